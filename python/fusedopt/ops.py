"""Thin wrappers over fusedopt's fused update ops, one per op, generated from the rules.

For every rule of the C++ registry (``fusedopt.rules``) and every variant there is one
wrapper, ``<variant>_<rule>``: ``apply_lazy_adam``, ``resource_apply_lazy_adam``,
``sparse_apply_lazy_adam``, ``resource_sparse_apply_lazy_adam``, ... Each takes the
variable and its slots (``tf.Variable`` objects for the ``resource_*`` ops; ref variables —
``tf.compat.v1.Variable(use_resource=False)`` in graph mode — for the others), the
hyper-parameters (Python numbers or tensors; cast to the variable's dtype) and the
gradient, in the op's input order; then ``use_locking``, the rule's options and ``name``,
and keyword-only ``stochastic_rounding`` and ``rounding_seed``.
Sparse wrappers also take ``indices``: ``grad`` then has shape ``[N] + var.shape[1:]``;
duplicate indices are summed before each named row is updated once, and rows not named
are left untouched (lazy updates); with keyword-only ``every_row=True`` every row is
updated, the rows not named with a zero gradient (the dense update of the densified
gradient: Keras's and TF's Adam on sparse gradients), in one pass without a table-sized
gradient buffer. ``every_row`` runs in the CPU kernels only: on a GPU and under XLA the
op refuses it (``_dispatch.densify`` and the dense op do the same there).

``resource_group_apply_<rule>`` updates many resource variables in one op (dense
gradients): ``var``, each slot and ``grad`` are lists of the same length, every variable of
one dtype (and device), the hyper-parameters are given once for all of them. One pass over
all elements, numbers identical to one ``resource_apply_<rule>`` per variable.

``resource_packed_group_apply_<rule>(pack, *hyper, grad)`` is the same update with the
variables and slots in a member pack (``variable_pack([*vars, *slot0s, ...])``, made once):
a step function captures one handle instead of one per variable and slot. Captured packs
are ordered like the variables they hold: ``fusedopt._pack_registry`` records each pack's
members and registers how (automatic control dependencies see the op as writing every
member).

What the loaded library reports about itself (huge pages, buffer separation, vector
instruction set) is in ``fusedopt.runtime``; the functions are also here, as before.

Slots are tf.Variables of the variable's dtype or, for a float32 variable, all of
``bfloat16`` or all of ``float16`` (compact slots: the update computes in float32 and rounds
each slot once on store, to nearest even, or with ``stochastic_rounding=True``
stochastically, from bits hashed from the stored value, the variable's old element and
``rounding_seed``: deterministic, the same on CPU, GPU and XLA's custom call; XLA's HLO path
where it contracts no multiply-add into an FMA). Stochastic rounding needs
``rounding_seed``, an int64 scalar (number or tensor) that changes every call, such as the
step number: without a fresh seed an element that does not change (a learning rate of 0,
an update below half a 16-bit step, a repeated gradient) would round the same way every
step, which is a bias. The front ends pass their step counter.

Updates happen in place. Resource wrappers return the op (graph mode) or None (eager);
ref wrappers return the updated variable's ref tensor, as TF's ``Apply*`` ops do.
Bad input raises ``tf.errors.InvalidArgumentError`` and leaves every variable as it was.
"""
import inspect
from typing import Optional

import numpy as np
import tensorflow as tf

from fusedopt import _loader, _pack_registry, rules
from fusedopt.runtime import (HUGE_PAGE_STATS, SEPARATION_STATS,  # noqa: F401 - as before
                              buffer_separation_stats, cpu_isa, huge_page_stats,
                              xla_cpu_lowering)

# rule -> {"op_name", "slots", "hyper", "options"}: the C++ declarations.
RULES = rules.SPECS

VARIANTS = ("apply", "resource_apply", "sparse_apply", "resource_sparse_apply")
GROUP_VARIANT = "resource_group_apply"  # N variables, one op (dense)
PACKED_GROUP_VARIANT = "resource_packed_group_apply"  # the same, variables in a pack
ALL_VARIANTS = VARIANTS + (GROUP_VARIANT, PACKED_GROUP_VARIANT)


def op_name(rule: str, variant: str) -> str:
    """The registered TF op name, e.g. ``FusedOpt>ResourceSparseApplyLazyAdam``,
    ``FusedOpt>ResourceGroupApplyLazyAdam``."""
    prefix = "".join(part.capitalize() for part in variant.split("_"))
    return "FusedOpt>" + prefix + RULES[rule]["op_name"]


_gradients_declared = False


def load_library():  # -> the op library's generated module
    """Loads the op library (once) and returns its generated op module."""
    global _gradients_declared
    library = _loader.load_library()
    if not _gradients_declared:
        for rule in RULES:
            for variant in ALL_VARIANTS:
                try:
                    tf.no_gradient(op_name(rule, variant))  # updates are not differentiable
                except KeyError:  # already declared (e.g. module reloaded)
                    pass
        _gradients_declared = True
    return library


def _dtype_of(variable):
    dtype = getattr(variable, "dtype", None)
    if dtype is None or dtype == tf.resource:
        raise TypeError("pass the tf.Variable itself (its dtype is needed), not a handle: "
                        f"{variable!r}")
    return dtype.base_dtype


def _state(variable, resource):
    if not resource:
        return variable  # ref inputs convert themselves with as_ref=True
    handle = getattr(variable, "handle", None)
    if handle is None:
        raise TypeError(f"resource ops need a resource tf.Variable, got {variable!r}")
    return handle


def _as_dtype(value, dtype):
    value = tf.convert_to_tensor(value, dtype_hint=dtype)
    return value if value.dtype == dtype else tf.cast(value, dtype)


# Plain graph-building code: autograph has nothing to convert here (and converting the
# loader inside a tf.function only produces warnings).
def _rounding_seed(stochastic_rounding, rounding_seed):
    """The ops' rounding_seed input: [seed as an int64 tensor] with stochastic rounding,
    [] without (a seed given there is ignored, as the rounding is to nearest)."""
    if not isinstance(stochastic_rounding, (bool, np.bool_)):
        raise TypeError(f"stochastic_rounding must be a bool, got {stochastic_rounding!r}")
    if not stochastic_rounding:
        return []
    if rounding_seed is None:
        raise ValueError(
            "stochastic_rounding=True needs rounding_seed: an int64 scalar that changes every "
            "call, such as the step number (without one, an element that does not change "
            "would round the same way every step, a bias)")
    if isinstance(rounding_seed, (bool, np.bool_)) or (
            isinstance(rounding_seed, (float, np.floating))):
        raise TypeError(f"rounding_seed must be an integer (int64), got {rounding_seed!r}")
    seed = tf.convert_to_tensor(rounding_seed, dtype_hint=tf.int64)
    if not seed.dtype.is_integer:
        raise TypeError(f"rounding_seed must be an integer (int64), got dtype {seed.dtype.name}")
    return [seed if seed.dtype == tf.int64 else tf.cast(seed, tf.int64)]


@tf.autograph.experimental.do_not_convert
def _apply(rule, variant, var, slots, hyper, grad, indices, use_locking, options, name,
           stochastic_rounding=False, rounding_seed=None, every_row=False):
    spec = RULES[rule]
    resource = variant.startswith("resource")
    seed = _rounding_seed(stochastic_rounding, rounding_seed)
    options = {**options, "stochastic_rounding": bool(stochastic_rounding),
               "rounding_seed": seed}
    if variant == GROUP_VARIANT:
        return _apply_group(rule, var, slots, hyper, grad, use_locking, options, name)
    if variant == PACKED_GROUP_VARIANT:
        return _apply_packed_group(rule, var, hyper, grad, use_locking, options, name)
    dtype = _dtype_of(var)
    kwargs = {"var": _state(var, resource), "use_locking": use_locking, "name": name}
    for slot_name, slot in zip(spec["slots"], slots):
        kwargs[slot_name] = _state(slot, resource)
    for hyper_name, value in zip(spec["hyper"], hyper):
        kwargs[hyper_name] = _as_dtype(value, dtype)
    kwargs["grad"] = tf.convert_to_tensor(grad, dtype_hint=dtype)
    if indices is not None:
        kwargs["indices"] = indices
        if not isinstance(every_row, (bool, np.bool_)):
            raise TypeError(f"every_row must be a bool, got {every_row!r}")
        kwargs["every_row"] = bool(every_row)
    kwargs.update(options)
    fn = getattr(load_library(), f"fused_opt_{variant}_{rule}")
    return fn(**kwargs)


def _as_list(value, what):
    if isinstance(value, (list, tuple)):
        return list(value)
    raise TypeError(f"{what} must be a list (one entry per variable), got {value!r}")


def _apply_group(rule, variables, slots, hyper, grads, use_locking, options, name):
    spec = RULES[rule]
    variables = _as_list(variables, "var")
    slots = [_as_list(s, slot_name) for s, slot_name in zip(slots, spec["slots"])]
    grads = _as_list(grads, "grad")
    if not variables:
        raise ValueError("var is empty: a group update needs at least one variable")
    for what, values in [*zip(spec["slots"], slots), ("grad", grads)]:
        if len(values) != len(variables):
            raise ValueError(f"{what} has {len(values)} entries but var has "
                             f"{len(variables)}: one per variable")
    dtype = _dtype_of(variables[0])
    kwargs = {"var": [_state(v, True) for v in variables], "use_locking": use_locking,
              "name": name}
    for slot_name, values in zip(spec["slots"], slots):
        kwargs[slot_name] = [_state(s, True) for s in values]
    for hyper_name, value in zip(spec["hyper"], hyper):
        kwargs[hyper_name] = _as_dtype(value, dtype)
    kwargs["grad"] = [tf.convert_to_tensor(g, dtype_hint=dtype) for g in grads]
    kwargs.update(options)
    fn = getattr(load_library(), f"fused_opt_{GROUP_VARIANT}_{rule}")
    return fn(**kwargs)


def _apply_packed_group(rule, pack, hyper, grads, use_locking, options, name):
    if not tf.executing_eagerly():
        pack = tf.convert_to_tensor(pack)
        graph = tf.compat.v1.get_default_graph()
        if hasattr(graph, "captures") and _pack_registry.pack_members(pack) is None:
            # Automatic control dependencies order the op by the members it updates; a
            # pack they cannot trace to its members (a function argument) would leave
            # reads of those variables unordered.
            raise ValueError(
                "resource_packed_group_apply needs a pack made by ops.variable_pack that "
                "this function captures or makes, not one passed in as an argument (or "
                "another resource): its members must be known to order the variables' "
                "reads and writes")
    grads = [tf.convert_to_tensor(g) for g in _as_list(grads, "grad")]
    if not grads:
        raise ValueError("grad is empty: a group update needs at least one variable")
    dtype = grads[0].dtype
    kwargs = {"pack": pack, "grad": grads, "use_locking": use_locking, "name": name}
    for hyper_name, value in zip(RULES[rule]["hyper"], hyper):
        kwargs[hyper_name] = _as_dtype(value, dtype)
    kwargs.update(options)
    fn = getattr(load_library(), f"fused_opt_{PACKED_GROUP_VARIANT}_{rule}")
    return fn(**kwargs)


def variable_pack(members: list, name: Optional[str] = None) -> tf.Tensor:
    """A member pack of resource variables (``tf.Variable`` objects, all distinct) for the
    ``resource_packed_group_apply_<rule>`` ops: every variable, then each slot's variables,
    in the group op's order. Returns its handle (a scalar resource tensor that owns the
    pack: the variables' storage lives while the handle does)."""
    handles = [_state(m, True) for m in _as_list(members, "members")]
    if not handles:
        raise ValueError("members is empty: a pack needs at least one variable")
    pack = load_library().fused_opt_variable_pack(members=handles, name=name)
    if tf.executing_eagerly():  # for ordering in the functions that capture it
        _pack_registry.register(pack, handles)
    return pack


_VARIANT_DOCS = {
    "apply": "update of a ref variable; returns the var ref",
    "resource_apply": "update of a resource variable",
    "sparse_apply": "update of the rows of a ref variable named by ``indices``; returns the "
                    "var ref",
    "resource_sparse_apply": "update of the rows of a resource variable named by ``indices``",
    GROUP_VARIANT: "update of many resource variables in one op: ``var``, each slot and "
                   "``grad`` are lists, one entry per variable (same dtype and device); "
                   "the hyper-parameters are shared",
    PACKED_GROUP_VARIANT: "update of the variables of a member pack (``variable_pack``) in "
                          "one op: ``pack`` holds every variable then each slot's, ``grad`` "
                          "is a list, one gradient per variable",
}


def _make_wrapper(rule, variant):
    """``<variant>_<rule>(var, *slots, *hyper, grad, [indices], use_locking=False,
    **options, name=None, *, stochastic_rounding=False, rounding_seed=None)`` with a real
    signature (help(), inspect, IDEs)."""
    spec = RULES[rule]
    sparse = variant.endswith("sparse_apply")
    packed = variant == PACKED_GROUP_VARIANT
    state = ["pack"] if packed else ["var", *spec["slots"]]
    positional = [*state, *spec["hyper"], "grad"] + (["indices"] if sparse else [])
    keyword = [("use_locking", False), *spec["options"].items(), ("name", None)]
    n_slots, n_hyper = len(spec["slots"]), len(spec["hyper"])

    def wrapper(*args, **kwargs):
        bound = wrapper.__signature__.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if packed:
            return _apply(rule, variant, a["pack"], [], [a[h] for h in spec["hyper"]],
                          a["grad"], None, a["use_locking"], {o: a[o] for o in spec["options"]},
                          a["name"], a["stochastic_rounding"], a["rounding_seed"])
        return _apply(rule, variant, a["var"], [a[s] for s in spec["slots"]],
                      [a[h] for h in spec["hyper"]], a["grad"], a.get("indices"),
                      a["use_locking"], {o: a[o] for o in spec["options"]}, a["name"],
                      a["stochastic_rounding"], a["rounding_seed"], a.get("every_row", False))

    P = inspect.Parameter
    wrapper.__signature__ = inspect.Signature(
        [P(n, P.POSITIONAL_OR_KEYWORD) for n in positional]
        + [P(n, P.POSITIONAL_OR_KEYWORD, default=d,
             annotation=Optional[str] if n == "name" else bool) for n, d in keyword]
        + [P("stochastic_rounding", P.KEYWORD_ONLY, default=False, annotation=bool),
           P("rounding_seed", P.KEYWORD_ONLY, default=None)]
        + ([P("every_row", P.KEYWORD_ONLY, default=False, annotation=bool)] if sparse else []))
    wrapper.__name__ = wrapper.__qualname__ = f"{variant}_{rule}"
    wrapper.__doc__ = (f"{spec['op_name']} {_VARIANT_DOCS[variant]}.\n\n"
                       f"``{rules.module(rule).MATH}``\n\n"
                       f"Op ``{op_name(rule, variant)}``: {n_slots} slot(s), {n_hyper} "
                       "hyper-parameter(s); see the module docstring.")
    wrapper.__module__ = __name__
    return wrapper


__all__ = ["RULES", "VARIANTS", "GROUP_VARIANT", "PACKED_GROUP_VARIANT", "ALL_VARIANTS",
           "op_name", "load_library", "variable_pack", "huge_page_stats",
           "buffer_separation_stats", "cpu_isa", "xla_cpu_lowering"]
for _rule in RULES:
    for _variant in ALL_VARIANTS:
        globals()[f"{_variant}_{_rule}"] = _make_wrapper(_rule, _variant)
        __all__.append(f"{_variant}_{_rule}")
del _rule, _variant


def __dir__():
    return sorted(__all__)


# Loaded at import, not on first use: XLA lists its JIT kernels at the process's first XLA
# compilation, and ops registered before that take the normal path (a library loaded later
# registers its XLA kernels itself).
load_library()
