"""Compact slots (bfloat16/float16 slots beside a float32 variable) inside XLA-compiled
functions: the resource ops and the group op under tf.function(jit_compile=True) equal the
op run without XLA (the CPU kernel) bit for bit, slots rounded to nearest even or
stochastically (cc/core/numeric.h), in both lowerings of cc/tf/xla_kernels.cc:

* "custom_call" (XLA:CPU, TF >= 2.16): the CPU engine itself, with the slots' storage type;
* "hlo" (XLA:GPU's, TF 2.15's, FUSEDOPT_XLA_LOWERING=hlo): the rules as XLA operations and
  numeric.h's stochastic rounding as U32 bit operations (cc/tf/xla_hlo.h).

The HLO lowering computes what the engine computes, but XLA's CPU compiler contracts a*b + c
into fused multiply-adds where the CPU has them (tests/xla/test_xla.py). So the inputs here
are chosen so that every product a slot's value is made of is exact (gradients on a grid of
1/64, betas 1 - 2^-k, slots loaded from 16 bits, rows of 64 elements): a fused multiply-add
then rounds as the engine does and every slot is compared bit for bit on both lowerings.
The variable's own update still has inexact products (a step size times a moment): it is
compared bit for bit where XLA emits no fused multiply-adds (the custom call; the HLO child
process below where XLA can be told so: --xla_cpu_max_isa=AVX), else within test_xla.py's
bound. So is centered RMSprop's `mom`: it divides by sqrt(ms - mg*mg + eps), and mg*mg (mg
just updated, in float32) is inexact, so a contracted ms - mg*mg moves the float32 value by
an ulp, which may move its 16-bit rounding by one step (TF 2.15's XLA, which has no max-ISA
flag, does this in a few elements of a thousand). The "hlo" cases run in a child process (the lowering is chosen when a step compiles,
and compiled steps are cached per process).

Refused combinations (compact slots of a float64 variable, slots of two dtypes, float64 slots
of a float32 variable) are the CPU kernel's InvalidArgumentErrors, raised when the step
compiles, and nothing is written.
"""
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import compact
import numpy_reference as npref
from fusedopt import ops

RULES = npref.RULES
RULE_NAMES = sorted(RULES)
SLOT_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
ROW = 64  # two blocks of the row sum's 32 lanes; a power of two (exact mean)
ROWS = 40
CHILD = os.environ.get("FUSEDOPT_TEST_XLA_CHILD") == "1"
LOWERING = ops.xla_cpu_lowering()
# The variable bit for bit too: the custom call, or XLA told to emit no FMA (the parent sets
# this for its HLO child where XLA knows --xla_cpu_max_isa).
EXACT_VAR = LOWERING == "custom_call" or os.environ.get("FUSEDOPT_TEST_XLA_NO_FMA") == "1"
HLO_ULPS = 4  # test_xla.py's bound for the HLO lowering's fused multiply-adds
# Slots made from an inexact product that XLA may contract (see the docstring): bit for bit
# only where EXACT_VAR, else within one step of their 16-bit storage.
CONTRACTED_SLOTS = {"centered_rms_prop": {"mom"}}

# Betas whose complements are powers of two: (g - m) * (1 - beta1) is exact.
DYADIC = {"beta1": 0.875, "beta2": 0.9375, "rho": 0.9375, "momentum": 0.5}


def _per_row(rule, k):
    return RULES[rule]["slot_layouts"][RULES[rule]["slots"][k]] == "per_row"


def _hyper(rule, step=3):
    oracle = npref.ORACLES[rule]
    h = {name: DYADIC.get(name, value) for name, value in oracle.BASE_HYPER.items()}
    for power, base in oracle.POWERS.items():
        h[power] = h[base] ** step
    return {name: np.float32(h[name]) for name in RULES[rule]["hyper"]}


def _grid(rng, shape):
    """Values k/64, k in [-64, 64] \\ {0}: sums of a few stay exact, and so do their squares."""
    g = rng.integers(-64, 65, shape)
    g[g == 0] = 32
    return (g / 64.0).astype(np.float32)


def _state(rule, np_slot, rng, rows=ROWS, row=ROW):
    shape = (rows, row)
    var = rng.uniform(-1, 1, shape).astype(np.float32)
    ranges = npref.ORACLES[rule].SLOT_RANGES
    slots = [rng.uniform(*ranges[name], npref.slot_shape(rule, name, shape)).astype(np_slot)
             for name in RULES[rule]["slots"]]
    return var, slots


# Duplicates, a row named 40 times (more than 32: sum_order.h's chunks), untouched rows.
SPARSE_IDS = np.array([3, 7, 3, 0, 39, 7, 3, 12] + [21] * 40 + [5, 21, 3], np.int64)


def _case(rule, sparse, np_slot, seed, index_dtype=np.int64):
    rng = np.random.default_rng(seed)
    var, slots = _state(rule, np_slot, rng)
    ids = SPARSE_IDS.astype(index_dtype) if sparse else None
    grad = _grid(rng, ((len(ids),) if sparse else (ROWS,)) + (ROW,))
    return var, slots, _hyper(rule), grad, ids


# The calls' rounding seed (a step counter's value): both 32-bit halves in use.
SEED = 0x0000_0007_FFFF_FFF3


def _run(rule, case, stochastic, jit, seed=SEED):
    """One update of fresh variables, in a jit_compile function or not: their values after.
    The seed is an argument of the function (a run-time value under XLA)."""
    var, slots, hyper, grad, ids = case
    variables = [tf.Variable(x) for x in [var] + slots]
    op = getattr(ops, "resource_%sapply_%s" % ("sparse_" if ids is not None else "", rule))

    def step(hyper, grad, ids, seed):
        args = [variables[0], *variables[1:], *[hyper[h] for h in RULES[rule]["hyper"]], grad]
        if ids is not None:
            args.append(ids)
        op(*args, stochastic_rounding=stochastic, rounding_seed=seed if stochastic else None)

    tf.function(step, jit_compile=jit)(
        {k: tf.constant(v) for k, v in hyper.items()}, tf.constant(grad),
        None if ids is None else tf.constant(ids), tf.constant(seed, tf.int64))
    return [v.numpy() for v in variables]


def _bits(x):
    x = np.ascontiguousarray(x)
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def _assert_var(got, want, old, what):
    if EXACT_VAR:
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=what)
        return
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    scale = np.maximum(np.maximum(np.abs(g64), np.abs(w64)), np.abs(old.astype(np.float64)))
    bad = np.abs(g64 - w64) > HLO_ULPS * float(np.finfo(np.float32).eps) * scale
    assert not bad.any(), (what, np.flatnonzero(bad)[:5])


def _assert_same(rule, got, want, old_var, what):
    """Slots bit for bit (dtype too); var bit for bit where XLA contracts nothing."""
    _assert_var(got[0], want[0], old_var, what + ": var")
    for k, (g, w) in enumerate(zip(got[1:], want[1:])):
        name = f"{what}: {RULES[rule]['slots'][k]}"
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        if not EXACT_VAR and RULES[rule]["slots"][k] in CONTRACTED_SLOTS.get(rule, ()):
            _assert_one_step(g, w, name)
        else:
            np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=name)


def _assert_one_step(got, want, what):
    """At most one step of the storage type apart (same sign), in at most 1% of elements."""
    g, w = _bits(got).astype(np.int64), _bits(want).astype(np.int64)
    sign = 1 << (8 * got.dtype.itemsize - 1)
    assert ((g & sign) == (w & sign)).all(), what
    steps = np.abs(g - w)
    assert steps.max() <= 1, (what, steps.max())
    assert np.count_nonzero(steps) <= max(1, steps.size // 100), (what, np.count_nonzero(steps))


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("slot_dtype", sorted(SLOT_DTYPES))
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_compact_slots_under_xla_equal_the_op(rule, sparse, slot_dtype, stochastic):
    np_slot = SLOT_DTYPES[slot_dtype]
    case = _case(rule, sparse, np_slot, seed=11)
    got = _run(rule, case, stochastic, jit=True)
    want = _run(rule, case, stochastic, jit=False)
    _assert_same(rule, got, want, case[0], f"{rule} {slot_dtype}")
    assert all(s.dtype == np.dtype(np_slot) for s in got[1:])
    if stochastic:  # and the op is numeric.h's rounding of its float32 update (its own test)
        near = _run(rule, case, False, jit=False)
        assert any((_bits(a) != _bits(b)).any() for a, b in zip(want[1:], near[1:]))
    if sparse:  # untouched rows: not a bit changed
        untouched = np.setdiff1d(np.arange(ROWS), case[4])
        np.testing.assert_array_equal(_bits(got[0][untouched]), _bits(case[0][untouched]))
        for g, s in zip(got[1:], case[1]):
            np.testing.assert_array_equal(_bits(g[untouched]), _bits(s[untouched]))


@pytest.mark.parametrize("shape", [(), (5,), (4, 3, 16)], ids=["scalar", "vector", "rank3"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_compact_slots_of_other_shapes(rule, shape):
    """A scalar (one row of one element), a vector (rows of one) and a rank-3 table: the
    per-row salt is each row's first element (a scalar's own value), as on the CPU."""
    rng = np.random.default_rng(13)
    var = rng.uniform(-1, 1, shape).astype(np.float32)
    ranges = npref.ORACLES[rule].SLOT_RANGES
    slots = [rng.uniform(*ranges[name], shape[:1] if _per_row(rule, k) else shape)
             .astype(ml_dtypes.bfloat16) for k, name in enumerate(RULES[rule]["slots"])]
    case = (var, slots, _hyper(rule), _grid(rng, shape), None)
    got = _run(rule, case, True, jit=True)
    _assert_same(rule, got, _run(rule, case, True, jit=False), var, f"{rule} {shape}")


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64], ids=["int32", "int64"])
def test_slots_of_16_bit_variables_round_stochastically_too(index_dtype):
    """Slots of a bfloat16/half variable (its own dtype: not compact slots) are 16-bit too:
    stochastic_rounding rounds them so, on every engine; the same under XLA."""
    for dtype in (ml_dtypes.bfloat16, np.float16):
        rng = np.random.default_rng(5)
        var = rng.uniform(-1, 1, (ROWS, ROW)).astype(dtype)
        slots = [rng.uniform(0.01, 1, (ROWS, ROW)).astype(dtype) for _ in range(2)]
        hyper = {k: np.asarray(v, dtype) for k, v in _hyper("lazy_adam").items()}
        grad = _grid(rng, (len(SPARSE_IDS), ROW)).astype(dtype)
        case = (var, slots, hyper, grad, SPARSE_IDS.astype(index_dtype))
        got = _run("lazy_adam", case, True, jit=True)
        want = _run("lazy_adam", case, True, jit=False)
        for k, (g, w) in enumerate(zip(got[1:], want[1:])):
            np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=f"{dtype} slot {k}")
        if EXACT_VAR:
            np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]))


@pytest.mark.parametrize("slot_dtype", sorted(SLOT_DTYPES))
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_values_at_the_edges_of_the_slot_type_round_as_the_op_does(sparse, slot_dtype):
    """Adagrad accumulators at the largest finite value plus a fraction of its last step (a
    stochastic carry into Inf), past it (half: the fallback to nearest, Inf; bfloat16: a
    float32 Inf), in half's subnormal range (its fallback to nearest), and at +Inf: numeric.h's
    branches, the same under XLA, and the op's result numeric.h's (tests/support/compact.py)."""
    np_slot = SLOT_DTYPES[slot_dtype]
    half = np_slot == np.float16
    rng = np.random.default_rng(7)
    big = float(ml_dtypes.finfo(np_slot).max)
    tiny = float(ml_dtypes.finfo(np_slot).smallest_normal)
    accum = np.concatenate([
        np.full((2, ROW), big),
        rng.uniform(0.0, 4 * tiny, (2, ROW)),
        np.full((1, ROW), np.inf),
        rng.uniform(0.5, 2.0, (4, ROW))]).astype(np_slot)
    rows = accum.shape[0]
    grad = np.concatenate([
        np.full((1, ROW), 4.0 if half else 2.0 ** 59),     # half of half's / a quarter of
                                                            # bfloat16's last step
        np.full((1, ROW), 16.0 if half else 2.0 ** 64),    # past the largest: Inf
        rng.integers(1, 9, (2, ROW)) * 2.0 ** -13,          # squares below half's normals
        np.full((1, ROW), 1.0),
        _grid(rng, (4, ROW))]).astype(np.float32)
    var = rng.uniform(-1, 1, (rows, ROW)).astype(np.float32)
    hyper = {"lr": np.float32(0.25), "epsilon": np.float32(1e-3)}
    ids = None
    if sparse:
        ids = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 2, 6], np.int32)
        grad = np.concatenate([grad, grad[[2, 6]]])
    case = (var, [accum], hyper, grad, ids)
    for stochastic in (False, True):
        got = _run("adagrad", case, stochastic, jit=True)
        want = _run("adagrad", case, stochastic, jit=False)
        _assert_same("adagrad", got, want, var, f"{slot_dtype} stochastic={stochastic}")
        summed = np.zeros((rows, ROW), np.float32)
        for i, r in enumerate(range(rows) if ids is None else ids):
            summed[r] += grad[i]
        with np.errstate(over="ignore"):  # float32 and 16-bit overflows to Inf, as meant
            new = accum.astype(np.float32) + summed * summed
            model = compact.round_slot(new, np_slot, stochastic,
                                       compact.element_salt(var, SEED))
        np.testing.assert_array_equal(_bits(want[1]), _bits(model))
    carried = np.isinf(got[1][0].astype(np.float32))  # stochastic: some carried into Inf
    assert carried.any() and not carried.all()
    assert np.isinf(got[1][1].astype(np.float32)).all()


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_group_op_with_compact_slots_under_xla(rule, stochastic):
    """One custom call over every member (XLA:CPU), or each member's HLO: the op's bits."""
    members = [_case(rule, False, ml_dtypes.bfloat16, seed=s) for s in (1, 2, 3)]
    members[2] = (members[2][0][:7, :5].copy(), [s[:7, :5].copy() if s.ndim == 2 else s[:7].copy()
                                               for s in members[2][1]],
                  members[2][2], members[2][3][:7, :5].copy(), None)
    hyper = members[0][2]
    n_slots = len(RULES[rule]["slots"])
    op = getattr(ops, "resource_group_apply_" + rule)

    def run(jit):
        state = [[tf.Variable(m[0]) for m in members]]
        state += [[tf.Variable(m[1][k]) for m in members] for k in range(n_slots)]

        def step(hyper, grads, seed):
            op(*state, *[hyper[h] for h in RULES[rule]["hyper"]], grads,
               stochastic_rounding=stochastic, rounding_seed=seed if stochastic else None)

        tf.function(step, jit_compile=jit)({k: tf.constant(v) for k, v in hyper.items()},
                                           [tf.constant(m[3]) for m in members],
                                           tf.constant(SEED, tf.int64))
        return [[x.numpy() for x in column] for column in state]

    got, want = run(True), run(False)
    for i, m in enumerate(members):
        _assert_same(rule, [got[0][i]] + [got[k + 1][i] for k in range(n_slots)],
                     [want[0][i]] + [want[k + 1][i] for k in range(n_slots)], m[0],
                     f"member {i}")


def _refused(rule, var, slots, match, group):
    hyper = {k: np.asarray(v, var.dtype) for k, v in _hyper(rule).items()}
    variables = [tf.Variable(x) for x in [var] + slots]
    before = [_bits(v.numpy()).copy() for v in variables]
    grad = np.ones(var.shape, var.dtype)
    h = [tf.constant(hyper[name]) for name in RULES[rule]["hyper"]]
    if group:
        step = lambda: [getattr(ops, "resource_group_apply_" + rule)(  # noqa: E731
            [variables[0]], *[[s] for s in variables[1:]], *h, [tf.constant(grad)]), None][1]
    else:
        step = lambda: [getattr(ops, "resource_apply_" + rule)(  # noqa: E731
            variables[0], *variables[1:], *h, tf.constant(grad),
            stochastic_rounding=True, rounding_seed=SEED), None][1]
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        tf.function(step, jit_compile=True)()
    for v, old in zip(variables, before):
        np.testing.assert_array_equal(_bits(v.numpy()), old)


@pytest.mark.parametrize("group", [False, True], ids=["single", "group"])
def test_compact_slots_of_a_float64_variable_are_refused(group):
    _refused("adagrad", np.ones((4, 3), np.float64), [np.ones((4, 3), ml_dtypes.bfloat16)],
             r"accum(\[0\])? has dtype bfloat16 but the update is for double \(bfloat16/half "
             r"slots are for float32 variables\)", group)


@pytest.mark.parametrize("group", [False, True], ids=["single", "group"])
def test_slots_of_two_dtypes_are_refused(group):
    _refused("lazy_adam", np.ones((4, 3), np.float32),
             [np.ones((4, 3), ml_dtypes.bfloat16), np.ones((4, 3), np.float16)],
             r"v(\[0\])? has dtype half but m(\[0\])? has bfloat16: an update's slots are "
             r"stored in one dtype", group)


@pytest.mark.parametrize("group", [False, True], ids=["single", "group"])
def test_float64_slots_of_a_float32_variable_are_refused(group):
    _refused("adagrad", np.ones((4, 3), np.float32), [np.ones((4, 3), np.float64)],
             r"accum(\[0\])? has dtype double but the update is for float \(slots may be "
             r"float, bfloat16 or half\)", group)


def test_a_variable_of_another_dtype_is_refused():
    """The raw op (fusedopt.ops casts the hyper-parameters to var's dtype): T double, var
    float32."""
    var = tf.Variable(np.ones((4, 3), np.float32))
    accum = tf.Variable(np.ones((4, 3), np.float64))
    raw = ops.load_library().fused_opt_resource_apply_adagrad
    step = lambda: [raw(  # noqa: E731
        var=var.handle, accum=accum.handle, lr=tf.constant(0.5, tf.float64),
        epsilon=tf.constant(0.1, tf.float64), grad=tf.ones((4, 3), tf.float64),
        rounding_seed=[]), None][1]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=re.escape("var has dtype float but the update is for double")):
        tf.function(step, jit_compile=True)()
    np.testing.assert_array_equal(var.numpy(), np.ones((4, 3), np.float32))
    np.testing.assert_array_equal(accum.numpy(), np.ones((4, 3), np.float64))


def _xla_knows_max_isa():
    """Whether this TensorFlow's XLA takes --xla_cpu_max_isa (an unknown XLA flag aborts)."""
    header = os.path.join(tf.sysconfig.get_include(), "xla", "xla.pb.h")
    try:
        with open(header) as f:
            return "xla_cpu_max_isa" in f.read()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(CHILD, reason="runs in the parent only")
def test_hlo_lowering_in_a_child_process():
    """This file through the HLO lowering (XLA:GPU's, TF 2.15's), with XLA told to emit no
    fused multiply-adds where it can be (then the variable is compared bit for bit too)."""
    if LOWERING == "hlo":
        pytest.skip("this process already uses the HLO lowering")
    env = dict(os.environ, FUSEDOPT_XLA_LOWERING="hlo", FUSEDOPT_TEST_XLA_CHILD="1")
    if _xla_knows_max_isa():
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_max_isa=AVX").strip()
        env["FUSEDOPT_TEST_XLA_NO_FMA"] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
                          os.path.abspath(__file__)], env=env, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert re.search(r"\d+ passed", out.stdout), out.stdout[-2000:]
