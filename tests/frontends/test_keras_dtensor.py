"""fusedopt.keras.dtensor.Adagrad on a 2-device virtual CPU mesh.

Virtual devices must be configured before TensorFlow initializes its devices, so this
module re-runs itself in a subprocess (``FUSEDOPT_DTENSOR_CHILD=1``, and
``TF_USE_LEGACY_KERAS=1`` for tf_keras on TF >= 2.16) and the real tests run there.
``FUSEDOPT_DTENSOR_CHILD=1 pytest tests/frontends/test_keras_dtensor.py`` runs them directly.
"""

import os

CHILD = os.environ.get("FUSEDOPT_DTENSOR_CHILD") == "1"

if not CHILD:

    def test_dtensor_suite_on_virtual_cpu_mesh():
        import tensorflow as tf

        env = dict(os.environ, FUSEDOPT_DTENSOR_CHILD="1")
        if tuple(int(x) for x in tf.__version__.split(".")[:2]) >= (2, 16):
            env["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras = tf_keras (TF 2.15 has no tf_keras)
        import harness

        harness.run_test_file_in_subprocess(__file__, env)

else:
    import numpy as np
    import pytest
    import tensorflow as tf

    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        _cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    from tensorflow.experimental import dtensor  # noqa: E402

    from fusedopt.keras import dtensor as fd  # noqa: E402

    K = fd._keras
    DEVICES = ["CPU:0", "CPU:1"]
    SHAPES = [(4, 6), (6,)]

    def _init(seed=0):
        rng = np.random.default_rng(seed)
        return [rng.uniform(-1, 1, s).astype(np.float32) for s in SHAPES]

    def _grad_steps(n=6, seed=1):
        rng = np.random.default_rng(seed)
        return [[rng.normal(size=s).astype(np.float32) for s in SHAPES] for _ in range(n)]

    def _layouts(kind):
        if kind == "batch":  # data parallel: every weight replicated
            mesh = dtensor.create_mesh([("batch", 2)], devices=DEVICES)
            return mesh, [dtensor.Layout.replicated(mesh, rank=len(s)) for s in SHAPES]
        mesh = dtensor.create_mesh([("model", 2)], devices=DEVICES)
        return mesh, [dtensor.Layout([dtensor.UNSHARDED, "model"], mesh),
                      dtensor.Layout(["model"], mesh)]

    def _fused_types(graph):
        types = {op.type for op in graph.get_operations()}
        for f in graph._functions.values():
            types.update(o.type for o in f.graph.get_operations())
        return {t for t in types if t.startswith("FusedOpt>")}

    def _single_device(cls, **kwargs):
        variables = [tf.Variable(x) for x in _init()]
        opt = cls(**kwargs)
        step = tf.function(lambda gs: opt.apply_gradients(zip(gs, variables)))
        for grads in _grad_steps():
            step([tf.constant(g) for g in grads])
        return [v.numpy() for v in variables], [a.numpy() for a in opt._accumulators]

    def test_signature():
        import inspect

        params = list(inspect.signature(fd.Adagrad.__init__).parameters)[1:8]
        assert params == ["learning_rate", "initial_accumulator_value", "epsilon",
                          "gradients_clip_option", "ema_option", "name", "mesh"]
        assert fd.Adagrad().name == "Adagrad"
        opt = fd.Adagrad(gradients_clip_option={"clipnorm": 0.5},
                         ema_option={"use_ema": True, "ema_momentum": 0.9})
        assert opt.clipnorm == 0.5 and opt.use_ema and opt.ema_momentum == 0.9
        config = opt.get_config()
        assert type(fd.Adagrad.from_config(config)) is fd.Adagrad

    def test_single_device_matches_keras_adagrad():
        ours = _single_device(fd.Adagrad, learning_rate=0.1, epsilon=0.05)
        ref = _single_device(K.optimizers.Adagrad, learning_rate=0.1, epsilon=0.05)
        for a, b in zip(ours[0] + ours[1], ref[0] + ref[1]):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)

    @pytest.mark.parametrize("eager", [True, False])
    @pytest.mark.parametrize("kind", ["batch", "model"])
    def test_mesh_matches_single_device(kind, eager):
        mesh, layouts = _layouts(kind)
        variables = [dtensor.DVariable(dtensor.copy_to_mesh(
            x, dtensor.Layout.replicated(mesh, rank=x.ndim)))
            for x in _init()]
        variables = [dtensor.DVariable(dtensor.relayout(v.read_value(), lay))
                     for v, lay in zip(variables, layouts)]
        opt = fd.Adagrad(learning_rate=0.1, epsilon=0.05, mesh=mesh)

        def step(gs):
            opt.apply_gradients(zip(gs, variables))

        traced = tf.function(step)
        if not eager:
            step = traced

        def dgrads(grads):
            return [dtensor.relayout(dtensor.copy_to_mesh(
                tf.constant(g), dtensor.Layout.replicated(mesh, rank=g.ndim)), lay)
                for g, lay in zip(grads, layouts)]

        steps = _grad_steps()
        step(dgrads(steps[0]))
        for v, acc, lay in zip(variables, opt._accumulators, layouts):
            assert dtensor.fetch_layout(acc) == lay  # slots take the variable's layout
        replicated0 = dtensor.Layout.replicated(mesh, rank=0)
        assert dtensor.fetch_layout(opt.iterations) == replicated0
        assert dtensor.fetch_layout(opt._learning_rate) == replicated0
        # Traced steps always use the composed form (DTensor's SPMD pass cannot place
        # custom ops); eager steps on replicated layouts run the fused op.
        assert _fused_types(traced.get_concrete_function(dgrads(steps[1])).graph) == set()
        if eager:
            from fusedopt import _dispatch

            calls = []
            real = _dispatch._op

            def spy(rule, sparse):
                calls.append(rule)
                return real(rule, sparse)

            _dispatch._op = spy
            try:
                step(dgrads(steps[1]))
            finally:
                _dispatch._op = real
            assert calls == (["adagrad"] * 2 if kind == "batch" else [])
            steps = steps[:1] + steps[2:]
            extra = 1
        else:
            extra = 0
        for grads in steps[1:]:
            step(dgrads(grads))
        assert int(opt.iterations.numpy()) == len(steps) + extra
        exp_vars, exp_accs = _single_device(fd.Adagrad, learning_rate=0.1, epsilon=0.05)
        def value(v):  # a sharded DTensor must be replicated before .numpy()
            return dtensor.relayout(v.read_value(), dtensor.Layout.replicated(
                mesh, rank=len(v.shape))).numpy()

        for got, exp in zip([value(v) for v in variables] +
                            [value(a) for a in opt._accumulators], exp_vars + exp_accs):
            np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-7)

    def _train_keras_model(kind, steps=4):
        """Dense model built under a LayoutMap; returns final weights (replicated)."""
        rng = np.random.default_rng(0)
        x = rng.normal(size=(8, 5)).astype(np.float32)
        y = rng.normal(size=(8, 4)).astype(np.float32)
        K.utils.set_random_seed(1)
        if kind is None:
            mesh = None
            model = K.Sequential([K.layers.Dense(6, activation="tanh", name="d1"),
                                  K.layers.Dense(4, name="d2")])
            model.build((None, 5))
            xs, ys = tf.constant(x), tf.constant(y)
        else:
            mesh = dtensor.create_mesh([(kind, 2)], devices=DEVICES)
            layout_map = K.dtensor.experimental.LayoutMap(mesh=mesh)
            if kind == "model":
                layout_map["d1.kernel"] = dtensor.Layout([dtensor.UNSHARDED, "model"], mesh)
                layout_map["d1.bias"] = dtensor.Layout(["model"], mesh)
                layout_map["d2.kernel"] = dtensor.Layout(["model", dtensor.UNSHARDED], mesh)
            with layout_map.scope():
                model = K.Sequential([K.layers.Dense(6, activation="tanh", name="d1"),
                                      K.layers.Dense(4, name="d2")])
                model.build((None, 5))
            data = dtensor.Layout(["batch" if kind == "batch" else dtensor.UNSHARDED,
                                   dtensor.UNSHARDED], mesh)
            rep = dtensor.Layout.replicated(mesh, rank=2)
            xs = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(x), rep), data)
            ys = dtensor.relayout(dtensor.copy_to_mesh(tf.constant(y), rep), data)
        opt = fd.Adagrad(learning_rate=0.1, epsilon=0.05, mesh=mesh)

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        for _ in range(steps):
            step(xs, ys)
        out = []
        for v in model.trainable_variables:
            if mesh is not None:
                lay = dtensor.fetch_layout(v)
                slot = opt._accumulators[opt._index_dict[opt._var_key(v)]]
                assert dtensor.fetch_layout(slot) == lay
                if kind == "model" and v.name.startswith("d1"):
                    assert not lay.is_fully_replicated()
                out.append(dtensor.relayout(v.read_value(), dtensor.Layout.replicated(
                    mesh, rank=len(v.shape))).numpy())
            else:
                out.append(v.numpy())
        return out

    @pytest.mark.parametrize("kind", ["batch", "model"])
    def test_keras_model_with_layout_map_matches_single_device(kind):
        expected = _train_keras_model(None)
        got = _train_keras_model(kind)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    def _sparse_steps(make_table, opt, steps=4):
        """Embedding steps: tf.gather of duplicate ids inside a tf.function (a sparse
        tf.IndexedSlices gradient), as a replicated-table data-parallel model has."""
        table = make_table(np.random.default_rng(3).uniform(-1, 1, (6, 4)).astype(np.float32))
        rng = np.random.default_rng(4)
        batches = [(rng.integers(0, 5, size=8).astype(np.int32),  # row 5 never named
                    rng.normal(size=(8, 4)).astype(np.float32)) for _ in range(steps)]

        @tf.function
        def step(ids, target):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(tf.gather(table, ids) - target))
            grad = tape.gradient(loss, [table])
            assert isinstance(grad[0], tf.IndexedSlices)
            opt.apply_gradients(zip(grad, [table]))

        return table, batches, step

    def test_sparse_gradient_in_tf_function_on_a_mesh():
        """Issue 29, item 5: the composed sparse form uses only ops DTensor lays out
        (it failed with "'tf.UnsortedSegmentMax' op does not implement layout
        propagation"); numbers of Keras's own Adagrad on one device."""
        mesh = dtensor.create_mesh([("batch", 2)], devices=DEVICES)

        def on_mesh(x):
            return dtensor.DVariable(dtensor.copy_to_mesh(
                tf.constant(x), dtensor.Layout.replicated(mesh, rank=x.ndim)))

        def replicated(ids, target):
            rep = dtensor.Layout.replicated
            return (dtensor.copy_to_mesh(tf.constant(ids), rep(mesh, rank=1)),
                    dtensor.copy_to_mesh(tf.constant(target), rep(mesh, rank=2)))

        results = []
        for make, opt, feed in (
                (on_mesh, fd.Adagrad(learning_rate=0.1, epsilon=0.05, mesh=mesh), replicated),
                (tf.Variable, K.optimizers.Adagrad(learning_rate=0.1, epsilon=0.05),
                 lambda ids, t: (tf.constant(ids), tf.constant(t)))):
            table, batches, step = _sparse_steps(make, opt)
            start = table.numpy() if not isinstance(table, dtensor.DVariable) else \
                dtensor.relayout(table.read_value(), dtensor.Layout.replicated(
                    mesh, rank=2)).numpy()
            for ids, target in batches:
                step(*feed(ids, target))
            results.append((start, table.read_value().numpy()))
        (start, got), (_, expected) = results
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(got[5], start[5])  # never named: untouched
        assert not np.allclose(got[:5], start[:5])
