"""tools/gpu_check.sh never passes falsely: where a GPU is expected, each cause that used to
end in "no GPU: skipped" (no nvcc, `import cupy` failing, CUDA failing to initialise, no test
collected or run) fails with a line naming it; without an expected GPU it still exits 0. Also
its stages: memcheck before racecheck (at error level), and stages skipped or stopped by the
time budget. Each condition is faked: an `nvidia-smi` on PATH that lists a GPU (or fails),
FUSEDOPT_NVCC pointing nowhere, a `cupy` on PYTHONPATH that raises ImportError, the real
_core_cuda on a machine where CUDA does not initialise, a `compute-sanitizer` that logs its
arguments and runs the command, and a "device that initialises" played by the CPU
stand-ins of tests/gpu/standin.

The real modules come from $FUSEDOPT_CUDA_PKG (a CUDA pip build: CI's), else
$FUSEDOPT_GPU_BUILD (a gpu_check.sh build dir), else one gpu_check.sh build per session
(needs nvcc; about two minutes on two cores), which also tests the no-GPU build path.
Every other run reuses them (GPU_CHECK_REUSE_BUILD=1).
"""
import os
import stat
import subprocess
import sys
import sysconfig
import textwrap

import pytest

# Independent of TensorFlow's version (TF-free CUDA modules): one TF stage of CI runs it.
pytestmark = pytest.mark.once

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "gpu_check.sh")
STANDIN_DIR = os.path.join(ROOT, "tests", "gpu", "standin")
EXT = sysconfig.get_config_var("EXT_SUFFIX")
MODULES = ("_core_cuda", "_core")

NVIDIA_SMI_WITH_GPU = """\
#!/bin/sh
# Fake: one H200, as `nvidia-smi -L` and the queries gpu_check.sh makes print it.
case "$*" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-fake)" ;;
  *compute_cap*) echo "9.0" ;;
  *) echo "NVIDIA H200, 580.00 (fake), 143771 MiB" ;;
esac
"""
NVIDIA_SMI_WITHOUT_DRIVER = """\
#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. (fake)"
exit 9
"""
COMPUTE_SANITIZER = """\
#!/usr/bin/env bash
# Fake: logs its arguments, sleeps FAKE_SANITIZER_SLEEP, exits 3 (errors found) for the tool
# named by FAKE_SANITIZER_FAILS, else runs the command.
echo "$*" >>"$FAKE_SANITIZER_LOG"
tool=""
while [[ $1 == --* ]]; do [[ $1 == --tool ]] && tool=$2; shift 2; done
sleep "${FAKE_SANITIZER_SLEEP:-0}"
[[ $tool == "${FAKE_SANITIZER_FAILS:-}" ]] && exit 3
exec "$@"
"""
NVCC = "#!/bin/sh\nexit 0\n"  # never run: the modules are reused
# A CUDA device that initialises, for the stages after the device check: the stand-in
# _core_cuda and cupy, found ahead of everything on sys.path (the build dir included).
STANDIN_DEVICE = f"""\
import importlib.machinery
import sys


class _StandinFirst:
    def find_spec(self, name, path=None, target=None):
        if name in ("_core_cuda", "cupy"):
            return importlib.machinery.PathFinder.find_spec(name, [{STANDIN_DIR!r}])
        return None


sys.meta_path.insert(0, _StandinFirst())
"""


def write(path, text, executable=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    if executable:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def module_files(directory):
    found = {m: os.path.join(directory, m + EXT) for m in MODULES}
    return found if all(os.path.isfile(f) for f in found.values()) else None


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """A directory holding links to real _core_cuda and _core modules."""
    links = tmp_path_factory.mktemp("gpu_build")
    pkg = os.environ.get("FUSEDOPT_CUDA_PKG", "")
    found = None
    for candidate in (os.path.join(pkg, "fusedopt") if pkg else "",
                      os.environ.get("FUSEDOPT_GPU_BUILD", "")):
        found = candidate and module_files(candidate)
        if found:
            break
    if not found:  # build them once, through the no-GPU path
        build = str(tmp_path_factory.mktemp("gpu_check_build"))
        result = subprocess.run(["bash", SCRIPT, sys.executable], capture_output=True, text=True,
                                env=dict(os.environ, FUSEDOPT_EXPECT_GPU="0",
                                         FUSEDOPT_GPU_BUILD=build))
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "no GPU: skipped" in result.stdout
        if "no nvcc" in result.stdout:
            pytest.skip("no CUDA modules to test with: set FUSEDOPT_CUDA_PKG, or have nvcc")
        assert "built _core_cuda and _core" in result.stdout
        found = module_files(build)
    for module, path in found.items():
        os.symlink(path, os.path.join(links, module + EXT))
    return str(links)


@pytest.fixture
def fake(tmp_path):
    """Builds the environment of one gpu_check.sh run; .run() runs it."""
    return FakeMachine(tmp_path)


class FakeMachine:
    def __init__(self, tmp):
        self.tmp = tmp
        self.bin = str(tmp / "bin")
        self.out = str(tmp / "out")
        self.sanitizer_log = str(tmp / "sanitizer.log")
        write(os.path.join(self.bin, "compute-sanitizer"), COMPUTE_SANITIZER, executable=True)
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("GPU_CHECK_", "FUSEDOPT_", "FAKE_"))}
        self.env.update(PATH=self.bin + os.pathsep + os.environ["PATH"], OUT=self.out,
                        FAKE_SANITIZER_LOG=self.sanitizer_log, PYTHONDONTWRITEBYTECODE="1")
        self.gpu_listed(True)

    def gpu_listed(self, listed):
        write(os.path.join(self.bin, "nvidia-smi"),
              NVIDIA_SMI_WITH_GPU if listed else NVIDIA_SMI_WITHOUT_DRIVER, executable=True)

    def reuse(self, build):
        self.env.update(FUSEDOPT_GPU_BUILD=build, GPU_CHECK_REUSE_BUILD="1",
                        FUSEDOPT_NVCC=write(os.path.join(self.bin, "nvcc"), NVCC, True))

    def python_path(self, name, files):
        directory = str(self.tmp / name)
        for relative, text in files.items():
            write(os.path.join(directory, relative), text)
        self.env["PYTHONPATH"] = directory

    def device_that_initialises(self):
        self.python_path("standin_device", {"sitecustomize.py": STANDIN_DEVICE})

    def tests(self, files):
        directory = str(self.tmp / "gpu_tests")
        os.makedirs(directory, exist_ok=True)
        for name, text in files.items():
            write(os.path.join(directory, name), textwrap.dedent(text))
        self.env["GPU_CHECK_TESTS"] = directory

    def run(self, **env):
        self.env.update(env)
        result = subprocess.run(["bash", SCRIPT, sys.executable], capture_output=True, text=True,
                                env=self.env, cwd=str(self.tmp), timeout=300)
        self.stdout = result.stdout
        self.returncode = result.returncode
        return result

    def line(self, start):
        """The first output line containing `start` (after the timestamp)."""
        for line in self.stdout.splitlines():
            if start in line:
                return line
        raise AssertionError(f"no line with {start!r} in:\n{self.stdout}")

    def sanitizer_calls(self):
        if not os.path.exists(self.sanitizer_log):
            return []
        with open(self.sanitizer_log) as f:
            return f.read().splitlines()


PASSING = {"test_one.py": "def test_passes():\n    pass\n"}
ALL_SKIPPED = {"test_one.py": """\
    import pytest


    def test_needs_a_gpu():
        pytest.skip("fake: no GPU")
    """}


def assert_fails(fake, cause):
    assert fake.returncode != 0, fake.stdout
    assert "FAIL: " + cause in fake.line("FAIL: "), fake.stdout


# --- no GPU expected: a skip, exit 0 ---

@pytest.mark.slow
def test_without_a_listed_gpu_it_skips_and_exits_0(fake, built):
    fake.gpu_listed(False)
    fake.reuse(built)
    fake.run()
    assert fake.returncode == 0, fake.stdout
    assert "GPU expected: no (nvidia-smi lists no GPU)" in fake.stdout
    assert "no GPU: skipped" in fake.line("no GPU: skipped")


def test_expect_gpu_0_overrides_a_listed_gpu(fake, built):
    fake.reuse(built)
    fake.run(FUSEDOPT_EXPECT_GPU="0")
    assert fake.returncode == 0, fake.stdout
    assert "GPU expected: no (FUSEDOPT_EXPECT_GPU=0)" in fake.stdout
    assert "no GPU: skipped" in fake.stdout


def test_without_nvcc_and_no_gpu_it_skips(fake):
    fake.gpu_listed(False)
    fake.run(FUSEDOPT_NVCC="/nonexistent/nvcc")
    assert fake.returncode == 0, fake.stdout
    assert "no nvcc (/nonexistent/nvcc is not an executable file)" in fake.stdout
    assert "no GPU: skipped" in fake.stdout


# --- a GPU expected: each false-pass cause fails, naming itself ---

def test_listed_gpu_without_nvcc_fails(fake):
    fake.run(FUSEDOPT_NVCC="/nonexistent/nvcc")
    assert "GPU expected: yes (nvidia-smi lists GPU 0: NVIDIA H200" in fake.stdout
    assert_fails(fake, "nvcc missing (/nonexistent/nvcc is not an executable file)")
    assert "no GPU: skipped" not in fake.stdout


def test_expect_gpu_1_without_a_listed_gpu_fails_without_nvcc(fake):
    fake.gpu_listed(False)
    fake.run(FUSEDOPT_NVCC="/nonexistent/nvcc", FUSEDOPT_EXPECT_GPU="1")
    assert "GPU expected: yes (FUSEDOPT_EXPECT_GPU=1)" in fake.stdout
    assert_fails(fake, "nvcc missing")


def test_expect_gpu_must_be_0_or_1(fake):
    fake.run(FUSEDOPT_EXPECT_GPU="yes")
    assert_fails(fake, "FUSEDOPT_EXPECT_GPU must be 0 or 1, got 'yes'")


def test_cupy_import_error_fails_and_is_shown(fake, built):
    fake.reuse(built)
    fake.python_path("broken_cupy", {"cupy/__init__.py": (
        'raise ImportError("libcudart.so.13: cannot open shared object file (fake)")\n')})
    fake.run()
    assert_fails(fake, "'import cupy' failed: ImportError: libcudart.so.13: cannot open "
                       "shared object file (fake)")


def test_cuda_that_does_not_initialise_fails_with_its_error(fake, built):
    probe = subprocess.run(
        [sys.executable, "-c", "import _core_cuda as m; print(m.device_count()); "
                               "print(m.cuda_init_error())"],
        capture_output=True, text=True, cwd=built, check=True).stdout.splitlines()
    if int(probe[0]) > 0:
        pytest.skip("CUDA initialises on this machine: its failure cannot be faked here")
    assert probe[1], "device_count() is 0 but cuda_init_error() is empty"
    fake.reuse(built)
    fake.python_path("working_cupy", {"cupy/__init__.py": ""})
    fake.run()
    assert_fails(fake, "CUDA did not initialise: " + probe[1])


def test_no_test_collected_fails(fake, built):
    fake.reuse(built)
    fake.device_that_initialises()
    fake.tests({})
    fake.run(GPU_CHECK_BENCH="0")
    assert_fails(fake, "no tests collected from " + fake.env["GPU_CHECK_TESTS"])


def test_no_test_run_fails(fake, built):
    fake.reuse(built)
    fake.device_that_initialises()
    fake.tests(ALL_SKIPPED)
    fake.run(GPU_CHECK_BENCH="0")
    assert_fails(fake, "0 of 1 GPU tests ran (all skipped")
    assert "fake: no GPU" in fake.stdout  # the skip reason is shown (-rs)


# --- stages, order, time budget ---

@pytest.mark.slow
def test_passing_run_sanitizes_memcheck_then_racecheck_and_sums_up(fake, built):
    fake.reuse(built)
    fake.device_that_initialises()
    fake.tests(PASSING)
    fake.run(GPU_CHECK_BENCH="0", GPU_CHECK_SANITIZER_SLOWDOWN="1")
    assert fake.returncode == 0, fake.stdout
    assert "tests passed: 1 of 1 ran, 0 skipped" in fake.stdout
    calls = fake.sanitizer_calls()
    assert [c.split()[:2] for c in calls] == [["--tool", "memcheck"], ["--tool", "racecheck"]]
    assert "--racecheck-detect-level error" in calls[1]
    assert "--racecheck-detect-level" not in calls[0]
    for call in calls:
        assert "--error-exitcode 3" in call and fake.env["GPU_CHECK_TESTS"] in call
    summary = fake.stdout[fake.stdout.index("summary (budget 480 s"):]
    for stage, result in (("build", "reused"), ("tests", "passed: 1 of 1 ran"),
                          ("bench", "skipped (GPU_CHECK_BENCH=0)"), ("memcheck", "clean"),
                          ("racecheck", "clean")):
        assert any(line.split()[:1] == [stage] and result in line
                   for line in summary.splitlines()), (stage, summary)
    assert os.path.isfile(os.path.join(fake.out, "gpu_tests.xml"))
    with open(os.path.join(fake.out, "gpu_check.log")) as f:
        assert "compute-sanitizer racecheck: clean" in f.read()


@pytest.mark.slow
def test_failing_tests_fail_the_run_after_the_other_stages(fake, built):
    fake.reuse(built)
    fake.device_that_initialises()
    fake.tests({"test_one.py": "def test_fails():\n    assert False\n"})
    fake.run(GPU_CHECK_BENCH="0", GPU_CHECK_SANITIZER_SLOWDOWN="1")
    assert fake.returncode == 1, fake.stdout
    assert "FAIL: 1 of 1 GPU tests failed (0 skipped)" in fake.stdout
    assert "tests passed" not in fake.stdout
    assert len(fake.sanitizer_calls()) == 2


def test_sanitizer_errors_fail_the_run(fake, built):
    fake.reuse(built)
    fake.device_that_initialises()
    fake.tests(PASSING)
    fake.run(GPU_CHECK_BENCH="0", GPU_CHECK_SANITIZER_SLOWDOWN="1", FAKE_SANITIZER_FAILS="memcheck")
    assert fake.returncode == 1, fake.stdout
    assert "compute-sanitizer memcheck: FAIL: errors found" in fake.stdout
    assert "compute-sanitizer racecheck: clean" in fake.stdout  # still run: more to learn


def test_sanitizers_that_would_overrun_the_budget_are_skipped(fake, built):
    fake.reuse(built)
    fake.device_that_initialises()
    fake.tests(PASSING)
    # Estimates: the tests' time x 1000, minutes here, against a 60 s budget.
    fake.run(GPU_CHECK_BENCH="0", GPU_CHECK_SANITIZER_SLOWDOWN="1000", GPU_CHECK_BUDGET_S="60")
    assert fake.returncode == 0, fake.stdout
    assert "SKIPPED memcheck: needs ~" in fake.stdout
    assert "SKIPPED racecheck: needs ~" in fake.stdout
    assert fake.sanitizer_calls() == []


@pytest.mark.slow
def test_racecheck_is_skipped_on_memchecks_measured_time(fake, built):
    """memcheck's estimate is 0 (slowdown 0) so it runs, taking 15 s; racecheck's estimate is
    then memcheck's measured time, more than the 27 s budget has left (about 10 s: margins of
    ~5-10 s either way, so the start-up time of the machine running this does not decide)."""
    fake.reuse(built)
    fake.device_that_initialises()
    fake.tests(PASSING)
    fake.run(GPU_CHECK_BENCH="0", GPU_CHECK_SANITIZER_SLOWDOWN="0", GPU_CHECK_BUDGET_S="27",
             FAKE_SANITIZER_SLEEP="15")
    assert fake.returncode == 0, fake.stdout
    assert "compute-sanitizer memcheck: clean" in fake.stdout
    needs = fake.line("SKIPPED racecheck: needs ~").split("needs ~")[1].split()[0]
    assert float(needs) >= 15
    assert len(fake.sanitizer_calls()) == 1


@pytest.mark.slow
def test_a_stage_running_past_the_budget_is_stopped_and_fails(fake, built):
    fake.reuse(built)
    fake.device_that_initialises()
    fake.tests(PASSING)
    fake.run(GPU_CHECK_BENCH="0", GPU_CHECK_SANITIZER_SLOWDOWN="0", GPU_CHECK_BUDGET_S="12",
             FAKE_SANITIZER_SLEEP="60")
    assert fake.returncode == 1, fake.stdout
    assert "compute-sanitizer memcheck: FAIL: incomplete, stopped at the time budget" in fake.stdout

