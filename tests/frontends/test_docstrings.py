"""The public optimizer classes document their constructor the way Keras's own do: an
``Args:`` section naming every argument of the constructor as installed (the Keras
classes inherit Keras's constructor, so the running Keras version decides the list)."""
import inspect
import re

import pytest


def public_classes():
    import fusedopt.compat.v1 as v1
    import fusedopt.keras as fk
    from fusedopt.keras import legacy

    # (fusedopt.keras.Embedding is Keras's layer: its docstring is Keras's, after ours:
    # tests/frontends/test_keras_embedding.py)
    classes = [getattr(fk, name) for name in fk.__all__ if name != "Embedding"]
    classes += [getattr(legacy, name) for name in legacy.__all__]
    classes += [getattr(v1, name) for name in v1.__all__]
    return classes


@pytest.mark.parametrize("cls", public_classes(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_constructor_arguments_are_documented(cls):
    doc = inspect.getdoc(cls) or ""
    assert "\nArgs:\n" in doc, f"{cls.__module__}.{cls.__name__} has no Args section"
    args = doc.split("\nArgs:\n", 1)[1]
    documented = set(re.findall(r"^  (\*{0,2}\w+):", args, re.M))
    parameters = inspect.signature(cls.__init__).parameters.values()
    wanted = {("**" if p.kind is p.VAR_KEYWORD else "") + p.name
              for p in parameters if p.name != "self"}
    assert not wanted - documented, (cls.__name__, sorted(wanted - documented))
