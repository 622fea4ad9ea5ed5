"""Property-based fuzzing of every fused op (hypothesis).

Each example draws a rule and its options, a dtype, a shape (rank 0..4 dense, 1..4
sparse; zero rows, inner dimension 1 or 0), an index dtype and indices (duplicates,
negatives, out-of-range, empty), gradients with NaN/+-Inf sprinkled in and
hyper-parameters that are sometimes NaN/Inf/0/1/negative.  The op must then either

* match the NumPy reference (tests/support/numpy_reference.py's formulas, in float64 or, for
  16/32-bit dtypes, in float32, the kernels' compute type) after rounding it to the var
  dtype, NaN-aware: NaN where the reference has NaN, the same infinities, the per-dtype
  tolerance elsewhere; rows a sparse update does not name stay bit-for-bit unchanged; or
* raise the documented error (docs/API_SPEC.md) with var and every slot bit-for-bit
  unchanged.

Gradients are small dyadic rationals (k * 2**-s, |k| <= 64) so that summing duplicate
rows is exact in every compute type and the float64 reference sees the same sums.

``test_hostile_callers`` draws calls no honest caller makes (wrong dtypes, shared or
copy-on-read variables, aliasing, lists, bad hyper-parameter types, huge thread counts;
see its section) and runs them in a child process, so that an abort fails the test.

Profiles (registered here): "ci" (default; bounded, derandomized) and "long"
(thousands of examples): ``HYPOTHESIS_PROFILE=long pytest tests/ops/test_fuzz.py``.
``FUSEDOPT_FUZZ_EXAMPLES=N`` overrides the example count of either profile.
"""

import os
import re

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import harness
import numpy_reference as npref
from fusedopt import _core
import fusedopt.ops as fops

RULES = npref.RULES
RULE_NAMES = sorted(RULES)

_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)
settings.register_profile("ci", max_examples=60, derandomize=True, database=None, **_COMMON)
settings.register_profile("long", max_examples=3000, database=None, **_COMMON)
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
if _PROFILE not in ("ci", "long"):
    _PROFILE = "ci"
_EXAMPLES = int(os.environ.get("FUSEDOPT_FUZZ_EXAMPLES", "0"))


def fuzz_settings(fraction=1.0):
    """The active profile, with max_examples scaled for the slower tests."""
    base = settings.get_profile(_PROFILE)
    n = _EXAMPLES or base.max_examples
    return settings(base, max_examples=max(1, int(n * fraction)))


# Examples actually run, per test (printed at session end by the fixture below).
RUN_COUNTS = {}


@pytest.fixture(scope="module", autouse=True)
def _report_counts():
    yield
    if RUN_COUNTS:
        total = sum(v for k, v in RUN_COUNTS.items() if ":" not in k)
        print("\nfuzz examples run (profile %s): %s, total %d"
              % (_PROFILE, dict(sorted(RUN_COUNTS.items())), total))


def _count(name, outcome, c):
    """Counts an example under name and under the kind of input it was."""
    kinds = [name, "%s:%s" % (name, outcome)]
    if c["special_rate"] or not all(np.isfinite(v) for v in c["hyper"].values()):
        kinds.append("%s:non-finite" % name)
    for k in kinds:
        RUN_COUNTS[k] = RUN_COUNTS.get(k, 0) + 1


# --- strategies ---------------------------------------------------------------------

SPECIAL = [float("nan"), float("inf"), float("-inf")]
_NORMAL_HYPER = {
    "beta1_power": [0.9, 0.5, 0.0, 0.999, 0.81],
    "beta2_power": [0.999, 0.99, 0.0, 0.5, 0.98],
    "beta1": [0.9, 0.0, 0.5, 0.99, 1.0],
    "beta2": [0.999, 0.9, 0.0, 0.5, 1.0],
    "lr": [0.1, 1.0, 0.0, -0.5, 3.0, 1e-3],
    "epsilon": [1e-7, 0.0, 0.1, 1.0, 1e-3],
}


@st.composite
def hyper_st(draw, rule, dtype):
    h = {}
    for name in RULES[rule]["hyper"]:
        if draw(st.integers(0, 24)) == 7:  # ~4% each (not 0: hypothesis favours 0)
            h[name] = draw(st.sampled_from(SPECIAL + [1.0, -1.0, 2.0]))
        else:  # names of other rules: their oracle's value and a few around it
            base = npref.ORACLES[rule].BASE_HYPER.get(name, 0.5)
            h[name] = draw(st.sampled_from(_NORMAL_HYPER.get(name, [base, 0.0, 1.0, 2 * base])))
    return npref.round_hyper(h, dtype)


@st.composite
def case_st(draw, sparse, dtypes=tuple(harness.DTYPES)):
    rule = draw(st.sampled_from(RULE_NAMES))
    options = draw(st.sampled_from(harness.OPTION_SETS[rule]))
    dtype = draw(st.sampled_from(dtypes))
    rank = draw(st.integers(1 if sparse else 0, 4))
    rows = draw(st.integers(0, 6)) if rank else None
    inner = [draw(st.sampled_from([1, 1, 2, 3, 0] if d == 0 else [1, 2])) for d in range(rank - 1)]
    shape = tuple([rows] + inner) if rank else ()
    c = dict(rule=rule, options=options, dtype=dtype, shape=shape, sparse=sparse,
             seed=draw(st.integers(0, 2**32 - 1)), hyper=draw(hyper_st(rule, dtype)),
             special_rate=draw(st.sampled_from([0.0, 0.0, 0.0, 0.05, 0.3])),
             error=None)
    if sparse:
        index_dtype = draw(st.sampled_from([np.int32, np.int64]))
        n = draw(st.integers(0, 10))
        if rows > 0:
            # Few distinct rows: plenty of duplicates.
            idx = draw(st.lists(st.integers(0, rows - 1), min_size=n, max_size=n))
        else:
            idx = []
        if draw(st.integers(0, 3)) == 0:  # ~25%: one or more bad indices somewhere
            lo, hi = np.iinfo(index_dtype).min, np.iinfo(index_dtype).max
            bad_values = st.one_of(
                st.sampled_from([-1, rows, rows + 1, lo, hi]),
                st.integers(lo, -1), st.integers(rows, hi))
            for _ in range(draw(st.integers(1, 2))):
                idx.insert(draw(st.integers(0, len(idx))), draw(bad_values))
        c["indices"] = np.asarray(idx, dtype=index_dtype).reshape(-1)
        c["grad_shape"] = (len(idx),) + shape[1:]
        bad = np.nonzero((c["indices"] < 0) | (c["indices"] >= rows))[0]
        if bad.size:
            i = int(bad[0])
            c["error"] = re.escape("indices[%d] = %d is not in [0, %d)"
                                   % (i, int(c["indices"][i]), rows))
    else:
        c["indices"] = None
        c["grad_shape"] = shape
        if rank and draw(st.integers(0, 9)) == 0:  # ~10%: grad of the wrong shape
            gs = list(shape)
            gs[-1] += 1
            c["grad_shape"] = tuple(gs)
            fmt = lambda s: "[" + ",".join(map(str, s)) + "]"  # noqa: E731
            c["error"] = re.escape("grad must have the same shape as var: %s vs %s"
                                   % (fmt(shape), fmt(gs)))
    return c


def arrays(c):
    """(var, [slots], grad) for case c, from its seed."""
    rng = np.random.default_rng(c["seed"])
    dt = npref.np_dtype(c["dtype"])
    shape = c["shape"]

    def sprinkle(x):
        if c["special_rate"] and x.size:
            mask = rng.random(x.shape) < c["special_rate"]
            x[mask] = rng.choice(SPECIAL, size=int(mask.sum()))
        return x

    var = rng.uniform(-2, 2, shape)
    slots = []
    for name in RULES[c["rule"]]["slots"]:
        slot_shape = npref.slot_shape(c["rule"], name, shape)
        s = rng.uniform(-1, 1, slot_shape) if name == "m" else rng.uniform(0, 2, slot_shape)
        if name != "m" and s.size:
            s[rng.random(slot_shape) < 0.2] = 0.0
        slots.append(s.astype(dt))
    grad = (rng.integers(-64, 65, c["grad_shape"])
            * np.ldexp(1.0, -rng.integers(0, 9, c["grad_shape"])))
    grad = sprinkle(np.asarray(grad, np.float64))
    if c["special_rate"] and var.size:
        var = sprinkle(var)
        if slots:
            slots[0] = sprinkle(slots[0].astype(np.float64)).astype(dt)
    return var.astype(dt), slots, grad.astype(dt)


def _dense_ref(c, var, slots, grad, ftype=np.float64):
    """npref.dense_update's math (the rule's oracle) with NumPy hyper-parameters of `ftype`:
    npref converts them to Python floats, which raise ZeroDivisionError (e.g. adamax with
    beta1_power == 1) where the kernels (and NumPy) give Inf/NaN. With ftype=float32 this
    is the same formula evaluated in the kernels' compute type for half/bfloat16/float."""
    h = {k: ftype(v) for k, v in c["hyper"].items()}
    opts = dict(RULES[c["rule"]]["options"], **c["options"])
    with np.errstate(all="ignore"):
        return npref.ORACLES[c["rule"]].update(np.array(var, ftype),
                                               [np.array(s, ftype) for s in slots],
                                               np.array(grad, ftype), h, opts)


def expected(c, var, slots, grad, ftype=np.float64):
    """(new_var, [new_slots]) as npref.dense_update / sparse_update, in `ftype`."""
    if not c["sparse"]:
        return _dense_ref(c, var, slots, grad, ftype)
    new_var = np.array(var, ftype)
    new_slots = [np.array(s, ftype) for s in slots]
    rows, g = npref.sum_duplicates(grad, c["indices"])  # exact: dyadic gradients
    if rows.size:
        v, s = _dense_ref(c, new_var[rows], [x[rows] for x in new_slots], g.astype(ftype), ftype)
        new_var[rows] = v
        for x, r in zip(new_slots, s):
            x[rows] = r
    return new_var, new_slots


def _element_ok(got, exact, dt, tol, before):
    """Per element: got equals `exact` rounded to dt (NaN-aware) within tolerance.

    Finite: |got - exp| <= atol + rtol * max(|exp|, |before| + |exp - before|): the
    second term covers cancellation in `before - delta`, whose rounding error scales with
    the operands rather than with the (possibly much smaller) result."""
    with np.errstate(over="ignore", invalid="ignore"):
        exp = np.asarray(exact).astype(dt).astype(np.float64)
        scale = np.nan_to_num(np.abs(before) + np.abs(np.asarray(exact, np.float64) - before),
                              nan=0.0, posinf=0.0)
        allowed = tol["atol"] + tol["rtol"] * np.maximum(np.abs(exp), scale)
        close = np.abs(got - exp) <= allowed
    same_special = (np.isnan(got) & np.isnan(exp)) | (np.isinf(exp) & (got == exp))
    return np.where(np.isfinite(exp), close, same_special)


def assert_matches(actual, exacts, dtype, what, before):
    """Each element of `actual` must match one of the references in `exacts` (the float64
    reference, and for 16/32-bit dtypes the same formula evaluated in float32, the
    kernels' compute type: that one has the kernel's own cancellation where a slot
    update cancels and a large step (e.g. Adamax with beta1_power = 0.999: 100 * lr)
    amplifies it)."""
    dt = npref.np_dtype(dtype)
    assert actual.dtype == dt and actual.shape == exacts[0].shape, what
    got = actual.astype(np.float64)
    b = np.asarray(before, np.float64)
    tol = npref.tolerance(dtype)
    ok = np.zeros(got.shape, bool)
    for exact in exacts:
        ok |= _element_ok(got, exact, dt, tol, b)
    if not ok.all():
        i = tuple(np.argwhere(~ok)[0])
        raise AssertionError("%s: %d values off; first at %s: got %r, references %r, "
                             "before %r" % (what, (~ok).sum(), i, got[i],
                                            [e[i] for e in exacts], b[i]))


def check_result(c, before, after):
    """after: [var, *slots] from the op; before: the inputs."""
    var, slots, grad = before
    if c["error"] is not None:
        raise AssertionError("expected error %s, the op succeeded" % c["error"])
    refs = [expected(c, var, slots, grad)]
    if c["dtype"] != "double":
        refs.append(expected(c, var, slots, grad, np.float32))
    names = ["var"] + RULES[c["rule"]]["slots"]
    for k, (name, got, b) in enumerate(zip(names, after, [var] + slots)):
        exacts = [r[0] if k == 0 else r[1][k - 1] for r in refs]
        assert_matches(got, exacts, c["dtype"], "%s of %r" % (name, _brief(c)), b)
    if c["sparse"] and c["shape"][0]:
        untouched = np.setdiff1d(np.arange(c["shape"][0]), c["indices"])
        for name, b, a in zip(names, [var] + slots, after):
            assert b[untouched].tobytes() == a[untouched].tobytes(), (
                "untouched rows of %s changed: %r" % (name, _brief(c)))
    if c["sparse"] and c["indices"].size == 0 or 0 in c["shape"]:
        for name, b, a in zip(names, [var] + slots, after):
            assert b.tobytes() == a.tobytes(), "no-op changed %s: %r" % (name, _brief(c))


def assert_unchanged(before, after, c):
    var, slots, _ = before
    for i, (b, a) in enumerate(zip([var] + slots, after)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes(), "input %d changed by a rejected call: %r" % (
            i, _brief(c))


def _brief(c):
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in c.items()}


def wrapper(rule, sparse, resource):
    return fops.__dict__["%s%sapply_%s" % ("resource_" if resource else "",
                                          "sparse_" if sparse else "", rule)]


def op_args(c, var, slots, grad, hyper, indices):
    args = [var] + list(slots) + [hyper[h] for h in RULES[c["rule"]]["hyper"]] + [grad]
    return args + ([indices] if c["sparse"] else [])


# --- TF resource ops, eager (the main path) ---------------------------------------

def run_eager(c):
    var, slots, grad = arrays(c)
    tfdt = harness.TF_DTYPES[c["dtype"]]
    vs = [tf.Variable(x) for x in [var] + slots]
    hyper = {k: tf.constant(v, tfdt) for k, v in c["hyper"].items()}
    f = wrapper(c["rule"], c["sparse"], True)
    args = op_args(c, vs[0], vs[1:], tf.constant(grad), hyper,
                   None if c["indices"] is None else tf.constant(c["indices"]))
    if c["error"] is not None:
        with pytest.raises(tf.errors.InvalidArgumentError, match=c["error"]):
            f(*args, **c["options"])
        assert_unchanged((var, slots, grad), [v.numpy() for v in vs], c)
        return "rejected"
    f(*args, **c["options"])
    check_result(c, (var, slots, grad), [v.numpy() for v in vs])
    return "matched"


@fuzz_settings()
@given(case_st(sparse=False))
def test_resource_dense_eager(c):
    _count("resource_dense_eager", run_eager(c), c)


@fuzz_settings()
@given(case_st(sparse=True))
def test_resource_sparse_eager(c):
    _count("resource_sparse_eager", run_eager(c), c)


# --- TF ref ops, graph mode + Session (one pass; graphs are slow to build) ----------

def run_graph_ref(c):
    var, slots, grad = arrays(c)
    tfdt = harness.TF_DTYPES[c["dtype"]]
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        vs = [tf.compat.v1.Variable(x, use_resource=False) for x in [var] + slots]
        ph = lambda d: tf.compat.v1.placeholder(d, shape=None)  # noqa: E731
        hyper = {k: ph(tfdt) for k in c["hyper"]}
        g = ph(tfdt)
        i = None if c["indices"] is None else ph(tf.as_dtype(c["indices"].dtype))
        out = wrapper(c["rule"], c["sparse"], False)(
            *op_args(c, vs[0], vs[1:], g, hyper, i), **c["options"])
        feed = {hyper[k]: np.asarray(v, npref.np_dtype(c["dtype"]))
                for k, v in c["hyper"].items()}
        feed[g] = grad
        if i is not None:
            feed[i] = c["indices"]
        sess.run(tf.compat.v1.global_variables_initializer())
        if c["error"] is not None:
            with pytest.raises(tf.errors.InvalidArgumentError, match=c["error"]):
                sess.run(out, feed)
            assert_unchanged((var, slots, grad), sess.run(vs), c)
            return "rejected"
        got = sess.run(out, feed)
        after = sess.run(vs)
        assert got.tobytes() == after[0].tobytes(), "ref output != updated var"
        check_result(c, (var, slots, grad), after)
        return "matched"


@fuzz_settings(0.5)
@given(st.one_of(case_st(sparse=False), case_st(sparse=True)))
def test_ref_graph(c):
    _count("ref_graph", run_graph_ref(c), c)


# --- fusedopt._core (pybind11, NumPy in place) ---------------------------------------

def run_core(c, num_threads):
    var, slots, grad = arrays(c)
    v2, s2 = var.copy(), [s.copy() for s in slots]
    try:
        if c["sparse"]:
            _core.apply_sparse(c["rule"], v2, s2, grad, c["indices"], c["hyper"], c["options"],
                               num_threads=num_threads)
        else:
            _core.apply_dense(c["rule"], v2, s2, grad, c["hyper"], c["options"],
                              num_threads=num_threads)
    except ValueError as e:
        assert c["error"] is not None and re.search(c["error"], str(e)), (str(e), _brief(c))
        assert_unchanged((var, slots, grad), [v2] + s2, c)
        return "rejected"
    check_result(c, (var, slots, grad), [v2] + s2)
    return "matched"


@fuzz_settings()
@given(st.one_of(case_st(sparse=False), case_st(sparse=True)), st.sampled_from([1, 3]))
def test_core(c, num_threads):
    _count("core", run_core(c, num_threads), c)


# --- hostile callers (issue 16) -------------------------------------------------------
#
# Calls no honest caller makes: an input of another dtype, variables whose buffers are
# shared (a kept read, a variable cloned from another) or in copy-on-read mode (after a
# gather), the same variable twice, lists where arrays are updated in place, overlapping
# arrays, read-only / non-contiguous / misaligned arrays, hyper-parameters and options of
# the wrong type, thread counts from 0 to 2^31 - 1. Each must either be refused (a Python
# exception, every variable/array and every kept read bit-for-bit unchanged) or give
# exactly the result of the same update on clean, unshared inputs. The examples run in a
# child process: a call that aborts or crashes it fails the test and names the example.

HOSTILE_CHILD = os.environ.get("FUSEDOPT_HOSTILE_CHILD") == "1"
_NP_TYPES = ["half", "bfloat16", "float", "double", "int32", "int64"]
_REFUSED_OP = (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, TypeError, ValueError)


@st.composite
def hostile_op_st(draw):
    rule = draw(st.sampled_from(RULE_NAMES))
    names = ["var"] + RULES[rule]["slots"]
    dtype = draw(st.sampled_from(["half", "float", "double"]))
    sparse = draw(st.booleans())
    rows, inner = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    n = draw(st.integers(0, 6))
    c = dict(target="op", rule=rule, dtype=dtype, sparse=sparse, shape=(rows, inner),
             indices=draw(st.lists(st.integers(0, rows - 1), min_size=n, max_size=n)),
             seed=draw(st.integers(0, 2**32 - 1)), use_locking=draw(st.booleans()),
             share=draw(st.sampled_from(["none", "kept_read", "copy_on_read", "clone"])),
             wrong=None, wrong_dtype=None, alias=None, not_a_variable=None)
    fault = draw(st.sampled_from(["none", "dtype", "dtype", "alias", "not_a_variable"]))
    if fault == "dtype":
        c["wrong"] = draw(st.sampled_from(names + ["grad", "hyper"] + (["indices"] if sparse
                                                                       else [])))
        pool = (["float", "int32", "int64"] if c["wrong"] == "indices"
                else [t for t in _NP_TYPES if t != dtype])
        c["wrong_dtype"] = draw(st.sampled_from(pool))
    elif fault == "alias":
        i = draw(st.integers(0, len(names) - 2))
        c["alias"] = (i, draw(st.integers(i + 1, len(names) - 1)))
    elif fault == "not_a_variable":
        c["not_a_variable"] = draw(st.integers(1, len(names) - 1))
    # Refused: a state input or grad of another dtype, bad index dtype, aliasing, a list.
    c["refused"] = (c["alias"] is not None or c["not_a_variable"] is not None
                    or c["wrong"] not in (None, "hyper", "indices")
                    or (c["wrong"] == "indices" and c["wrong_dtype"] == "float"))
    return c


def _op_inputs(c):
    """(state arrays, grad, hyper, indices) of an op scenario, clean but for `wrong`."""
    rng = np.random.default_rng(c["seed"])
    var, slots = harness.make_state(c["rule"], c["shape"], c["dtype"], rng)
    state = [var] + slots
    names = ["var"] + RULES[c["rule"]]["slots"]
    n = len(c["indices"])
    grad = harness.make_grad((n, c["shape"][1]) if c["sparse"] else c["shape"], c["dtype"], rng)
    hyper = harness.hyper_for(c["rule"], c["dtype"], 1)
    indices = np.asarray(c["indices"], np.int64) if c["sparse"] else None
    wrong = npref.np_dtype(c["wrong_dtype"]) if c["wrong"] else None
    if c["wrong"] in names:
        state[names.index(c["wrong"])] = state[names.index(c["wrong"])].astype(wrong)
    elif c["wrong"] == "grad":
        grad = grad.astype(wrong)
    elif c["wrong"] == "hyper":
        hyper = {k: np.asarray(v).astype(wrong) for k, v in hyper.items()}
    elif c["wrong"] == "indices":
        indices = indices.astype(wrong)
    return state, grad, hyper, indices


def _call_op(c, vs, grad, hyper, indices):
    # grad as a tensor: the wrapper would convert a NumPy grad of another float dtype.
    args = [vs[0]] + list(vs[1:]) + [hyper[h] for h in RULES[c["rule"]]["hyper"]]
    args.append(tf.constant(grad))
    wrapper(c["rule"], c["sparse"], True)(*args + ([indices] if c["sparse"] else []),
                                          use_locking=c["use_locking"])


def run_hostile_op(c):
    state, grad, hyper, indices = _op_inputs(c)
    keep = []  # (tensor or variable that must keep its value, expected bytes)
    if c["share"] == "clone":  # each variable initialised from another: may share a buffer
        sources = [tf.Variable(x) for x in state]
        vs = [tf.Variable(s) for s in sources]
        keep += [(s, x.tobytes()) for s, x in zip(sources, state)]
    else:
        vs = [tf.Variable(x) for x in state]
    if c["share"] == "kept_read":
        keep += [(v.read_value(), x.tobytes()) for v, x in zip(vs, state)]
    elif c["share"] == "copy_on_read":
        keep += [(tf.gather(v, [0]), x[:1].tobytes()) for v, x in zip(vs, state)]
    args = list(vs)
    if c["alias"]:
        args[c["alias"][1]] = vs[c["alias"][0]]
    if c["not_a_variable"]:
        args[c["not_a_variable"]] = state[c["not_a_variable"]].tolist()
    try:
        _call_op(c, args, grad, hyper, indices)
    except _REFUSED_OP as e:
        assert c["refused"], ("refused a fine call", repr(e)[:500], _brief(c))
        after, outcome = [x.tobytes() for x in state], "refused"
    else:
        assert not c["refused"], ("accepted a call it must refuse", _brief(c))
        clean = [tf.Variable(x) for x in state]
        _call_op(c, clean, grad, hyper, indices)
        after, outcome = [v.numpy().tobytes() for v in clean], "accepted"
    for k, (v, want) in enumerate(zip(vs, after)):
        assert v.numpy().tobytes() == want, ("variable %d" % k, outcome, _brief(c))
    for t, want in keep:
        assert t.numpy().tobytes() == want, ("a kept read or clone source changed", _brief(c))
    return outcome


@st.composite
def hostile_core_st(draw):
    rule = draw(st.sampled_from(RULE_NAMES))
    sparse = draw(st.booleans())
    fault = draw(st.sampled_from([
        "none", "list_var", "list_slot", "tuple_slots", "slot_is_var", "slots_overlap",
        "grad_overlaps", "dtype", "dtype", "hyper_type", "option_type", "threads", "threads",
        "threads_below_1", "readonly", "noncontiguous", "misaligned"]))
    # Two elements at least where a fault needs them (a one-element array is contiguous
    # whatever its strides; views one element apart overlap only beyond one element).
    wide = fault in ("noncontiguous", "slots_overlap")
    rows, inner = draw(st.integers(1, 5)), draw(st.integers(2 if wide else 1, 3))
    n = draw(st.integers(2 if wide else 1, 6))
    c = dict(target="core", rule=rule, sparse=sparse, shape=(rows, inner), fault=fault,
             dtype=draw(st.sampled_from(["half", "bfloat16", "float", "double"])),
             indices=draw(st.lists(st.integers(0, rows - 1), min_size=n, max_size=n)),
             seed=draw(st.integers(0, 2**32 - 1)), threads=1, which=None, value=None)
    inputs = ["var"] + ["slot%d" % k for k in range(len(RULES[rule]["slots"]))] + ["grad"]
    if fault == "dtype":
        c["which"] = draw(st.sampled_from(inputs + (["indices"] if sparse else [])))
        c["value"] = draw(st.sampled_from(
            ["float", "uint32", "int16"] if c["which"] == "indices"
            else [t for t in _NP_TYPES if t != c["dtype"]] + [">f4"]))
    elif fault in ("readonly", "noncontiguous", "misaligned"):
        c["which"] = draw(st.sampled_from(inputs[:-1] if fault == "readonly" else inputs))
    elif fault == "hyper_type":
        c["which"] = draw(st.sampled_from(RULES[rule]["hyper"]))
        c["value"] = draw(st.sampled_from(["0.1", None, [0.1], 1j, "nan", np.ones(2)]))
    elif fault == "option_type":
        c["value"] = draw(st.sampled_from([1, 0, "yes", None, 1.0]))
    elif fault == "threads":
        c["threads"] = draw(st.sampled_from([2, 3, 257, 3000, 2**31 - 1]))
    elif fault == "threads_below_1":
        c["threads"] = draw(st.sampled_from([0, -1, -2**31]))
    c["refused"] = fault not in ("none", "tuple_slots", "threads")
    return c


def _core_inputs(c):
    rng = np.random.default_rng(c["seed"])
    var, slots = harness.make_state(c["rule"], c["shape"], c["dtype"], rng)
    n = len(c["indices"])
    grad = harness.make_grad((n, c["shape"][1]) if c["sparse"] else c["shape"], c["dtype"], rng)
    indices = np.asarray(c["indices"], np.int64) if c["sparse"] else None
    return var, slots, grad, indices


def _hostile_arrays(c, var, slots, grad, indices):
    """The scenario's (var, slots, grad, indices, hyper, options) built from clean copies."""
    var, slots, grad = var.copy(), [s.copy() for s in slots], grad.copy()
    hyper = harness.hyper_for(c["rule"], c["dtype"], 1)
    options, fault, which = {}, c["fault"], c["which"]
    named = {"var": var, "grad": grad, "indices": indices,
             **{"slot%d" % k: s for k, s in enumerate(slots)}}

    def replace(name, new):
        nonlocal var, grad, indices
        if name == "var":
            var = new
        elif name == "grad":
            grad = new
        elif name == "indices":
            indices = new
        else:
            slots[int(name[4:])] = new

    if fault == "list_var":
        var = var.tolist()
    elif fault == "list_slot":
        slots[0] = slots[0].tolist()
    elif fault == "tuple_slots":
        slots = tuple(slots)
    elif fault == "slot_is_var":
        slots[0] = var
    elif fault == "slots_overlap":  # var and slot 0: views one element apart
        buf = np.concatenate([var.ravel(), var.ravel()[:1]])
        var, slots[0] = buf[:-1].reshape(var.shape), buf[1:].reshape(var.shape)
    elif fault == "grad_overlaps":
        grad = var[:grad.shape[0]] if c["sparse"] else var
    elif fault == "dtype":
        replace(which, named[which].astype(npref.np_dtype(c["value"])))
    elif fault == "readonly":
        named[which].setflags(write=False)
    elif fault == "noncontiguous":
        a = named[which]
        wide = np.repeat(a[..., None], 2, axis=-1)
        replace(which, wide[..., 0])
    elif fault == "misaligned":
        a = named[which]
        raw = np.frombuffer(bytearray(a.nbytes + a.itemsize), np.uint8)[1:1 + a.nbytes]
        moved = raw.view(a.dtype).reshape(a.shape)
        moved[...] = a
        replace(which, moved)
    elif fault == "hyper_type":
        hyper[which] = c["value"]
    elif fault == "option_type":
        options = {next(iter(RULES[c["rule"]]["options"]), "bogus"): c["value"]}
    return var, slots, grad, indices, hyper, options


def _call_core(c, var, slots, grad, indices, hyper, options, threads):
    if c["sparse"]:
        _core.apply_sparse(c["rule"], var, slots, grad, indices, hyper, options,
                           num_threads=threads)
    else:
        _core.apply_dense(c["rule"], var, slots, grad, hyper, options, num_threads=threads)


def _bytes(x):
    return np.asarray(x).tobytes() if isinstance(x, np.ndarray) else repr(x)


def run_hostile_core(c):
    clean = _core_inputs(c)
    var, slots, grad, indices, hyper, options = _hostile_arrays(c, *clean)
    before = [_bytes(x) for x in [var, *slots, grad]]
    try:
        _call_core(c, var, slots, grad, indices, hyper, options, c["threads"])
    except (TypeError, ValueError) as e:
        assert c["refused"], ("refused a fine call", repr(e)[:500], _brief(c))
        assert [_bytes(x) for x in [var, *slots, grad]] == before, ("changed", _brief(c))
        return "refused"
    assert not c["refused"], ("accepted a call it must refuse", _brief(c))
    var0, slots0, grad0, indices0 = clean
    want_var, want_slots = var0.copy(), [s.copy() for s in slots0]
    _call_core(c, want_var, want_slots, grad0, indices0,
               harness.hyper_for(c["rule"], c["dtype"], 1), {}, 1)
    assert [_bytes(x) for x in [var, *slots]] == [_bytes(x) for x in [want_var, *want_slots]], (
        "result differs from the clean one-thread call", _brief(c))
    return "accepted"


@pytest.mark.skipif(not HOSTILE_CHILD, reason="runs in the child of test_hostile_callers")
@fuzz_settings(5)  # cheap examples (~15 ms): 300 in the ci profile
@given(st.one_of(hostile_op_st(), hostile_core_st()))
def test_hostile_caller(c):
    with open(os.environ["FUSEDOPT_HOSTILE_TRACE"], "w") as f:
        f.write(repr(_brief(c)))  # names the example if the process dies
    outcome = run_hostile_op(c) if c["target"] == "op" else run_hostile_core(c)
    for key in ("hostile_%s" % c["target"], "hostile_%s:%s" % (c["target"], outcome)):
        RUN_COUNTS[key] = RUN_COUNTS.get(key, 0) + 1


@pytest.mark.slow
@pytest.mark.skipif(HOSTILE_CHILD, reason="the parent of test_hostile_caller")
def test_hostile_callers(tmp_path):
    trace = tmp_path / "example"
    env = dict(os.environ, FUSEDOPT_HOSTILE_CHILD="1", FUSEDOPT_HOSTILE_TRACE=str(trace),
               HYPOTHESIS_PROFILE=_PROFILE)
    proc = harness.run_python_in_subprocess(
        "import sys, pytest; sys.exit(pytest.main(['-q', '-s', '-p', 'no:cacheprovider', "
        "'-k', 'test_hostile_caller and not callers', %r]))" % os.path.abspath(__file__),
        env_extra=env, timeout=1800)
    counts = re.findall(r"^fuzz examples run.*$", proc.stdout, re.M)
    print("\n" + (counts[-1] if counts else "no counts"))
    last = trace.read_text() if trace.exists() else None
    assert proc.returncode == 0, "%s; last example %s\n%s" % (
        harness.describe_exit(proc), last, proc.stdout[-6000:])
    assert re.search(r"\b1 passed", proc.stdout), proc.stdout[-3000:]
