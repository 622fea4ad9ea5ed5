"""tests/gpu runs against the real fusedopt._core_cuda and CuPy on a GPU (tools/gpu_check.sh),
or, with FUSEDOPT_GPU_STANDIN=1, against the CPU stand-ins in tests/gpu/standin: a
_core_cuda that forwards to fusedopt._core and a minimal cupy with stream-ordered "device"
memory. The stand-in run (CI) proves the test logic and the harness, not the kernels."""
import os
import sys

STANDIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin")
STANDIN = os.environ.get("FUSEDOPT_GPU_STANDIN") == "1"
if STANDIN and sys.path[:1] != [STANDIN_DIR]:
    sys.path.insert(0, STANDIN_DIR)  # before any real cupy or _core_cuda


def pytest_report_header(config):
    if STANDIN:
        return ("tests/gpu: CPU STAND-IN backend (FUSEDOPT_GPU_STANDIN=1): proves the test "
                "logic and the harness, not the kernels; no GPU code runs")
    return None


def pytest_terminal_summary(terminalreporter):
    if STANDIN:  # also under -q, where the header is not shown
        terminalreporter.write_line("tests/gpu ran on the CPU stand-in (FUSEDOPT_GPU_STANDIN=1): "
                                    "not a GPU run; proves the test logic and the harness, not "
                                    "the kernels")
