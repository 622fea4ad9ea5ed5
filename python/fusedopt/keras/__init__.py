"""Fused-kernel drop-in replacements for the Keras optimizers (the current Keras API).

``fusedopt.keras.LazyAdam``, ``Adamax`` and ``Adagrad`` subclass the optimizers of
``tf.keras.optimizers`` as installed — Keras 3 on TF >= 2.16, Keras 2.15's new optimizer
on TF 2.15 (or tf_keras's with ``TF_USE_LEGACY_KERAS=1``) — and keep their constructor,
variables (slot names and layout), configuration and every base-class feature
(clipping, weight decay, EMA, loss scaling, gradient accumulation, schedules). Only
``update_step`` changes: it runs fusedopt's fused op (``tf.IndexedSlices`` gradients go
to the sparse op and update the touched rows only: lazy updates), in XLA-compiled steps
too (``fit(jit_compile=True)``: the ops have XLA kernels).

    model.compile(optimizer=fusedopt.keras.LazyAdam(1e-3), ...)   # was keras.optimizers.Adam

Keras 2 ``OptimizerV2`` classes: ``fusedopt.keras.legacy``; DTensor: ``fusedopt.keras.dtensor``.
"""

import tensorflow as tf

from fusedopt.keras import _dispatch

__all__ = ["LazyAdam", "Adamax", "Adagrad"]

_optimizers = tf.keras.optimizers
_register = tf.keras.utils.register_keras_serializable(package="fusedopt")


def _value(x):
    return x() if callable(x) else x


class _FusedUpdate:
    """Mixin: helpers shared by the three optimizers (Keras 3 and Keras 2.15 bases)."""

    _fused_composed = False  # True: always the composed form (DTensor subclasses)

    def _slot(self, slots, variable):
        if hasattr(self, "_get_variable_index"):  # Keras 3
            return slots[self._get_variable_index(variable)]
        return slots[self._index_dict[self._var_key(variable)]]  # Keras 2.15

    def _lr(self, variable, learning_rate):
        if learning_rate is None:  # Keras 2 passes no learning rate to update_step
            learning_rate = self.learning_rate
        return tf.cast(learning_rate, variable.dtype)

    def _keras_update_step(self, base, gradient, variable, learning_rate):
        if learning_rate is None:
            return base.update_step(self, gradient, variable)
        return base.update_step(self, gradient, variable, learning_rate)

    def _deduplicate_sparse_grad(self, grads):
        # Keras 2.15's apply_gradients sums duplicate sparse ids first (tf.unique + a
        # segment sum: a third of a 16K-id embedding step). The fused sparse ops, and the
        # composed form, sum them themselves, in the same order; Keras's own update
        # (amsgrad) still gets its deduplicated gradient. Keras 3 has no such step.
        if getattr(self, "amsgrad", False):
            return super()._deduplicate_sparse_grad(grads)
        return grads

    def _fused(self, rule, variable, slots, gradient, hyper, options=None):
        return _dispatch.apply(rule, variable, slots, gradient, hyper, options,
                               composed=self._fused_composed)


@_register
class LazyAdam(_FusedUpdate, _optimizers.Adam):
    """Adam with fused kernels; sparse gradients update only the rows they touch.

    Same arguments, variables and dense numbers as ``tf.keras.optimizers.Adam``
    (``amsgrad=True`` runs Keras's own Adam update). With ``tf.IndexedSlices`` gradients
    only the rows named by the indices are updated, moments included ("lazy" Adam)::

        m <- beta_1*m + (1-beta_1)*g;  v <- beta_2*v + (1-beta_2)*g*g
        var <- var - learning_rate*sqrt(1-beta_2^t)/(1-beta_1^t) * m/(sqrt(v)+epsilon)

    Args:
      learning_rate: float, ``keras.optimizers.schedules.LearningRateSchedule``, or a
        callable taking no argument and returning the value (default 0.001).
      beta_1: decay rate of the first moment ``m`` (float or callable, default 0.9).
      beta_2: decay rate of the second moment ``v`` (float or callable, default 0.999).
      epsilon: added to ``sqrt(v)`` ("epsilon hat" of the Adam paper, default 1e-7).
      amsgrad: whether to use AMSGrad (Keras's own update, not fused; default False).
      weight_decay: if set, decoupled weight decay (``var -= lr*weight_decay*var``) applied
        before the update, as in Keras.
      clipnorm: if set, each gradient is clipped to this norm.
      clipvalue: if set, each gradient is clipped to ``[-clipvalue, clipvalue]``.
      global_clipnorm: if set, the gradients are clipped together to this global norm.
      use_ema: whether to keep an exponential moving average of the weights (Keras's EMA).
      ema_momentum: momentum of that average (default 0.99).
      ema_overwrite_frequency: every how many steps the weights are overwritten with their
        average (None: never; call ``finalize_variable_values()``).
      loss_scale_factor: Keras 3: the loss is multiplied by it and the gradients divided
        by it (mixed precision); None: no scaling.
      gradient_accumulation_steps: Keras 3: apply the mean of this many steps' gradients
        every this many steps (None: every step).
      jit_compile: Keras 2.15: compile the update step with XLA (default True; the fused
        ops have XLA kernels).
      name: name of the optimizer and of its variables' scope.
      **kwargs: other keyword arguments of the Keras base optimizer.
    """

    def update_step(self, gradient, variable, learning_rate=None):
        if self.amsgrad:
            return self._keras_update_step(_optimizers.Adam, gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta1 = tf.cast(_value(self.beta_1), dtype)
        beta2 = tf.cast(_value(self.beta_2), dtype)
        hyper = dict(beta1_power=tf.pow(beta1, step), beta2_power=tf.pow(beta2, step),
                     lr=self._lr(variable, learning_rate), beta1=beta1, beta2=beta2,
                     epsilon=_value(self.epsilon))
        slots = [self._slot(self._momentums, variable), self._slot(self._velocities, variable)]
        return self._fused("lazy_adam", variable, slots, gradient, hyper)


@_register
class Adamax(_FusedUpdate, _optimizers.Adamax):
    """Adamax with fused kernels (same arguments, variables and dense numbers as
    ``tf.keras.optimizers.Adamax``); sparse gradients update only the rows they touch::

        m <- beta_1*m + (1-beta_1)*g;  u <- max(beta_2*u, |g|)
        var <- var - learning_rate/(1-beta_1^t) * m/(u+epsilon)

    Args:
      learning_rate: float, ``keras.optimizers.schedules.LearningRateSchedule``, or a
        callable taking no argument and returning the value (default 0.001).
      beta_1: decay rate of the first moment ``m`` (float or callable, default 0.9).
      beta_2: decay rate of the infinity norm ``u`` (float or callable, default 0.999).
      epsilon: added to ``u`` (default 1e-7).
      weight_decay: if set, decoupled weight decay (``var -= lr*weight_decay*var``) applied
        before the update, as in Keras.
      clipnorm: if set, each gradient is clipped to this norm.
      clipvalue: if set, each gradient is clipped to ``[-clipvalue, clipvalue]``.
      global_clipnorm: if set, the gradients are clipped together to this global norm.
      use_ema: whether to keep an exponential moving average of the weights (Keras's EMA).
      ema_momentum: momentum of that average (default 0.99).
      ema_overwrite_frequency: every how many steps the weights are overwritten with their
        average (None: never; call ``finalize_variable_values()``).
      loss_scale_factor: Keras 3: the loss is multiplied by it and the gradients divided
        by it (mixed precision); None: no scaling.
      gradient_accumulation_steps: Keras 3: apply the mean of this many steps' gradients
        every this many steps (None: every step).
      jit_compile: Keras 2.15: compile the update step with XLA (default True; the fused
        ops have XLA kernels).
      name: name of the optimizer and of its variables' scope.
      **kwargs: other keyword arguments of the Keras base optimizer.
    """

    def update_step(self, gradient, variable, learning_rate=None):
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta1 = tf.cast(_value(self.beta_1), dtype)
        hyper = dict(beta1_power=tf.pow(beta1, step), lr=self._lr(variable, learning_rate),
                     beta1=beta1, beta2=_value(self.beta_2), epsilon=_value(self.epsilon))
        slots = [self._slot(self._m, variable), self._slot(self._u, variable)]
        return self._fused("adamax", variable, slots, gradient, hyper)


@_register
class Adagrad(_FusedUpdate, _optimizers.Adagrad):
    """Adagrad with fused kernels (same arguments, variables and dense numbers as
    ``tf.keras.optimizers.Adagrad``: ``var -= lr*g/sqrt(accumulator + epsilon)``);
    sparse gradients update only the rows they touch.

    Args:
      learning_rate: float, ``keras.optimizers.schedules.LearningRateSchedule``, or a
        callable taking no argument and returning the value (default 0.001).
      initial_accumulator_value: starting value of the accumulators (default 0.1).
      epsilon: added to the accumulator inside the square root (default 1e-7).
      weight_decay: if set, decoupled weight decay (``var -= lr*weight_decay*var``) applied
        before the update, as in Keras.
      clipnorm: if set, each gradient is clipped to this norm.
      clipvalue: if set, each gradient is clipped to ``[-clipvalue, clipvalue]``.
      global_clipnorm: if set, the gradients are clipped together to this global norm.
      use_ema: whether to keep an exponential moving average of the weights (Keras's EMA).
      ema_momentum: momentum of that average (default 0.99).
      ema_overwrite_frequency: every how many steps the weights are overwritten with their
        average (None: never; call ``finalize_variable_values()``).
      loss_scale_factor: Keras 3: the loss is multiplied by it and the gradients divided
        by it (mixed precision); None: no scaling.
      gradient_accumulation_steps: Keras 3: apply the mean of this many steps' gradients
        every this many steps (None: every step).
      jit_compile: Keras 2.15: compile the update step with XLA (default True; the fused
        ops have XLA kernels).
      name: name of the optimizer and of its variables' scope.
      **kwargs: other keyword arguments of the Keras base optimizer.
    """

    def update_step(self, gradient, variable, learning_rate=None):
        hyper = dict(lr=self._lr(variable, learning_rate), epsilon=_value(self.epsilon))
        slots = [self._slot(self._accumulators, variable)]
        return self._fused("adagrad", variable, slots, gradient, hyper,
                           {"epsilon_inside_sqrt": True})
