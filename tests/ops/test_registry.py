"""The rule registry is complete: every rule the C++ declares (fusedopt._core.rules())
has its four ops in the op library, its op wrappers, its composed form, a class in every
front end (fusedopt.keras, fusedopt.keras.legacy, fusedopt.compat.v1) whose spec maps
exactly the rule's hyper-parameters and slots, and its NumPy oracle in tests/support/numpy_rules
(written from the spec, and agreeing with the C++ on slots, hyper-parameters and
options). A rule that ships without any of these fails here by name."""
import importlib
import os
import pkgutil
import re

import pytest

import numpy_reference as npref
from fusedopt import _core, ops, reference, rules
from fusedopt.rules import _front

RULES = _core.rules()
FRONT_END_TYPES = {"KERAS": _front.Keras, "LEGACY": _front.Legacy,
                   "COMPAT_V1": _front.CompatV1}


def test_every_layer_knows_the_same_rules():
    python_modules = {m.name for m in pkgutil.iter_modules(rules.__path__)
                      if not m.name.startswith("_")}
    assert rules.names() == list(RULES)
    assert python_modules == set(RULES), "fusedopt/rules/<rule>.py for every C++ rule"
    assert set(npref.ORACLES) == set(RULES), "tests/support/numpy_rules/<rule>.py for every rule"


def test_python_names_are_the_op_names_in_snake_case():
    # The C++ rule states only its op name; the Python name is derived from it (PyName<Rule>).
    def snake(op_name):
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", op_name).lower()
    assert {name: snake(spec["op_name"]) for name, spec in RULES.items()} == \
        {name: name for name in RULES}
    assert RULES["rms_prop"]["op_name"] == "RMSProp"  # an acronym: one word, not r_m_s


@pytest.mark.parametrize("rule", list(RULES))
def test_oracle_agrees_with_the_cpp_declaration(rule):
    spec = RULES[rule]
    assert npref.RULES[rule] == {k: spec[k] for k in ("slots", "hyper", "options",
                                                      "slot_layouts")}


@pytest.mark.parametrize("rule", list(RULES))
def test_op_library_registers_every_variant(rule):
    from tensorflow.python.framework import op_def_registry

    ops.load_library()
    for variant in ops.VARIANTS:
        op_def = op_def_registry.get(ops.op_name(rule, variant))
        assert op_def is not None, ops.op_name(rule, variant)
        inputs = [arg.name for arg in op_def.input_arg]
        assert inputs[:1 + len(RULES[rule]["slots"])] == ["var", *RULES[rule]["slots"]]
        wrapper = getattr(ops, f"{variant}_{rule}")
        params = list(wrapper.__signature__.parameters)
        expected = ["var", *RULES[rule]["slots"], *RULES[rule]["hyper"], "grad"]
        assert params[:len(expected)] == expected
        assert set(RULES[rule]["options"]) <= set(params)


@pytest.mark.parametrize("rule", list(RULES))
def test_composed_form(rule):
    module = rules.module(rule)
    assert callable(module.composed) and module.MATH
    assert callable(getattr(reference, rule))


@pytest.mark.parametrize("front_end", sorted(FRONT_END_TYPES))
@pytest.mark.parametrize("rule", list(RULES))
def test_every_front_end_has_a_class(rule, front_end):
    """A class of its own, or a setting of another rule's class (its spec's variants: a
    spec without a name, e.g. RMSprop's centered=True)."""
    spec = getattr(rules.module(rule), front_end, None)
    assert isinstance(spec, FRONT_END_TYPES[front_end]), \
        f"fusedopt/rules/{rule}.py must declare {front_end}"
    declared = RULES[rule]
    assert set(spec.hyper) == set(declared["hyper"]), "the spec maps every hyper-parameter"
    assert len(spec.slots) == len(declared["slots"])
    assert set(spec.options) <= set(declared["options"])
    module = {"KERAS": "fusedopt.keras", "LEGACY": "fusedopt.keras.legacy",
              "COMPAT_V1": "fusedopt.compat.v1"}[front_end]
    if front_end == "LEGACY" and not _legacy_keras_available():
        pytest.skip("no Keras 2 here (tf_keras not installed)")
    if spec.name is None:
        owner, variant_spec = rules.variant_specs(front_end)[rule]
        assert variant_spec is spec
        class_spec = getattr(rules.module(owner), front_end)
        assert getattr(importlib.import_module(module), class_spec.name)
        return
    cls = getattr(importlib.import_module(module), spec.name)
    assert cls.__name__ == spec.name and cls.__doc__.startswith(spec.doc)


def _legacy_keras_available():
    try:
        importlib.import_module("fusedopt.keras.legacy")
        return True
    except ImportError:
        return False


def test_cuda_module_knows_the_same_rules():
    try:
        from fusedopt import _core_cuda
    except ImportError:
        pkg = os.environ.get("FUSEDOPT_CUDA_PKG")
        if not pkg:
            pytest.skip("not a CUDA build (FUSEDOPT_CUDA_PKG unset)")
        # Loaded from its file: putting the package directory on sys.path would make its
        # `keras` subpackage shadow the real keras for the rest of the session.
        import glob
        import importlib.util
        path, = glob.glob(os.path.join(pkg, "fusedopt", "_core_cuda*.so"))
        spec = importlib.util.spec_from_file_location("_core_cuda", path)
        _core_cuda = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_core_cuda)
    assert _core_cuda.rules() == RULES


def test_benchmark_has_every_rule():
    """python -m fusedopt.bench measures every rule against its peers (bench/contenders.py
    names the peers; the rule's slots must be the registry's)."""
    from fusedopt.bench.contenders import RULES as BENCH

    assert set(BENCH) == set(RULES)
    for rule, entry in BENCH.items():
        assert list(entry.slots) == RULES[rule]["slots"]
        assert set(entry.per_row) == {s for s, layout in RULES[rule]["slot_layouts"].items()
                                      if layout == "per_row"}
        assert set(entry.hyper(1)) == set(RULES[rule]["hyper"])
