"""CI's two TensorFlow stages (tools/test_all.sh): the first runs every test, the second
(FUSEDOPT_REPEAT_STAGE=1) leaves out the tests marked `once`, which do not depend on
TensorFlow's version. Checked: the marker deselects exactly those tests, only where the
variable is set, and only the second stage's pytest sets it."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _collected(env_value, path="tests/builds/test_experiments.py"):
    env = dict(os.environ)
    env.pop("FUSEDOPT_REPEAT_STAGE", None)
    if env_value is not None:
        env["FUSEDOPT_REPEAT_STAGE"] = env_value
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", path], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode in (0, 5), run.stdout[-2000:] + run.stderr[-2000:]
    return [line for line in run.stdout.splitlines() if "::" in line]


def test_once_tests_run_in_the_first_stage_and_not_the_repeat():
    first = _collected(None)
    assert first  # the experiment tools' tests: marked once, collected by default
    assert _collected("0") == first
    assert _collected("1") == []
    # a module without the marker is untouched by the variable
    ops = "tests/ops/test_registry.py"
    assert _collected("1", ops) == _collected(None, ops) != []


def test_only_the_second_stage_sets_the_variable():
    script = open(os.path.join(ROOT, "tools", "test_all.sh")).read()
    suites = [line for line in script.splitlines() if '-m "not large" tests' in line]
    assert len(suites) == 2, suites
    assert '"$py221" -m pytest' in suites[0] and "FUSEDOPT_REPEAT_STAGE" not in suites[0]
    assert '"$py215" -m pytest' in suites[1] and "FUSEDOPT_REPEAT_STAGE=1 " in suites[1]
    assert script.count("FUSEDOPT_REPEAT_STAGE=1 ") == 1  # (the comment above it names it too)
