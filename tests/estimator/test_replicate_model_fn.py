"""fusedopt.estimator.replicate_model_fn / TowerOptimizer, in tf.compat.v1 graph mode.

The replicated model_fn is called directly in a ``tf.Graph`` and run with a
``tf.compat.v1.Session`` (works on every TF 2.x, with or without tf.estimator). Towers
run on several CPU devices: each Session is created with
``ConfigProto(device_count={"CPU": n})`` and ``allow_soft_placement=False``, so a tower
placed on a missing device fails instead of silently running on CPU:0 — and no
process-wide TF device configuration is changed (other test files are unaffected). The
``devices=None`` default, which reads the process's logical devices, is tested in a
subprocess configured with ``tf.config.set_logical_device_configuration``.

Central check: N towers on a batch leave the same variables as one (unreplicated)
model_fn on the whole batch, after several steps, for a dense and an embedding model, with
each fusedopt.compat.v1 optimizer and a TF optimizer.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from fusedopt import estimator as fe
from fusedopt.compat import v1 as fv1

ModeKeys = fe.ModeKeys
TowerOptimizer = fe.TowerOptimizer

OPTIMIZERS = {
    "lazy_adam": lambda: fv1.LazyAdamOptimizer(0.05),
    "adamax": lambda: fv1.AdamaxOptimizer(0.05),
    "adagrad": lambda: fv1.AdagradOptimizer(0.3),
    "tf_adam": lambda: tf.compat.v1.train.AdamOptimizer(0.05),
}
FUSED_OP = {"lazy_adam": "LazyAdam", "adamax": "Adamax", "adagrad": "Adagrad"}

ROWS, DIM, FEATURES, BATCH = 10, 2, 3, 12


def _devices(n):
    return ["/device:CPU:%d" % i for i in range(n)]


def _session(n, graph=None):
    config = tf.compat.v1.ConfigProto(device_count={"CPU": max(n, 1)},
                                      allow_soft_placement=False)
    return tf.compat.v1.Session(graph=graph, config=config)


def _data(seed=0, batch=BATCH):
    rng = np.random.default_rng(seed)
    # ids 8, 9 never used; duplicates within and across every split of the batch
    ids = rng.integers(0, ROWS - 2, size=(batch,)).astype(np.int64)
    ids[: batch // 2] = ids[batch - batch // 2:]
    x = rng.normal(size=(batch, FEATURES)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3 * (ids % 3)[:, None]
         ).astype(np.float32)
    return {"x": x, "ids": ids}, y


_W0 = np.random.default_rng(1).normal(size=(FEATURES, 1)).astype(np.float32)
_E0 = np.random.default_rng(2).normal(size=(ROWS, DIM)).astype(np.float32)


def _get(name, value, params):
    return tf.compat.v1.get_variable(name, initializer=value,
                                     use_resource=params.get("use_resource", True))


def _predict(features, params):
    """Dense: x @ w + b. Embedding: + rows of two tables (embedding_lookup and gather)."""
    w = _get("w", _W0, params)
    b = _get("b", np.zeros([1], np.float32), params)
    pred = tf.matmul(features["x"], w) + b
    if params["model"] == "embedding":
        e1 = _get("emb1", _E0, params)
        e2 = _get("emb2", _E0[::-1].copy(), params)
        rows = (tf.nn.embedding_lookup(e1, features["ids"])
                + tf.gather(e2, features["ids"]))
        pred += tf.reduce_sum(rows, axis=1, keepdims=True)
    return pred


def _train_model_fn(features, labels, mode, params):
    pred = _predict(features, params)
    loss = tf.compat.v1.losses.mean_squared_error(labels, pred)
    opt = OPTIMIZERS[params["opt"]]()
    if params["tower"]:
        opt = TowerOptimizer(opt)
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return fe.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _train(model_fn, towers, params, steps=3, data=None, loss_reduction=None,
           replicate=True, **kwargs):
    """Builds the (replicated) model_fn, trains `steps` steps. Returns values & graph."""
    features, labels = data if data is not None else _data()
    graph = tf.Graph()
    with graph.as_default():
        fn = model_fn
        if replicate:
            extra = {} if loss_reduction is None else {"loss_reduction": loss_reduction}
            fn = fe.replicate_model_fn(model_fn, devices=_devices(towers), **extra, **kwargs)
        spec = fn(features, labels, ModeKeys.TRAIN, params=params)
        assert not tf.compat.v1.get_collection(TowerOptimizer.COLLECTION_FOR_GRAPH_STATES)
        with _session(towers, graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = [sess.run([spec.loss, spec.train_op])[0] for _ in range(steps)]
            values = {v.op.name: sess.run(v) for v in tf.compat.v1.global_variables()}
    return values, losses, graph


def _assert_same_variables(expected, actual, rtol=2e-5, atol=2e-6):
    assert sorted(expected) == sorted(actual)
    for name in expected:
        np.testing.assert_allclose(actual[name], expected[name], rtol=rtol, atol=atol,
                                   err_msg=name)


# --- N towers == one model_fn on the whole batch ----------------------------------------

@pytest.mark.parametrize("model", ["dense", "embedding"])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_towers_match_one_model_fn_on_whole_batch(opt, model):
    params = {"opt": opt, "model": model, "tower": False}
    expected, expected_losses, _ = _train(_train_model_fn, 1, params, replicate=False)
    towers = 3 if model == "embedding" else 2
    values, losses, graph = _train(_train_model_fn, towers, dict(params, tower=True))
    _assert_same_variables(expected, values)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    assert values["global_step"] == 3
    # the variables did change, and the embedding rows that no id names did not (lazy)
    assert not np.allclose(values["w"], _W0)
    if model == "embedding":
        assert not np.allclose(values["emb1"][:8], _E0[:8])
        if opt != "tf_adam":  # TF's Adam is not lazy
            np.testing.assert_array_equal(values["emb1"][8:], _E0[8:])
    op_types = {op.type for op in graph.get_operations()}
    if opt in FUSED_OP:
        # the step's dense updates: one group op (fusedopt.compat.v1 groups them)
        assert "FusedOpt>ResourceGroupApply%s" % FUSED_OP[opt] in op_types
        if model == "embedding":
            # towers' IndexedSlices concatenated, duplicates summed by the kernel
            assert "FusedOpt>ResourceSparseApply%s" % FUSED_OP[opt] in op_types
            assert not {"Unique", "UnsortedSegmentSum"} & op_types
        # one update per variable and step, not one per tower
        applies = [op for op in graph.get_operations() if op.type.startswith("FusedOpt>")]
        updated = sum(op.get_attr("N") if op.type.startswith("FusedOpt>ResourceGroupApply")
                      else 1 for op in applies)
        assert updated == (4 if model == "embedding" else 2)


def test_towers_match_with_ref_variables_and_four_towers():
    params = {"opt": "lazy_adam", "model": "embedding", "tower": False,
              "use_resource": False}
    expected, _, _ = _train(_train_model_fn, 1, params, replicate=False)
    values, _, graph = _train(_train_model_fn, 4, dict(params, tower=True))
    _assert_same_variables(expected, values)
    op_types = {op.type for op in graph.get_operations()}
    assert {"FusedOpt>SparseApplyLazyAdam", "FusedOpt>ApplyLazyAdam"} <= op_types


def test_towers_run_on_their_devices_and_variables_on_consolidation_device():
    params = {"opt": "lazy_adam", "model": "embedding", "tower": True}
    features, labels = _data()
    with tf.Graph().as_default() as graph:
        fn = fe.replicate_model_fn(_train_model_fn, devices=_devices(3))
        spec = fn(features, labels, ModeKeys.TRAIN, params=params)
        for op in graph.get_operations():
            if op.type == "VarHandleOp":
                assert op.device == "/device:CPU:0", op
        for i in range(3):
            # tower 0 unprefixed (contrib's names), then tower_1/, tower_2/
            matmuls = [op for op in graph.get_operations() if op.type == "MatMul" and (
                op.name.startswith("tower_%d/" % i) if i else
                not op.name.startswith("tower_"))]
            assert matmuls and all(op.device == "/device:CPU:%d" % i for op in matmuls)
        with _session(3, graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            meta = tf.compat.v1.RunMetadata()
            sess.run(spec.train_op, options=tf.compat.v1.RunOptions(trace_level=3),
                     run_metadata=meta)
    used = {d.device.rsplit("/", 1)[-1] for d in meta.step_stats.dev_stats}
    assert {"device:CPU:0", "device:CPU:1", "device:CPU:2"} <= used


def test_round_robin_variable_placement():
    params = {"opt": "adagrad", "model": "embedding", "tower": False}
    expected, _, _ = _train(_train_model_fn, 1, params, replicate=False)
    values, _, graph = _train(_train_model_fn, 2, dict(params, tower=True),
                              variable_placement="round_robin")
    _assert_same_variables(expected, values)
    devices = {op.name: op.device for op in graph.get_operations()
               if op.type == "VarHandleOp"}
    assert devices["w"] == "/device:CPU:0" and devices["b"] == "/device:CPU:1"
    assert devices["emb1"] == "/device:CPU:0" and devices["emb2"] == "/device:CPU:1"


# --- cases of the original suite ---------------------------------------------------------

def test_single_tower_without_tower_optimizer_is_the_model_fn():
    params = {"opt": "adamax", "model": "embedding", "tower": False}
    expected, _, plain_graph = _train(_train_model_fn, 1, params, replicate=False)
    values, _, graph = _train(_train_model_fn, 1, params)
    _assert_same_variables(expected, values, rtol=0, atol=0)

    def var_names(g):
        return sorted(v.op.name for v in g.get_collection("variables"))
    assert var_names(graph) == var_names(plain_graph)  # checkpoint compatible


def test_tower_optimizer_keeps_variable_names_of_the_model_fn():
    params = {"opt": "lazy_adam", "model": "dense", "tower": False}
    _, _, plain = _train(_train_model_fn, 1, params, steps=1, replicate=False)
    _, _, replicated = _train(_train_model_fn, 2, dict(params, tower=True), steps=1)
    names = sorted(v.op.name for v in plain.get_collection("variables"))
    assert names == sorted(v.op.name for v in replicated.get_collection("variables"))
    assert "beta1_power" in names and "w/Adam" in names


def _two_optimizers_model_fn(features, labels, mode, params):
    pred = _predict(features, params)
    loss = tf.compat.v1.losses.mean_squared_error(labels, pred)
    wrap = TowerOptimizer if params["tower"] else (lambda opt: opt)
    first = [v for v in tf.compat.v1.trainable_variables() if v.op.name != "b"]
    bias = [v for v in tf.compat.v1.trainable_variables() if v.op.name == "b"]
    train_op = tf.group(
        wrap(fv1.LazyAdamOptimizer(0.05)).minimize(
            loss, var_list=first, global_step=tf.compat.v1.train.get_or_create_global_step()),
        wrap(lambda: fv1.AdagradOptimizer(0.2)).minimize(loss, var_list=bias)
        if params["tower"] else fv1.AdagradOptimizer(0.2).minimize(loss, var_list=bias))
    return fe.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_two_optimizers_in_one_model_fn():
    params = {"model": "embedding", "tower": False}
    expected, _, _ = _train(_two_optimizers_model_fn, 1, params, replicate=False)
    values, _, _ = _train(_two_optimizers_model_fn, 2, dict(params, tower=True))
    _assert_same_variables(expected, values)
    assert "b/Adagrad" in values and "w/Adam" in values and "b/Adam" not in values
    assert values["global_step"] == 3


def _two_losses_model_fn(features, labels, mode, params):
    pred = _predict(features, params)
    loss1 = tf.compat.v1.losses.mean_squared_error(labels, pred)
    loss2 = tf.compat.v1.losses.absolute_difference(labels, pred)
    opt = fv1.LazyAdamOptimizer(0.05)
    if params["tower"]:
        opt = TowerOptimizer(opt)
    step = tf.compat.v1.train.get_or_create_global_step()
    op1 = opt.minimize(loss1, global_step=step)
    with tf.control_dependencies([op1]):
        op2 = opt.minimize(loss2)
    return fe.EstimatorSpec(mode, loss=loss1 + loss2, train_op=op2)


def test_two_losses_with_one_optimizer():
    params = {"model": "dense", "tower": False}
    expected, expected_losses, _ = _train(_two_losses_model_fn, 1, params, replicate=False)
    values, losses, _ = _train(_two_losses_model_fn, 2, dict(params, tower=True))
    _assert_same_variables(expected, values)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)


def test_collected_gradients_are_reset_between_model_fn_calls():
    """Graph state is per call and cleared afterwards: a second replicated model_fn in the
    same graph (other variable scope) applies only its own towers' gradients."""
    params = {"opt": "lazy_adam", "model": "dense", "tower": False}
    expected, _, _ = _train(_train_model_fn, 1, params, steps=2, replicate=False)
    seen = []

    def model_fn(features, labels, mode, params):
        seen.append(TowerOptimizer.has_been_used())
        spec = _train_model_fn(features, labels, mode, params)
        seen.append(TowerOptimizer.has_been_used())
        return spec

    features, labels = _data()
    with tf.Graph().as_default() as graph:
        assert not TowerOptimizer.has_been_used()
        fn = fe.replicate_model_fn(model_fn, devices=_devices(2))
        specs = []
        for scope in ("first", "second"):
            with tf.compat.v1.variable_scope(scope):
                specs.append(fn(features, labels, ModeKeys.TRAIN,
                                params=dict(params, tower=True)))
            assert not graph.get_collection(TowerOptimizer.COLLECTION_FOR_GRAPH_STATES)
            assert not TowerOptimizer.has_been_used()
        applies = [op for op in graph.get_operations() if op.type.startswith("FusedOpt>")]
        # w and b, once per replicated call: one group op of two variables per call
        assert [op.get_attr("N") for op in applies] == [2, 2]
        with _session(2, graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):  # only the first model's train op runs
                sess.run(specs[0].train_op)
            first = sess.run(tf.compat.v1.global_variables("first/w")[0])
            second = sess.run(tf.compat.v1.global_variables("second/w")[0])
    assert seen == [False, True, True, True, False, True, True, True]
    np.testing.assert_allclose(first, expected["w"], rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(second, _W0)


def _reduction_model_fn(features, labels, mode, params):
    pred = _predict(features, params)
    loss = tf.compat.v1.losses.mean_squared_error(labels, pred,
                                                  reduction=params["reduction"])
    opt = fv1.AdagradOptimizer(0.1)
    if params["tower"]:
        opt = TowerOptimizer(opt)
    return fe.EstimatorSpec(mode, loss=loss, train_op=opt.minimize(loss))


@pytest.mark.parametrize("reduction", [tf.compat.v1.losses.Reduction.SUM,
                                       tf.compat.v1.losses.Reduction.MEAN,
                                       tf.compat.v1.losses.Reduction.SUM_OVER_BATCH_SIZE])
def test_loss_reduction_sum_vs_mean(reduction):
    params = {"model": "dense", "tower": False, "reduction": reduction}
    expected, expected_losses, _ = _train(_reduction_model_fn, 1, params, replicate=False)
    values, losses, _ = _train(_reduction_model_fn, 2, dict(params, tower=True),
                               loss_reduction=reduction)
    _assert_same_variables(expected, values)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)


def test_wrong_loss_reduction_changes_the_result():
    """A mean loss declared as SUM: gradients are not divided by the towers (N times
    larger) and the reported loss is the sum of the towers' means."""
    mean = tf.compat.v1.losses.Reduction.MEAN
    params = {"model": "dense", "tower": False, "reduction": mean}
    expected, expected_losses, _ = _train(_reduction_model_fn, 1, params, steps=1,
                                          replicate=False)
    values, losses, _ = _train(_reduction_model_fn, 2, dict(params, tower=True), steps=1,
                               loss_reduction=tf.compat.v1.losses.Reduction.SUM)
    assert not np.allclose(values["w"], expected["w"], rtol=1e-3)
    np.testing.assert_allclose(losses[0], 2 * expected_losses[0], rtol=1e-5)


# --- EVAL: metrics over the whole batch --------------------------------------------------

def _eval_model_fn(features, labels, mode, params):
    pred = _predict(features, params)
    loss = tf.compat.v1.losses.mean_squared_error(labels, pred)
    # weights that differ between towers: the mean over all != mean of tower means
    weights = tf.cast(features["ids"][:, None] + 1, tf.float32)
    metrics = {
        "weighted_mean": tf.compat.v1.metrics.mean(pred, weights=weights),
        "mse": tf.compat.v1.metrics.mean_squared_error(labels, pred),
        "accuracy": tf.compat.v1.metrics.accuracy(labels > 0, pred > 0),
        "auc": tf.compat.v1.metrics.auc(tf.cast(labels > 0, tf.int64), tf.sigmoid(pred)),
        "precision": tf.compat.v1.metrics.precision(labels > 0, pred > 0),
    }
    return fe.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)


def _evaluate(towers, replicate, batches):
    params = {"model": "embedding"}
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        fn = (fe.replicate_model_fn(_eval_model_fn, devices=_devices(towers))
              if replicate else _eval_model_fn)
        spec = fn({"x": x, "ids": ids}, y, ModeKeys.EVAL, params=params)
        updates = [u for _, u in spec.eval_metric_ops.values()]
        with _session(towers, graph) as sess:
            sess.run([tf.compat.v1.global_variables_initializer(),
                      tf.compat.v1.local_variables_initializer()])
            losses = []
            for features, labels in batches:
                losses.append(sess.run([spec.loss] + updates, {
                    x: features["x"], ids: features["ids"], y: labels})[0])
            return losses, {k: sess.run(v) for k, (v, _) in spec.eval_metric_ops.items()}


def test_eval_metrics_reduce_over_all_towers():
    batches = [_data(seed) for seed in (3, 4)]
    expected_losses, expected = _evaluate(1, False, batches)
    losses, metrics = _evaluate(3, True, batches)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    assert sorted(metrics) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(metrics[name], expected[name], rtol=2e-5, err_msg=name)
    # the weighted mean is not the average of the towers' weighted means
    towers = [_evaluate(1, False, [({k: v[i * 4:(i + 1) * 4] for k, v in f.items()},
                                    l[i * 4:(i + 1) * 4]) for f, l in batches])[1]
              for i in range(3)]
    naive = np.mean([t["weighted_mean"] for t in towers])
    assert abs(naive - expected["weighted_mean"]) > 1e-3


# --- PREDICT: predictions and export outputs ---------------------------------------------

def _export_output_classes():
    try:
        return tf.compat.v1.estimator.export
    except AttributeError:
        from tensorflow.python.saved_model.model_utils import export_output
        return export_output


def _predict_model_fn(features, labels, mode, params):
    pred = _predict(features, params)
    probs = tf.sigmoid(pred)
    classes = tf.strings.as_string(tf.cast(pred > 0, tf.int64))
    eo = _export_output_classes()
    return fe.EstimatorSpec(mode, predictions={"pred": pred,
                                               "ids": tf.identity(features["ids"])},
                            export_outputs={
                                "serving_default": eo.PredictOutput({"pred": pred}),
                                "classify": eo.ClassificationOutput(scores=probs,
                                                                    classes=classes),
                                "regress": eo.RegressionOutput(value=pred[:, 0]),
                            })


def test_predictions_and_export_outputs_are_concatenated():
    features, _ = _data()
    results = {}
    for towers, replicate in ((1, False), (3, True)):
        with tf.Graph().as_default() as graph:
            fn = (fe.replicate_model_fn(_predict_model_fn, devices=_devices(towers))
                  if replicate else _predict_model_fn)
            spec = fn(features, None, ModeKeys.PREDICT, params={"model": "embedding"})
            eo = _export_output_classes()
            assert isinstance(spec.export_outputs["serving_default"], eo.PredictOutput)
            assert isinstance(spec.export_outputs["classify"], eo.ClassificationOutput)
            assert isinstance(spec.export_outputs["regress"], eo.RegressionOutput)
            fetch = {"predictions": spec.predictions,
                     "predict": spec.export_outputs["serving_default"].outputs,
                     "scores": spec.export_outputs["classify"].scores,
                     "classes": spec.export_outputs["classify"].classes,
                     "value": spec.export_outputs["regress"].value}
            with _session(towers, graph) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                results[towers] = sess.run(fetch)
    one, three = results[1], results[3]
    np.testing.assert_array_equal(three["predictions"]["ids"], features["ids"])
    for key in ("scores", "value"):
        np.testing.assert_allclose(three[key], one[key], rtol=1e-6)
    np.testing.assert_allclose(three["predictions"]["pred"], one["predictions"]["pred"],
                               rtol=1e-6)
    np.testing.assert_allclose(three["predict"]["pred"], one["predict"]["pred"], rtol=1e-6)
    np.testing.assert_array_equal(three["classes"], one["classes"])
    assert three["value"].shape == (BATCH,)


# --- splitting the batch -----------------------------------------------------------------

def test_batch_splitting_dense_dicts_and_uneven_sparse():
    shards = []

    def model_fn(features, labels, mode):
        shards.append((features, labels))
        w = tf.compat.v1.get_variable("w", initializer=1.0)
        return fe.EstimatorSpec(mode, predictions={"x": features["dense"] * w})

    sparse = tf.compat.v1.SparseTensorValue(
        indices=[[0, 0], [1, 1], [2, 0], [3, 2], [4, 1], [4, 2]],
        values=np.array([1, 2, 3, 4, 5, 6], np.int64), dense_shape=[5, 3])
    with tf.Graph().as_default() as graph:
        dense = tf.compat.v1.placeholder(tf.float32, [None, 2])  # dynamic batch
        features = {"dense": dense, "nested": {"sparse": sparse, "static": np.arange(4.0)}}
        labels = np.arange(8).reshape(4, 2)
        fn = fe.replicate_model_fn(model_fn, devices=_devices(2))
        spec = fn(features, labels, ModeKeys.PREDICT)
        assert len(shards) == 2
        with _session(2, graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            feed = {dense: np.arange(8.0).reshape(4, 2)}
            got = sess.run([shards, spec.predictions], feed)
    (f0, l0), (f1, l1) = got[0]
    np.testing.assert_array_equal(f0["dense"], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(f1["dense"], [[4, 5], [6, 7]])
    np.testing.assert_array_equal(f0["nested"]["static"], [0, 1])
    np.testing.assert_array_equal(l1, [[4, 5], [6, 7]])
    # 5 sparse rows on 2 towers: 3 + 2, indices local to each part
    s0, s1 = f0["nested"]["sparse"], f1["nested"]["sparse"]
    np.testing.assert_array_equal(s0.dense_shape, [3, 3])
    np.testing.assert_array_equal(s0.indices, [[0, 0], [1, 1], [2, 0]])
    np.testing.assert_array_equal(s0.values, [1, 2, 3])
    np.testing.assert_array_equal(s1.dense_shape, [2, 3])
    np.testing.assert_array_equal(s1.indices, [[0, 2], [1, 1], [1, 2]])
    np.testing.assert_array_equal(s1.values, [4, 5, 6])
    np.testing.assert_array_equal(got[1]["x"], np.arange(8.0).reshape(4, 2))


# --- errors ------------------------------------------------------------------------------

def test_several_towers_without_tower_optimizer_raise():
    params = {"opt": "lazy_adam", "model": "dense", "tower": False}
    with pytest.raises(ValueError, match="TowerOptimizer"):
        _train(_train_model_fn, 2, params)


def test_towers_making_different_optimizer_calls_raise():
    def make(kind):
        def model_fn(features, labels, mode):
            tower = len(calls)
            calls.append(tower)
            pred = _predict(features, {"model": "dense"})
            loss = tf.compat.v1.losses.mean_squared_error(labels, pred)
            opt = TowerOptimizer(fv1.AdagradOptimizer(0.1))
            if kind == "other_vars" and tower == 1:
                ops = [opt.minimize(loss, var_list=[tf.compat.v1.trainable_variables()[0]])]
            elif kind == "other_optimizer" and tower == 1:
                ops = [TowerOptimizer(fv1.LazyAdamOptimizer(0.1)).minimize(loss)]
            else:
                ops = [opt.minimize(loss)]
            if kind == "extra_call" and tower == 1:
                ops.append(opt.minimize(loss))
            if kind == "missing_call" and tower == 0:
                ops.append(opt.minimize(loss))
            return fe.EstimatorSpec(mode, loss=loss, train_op=tf.group(*ops))
        return model_fn

    for kind, match in (("extra_call", "tower 1 made apply_gradients call #2"),
                        ("missing_call", r"calls per tower: \[2, 1\]"),
                        ("other_vars", r"updates \['w:0', 'b:0'\] in tower 0 but \['w:0'\]"),
                        ("other_optimizer", "AdagradOptimizer in tower 0 but "
                                            "LazyAdamOptimizer in tower 1")):
        calls = []
        with pytest.raises(ValueError, match="different optimizer calls") as info:
            _train(make(kind), 2, {}, steps=0)
        assert info.match(match), (kind, str(info.value))


def test_batch_not_divisible_by_towers_raises():
    params = {"opt": "lazy_adam", "model": "dense", "tower": True}
    data = _data(batch=9)
    with pytest.raises(ValueError, match=r"Batch size 9 needs to be divisible by the number "
                                         r"of GPUs, which is 2: .*the batch size of "
                                         r"features\['x'\] is not divisible "
                                         r"by the number of towers \(2\)"):
        _train(_train_model_fn, 2, params, data=data)
    # dynamic batch: checked when run
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        spec = fe.replicate_model_fn(_train_model_fn, devices=_devices(2))(
            {"x": x}, y, ModeKeys.TRAIN, params=params)
        with _session(2, graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(spec.train_op, {x: data[0]["x"][:8], y: data[1][:8]})
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"not divisible by the number of towers \(2\)"):
                sess.run(spec.train_op, {x: data[0]["x"], y: data[1]})


def test_loss_reduction_none_and_bad_arguments_raise():
    with pytest.raises(ValueError, match="loss_reduction=NONE"):
        fe.replicate_model_fn(_train_model_fn,
                              loss_reduction=tf.compat.v1.losses.Reduction.NONE)
    with pytest.raises(ValueError, match="Unknown loss_reduction"):
        fe.replicate_model_fn(_train_model_fn, loss_reduction="average")
    with pytest.raises(ValueError, match="devices must not be empty"):
        fe.replicate_model_fn(_train_model_fn, devices=[])
    with pytest.raises(ValueError, match="variable_placement"):
        fe.replicate_model_fn(_train_model_fn, variable_placement="everywhere")
    with pytest.raises(TypeError, match="TowerOptimizer needs"):
        TowerOptimizer(0.1)
    with pytest.raises(RuntimeError, match="tf.Graph"):  # eager
        fe.replicate_model_fn(_train_model_fn, devices=_devices(1))(
            *_data(), ModeKeys.TRAIN, params={"opt": "adagrad", "model": "dense",
                                              "tower": True})


def test_tower_creating_unshared_variables_raises():
    def model_fn(features, labels, mode):
        w = tf.Variable(tf.ones([FEATURES, 1]))  # not shared between towers
        loss = tf.reduce_mean(tf.matmul(features["x"], w))
        return fe.EstimatorSpec(mode, loss=loss,
                                train_op=TowerOptimizer(fv1.AdagradOptimizer(0.1)).minimize(loss))
    with pytest.raises(ValueError, match="tower 1 created new trainable variables"):
        _train(model_fn, 2, {}, steps=0)


# --- TowerOptimizer delegation -----------------------------------------------------------

def test_tower_optimizer_delegates():
    made = []

    def factory():
        made.append(1)
        return fv1.LazyAdamOptimizer(0.1, name="MyAdam")

    opt = TowerOptimizer(factory)
    assert isinstance(opt, tf.compat.v1.train.Optimizer)
    assert opt.GATE_NONE == 0 and opt.GATE_OP == 1 and opt.GATE_GRAPH == 2
    assert TowerOptimizer.COLLECTION_FOR_GRAPH_STATES == "replicate_model_fn_graph_states"
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0])
        train_op = opt.minimize(tf.reduce_sum(w * w))  # outside replicate_model_fn: plain
        assert not tf.compat.v1.get_collection(TowerOptimizer.COLLECTION_FOR_GRAPH_STATES)
        assert not TowerOptimizer.has_been_used()
        assert opt.get_name() == "MyAdam"
        assert sorted(opt.get_slot_names()) == ["m", "v"]
        assert opt.get_slot(w, "m").op.name == "w/MyAdam"
        assert sorted(v.op.name for v in opt.variables()) == [
            "beta1_power", "beta2_power", "w/MyAdam", "w/MyAdam_1"]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train_op)
            np.testing.assert_allclose(sess.run(w), [0.9, 1.9], rtol=1e-5)
    assert made == [1]  # factory called once


# --- devices=None ------------------------------------------------------------------------

@pytest.mark.slow
def test_default_devices_are_all_local_cpus_without_gpus():
    code = textwrap.dedent("""
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
        tf.config.set_visible_devices([], "GPU")
        from fusedopt import estimator as fe
        towers = []
        def model_fn(features, labels, mode):
            towers.append(features.device)
            w = tf.compat.v1.get_variable("w", initializer=1.0)
            return fe.EstimatorSpec(mode, predictions=features * w)
        with tf.Graph().as_default() as g:
            spec = fe.replicate_model_fn(model_fn)(tf.range(6.0), None, fe.ModeKeys.PREDICT)
            with tf.compat.v1.Session() as sess:  # session takes the context's 3 CPUs
                sess.run(tf.compat.v1.global_variables_initializer())
                print("RESULT", len(towers), sess.run(spec.predictions).tolist())
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT 3 [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]" in out.stdout, out.stdout
