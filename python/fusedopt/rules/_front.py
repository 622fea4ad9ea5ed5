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
from typing import Callable, Optional, Union

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
class _KerasFamily:
    """What the two Keras front ends share: a subclass of `base` named `name` whose update
    runs the rule's op, with the base's own update where the rule does not cover a setting."""
    name: str
    base: str
    slots: tuple           # the base's slots (per-variable lists or slot names), rule order
    hyper: dict            # op hyper-parameter -> where the front end keeps it
    options: dict = dataclasses.field(default_factory=dict)
    # When the base's own update runs instead: an attribute name (true: own update) or a
    # function of the optimizer, for settings the rule does not cover (e.g. amsgrad).
    own_update_when: Optional[Union[str, Callable]] = None
    doc: str = ""

    def keeps_own_update(self, optimizer):
        condition = self.own_update_when
        if condition is None:
            return False
        if callable(condition):
            return bool(condition(optimizer))
        return bool(getattr(optimizer, condition, False))


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
