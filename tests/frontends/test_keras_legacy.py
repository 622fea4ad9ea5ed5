"""fusedopt.keras.legacy: Keras 2 OptimizerV2 drop-ins (tf_keras on TF >= 2.16,
tf.keras.optimizers.legacy on TF 2.15).

On TF >= 2.16 the legacy API needs ``TF_USE_LEGACY_KERAS=1`` before TensorFlow is
imported; when this process has imported TF without it, the module re-runs itself in a
subprocess with the variable set (one test here, every test there), so a plain
``pytest tests/`` covers it in both environments.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import harness
import front_ends
import numpy_reference as npref

TF_VERSION = tuple(int(x) for x in tf.__version__.split(".")[:2])
IN_SUBPROCESS = TF_VERSION >= (2, 16) and os.environ.get("TF_USE_LEGACY_KERAS") != "1"


if IN_SUBPROCESS:

    def test_legacy_suite_with_tf_use_legacy_keras():
        env = dict(os.environ, TF_USE_LEGACY_KERAS="1")
        import harness

        harness.run_test_file_in_subprocess(__file__, env)

else:
    from fusedopt.keras import legacy as fl

    from fusedopt import ops, rules

    K = fl._keras  # tf.keras on TF 2.15; tf_keras on TF >= 2.16
    # rule -> its LEGACY spec and fusedopt class; (fusedopt class, the Keras 2 class it
    # replaces) for the rules Keras 2 has (NEW: fusedopt's own classes, tests at the end).
    SPECS = front_ends.specs("LEGACY")
    CLASSES = front_ends.classes("LEGACY", fl)
    PAIRS = {rule: (CLASSES[rule], getattr(K.optimizers.legacy, spec.base))
             for rule, spec in SPECS.items() if spec.base is not None}
    NEW = sorted(set(CLASSES) - set(PAIRS))

    def make(rule, which=0, *args, **kwargs):
        """PAIRS[rule][which](...) (0: fusedopt's class, any rule) with the rule's
        LEGACY_KWARGS (its fused path)."""
        cls = CLASSES[rule] if which == 0 else PAIRS[rule][which]
        return cls(*args, **{**npref.ORACLES[rule].LEGACY_KWARGS, **kwargs})

    def _vars(seed, dtype="float32"):
        rng = np.random.default_rng(seed)
        return [tf.Variable(rng.uniform(-1, 1, (5, 3)).astype(dtype)),
                tf.Variable(rng.uniform(-1, 1, (3,)).astype(dtype))]

    def _no_result(fn):  # OptimizerV2.apply_gradients returns an Operation
        def wrapped(*args):
            fn(*args)
        return wrapped

    def _grads(rng, variables, scale=1.0):
        return [tf.constant((scale * rng.normal(size=v.shape)).astype(
            v.dtype.as_numpy_dtype)) for v in variables]

    def test_tf_keras_is_the_legacy_keras():
        assert issubclass(fl.LazyAdam, K.optimizers.legacy.Adam)
        assert issubclass(fl.Adagrad, K.optimizers.legacy.Optimizer)
        if TF_VERSION >= (2, 16):  # TF_USE_LEGACY_KERAS=1: tf.keras is tf_keras
            assert tf.keras.optimizers.legacy.Adam is K.optimizers.legacy.Adam

    CONFIGS = {
        "plain": dict(learning_rate=0.05, epsilon=0.05),
        "clipnorm_lr_alias": dict(lr=0.03, clipnorm=0.5),
        "clipvalue_decay": dict(learning_rate=0.1, clipvalue=0.3, decay=0.1),
        "global_clipnorm": dict(learning_rate=0.05, global_clipnorm=1.0),
    }

    @pytest.mark.parametrize("config", sorted(CONFIGS))
    @pytest.mark.parametrize("rule", sorted(PAIRS))
    def test_dense_matches_keras_legacy(rule, config):
        ours, ref = make(rule, 0, **CONFIGS[config]), make(rule, 1, **CONFIGS[config])
        v_ours, v_ref = _vars(1), _vars(1)
        rng = np.random.default_rng(2)
        step_ours = tf.function(_no_result(lambda g: ours.apply_gradients(zip(g, v_ours))))
        for step in range(12):
            grads = _grads(rng, v_ours, scale=2.0)
            if step < 6:
                ours.apply_gradients(zip(grads, v_ours))
            else:
                step_ours(grads)
            ref.apply_gradients(zip(grads, v_ref))
            for a, b in zip(v_ours, v_ref):
                np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6,
                                           err_msg="%s %s step %d" % (rule, config, step))
        assert ours.get_slot_names() == ref.get_slot_names()
        for a, b in zip(ours.get_weights(), ref.get_weights()):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    @pytest.mark.parametrize("dtype", ["float16", "float64"])
    @pytest.mark.parametrize("rule", sorted(PAIRS))
    def test_dense_other_dtypes(rule, dtype):
        ours, ref = make(rule, 0, 0.05, epsilon=1e-3), make(rule, 1, 0.05, epsilon=1e-3)
        v_ours, v_ref = _vars(3, dtype), _vars(3, dtype)
        rng = np.random.default_rng(4)
        for _ in range(8):
            grads = _grads(rng, v_ours)
            ours.apply_gradients(zip(grads, v_ours))
            ref.apply_gradients(zip(grads, v_ref))
        tol = dict(rtol=1e-10, atol=1e-12) if dtype == "float64" else dict(rtol=2e-2,
                                                                            atol=5e-3)
        for a, b in zip(v_ours, v_ref):
            np.testing.assert_allclose(a.numpy().astype(np.float64),
                                       b.numpy().astype(np.float64), **tol)

    @pytest.mark.parametrize("rule", sorted(CLASSES))
    def test_uses_fused_ops_and_xla_fallback(rule):
        opt = make(rule, 0, 0.1)
        variables = _vars(5)
        emb = tf.Variable(np.ones((6, 2), np.float32))
        grads = _grads(np.random.default_rng(0), variables)
        sparse = tf.IndexedSlices(tf.ones((3, 2)), tf.constant([0, 2, 2]), tf.constant([6, 2]))

        def step(g0, g1):
            opt.apply_gradients(zip([g0, g1, sparse], variables + [emb]))

        step(*grads)  # creates the slots
        graph = tf.function(step).get_concrete_function(*grads).graph
        types = {op.type for op in graph.get_operations()}
        for f in graph._functions.values():
            types.update(o.type for o in f.graph.get_operations())
        # the step's dense updates: one group op (on a member pack, made eagerly); the
        # sparse one: its sparse op
        assert {t for t in types if t.startswith("FusedOpt>")} == {
            ops.op_name(rule, "resource_packed_group_apply"),
            ops.op_name(rule, "resource_sparse_apply")}
        jit = tf.function(step, jit_compile=True)
        jit_graph = jit.get_concrete_function(*grads).graph
        jit_types = {op.type for op in jit_graph.get_operations()}
        for f in jit_graph._functions.values():
            jit_types.update(o.type for o in f.graph.get_operations())
        assert ops.op_name(rule, "resource_group_apply") in jit_types  # XLA: the list op
        assert not any(t.startswith("FusedOpt>ResourcePacked") for t in jit_types)
        before = [v.numpy() for v in variables + [emb]]
        jit(*grads)
        assert all(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables + [emb]))
        assert np.array_equal(before[2][[1, 3, 4, 5]], emb.numpy()[[1, 3, 4, 5]])

    @pytest.mark.parametrize("jit", [False, True])
    @pytest.mark.parametrize("rule", sorted(CLASSES))
    def test_sparse_lazy_matches_reference(rule, jit):
        opt = make(rule, 0, 0.1, epsilon=0.01)
        rng = np.random.default_rng(7)
        var = tf.Variable(rng.uniform(-1, 1, (8, 3)).astype(np.float32))
        opt._create_all_weights([var])  # slots exist before the first step
        fn = tf.function(_no_result(
            lambda g, i: opt.apply_gradients([(tf.IndexedSlices(g, i, [8, 3]), var)])),
            jit_compile=jit)
        for step in range(1, 6):
            idx = rng.choice([0, 2, 3, 5, 6], size=6).astype(np.int32)
            g = rng.normal(size=(6, 3)).astype(np.float32)
            v0 = var.numpy()
            s0 = [np.asarray(opt.get_slot(var, n).numpy()) for n in SPECS[rule].slots]
            # The op's hyper-parameters this step: the base's coefficients, through the spec.
            coefficients = opt._fallback_apply_state(var.device, var.dtype.base_dtype)
            hyper = {name: float(coefficients[key])
                     for name, key in SPECS[rule].hyper.items()}
            exp_v, exp_s = npref.sparse_update(rule, v0, s0, g, idx, hyper, SPECS[rule].options)
            fn(tf.constant(g), tf.constant(idx))
            np.testing.assert_allclose(var.numpy(), exp_v, rtol=1e-5, atol=1e-6)
            for n, e in zip(SPECS[rule].slots, exp_s):
                np.testing.assert_allclose(opt.get_slot(var, n).numpy(), e, rtol=1e-5,
                                           atol=1e-6)
            for untouched in (1, 4, 7):
                assert var.numpy()[untouched].tobytes() == v0[untouched].tobytes()

    def test_sparse_adagrad_matches_keras_legacy():
        # Keras 2's own sparse Adagrad is already lazy (ResourceSparseApplyAdagradV2).
        rng = np.random.default_rng(3)
        init = rng.uniform(-1, 1, (6, 2)).astype(np.float32)
        results = []
        for cls in (fl.Adagrad, K.optimizers.legacy.Adagrad):
            var, opt = tf.Variable(init), cls(0.2, epsilon=0.05)
            r = np.random.default_rng(9)
            for _ in range(5):
                g = tf.IndexedSlices(tf.constant(r.normal(size=(4, 2)).astype(np.float32)),
                                     tf.constant(r.integers(0, 6, 4).astype(np.int32)), [6, 2])
                opt.apply_gradients([(g, var)])
            results.append(var.numpy())
        np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)

    # --- member packs (fusedopt._packs) ---------------------------------------------------

    def _packed_run(rule, packed, monkeypatch, steps=4):
        """Steps of a tf.function over a dense group (its reads right after the update must
        see it); the final variables and slots, and the fused op types in the graph."""
        from fusedopt import _packs

        if not packed:
            monkeypatch.setattr(_packs, "packable", lambda variables: False)
        rng = np.random.default_rng(11)
        variables = [tf.Variable(rng.uniform(-1, 1, s).astype(np.float32))
                     for s in [(8, 8), (8,), (4, 8), (4,)] * 2]
        opt = make(rule, 0, 0.05)

        @tf.function
        def step(grads):
            opt.apply_gradients(zip(grads, variables))
            return [tf.identity(v) for v in variables + opt.variables()]
        for t in range(steps):
            seen = step(_grads(np.random.default_rng(t), variables))
        state = [v.numpy() for v in variables + opt.variables()]
        for a, b in zip(seen, state):
            np.testing.assert_array_equal(a.numpy(), b)
        graph = step.get_concrete_function(_grads(rng, variables)).graph
        fused = {op.type for op in graph.get_operations() if op.type.startswith("FusedOpt>")}
        monkeypatch.undo()
        return state, fused, opt

    @pytest.mark.parametrize("rule", sorted(CLASSES))
    def test_packed_step_identical_to_list_and_read_after_sees_it(rule, monkeypatch):
        expected, list_ops, _ = _packed_run(rule, False, monkeypatch)
        got, packed_ops, opt = _packed_run(rule, True, monkeypatch)
        assert packed_ops == {ops.op_name(rule, "resource_packed_group_apply")}
        assert list_ops == {ops.op_name(rule, "resource_group_apply")}
        assert len(opt._fused_packs().packs()) == 1  # one pack, reused by every step
        assert [x.tobytes() for x in got] == [x.tobytes() for x in expected]

    def test_packs_not_made_in_v1_graphs():
        graph = tf.Graph()
        with graph.as_default():
            var = tf.compat.v1.Variable([[1.0, -2.0]], use_resource=True)
            opt = fl.LazyAdam(0.1)
            update = opt.apply_gradients([(tf.ones((1, 2)), var)])
            types = {op.type for op in graph.get_operations()}
            assert "FusedOpt>ResourceGroupApplyLazyAdam" in types
            assert not opt._fused_packs().packs()
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                sess.run(update)
                assert sess.run(var)[0, 0] < 1.0

    def test_savedmodel_with_a_packed_step_loads_and_trains_on(tmp_path):
        import harness

        harness.check_savedmodel_of_a_packed_step(
            tmp_path, lambda: _vars(3), lambda: fl.LazyAdam(0.01),
            lambda opt, variables: opt._create_all_weights(variables))

    def test_checkpoint_holds_no_packs(tmp_path):
        variables = _vars(4)
        opt = fl.LazyAdam(0.01)
        tf.function(_no_result(lambda g: opt.apply_gradients(zip(g, variables))))(
            _grads(np.random.default_rng(1), variables))
        assert opt._fused_packs().packs()
        path = tf.train.Checkpoint(opt=opt, v=variables).save(str(tmp_path / "ckpt"))
        fresh_vars = _vars(5)
        fresh = fl.LazyAdam(0.01)
        status = tf.train.Checkpoint(opt=fresh, v=fresh_vars).restore(path)
        fresh._create_all_weights(fresh_vars)
        status.assert_consumed()
        assert int(fresh.iterations.numpy()) == int(opt.iterations.numpy()) == 1
        for var, fresh_var in zip(variables, fresh_vars):
            np.testing.assert_array_equal(fresh_var.numpy(), var.numpy())
            for name in SPECS["lazy_adam"].slots:
                np.testing.assert_array_equal(fresh.get_slot(fresh_var, name).numpy(),
                                              opt.get_slot(var, name).numpy())

    # --- the OptimizerV2 API -------------------------------------------------------------

    @pytest.mark.parametrize("rule", sorted(CLASSES))
    def test_config_serialization(rule):
        cls = CLASSES[rule]
        opt = make(rule, 0, learning_rate=0.03, epsilon=1e-4, clipnorm=0.7, decay=0.01,
                   name="opt")
        config = opt.get_config()
        assert config["name"] == "opt" and config["clipnorm"] == 0.7
        again = cls.from_config(config, custom_objects={})
        assert type(again) is cls and again.get_config() == config
        ser = K.optimizers.serialize(opt)
        back = K.optimizers.deserialize(ser)
        assert type(back) is cls and back.get_config() == config
        assert "fusedopt" in str(ser)

    def test_optimizer_v2_api():
        var = tf.Variable([[1.0, 2.0], [3.0, 4.0]])
        opt = fl.LazyAdam(0.1)
        loss = lambda: tf.reduce_sum(var * var)  # noqa: E731
        opt.minimize(loss, [var])
        assert int(opt.iterations.numpy()) == 1
        assert opt.get_slot_names() == ["m", "v"]
        m = opt.get_slot(var, "m")
        np.testing.assert_allclose(m.numpy(), 0.1 * 2 * np.array([[1, 2], [3, 4]]), rtol=1e-6)
        extra = opt.add_slot(var, "extra", "ones")
        assert opt.get_slot(var, "extra") is extra
        weights = opt.get_weights()
        assert len(weights) == 4 and len(opt.weights) == 4 and len(opt.variables()) == 4
        opt.set_weights([w * 0 for w in weights])
        assert int(opt.iterations.numpy()) == 0
        assert opt.lr.numpy() == pytest.approx(0.1)

    @pytest.mark.parametrize("rule", sorted(PAIRS))
    def test_get_updates_and_get_gradients_in_graph(rule):
        results = []
        for which in (0, 1):
            graph = tf.Graph()
            with graph.as_default():
                var = tf.compat.v1.Variable([[1.0, -2.0], [0.5, 4.0]], use_resource=True)
                loss = tf.reduce_sum(var * var * var)
                opt = make(rule, which, 0.1)
                assert len(opt.get_gradients(loss, [var])) == 1
                updates = opt.get_updates(loss, [var])
                with tf.compat.v1.Session(graph=graph) as sess:
                    sess.run(tf.compat.v1.global_variables_initializer())
                    for _ in range(3):
                        sess.run(updates)
                    results.append(sess.run(var))
        np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)

    # --- model.fit, checkpoints ----------------------------------------------------------

    def _model(seed=0):
        K.utils.set_random_seed(seed)
        inp = K.Input((4,), dtype="int32")
        x = K.layers.Embedding(20, 6)(inp)
        x = K.layers.Flatten()(x)
        x = K.layers.Dense(8, activation="tanh")(x)
        return K.Model(inp, K.layers.Dense(1)(x))

    def _data(n=64):
        rng = np.random.default_rng(0)
        x = rng.integers(0, 20, (n, 4)).astype(np.int32)
        return x, (x.sum(axis=1, keepdims=True) / 40.0 - 0.5).astype(np.float32)

    @pytest.mark.parametrize("rule", sorted(CLASSES))
    def test_fit_and_jit_compile(rule):
        x, y = _data()
        weights = []
        for jit in (False, True):
            model = _model()
            model.compile(optimizer=make(rule, 0, 0.05), loss="mse", jit_compile=jit)
            hist = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
            assert hist.history["loss"][-1] < hist.history["loss"][0]
            weights.append(model.get_weights())
        for a, b in zip(*weights):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)

    @pytest.mark.parametrize("rule", sorted(PAIRS))
    def test_fit_steps_per_execution_matches_one_step_per_call(rule):
        """Four train steps per tf.function call (a loop in the function, dense and sparse
        updates in its body) give what one step per call gives: weights and slots."""
        x, y = _data()
        runs = []
        for steps in (4, 1):
            model = _model()
            opt = make(rule, 0, 0.05)
            model.compile(optimizer=opt, loss="mse", steps_per_execution=steps)
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
            assert int(opt.iterations.numpy()) == 2 * len(x) // 8
            runs.append(model.get_weights() + [v.numpy() for v in opt.variables()])
        assert len(runs[0]) == len(runs[1])
        for a, b in zip(*runs):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    def test_fit_dense_matches_keras_adam():
        rng = np.random.default_rng(1)
        x = rng.normal(size=(64, 5)).astype(np.float32)
        y = x @ rng.normal(size=(5, 1)).astype(np.float32)
        weights = []
        for cls in (fl.LazyAdam, K.optimizers.legacy.Adam):
            K.utils.set_random_seed(3)
            model = K.Sequential([K.layers.Dense(7, activation="relu", input_shape=(5,)),
                                  K.layers.Dense(1)])
            model.compile(optimizer=cls(0.01, clipnorm=1.0), loss="mse")
            model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
            weights.append(model.get_weights())
        for a, b in zip(*weights):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    def test_keras_adam_checkpoint_restores_into_lazy_adam(tmp_path):
        x, y = _data()
        model = _model()
        opt = K.optimizers.legacy.Adam(0.02)
        model.compile(optimizer=opt, loss="mse")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        prefix = tf.train.Checkpoint(model=model, optimizer=opt).save(str(tmp_path / "c"))
        model2 = _model(seed=5)
        opt2 = fl.LazyAdam(0.02)
        status = tf.train.Checkpoint(model=model2, optimizer=opt2).restore(prefix)
        opt2._create_all_weights(model2.trainable_variables)  # slots take restored values
        status.assert_consumed()
        assert int(opt2.iterations.numpy()) == 4
        assert len(opt.get_weights()) == len(opt2.get_weights())
        for a, b in zip(model.get_weights(), model2.get_weights()):
            np.testing.assert_array_equal(a, b)
        for var, var2 in zip(model.trainable_variables, model2.trainable_variables):
            for name in ("m", "v"):
                np.testing.assert_array_equal(opt.get_slot(var, name).numpy(),
                                              opt2.get_slot(var2, name).numpy())

    def test_model_save_savedmodel_after_packed_fit(tmp_path):
        """fit's step ran on a member pack (listed in the SavedModel, minus the slot
        variables, which Keras 2 tracks itself); the saved model loads and trains on."""
        x, y = _data()
        model = _model()
        model.compile(optimizer=fl.LazyAdam(0.02), loss="mse")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        assert len(model.optimizer._fused_packs().packs()) == 1
        model.save(str(tmp_path / "sm"), save_format="tf")
        loaded = K.models.load_model(str(tmp_path / "sm"))
        assert type(loaded.optimizer) is fl.LazyAdam
        for a, b in zip(model.optimizer.get_weights(), loaded.optimizer.get_weights()):
            np.testing.assert_array_equal(a, b)
        before = [w.copy() for w in loaded.get_weights()]
        loaded.fit(x, y, batch_size=16, epochs=1, verbose=0)
        assert all(not np.array_equal(a, b) for a, b in zip(before, loaded.get_weights()))

    def test_model_save_load_h5(tmp_path):
        x, y = _data()
        model = _model()
        model.compile(optimizer=fl.Adamax(0.02), loss="mse")
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        path = str(tmp_path / "m.h5")
        model.save(path)
        loaded = K.models.load_model(path)
        assert type(loaded.optimizer) is fl.Adamax
        for a, b in zip(model.optimizer.get_weights(), loaded.optimizer.get_weights()):
            np.testing.assert_array_equal(a, b)

    # --- dtypes the fused ops do not take: Keras 2's own update (issue 29, item 4) -------

    @pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
    @pytest.mark.parametrize("dtype", harness.FALLBACK_DTYPES)
    @pytest.mark.parametrize("rule", sorted(PAIRS))
    def test_dtypes_the_ops_do_not_take_run_keras_own_update(rule, dtype, sparse):
        """complex and integer variables: the same numbers (bit for bit) or the same error
        as the Keras 2 class replaced, never our op's dtype error."""
        ours, theirs = (harness.run_fallback(
            lambda cls=cls: cls(learning_rate=0.1, **npref.ORACLES[rule].LEGACY_KWARGS),
            dtype, sparse) for cls in PAIRS[rule])
        # what Keras 2 trains: complex Adam, Adagrad, RMSprop (no AdaMax kernel for complex)
        must_train = dtype.startswith("complex") and rule != "adamax"
        harness.check_fallback_is_the_replaced_class(ours, theirs, dtype, sparse,
                                                     np.testing.assert_array_equal,
                                                     must_train)

    # --- fusedopt's own classes (rules Keras 2 has no optimizer for: issue 32) -----------

    @pytest.mark.parametrize("rule", NEW)
    def test_new_rule_dense_matches_reference_and_checkpoints(rule, tmp_path):
        """No Keras 2 class to run beside: the NumPy oracle step by step (eager, then
        tf.function), slots of the rule's layouts; a tf.train.Checkpoint restores them
        into a fresh optimizer, which goes on with the same bits."""
        opt = make(rule, 0, 0.1, epsilon=0.01)
        variables = _vars(4)
        opt._create_all_weights(variables)
        names = SPECS[rule].slots
        for var in variables:
            assert [tuple(opt.get_slot(var, n).shape) for n in names] == [
                npref.slot_shape(rule, s, var.shape) for s in npref.RULES[rule]["slots"]]
        rng = np.random.default_rng(6)
        step = tf.function(_no_result(lambda g: opt.apply_gradients(zip(g, variables))))
        for t in range(1, 7):
            grads = _grads(rng, variables)
            before = [(v.numpy(), [opt.get_slot(v, n).numpy() for n in names])
                      for v in variables]
            coefficients = opt._fallback_apply_state(variables[0].device, tf.float32)
            hyper = {name: float(coefficients[key]) for name, key in SPECS[rule].hyper.items()}
            (opt.apply_gradients(zip(grads, variables)) if t < 4 else step(grads))
            for var, (v0, s0), g in zip(variables, before, grads):
                exp_v, exp_s = npref.dense_update(rule, v0, s0, g.numpy(), hyper,
                                                  SPECS[rule].options)
                npref.assert_close(var.numpy(), exp_v, "float32", "var step %d" % t)
                for n, e in zip(names, exp_s):
                    npref.assert_close(opt.get_slot(var, n).numpy(), e, "float32", n)
        path = tf.train.Checkpoint(opt=opt, v=variables).save(str(tmp_path / "ckpt"))
        fresh_vars = _vars(99)
        fresh = make(rule, 0, 0.1, epsilon=0.01)
        tf.train.Checkpoint(opt=fresh, v=fresh_vars).restore(path)
        grads = _grads(rng, variables)
        opt.apply_gradients(zip(grads, variables))
        fresh.apply_gradients(zip(grads, fresh_vars))  # slots restored on creation
        for var, fresh_var in zip(variables, fresh_vars):
            np.testing.assert_array_equal(var.numpy(), fresh_var.numpy())
            for n in names:
                np.testing.assert_array_equal(opt.get_slot(var, n).numpy(),
                                              fresh.get_slot(fresh_var, n).numpy())
