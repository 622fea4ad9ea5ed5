"""Drop-in replacements for TensorFlow's compatibility-API optimizers.

``fusedopt.compat.v1`` holds ``tf.compat.v1.train.Optimizer`` subclasses
(``LazyAdamOptimizer``, ``AdamaxOptimizer``, ``AdagradOptimizer``) that run every
update with fusedopt's fused ops.
"""
from fusedopt.compat import v1

__all__ = ["v1"]
