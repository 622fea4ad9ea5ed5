"""The CUDA build (FUSEDOPT_CUDA=1 pip install) on a machine without a GPU: it links cudart
statically, needs no GPU-only TensorFlow symbol, loads in CPU-only TensorFlow with its GPU
kernels registered but inert, and its CPU kernels work.

Which build: $FUSEDOPT_CUDA_PKG, a directory holding a CUDA-built `fusedopt` package (CI
builds one with `FUSEDOPT_CUDA=1 pip install --target DIR`), or `build` to build one here
into a temporary directory (needs nvcc; a few minutes). Unset: skipped.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTING = os.environ.get("FUSEDOPT_CUDA_PKG", "")

pytestmark = pytest.mark.skipif(
    not SETTING or (SETTING == "build" and shutil.which("nvcc") is None),
    reason="no CUDA build to test (FUSEDOPT_CUDA_PKG=DIR of a CUDA build, or =build with nvcc)")


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    """Directory with the CUDA-built fusedopt package in it."""
    if SETTING != "build":
        assert os.path.isfile(os.path.join(SETTING, "fusedopt", "_fusedopt_ops.so")), SETTING
        return SETTING
    target = str(tmp_path_factory.mktemp("cuda_pkg"))
    env = dict(os.environ, FUSEDOPT_CUDA="1", FUSEDOPT_WERROR="1")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-build-isolation", "--no-deps", "--target", target, ROOT],
                   check=True, env=env)
    return target


def libraries(pkg):
    d = os.path.join(pkg, "fusedopt")
    return [os.path.join(d, f) for f in sorted(os.listdir(d))
            if f.endswith(".so") and (f.startswith("_fusedopt_ops") or f.startswith("_core_cuda"))]


def run_in(pkg, code):
    env = dict(os.environ, PYTHONPATH=pkg, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env.pop("FUSEDOPT_OPS_LIBRARY", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                            cwd=os.path.join(ROOT, "tests"))
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_build_info_records_cuda(pkg):
    with open(os.path.join(pkg, "fusedopt", "_build_info.json")) as f:
        info = json.load(f)
    assert info["cuda"] is True
    # The release targets (cc/core/gpu/nvcc_flags.txt), or those FUSEDOPT_CUDA_ARCHS named
    # (CI builds for sm_90 only: tools/test_all.sh).
    narrowed = os.environ.get("FUSEDOPT_CUDA_ARCHS", "").replace(",", " ").split()
    assert info["cuda_archs"] == (narrowed or ["sm_80", "sm_90", "compute_90"])
    assert "release" in info["nvcc"]


def test_both_libraries_exist_and_link_cudart_statically(pkg):
    libs = libraries(pkg)
    assert [os.path.basename(p).split(".")[0] for p in libs] == ["_core_cuda", "_fusedopt_ops"]
    for lib in libs:
        dynamic = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True,
                                 check=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dynamic)
        assert needed, dynamic
        assert not [n for n in needed if "cuda" in n], (lib, needed)


def test_no_gpu_only_tensorflow_symbols_and_no_cudart_exports(pkg):
    ops = os.path.join(pkg, "fusedopt", "_fusedopt_ops.so")
    undefined = subprocess.run(f"nm -D --undefined-only {ops} | c++filt", shell=True,
                               capture_output=True, text=True, check=True).stdout
    # TF's GPU functors (DenseUpdate<GpuDevice>, ...) exist only in TF's CUDA builds.
    bad = [line for line in undefined.splitlines()
           if re.search(r"GpuDevice|DenseUpdate|functor::|\bcuda|__cuda", line)]
    assert not bad, bad
    for lib in libraries(pkg):
        defined = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True,
                                 text=True, check=True).stdout
        exported = [line for line in defined.splitlines() if re.search(r"\s_*cuda", line)]
        assert not exported, (lib, exported[:5])  # cudart stays private (--exclude-libs)


def test_loads_in_cpu_only_tensorflow_with_inert_gpu_kernels(pkg):
    out = run_in(pkg, """
import json
import numpy as np
import tensorflow as tf
from fusedopt import info, ops, _loader
assert _loader.build_info()["cuda"] is True
assert not tf.config.list_physical_devices("GPU")
d = info.describe()
assert d["cuda_kernels"] and d["cpu_kernels"], d
assert all(devs == ["CPU", "GPU"] for devs in d["ops"].values()), d["ops"]
var = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
acc = tf.Variable(np.full((4, 3), 0.5, np.float32))
ops.resource_sparse_apply_adagrad(var, acc, lr=0.1, epsilon=0.0, grad=tf.ones([3, 3]),
                                  indices=tf.constant([2, 0, 2]))
ops.resource_apply_adagrad(var, acc, lr=0.1, epsilon=0.0, grad=tf.ones([4, 3]))
try:
    ops.resource_sparse_apply_adagrad(var, acc, lr=0.1, epsilon=0.0, grad=tf.ones([1, 3]),
                                      indices=tf.constant([4]))
    raise SystemExit("no error")
except tf.errors.InvalidArgumentError as e:
    assert "indices[0] = 4 is not in [0, 4)" in str(e)
print(json.dumps({"var": var.numpy().tolist(), "acc": acc.numpy().tolist()}))
""")
    got = json.loads(out.strip().splitlines()[-1])
    import numpy as np

    var = np.arange(12, dtype=np.float32).reshape(4, 3)
    acc = np.full((4, 3), 0.5, np.float32)
    g = np.zeros((4, 3), np.float32)
    g[2], g[0] = 2, 1  # duplicates summed first
    for rows, grad in ((np.array([0, 2]), g[[0, 2]]), (np.arange(4), np.ones((4, 3), np.float32))):
        acc[rows] += grad * grad
        var[rows] -= np.float32(0.1) * grad / np.sqrt(acc[rows])
    np.testing.assert_allclose(got["acc"], acc, rtol=1e-6)
    np.testing.assert_allclose(got["var"], var, rtol=1e-6)


def test_cuda_core_module_imports_without_a_gpu(pkg):
    out = run_in(pkg, """
from fusedopt import _core, _core_cuda
assert _core_cuda.rules() == _core.rules()
print(_core_cuda.device_count())
arr = {"data": (0, False), "shape": (4,), "typestr": "<f4"}
try:
    _core_cuda.apply_dense("adagrad", arr, [arr], arr, {"lr": 0.1, "epsilon": 0.0})
except ValueError as e:
    print("ValueError", e)
""")
    lines = out.strip().splitlines()
    assert lines[0] == "0"  # no GPU on this machine (CUDA_VISIBLE_DEVICES="")
    assert lines[1].startswith("ValueError var is not CUDA memory")


def test_cuda_core_module_refuses_arrays_not_aligned_to_their_elements(pkg):
    # Checked before any CUDA call (a misaligned load would be a sticky CUDA error).
    out = run_in(pkg, """
from fusedopt import _core_cuda
arr = lambda ptr, typestr="<f4": {"data": (ptr, False), "shape": (4,), "typestr": typestr}
calls = [
    lambda: _core_cuda.apply_dense("adagrad", arr(4098), [arr(8192)], arr(12288), {}),
    lambda: _core_cuda.apply_dense("adagrad", arr(4096), [arr(8193)], arr(12288), {}),
    lambda: _core_cuda.apply_dense("adagrad", arr(4096), [arr(8192)], arr(12290), {}),
    lambda: _core_cuda.apply_sparse("adagrad", arr(4096), [arr(8192)], arr(12288),
                                    arr(16388, "<i8"), {}),
]
for call in calls:
    try:
        call()
    except ValueError as e:
        print(e)
""")
    assert out.strip().splitlines() == [
        "var is not aligned to its 4-byte elements", "slot is not aligned to its 4-byte elements",
        "grad is not aligned to its 4-byte elements",
        "indices is not aligned to its 8-byte elements"]


def test_cuda_core_module_checks_compact_slots_without_a_gpu(pkg):
    # Slot dtypes (compact slots) and the group's overlap check are settled before any CUDA
    # call: a call that passes them stops at "not CUDA memory" on this machine.
    out = run_in(pkg, """
from fusedopt import _core_cuda
arr = lambda ptr, typestr="<f4", n=4: {"data": (ptr, False), "shape": (n,), "typestr": typestr}
ada = {"lr": 0.1, "epsilon": 0.1}
adam = {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "epsilon": 0.1, "beta1_power": 0.9,
        "beta2_power": 0.99}
calls = [
    lambda: _core_cuda.apply_dense("adagrad", arr(4096), [arr(8192, "<u2")], arr(12288), ada),
    lambda: _core_cuda.apply_dense("adagrad", arr(4096), [arr(8192, "<u2")], arr(12288), ada,
                                   slot_dtype="bfloat16", stochastic_rounding=True,
                                   rounding_seed=1),
    lambda: _core_cuda.apply_dense("adagrad", arr(4096), [arr(8192, "<f2")], arr(12288), ada),
    lambda: _core_cuda.apply_sparse("adagrad", arr(4096, "<f8"), [arr(8192, "<f2")],
                                    arr(12288, "<f8"), arr(16384, "<i8"), ada),
    lambda: _core_cuda.apply_dense("lazy_adam", arr(4096), [arr(8192, "<f2"), arr(8704)],
                                   arr(12288), adam),
    lambda: _core_cuda.apply_dense_group(
        "adagrad", [arr(4096), arr(4352)], [[arr(8192, "<f2"), arr(8448)]],
        [arr(12288), arr(12544)], ada),
    # A 2-byte slot of 64 values right before its gradient: no overlap; 2 bytes further, one.
    lambda: _core_cuda.apply_dense_group("adagrad", [arr(4096, n=64)], [[arr(8192, "<f2", 64)]],
                                         [arr(8320, n=64)], ada),
    lambda: _core_cuda.apply_dense_group("adagrad", [arr(4096, n=64)], [[arr(8194, "<f2", 64)]],
                                         [arr(8320, n=64)], ada),
]
for call in calls:
    try:
        call()
    except ValueError as e:
        print(e)
try:
    _core_cuda.apply_dense("adagrad", arr(4096), [arr(8192, "<f2")], arr(12288), ada,
                           stochastic_rounding=1)
except TypeError as e:
    print(e)
""")
    lines = out.strip().splitlines()
    assert len(lines) == 9, lines
    for accepted in (1, 2, 6):  # past every check: the pointer is not device memory
        assert lines[accepted].startswith("var is not CUDA memory"), lines[accepted]
    assert [line for i, line in enumerate(lines) if i not in (1, 2, 6)] == [
        "accum has dtype typestr <u2 but var is float32 (slots may be float32, bfloat16 or "
        "float16)",
        "accum has dtype float16 but var is float64 (bfloat16/float16 slots are for float32 "
        "variables)",
        "v has dtype float32 but m has float16: an update's slots are stored in one dtype",
        "variable 1 of 2: slot dtype float32 differs from variable 0's float16 (one group, one "
        "slot dtype)",
        "accum[0] and grad[0] overlap in memory; every var and slot needs its own array",
        "stochastic_rounding must be a bool, got int"]
