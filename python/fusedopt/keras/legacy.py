"""Fused-kernel drop-ins for the Keras 2 ``OptimizerV2`` optimizers (the legacy API).

For code on ``tf_keras`` (TF >= 2.16, usually with ``TF_USE_LEGACY_KERAS=1``) and on
``tf.keras.optimizers.legacy`` (TF 2.15): ``fusedopt.keras.legacy.LazyAdam``, ``Adamax``
and ``Adagrad`` subclass that API's ``Adam``/``Adamax``/``Adagrad`` and keep their
arguments (``learning_rate``, ``beta_1``, ``beta_2``, ``epsilon``, ``name``, ``clipnorm``,
``clipvalue``, ``lr``, ``decay``, ...), slots (``m``/``v``, ``accumulator``), config and
methods; only ``_resource_apply_dense``/``_resource_apply_sparse`` change. Dense numbers
are those of the Keras optimizer (TF ``ApplyAdam``/``ApplyAdaMax``/``ApplyAdagradV2``:
Adagrad's epsilon outside the square root); sparse gradients update only touched rows.

    model.compile(optimizer=fusedopt.keras.legacy.LazyAdam(1e-3), ...)
"""

import tensorflow as tf

from fusedopt.keras import _dispatch


def _keras2():
    """The Keras 2 package whose OptimizerV2 we extend (tf.keras on TF < 2.16, else tf_keras)."""
    major, minor = (int(x) for x in tf.__version__.split(".")[:2])
    if (major, minor) < (2, 16):
        return tf.keras
    import tf_keras  # TF >= 2.16: Keras 2 lives on as tf_keras

    return tf_keras


_keras = _keras2()
_legacy = _keras.optimizers.legacy
# A package of its own: on TF 2.15 fusedopt.keras registers "fusedopt>LazyAdam" etc. in
# the same registry.
_register = _keras.utils.register_keras_serializable(package="fusedopt.legacy")

__all__ = ["LazyAdam", "Adamax", "Adagrad"]


class _FusedApply:
    """Mixin: fused dense and sparse resource updates for OptimizerV2 subclasses."""

    _fused_rule = None
    _fused_options = {}
    _fused_composed = False

    def _coefficients(self, var, apply_state):
        var_device, var_dtype = var.device, var.dtype.base_dtype
        return (apply_state or {}).get((var_device, var_dtype)) or \
            self._fallback_apply_state(var_device, var_dtype)

    def _fused(self, grad, var, apply_state):
        c = self._coefficients(var, apply_state)
        slots = [self.get_slot(var, name) for name in self._fused_slot_names]
        hyper = {name: c[key] for name, key in self._fused_hyper.items()}
        op = _dispatch.apply(self._fused_rule, var, slots, grad, hyper, self._fused_options,
                             composed=self._fused_composed, use_locking=self._use_locking)
        return tf.no_op() if op is None and not tf.executing_eagerly() else op

    def _resource_apply_dense(self, grad, var, apply_state=None):
        return self._fused(grad, var, apply_state)

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        return self._fused(tf.IndexedSlices(grad, indices), var, apply_state)

    def _resource_apply_sparse_duplicate_indices(self, grad, var, indices, **kwargs):
        # The sparse ops sum duplicate indices themselves.
        return self._resource_apply_sparse(grad, var, indices, **kwargs)


@_register
class LazyAdam(_FusedApply, _legacy.Adam):
    """Keras 2 ``Adam`` with fused kernels; sparse gradients update only touched rows
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
      amsgrad: whether to use AMSGrad (Keras's own update, not fused; default False).
      name: name of the optimizer and of its slot variables' scope.
      **kwargs: Keras 2's optimizer keywords: ``clipnorm``, ``clipvalue`` and
        ``global_clipnorm`` (gradient clipping), ``lr`` (old name of ``learning_rate``),
        ``decay`` (inverse-time decay of the learning rate per step).
    """

    _fused_rule = "lazy_adam"
    _fused_slot_names = ("m", "v")
    _fused_hyper = dict(beta1_power="beta_1_power", beta2_power="beta_2_power", lr="lr_t",
                        beta1="beta_1_t", beta2="beta_2_t", epsilon="epsilon")

    def _resource_apply_dense(self, grad, var, apply_state=None):
        if self.amsgrad:
            return _legacy.Adam._resource_apply_dense(self, grad, var, apply_state)
        return self._fused(grad, var, apply_state)

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        if self.amsgrad:
            return _legacy.Adam._resource_apply_sparse(self, grad, var, indices, apply_state)
        return self._fused(tf.IndexedSlices(grad, indices), var, apply_state)

    def _resource_apply_sparse_duplicate_indices(self, grad, var, indices, **kwargs):
        if self.amsgrad:
            return _legacy.Adam._resource_apply_sparse_duplicate_indices(
                self, grad, var, indices, **kwargs)
        return self._resource_apply_sparse(grad, var, indices, **kwargs)


@_register
class Adamax(_FusedApply, _legacy.Adamax):
    """Keras 2 ``Adamax`` with fused kernels; sparse gradients update only touched rows.

    Args:
      learning_rate: float, tensor, ``LearningRateSchedule`` or callable returning the
        value (default 0.001).
      beta_1: decay rate of the first moment ``m`` (float, tensor or callable; 0.9).
      beta_2: decay rate of the infinity norm ``v`` (float, tensor or callable; 0.999).
      epsilon: added to ``v`` (default 1e-7).
      name: name of the optimizer and of its slot variables' scope.
      **kwargs: Keras 2's optimizer keywords: ``clipnorm``, ``clipvalue`` and
        ``global_clipnorm`` (gradient clipping), ``lr`` (old name of ``learning_rate``),
        ``decay`` (inverse-time decay of the learning rate per step).
    """

    _fused_rule = "adamax"
    _fused_slot_names = ("m", "v")
    _fused_hyper = dict(beta1_power="beta_1_power", lr="lr_t", beta1="beta_1_t",
                        beta2="beta_2_t", epsilon="epsilon")


@_register
class Adagrad(_FusedApply, _legacy.Adagrad):
    """Keras 2 ``Adagrad`` with fused kernels (``var -= lr*g/(sqrt(acc)+epsilon)``, TF
    ``ApplyAdagradV2``); sparse gradients update only touched rows.

    Args:
      learning_rate: float, tensor, ``LearningRateSchedule`` or callable returning the
        value (default 0.001).
      initial_accumulator_value: starting value of the accumulators (default 0.1).
      epsilon: added to ``sqrt(accumulator)`` (default 1e-7).
      name: name of the optimizer and of its slot variables' scope.
      **kwargs: Keras 2's optimizer keywords: ``clipnorm``, ``clipvalue`` and
        ``global_clipnorm`` (gradient clipping), ``lr`` (old name of ``learning_rate``),
        ``decay`` (inverse-time decay of the learning rate per step).
    """

    _fused_rule = "adagrad"
    _fused_slot_names = ("accumulator",)
    _fused_hyper = dict(lr="lr_t", epsilon="epsilon")
    _fused_options = {"epsilon_inside_sqrt": False}
