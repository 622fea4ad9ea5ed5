"""RMSprop with momentum (TF ``ApplyRMSProp``; Keras ``RMSprop`` with ``momentum > 0``;
``tf.compat.v1.train.RMSPropOptimizer``). Epsilon sits inside the square root.

Keras's ``centered=True`` and Keras's ``momentum=0`` run the base class's own update (the
centered form needs a third slot: it would be a rule of its own, as TF has
``ApplyCenteredRMSProp`` beside ``ApplyRMSProp``; without momentum Keras keeps no
momentum slot for the rule to update). The compat.v1 class always has the momentum slot
(as TF's) and rejects ``centered=True``.

C++: ``cc/core/rules/rms_prop.h`` (``RmsPropRule``).
"""
import tensorflow as tf

from fusedopt.rules._front import REQUIRED, Attr, CompatV1, Keras, LearningRate, Legacy

MATH = "ms += (g²-ms)(1-rho); mom = momentum·mom + lr·g/sqrt(ms+epsilon); var -= mom"


def composed(var, slots, g, h, o):
    ms, mom = slots
    ms = ms + (g * g - ms) * (1 - h["rho"])
    mom = mom * h["momentum"] + (g * h["lr"]) / tf.sqrt(ms + h["epsilon"])
    return var - mom, [ms, mom]


KERAS = Keras(
    name="RMSprop", base="RMSprop", slots=("_velocities", "_momentums"),
    hyper=dict(lr=LearningRate(), rho=Attr("rho"), momentum=Attr("momentum"),
               epsilon=Attr("epsilon")),
    own_update_when=lambda opt: opt.centered or not opt.momentum > 0,
    doc="""RMSprop with fused kernels (same arguments, variables and dense numbers as
    ``keras.optimizers.RMSprop``) when ``momentum > 0`` and not ``centered``; otherwise
    Keras's own update. Sparse gradients update only the rows they touch::

        velocity <- rho*velocity + (1-rho)*g*g
        m <- momentum*m + learning_rate*g/sqrt(velocity + epsilon);  var <- var - m

    Args:
      learning_rate: float, ``keras.optimizers.schedules.LearningRateSchedule``, or a
        callable taking no argument and returning the value (default 0.001).
      rho: discounting factor of the gradient history ``velocity`` (default 0.9).
      momentum: momentum factor (default 0.0: Keras's own update; > 0: fused).
      epsilon: added to ``velocity`` inside the square root (default 1e-7).
      centered: normalise by the centered second moment (Keras's own update; default
        False).""")

LEGACY = Legacy(
    name="RMSprop", base="RMSprop", slots=("rms", "momentum"),
    hyper=dict(lr="lr_t", rho="rho", momentum="momentum", epsilon="epsilon"),
    own_update_when=lambda opt: opt.centered or not opt._momentum,
    doc="""Keras 2 ``RMSprop`` with fused kernels when ``momentum > 0`` and not ``centered``
    (TF ``ApplyRMSProp``), else Keras's own update; sparse gradients update only touched
    rows.

    Args:
      learning_rate: float, tensor, ``LearningRateSchedule`` or callable returning the
        value (default 0.001).
      rho: discounting factor of the gradient history ``rms`` (default 0.9).
      momentum: momentum factor (default 0.0: Keras's own update; > 0: fused).
      epsilon: added to ``rms`` inside the square root (default 1e-7).
      centered: normalise by the centered second moment (Keras's own update; default
        False).""")


def _not_centered(arguments):
    if arguments["centered"]:
        raise ValueError("centered=True: fusedopt has no centered RMSprop rule yet; use "
                         "tf.compat.v1.train.RMSPropOptimizer")


COMPAT_V1 = CompatV1(
    name="RMSPropOptimizer",
    signature=(("learning_rate", REQUIRED), ("decay", 0.9), ("momentum", 0.0),
               ("epsilon", 1e-10), ("use_locking", False), ("centered", False),
               ("name", "RMSProp")),
    slots=(("rms", 1.0), ("momentum", None)),
    hyper=dict(lr="learning_rate", rho="decay", momentum="momentum", epsilon="epsilon"),
    check=_not_centered,
    anchor="RMSPropOptimizer",
    doc="""RMSprop, on fusedopt's fused ops.

    A drop-in replacement for ``tf.compat.v1.train.RMSPropOptimizer`` (not centered)::

        rms <- rms + (g*g - rms)*(1-decay)
        mom <- momentum*mom + lr*g/sqrt(rms + epsilon);  var <- var - mom

    ``IndexedSlices`` gradients update only the named rows (repeated indices count as one
    row with the sum of their gradients), as TF's sparse RMSProp does.

    Slots ``rms`` (starting at 1, as TF's) and ``momentum`` (``mom`` above) per variable.

    Args:
      learning_rate: float, tensor or callable returning one.
      decay: discounting factor of the gradient history (TF's name for rho).
      momentum: momentum factor.
      epsilon: added to ``rms`` inside the square root.
      use_locking: passed to the ops (lock var and slots while updating).
      centered: must be False (no centered rule yet).
      name: the name of the slot variables' scope.

    Raises:
      ValueError: if ``centered`` is true.
    """)
