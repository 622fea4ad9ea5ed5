"""AdaMax (TF ``ApplyAdaMax``, Keras ``Adamax``, ``tf.contrib.opt.AdaMaxOptimizer``).

C++: ``cc/core/rules/adamax.h`` (``AdamaxRule``).
"""
import tensorflow as tf

from fusedopt.rules._front import Attr, CompatV1, Keras, LearningRate, Legacy, NonSlot, Power

__all__ = ["MATH", "composed", "KERAS", "LEGACY", "COMPAT_V1"]

MATH = "m += (g-m)(1-beta1); v = max(beta2·v, |g|); var -= lr/(1-beta1_power) · m/(v+epsilon)"


def composed(var, slots, g, h, o):
    m, v = slots
    m = m + (g - m) * (1 - h["beta1"])
    v = tf.maximum(h["beta2"] * v, tf.abs(g))
    return var - h["lr"] / (1 - h["beta1_power"]) * m / (v + h["epsilon"]), [m, v]


KERAS = Keras(
    name="Adamax", base="Adamax", slots=("_m", "_u"),
    hyper=dict(beta1_power=Power("beta_1"), lr=LearningRate(), beta1=Attr("beta_1"),
               beta2=Attr("beta_2"), epsilon=Attr("epsilon")),
    doc="""Adamax with fused kernels (same arguments, variables and dense numbers as
    ``keras.optimizers.Adamax``); sparse gradients update only the rows they touch:

        m <- beta_1*m + (1-beta_1)*g;  u <- max(beta_2*u, |g|)
        var <- var - learning_rate/(1-beta_1^t) * m/(u+epsilon)

    Args:
      learning_rate: float, ``keras.optimizers.schedules.LearningRateSchedule``, or a
        callable taking no argument and returning the value (default 0.001).
      beta_1: decay rate of the first moment ``m`` (float or callable, default 0.9).
      beta_2: decay rate of the infinity norm ``u`` (float or callable, default 0.999).
      epsilon: added to ``u`` (default 1e-7).""")

LEGACY = Legacy(
    name="Adamax", base="Adamax", slots=("m", "v"),
    hyper=dict(beta1_power="beta_1_power", lr="lr_t", beta1="beta_1_t", beta2="beta_2_t",
               epsilon="epsilon"),
    doc="""Keras 2 ``Adamax`` with fused kernels; sparse gradients update only touched rows.

    Args:
      learning_rate: float, tensor, ``LearningRateSchedule`` or callable returning the
        value (default 0.001).
      beta_1: decay rate of the first moment ``m`` (float, tensor or callable; 0.9).
      beta_2: decay rate of the infinity norm ``v`` (float, tensor or callable; 0.999).
      epsilon: added to ``v`` (default 1e-7).""")

COMPAT_V1 = CompatV1(
    name="AdamaxOptimizer",
    signature=(("learning_rate", 0.001), ("beta1", 0.9), ("beta2", 0.999), ("epsilon", 1e-08),
               ("use_locking", False), ("name", "AdaMax")),
    slots=(("m", None), ("v", None)),
    hyper=dict(beta1_power=NonSlot("beta1_power"), lr="learning_rate", beta1="beta1",
               beta2="beta2", epsilon="epsilon"),
    powers=(("beta1_power", "beta1"),),
    doc="""AdaMax (Kingma & Ba, 2015, section 7), on fusedopt's fused ops.

    Mirrors ``tf.contrib.opt.AdaMaxOptimizer`` (TF 1.15):

        m <- beta1*m + (1-beta1)*g;  v <- max(beta2*v, |g|)
        var <- var - lr/(1-beta1^t) * m/(v+epsilon)

    ``IndexedSlices`` gradients update only the named rows of ``var``, ``m`` and ``v``
    (repeated indices count as one row with the sum of their gradients), as contrib's
    sparse AdaMax did.

    Slots ``m`` and ``v`` per variable; one non-slot variable ``beta1_power``
    (``beta1^t``), multiplied by ``beta1`` after each ``apply_gradients``.

    Args:
      learning_rate: float, tensor or callable returning one.
      beta1: decay of the first moment (float, tensor or callable).
      beta2: decay of the infinity norm (float, tensor or callable).
      epsilon: added to ``v`` (float, tensor or callable).
      use_locking: passed to the ops (lock var and slots while updating).
      name: the name of the slot variables' scope (default ``"AdaMax"``, contrib's: slot
        names ``<var>/AdaMax``, ``<var>/AdaMax_1`` and checkpoints are contrib's).
    """)
