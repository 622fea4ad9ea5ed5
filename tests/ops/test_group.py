"""The group ops (FusedOpt>ResourceGroupApply<Rule>: N variables, one op) and the front ends
that use them.

Every rule x dtype x option set: the group op's results equal one per-variable op per
variable bit for bit (eager, tf.function, XLA custom call, XLA HLO, v1 graph) and the NumPy
float64 reference within the dtype's tolerance. Bad input anywhere in the group is an
InvalidArgumentError naming the member and leaves every variable and slot as it was. The
Keras 3, Keras 2 (legacy) and compat.v1 classes run their dense updates through it, and
their numbers equal the per-variable path's.
"""
import threading

import numpy as np
import pytest
import tensorflow as tf

import fusedopt.ops as fops
from fusedopt import _dispatch
import harness
import numpy_reference as npref

RULES = npref.RULES
SHAPES = [(7, 5), (64,), (3, 1, 2), (0, 4), (1,), (2100,)]  # (2100,): several blocks


def _group_op(rule):
    return getattr(fops, "resource_group_apply_" + rule)


def _single_op(rule):
    return getattr(fops, "resource_apply_" + rule)


def _states(rule, dtype, rng, shapes=SHAPES):
    return [harness.make_state(rule, shape, dtype, rng) for shape in shapes]


def _variables(states):
    return [[tf.Variable(v)] + [tf.Variable(s) for s in slots] for v, slots in states]


def _values(variables):
    return [[x.numpy() for x in group] for group in variables]


def _group_call(rule, variables, grads, hyper, options):
    n_slots = len(RULES[rule]["slots"])
    return _group_op(rule)([v[0] for v in variables],
                           *[[v[1 + k] for v in variables] for k in range(n_slots)],
                           *[hyper[h] for h in RULES[rule]["hyper"]], grads, **options)


def _single_calls(rule, variables, grads, hyper, options):
    for v, g in zip(variables, grads):
        _single_op(rule)(v[0], *v[1:], *[hyper[h] for h in RULES[rule]["hyper"]], g,
                         **options)


def _bytes(values):
    return [[x.tobytes() for x in group] for group in values]


@pytest.mark.parametrize("mode", ["eager", "function", "jit", "jit_hlo"])
@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("rule,options", harness.RULE_OPTIONS, ids=harness.param_ids)
def test_group_equals_per_variable_ops_and_reference(rule, options, dtype, mode,
                                                     monkeypatch):
    if mode == "jit_hlo":
        monkeypatch.setenv("FUSEDOPT_XLA_LOWERING", "hlo")
    rng = np.random.default_rng(1)
    states = _states(rule, dtype, rng)
    grouped, single = _variables(states), _variables(states)
    tf_dtype = harness.TF_DTYPES[dtype]

    def run(fn, variables):
        def step(grads, hyper):
            fn(rule, variables, grads, hyper, options)
        if mode == "eager":
            return step
        return tf.function(step, jit_compile=mode.startswith("jit"))

    group_step, single_step = run(_group_call, grouped), run(_single_calls, single)
    expected = [(v, list(s)) for v, s in states]
    for t in range(1, 4):
        grads = [harness.make_grad(v.shape, dtype, rng) for v, _ in states]
        hyper = harness.hyper_for(rule, dtype, t)
        hyper_t = {k: tf.constant(x, tf_dtype) for k, x in hyper.items()}
        grads_t = [tf.constant(g) for g in grads]
        group_step(grads_t, hyper_t)
        single_step(grads_t, hyper_t)
        got = _values(grouped)
        assert _bytes(got) == _bytes(_values(single)), "group op != per-variable ops"
        for i, ((var, slots), g) in enumerate(zip(expected, grads)):
            new_var, new_slots = npref.dense_update(rule, var, slots, g, hyper, options)
            npref.assert_close(got[i][0], new_var, dtype, err_msg=f"var {i} step {t}")
            for k, s in enumerate(new_slots):
                npref.assert_close(got[i][1 + k], s, dtype, err_msg=f"slot {k} of {i}")
            expected[i] = (got[i][0], got[i][1:])  # next step from what the op produced


@pytest.mark.parametrize("rule", sorted(RULES))
def test_group_in_v1_graph(rule):
    rng = np.random.default_rng(2)
    states = _states(rule, "float", rng)
    grads = [harness.make_grad(v.shape, "float", rng) for v, _ in states]
    hyper = harness.hyper_for(rule, "float", 1)
    single = _variables(states)
    _single_calls(rule, single, [tf.constant(g) for g in grads], hyper, {})
    graph = tf.Graph()
    with graph.as_default():
        variables = [[tf.compat.v1.Variable(v, use_resource=True)]
                     + [tf.compat.v1.Variable(s, use_resource=True) for s in slots]
                     for v, slots in states]
        op = _group_call(rule, variables, [tf.constant(g) for g in grads], hyper, {})
        assert op.type == "FusedOpt>ResourceGroupApply" + fops.RULES[rule]["op_name"]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(op)
            got = [sess.run(group) for group in variables]
    assert _bytes(got) == _bytes(_values(single))


# --- bad input: a clear error, nothing written ---------------------------------------

def _setup(rule="lazy_adam", shapes=((4, 3), (5,), (2, 2)), dtype="float"):
    rng = np.random.default_rng(3)
    states = _states(rule, dtype, rng, shapes)
    variables = _variables(states)
    grads = [tf.constant(harness.make_grad(v.shape, dtype, rng)) for v, _ in states]
    hyper = harness.hyper_for(rule, dtype, 1)
    return variables, grads, hyper


def _unchanged(variables, before):
    assert _bytes(_values(variables)) == _bytes(before)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_bad_member_shape_names_it_and_writes_nothing(mode):
    variables, grads, hyper = _setup()
    grads[2] = tf.zeros([2, 3])
    before = _values(variables)

    def call():
        _group_call("lazy_adam", variables, grads, hyper, {})
    if mode == "function":
        call = tf.function(call)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=r"variable 2 of 3: grad must have the same shape as var: "
                             r"\[2,2\] vs \[2,3\]"):
        call()
    _unchanged(variables, before)


ROW_WISE_SLOTS = [(rule, name) for rule in sorted(RULES)
                  for name, layout in fops.RULES[rule]["slot_layouts"].items()
                  if layout == "per_row"]


@pytest.mark.parametrize("mode", ["eager", "function", "packed"])
@pytest.mark.parametrize("rule,slot", ROW_WISE_SLOTS)
def test_per_row_slot_in_var_shape_refused_and_writes_nothing(rule, slot, mode):
    """A per-row slot ([rows]) given in var's full shape ([rows, D]) is refused by the
    group op as by the single ops, in every form of the call, with nothing written."""
    variables, grads, hyper = _setup(rule, shapes=((4, 3), (6, 2), (5, 3)))
    k = 1 + fops.RULES[rule]["slots"].index(slot)
    variables[1][k] = tf.Variable(np.full((6, 2), 0.5, np.float32))  # the full shape
    before = _values(variables)
    n_slots = len(RULES[rule]["slots"])
    h = [hyper[name] for name in RULES[rule]["hyper"]]
    if mode == "packed":
        pack = fops.variable_pack([v[j] for j in range(1 + n_slots) for v in variables])

        def call():
            getattr(fops, "resource_packed_group_apply_" + rule)(pack, *h, grads)
    else:
        def call():
            _group_call(rule, variables, grads, hyper, {})
        if mode == "function":
            call = tf.function(call)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=r"variable 1 of 3: %s holds one value per row of var: shape "
                             r"(var.shape\[:1\] = )?\[6\], got \[6,2\]" % slot):
        call()
    _unchanged(variables, before)


def test_bad_slot_shape_at_run_time_writes_nothing():
    variables, grads, hyper = _setup()
    before = _values(variables)

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def call(last_grad):  # unknown shape at trace time: the kernel must catch it
        _group_call("lazy_adam", variables, grads[:2] + [last_grad], hyper, {})
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"variable 2 of 3: grad must have the same shape as var"):
        call(tf.zeros([3, 2]))
    _unchanged(variables, before)


def test_mixed_dtypes_rejected_naming_the_variable():
    variables, grads, hyper = _setup()
    variables[1][0] = tf.Variable(np.zeros(5, np.float64))
    before = _values(variables)
    with pytest.raises((tf.errors.InvalidArgumentError, TypeError, ValueError),
                       match=r"var\[1\] has dtype double but the update is for float|"
                             r"float64|double"):
        _group_call("lazy_adam", variables, grads, hyper, {})
    _unchanged(variables, before)


def test_same_variable_twice_in_a_group_rejected():
    variables, grads, hyper = _setup(shapes=((4, 3), (4, 3)))
    variables[1][2] = variables[0][1]  # v[1] is m[0]
    before = _values(variables)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"m\[0\] and v\[1\] are the same variable.*each needs its own"):
        _group_call("lazy_adam", variables, grads, hyper, {})
    _unchanged(variables, before)


def test_uninitialized_member_is_failed_precondition_and_writes_nothing():
    variables, grads, hyper = _setup()
    before = _values(variables)
    graph = tf.Graph()
    with graph.as_default():
        live = [[tf.compat.v1.Variable(x, use_resource=True) for x in group]
                for group in before]
        ghost = tf.compat.v1.Variable(np.zeros(5, np.float32), use_resource=True)
        live[1][0] = ghost
        op = _group_call("lazy_adam", live, grads_as_graph(grads), hyper, {})
        with tf.compat.v1.Session(graph=graph) as sess:
            for group in live:
                for x in group:
                    if x is not ghost:
                        sess.run(x.initializer)
            with pytest.raises(tf.errors.FailedPreconditionError,
                               match=r"uninitialized variable: var\[1\]"):
                sess.run(op)
            got = [[sess.run(x) for x in group if x is not ghost] for group in live]
    expected = [[x for j, x in enumerate(group) if not (i == 1 and j == 0)]
                for i, group in enumerate(before)]
    assert _bytes(got) == _bytes(expected)


def grads_as_graph(grads):
    return [tf.constant(g.numpy()) for g in grads]


def test_non_scalar_hyper_rejected():
    variables, grads, hyper = _setup()
    hyper["lr"] = tf.constant([0.1, 0.2])
    before = _values(variables)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match=r"lr must be a scalar, got shape \[2\]"):
        _group_call("lazy_adam", variables, grads, hyper, {})
    _unchanged(variables, before)


def test_python_side_checks():
    variables, grads, hyper = _setup()
    op = _group_op("lazy_adam")
    h = [hyper[k] for k in RULES["lazy_adam"]["hyper"]]
    vs, ms, vv = ([g[k] for g in variables] for k in range(3))
    with pytest.raises(ValueError, match="m has 2 entries but var has 3"):
        op(vs, ms[:2], vv, *h, grads)
    with pytest.raises(ValueError, match="grad has 2 entries but var has 3"):
        op(vs, ms, vv, *h, grads[:2])
    with pytest.raises(ValueError, match="var is empty"):
        op([], [], [], *h, [])
    with pytest.raises(TypeError, match="var must be a list"):
        op(vs[0], ms, vv, *h, grads)
    with pytest.raises(TypeError, match="pass the tf.Variable itself"):
        op([v.handle for v in vs], ms, vv, *h, grads)


def test_concurrent_groups_over_shared_variables_do_not_deadlock():
    """Two groups over the same variables listed in opposite orders, many times, from two
    threads: the locks are taken in address order, so this always finishes."""
    variables, grads, hyper = _setup(shapes=[(16,)] * 6)
    @tf.function
    def forward():
        _group_call("lazy_adam", variables, grads, hyper, {})

    @tf.function
    def backward():
        _group_call("lazy_adam", variables[::-1], grads[::-1], hyper, {})
    errors = []

    def loop(fn):
        try:
            for _ in range(200):
                fn()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=loop, args=(f,)) for f in (forward, backward)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors
    assert all(np.isfinite(x.numpy()).all() for g in variables for x in g)


# --- the front ends ----------------------------------------------------------------

def _count_group_calls(monkeypatch):
    calls = []
    real = _dispatch.apply_group

    def spy(rule, updates, *args, **kwargs):
        calls.append(len(updates))
        return real(rule, updates, *args, **kwargs)
    monkeypatch.setattr(_dispatch, "apply_group", spy)
    return calls


def _no_grouping(monkeypatch):
    monkeypatch.setattr(_dispatch, "groupable", lambda var, grad: False)


def _model_variables(seed, dtype=tf.float32):
    rng = np.random.default_rng(seed)
    shapes = [(8, 8), (8,), (4, 8), (4,)] * 3
    return [tf.Variable(rng.uniform(-1, 1, s).astype(dtype.as_numpy_dtype)) for s in shapes]


def _grads(variables, step):
    rng = np.random.default_rng(100 + step)
    return [tf.constant(rng.uniform(-1, 1, v.shape).astype(v.dtype.as_numpy_dtype))
            for v in variables]


# (class, arguments, grouped): settings the rule does not cover run Keras's own update.
KERAS3 = hasattr(tf.keras.optimizers.Optimizer, "_distributed_tf_update_step")
KERAS3_CASES = [("LazyAdam", {}, True), ("Adamax", {}, True), ("Adagrad", {}, True),
                ("RMSprop", {"momentum": 0.5}, True),
                ("LazyAdam", {"weight_decay": 0.01, "clipnorm": 1.0}, True),
                ("RMSprop", {}, False), ("LazyAdam", {"amsgrad": True}, False)]


def _keras3_steps(name, kwargs, jit, steps=3):
    import fusedopt.keras
    variables = _model_variables(0)
    opt = getattr(fusedopt.keras, name)(learning_rate=0.01, **kwargs)
    step = tf.function(lambda grads: opt.apply_gradients(zip(grads, variables)),
                       jit_compile=jit) if jit is not None else (
        lambda grads: opt.apply_gradients(zip(grads, variables)))
    for t in range(steps):
        step(_grads(variables, t))
    return [v.numpy() for v in variables] + [v.numpy() for v in opt.variables]


@pytest.mark.slow
@pytest.mark.parametrize("jit", [None, False, True], ids=["eager", "function", "jit"])
@pytest.mark.parametrize("name,kwargs,grouped", KERAS3_CASES, ids=str)
def test_keras_dense_step_is_grouped_and_identical(name, kwargs, grouped, jit, monkeypatch):
    # Keras 2.15's optimizer (TF 2.15) keeps one op per variable: nothing to group there.
    grouped = grouped and KERAS3
    with monkeypatch.context() as m:
        _no_grouping(m)
        expected = _keras3_steps(name, kwargs, jit)
    calls = _count_group_calls(monkeypatch)
    got = _keras3_steps(name, kwargs, jit)
    assert bool(calls) == grouped, calls
    assert [x.tobytes() for x in got] == [x.tobytes() for x in expected]


@pytest.mark.skipif(not KERAS3, reason="Keras 3's gradient all-reduce (TF >= 2.16)")
def test_keras3_step_outside_a_strategy_adds_no_all_reduce_ops():
    """Outside tf.distribute, Keras 3's gradient all-reduce is one replica's Identity per
    gradient; fusedopt's classes pass the gradients on as they are. Under a strategy the
    all-reduce stays."""
    import fusedopt.keras

    def step_op_types(strategy=None):
        strategy_given = strategy is not None
        strategy = strategy or tf.distribute.get_strategy()
        with strategy.scope():
            variables = _model_variables(1)
            opt = fusedopt.keras.LazyAdam(0.01)
        grads = _grads(variables, 0)
        def update():
            opt.apply_gradients(zip(grads, variables))

        @tf.function
        def step():  # returns nothing: no output Identity ops
            strategy.run(update) if strategy_given else update()
        step()
        return [op.type for op in step.get_concrete_function().graph.get_operations()]
    plain = step_op_types()
    assert "Identity" not in plain and "IdentityN" not in plain, sorted(set(plain))
    # The packed group op (fusedopt._packs): one pack handle for the variables and slots.
    assert plain.count("FusedOpt>ResourcePackedGroupApplyLazyAdam") == 1, sorted(set(plain))
    assert "FusedOpt>ResourceGroupApplyLazyAdam" not in plain
    mirrored = step_op_types(tf.distribute.MirroredStrategy(["/cpu:0"]))
    assert mirrored.count("Identity") >= 12, sorted(set(mirrored))  # one per gradient


def test_keras_groups_by_dtype_and_keeps_sparse_lazy(monkeypatch):
    import fusedopt.keras
    calls = _count_group_calls(monkeypatch)
    ops_seen = []
    real_group = fops.resource_group_apply_lazy_adam
    real_packed = fops.resource_packed_group_apply_lazy_adam

    def spy(var, *args, **kwargs):
        ops_seen.append({v.dtype for v in var})
        return real_group(var, *args, **kwargs)

    def packed_spy(pack, *args, grad, **kwargs):  # Keras 3, eager: the packed op
        ops_seen.append({g.dtype for g in grad})
        return real_packed(pack, *args, grad=grad, **kwargs)
    monkeypatch.setattr(fops, "resource_group_apply_lazy_adam", spy)
    monkeypatch.setattr(fops, "resource_packed_group_apply_lazy_adam", packed_spy)
    dense32 = [tf.Variable(np.ones((3, 3), np.float32)), tf.Variable(np.ones(3, np.float32))]
    dense64 = [tf.Variable(np.ones(4, np.float64))]
    table = tf.Variable(np.ones((10, 2), np.float32))
    opt = fusedopt.keras.LazyAdam(0.1)
    grads = [tf.ones((3, 3)), tf.ones(3), tf.ones(4, tf.float64),
             tf.IndexedSlices(tf.ones((2, 2)), tf.constant([1, 7]), tf.constant([10, 2]))]
    opt.apply_gradients(zip(grads, dense32 + dense64 + [table]))
    if KERAS3:
        assert calls == [3] and sorted(map(len, ops_seen)) == [1, 1]
    else:  # Keras 2.15: one op per variable
        assert calls == [] and ops_seen == []
    untouched = [r for r in range(10) if r not in (1, 7)]
    np.testing.assert_array_equal(table.numpy()[untouched], 1.0)  # lazy: rows not named
    assert (table.numpy()[[1, 7]] < 1).all() and (dense64[0].numpy() < 1).all()
    assert int(np.asarray(opt.iterations)) == 1


def test_keras_fit_uses_group_op_and_matches_adam(monkeypatch):
    import keras

    import fusedopt.keras
    calls = _count_group_calls(monkeypatch)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 6)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")

    def train(opt):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=opt, loss="mse", jit_compile=False)
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        return [w.numpy() for w in model.weights]
    got = train(fusedopt.keras.LazyAdam(1e-2))
    assert bool(calls) == KERAS3
    want = train(keras.optimizers.Adam(1e-2))
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_legacy_dense_step_is_grouped_and_identical(monkeypatch):
    from fusedopt.keras import legacy

    def steps(graph_mode):
        variables = _model_variables(0)
        opt = legacy.LazyAdam(0.01)
        def fn(grads):
            opt.apply_gradients(zip(grads, variables))
        if graph_mode:
            fn = tf.function(fn)
        for t in range(3):
            fn(_grads(variables, t))
        assert int(opt.iterations.numpy()) == 3
        return [v.numpy() for v in variables] + [v.numpy() for v in opt.variables()]
    for graph_mode in (False, True):
        with monkeypatch.context() as m:
            _no_grouping(m)
            expected = steps(graph_mode)
        with monkeypatch.context() as m:
            calls = _count_group_calls(m)
            got = steps(graph_mode)
        # Eager: every step; tf.function: every trace (slot creation traces twice).
        assert calls and set(calls) == {12} and (graph_mode or len(calls) == 3)
        assert [x.tobytes() for x in got] == [x.tobytes() for x in expected]


def test_legacy_constraint_variables_keep_per_variable_path(monkeypatch):
    from fusedopt.keras import legacy
    calls = _count_group_calls(monkeypatch)
    free = tf.Variable(np.ones(3, np.float32))
    clipped = tf.Variable(np.ones(3, np.float32), constraint=lambda v: tf.clip_by_value(v, 0.95, 2))
    opt = legacy.LazyAdam(0.5)
    opt.apply_gradients([(tf.ones(3), free), (tf.ones(3), clipped)])
    assert calls == [1]
    np.testing.assert_allclose(clipped.numpy(), 0.95)  # the update ran, then the constraint
    assert (free.numpy() < 0.95).all()


@pytest.mark.parametrize("rule_class,anchor", [("LazyAdamOptimizer", "AdamOptimizer"),
                                               ("AdagradOptimizer", "AdagradOptimizer")])
def test_compat_v1_graph_dense_updates_grouped(rule_class, anchor):
    import fusedopt.compat.v1 as v1
    rng = np.random.default_rng(5)
    inits = [rng.uniform(-1, 1, s).astype(np.float32) for s in [(4, 3), (3,), (5,)]]
    results = {}
    for name, cls in (("fused", getattr(v1, rule_class)),
                      ("tf", getattr(tf.compat.v1.train, anchor))):
        graph = tf.Graph()
        with graph.as_default():
            variables = [tf.compat.v1.Variable(x, use_resource=True) for x in inits]
            loss = sum(tf.reduce_sum(tf.square(v) * (i + 1)) for i, v in enumerate(variables))
            global_step = tf.compat.v1.train.get_or_create_global_step()
            train = cls(0.1).minimize(loss, global_step=global_step)
            types = [op.type for op in graph.get_operations()]
            with tf.compat.v1.Session(graph=graph) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(4):
                    sess.run(train)
                results[name] = sess.run(variables)
                assert sess.run(global_step) == 4
        if name == "fused":
            group_type = "FusedOpt>ResourceGroupApply" + fops.RULES[
                "lazy_adam" if "Adam" in rule_class else "adagrad"]["op_name"]
            assert types.count(group_type) == 1
            assert not any(t.startswith("FusedOpt>ResourceApply") for t in types)
    for a, b in zip(results["fused"], results["tf"]):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)


def test_compat_v1_eager_matches_per_variable(monkeypatch):
    import fusedopt.compat.v1 as v1

    def steps():
        variables = _model_variables(3)
        opt = v1.LazyAdamOptimizer(0.01)
        for t in range(3):
            opt.apply_gradients(zip(_grads(variables, t), variables))
        powers = [p.numpy() for p in opt._get_beta_accumulators()]
        return [v.numpy() for v in variables] + powers
    with monkeypatch.context() as m:
        _no_grouping(m)
        expected = steps()
    with monkeypatch.context() as m:
        calls = _count_group_calls(m)
        got = steps()
    assert calls == [12] * 3
    assert [x.tobytes() for x in got] == [x.tobytes() for x in expected]
