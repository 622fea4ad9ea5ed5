"""``tf.compat.v1.train.Optimizer`` subclasses running fusedopt's fused update ops.

Drop-in replacements for TF1-style code (graph mode with ``tf.compat.v1.Session`` or
``tf.compat.v1.estimator.Estimator``, and eager mode), one per rule of the registry, built
from the rule's ``COMPAT_V1`` spec (``fusedopt/rules/<rule>.py``):

    opt = fusedopt.compat.v1.LazyAdamOptimizer(1e-3)   # was tf.contrib.opt.LazyAdamOptimizer
    opt = fusedopt.compat.v1.AdamaxOptimizer(1e-3)     # was tf.contrib.opt.AdaMaxOptimizer
    opt = fusedopt.compat.v1.AdagradOptimizer(0.1)     # was tf.compat.v1.train.AdagradOptimizer

Every update is one fused op (the dense updates of resource variables in one
``apply_gradients`` call: one group op per dtype and device, which each of those variables'
``_resource_apply_dense`` returns; a method called from outside that loop, or overridden by
a subclass, updates its variable alone): ref variables (``use_resource=False``, graph mode) use the
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
import inspect
import threading

import tensorflow as tf
from tensorflow.python.training import optimizer as _tf_optimizer

from fusedopt import ops as _fused_ops
from fusedopt import rules as _rules
from fusedopt import _compact, _dispatch, reference
from fusedopt.rules._front import REQUIRED, ArgOr, NonSlot


def _colocated_with(variable):
    """Places the ops created inside next to `variable` (graphs only; eager: no-op)."""
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    return tf.compat.v1.get_default_graph().colocate_with(variable)


# Per thread: {id(optimizer): [the _Call of each apply_gradients call running]}.
_calls = threading.local()

# The non-slot step counter that seeds stochastic rounding (made only with it).
_ROUNDING_STEP = "rounding_step"


class _FusedOptimizer(tf.compat.v1.train.Optimizer):
    """Shared plumbing: hyper-parameters, slots and power non-slots, dispatch to the fused
    ops, all read from the class's ``_SPEC`` (a ``CompatV1`` spec) and ``_RULE``, or for a
    setting with a rule of its own (``RMSPropOptimizer(centered=True)``) that rule's."""

    _RULE = None
    _SPEC = None

    def __init__(self, *args, **kwargs):
        arguments = self.__signature__.bind(*args, **kwargs)
        arguments.apply_defaults()
        arguments = dict(arguments.arguments)
        # fusedopt's own keywords: compact slots (fusedopt._compact).
        self._slot_dtype = _compact.parse_slot_dtype(arguments.pop("slot_dtype"))
        self._stochastic_rounding = _compact.parse_flag(
            "stochastic_rounding", arguments.pop("stochastic_rounding"))
        rule, spec = _rules.select_variant(self._SPEC, "COMPAT_V1", arguments)
        if rule is not None:  # per instance: the rule of these settings
            self._RULE, self._SPEC = rule, spec
        for source in self._SPEC.hyper.values():  # TF's classes fail on None when applying
            if isinstance(source, str) and arguments.get(source) is None:
                raise ValueError(f"{source} must be a number, a tensor or a callable "
                                 "returning one, got None")
        if self._SPEC.check is not None:
            self._SPEC.check(arguments)
        super().__init__(arguments.pop("use_locking"), arguments.pop("name"))
        self._arguments = arguments  # floats, tensors or callables, as given
        self._hyper_t = {}  # tensors, set by _prepare for one apply_gradients call

    # --- hyper-parameters, slots and non-slot variables -----------------------------

    def _prepare(self):
        for key, value in self._arguments.items():
            if value is not None:
                self._hyper_t[key] = tf.convert_to_tensor(self._call_if_callable(value),
                                                          name=key)

    def _create_slots(self, var_list):
        # As tf.compat.v1.train.AdamOptimizer's powers: one copy per graph, next to the
        # variable whose name sorts first, so placement is deterministic.
        first_var = min(var_list, key=lambda x: x.name)
        for power_name, argument in self._SPEC.powers:
            self._create_non_slot_variable(initial_value=self._arguments[argument],
                                           name=power_name, colocate_with=first_var)
        # A step counter of our own seeds stochastic rounding only where it rounds a slot
        # and apply_gradients is given no global_step (which then seeds it): checkpoints
        # of TF's optimizers, and runs that count their steps, keep their variables.
        if (self._stochastic_rounding and self._call_global_step() is None
                and any(self._rounds_stochastically(var) for var in var_list)):
            self._create_non_slot_variable(initial_value=tf.constant(0, tf.int64),
                                           name=_ROUNDING_STEP, colocate_with=first_var)
        for var in var_list:
            compact = _compact.slot_dtype_for(var.dtype, self._slot_dtype) != var.dtype.base_dtype
            for slot_name, initial in self._SPEC.slots:
                if initial is None and not self._per_row(slot_name) and not compact:
                    self._zeros_slot(var, slot_name, self._name)
                else:
                    value = self._arguments[initial] if isinstance(initial, str) else initial
                    self._filled_slot(var, slot_name, value or 0.0)

    def _per_row(self, slot_name):
        """Whether the rule keeps slot `slot_name` (TF's name) per row of var."""
        rule = _fused_ops.RULES[self._RULE]
        for (name, _), rule_slot in zip(self._SPEC.slots, rule["slots"]):
            if name == slot_name:
                return rule["slot_layouts"][rule_slot] == "per_row"
        return None  # not one of the rule's slots

    def _slot_shape_and_dtype(self, var, slot_name):
        """A slot's shape (var's, or per row var.shape[:1]) and dtype (compact slots:
        fusedopt._compact)."""
        shape = var.get_shape()[:1] if self._per_row(slot_name) else var.get_shape()
        return shape, _compact.slot_dtype_for(var.dtype, self._slot_dtype)

    def _rounds_stochastically(self, var):
        """Whether stochastic rounding has a 16-bit slot of `var` to round."""
        return (self._stochastic_rounding and _compact.slot_dtype_for(
            var.dtype, self._slot_dtype) in _compact.COMPACT_DTYPES)

    def _filled_slot(self, var, slot_name, value):
        """A slot filled with `value`, in the rule's layout and the slot dtype."""
        shape, dtype = self._slot_shape_and_dtype(var, slot_name)
        _compact.check_strategy(dtype)
        if shape.is_fully_defined():
            init = tf.compat.v1.constant_initializer(value)
        else:
            per_row = self._per_row(slot_name)

            def init():  # shape known only at run time, as in TF's AdagradOptimizer
                dims = tf.shape(var)[:1] if per_row else tf.shape(var)
                return tf.cast(tf.fill(dims, value), dtype)
        self._get_or_make_slot_with_initializer(var, init, shape, dtype, slot_name, self._name)

    def _get_or_make_slot_with_initializer(self, var, initializer, shape, dtype, slot_name,
                                           op_name):
        # TF's deferred restoration (tf.train.Checkpoint.restore before the first step)
        # makes a restored slot in var's shape and dtype: the rule's may be per row, or
        # 16-bit (compact slots).
        if self._per_row(slot_name) is not None:
            shape, dtype = self._slot_shape_and_dtype(var, slot_name)
        return super()._get_or_make_slot_with_initializer(var, initializer, shape, dtype,
                                                          slot_name, op_name)

    def _non_slot(self, name):
        """The non-slot variable `name` of the current graph (eager: the only one)."""
        with tf.init_scope():
            graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
            return self._get_non_slot_variable(name, graph=graph)

    def _powers(self):
        """The non-slot power variables of the current graph (eager: the only ones)."""
        return tuple(self._non_slot(power_name) for power_name, _ in self._SPEC.powers)

    def _rounding(self, variables):
        """The ops' stochastic_rounding and rounding_seed for an update of `variables`: the
        global_step given to apply_gradients, else the optimizer's own step counter (a
        non-slot variable each apply_gradients moves on): every step's rounding fresh."""
        if not any(self._rounds_stochastically(var) for var in variables):
            return {"stochastic_rounding": False}  # no 16-bit slot: nothing to round
        global_step = self._call_global_step()
        if global_step is not None:
            return {"stochastic_rounding": True,
                    "rounding_seed": tf.cast(global_step, tf.int64)}
        step = self._non_slot(_ROUNDING_STEP)
        if step is None:  # a per-variable method called before any apply_gradients made it
            raise ValueError(
                "stochastic_rounding=True seeds each step's rounding from a step counter that "
                "apply_gradients makes (with the slots): call apply_gradients (or "
                "minimize) before this optimizer's per-variable update methods")
        return {"stochastic_rounding": True, "rounding_seed": step}

    def _get_beta_accumulators(self):
        """As the class replaced: AdamOptimizer's a tuple (beta1_power, beta2_power),
        contrib AdaMaxOptimizer's the one variable beta1_power."""
        powers = self._powers()
        return powers[0] if len(powers) == 1 else powers

    # --- the dense updates of one apply_gradients call, as group ops ---------------------
    #
    # TF's apply_gradients calls _resource_apply_dense once per variable through its
    # processors, then _finish. Where this class drives that loop unchanged, the dense
    # updates of resource variables (TF's own processor, no constraint, our method not
    # overridden) are one group op per (dtype, device), built at the first such variable's
    # call; each of those variables' calls returns its group's op, so every call returns an
    # op that has done that variable's update when it runs, as TF's optimizers promise (a
    # library that wraps the optimizer reads the variable after it). Every other call (a
    # variable a library's own processor updates, a subclass's override, a call from
    # outside apply_gradients) updates its variable alone. Under a tf.distribute strategy
    # the updates run per replica: no grouping there.
    #
    # The batch belongs to the call, not to the optimizer: threads sharing one optimizer
    # (eager apply_gradients from a thread pool) each have their own.

    def _groups_dense_updates(self):
        """Whether this optimizer's own methods do the dense updates (not a subclass's or
        an instance's replacement), so that grouping them changes nothing a caller sees."""
        return not _dispatch.overridden(self, "_resource_apply_dense", _FusedOptimizer)

    def _call(self):
        """This thread's innermost apply_gradients call on this optimizer, or None."""
        stack = getattr(_calls, "stacks", {}).get(id(self))
        return stack[-1] if stack else None

    def _dense_batch(self):
        """The _DenseBatch of this thread's innermost apply_gradients call, or None."""
        call = self._call()
        return call.batch if call is not None else None

    def _call_global_step(self):
        """The global_step given to this thread's innermost apply_gradients, or None."""
        call = self._call()
        return call.global_step if call is not None else None

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = tuple(grads_and_vars)
        batch = None
        if not tf.distribute.has_strategy() and self._groups_dense_updates():
            batch = _DenseBatch(self, grads_and_vars)
        stacks = _calls.__dict__.setdefault("stacks", {})
        stack = stacks.setdefault(id(self), [])
        stack.append(_Call(batch, global_step))
        try:
            return super().apply_gradients(grads_and_vars, global_step, name)
        finally:
            stack.pop()
            if not stack:
                stacks.pop(id(self), None)

    def _group_update(self, members):
        """One group op per (dtype, device) for `members` [(var, grad)]: {var ref: op}."""
        slot_names = [name for name, _ in self._SPEC.slots]
        rule_hyper = _fused_ops.RULES[self._RULE]["hyper"]
        updates = []
        for var, grad in members:
            slots = [self.get_slot(var, slot) for slot in slot_names]
            _compact.check_slots(self, var, slots, self._slot_dtype, self._stochastic_rounding)
            updates.append((var, slots, grad))
        return _dispatch.apply_group(
            self._RULE, updates,
            lambda var: dict(zip(rule_hyper, (tf.cast(h, var.dtype.base_dtype)
                                              for h in self._op_hyper()))),
            self._SPEC.options, use_locking=self._use_locking,
            **self._rounding([var for var, _ in members]))

    def _finish(self, update_ops, name_scope):
        update_ops = list({id(op): op for op in update_ops if op is not None}.values())
        step = self._non_slot(_ROUNDING_STEP) if self._stochastic_rounding else None
        if step is not None and self._call_global_step() is None:
            with tf.control_dependencies(update_ops), _colocated_with(step):
                update_ops.append(step.assign_add(1, use_locking=self._use_locking))
        if not self._SPEC.powers:
            return super()._finish(update_ops, name_scope)
        with tf.control_dependencies(update_ops):
            powers = self._powers()
            with _colocated_with(powers[0]):
                updates = [power.assign(power * self._hyper_t[argument],
                                        use_locking=self._use_locking)
                           for power, (_, argument) in zip(powers, self._SPEC.powers)]
        return tf.group(*(list(update_ops) + updates), name=name_scope)

    # --- updates ---------------------------------------------------------------------

    def _op_hyper(self):
        """The rule's hyper-parameters in op order (tensors/variables of any float type)."""
        powers = dict(zip((name for name, _ in self._SPEC.powers),
                          self._powers()))
        values = []
        for hyper in _fused_ops.RULES[self._RULE]["hyper"]:
            source = self._SPEC.hyper[hyper]
            if isinstance(source, NonSlot):
                values.append(powers[source.name])
            elif isinstance(source, ArgOr):
                values.append(self._hyper_t.get(source.name, source.default))
            else:
                values.append(self._hyper_t[source])
        return values

    def _fused_update(self, variant, var, grad, indices=None):
        every_row = {}
        if indices is not None and not self._SPEC.lazy_sparse:
            # Every row updated (AdamOptimizer's sparse semantics): the sparse op's
            # every_row on the CPU, else the dense op on the densified gradient.
            if _dispatch.covers(var, indices) and _dispatch.every_row_in_kernel(var):
                every_row = {"every_row": True}
            else:
                grad = _dispatch.densify(tf.IndexedSlices(grad, indices), var)
                variant, indices = variant.replace("sparse_", ""), None
        if not _dispatch.covers(var, indices):
            return self._composed_update(var, grad, indices)
        dtype = var.dtype.base_dtype
        slots = [self.get_slot(var, name) for name, _ in self._SPEC.slots]
        _compact.check_slots(self, var, slots, self._slot_dtype, self._stochastic_rounding)
        args = [var] + slots + [tf.cast(h, dtype) for h in self._op_hyper()]
        args.append(grad)
        if indices is not None:
            args.append(indices)
        fn = getattr(_fused_ops, "%s_%s" % (variant, self._RULE))
        return fn(*args, use_locking=self._use_locking, **self._SPEC.options,
                  **self._rounding([var]), **every_row)

    def _composed_update(self, var, grad, indices):
        """Dtypes the ops do not take (complex, ...): the rule in composed TF ops, the
        same math as the replaced class's update (TF's v1 optimizers take complex)."""
        slots = [self.get_slot(var, name) for name, _ in self._SPEC.slots]
        hyper = dict(zip(_fused_ops.RULES[self._RULE]["hyper"], self._op_hyper()))
        if indices is None:
            update = reference.apply_dense(self._RULE, var, slots, grad, **hyper,
                                           **self._SPEC.options)
        else:
            update = reference.apply_sparse(self._RULE, var, slots, grad, indices, **hyper,
                                            **self._SPEC.options)
        # None in eager mode and tf.function (automatic control dependencies order it)
        return update if update is not None or tf.executing_eagerly() else tf.no_op()

    def _apply_dense(self, grad, var):
        return _op_of(self._fused_update("apply", var, grad))

    def _resource_apply_dense(self, grad, var):
        batch = self._dense_batch()
        if batch is not None and batch.holds(var, grad):
            return batch.update_of(var)  # the group op that updates var (eager: done)
        return self._fused_update("resource_apply", var, grad)

    # The kernels sum repeated indices themselves: no Python-level dedup
    # (tf.compat.v1.train.Optimizer's default would add unique + unsorted_segment_sum).
    def _apply_sparse_duplicate_indices(self, grad, var):
        return _op_of(self._fused_update("sparse_apply", var, grad.values, grad.indices))

    def _apply_sparse(self, grad, var):
        return self._apply_sparse_duplicate_indices(grad, var)

    def _resource_apply_sparse_duplicate_indices(self, grad, var, indices):
        return self._fused_update("resource_sparse_apply", var, grad, indices)

    def _resource_apply_sparse(self, grad, var, indices):
        return self._resource_apply_sparse_duplicate_indices(grad, var, indices)


class _Call:
    """One apply_gradients call: its dense batch (None where its updates are not grouped)
    and the global_step it was given (which then seeds stochastic rounding)."""

    def __init__(self, batch, global_step):
        self.batch, self.global_step = batch, global_step


class _DenseBatch:
    """The dense updates one apply_gradients call makes as group ops: those of resource
    variables TF's own processor updates (``_DenseResourceVariableProcessor``: nothing
    after the update but a constraint, and none here), with a gradient tensor the loop
    passes on as it is. Built at the first member's ``_resource_apply_dense``."""

    def __init__(self, optimizer, grads_and_vars):
        self._optimizer = optimizer
        self._members = {}  # var ref -> (var, grad)
        repeated = _dispatch.repeated_variables(grads_and_vars)
        for grad, var in grads_and_vars:
            if (isinstance(grad, tf.Tensor) and _dispatch.identity(var) not in repeated and getattr(var, "constraint", None) is None
                    and _dispatch.groupable(var, grad)
                    and type(_tf_optimizer._get_processor(var))  # as TF's loop will ask
                    is _tf_optimizer._DenseResourceVariableProcessor):
                self._members[var.ref()] = (var, grad)
        self._ops = None  # {var ref: its group's op} once built

    def holds(self, var, grad):
        member = self._members.get(var.ref()) if hasattr(var, "ref") else None
        return member is not None and member[1] is grad

    def update_of(self, var):
        if self._ops is None:
            # Outside the calling variable's colocation: each group goes to its own device.
            with contextlib.ExitStack() as scope:
                if not tf.executing_eagerly():
                    scope.enter_context(tf.compat.v1.get_default_graph().colocate_with(
                        None, ignore_existing=True))
                self._ops = self._optimizer._group_update(list(self._members.values()))
        return self._ops.get(var.ref())  # None when executing eagerly (done)


def _op_of(update):
    """The op of a ref-variable update (the fused ops return the variable's tensor)."""
    return update if update is None or isinstance(update, tf.Operation) else update.op


def _signature(spec):
    """TF's constructor signature, then fusedopt's keyword-only compact-slot options."""
    P = inspect.Parameter
    return inspect.Signature(
        [P("self", P.POSITIONAL_OR_KEYWORD)]
        + [P(name, P.POSITIONAL_OR_KEYWORD, **({} if default is REQUIRED else {"default": default}))
           for name, default in spec.signature]
        + [P("slot_dtype", P.KEYWORD_ONLY, default=None),
           P("stochastic_rounding", P.KEYWORD_ONLY, default=False)])


def _make_class(rule, spec):
    def __init__(self, *args, **kwargs):
        _FusedOptimizer.__init__(self, *args, **kwargs)

    full = _signature(spec)
    __init__.__signature__ = full  # help() shows TF's constructor
    __init__.__qualname__ = spec.name + ".__init__"
    return type(spec.name, (_FusedOptimizer,), {
        "_RULE": rule, "_SPEC": spec, "__doc__": spec.doc + _compact.DOC,
        "__module__": __name__,
        "__init__": __init__,
        "__signature__": full.replace(parameters=list(full.parameters.values())[1:])})


__all__ = _rules.define_classes(globals(), "COMPAT_V1", _make_class)


def __dir__():  # the classes, not this module's plumbing
    return sorted(__all__)
