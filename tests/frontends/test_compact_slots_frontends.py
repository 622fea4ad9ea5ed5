"""Compact slots (``slot_dtype="bfloat16"/"float16"``, ``stochastic_rounding``) in the front
ends: fusedopt.keras (Keras 3 / Keras 2.15's classes and the own ones) and
fusedopt.compat.v1.

The ops' numbers are checked in tests/ops/test_compact_slots.py; here: the slot variables
are of the compact dtype for float32 variables only, the first step from zero slots moves
the variable exactly as the float32-slot optimizer does (the update computes in float32
and only the stored slots are rounded) and stores those slots rounded, the option travels
through get_config, Keras model files restore across slot dtypes (cast), and fit trains.
"""
import os

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import compact
import front_ends
import numpy_reference as npref

import fusedopt.compat.v1 as fv1
import fusedopt.keras as fk
from fusedopt import rules, runtime

keras = tf.keras
KERAS3 = hasattr(keras.optimizers.Optimizer, "stateless_apply")
SPECS = front_ends.specs("KERAS")
V1_SPECS = front_ends.specs("COMPAT_V1")
KERAS_CLASSES = {rule: name for rule, (name, _) in front_ends.cases("KERAS").items()}
V1_CLASSES = {rule: name for rule, (name, _) in front_ends.cases("COMPAT_V1").items()}
LEGACY_CLASSES = {rule: name for rule, (name, _) in front_ends.cases("LEGACY").items()}
NP = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
ROWS, WIDTH = 12, 5


def _keras(rule, **kwargs):
    extra = npref.ORACLES[rule].KERAS_KWARGS
    return getattr(fk, KERAS_CLASSES[rule])(**{**extra, "learning_rate": 0.05, **kwargs})


def _slots(opt, variable, rule):
    return [opt._slot(getattr(opt, attr), variable) for attr in SPECS[rule].slots]


def _grad(sparse, seed=1):
    rng = np.random.default_rng(seed)
    if sparse:
        ids = [2, 7, 2, 5]
        return tf.IndexedSlices(tf.constant(rng.normal(size=(4, WIDTH)).astype(np.float32)),
                                tf.constant(ids, tf.int64), tf.constant([ROWS, WIDTH], tf.int64))
    return tf.constant(rng.normal(size=(ROWS, WIDTH)).astype(np.float32))


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


def _table():
    return np.random.default_rng(0).uniform(-1, 1, (ROWS, WIDTH)).astype(np.float32)


def _per_row(rule, k):
    spec = rules.SPECS[rule]
    return spec["slot_layouts"][spec["slots"][k]] == "per_row"


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("slot_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rule", sorted(SPECS))
def test_keras_first_step_is_the_float32_step_with_rounded_slots(rule, sparse, slot_dtype,
                                                                  stochastic):
    start = _table()
    compact_var, full_var = tf.Variable(start), tf.Variable(start)
    opt = _keras(rule, slot_dtype=slot_dtype, stochastic_rounding=stochastic)
    full = _keras(rule)
    opt.build([compact_var])
    full.build([full_var])
    # Slots start where a 16-bit slot can hold them exactly (zeros, Adagrad's 0.1 is not):
    # both optimizers start from the 16-bit values.
    for a, b in zip(_slots(opt, compact_var, rule), _slots(full, full_var, rule)):
        assert tf.as_dtype(a.dtype) == tf.as_dtype(slot_dtype)
        b.assign(tf.cast(tf.convert_to_tensor(a), tf.float32))
    opt.apply_gradients([(_grad(sparse), compact_var)])
    full.apply_gradients([(_grad(sparse), full_var)])
    np.testing.assert_array_equal(_bits(compact_var.numpy()), _bits(full_var.numpy()))
    salt = compact.element_salt(start, 0)  # the first step: iterations 0 seeds the rounding
    for k, (a, b) in enumerate(zip(_slots(opt, compact_var, rule), _slots(full, full_var, rule))):
        want = compact.round_slot(np.asarray(b), NP[slot_dtype], stochastic,
                                  salt[:, 0] if _per_row(rule, k) else salt, k)
        np.testing.assert_array_equal(_bits(np.asarray(a)), _bits(want))


@pytest.mark.parametrize("mode", ["function", "xla"])
@pytest.mark.parametrize("rule", ["lazy_adam", "row_wise_adagrad"])
def test_keras_compiled_steps_equal_eager_steps(rule, mode):
    """tf.function and XLA-compiled steps (Keras's fit(jit_compile=True)) store the same
    slot bits as eager ones, stochastic rounding included."""
    results = []
    for compiled in (False, True):
        var = tf.Variable(_table())
        opt = _keras(rule, slot_dtype="bfloat16", stochastic_rounding=True)
        opt.build([var])

        def step(grad):
            opt.apply_gradients([(grad, var)])

        if compiled:
            step = tf.function(step, jit_compile=mode == "xla")
        for seed in (1, 2, 3):
            step(_grad(True, seed))
            step(_grad(False, seed))
        results.append([var.numpy()] + [np.asarray(s) for s in _slots(opt, var, rule)])
    if mode == "xla" and runtime.xla_cpu_lowering() == "hlo":
        # XLA's HLO (TF 2.15) may fuse multiply-adds: the float32 value a slot is rounded
        # from can differ in its last bit, so its stochastic rounding may differ by one
        # 16-bit step (documented); the custom call (TF >= 2.16) is bit-exact above.
        for a, b in zip(*results):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                       rtol=2 ** -5, atol=1e-5)  # a few steps of drift
        return
    for a, b in zip(*results):
        np.testing.assert_array_equal(_bits(a), _bits(b))


def test_keras_other_variables_keep_their_dtype_and_base_variables_stay_float32():
    table = tf.Variable(_table())
    wide = tf.Variable(np.ones((3,), np.float64))
    opt = _keras("lazy_adam", slot_dtype="bfloat16", use_ema=True)
    opt.build([table, wide])
    assert [tf.as_dtype(s.dtype) for s in _slots(opt, table, "lazy_adam")] == [tf.bfloat16] * 2
    assert [tf.as_dtype(s.dtype) for s in _slots(opt, wide, "lazy_adam")] == [tf.float64] * 2
    averages = opt._model_variables_moving_average
    assert [tf.as_dtype(a.dtype) for a in averages] == [tf.float32, tf.float64]


def test_keras_config_round_trip_and_refusals():
    opt = _keras("lazy_adam", slot_dtype=tf.bfloat16, stochastic_rounding=True)
    config = opt.get_config()
    assert config["slot_dtype"] == "bfloat16" and config["stochastic_rounding"] is True
    again = type(opt).from_config(config)
    assert again.slot_dtype == tf.bfloat16 and again.stochastic_rounding
    assert "slot_dtype" not in _keras("lazy_adam").get_config()
    with pytest.raises(ValueError, match="slot_dtype must be"):
        _keras("lazy_adam", slot_dtype="int8")
    with pytest.raises(ValueError, match="amsgrad"):
        _keras("lazy_adam", slot_dtype="bfloat16", amsgrad=True)


def _model(optimizer):
    model = keras.Sequential([keras.Input((2,), dtype="int32"),
                              keras.layers.Embedding(50, 8), keras.layers.Flatten(),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _data():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 50, (256, 2)).astype(np.int32)
    return x, (x[:, :1] % 7).astype(np.float32) / 7.0


@pytest.mark.slow
def test_keras_fit_trains_and_model_files_restore_across_slot_dtypes(tmp_path):
    x, y = _data()
    model = _model(fk.LazyAdam(0.01, slot_dtype="bfloat16", stochastic_rounding=True))
    first = model.fit(x, y, epochs=1, batch_size=32, verbose=0).history["loss"][0]
    last = model.fit(x, y, epochs=5, batch_size=32, verbose=0).history["loss"][-1]
    assert last < 0.5 * first
    slot_dtypes = {tf.as_dtype(v.dtype).name for v in model.optimizer.variables
                   if len(v.shape) == 2}
    assert slot_dtypes == {"bfloat16"}
    if not KERAS3:
        return  # Keras 2.15 model files: tf.train.Checkpoint inside (dtype must match)
    path = os.path.join(tmp_path, "compact.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.optimizer.slot_dtype == tf.bfloat16
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Into a float32-slot optimizer and back: cast.
    wide = _model(fk.LazyAdam(0.01))
    wide.optimizer.build(wide.trainable_variables)
    store = {str(i): np.asarray(v) for i, v in enumerate(model.optimizer.variables)}
    wide.optimizer.load_own_variables(store)
    for a, b in zip(model.optimizer.variables, wide.optimizer.variables):
        assert tf.as_dtype(b.dtype) in (tf.float32, tf.int64)
        np.testing.assert_array_equal(np.asarray(a).astype(np.float64),
                                      np.asarray(b).astype(np.float64))
    narrow = _model(fk.LazyAdam(0.01, slot_dtype="float16"))
    narrow.optimizer.build(narrow.trainable_variables)
    narrow.optimizer.load_own_variables(
        {str(i): np.asarray(v) for i, v in enumerate(wide.optimizer.variables)})
    for a, b in zip(wide.optimizer.variables, narrow.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a).astype(np.asarray(b).dtype))


# --- fusedopt.compat.v1 ------------------------------------------------------------------

def _v1(rule, **kwargs):
    spec = V1_SPECS[rule]
    names = [name for name, _ in spec.signature]
    args = {"learning_rate": 0.05} if "learning_rate" in names else {}
    args.update(getattr(npref.ORACLES[rule], "VARIANT_KWARGS", {}))
    return getattr(fv1, V1_CLASSES[rule])(**args, **kwargs)


@pytest.mark.parametrize("resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rule", sorted(V1_SPECS))
def test_compat_v1_session_step_with_bfloat16_slots(rule, sparse, resource):
    start = _table()
    results = {}
    for slot_dtype in (None, "bfloat16"):
        graph = tf.Graph()
        with graph.as_default():
            var = tf.compat.v1.Variable(start, use_resource=resource)
            opt = _v1(rule, slot_dtype=slot_dtype)
            if sparse:
                g = _grad(True)
                grad = tf.IndexedSlices(g.values, g.indices, g.dense_shape)
            else:
                grad = _grad(False)
            train = opt.apply_gradients([(grad, var)])
            slot_names = [name for name, _ in V1_SPECS[rule].slots]
            slots = [opt.get_slot(var, name) for name in slot_names]
            with tf.compat.v1.Session(graph=graph) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                if slot_dtype is None:  # start from the 16-bit values too
                    for s in slots:
                        session.run(s.assign(tf.cast(tf.cast(s, tf.bfloat16), tf.float32)))
                session.run(train)
                results[slot_dtype] = session.run([var] + slots)
        if slot_dtype is not None:
            assert all(s.dtype.base_dtype == tf.bfloat16 for s in slots)
    full, narrow = results[None], results["bfloat16"]
    np.testing.assert_array_equal(_bits(narrow[0]), _bits(full[0]))
    for a, b in zip(narrow[1:], full[1:]):
        np.testing.assert_array_equal(_bits(a), _bits(b.astype(ml_dtypes.bfloat16)))


def test_compat_v1_signature_and_refusal():
    import inspect

    parameters = inspect.signature(fv1.LazyAdamOptimizer).parameters
    assert parameters["slot_dtype"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["stochastic_rounding"].default is False
    with pytest.raises(ValueError, match="slot_dtype must be"):
        fv1.LazyAdamOptimizer(slot_dtype="float64")


# --- fusedopt.keras.legacy (Keras 2 OptimizerV2) -------------------------------------------

import fusedopt.keras.legacy as fl  # noqa: E402

LEGACY_SPECS = front_ends.specs("LEGACY")


def _legacy(rule, **kwargs):
    extra = npref.ORACLES[rule].KERAS_KWARGS
    return getattr(fl, LEGACY_CLASSES[rule])(**{**extra, "learning_rate": 0.05, **kwargs})


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rule", sorted(LEGACY_SPECS))
def test_legacy_first_step_is_the_float32_step_with_rounded_slots(rule, sparse, stochastic):
    start = _table()
    compact_var, full_var = tf.Variable(start), tf.Variable(start)
    opt = _legacy(rule, slot_dtype="bfloat16", stochastic_rounding=stochastic)
    full = _legacy(rule)
    opt._create_all_weights([compact_var])
    full._create_all_weights([full_var])
    names = LEGACY_SPECS[rule].slots
    for name in names:
        a, b = opt.get_slot(compact_var, name), full.get_slot(full_var, name)
        assert a.dtype.base_dtype == tf.bfloat16
        b.assign(tf.cast(a, tf.float32))
    opt.apply_gradients([(_grad(sparse), compact_var)])
    full.apply_gradients([(_grad(sparse), full_var)])
    np.testing.assert_array_equal(_bits(compact_var.numpy()), _bits(full_var.numpy()))
    salt = compact.element_salt(start, 0)  # the first step: iterations 0 seeds the rounding
    for k, name in enumerate(names):
        a, b = opt.get_slot(compact_var, name), full.get_slot(full_var, name)
        want = compact.round_slot(b.numpy(), ml_dtypes.bfloat16, stochastic,
                                  salt[:, 0] if _per_row(rule, k) else salt, k)
        np.testing.assert_array_equal(_bits(a.numpy()), _bits(want))


def test_legacy_config_and_refusals():
    opt = _legacy("adagrad", slot_dtype="float16")
    config = opt.get_config()
    assert config["slot_dtype"] == "float16" and "stochastic_rounding" not in config
    assert type(opt).from_config(config).slot_dtype == tf.float16
    with pytest.raises(ValueError, match="amsgrad"):
        _legacy("lazy_adam", slot_dtype="bfloat16", amsgrad=True)
    wide = tf.Variable(np.ones((3, 2), np.float64))
    opt._create_all_weights([wide])
    assert opt.get_slot(wide, LEGACY_SPECS["adagrad"].slots[0]).dtype.base_dtype == tf.float64


# --- stochastic rounding seeded by the step: unbiased where nothing moves ---------------

@pytest.mark.parametrize("front_end", ["keras", "legacy", "compat_v1"])
def test_front_ends_seed_each_step_so_rounding_is_unbiased(front_end):
    """Adagrad with a learning rate of 0 (var never moves) and a repeated gradient,
    accumulators of 1.0 in bfloat16 growing by g^2 = 1/640 a step (a fifth of a bfloat16
    step): each front end seeds the rounding with its step counter, so the accumulators
    grow by the exact sum on average (a fixed seed would leave most of them at 1.0)."""
    n, steps = 1024, 64
    start = np.linspace(-1, 1, n).astype(np.float32)
    var = tf.Variable(start)
    grad = tf.constant(np.full(n, np.sqrt(1 / 640), np.float32))
    kwargs = dict(initial_accumulator_value=1.0, slot_dtype="bfloat16",
                  stochastic_rounding=True)
    if front_end == "keras":
        opt = fk.Adagrad(learning_rate=0.0, **kwargs)
    elif front_end == "legacy":
        opt = fl.Adagrad(learning_rate=0.0, **kwargs)
    else:
        opt = fv1.AdagradOptimizer(0.0, **kwargs)
    for _ in range(steps):
        opt.apply_gradients([(grad, var)])
    if front_end == "keras":
        acc = opt._accumulators[0]
    else:
        acc = opt.get_slot(var, "accumulator")
    assert acc.dtype == tf.bfloat16
    np.testing.assert_array_equal(var.numpy(), start)
    exact = steps * float(grad[0] * grad[0])
    growth = acc.numpy().astype(np.float64).mean() - 1.0
    assert abs(growth - exact) < 0.06 * exact, (growth, exact)
