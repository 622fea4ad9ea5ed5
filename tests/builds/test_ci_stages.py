"""CI's two TensorFlow stages (tools/test_all.sh): the first runs every test, the second
(FUSEDOPT_REPEAT_STAGE=1) leaves out the tests marked `once`, which do not depend on
TensorFlow's version. Checked: the marker is on exactly the tests listed in ONCE_TESTS, it
deselects exactly those tests, only where the variable is set, and only the second stage's
pytest sets it, with the same pytest arguments as the first."""
import ast
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
    # the same selection otherwise (workers, markers), and none that leaves `once` out
    args = [line.split(" -m pytest ", 1)[1] for line in suites]
    assert args[0] == args[1] and "once" not in args[0], args


# The tests marked `once`, each independent of TensorFlow's version: the benchmark harness,
# FBGEMM in its own venv, TF-free tools and builds, install checks no TensorFlow takes part
# in, the documentation site (built with the first stage's TensorFlow, where its tools are). A file stands for every test in it. Marking another test means listing it here.
ONCE_TESTS = {
    "tests/builds/test_bench.py",
    "tests/builds/test_bench_fbgemm.py",
    "tests/builds/test_bench_largest_table.py",
    "tests/builds/test_bench_state.py",
    "tests/builds/test_build_config.py::test_a_wrong_cuda_target_is_named_before_anything_builds",
    "tests/builds/test_build_config.py::test_both_builds_read_the_one_source_list",
    "tests/builds/test_build_config.py::test_cuda_engine_instantiates_each_type_pair_once",
    "tests/builds/test_build_config.py::test_every_cc_file_is_in_the_one_source_list",
    "tests/builds/test_build_config.py::test_nvcc_settings_are_written_once",
    "tests/builds/test_experiments.py",
    "tests/builds/test_gpu_check.py",
    "tests/builds/test_packaging.py::test_bazel_build_names_what_is_missing_before_bazel_starts",
    "tests/builds/test_packaging.py::test_missing_system_packages_are_named_before_anything_compiles",
    "tests/builds/test_packaging.py::test_no_build_isolation_in_a_bare_venv_names_every_prerequisite",
    "tests/builds/test_packaging.py::test_plain_pip_install_explains_build_isolation",
    "tests/builds/test_packaging.py::test_sdist_holds_everything_both_builds_and_the_tests_read",
    "tests/core/test_fbgemm_oracle.py",
    "tests/docs/test_docs_site.py",  # the site is built in the first stage's environment
    "tests/distribute/test_ps_bench.py",
    "tests/ops/test_leaks.py",  # our allocations (kernels, _core): the same source in both
}


def _is_once(node):
    """pytest.mark.once, called or not, alone or in a list."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_once(n) for n in node.elts)
    if isinstance(node, ast.Call):
        node = node.func
    return ast.unparse(node) == "pytest.mark.once"


def test_the_once_marker_is_on_exactly_the_listed_tests():
    marked = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "tests")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), ROOT)
            with open(os.path.join(ROOT, rel)) as f:
                tree = ast.parse(f.read())
            found = 0
            for node in tree.body:
                if isinstance(node, ast.Assign) and _is_once(node.value) and any(
                        isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
                    marked.add(rel)
                    found += 1
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and any(
                        _is_once(d) for d in node.decorator_list):
                    marked.add("%s::%s" % (rel, node.name))
                    found += 1
            # any other use (an alias, pytest.param(marks=...)) would escape this check
            uses = sum(isinstance(n, ast.Attribute) and n.attr == "once" and
                       ast.unparse(n.value).endswith("mark") for n in ast.walk(tree))
            assert uses == found, "%s: mark.once not as a decorator or pytestmark" % rel
    assert marked == ONCE_TESTS, (sorted(marked - ONCE_TESTS), sorted(ONCE_TESTS - marked))
