"""Fused-kernel drop-ins for the Keras 2 ``OptimizerV2`` optimizers (the legacy API).

For code on ``tf_keras`` (TF >= 2.16, usually with ``TF_USE_LEGACY_KERAS=1``) and on
``tf.keras.optimizers.legacy`` (TF 2.15): ``fusedopt.keras.legacy.LazyAdam``, ``Adamax``,
``Adagrad``, ... (one per rule, from its ``LEGACY`` spec) subclass that API's
``Adam``/``Adamax``/``Adagrad``/... and keep their
arguments (``learning_rate``, ``beta_1``, ``beta_2``, ``epsilon``, ``name``, ``clipnorm``,
``clipvalue``, ``lr``, ``decay``, ...), slots (``m``/``v``, ``accumulator``), config and
methods; only the updates change (``_resource_apply_dense``/``_resource_apply_sparse``, and
the dense updates of a step go to one group op per device and dtype). Dense numbers
are those of the Keras optimizer (TF ``ApplyAdam``/``ApplyAdaMax``/``ApplyAdagradV2``:
Adagrad's epsilon outside the square root); sparse gradients update only touched rows.

    model.compile(optimizer=fusedopt.keras.legacy.LazyAdam(1e-3), ...)
"""

import functools
import inspect

import tensorflow as tf

from fusedopt import rules as _rules
from fusedopt import _compact, _dispatch, _packs
from fusedopt.rules._front import (bind_new_optimizer, new_optimizer_base,
                                   new_optimizer_signature)


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


class _FusedApply(_packs.PacksOfOptimizer):
    """Mixin: fused dense and sparse resource updates of a ``Legacy`` spec, for
    OptimizerV2 subclasses (the class's ``_fused_spec``)."""

    _fused_rule = None
    _fused_spec = None
    _fused_composed = False
    # Compact slots (fusedopt._compact): set by the constructor's keywords of these names.
    slot_dtype = None
    stochastic_rounding = False

    def get_config(self):
        config = super().get_config()
        config.update(_compact.config(self.slot_dtype, self.stochastic_rounding))
        return config

    # The rule's slots of a float32 variable in slot_dtype: add_slot gives a slot the
    # variable's true_dtype (as for a mixed-precision variable).
    def add_slot(self, var, slot_name, initializer="zeros", shape=None):
        dtype = _compact.slot_dtype_for(getattr(var, "true_dtype", var.dtype), self.slot_dtype)
        if slot_name in self._fused_spec.slots and dtype != var.dtype.base_dtype:
            _compact.check_strategy(dtype)
            var = _compact.SlotDtypeView(var, dtype)
        return super().add_slot(var, slot_name, initializer, shape)

    def _coefficients(self, var, apply_state):
        var_device, var_dtype = var.device, var.dtype.base_dtype
        return (apply_state or {}).get((var_device, var_dtype)) or \
            self._fallback_apply_state(var_device, var_dtype)

    def _keeps_own_update(self):
        return self._fused_spec.keeps_own_update(self)

    def _rounding(self):
        """The ops' stochastic_rounding and rounding_seed: the step counter (iterations),
        so that each step's rounding is fresh."""
        if not self.stochastic_rounding:
            return {"stochastic_rounding": False}
        return {"stochastic_rounding": True, "rounding_seed": self.iterations}

    def _fused_slots(self, var):
        """The rule's slots of `var`, in rule order."""
        slots = [self.get_slot(var, name) for name in self._fused_spec.slots]
        _compact.check_slots(self, var, slots, self.slot_dtype, self.stochastic_rounding)
        return slots

    def _fused(self, grad, var, apply_state):
        c = self._coefficients(var, apply_state)
        spec = self._fused_spec
        hyper = {name: c[key] for name, key in spec.hyper.items()}
        op = _dispatch.apply(self._fused_rule, var, self._fused_slots(var), grad, hyper,
                             spec.options, composed=self._fused_composed,
                             use_locking=self._use_locking, **self._rounding(),
                             every_row=not spec.lazy_sparse)
        return tf.no_op() if op is None and not tf.executing_eagerly() else op

    # OptimizerV2 applies each variable in turn; the dense gradients of resource variables
    # without a constraint go to one group op per (device, dtype) first (apply_state's
    # coefficients are per (device, dtype) too), the rest through the base's loop, whose
    # iterations increment then waits for the group ops; in TF2 functions on member packs
    # (fusedopt/_packs.py: one captured handle for a group). Not under a tf.distribute
    # strategy (its update() runs per replica), nor where a subclass or the instance has its
    # own _resource_apply_dense (it must be called for every variable).
    def _distributed_apply(self, distribution, grads_and_vars, apply_state, name):
        if (self._keeps_own_update() or self._fused_composed or tf.distribute.has_strategy()
                or distribution is not tf.distribute.get_strategy()
                or _dispatch.overridden(self, "_resource_apply_dense", _FusedApply)):
            return super()._distributed_apply(distribution, grads_and_vars, apply_state, name)
        grads_and_vars = list(grads_and_vars)
        repeated = _dispatch.repeated_variables(grads_and_vars)
        grouped, rest = [], []
        for grad, var in grads_and_vars:
            ok = (_dispatch.identity(var) not in repeated and _dispatch.groupable(var, grad)
                  and getattr(var, "constraint", None) is None)
            (grouped if ok else rest).append((grad, var))
        spec = self._fused_spec
        group_ops = _dispatch.apply_group(
            self._fused_rule,
            [(var, self._fused_slots(var), grad) for grad, var in grouped],
            lambda var: {name: c for name, c in zip(
                spec.hyper, (self._coefficients(var, apply_state)[key]
                             for key in spec.hyper.values()))},
            spec.options, use_locking=self._use_locking,
            packs=self._fused_packs(), **self._rounding()) if grouped else {}
        with tf.control_dependencies(list({id(op): op for op in group_ops.values()}.values())):
            return super()._distributed_apply(distribution, rest, apply_state, name)

    def _fused_slot_variables(self):
        # OptimizerV2 tracks its slots as checkpoint slot variables, which no other object
        # may list as a dependency (the member packs' SavedModel dependencies skip them).
        return [slot for slots in self._slots.values() for slot in slots.values()]

    # Settings the rule does not cover (amsgrad, ...) and dtypes the ops do not take
    # (complex, integers): the replaced class's own update, as if unswapped.
    def _own_update(self, var, indices=None):
        return self._keeps_own_update() or not _dispatch.covers(var, indices)

    def _resource_apply_dense(self, grad, var, apply_state=None):
        if self._own_update(var):
            return super()._resource_apply_dense(grad, var, apply_state)
        return self._fused(grad, var, apply_state)

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        if self._own_update(var, indices):
            return super()._resource_apply_sparse(grad, var, indices, apply_state)
        return self._fused(tf.IndexedSlices(grad, indices), var, apply_state)

    def _resource_apply_sparse_duplicate_indices(self, grad, var, indices, **kwargs):
        if self._own_update(var, indices):
            return super()._resource_apply_sparse_duplicate_indices(grad, var, indices,
                                                                    **kwargs)
        # The sparse ops sum duplicate indices themselves.
        return self._resource_apply_sparse(grad, var, indices, **kwargs)


# Keras 2's optimizer arguments, documented once; each spec's doc ends with its rule's
# arguments (an ``Args:`` section) and these follow them.
_BASE_ARGS = """
      slot_dtype: fusedopt's own (keyword only, default None): "bfloat16" or "float16" to
        store the rule's slots of float32 variables in 16 bits (the update computes in
        float32 and rounds once on store). Only in the config when set.
      stochastic_rounding: fusedopt's own (keyword only, default False): round 16-bit slots
        stochastically (unbiased) instead of to nearest even; deterministic bits.
      name: name of the optimizer and of its slot variables' scope.
      **kwargs: Keras 2's optimizer keywords: ``clipnorm``, ``clipvalue`` and
        ``global_clipnorm`` (gradient clipping), ``lr`` (old name of ``learning_rate``),
        ``decay`` (inverse-time decay of the learning rate per step).
    """


def _new_optimizer(rule, spec):
    """The OptimizerV2 base of a rule Keras 2 has no class for (``spec.new``), written as
    Keras 2's optimizers are: ``learning_rate`` a hyper (``lr``, ``decay`` kept), the other
    arguments attributes, ``_create_slots`` in the rule's layouts (per row: shape
    ``var.shape[:1]``), ``_prepare_local`` giving the spec's coefficients, ``get_config``;
    its own updates are the rule in composed TF ops (where the fused op cannot run)."""
    new = spec.new
    declared = _rules.SPECS[rule]
    per_row = [declared["slot_layouts"][s] == "per_row" for s in declared["slots"]]
    signature = new_optimizer_signature(new)
    base = _legacy.Optimizer

    def __init__(self, *args, **kwargs):
        values, rest = bind_new_optimizer(new, signature, args, kwargs)
        learning_rate = rest.pop("lr", values.pop("learning_rate"))
        base.__init__(self, values.pop("name"), **rest)
        self._set_hyper("learning_rate", learning_rate)
        self._set_hyper("decay", self._initial_decay)
        for argument, value in values.items():
            setattr(self, argument, value)

    def _create_slots(self, var_list):
        for var in var_list:
            for slot_name, initial, row_wise in zip(spec.slots, new.slot_initial, per_row):
                value = getattr(self, initial) if initial else 0.0
                shape = var.shape[:1] if row_wise else var.shape
                self.add_slot(var, slot_name, _keras.initializers.Constant(value), shape=shape)

    powers = dict(new.powers)

    def _prepare_local(self, var_device, var_dtype, apply_state):
        base._prepare_local(self, var_device, var_dtype, apply_state)
        coefficients = {key: tf.convert_to_tensor(getattr(self, powers.get(key, key)), var_dtype)
                        for key in spec.hyper.values() if key != "lr_t"}
        if powers:  # as Keras 2's Adam: beta_1_power = beta_1 ** (iterations + 1)
            step = tf.cast(self.iterations + 1, var_dtype)
            coefficients.update({key: tf.pow(coefficients[key], step) for key in powers})
        apply_state[(var_device, var_dtype)].update(coefficients)

    def _composed(self, grad, var, indices, apply_state):
        c = self._coefficients(var, apply_state)
        slots = [self.get_slot(var, name) for name in spec.slots]
        hyper = {name: c[key] for name, key in spec.hyper.items()}
        if indices is not None:
            grad = tf.IndexedSlices(grad, indices)
        op = _dispatch.apply(rule, var, slots, grad, hyper, spec.options, composed=True,
                             **self._rounding())
        return tf.no_op() if op is None and not tf.executing_eagerly() else op

    def _resource_apply_dense(self, grad, var, apply_state=None):
        return _composed(self, grad, var, None, apply_state)

    def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
        return _composed(self, grad, var, indices, apply_state)

    def get_config(self):
        config = base.get_config(self)
        config.update(learning_rate=self._serialize_hyperparameter("learning_rate"),
                      decay=self._initial_decay)
        return config

    return new_optimizer_base(
        spec, base, signature,
        {"_HAS_AGGREGATE_GRAD": True, "__init__": __init__, "_create_slots": _create_slots,
         "_prepare_local": _prepare_local, "_resource_apply_dense": _resource_apply_dense,
         "_resource_apply_sparse": _resource_apply_sparse, "get_config": get_config},
        __name__, "Keras 2 optimizer")


def _with_compact_keywords(cls):
    """`cls` whose constructor also takes the compact-slot keywords (fusedopt._compact),
    which Keras 2's base would refuse; help() and inspect show them after the base's."""
    base_init = cls.__init__

    @functools.wraps(base_init)
    def __init__(self, *args, slot_dtype=None, stochastic_rounding=False, **kwargs):
        base_init(self, *args, **kwargs)
        # The rule of these settings (RMSprop(centered=True): its own), per instance.
        rule, spec = _rules.select_variant(self._fused_spec, "LEGACY", self)
        if rule is not None:
            self._fused_rule, self._fused_spec = rule, spec
        _compact.set_options(self, slot_dtype, stochastic_rounding)
        self._fused_spec.warn_if_own_update(self)

    __init__.__signature__ = _compact.with_keywords(inspect.signature(base_init),
                                                    _compact.KEYWORDS)
    cls.__init__ = __init__
    return cls


__all__ = _rules.define_classes(globals(), "LEGACY", lambda rule, spec: _register(
    _with_compact_keywords(_rules.fused_subclass(
        rule, spec, _FusedApply,
        getattr(_legacy, spec.base) if spec.base else _new_optimizer(rule, spec),
        __name__, _BASE_ARGS))))


def __dir__():  # the classes, not this module's plumbing
    return sorted(__all__)
