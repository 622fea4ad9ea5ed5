"""Every fusedopt TF op (four per rule, and the group ops) against the NumPy float64
reference and TF's own training ops.

Every op family x dtype x index dtype x variable kind (ref variables in a v1 graph +
Session, resource variables eager, in tf.function and in a v1 graph + Session), several
steps each, var and every slot checked after each step.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import fusedopt
import fusedopt.ops as fops
import harness
import numpy_reference as npref

RULES = npref.RULES
RULE_NAMES = sorted(RULES)
# The non-default option combinations of every rule (from its oracle's OPTION_SETS).
OPTION_SETS = [(rule, options) for rule, options in harness.RULE_OPTIONS if options]
OP_TYPE_RULE = {rule: fops.RULES[rule]["op_name"] for rule in RULES}


def _ids(val):
    if isinstance(val, dict):
        return "-".join("%s=%s" % kv for kv in sorted(val.items())) or "defaults"
    return None


def wrapper(rule, sparse, resource):
    return getattr(fops, "%s%sapply_%s" % ("resource_" if resource else "",
                                          "sparse_" if sparse else "", rule))


def op_args(rule, var, slots, grad, indices, hyper):
    args = [var] + list(slots) + [hyper[h] for h in RULES[rule]["hyper"]] + [grad]
    return args + ([indices] if indices is not None else [])


def update_fn(rule, options=None, **kwargs):
    """harness update function calling the fusedopt op that fits the mode."""
    options = dict(options or {}, **kwargs)

    def fn(var, slots, grad, indices, hyper, mode):
        f = wrapper(rule, indices is not None, resource=(mode != "graph_ref"))
        return f(*op_args(rule, var, slots, grad, indices, hyper), **options)
    return fn


# --- interface ---------------------------------------------------------------------

def _spec_keys(rules):
    return {r: {k: d[k] for k in ("slots", "hyper", "options", "slot_layouts")} for r, d in rules.items()}


def test_rules_table():
    assert _spec_keys(fops.RULES) == RULES


@pytest.mark.parametrize("resource", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_wrapper_signatures(rule, sparse, resource):
    spec = RULES[rule]
    params = inspect.signature(wrapper(rule, sparse, resource)).parameters
    expected = (["var"] + spec["slots"] + spec["hyper"] + ["grad"]
                + (["indices"] if sparse else []) + ["use_locking"] + list(spec["options"])
                + ["name", "stochastic_rounding", "rounding_seed"]
                + (["every_row"] if sparse else []))
    assert list(params) == expected
    assert params["use_locking"].default is False
    assert params["name"].default is None
    # compact slots' rounding: keyword only, after everything positional as before
    assert params["stochastic_rounding"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["stochastic_rounding"].default is False
    assert params["rounding_seed"].kind is inspect.Parameter.KEYWORD_ONLY
    assert params["rounding_seed"].default is None
    if sparse:  # every row updated (the others with a zero gradient): keyword only
        assert params["every_row"].kind is inspect.Parameter.KEYWORD_ONLY
        assert params["every_row"].default is False
    for opt, default in spec["options"].items():
        assert params[opt].default is default


@pytest.mark.parametrize("resource", [False, True])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_registered_op_types_and_attrs(rule, sparse, resource):
    with tf.Graph().as_default():
        var, slots = harness.make_state(rule, (4, 2), "float", np.random.default_rng(0))
        vs = [tf.compat.v1.Variable(x, use_resource=resource) for x in [var] + slots]
        indices = tf.constant([1, 2], tf.int64) if sparse else None
        grad = tf.ones([2, 2] if sparse else [4, 2])
        out = wrapper(rule, sparse, resource)(
            *op_args(rule, vs[0], vs[1:], grad, indices, harness.hyper_for(rule, "float", 1)),
            name="my_update")
        op = out if isinstance(out, tf.Operation) else out.op
        assert op.type == "FusedOpt>%s%sApply%s" % ("Resource" if resource else "",
                                                   "Sparse" if sparse else "",
                                                   OP_TYPE_RULE[rule])
        assert "my_update" in op.name
        assert op.get_attr("T") == tf.float32
        assert op.get_attr("use_locking") is False
        if sparse:
            assert op.get_attr("Tindices") == tf.int64
        for opt, default in RULES[rule]["options"].items():
            assert op.get_attr(opt) is default
        if resource:
            assert len(op.outputs) == 0
        else:
            assert len(op.outputs) == 1 and op.outputs[0].dtype == tf.float32._as_ref


# --- numerics vs the NumPy reference, every family/dtype/index dtype/variable kind ------

KINDS = ["dense", "sparse_int32", "sparse_int64"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("rule", RULE_NAMES)
@pytest.mark.parametrize("mode", harness.MODES)
def test_matches_numpy_reference(mode, rule, dtype, kind):
    sparse = kind != "dense"
    harness.check_steps(mode, rule, dtype, update_fn(rule), sparse=sparse,
                        index_dtype=harness.INDEX_DTYPES.get(kind[7:], np.int32),
                        check_output=(mode == "graph_ref"))


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("mode", ["graph_ref", "eager"])
@pytest.mark.parametrize("rule,options", OPTION_SETS, ids=_ids)
def test_options(rule, options, mode, sparse, dtype):
    harness.check_steps(mode, rule, dtype, update_fn(rule, options), sparse=sparse,
                        options=options, check_output=(mode == "graph_ref"))


@pytest.mark.parametrize("dtype", ["half", "float"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_use_locking(rule, dtype):
    harness.check_steps("graph_ref", rule, dtype, update_fn(rule, use_locking=True),
                        check_output=True)
    harness.check_steps("eager", rule, dtype, update_fn(rule, use_locking=True),
                        sparse=True)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("mode", ["graph_ref", "eager"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_rank3(rule, mode, sparse):
    harness.check_steps(mode, rule, "float", update_fn(rule), sparse=sparse,
                        shape=(5, 2, 3), n_indices=7, check_output=(mode == "graph_ref"))


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_large_shapes(rule, sparse):
    # Big enough that a kernel sharding work across threads splits it.
    harness.check_steps("eager", rule, "float", update_fn(rule), sparse=sparse,
                        shape=(3001, 67), n_indices=5000, steps=2)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("dtype", ["half", "float"])
def test_hyper_parameters_cast_to_var_dtype(dtype, sparse):
    rule = "lazy_adam"
    rng = np.random.default_rng(7)
    var, slots = harness.make_state(rule, (5, 3), dtype, rng)
    indices = np.array([3, 0, 3], np.int32) if sparse else None
    grad = harness.make_grad((3, 3) if sparse else (5, 3), dtype, rng)
    hyper = harness.hyper_for(rule, dtype, 2)
    results = []
    for h in [hyper, {k: tf.constant(v, tf.float64) for k, v in hyper.items()},
              {k: tf.constant(v, harness.TF_DTYPES[dtype]) for k, v in hyper.items()}]:
        vs = [tf.Variable(x) for x in [var] + slots]
        wrapper(rule, sparse, True)(*op_args(rule, vs[0], vs[1:], grad, indices, h))
        results.append([v.numpy().tobytes() for v in vs])
    assert results[0] == results[1] == results[2]
    assert results[0][0] != var.tobytes()


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("dtype", ["half", "bfloat16"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_low_precision_rounds_once(rule, dtype, sparse):
    # half/bfloat16 compute in float32 and round once: within ~1 ulp of the exact result.
    rng = np.random.default_rng(8)
    var, slots = harness.make_state(rule, (64, 16), dtype, rng)
    vs = [tf.Variable(x) for x in [var] + slots]
    for t in range(1, 4):
        hyper = harness.hyper_for(rule, dtype, t)
        before = [v.numpy() for v in vs]
        if sparse:
            indices = rng.integers(0, 64, 100).astype(np.int32)
            grad = harness.make_grad((100, 16), dtype, rng)
            exp = npref.sparse_update(rule, before[0], before[1:], grad, indices, hyper)
        else:
            indices = None
            grad = harness.make_grad((64, 16), dtype, rng)
            exp = npref.dense_update(rule, before[0], before[1:], grad, hyper)
        wrapper(rule, sparse, True)(*op_args(rule, vs[0], vs[1:], grad, indices, hyper))
        for v, e, b in zip(vs, [exp[0]] + exp[1], before):
            npref.assert_rounded_once(v.numpy(), e, dtype, scale=b,
                                      err_msg="%s step %d" % (v.name, t))


# --- sparse semantics ------------------------------------------------------------------

def _run_once(rule, resource, var, slots, grad, indices, hyper, sparse=True):
    """One op call on fresh variables; returns ([var, *slots] arrays, op output or None)."""
    if resource:
        vs = [tf.Variable(x) for x in [var] + slots]
        out = wrapper(rule, sparse, True)(*op_args(rule, vs[0], vs[1:], grad, indices, hyper))
        assert out is None or isinstance(out, tf.Operation)
        return [v.numpy() for v in vs], None
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        vs = [tf.compat.v1.Variable(x, use_resource=False) for x in [var] + slots]
        out = wrapper(rule, sparse, False)(*op_args(rule, vs[0], vs[1:], tf.constant(grad),
                                                    None if indices is None
                                                    else tf.constant(indices), hyper))
        sess.run(tf.compat.v1.global_variables_initializer())
        fetched = sess.run(out)
        return sess.run(vs), fetched


@pytest.mark.parametrize("resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_duplicates_equal_presummed(rule, dtype, index_dtype, resource):
    rng = np.random.default_rng(11)
    var, slots = harness.make_state(rule, (6, 4), dtype, rng)
    indices = np.array([4, 1, 4, 4, 0, 1, 3, 4], harness.INDEX_DTYPES[index_dtype])
    grad = harness.make_grad((8, 4), dtype, rng)
    hyper = harness.hyper_for(rule, dtype, 1)
    g2, i2 = harness.presum(grad, indices)
    assert len(i2) == 4
    dup, _ = _run_once(rule, resource, var, slots, grad, indices, hyper)
    pre, _ = _run_once(rule, resource, var, slots, g2, i2, hyper)
    for name, a, b, before in zip(["var"] + RULES[rule]["slots"], dup, pre, [var] + slots):
        if dtype in ("float", "double"):
            assert a.tobytes() == b.tobytes(), name
        else:
            npref.assert_close(a, b, dtype, name)
        assert a[[2, 5]].tobytes() == before[[2, 5]].tobytes(), name
        for row in [0, 1, 3, 4]:
            assert a[row].tobytes() != before[row].tobytes(), (name, row)
    # and the duplicate-summed result is the NumPy reference's
    exp_var, exp_slots = npref.sparse_update(rule, var, slots, grad, indices, hyper)
    for a, e in zip(dup, [exp_var] + exp_slots):
        npref.assert_close(a, e, dtype)


@pytest.mark.parametrize("resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_empty_indices_is_noop(rule, dtype, index_dtype, resource):
    rng = np.random.default_rng(12)
    var, slots = harness.make_state(rule, (5, 3), dtype, rng)
    grad = np.zeros((0, 3), harness.np_dtype(dtype))
    indices = np.zeros((0,), harness.INDEX_DTYPES[index_dtype])
    after, out = _run_once(rule, resource, var, slots, grad, indices,
                           harness.hyper_for(rule, dtype, 1))
    for a, b in zip(after, [var] + slots):
        assert a.tobytes() == b.tobytes()
    if not resource:
        assert out.tobytes() == var.tobytes()


@pytest.mark.parametrize("rule", RULE_NAMES)
def test_single_row_touched_leaves_everything_else_bitwise(rule):
    rng = np.random.default_rng(13)
    var, slots = harness.make_state(rule, (50, 8), "float", rng)
    grad = harness.make_grad((1, 8), "float", rng)
    after, _ = _run_once(rule, True, var, slots, grad, np.array([37], np.int64),
                         harness.hyper_for(rule, "float", 1))
    for a, b in zip(after, [var] + slots):
        assert np.delete(a, 37, 0).tobytes() == np.delete(b, 37, 0).tobytes()
    assert after[0][37].tobytes() != var[37].tobytes()


# --- ref ops return the updated ref ---------------------------------------------------

@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_ref_op_returns_the_ref(rule, sparse):
    rng = np.random.default_rng(14)
    var, slots = harness.make_state(rule, (4, 3), "double", rng)
    h1, h2 = harness.hyper_for(rule, "double", 1), harness.hyper_for(rule, "double", 2)
    g1 = harness.make_grad((3, 3) if sparse else (4, 3), "double", rng)
    g2 = harness.make_grad((3, 3) if sparse else (4, 3), "double", rng)
    idx = np.array([2, 0, 2], np.int32) if sparse else None
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        vs = [tf.compat.v1.Variable(x, use_resource=False) for x in [var] + slots]
        f = wrapper(rule, sparse, False)
        out1 = f(*op_args(rule, vs[0], vs[1:], g1, idx, h1))
        assert out1.dtype == tf.float64._as_ref
        # Chaining through the returned ref updates the same variable twice.
        out2 = f(*op_args(rule, out1, vs[1:], g2, idx, h2))
        sess.run(tf.compat.v1.global_variables_initializer())
        fetched = sess.run(out2)
        got = sess.run(vs)
    exp = npref.sparse_update(rule, var, slots, g1, idx, h1) if sparse else \
        npref.dense_update(rule, var, slots, g1, h1)
    exp = npref.sparse_update(rule, exp[0], exp[1], g2, idx, h2) if sparse else \
        npref.dense_update(rule, exp[0], exp[1], g2, h2)
    npref.assert_close(fetched, exp[0], "double")
    assert fetched.tobytes() == got[0].tobytes()
    for a, e in zip(got, [exp[0]] + exp[1]):
        npref.assert_close(a, e, "double")


# --- against TensorFlow's own training kernels ------------------------------------------

def _tf_step(case, vs, grad, hyper, indices):
    h = {k: tf.constant(v, vs[0].dtype) for k, v in hyper.items()}
    r = tf.raw_ops
    if case in ("adam", "adam_nesterov"):
        r.ResourceApplyAdam(var=vs[0].handle, m=vs[1].handle, v=vs[2].handle,
                            beta1_power=h["beta1_power"], beta2_power=h["beta2_power"],
                            lr=h["lr"], beta1=h["beta1"], beta2=h["beta2"],
                            epsilon=h["epsilon"], grad=grad,
                            use_nesterov=case == "adam_nesterov")
    elif case == "adamax":
        r.ResourceApplyAdaMax(var=vs[0].handle, m=vs[1].handle, v=vs[2].handle,
                              beta1_power=h["beta1_power"], lr=h["lr"], beta1=h["beta1"],
                              beta2=h["beta2"], epsilon=h["epsilon"], grad=grad)
    elif case.startswith("adagrad_v2"):
        r.ResourceApplyAdagradV2(var=vs[0].handle, accum=vs[1].handle, lr=h["lr"],
                                 epsilon=h["epsilon"], grad=grad,
                                 update_slots=not case.endswith("noslots"))
    elif case.startswith("adagrad_v1"):
        r.ResourceApplyAdagrad(var=vs[0].handle, accum=vs[1].handle, lr=h["lr"], grad=grad,
                               update_slots=not case.endswith("noslots"))
    elif case.startswith("sparse_adagrad_v2"):
        r.ResourceSparseApplyAdagradV2(var=vs[0].handle, accum=vs[1].handle, lr=h["lr"],
                                       epsilon=h["epsilon"], grad=grad, indices=indices,
                                       update_slots=not case.endswith("noslots"))
    else:
        raise AssertionError(case)


TF_CASES = {  # case -> (rule, options, sparse)
    "adam": ("lazy_adam", {}, False),
    "adam_nesterov": ("lazy_adam", {"use_nesterov": True}, False),
    "adamax": ("adamax", {}, False),
    "adagrad_v2": ("adagrad", {}, False),
    "adagrad_v2_noslots": ("adagrad", {"update_slots": False}, False),
    "adagrad_v1": ("adagrad", {}, False),
    "adagrad_v1_noslots": ("adagrad", {"update_slots": False}, False),
    "sparse_adagrad_v2": ("adagrad", {}, True),
    "sparse_adagrad_v2_noslots": ("adagrad", {"update_slots": False}, True),
}


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("case", sorted(TF_CASES))
def test_matches_tf_training_ops(case, dtype):
    rule, options, sparse = TF_CASES[case]
    rng = np.random.default_rng(15)
    var, slots = harness.make_state(rule, (9, 5), dtype, rng)
    ours = [tf.Variable(x) for x in [var] + slots]
    theirs = [tf.Variable(x) for x in [var] + slots]
    f = wrapper(rule, sparse, True)
    for t in range(1, 5):
        hyper = harness.hyper_for(rule, dtype, t)
        if case.startswith("adagrad_v1"):
            hyper["epsilon"] = 0.0
        indices = rng.choice(9, 6, replace=False).astype(np.int32) if sparse else None
        grad = harness.make_grad((6, 5) if sparse else (9, 5), dtype, rng)
        f(*op_args(rule, ours[0], ours[1:], grad, indices, hyper), **options)
        _tf_step(case, theirs, grad, {k: v for k, v in hyper.items()
                                      if not (case.startswith("adagrad_v1")
                                              and k == "epsilon")}, indices)
        for a, b in zip(ours, theirs):
            npref.assert_close(a.numpy(), b.numpy(), dtype, "%s step %d" % (case, t))


def test_load_library_is_idempotent():
    fops.load_library()
    fops.load_library()
    assert _spec_keys(fusedopt.ops.RULES) == RULES
