"""Installing fusedopt as a user would (issue 15): the build's prerequisite message, a
complete sdist, the wheel's version and TensorFlow pin, the loader naming the wheel to
install, lazy subpackages, `python -m fusedopt.info` on a broken install, and the scripts'
behaviour on machines without nvcc or root (tools/test_all.sh, install_system_deps.sh,
run_demo.sh). The wheel itself is built, installed into a clean venv and tested by
tools/build_wheel.sh + tools/check_wheel.sh, which CI runs (tools/test_all.sh)."""
import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import textwrap

import pytest

import fusedopt
from fusedopt import _loader

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args, **kwargs):
    kwargs.setdefault("timeout", 600)
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


def source_copy(tmp_path):
    """The project's files (no builds, venvs or VCS data) in tmp_path/src: pip and
    setuptools write into the tree they build."""
    ignore = shutil.ignore_patterns(".git", "build", "dist", ".venv*", "bazel-*", "__pycache__",
                                    "*.so", "_build_info.json", "*.egg-info", ".hypothesis",
                                    ".pytest_cache")
    return shutil.copytree(ROOT, tmp_path / "src", ignore=ignore)


# --- install paths ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory):
    """A fresh venv: the base interpreter's pip and setuptools, no TensorFlow, no pybind11."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    proc = run([sys.executable, "-m", "venv", str(venv)])
    assert proc.returncode == 0, proc.stderr
    return venv / "bin" / "python"


def _setuptools_major(python):
    out = run([str(python), "-c", "import setuptools; print(setuptools.__version__)"]).stdout
    return int(out.split(".")[0])


@pytest.mark.once  # no TensorFlow version takes part: one TF stage of CI runs it
@pytest.mark.slow
def test_no_build_isolation_in_a_bare_venv_names_every_prerequisite(bare_venv, tmp_path):
    src = source_copy(tmp_path)
    proc = run([str(bare_venv), "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                "--disable-pip-version-check", str(src)])
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "fusedopt cannot be built here" in out, out[-3000:]
    assert "pybind11 is not installed" in out
    if _setuptools_major(bare_venv) < 77:  # the venv's bundled setuptools (65 with 3.11)
        assert re.search(r"setuptools [\d.]+ is too old \(needs >= 77\)", out)
    assert "pip install --no-build-isolation ." in out
    assert "must be valid exactly by one definition" not in out  # the old, hintless failure
    assert "Traceback" not in out


@pytest.mark.once  # no TensorFlow version takes part: one TF stage of CI runs it
def test_bazel_build_names_what_is_missing_before_bazel_starts(tmp_path):
    """The Bazel path (tools/bazel_build.sh, bazel_test.sh) checks its prerequisites as
    setup.py does: no Bazel, no compiler, no XLA header packages -> one line naming the
    packages and the commands, exit 1, and Bazel never started (no bazel-* links made)."""
    empty = tmp_path / "include"
    empty.mkdir()
    (tmp_path / "include-ok" / "highwayhash").mkdir(parents=True)
    (tmp_path / "include-ok" / "highwayhash" / "arch_specific.h").write_text("")
    log = tmp_path / "bazel.log"
    fake_bazel = tmp_path / "bazel"
    fake_bazel.write_text(f"#!/bin/sh\necho ran >> {log}\n")
    fake_bazel.chmod(0o755)
    for script in ("bazel_build.sh", "bazel_test.sh"):
        env = dict(os.environ, BAZEL=str(tmp_path / "no-such-bazel"), CXX=str(tmp_path / "no-g++"),
                   FUSEDOPT_SYSTEM_INCLUDE_DIRS=str(empty))
        proc = run(["bash", os.path.join(ROOT, "tools", script), sys.executable], env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert lines[0].startswith("fusedopt's Bazel build cannot run here: Bazel is not on PATH")
        assert "apt-get install bazel-bootstrap" in lines[0]
        assert "no C++ compiler" in lines[0] and "apt-get install g++" in lines[0]
        assert "apt-get install libhighwayhash-dev libfarmhash-dev" in lines[0]
        # Bazel and a compiler there, one header package missing: only it is named, and
        # Bazel does not start.
        env.update(BAZEL=str(fake_bazel), CXX=shutil.which("g++") or "g++",
                   FUSEDOPT_SYSTEM_INCLUDE_DIRS=str(tmp_path / "include-ok"))
        proc = run(["bash", os.path.join(ROOT, "tools", script), sys.executable], env=env)
        assert proc.returncode == 1, proc.stderr
        assert "apt-get install libfarmhash-dev," in proc.stderr, proc.stderr
        assert "Bazel is not on PATH" not in proc.stderr and "libhighwayhash-dev" not in proc.stderr
        assert not log.exists()


@pytest.mark.once  # no TensorFlow version takes part: one TF stage of CI runs it
@pytest.mark.slow
def test_missing_system_packages_are_named_before_anything_compiles(tmp_path):
    """Issue 34: a machine without the XLA kernels' header packages (the check pointed at an
    empty include directory) and without a C++ compiler stops at once, with one message
    naming the packages and the command, and the way out (FUSEDOPT_XLA=0): not a raw
    compiler error a minute into the build."""
    src = source_copy(tmp_path)
    empty = tmp_path / "include"
    empty.mkdir()
    env = dict(os.environ, FUSEDOPT_SYSTEM_INCLUDE_DIRS=str(empty),
               CXX=str(tmp_path / "no-such-g++"))
    proc = run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                "--disable-pip-version-check", "--target", str(tmp_path / "target"), str(src)],
               env=env)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "fusedopt cannot be built here" in out, out[-3000:]
    assert "sudo apt-get install libhighwayhash-dev libfarmhash-dev" in out
    assert "highwayhash/arch_specific.h and farmhash.h" in out
    assert "no C++ compiler" in out and "apt-get install g++" in out
    assert "FUSEDOPT_XLA=0 pip install --no-build-isolation ." in out
    assert "No such file or directory" not in out and "Traceback" not in out
    assert not (tmp_path / "target" / "fusedopt").exists()
    # Without the XLA kernels the headers are not needed; with them and a compiler, only
    # the headers are named.
    for extra, named in (({"FUSEDOPT_XLA": "0"}, None), ({}, "libfarmhash-dev")):
        check = run([sys.executable, "setup.py", "build_ext", "--help"], cwd=src,
                    env=dict(os.environ, FUSEDOPT_SYSTEM_INCLUDE_DIRS=str(empty), **extra))
        text = check.stdout + check.stderr
        if named is None:
            assert check.returncode == 0 and "cannot be built" not in text, text[-2000:]
        else:
            assert check.returncode != 0 and named in text and "no C++ compiler" not in text


@pytest.mark.once  # no TensorFlow version takes part: one TF stage of CI runs it
@pytest.mark.slow
def test_plain_pip_install_explains_build_isolation(tmp_path):
    # pip's default: an isolated build env with setuptools and pybind11 from the package
    # index but without the environment's TensorFlow.
    src = source_copy(tmp_path)
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                "-w", str(tmp_path / "wheels"), str(src)])
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "fusedopt cannot be built here: TensorFlow is not importable" in out, out[-3000:]
    assert "pip's build isolation hides the environment's packages" in out
    assert "pip install --no-build-isolation ." in out
    assert not list(tmp_path.glob("wheels/*.whl"))


@pytest.mark.once  # no TensorFlow version takes part: one TF stage of CI runs it
@pytest.mark.slow
def test_sdist_holds_everything_both_builds_and_the_tests_read(tmp_path):
    src = source_copy(tmp_path)
    proc = run([sys.executable, "-c", "from setuptools import build_meta as b; "
                "print(b.build_sdist(%r))" % str(tmp_path / "dist")], cwd=src)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = proc.stdout.strip().splitlines()[-1]
    assert name == f"fusedopt-{fusedopt.__version__}.tar.gz"  # no TF label: built anywhere
    with tarfile.open(tmp_path / "dist" / name) as tar:
        prefix = name[:-len(".tar.gz")] + "/"
        members = {m.name[len(prefix):] for m in tar.getmembers() if m.isfile()}
    lists = {}
    with open(os.path.join(ROOT, "cc", "sources.bzl")) as f:
        exec(f.read(), lists)  # Starlark lists of strings are Python
    sources = {p for key, value in lists.items() if key.isupper() for p in value}
    assert {"cc/core/gpu/engine_gpu_kernels.cuh", "cc/tf/xla_kernels.cc"} <= sources
    expected = sources | {"cc/sources.bzl", "setup.py", "pyproject.toml", "MANIFEST.in",
                          "LICENSE", "NOTICE", "CHANGELOG.md", "README.md", "BUILD", "WORKSPACE",
                          # the documentation site's sources and the examples
                          "CONTRIBUTING.md", "BENCHMARKS.md", "mkdocs.yml",
                          "docs/bench/benchmarks.png", "python/fusedopt/py.typed"}
    for folder in ("python", "tests", "tools", "benchmarks", "third_party", "examples", "docs"):
        for dirpath, dirnames, filenames in os.walk(src / folder):
            dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "bench")]
            expected |= {os.path.relpath(os.path.join(dirpath, f), src) for f in filenames}
    assert {"examples/keras_recommender.py", "docs/guides/keras.md",
            "docs/requirements.txt"} <= expected
    assert not expected - members, sorted(expected - members)
    assert not [m for m in members if m.endswith((".so", ".pyc", "_build_info.json"))]


# --- wheels -------------------------------------------------------------------------------

@pytest.mark.parametrize("dist,name,requirement", [
    ("tensorflow-cpu", "fusedopt-tf2.21-cpu", "tensorflow-cpu>=2.21.0,<2.22"),
    ("tensorflow", "fusedopt-tf2.21", "tensorflow>=2.21.0,<2.22"),
])
def test_wheel_name_and_pin_follow_the_tensorflow_distribution(dist, name, requirement):
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    assert _loader.wheel_name("2.21.3", dist) == name
    assert _loader.tensorflow_requirement("2.21.3", dist) == requirement
    assert _loader.tensorflow_requirement("2.9.1", dist).endswith(">=2.9.0,<2.10")
    # What a public index takes: a valid project name and fusedopt's own public version (no
    # local label: PyPI refuses those).
    assert canonicalize_name(name) == name.replace(".", "-")
    assert not Version(fusedopt.__version__).local


@pytest.mark.slow
def test_setup_py_pins_a_wheel_only_when_asked(tmp_path):
    import tensorflow as tf

    src = source_copy(tmp_path)
    # setup.py run as pip runs it (argv egg_info), setup() replaced by a print; then, in the
    # same process, the wheel build's pin for the distribution here and for the other one
    # (FUSEDOPT_TF_DIST). The version is fusedopt's either way.
    code = textwrap.dedent("""
        import os, runpy, sys, setuptools
        setuptools.setup = lambda **kw: print(kw["version"], kw["install_requires"])
        sys.argv = ["setup.py", "egg_info"]
        setup = runpy.run_path("setup.py")
        os.environ["FUSEDOPT_WHEEL_FOR_TF"] = "1"
        runpy.run_path("setup.py")
        print(setup["wheel_pin"]())
        os.environ["FUSEDOPT_TF_DIST"] = "tensorflow"
        print(setup["wheel_pin"]())
    """)
    proc = run([sys.executable, "-c", code], cwd=src)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plain, wheel, here, other = proc.stdout.splitlines()[-4:]
    assert plain == f"{fusedopt.__version__} ['numpy']"  # pip install . / sdist: no pin
    dist = _loader.tensorflow_distribution(tf.__version__)
    assert here == _loader.tensorflow_requirement(tf.__version__, dist)
    assert wheel == f"{fusedopt.__version__} ['numpy', '{here}']"
    assert other == _loader.tensorflow_requirement(tf.__version__, "tensorflow")


def wheel_identity():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "wheel_identity", os.path.join(ROOT, "tools", "wheel_identity.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wheel_tag_is_the_newer_of_tensorflows_and_what_the_symbols_need():
    tools = wheel_identity()
    assert tools.glibc_of("manylinux_2_27_x86_64") == (2, 27)
    assert tools.glibc_of("manylinux2014_x86_64") == (2, 17)  # PEP 600's legacy alias
    assert tools.glibc_of("linux_x86_64") is None
    # TF 2.15 (manylinux2014) under a g++ 12 build: the symbols' manylinux_2_27 wins.
    assert tools.newer("manylinux_2_17_x86_64", "manylinux_2_27_x86_64") == "manylinux_2_27_x86_64"
    # TF 2.21 (manylinux_2_27), symbols allowing older still: TensorFlow's.
    assert tools.newer("manylinux_2_27_x86_64", "manylinux_2_17_x86_64") == "manylinux_2_27_x86_64"
    assert tools.newer("manylinux_2_28_x86_64", "manylinux_2_27_x86_64") == "manylinux_2_28_x86_64"


@pytest.mark.slow
def test_wheel_identity_names_the_project_for_this_tensorflow(tmp_path):
    import tensorflow as tf

    pyproject = tmp_path / "pyproject.toml"
    original = (pathlib.Path(ROOT) / "pyproject.toml").read_text()
    pyproject.write_text(original)
    proc = run([sys.executable, os.path.join(ROOT, "tools", "wheel_identity.py"), str(pyproject)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    dist = _loader.tensorflow_distribution(tf.__version__)
    name, plat = proc.stdout.split()
    assert name == _loader.wheel_name(tf.__version__, dist)
    assert plat.startswith("manylinux_2_") and plat.endswith("_x86_64"), plat  # TF's own tag
    assert pyproject.read_text() == original.replace('name = "fusedopt"', f'name = "{name}"', 1)
    # A pyproject.toml without the project line is refused, not half-renamed.
    proc = run([sys.executable, os.path.join(ROOT, "tools", "wheel_identity.py"), str(pyproject)])
    assert proc.returncode != 0 and "no line" in proc.stderr


def test_running_tensorflow_distribution_is_found():
    import importlib.metadata

    import tensorflow as tf

    dist = _loader.tensorflow_distribution(tf.__version__)
    assert importlib.metadata.version(dist) == tf.__version__


def _run_with_library_built_for(tmp_path, built_version, args):
    foreign = tmp_path / "_fusedopt_ops.so"
    shutil.copy(_loader.library_path(), foreign)
    (tmp_path / "_build_info.json").write_text(json.dumps({"tensorflow_version": built_version}))
    env = dict(os.environ, FUSEDOPT_OPS_LIBRARY=str(foreign), TF_CPP_MIN_LOG_LEVEL="3")
    return run([sys.executable, *args], env=env, cwd=str(tmp_path))


def test_wrong_version_import_error_names_the_wheel_to_install(tmp_path):
    import tensorflow as tf

    proc = _run_with_library_built_for(
        tmp_path, "2.9.3", ["-c", "from fusedopt import ops; ops.load_library()"])
    assert proc.returncode == 1 and "ImportError" in proc.stderr
    name = _loader.wheel_name(tf.__version__, _loader.tensorflow_distribution(tf.__version__))
    assert f"pip install {name}=={fusedopt.__version__}" in proc.stderr, proc.stderr
    assert "tools/build_wheel.sh" in proc.stderr and _loader.REBUILD_COMMAND in proc.stderr


# --- package hygiene ----------------------------------------------------------------------

@pytest.mark.slow
def test_import_fusedopt_is_cheap_and_subpackages_load_on_first_use():
    code = textwrap.dedent("""
        import sys
        import fusedopt
        assert "tensorflow" not in sys.modules, "import fusedopt imported TensorFlow"
        assert {"ops", "keras", "compat", "estimator", "reference"} <= set(dir(fusedopt))
        try:
            fusedopt.no_such_thing
        except AttributeError as e:
            assert "no_such_thing" in str(e)
        else:
            raise SystemExit("no AttributeError")
        assert callable(fusedopt.keras.LazyAdam)
        assert "tensorflow" in sys.modules
        assert fusedopt.keras is sys.modules["fusedopt.keras"]
        assert fusedopt.compat.v1.LazyAdamOptimizer
        assert fusedopt.ops.resource_sparse_apply_lazy_adam
        assert fusedopt.estimator.replicate_model_fn and fusedopt.reference
        print("ok")
    """)
    proc = run([sys.executable, "-c", code], env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def _info_lines(stdout):
    return dict(re.findall(r"^(\w+)\s+(.*)$", stdout, re.M))


@pytest.mark.slow
def test_info_reports_a_wrong_version_library_then_the_loaders_error(tmp_path):
    proc = _run_with_library_built_for(tmp_path, "2.9.3", ["-m", "fusedopt.info"])
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = _info_lines(proc.stdout)
    assert lines["op_library"].startswith("NOT LOADABLE:") and "2.9.3" in lines["op_library"]
    assert lines["built_against_tensorflow"] == "2.9.3"
    assert lines["core_module"].startswith("ok")
    assert {"fusedopt_version", "running_tensorflow", "huge_pages_for_tables"} <= set(lines)
    # The loader's message in full (several lines) closes the output.
    assert "fusedopt's op library does not load (ImportError):" in proc.stderr
    assert proc.stderr.rstrip().endswith("environment with TensorFlow %s)" % ".".join(
        lines["running_tensorflow"].split(".")[:2])), proc.stderr
    assert "\n    pip install --no-build-isolation" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_info_without_tensorflow_still_prints_the_build(tmp_path):
    # A Python where `import tensorflow` fails (sys.modules entry None: ImportError).
    code = ("import runpy, sys\nsys.modules['tensorflow'] = None\n"
            "runpy.run_module('fusedopt.info', run_name='__main__')")
    proc = run([sys.executable, "-c", code])
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = _info_lines(proc.stdout)
    assert lines["fusedopt_version"] == fusedopt.__version__
    assert lines["running_tensorflow"].startswith("NOT LOADABLE:")
    assert lines["op_library"] == "not loaded: TensorFlow does not import"
    assert lines["built_against_tensorflow"] == _loader.build_info().get("tensorflow_version")
    assert "TensorFlow does not load (ModuleNotFoundError):" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_license_notice_changelog():
    with open(os.path.join(ROOT, "LICENSE")) as f:
        assert "Apache License" in f.read(200)
    with open(os.path.join(ROOT, "NOTICE")) as f:
        notice = f.read()
    assert "replicate_model_fn" in notice and "python/fusedopt/estimator" in notice
    with open(os.path.join(ROOT, "CHANGELOG.md")) as f:
        assert f"## {fusedopt.__version__} " in f.read()
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        pyproject = f.read()
    assert 'license = "Apache-2.0"' in pyproject and '"LICENSE", "NOTICE"' in pyproject


# --- scripts on machines without nvcc, root or sudo -----------------------------------------

def _stub(path, body):
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _script_sandbox(tmp_path, script, stubs):
    """tmp_path/root/tools/<script> (a copy of the real one) beside stub tools that log
    their calls to tmp_path/calls.log; returns the copy's path."""
    tools = tmp_path / "root" / "tools"
    tools.mkdir(parents=True)
    (tmp_path / "root" / "tests").mkdir()
    shutil.copy(os.path.join(ROOT, "tools", script), tools / script)
    log = tmp_path / "calls.log"
    for name, body in stubs.items():
        _stub(tools / name, f'echo "{name} $* WERROR=${{FUSEDOPT_WERROR:-}}" >> {log}\n{body}')
    return tools / script


def _bin_dir(tmp_path, programs):
    """A PATH folder with only bash's basics plus the given stub programs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "cat", "date", "dirname", "printf", "tail", "mkdir", "rm", "id",
                 "mktemp", "grep", "sed", "env"):
        found = shutil.which(tool)
        if found and tool not in programs:
            os.symlink(found, bin_dir / tool)
    for name, body in programs.items():
        _stub(bin_dir / name, body)
    return bin_dir


@pytest.mark.parametrize("have_nvcc", [False, True])
def test_test_all_skips_the_cuda_steps_without_nvcc(tmp_path, have_nvcc):
    log = tmp_path / "calls.log"
    py = tmp_path / "root" / "fakepython"
    script = _script_sandbox(tmp_path, "test_all.sh", {
        "install_system_deps.sh": "", "setup_env.sh": f"echo {py}",
        "setup_fbgemm_env.sh": "echo /fake/fbgemm/python",
        "build_wheel.sh": "echo /tmp/fusedopt_tf2.21_cpu-0.2.0-cp311-cp311-manylinux_2_27_x86_64.whl",
        "check_wheel.sh": "", "gpu_check.sh": "", "sanitize.sh": "",
        "bazel_build.sh": "echo /tmp/bazel-pkg/fusedopt", "bazel_test.sh": "",
        "check_foreign_library.sh": ""})
    _stub(py, f'echo "python $* CUDA=${{FUSEDOPT_CUDA:-}} CUDA_PKG=${{FUSEDOPT_CUDA_PKG-unset}}" >> {log}')
    bin_dir = _bin_dir(tmp_path, {"nvcc": "exit 0"} if have_nvcc else {})
    proc = run(["bash", str(script)], env={"PATH": str(bin_dir), "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    calls = log.read_text()
    skipped = [line for line in proc.stdout.splitlines() if "CUDA steps SKIPPED" in line]
    cuda_build = "CUDA=1" in calls
    if have_nvcc:
        assert not skipped and cuda_build and "gpu_check.sh" in calls
    else:
        assert len(skipped) == 1 and "no nvcc" in skipped[0], proc.stdout
        assert not cuda_build and "gpu_check.sh" not in calls
        # The suite is not pointed at a CUDA build.
        assert re.search(r"^python -m pytest .* tests CUDA= CUDA_PKG=$", calls, re.M), calls
    # Either way the wheel is built with -Werror, checked in a clean venv, and the rest runs.
    assert "build_wheel.sh" in calls and "WERROR=1" in calls.split("build_wheel.sh")[1].split("\n")[0]
    assert "check_wheel.sh" in calls and "bazel_test.sh" in calls and "all passed" in proc.stdout


@pytest.mark.parametrize("sudo,why", [
    (None, "not root and there is no sudo"),
    ("exit 1", "sudo asks for a password"),
])
def test_install_system_deps_explains_missing_root(tmp_path, sudo, why):
    programs = {"id": "echo 1000", "apt-get": "echo apt-get should not run >&2; exit 1"}
    if sudo is not None:
        programs["sudo"] = sudo
    bin_dir = _bin_dir(tmp_path, programs)  # no bazel on PATH: a package is missing
    proc = run(["bash", os.path.join(ROOT, "tools", "install_system_deps.sh")],
               env={"PATH": str(bin_dir)})
    assert proc.returncode == 1
    assert why in proc.stderr and "bazel-bootstrap" in proc.stderr, proc.stderr
    assert "apt-get update && apt-get install -y bazel-bootstrap" in proc.stderr
    assert "apt-get should not run" not in proc.stderr
    # The demo's pip build needs no Bazel: nothing missing where the headers are there.
    headers = os.path.exists("/usr/include/highwayhash/sip_hash.h") and \
        os.path.exists("/usr/include/farmhash.h")
    demo = run(["bash", os.path.join(ROOT, "tools", "install_system_deps.sh"), "--pip-build"],
               env={"PATH": str(bin_dir)})
    assert (demo.returncode == 0) == headers, demo.stderr
    assert "bazel" not in demo.stderr


def test_run_demo_installs_only_the_demo_and_never_builds_with_werror(tmp_path):
    log = tmp_path / "calls.log"
    py = tmp_path / "root" / "fakepython"
    script = _script_sandbox(tmp_path, "run_demo.sh", {"setup_env.sh": f"echo {py}",
                                                       "build_pip.sh": "",
                                                       "install_system_deps.sh": ""})
    _stub(py, f'echo "python $*" >> {log}')
    proc = run(["bash", str(script), "--quick"],
               env=dict(os.environ, FUSEDOPT_WERROR="1"))
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("install_system_deps.sh --pip-build")
    assert calls[1].startswith("setup_env.sh 2.21 --demo")
    assert calls[2] == f"build_pip.sh {py} WERROR=0"
    assert calls[3] == "python -m fusedopt.demo --quick"


def test_demo_environment_lists_only_what_the_demo_needs(tmp_path):
    # setup_env.sh --demo with a stub interpreter: the pip lines it would run.
    log = tmp_path / "calls.log"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _stub(venv / "bin" / "python", f'echo "$*" >> {log}')
    proc = run(["bash", os.path.join(ROOT, "tools", "setup_env.sh"), "2.21", str(venv), "--demo"])
    assert proc.returncode == 0, proc.stderr
    installed = log.read_text()
    assert "tensorflow-cpu==2.21.0" in installed and "pybind11" in installed
    assert "setuptools" in installed
    for unneeded in ("torch", "matplotlib", "pytest", "hypothesis", "tf-keras"):
        assert unneeded not in installed, installed
    full = tmp_path / "full.log"
    _stub(venv / "bin" / "python", f'echo "$*" >> {full}')
    run(["bash", os.path.join(ROOT, "tools", "setup_env.sh"), "2.21", str(venv)])
    assert "torch" in full.read_text() and "pytest" in full.read_text()
