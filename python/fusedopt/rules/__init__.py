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

__all__ = ["SPECS", "FRONT_ENDS", "names", "module", "front_end_specs", "variant_specs",
           "select_variant", "define_classes", "fused_subclass", "more_class_specs"]

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
    """[(rule name, spec)] of one front end ("KERAS", "LEGACY", "COMPAT_V1"): the specs
    that make a class (a spec named None serves another rule's class for some of its
    settings: that class's ``variants``)."""
    specs = [(name, getattr(module(name), front_end, None)) for name in names()]
    return [(name, spec) for name, spec in specs if spec is not None and spec.name is not None]


def more_class_specs(front_end):
    """[(rule name, spec)] of the further classes a rule's module declares for `front_end`
    (its ``MORE_CLASSES[front_end]``: the same rule behind another class, e.g. Adam beside
    LazyAdam, whose sparse updates reach every row)."""
    return [(name, spec) for name in names()
            for spec in getattr(module(name), "MORE_CLASSES", {}).get(front_end, ())]


def variant_specs(front_end):
    """{rule: (class rule, spec)} of the rules that run for some settings of another
    rule's class in one front end (that class's ``variants``), with their own spec."""
    out = {}
    for owner, spec in front_end_specs(front_end):
        for _, rule in spec.variants:
            out[rule] = (owner, getattr(module(rule), front_end))
    return out


def select_variant(spec, front_end, settings):
    """(rule, spec) for a class of `spec` given `settings` (its arguments, or the
    optimizer): the first of the spec's variants that applies, else (None, spec)."""
    for applies, rule in spec.variants:
        if applies(settings):
            return rule, getattr(module(rule), front_end)
    return None, spec


def define_classes(namespace, front_end, make_class):
    """Puts ``make_class(rule, spec)`` for every rule's ``front_end`` spec that names a
    class into a module's ``namespace`` (its globals) under the spec's name; returns the
    names (``__all__``)."""
    defined = []
    for name, spec in front_end_specs(front_end) + more_class_specs(front_end):
        namespace[spec.name] = make_class(name, spec)
        defined.append(spec.name)
    return defined


def fused_subclass(rule, spec, mixin, base, module_name, doc_suffix=""):
    """``class <spec.name>(mixin, base)`` for a Keras front end: the mixin's fused update
    reads ``_fused_rule`` and ``_fused_spec``."""
    return type(spec.name, (mixin, base), {
        "_fused_rule": rule, "_fused_spec": spec, "__doc__": spec.doc + doc_suffix,
        "__module__": module_name})
