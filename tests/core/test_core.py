"""fusedopt._core (the TF-free kernels over NumPy arrays) against the NumPy reference,
thread-count invariance, error handling, and bit-equality with the TF ops."""

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import error_cases as ec
import harness
import numpy_reference as npref
from fusedopt import _core

RULES = npref.RULES
RULE_NAMES = sorted(RULES)
DTYPES = ["half", "bfloat16", "float", "double"]
INDEX_DTYPES = [np.int32, np.int64]
OPTION_SETS = harness.OPTION_SETS
RULE_OPTIONS = harness.RULE_OPTIONS
_ids = harness.param_ids


def test_rules():
    # The spec'd keys must match; extra keys (e.g. the TF op name) are allowed.
    rules = _core.rules()
    assert {r: {k: d[k] for k in ("slots", "hyper", "options", "slot_layouts")}
            for r, d in rules.items()} \
        == RULES


def test_dtypes_are_numpy_and_ml_dtypes():
    assert harness.np_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)


def _copy(arrs):
    return [a.copy() for a in arrs]


def _snapshot(arrs):
    return [a.tobytes() for a in arrs]


def run_steps(rule, dtype, options, sparse, index_dtype=np.int32, num_threads=1,
              shape=(9, 4), steps=3, seed=0, n_indices=None):
    """Several in-place _core steps, each checked against the NumPy reference."""
    rng = np.random.default_rng(seed)
    var, slots = harness.make_state(rule, shape, dtype, rng)
    for t in range(1, steps + 1):
        hyper = harness.hyper_for(rule, dtype, t)
        var_b, slots_b = var.copy(), _copy(slots)
        if sparse:
            n = n_indices if n_indices is not None else shape[0] + 3
            indices = harness.make_indices(n, shape[0], index_dtype, rng)
            grad = harness.make_grad((n,) + tuple(shape[1:]), dtype, rng)
            exp_var, exp_slots = npref.sparse_update(rule, var_b, slots_b, grad, indices,
                                                     hyper, options)
            grad_b, idx_b = grad.tobytes(), indices.tobytes()
            res = _core.apply_sparse(rule, var, slots, grad, indices, hyper, options,
                                     num_threads=num_threads)
            assert idx_b == indices.tobytes()
        else:
            grad = harness.make_grad(shape, dtype, rng)
            exp_var, exp_slots = npref.dense_update(rule, var_b, slots_b, grad, hyper, options)
            grad_b = grad.tobytes()
            res = _core.apply_dense(rule, var, slots, grad, hyper, options,
                                    num_threads=num_threads)
        assert res is None
        assert grad_b == grad.tobytes(), "grad modified"
        where = "%s %s step %d" % (rule, dtype, t)
        npref.assert_close(var, exp_var, dtype, "var " + where)
        for name, got, exp in zip(RULES[rule]["slots"], slots, exp_slots):
            npref.assert_close(got, exp, dtype, name + " " + where)
        if sparse:
            untouched = np.setdiff1d(np.arange(shape[0]), indices)
            assert untouched.size
            for b, a in zip([var_b] + slots_b, [var] + slots):
                assert b[untouched].tobytes() == a[untouched].tobytes()
    return var, slots


@pytest.mark.parametrize("num_threads", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule,options", RULE_OPTIONS, ids=_ids)
def test_dense_matches_numpy(rule, options, dtype, num_threads):
    run_steps(rule, dtype, options, sparse=False, num_threads=num_threads)


@pytest.mark.parametrize("num_threads", [1, 4])
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule,options", RULE_OPTIONS, ids=_ids)
def test_sparse_matches_numpy(rule, options, dtype, index_dtype, num_threads):
    run_steps(rule, dtype, options, sparse=True, index_dtype=index_dtype,
              num_threads=num_threads)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_rank3_and_default_options(rule, sparse):
    rng = np.random.default_rng(21)
    var, slots = harness.make_state(rule, (4, 3, 2), "double", rng)
    hyper = harness.hyper_for(rule, "double", 1)
    if sparse:
        idx = np.array([3, 1, 3], np.int64)
        grad = harness.make_grad((3, 3, 2), "double", rng)
        exp = npref.sparse_update(rule, var, slots, grad, idx, hyper)
        _core.apply_sparse(rule, var, slots, grad, idx, hyper)  # options, threads defaulted
    else:
        grad = harness.make_grad((4, 3, 2), "double", rng)
        exp = npref.dense_update(rule, var, slots, grad, hyper)
        _core.apply_dense(rule, var, slots, grad, hyper)
    for got, e in zip([var] + slots, [exp[0]] + exp[1]):
        npref.assert_close(got, e, "double")


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("dtype", ["half", "bfloat16"])
@pytest.mark.parametrize("rule,options", RULE_OPTIONS, ids=_ids)
def test_low_precision_computes_in_float32_and_rounds_once(rule, options, dtype, sparse):
    # Within ~1 ulp of the exact (float64) result; computing in half/bfloat16 is not.
    rng = np.random.default_rng(26)
    shape = (200, 24)
    var, slots = harness.make_state(rule, shape, dtype, rng)
    for t in range(1, 4):
        hyper = harness.hyper_for(rule, dtype, t)
        before = [var.copy()] + _copy(slots)
        if sparse:
            indices = rng.integers(0, shape[0], 300).astype(np.int64)
            grad = harness.make_grad((300, 24), dtype, rng)
            exp = npref.sparse_update(rule, var, slots, grad, indices, hyper, options)
            _core.apply_sparse(rule, var, slots, grad, indices, hyper, options)
        else:
            grad = harness.make_grad(shape, dtype, rng)
            exp = npref.dense_update(rule, var, slots, grad, hyper, options)
            _core.apply_dense(rule, var, slots, grad, hyper, options)
        for name, got, e, b in zip(["var"] + RULES[rule]["slots"], [var] + slots,
                                   [exp[0]] + exp[1], before):
            npref.assert_rounded_once(got, e, dtype, scale=b, err_msg="%s step %d" % (name, t))


# --- threads ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["dense", "sparse_int32", "sparse_int64"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_num_threads_bit_identical(rule, dtype, kind):
    rng = np.random.default_rng(22)
    shape = (2003, 37)
    var0, slots0 = harness.make_state(rule, shape, dtype, rng)
    hyper = harness.hyper_for(rule, dtype, 3)
    if kind == "dense":
        grad = harness.make_grad(shape, dtype, rng)
    else:
        indices = rng.integers(0, shape[0] - 100, 6000).astype(
            np.int32 if kind == "sparse_int32" else np.int64)
        grad = harness.make_grad((6000, 37), dtype, rng)
    results = []
    for threads in (1, 4, 3):
        var, slots = var0.copy(), _copy(slots0)
        if kind == "dense":
            _core.apply_dense(rule, var, slots, grad, hyper, {}, num_threads=threads)
        else:
            _core.apply_sparse(rule, var, slots, grad, indices, hyper, {},
                               num_threads=threads)
        results.append(_snapshot([var] + slots))
    assert results[0] == results[1] == results[2]
    assert results[0][0] != var0.tobytes()
    if kind == "dense":
        exp = npref.dense_update(rule, var0, slots0, grad, hyper)
    else:
        exp = npref.sparse_update(rule, var0, slots0, grad, indices, hyper)
    npref.assert_close(var, exp[0], dtype)


@pytest.mark.parametrize("rule", RULE_NAMES)
def test_skewed_ids_every_row_once_at_any_thread_count(rule):
    # The sparse step splits its rows among threads by cost (a row's table rows plus the
    # gradient rows it sums): with one id holding most of the batch, a thread's share may
    # fall inside that row's gradient rows. Every row must still be updated exactly once,
    # whatever the split: the same bits at every thread count, and the oracle's numbers.
    rng = np.random.default_rng(31)
    shape = (3000, 16)
    var0, slots0 = harness.make_state(rule, shape, "float", rng)
    hyper = harness.hyper_for(rule, "float", 3)
    hot = np.full(5000, 7, np.int64)  # one row, then a tail of rare ones, shuffled
    indices = np.concatenate([hot, rng.integers(0, shape[0], 3000)])
    indices = indices[rng.permutation(len(indices))]
    grad = harness.make_grad((len(indices), shape[1]), "float", rng)
    results = []
    for threads in (1, 2, 3, 5, 8):
        var, slots = var0.copy(), _copy(slots0)
        _core.apply_sparse(rule, var, slots, grad, indices, hyper, {}, num_threads=threads)
        results.append(_snapshot([var] + slots))
    assert all(r == results[0] for r in results[1:])
    expected = npref.sparse_update(rule, var0, slots0, grad, indices, hyper)
    npref.assert_close(var, expected[0], "float")
    untouched = np.setdiff1d(np.arange(shape[0]), indices)
    assert var[untouched].tobytes() == var0[untouched].tobytes()


# --- sparse semantics ---------------------------------------------------------------------

@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_duplicates_equal_presummed(rule, dtype, index_dtype):
    rng = np.random.default_rng(23)
    var0, slots0 = harness.make_state(rule, (6, 5), dtype, rng)
    indices = np.array([5, 0, 5, 2, 5, 0, 3], index_dtype)
    grad = harness.make_grad((7, 5), dtype, rng)
    hyper = harness.hyper_for(rule, dtype, 2)
    g2, i2 = harness.presum(grad, indices)
    a = [var0.copy()] + _copy(slots0)
    b = [var0.copy()] + _copy(slots0)
    _core.apply_sparse(rule, a[0], a[1:], grad, indices, hyper, {})
    _core.apply_sparse(rule, b[0], b[1:], g2, i2, hyper, {})
    for x, y in zip(a, b):
        if dtype in ("float", "double"):
            assert x.tobytes() == y.tobytes()
        else:
            npref.assert_close(x, y, dtype)
    for x, before in zip(a, [var0] + slots0):
        assert x[[1, 4]].tobytes() == before[[1, 4]].tobytes()


@pytest.mark.parametrize("num_threads", [1, 2])
def test_coalescing_buffers_reused_across_calls_of_any_size(num_threads):
    # The engine keeps its duplicate-grouping table per thread between calls: growing,
    # shrinking, all-unique after duplicates, and a batch past the retention limit
    # (> 2^17 ids, which drops the table afterwards) must all group exactly.
    rng = np.random.default_rng(31)
    rows = 3000
    var, slots = harness.make_state("lazy_adam", (rows, 1), "double", rng)
    hyper = harness.hyper_for("lazy_adam", "double", 1)
    for n, unique in [(50, False), (5000, False), (7, False), (2000, True), (1 << 18 | 3, False),
                      (300, False), (1, False)]:
        indices = (rng.permutation(rows)[:n] if unique else rng.integers(0, rows, n)).astype(np.int64)
        grad = rng.normal(0, 1, (n, 1))
        exp_var, exp_slots = npref.sparse_update("lazy_adam", var.copy(), _copy(slots), grad,
                                                 indices, hyper, {})
        _core.apply_sparse("lazy_adam", var, slots, grad, indices, hyper, {},
                           num_threads=num_threads)
        npref.assert_close(var, exp_var, "double", f"var after a batch of {n}")
        for got, exp in zip(slots, exp_slots):
            npref.assert_close(got, exp, "double", f"slot after a batch of {n}")


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES, ids=_ids)
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_empty_indices_and_empty_var(rule, index_dtype):
    rng = np.random.default_rng(24)
    var, slots = harness.make_state(rule, (5, 3), "float", rng)
    before = _snapshot([var] + slots)
    hyper = harness.hyper_for(rule, "float", 1)
    _core.apply_sparse(rule, var, slots, np.zeros((0, 3), np.float32),
                       np.zeros((0,), index_dtype), hyper, {}, num_threads=4)
    assert _snapshot([var] + slots) == before
    var, slots = harness.make_state(rule, (0, 3), "float", rng)
    _core.apply_dense(rule, var, slots, np.zeros((0, 3), np.float32), hyper, {})
    _core.apply_sparse(rule, var, slots, np.zeros((0, 3), np.float32),
                       np.zeros((0,), index_dtype), hyper, {})


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(rows=st.integers(1, 12), inner=st.sampled_from([(), (1,), (3,), (2, 2)]),
       indices=st.lists(st.integers(0, 11), max_size=20),
       rule=st.sampled_from(RULE_NAMES), threads=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 2**16))
def test_sparse_property(rows, inner, indices, rule, threads, seed):
    indices = np.array([i % rows for i in indices], np.int64)
    rng = np.random.default_rng(seed)
    var, slots = harness.make_state(rule, (rows,) + inner, "double", rng)
    grad = harness.make_grad((len(indices),) + inner, "double", rng)
    hyper = harness.hyper_for(rule, "double", 1 + seed % 5)
    exp = npref.sparse_update(rule, var, slots, grad, indices, hyper)
    _core.apply_sparse(rule, var, slots, grad, indices, hyper, {}, num_threads=threads)
    for got, e in zip([var] + slots, [exp[0]] + exp[1]):
        npref.assert_close(got, e, "double")


# --- errors ---------------------------------------------------------------------------------

# Hyper-parameters go in as the cases' NumPy arrays (0-d, or [2] for "not a scalar").
CORE_CASES = ec.CASES


@pytest.mark.parametrize("case", CORE_CASES, ids=[c.id for c in CORE_CASES])
def test_errors_raise_value_error_and_change_nothing(case):
    var, slots = case.var.copy(), _copy(case.slots)
    hyper = dict(case.hyper)
    before = _snapshot([var] + slots)
    with pytest.raises(ValueError, match=case.message):
        if case.sparse:
            _core.apply_sparse(case.rule, var, slots, case.grad, case.indices, hyper, {},
                               num_threads=4)
        else:
            _core.apply_dense(case.rule, var, slots, case.grad, hyper, {}, num_threads=4)
    assert _snapshot([var] + slots) == before


def _lenient_bad_calls():
    """Bad calls whose exact exception/message the spec leaves open (ValueError or
    TypeError); what matters is that they are refused and change nothing."""
    f32 = lambda *s: np.ones(s, np.float32)  # noqa: E731
    h = harness.hyper_for("adagrad", "float", 1)
    return {
        "unknown_rule": ("dense", "sgd", [f32(3)], f32(3), h, {}),
        "missing_hyper": ("dense", "adagrad", [f32(3)], f32(3), {"lr": 0.1}, {}),
        "unknown_option": ("dense", "adagrad", [f32(3)], f32(3), h, {"bogus": True}),
        "too_few_slots": ("dense", "lazy_adam", [f32(3)], f32(3),
                          harness.hyper_for("lazy_adam", "float", 1), {}),
        "slot_dtype": ("dense", "adagrad", [np.ones(3, np.float64)], f32(3), h, {}),
        "grad_dtype": ("dense", "adagrad", [f32(3)], np.ones(3, np.float64), h, {}),
        "noncontiguous_grad": ("dense", "adagrad", [f32(3)], f32(3, 2)[:, 0], h, {}),
        "noncontiguous_slot": ("dense", "adagrad", [f32(3, 2)[:, 1]], f32(3), h, {}),
        "int_var": ("dense_intvar", "adagrad", [np.ones(3, np.int32)],
                    np.ones(3, np.int32), h, {}),
        "float_indices": ("sparse", "adagrad", [f32(3)], f32(2), h, {}),
    }


@pytest.mark.parametrize("name", sorted(_lenient_bad_calls()))
def test_bad_calls_refused_without_side_effects(name):
    kind, rule, slots, grad, hyper, options = _lenient_bad_calls()[name]
    var = np.ones(3, np.int32) if kind == "dense_intvar" else np.full(3, 2.0, np.float32)
    before = _snapshot([var] + slots)
    with pytest.raises((ValueError, TypeError)):
        if kind == "sparse":
            _core.apply_sparse(rule, var, slots, grad, np.array([0.0, 1.0]), hyper, options)
        else:
            _core.apply_dense(rule, var, slots, grad, hyper, options)
    assert _snapshot([var] + slots) == before


def test_noncontiguous_var_refused():
    base = np.full((3, 2), 2.0, np.float32)
    var = base[:, 0]
    accum = np.ones(3, np.float32)
    before = base.tobytes()
    with pytest.raises((ValueError, TypeError)):
        _core.apply_dense("adagrad", var, [accum], np.ones(3, np.float32),
                          harness.hyper_for("adagrad", "float", 1), {})
    assert base.tobytes() == before and not (accum != 1).any()


# --- same kernels as the TF ops ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["dense", "sparse_int32", "sparse_int64"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule,options", RULE_OPTIONS, ids=_ids)
def test_bit_identical_to_tf_op(rule, options, dtype, kind):
    tf = pytest.importorskip("tensorflow")
    import fusedopt.ops as fops

    rng = np.random.default_rng(25)
    shape = (513, 9)
    var0, slots0 = harness.make_state(rule, shape, dtype, rng)
    vs = [tf.Variable(x) for x in [var0] + slots0]
    var, slots = var0.copy(), _copy(slots0)
    sparse = kind != "dense"
    for t in range(1, 3):
        hyper = harness.hyper_for(rule, dtype, t)
        args = [vs[0]] + vs[1:] + [hyper[h] for h in RULES[rule]["hyper"]]
        if sparse:
            indices = rng.integers(0, shape[0], 700).astype(
                np.int32 if kind == "sparse_int32" else np.int64)
            grad = harness.make_grad((700, 9), dtype, rng)
            getattr(fops, "resource_sparse_apply_" + rule)(*args, grad, indices, **options)
            _core.apply_sparse(rule, var, slots, grad, indices, hyper, options, num_threads=2)
        else:
            grad = harness.make_grad(shape, dtype, rng)
            getattr(fops, "resource_apply_" + rule)(*args, grad, **options)
            _core.apply_dense(rule, var, slots, grad, hyper, options, num_threads=2)
        for name, v, a in zip(["var"] + RULES[rule]["slots"], vs, [var] + slots):
            assert v.numpy().tobytes() == a.tobytes(), "%s differs at step %d" % (name, t)


# --- hostile callers (issue 16) --------------------------------------------------------------

def _adagrad_args(n=3, dtype=np.float64):
    return np.full(n, 2.0, dtype), [np.ones(n, dtype)], np.full(n, 0.5, dtype)


HYPER = {"lr": 0.1, "epsilon": 1e-7}


@pytest.mark.parametrize("where", ["var", "slot"])
@pytest.mark.parametrize("container", [list, tuple])
def test_var_and_slots_must_be_ndarrays_not_sequences(where, container):
    # pybind11 would convert a list into a temporary array, update that and drop it.
    var, slots, grad = _adagrad_args()
    if where == "var":
        var = container(var.tolist())
    else:
        slots = [container(slots[0].tolist())]
    before = [list(var), list(slots[0])]
    name = "var" if where == "var" else "accum"
    with pytest.raises(TypeError, match=r"%s must be a numpy\.ndarray .*got %s"
                       % (name, container.__name__)):
        _core.apply_dense("adagrad", var, slots, grad, HYPER)
    with pytest.raises(TypeError, match=name + r" must be a numpy\.ndarray"):
        _core.apply_sparse("adagrad", var, slots, grad[:2], np.array([0, 2]), HYPER)
    assert [list(var), list(slots[0])] == before


def test_slots_may_be_a_list_or_tuple_of_arrays_but_nothing_else():
    var, slots, grad = _adagrad_args()
    _core.apply_dense("adagrad", var, tuple(slots), grad, HYPER)
    assert (slots[0] == 1.25).all() and (var < 2).all()
    with pytest.raises(TypeError, match="slots must be a list of numpy.ndarrays, got dict"):
        _core.apply_dense("adagrad", var, {"accum": slots[0]}, grad, HYPER)


def _overlaps():
    """(name, rule, var, slots, grad, indices or None, message): buffers sharing memory."""
    buf = np.zeros(12)
    a, b, c = buf[0:4], buf[3:7], buf[8:12]  # a and b share one element
    raw = np.zeros(8, np.float32)
    ints = np.zeros(4, np.int64)
    return [
        ("var_is_slot", "adagrad", a, [a], np.ones(4), None, "var and accum overlap"),
        ("slot_overlaps_var", "adagrad", a, [b], np.ones(4), None, "var and accum overlap"),
        ("two_slots_same", "lazy_adam", c, [a, a], np.ones(4), None, "m and v overlap"),
        ("shifted_views", "adagrad", raw[:4], [raw[2:6]], np.ones(4, np.float32), None,
         "var and accum overlap"),
        ("grad_is_var", "adagrad", a, [c], a, None, "grad overlaps var"),
        ("grad_overlaps_slot", "adagrad", c, [a], b, None, "grad overlaps accum"),
        ("sparse_grad_overlaps_slot", "adagrad", np.zeros((4, 1)), [buf[:4].reshape(4, 1)],
         buf[3:5].reshape(2, 1), np.array([0, 1]), "grad overlaps accum"),
        ("indices_are_var_bytes", "adagrad", ints.view(np.float64), [np.zeros(4)], np.ones(2),
         ints[:2], "indices overlaps var"),
    ]


@pytest.mark.parametrize("name,rule,var,slots,grad,indices,message", _overlaps(),
                         ids=[o[0] for o in _overlaps()])
def test_overlapping_buffers_rejected_and_nothing_written(name, rule, var, slots, grad, indices,
                                                          message):
    hyper = harness.hyper_for(rule, "double" if var.dtype == np.float64 else "float", 1)
    arrays = [var] + slots + [grad] + ([indices] if indices is not None else [])
    before = _snapshot(arrays)
    with pytest.raises(ValueError, match=message):
        if indices is None:
            _core.apply_dense(rule, var, slots, grad, hyper, num_threads=2)
        else:
            _core.apply_sparse(rule, var, slots, grad, indices, hyper, num_threads=2)
    assert _snapshot(arrays) == before


def test_adjacent_views_of_one_buffer_are_fine():
    buf = np.zeros(12)
    var, accum, grad = buf[0:4], buf[4:8], buf[8:12]
    var[:], accum[:], grad[:] = 2.0, 1.0, 0.5
    _core.apply_dense("adagrad", var, [accum], grad, HYPER)
    assert (accum == 1.25).all() and (grad == 0.5).all() and (var < 2).all()


def test_misaligned_arrays_rejected():
    raw = bytearray(8 * 10)
    var = np.frombuffer(raw, np.float64, count=3, offset=1)  # writeable, C-contiguous, unaligned
    assert not var.flags.aligned and var.flags.writeable
    with pytest.raises(ValueError, match="var is not aligned to its 8-byte elements"):
        _core.apply_dense("adagrad", var, [np.ones(3)], np.ones(3), HYPER)
    assert bytes(raw) == bytes(80)


@pytest.mark.parametrize("threads", [3000, 2**31 - 1])
def test_huge_thread_counts_are_capped(threads):
    # Up to 256 threads start; the result is the one-thread result, bit for bit.
    n = 1 << 20
    rng = np.random.default_rng(7)
    var0, slots0 = harness.make_state("adagrad", (n,), "float", rng)
    grad = harness.make_grad((n,), "float", rng)
    results = []
    for t in (1, threads):
        var, slots = var0.copy(), _copy(slots0)
        _core.apply_dense("adagrad", var, slots, grad, HYPER, num_threads=t)
        results.append(_snapshot([var] + slots))
    assert results[0] == results[1]


@pytest.mark.parametrize("threads", [0, -5])
def test_thread_count_below_one_rejected(threads):
    var, slots, grad = _adagrad_args()
    with pytest.raises(ValueError, match="num_threads must be at least 1, got %d" % threads):
        _core.apply_dense("adagrad", var, slots, grad, HYPER, num_threads=threads)
    assert (var == 2).all()


# Threads that cannot start (no address space for their stacks) used to std::terminate the
# process; now: RuntimeError, nothing written, and the next call works. In a subprocess,
# under an address-space limit with room for about three thread stacks (24 threads for the
# sparse call, 256 for the dense one).
_THREAD_FAILURE_SCRIPT = r"""
import resource
import numpy as np
from fusedopt import _core

hyper = {"lr": 0.1, "epsilon": 1e-7}
soft_stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
stack = soft_stack if soft_stack != resource.RLIM_INFINITY else 8 << 20
for kind, n in (("dense", 1 << 22), ("sparse", 1 << 17)):
    var, accum = np.full(n, 2.0, np.float32), np.ones(n, np.float32)
    grad = np.full(n, 0.5, np.float32)
    idx = np.arange(n, dtype=np.int64)
    # The engine keeps its grouping buffers per thread: allocate them before the limit.
    _core.apply_sparse("adagrad", var.copy(), [accum.copy()], grad, idx, hyper)
    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize")) * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm + 3 * stack + (4 << 20), hard))
    try:
        if kind == "dense":
            _core.apply_dense("adagrad", var, [accum], grad, hyper, num_threads=3000)
        else:
            _core.apply_sparse("adagrad", var, [accum], grad, idx, hyper, num_threads=3000)
    except RuntimeError as e:
        print(kind, "RuntimeError:", e)
    else:
        print(kind, "no error")
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    print(kind, "unchanged:", bool((var == 2).all() and (accum == 1).all()))
    _core.apply_dense("adagrad", var, [accum], grad, hyper, num_threads=2)
    print(kind, "next call works:", bool((accum == 1.25).all()))
"""


def test_thread_start_failure_raises_and_writes_nothing():
    proc = harness.run_python_in_subprocess(_THREAD_FAILURE_SCRIPT)
    assert proc.returncode == 0, "%s:\n%s" % (harness.describe_exit(proc), proc.stdout[-3000:])
    for kind in ("dense", "sparse"):
        assert re.search(kind + r" RuntimeError: could not start thread \d+ of \d+ \(.*\); "
                         r"nothing was run", proc.stdout), proc.stdout
        assert "%s unchanged: True" % kind in proc.stdout
        assert "%s next call works: True" % kind in proc.stdout


@pytest.mark.parametrize("value,message", [
    ("0.1", r"hyper-parameter lr must be a real number \(float\), got str"),
    (None, r"hyper-parameter lr must be a real number \(float\), got NoneType"),
    ([0.1], r"hyper-parameter lr must be a real number \(float\), got list"),
    (1j, r"hyper-parameter lr must be a real number \(float\), got complex"),
])
def test_hyper_parameter_of_wrong_type_named(value, message):
    var, slots, grad = _adagrad_args()
    with pytest.raises(TypeError, match=message):
        _core.apply_dense("adagrad", var, slots, grad, {"lr": value, "epsilon": 1e-7})
    assert (var == 2).all() and (slots[0] == 1).all()


@pytest.mark.parametrize("value", [np.float32(0.1), np.array(0.1), 1, True, np.int64(1)])
def test_hyper_parameter_numbers_accepted(value):
    var, slots, grad = _adagrad_args()
    _core.apply_dense("adagrad", var, slots, grad, {"lr": value, "epsilon": 1e-7})
    assert (var < 2).all()


@pytest.mark.parametrize("value", [1, "yes", None, 1.0])
def test_option_of_wrong_type_named(value):
    var, slots, grad = _adagrad_args()
    with pytest.raises(TypeError, match="option update_slots must be a bool, got %s"
                       % type(value).__name__):
        _core.apply_dense("adagrad", var, slots, grad, HYPER, {"update_slots": value})
    assert (var == 2).all() and (slots[0] == 1).all()
    _core.apply_dense("adagrad", var, slots, grad, HYPER, {"update_slots": np.bool_(False)})
    assert (slots[0] == 1).all() and (var < 2).all()
