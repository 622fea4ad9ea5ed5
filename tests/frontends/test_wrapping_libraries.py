"""fusedopt's optimizers inside libraries that wrap them.

Embedding libraries wrap an optimizer and call its per-variable methods themselves
(``_resource_apply_dense``, ``_apply_sparse``, ..., Keras's ``update_step``), on variables of
their own, then read the variable after the op the method returned and write it back to
their real table; or they subclass it and call ``super()``; or they replace its slot
creation. TF's optimizers promise that the op a per-variable method returns has done that
variable's update when it runs. These tests are such callers, for every rule (RMSprop's
centered setting included), dense and sparse:

- a processor of the library's own (TF's ``_get_processor`` replaced, as such libraries do)
  that calls ``_resource_apply_dense`` / ``_resource_apply_sparse_duplicate_indices`` inside
  ``apply_gradients`` and copies the variable to a table under a control dependency on the
  returned op;
- direct calls of every per-variable method (ref and resource, dense and sparse, with and
  without ``_duplicate_indices``), the variable read under ``control_dependencies``;
- subclasses overriding the per-variable method (compat.v1, Keras 2) or ``update_step``
  (Keras 3) and calling ``super()``: the override runs for every variable;
- slot creation replaced (float32 slots where ``slot_dtype`` asks for 16 bits): a warning
  (``fusedopt.IgnoredOptionWarning``), once, and the update still right.

The expected values come from the same optimizer class driving its own loop on a copy of
the variables (the fused ops give the same bits through either path).
"""
import warnings

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training import optimizer as tf_optimizer

import fusedopt
import numpy_reference as npref
from fusedopt import rules
from fusedopt.compat import v1 as fv1

_CLASS_SPECS = dict(rules.front_end_specs("COMPAT_V1"))
VARIANT_OF = {variant: rule for rule, spec in _CLASS_SPECS.items()
              for _, variant in spec.variants}
V1_RULES = sorted([*_CLASS_SPECS, *VARIANT_OF])


def v1_optimizer(rule, **extra):
    name = _CLASS_SPECS[VARIANT_OF.get(rule, rule)].name
    return getattr(fv1, name)(**npref.ORACLES[rule].COMPAT_V1_KWARGS, **extra)


SHAPE = (6, 4)


def problem(seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.uniform(-1, 1, SHAPE).astype(np.float32) for _ in range(2)]
    dense = [rng.uniform(-1, 1, SHAPE).astype(np.float32) for _ in range(2)]
    indices = np.array([4, 1, 4, 0], np.int32)  # a repeat; rows 2, 3, 5 untouched
    values = [rng.uniform(-1, 1, (len(indices), SHAPE[1])).astype(np.float32)
              for _ in range(2)]
    return init, dense, indices, values


def grads_of(sparse, dense, indices, values):
    if sparse:
        return [tf.IndexedSlices(tf.constant(v), tf.constant(indices), tf.constant(SHAPE))
                for v in values]
    return [tf.constant(g) for g in dense]


def expected_after(rule, sparse, steps=2):
    """The variables after `steps` steps of the optimizer's own apply_gradients (graph)."""
    init, dense, indices, values = problem()
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        variables = [tf.compat.v1.Variable(x, use_resource=True) for x in init]
        opt = v1_optimizer(rule)
        train = opt.apply_gradients(zip(grads_of(sparse, dense, indices, values), variables))
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(steps):
            sess.run(train)
        return sess.run(variables)


# --- a library's processor inside apply_gradients ------------------------------------


class _WrapperVariable(tf.Variable):
    """Marks the variables the library's processor owns (a plain resource variable)."""


class _LibraryProcessor(tf_optimizer._OptimizableVariable):
    """As an embedding library's processor: the optimizer's per-variable method, then the
    variable read after the returned op and written to the library's table."""

    def __init__(self, variable, table):
        self._v, self._table = variable, table

    def target(self):
        return self._v

    def update_op(self, optimizer, g):
        if isinstance(g, tf.IndexedSlices):
            op = optimizer._resource_apply_sparse_duplicate_indices(g.values, self._v, g.indices)
        else:
            op = optimizer._resource_apply_dense(g, self._v)
        with tf.control_dependencies([op] if op is not None else []):
            return self._table.assign(self._v.read_value()).op


@pytest.fixture
def library_processor(monkeypatch):
    """Installs the library's processor for the variables in `tables` ({var ref: table})."""
    tables = {}
    original = tf_optimizer._get_processor

    def get_processor(v):
        if hasattr(v, "ref") and v.ref() in tables:
            return _LibraryProcessor(v, tables[v.ref()])
        return original(v)

    monkeypatch.setattr(tf_optimizer, "_get_processor", get_processor)
    return tables


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rule", V1_RULES)
def test_library_processor_sees_each_update_in_apply_gradients(rule, sparse,
                                                               library_processor):
    """One variable the library updates through its processor, one TF's own: the table
    the library writes after the returned op holds the updated values, every step."""
    init, dense, indices, values = problem()
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        variables = [tf.compat.v1.Variable(x, use_resource=True) for x in init]
        table = tf.compat.v1.Variable(np.zeros(SHAPE, np.float32), use_resource=True)
        library_processor[variables[0].ref()] = table
        opt = v1_optimizer(rule)
        train = opt.apply_gradients(zip(grads_of(sparse, dense, indices, values), variables))
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(2):
            sess.run(train)
        got_table, *got = sess.run([table, *variables])
    want = expected_after(rule, sparse)
    assert got_table.tobytes() == want[0].tobytes()  # the library's copy: the updated var
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]
    assert not np.array_equal(want[0], init[0])


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("rule", V1_RULES)
def test_library_processor_eager(rule, sparse, library_processor):
    init, dense, indices, values = problem()
    variables = [tf.Variable(x) for x in init]
    table = tf.Variable(np.zeros(SHAPE, np.float32))
    library_processor[variables[0].ref()] = table
    opt = v1_optimizer(rule)
    for _ in range(2):
        opt.apply_gradients(zip(grads_of(sparse, dense, indices, values), variables))
    want = expected_after(rule, sparse)
    assert table.numpy().tobytes() == want[0].tobytes()
    assert [v.numpy().tobytes() for v in variables] == [w.tobytes() for w in want]


# --- direct calls of each per-variable method ------------------------------------------

METHODS = [  # (method, variable kind, sparse)
    ("_apply_dense", "ref", False),
    ("_resource_apply_dense", "resource", False),
    ("_apply_sparse", "ref", True),
    ("_apply_sparse_duplicate_indices", "ref", True),
    ("_resource_apply_sparse", "resource", True),
    ("_resource_apply_sparse_duplicate_indices", "resource", True),
]


def _call(opt, method, variable, sparse, dense, indices, values):
    if not sparse:
        return getattr(opt, method)(tf.constant(dense), variable)
    if method.startswith("_resource"):
        return getattr(opt, method)(tf.constant(values), variable, tf.constant(indices))
    return getattr(opt, method)(
        tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant(SHAPE)), variable)


@pytest.mark.parametrize("method,kind,sparse", METHODS, ids=[m[0] for m in METHODS])
@pytest.mark.parametrize("rule", V1_RULES)
def test_each_method_returns_an_op_that_has_updated_its_variable(rule, method, kind, sparse):
    """The library's pattern without apply_gradients: slots made, the per-variable method
    called, the variable read under control_dependencies([returned op]), twice."""
    init, dense, indices, values = problem()
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = tf.compat.v1.Variable(init[0], use_resource=(kind == "resource"))
        opt = v1_optimizer(rule)
        opt._create_slots([var])
        opt._prepare()
        with tf.name_scope("update"):
            op = _call(opt, method, var, sparse, dense[0], indices, values[0])
        with tf.control_dependencies([op]):
            read = tf.identity(var.read_value() if kind == "resource" else var)
        # What apply_gradients does after its loop (powers, step counters), run between
        # the steps on its own (with the op as a dependency it would update var again).
        finish = opt._finish([], "finish")
        sess.run(tf.compat.v1.global_variables_initializer())
        first = sess.run(read)
        sess.run(finish)
        second = sess.run(read)
    want_1, want_2 = _single_variable_steps(rule, sparse, init[0], dense[0], indices, values[0])
    assert first.tobytes() == want_1.tobytes()
    assert second.tobytes() == want_2.tobytes()


def _single_variable_steps(rule, sparse, init, dense, indices, values):
    """var after steps 1 and 2 of the optimizer's own apply_gradients on one variable."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        var = tf.compat.v1.Variable(init, use_resource=True)
        opt = v1_optimizer(rule)
        grad = grads_of(sparse, [dense], indices, [values])[0]
        train = opt.apply_gradients([(grad, var)])
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        first = sess.run(var)
        sess.run(train)
        return first, sess.run(var)


# --- subclasses that override the per-variable method ----------------------------------


def _recording_subclass(base, method):
    """`base` with `method` overridden: records each variable's value right after the
    update, read under a control dependency on super()'s op."""

    def override(self, grad, var, *args, **kwargs):
        op = getattr(super(cls, self), method)(grad, var, *args, **kwargs)
        with tf.control_dependencies([op] if op is not None else []):
            value = tf.identity(var.read_value())
        self.recorded.append((var, value))
        return op

    cls = type("Recording" + base.__name__, (base,), {method: override, "recorded": None})
    return cls


@pytest.mark.parametrize("mode", ["graph", "eager"])
@pytest.mark.parametrize("rule", V1_RULES)
def test_compat_v1_subclass_override_runs_for_every_variable(rule, mode):
    init, dense, indices, values = problem()
    base = type(v1_optimizer(rule))
    cls = _recording_subclass(base, "_resource_apply_dense")
    kwargs = npref.ORACLES[rule].COMPAT_V1_KWARGS

    def make():
        opt = cls(**kwargs)
        opt.recorded = []
        return opt

    want = expected_after(rule, False, steps=1)
    if mode == "eager":
        variables = [tf.Variable(x) for x in init]
        opt = make()
        opt.apply_gradients(zip(grads_of(False, dense, indices, values), variables))
        seen = [value.numpy() for _, value in opt.recorded]
        got = [v.numpy() for v in variables]
    else:
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            variables = [tf.compat.v1.Variable(x, use_resource=True) for x in init]
            opt = make()
            train = opt.apply_gradients(zip(grads_of(False, dense, indices, values), variables))
            sess.run(tf.compat.v1.global_variables_initializer())
            seen = sess.run([train, [value for _, value in opt.recorded]])[1]
            got = sess.run(variables)
    assert len(seen) == len(variables)  # the override ran for every variable
    assert [s.tobytes() for s in seen] == [w.tobytes() for w in want]
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


def _legacy():
    from fusedopt.keras import legacy
    return legacy


def _legacy_rules():
    return sorted(dict(rules.front_end_specs("LEGACY")))


@pytest.mark.parametrize("rule", _legacy_rules())
def test_keras2_subclass_override_runs_for_every_variable(rule):
    legacy = _legacy()
    spec = dict(rules.front_end_specs("LEGACY"))[rule]
    base = getattr(legacy, spec.name)
    kwargs = dict(npref.ORACLES[rule].LEGACY_KWARGS, learning_rate=0.05)
    init, dense, _, _ = problem()

    def run(cls, recorded):
        variables = [tf.Variable(x) for x in init]
        opt = cls(**kwargs)
        if recorded:
            opt.recorded = []
        opt.apply_gradients(zip([tf.constant(g) for g in dense], variables))
        return opt, [v.numpy() for v in variables]

    _, want = run(base, False)
    opt, got = run(_recording_subclass(base, "_resource_apply_dense"), True)
    assert len(opt.recorded) == len(init)
    assert [value.numpy().tobytes() for _, value in opt.recorded] == [w.tobytes() for w in want]
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


@pytest.mark.parametrize("rule", sorted(dict(rules.front_end_specs("KERAS"))))
def test_keras_subclass_update_step_override_runs_for_every_variable(rule):
    from fusedopt import keras as fkeras
    spec = dict(rules.front_end_specs("KERAS"))[rule]
    base = getattr(fkeras, spec.name)
    kwargs = dict(npref.ORACLES[rule].KERAS_KWARGS, learning_rate=0.05)
    init, dense, _, _ = problem()

    class Recording(base):
        def update_step(self, gradient, variable, learning_rate=None):
            self.calls.append(variable)
            return (super().update_step(gradient, variable) if learning_rate is None
                    else super().update_step(gradient, variable, learning_rate))

    def run(cls):
        variables = [tf.Variable(x) for x in init]
        opt = cls(**kwargs)
        opt.calls = []
        opt.apply_gradients(zip([tf.constant(g) for g in dense], variables))
        return opt, [v.numpy() for v in variables]

    _, want = run(base)
    opt, got = run(Recording)
    assert len(opt.calls) == len(init)  # grouping did not bypass the override
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


@pytest.mark.parametrize("rule", _legacy_rules())
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_keras2_per_variable_methods_in_a_v1_graph(rule, sparse):
    """Keras 2's _resource_apply_dense/_sparse called by a wrapper on a compat.v1 graph: the
    variable read after the returned op is the updated one."""
    legacy = _legacy()
    spec = dict(rules.front_end_specs("LEGACY"))[rule]
    kwargs = dict(npref.ORACLES[rule].LEGACY_KWARGS, learning_rate=0.05)
    init, dense, indices, values = problem()

    def graph_run(direct):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            var = tf.compat.v1.Variable(init[0], use_resource=True)
            opt = getattr(legacy, spec.name)(**kwargs)
            if direct:
                opt._create_all_weights([var])
                state = opt._prepare([var])
                if sparse:
                    op = opt._resource_apply_sparse_duplicate_indices(
                        tf.constant(values[0]), var, tf.constant(indices), apply_state=state)
                else:
                    op = opt._resource_apply_dense(tf.constant(dense[0]), var,
                                                   apply_state=state)
                with tf.control_dependencies([op]):
                    read = tf.identity(var.read_value())
            else:
                grad = grads_of(sparse, dense, indices, values)[0]
                with tf.control_dependencies([opt.apply_gradients([(grad, var)])]):
                    read = tf.identity(var.read_value())
            sess.run(tf.compat.v1.global_variables_initializer())
            return sess.run(read)

    got, want = graph_run(True), graph_run(False)
    assert got.tobytes() == want.tobytes()
    assert not np.array_equal(got, init[0])


# --- slot creation replaced: compact slots that cannot take effect ---------------------


def _ignored_option_warnings(caught):
    return [w for w in caught if issubclass(w.category, fusedopt.IgnoredOptionWarning)]


def test_compat_v1_replaced_slot_creation_warns_once_and_trains():
    init, dense, _, _ = problem()
    variables = [tf.Variable(x) for x in init]
    opt = fv1.AdagradOptimizer(0.1, slot_dtype="bfloat16")
    base = tf.compat.v1.train.Optimizer

    # As a wrapping library does: its own slot makers (which ignore the dtype asked for).
    def make_slot(var, initializer, shape, dtype, slot_name, op_name):
        return base._get_or_make_slot_with_initializer(opt, var, initializer, shape,
                                                       var.dtype.base_dtype, slot_name, op_name)

    opt._get_or_make_slot_with_initializer = make_slot
    reference = fv1.AdagradOptimizer(0.1)
    twins = [tf.Variable(x) for x in init]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            opt.apply_gradients(zip([tf.constant(g) for g in dense], variables))
            reference.apply_gradients(zip([tf.constant(g) for g in dense], twins))
    (warning,) = _ignored_option_warnings(caught)
    assert "slot_dtype='bfloat16' has no effect" in str(warning.message)
    assert "float32" in str(warning.message)
    assert opt.get_slot(variables[0], "accumulator").dtype == tf.float32
    assert [v.numpy().tobytes() for v in variables] == [t.numpy().tobytes() for t in twins]


def test_compat_v1_compact_slots_do_not_warn():
    init, dense, _, _ = problem()
    variables = [tf.Variable(x) for x in init]
    opt = fv1.AdagradOptimizer(0.1, slot_dtype="bfloat16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.apply_gradients(zip([tf.constant(g) for g in dense], variables))
    assert not _ignored_option_warnings(caught)
    assert opt.get_slot(variables[0], "accumulator").dtype == tf.bfloat16


def test_keras_replaced_slot_creation_warns_once():
    from fusedopt import keras as fkeras
    init, dense, _, _ = problem()
    variables = [tf.Variable(x) for x in init]
    opt = fkeras.Adagrad(0.1, slot_dtype="bfloat16")
    keras_base = tf.keras.optimizers.Optimizer

    def add_variable_from_reference(*args, **kwargs):  # the base's: the reference's dtype
        return keras_base.add_variable_from_reference(opt, *args, **kwargs)

    opt.add_variable_from_reference = add_variable_from_reference
    _train_twice_warns_once(opt, variables, dense)
    assert opt.get_config()["slot_dtype"] == "bfloat16"


def _train_twice_warns_once(opt, variables, dense):
    """Two steps: one IgnoredOptionWarning about slot_dtype."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            opt.apply_gradients(zip([tf.constant(g) for g in dense], variables))
    (warning,) = _ignored_option_warnings(caught)
    assert "slot_dtype='bfloat16' has no effect" in str(warning.message)


def test_keras2_replaced_add_slot_warns_once():
    legacy = _legacy()
    init, dense, _, _ = problem()
    variables = [tf.Variable(x) for x in init]
    opt = legacy.Adagrad(0.1, slot_dtype="bfloat16")
    base = legacy._legacy.Optimizer

    def add_slot(var, slot_name, initializer="zeros", shape=None):
        return base.add_slot(opt, var, slot_name, initializer, shape)

    opt.add_slot = add_slot
    _train_twice_warns_once(opt, variables, dense)
