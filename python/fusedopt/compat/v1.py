"""``tf.compat.v1.train.Optimizer`` subclasses running fusedopt's fused update ops.

Drop-in replacements for TF1-style code (graph mode with ``tf.compat.v1.Session`` or
``tf.compat.v1.estimator.Estimator``, and eager mode)::

    opt = fusedopt.compat.v1.LazyAdamOptimizer(1e-3)   # was tf.contrib.opt.LazyAdamOptimizer
    opt = fusedopt.compat.v1.AdamaxOptimizer(1e-3)     # was tf.contrib.opt.AdaMaxOptimizer
    opt = fusedopt.compat.v1.AdagradOptimizer(0.1)     # was tf.compat.v1.train.AdagradOptimizer

Every update is one fused op: ref variables (``use_resource=False``, graph mode) use the
``FusedOpt>Apply*`` / ``FusedOpt>SparseApply*`` ops, resource variables the
``FusedOpt>ResourceApply*`` / ``FusedOpt>ResourceSparseApply*`` ops. ``IndexedSlices``
gradients (``tf.gather``, embedding lookups) go to the sparse ops as they are: repeated
indices are summed inside the kernel, not by a Python-level dedup, and rows that are not
named are left untouched (var and slots).

Slot and non-slot variables have the names TF's optimizers give them (slots ``m``, ``v``
/ ``accumulator``; non-slot ``beta1_power``, ``beta2_power`` colocated with the first
variable), so ``tf.compat.v1.train.Saver`` checkpoints written with
``tf.compat.v1.train.AdamOptimizer`` / ``AdagradOptimizer`` restore into these optimizers
and vice versa (object-based ``tf.train.Checkpoint`` dependencies match as well).
"""
import contextlib

import tensorflow as tf

from fusedopt import ops as _fused_ops

__all__ = ["LazyAdamOptimizer", "AdamaxOptimizer", "AdagradOptimizer"]


def _colocated_with(variable):
    """Places the ops created inside next to `variable` (graphs only; eager: no-op)."""
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    return tf.compat.v1.get_default_graph().colocate_with(variable)


class _FusedOptimizer(tf.compat.v1.train.Optimizer):
    """Shared plumbing: hyper-parameters, beta-power non-slots, dispatch to the fused ops.

    Subclasses set ``_RULE`` (a ``fusedopt.ops.RULES`` key), ``_SLOT_NAMES`` (TF's slot
    names, in the rule's slot order), ``_POWERS`` ((non-slot name, hyper-parameter name)
    pairs: variables starting at the hyper-parameter and multiplied by it after every
    step), and implement ``_create_var_slots`` and ``_op_hyper`` (the rule's
    hyper-parameters in op order).
    """

    _RULE = None
    _SLOT_NAMES = ()
    _POWERS = ()

    def __init__(self, hyper, use_locking, name):
        super().__init__(use_locking, name)
        self._hyper = dict(hyper)  # floats, tensors or callables, as given
        self._hyper_t = {}  # tensors, set by _prepare for one apply_gradients call

    # --- hyper-parameters and non-slot variables ------------------------------------

    def _prepare(self):
        for key, value in self._hyper.items():
            self._hyper_t[key] = tf.convert_to_tensor(self._call_if_callable(value),
                                                      name=key)

    def _create_slots(self, var_list):
        if self._POWERS:
            # As tf.compat.v1.train.AdamOptimizer: one copy per graph, next to the
            # variable whose name sorts first, so placement is deterministic.
            first_var = min(var_list, key=lambda x: x.name)
            for power_name, hyper_name in self._POWERS:
                self._create_non_slot_variable(initial_value=self._hyper[hyper_name],
                                               name=power_name, colocate_with=first_var)
        for var in var_list:
            self._create_var_slots(var)

    def _create_var_slots(self, var):
        raise NotImplementedError

    def _get_beta_accumulators(self):
        """The non-slot power variables of the current graph (eager: the only ones)."""
        with tf.init_scope():
            graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
            return tuple(self._get_non_slot_variable(power_name, graph=graph)
                         for power_name, _ in self._POWERS)

    def _finish(self, update_ops, name_scope):
        if not self._POWERS:
            return super()._finish(update_ops, name_scope)
        with tf.control_dependencies(update_ops):
            powers = self._get_beta_accumulators()
            with _colocated_with(powers[0]):
                updates = [power.assign(power * self._hyper_t[hyper_name],
                                        use_locking=self._use_locking)
                           for power, (_, hyper_name) in zip(powers, self._POWERS)]
        return tf.group(*(list(update_ops) + updates), name=name_scope)

    # --- updates ---------------------------------------------------------------------

    def _op_hyper(self):
        """The rule's hyper-parameters in op order (tensors/variables of any float type)."""
        raise NotImplementedError

    def _op_options(self):
        return {}

    def _fused_update(self, variant, var, grad, indices=None):
        dtype = var.dtype.base_dtype
        args = [var] + [self.get_slot(var, name) for name in self._SLOT_NAMES]
        args += [tf.cast(h, dtype) for h in self._op_hyper()]
        args.append(grad)
        if indices is not None:
            args.append(indices)
        fn = getattr(_fused_ops, "%s_%s" % (variant, self._RULE))
        return fn(*args, use_locking=self._use_locking, **self._op_options())

    def _apply_dense(self, grad, var):
        return self._fused_update("apply", var, grad).op

    def _resource_apply_dense(self, grad, var):
        return self._fused_update("resource_apply", var, grad)

    # The kernels sum repeated indices themselves: no Python-level dedup
    # (tf.compat.v1.train.Optimizer's default would add unique + unsorted_segment_sum).
    def _apply_sparse_duplicate_indices(self, grad, var):
        return self._fused_update("sparse_apply", var, grad.values, grad.indices).op

    def _apply_sparse(self, grad, var):
        return self._apply_sparse_duplicate_indices(grad, var)

    def _resource_apply_sparse_duplicate_indices(self, grad, var, indices):
        return self._fused_update("resource_sparse_apply", var, grad, indices)

    def _resource_apply_sparse(self, grad, var, indices):
        return self._resource_apply_sparse_duplicate_indices(grad, var, indices)


class _AdamFamily(_FusedOptimizer):
    _SLOT_NAMES = ("m", "v")

    def __init__(self, learning_rate, beta1, beta2, epsilon, use_locking, name):
        super().__init__(dict(learning_rate=learning_rate, beta1=beta1, beta2=beta2,
                              epsilon=epsilon), use_locking, name)

    def _create_var_slots(self, var):
        self._zeros_slot(var, "m", self._name)
        self._zeros_slot(var, "v", self._name)


class LazyAdamOptimizer(_AdamFamily):
    """Adam with lazy sparse updates, on fusedopt's fused ops.

    A drop-in replacement for ``tf.contrib.opt.LazyAdamOptimizer`` (TF 1.15) and for
    ``tf.compat.v1.train.AdamOptimizer``:

    - dense gradients: exactly Adam (the math of TF's ``ApplyAdam``)::

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
    """

    _RULE = "lazy_adam"
    _POWERS = (("beta1_power", "beta1"), ("beta2_power", "beta2"))

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-08,
                 use_locking=False, name="Adam"):
        super().__init__(learning_rate, beta1, beta2, epsilon, use_locking, name)

    def _op_hyper(self):
        beta1_power, beta2_power = self._get_beta_accumulators()
        h = self._hyper_t
        return (beta1_power, beta2_power, h["learning_rate"], h["beta1"], h["beta2"],
                h["epsilon"])


class AdamaxOptimizer(_AdamFamily):
    """AdaMax (Kingma & Ba, 2015, section 7), on fusedopt's fused ops.

    Mirrors ``tf.contrib.opt.AdaMaxOptimizer`` (TF 1.15)::

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
      name: the name of the slot variables' scope.
    """

    _RULE = "adamax"
    _POWERS = (("beta1_power", "beta1"),)

    def __init__(self, learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-08,
                 use_locking=False, name="Adamax"):
        super().__init__(learning_rate, beta1, beta2, epsilon, use_locking, name)

    def _op_hyper(self):
        (beta1_power,) = self._get_beta_accumulators()
        h = self._hyper_t
        return (beta1_power, h["learning_rate"], h["beta1"], h["beta2"], h["epsilon"])


class AdagradOptimizer(_FusedOptimizer):
    """Adagrad, on fusedopt's fused ops.

    A drop-in replacement for ``tf.compat.v1.train.AdagradOptimizer``. With
    ``epsilon=None`` (the default) it is that optimizer's update::

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
    """

    _RULE = "adagrad"
    _SLOT_NAMES = ("accumulator",)

    def __init__(self, learning_rate, initial_accumulator_value=0.1, use_locking=False,
                 name="Adagrad", epsilon=None):
        if initial_accumulator_value <= 0.0:
            raise ValueError("initial_accumulator_value must be positive: %s"
                             % initial_accumulator_value)
        hyper = dict(learning_rate=learning_rate)
        if epsilon is not None:
            hyper["epsilon"] = epsilon
        super().__init__(hyper, use_locking, name)
        self._initial_accumulator_value = initial_accumulator_value

    def _create_var_slots(self, var):
        dtype = var.dtype.base_dtype
        value = self._initial_accumulator_value
        if var.get_shape().is_fully_defined():
            init = tf.compat.v1.constant_initializer(value, dtype=dtype)
        else:
            def init():  # shape known only at run time, as in TF's AdagradOptimizer
                return tf.cast(tf.fill(tf.shape(var), value), dtype)
        self._get_or_make_slot_with_initializer(var, init, var.get_shape(), dtype,
                                                "accumulator", self._name)

    def _op_hyper(self):
        h = self._hyper_t
        return (h["learning_rate"], h.get("epsilon", 0.0))
