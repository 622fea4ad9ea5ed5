"""Row-wise Adagrad (FBGEMM / TorchRec ``EXACT_ROWWISE_ADAGRAD``): one accumulator per row
of the variable (its first dimension; a scalar is one row) instead of one per element, so
an embedding table of D columns keeps 1/D of Adagrad's state:

    accumulator[r] += mean(g[r]²)
    var[r]         -= lr / (sqrt(accumulator[r]) + epsilon) · g[r]

No TensorFlow, Keras or tensorflow-addons class has it: the Keras classes are fusedopt's
own, on Keras's ``Optimizer`` base, with ``keras.optimizers.Adagrad``'s arguments and
defaults (learning_rate 0.001, initial_accumulator_value 0.1, epsilon 1e-7; FBGEMM's are
0.01, 0 and 1e-8). The accumulators' shape is ``var.shape[:1]``.

C++: ``cc/core/rules/row_wise_adagrad.h`` (``RowWiseAdagradRule``).
"""
import tensorflow as tf

from fusedopt.rules._front import (REQUIRED, Attr, CompatV1, Keras, LearningRate, Legacy,
                                   NewOptimizer)

__all__ = ["MATH", "composed", "KERAS", "LEGACY", "COMPAT_V1"]

MATH = "acc[r] += mean(g[r]²); var[r] -= lr/(sqrt(acc[r])+epsilon)·g[r]  (acc: one per row)"


def composed(var, slots, g, h, o):
    (accum,) = slots
    rows = tf.shape(accum)  # [rows], or [] for a scalar var
    g_rows = tf.reshape(g, tf.concat([tf.reshape(tf.reduce_prod(rows), [1]), [-1]], 0))
    # A sum over D (0 for rows of no elements, as the ops leave those alone).
    width = tf.cast(tf.shape(g_rows)[1], g.dtype)
    accum = accum + tf.reshape(tf.math.divide_no_nan(tf.reduce_sum(g_rows * g_rows, axis=1),
                                                     width), rows)
    multiplier = h["lr"] / (tf.sqrt(accum) + h["epsilon"])
    along_rows = tf.concat([rows, tf.ones([tf.rank(var) - tf.size(rows)], tf.int32)], 0)
    return var - tf.reshape(multiplier, along_rows) * g, [accum]


def _check_accumulator(arguments):
    if arguments["initial_accumulator_value"] < 0.0:
        raise ValueError("initial_accumulator_value must not be negative: %s"
                         % arguments["initial_accumulator_value"])


_NEW = dict(arguments=(("initial_accumulator_value", 0.1), ("epsilon", 1e-7)),
            slot_names=("accumulator",), slot_initial=("initial_accumulator_value",),
            check=_check_accumulator)

_ARGS = """
    Args:
      learning_rate: float, ``LearningRateSchedule``, or a callable taking no argument and
        returning the value (default 0.001).
      initial_accumulator_value: starting value of the accumulators (default 0.1; >= 0).
      epsilon: added to ``sqrt(accumulator)`` (default 1e-7)."""

KERAS = Keras(
    name="RowWiseAdagrad", base=None, slots=("_accumulators",),
    hyper=dict(lr=LearningRate(), epsilon=Attr("epsilon")),
    new=NewOptimizer(default_name="row_wise_adagrad", **_NEW),
    doc="""Row-wise Adagrad (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``) with fused kernels: one
    accumulator per row of each variable (shape ``var.shape[:1]``), ``acc[r] += mean(g[r]²)``,
    ``var[r] -= lr/(sqrt(acc[r])+epsilon)*g[r]``; sparse gradients update only the rows
    they touch. A Keras ``Optimizer`` of its own (no Keras class has this rule): serializable
    and checkpointable as any Keras optimizer.
""" + _ARGS)

LEGACY = Legacy(
    name="RowWiseAdagrad", base=None, slots=("accumulator",),
    hyper=dict(lr="lr_t", epsilon="epsilon"),
    new=NewOptimizer(default_name="RowWiseAdagrad", **_NEW),
    doc="""Keras 2 row-wise Adagrad (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``) with fused kernels:
    slot ``accumulator`` of shape ``var.shape[:1]`` per variable,
    ``acc[r] += mean(g[r]²)``, ``var[r] -= lr/(sqrt(acc[r])+epsilon)*g[r]``; sparse gradients
    update only the rows they touch. An ``OptimizerV2`` of its own (Keras has no such class).
""" + _ARGS)

COMPAT_V1 = CompatV1(
    name="RowWiseAdagradOptimizer",
    signature=(("learning_rate", REQUIRED), ("initial_accumulator_value", 0.1),
               ("epsilon", 1e-7), ("use_locking", False), ("name", "RowWiseAdagrad")),
    slots=(("accumulator", "initial_accumulator_value"),),
    hyper=dict(lr="learning_rate", epsilon="epsilon"),
    check=_check_accumulator,
    doc="""Row-wise Adagrad (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``) on fusedopt's fused ops, as a
    ``tf.compat.v1.train.Optimizer``:

        accumulator[r] <- accumulator[r] + mean(g[r]*g[r])
        var[r]         <- var[r] - lr / (sqrt(accumulator[r]) + epsilon) * g[r]

    Slot ``accumulator`` per variable, one value per row (shape ``var.shape[:1]``),
    starting at ``initial_accumulator_value``. ``IndexedSlices`` gradients update only the
    named rows (repeated indices count as one row with the sum of their gradients).

    Args:
      learning_rate: float, tensor or callable returning one.
      initial_accumulator_value: starting value of the accumulators; must not be negative.
      epsilon: added to ``sqrt(accumulator)``.
      use_locking: passed to the ops (lock var and slots while updating).
      name: the name of the slot variables' scope.

    Raises:
      ValueError: if ``initial_accumulator_value`` is negative.
    """)
