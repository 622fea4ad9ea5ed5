"""Member packs (fusedopt._packs): the packed group ops and what keeps them correct.

* Numbers: ``resource_packed_group_apply_<rule>`` equals the list group op bit for bit
  (every rule x dtype x option set; eager and tf.function).
* Bad input (a pack of the wrong size, a handle that is not a pack, a member passed twice,
  a bad shape, an uninitialized member) is an error that names it and writes nothing.
* Order: inside a tf.function, reads of a member (variable or slot) before the op see the
  old value and reads after it the new one: directly, through tf.cond, tf.while_loop and
  nested tf.functions, and in Keras 3's gradient accumulation (a cond in the optimizer).
  The op's graph shows the control edges, so the check cannot pass by luck of scheduling.
* Where packs are not used: XLA (the list op), tf.distribute (Keras's per-replica path).
* SavedModel: a saved training step that captured a pack loads and trains on, with the
  same numbers; checkpoints do not contain packs (restore with assert_consumed).
"""
import numpy as np
import pytest
import tensorflow as tf

import fusedopt.ops as fops
from fusedopt import _dispatch, _pack_registry, _packs
import harness
import numpy_reference as npref

RULES = npref.RULES
SHAPES = [(7, 5), (64,), (3, 1, 2), (0, 4), (1,), (2100,)]
PACKED = "FusedOpt>ResourcePackedGroupApply"


def _state_vars(rule, dtype, seed=1, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    states = [harness.make_state(rule, shape, dtype, rng) for shape in shapes]
    return [[tf.Variable(v)] + [tf.Variable(s) for s in slots] for v, slots in states]


def _flat(variables):
    """Every var, then each slot's variables: the pack's member order."""
    n = len(variables[0])
    return [group[k] for k in range(n) for group in variables]


def _hyper(rule, dtype, t):
    tf_dtype = harness.TF_DTYPES[dtype]
    return {k: tf.constant(x, tf_dtype) for k, x in harness.hyper_for(rule, dtype, t).items()}


def _bytes(variables):
    return [x.numpy().tobytes() for group in variables for x in group]


def _packed_op(rule):
    return getattr(fops, "resource_packed_group_apply_" + rule)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("rule,options", harness.RULE_OPTIONS, ids=harness.param_ids)
def test_packed_equals_list_group_op(rule, options, dtype, mode):
    packed, listed = _state_vars(rule, dtype), _state_vars(rule, dtype)
    pack = fops.variable_pack(_flat(packed))
    n_slots = len(RULES[rule]["slots"])
    hyper_names = RULES[rule]["hyper"]

    def packed_step(grads, hyper):
        _packed_op(rule)(pack, *[hyper[h] for h in hyper_names], grads, **options)

    def list_step(grads, hyper):
        getattr(fops, "resource_group_apply_" + rule)(
            [v[0] for v in listed], *[[v[1 + k] for v in listed] for k in range(n_slots)],
            *[hyper[h] for h in hyper_names], grads, **options)
    if mode == "function":
        packed_step, list_step = tf.function(packed_step), tf.function(list_step)
    rng = np.random.default_rng(2)
    for t in range(1, 4):
        grads = [tf.constant(harness.make_grad(v[0].shape, dtype, rng)) for v in packed]
        packed_step(grads, _hyper(rule, dtype, t))
        list_step(grads, _hyper(rule, dtype, t))
        assert _bytes(packed) == _bytes(listed), f"step {t}"
    assert not all(np.array_equal(a, b) for a, b in zip(
        _bytes(packed), _bytes(_state_vars(rule, dtype)))), "nothing was updated"


# --- bad input: an error naming it, nothing written -------------------------------------

def _adam_hyper():
    return dict(beta1_power=0.9, beta2_power=0.999, lr=0.1, beta1=0.9, beta2=0.999,
                epsilon=1e-7)


def _expect_error(fn, error, pattern, variables):
    before = _bytes(variables)
    with pytest.raises(error, match=pattern):
        fn()
    assert _bytes(variables) == before


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_bad_input_named_and_nothing_written(mode):
    variables = _state_vars("lazy_adam", "float", shapes=[(3, 2), (4,)])
    pack = fops.variable_pack(_flat(variables))
    grads = [tf.ones((3, 2)), tf.ones((4,))]

    def run(fn):
        if mode == "eager":
            return fn

        @tf.function
        def step():
            fn()  # returns nothing: the op
        return step
    op = fops.resource_packed_group_apply_lazy_adam
    _expect_error(run(lambda: op(pack, grad=grads[:1], **_adam_hyper())),
                  tf.errors.InvalidArgumentError,
                  r"the pack holds 6 variables but 1 gradients need 3", variables)
    _expect_error(run(lambda: op(pack, grad=[tf.ones((3, 2)), tf.ones((5,))], **_adam_hyper())),
                  tf.errors.InvalidArgumentError,
                  r"variable 1 of 2: grad must have the same shape as var", variables)
    # Not a pack: the kernel refuses it; in a function it is refused when traced (its
    # members could not be ordered).
    _expect_error(run(lambda: op(variables[0][0].handle, grad=grads[:1], **_adam_hyper())),
                  tf.errors.InvalidArgumentError if mode == "eager" else ValueError,
                  r"is not a fusedopt member pack" if mode == "eager" else
                  r"needs a pack made by ops.variable_pack", variables)
    # The packed op's hyper-parameters are checked when the graph is built, too.
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="must be a scalar"):
        run(lambda: op(pack, grad=grads, **{**_adam_hyper(), "lr": [0.1, 0.2]}))()
    assert _bytes(variables) == _bytes(_state_vars("lazy_adam", "float", shapes=[(3, 2), (4,)]))


def test_pack_rejects_a_variable_twice_and_python_misuse():
    a, b = tf.Variable([1.0]), tf.Variable([2.0])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"members\[0\] and members\[2\] are the same variable"):
        fops.variable_pack([a, b, a])
    with pytest.raises(ValueError, match="members is empty"):
        fops.variable_pack([])
    with pytest.raises(TypeError, match="must be a list"):
        fops.variable_pack(a)
    with pytest.raises(TypeError, match="pass the tf.Variable itself|resource tf.Variable"):
        fops.variable_pack([tf.constant([1.0])])


def test_uninitialized_member_fails_precondition_then_works_once_assigned():
    from tensorflow.python.ops import resource_variable_ops

    var = resource_variable_ops.UninitializedVariable(shape=[2], dtype=tf.float32)
    m, v = tf.Variable([0.0, 0.0]), tf.Variable([0.0, 0.0])
    pack = fops.variable_pack([var, m, v])
    op = fops.resource_packed_group_apply_lazy_adam
    with pytest.raises(tf.errors.FailedPreconditionError, match=r"uninitialized variable: var\[0\]"):
        op(pack, grad=[tf.ones(2)], **_adam_hyper())
    assert m.numpy().tolist() == [0.0, 0.0]
    var.assign([1.0, 1.0])
    op(pack, grad=[tf.ones(2)], **_adam_hyper())
    assert (var.numpy() < 1.0).all() and (m.numpy() > 0).all()


def test_pack_as_function_argument_refused():
    variables = _state_vars("lazy_adam", "float", shapes=[(2,)])
    pack = fops.variable_pack(_flat(variables))

    @tf.function
    def step(p):
        fops.resource_packed_group_apply_lazy_adam(p, grad=[tf.ones(2)], **_adam_hyper())
    with pytest.raises(ValueError, match="not one passed in as an argument"):
        step(pack)


# --- order inside functions ---------------------------------------------------------------

def _ordering_case(wrap):
    """A function reading every member before and after one packed update (inside `wrap`);
    returns (before, after, expected after, graph)."""
    variables = _state_vars("lazy_adam", "float", shapes=[(3, 2), (4,)])
    flat = _flat(variables)
    pack = fops.variable_pack(flat)
    grads = [tf.constant(np.full(v[0].shape, 0.5, np.float32)) for v in variables]
    reference = _state_vars("lazy_adam", "float", shapes=[(3, 2), (4,)])
    fops.resource_group_apply_lazy_adam([r[0] for r in reference], [r[1] for r in reference],
                                        [r[2] for r in reference], grad=grads, **_adam_hyper())

    def update():
        fops.resource_packed_group_apply_lazy_adam(pack, grad=grads, **_adam_hyper())

    @tf.function
    def step():
        before = [x.read_value() for x in flat]
        wrap(update)
        after = [x.read_value() for x in flat]
        return before, after
    before, after = step()
    original = _state_vars("lazy_adam", "float", shapes=[(3, 2), (4,)])
    for got, want in zip(before, _flat(original)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    for got, want in zip(after, _flat(reference)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    return step.get_concrete_function().graph


def _control_path(graph, start_types, end):
    """Whether op `end` depends (data or control edges) on an op whose type starts with
    one of `start_types`."""
    seen, stack = set(), [end]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if op is not end and op.type.startswith(start_types):
            return True
        stack.extend(op.control_inputs)
        stack.extend(t.op for t in op.inputs)
    return False


def _one_step(update):
    update()


def _in_cond(update):
    tf.cond(tf.constant(True), lambda: (update(), tf.constant(0))[1], lambda: tf.constant(1))


def _in_while(update):
    for _ in tf.range(1):
        update()


def _in_nested_function(update):
    tf.function(update)()


@pytest.mark.parametrize("wrap", [_one_step, _in_cond, _in_while, _in_nested_function],
                         ids=["plain", "cond", "while", "nested_function"])
def test_reads_before_and_after_are_ordered(wrap):
    graph = _ordering_case(wrap)
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp"]
    assert len(reads) == 12
    update_types = (PACKED, "If", "StatelessIf", "While", "StatelessWhile",
                    "PartitionedCall", "StatefulPartitionedCall")
    # The six reads after the update depend on it; the six before do not.
    ordered = [_control_path(graph, update_types, op) for op in reads]
    assert sorted(ordered) == [False] * 6 + [True] * 6, ordered


@pytest.mark.parametrize("wrap", [_one_step, _in_cond, _in_while, _in_nested_function],
                         ids=["plain", "cond", "while", "nested_function"])
def test_ordering_would_fail_without_the_resolver(wrap, monkeypatch):
    """The check above can fail: with the resolver blind (no pack has known members), no
    read is ordered after the update (the pack hides the members from TF)."""
    monkeypatch.setattr(_pack_registry, "pack_members", lambda pack: [])
    variables = _state_vars("lazy_adam", "float", shapes=[(2,)])
    flat = _flat(variables)
    pack = fops.variable_pack(flat)

    def update():
        fops.resource_packed_group_apply_lazy_adam(pack, grad=[tf.ones(2)], **_adam_hyper())

    @tf.function
    def step():
        wrap(update)
        return [x.read_value() for x in flat]
    graph = step.get_concrete_function().graph
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp"]
    update_types = (PACKED, "If", "StatelessIf", "While", "StatelessWhile",
                    "PartitionedCall", "StatefulPartitionedCall")
    assert len(reads) == 3 and not any(_control_path(graph, update_types, op) for op in reads)


# --- the Keras 3 classes -------------------------------------------------------------------

KERAS3 = hasattr(tf.keras.optimizers.Optimizer, "_distributed_tf_update_step")
keras3_only = pytest.mark.skipif(not KERAS3, reason="Keras 3's grouped update (TF >= 2.16)")


def _model_variables(seed):
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.uniform(-1, 1, s).astype(np.float32))
            for s in [(8, 8), (8,), (4, 8), (4,)] * 3]


def _grads(variables, step):
    rng = np.random.default_rng(100 + step)
    return [tf.constant(rng.uniform(-1, 1, v.shape).astype(np.float32)) for v in variables]


def _keras_run(name="LazyAdam", packs=True, jit=False, steps=4, monkeypatch=None, **kwargs):
    import fusedopt.keras

    if not packs:
        monkeypatch.setattr(_packs, "packable", lambda variables: False)
    variables = _model_variables(0)
    opt = getattr(fusedopt.keras, name)(learning_rate=0.01, **kwargs)

    @tf.function(jit_compile=jit)
    def step(grads):
        opt.apply_gradients(zip(grads, variables))
        # Read right after the update: must see it.
        return [tf.identity(v) for v in variables] + [tf.identity(v) for v in opt.variables]
    for t in range(steps):
        seen = step(_grads(variables, t))
    state = [v.numpy() for v in variables] + [v.numpy() for v in opt.variables]
    for a, b in zip(seen, state):
        np.testing.assert_array_equal(a.numpy(), b)
    graph = step.get_concrete_function(_grads(variables, 0)).graph
    types = {op.type for op in graph.get_operations()}
    for f in graph._functions.values():
        types.update(op.type for op in f.graph.get_operations())
    if not packs:
        monkeypatch.undo()
    return state, types


@keras3_only
@pytest.mark.parametrize("name,kwargs", [
    ("LazyAdam", {}), ("Adamax", {}), ("Adagrad", {}), ("RMSprop", {"momentum": 0.5}),
    ("LazyAdam", {"gradient_accumulation_steps": 2}),
    ("LazyAdam", {"use_ema": True, "ema_overwrite_frequency": 2, "weight_decay": 0.01})],
    ids=str)
def test_keras3_step_packed_identical_and_read_after_sees_it(name, kwargs, monkeypatch):
    expected, list_types = _keras_run(name, packs=False, monkeypatch=monkeypatch, **kwargs)
    got, types = _keras_run(name, **kwargs)
    assert any(t.startswith(PACKED) for t in types), sorted(types)
    assert not any(t.startswith(PACKED) for t in list_types)
    assert [x.tobytes() for x in got] == [x.tobytes() for x in expected]


@keras3_only
def test_keras3_under_xla_uses_the_list_op():
    _, types = _keras_run(jit=True)
    assert "FusedOpt>ResourceGroupApplyLazyAdam" in types
    assert not any(t.startswith(PACKED) or t == _pack_registry.PACK_OP for t in types)


@keras3_only
def test_keras3_pack_reused_across_traces_and_bounded(monkeypatch):
    import fusedopt.keras

    variables = _model_variables(0)
    opt = fusedopt.keras.LazyAdam(0.01)
    step = tf.function(lambda grads: opt.apply_gradients(zip(grads, variables)))
    step(_grads(variables, 0))
    step(_grads(variables, 1))
    assert len(opt._fused_packs().packs()) == 1
    monkeypatch.setattr(_packs, "MAX_PACKS", 2)
    for k in range(1, 5):  # a different subset each time: a pack each, two kept
        subset = variables[:k]
        opt.apply_gradients(zip(_grads(subset, k), subset))
    assert len(opt._fused_packs().packs()) == 2


def test_packs_not_used_under_a_strategy_or_in_v1_graphs():
    from fusedopt.compat import v1 as compat_v1  # noqa: F401 - imports the front ends

    variables = [tf.Variable([1.0])]
    assert _packs.packable(variables)
    with tf.Graph().as_default():
        graph_var = tf.compat.v1.Variable([1.0], use_resource=True)
        assert not _packs.packable([graph_var])
    updates = [(variables[0], [tf.Variable([0.0]), tf.Variable([0.0])], tf.ones(1))]
    cache = _packs.PackCache()
    _dispatch.apply_group("lazy_adam", updates, lambda v: _adam_hyper(), packs=cache)
    assert len(cache.packs()) == 1


@keras3_only
def test_keras3_savedmodel_with_a_packed_step_loads_and_trains_on(tmp_path):
    import fusedopt.keras

    harness.check_savedmodel_of_a_packed_step(
        tmp_path, lambda: _model_variables(3), lambda: fusedopt.keras.LazyAdam(0.01),
        lambda opt, variables: opt.build(variables))


@keras3_only
def test_checkpoints_hold_no_packs(tmp_path):
    import fusedopt.keras

    variables = _model_variables(4)
    opt = fusedopt.keras.LazyAdam(0.01)
    tf.function(lambda g: opt.apply_gradients(zip(g, variables)))(_grads(variables, 0))
    assert opt._fused_packs().packs()
    path = tf.train.Checkpoint(opt=opt, v=variables).save(str(tmp_path / "ckpt"))
    fresh_vars = _model_variables(5)
    fresh = fusedopt.keras.LazyAdam(0.01)
    fresh.build(fresh_vars)
    tf.train.Checkpoint(opt=fresh, v=fresh_vars).restore(path).assert_consumed()
    for a, b in zip(fresh.variables, opt.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
