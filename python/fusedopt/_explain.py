"""Which kernel updates which variable: ``fusedopt.explain(optimizer, variables)``
(``fusedopt.explain`` calls this module's ``explain``).

Every fusedopt optimizer runs fusedopt's fused ops where it can and the replaced class's own
update where a setting or a dtype has no fused rule (it warns once when that happens:
``fusedopt.FallbackWarning``). ``explain`` says, for each variable, what runs for a dense
gradient and for a sparse one (``tf.IndexedSlices``, an embedding's), and how its slots are
stored:

    print(fusedopt.explain(model.optimizer, model.trainable_variables))

It reads the optimizer's settings only: nothing is built, run or changed.
"""
import dataclasses
from typing import List, Optional, Sequence

__all__ = ["explain", "Explanation", "VariableRoute"]


@dataclasses.dataclass(frozen=True)
class VariableRoute:
    """What updates one variable."""

    name: str
    shape: tuple
    dtype: str
    slot_dtype: str  # the dtype its rule's slots are stored in
    dense: str  # what a dense gradient runs
    sparse: str  # what a tf.IndexedSlices gradient runs


@dataclasses.dataclass(frozen=True)
class Explanation:
    """``explain``'s answer: the optimizer, its rule and settings, and one route per
    variable. ``str()`` gives a table."""

    optimizer: str
    rule: Optional[str]  # fusedopt's rule the settings select (None: not a fusedopt class)
    note: str
    variables: List[VariableRoute]

    # Under a tf.distribute strategy the dense updates run per variable and replica
    # (FusedOpt>ResourceApply<Rule>) instead of as one group op.

    @property
    def fused(self) -> bool:
        """Whether every variable's dense and sparse updates run fusedopt's ops."""
        return bool(self.variables) and all(
            r.dense.startswith("FusedOpt>") and r.sparse.startswith("FusedOpt>")
            for r in self.variables)

    def __str__(self) -> str:
        lines = [f"{self.optimizer}: {self.note}"]
        if not self.variables:
            return lines[0]
        width = max(len(r.name) for r in self.variables)
        for r in self.variables:
            lines.append(f"  {r.name:{width}s}  {r.dtype}{list(r.shape)} slots {r.slot_dtype}")
            lines.append(f"  {'':{width}s}    dense gradient:  {r.dense}")
            lines.append(f"  {'':{width}s}    sparse gradient: {r.sparse}")
        return "\n".join(lines)


def _op(rule: str, variant: str) -> str:
    from fusedopt import ops

    return ops.op_name(rule, variant)


def _variable_facts(variable):
    from fusedopt import _dispatch

    inner = _dispatch.unwrap(variable)
    name = getattr(variable, "path", None) or getattr(inner, "name", None) or repr(variable)
    shape = tuple(int(d) if d is not None else -1 for d in getattr(inner, "shape", ()))
    dtype = getattr(getattr(inner, "dtype", None), "base_dtype", None)
    return inner, str(name), shape, dtype


def explain(optimizer, variables: Optional[Sequence] = None) -> Explanation:
    """What `optimizer` runs for each of `variables` (default: those a built Keras 3
    optimizer keeps; other optimizers need them given). Works for ``fusedopt.keras``, ``fusedopt.keras.legacy`` and
    ``fusedopt.compat.v1`` optimizers; any other optimizer is reported as not fusedopt's."""
    import tensorflow as tf

    from fusedopt import _compact, _dispatch
    from fusedopt.compat import v1 as compat_v1

    if isinstance(optimizer, type) or optimizer is None or isinstance(optimizer, (str, bytes)):
        raise TypeError(f"explain() takes an optimizer (an instance), got {optimizer!r}")
    wrappers = []
    while hasattr(optimizer, "inner_optimizer"):  # Keras's LossScaleOptimizer (mixed precision)
        wrappers.append(type(optimizer).__name__)
        optimizer = optimizer.inner_optimizer
    kind = " inside ".join([type(optimizer).__name__] + wrappers[::-1])
    variables = _variable_list(optimizer, variables)
    constrained_alone = False
    if isinstance(optimizer, compat_v1._FusedOptimizer):
        rule, slot_dtype = optimizer._RULE, optimizer._slot_dtype
        stochastic = optimizer._stochastic_rounding
        grouped, own, constrained_alone = optimizer._groups_dense_updates(), None, True
    else:
        spec = getattr(optimizer, "_fused_spec", None)
        if spec is None or not hasattr(optimizer, "_fused_rule"):
            return Explanation(kind, None, "not a fusedopt optimizer: its own updates",
                               [_route(v, "its own update", "its own update", None)
                                for v in variables])
        rule, slot_dtype = optimizer._fused_rule, getattr(optimizer, "slot_dtype", None)
        stochastic = getattr(optimizer, "stochastic_rounding", False)
        legacy = hasattr(optimizer, "_distributed_apply") and not hasattr(optimizer,
                                                                          "update_step")
        constrained_alone = legacy
        method = "_resource_apply_dense" if legacy else "update_step"
        owner = next(c for c in type(optimizer).__mro__ if method in vars(c)
                     and c.__module__.startswith("fusedopt."))
        grouped = not _dispatch.overridden(optimizer, method, owner)
        own = (f"Keras's own {spec.base} update ({spec.own_update_setting})"
               if spec.keeps_own_update(optimizer) else None)
        if getattr(optimizer, "_fused_composed", False):
            own = "composed TF ops (fusedopt.reference: DTensor's sharded layouts)"
    note = own or (f"rule {rule}" + ("" if grouped else
                                     "; per variable (its update method is overridden)"))
    slot_dtypes = {_compact.slot_dtype_for(v_dtype, slot_dtype)
                   for v_dtype in (_variable_facts(v)[3] for v in variables) if v_dtype}
    if slot_dtype is not None:
        note += f"; compact slots: {slot_dtype.name} (of float32 variables)"
    if stochastic:
        note += (", stochastic rounding of 16-bit slots seeded by the step"
                 if slot_dtypes & set(_compact.COMPACT_DTYPES) else
                 "; stochastic_rounding has no 16-bit slot to round here")
    routes = []
    for variable in variables:
        inner, name, shape, dtype = _variable_facts(variable)
        slots = _compact.slot_dtype_for(dtype, slot_dtype).name if dtype is not None else "?"
        if own is not None:
            dense = sparse = own
        elif dtype is None or not _dispatch.covers(inner):
            dense = sparse = ("the replaced class's own update (no fused kernel for "
                              f"{getattr(dtype, 'name', dtype)})")
        elif not (isinstance(inner, tf.Variable) and hasattr(inner, "handle")):
            dense = _op(rule, "apply") + " (ref variable)"
            sparse = _op(rule, "sparse_apply")
        else:
            alone = (not grouped or (constrained_alone
                                     and getattr(inner, "constraint", None) is not None))
            dense = (_op(rule, "resource_apply") + (" (alone: a constraint follows it)"
                                                    if grouped else "") if alone else
                     _op(rule, "resource_group_apply") + " (a step's dense updates in one op)")
            sparse = _op(rule, "resource_sparse_apply") + " (the touched rows only)"
        routes.append(VariableRoute(name, shape, getattr(dtype, "name", str(dtype)), slots,
                                    dense, sparse))
    return Explanation(kind, rule, note, routes)


def _variable_list(optimizer, variables):
    """`variables` as a list of variables (one variable alone is one), refusing what no
    optimizer updates (tensors, strings, None)."""
    import tensorflow as tf

    if variables is None:
        return _known_variables(optimizer)
    if hasattr(variables, "dtype") and hasattr(variables, "shape"):
        variables = [variables]  # one variable (or a tensor: refused below)
    elif isinstance(variables, dict):
        variables = list(variables.values())
    elif isinstance(variables, (str, bytes)) or not hasattr(variables, "__iter__"):
        raise TypeError(f"explain() takes a list of variables, got {variables!r}")
    variables = list(variables)
    for v in variables:
        from fusedopt import _dispatch

        inner = _dispatch.unwrap(v)
        if not isinstance(inner, tf.Variable):
            raise TypeError(f"explain() takes variables (what an optimizer updates), got "
                            f"{type(v).__name__}: {v!r:.80}")
    return variables


def _route(variable, dense, sparse, slot_dtype):
    _, name, shape, dtype = _variable_facts(variable)
    return VariableRoute(name, shape, getattr(dtype, "name", str(dtype)),
                         getattr(slot_dtype, "name", getattr(dtype, "name", "?")), dense, sparse)


def _known_variables(optimizer):
    """The variables a Keras 3 optimizer was built for; other optimizers keep no list."""
    found = getattr(optimizer, "_trainable_variables", None)
    if found:
        return list(found)
    raise ValueError(f"explain({type(optimizer).__name__}) needs the variables: "
                     "fusedopt.explain(optimizer, model.trainable_variables)")
