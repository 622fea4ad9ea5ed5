"""replicate_model_fn inside a real tf.compat.v1.estimator.Estimator (2 CPU towers).

Needs tf.estimator (TensorFlow <= 2.15 with tensorflow-estimator); skipped elsewhere. The
Estimator's sessions get ``device_count={"CPU": 2}`` with soft placement off, so the
towers really run on /device:CPU:0 and /device:CPU:1 (a missing device would fail).
train, evaluate, predict and export_saved_model of the replicated model_fn give what the
unreplicated model_fn gives on the same data.
"""

import numpy as np
import pytest
import tensorflow as tf

import harness
from fusedopt import estimator as fe
from fusedopt.compat import v1 as fv1


pytestmark = harness.requires_estimator

ROWS, DIM, FEATURES, BATCH, TOWERS = 10, 2, 3, 16, 2
_W0 = np.random.default_rng(1).normal(size=(FEATURES, 1)).astype(np.float32)
_E0 = np.random.default_rng(2).normal(size=(ROWS, DIM)).astype(np.float32)


def _data(n=64):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, ROWS - 2, size=(n,)).astype(np.int64)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3 * (ids % 3)[:, None]
         ).astype(np.float32)
    return {"x": x, "ids": ids}, y


def _input_fn():
    return tf.data.Dataset.from_tensor_slices(_data()).batch(BATCH)


def _train_input_fn():
    return _input_fn().repeat(2)  # 4 batches per epoch: 8 steps


def _predict_input_fn():
    return tf.data.Dataset.from_tensor_slices(_data()[0]).batch(BATCH)


_PLACED = []  # devices of the ops in each graph the replicated Estimator built


def _model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", initializer=_W0)
    emb = tf.compat.v1.get_variable("emb", initializer=_E0)
    pred = tf.matmul(features["x"], w) + tf.reduce_sum(
        tf.nn.embedding_lookup(emb, features["ids"]), axis=1, keepdims=True)
    predictions = {"pred": pred, "ids": tf.identity(features["ids"])}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.compat.v1.estimator.EstimatorSpec(
            mode, predictions=predictions,
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(
                {"pred": pred}), "regress": tf.estimator.export.RegressionOutput(pred)})
    loss = tf.compat.v1.losses.mean_squared_error(labels, pred)
    if mode == tf.estimator.ModeKeys.EVAL:
        weights = tf.cast(features["ids"][:, None] + 1, tf.float32)
        return tf.compat.v1.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={
            "weighted_pred": tf.compat.v1.metrics.mean(pred, weights=weights),
            "mae": tf.compat.v1.metrics.mean_absolute_error(labels, pred)})
    opt = fv1.LazyAdamOptimizer(0.05)
    if params["replicated"]:
        opt = fe.TowerOptimizer(opt)
    train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.compat.v1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class _PlacementHook(tf.compat.v1.train.SessionRunHook):
    def begin(self):
        _PLACED.append({op.device for op in tf.compat.v1.get_default_graph().get_operations()})


def _replicated_model_fn():
    fn = fe.replicate_model_fn(_model_fn, devices=["/device:CPU:%d" % i for i in range(TOWERS)])

    def model_fn(features, labels, mode, params):
        spec = fn(features, labels, mode, params)
        return spec._replace(training_hooks=list(spec.training_hooks) + [_PlacementHook()])
    return model_fn


def _estimator(model_dir, replicated):
    est = tf.compat.v1.estimator
    session_config = tf.compat.v1.ConfigProto(device_count={"CPU": TOWERS},
                                              allow_soft_placement=False)
    config = est.RunConfig(model_dir=str(model_dir), session_config=session_config,
                           save_summary_steps=None, save_checkpoints_steps=1000,
                           log_step_count_steps=1000)
    model_fn = _replicated_model_fn() if replicated else _model_fn
    return est.Estimator(model_fn, config=config, params={"replicated": replicated})


@pytest.fixture(scope="module")
def estimators(tmp_path_factory):
    plain = _estimator(tmp_path_factory.mktemp("plain"), replicated=False)
    plain.train(_train_input_fn, steps=8)
    _PLACED.clear()
    replicated = _estimator(tmp_path_factory.mktemp("replicated"), replicated=True)
    replicated.train(_train_input_fn, steps=8)
    return plain, replicated


def test_train_matches_unreplicated_model_fn(estimators):
    plain, replicated = estimators
    assert sorted(replicated.get_variable_names()) == sorted(plain.get_variable_names())
    assert replicated.get_variable_value("global_step") == 8
    for name in plain.get_variable_names():
        np.testing.assert_allclose(replicated.get_variable_value(name),
                                   plain.get_variable_value(name), rtol=2e-5, atol=2e-6,
                                   err_msg=name)
    assert not np.allclose(replicated.get_variable_value("w"), _W0)
    np.testing.assert_array_equal(replicated.get_variable_value("emb")[8:], _E0[8:])
    # the training graph placed towers on both CPU devices
    assert _PLACED and {"/device:CPU:0", "/device:CPU:1"} <= _PLACED[0]


def test_evaluate_matches_unreplicated_model_fn(estimators):
    plain, replicated = estimators
    expected = plain.evaluate(_input_fn)
    got = replicated.evaluate(_input_fn)
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=2e-5, err_msg=key)


def test_predict_matches_unreplicated_model_fn(estimators):
    plain, replicated = estimators
    expected = list(plain.predict(_predict_input_fn))
    got = list(replicated.predict(_predict_input_fn))
    assert len(got) == len(expected) == 64
    for e, g in zip(expected, got):
        assert e["ids"] == g["ids"]
        np.testing.assert_allclose(g["pred"], e["pred"], rtol=2e-5)


def test_export_saved_model_serves_the_concatenated_outputs(estimators, tmp_path):
    plain, replicated = estimators

    def serving_input_receiver_fn():
        x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES], name="x")
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        return tf.estimator.export.ServingInputReceiver({"x": x, "ids": ids},
                                                        {"x": x, "ids": ids})

    path = replicated.export_saved_model(str(tmp_path), serving_input_receiver_fn)
    features, _ = _data(6)
    expected = [p["pred"] for p in plain.predict(
        lambda: tf.data.Dataset.from_tensor_slices(features).batch(6))]
    config = tf.compat.v1.ConfigProto(device_count={"CPU": TOWERS})
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(config=config) as sess:
        meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], path)
        assert "serving_default" in meta.signature_def  # ("regress" needs a string input)
        sig = meta.signature_def["serving_default"]
        feed = {graph.get_tensor_by_name(sig.inputs[k].name): features[k]
                for k in ("x", "ids")}
        out = sess.run(graph.get_tensor_by_name(sig.outputs["pred"].name), feed)
        np.testing.assert_allclose(out, np.stack(expected), rtol=2e-5)
        odd = {t: v[:5] for t, v in feed.items()}
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"not divisible by the number of towers \(2\)"):
            sess.run(graph.get_tensor_by_name(sig.outputs["pred"].name), odd)


# --- contrib's users' model_fns under a real Estimator (issue 29, items 1 and 2) ---------

class _CloseAtEnd(tf.compat.v1.train.SessionRunHook):
    """Closes the session after the other hooks' end: SyncReplicas' chief queue runner,
    waiting for the next step's gradients, is cancelled at once instead of after the
    monitored session's 120 s grace period."""

    def end(self, session):
        session.close()


def _contrib_order_model_fn(mode, features, labels, params):
    """contrib's suite's argument order; SyncReplicasOptimizer inside TowerOptimizer."""
    c = tf.compat.v1.get_variable("c", initializer=tf.constant(10.0, tf.float64),
                                  dtype=tf.float64)
    loss = tf.reduce_sum(tf.compat.v1.losses.absolute_difference(
        labels, features["features"] * c, reduction=tf.compat.v1.losses.Reduction.SUM))
    opt = tf.compat.v1.train.GradientDescentOptimizer(params["learning_rate"])
    hooks = []
    if params["sync"]:
        opt = tf.compat.v1.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=1)
        hooks += [opt.make_session_run_hook(is_chief=True), _CloseAtEnd()]
    train_op = fe.TowerOptimizer(opt).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.compat.v1.estimator.EstimatorSpec(mode=mode, loss=loss, train_op=train_op,
                                                training_hooks=hooks)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("sync", [False, True], ids=["plain", "sync_replicas"])
def test_contrib_model_fn_trains_under_estimator(sync, tmp_path):
    fn = fe.replicate_model_fn(_contrib_order_model_fn,
                               loss_reduction=tf.compat.v1.losses.Reduction.SUM,
                               devices=["/cpu:0", "/cpu:1"])
    config = tf.compat.v1.estimator.RunConfig(
        model_dir=str(tmp_path), save_summary_steps=None, log_step_count_steps=1000,
        session_config=tf.compat.v1.ConfigProto(device_count={"CPU": 2},
                                                allow_soft_placement=False))
    est = tf.compat.v1.estimator.Estimator(fn, config=config,
                                           params={"learning_rate": 1.0, "sync": sync})

    def input_fn():
        return tf.data.Dataset.from_tensors(
            ({"features": np.array([[1.0], [2.0]])}, np.array([[1.0], [2.0]])))
    est.train(input_fn, steps=1)
    # loss = |1*c - 1| + |2*c - 2|: gradient 3, c = 10 - 3
    assert est.get_variable_value("c") == 7.0
