"""Adam (TF ``ApplyAdam``, Keras ``Adam``); on sparse gradients only the named rows change.

C++: ``cc/core/rules/lazy_adam.h`` (``LazyAdamRule``).
"""
import dataclasses

import tensorflow as tf

from fusedopt.rules._front import Attr, CompatV1, Keras, LearningRate, Legacy, NonSlot, Power

__all__ = ["MATH", "composed", "KERAS", "LEGACY", "COMPAT_V1", "MORE_CLASSES"]

MATH = ("m += (g-m)(1-beta1); v += (g²-v)(1-beta2); "
        "var -= lr·sqrt(1-beta2_power)/(1-beta1_power) · m/(sqrt(v)+epsilon)")


def composed(var, slots, g, h, o):
    m, v = slots
    m = m + (g - m) * (1 - h["beta1"])
    v = v + (g * g - v) * (1 - h["beta2"])
    alpha = h["lr"] * tf.sqrt(1 - h["beta2_power"]) / (1 - h["beta1_power"])
    direction = m * h["beta1"] + (1 - h["beta1"]) * g if o["use_nesterov"] else m
    return var - alpha * direction / (tf.sqrt(v) + h["epsilon"]), [m, v]


KERAS = Keras(
    name="LazyAdam", base="Adam", slots=("_momentums", "_velocities"),
    hyper=dict(beta1_power=Power("beta_1"), beta2_power=Power("beta_2"), lr=LearningRate(),
               beta1=Attr("beta_1"), beta2=Attr("beta_2"), epsilon=Attr("epsilon")),
    own_update_when="amsgrad", own_update_setting="amsgrad=True",
    doc="""Adam with fused kernels; sparse gradients update only the rows they touch.

    Same arguments, variables and dense numbers as ``keras.optimizers.Adam``
    (``amsgrad=True`` runs Keras's own Adam update). With ``tf.IndexedSlices`` gradients
    only the rows named by the indices are updated, moments included ("lazy" Adam):

        m <- beta_1*m + (1-beta_1)*g;  v <- beta_2*v + (1-beta_2)*g*g
        var <- var - learning_rate*sqrt(1-beta_2^t)/(1-beta_1^t) * m/(sqrt(v)+epsilon)

    Args:
      learning_rate: float, ``keras.optimizers.schedules.LearningRateSchedule``, or a
        callable taking no argument and returning the value (default 0.001).
      beta_1: decay rate of the first moment ``m`` (float or callable, default 0.9).
      beta_2: decay rate of the second moment ``v`` (float or callable, default 0.999).
      epsilon: added to ``sqrt(v)`` ("epsilon hat" of the Adam paper, default 1e-7).
      amsgrad: whether to use AMSGrad (Keras's own update, not fused; default False).""")

LEGACY = Legacy(
    name="LazyAdam", base="Adam", slots=("m", "v"),
    hyper=dict(beta1_power="beta_1_power", beta2_power="beta_2_power", lr="lr_t",
               beta1="beta_1_t", beta2="beta_2_t", epsilon="epsilon"),
    own_update_when="amsgrad", own_update_setting="amsgrad=True",
    doc="""Keras 2 ``Adam`` with fused kernels; sparse gradients update only touched rows
    (moments included). ``amsgrad=True`` runs Keras's own Adam updates.

    Takes ``tfa.optimizers.LazyAdam``'s arguments too, in the same order, and loads
    models saved with it (``custom_objects={"Addons>LazyAdam": LazyAdam}``;
    docs/MIGRATING.md). The default name is Keras's ``"Adam"`` (tfa's: ``"LazyAdam"``).

    Args:
      learning_rate: float, tensor, ``LearningRateSchedule`` or callable returning the
        value (default 0.001).
      beta_1: decay rate of the first moment ``m`` (float, tensor or callable; 0.9).
      beta_2: decay rate of the second moment ``v`` (float, tensor or callable; 0.999).
      epsilon: added to ``sqrt(v)`` ("epsilon hat" of the Adam paper, default 1e-7).
      amsgrad: whether to use AMSGrad (Keras's own update, not fused; default False).""")

def adam_compat_v1(default_name):
    """What every Adam-family ``tf.compat.v1`` class shares (CompatV1 fields): TF's
    ``AdamOptimizer`` constructor (with `default_name`), slots m and v, the op's Adam
    hyper-parameters from its arguments and the beta powers kept as non-slot variables."""
    return dict(
        signature=(("learning_rate", 0.001), ("beta1", 0.9), ("beta2", 0.999),
                   ("epsilon", 1e-08), ("use_locking", False), ("name", default_name)),
        slots=(("m", None), ("v", None)),
        hyper=dict(beta1_power=NonSlot("beta1_power"), beta2_power=NonSlot("beta2_power"),
                   lr="learning_rate", beta1="beta1", beta2="beta2", epsilon="epsilon"),
        powers=(("beta1_power", "beta1"), ("beta2_power", "beta2")))


COMPAT_V1 = CompatV1(
    name="LazyAdamOptimizer",
    **adam_compat_v1("Adam"),
    anchor="AdamOptimizer",
    doc="""Adam with lazy sparse updates, on fusedopt's fused ops.

    A drop-in replacement for ``tf.contrib.opt.LazyAdamOptimizer`` (TF 1.15), and for
    ``tf.compat.v1.train.AdamOptimizer`` where only touched rows should change (for
    ``AdamOptimizer``'s own sparse numbers: ``fusedopt.compat.v1.AdamOptimizer``):

    - dense gradients: exactly Adam (the math of TF's ``ApplyAdam``):

          m <- beta1*m + (1-beta1)*g;  v <- beta2*v + (1-beta2)*g*g
          var <- var - lr*sqrt(1-beta2^t)/(1-beta1^t) * m/(sqrt(v)+epsilon)

    - ``IndexedSlices`` gradients: the same update on the named rows only; ``m``, ``v``
      and ``var`` of all other rows stay as they are (contrib LazyAdam semantics).
      Repeated indices count as one row with the sum of their gradients.

    Slots ``m`` and ``v`` per variable; non-slot variables ``beta1_power`` and
    ``beta2_power`` (``beta1^t``, ``beta2^t``), multiplied by ``beta1``/``beta2`` after
    each ``apply_gradients``. The default ``name`` is ``"Adam"``, as contrib's, so
    variable names (``<var>/Adam``, ``<var>/Adam_1``) and checkpoints are those of
    ``AdamOptimizer``.

    Args:
      learning_rate: float, tensor or callable returning one.
      beta1: decay of the first moment (float, tensor or callable).
      beta2: decay of the second moment (float, tensor or callable).
      epsilon: added to ``sqrt(v)`` (float, tensor or callable).
      use_locking: passed to the ops (lock var and slots while updating).
      name: the name of the slot variables' scope.
    """)


# Adam with the replaced classes' sparse semantics: the same rule and op, every row updated.
_EVERY_ROW = """

    Sparse gradients (``tf.IndexedSlices``, an embedding's) update every row, as
    %s does: rows no id names take the update of a zero gradient (their ``m`` and ``v``
    decay, and ``var`` moves by the decayed moments). Repeated ids are summed first.
    fusedopt does it in one fused pass over the table, where the replaced class makes
    several: on the CPU the sparse op itself (``every_row=True``) reads and writes var,
    ``m`` and ``v`` once, with no gradient buffer of the table's size; on a GPU and under
    XLA the gradient is summed into such a buffer first, then the dense op runs.
    ``LazyAdam`` updates the touched rows only: the faster choice for large embedding
    tables, with other numbers."""

MORE_CLASSES = {
    "KERAS": (dataclasses.replace(
        KERAS, name="Adam", lazy_sparse=False,
        doc="""Adam with fused kernels: ``keras.optimizers.Adam``'s numbers, sparse gradients
    included.""" + _EVERY_ROW % "``keras.optimizers.Adam``" + KERAS.doc.split(
            '("lazy" Adam):')[1].replace("only the rows named by the indices", "every row")),),
    "LEGACY": (dataclasses.replace(
        LEGACY, name="Adam", lazy_sparse=False,
        doc="""Keras 2 ``Adam`` with fused kernels: its numbers, sparse gradients included.
    ``amsgrad=True`` runs Keras's own Adam updates.""" + _EVERY_ROW % "Keras 2's ``Adam``"
        + "\n\n    Args:" + LEGACY.doc.split("Args:")[1]),),
    "COMPAT_V1": (dataclasses.replace(
        COMPAT_V1, name="AdamOptimizer", lazy_sparse=False,
        doc="""Adam on fusedopt's fused ops: a drop-in for ``tf.compat.v1.train.AdamOptimizer``,
    sparse gradients included.""" + _EVERY_ROW % "``AdamOptimizer``" + """

          m <- beta1*m + (1-beta1)*g;  v <- beta2*v + (1-beta2)*g*g
          var <- var - lr*sqrt(1-beta2^t)/(1-beta1^t) * m/(sqrt(v)+epsilon)

    Slots, non-slot variables, default name and checkpoints are ``AdamOptimizer``'s.

    Args:""" + COMPAT_V1.doc.split("Args:")[1]),),
}
