"""The CUDA engine (fusedopt._core_cuda) against the CPU engine (fusedopt._core), on a GPU,
without TensorFlow: every rule dense and sparse, every dtype and index type, duplicates,
out-of-range indices (ValueError, nothing written), determinism, streams.

Runs where a CUDA device, CuPy and both modules are importable: from
$FUSEDOPT_GPU_BUILD (what tools/gpu_check.sh builds) or the installed fusedopt package.
Everywhere else the whole module is skipped ("no GPU: skipped"), except with
FUSEDOPT_GPU_STANDIN=1 (CI), where it runs against CPU stand-ins for _core_cuda and CuPy
(tests/gpu/standin): that proves the test logic and the harness, not the kernels.

Float and double results must equal the CPU engine's bit for bit (device code is built with
--fmad=false, IEEE sqrt/division, and sums duplicates in the CPU's order); 16-bit types
compute in float32 with the same rounding, so they are compared bit for bit too.
"""
import numpy as np
import pytest

from gpu_harness import (DTYPES, HYPER, RULE_OPTIONS, IgnoresTheStream, StreamHold,
                         assert_bits_equal, check_same, core, core_cuda, cp, dtype_arg, elapsed,
                         make_state, requires_gpu, run_cpu, run_gpu, to_device, to_host)

pytestmark = requires_gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule,options", RULE_OPTIONS)
def test_dense_equals_cpu(rule, options, dtype):
    rng = np.random.default_rng(1)
    var, slots, grad = make_state(rule, dtype, (1001, 37), rng)  # odd size: vector tail
    hyper = HYPER[rule]
    check_same(rule, dtype, run_gpu(rule, dtype, var, slots, grad, hyper, options),
               run_cpu(rule, var, slots, grad, hyper, options))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_unaligned_buffers_take_the_scalar_path(dtype):
    rule = "lazy_adam"
    rng = np.random.default_rng(2)
    var, slots, grad = make_state(rule, dtype, (4099,), rng)
    want = run_cpu(rule, var, slots, grad, HYPER[rule], {})

    def shifted(a):  # same values, device pointer one element past a 16-byte boundary
        d = to_device(np.concatenate([a[:1], a]))
        return d[1:]

    dvar, dslots, dgrad = shifted(var), [shifted(s) for s in slots], shifted(grad)
    core_cuda.apply_dense(rule, dvar, dslots, dgrad, HYPER[rule],
                          dtype=dtype_arg(dtype))
    cp.cuda.runtime.deviceSynchronize()
    check_same(rule, dtype, (to_host(dvar, dtype), [to_host(s, dtype) for s in dslots]), want)


@pytest.mark.parametrize("index_type", ["int32", "int64"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule,options", RULE_OPTIONS)
def test_sparse_with_duplicates_equals_cpu(rule, options, dtype, index_type):
    rng = np.random.default_rng(3)
    rows, n = 500, 2000  # ~4 hits per touched row: many duplicates, some rows untouched
    indices = rng.integers(0, rows, n).astype(index_type)
    var, slots, grad = make_state(rule, dtype, (rows, 33), rng, grad_rows=n)
    hyper = HYPER[rule]
    gpu = run_gpu(rule, dtype, var, slots, grad, hyper, options, indices)
    cpu = run_cpu(rule, var, slots, grad, hyper, options, indices)
    check_same(rule, dtype, gpu, cpu)
    untouched = np.setdiff1d(np.arange(rows), indices)
    assert untouched.size > 0
    assert_bits_equal(gpu[0][untouched], var[untouched], "untouched rows")


@pytest.mark.parametrize("row_shape", [(), (1,), (3,), (255,), (256,), (1000,), (4, 7)])
def test_sparse_row_widths(row_shape):
    rule, dtype = "adagrad", "float32"
    rng = np.random.default_rng(4)
    rows, n = 300, 700
    indices = rng.integers(0, rows, n).astype(np.int64)
    var, slots, grad = make_state(rule, dtype, (rows,) + row_shape, rng, grad_rows=n)
    check_same(rule, dtype, run_gpu(rule, dtype, var, slots, grad, HYPER[rule], {}, indices),
               run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices))


def test_sparse_all_unique_and_single_row():
    rule, dtype = "lazy_adam", "float32"
    rng = np.random.default_rng(5)
    for indices in (rng.permutation(400)[:250].astype(np.int32), np.full(64, 7, np.int32)):
        var, slots, grad = make_state(rule, dtype, (400, 16), rng, grad_rows=indices.size)
        check_same(rule, dtype,
                   run_gpu(rule, dtype, var, slots, grad, HYPER[rule], {}, indices),
                   run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices))


@pytest.mark.parametrize("index_type", ["int32", "int64"])
@pytest.mark.parametrize("bad", [[(7, 500)], [(7, -1)], [(12, 900), (7, 500), (1999, -5)]])
def test_out_of_range_raises_and_writes_nothing(bad, index_type):
    rule, dtype = "lazy_adam", "float32"
    rng = np.random.default_rng(6)
    rows, n = 500, 2000
    indices = rng.integers(0, rows, n).astype(index_type)
    for position, value in bad:
        indices[position] = value
    var, slots, grad = make_state(rule, dtype, (rows, 8), rng, grad_rows=n)
    with pytest.raises(ValueError) as cpu_error:
        run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices)
    dvar, dslots = to_device(var), [to_device(s) for s in slots]
    with pytest.raises(ValueError) as gpu_error:
        core_cuda.apply_sparse(rule, dvar, dslots, to_device(grad), cp.asarray(indices),
                               HYPER[rule])
    first = min(bad)
    assert str(gpu_error.value) == f"indices[{first[0]}] = {first[1]} is not in [0, {rows})"
    assert str(gpu_error.value) == str(cpu_error.value)
    assert_bits_equal(to_host(dvar, dtype), var, "var after a rejected call")
    for d, s in zip(dslots, slots):
        assert_bits_equal(to_host(d, dtype), s, "slot after a rejected call")


def test_empty_indices_are_a_no_op_and_shape_errors_match_cpu():
    rule, dtype = "adamax", "float32"
    rng = np.random.default_rng(7)
    var, slots, grad = make_state(rule, dtype, (10, 4), rng, grad_rows=0)
    gpu = run_gpu(rule, dtype, var, slots, grad, HYPER[rule], {}, np.zeros(0, np.int32))
    check_same(rule, dtype, gpu, (var, slots))
    bad_grad = rng.standard_normal((3, 5)).astype(np.float32)
    indices = np.zeros(3, np.int32)
    with pytest.raises(ValueError) as cpu_error:
        core.apply_sparse(rule, var.copy(), [s.copy() for s in slots], bad_grad, indices,
                          HYPER[rule])
    with pytest.raises(ValueError) as gpu_error:
        core_cuda.apply_sparse(rule, to_device(var), [to_device(s) for s in slots],
                               to_device(bad_grad), cp.asarray(indices), HYPER[rule])
    assert str(gpu_error.value) == str(cpu_error.value)
    with pytest.raises(ValueError, match="must share one dtype"):
        core_cuda.apply_dense(rule, to_device(var), [to_device(s) for s in slots],
                              to_device(var.astype(np.float64)), HYPER[rule])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_deterministic_run_to_run(dtype):
    """Heavy duplication (Zipf ids), big enough to spread over every SM: two runs agree
    bit for bit, dense and sparse."""
    rule = "lazy_adam"
    rng = np.random.default_rng(8)
    rows, n = 20_000, 400_000
    indices = np.minimum(rng.zipf(1.2, n) - 1, rows - 1).astype(np.int64)
    var, slots, grad = make_state(rule, dtype, (rows, 64), rng, grad_rows=n)
    first = run_gpu(rule, dtype, var, slots, grad, HYPER[rule], {}, indices)
    second = run_gpu(rule, dtype, var, slots, grad, HYPER[rule], {}, indices)
    check_same(rule, dtype, first, second)
    check_same(rule, dtype, first, run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices))
    dense_grad = rng.standard_normal(var.shape).astype(var.dtype)
    a = run_gpu(rule, dtype, var, slots, dense_grad, HYPER[rule], {})
    b = run_gpu(rule, dtype, var, slots, dense_grad, HYPER[rule], {})
    check_same(rule, dtype, a, b)


STREAM_CALLS = ["dense", "group", "sparse", "sparse_wait_false"]
RELEASE_DELAY_S = 0.3


def check_update_runs_on_the_stream_given(backend, call):
    """Enqueues one update (`call`: dense; sparse, which waits for its index check; sparse
    with wait=False) with `backend` on a non-blocking stream kept busy by a StreamHold.
    While the stream is held, var read on the legacy default stream (which does not wait for
    a non-blocking stream) must still be the old one and the call must not have waited —
    or, for a waiting sparse call, must not return before the hold is released. Then that
    stream alone is synchronized and var and slots must equal the CPU engine's. Raises
    AssertionError ("... stream given ...") when the update did not run on the stream."""
    rule, dtype = "adagrad", "float32"
    rng = np.random.default_rng(9)
    indices = rng.integers(0, 100, 300).astype(np.int32)
    sparse = call not in ("dense", "group")
    var, slots, grad = make_state(rule, dtype, (100, 8), rng, grad_rows=300 if sparse else None)
    want = run_cpu(rule, var, slots, grad, HYPER[rule], {}, indices if sparse else None)
    dvar, dslots, dgrad, dindices = (to_device(var), [to_device(s) for s in slots],
                                     to_device(grad), cp.asarray(indices))
    cp.cuda.runtime.deviceSynchronize()  # the copies are done before the stream is held
    stream = cp.cuda.Stream(non_blocking=True)
    with StreamHold(stream) as hold:
        if call == "sparse":
            timer = hold.release_after(RELEASE_DELAY_S)
            _, seconds = elapsed(lambda: backend.apply_sparse(
                rule, dvar, dslots, dgrad, dindices, HYPER[rule], stream=stream.ptr))
            timer.join()
            assert seconds >= RELEASE_DELAY_S * 0.9, (
                f"the waiting sparse call returned after {seconds:.3f} s, before the stream "
                f"given was released ({RELEASE_DELAY_S} s): its check did not run on the stream "
                "given")
        else:
            if call == "dense":
                pending = backend.apply_dense(rule, dvar, dslots, dgrad, HYPER[rule],
                                              stream=stream.ptr)
            elif call == "group":
                pending = backend.apply_dense_group(rule, [dvar], [[s] for s in dslots],
                                                    [dgrad], HYPER[rule], stream=stream.ptr)
            else:
                pending = backend.apply_sparse(rule, dvar, dslots, dgrad, dindices, HYPER[rule],
                                               stream=stream.ptr, wait=False)
            seen = to_host(dvar, dtype)
            assert not stream.done, "the hold ended before var was read: inconclusive"
            assert_bits_equal(seen, var, "var read while the stream given was held: an update "
                              "that did not wait for the stream given")
            if call == "sparse_wait_false":
                assert not pending.done(), "PendingCheck.done() while the stream given is held"
            hold.release()
        stream.synchronize()
    check_same(rule, dtype, (to_host(dvar, dtype), [to_host(s, dtype) for s in dslots]), want)
    if call == "sparse_wait_false":
        assert pending.done() and pending.result() is None


@pytest.mark.parametrize("call", STREAM_CALLS)
def test_runs_on_the_stream_given(call):
    check_update_runs_on_the_stream_given(core_cuda, call)


@pytest.mark.parametrize("call", STREAM_CALLS)
def test_the_stream_check_fails_for_a_backend_that_ignores_the_stream(call):
    """The test above can fail: the same check against a backend that sends the work to the
    legacy default stream instead."""
    with pytest.raises(AssertionError, match="stream given"):
        check_update_runs_on_the_stream_given(IgnoresTheStream(core_cuda), call)


def test_raw_pointer_interface_dicts():
    rule, dtype = "adagrad", "float64"
    rng = np.random.default_rng(10)
    var, slots, grad = make_state(rule, dtype, (64,), rng)
    d = [to_device(a) for a in (var, slots[0], grad)]
    raw = [dict(data=(a.data.ptr, False), shape=a.shape, typestr=a.dtype.str, version=3) for a in d]
    core_cuda.apply_dense(rule, raw[0], [raw[1]], raw[2], HYPER[rule])
    cp.cuda.runtime.deviceSynchronize()
    check_same(rule, dtype, (to_host(d[0], dtype), [to_host(d[1], dtype)]),
               run_cpu(rule, var, slots, grad, HYPER[rule], {}))


def test_array_interface_errors():
    """What only the CUDA module checks (the arrays' interfaces), with its words."""
    rule = "adagrad"
    d = [to_device(np.ones(8, np.float32)) for _ in range(3)]
    raw = [dict(data=(a.data.ptr, False), shape=a.shape, typestr=a.dtype.str, version=3)
           for a in d]
    host = np.ones(8, np.float32)  # pageable host memory: not a device pointer

    def dense(var, slots, grad, **kw):
        core_cuda.apply_dense(rule, var, slots, grad, HYPER[rule], **kw)

    cases = [
        (lambda: dense(np.ones(8, np.float32), [d[1]], d[2]),
         "var must be a CUDA array (__cuda_array_interface__) or its dict"),
        (lambda: dense(d[0], [d[1]], [1.0] * 8),
         "grad must be a CUDA array (__cuda_array_interface__) or its dict"),
        (lambda: dense(dict(raw[0], data=(d[0].data.ptr, True)), [raw[1]], raw[2]),
         "var and slots must be writeable"),
        (lambda: dense(dict(raw[0], shape=(4,), strides=(8,)), [dict(raw[1], shape=(4,))],
                       dict(raw[2], shape=(4,))), "arrays must be C-contiguous"),
        (lambda: dense(d[0], [d[1]], d[2], dtype="bfloat16"),
         "dtype='bfloat16' needs 2-byte arrays, got typestr <f4"),
        (lambda: dense(d[0].view(np.int32), [d[1].view(np.int32)], d[2].view(np.int32)),
         "unsupported dtype typestr <i4 (float16, bfloat16, float32, float64)"),
        (lambda: core_cuda.apply_sparse(rule, d[0], [d[1]], d[2], d[2], HYPER[rule]),
         "indices must be int32 or int64, got typestr <f4"),
        (lambda: dense(d[0], [d[1], d[2]], d[2]), "adagrad needs 1 slot arrays"),
        (lambda: dense(dict(raw[0], data=(host.ctypes.data, False)), [raw[1]], raw[2]),
         "var must be device (or managed) memory"),
        # Misaligned loads are a sticky CUDA error (the context is lost): refused first.
        (lambda: dense(dict(raw[0], data=(d[0].data.ptr + 2, False), shape=(4,)),
                       [dict(raw[1], shape=(4,))], dict(raw[2], shape=(4,))),
         "var is not aligned to its 4-byte elements"),
        (lambda: dense(raw[0], [raw[1]], dict(raw[2], data=(d[2].data.ptr + 1, False), shape=(4,))),
         "grad is not aligned to its 4-byte elements"),
        (lambda: core_cuda.apply_dense_group(rule, [raw[0]], [[dict(raw[1], data=(
            d[1].data.ptr + 4, False), typestr="<f8", shape=(2,))]], [raw[2]], HYPER[rule]),
         "variable 0 of 1: slot is not aligned to its 8-byte elements"),
        (lambda: core_cuda.apply_sparse(rule, d[0], [d[1]], d[2], dict(
            raw[2], data=(d[2].data.ptr + 4, False), typestr="<i8", shape=(2,)), HYPER[rule]),
         "indices is not aligned to its 8-byte elements"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as error:
            call()
        assert str(error.value) == message
    cp.cuda.runtime.deviceSynchronize()
    assert_bits_equal(cp.asnumpy(d[0]), np.ones(8, np.float32), "var after rejected calls")
