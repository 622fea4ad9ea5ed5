"""The build's own promises: one source list, versions that agree, the info command,
the 16-bit conversions, the version-mismatch ImportError and the demo."""
import glob
import json
import math
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import fusedopt
from fusedopt import _core, _loader, ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_sources():
    namespace = {}
    with open(os.path.join(ROOT, "cc", "sources.bzl")) as f:
        exec(f.read(), namespace)
    return namespace


SOURCE_LISTS = ("CORE_HDRS", "GPU_HDRS", "GPU_CUDA_HDRS", "GPU_SRCS", "TF_HDRS", "TF_SRCS",
                "PYBIND_HDRS", "PYBIND_SRCS", "PYBIND_CUDA_SRCS")


def test_every_cc_file_is_in_the_one_source_list():
    lists = read_sources()
    listed = [p for key in SOURCE_LISTS for p in lists[key]]
    on_disk = sorted(os.path.relpath(p, ROOT) for ext in ("h", "cc", "cuh")
                     for p in glob.glob(os.path.join(ROOT, "cc", "**", f"*.{ext}"), recursive=True))
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)


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
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    assert fusedopt.__version__ == version
    info = _loader.build_info()
    if info.get("build_system") == "setuptools":
        assert info["fusedopt_version"] == version


def test_build_info_names_the_running_tensorflow():
    import tensorflow as tf

    info = _loader.build_info()
    assert info["tensorflow_version"] == tf.__version__
    assert info["build_system"] in ("setuptools", "bazel")


def test_python_rule_table_matches_the_cpp_rules():
    assert _core.rules() == ops.RULES


def test_info_command_lists_all_twelve_ops_with_cpu_kernels():
    out = subprocess.run([sys.executable, "-m", "fusedopt.info"], capture_output=True,
                         text=True, check=True).stdout
    names = re.findall(r"^\s+(FusedOpt>\w+)\s+(.*)$", out, re.M)
    assert len(names) == 12
    assert all("CPU" in devices for _, devices in names)
    assert re.search(r"^cpu_kernels\s+True$", out, re.M)
    assert re.search(r"^running_tensorflow\s+\d+\.\d+", out, re.M)


def test_info_reports_whether_tables_get_huge_pages():
    from fusedopt import info
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    for extra, expected in [({}, "off"), ({"GLIBC_TUNABLES": info.HUGE_PAGES_TUNABLE}, "on")]:
        out = subprocess.run([sys.executable, "-m", "fusedopt.info"], capture_output=True,
                             text=True, check=True, env={**env, **extra}).stdout
        line = re.search(r"^huge_pages_for_tables\s+(\w+)", out, re.M).group(1)
        assert line == (expected if info.huge_pages_available() else "unavailable")


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


def run_python(code, env_extra):
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def test_library_built_for_another_tensorflow_raises_clear_import_error(tmp_path):
    import tensorflow as tf

    foreign = tmp_path / "_fusedopt_ops.so"
    foreign.write_bytes(open(_loader.library_path(), "rb").read())
    (tmp_path / "_build_info.json").write_text(json.dumps({"tensorflow_version": "2.9.3"}))
    result = run_python("from fusedopt import ops; ops.load_library()",
                        {"FUSEDOPT_OPS_LIBRARY": str(foreign)})
    assert result.returncode != 0
    message = result.stderr
    assert "ImportError" in message
    assert "built for TensorFlow 2.9.3" in message and f"TensorFlow {tf.__version__}" in message
    assert _loader.REBUILD_COMMAND in message


def test_missing_library_raises_import_error_with_build_command(tmp_path):
    result = run_python("from fusedopt import ops; ops.load_library()",
                        {"FUSEDOPT_OPS_LIBRARY": str(tmp_path / "_fusedopt_ops.so")})
    assert result.returncode != 0
    assert "ImportError" in result.stderr and "missing" in result.stderr
    assert _loader.REBUILD_COMMAND in result.stderr


@pytest.mark.parametrize("api,names", [
    ("keras", ("fusedopt.keras LazyAdam", "keras Adam")),
    ("ops", ("fusedopt LazyAdam", "tf.keras Adam")),
])
def test_demo_trains_and_reports_both_optimizers(api, names):
    result = subprocess.run([sys.executable, "-m", "fusedopt.demo", "--quick", "--api", api],
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
    result = subprocess.run([sys.executable, "-m", "fusedopt.demo", "--quick", "--estimator", "2"],
                            capture_output=True, text=True, check=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    rows = dict(re.findall(r"^(fusedopt v1 LazyAdam|tf.compat.v1 Adam)\s+([\d.]+\s+[\d.]+\s+[\d.]+)$",
                           result.stdout, re.M))
    assert set(rows) == {"fusedopt v1 LazyAdam", "tf.compat.v1 Adam"}, result.stdout
    for name, numbers in rows.items():
        first, final, _ = map(float, numbers.split())
        assert abs(first - math.log(2)) < 0.01 and final < first - 0.005, (name, first, final)
