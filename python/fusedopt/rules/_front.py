"""How each front end feeds a rule's op: the declarative specs a rule's module fills in.

A rule's Python module (``fusedopt/rules/<rule>.py``) declares, next to its composed form,
one spec per front end:

- ``KERAS``: a ``Keras`` spec, the ``fusedopt.keras`` class (Keras 3; Keras 2.15 on TF 2.15);
- ``LEGACY``: a ``Legacy`` spec, the ``fusedopt.keras.legacy`` class (Keras 2 OptimizerV2);
- ``COMPAT_V1``: a ``CompatV1`` spec, the ``fusedopt.compat.v1`` class.

Each maps every hyper-parameter of the rule's op to where that front end keeps it, so the
front-end modules build every class the same way and no class writes its update by hand.
"""
import dataclasses
import inspect
from typing import Callable, Optional, Union

__all__ = ["REQUIRED", "Attr", "Power", "LearningRate", "NewOptimizer", "Keras", "Legacy",
           "NonSlot", "ArgOr", "CompatV1", "new_optimizer_signature", "bind_new_optimizer",
           "new_optimizer_base"]

REQUIRED = object()  # a constructor argument without a default


@dataclasses.dataclass(frozen=True)
class _Named:
    """A value the front end looks up by name; subclasses say where."""
    name: str


class Attr(_Named):
    """An optimizer attribute (number, tensor, variable or callable), in the var's dtype."""


class Power(_Named):
    """An attribute raised to the step number (``iterations + 1``): Adam's beta powers."""


@dataclasses.dataclass(frozen=True)
class LearningRate:
    """The learning rate Keras passes to ``update_step`` (schedules already applied)."""


@dataclasses.dataclass(frozen=True)
class NewOptimizer:
    """For a rule no Keras optimizer has: what the front end's own class on Keras's
    ``Optimizer`` base (``OptimizerV2`` for Keras 2) takes and keeps, so the two Keras front
    ends build it (constructor, slot variables of the rule's layouts, get_config) the same
    way a Keras class is written."""
    arguments: tuple       # ((argument, default), ...) after learning_rate, in order
    slot_names: tuple      # the slot variables' names, rule order ("accumulator")
    slot_initial: tuple    # per slot: the argument giving its initial value, or None (zeros)
    default_name: str      # the optimizer's name when none is given
    learning_rate: float = 0.001
    check: Optional[Callable] = None  # check(arguments dict): raises ValueError
    # Keras 2 (its coefficients are apply_state keys): ((key, argument), ...), the argument
    # raised to the step number (``iterations + 1``), as Adam's ``beta_1_power``.
    powers: tuple = ()


@dataclasses.dataclass(frozen=True)
class _KerasFamily:
    """What the two Keras front ends share: a subclass of `base` named `name` whose update
    runs the rule's op, with the base's own update where the rule does not cover a setting.
    ``base`` None: no Keras class has the rule; ``new`` describes the class built instead."""
    name: str
    base: Optional[str]
    slots: tuple           # the base's slots (per-variable lists or slot names), rule order
    hyper: dict            # op hyper-parameter -> where the front end keeps it
    options: dict = dataclasses.field(default_factory=dict)
    new: Optional[NewOptimizer] = None
    # When the base's own update runs instead: an attribute name (true: own update) or a
    # function of the optimizer, for settings the rule does not cover (e.g. amsgrad).
    own_update_when: Optional[Union[str, Callable]] = None
    # Those settings in words, for the warning (fusedopt.FallbackWarning) such a class
    # gives once: "amsgrad=True", ...
    own_update_setting: str = ""
    doc: str = ""
    # Settings with a rule of their own: ((applies(optimizer), rule name), ...); the first
    # that applies runs that rule with its module's spec of this front end (whose name is
    # None: no class of its own), e.g. RMSprop(centered=True).
    variants: tuple = ()
    # What a sparse gradient (tf.IndexedSlices) updates: True, the rows it names only (lazy);
    # False, every row, the others with gradient zero (Keras's Adam: moments decay
    # everywhere), in one fused dense pass over the summed gradient.
    lazy_sparse: bool = True

    def keeps_own_update(self, optimizer):
        condition = self.own_update_when
        if condition is None:
            return False
        if callable(condition):
            return bool(condition(optimizer))
        return bool(getattr(optimizer, condition, False))

    def warn_if_own_update(self, optimizer):
        """Says once (``fusedopt.FallbackWarning``) that `optimizer`'s settings run the base
        class's own update instead of fusedopt's kernels, and how to get them."""
        if not self.keeps_own_update(optimizer):
            return
        from fusedopt._warnings import FallbackWarning, warn_once

        warn_once(optimizer, "own_update", FallbackWarning,
                  f"{type(optimizer).__name__}({self.own_update_setting}) runs the "
                  f"replaced Keras class's own {self.base} update, not fusedopt's fused "
                  "kernels: the same numbers, without fusedopt's speed or its lazy sparse "
                  f"updates. {self.own_update_hint}", stacklevel=5)

    @property
    def own_update_hint(self):
        return {"amsgrad=True": "fusedopt has no AMSGrad rule; amsgrad=False is fused.",
                "momentum=0": "Pass momentum > 0 (e.g. 0.9) for the fused RMSprop update "
                              "(with momentum, as TF's RMSPropOptimizer)."}.get(
                                  self.own_update_setting, "")


@dataclasses.dataclass(frozen=True)
class Keras(_KerasFamily):
    """``fusedopt.keras.<name>``: subclasses ``keras.optimizers.<base>``, keeps its
    arguments and variables, replaces ``update_step``. ``slots``: the base's per-variable
    lists; ``hyper`` values: Attr / Power / LearningRate."""


@dataclasses.dataclass(frozen=True)
class Legacy(_KerasFamily):
    """``fusedopt.keras.legacy.<name>``: subclasses Keras 2's ``optimizers.legacy.<base>``,
    replaces ``_resource_apply_dense``/``_resource_apply_sparse``. ``slots``: the base's slot
    names; ``hyper`` values: keys of the base's apply_state coefficients."""


class NonSlot(_Named):
    """A compat.v1 non-slot variable (e.g. ``beta1_power``), see ``CompatV1.powers``."""


@dataclasses.dataclass(frozen=True)
class ArgOr:
    """A compat.v1 constructor argument, or `default` when it was given as None."""
    name: str
    default: float


@dataclasses.dataclass(frozen=True)
class CompatV1:
    """``fusedopt.compat.v1.<name>``: a ``tf.compat.v1.train.Optimizer`` with TF's
    constructor signature, slot names and non-slot variables (checkpoints interchange)."""
    name: str
    signature: tuple       # ((argument, default or REQUIRED), ...) in TF's order
    slots: tuple           # ((TF's slot name, initial value), ...): None (zeros), a number,
                           # or the name of the argument that gives it
    hyper: dict            # op hyper-parameter -> argument name, NonSlot or ArgOr
    powers: tuple = ()     # ((non-slot name, argument)): start at it, times it every step
    options: dict = dataclasses.field(default_factory=dict)
    check: Optional[Callable] = None  # check(arguments dict): raises ValueError
    anchor: Optional[str] = None      # the tf.compat.v1 class it reproduces, if TF has one
    doc: str = ""
    # Settings with a rule of their own: ((applies(arguments dict), rule name), ...); the
    # first that applies runs that rule with its module's COMPAT_V1 spec (whose name is
    # None: no class of its own), e.g. RMSPropOptimizer(centered=True).
    variants: tuple = ()
    lazy_sparse: bool = True  # as _KerasFamily's: False, a sparse gradient updates every row


def new_optimizer_signature(new, keyword_only=()):
    """The constructor signature of a ``NewOptimizer``'s class: learning_rate, its arguments,
    then `keyword_only` ((name, default), ...), name and **kwargs (the base's keywords)."""
    P = inspect.Parameter
    return inspect.Signature(
        [P("self", P.POSITIONAL_OR_KEYWORD),
         P("learning_rate", P.POSITIONAL_OR_KEYWORD, default=new.learning_rate)]
        + [P(n, P.POSITIONAL_OR_KEYWORD, default=d) for n, d in new.arguments]
        + [P(n, P.KEYWORD_ONLY, default=d) for n, d in keyword_only]
        + [P("name", P.KEYWORD_ONLY, default=new.default_name), P("kwargs", P.VAR_KEYWORD)])


def bind_new_optimizer(new, signature, args, kwargs):
    """(values of the signature's named arguments, the remaining **kwargs), checked."""
    bound = signature.bind(None, *args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    values.pop("self")
    rest = values.pop("kwargs")
    if new.check is not None:
        new.check(values)
    return values, rest


def new_optimizer_base(spec, base, signature, methods, module_name, api):
    """The class ``_<name>Base(base)`` of a ``NewOptimizer`` spec for one Keras front end:
    `methods` (``__init__`` takes `signature`), and ``get_config`` adding the spec's
    arguments to the config of ``methods["get_config"]`` (default: the base's)."""
    new = spec.new
    base_config = methods.get("get_config", base.get_config)

    def get_config(self):
        config = base_config(self)
        config.update({argument: getattr(self, argument) for argument, _ in new.arguments})
        return config

    methods["__init__"].__signature__ = signature
    return type("_" + spec.name + "Base", (base,), {
        **methods, "get_config": get_config, "__module__": module_name,
        "__doc__": "fusedopt's own %s base of %s." % (api, spec.name)})
