"""fusedopt.reference (composed TF ops) vs the NumPy reference, and the NumPy reference
itself vs TensorFlow's own training ops. Needs no custom-op library."""


import numpy as np
import pytest
import tensorflow as tf

import harness
import numpy_reference as npref
from fusedopt import reference

RULE_NAMES = sorted(npref.RULES)
RULE_OPTIONS = harness.RULE_OPTIONS
_ids = harness.param_ids


def update_fn(rule, options):
    def fn(var, slots, grad, indices, hyper, mode):
        if indices is None:
            return reference.apply_dense(rule, var, slots, grad, **hyper, **options)
        return reference.apply_sparse(rule, var, slots, grad, indices, **hyper, **options)
    return fn


def test_rules_table_matches_spec():
    assert {rule: {k: spec[k] for k in ("slots", "hyper", "options", "slot_layouts")}
            for rule, spec in reference.RULES.items()} == npref.RULES


@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("rule,options", RULE_OPTIONS, ids=_ids)
def test_pure_rule_functions(rule, options, dtype):
    rng = np.random.default_rng(1)
    var, slots = harness.make_state(rule, (4, 5), dtype, rng)
    grad = harness.make_grad((4, 5), dtype, rng)
    hyper = harness.hyper_for(rule, dtype, 2)
    tfd = harness.TF_DTYPES[dtype]
    fn = getattr(reference, rule)
    out = fn(tf.constant(var), *[tf.constant(s) for s in slots], tf.constant(grad),
             **{k: tf.constant(v, tfd) for k, v in hyper.items()}, **options)
    assert len(out) == 1 + len(slots)
    exp_var, exp_slots = npref.dense_update(rule, var, slots, grad, hyper, options)
    for got, exp in zip(out, [exp_var] + exp_slots):
        assert got.dtype == tfd
        npref.assert_close(got.numpy(), exp, dtype)
    # Python-number hyper-parameters are cast to the var dtype as well.
    out2 = fn(tf.constant(var), *[tf.constant(s) for s in slots], tf.constant(grad),
              **hyper, **options)
    for a, b in zip(out, out2):
        assert a.numpy().tobytes() == b.numpy().tobytes()


MODES = harness.MODES + ["jit"]


@pytest.mark.parametrize("dtype", harness.DTYPES)
@pytest.mark.parametrize("rule", RULE_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_apply_dense(mode, rule, dtype):
    harness.check_steps(mode, rule, dtype, update_fn(rule, {}), sparse=False)


# The index dtype is independent of the value dtype: int64 x 16-bit only under jit.
SPARSE_CASES = [(mode, rule, dtype, index_dtype)
                for mode in MODES for rule in RULE_NAMES for dtype in harness.DTYPES
                for index_dtype in ("int32", "int64")
                if not (index_dtype == "int64" and dtype in ("half", "bfloat16") and mode != "jit")]


@pytest.mark.parametrize("mode,rule,dtype,index_dtype", SPARSE_CASES)
def test_apply_sparse(mode, rule, dtype, index_dtype):
    harness.check_steps(mode, rule, dtype, update_fn(rule, {}), sparse=True,
                        index_dtype=harness.INDEX_DTYPES[index_dtype])


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("mode", ["eager", "jit", "graph_ref"])
@pytest.mark.parametrize("rule,options", RULE_OPTIONS, ids=_ids)
def test_options(rule, options, mode, sparse):
    harness.check_steps(mode, rule, "double", update_fn(rule, options), sparse=sparse,
                        options=options)


@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_rank3(rule, sparse, mode):
    harness.check_steps(mode, rule, "float", update_fn(rule, {}), sparse=sparse,
                        shape=(5, 2, 3), n_indices=6)


@pytest.mark.parametrize("dtype", ["float", "double"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_sparse_duplicates_equal_presummed(rule, dtype):
    rng = np.random.default_rng(3)
    var0, slots0 = harness.make_state(rule, (6, 4), dtype, rng)
    indices = np.array([4, 1, 4, 4, 0, 1, 3], np.int32)
    grad = harness.make_grad((7, 4), dtype, rng)
    hyper = harness.hyper_for(rule, dtype, 1)
    g2, i2 = harness.presum(grad, indices)
    results = []
    for g, i in [(grad, indices), (g2, i2)]:
        vs = [tf.Variable(x) for x in [var0] + slots0]
        reference.apply_sparse(rule, vs[0], vs[1:], g, i, **hyper)
        results.append([v.numpy().tobytes() for v in vs])
    assert results[0] == results[1]


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_sparse_empty_indices_is_noop(rule, jit):
    rng = np.random.default_rng(4)
    var0, slots0 = harness.make_state(rule, (5, 3), "float", rng)
    vs = [tf.Variable(x) for x in [var0] + slots0]
    hyper = harness.hyper_for(rule, "float", 1)
    f = tf.function(lambda g, i: reference.apply_sparse(rule, vs[0], vs[1:], g, i, **hyper),
                    jit_compile=jit)
    f(tf.zeros([0, 3]), tf.zeros([0], tf.int64))
    for v, x in zip(vs, [var0] + slots0):
        assert v.numpy().tobytes() == x.tobytes()


def test_unknown_rule_and_arguments():
    v = tf.Variable([1.0, 2.0])
    with pytest.raises(ValueError, match="unknown rule"):
        reference.apply_dense("sgd", v, [], [1.0, 1.0], lr=0.1)
    with pytest.raises(TypeError, match="missing"):
        reference.apply_dense("adagrad", v, [tf.Variable([1.0, 1.0])], [1.0, 1.0], lr=0.1)
    with pytest.raises(ValueError, match="slots"):
        reference.apply_dense("adagrad", v, [], [1.0, 1.0], lr=0.1, epsilon=0.0)


# --- bad indices in the composed sparse forms (issue 16) ----------------------------------

@pytest.mark.parametrize("rule", RULE_NAMES)
def test_apply_sparse_never_reads_the_whole_table(rule):
    """Only gathers and scatters touch the variables: a dense read (tf.shape(variable) did
    one) leaves a tensor sharing the table's buffer, and each scatter after it then copies
    the whole table (a 1M x 64 step: ~870 ms instead of ~30)."""
    rng = np.random.default_rng(3)
    var0, slots0 = harness.make_state(rule, (6, 4), "float", rng)
    vs = [tf.Variable(x) for x in [var0] + slots0]
    hyper = harness.hyper_for(rule, "float", 1)
    step = tf.function(lambda g, i: reference.apply_sparse(rule, vs[0], vs[1:], g, i, **hyper))
    graph = step.get_concrete_function(tf.TensorSpec([None, 4], tf.float32),
                                       tf.TensorSpec([None], tf.int64)).graph
    uses = sorted({op.type for op in graph.get_operations()
                   if any(t.dtype == tf.resource for t in op.inputs)})
    assert "ReadVariableOp" not in uses, uses
    assert "ResourceGather" in uses and "ResourceScatterUpdate" in uses, uses


BAD_INDICES = [([2, -3], "indices[1] = -3 is not in [0, 4)"),
               ([-1], "indices[0] = -1 is not in [0, 4)"),
               ([1, 1, 4, -2], "indices[2] = 4 is not in [0, 4)"),
               ([3, -2147483648], "indices[1] = -2147483648 is not in [0, 4)")]


def _masked_step(rule, vs, hyper):
    def step(grad, indices):
        new_var, new_slots = reference.masked_sparse_update(
            rule, vs[0], vs[1:], grad, indices, **hyper)
        for v, x in zip(vs, [new_var] + list(new_slots)):
            v.assign(x)
    return step


def _apply_sparse_step(rule, vs, hyper):
    return lambda grad, indices: reference.apply_sparse(rule, vs[0], vs[1:], grad, indices,
                                                        **hyper)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64], ids=_ids)
@pytest.mark.parametrize("mode", ["eager", "function", "jit"])
@pytest.mark.parametrize("form", ["masked_sparse_update", "apply_sparse"])
@pytest.mark.parametrize("rule", RULE_NAMES)
def test_bad_indices_rejected_before_writing(rule, form, mode, index_dtype):
    # As the ops: every id must be in [0, rows), negative ones too; nothing is written.
    # Under XLA nothing can raise at run time: the call writes nothing instead.
    rng = np.random.default_rng(8)
    var0, slots0 = harness.make_state(rule, (4, 3), "float", rng)
    hyper = harness.hyper_for(rule, "float", 1)
    make = _masked_step if form == "masked_sparse_update" else _apply_sparse_step
    vs = [tf.Variable(x) for x in [var0] + slots0]
    step = make(rule, vs, hyper)
    if mode != "eager":  # one trace for every case: ids of any length
        step = tf.function(step, jit_compile=mode == "jit", input_signature=[
            tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None], index_dtype)])
    for ids, message in BAD_INDICES:  # each case must leave the variables as they started
        grad = tf.constant(harness.make_grad((len(ids), 3), "float", rng))
        indices = tf.constant(ids, index_dtype)
        if mode == "jit":
            step(grad, indices)
        else:
            with pytest.raises(tf.errors.InvalidArgumentError) as raised:
                step(grad, indices)
            assert message in raised.value.message
        for v, x in zip(vs, [var0] + slots0):
            assert v.numpy().tobytes() == x.tobytes(), (ids, mode)


@pytest.mark.parametrize("mode", ["eager", "function", "jit"])
def test_masked_sparse_update_valid_and_empty_indices_still_update(mode):
    rng = np.random.default_rng(9)
    var0, slots0 = harness.make_state("adagrad", (4, 3), "float", rng)
    hyper = harness.hyper_for("adagrad", "float", 1)
    for ids in ([2, 0, 2], []):
        vs = [tf.Variable(x) for x in [var0] + slots0]
        step = _masked_step("adagrad", vs, hyper)
        if mode != "eager":
            step = tf.function(step, jit_compile=mode == "jit")
        grad = harness.make_grad((len(ids), 3), "float", rng)
        step(tf.constant(grad), tf.constant(ids, tf.int64))
        exp_var, exp_slots = npref.sparse_update("adagrad", var0, slots0, grad,
                                                 np.array(ids, np.int64), hyper)
        npref.assert_close(vs[0].numpy(), exp_var, "float", "var %s" % ids)
        npref.assert_close(vs[1].numpy(), exp_slots[0], "float", "accum %s" % ids)


# --- the NumPy oracle itself against TensorFlow's built-in training ops (float64) ------

# Every oracle's ANCHOR_CASES: (rule, options, hyper overrides, sparse), run against its
# tf_anchor (TF's own op of the same math).
ANCHOR_CASES = [(rule, options, overrides, sparse)
                for rule, oracle in sorted(npref.ORACLES.items())
                for options, overrides, sparse in oracle.ANCHOR_CASES]


@pytest.mark.parametrize("rule,options,overrides,sparse", ANCHOR_CASES,
                         ids=["%s-%s-%s-%s" % (r, harness.param_ids(o), harness.param_ids(h),
                                               "sparse" if s else "dense")
                              for r, o, h, s in ANCHOR_CASES])
def test_numpy_reference_matches_tf_training_ops(rule, options, overrides, sparse):
    rng = np.random.default_rng(5)
    var, slots = harness.make_state(rule, (6, 3), "double", rng)
    vs = [tf.Variable(x) for x in [var] + slots]
    for t in range(1, 4):
        hyper = dict(harness.hyper_for(rule, "double", t), **overrides)
        if sparse:
            indices = rng.choice(6, 4, replace=False).astype(np.int64)
            grad = harness.make_grad((4, 3), "double", rng)
            var, slots = npref.sparse_update(rule, var, slots, grad, indices, hyper, options)
        else:
            indices = None
            grad = harness.make_grad((6, 3), "double", rng)
            var, slots = npref.dense_update(rule, var, slots, grad, hyper, options)
        npref.ORACLES[rule].tf_anchor(tf, [v.handle for v in vs],
                                      {k: tf.constant(v, tf.float64) for k, v in hyper.items()},
                                      grad, options, indices)
        for v, exp in zip(vs, [var] + slots):
            npref.assert_close(v.numpy(), exp, "double", "step %d" % t)


def test_numpy_reference_sparse_semantics():
    var = np.arange(12.0).reshape(4, 3)
    accum = np.ones((4, 3))
    grad = np.array([[1.0] * 3, [2.0] * 3, [4.0] * 3])
    new_var, (new_accum,) = npref.sparse_update(
        "adagrad", var, [accum], grad, np.array([2, 0, 2]), {"lr": 1.0, "epsilon": 0.0})
    np.testing.assert_array_equal(new_var[[1, 3]], var[[1, 3]])
    np.testing.assert_allclose(new_accum[2], 1 + 25.0)
    np.testing.assert_allclose(new_var[2], var[2] - 5.0 / np.sqrt(26.0))
    np.testing.assert_allclose(new_var[0], var[0] - 2.0 / np.sqrt(5.0))
    with pytest.raises(ValueError, match=r"indices\[1\] = 4 is not in \[0, 4\)"):
        npref.sparse_update("adagrad", var, [accum], grad, np.array([0, 4, -1]),
                            {"lr": 1.0, "epsilon": 0.0})
    for dtype in harness.DTYPES:
        tol = npref.tolerance(dtype)
        assert 0 < tol["rtol"] < 0.05 and 0 < tol["atol"] < 0.01


@pytest.mark.parametrize("rule", RULE_NAMES)
def test_apply_sparse_under_jit_with_indices_already_deduplicated(rule):
    # Keras 2.15 de-duplicates sparse gradients with tf.unique before the update; under
    # XLA a second tf.unique of such dynamically shaped indices returns padded values,
    # so the composed form must not rely on it (it used to leave touched rows stale).
    rng = np.random.default_rng(5)
    var0, slots0 = harness.make_state(rule, (7, 3), "float", rng)
    grad = harness.make_grad((6, 3), "float", rng)
    indices = np.array([5, 1, 5, 0, 1, 3], np.int64)
    hyper = harness.hyper_for(rule, "float", 1)
    var = tf.Variable(var0)
    slots = [tf.Variable(s) for s in slots0]

    @tf.function(jit_compile=True)
    def step(values, idx):
        rows, segments = tf.unique(idx)
        summed = tf.math.unsorted_segment_sum(values, segments, tf.shape(rows)[0])
        reference.apply_sparse(rule, var, slots, summed, rows, **hyper)

    step(tf.constant(grad), tf.constant(indices))
    exp_var, exp_slots = npref.sparse_update(rule, var0, slots0, grad, indices, hyper)
    npref.assert_close(var.numpy(), exp_var, "float", "var")
    for s, e in zip(slots, exp_slots):
        npref.assert_close(s.numpy(), e, "float", "slot")
    assert var.numpy()[[2, 4, 6]].tobytes() == var0[[2, 4, 6]].tobytes()
