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

    kind = type(optimizer).__name__
    variables = list(variables) if variables is not None else _known_variables(optimizer)
    if isinstance(optimizer, compat_v1._FusedOptimizer):
        rule, slot_dtype = optimizer._RULE, optimizer._slot_dtype
        grouped = optimizer._groups_dense_updates()
        own = None
    else:
        spec = getattr(optimizer, "_fused_spec", None)
        if spec is None or not hasattr(optimizer, "_fused_rule"):
            return Explanation(kind, None, "not a fusedopt optimizer: its own updates",
                               [_route(v, "its own update", "its own update", None)
                                for v in variables])
        rule, slot_dtype = optimizer._fused_rule, getattr(optimizer, "slot_dtype", None)
        legacy = hasattr(optimizer, "_distributed_apply") and not hasattr(optimizer,
                                                                          "update_step")
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
    if slot_dtype is not None:
        note += f"; compact slots: {slot_dtype.name}"
    if getattr(optimizer, "stochastic_rounding", getattr(optimizer, "_stochastic_rounding",
                                                         False)):
        note += ", stochastic rounding seeded by the step"
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
            dense = (_op(rule, "resource_group_apply") + " (a step's dense updates in one "
                     "op)") if grouped else _op(rule, "resource_apply")
            sparse = _op(rule, "resource_sparse_apply") + " (the touched rows only)"
        routes.append(VariableRoute(name, shape, getattr(dtype, "name", str(dtype)), slots,
                                    dense, sparse))
    return Explanation(kind, rule, note, routes)


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
