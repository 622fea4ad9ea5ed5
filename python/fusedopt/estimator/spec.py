"""``EstimatorSpec`` and ``ModeKeys``: tf.estimator's where it exists, else stand-ins.

TF >= 2.16 has no tf.estimator; the stand-ins have the same fields, defaults and mode
values, so a replicated model_fn can still be built in a ``tf.compat.v1`` graph and run
with a Session.
"""
import collections

import tensorflow as tf

__all__ = ["EstimatorSpec", "ModeKeys"]


def _estimator_module():
    try:
        return tf.compat.v1.estimator
    except AttributeError:  # TF >= 2.16: tf.estimator removed
        return None


_SPEC_FIELDS = ("mode", "predictions", "loss", "train_op", "eval_metric_ops",
                "export_outputs", "training_chief_hooks", "training_hooks", "scaffold",
                "evaluation_hooks", "prediction_hooks")


class _ModeKeys:
    """Same values as ``tf.estimator.ModeKeys``."""
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


class _EstimatorSpec(collections.namedtuple("EstimatorSpec", _SPEC_FIELDS)):
    """Minimal stand-in for ``tf.estimator.EstimatorSpec`` where tf.estimator is absent.

    Same fields and defaults; only the checks replicate_model_fn relies on.
    """

    def __new__(cls, mode, predictions=None, loss=None, train_op=None, eval_metric_ops=None,
                export_outputs=None, training_chief_hooks=None, training_hooks=None,
                scaffold=None, evaluation_hooks=None, prediction_hooks=None):
        _check_spec(mode, predictions, loss, train_op)
        return super().__new__(
            cls, mode, {} if predictions is None else predictions, loss, train_op,
            dict(eval_metric_ops or {}), export_outputs, tuple(training_chief_hooks or ()),
            tuple(training_hooks or ()), scaffold, tuple(evaluation_hooks or ()),
            tuple(prediction_hooks or ()))


def _check_spec(mode, predictions, loss, train_op):
    modes = (_ModeKeys.TRAIN, _ModeKeys.EVAL, _ModeKeys.PREDICT)
    if mode not in modes:
        raise ValueError("mode must be one of %r, got %r" % (modes, mode))
    if mode == _ModeKeys.TRAIN and (loss is None or train_op is None):
        raise ValueError("Missing loss or train_op in TRAIN mode.")
    if mode == _ModeKeys.EVAL and loss is None:
        raise ValueError("Missing loss in EVAL mode.")
    if mode == _ModeKeys.PREDICT and predictions is None:
        raise ValueError("Missing predictions in PREDICT mode.")


if _estimator_module() is not None:
    EstimatorSpec = _estimator_module().EstimatorSpec
    ModeKeys = _estimator_module().ModeKeys
else:
    EstimatorSpec = _EstimatorSpec
    ModeKeys = _ModeKeys

