"""fusedopt.keras (current Keras optimizer API: Keras 3 on TF >= 2.16, Keras 2.15 on TF 2.15).

Each optimizer is run side by side with the Keras optimizer it replaces and must give the
same numbers (dense); sparse gradients must update only touched rows (lazy) and match the
NumPy reference; XLA-compiled steps must fall back to the composed form.
"""

import numpy as np
import pytest
import tensorflow as tf

import harness
import numpy_reference as npref

keras = tf.keras
KERAS3 = hasattr(keras.optimizers.Optimizer, "stateless_apply")  # Keras 3 (not 2.x)

import fusedopt.keras as fk
from fusedopt import ops, rules
import front_ends

# rule -> its KERAS spec and fusedopt class, for every rule; (fusedopt class, the Keras class
# it replaces) for the rules Keras has (NEW: fusedopt's own classes, tests at the end).
SPECS = front_ends.specs("KERAS")  # centered RMSprop through RMSprop(centered=True)
CLASSES = front_ends.classes("KERAS", fk)
PAIRS = {rule: (CLASSES[rule], getattr(keras.optimizers, spec.base))
         for rule, spec in SPECS.items() if spec.base is not None}
NEW = sorted(set(CLASSES) - set(PAIRS))
SLOT_ATTRS = {rule: spec.slots for rule, spec in SPECS.items()}


def make(rule, which=0, **kwargs):
    """PAIRS[rule][which](**kwargs) (0: fusedopt's class, any rule), with the arguments that
    make the rule's fused update run (e.g. RMSprop's momentum > 0) from its oracle's
    KERAS_KWARGS."""
    cls = CLASSES[rule] if which == 0 else PAIRS[rule][which]
    return cls(**{**npref.ORACLES[rule].KERAS_KWARGS, **kwargs})


def spec_hyper(rule, opt, step, learning_rate):
    return harness.keras_spec_hyper(SPECS[rule], opt, step, learning_rate)


def _vars(seed, dtype="float32"):
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.uniform(-1, 1, (5, 3)).astype(dtype)),
            tf.Variable(rng.uniform(-1, 1, (3,)).astype(dtype))]


def _grads(rng, variables, scale=1.0):
    return [tf.cast(tf.constant(scale * rng.normal(size=v.shape).astype(np.float32)), v.dtype)
            for v in variables]


def _fused_op_types(fn, *args):
    graph = tf.function(fn).get_concrete_function(*args).graph
    types = set()
    for op in graph.get_operations():
        types.add(op.type)
        for f in graph._functions.values():
            types.update(o.type for o in f.graph.get_operations())
    return {t for t in types if t.startswith("FusedOpt>")}


# --- dense numbers vs Keras ------------------------------------------------------------

CONFIGS = {
    "plain": dict(learning_rate=0.05, epsilon=0.05),
    "clipnorm_ema": dict(learning_rate=0.05, clipnorm=0.5, use_ema=True, ema_momentum=0.9),
    "globalclip_wd_ema_overwrite": dict(learning_rate=0.02, global_clipnorm=1.0,
                                         weight_decay=0.01, use_ema=True,
                                         ema_overwrite_frequency=3),
    "clipvalue_schedule": dict(clipvalue=0.3),  # learning_rate: ExponentialDecay schedule
}
if KERAS3:  # base arguments that only Keras 3 has
    CONFIGS["accumulation_loss_scale"] = dict(learning_rate=0.05, gradient_accumulation_steps=3,
                                              loss_scale_factor=4.0)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("rule", sorted(PAIRS))
def test_dense_matches_keras(rule, config):
    kwargs = dict(CONFIGS[config])
    if config == "clipvalue_schedule":
        kwargs["learning_rate"] = keras.optimizers.schedules.ExponentialDecay(0.1, 3, 0.5)
    ours, ref = make(rule, 0, **kwargs), make(rule, 1, **kwargs)
    v_ours, v_ref = _vars(1), _vars(1)
    rng = np.random.default_rng(2)
    step_ours = tf.function(lambda g: ours.apply_gradients(zip(g, v_ours)))
    for step in range(12):
        grads = _grads(rng, v_ours, scale=2.0)
        if step < 6:  # eager, then tf.function
            ours.apply_gradients(zip(grads, v_ours))
        else:
            step_ours(grads)
        ref.apply_gradients(zip(grads, v_ref))
        for a, b in zip(v_ours, v_ref):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-5, atol=2e-6,
                                       err_msg="%s %s step %d" % (rule, config, step))
    assert int(ours.iterations.numpy()) == int(ref.iterations.numpy()) > 0
    assert len(ours.variables) == len(ref.variables)
    for a, b in zip(ours.variables, ref.variables):
        np.testing.assert_allclose(np.asarray(a.numpy(), np.float64),
                                   np.asarray(b.numpy(), np.float64), rtol=2e-5, atol=2e-6)
    if kwargs.get("use_ema"):
        ours.finalize_variable_values(v_ours)
        ref.finalize_variable_values(v_ref)
        for a, b in zip(v_ours, v_ref):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
@pytest.mark.parametrize("rule", sorted(PAIRS))
def test_dense_other_dtypes(rule, dtype):
    ours, ref = make(rule, 0, learning_rate=0.05, epsilon=1e-3), \
        make(rule, 1, learning_rate=0.05, epsilon=1e-3)
    if dtype == "bfloat16":
        v_ours, v_ref = [[tf.Variable(tf.cast(v, tf.bfloat16)) for v in _vars(3)]
                         for _ in range(2)]
    else:
        v_ours, v_ref = _vars(3, dtype), _vars(3, dtype)
    rng = np.random.default_rng(4)
    for _ in range(8):
        grads = _grads(rng, v_ours)
        ours.apply_gradients(zip(grads, v_ours))
        ref.apply_gradients(zip(grads, v_ref))
    # float64: the Python-float hyper-parameters in float64 exactly, as Keras converts
    # them (issue 30, item 4: through float32, LazyAdam was 9.7e-6 off after 3 steps).
    tol = {"float64": dict(rtol=1e-12, atol=1e-13), "float16": dict(rtol=2e-2, atol=5e-3),
           "bfloat16": dict(rtol=5e-2, atol=2e-2)}[dtype]
    for a, b in zip(v_ours, v_ref):
        assert a.dtype == b.dtype == tf.as_dtype(dtype)
        np.testing.assert_allclose(a.numpy().astype(np.float64), b.numpy().astype(np.float64),
                                   **tol)


@pytest.mark.parametrize("rule", sorted(CLASSES))
def test_uses_fused_ops_also_under_xla(rule):
    opt = make(rule, learning_rate=0.1)
    variables = _vars(5)
    emb = tf.Variable(np.ones((6, 2), np.float32))
    opt.build(variables + [emb])
    grads = _grads(np.random.default_rng(0), variables)
    sparse = tf.IndexedSlices(tf.ones((3, 2)), tf.constant([0, 2, 2]), tf.constant([6, 2]))

    def step(g0, g1):
        opt.apply_gradients(zip([g0, g1, sparse], variables + [emb]))

    # Keras 3: the step's dense updates are one group op (on a member pack; under XLA,
    # tests/ops/test_packs.py, on lists); Keras 2.15: one op per variable.
    keras3 = hasattr(tf.keras.optimizers.Optimizer, "_distributed_tf_update_step")
    dense = ops.op_name(rule, "resource_packed_group_apply" if keras3 else "resource_apply")
    fused = {dense, ops.op_name(rule, "resource_sparse_apply")}
    assert _fused_op_types(step, *grads) == fused
    # Duplicate ids are summed inside the sparse op: no Python-side dedup in the step
    # (Keras 2.15's apply_gradients would add tf.unique + a segment sum).
    traced = tf.function(step).get_concrete_function(*grads).graph.get_operations()
    assert not {op.type for op in traced} & {"Unique", "UniqueV2", "UnsortedSegmentSum"}
    # Under XLA the same ops run (their XLA kernels), not a composed fallback; the dense
    # group on lists (the packed op has no XLA kernel).
    jit = tf.function(step, jit_compile=True)
    if keras3:
        fused = {ops.op_name(rule, "resource_group_apply"),
                 ops.op_name(rule, "resource_sparse_apply")}
    assert {op.type for op in jit.get_concrete_function(*grads).graph.get_operations()
            if op.type.startswith("FusedOpt>")} == fused
    before = [v.numpy() for v in variables + [emb]]
    jit(*grads)
    assert all(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables + [emb]))
    assert np.array_equal(before[2][[1, 3, 4, 5]], emb.numpy()[[1, 3, 4, 5]])


# --- sparse (lazy) updates ---------------------------------------------------------------

@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("rule", sorted(CLASSES))
def test_sparse_lazy_matches_reference(rule, jit):
    opt = make(rule, learning_rate=0.1, epsilon=0.01)
    rng = np.random.default_rng(7)
    var = tf.Variable(rng.uniform(-1, 1, (8, 3)).astype(np.float32))
    opt.build([var])
    slots = [getattr(opt, a)[0] for a in SLOT_ATTRS[rule]]
    fn = tf.function(lambda g, i: opt.apply_gradients([(tf.IndexedSlices(g, i, [8, 3]), var)]),
                     jit_compile=jit)
    for step in range(1, 6):
        idx = rng.choice([0, 2, 3, 5, 6], size=6).astype(np.int32)
        g = rng.normal(size=(6, 3)).astype(np.float32)
        v0, s0 = var.numpy(), [np.asarray(s.numpy()) for s in slots]
        hyper = spec_hyper(rule, opt, step, 0.1)
        exp_v, exp_s = npref.sparse_update(rule, v0, s0, g, idx, hyper, SPECS[rule].options)
        fn(tf.constant(g), tf.constant(idx))
        np.testing.assert_allclose(var.numpy(), exp_v, rtol=1e-5, atol=1e-6)
        for s, e in zip(slots, exp_s):
            np.testing.assert_allclose(np.asarray(s.numpy()), e, rtol=1e-5, atol=1e-6)
        for untouched in (1, 4, 7):  # lazy: never-named rows keep their exact bits
            assert var.numpy()[untouched].tobytes() == v0[untouched].tobytes()
            for s, b in zip(slots, s0):
                assert np.asarray(s.numpy())[untouched].tobytes() == b[untouched].tobytes()


# --- model.fit, jit_compile --------------------------------------------------------------

def _model(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((4,), dtype="int32")
    x = keras.layers.Embedding(20, 6)(inp)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(8, activation="tanh")(x)
    out = keras.layers.Dense(1)(x)
    return keras.Model(inp, out)


def _data(n=64):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, (n, 4)).astype(np.int32)
    y = (x.sum(axis=1, keepdims=True) / 40.0 - 0.5).astype(np.float32)
    return x, y


@pytest.mark.slow
@pytest.mark.parametrize("rule", sorted(CLASSES))
def test_fit_jit_compile_matches_fused(rule):
    x, y = _data()
    weights = {}
    for jit in (False, True):
        model = _model()
        model.compile(optimizer=make(rule, learning_rate=0.05), loss="mse",
                      jit_compile=jit)
        hist = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        assert np.isfinite(hist.history["loss"]).all()
        weights[jit] = model.get_weights()
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    for a, b in zip(weights[False], weights[True]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("rule", sorted(PAIRS))
def test_fit_steps_per_execution_matches_one_step_per_call(rule):
    """Several train steps per tf.function call (Keras's steps_per_execution: the step in a
    loop inside the function, with dense and sparse updates in its body) give the same
    weights, slots and iteration count as one step per call; on a dense model, the same as
    the Keras class replaced. (On the embedding the Keras classes differ by design: they
    square each duplicate id's gradient separately; docs/guides/keras.md, "What differs on sparse gradients".)"""
    def fit(model, x, y, which, steps):
        opt = make(rule, which, learning_rate=0.05)
        model.compile(optimizer=opt, loss="mse", jit_compile=False,
                      steps_per_execution=steps)
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        assert int(np.asarray(opt.iterations)) == 2 * len(x) // 8
        return model.get_weights() + [np.asarray(v) for v in opt.variables]

    def dense_model():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(7, activation="tanh"),
                                 keras.layers.Dense(1)])
    x, y = _data()
    for a, b in zip(fit(_model(), x, y, 0, 4), fit(_model(), x, y, 0, 1)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = np.tanh(x @ rng.normal(size=(5, 1))).astype(np.float32)
    ours, theirs = fit(dense_model(), x, y, 0, 4), fit(dense_model(), x, y, 1, 4)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_fit_dense_model_matches_keras_adam():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = x @ rng.normal(size=(5, 1)).astype(np.float32)
    weights = []
    for cls in (fk.LazyAdam, keras.optimizers.Adam):
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=cls(learning_rate=0.01, clipnorm=1.0), loss="mse")
        model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# --- serialization and checkpoints ---------------------------------------------------------

@pytest.mark.parametrize("rule", sorted(CLASSES))
def test_config_round_trip(rule):
    cls = CLASSES[rule]
    opt = make(rule, learning_rate=0.03, clipnorm=0.7, use_ema=True, epsilon=1e-4)
    config = opt.get_config()
    again = cls.from_config(config)
    assert type(again) is cls and again.get_config() == config
    ser = keras.optimizers.serialize(opt)
    assert "fusedopt" in str(ser)
    back = keras.optimizers.deserialize(ser)
    assert type(back) is cls and back.get_config() == config
    assert issubclass(cls, keras.optimizers.Optimizer)
    if rule in PAIRS:
        assert issubclass(cls, PAIRS[rule][1])


def test_model_save_load_keeps_optimizer_state(tmp_path):
    x, y = _data()
    model = _model()
    model.compile(optimizer=fk.LazyAdam(learning_rate=0.02), loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is fk.LazyAdam
    assert int(loaded.optimizer.iterations.numpy()) == 4
    a_vars = [np.asarray(v.numpy()) for v in model.optimizer.variables]
    b_vars = [np.asarray(v.numpy()) for v in loaded.optimizer.variables]
    assert len(a_vars) == len(b_vars)
    for a, b in zip(a_vars, b_vars):
        np.testing.assert_array_equal(a, b)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("target", ["fused", "keras_adam"])
@pytest.mark.parametrize("source", ["fused", "keras_adam"])
def test_checkpoint_round_trip_and_keras_adam_compat(tmp_path, source, target):
    x, y = _data()
    model = _model()
    opt = fk.LazyAdam(0.02) if source == "fused" else keras.optimizers.Adam(0.02)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    prefix = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "ckpt"))

    model2 = _model(seed=5)
    opt2 = fk.LazyAdam(0.02) if target == "fused" else keras.optimizers.Adam(0.02)
    opt2.build(model2.trainable_variables)
    tf.train.Checkpoint(model=model2, optimizer=opt2).restore(prefix).assert_consumed()
    assert int(opt2.iterations.numpy()) == 4
    for a, b in zip(opt.variables, opt2.variables):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    for a, b in zip(model.get_weights(), model2.get_weights()):
        np.testing.assert_array_equal(a, b)


# --- mixed precision -----------------------------------------------------------------------

@pytest.fixture
def policy():
    def set_policy(name):
        keras.mixed_precision.set_global_policy(name)
    yield set_policy
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_fit_matches_keras(policy, name):
    policy(name)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = x @ rng.normal(size=(5, 1)).astype(np.float32)
    weights = []
    for cls in (fk.LazyAdam, keras.optimizers.Adam):
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7, activation="relu"),
                                  keras.layers.Dense(1, dtype="float32")])
        opt = cls(learning_rate=0.01)
        if name == "mixed_float16":
            opt = keras.mixed_precision.LossScaleOptimizer(opt)
        model.compile(optimizer=opt, loss="mse")
        hist = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        assert np.isfinite(hist.history["loss"]).all()
        weights.append(model.get_weights())
    assert weights[0][0].dtype == np.float32
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-3)


# --- the one-line swap keeps names (issue 29, item 6) ------------------------------------------

@pytest.mark.parametrize("rule", sorted(PAIRS))
def test_default_name_is_the_replaced_class(rule):
    """fusedopt.keras.LazyAdam() is named as keras.optimizers.Adam() is ("adam"; Keras 3
    would name it after its class, "lazy_adam"), so get_config()['name'] and the optimizer
    variables' paths stay those of the class replaced."""
    ours, theirs = PAIRS[rule][0](), PAIRS[rule][1]()
    strip = (lambda name: name.rsplit("_", 1)[0] if name.rsplit("_", 1)[-1].isdigit()
             else name)  # Keras 3 numbers repeated names: adam, adam_1, ...
    assert strip(ours.name) == strip(theirs.name)
    assert strip(ours.get_config()["name"]) == strip(theirs.get_config()["name"])
    assert PAIRS[rule][0](name="mine").name == "mine"


@pytest.mark.parametrize("direction", ["keras_to_fused", "fused_to_keras"])
def test_keras_file_interchange_with_keras_adam(tmp_path, direction):
    """A .keras file saved with either optimizer goes on with the other (docs/MIGRATING.md:
    the class from the other's config, built on the model, its variables assigned in order: the
    same layout), and training goes on identically; tf.train.Checkpoint interchanges
    directly (test_checkpoint_round_trip_and_keras_adam_compat, both ways)."""
    x, y = _data()
    model = _model()
    first, second = ((keras.optimizers.Adam, fk.LazyAdam) if direction == "keras_to_fused"
                     else (fk.LazyAdam, keras.optimizers.Adam))
    model.compile(optimizer=first(learning_rate=0.02), loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is first

    def swap(m):
        swapped = second.from_config(m.optimizer.get_config())
        assert swapped.name == m.optimizer.name
        swapped.build(m.trainable_variables)
        assert ([tuple(v.shape) for v in swapped.variables]
                == [tuple(v.shape) for v in m.optimizer.variables])  # one layout
        for a, b in zip(swapped.variables, m.optimizer.variables):
            a.assign(b)
        m.compile(optimizer=swapped, loss="mse")

    # The file lost nothing: the swapped optimizer goes on exactly as one swapped in
    # memory. (The two classes differ on the embedding's sparse gradient: lazy rows.)
    swap(loaded)
    swap(model)
    assert int(loaded.optimizer.iterations.numpy()) == 4
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)


# --- dtypes the fused ops do not take: Keras's own update (issue 29, item 4) -------------

@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("dtype", harness.FALLBACK_DTYPES)
@pytest.mark.parametrize("rule", sorted(PAIRS))
def test_dtypes_the_ops_do_not_take_run_keras_own_update(rule, dtype, sparse):
    """complex and integer variables: the same numbers (bit for bit) or the same error as
    the Keras class replaced, never our op's dtype error."""
    ours, theirs = (harness.run_fallback(lambda w=which: make(rule, w, learning_rate=0.1),
                                         dtype, sparse) for which in (0, 1))
    # what Keras 3 itself trains (its Adamax, its sparse complex updates and complex128
    # Adam raise: ours raise the same)
    must_train = KERAS3 and dtype == "complex64" and not sparse and rule != "adamax"
    harness.check_fallback_is_the_replaced_class(ours, theirs, dtype, sparse,
                                                 np.testing.assert_array_equal, must_train)


# --- fusedopt's own classes (rules no Keras optimizer has: issue 32) ------------------------

@pytest.mark.parametrize("rule", NEW)
def test_new_rule_dense_matches_reference(rule):
    """No Keras class to run beside: the NumPy oracle, step by step, eager then tf.function;
    the slots have the rule's layouts (per row: var.shape[:1])."""
    opt = make(rule, learning_rate=0.1, epsilon=0.01)
    variables = _vars(8)
    opt.build(variables)
    slots = [[getattr(opt, a)[i] for a in SLOT_ATTRS[rule]] for i in range(len(variables))]
    for var, var_slots in zip(variables, slots):
        assert [tuple(s.shape) for s in var_slots] == [
            npref.slot_shape(rule, name, var.shape) for name in npref.RULES[rule]["slots"]]
    rng = np.random.default_rng(9)
    step = tf.function(lambda g: opt.apply_gradients(zip(g, variables)))
    for t in range(1, 7):
        grads = _grads(rng, variables)
        before = [(v.numpy(), [np.asarray(s.numpy()) for s in ss])
                  for v, ss in zip(variables, slots)]
        hyper = spec_hyper(rule, opt, t, 0.1)
        (opt.apply_gradients(zip(grads, variables)) if t < 4 else step(grads))
        for var, var_slots, (v0, s0), g in zip(variables, slots, before, grads):
            exp_v, exp_s = npref.dense_update(rule, v0, s0, g.numpy(), hyper,
                                              SPECS[rule].options)
            npref.assert_close(var.numpy(), exp_v, "float32", "var step %d" % t)
            for s, e in zip(var_slots, exp_s):
                npref.assert_close(np.asarray(s.numpy()), e, "float32", "slot step %d" % t)


@pytest.mark.parametrize("rule", NEW)
def test_new_rule_arguments_and_name(rule):
    cls = CLASSES[rule]
    opt = cls()
    assert opt.name.startswith(SPECS[rule].new.default_name)
    # No weight decay by default, as Keras's own classes (Keras 2's base has 0: a decay
    # step over every row of every variable, each step).
    assert opt.weight_decay is None
    assert cls(name="mine").name == "mine"
    defaults = dict(SPECS[rule].new.arguments)
    for argument, default in defaults.items():
        assert getattr(opt, argument) == default
    assert float(np.asarray(opt.learning_rate)) == pytest.approx(SPECS[rule].new.learning_rate)
    positional = cls(0.5, *[v * 2 for v in defaults.values()])
    assert float(np.asarray(positional.learning_rate)) == 0.5
    again = cls.from_config(positional.get_config())  # Keras 2's base keeps no learning rate
    assert float(np.asarray(again.learning_rate)) == 0.5
    assert [getattr(again, a) for a in defaults] == [v * 2 for v in defaults.values()]
    assert [getattr(positional, a) for a in defaults] == [v * 2 for v in defaults.values()]
    with pytest.raises(TypeError):
        cls(0.1, learning_rate=0.2)
    with pytest.raises((TypeError, ValueError)):  # Keras's base: ValueError
        cls(not_an_argument=1)
    if "initial_accumulator_value" in defaults:
        with pytest.raises(ValueError, match="initial_accumulator_value"):
            cls(initial_accumulator_value=-1.0)


@pytest.mark.parametrize("rule", NEW)
def test_new_rule_fit_save_load_goes_on_identically(rule, tmp_path):
    """model.fit with the embedding's sparse and the dense layers' gradients; the .keras
    file restores the class, its per-row slots and the step, and training goes on with
    the same bits as the model kept in memory."""
    x, y = _data()
    model = _model()
    model.compile(optimizer=make(rule, learning_rate=0.05), loss="mse")
    hist = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is CLASSES[rule]
    shapes = [tuple(v.shape) for v in model.optimizer.variables]
    assert [tuple(v.shape) for v in loaded.optimizer.variables] == shapes
    # The embedding's slots in the rule's layouts: one per-row slot of shape [rows] each.
    embedding = model.trainable_variables[0]
    per_row = [npref.slot_shape(rule, name, embedding.shape) == (embedding.shape[0],)
               for name in npref.RULES[rule]["slots"]]
    assert shapes.count((embedding.shape[0],)) == sum(per_row)
    assert shapes.count(tuple(embedding.shape)) == len(per_row) - sum(per_row)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
