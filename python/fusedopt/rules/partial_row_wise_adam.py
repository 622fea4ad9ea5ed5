"""Partial row-wise Adam (FBGEMM / TorchRec ``PARTIAL_ROWWISE_ADAM``): Adam's first moment
per element, its second moment per row of the variable (its first dimension; a scalar is
one row), so an embedding table of D columns keeps 1 + 1/D values of state per parameter
instead of Adam's 2:

    v[r]   = beta_2·v[r] + (1-beta_2)·mean(g[r]²)
    m      = beta_1·m + (1-beta_1)·g
    var[r] -= lr/(1-beta_1^t) / (sqrt(v[r]/(1-beta_2^t)) + epsilon) · m[r]

FBGEMM's bias correction and epsilon (added to the bias-corrected ``sqrt(v)``). No
TensorFlow, Keras or tensorflow-addons class has it: the Keras classes are fusedopt's own,
on Keras's ``Optimizer`` base, with ``keras.optimizers.Adam``'s arguments and defaults
(learning_rate 0.001, beta_1 0.9, beta_2 0.999, epsilon 1e-7).

C++: ``cc/core/rules/partial_row_wise_adam.h`` (``PartialRowWiseAdamRule``).
"""
import tensorflow as tf

from fusedopt.rules._front import (Attr, CompatV1, Keras, LearningRate, Legacy,
                                   NewOptimizer, Power)
from fusedopt.rules.lazy_adam import adam_compat_v1

__all__ = ["MATH", "composed", "KERAS", "LEGACY", "COMPAT_V1"]

MATH = ("v[r] = beta2·v[r] + (1-beta2)·mean(g[r]²); m = beta1·m + (1-beta1)·g; "
        "var -= lr/(1-beta1_power) / (sqrt(v[r]/(1-beta2_power)) + epsilon) · m  (v: one per row)")


def composed(var, slots, g, h, o):
    m, v = slots
    rows = tf.shape(v)  # [rows], or [] for a scalar var
    g_rows = tf.reshape(g, tf.concat([tf.reshape(tf.reduce_prod(rows), [1]), [-1]], 0))
    width = tf.cast(tf.shape(g_rows)[1], g.dtype)
    # Rows of no elements keep their v (the ops leave them alone).
    mean_square = tf.reshape(tf.math.divide_no_nan(tf.reduce_sum(g_rows * g_rows, axis=1),
                                                   width), rows)
    v = tf.where(width > 0, h["beta2"] * v + (1 - h["beta2"]) * mean_square, v)
    multiplier = (h["lr"] / (1 - h["beta1_power"])
                  / (tf.sqrt(v / (1 - h["beta2_power"])) + h["epsilon"]))
    m = h["beta1"] * m + (1 - h["beta1"]) * g
    along_rows = tf.concat([rows, tf.ones([tf.rank(var) - tf.size(rows)], tf.int32)], 0)
    return var - tf.reshape(multiplier, along_rows) * m, [m, v]


_ADAM_ARGUMENTS = (("beta_1", 0.9), ("beta_2", 0.999), ("epsilon", 1e-7))

_ARGS = """
    Args:
      learning_rate: float, ``LearningRateSchedule``, or a callable taking no argument and
        returning the value (default 0.001).
      beta_1: decay rate of the first moment ``m`` (default 0.9).
      beta_2: decay rate of the per-row second moment ``v`` (default 0.999).
      epsilon: added to the bias-corrected ``sqrt(v)`` (default 1e-7)."""

_MATH_DOC = """``v[r] = beta_2*v[r] + (1-beta_2)*mean(g[r]²)``, ``m = beta_1*m + (1-beta_1)*g``,
    ``var[r] -= lr/(1-beta_1^t) / (sqrt(v[r]/(1-beta_2^t)) + epsilon) * m[r]``"""

KERAS = Keras(
    name="PartialRowWiseAdam", base=None, slots=("_momentums", "_velocities"),
    hyper=dict(beta1_power=Power("beta_1"), beta2_power=Power("beta_2"), lr=LearningRate(),
               beta1=Attr("beta_1"), beta2=Attr("beta_2"), epsilon=Attr("epsilon")),
    new=NewOptimizer(default_name="partial_row_wise_adam", arguments=_ADAM_ARGUMENTS,
                     slot_names=("momentum", "velocity"), slot_initial=(None, None)),
    doc="""Partial row-wise Adam (FBGEMM's ``PARTIAL_ROWWISE_ADAM``) with fused kernels: the
    first moment per element, the second moment one value per row of each variable (shape
    ``var.shape[:1]``): """ + _MATH_DOC + """; sparse gradients update only the rows they
    touch. A Keras ``Optimizer`` of its own (no Keras class has this rule): serializable
    and checkpointable as any Keras optimizer.
""" + _ARGS)

LEGACY = Legacy(
    name="PartialRowWiseAdam", base=None, slots=("m", "v"),
    hyper=dict(beta1_power="beta_1_power", beta2_power="beta_2_power", lr="lr_t",
               beta1="beta_1", beta2="beta_2", epsilon="epsilon"),
    new=NewOptimizer(default_name="PartialRowWiseAdam", arguments=_ADAM_ARGUMENTS,
                     slot_names=("m", "v"), slot_initial=(None, None),
                     powers=(("beta_1_power", "beta_1"), ("beta_2_power", "beta_2"))),
    doc="""Keras 2 partial row-wise Adam (FBGEMM's ``PARTIAL_ROWWISE_ADAM``) with fused
    kernels: slot ``m`` per element and slot ``v`` of shape ``var.shape[:1]`` per variable,
    """ + _MATH_DOC + """; sparse gradients update only the rows they touch. An
    ``OptimizerV2`` of its own (Keras has no such class).
""" + _ARGS)

COMPAT_V1 = CompatV1(
    name="PartialRowWiseAdamOptimizer",
    **adam_compat_v1("PartialRowWiseAdam"),  # Adam's hyper-parameters, as the C++ rule's
    doc="""Partial row-wise Adam (FBGEMM's ``PARTIAL_ROWWISE_ADAM``) on fusedopt's fused ops,
    as a ``tf.compat.v1.train.Optimizer``:

        v[r]   <- beta2*v[r] + (1-beta2)*mean(g[r]*g[r])
        m      <- beta1*m + (1-beta1)*g
        var[r] <- var[r] - lr/(1-beta1^t) / (sqrt(v[r]/(1-beta2^t)) + epsilon) * m[r]

    Slots ``m`` (var's shape) and ``v`` (one value per row: shape ``var.shape[:1]``), both
    starting at zero; non-slot variables ``beta1_power`` and ``beta2_power`` as
    ``AdamOptimizer``'s. ``IndexedSlices`` gradients update only the named rows (repeated
    indices count as one row with the sum of their gradients).

    Args:
      learning_rate: float, tensor or callable returning one.
      beta1: decay of the first moment (float, tensor or callable).
      beta2: decay of the per-row second moment (float, tensor or callable).
      epsilon: added to the bias-corrected ``sqrt(v)`` (float, tensor or callable).
      use_locking: passed to the ops (lock var and slots while updating).
      name: the name of the slot variables' scope.
    """)
