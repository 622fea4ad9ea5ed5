"""Compact slots in fusedopt._core: bfloat16/float16 slots beside a float32 variable.

The engine computes in float32 with the slots' values widened from 16 bit and rounds each
slot once on store, to nearest even or (stochastic_rounding=True) stochastically with the
noise of cc/core/numeric.h. The oracle: the same update with float32 slots holding the
widened values (the float32 path, itself checked against the NumPy float64 reference),
its slots then rounded by tests/support/compact.py (ml_dtypes to nearest even; the NumPy
model of numeric.h's stochastic rounding, salted with the variable's element before the
update, or a per-row slot with its row's first element): bit for bit. Every result is
also checked against the NumPy float64 reference (numpy_reference) directly.
"""
import ml_dtypes
import numpy as np
import pytest

import compact
import harness
import numpy_reference as npref
from fusedopt import _core

RULES = npref.RULES
RULE_NAMES = sorted(RULES)
SLOT_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}
SHAPE = (40, 37)  # rows of 37: more than the row sum's 32 lanes, odd (a vector tail)
# Duplicates (row 3 three times), an untouched majority, and hot rows: 40 and 1100
# duplicates (sum_order.h's chunks of 32, then of ceil(sqrt(count))).
INDICES = np.array([3, 7, 3, 0, 39, 7, 3, 12] + [5] * 40 + [9] * 1100, np.int64)


def _bits(x):
    x = np.ascontiguousarray(x)
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def _per_row(rule, k):
    return RULES[rule]["slot_layouts"][RULES[rule]["slots"][k]] == "per_row"


# The calls' rounding seed where a test gives one: both halves of 64 bits in use.
SEED = 0x1234_5678_9ABC_DEF0


def row_salts(var, seed=0):
    """SaltBits of each row's first element (a per-row slot's salt; 0 for empty rows), with
    the call's salt."""
    num_rows = var.shape[0] if var.ndim else 1
    rows = var.reshape(num_rows, var.size // num_rows if num_rows else 0)
    if rows.shape[1] == 0:
        return np.zeros(rows.shape[0], np.uint64) ^ compact.call_salt(seed)
    return compact.element_salt(rows[:, 0].astype(np.float32), seed)


def expected(rule, var_before, out32, slot_dtype, stochastic, seed=0):
    """The float32-slot update's results, its slots stored as numeric.h stores them."""
    salt = compact.element_salt(np.asarray(var_before, np.float32), seed)
    out = [out32[0]]
    for k, slot in enumerate(out32[1]):
        slot_salt = (row_salts(var_before, seed).reshape(slot.shape) if _per_row(rule, k)
                     else salt)
        out.append(compact.round_slot(slot, slot_dtype, stochastic, slot_salt, k))
    return out[0], out[1:]


def _state(rule, slot_dtype, seed, shape=SHAPE, var_dtype="float"):
    rng = np.random.default_rng(seed)
    var, slots = harness.make_state(rule, shape, var_dtype, rng)
    return rng, var, [s.astype(slot_dtype) for s in slots]


def _run(rule, var, slots, grad, hyper, options, indices=None, **kw):
    var, slots = var.copy(), [s.copy() for s in slots]
    if indices is None:
        _core.apply_dense(rule, var, slots, grad, hyper, options, **kw)
    else:
        _core.apply_sparse(rule, var, slots, grad, indices, hyper, options, **kw)
    return var, slots


def _check(rule, got, want):
    np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]), err_msg="var")
    for k, (g, w) in enumerate(zip(got[1], want[1])):
        assert g.dtype == w.dtype, (k, g.dtype, w.dtype)
        np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=RULES[rule]["slots"][k])


def _check_against_float64(rule, var, slots, grad, hyper, options, indices, got, slot_dtype):
    """The float64 NumPy reference from the same (widened) state: var to float32's
    tolerance, each slot within one 16-bit ulp (nearest and stochastic rounding both pick a
    neighbour of the exact value)."""
    wide = [s.astype(np.float64) for s in slots]
    if indices is None:
        exact = npref.dense_update(rule, var, wide, grad, hyper, options)
    else:
        exact = npref.sparse_update(rule, var, wide, grad, indices, hyper, options)
    npref.assert_close(got[0], exact[0], "float", err_msg="var")
    for k, (g, e) in enumerate(zip(got[1], exact[1])):
        npref.assert_rounded_once(g, e, slot_dtype, err_msg=RULES[rule]["slots"][k])


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("slot_dtype", sorted(SLOT_DTYPES))
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_compact_update_is_the_float32_update_rounded_once(rule, sparse, slot_dtype, stochastic):
    dt = SLOT_DTYPES[slot_dtype]
    rng, var, slots = _state(rule, dt, 1)
    hyper = harness.hyper_for(rule, "float", 3)
    indices = INDICES if sparse else None
    grad = harness.make_grad((len(INDICES),) + SHAPE[1:] if sparse else SHAPE, "float", rng)
    got = _run(rule, var, slots, grad, hyper, {}, indices, stochastic_rounding=stochastic,
               rounding_seed=SEED)
    out32 = _run(rule, var, [s.astype(np.float32) for s in slots], grad, hyper, {}, indices)
    _check(rule, got, expected(rule, var, out32, dt, stochastic, SEED))
    _check_against_float64(rule, var, slots, grad, hyper, {}, indices, got, dt)
    if sparse:  # rows not named: not a bit changed
        untouched = np.setdiff1d(np.arange(SHAPE[0]), INDICES)
        np.testing.assert_array_equal(_bits(got[0][untouched]), _bits(var[untouched]))
        for g, s in zip(got[1], slots):
            np.testing.assert_array_equal(_bits(g[untouched]), _bits(s[untouched]))


@pytest.mark.parametrize("slot_dtype", sorted(SLOT_DTYPES))
@pytest.mark.parametrize("rule,options", harness.RULE_OPTIONS, ids=harness.param_ids)
def test_every_option_set(rule, options, slot_dtype):
    dt = SLOT_DTYPES[slot_dtype]
    rng, var, slots = _state(rule, dt, 2, shape=(6, 33))
    hyper = harness.hyper_for(rule, "float", 2)
    grad = harness.make_grad((6, 33), "float", rng)
    for stochastic in (False, True):
        got = _run(rule, var, slots, grad, hyper, options, stochastic_rounding=stochastic,
                   rounding_seed=0 if stochastic else None)
        out32 = _run(rule, var, [s.astype(np.float32) for s in slots], grad, hyper, options)
        _check(rule, got, expected(rule, var, out32, dt, stochastic))


@pytest.mark.parametrize("shape", [(), (5,), (0, 4), (3, 0), (4, 3, 5)], ids=str)
@pytest.mark.parametrize("rule", ["row_wise_adagrad", "partial_row_wise_adam", "lazy_adam"])
def test_shapes_and_per_row_salts(rule, shape):
    """Scalars, 1-D (rows of one element), empty tensors and rows, rank 3: a per-row slot's
    salt is its row's first element (0 for an empty row)."""
    dt = SLOT_DTYPES["bfloat16"]
    rng, var, slots = _state(rule, dt, 3, shape=shape)
    hyper = harness.hyper_for(rule, "float", 1)
    grad = harness.make_grad(shape, "float", rng)
    got = _run(rule, var, slots, grad, hyper, {}, stochastic_rounding=True, rounding_seed=0)
    out32 = _run(rule, var, [s.astype(np.float32) for s in slots], grad, hyper, {})
    _check(rule, got, expected(rule, var, out32, dt, True))


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("slot_dtype", sorted(SLOT_DTYPES))
def test_thread_count_changes_no_bit(slot_dtype, sparse):
    rule, dt = "lazy_adam", SLOT_DTYPES[slot_dtype]
    rng = np.random.default_rng(4)
    shape = (3000, 24)
    var, slots = harness.make_state(rule, shape, "float", rng)
    slots = [s.astype(dt) for s in slots]
    hyper = harness.hyper_for(rule, "float", 2)
    indices = harness.make_indices(6000, shape[0], np.int32, rng) if sparse else None
    grad = harness.make_grad((6000, 24) if sparse else shape, "float", rng)
    runs = [_run(rule, var, slots, grad, hyper, {}, indices, num_threads=t,
                 stochastic_rounding=True, rounding_seed=SEED) for t in (1, 4)]
    _check(rule, runs[1], runs[0])


@pytest.mark.parametrize("var_dtype", ["bfloat16", "half"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_16bit_variables_round_their_slots_stochastically_too(rule, var_dtype):
    """stochastic_rounding rounds every 16-bit slot: also those of a half/bfloat16 variable
    (slots of var's dtype); the variable itself is rounded to nearest."""
    dt = npref.np_dtype(var_dtype)
    rng, var, slots = _state(rule, dt, 5, var_dtype=var_dtype)
    hyper = harness.hyper_for(rule, var_dtype, 3)  # exact in float32: the same params
    grad = harness.make_grad(SHAPE, var_dtype, rng)
    got = _run(rule, var, slots, grad, hyper, {}, stochastic_rounding=True, rounding_seed=0)
    wide = [x.astype(np.float32) for x in (var, grad)]
    out32 = _run(rule, wide[0], [s.astype(np.float32) for s in slots], wide[1], hyper, {})
    want_var, want_slots = expected(rule, wide[0], out32, dt, True)
    _check(rule, got, (want_var.astype(dt), want_slots))
    nearest = _run(rule, var, slots, grad, hyper, {})
    assert any((_bits(a) != _bits(b)).any() for a, b in zip(got[1], nearest[1]))


@pytest.mark.parametrize("slot_dtype,spacing", [("bfloat16", 2.0 ** -7), ("float16", 2.0 ** -10)])
@pytest.mark.parametrize("g", [0.1, 0.03, 0.05])
def test_stochastic_rounding_is_unbiased(slot_dtype, spacing, g):
    """Adagrad's accumulator 1.0 + g^2, the same float32 value in every element, stored
    from 200,000 elements (each its own salt): the mean of the stored values is within 4
    standard errors of the value; to nearest every element stores the same neighbour."""
    n, dt = 200_000, SLOT_DTYPES[slot_dtype]
    var = np.random.default_rng(6).uniform(-1, 1, n).astype(np.float32)
    grad = np.full(n, g, np.float32)
    hyper = {"lr": 1e-3, "epsilon": 0.0}
    value = _run("adagrad", var, [np.ones(n, np.float32)], grad, hyper, {})[1][0]
    assert (value == value[0]).all()
    x = float(value[0])
    low = float(np.float32(x).astype(dt))
    low = low if low <= x else low - spacing
    p = (x - low) / spacing
    assert 0.05 < p < 0.95, p
    stored = _run("adagrad", var, [np.ones(n, dt)], grad, hyper, {},
                  stochastic_rounding=True, rounding_seed=0)[1][0].astype(np.float64)
    assert set(np.unique(stored)) == {low, low + spacing}
    standard_error = spacing * np.sqrt(p * (1 - p) / n)
    assert abs(stored.mean() - x) < 4 * standard_error, (stored.mean(), x, standard_error)
    up = (stored > low).mean()  # each element up with probability p, independently
    assert abs(up - p) < 4 * np.sqrt(p * (1 - p) / n), (up, p)
    nearest = _run("adagrad", var, [np.ones(n, dt)], grad, hyper, {})[1][0].astype(np.float64)
    assert len(np.unique(nearest)) == 1
    assert abs(nearest.mean() - x) > 40 * standard_error


@pytest.mark.parametrize("seed", [0, 1, -1, 2 ** 63 - 1, -(2 ** 63), 2 ** 64 - 1, SEED])
def test_rounding_seed_enters_every_salt(seed):
    """Any 64-bit seed (an int64's range, or its unsigned bits) salts every element's and
    every row's stores as the NumPy model of numeric.h's CallSalt says."""
    dt = SLOT_DTYPES["bfloat16"]
    for rule in ("adagrad", "row_wise_adagrad"):
        rng, var, slots = _state(rule, dt, 7, shape=(9, 35))
        hyper = harness.hyper_for(rule, "float", 1)
        grad = harness.make_grad((9, 35), "float", rng)
        got = _run(rule, var, slots, grad, hyper, {}, stochastic_rounding=True,
                   rounding_seed=seed)
        out32 = _run(rule, var, [s.astype(np.float32) for s in slots], grad, hyper, {})
        _check(rule, got, expected(rule, var, out32, dt, True, seed))


def test_rounding_seed_changes_the_decisions_and_only_it():
    """The same seed: the same bits; another seed: other decisions (the same neighbours)."""
    dt = SLOT_DTYPES["bfloat16"]
    rng, var, slots = _state("lazy_adam", dt, 8, shape=(50, 40))
    hyper = harness.hyper_for("lazy_adam", "float", 1)
    grad = harness.make_grad((50, 40), "float", rng)
    runs = [_run("lazy_adam", var, slots, grad, hyper, {}, stochastic_rounding=True,
                 rounding_seed=seed) for seed in (5, 5, 6)]
    _check("lazy_adam", runs[1], runs[0])
    assert any((_bits(a) != _bits(b)).any() for a, b in zip(runs[0][1], runs[2][1]))
    for a, b in zip(runs[0][1], runs[2][1]):  # both within one step of each other
        assert np.all(np.abs(a.astype(np.float64) - b.astype(np.float64))
                      <= np.abs(a.astype(np.float64)) * 2.0 ** -7 + 1e-30)


@pytest.mark.parametrize("why", ["lr_zero", "below_half_a_step"])
def test_stochastic_rounding_is_unbiased_where_nothing_moves(why):
    """The bias the seed removes: an accumulator of 1.0 in bfloat16 (steps of 2^-7) growing
    by g^2 = 1/640 a step, a repeated gradient, where var does not move (lr = 0) or moves by
    less than its own rounding (lr tiny): with the step as seed it grows by the exact sum in
    expectation; with one seed for every step each element takes the same decision every
    step (all up or none), a bias."""
    n, steps = 2048, 96
    g = np.float32(np.sqrt(1 / 640))
    grad = np.full(n, g, np.float32)
    lr = 0.0 if why == "lr_zero" else 1e-30
    exact = steps * float(np.float32(g) * np.float32(g))

    def grow(seed_of_step):
        var = np.linspace(-1, 1, n).astype(np.float32)
        acc = np.ones(n, ml_dtypes.bfloat16)
        before = var.copy()
        for step in range(steps):
            _core.apply_dense("adagrad", var, [acc], grad, {"lr": lr, "epsilon": 0.0},
                              stochastic_rounding=True, rounding_seed=seed_of_step(step))
        assert np.array_equal(var, before)  # var never moved
        return acc.astype(np.float64) - 1.0

    fresh = grow(lambda step: step)
    # Each element's growth: a sum of `steps` independent small chances.
    assert abs(fresh.mean() - exact) < 0.05 * exact, (fresh.mean(), exact)
    stuck = grow(lambda step: 7)
    # One seed: an element's decision at 1.0 repeats until it first rounds up, so the
    # elements split into those that never moved and those that climbed every step.
    assert abs(stuck.mean() - exact) > 0.25 * exact, (stuck.mean(), exact)


def test_stochastic_rounding_keeps_small_increments_nearest_drops():
    """An accumulator of 1.0 in bfloat16 (steps of 2^-7) growing by g^2 = 2^-10 a step: to
    nearest it never moves; stochastically it grows by ~2^-10 a step on average."""
    n, steps = 4096, 64
    grad = np.full(n, 2.0 ** -5, np.float32)
    grown = {}
    for stochastic in (False, True):
        var = np.linspace(-1, 1, n).astype(np.float32)
        acc = np.ones(n, ml_dtypes.bfloat16)
        for step in range(steps):
            _core.apply_dense("adagrad", var, [acc], grad, {"lr": 1e-3, "epsilon": 0.0},
                              stochastic_rounding=stochastic, rounding_seed=step)
        grown[stochastic] = acc.astype(np.float64).mean() - 1.0
    assert grown[False] == 0.0
    assert abs(grown[True] - steps * 2.0 ** -10) < 0.1 * steps * 2.0 ** -10, grown[True]


# --- refusals: ValueError naming the slot, nothing written -------------------------------

def _refused(rule, var, slots, match, sparse=False, error=ValueError, **kw):
    hyper = harness.hyper_for(rule, "float", 1)
    before = [a.tobytes() for a in [var] + slots]
    grad = np.ones(var.shape, var.dtype)
    with pytest.raises(error, match=match):
        if sparse:
            _core.apply_sparse(rule, var, slots, grad, np.arange(var.shape[0], dtype=np.int32),
                               hyper, **kw)
        else:
            _core.apply_dense(rule, var, slots, grad, hyper, **kw)
    assert [a.tobytes() for a in [var] + slots] == before


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("var_dtype,slot_dtype", [("float64", "float16"), ("float64", "bfloat16"),
                                                  ("bfloat16", "float16"), ("float16", "bfloat16")])
def test_compact_slots_need_a_float32_variable(var_dtype, slot_dtype, sparse):
    var = np.ones((4, 3), npref.np_dtype(var_dtype))
    _refused("adagrad", var, [np.ones((4, 3), SLOT_DTYPES[slot_dtype])],
             rf"^accum has dtype {slot_dtype} but var is {var_dtype} \(bfloat16/float16 slots "
             r"are for float32 variables\)$", sparse)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_slots_of_one_update_share_one_dtype(sparse):
    var = np.ones((4, 3), np.float32)
    slots = [np.ones((4, 3), ml_dtypes.bfloat16), np.ones((4, 3), np.float16)]
    _refused("lazy_adam", var, slots, r"^v has dtype float16 but m has bfloat16: an update's "
             r"slots are stored in one dtype$", sparse)
    slots = [np.ones((4, 3), np.float32), np.ones((4, 3), ml_dtypes.bfloat16)]
    _refused("lazy_adam", var, slots, r"^v has dtype bfloat16 but m has float32", sparse)


@pytest.mark.parametrize("slot", [np.float64, np.int16, np.uint16])
def test_other_slot_dtypes_of_a_float32_variable_are_refused(slot):
    var = np.ones((4, 3), np.float32)
    name = np.dtype(slot).name
    _refused("adagrad", var, [np.ones((4, 3), slot)],
             rf"^accum has dtype {name} but var is float32 \(slots may be float32, bfloat16 "
             r"or float16\)$")


def test_grad_must_have_var_dtype():
    var = np.ones((4, 3), np.float32)
    before = var.tobytes()
    with pytest.raises(ValueError, match=r"^grad has dtype bfloat16 but var is float32: var and "
                       r"grad must share one dtype$"):
        _core.apply_dense("adagrad", var, [np.ones((4, 3), ml_dtypes.bfloat16)],
                          np.ones((4, 3), ml_dtypes.bfloat16), {"lr": 0.1, "epsilon": 0.1})
    assert var.tobytes() == before


@pytest.mark.parametrize("value", [1, 0.0, "yes", None])
def test_stochastic_rounding_must_be_a_bool(value):
    var = np.ones((4, 3), np.float32)
    _refused("adagrad", var, [np.ones((4, 3), ml_dtypes.bfloat16)],
             r"^stochastic_rounding must be a bool, got", error=TypeError,
             stochastic_rounding=value)


def test_stochastic_rounding_is_keyword_only():
    var, acc, grad = np.ones(4, np.float32), np.ones(4, ml_dtypes.bfloat16), np.ones(4, np.float32)
    with pytest.raises(TypeError):
        _core.apply_dense("adagrad", var, [acc], grad, {"lr": 0.1, "epsilon": 0.1}, {}, 1, True)
    _core.apply_dense("adagrad", var, [acc], grad, {"lr": 0.1, "epsilon": 0.1}, {}, 1,
                      stochastic_rounding=np.bool_(True), rounding_seed=np.int64(3))


def test_stochastic_rounding_needs_a_seed():
    """The same seed every call would be biased where nothing moves: none is refused, as
    the ops refuse it, with nothing written; a NumPy integer is a seed like Python's."""
    var, acc, grad = np.ones(4, np.float32), np.ones(4, ml_dtypes.bfloat16), np.ones(4, np.float32)
    _refused("adagrad", var, [acc], r"^stochastic_rounding=True needs rounding_seed: an "
             r"integer that changes every call", stochastic_rounding=True)
    for bad in (1.5, "3", True, np.float32(2)):
        _refused("adagrad", var, [acc], r"^rounding_seed must be an integer", error=TypeError,
                 stochastic_rounding=True, rounding_seed=bad)
    _refused("adagrad", var, [acc], r"^rounding_seed must fit in 64 bits",
             stochastic_rounding=True, rounding_seed=2 ** 64)
    _core.apply_dense("adagrad", var, [acc], grad, {"lr": 0.1, "epsilon": 0.1},
                      stochastic_rounding=True, rounding_seed=np.uint64(2 ** 64 - 1))


def test_a_compact_slot_is_measured_by_its_own_bytes():
    """var and a bfloat16 accumulator side by side in one buffer: no overlap (the slot's
    2 bytes an element, not var's 4); one element further they overlap: refused."""
    n = 64
    buffer = np.zeros(n * 4 + n * 2 + 4, np.uint8)
    acc = buffer[: n * 2].view(ml_dtypes.bfloat16)
    var = buffer[n * 2: n * 6].view(np.float32)
    acc[:], var[:] = 1.0, 0.5
    grad = np.full(n, 0.25, np.float32)
    _core.apply_dense("adagrad", var, [acc], grad, {"lr": 0.1, "epsilon": 0.1})
    assert (acc.astype(np.float32) == np.float32(1.0625)).all()
    shifted = buffer[2: n * 2 + 2].view(ml_dtypes.bfloat16)
    before = buffer.tobytes()
    with pytest.raises(ValueError, match="var and accum overlap in memory"):
        _core.apply_dense("adagrad", var, [shifted], grad, {"lr": 0.1, "epsilon": 0.1})
    assert buffer.tobytes() == before
