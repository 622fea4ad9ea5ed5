"""Shared pytest setup for the fusedopt tests."""

import importlib.util
import os
import sys

import pytest

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
    config._fusedopt_once_deselected = len(once)
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: tell the main process
        config.workeroutput["fusedopt_once_deselected"] = len(once)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, where it is installed
def pytest_testnodedown(node, error):
    n = getattr(node, "workeroutput", {}).get("fusedopt_once_deselected")
    if n is not None:  # every worker collects the whole selection: one count
        node.config._fusedopt_once_deselected = n


def pytest_terminal_summary(terminalreporter, config):
    """The count, also under -q and under pytest-xdist (whose summary has no deselected)."""
    n = getattr(config, "_fusedopt_once_deselected", None)
    if n is not None:
        terminalreporter.write_line(
            "FUSEDOPT_REPEAT_STAGE=1: %d test%s marked `once` deselected (TF-version-"
            "independent: tools/test_all.sh's first TF stage runs them)" % (n, "s" * (n != 1)))
