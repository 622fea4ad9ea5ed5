"""The front-end classes the tests run, per rule, from the rules' specs.

A rule has a class of its own in a front end (its spec names it), or runs for some settings
of another rule's class (that spec's ``variants``, e.g. RMSprop's ``centered=True``): such
a rule is tested through that class, with the setting in its oracle's ``<FRONT_END>_KWARGS``.
"""
from fusedopt import rules


def cases(front_end):
    """{rule: (class name, spec)} of one front end ("KERAS", "LEGACY", "COMPAT_V1")."""
    out = {rule: (spec.name, spec) for rule, spec in rules.front_end_specs(front_end)}
    for rule, (owner, spec) in rules.variant_specs(front_end).items():
        out[rule] = (out[owner][0], spec)
    return out


def specs(front_end):
    """{rule: spec} of every rule cases() lists."""
    return {rule: spec for rule, (_, spec) in cases(front_end).items()}


def classes(front_end, module):
    """{rule: the class in `module` that runs it}."""
    return {rule: getattr(module, name) for rule, (name, _) in cases(front_end).items()}
