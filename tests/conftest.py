"""Shared pytest setup for the fusedopt tests."""

import importlib.util
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The tests' shared helpers (harness, numpy_reference, numpy_rules, error_cases) live in
# tests/support, importable from every folder of concerns.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

# Use the installed package (pip install -e . or a wheel) when there is one; otherwise
# fall back to the source tree so that the pure-Python parts (fusedopt.reference) can
# be tested before the extension is built.
if importlib.util.find_spec("fusedopt") is None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "python"))


def pytest_collection_modifyitems(config, items):
    """FUSEDOPT_REPEAT_STAGE=1 (tools/test_all.sh's second TensorFlow): the tests marked
    `once`, which do not depend on TensorFlow's version, ran in the first stage already."""
    if os.environ.get("FUSEDOPT_REPEAT_STAGE") != "1":
        return
    once = [item for item in items if item.get_closest_marker("once") is not None]
    if once:
        config.hook.pytest_deselected(items=once)
        items[:] = [item for item in items if item.get_closest_marker("once") is None]
