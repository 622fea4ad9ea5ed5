"""Compact slots on the CUDA engine: bfloat16/float16 slots beside a float32 variable
(fusedopt._core_cuda's slot_dtype / stochastic_rounding), against the CPU engine bit for
bit, and both against the model of tests/support/compact.py: the update with float32
slots holding the widened 16-bit values, its slots rounded to nearest even (ml_dtypes) or
stochastically (numeric.h's noise, salted with var's element before the update; a per-row
slot with its row's first element). Dense (vector packs and scalar tails), sparse with
duplicates and hot rows, group launches; refusals with every array unchanged.

Runs where tests/gpu runs (see test_gpu_core.py): on a GPU, or on the CPU stand-ins in CI.
"""
import numpy as np
import pytest

import compact
from gpu_harness import (HYPER, group_to_device, NUM_SLOTS, RULE_SPECS, RULES, assert_bits_equal, check_same,
                         core_cuda, cp, make_state, np_dtype, requires_gpu, run_cpu, run_gpu,
                         slot_dtype_arg, to_device, to_host)

pytestmark = requires_gpu

SLOT_DTYPES = ["bfloat16", "float16"]
# Every slot storage type with either rounding: each a kernel instantiation of its own.
# (Options and index types do not meet the slot storage in the kernels: tested elsewhere.)
EVERY_STORAGE = pytest.mark.parametrize(
    "slot_dtype,stochastic", [(d, s) for d in SLOT_DTYPES for s in (False, True)],
    ids=[f"{d}-{'stochastic' if s else 'nearest'}" for d in SLOT_DTYPES for s in (False, True)])


def _per_row(rule, k):
    spec = RULE_SPECS[rule]
    return spec["slot_layouts"][spec["slots"][k]] == "per_row"


# The calls' rounding seed: both 32-bit halves in use, negative as an int64.
SEED = -0x7654_3210_0123_4567


def _row_salts(var, seed):
    num_rows = var.shape[0] if var.ndim else 1
    rows = var.reshape(num_rows, var.size // num_rows if num_rows else 0)
    if rows.shape[1] == 0:
        return np.zeros(rows.shape[0], np.uint64) ^ compact.call_salt(seed)
    return compact.element_salt(rows[:, 0].astype(np.float32), seed)


def compact_state(rule, slot_dtype, shape, rng, grad_rows=None):
    """float32 var and grad, slots of slot_dtype (16-bit values drawn from the oracle's
    ranges)."""
    var, slots, grad = make_state(rule, "float32", shape, rng, grad_rows)
    return var, [s.astype(np_dtype(slot_dtype)) for s in slots], grad


def model(rule, var, slots, grad, hyper, options, indices=None, stochastic=False, seed=SEED):
    """The CPU engine with float32 slots (the widened values), slots then stored as
    numeric.h stores them (stochastically with the call's seed)."""
    out_var, out32 = run_cpu(rule, var, [s.astype(np.float32) for s in slots], grad, hyper,
                             options, indices)
    salt = compact.element_salt(var, seed)
    rounded = []
    for k, (slot, before) in enumerate(zip(out32, slots)):
        slot_salt = _row_salts(var, seed).reshape(slot.shape) if _per_row(rule, k) else salt
        rounded.append(compact.round_slot(slot, before.dtype, stochastic, slot_salt, k))
    return out_var, rounded


def check_all(rule, what, gpu, cpu, want):
    check_same(rule, what, gpu, cpu)
    check_same(rule, what + " (model)", cpu, want)
    for k, (g, s) in enumerate(zip(gpu[1], want[1])):
        assert g.dtype == s.dtype, (k, g.dtype, s.dtype)


@EVERY_STORAGE
@pytest.mark.parametrize("rule", RULES)
def test_dense_equals_cpu(rule, slot_dtype, stochastic):
    rng = np.random.default_rng(21)
    var, slots, grad = compact_state(rule, slot_dtype, (1001, 37), rng)  # odd: vector tail
    hyper, kw, options = HYPER[rule], dict(stochastic_rounding=stochastic, rounding_seed=SEED), {}
    check_all(rule, f"{slot_dtype} dense",
              run_gpu(rule, "float32", var, slots, grad, hyper, options, **kw),
              run_cpu(rule, var, slots, grad, hyper, options, **kw),
              model(rule, var, slots, grad, hyper, options, stochastic=stochastic))


@pytest.mark.parametrize("slot_dtype", SLOT_DTYPES)
@pytest.mark.parametrize("shift", [(0, 1), (1, 0), (1, 1), (0, 2)], ids=str)
def test_dense_packs_need_every_buffer_aligned(shift, slot_dtype):
    """(var/grad shift, slot shift) in elements: a compact slot's pack is 8 bytes (4 x 2),
    var's 16; any buffer off its pack boundary sends the call down the scalar path, and the
    bits stay the CPU engine's."""
    rule = "lazy_adam"
    rng = np.random.default_rng(22)
    var, slots, grad = compact_state(rule, slot_dtype, (4099,), rng)
    kw = dict(stochastic_rounding=True, rounding_seed=SEED)
    want = run_cpu(rule, var, slots, grad, HYPER[rule], {}, **kw)

    def shifted(a, by):  # same values, device pointer `by` elements past a 16-byte boundary
        return to_device(np.concatenate([a[:by], a]))[by:] if by else to_device(a)

    dvar, dgrad = shifted(var, shift[0]), shifted(grad, shift[0])
    dslots = [shifted(s, shift[1]) for s in slots]
    core_cuda.apply_dense(rule, dvar, dslots, dgrad, HYPER[rule],
                          slot_dtype=slot_dtype_arg(var, slots), **kw)
    cp.cuda.runtime.deviceSynchronize()
    got = to_host(dvar, "float32"), [to_host(d, s.dtype) for d, s in zip(dslots, slots)]
    check_same(rule, slot_dtype, got, want)


@EVERY_STORAGE
@pytest.mark.parametrize("rule", RULES)
def test_sparse_with_duplicates_and_hot_rows_equals_cpu(rule, slot_dtype, stochastic):
    """~4 hits per touched row, plus rows hit 40 and 1500 times (the two-level hot-row
    kernels); rows not named keep every bit."""
    index_type = "int64" if stochastic else "int32"
    rng = np.random.default_rng(23)
    rows = 500
    indices = np.concatenate([rng.integers(0, rows, 2000), np.full(40, 17), np.full(1500, 3)])
    indices = rng.permutation(indices).astype(index_type)
    var, slots, grad = compact_state(rule, slot_dtype, (rows, 33), rng, grad_rows=indices.size)
    hyper, kw = HYPER[rule], dict(stochastic_rounding=stochastic, rounding_seed=SEED)
    gpu = run_gpu(rule, "float32", var, slots, grad, hyper, {}, indices, **kw)
    check_all(rule, f"{slot_dtype} sparse", gpu,
              run_cpu(rule, var, slots, grad, hyper, {}, indices, **kw),
              model(rule, var, slots, grad, hyper, {}, indices, stochastic))
    untouched = np.setdiff1d(np.arange(rows), indices)
    assert untouched.size > 0
    assert_bits_equal(gpu[0][untouched], var[untouched], "untouched rows")
    for g, s in zip(gpu[1], slots):
        assert_bits_equal(g[untouched], s[untouched], "untouched slot rows")


@pytest.mark.parametrize("row_shape", [(), (1,), (33,), (300,), (4, 7)], ids=str)
@pytest.mark.parametrize("rule", ["row_wise_adagrad", "partial_row_wise_adam"])
def test_per_row_slot_salts_on_every_row_width(rule, row_shape):
    """A per-row slot's stochastic salt is its row's first element before the update: lane 0
    of the row's warp reads it before the element pass writes it."""
    rng = np.random.default_rng(24)
    rows = 200
    indices = rng.integers(0, rows, 600).astype(np.int32)
    for idx in (None, indices):
        var, slots, grad = compact_state(rule, "bfloat16", (rows,) + row_shape, rng,
                                         grad_rows=None if idx is None else idx.size)
        kw = dict(stochastic_rounding=True, rounding_seed=SEED)
        check_all(rule, f"rows {row_shape}",
                  run_gpu(rule, "float32", var, slots, grad, HYPER[rule], {}, idx, **kw),
                  run_cpu(rule, var, slots, grad, HYPER[rule], {}, idx, **kw),
                  model(rule, var, slots, grad, HYPER[rule], {}, idx, True))


@pytest.mark.parametrize("var_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rule", RULES)
def test_16bit_variables_round_their_slots_stochastically_too(rule, var_dtype):
    """Slots of a half/bfloat16 variable (var's own dtype) are 16-bit storage too:
    stochastic_rounding rounds them as the CPU engine does, dense and sparse."""
    rng = np.random.default_rng(25)
    indices = rng.integers(0, 300, 900).astype(np.int64)
    for idx in (None, indices):
        var, slots, grad = make_state(rule, var_dtype, (300, 19), rng,
                                      grad_rows=None if idx is None else idx.size)
        kw = dict(stochastic_rounding=True, rounding_seed=SEED)
        gpu = run_gpu(rule, var_dtype, var, slots, grad, HYPER[rule], {}, idx, **kw)
        check_same(rule, var_dtype, gpu, run_cpu(rule, var, slots, grad, HYPER[rule], {}, idx,
                                                 **kw))
        nearest = run_cpu(rule, var, slots, grad, HYPER[rule], {}, idx)
        assert any((g.view(np.uint16) != n.view(np.uint16)).any()
                   for g, n in zip(gpu[1], nearest[1]))


# --- group launches -------------------------------------------------------------------

SHAPES = [(0,), (), (1,), (7,), (4096,), (4097,), (3, 4096), (10001,), (5, 7, 9)]


def _run_group(rule, members, hyper, options, unaligned=(), **kw):
    dvars, dslots, dgrads = group_to_device(members, unaligned)
    core_cuda.apply_dense_group(rule, dvars, dslots, dgrads, hyper, options,
                                slot_dtype=slot_dtype_arg(members[0][0], members[0][1]), **kw)
    cp.cuda.runtime.deviceSynchronize()
    return [(to_host(dvars[i], "float32"),
             [to_host(d[i], s.dtype) for d, s in zip(dslots, members[i][1])])
            for i in range(len(members))]


@EVERY_STORAGE
@pytest.mark.parametrize("rule", RULES)
def test_group_equals_cpu_per_variable(rule, slot_dtype, stochastic):
    rng = np.random.default_rng(26)
    members = [compact_state(rule, slot_dtype, shape, rng) for shape in SHAPES]
    hyper, kw, options = HYPER[rule], dict(stochastic_rounding=stochastic, rounding_seed=SEED), {}
    got = _run_group(rule, members, hyper, options, **kw)
    for i, ((var, slots, grad), result) in enumerate(zip(members, got)):
        check_all(rule, f"{slot_dtype} member {i}", result,
                  run_cpu(rule, var, slots, grad, hyper, options, **kw),
                  model(rule, var, slots, grad, hyper, options, stochastic=stochastic))


@pytest.mark.parametrize("slot_dtype", SLOT_DTYPES)
def test_groups_larger_than_one_launch(slot_dtype):
    """150 members (three launches), some unaligned (slots 2 bytes off their 8-byte packs)."""
    rule = "lazy_adam"
    rng = np.random.default_rng(27)
    members = [compact_state(rule, slot_dtype, (int(n),), rng)
               for n in rng.integers(0, 9000, 150)]
    got = _run_group(rule, members, HYPER[rule], {}, set(range(3, 150, 17)),
                     stochastic_rounding=True, rounding_seed=SEED)
    for i, ((var, slots, grad), result) in enumerate(zip(members, got)):
        check_same(rule, f"member {i}", result,
                   run_cpu(rule, var, slots, grad, HYPER[rule], {}, stochastic_rounding=True,
                           rounding_seed=SEED))


def test_group_compact_slot_spans_only_its_own_bytes():
    """A bfloat16 slot packed right before its gradient in one buffer is no overlap (its 2
    bytes an element, not var's 4); one element further it reaches into the gradient."""
    rule = "adagrad"
    rng = np.random.default_rng(28)
    members = [compact_state(rule, "bfloat16", shape, rng) for shape in [(6, 6), (10,)]]
    dvars = [to_device(var) for var, _, _ in members]
    accums, grads = [], []
    for var, (accum,), grad in members:
        packed = to_device(np.concatenate([accum.view(np.uint8).ravel(),
                                           grad.view(np.uint8).ravel()]))
        accums.append(packed[:accum.nbytes].view(np.uint16).reshape(accum.shape))
        grads.append(packed[accum.nbytes:].view(np.float32).reshape(grad.shape))
    core_cuda.apply_dense_group(rule, dvars, [accums], grads, HYPER[rule], {},
                                slot_dtype="bfloat16", stochastic_rounding=True,
                                rounding_seed=SEED)
    cp.cuda.runtime.deviceSynchronize()
    for i, (var, slots, grad) in enumerate(members):
        check_same(rule, f"member {i}", (to_host(dvars[i], "float32"),
                                         [to_host(accums[i], "bfloat16")]),
                   run_cpu(rule, var, slots, grad, HYPER[rule], {}, stochastic_rounding=True,
                           rounding_seed=SEED))
    var, (accum,), grad = members[0]
    packed = to_device(np.concatenate([accum.view(np.uint8).ravel(), grad.view(np.uint8).ravel()]))
    reaching = packed[accum.nbytes - 4:accum.nbytes - 4 + grad.nbytes]  # 2 accum values
    with pytest.raises(ValueError, match=r"accum\[0\] and grad\[0\] overlap in memory"):
        core_cuda.apply_dense_group(
            rule, [to_device(var)], [[packed[:accum.nbytes].view(np.uint16).reshape(accum.shape)]],
            [reaching.view(np.float32).reshape(grad.shape)], HYPER[rule], {},
            slot_dtype="bfloat16")


# --- refusals ---------------------------------------------------------------------------

def _device_state(var, slots, grad):
    return to_device(var), [to_device(s) for s in slots], to_device(grad)


def _assert_unchanged(dvar, dslots, var, slots):
    cp.cuda.runtime.deviceSynchronize()
    assert_bits_equal(to_host(dvar, var.dtype), var, "var after a rejected call")
    for d, s in zip(dslots, slots):
        assert_bits_equal(to_host(d, s.dtype), s, "slot after a rejected call")


def _both_ways(rule, dvar, dslots, dgrad, **kw):
    """The call dense and sparse (the sparse one over every row)."""
    hyper = HYPER[rule]
    rows = dvar.shape[0]
    yield lambda: core_cuda.apply_dense(rule, dvar, dslots, dgrad, hyper, **kw)
    yield lambda: core_cuda.apply_sparse(rule, dvar, dslots, dgrad,
                                         cp.asarray(np.arange(rows, dtype=np.int32)), hyper, **kw)


@pytest.mark.parametrize("var_dtype,slot_dtype", [("float64", "float16"), ("float64", "bfloat16"),
                                                  ("bfloat16", "float16"), ("float16", "bfloat16")])
def test_compact_slots_need_a_float32_variable(var_dtype, slot_dtype):
    rule = "adagrad"
    rng = np.random.default_rng(29)
    var, slots, grad = make_state(rule, var_dtype, (6, 5), rng)
    slots = [s.astype(np_dtype(slot_dtype)) for s in slots]
    dvar, dslots, dgrad = _device_state(var, slots, grad)
    # dtype='bfloat16' would make 2-byte slots bfloat16 too: name the slots' dtype.
    kw = dict(dtype="bfloat16" if var_dtype == "bfloat16" else "", slot_dtype=slot_dtype)
    for call in _both_ways(rule, dvar, dslots, dgrad, **kw):
        with pytest.raises(ValueError, match=rf"^accum has dtype {slot_dtype} but var is "
                           rf"{var_dtype} \(bfloat16/float16 slots are for float32 variables\)$"):
            call()
    _assert_unchanged(dvar, dslots, var, slots)


def test_slots_of_one_update_share_one_dtype():
    rule = "lazy_adam"
    rng = np.random.default_rng(30)
    var, slots, grad = make_state(rule, "float32", (6, 5), rng)
    slots = [slots[0].astype(np.float16), slots[1].astype(np.float32)]
    dvar, dslots, dgrad = _device_state(var, slots, grad)
    for call in _both_ways(rule, dvar, dslots, dgrad):
        with pytest.raises(ValueError, match=r"^v has dtype float32 but m has float16: an "
                           r"update's slots are stored in one dtype$"):
            call()
    _assert_unchanged(dvar, dslots, var, slots)


def test_bfloat16_slot_bits_must_be_named():
    """bfloat16 travels as 2-byte integers: without slot_dtype='bfloat16' they are refused
    (a typestr, not a dtype), as are slot_dtype='bfloat16' for 4-byte slots and unknown
    names."""
    rule = "adagrad"
    rng = np.random.default_rng(31)
    var, slots, grad = compact_state(rule, "bfloat16", (6, 5), rng)
    dvar, dslots, dgrad = _device_state(var, slots, grad)
    for call in _both_ways(rule, dvar, dslots, dgrad):
        with pytest.raises(ValueError, match=r"^accum has dtype typestr <u2 but var is float32 "
                           r"\(slots may be float32, bfloat16 or float16\)$"):
            call()
    wide = [to_device(s.astype(np.float32)) for s in slots]
    for call in _both_ways(rule, dvar, wide, dgrad, slot_dtype="bfloat16"):
        with pytest.raises(ValueError, match=r"^slot_dtype='bfloat16' needs 2-byte arrays, but "
                           r"accum has typestr <f4$"):
            call()
    for call in _both_ways(rule, dvar, dslots, dgrad, slot_dtype="float16"):
        with pytest.raises(ValueError, match=r"^slot_dtype='float16' but accum has typestr <u2$"):
            call()
    for call in _both_ways(rule, dvar, dslots, dgrad, slot_dtype="int8"):
        with pytest.raises(ValueError, match=r"^unsupported slot_dtype int8"):
            call()
    for call in _both_ways(rule, dvar, dslots, dgrad, slot_dtype="bfloat16",
                           stochastic_rounding=1):
        with pytest.raises(TypeError, match=r"stochastic_rounding must be a bool"):
            call()
    _assert_unchanged(dvar, dslots, var, slots)


def test_group_members_share_one_slot_dtype():
    rule = "lazy_adam"
    rng = np.random.default_rng(32)
    members = [compact_state(rule, "float16", (8,), rng), compact_state(rule, "float16", (5,), rng)]
    members[1] = (members[1][0], [s.astype(np.float32) for s in members[1][1]], members[1][2])
    dvars = [to_device(m[0]) for m in members]
    dslots = [[to_device(m[1][k]) for m in members] for k in range(NUM_SLOTS[rule])]
    dgrads = [to_device(m[2]) for m in members]
    with pytest.raises(ValueError, match=r"^variable 1 of 2: slot dtype float32 differs from "
                       r"variable 0's float16 \(one group, one slot dtype\)$"):
        core_cuda.apply_dense_group(rule, dvars, dslots, dgrads, HYPER[rule])
    mixed = [dslots[0], [dslots[1][0], to_device(members[1][1][1].astype(np.float16))]]
    with pytest.raises(ValueError, match=r"^variable 1 of 2: v has dtype float16 but m has "
                       r"float32: an update's slots are stored in one dtype$"):
        core_cuda.apply_dense_group(rule, dvars, mixed, dgrads, HYPER[rule])
    cp.cuda.runtime.deviceSynchronize()
    for i, (var, slots, _) in enumerate(members):
        assert_bits_equal(to_host(dvars[i], "float32"), var, f"var[{i}]")
        for k, s in enumerate(slots):
            assert_bits_equal(to_host(dslots[k][i], s.dtype), s, f"slot {k}[{i}]")
