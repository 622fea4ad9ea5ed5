"""Fused-kernel drop-in replacements for the Keras optimizers (the current Keras API).

``fusedopt.keras.LazyAdam``, ``Adamax``, ``Adagrad``, ... (one per rule of the registry,
built from the rule's ``KERAS`` spec in ``fusedopt/rules/<rule>.py``) subclass the
optimizers of ``tf.keras.optimizers`` as installed — Keras 3 on TF >= 2.16, Keras 2.15's
new optimizer on TF 2.15 (or tf_keras's with ``TF_USE_LEGACY_KERAS=1``) — and keep their
constructor, variables (slot names and layout), configuration and every base-class feature
(clipping, weight decay, EMA, loss scaling, gradient accumulation, schedules). Only
``update_step`` changes: it runs fusedopt's fused op (``tf.IndexedSlices`` gradients go
to the sparse op and update the touched rows only: lazy updates), in XLA-compiled steps
too (``fit(jit_compile=True)``: the ops have XLA kernels).

    model.compile(optimizer=fusedopt.keras.LazyAdam(1e-3), ...)   # was keras.optimizers.Adam

Keras 2 ``OptimizerV2`` classes: ``fusedopt.keras.legacy``; DTensor: ``fusedopt.keras.dtensor``.
"""

import functools
import inspect
import re

import tensorflow as tf

from fusedopt import rules as _rules
from fusedopt import _compact, _dispatch, _packs
from fusedopt.rules._front import (LearningRate, Power, bind_new_optimizer,
                                   new_optimizer_base, new_optimizer_signature)

_optimizers = tf.keras.optimizers
# Keras 2's optimizer (Keras 2.15, tf_keras) builds its learning rate in the subclass
# (_build_learning_rate); Keras 3's base takes it. (Neither base's signature names it.)
_KERAS3 = not hasattr(_optimizers.Optimizer, "_build_learning_rate")
_register = tf.keras.utils.register_keras_serializable(package="fusedopt")


def _in_dtype(x, dtype, through_cast=False):
    """`x` (number, tensor, variable or callable) in `dtype`, as Keras's updates use it.
    Keras uses its Python-float hyper-parameters as they are (``1 - self.beta_1``,
    ``ops.add(..., self.epsilon)``: exact in a float64 update), except where it casts them
    first (``ops.cast(self.beta_1, dtype)`` for the beta powers, which goes through float32:
    0.9 becomes 0.8999999761581421): `through_cast`. Both ways matter for float64 variables."""
    x = x() if callable(x) else x
    if isinstance(x, (int, float)) and not through_cast:
        return tf.constant(x, dtype)
    return tf.cast(x, dtype)


def _default_name(base):
    """The name keras.optimizers.<base>() takes when none is given."""
    signature = inspect.signature(getattr(_optimizers, base).__init__)
    default = signature.parameters["name"].default if "name" in signature.parameters else None
    if default is not None:
        return default
    try:
        from keras.src.utils.naming import auto_name  # what Keras 3's base calls
    except ImportError:  # pragma: no cover - Keras 3 keeps it there
        return base.lower()
    return auto_name(base)


def _tf_variable(variable):
    """The tf.Variable of a Keras 3 variable (its ``value``); a tf.Variable itself."""
    inner = getattr(variable, "value", variable)
    return variable if callable(inner) else inner  # Keras 2: value() is a method


class _FusedUpdate(_packs.PacksOfOptimizer):
    """Mixin: the fused ``update_step`` of a ``Keras`` spec (Keras 3 and Keras 2.15 bases)."""

    _fused_rule = None
    _fused_spec = None
    _fused_composed = False  # True: always the composed form (DTensor subclasses)
    # Set by the constructor (the keywords of the same names, fusedopt's own): weight decay
    # of the rows a sparse gradient touches only; compact slots (fusedopt._compact).
    lazy_weight_decay = False
    slot_dtype = None  # a tf.DType (bfloat16, float16) or None
    stochastic_rounding = False
    _pending_slot_dtype = None

    def get_config(self):
        config = super().get_config()
        if self.lazy_weight_decay:  # only then: the config stays the replaced class's
            config["lazy_weight_decay"] = True
        config.update(_compact.config(self.slot_dtype, self.stochastic_rounding))
        return config

    def _set_fusedopt_options(self, lazy_weight_decay, slot_dtype, stochastic_rounding):
        # The rule of these settings (RMSprop(centered=True): its own), per instance.
        rule, spec = _rules.select_variant(self._fused_spec, "KERAS", self)
        if rule is not None:
            self._fused_rule, self._fused_spec = rule, spec
        self.lazy_weight_decay = _compact.parse_flag("lazy_weight_decay", lazy_weight_decay)
        if (self.lazy_weight_decay and self._fused_spec is not None
                and not self._fused_spec.lazy_sparse):
            raise ValueError(
                f"lazy_weight_decay=True decays only the rows a sparse gradient touches, but "
                f"{type(self).__name__} updates every row on sparse gradients (as the class "
                f"it replaces); for lazy updates and lazy decay use Lazy{type(self).__name__}")
        _compact.set_options(self, slot_dtype, stochastic_rounding)
        if self._fused_spec is not None:
            self._fused_spec.warn_if_own_update(self)

    # Compact slots: the rule's slot variables of a float32 variable in slot_dtype. Keras
    # makes every optimizer variable of a model variable here, the base's own too (EMA
    # averages, gradient accumulators): those keep the variable's dtype.
    _BASE_VARIABLES = ("average", "gradient_accumulator")

    def add_variable_from_reference(self, *args, **kwargs):
        # Keras 3: (reference_variable, name=None, initializer="zeros"); Keras 2.15:
        # (model_variable, variable_name, shape=None, initial_value=None).
        names = (("reference_variable", "name") if _KERAS3 else
                 ("model_variable", "variable_name", "shape", "initial_value"))
        given = dict(zip(names, args), **kwargs)
        reference, name = given[names[0]], given.get(names[1])
        dtype = _compact.slot_dtype_for(reference.dtype, self.slot_dtype)
        if dtype == tf.as_dtype(reference.dtype) or name in self._BASE_VARIABLES:
            return super().add_variable_from_reference(*args, **kwargs)
        _compact.check_strategy(dtype)
        if not _KERAS3:
            # Keras 2.15's base makes the variable in the reference's dtype: it sees the
            # reference in the slot dtype (colocated with the variable itself, as its
            # subclass would), and an initial value given in the reference's is cast.
            if given.get("initial_value") is not None:
                given["initial_value"] = tf.cast(given["initial_value"], dtype)
            given["model_variable"] = _compact.SlotDtypeView(reference, dtype)
            base = next(c for c in type(self).__mro__ if c.__name__ == "_BaseOptimizer")
            with tf.distribute.get_strategy().extended.colocate_vars_with(reference):
                return base.add_variable_from_reference(self, **given)
        self._pending_slot_dtype = dtype  # add_variable below: Keras 3's base calls it
        try:
            return super().add_variable_from_reference(*args, **kwargs)
        finally:
            self._pending_slot_dtype = None

    def add_variable(self, *args, **kwargs):
        if self._pending_slot_dtype is not None:
            kwargs["dtype"] = self._pending_slot_dtype
        return super().add_variable(*args, **kwargs)

    # Keras 3 restores its variables by assignment (.keras / .weights.h5 files): slots
    # saved in another dtype (float32 <-> compact) are cast.
    def load_own_variables(self, store):
        variables = list(self.variables)
        if len(store.keys()) == len(variables):
            for i, variable in enumerate(variables):
                value = store[str(i)]
                if str(getattr(value, "dtype", "")) != str(tf.as_dtype(variable.dtype).name):
                    variable.assign(tf.cast(tf.convert_to_tensor(value[...]), variable.dtype))
                else:
                    variable.assign(value)
            return
        super().load_own_variables(store)

    # Lazy weight decay: Keras decays every weight of every variable before the update
    # step (``var -= var * weight_decay * lr``), an embedding table's every row each step.
    # With lazy_weight_decay it happens with each variable's own update instead: the same
    # expression for a dense gradient, and for a sparse one on the touched rows only (as
    # lazy Adam leaves untouched rows' moments alone).
    def _apply_weight_decay(self, variables):
        if not self.lazy_weight_decay:
            super()._apply_weight_decay(variables)

    def _lazy_decay(self, gradient, variable, learning_rate):
        if (not self.lazy_weight_decay or self.weight_decay is None
                or not self._use_weight_decay(variable)):
            return
        dtype = variable.dtype
        wd = tf.cast(self.weight_decay, dtype)
        lr = self._lr(variable, learning_rate)
        if not isinstance(gradient, tf.IndexedSlices):
            variable.assign_sub(variable * wd * lr)
            return
        # Duplicate ids all write the same decayed row (read before any write): one decay.
        target = _tf_variable(variable)
        rows = tf.gather(target, gradient.indices)
        target.scatter_update(tf.IndexedSlices(rows - rows * wd * lr, gradient.indices))

    def _slot(self, slots, variable):
        if hasattr(self, "_get_variable_index"):  # Keras 3
            return slots[self._get_variable_index(variable)]
        return slots[self._index_dict[self._var_key(variable)]]  # Keras 2.15

    def _lr(self, variable, learning_rate):
        if learning_rate is None:  # Keras 2 passes no learning rate to update_step
            learning_rate = self.learning_rate
        return tf.cast(learning_rate, variable.dtype)

    def _keeps_own_update(self):
        return self._fused_spec is not None and self._fused_spec.keeps_own_update(self)

    def _rounding(self):
        """The ops' stochastic_rounding and rounding_seed: the step counter (iterations),
        so that each step's rounding is fresh."""
        if not self.stochastic_rounding:
            return {"stochastic_rounding": False}
        return {"stochastic_rounding": True,
                "rounding_seed": _dispatch.unwrap(self.iterations)}

    def _fused_slots(self, variable):
        """The rule's slots of `variable` (the base's slot lists, in rule order)."""
        slots = [self._slot(getattr(self, attr), variable) for attr in self._fused_spec.slots]
        _compact.check_slots(self, variable, slots, self.slot_dtype, self.stochastic_rounding)
        return slots

    def _deduplicate_sparse_grad(self, grads):
        # Keras 2.15's apply_gradients sums duplicate sparse ids first (tf.unique + a
        # segment sum: a third of a 16K-id embedding step). The fused sparse ops, and the
        # composed form, sum them themselves, in the same order; Keras's own update still
        # gets its deduplicated gradient. Keras 3 has no such step.
        if self._keeps_own_update():
            return super()._deduplicate_sparse_grad(grads)
        own = super()._deduplicate_sparse_grad
        return [g if _dispatch.covers_gradient(g) else own([g])[0]
                for g in grads]

    def _hyper(self, variable, learning_rate):
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        hyper = {}
        for name, source in self._fused_spec.hyper.items():
            if isinstance(source, LearningRate):
                hyper[name] = self._lr(variable, learning_rate)
            else:
                power = isinstance(source, Power)
                value = _in_dtype(getattr(self, source.name), dtype, through_cast=power)
                hyper[name] = tf.pow(value, step) if power else value
        return hyper

    def update_step(self, gradient, variable, learning_rate=None):
        self._lazy_decay(gradient, variable, learning_rate)
        # Settings the rule does not cover (amsgrad, ...) and dtypes the ops do not take
        # (complex, integers): the replaced class's own update, as if unswapped.
        indices = gradient.indices if isinstance(gradient, tf.IndexedSlices) else None
        if self._keeps_own_update() or not _dispatch.covers(variable, indices):
            base = super()
            return (base.update_step(gradient, variable) if learning_rate is None
                    else base.update_step(gradient, variable, learning_rate))
        return self._fused(self._fused_rule, variable, self._fused_slots(variable), gradient,
                           self._hyper(variable, learning_rate), self._fused_spec.options)

    # Keras 3 (TF backend) all-reduces the gradients before the update. Outside a
    # tf.distribute strategy that is the default replica context's sum over one replica: an
    # Identity op per gradient (1,000 ops a step for 1,000 variables, each run every step),
    # so the gradients go on as they are: the same values. Under a strategy, Keras's own.
    def _all_reduce_sum_gradients(self, grads_and_vars):
        if tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            return super()._all_reduce_sum_gradients(grads_and_vars)
        return list(grads_and_vars)

    # Keras 3 (TF backend) calls update_step once per variable from here. Dense gradients
    # instead go to one group op per dtype and device, the per-step scalars computed once;
    # sparse gradients (and everything under a tf.distribute strategy, whose update() runs
    # per replica) keep the per-variable path, as does a subclass's or an instance's own
    # update_step (it must be called for every variable).
    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        if (self._keeps_own_update() or self._fused_composed or tf.distribute.has_strategy()
                or distribution is not tf.distribute.get_strategy()
                or _dispatch.overridden(self, "update_step", _FusedUpdate)):
            return super()._distributed_tf_update_step(distribution, grads_and_vars,
                                                       learning_rate)
        grads_and_vars = list(grads_and_vars)
        repeated = _dispatch.repeated_variables(grads_and_vars)
        grouped, rest = [], []
        for grad, var in grads_and_vars:
            ok = _dispatch.identity(var) not in repeated and _dispatch.groupable(var, grad)
            (grouped if ok else rest).append((grad, var))
        if grouped:
            for grad, var in grouped:
                self._lazy_decay(grad, var, learning_rate)
            spec = self._fused_spec
            _dispatch.apply_group(
                self._fused_rule,
                [(var, self._fused_slots(var), grad) for grad, var in grouped],
                lambda var: self._hyper(var, learning_rate), spec.options,
                packs=self._fused_packs(), **self._rounding())
        return super()._distributed_tf_update_step(distribution, rest, learning_rate)

    def _fused(self, rule, variable, slots, gradient, hyper, options=None):
        return _dispatch.apply(rule, variable, slots, gradient, hyper, options,
                               composed=self._fused_composed, **self._rounding(),
                               every_row=not self._fused_spec.lazy_sparse)


# The base optimizer's own arguments, documented once; each spec's doc ends with its
# rule's arguments (an ``Args:`` section) and these follow them.
_BASE_ARGS = """
      weight_decay: if set, decoupled weight decay (``var -= lr*weight_decay*var``) applied
        before the update, as in Keras: to every variable, every row, every step.
      lazy_weight_decay: fusedopt's own (keyword only, default False): with a sparse
        gradient (``tf.IndexedSlices``, an embedding's) decay only the rows it touches,
        with the variable's update (as lazy Adam's moments), instead of the whole table
        every step; dense gradients decay as Keras does. Only in the config when True.
      slot_dtype: fusedopt's own (keyword only, default None): "bfloat16" or "float16" to
        store the rule's slots of float32 variables in 16 bits (half the state memory; the
        update computes in float32 and rounds once on store). Only in the config when set.
      stochastic_rounding: fusedopt's own (keyword only, default False): round 16-bit slots
        stochastically (unbiased) instead of to nearest even; deterministic bits.
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


def _named_as_base(cls, base):
    """`cls` with `base`'s default name: Keras 3 names an unnamed optimizer after its class
    ("lazy_adam"); the class replaced's name instead ("adam") keeps get_config() and the
    variables' paths through the one-line swap. (Keras 2.15's bases name themselves.)"""
    signature = inspect.signature(base.__init__)

    @functools.wraps(base.__init__)  # help() and inspect show the base's arguments
    def __init__(self, *args, lazy_weight_decay=False, slot_dtype=None,
                 stochastic_rounding=False, **kwargs):
        try:
            named = "name" in signature.bind_partial(self, *args, **kwargs).arguments
        except TypeError:  # arguments the base refuses: its own error, below
            named = True
        if not named:
            kwargs["name"] = _default_name(base.__name__)  # per instance: Keras numbers them
        super(cls, self).__init__(*args, **kwargs)
        self._set_fusedopt_options(lazy_weight_decay, slot_dtype, stochastic_rounding)

    __init__.__signature__ = _with_own_keywords(signature)
    cls.__init__ = __init__
    return cls


# fusedopt's keyword-only arguments of every fusedopt.keras class, with their defaults.
_OWN_KEYWORDS = (("lazy_weight_decay", False), *_compact.KEYWORDS)


def _with_own_keywords(signature):
    """`signature` with fusedopt's keyword-only arguments (_OWN_KEYWORDS) before **kwargs."""
    return _compact.with_keywords(signature, _OWN_KEYWORDS)


def _new_optimizer(rule, spec):
    """The base class of a rule no Keras optimizer has (``spec.new``), written as Keras's own
    optimizers are: arguments kept as attributes, ``build`` making the slot variables in the
    rule's layouts (per row: shape ``var.shape[:1]``), ``get_config``; its own
    ``update_step`` is the rule in composed TF ops (what runs where the fused op cannot)."""
    new = spec.new
    declared = _rules.SPECS[rule]
    per_row = [declared["slot_layouts"][s] == "per_row" for s in declared["slots"]]
    keras3 = _KERAS3
    signature = new_optimizer_signature(new, keyword_only=_OWN_KEYWORDS)
    base = _optimizers.Optimizer

    def __init__(self, *args, **kwargs):
        values, rest = bind_new_optimizer(new, signature, args, kwargs)
        learning_rate, name = values.pop("learning_rate"), values.pop("name")
        # No weight decay unless asked, as in Keras's own classes: Keras 2's base defaults
        # to 0, which still runs its decay step (var -= var * 0 * lr) over every row of
        # every variable at every step, a whole embedding table's worth of memory traffic.
        rest.setdefault("weight_decay", None)
        if keras3:
            base.__init__(self, learning_rate=learning_rate, name=name, **rest)
        else:  # Keras 2.15: the subclass builds its learning rate
            base.__init__(self, name=name, **rest)
            self._learning_rate = self._build_learning_rate(learning_rate)
        own = {name: values.pop(name) for name, _ in _OWN_KEYWORDS}
        for argument, value in values.items():
            setattr(self, argument, value)
        self._set_fusedopt_options(**own)

    def _slot_variable(self, var, slot_name, value, row_wise):
        shape = tuple(var.shape[:1]) if row_wise else tuple(var.shape)
        dtype = _compact.slot_dtype_for(var.dtype, self.slot_dtype)
        _compact.check_strategy(dtype)
        if keras3:
            path = getattr(var, "path", None) or str(var.name).replace(":", "_")
            # Filled in one buffer (Keras's Constant initializer multiplies a second,
            # slot-sized ones tensor: twice the slot's memory at build for a huge table).
            def fill(shape, dtype):
                return tf.fill(shape, tf.cast(value, dtype))

            # A Keras variable next to its tf.Variable (a plain tf.Variable: itself).
            with self._distribution_strategy.extended.colocate_vars_with(_tf_variable(var)):
                return self.add_variable(shape=shape, initializer=fill, dtype=dtype,
                                         name=path.replace("/", "_") + "_" + slot_name)
        return self.add_variable_from_reference(
            var, slot_name, shape=tf.TensorShape(shape),
            initial_value=tf.fill(shape, tf.cast(value, dtype)))

    def build(self, var_list):
        if getattr(self, "built", False) or getattr(self, "_built", False):
            return
        base.build(self, var_list)
        self._built = True
        for attr, slot_name, initial, row_wise in zip(spec.slots, new.slot_names,
                                                      new.slot_initial, per_row):
            value = getattr(self, initial) if initial else 0.0
            setattr(self, attr, [_slot_variable(self, v, slot_name, value, row_wise)
                                 for v in var_list])

    def update_step(self, gradient, variable, learning_rate=None):
        slots = [self._slot(getattr(self, attr), variable) for attr in spec.slots]
        return _dispatch.apply(rule, variable, slots, gradient,
                               self._hyper(variable, learning_rate), spec.options,
                               composed=True, **self._rounding())

    def get_config(self):
        config = base.get_config(self)
        if not keras3:  # Keras 2's base leaves the learning rate to its subclasses
            config["learning_rate"] = self._serialize_hyperparameter(self._learning_rate)
        return config

    return new_optimizer_base(
        spec, base, signature,
        {"__init__": __init__, "build": build, "update_step": update_step,
         "get_config": get_config},
        __name__, "Keras optimizer")


def _base_args_of(base):
    """_BASE_ARGS' entries of the arguments `base`'s constructor takes (this Keras's: Keras
    2.15 has jit_compile, Keras 3 loss_scale_factor, ...), fusedopt's own and **kwargs."""
    taken = {name for name, _ in _OWN_KEYWORDS} | {"**kwargs", "name"}
    for cls in inspect.getmro(base):  # Keras's bases take the shared ones through **kwargs
        if "__init__" in vars(cls):
            taken |= set(inspect.signature(cls.__init__).parameters)
    entries = re.split(r"\n(?=      \S)", _BASE_ARGS.strip("\n"))
    kept = [e for e in entries if e.strip().split(":")[0] in taken]
    return "\n" + "\n".join(kept) + "\n    "


def _make_class(rule, spec):
    if spec.base is None:
        new_base = _new_optimizer(rule, spec)
        return _register(_rules.fused_subclass(rule, spec, _FusedUpdate, new_base, __name__,
                                               _base_args_of(new_base)))
    base = getattr(_optimizers, spec.base)
    return _register(_named_as_base(
        _rules.fused_subclass(rule, spec, _FusedUpdate, base, __name__, _base_args_of(base)),
        base))


__all__ = _rules.define_classes(globals(), "KERAS", _make_class) + ["Embedding"]

from fusedopt.keras.layers import Embedding  # noqa: E402  (the layer beside the optimizers)


def __dir__():  # the classes, not this module's plumbing
    return sorted(__all__)
