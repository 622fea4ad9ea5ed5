"""FBGEMM's CPU build for the tests (the row-wise Adagrad oracle, the benchmark's peer).

FBGEMM runs in a venv of its own (tools/setup_fbgemm_env.sh; its torch and TensorFlow
crash in one process), named by FUSEDOPT_FBGEMM_PYTHON; tools/test_all.sh sets it. Tests
that need it are `slow` and fail, not skip, without it: a CI that lost the oracle must
say so. Day to day (the fast tier) they do not run.
"""
import pytest

from fusedopt.bench import fbgemm


def python_or_fail():
    """The FBGEMM venv's python; fails the test, naming the fix, where there is none."""
    python, why = fbgemm.find_python()
    if python is None:
        pytest.fail(f"FBGEMM's CPU build is needed here (the outside oracle): {why}; "
                    "tools/test_all.sh sets it up", pytrace=False)
    return python
