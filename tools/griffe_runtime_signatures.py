"""A griffe extension for the API reference (mkdocs.yml, mkdocstrings' Python handler).

fusedopt's optimizer classes and op wrappers are made at import time from the rule registry
(``fusedopt.rules.define_classes``, ``fusedopt.ops``), so the reference is built by
inspecting the imported package (``force_inspection``), not by reading its source. Two
things then need help:

- **Constructors defined in another package.** Most optimizer classes subclass a Keras or
  TensorFlow optimizer and either inherit its ``__init__`` or wrap it (``functools.wraps``,
  which names Keras's module): the constructor is the replaced class's own. griffe would
  follow ``__init__`` into Keras's source, which the reference does not load, and fail.
  `RuntimeSignatures` gives each such class an ``__init__`` built from
  ``inspect.signature`` of the live class, so the page shows the constructor as the running
  Keras (or TensorFlow) defines it, under the class's own docstring.
- **Command-line modules.** Inspecting a package imports every module in it, and
  ``fusedopt/bench/__main__.py`` runs the benchmark when imported (``python -m
  fusedopt.bench``). griffe is told never to import a ``__main__`` module: it is a script.
"""
import inspect
from typing import Optional

import griffe

__all__ = ["RuntimeSignatures", "constructor", "NOT_INSPECTED"]

# Modules griffe must never import (importing one runs a command). griffe compares these as
# prefixes of the name it imports, which for a package's module is the name in the package.
NOT_INSPECTED = ("__main__",)
griffe.GriffeLoader.ignored_modules.update(NOT_INSPECTED)

_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def _default(value: object) -> Optional[str]:
    if value is inspect.Parameter.empty:
        return None
    return getattr(value, "__name__", None) or repr(value)


def _annotation(value: object) -> Optional[str]:
    if value is inspect.Parameter.empty:
        return None
    return value if isinstance(value, str) else getattr(value, "__name__", repr(value))


def constructor(cls: type) -> Optional[griffe.Function]:
    """An ``__init__`` for `cls` from its runtime signature (``self`` first), or None when
    Python cannot tell the signature."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return None
    parameters = [griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)]
    parameters += [griffe.Parameter(p.name, annotation=_annotation(p.annotation),
                                    kind=_KINDS[p.kind], default=_default(p.default))
                   for p in signature.parameters.values()]
    return griffe.Function("__init__", parameters=griffe.Parameters(*parameters))


class RuntimeSignatures(griffe.Extension):
    """Gives the runtime constructor to classes whose ``__init__`` griffe would look for in
    another package (see the module docstring)."""

    def on_class_members(self, *, node: griffe.ObjectNode, cls: griffe.Class,
                         agent: object, **kwargs: object) -> None:
        obj = getattr(node, "obj", None)
        current = cls.members.get("__init__")
        if not inspect.isclass(obj) or (current is not None and not current.is_alias):
            return  # the class's own constructor, which griffe inspected itself
        init = constructor(obj)
        if init is not None:
            cls.set_member("__init__", init)
