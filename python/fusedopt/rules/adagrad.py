"""Adagrad in the three forms users migrate from (where epsilon sits):

- ``tf.compat.v1.train.AdagradOptimizer``: ``var -= lr·g/sqrt(acc)`` (epsilon = 0);
- ``ApplyAdagradV2`` / tf_keras: ``var -= lr·g/(sqrt(acc)+epsilon)`` (the default);
- Keras >= 2.11 and Keras 3: ``var -= lr·g/sqrt(acc+epsilon)`` (``epsilon_inside_sqrt``).

C++: ``cc/core/rules/adagrad.h`` (``AdagradRule``).
"""
import tensorflow as tf

from fusedopt.rules._front import REQUIRED, ArgOr, Attr, CompatV1, Keras, LearningRate, Legacy

__all__ = ["MATH", "composed", "KERAS", "LEGACY", "COMPAT_V1"]

MATH = ("acc += g² (update_slots); "
        "var -= lr·g/(sqrt(acc)+epsilon), or /sqrt(acc+epsilon) with epsilon_inside_sqrt")


def composed(var, slots, g, h, o):
    (accum,) = slots
    if o["update_slots"]:
        accum = accum + g * g
    eps = h["epsilon"]
    denom = tf.sqrt(accum + eps) if o["epsilon_inside_sqrt"] else tf.sqrt(accum) + eps
    return var - h["lr"] * g / denom, [accum]


KERAS = Keras(
    name="Adagrad", base="Adagrad", slots=("_accumulators",),
    hyper=dict(lr=LearningRate(), epsilon=Attr("epsilon")),
    options={"epsilon_inside_sqrt": True},
    doc="""Adagrad with fused kernels (same arguments, variables and dense numbers as
    ``keras.optimizers.Adagrad``: ``var -= lr*g/sqrt(accumulator + epsilon)``);
    sparse gradients update only the rows they touch.

    Args:
      learning_rate: float, ``keras.optimizers.schedules.LearningRateSchedule``, or a
        callable taking no argument and returning the value (default 0.001).
      initial_accumulator_value: starting value of the accumulators (default 0.1).
      epsilon: added to the accumulator inside the square root (default 1e-7).""")

LEGACY = Legacy(
    name="Adagrad", base="Adagrad", slots=("accumulator",),
    hyper=dict(lr="lr_t", epsilon="epsilon"),
    options={"epsilon_inside_sqrt": False},
    doc="""Keras 2 ``Adagrad`` with fused kernels (``var -= lr*g/(sqrt(acc)+epsilon)``, TF
    ``ApplyAdagradV2``); sparse gradients update only touched rows.

    Args:
      learning_rate: float, tensor, ``LearningRateSchedule`` or callable returning the
        value (default 0.001).
      initial_accumulator_value: starting value of the accumulators (default 0.1).
      epsilon: added to ``sqrt(accumulator)`` (default 1e-7).""")


def _check_accumulator(arguments):
    if arguments["initial_accumulator_value"] <= 0.0:
        raise ValueError("initial_accumulator_value must be positive: %s"
                         % arguments["initial_accumulator_value"])


COMPAT_V1 = CompatV1(
    name="AdagradOptimizer",
    signature=(("learning_rate", REQUIRED), ("initial_accumulator_value", 0.1),
               ("use_locking", False), ("name", "Adagrad"), ("epsilon", None)),
    slots=(("accumulator", "initial_accumulator_value"),),
    hyper=dict(lr="learning_rate", epsilon=ArgOr("epsilon", 0.0)),
    check=_check_accumulator,
    anchor="AdagradOptimizer",
    doc="""Adagrad, on fusedopt's fused ops.

    A drop-in replacement for ``tf.compat.v1.train.AdagradOptimizer``. With
    ``epsilon=None`` (the default) it is that optimizer's update:

        accumulator <- accumulator + g*g;  var <- var - lr * g/sqrt(accumulator)

    With ``epsilon`` given it is the V2 form (``ApplyAdagradV2``, tf_keras), epsilon
    outside the square root: ``var <- var - lr * g/(sqrt(accumulator)+epsilon)``.
    ``IndexedSlices`` gradients update only the named rows (repeated indices count as
    one row with the sum of their gradients).

    Slot ``accumulator`` per variable, starting at ``initial_accumulator_value``.

    Args:
      learning_rate: float, tensor or callable returning one.
      initial_accumulator_value: starting value of the accumulators; must be positive.
      use_locking: passed to the ops (lock var and slots while updating).
      name: the name of the slot variables' scope.
      epsilon: None (tf.compat.v1 semantics), or a float, tensor or callable (V2 form).

    Raises:
      ValueError: if ``initial_accumulator_value`` is not positive.
    """)
