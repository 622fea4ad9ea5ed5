"""The build's own promises: one source list, versions that agree, the info command,
the 16-bit conversions, the version-mismatch ImportError, damaged libraries refused before
dlopen (ImportError, never SIGBUS) and the demo."""
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import fusedopt
import harness
from fusedopt import _core, _loader, ops

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_sources():
    namespace = {}
    with open(os.path.join(ROOT, "cc", "sources.bzl")) as f:
        exec(f.read(), namespace)
    return namespace


SOURCE_LISTS = ("CORE_HDRS", "GPU_HDRS", "GPU_CUDA_HDRS", "GPU_SRCS", "TF_HDRS", "TF_SRCS",
                "XLA_HDRS", "XLA_SRCS", "PYBIND_HDRS", "PYBIND_SRCS", "PYBIND_CUDA_SRCS",
                "ABI_FLOOR_HDRS", "ABI_FLOOR_SRCS")


@pytest.mark.once  # the sources alone: no TensorFlow, no build
def test_every_cc_file_is_in_the_one_source_list():
    lists = read_sources()
    listed = [p for key in SOURCE_LISTS for p in lists[key]]
    on_disk = sorted(os.path.relpath(p, ROOT) for ext in ("h", "cc", "cuh")
                     for p in glob.glob(os.path.join(ROOT, "cc", "**", f"*.{ext}"), recursive=True))
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)


@pytest.mark.once  # the sources alone: no TensorFlow, no build
def test_cuda_engine_instantiates_each_type_pair_once():
    """The CUDA engine's kernels are instantiated over several files (parallel compiles):
    together they cover exactly the (var, slot) pairs SlotStorageAllowed admits, each once,
    and every such file is a GPU source (tools/gpu_check.sh compiles cc/core/gpu/*.cu.cc)."""
    gpu_srcs = read_sources()["GPU_SRCS"]
    assert sorted(gpu_srcs) == sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "cc", "core", "gpu", "*.cu.cc")))
    pairs = []
    for path in gpu_srcs:
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        for args in re.findall(r"InstantiateAll<AllRules,((?:\s*Pair<[^>]+>,?)+)>;", text):
            pairs += [tuple(t.strip() for t in p.split(","))
                      for p in re.findall(r"Pair<([^>]+)>", args)]
    types = ("half_t", "bfloat16_t", "float", "double")
    allowed = [(t, t) for t in types] + [("float", "half_t"), ("float", "bfloat16_t")]
    assert sorted(pairs) == sorted(allowed)


@pytest.mark.once  # the sources alone: no TensorFlow, no build
def test_both_builds_read_the_one_source_list():
    with open(os.path.join(ROOT, "BUILD")) as f:
        build = f.read()
    with open(os.path.join(ROOT, "setup.py")) as f:
        setup = f.read()
    assert re.search(r'load\(\s*"//cc:sources.bzl"', build)
    for key in SOURCE_LISTS:
        assert key in build and f'lists["{key}"]' in setup
    # Neither build may name a .cc file on its own.
    assert not re.search(r'"cc/[^"]+\.cc"', setup)
    assert not re.search(r'"//cc:[^"]+\.cc"', build)


def test_versions_agree():
    # One home for the version: fusedopt/__init__.py (pyproject.toml: dynamic, from setup.py).
    with open(os.path.join(ROOT, "python", "fusedopt", "__init__.py")) as f:
        version = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert re.search(r'^dynamic = \[.*"version"', f.read(), re.M)
    assert fusedopt.__version__ == version
    info = _loader.build_info()
    if info.get("build_system") == "setuptools":
        assert info["fusedopt_version"] == version


def test_build_info_names_the_running_tensorflow():
    import tensorflow as tf

    info = _loader.build_info()
    assert info["tensorflow_version"] == tf.__version__
    assert info["build_system"] in ("setuptools", "bazel")


def test_python_rule_table_is_the_cpp_rules():
    assert ops.RULES == _core.rules()  # generated from it (test_registry.py checks the rest)


@pytest.fixture(scope="module")
def info_outputs():
    """`python -m fusedopt.info`'s output with the huge-pages setting unset, "1" and "0"."""
    from fusedopt import info
    env = {k: v for k, v in os.environ.items() if k != info.HUGE_PAGES_SETTING}
    return {value: subprocess.run(
                [sys.executable, "-m", "fusedopt.info"], capture_output=True, text=True,
                check=True, env=env if value is None else {**env, info.HUGE_PAGES_SETTING: value}
            ).stdout for value in (None, "1", "0")}


@pytest.mark.slow
def test_info_command_lists_every_op_with_cpu_kernels(info_outputs):
    out = info_outputs[None]
    names = re.findall(r"^\s+(FusedOpt>\w+)\s+(.*)$", out, re.M)
    # Every rule's four ops, its group and packed-group ops, and the member pack op.
    assert len(names) == 6 * len(_core.rules()) + 1 >= 37
    assert all("CPU" in devices for _, devices in names)
    assert re.search(r"^cpu_kernels\s+True$", out, re.M)
    assert re.search(r"^running_tensorflow\s+\d+\.\d+", out, re.M)


@pytest.mark.slow
def test_info_reports_whether_tables_get_huge_pages(info_outputs):
    from fusedopt import info
    for value, expected in [(None, "on"), ("1", "on"), ("0", "off")]:
        out = info_outputs[value]
        line = re.search(r"^huge_pages_for_tables\s+(\w+)", out, re.M).group(1)
        if expected == "on" and not info.huge_pages_available():
            expected = "unavailable"
        assert line == expected, out


def interesting_float32():
    """Rounding edge cases of both 16-bit formats, plus a dense random sweep."""
    rng = np.random.default_rng(0)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 65536,
                         6.1035156e-05, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 1e-40,
                         3.3895314e38, 3.4028235e38, 1.0009766, 1.0004883, 1.0014648],
                        np.float32)
    bits = rng.integers(0, 2**32, 400_000, dtype=np.uint64).astype(np.uint32)
    random = bits.view(np.float32)
    # Exact halfway points between neighbouring halves/bfloat16s (ties to even).
    halves = np.arange(0, 0x7c00, 7, dtype=np.uint16).view(np.float16).astype(np.float32)
    ties = (halves * np.float32(1 + 2**-11)).astype(np.float32)
    return np.concatenate([specials, -specials, random, ties, -ties])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_rounding_matches_numpy_and_ml_dtypes(dtype):
    x = interesting_float32()
    np_type = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    with np.errstate(over="ignore", invalid="ignore"):
        expected = x.astype(np_type)
    got = _core.round_float32(np.ascontiguousarray(x), dtype).view(np_type)
    nan = np.isnan(expected.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert np.array_equal(got[~nan].view(np.uint16), expected[~nan].view(np.uint16))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_widening_is_exact(dtype):
    bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    np_type = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    expected = bits.view(np_type).astype(np.float32)
    got = _core.widen_to_float32(bits, dtype)
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))


@pytest.mark.slow
def test_library_built_for_another_tensorflow_raises_clear_import_error(load_failures):
    import tensorflow as tf

    _, message = load_failures["foreign"]
    assert "built for TensorFlow 2.9.3" in message and f"TensorFlow {tf.__version__}" in message
    assert _loader.REBUILD_COMMAND in message


@pytest.mark.slow
def test_missing_library_raises_import_error_with_build_command(load_failures):
    _, message = load_failures["missing"]
    assert "missing" in message and _loader.REBUILD_COMMAND in message, message


# Small sizes (seconds): --quick is sized to show the speed-up, which these tests do not time.
DEMO_SIZES = ["--rows", "10000", "--batch", "256", "--steps", "30"]


@pytest.mark.parametrize("api,names", [
    ("keras", ("fusedopt.keras LazyAdam", "keras Adam")),
    ("ops", ("fusedopt LazyAdam", "tf.keras Adam")),
])
@pytest.mark.slow
def test_demo_trains_and_reports_both_optimizers(api, names):
    result = subprocess.run([sys.executable, "-m", "fusedopt.demo", "--api", api] + DEMO_SIZES,
                            capture_output=True, text=True, check=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    pattern = r"^(%s)\s+([\d.]+\s+[\d.]+\s+[\d.]+)$" % "|".join(map(re.escape, names))
    rows = dict(re.findall(pattern, result.stdout, re.M))
    assert set(rows) == set(names), result.stdout
    for name, numbers in rows.items():
        first, final, step_ms = map(float, numbers.split())
        assert abs(first - math.log(2)) < 0.01, (name, first)
        assert final < first - 0.005, (name, first, final)  # the loss falls
        assert step_ms > 0


def test_demo_estimator_variant_trains_on_two_towers():
    import tensorflow as tf

    if not hasattr(tf.compat.v1, "estimator") or not hasattr(tf.compat.v1.estimator, "Estimator"):
        pytest.skip(f"tf.compat.v1.estimator is absent in TensorFlow {tf.__version__} "
                    "(removed in 2.16); CI runs this in the TF 2.15 environment")
    result = subprocess.run([sys.executable, "-m", "fusedopt.demo", "--estimator", "2"]
                            + DEMO_SIZES,
                            capture_output=True, text=True, check=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    rows = dict(re.findall(r"^(fusedopt v1 LazyAdam|tf.compat.v1 Adam)\s+([\d.]+\s+[\d.]+\s+[\d.]+)$",
                           result.stdout, re.M))
    assert set(rows) == {"fusedopt v1 LazyAdam", "tf.compat.v1 Adam"}, result.stdout
    for name, numbers in rows.items():
        first, final, _ = map(float, numbers.split())
        assert abs(first - math.log(2)) < 0.01 and final < first - 0.005, (name, first, final)


# --- damaged libraries: ImportError, never a crash (issue 16) -------------------------------

def test_build_info_records_every_library():
    # Size and sha256 of each native library, as built, for the loader's check.
    package = os.path.dirname(_loader.library_path())
    libraries = _loader.build_info().get("libraries")
    assert isinstance(libraries, dict), _loader.build_info()
    core = os.path.basename(_core.__file__)
    assert {"_fusedopt_ops.so", core} <= set(libraries)
    for name, record in libraries.items():
        assert record == _loader.library_record(os.path.join(package, name)), name


def _damage(path, kind):
    size = os.path.getsize(path)
    if kind == "truncated":  # an interrupted copy: mapped anyway, SIGBUS on first touch
        os.truncate(path, size // 2)
    elif kind == "empty":
        os.truncate(path, 0)
    elif kind == "garbage":
        with open(path, "wb") as f:
            f.write(np.random.default_rng(0).bytes(4096))
    elif kind == "directory":
        os.remove(path)
        os.mkdir(path)
    elif kind == "one_byte_changed":  # structurally fine: only the recorded hash can tell
        with open(path, "r+b") as f:
            f.seek(size // 3)
            byte = f.read(1)
            f.seek(size // 3)
            f.write(bytes([byte[0] ^ 0xFF]))


DAMAGE = {"truncated": "is truncated", "empty": "is empty", "garbage": "is not a shared library",
          "directory": "is not a regular file", "one_byte_changed": "sha256 mismatch"}


def _package_copy(tmp_path):
    """A copy of the installed fusedopt package (Python files, libraries, build info)."""
    source = os.path.dirname(os.path.abspath(fusedopt.__file__))
    target = tmp_path / "pkg" / "fusedopt"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _run_in(package_dir, args):
    env = dict(os.environ, PYTHONPATH=str(package_dir.parent), TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("FUSEDOPT_OPS_LIBRARY", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=str(package_dir.parent.parent), timeout=300)


def _describe(proc):
    return "%s\n%s%s" % (harness.describe_exit(proc), proc.stdout[-2000:], proc.stderr[-2000:])


@pytest.fixture(scope="module")
def load_failures(tmp_path_factory):
    """kind -> the ImportError's message, for every op library the loader must refuse: each
    kind of damage, one missing, one built for another TensorFlow. One subprocess tries them
    all in turn through fusedopt._loader, which ops.load_library calls (importing fusedopt.ops
    would load the package's own library first); the loader re-reads the path each time, and
    each try fails before dlopen. The old behaviour for a truncated file was SIGBUS."""
    tmp_path = tmp_path_factory.mktemp("load_failures")
    package = _package_copy(tmp_path)
    libraries = {}
    for kind in DAMAGE:
        path = tmp_path / kind / "_fusedopt_ops.so"
        path.parent.mkdir()
        shutil.copy(package / "_fusedopt_ops.so", path)
        shutil.copy(package / "_build_info.json", path.parent / "_build_info.json")
        _damage(str(path), kind)
        libraries[kind] = str(path)
    libraries["missing"] = str(tmp_path / "missing" / "_fusedopt_ops.so")
    foreign = tmp_path / "foreign" / "_fusedopt_ops.so"
    foreign.parent.mkdir()
    shutil.copy(package / "_fusedopt_ops.so", foreign)
    (foreign.parent / "_build_info.json").write_text(json.dumps({"tensorflow_version": "2.9.3"}))
    libraries["foreign"] = str(foreign)
    code = ("import json, os, sys\n"
            "from fusedopt import _loader\n"
            "for kind, path in json.loads(sys.argv[1]).items():\n"
            "    print('START', kind, flush=True)\n"
            "    os.environ['FUSEDOPT_OPS_LIBRARY'] = path\n"
            "    try:\n"
            "        _loader.load_library()\n"
            "    except ImportError as e:\n"
            "        print('IMPORTERROR', kind, ' '.join(str(e).split()), flush=True)\n"
            "    else:\n"
            "        print('LOADED', kind, flush=True)\n")
    proc = _run_in(package, ["-c", code, json.dumps(libraries)])
    assert proc.returncode == 0, _describe(proc)
    failures = dict(line.split(" ", 2)[1:] for line in proc.stdout.splitlines()
                    if line.startswith("IMPORTERROR"))
    assert set(failures) == set(libraries), _describe(proc)
    return {kind: (libraries[kind], message) for kind, message in failures.items()}


@pytest.mark.slow
def test_damaged_op_library_is_an_import_error(load_failures):
    for kind, problem in DAMAGE.items():
        path, message = load_failures[kind]
        assert path in message and problem in message, message
        assert _loader.REBUILD_COMMAND in message, message


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_core_module_is_an_import_error(tmp_path, kind):
    package = _package_copy(tmp_path)
    core = package / os.path.basename(_core.__file__)
    _damage(str(core), kind)
    proc = _run_in(package, ["-c", "import fusedopt._core"])
    assert proc.returncode == 1, _describe(proc)
    assert "ImportError" in proc.stderr and str(core) in proc.stderr, _describe(proc)
    assert DAMAGE[kind] in proc.stderr and _loader.REBUILD_COMMAND in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("library", ["op library", "_core"])
def test_info_command_reports_a_damaged_library(tmp_path, library):
    package = _package_copy(tmp_path)
    name = "_fusedopt_ops.so" if library == "op library" else os.path.basename(_core.__file__)
    _damage(str(package / name), "truncated")
    proc = _run_in(package, ["-m", "fusedopt.info"])
    assert proc.returncode == 1, _describe(proc)
    key = "op_library" if library == "op library" else "core_module"
    line = re.search(r"^%s\s+(.*)$" % key, proc.stdout, re.M)
    assert line and line.group(1).startswith("NOT LOADABLE:"), _describe(proc)
    assert str(package / name) in line.group(1) and "is truncated" in line.group(1)
    assert "Traceback" not in proc.stderr, _describe(proc)


@pytest.mark.once  # the sources alone: no TensorFlow, no build
@pytest.mark.parametrize("archs", ["sm90", "sm_90 cuda_80"])
def test_a_wrong_cuda_target_is_named_before_anything_builds(archs):
    """FUSEDOPT_CUDA_ARCHS narrows the CUDA targets; a value that is not one stops setup.py
    at once, naming it and the release targets."""
    env = dict(os.environ, FUSEDOPT_CUDA_ARCHS=archs)
    proc = subprocess.run([sys.executable, "setup.py", "--name"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, _describe(proc)
    bad = archs.split()[-1]
    assert f"FUSEDOPT_CUDA_ARCHS: {bad} is not a CUDA target" in proc.stderr, _describe(proc)
    assert "sm_80 sm_90 compute_90" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.once  # the sources alone: no TensorFlow, no build
def test_nvcc_settings_are_written_once():
    """setup.py, BUILD and tools/gpu_check.sh read cc/core/gpu/nvcc_flags.txt: no other
    file spells an nvcc flag or an architecture list."""
    one_place = os.path.join("cc", "core", "gpu", "nvcc_flags.txt")
    for path in ("setup.py", "BUILD", os.path.join("tools", "gpu_check.sh")):
        with open(os.path.join(ROOT, path)) as f:
            text = f.read()
        assert "nvcc_flags.txt" in text, path
        assert "--fmad=false" not in text.replace("# --fmad", ""), path
        assert "sm_80" not in text and "compute_90" not in text, path
    with open(os.path.join(ROOT, one_place)) as f:
        assert "--fmad=false" in f.read()
