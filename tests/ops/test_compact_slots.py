"""Compact slots (bfloat16/float16 slots beside a float32 variable) in the TF ops.

The engines compute in float32 and round each slot once on store: a compact update must
equal, bit for bit, the same update with float32 slots holding the widened 16-bit values,
its slots then rounded as numeric.h rounds them (tests/support/compact.py: to nearest even,
or stochastically from the value and the variable element's old bits). The float32 path
is itself checked against the NumPy float64 oracle elsewhere.
"""
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import compact
import harness
import numpy_reference as npref
from fusedopt import ops

RULES = npref.RULES
RULE_NAMES = sorted(RULES)
SLOT_DTYPES = {"bfloat16": (tf.bfloat16, ml_dtypes.bfloat16), "float16": (tf.float16, np.float16)}
ROW = 37  # > 32 lanes of the row sum, odd


def _per_row(rule, k):
    return RULES[rule]["slot_layouts"][RULES[rule]["slots"][k]] == "per_row"


def _inputs(rule, sparse, np_slot, seed=0):
    rng = np.random.default_rng(seed)
    shape = (40, ROW)
    var = rng.uniform(-1, 1, shape).astype(np.float32)
    # Slots start as 16-bit values; the float32 run gets them widened.
    slots = [rng.uniform(0.01, 1, npref.slot_shape(rule, n, shape)).astype(np_slot)
             for n in RULES[rule]["slots"]]
    hyper = harness.hyper_for(rule, "float", 3)
    if sparse:
        indices = np.array([3, 7, 3, 0, 39, 7, 3, 12], np.int64)
        grad = rng.uniform(-1, 1, (len(indices), ROW)).astype(np.float32)
    else:
        indices = None
        grad = rng.uniform(-1, 1, shape).astype(np.float32)
    return var, slots, hyper, grad, indices


SEED = -0x0F1E_2D3C_4B5A_6978  # the calls' rounding seed: negative, both halves in use


def _run(rule, sparse, var, slots, hyper, grad, indices, stochastic=False, seed=SEED):
    vs = [tf.Variable(var)] + [tf.Variable(s) for s in slots]
    variant = "resource_sparse_apply" if sparse else "resource_apply"
    args = [vs[0], *vs[1:], *[hyper[h] for h in RULES[rule]["hyper"]], grad]
    if sparse:
        args.append(indices)
    getattr(ops, f"{variant}_{rule}")(*args, stochastic_rounding=stochastic,
                                       rounding_seed=seed if stochastic else None)
    return [v.numpy() for v in vs]


def _expected(rule, var, out32, np_slot, stochastic, seed=SEED):
    """The float32-slot run's results with its slots stored as numeric.h stores them."""
    salt = compact.element_salt(var, seed)
    out = [out32[0]]
    for k, slot in enumerate(out32[1:]):
        slot_salt = salt[:, 0] if _per_row(rule, k) else salt
        out.append(compact.round_slot(slot, np_slot, stochastic, slot_salt, k))
    return out


def _bits(x):
    return np.asarray(x).view(np.uint16 if np.asarray(x).dtype.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("slot_dtype", sorted(SLOT_DTYPES))
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_compact_update_is_the_float32_update_rounded_once(rule, sparse, slot_dtype, stochastic):
    tf_slot, np_slot = SLOT_DTYPES[slot_dtype]
    var, slots, hyper, grad, indices = _inputs(rule, sparse, np_slot)
    got = _run(rule, sparse, var, slots, hyper, grad, indices, stochastic)
    out32 = _run(rule, sparse, var, [s.astype(np.float32) for s in slots], hyper, grad, indices)
    want = _expected(rule, var, out32, np_slot, stochastic)
    assert got[0].dtype == np.float32
    np.testing.assert_array_equal(_bits(got[0]), _bits(want[0]))
    for k, (g, w) in enumerate(zip(got[1:], want[1:])):
        assert g.dtype == np.dtype(np_slot), (k, g.dtype)
        np.testing.assert_array_equal(_bits(g), _bits(w), err_msg=RULES[rule]["slots"][k])
    if sparse:  # untouched rows: not a bit changed
        untouched = np.setdiff1d(np.arange(var.shape[0]), indices)
        np.testing.assert_array_equal(got[0][untouched], var[untouched])
        for g, s in zip(got[1:], slots):
            np.testing.assert_array_equal(_bits(g[untouched]), _bits(s[untouched]))


def test_stochastic_rounding_keeps_small_increments_nearest_drops():
    """Adagrad's accumulator at 1.0 in bfloat16 (steps of 2^-7) growing by g^2 = 2^-10 per
    step: to nearest it never moves; stochastically it grows by ~2^-10 a step on average."""
    n, steps = 4096, 64
    g = np.full((n,), 2.0 ** -5, np.float32)
    results = {}
    for stochastic in (False, True):
        var = tf.Variable(np.linspace(-1, 1, n).astype(np.float32))
        acc = tf.Variable(np.ones((n,), ml_dtypes.bfloat16))
        for step in range(steps):
            ops.resource_apply_adagrad(var, acc, 1e-3, 0.0, g, stochastic_rounding=stochastic,
                                       rounding_seed=step if stochastic else None)
        results[stochastic] = acc.numpy().astype(np.float64)
    assert np.all(results[False] == 1.0)
    growth = results[True].mean() - 1.0
    assert abs(growth - steps * 2.0 ** -10) < 0.1 * steps * 2.0 ** -10, growth


def test_stochastic_rounding_is_deterministic():
    var, slots, hyper, grad, indices = _inputs("lazy_adam", True, ml_dtypes.bfloat16, seed=4)
    a = _run("lazy_adam", True, var, slots, hyper, grad, indices, True)
    b = _run("lazy_adam", True, var, slots, hyper, grad, indices, True)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(_bits(x), _bits(y))


@pytest.mark.parametrize("rule", RULE_NAMES)
def test_group_op_with_compact_slots(rule):
    _, np_slot = SLOT_DTYPES["bfloat16"]
    members = [_inputs(rule, False, np_slot, seed=s) for s in (1, 2)]
    hyper = members[0][2]
    state = [[tf.Variable(m[0]) for m in members]]
    n_slots = len(RULES[rule]["slots"])
    state += [[tf.Variable(m[1][k]) for m in members] for k in range(n_slots)]
    getattr(ops, "resource_group_apply_" + rule)(
        *state, *[hyper[h] for h in RULES[rule]["hyper"]], [m[3] for m in members],
        stochastic_rounding=True, rounding_seed=tf.constant(SEED, tf.int64))
    for i, (var, slots, _, grad, _) in enumerate(members):
        out32 = _run(rule, False, var, [s.astype(np.float32) for s in slots], hyper, grad, None)
        want = _expected(rule, var, out32, np_slot, True)
        got = [state[0][i].numpy()] + [state[k + 1][i].numpy() for k in range(n_slots)]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(_bits(g), _bits(w))


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_ref_variables_with_compact_slots(sparse):
    """TF1 graphs: ref slots of bfloat16 beside a float32 ref variable (the op's S attr)."""
    rule = "lazy_adam"
    var, slots, hyper, grad, indices = _inputs(rule, sparse, ml_dtypes.bfloat16)
    graph = tf.Graph()
    with graph.as_default():
        vs = [tf.compat.v1.Variable(x, use_resource=False) for x in [var] + slots]
        args = [vs[0], *vs[1:], *[hyper[h] for h in RULES[rule]["hyper"]], grad]
        if sparse:
            args.append(indices)
        update = getattr(ops, ("sparse_apply_" if sparse else "apply_") + rule)(*args)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(update)
            got = session.run(vs)
    out32 = _run(rule, sparse, var, [s.astype(np.float32) for s in slots], hyper, grad, indices)
    for g, w in zip(got, _expected(rule, var, out32, ml_dtypes.bfloat16, False)):
        np.testing.assert_array_equal(_bits(g), _bits(w))


def _refused(rule, var, slots, match, group=False):
    hyper = harness.hyper_for(rule, "float", 1)
    vs = [tf.Variable(x) for x in [var] + slots]
    before = [v.numpy().tobytes() for v in vs]
    grad = np.ones(var.shape, var.dtype)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        if group:
            getattr(ops, "resource_group_apply_" + rule)(
                [vs[0]], *[[s] for s in vs[1:]], *[hyper[h] for h in RULES[rule]["hyper"]],
                [grad])
        else:
            getattr(ops, "resource_apply_" + rule)(
                vs[0], *vs[1:], *[hyper[h] for h in RULES[rule]["hyper"]], grad)
    assert [v.numpy().tobytes() for v in vs] == before


@pytest.mark.parametrize("group", [False, True], ids=["single", "group"])
def test_compact_slots_need_a_float32_variable(group):
    var = np.ones((4, 3), np.float64)
    slots = [np.ones((4, 3), ml_dtypes.bfloat16)]
    _refused("adagrad", var, slots, r"accum(\[0\])? has dtype bfloat16 but the update is for "
             r"double \(bfloat16/half slots are for float32 variables\)", group)


@pytest.mark.parametrize("group", [False, True], ids=["single", "group"])
def test_slots_of_one_update_share_one_dtype(group):
    var = np.ones((4, 3), np.float32)
    slots = [np.ones((4, 3), ml_dtypes.bfloat16), np.ones((4, 3), np.float16)]
    _refused("lazy_adam", var, slots,
             r"v(\[0\])? has dtype half but m(\[0\])? has bfloat16: an update's slots are "
             r"stored in one dtype", group)


def test_float64_slots_of_a_float32_variable_are_refused():
    var = np.ones((4, 3), np.float32)
    _refused("adagrad", var, [np.ones((4, 3), np.float64)],
             r"accum has dtype double but the update is for float \(slots may be "
             r"float, bfloat16 or half\)")


# --- the rounding seed -------------------------------------------------------------------


def test_stochastic_rounding_is_unbiased_where_var_does_not_move():
    """Adagrad with lr = 0 and a repeated gradient (var never moves), accumulators of 1.0 in
    bfloat16 growing by g^2 = 1/640 a step: with the step as the seed the mean growth is the
    exact sum; with the same seed every step each element repeats its decision (a bias)."""
    n, steps = 2048, 96
    g = np.full((n,), np.sqrt(1 / 640), np.float32)
    exact = steps * float(g[0] * g[0])

    def grow(seed_of_step):
        var = tf.Variable(np.linspace(-1, 1, n).astype(np.float32))
        acc = tf.Variable(np.ones((n,), ml_dtypes.bfloat16))
        for step in range(steps):
            ops.resource_apply_adagrad(var, acc, 0.0, 0.0, g, stochastic_rounding=True,
                                       rounding_seed=seed_of_step(step))
        np.testing.assert_array_equal(var.numpy(), np.linspace(-1, 1, n).astype(np.float32))
        return acc.numpy().astype(np.float64) - 1.0

    assert abs(grow(lambda step: step).mean() - exact) < 0.05 * exact
    assert abs(grow(lambda step: 3).mean() - exact) > 0.25 * exact


@pytest.mark.parametrize("mode", ["eager", "function", "jit", "jit_hlo"])
def test_rounding_seed_from_a_variable_in_every_mode(mode, monkeypatch):
    """The seed read from an int64 variable (a step counter), the same bits in eager,
    tf.function and both XLA lowerings as the NumPy model of numeric.h."""
    if mode == "jit_hlo":
        monkeypatch.setenv("FUSEDOPT_XLA_LOWERING", "hlo")
    var, slots, hyper, grad, _ = _inputs("adagrad", False, ml_dtypes.bfloat16, seed=9)
    out32 = _run("adagrad", False, var, [s.astype(np.float32) for s in slots], hyper, grad, None)
    step = tf.Variable(123456789012, dtype=tf.int64)
    vs = [tf.Variable(var)] + [tf.Variable(s) for s in slots]

    def update():
        ops.resource_apply_adagrad(vs[0], vs[1], hyper["lr"], hyper["epsilon"], grad,
                                   stochastic_rounding=True, rounding_seed=step)
    if mode != "eager":
        update = tf.function(update, jit_compile=mode.startswith("jit"))
    update()
    want = _expected("adagrad", var, out32, ml_dtypes.bfloat16, True, 123456789012)
    np.testing.assert_array_equal(_bits(vs[1].numpy()), _bits(want[1]))


def test_stochastic_rounding_without_a_seed_is_refused():
    var = tf.Variable(np.ones(4, np.float32))
    acc = tf.Variable(np.ones(4, ml_dtypes.bfloat16))
    before = acc.numpy().copy()
    with pytest.raises(ValueError, match=r"stochastic_rounding=True needs rounding_seed: an "
                                         r"int64 scalar that changes every call"):
        ops.resource_apply_adagrad(var, acc, 0.1, 0.0, np.ones(4, np.float32),
                                   stochastic_rounding=True)
    # The op itself, called without the wrapper: refused by its kernel, nothing written.
    library = ops.load_library()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"stochastic_rounding needs a rounding_seed"):
        library.fused_opt_resource_apply_adagrad(
            var=var.handle, accum=acc.handle, lr=tf.constant(0.1), epsilon=tf.constant(0.0),
            grad=tf.ones(4), rounding_seed=[], stochastic_rounding=True)
    with tf.Graph().as_default():  # at graph construction: the shape function's check
        v = tf.compat.v1.Variable(np.ones(4, np.float32), use_resource=True)
        a = tf.compat.v1.Variable(np.ones(4, ml_dtypes.bfloat16), use_resource=True)
        with pytest.raises(ValueError, match=r"stochastic_rounding needs a rounding_seed"):
            library.fused_opt_resource_apply_adagrad(
                var=v.handle, accum=a.handle, lr=tf.constant(0.1), epsilon=tf.constant(0.0),
                grad=tf.ones(4), rounding_seed=[], stochastic_rounding=True)
    np.testing.assert_array_equal(_bits(acc.numpy()), _bits(before))


@pytest.mark.parametrize("seed,error,match", [
    (1.5, TypeError, r"rounding_seed must be an integer"),
    (True, TypeError, r"rounding_seed must be an integer"),
    (np.float32(2), TypeError, r"rounding_seed must be an integer"),
    (tf.constant(2.0), TypeError, r"rounding_seed must be an integer"),
    (tf.constant([1, 2], tf.int64), (ValueError, tf.errors.InvalidArgumentError),
     r"rounding_seed must be a scalar"),
    ("7", (TypeError, ValueError), r"rounding_seed|int64|string"),
])
def test_bad_rounding_seeds_are_refused(seed, error, match):
    var = tf.Variable(np.ones(4, np.float32))
    acc = tf.Variable(np.ones(4, ml_dtypes.bfloat16))
    before = acc.numpy().copy()
    with pytest.raises(error, match=match):
        ops.resource_apply_adagrad(var, acc, 0.1, 0.0, np.ones(4, np.float32),
                                   stochastic_rounding=True, rounding_seed=seed)
    np.testing.assert_array_equal(_bits(acc.numpy()), _bits(before))


def test_a_seed_without_stochastic_rounding_changes_nothing():
    var, slots, hyper, grad, _ = _inputs("adagrad", False, ml_dtypes.bfloat16, seed=10)
    vs = [tf.Variable(var)] + [tf.Variable(s) for s in slots]
    ops.resource_apply_adagrad(vs[0], vs[1], hyper["lr"], hyper["epsilon"], grad,
                               rounding_seed=99)
    want = _run("adagrad", False, var, slots, hyper, grad, None)
    np.testing.assert_array_equal(_bits(vs[1].numpy()), _bits(want[1]))
