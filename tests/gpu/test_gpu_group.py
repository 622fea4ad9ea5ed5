"""The CUDA group engine (fusedopt._core_cuda.apply_dense_group: multi-tensor launches, the
group op's GPU path) against the CPU engine applied to each variable alone, bit for bit:
every rule, option set and dtype; groups that span several launches (more than
kMaxGroupTensorsPerLaunch = 64 members); empty, tiny, unaligned and multi-chunk members;
errors raised before anything is enqueued, with every array unchanged.

Runs where tests/gpu runs (see test_gpu_core.py): on a GPU, or on the CPU stand-ins in CI.
"""
import numpy as np
import pytest

from gpu_harness import (DTYPES, group_to_device, HYPER, RULE_OPTIONS, assert_bits_equal, check_same, core_cuda,
                         cp, dtype_arg, make_state, requires_gpu, run_cpu, to_device, to_host)

pytestmark = requires_gpu

# 0 elements, scalars, vector tails, exactly one and several 4096-element chunks, a rank-3
# tensor: every path of the kernel (chunk lookup, vector packs, scalar tail).
SHAPES = [(0,), (), (1,), (7,), (4096,), (4097,), (3, 4096), (10001,), (5, 7, 9)]


def _group_state(rule, dtype, shapes, rng):
    return [make_state(rule, dtype, shape, rng) for shape in shapes]


def _run_group_gpu(rule, dtype, members, hyper, options, unaligned=()):
    """Device copies, one apply_dense_group call, results on the host."""
    dvars, dslots, dgrads = group_to_device(members, unaligned)
    core_cuda.apply_dense_group(rule, dvars, dslots, dgrads, hyper, options,
                                dtype=dtype_arg(dtype))
    cp.cuda.runtime.deviceSynchronize()
    return [(to_host(dvars[i], dtype), [to_host(s[i], dtype) for s in dslots])
            for i in range(len(members))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rule,options", RULE_OPTIONS)
def test_group_equals_cpu_per_variable(rule, options, dtype):
    rng = np.random.default_rng(11)
    members = _group_state(rule, dtype, SHAPES, rng)
    got = _run_group_gpu(rule, dtype, members, HYPER[rule], options)
    for (var, slots, grad), result in zip(members, got):
        check_same(rule, dtype, result, run_cpu(rule, var, slots, grad, HYPER[rule], options))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_groups_larger_than_one_launch(dtype):
    """150 members (three launches: 64 + 64 + 22), some unaligned (scalar path inside a
    vectorised launch), sizes drawn so chunks are shared unevenly."""
    rule = "lazy_adam"
    rng = np.random.default_rng(12)
    shapes = [(int(n),) for n in rng.integers(0, 9000, 150)]
    members = _group_state(rule, dtype, shapes, rng)
    unaligned = set(range(3, 150, 17))
    got = _run_group_gpu(rule, dtype, members, HYPER[rule], {}, unaligned)
    for i, ((var, slots, grad), result) in enumerate(zip(members, got)):
        want = run_cpu(rule, var, slots, grad, HYPER[rule], {})
        assert_bits_equal(result[0], want[0], f"member {i} var")
        for k, (g, w) in enumerate(zip(result[1], want[1])):
            assert_bits_equal(g, w, f"member {i} slot {k}")


def test_empty_group_and_all_empty_members_are_no_ops():
    core_cuda.apply_dense_group("adagrad", [], [[]], [], HYPER["adagrad"])
    rng = np.random.default_rng(13)
    members = _group_state("adagrad", "float32", [(0,), (0, 3)], rng)
    got = _run_group_gpu("adagrad", "float32", members, HYPER["adagrad"], {})
    assert [r[0].shape for r in got] == [(0,), (0, 3)]


def _device_group(rule, dtype, shapes, rng):
    members = _group_state(rule, dtype, shapes, rng)
    dvars = [to_device(m[0]) for m in members]
    dslots = [[to_device(m[1][k]) for m in members] for k in range(len(members[0][1]))]
    dgrads = [to_device(m[2]) for m in members]
    return members, dvars, dslots, dgrads


def _assert_unchanged(members, dvars, dslots, dtype):
    for i, (var, slots, _) in enumerate(members):
        assert_bits_equal(to_host(dvars[i], dtype), var, f"var[{i}] after a rejected call")
        for k, s in enumerate(slots):
            assert_bits_equal(to_host(dslots[k][i], dtype), s, f"slot {k}[{i}] after a rejected call")


def test_bad_member_named_and_nothing_written():
    rule, dtype = "lazy_adam", "float32"
    rng = np.random.default_rng(14)
    members, dvars, dslots, dgrads = _device_group(rule, dtype, [(8,), (4, 3), (5,)], rng)
    hyper = HYPER[rule]
    bad_grads = dgrads[:1] + [to_device(np.ones((4, 4), np.float32))] + dgrads[2:]
    with pytest.raises(ValueError, match=r"^variable 1 of 3: .*grad"):
        core_cuda.apply_dense_group(rule, dvars, dslots, bad_grads, hyper)
    mixed = dgrads[:2] + [to_device(members[2][2].astype(np.float64))]
    with pytest.raises(ValueError, match=r"^variable 2 of 3: grad has typestr <f8 but var <f4: "
                       r"var and grad must share one dtype"):
        core_cuda.apply_dense_group(rule, dvars, dslots, mixed, hyper)
    with pytest.raises(ValueError, match="vars and grads must have one entry per variable"):
        core_cuda.apply_dense_group(rule, dvars, dslots, dgrads[:2], hyper)
    with pytest.raises(ValueError, match="needs 2 slot lists"):
        core_cuda.apply_dense_group(rule, dvars, dslots[:1], dgrads, hyper)
    with pytest.raises(ValueError, match="v has 2 entries for 3 variables"):
        core_cuda.apply_dense_group(rule, dvars, [dslots[0], dslots[1][:2]], dgrads, hyper)
    cp.cuda.runtime.deviceSynchronize()
    _assert_unchanged(members, dvars, dslots, dtype)


def test_per_row_slot_spans_only_its_rows():
    """A per-row slot ([rows]) is checked for overlap over its own bytes, not var's: an
    accumulator packed right before the gradient in one buffer is no overlap (both
    engines once measured it with var's size and refused such groups at random)."""
    rule, dtype = "row_wise_adagrad", "float32"
    rng = np.random.default_rng(16)
    members = _group_state(rule, dtype, [(6, 5), (4, 3)], rng)
    dvars = [to_device(var) for var, _, _ in members]
    accums, grads = [], []
    for var, (accum,), grad in members:
        packed = to_device(np.concatenate([accum.ravel(), grad.ravel()]))
        accums.append(packed[:accum.size])
        grads.append(packed[accum.size:].reshape(grad.shape))
    core_cuda.apply_dense_group(rule, dvars, [accums], grads, HYPER[rule], {})
    cp.cuda.runtime.deviceSynchronize()
    for i, (var, slots, grad) in enumerate(members):
        check_same(rule, dtype, (to_host(dvars[i], dtype), [to_host(accums[i], dtype)]),
                   run_cpu(rule, var, slots, grad, HYPER[rule], {}))
    # One element further and the accumulator does reach into the gradient: refused.
    var, (accum,), grad = members[0]
    packed = to_device(np.concatenate([accum.ravel(), grad.ravel()]))
    with pytest.raises(ValueError, match=r"accum\[0\] and grad\[0\] overlap in memory"):
        core_cuda.apply_dense_group(rule, [to_device(var)], [[packed[:accum.size]]],
                                    [packed[accum.size - 1:-1].reshape(grad.shape)],
                                    HYPER[rule], {})


def test_a_buffer_twice_in_the_group_is_refused_and_nothing_written():
    rule, dtype = "lazy_adam", "float32"
    rng = np.random.default_rng(15)
    members, dvars, dslots, dgrads = _device_group(rule, dtype, [(8,), (8,), (8,)], rng)
    hyper = HYPER[rule]
    twice = [dvars[0], dvars[1], dvars[0]]  # var[0] is var[2]
    with pytest.raises(ValueError, match=r"var\[0\] and var\[2\] overlap in memory"):
        core_cuda.apply_dense_group(rule, twice, dslots, dgrads, hyper)
    as_slot = [dslots[0][0], dslots[0][1], dvars[1]]  # m[2] is var[1]
    with pytest.raises(ValueError, match=r"overlap in memory"):
        core_cuda.apply_dense_group(rule, dvars, [as_slot, dslots[1]], dgrads, hyper)
    grad_is_state = [dgrads[0], dslots[1][2], dgrads[2]]  # grad[1] is v[2]
    with pytest.raises(ValueError, match=r"overlap in memory"):
        core_cuda.apply_dense_group(rule, dvars, dslots, grad_is_state, hyper)
    cp.cuda.runtime.deviceSynchronize()
    _assert_unchanged(members, dvars, dslots, dtype)
    # Gradients are only read: one gradient for every member is fine.
    shared = [dgrads[0]] * 3
    core_cuda.apply_dense_group(rule, dvars, dslots, shared, hyper)
    cp.cuda.runtime.deviceSynchronize()
    for i, (var, slots, _) in enumerate(members):
        want = run_cpu(rule, var, slots, members[0][2], hyper, {})
        check_same(rule, dtype, (to_host(dvars[i], dtype), [to_host(s[i], dtype) for s in dslots]),
                   want)
