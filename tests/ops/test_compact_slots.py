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


def _run(rule, sparse, var, slots, hyper, grad, indices, stochastic=False):
    vs = [tf.Variable(var)] + [tf.Variable(s) for s in slots]
    variant = "resource_sparse_apply" if sparse else "resource_apply"
    args = [vs[0], *vs[1:], *[hyper[h] for h in RULES[rule]["hyper"]], grad]
    if sparse:
        args.append(indices)
    getattr(ops, f"{variant}_{rule}")(*args, stochastic_rounding=stochastic)
    return [v.numpy() for v in vs]


def _expected(rule, var, out32, np_slot, stochastic):
    """The float32-slot run's results with its slots stored as numeric.h stores them."""
    salt = compact.float_bits(var)
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
        for _ in range(steps):
            ops.resource_apply_adagrad(var, acc, 1e-3, 0.0, g, stochastic_rounding=stochastic)
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
        stochastic_rounding=True)
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
