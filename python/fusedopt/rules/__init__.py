"""The registry of update rules, from the C++ declarations outward.

The rules are declared once, in C++ (``cc/core/rules/*.h``, listed in ``AllRules``): name,
slots, hyper-parameters and options. ``fusedopt._core.rules()`` reports them, and
everything in Python derives from that report and from each rule's Python module
``fusedopt/rules/<name>.py``, which holds what only Python needs: the rule in composed TF
ops (``composed``: fusedopt.reference, DTensor's sharded layouts) and the specs of its
front-end classes (``KERAS``, ``LEGACY``, ``COMPAT_V1``: see ``_front``). The op wrappers
(``fusedopt.ops``), the reference functions and the front-end classes are generated from
these; a new rule needs its C++ rule, its op registration and this one Python module.
"""
import importlib

from fusedopt import _core

# name -> {"op_name", "slots", "hyper", "options"}, in AllRules' order.
SPECS = _core.rules()

FRONT_ENDS = ("KERAS", "LEGACY", "COMPAT_V1")


def names():
    """Every rule's Python name (``"lazy_adam"``, ...), in the C++ registry's order."""
    return list(SPECS)


def module(name):
    """The rule's Python module: ``composed``, ``MATH`` and the front-end specs."""
    if name not in SPECS:
        raise ValueError("unknown rule %r; the rules are %s" % (name, names()))
    return importlib.import_module("fusedopt.rules." + name)


def front_end_specs(front_end):
    """[(rule name, spec)] of one front end ("KERAS", "LEGACY", "COMPAT_V1")."""
    return [(name, getattr(module(name), front_end)) for name in names()]
