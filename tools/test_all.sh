#!/usr/bin/env bash
# The whole test suite on a fresh machine (this is what .ci/run calls):
#   1. TF 2.21 (Keras 3, tf_keras): the release wheel built (tools/build_wheel.sh: sdist,
#      then the wheel from it), installed into the TF 2.21 venv and, with
#      tools/check_wheel.sh, into a clean venv (its op tests); full pytest suite; the CUDA
#      variant built too (nvcc, no GPU needed) and the CPU op tests run against it; the
#      GPU harness builds and reports "no GPU: skipped"; an ASan+UBSan build of the op
#      library and pybind11 module runs the op tests. Without nvcc the CUDA steps are
#      skipped with one line saying so.
#      FBGEMM's CPU build gets a venv of its own (tools/setup_fbgemm_env.sh), exported as
#      FUSEDOPT_FBGEMM_PYTHON: the row-wise Adagrad oracle, the bench's peer. It and the
#      TF 2.15 venv are set up in the background while the TF 2.21 builds compile.
#   2. TF 2.15 (+ Estimator): built with Bazel, full pytest suite against that build less
#      the tests marked `once` (TF-version-independent: they ran in stage 1), then
#      `bazel test //...`. Both suites (and the op tests of the CUDA and sanitizer builds)
#      run on two pytest-xdist workers.
#   3. Each TensorFlow refuses the other's op library with a clear ImportError.
# Tests marked `large` (rows past 2^31 elements, ~9 GB) are opt-in:
#   FUSEDOPT_LARGE_TESTS=1 python -m pytest -m large tests
# Exits non-zero as soon as anything fails.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
export PYTHONDONTWRITEBYTECODE=1
section() { printf '\n=== %s (%s) ===\n' "$1" "$(date +%T)"; }

section "system packages"
tools/install_system_deps.sh

section "TF 2.21: environment"
py221=$(tools/setup_env.sh 2.21)
# Two more environments are set up in the background while the TF 2.21 builds compile (pip
# installs: mostly download and unpacking, ~1 min each fresh, ~1 s when they exist); each
# one's log is shown when it is waited for, and a failure stops the run there.
#  - FBGEMM's CPU build in a venv of its own (its torch and TF crash in one process): the
#    row-wise Adagrad oracle (tests/core/test_fbgemm_oracle.py) and the benchmark's peer;
#    the tests that need it fail without it. Waited for before the TF 2.21 tests.
#  - TF 2.15 (+ Estimator): waited for before its Bazel build.
bg=$(mktemp -d)
declare -A bg_pid=()
# On the way out (a failure elsewhere included): nothing left running in the background.
trap 'for p in "${bg_pid[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$bg"' EXIT
background() {  # background NAME CMD...: runs CMD, its stdout to $bg/NAME.out, stderr to .log
  local name=$1
  shift
  "$@" >"$bg/$name.out" 2>"$bg/$name.log" &
  bg_pid[$name]=$!
}
finish() {  # finish NAME TITLE: waits for NAME and shows its log; sets $finished to the last
  local name=$1 rc=0  # line of its stdout; its failure stops the run
  section "$2 (started in the background)"
  wait "${bg_pid[$name]}" || rc=$?
  unset "bg_pid[$name]"
  cat "$bg/$name.log" >&2
  if ((rc != 0)); then
    echo "$2 failed (exit $rc)" >&2
    exit "$rc"
  fi
  finished=$(tail -n 1 "$bg/$name.out")
}
section "FBGEMM CPU and TF 2.15 environments: started in the background"
background fbgemm tools/setup_fbgemm_env.sh
background env215 tools/setup_env.sh 2.15
section "TF 2.21: release wheel (sdist, then the wheel from it; installed into the venv)"
wheel=$(FUSEDOPT_WERROR=1 tools/build_wheel.sh "$py221" "$root/build/dist" | tail -n 1)
# Any fusedopt in the venv (a dev install, an earlier run's wheel) would shadow the wheel.
"$py221" -m pip uninstall -q -y fusedopt $("$py221" -m pip list --format=freeze 2>/dev/null |
  sed -n 's/^\(fusedopt[-_]tf[^=]*\)==.*/\1/p') 2>/dev/null || true
section "TF 2.21: the wheel in a clean venv (tools/check_wheel.sh)"
# Before the wheel goes into the TF 2.21 venv: the clean venv sees that venv's packages.
tools/check_wheel.sh "$py221" "$wheel"
# With its requirements but --no-index: the TensorFlow pin must be met by the venv's own.
# (Not --force-reinstall: that would reinstall TensorFlow too.)
"$py221" -m pip install -q --disable-pip-version-check --no-index "$wheel"
# The CUDA steps need nvcc (no GPU): without it, one line and on.
nvcc=${FUSEDOPT_NVCC:-$(command -v nvcc || true)}
cuda_pkg=$root/build/cuda-pkg
rm -rf "$cuda_pkg"
if [[ -n $nvcc ]]; then
  section "TF 2.21: CUDA build (nvcc; no GPU needed: compile + link only)"
  # FUSEDOPT_XLA=0: the XLA kernels do not depend on the CUDA build (the wheel above has
  # them), and leaving them out here saves CI their slowest compile. FUSEDOPT_CUDA_ARCHS:
  # device code for Hopper only (the GPU machines' sm_90), not the release's three targets:
  # the same sources through the same compiler, a third of the device compiles.
  # (Exported: tests/builds/test_cuda_build.py checks the build records what was built.)
  export FUSEDOPT_CUDA_ARCHS=sm_90
  FUSEDOPT_CUDA=1 FUSEDOPT_XLA=0 FUSEDOPT_WERROR=1 "$py221" -m pip install -q \
    --disable-pip-version-check --no-build-isolation --no-deps --target "$cuda_pkg" .
else
  section "CUDA steps SKIPPED: no nvcc on PATH (FUSEDOPT_NVCC unset): no CUDA build, its op tests or GPU harness build; install the CUDA 13 toolkit to run them"
fi
finish fbgemm "FBGEMM CPU: environment (tools/setup_fbgemm_env.sh)"
FUSEDOPT_FBGEMM_PYTHON=$finished
export FUSEDOPT_FBGEMM_PYTHON
section "TF 2.21: tests"
(cd tests && "$py221" -m fusedopt.info)
# Both full suites: -n 2 --dist loadfile (pytest-xdist, tools/setup_env.sh), two worker
# processes, each test file in one of them (its module fixtures made once, its tests in
# order). Most of the suite is one core's Python between short TF calls: on CI's 2 cores
# two workers nearly halve it.
xdist=(-n 2 --dist loadfile)
FUSEDOPT_CUDA_PKG="${nvcc:+$cuda_pkg}" \
  "$py221" -m pytest -q -p no:cacheprovider "${xdist[@]}" -m "not large" tests
section "TF 2.21: tests/gpu on the CPU STAND-IN, not a GPU run (proves the test logic and the harness, not the kernels)"
FUSEDOPT_GPU_STANDIN=1 "$py221" -m pytest -q -p no:cacheprovider tests/gpu
if [[ -n $nvcc ]]; then
  section "TF 2.21: CPU op tests against the CUDA build (CPU-only TF: GPU kernels inert)"
  (cd tests && PYTHONPATH="$cuda_pkg" "$py221" -m fusedopt.info)
  PYTHONPATH="$cuda_pkg" "$py221" -m pytest -q -p no:cacheprovider "${xdist[@]}" \
    tests/ops/test_ops.py tests/ops/test_errors.py
  section "GPU harness (tools/gpu_check.sh: builds, skips without a GPU)"
  tools/gpu_check.sh "$py221"
fi
section "TF 2.21: ASan + UBSan build, op tests"
tools/sanitize.sh "$py221" "${xdist[@]}" tests/ops/test_ops.py tests/ops/test_errors.py tests/core/test_core.py

finish env215 "TF 2.15: environment"
py215=$finished
section "TF 2.15: Bazel build"
pkg=$(tools/bazel_build.sh "$py215" | tail -n 1)
section "TF 2.15: tests against the Bazel build"
(cd tests && PYTHONPATH="$(dirname "$pkg")" "$py215" -m fusedopt.info)
# FUSEDOPT_REPEAT_STAGE=1: the tests marked `once` (TF-version-independent: benchmark
# harness, FBGEMM, TF-free builds such as gpu_check.sh's, install checks) ran in the TF 2.21
# stage and are deselected here.
PYTHONPATH="$(dirname "$pkg")" \
  FUSEDOPT_REPEAT_STAGE=1 "$py215" -m pytest -q -p no:cacheprovider "${xdist[@]}" -m "not large" tests
section "TF 2.15: bazel test //..."
tools/bazel_test.sh "$py215"

section "wrong-version library: each TensorFlow refuses the other's build"
lib221=$("$py221" -c "from fusedopt import _loader; print(_loader.library_path())")
tools/check_foreign_library.sh "$py215" "$lib221"
tools/check_foreign_library.sh "$py221" "$pkg/_fusedopt_ops.so"

section "all passed"
