"""RMSprop with momentum (TF ``ApplyRMSProp``; Keras ``RMSprop`` with ``momentum > 0``;
``tf.compat.v1.train.RMSPropOptimizer``). Epsilon sits inside the square root.

The centered form is a rule of its own (``centered_rms_prop``: a third slot, as TF has
``ApplyCenteredRMSProp`` beside ``ApplyRMSProp``): ``RMSPropOptimizer(centered=True)`` runs
it, as do Keras's ``RMSprop(centered=True)`` classes with momentum. Keras's ``momentum=0``
runs the base class's own update (without momentum Keras keeps no momentum slot for the
rule to update).

C++: ``cc/core/rules/rms_prop.h`` (``RmsPropRule``, ``RmsPropForm<false>``).
"""
import tensorflow as tf

from fusedopt.rules._front import REQUIRED, Attr, CompatV1, Keras, LearningRate, Legacy

__all__ = ["MATH", "composed", "KERAS", "LEGACY", "COMPAT_V1", "COMPAT_V1_SIGNATURE",
           "COMPAT_V1_HYPER", "KERAS_HYPER", "LEGACY_HYPER"]

MATH = "ms += (g²-ms)(1-rho); mom = momentum·mom + lr·g/sqrt(ms+epsilon); var -= mom"


def composed(var, slots, g, h, o):
    ms, mom = slots
    ms = ms + (g * g - ms) * (1 - h["rho"])
    mom = mom * h["momentum"] + (g * h["lr"]) / tf.sqrt(ms + h["epsilon"])
    return var - mom, [ms, mom]


KERAS_HYPER = dict(lr=LearningRate(), rho=Attr("rho"), momentum=Attr("momentum"),
                   epsilon=Attr("epsilon"))
LEGACY_HYPER = dict(lr="lr_t", rho="rho", momentum="momentum", epsilon="epsilon")

KERAS = Keras(
    name="RMSprop", base="RMSprop", slots=("_velocities", "_momentums"),
    hyper=KERAS_HYPER,
    own_update_when=lambda opt: not opt.momentum > 0, own_update_setting="momentum=0",
    variants=((lambda opt: bool(opt.centered), "centered_rms_prop"),),
    doc="""RMSprop with fused kernels (same arguments, variables and dense numbers as
    ``keras.optimizers.RMSprop``) when ``momentum > 0``, centered or not; otherwise
    Keras's own update. Sparse gradients update only the rows they touch:

        velocity <- rho*velocity + (1-rho)*g*g
        m <- momentum*m + learning_rate*g/sqrt(velocity + epsilon);  var <- var - m

    ``centered=True`` also keeps the mean gradient ``average_gradient`` and divides by
    ``sqrt(velocity - average_gradient**2 + epsilon)`` (the centered rule's kernels).

    Args:
      learning_rate: float, ``keras.optimizers.schedules.LearningRateSchedule``, or a
        callable taking no argument and returning the value (default 0.001).
      rho: discounting factor of the gradient history ``velocity`` (default 0.9).
      momentum: momentum factor (default 0.0: Keras's own update; > 0: fused).
      epsilon: added to ``velocity`` inside the square root (default 1e-7).
      centered: normalise by the centered second moment, the gradient's estimated
        variance (default False; fused with momentum > 0).""")

LEGACY = Legacy(
    name="RMSprop", base="RMSprop", slots=("rms", "momentum"),
    hyper=LEGACY_HYPER,
    own_update_when=lambda opt: not opt._momentum, own_update_setting="momentum=0",
    variants=((lambda opt: bool(opt.centered), "centered_rms_prop"),),
    doc="""Keras 2 ``RMSprop`` with fused kernels when ``momentum > 0`` (TF ``ApplyRMSProp``;
    centered: ``ApplyCenteredRMSProp``), else Keras's own update; sparse gradients update
    only touched rows.

    Args:
      learning_rate: float, tensor, ``LearningRateSchedule`` or callable returning the
        value (default 0.001).
      rho: discounting factor of the gradient history ``rms`` (default 0.9).
      momentum: momentum factor (default 0.0: Keras's own update; > 0: fused).
      epsilon: added to ``rms`` inside the square root (default 1e-7).
      centered: normalise by the centered second moment, the gradient's estimated
        variance (default False; fused with momentum > 0).""")


COMPAT_V1_SIGNATURE = (("learning_rate", REQUIRED), ("decay", 0.9), ("momentum", 0.0),
                       ("epsilon", 1e-10), ("use_locking", False), ("centered", False),
                       ("name", "RMSProp"))
COMPAT_V1_HYPER = dict(lr="learning_rate", rho="decay", momentum="momentum", epsilon="epsilon")

COMPAT_V1 = CompatV1(
    name="RMSPropOptimizer",
    signature=COMPAT_V1_SIGNATURE,
    slots=(("rms", 1.0), ("momentum", None)),
    hyper=COMPAT_V1_HYPER,
    variants=((lambda arguments: bool(arguments["centered"]), "centered_rms_prop"),),
    anchor="RMSPropOptimizer",
    doc="""RMSprop, on fusedopt's fused ops.

    A drop-in replacement for ``tf.compat.v1.train.RMSPropOptimizer``, every setting:

        rms <- rms + (g*g - rms)*(1-decay)
        mom <- momentum*mom + lr*g/sqrt(rms + epsilon);  var <- var - mom

    and with ``centered=True`` (TF's ``ApplyCenteredRMSProp``):

        mg  <- mg + (g - mg)*(1-decay)
        mom <- momentum*mom + lr*g/sqrt(rms - mg*mg + epsilon)

    ``IndexedSlices`` gradients update only the named rows (repeated indices count as one
    row with the sum of their gradients), as TF's sparse RMSProp does.

    Slots ``rms`` (starting at 1, as TF's), ``momentum`` (``mom`` above) and, centered,
    ``mg`` per variable: TF's names, so checkpoints interchange.

    Args:
      learning_rate: float, tensor or callable returning one.
      decay: discounting factor of the gradient history (TF's name for rho).
      momentum: momentum factor.
      epsilon: added inside the square root.
      use_locking: passed to the ops (lock var and slots while updating).
      centered: normalise by the centered second moment (estimated variance); a third
        slot ``mg`` (the mean gradient).
      name: the name of the slot variables' scope.
    """)
