"""Property-based fuzzing of every fused op (hypothesis).

Each example draws a rule and its options, a dtype, a shape (rank 0..4 dense, 1..4
sparse; zero rows, inner dimension 1 or 0), an index dtype and indices (duplicates,
negatives, out-of-range, empty), gradients with NaN/+-Inf sprinkled in and
hyper-parameters that are sometimes NaN/Inf/0/1/negative.  The op must then either

* match the NumPy reference (tests/numpy_reference.py's formulas, in float64 or, for
  16/32-bit dtypes, in float32, the kernels' compute type) after rounding it to the var
  dtype, NaN-aware: NaN where the reference has NaN, the same infinities, the per-dtype
  tolerance elsewhere; rows a sparse update does not name stay bit-for-bit unchanged; or
* raise the documented error (docs/API_SPEC.md) with var and every slot bit-for-bit
  unchanged.

Gradients are small dyadic rationals (k * 2**-s, |k| <= 64) so that summing duplicate
rows is exact in every compute type and the float64 reference sees the same sums.

Profiles (registered here): "ci" (default; bounded, derandomized) and "long"
(thousands of examples): ``HYPOTHESIS_PROFILE=long pytest tests/test_fuzz.py``.
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
        else:
            h[name] = draw(st.sampled_from(_NORMAL_HYPER[name]))
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
        s = rng.uniform(-1, 1, shape) if name == "m" else rng.uniform(0, 2, shape)
        if name != "m" and s.size:
            s[rng.random(shape) < 0.2] = 0.0
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
    """npref.dense_update's math (npref._MATH) with NumPy hyper-parameters of `ftype`:
    npref converts them to Python floats, which raise ZeroDivisionError (e.g. adamax with
    beta1_power == 1) where the kernels (and NumPy) give Inf/NaN. With ftype=float32 this
    is the same formula evaluated in the kernels' compute type for half/bfloat16/float."""
    h = {k: ftype(v) for k, v in c["hyper"].items()}
    opts = dict(RULES[c["rule"]]["options"], **c["options"])
    with np.errstate(all="ignore"):
        return npref._MATH[c["rule"]](np.array(var, ftype), *[np.array(s, ftype) for s in slots],
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
