"""The CUDA engine's hot-row summation and its no-host-sync sparse path.

Hot rows: rows named by many ids (Zipf batches give one row tens of thousands) are summed
by many GPU threads in the order of cc/core/sum_order.h, which the CPU engine shares, so
results still equal the CPU engine's bit for bit (float/double; 16-bit types too).

No host sync: apply_sparse(wait=False) enqueues the index check, coalescing and update and
returns at once with a PendingCheck; a bad index writes nothing and surfaces from
PendingCheck.result() as the CPU's ValueError.
"""
import numpy as np
import pytest

from gpu_harness import (HYPER, RULE_OPTIONS, assert_bits_equal, check_same, core, core_cuda,
                         cp, dtype_arg, make_state, requires_gpu, run_cpu, run_gpu, to_device,
                         to_host)

pytestmark = requires_gpu

LIMIT = 2147483646


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


def device_state(rule, dtype, var, slots, grad, indices):
    return (to_device(var), [to_device(s) for s in slots], to_device(grad), cp.asarray(indices))


def test_wait_false_returns_a_pending_check():
    rule, dtype = "lazy_adam", "float32"
    rng = np.random.default_rng(24)
    indices = hot_indices(rng, 1000, [3000], 20000).astype(np.int32)
    var, slots, grad = make_state(rule, dtype, (1000, 32), rng, grad_rows=indices.size)
    dvar, dslots, dgrad, dind = device_state(rule, dtype, var, slots, grad, indices)
    pending = core_cuda.apply_sparse(rule, dvar, dslots, dgrad, dind, HYPER[rule], wait=False)
    assert pending is not None
    assert pending.result() is None
    assert pending.done()
    check_same(rule, dtype, (to_host(dvar, dtype), [to_host(s, dtype) for s in dslots]),
               run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices))
    assert core_cuda.apply_sparse(rule, dvar, dslots, dgrad, dind, HYPER[rule]) is None


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
    dvar, dslots, dgrad, dind = device_state(rule, dtype, var, slots, grad, indices)
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


def test_no_host_sync_while_the_stream_is_busy():
    """With the stream held busy, apply_sparse(wait=False) returns before the stream has run
    anything: the engine never waits on the host (the old engine read its index check back
    synchronously, so this call would have blocked until the stream drained)."""
    rule, dtype = "adagrad", "float32"
    rng = np.random.default_rng(26)
    indices = rng.integers(0, 500, 4000).astype(np.int32)
    var, slots, grad = make_state(rule, dtype, (500, 8), rng, grad_rows=indices.size)
    stream = cp.cuda.Stream(non_blocking=True)
    # Warm up on a copy (first-call setup such as the host records for verdicts).
    warm = device_state(rule, dtype, var, slots, grad, indices)
    core_cuda.apply_sparse(rule, *warm[:3], warm[3], HYPER[rule], stream=stream.ptr)
    dvar, dslots, dgrad, dind = device_state(rule, dtype, var, slots, grad, indices)
    cp.cuda.runtime.deviceSynchronize()
    hold = hold_stream(stream)
    # Had the call waited for the stream, it would block here until the spin gives up
    # (~5 s), and done() would then be True.
    pending = core_cuda.apply_sparse(rule, dvar, dslots, dgrad, dind, HYPER[rule],
                                     stream=stream.ptr, wait=False)
    assert not pending.done()  # still held: nothing of the call has run
    release_stream(hold)
    pending.result()
    assert pending.done()
    check_same(rule, dtype, (to_host(dvar, dtype), [to_host(s, dtype) for s in dslots]),
               run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices))


_SPIN = None


def hold_stream(stream):
    """Keeps `stream` busy until release_stream(): a kernel spinning on a flag in mapped
    host memory (real GPU), or the stand-in's hold."""
    if hasattr(cp, "standin_hold"):
        return cp.standin_hold(stream)
    global _SPIN
    if _SPIN is None:
        _SPIN = cp.RawKernel(r'''
extern "C" __global__ void spin(volatile int* flag, long long max_cycles) {
  long long start = clock64();
  while (*flag == 0 && clock64() - start < max_cycles) {}
}''', "spin")
    flag = cp.cuda.alloc_pinned_memory(4)
    view = np.frombuffer(flag, np.int32, 1)
    view[0] = 0
    with stream:
        # ~5 s at 2 GHz at most, so a failing test cannot hang the suite.
        _SPIN((1,), (1,), (np.intp(flag.ptr), np.int64(10_000_000_000)))
    return view, flag


def release_stream(hold):
    if hasattr(cp, "standin_release"):
        cp.standin_release(hold)
        return
    view, _ = hold
    view[0] = 1


def test_more_than_the_limit_is_rejected_before_anything_runs():
    small = cp.zeros(8, cp.float32)
    rows = {"data": (small.data.ptr, False), "shape": (4, 0), "typestr": "<f4"}
    grad = {"data": (small.data.ptr, False), "shape": (LIMIT + 1, 0), "typestr": "<f4"}
    ids = cp.zeros(8, cp.int32)
    indices = {"data": (ids.data.ptr, False), "shape": (LIMIT + 1,), "typestr": "<i4"}
    for wait in (True, False):
        with pytest.raises(ValueError,
                           match=f"sparse updates take at most {LIMIT} indices per call, "
                                 f"got {LIMIT + 1}"):
            core_cuda.apply_sparse("adagrad", rows, [rows], grad, indices, HYPER["adagrad"],
                                   wait=wait)
