"""The CUDA engine's hot rows: rows named by many ids (Zipf batches give one row tens of
thousands) are summed by many GPU threads in the order of cc/core/sum_order.h, which the CPU
engine shares, so results still equal the CPU engine's bit for bit (every dtype), and a bad
index elsewhere in the batch stops the hot-row kernels from writing too.
(apply_sparse(wait=False) itself: test_gpu_sparse_async.py.)
"""
import numpy as np
import pytest

from gpu_harness import (HYPER, RULE_OPTIONS, assert_bits_equal, check_same, core_cuda, cp,
                         make_state, requires_gpu, run_cpu, run_gpu, to_device, to_host)

pytestmark = requires_gpu

def hot_indices(rng, rows, counts, background):
    """Rows 0.. named counts[k] times each, plus `background` Zipf ids, shuffled."""
    hot = np.concatenate([np.full(c, k, np.int64) for k, c in enumerate(counts)])
    rest = np.minimum(rng.zipf(1.2, background) - 1, rows - 1)
    indices = np.concatenate([hot, rest])
    rng.shuffle(indices)
    return indices


@pytest.mark.parametrize("index_type", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("rule,options", RULE_OPTIONS)
def test_hot_rows_equal_cpu(rule, options, dtype, index_type):
    rng = np.random.default_rng(21)
    rows = 3000
    # Each regime of sum_order.h: one chain, chunks of 32, chunks of ceil(sqrt(count)).
    counts = [1, 31, 32, 33, 64, 1000, 1024, 1025, 4097, 20000]
    indices = hot_indices(rng, rows, counts, 5000).astype(index_type)
    var, slots, grad = make_state(rule, dtype, (rows, 24), rng, grad_rows=indices.size)
    hyper = HYPER[rule]
    check_same(rule, dtype, run_gpu(rule, dtype, var, slots, grad, hyper, options, indices),
               run_cpu(rule, var, slots, grad, hyper, options, indices))


@pytest.mark.parametrize("row_shape", [(), (1,), (7,), (256,), (700,)])
def test_hot_rows_every_row_width(row_shape):
    rule, dtype = "lazy_adam", "float32"
    rng = np.random.default_rng(22)
    rows = 200
    indices = hot_indices(rng, rows, [40, 2000, 1100], 300).astype(np.int32)
    var, slots, grad = make_state(rule, dtype, (rows,) + row_shape, rng, grad_rows=indices.size)
    check_same(rule, dtype, run_gpu(rule, dtype, var, slots, grad, HYPER[rule], {}, indices),
               run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices))


def test_one_row_named_by_every_id():
    """The extreme: a whole 200K-id batch on one row (the two-level sum at its longest)."""
    rule, dtype = "adagrad", "float32"
    rng = np.random.default_rng(23)
    indices = np.full(200_000, 5, np.int64)
    var, slots, grad = make_state(rule, dtype, (10, 64), rng, grad_rows=indices.size)
    gpu = run_gpu(rule, dtype, var, slots, grad, HYPER[rule], {}, indices)
    check_same(rule, dtype, gpu, run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices))
    others = np.arange(10) != 5
    assert_bits_equal(gpu[0][others], var[others], "rows not named")


@pytest.mark.parametrize("bad", [(0, -1), (25_000, 1000), (7, 2**31 - 1)])
def test_bad_index_is_reported_later_and_writes_nothing(bad):
    """Hot rows in the batch too: every update kernel (plain and hot-row) must skip."""
    rule, dtype = "adamax", "float32"
    rng = np.random.default_rng(25)
    indices = hot_indices(rng, 1000, [5000, 40], 20000).astype(np.int64)
    position, value = bad
    indices[position] = value
    indices[-1] = -7  # a later offender: the first one is reported
    var, slots, grad = make_state(rule, dtype, (1000, 16), rng, grad_rows=indices.size)
    with pytest.raises(ValueError) as cpu_error:
        run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices)
    dvar, dslots = to_device(var), [to_device(s) for s in slots]
    dgrad, dind = to_device(grad), cp.asarray(indices)
    pending = core_cuda.apply_sparse(rule, dvar, dslots, dgrad, dind, HYPER[rule], wait=False)
    with pytest.raises(ValueError) as gpu_error:
        pending.result()
    assert str(gpu_error.value) == str(cpu_error.value) == \
        f"indices[{position}] = {value} is not in [0, 1000)"
    assert_bits_equal(to_host(dvar, dtype), var, "var after a rejected call")
    for d, s in zip(dslots, slots):
        assert_bits_equal(to_host(d, dtype), s, "slot after a rejected call")
    with pytest.raises(ValueError, match=r"indices\[%d\]" % position):  # wait=True: at the call
        core_cuda.apply_sparse(rule, dvar, dslots, dgrad, dind, HYPER[rule])
    assert_bits_equal(to_host(dvar, dtype), var, "var after a second rejected call")
