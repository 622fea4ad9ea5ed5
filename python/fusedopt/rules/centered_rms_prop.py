"""Centered RMSprop with momentum (TF ``ApplyCenteredRMSProp``): RMSprop normalised by the
gradient's estimated variance instead of its second moment. Epsilon inside the square root.

No class of its own: the RMSprop classes run it for ``centered=True`` (the RMSProp specs'
``variants``): ``fusedopt.compat.v1.RMSPropOptimizer(centered=True)`` (TF's
``RMSPropOptimizer``'s drop-in), and ``fusedopt.keras.RMSprop`` /
``fusedopt.keras.legacy.RMSprop`` with ``centered=True`` and ``momentum > 0``.

C++: ``cc/core/rules/rms_prop.h`` (``CenteredRmsPropRule``, ``RmsPropForm<true>``).
"""
import tensorflow as tf

from fusedopt.rules import rms_prop
from fusedopt.rules._front import CompatV1, Keras, Legacy

__all__ = ["MATH", "composed", "KERAS", "LEGACY", "COMPAT_V1"]

MATH = ("ms += (g²-ms)(1-rho); mg += (g-mg)(1-rho); "
        "mom = momentum·mom + lr·g/sqrt(ms-mg²+epsilon); var -= mom")


def composed(var, slots, g, h, o):
    ms, mom, mg = slots
    ms = ms + (g * g - ms) * (1 - h["rho"])
    mg = mg + (g - mg) * (1 - h["rho"])
    mom = mom * h["momentum"] + (g * h["lr"]) / tf.sqrt((ms - mg * mg) + h["epsilon"])
    return var - mom, [ms, mom, mg]


# Keras's RMSprop(centered=True): its mean-gradient slots beside velocity and momentum.
KERAS = Keras(
    name=None, base="RMSprop", slots=("_velocities", "_momentums", "_average_gradients"),
    hyper=rms_prop.KERAS_HYPER, own_update_when=rms_prop.KERAS.own_update_when,
    own_update_setting=rms_prop.KERAS.own_update_setting)

LEGACY = Legacy(
    name=None, base="RMSprop", slots=("rms", "momentum", "mg"),
    hyper=rms_prop.LEGACY_HYPER, own_update_when=rms_prop.LEGACY.own_update_when,
    own_update_setting=rms_prop.LEGACY.own_update_setting)

# RMSPropOptimizer(centered=True): TF's signature and slot names ("mg" beside "rms" and
# "momentum"), in the rule's slot order.
COMPAT_V1 = CompatV1(
    name=None,
    signature=rms_prop.COMPAT_V1_SIGNATURE,
    slots=(("rms", 1.0), ("momentum", None), ("mg", None)),
    hyper=rms_prop.COMPAT_V1_HYPER,
    anchor="RMSPropOptimizer")
