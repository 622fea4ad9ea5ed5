"""Multi-tower training of Estimator model_fns: ``replicate_model_fn`` and ``TowerOptimizer``.

A port of ``tf.contrib.estimator.replicate_model_fn`` (TF 1.x) for today's TensorFlow,
working with fusedopt's optimizers (``fusedopt.compat.v1``) and any
``tf.compat.v1.train.Optimizer``:

    def model_fn(features, labels, mode, params):
        ...
        opt = fusedopt.estimator.TowerOptimizer(fusedopt.compat.v1.LazyAdamOptimizer(1e-3))
        train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
        return fusedopt.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    est = tf.compat.v1.estimator.Estimator(
        fusedopt.estimator.replicate_model_fn(model_fn, devices=["/gpu:0", "/gpu:1"]))

``EstimatorSpec`` and ``ModeKeys`` are tf.estimator's where it exists (TF <= 2.15 with
tensorflow-estimator), else minimal stand-ins with the same fields and values, so the
replicated model_fn can be called in a ``tf.compat.v1`` graph and run with a Session.

Modules: ``replicate`` (the entry point, the tower loop), ``split`` (batch splitting),
``placement`` (devices), ``tower_optimizer`` (gradients summed and applied once),
``merge`` (the towers' specs and metrics as one), ``spec`` (EstimatorSpec/ModeKeys).
"""
from fusedopt.estimator.replicate import replicate_model_fn
from fusedopt.estimator.spec import EstimatorSpec, ModeKeys
from fusedopt.estimator.tower_optimizer import TowerOptimizer

__all__ = ["replicate_model_fn", "TowerOptimizer", "EstimatorSpec", "ModeKeys"]
