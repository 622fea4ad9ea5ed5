"""Independent NumPy float64 reference of the fusedopt update rules (no TensorFlow).

Written from docs/API_SPEC.md only; it shares no code with the C++ kernels or with
``fusedopt.reference`` (the composed-TF implementation), so it can serve as an
oracle for both.

    dense_update(rule, var, slots, grad, hyper, options=None)            -> (new_var, new_slots)
    sparse_update(rule, var, slots, grad, indices, hyper, options=None)  -> (new_var, new_slots)

``slots`` is a sequence in the rule's slot order (or a dict keyed by slot name);
``new_slots`` is a list in slot order.  Inputs are never modified; all
arithmetic is float64.  Half/bfloat16/float32 kernels compute in float32 and
round the result once per step, so compare against this reference with
``tolerance(dtype)`` / ``assert_close``, after rounding the hyper-parameters to
the variable dtype with ``round_hyper`` (the ops cast them to the var dtype).
"""

import importlib
import pkgutil

import numpy as np

import numpy_rules

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes ships with TensorFlow
    ml_dtypes = None
    BFLOAT16 = None

# The oracle modules, one per rule (tests/support/numpy_rules/<rule>.py), by rule name.
ORACLES = {info.name: importlib.import_module("numpy_rules." + info.name)
           for info in pkgutil.iter_modules(numpy_rules.__path__)}

# rule -> {"slots", "hyper", "options", "slot_layouts"}: the rules as docs/API_SPEC.md
# documents them. A slot is per element (var's shape) or, listed in the oracle's PER_ROW,
# per row (var.shape[:1]; [] for a scalar var).
RULES = {name: {"slots": list(m.SLOTS), "hyper": list(m.HYPER), "options": dict(m.OPTIONS),
                "slot_layouts": {s: "per_row" if s in getattr(m, "PER_ROW", ()) else "per_element"
                                 for s in m.SLOTS}}
         for name, m in sorted(ORACLES.items())}


def slot_shape(rule, slot, var_shape):
    """The shape of `rule`'s slot `slot` beside a var of `var_shape`."""
    var_shape = tuple(var_shape)
    if RULES[rule]["slot_layouts"][slot] == "per_row":
        return var_shape[:1]
    return var_shape


def _f64(x):
    return np.array(x, dtype=np.float64)  # always a copy


def _options(rule, options):
    opts = dict(RULES[rule]["options"])
    for k, v in (options or {}).items():
        if k not in opts:
            raise ValueError("unknown option %r for rule %r" % (k, rule))
        opts[k] = bool(v)
    return opts


def _hyper(rule, hyper):
    missing = [h for h in RULES[rule]["hyper"] if h not in hyper]
    if missing:
        raise ValueError("missing hyper-parameters %s for rule %r" % (missing, rule))
    return {h: float(hyper[h]) for h in RULES[rule]["hyper"]}


def _slot_list(rule, slots):
    names = RULES[rule]["slots"]
    if isinstance(slots, dict):
        slots = [slots[n] for n in names]
    slots = list(slots)
    if len(slots) != len(names):
        raise ValueError("rule %r takes %d slots, got %d" % (rule, len(names), len(slots)))
    return slots


def dense_update(rule, var, slots, grad, hyper, options=None):
    """One dense step. Returns (new_var, [new_slot, ...]) as float64 arrays."""
    var = _f64(var)
    slots = [_f64(s) for s in _slot_list(rule, slots)]
    grad = _f64(grad)
    for name, s in zip(RULES[rule]["slots"], slots):
        if s.shape != slot_shape(rule, name, var.shape):
            raise ValueError("%s must have shape %s" % (name, slot_shape(rule, name, var.shape)))
    if grad.shape != var.shape:
        raise ValueError("grad must have the same shape as var")
    with np.errstate(divide="ignore", invalid="ignore"):
        return ORACLES[rule].update(var, slots, grad, _hyper(rule, hyper),
                                    _options(rule, options))


def sum_duplicates(grad, indices):
    """(unique_indices in order of first appearance, float64 summed grad rows)."""
    grad = _f64(grad)
    indices = np.asarray(indices).astype(np.int64).reshape(-1)
    unique, first_pos, inverse = np.unique(indices, return_index=True, return_inverse=True)
    summed = np.zeros((len(unique),) + grad.shape[1:], np.float64)
    np.add.at(summed, inverse.reshape(-1), grad)
    order = np.argsort(first_pos, kind="stable")
    return unique[order], summed[order]


def sparse_update(rule, var, slots, grad, indices, hyper, options=None):
    """One sparse step: duplicates summed, each touched row updated once, others unchanged."""
    var = _f64(var)
    slots = [_f64(s) for s in _slot_list(rule, slots)]
    grad = _f64(grad)
    indices = np.asarray(indices)
    if var.ndim < 1:
        raise ValueError("var must be at least 1-D")
    if indices.ndim != 1:
        raise ValueError("indices must be 1-D")
    if grad.shape != indices.shape[:1] + var.shape[1:]:
        raise ValueError("grad must have shape [N] + var.shape[1:]")
    bad = np.nonzero((indices < 0) | (indices >= var.shape[0]))[0]
    if bad.size:
        raise ValueError("indices[%d] = %d is not in [0, %d)"
                         % (bad[0], indices[bad[0]], var.shape[0]))
    rows, g = sum_duplicates(grad, indices)
    if rows.size == 0:
        return var, slots
    new_rows, new_slot_rows = dense_update(
        rule, var[rows], [s[rows] for s in slots], g, hyper, options)
    var[rows] = new_rows
    for s, r in zip(slots, new_slot_rows):
        s[rows] = r
    return var, slots


# --- dtypes and tolerances --------------------------------------------------------

def np_dtype(dtype):
    """NumPy dtype for 'half'/'float16', 'bfloat16', 'float'/'float32', 'double'/'float64',
    a NumPy dtype, or a tf.DType (duck-typed through .as_numpy_dtype)."""
    if hasattr(dtype, "as_numpy_dtype"):
        return np.dtype(dtype.as_numpy_dtype)
    aliases = {"half": np.float16, "float": np.float32, "double": np.float64,
               "bfloat16": BFLOAT16}
    if isinstance(dtype, str) and dtype in aliases:
        return np.dtype(aliases[dtype])
    return np.dtype(dtype)


# (rtol, atol) for one kernel step against this float64 reference, starting from the
# same (already dtype-rounded) state and dtype-rounded hyper-parameters.
#  float64: only operation-order differences (a few ulp; atol covers cancellation).
#  float32: float32 arithmetic, ~10 roundings.
#  half/bfloat16: computed in float32, the result rounded once (0.5 ulp = 4.9e-4 for
#  half, 3.9e-3 for bfloat16), with headroom; atol covers results that cancel to ~0.
_TOL = {
    np.dtype(np.float64): (1e-12, 1e-13),
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float16): (1e-2, 1e-3),
}
if BFLOAT16 is not None:
    _TOL[BFLOAT16] = (2e-2, 4e-3)


def tolerance(dtype):
    """{'rtol': ..., 'atol': ...} for comparing a kernel of `dtype` with this reference."""
    rtol, atol = _TOL[np_dtype(dtype)]
    return {"rtol": rtol, "atol": atol}


def assert_close(actual, desired, dtype, err_msg=""):
    """np.testing.assert_allclose with the per-dtype tolerance; compares in float64."""
    np.testing.assert_allclose(_f64(actual), _f64(desired), err_msg=err_msg,
                               **tolerance(dtype))


def round_to(x, dtype):
    """Round float64 values to `dtype` (round-to-nearest) and return them as float64."""
    return np.asarray(x, dtype=np.float64).astype(np_dtype(dtype)).astype(np.float64)


def round_hyper(hyper, dtype):
    """Hyper-parameters rounded to the variable dtype, as exactly representable Python floats.

    The ops cast hyper-parameters to the var dtype; feeding pre-rounded values makes
    the op and this reference see identical numbers (e.g. bfloat16(0.999) == 1.0).
    """
    return {k: float(round_to(v, dtype)) for k, v in hyper.items()}


# (mantissa bits incl. the implicit one, minimum normal exponent) of the low-precision types
_FORMAT = {np.dtype(np.float16): (11, -14), np.dtype(np.float32): (24, -126)}
if BFLOAT16 is not None:
    _FORMAT[BFLOAT16] = (8, -126)


def ulp(x, dtype):
    """Spacing of `dtype` values around |x| (float64 array); subnormal spacing near 0."""
    bits, emin = _FORMAT[np_dtype(dtype)]
    x = np.abs(_f64(x))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(x > 0, x, 1.0)))
    return np.ldexp(1.0, (np.maximum(e, emin) - (bits - 1)).astype(int))


def assert_rounded_once(actual, exact, dtype, scale=None, err_msg=""):
    """Checks a half/bfloat16 result against the float64 value rounded once to `dtype`.

    A kernel that computes in float32 and rounds the result once is within 1 ulp of
    the exact value (float32 error is far below half an ulp, except where the result
    cancels: `scale`, e.g. |var before|, bounds that float32 error as 1e-6 * scale).
    Computing in half/bfloat16 throughout makes errors of several ulp.
    """
    actual, exact = _f64(actual), _f64(exact)
    slack = 1e-6 * (np.abs(exact) if scale is None else np.maximum(np.abs(_f64(scale)),
                                                                   np.abs(exact)))
    err = np.abs(actual - exact)
    bad = err > ulp(exact, dtype) + slack
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err / ulp(exact, dtype), 0)), bad.shape)
        raise AssertionError("%s: %d values off by more than 1 ulp of %s; worst at %s: "
                             "got %r, exact %r (%.2f ulp)"
                             % (err_msg, bad.sum(), np_dtype(dtype), i, actual[i], exact[i],
                                err[i] / ulp(exact, dtype)[i]))
