"""_core_cuda.apply_sparse(..., wait=False): enqueued without synchronising, the index check
reported later by the returned PendingCheck (done() / result()); and the per-call limit on
the number of indices. Same harness as test_gpu_core.py (a GPU, or the CPU stand-in)."""
import numpy as np
import pytest

from gpu_harness import (HYPER, StreamHold, assert_bits_equal, check_same, core, core_cuda, cp,
                         make_state, requires_gpu, run_cpu, to_device, to_host)

pytestmark = requires_gpu

RULE, DTYPE = "lazy_adam", "float32"


def device_state(seed, rows=200, n=600, width=8):
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, rows, n)
    var, slots, grad = make_state(RULE, DTYPE, (rows, width), rng, grad_rows=n)
    return indices, (var, slots, grad)


def on_device(var, slots, grad, indices):
    d = to_device(var), [to_device(s) for s in slots], to_device(grad), cp.asarray(indices)
    cp.cuda.runtime.deviceSynchronize()
    return d


def host_state(dvar, dslots):
    return to_host(dvar, DTYPE), [to_host(s, DTYPE) for s in dslots]


@pytest.mark.parametrize("index_type", ["int32", "int64"])
def test_returns_before_the_check_and_result_reports_success(index_type):
    indices, (var, slots, grad) = device_state(11)
    indices = indices.astype(index_type)
    dvar, dslots, dgrad, dindices = on_device(var, slots, grad, indices)
    stream = cp.cuda.Stream(non_blocking=True)
    with StreamHold(stream) as hold:
        pending = core_cuda.apply_sparse(RULE, dvar, dslots, dgrad, dindices, HYPER[RULE],
                                         stream=stream.ptr, wait=False)
        # Had the call synchronised, it would have outwaited the hold and the check be done.
        assert not pending.done()
        hold.release()
        assert pending.result() is None
    assert pending.done()
    stream.synchronize()
    check_same(RULE, DTYPE, host_state(dvar, dslots),
               run_cpu(RULE, var, slots, grad, HYPER[RULE], {}, indices))


@pytest.mark.parametrize("index_type", ["int32", "int64"])
def test_out_of_range_is_raised_by_result_with_nothing_written(index_type):
    """And the stream goes on: an update enqueued after the rejected one applies."""
    indices, (var, slots, grad) = device_state(12)
    bad = indices.astype(index_type)
    bad[[17, 40]] = [-3, 200]
    with pytest.raises(ValueError) as cpu_error:
        run_cpu(RULE, var, slots, grad, HYPER[RULE], {}, bad)
    good = indices.astype(index_type)
    dvar, dslots, dgrad, dbad = on_device(var, slots, grad, bad)
    dgood = cp.asarray(good)
    stream = cp.cuda.Stream(non_blocking=True)
    with StreamHold(stream) as hold:
        rejected = core_cuda.apply_sparse(RULE, dvar, dslots, dgrad, dbad, HYPER[RULE],
                                          stream=stream.ptr, wait=False)
        accepted = core_cuda.apply_sparse(RULE, dvar, dslots, dgrad, dgood, HYPER[RULE],
                                          stream=stream.ptr, wait=False)
        assert not rejected.done() and not accepted.done()
        hold.release()
        with pytest.raises(ValueError) as gpu_error:
            rejected.result()
        assert accepted.result() is None
    assert str(gpu_error.value) == str(cpu_error.value) == "indices[17] = -3 is not in [0, 200)"
    stream.synchronize()
    check_same(RULE, DTYPE, host_state(dvar, dslots),
               run_cpu(RULE, var, slots, grad, HYPER[RULE], {}, good))


def test_rejected_alone_leaves_var_and_slots_unchanged():
    indices, (var, slots, grad) = device_state(13)
    indices[5] = 10**6
    dvar, dslots, dgrad, dindices = on_device(var, slots, grad, indices)
    stream = cp.cuda.Stream(non_blocking=True)
    pending = core_cuda.apply_sparse(RULE, dvar, dslots, dgrad, dindices, HYPER[RULE],
                                     stream=stream.ptr, wait=False)
    with pytest.raises(ValueError, match=r"^indices\[5\] = 1000000 is not in \[0, 200\)$"):
        pending.result()
    stream.synchronize()
    check_same(RULE, DTYPE, host_state(dvar, dslots), (var, slots))


def test_empty_indices_give_a_check_that_is_already_done():
    _, (var, slots, grad) = device_state(14, n=0)
    dvar, dslots, dgrad, dindices = on_device(var, slots, grad, np.zeros(0, np.int64))
    stream = cp.cuda.Stream(non_blocking=True)
    with StreamHold(stream):
        pending = core_cuda.apply_sparse(RULE, dvar, dslots, dgrad, dindices, HYPER[RULE],
                                         stream=stream.ptr, wait=False)
        assert pending.done()
        assert pending.result() is None
    stream.synchronize()
    check_same(RULE, DTYPE, host_state(dvar, dslots), (var, slots))


@pytest.mark.parametrize("wait", [True, False])
def test_shape_and_dtype_errors_are_raised_by_the_call(wait):
    """At call time, on a busy stream, in both modes; with the CPU engine's words."""
    indices, (var, slots, grad) = device_state(15)
    dvar, dslots, dgrad, dindices = on_device(var, slots, grad, indices)
    short_grad = to_device(grad[:-1])
    with pytest.raises(ValueError) as cpu_error:
        core.apply_sparse(RULE, var.copy(), [s.copy() for s in slots], grad[:-1], indices,
                          HYPER[RULE])
    stream = cp.cuda.Stream(non_blocking=True)
    with StreamHold(stream):
        with pytest.raises(ValueError) as gpu_error:
            core_cuda.apply_sparse(RULE, dvar, dslots, short_grad, dindices, HYPER[RULE],
                                   stream=stream.ptr, wait=wait)
        assert str(gpu_error.value) == str(cpu_error.value)
        with pytest.raises(ValueError, match="must share one dtype"):
            core_cuda.apply_sparse(RULE, dvar, dslots, to_device(grad.astype(np.float64)),
                                   dindices, HYPER[RULE], stream=stream.ptr, wait=wait)
        with pytest.raises(ValueError, match="missing hyper-parameter lr"):
            hyper = {k: v for k, v in HYPER[RULE].items() if k != "lr"}
            core_cuda.apply_sparse(RULE, dvar, dslots, dgrad, dindices, hyper,
                                   stream=stream.ptr, wait=wait)
    stream.synchronize()
    check_same(RULE, DTYPE, host_state(dvar, dslots), (var, slots))


@pytest.mark.parametrize("wait", [True, False])
@pytest.mark.parametrize("n,typestr", [(2**31 - 1, "<i4"), (2**31 + 5, "<i8")])
def test_more_than_2147483646_indices_is_a_value_error(n, typestr, wait):
    """Rows of width 0 keep grad empty, and the indices are raw-pointer dicts over a small
    allocation: the limit must be enforced before any index is read."""
    rule = "adagrad"
    backing = cp.asarray(np.zeros(16, np.int64))
    var, slot = to_device(np.zeros((10, 0), np.float32)), to_device(np.zeros((10, 0), np.float32))
    grad = dict(data=(backing.data.ptr, False), shape=(n, 0), typestr="<f4", version=3)
    indices = dict(data=(backing.data.ptr, False), shape=(n,), typestr=typestr, version=3)
    with pytest.raises(ValueError, match="2147483646"):
        core_cuda.apply_sparse(rule, var, [slot], grad, indices, HYPER[rule], wait=wait)
    cp.cuda.runtime.deviceSynchronize()
