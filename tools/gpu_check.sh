#!/usr/bin/env bash
# Usage: tools/gpu_check.sh [PYTHON]
# The GPU harness, TensorFlow-free: builds fusedopt._core_cuda (nvcc + pybind11) and the CPU
# fusedopt._core (g++) from this tree into a fresh build dir, then, where a CUDA device and
# CuPy are available, runs tests/gpu (GPU vs CPU engine, every rule/dtype/index type,
# duplicates, out-of-range, determinism), the same tests under compute-sanitizer memcheck and
# racecheck, and tools/gpu_bench.py (GB/s vs a device copy).
# Without a GPU it still builds everything, then prints "no GPU: skipped" and exits 0
# (CI runs it that way). Results go to $OUT when set. Needs: nvcc, g++, PYTHON with
# pybind11 and numpy (+ pytest, cupy, ml_dtypes to test). Device code is built for the
# local GPU's architecture only (sm_90 without one) to keep the build short; the pip and
# Bazel CUDA builds compile sm_80, sm_90 and compute_90.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${1:-${PYTHON:-python3}}
out=${OUT:-}
[[ -n $out ]] && mkdir -p "$out"
say() { printf '[gpu_check %s] %s\n' "$(date +%T)" "$*"; }
log() { if [[ -n $out ]]; then tee -a "$out/gpu_check.log"; else cat; fi; }

{
nvcc=${FUSEDOPT_NVCC:-$(command -v nvcc || true)}
if [[ -z $nvcc ]]; then
  say "no nvcc: nothing built; no GPU: skipped"
  exit 0
fi
# The toolkit nvcc itself reports (nvcc may be a wrapper script).
cuda_root=${CUDA_HOME:-$("$nvcc" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)}
cuda_root=$(cd "$cuda_root" && pwd -P)
if [[ -n ${FUSEDOPT_GPU_BUILD:-} ]]; then
  build=$FUSEDOPT_GPU_BUILD
  mkdir -p "$build"
else
  build=$(mktemp -d /tmp/fusedopt-gpu.XXXXXX)
  trap 'rm -rf "$build"' EXIT
fi
arch=sm_90
if command -v nvidia-smi >/dev/null && cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1) && [[ $cap =~ ^[0-9]+\.[0-9]+$ ]]; then
  arch=sm_${cap/./}
fi
say "nvcc: $("$nvcc" --version | grep release) | arch $arch | python: $("$py" --version 2>&1) | build: $build"
ext=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
pyinc=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
pybind=$("$py" -c "import pybind11; print(pybind11.get_include())")
start=$SECONDS

# Device code: the two GPU_SRCS in parallel, flags as setup.py's (--fmad=false: GPU == CPU).
nvcc_flags=(-DGOOGLE_CUDA=1 -x cu --expt-relaxed-constexpr -std=c++17 -O3 --fmad=false
            -arch="$arch" -Xcompiler -fPIC -Xcompiler -fvisibility=hidden -I "$root")
pids=()
for src in cc/core/gpu/engine_gpu.cu.cc cc/core/gpu/coalesce_gpu.cu.cc; do
  "$nvcc" "${nvcc_flags[@]}" -c "$src" -o "$build/$(basename "$src").o" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
host_flags=(-std=c++20 -O3 -fno-math-errno -fPIC -fvisibility=hidden -shared -Wall -Wextra
            -I "$root" -isystem "$pybind" -isystem "$pyinc")
g++ "${host_flags[@]}" -isystem "$cuda_root/include" cc/pybind/core_cuda_module.cc \
  "$build"/*.cu.cc.o "$cuda_root/lib64/libcudart_static.a" -ldl -lrt -lpthread \
  -Wl,--exclude-libs,libcudart_static.a -o "$build/_core_cuda$ext" & pids=($!)
g++ "${host_flags[@]}" cc/pybind/core_module.cc -o "$build/_core$ext" & pids+=($!)
for pid in "${pids[@]}"; do wait "$pid"; done
say "built _core_cuda and _core in $((SECONDS - start)) s"
if readelf -d "$build/_core_cuda$ext" | grep -q 'libcudart\.so'; then
  say "FAIL: _core_cuda depends on libcudart.so"
  exit 1
fi

devices=$(cd "$build" && "$py" -c "import _core_cuda; print(_core_cuda.device_count())")
if [[ $devices == 0 ]] || ! "$py" -c "import cupy" 2>/dev/null; then
  say "no GPU: skipped (built OK; CUDA devices: $devices; GPU tests need a device and CuPy)"
  exit 0
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export FUSEDOPT_GPU_BUILD=$build PYTHONDONTWRITEBYTECODE=1
junit=(); [[ -n $out ]] && junit=(--junitxml "$out/gpu_tests.xml")
"$py" -m pytest -q -p no:cacheprovider -o addopts= "${junit[@]}" tests/gpu
say "tests passed"
"$py" tools/gpu_bench.py ${out:+--out "$out"}
# Last, so the figures above are in $OUT even if time runs out: compute-sanitizer (memcheck: out-of-bounds/misaligned accesses; racecheck: shared-memory
# hazards) over the GPU tests, unless GPU_CHECK_SANITIZE=0. Each tool re-runs the suite.
if [[ ${GPU_CHECK_SANITIZE:-1} == 1 ]] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 3 --target-processes all \
      "$py" -m pytest -q -p no:cacheprovider -o addopts= -x tests/gpu
    say "compute-sanitizer $tool: clean"
  done
else
  say "compute-sanitizer: skipped (not on PATH or GPU_CHECK_SANITIZE=0)"
fi
say "done in $((SECONDS - start)) s"
} 2>&1 | log
exit "${PIPESTATUS[0]}"
