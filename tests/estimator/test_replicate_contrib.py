"""replicate_model_fn as contrib's users called it (issue 29, items 1 and 2).

What ``tf.contrib.estimator``'s own suite checks and we got wrong before: the model_fn
is called by keyword with only the arguments it takes (any order, partials, callables),
``params``/``config`` copied per tower; a ``SyncReplicasOptimizer`` inside
``TowerOptimizer`` trains with several towers (the last tower's hooks are kept); device
strings are canonical (``/device:GPU:0``); scalar export outputs are stacked, one per
tower; tower 0's ops keep the model_fn's own names; what contrib rejected is rejected with
its exception type and its words. Built in a ``tf.Graph`` and run with a Session (every
TF 2.x); tests/estimator/test_replicate_estimator.py runs the same under a real Estimator (2.15).
"""
import functools

import numpy as np
import pytest
import tensorflow as tf

from fusedopt import estimator as fe

ModeKeys = fe.ModeKeys
TowerOptimizer = fe.TowerOptimizer
SUM = tf.compat.v1.losses.Reduction.SUM

FEATURES = np.array([[1.0], [2.0]])
LABELS = np.array([[1.0], [2.0]])


def _session(n=2):
    config = tf.compat.v1.ConfigProto(device_count={"CPU": n}, allow_soft_placement=False)
    return tf.compat.v1.Session(config=config)


def _cpus(n=2):
    return ["/cpu:%d" % i for i in range(n)]


def _linear_spec(features, labels, mode, learning_rate=1.0, wrap=True):
    """contrib's suite model: prediction = x * c, loss = sum |x*c - y|, c starts at 10."""
    c = tf.compat.v1.get_variable("c", initializer=tf.constant(10.0, tf.float64),
                                  dtype=tf.float64)
    predictions = features * c
    loss = tf.reduce_sum(tf.compat.v1.losses.absolute_difference(
        labels, predictions, reduction=SUM))
    opt = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
    if wrap:
        opt = TowerOptimizer(opt)
    step = tf.compat.v1.train.get_or_create_global_step()
    return fe.EstimatorSpec(mode=mode, loss=loss, predictions={"p": predictions},
                            train_op=opt.minimize(loss, global_step=step))


def _train_step(model_fn, devices=None, params=None, n=2):
    """c after one step of the replicated model_fn (gradient of the sum: 1 + 2 = 3)."""
    with tf.Graph().as_default():
        fn = fe.replicate_model_fn(model_fn, loss_reduction=SUM,
                                   devices=devices or _cpus(n))
        spec = fn(FEATURES, LABELS, ModeKeys.TRAIN, params if params is not None else {})
        with _session(n) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(spec.loss) == (10.0 - 1.0) + (20.0 - 2.0)
            sess.run(spec.train_op)
            return sess.run(tf.compat.v1.global_variables("c")[0])


# --- item 1: the model_fn is called by keyword -------------------------------------------

def test_model_fn_in_contrib_argument_order():
    seen = []

    def model_fn(mode, features, labels, params):  # contrib's suite's order
        seen.append((mode, features.shape.as_list(), labels.shape.as_list(), dict(params)))
        return _linear_spec(features, labels, mode, params["learning_rate"])

    assert _train_step(model_fn, params={"learning_rate": 1.0}) == 7.0
    assert seen == [(ModeKeys.TRAIN, [1, 1], [1, 1], {"learning_rate": 1.0})] * 2


class _CallableModel:
    def __call__(self, labels, features, mode):
        return _linear_spec(features, labels, mode)


def _keyword_only(*, mode, labels, features):
    return _linear_spec(features, labels, mode)


def _with_config(config, labels, mode, features, params):
    assert config == {"cluster": None} and params == {"learning_rate": 1.0}
    return _linear_spec(features, labels, mode, params["learning_rate"])


@pytest.mark.parametrize("model_fn", [
    _CallableModel(),
    _keyword_only,
    functools.partial(_with_config, config={"cluster": None}),  # config bound: not passed
    functools.partial(lambda rate, features, labels, mode: _linear_spec(
        features, labels, mode, rate), 1.0),
], ids=["callable_object", "keyword_only", "partial_by_keyword", "partial_positional"])
def test_model_fn_in_any_argument_order(model_fn):
    with tf.Graph().as_default():
        fn = fe.replicate_model_fn(model_fn, loss_reduction=SUM, devices=_cpus())
        spec = fn(features=FEATURES, labels=LABELS, mode=ModeKeys.TRAIN,
                  params={"learning_rate": 1.0}, config={"cluster": "replaced"})
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(spec.train_op)
            assert sess.run(tf.compat.v1.global_variables("c")[0]) == 7.0


def test_params_and_config_are_copied_per_tower():
    def model_fn(features, labels, mode, params, config):
        rate = params.pop("learning_rate")  # would be gone in tower 1 without the copy
        config.append("seen")
        assert config == ["seen"]
        return _linear_spec(features, labels, mode, rate)

    params, config = {"learning_rate": 1.0}, []
    with tf.Graph().as_default():
        fe.replicate_model_fn(model_fn, devices=_cpus())(
            FEATURES, LABELS, ModeKeys.TRAIN, params, config)
    assert params == {"learning_rate": 1.0} and config == []


def test_model_fn_without_features_or_labels_is_refused_as_estimator_does():
    with pytest.raises(ValueError, match="must include features argument"):
        fe.replicate_model_fn(lambda inputs, labels, mode: None)

    def predict_only(features, mode):
        return fe.EstimatorSpec(mode, predictions=features * tf.compat.v1.get_variable(
            "w", initializer=tf.constant(2.0, tf.float64),
                                  dtype=tf.float64))
    with tf.Graph().as_default():
        fn = fe.replicate_model_fn(predict_only, devices=_cpus())
        with pytest.raises(ValueError, match="model_fn does not take labels"):
            fn(FEATURES, LABELS, ModeKeys.PREDICT)
        spec = fn(FEATURES, None, ModeKeys.PREDICT)
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(spec.predictions), [[2.0], [4.0]])


# --- item 2: the rest of contrib's suite ---------------------------------------------------

def _sync_replicas_model_fn(features, labels, mode):
    c = tf.compat.v1.get_variable("c", initializer=tf.constant(10.0, tf.float64),
                                  dtype=tf.float64)
    loss = tf.reduce_sum(tf.compat.v1.losses.absolute_difference(
        labels, features * c, reduction=SUM))
    sync = tf.compat.v1.train.SyncReplicasOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(1.0), replicas_to_aggregate=1)
    hook = sync.make_session_run_hook(is_chief=True)
    train_op = TowerOptimizer(sync).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return fe.EstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=[hook])


# SyncReplicas' chief queue runner waits for the next step's gradients; closing the
# session cancels it (a warning from its thread, not a failure).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_sync_replicas_optimizer_in_tower_optimizer_trains_with_two_towers():
    with tf.Graph().as_default():
        fn = fe.replicate_model_fn(_sync_replicas_model_fn, loss_reduction=SUM,
                                   devices=_cpus())
        spec = fn(FEATURES, LABELS, ModeKeys.TRAIN)
        # one tower's hooks: the last tower's, whose optimizer applied the gradients
        assert len(spec.training_hooks) == 1
        creator = tf.compat.v1.train.ChiefSessionCreator(config=tf.compat.v1.ConfigProto(
            device_count={"CPU": 2}, allow_soft_placement=False))
        with tf.compat.v1.train.MonitoredSession(session_creator=creator,
                                                 hooks=spec.training_hooks,
                                                 stop_grace_period_secs=1) as sess:
            sess.run(spec.train_op)
            assert sess.run(tf.compat.v1.global_variables("c")[0]) == 7.0


def test_hooks_are_the_last_towers_in_train_and_tower_0s_otherwise():
    made = []

    def model_fn(features, labels, mode):
        hook = tf.compat.v1.train.SessionRunHook()
        made.append(hook)
        spec = _linear_spec(features, labels, mode)
        return spec._replace(training_hooks=[hook], evaluation_hooks=[hook],
                             prediction_hooks=[hook])
    for mode, field, tower in ((ModeKeys.TRAIN, "training_hooks", -1),
                               (ModeKeys.EVAL, "evaluation_hooks", 0),
                               (ModeKeys.PREDICT, "prediction_hooks", 0)):
        made.clear()
        with tf.Graph().as_default():
            spec = fe.replicate_model_fn(model_fn, devices=_cpus(3))(
                np.ones([3, 1]), np.ones([3, 1]), mode)
        assert len(made) == 3
        assert list(getattr(spec, field)) == [made[tower]], mode


@pytest.mark.parametrize("spelling", ["/gpu:0", "/GPU:0", "/device:GPU:0"])
def test_device_strings_are_canonical(spelling):
    with tf.Graph().as_default():
        spec = fe.replicate_model_fn(_linear_spec, devices=[spelling])(
            FEATURES, LABELS, ModeKeys.TRAIN)
        assert tf.compat.v1.global_variables("c")[0].device == "/device:GPU:0"
        assert spec.loss.device == "/device:GPU:0"


def test_tower_ops_and_variables_placed_with_canonical_names():
    def model_fn(features, labels, mode):
        spec = _linear_spec(features, labels, mode)
        with tf.device("/job:worker"):  # partial device: merged with the tower's
            extra = tf.identity(spec.loss, name="on_worker")
        with tf.device("/cpu:0"):  # explicit device: kept
            pinned = tf.identity(spec.loss, name="pinned")
        return spec._replace(predictions={"extra": extra, "pinned": pinned})

    with tf.Graph().as_default() as graph:
        spec = fe.replicate_model_fn(model_fn, devices=["/gpu:0", "/gpu:1", "/gpu:3"])(
            np.ones([3, 1]), np.ones([3, 1]), ModeKeys.TRAIN)
        assert tf.compat.v1.global_variables("c")[0].device == "/device:CPU:0"
        for name, device in (("Sum", "/device:GPU:0"), ("tower_1/Sum", "/device:GPU:1"),
                             ("tower_2/Sum", "/device:GPU:3"),
                             ("tower_1/on_worker", "/job:worker/device:GPU:1"),
                             ("tower_2/pinned", "/device:CPU:0")):
            assert graph.get_operation_by_name(name).device == device, name
        assert spec.loss.device == "/device:CPU:0"


def test_round_robin_variables_have_canonical_names():
    def model_fn(features, labels, mode):
        for name in "abcd":
            tf.compat.v1.get_variable(name, initializer=tf.constant(0.25, tf.float64),
                                  dtype=tf.float64)
        return fe.EstimatorSpec(mode, predictions=features)
    with tf.Graph().as_default():
        fe.replicate_model_fn(model_fn, devices=["/gpu:0", "/gpu:1", "/gpu:3"],
                              variable_placement="round_robin")(
            np.ones([3, 1]), None, ModeKeys.PREDICT)
        devices = [tf.compat.v1.global_variables(n)[0].device for n in "abcd"]
    assert devices == ["/device:GPU:0", "/device:GPU:1", "/device:GPU:3", "/device:GPU:0"]


def test_tower_0_keeps_the_model_fns_names():
    with tf.Graph().as_default():
        spec = fe.replicate_model_fn(_linear_spec, loss_reduction=SUM, devices=_cpus())(
            FEATURES, LABELS, ModeKeys.EVAL)
        graph = tf.compat.v1.get_default_graph()
        assert graph.get_operation_by_name("Sum").device == "/device:CPU:0"
        assert graph.get_operation_by_name("tower_1/Sum").device == "/device:CPU:1"
        assert spec.loss is not None


def test_scalar_export_outputs_are_stacked_one_per_tower():
    eo = (tf.estimator.export if hasattr(tf, "estimator") else None)
    if eo is None:  # TF >= 2.16: the export outputs live in TF's saved_model package
        from tensorflow.python.saved_model.model_utils import export_output as eo
    towers = []

    def model_fn(features, mode):
        towers.append(len(towers))
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(10.0, tf.float64),
                                  dtype=tf.float64)
        scores = features[:, 0] * w
        classes = tf.constant("tower %d" % towers[-1])  # one scalar per tower
        mean = tf.reduce_mean(scores)  # scalar
        return fe.EstimatorSpec(mode, predictions={"p": scores}, export_outputs={
            "both": eo.ClassificationOutput(scores[:, None], classes),
            "classes": eo.ClassificationOutput(classes=classes),
            "scores": eo.ClassificationOutput(scores=scores[:, None]),
            "mean": eo.RegressionOutput(tf.cast(mean, tf.float32)),
            "serving_default": eo.PredictOutput({"mean": mean, "scores": scores})})

    with tf.Graph().as_default():
        spec = fe.replicate_model_fn(model_fn, devices=_cpus())(
            np.array([[0.01], [0.002]]), None, ModeKeys.PREDICT)
        out = spec.export_outputs
        assert out["scores"].classes is None and out["classes"].scores is None
        with _session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got = sess.run({"classes": out["both"].classes, "scores": out["both"].scores,
                            "only_classes": out["classes"].classes,
                            "only_scores": out["scores"].scores,
                            "mean": out["mean"].value, "predict": out["serving_default"].outputs})
    np.testing.assert_array_equal(got["classes"], [b"tower 0", b"tower 1"])
    np.testing.assert_array_equal(got["only_classes"], [b"tower 0", b"tower 1"])
    np.testing.assert_allclose(got["scores"], [[0.1], [0.02]])
    np.testing.assert_allclose(got["only_scores"], [[0.1], [0.02]])
    np.testing.assert_allclose(got["mean"], [0.1, 0.02], rtol=1e-6)
    np.testing.assert_allclose(got["predict"]["mean"], [0.1, 0.02])
    np.testing.assert_allclose(got["predict"]["scores"], [0.1, 0.02])


# --- what contrib rejected: its exception types, its words --------------------------------
# (the patterns are those contrib's own suite matches on)

def test_batch_not_divisible_by_the_towers_in_contribs_words():
    with tf.Graph().as_default():
        fn = fe.replicate_model_fn(_linear_spec, devices=_cpus())
        with pytest.raises(ValueError,
                           match=r".*Batch.+size.+needs.+to.+be.+divisible.+by.+GPUs.+"):
            fn(np.ones([3, 1]), np.ones([3, 1]), ModeKeys.TRAIN)


def test_loss_reduction_none_in_contribs_words():
    with pytest.raises(ValueError, match=r".+none.+reduction.+is.+specified.+"):
        fe.replicate_model_fn(_linear_spec, tf.compat.v1.losses.Reduction.NONE)


def test_unwrapped_optimizer_in_contribs_words():
    with tf.Graph().as_default():
        fn = fe.replicate_model_fn(functools.partial(_linear_spec, wrap=False),
                                   devices=_cpus())
        with pytest.raises(ValueError, match=r"Please.+wrap.+with.+TowerOptimizer"):
            fn(FEATURES, LABELS, ModeKeys.TRAIN)


@pytest.mark.parametrize("skip_in_tower", [0, 1])
def test_different_optimizer_calls_in_contribs_words(skip_in_tower):
    calls = []

    def model_fn(features, labels, mode):
        tower = len(calls)
        calls.append(tower)
        c = tf.compat.v1.get_variable("c", initializer=tf.constant(10.0, tf.float64),
                                  dtype=tf.float64)
        d = tf.compat.v1.get_variable("d", initializer=tf.constant(2.0, tf.float64),
                                  dtype=tf.float64)
        loss = tf.reduce_sum(features * c - labels)
        other = tf.reduce_sum(features * d - labels)
        ops = [TowerOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0)).minimize(
            loss, var_list=[c])]
        if tower != skip_in_tower:
            ops.append(TowerOptimizer(tf.compat.v1.train.GradientDescentOptimizer(
                1.0)).minimize(other, var_list=[d]))
        return fe.EstimatorSpec(mode, loss=loss + other, train_op=tf.group(ops))

    with tf.Graph().as_default():
        fn = fe.replicate_model_fn(model_fn, devices=_cpus())
        with pytest.raises(ValueError,
                           match=r".+was.+supposed.+to.+make.+same.+optimizer.+calls.+"):
            fn(FEATURES, LABELS, ModeKeys.TRAIN)


def test_different_metrics_per_tower_in_contribs_words():
    calls = []

    def model_fn(features, labels, mode):
        calls.append(1)
        c = tf.compat.v1.get_variable("c", initializer=tf.constant(10.0, tf.float64),
                                  dtype=tf.float64)
        predictions = features * c
        loss = tf.reduce_sum(predictions - labels)
        metric = (tf.compat.v1.metrics.mean(predictions) if len(calls) == 1 else
                  tf.compat.v1.metrics.accuracy(labels, predictions))
        if len(calls) == 2:  # a metric with one more variable in tower 1
            tf.compat.v1.metrics.mean(predictions)
        return fe.EstimatorSpec(mode, loss=loss, eval_metric_ops={"m": metric})

    with tf.Graph().as_default():
        fn = fe.replicate_model_fn(model_fn, devices=_cpus())
        with pytest.raises(ValueError,
                           match=r".+Expected.+local.+variables.+but.+got.+instead.+"):
            fn(FEATURES, LABELS, ModeKeys.EVAL)
