#!/usr/bin/env bash
# Usage: tools/gpu_check.sh [PYTHON]
# The GPU harness, TensorFlow-free: builds fusedopt._core_cuda (nvcc + pybind11) and the CPU
# fusedopt._core (g++) from this tree, then, on a GPU, runs in order: tests/gpu (GPU vs CPU
# engine, every rule/dtype/index type, duplicates, out-of-range, determinism, streams),
# tools/gpu_bench.py (GB/s vs a device copy), and tests/gpu under compute-sanitizer memcheck,
# then racecheck (--racecheck-detect-level error). Each stage is timed; a summary closes
# the log. Results (gpu_check.log, gpu_tests.xml, gpu_bench.*) go to $OUT when set.
#
# A GPU is expected when `nvidia-smi -L` lists one (override: FUSEDOPT_EXPECT_GPU=1|0).
# Then it never passes falsely: a missing nvcc, a failing `import cupy`, CUDA failing to
# initialise (the CUDA error is printed), no test collected, or no test run (all skipped)
# each FAIL with a line naming the cause. Without an expected GPU it builds (if nvcc is
# there), prints "no GPU: skipped" and exits 0 (CI runs it that way); where CuPy and a
# device work anyway, it runs everything.
#
# Time: the whole run stays within GPU_CHECK_BUDGET_S (default 480 s, under 8 minutes on one
# H200). The benchmark and each sanitizer stage are skipped, with a line saying so, when
# their estimate would overrun what is left: memcheck ~ tests time x
# GPU_CHECK_SANITIZER_SLOWDOWN (an integer, default 50, the slow end of memcheck's usual 10-50x),
# racecheck ~ the larger of that and memcheck's measured time. A stage still running at the
# budget is stopped and counts as a failure (incomplete).
#
# Other settings: FUSEDOPT_NVCC (nvcc to use), FUSEDOPT_GPU_BUILD=DIR (build there and keep
# it; else a temporary dir), GPU_CHECK_REUSE_BUILD=1 (with FUSEDOPT_GPU_BUILD: skip the
# compile when both modules are already in DIR), GPU_CHECK_TESTS (pytest paths, default
# tests/gpu), GPU_CHECK_BENCH=0, GPU_CHECK_SANITIZE=0 (skip those stages).
# Needs: nvcc, g++, PYTHON with pybind11 and numpy (+ pytest, cupy, ml_dtypes to test).
# Device code is built for the local GPU's architecture only (sm_90 without one) to keep the
# build short; the pip and Bazel CUDA builds compile the targets in cc/core/gpu/nvcc_flags.txt.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${1:-${PYTHON:-python3}}
out=${OUT:-}
[[ -n $out ]] && mkdir -p "$out"
# This script is the real GPU check: never the CPU stand-in of tests/gpu/standin.
unset FUSEDOPT_GPU_STANDIN
budget_s=${GPU_CHECK_BUDGET_S:-480}
# Sanitizer run time over the plain test run: measured on an H200 (2026-11-30) memcheck 2.8x,
# racecheck 8x; 12x leaves room.
slowdown=${GPU_CHECK_SANITIZER_SLOWDOWN:-12}
read -ra test_paths <<<"${GPU_CHECK_TESTS:-tests/gpu}"
say() { printf '[gpu_check %s] %s\n' "$(date +%T)" "$*"; }
log() { if [[ -n $out ]]; then tee -a "$out/gpu_check.log"; else cat; fi; }

{
now_ms() { local us=${EPOCHREALTIME//[.,]/}; echo $((us / 1000)); }
seconds() { printf '%d.%d' $(($1 / 1000)) $(($1 % 1000 / 100)); }  # ms -> "12.3"
start_ms=$(now_ms)
left_ms() { echo $((budget_s * 1000 - ($(now_ms) - start_ms))); }
declare -A took_ms=()
summary=()
failed=0
# record STAGE RESULT [MS]: one line of the closing summary.
record() {
  local shown=-
  [[ -n ${3:-} ]] && shown="$(seconds "$3") s"
  summary+=("$(printf '  %-10s %9s  %s' "$1" "$shown" "$2")")
}
fail() { say "FAIL: $*"; exit 1; }
build=""
temp_build=""
on_exit() {
  local rc=$?
  if ((${#summary[@]})); then
    say "summary (budget ${budget_s} s; $(seconds $(($(now_ms) - start_ms))) s in all; exit $rc):"
    printf '%s\n' "${summary[@]}"
  fi
  [[ -n $temp_build ]] && rm -rf "$temp_build"
  return 0
}
trap on_exit EXIT
# run_timed STAGE CMD...: runs CMD within what is left of the budget; sets stage_rc and
# took_ms[STAGE] (rc 124: stopped at the budget).
run_timed() {
  local stage=$1 t0 left
  shift
  left=$(left_ms)
  t0=$(now_ms)
  if ((left < 1000)); then  # (also: `timeout 0.0` would mean no limit at all)
    stage_rc=124
  else
    stage_rc=0
    timeout --kill-after=10 "$(seconds "$left")" "$@" || stage_rc=$?
  fi
  took_ms[$stage]=$(($(now_ms) - t0))
}

# Is a GPU expected here?
expect_gpu=${FUSEDOPT_EXPECT_GPU:-}
listed=""
if command -v nvidia-smi >/dev/null; then
  listed=$(nvidia-smi -L 2>/dev/null | grep -E '^GPU [0-9]+:' || true)
fi
case $expect_gpu in
  "") if [[ -n $listed ]]; then
        expect_gpu=1 why="nvidia-smi lists ${listed%%$'\n'*}"
      else
        expect_gpu=0 why="nvidia-smi lists no GPU"
      fi ;;
  0 | 1) why="FUSEDOPT_EXPECT_GPU=$expect_gpu" ;;
  *) fail "FUSEDOPT_EXPECT_GPU must be 0 or 1, got '$expect_gpu'" ;;
esac
say "GPU expected: $( ((expect_gpu)) && echo yes || echo no) ($why)"

nvcc=${FUSEDOPT_NVCC:-$(command -v nvcc || true)}
if [[ -z $nvcc || ! -x $nvcc ]]; then
  missing=${nvcc:+"$nvcc is not an executable file"}
  missing=${missing:-"no nvcc on PATH"}
  ((expect_gpu)) && fail "nvcc missing ($missing): a GPU is expected, so this is not a skip" \
    "(install the CUDA 13 toolkit, or set FUSEDOPT_NVCC)"
  say "no nvcc ($missing): nothing built; no GPU: skipped"
  exit 0
fi
if [[ -n ${FUSEDOPT_GPU_BUILD:-} ]]; then
  build=$FUSEDOPT_GPU_BUILD
  mkdir -p "$build"
else
  build=$(mktemp -d /tmp/fusedopt-gpu.XXXXXX)
  temp_build=$build
fi
ext=$("$py" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")

t0=$(now_ms)
if [[ ${GPU_CHECK_REUSE_BUILD:-0} == 1 && -e $build/_core_cuda$ext && -e $build/_core$ext ]]; then
  say "build: reusing _core_cuda and _core in $build (GPU_CHECK_REUSE_BUILD=1)"
  record build "reused $build" "$(($(now_ms) - t0))"
else
  # The toolkit nvcc itself reports (nvcc may be a wrapper script).
  cuda_root=${CUDA_HOME:-$("$nvcc" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)}
  cuda_root=$(cd "$cuda_root" && pwd -P)
  arch=sm_90
  if [[ -n $listed ]] && cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1) && [[ $cap =~ ^[0-9]+\.[0-9]+$ ]]; then
    arch=sm_${cap/./}
  fi
  say "nvcc: $("$nvcc" --version | grep release) | arch $arch | python: $("$py" --version 2>&1) | build: $build"
  pyinc=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  pybind=$("$py" -c "import pybind11; print(pybind11.get_include())")
  # Device code: every GPU_SRCS file (cc/sources.bzl: all of cc/core/gpu/*.cu.cc) in
  # parallel, with every build's flags (one file, see it).
  read -ra nvcc_flags <<<"$(sed -n 's/^flags://p' cc/core/gpu/nvcc_flags.txt)"
  nvcc_flags+=(-arch="$arch" -I "$root")
  pids=()
  for src in cc/core/gpu/*.cu.cc; do
    "$nvcc" "${nvcc_flags[@]}" -c "$src" -o "$build/$(basename "$src").o" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || fail "nvcc failed (see its output above)"; done
  host_flags=(-std=c++20 -O3 -fno-math-errno -fPIC -fvisibility=hidden -shared -Wall -Wextra
              -I "$root" -isystem "$pybind" -isystem "$pyinc")
  g++ "${host_flags[@]}" -isystem "$cuda_root/include" cc/pybind/core_cuda_module.cc \
    "$build"/*.cu.cc.o "$cuda_root/lib64/libcudart_static.a" -ldl -lrt -lpthread \
    -Wl,--exclude-libs,libcudart_static.a -o "$build/_core_cuda$ext" & pids=($!)
  g++ "${host_flags[@]}" cc/pybind/core_module.cc -o "$build/_core$ext" & pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || fail "g++ failed (see its output above)"; done
  took=$(($(now_ms) - t0))
  say "built _core_cuda and _core in $(seconds "$took") s"
  record build "built (arch $arch)" "$took"
  if readelf -d "$build/_core_cuda$ext" | grep -q 'libcudart\.so'; then
    fail "_core_cuda depends on libcudart.so"
  fi
fi

# What the GPU stages need: CuPy, and a CUDA device that initialises.
cupy_error=$(cd "$build" && "$py" -c "import cupy" 2>&1 >/dev/null) && cupy_ok=1 || cupy_ok=0
probe=$(cd "$build" && "$py" -c "import _core_cuda as m; print(m.device_count()); print(m.cuda_init_error())" 2>"$build/probe.err") ||
  fail "cannot import _core_cuda from $build: $(tail -n 1 "$build/probe.err")"
devices=$(sed -n 1p <<<"$probe")
init_error=$(sed -n 2p <<<"$probe")  # "" when CUDA initialised
if ((expect_gpu)); then
  if ((!cupy_ok)); then
    printf '%s\n' "$cupy_error" | sed 's/^/    /'
    fail "'import cupy' failed: ${cupy_error##*$'\n'} (a GPU is expected, so this is not a skip)"
  fi
  if ((devices == 0)); then
    fail "CUDA did not initialise: ${init_error:-"no CUDA error, but no device visible (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset})"}" \
      "(a GPU is expected, so this is not a skip)"
  fi
elif ((!cupy_ok || devices == 0)); then
  record tests "no GPU: skipped"
  say "no GPU: skipped (built OK; CUDA devices: $devices${init_error:+ ($init_error)};" \
      "cupy: $( ((cupy_ok)) && echo importable || echo "${cupy_error##*$'\n'}"))"
  exit 0
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export FUSEDOPT_GPU_BUILD=$build PYTHONDONTWRITEBYTECODE=1
results=${out:-$build}
pytest_args=(-q -p no:cacheprovider -o addopts=)

# Tests: they must collect and run (a suite that skips everything proves nothing). A failing
# test fails the run, at the end.
rm -f "$results/gpu_tests.xml"
run_timed tests "$py" -m pytest "${pytest_args[@]}" -rs --junitxml "$results/gpu_tests.xml" "${test_paths[@]}"
case $stage_rc in
  0 | 1) ;;  # 1: some failed; counted below, and the other stages still run (GPU time is scarce)
  5) record tests "FAIL: no tests collected" "${took_ms[tests]}"
     fail "no tests collected from ${test_paths[*]}" ;;
  124 | 137) record tests "FAIL: stopped at the time budget" "${took_ms[tests]}"
     fail "tests stopped at the time budget (GPU_CHECK_BUDGET_S=$budget_s)" ;;
  *) record tests "FAIL: pytest exit $stage_rc" "${took_ms[tests]}"
     fail "pytest could not run the GPU tests (exit $stage_rc)" ;;
esac
read -r total skipped broken < <("$py" -c "
import sys, xml.etree.ElementTree as ET
suites = list(ET.parse(sys.argv[1]).getroot().iter('testsuite'))
count = lambda key: sum(int(s.get(key, 0)) for s in suites)
print(count('tests'), count('skipped'), count('failures') + count('errors'))" "$results/gpu_tests.xml") ||
  fail "cannot read the test counts from $results/gpu_tests.xml"
ran=$((total - skipped))
if ((ran == 0)); then
  record tests "FAIL: 0 of $total ran" "${took_ms[tests]}"
  fail "0 of $total GPU tests ran (all skipped: see the reasons above)"
fi
if ((stage_rc != 0)); then
  record tests "FAIL: $broken of $ran failed ($skipped skipped)" "${took_ms[tests]}"
  say "FAIL: $broken of $ran GPU tests failed ($skipped skipped); the other stages still run"
  failed=1
else
  record tests "passed: $ran of $total ran, $skipped skipped" "${took_ms[tests]}"
  say "tests passed: $ran of $total ran, $skipped skipped"
fi

# stage_fits STAGE ESTIMATE_MS: whether the stage's estimate fits in what is left; if not,
# records it as skipped with a line saying so.
stage_fits() {
  local left
  left=$(left_ms)
  if (($2 > left)); then
    say "SKIPPED $1: needs ~$(seconds "$2") s (estimate), $(seconds $((left > 0 ? left : 0))) s" \
        "of the ${budget_s} s budget left (GPU_CHECK_BUDGET_S)"
    record "$1" "SKIPPED: needs ~$(seconds "$2") s, $(seconds $((left > 0 ? left : 0))) s left"
    return 1
  fi
}

# Benchmark: ~3 s on an H200; 60 s allowed before it is skipped for time.
if [[ ${GPU_CHECK_BENCH:-1} == 0 ]]; then
  record bench "skipped (GPU_CHECK_BENCH=0)"
elif stage_fits bench 60000; then
  run_timed bench "$py" tools/gpu_bench.py ${out:+--out "$out"}
  if ((stage_rc == 0)); then
    record bench "done" "${took_ms[bench]}"
  else
    record bench "FAIL: exit $stage_rc" "${took_ms[bench]}"
    say "FAIL: benchmark exit $stage_rc"
    failed=1
  fi
fi

# compute-sanitizer over the GPU tests, last so that the figures above are in $OUT even if
# time runs out: memcheck (out-of-bounds/misaligned accesses) first, then racecheck
# (shared-memory hazards, reported at error level). Each re-runs the suite.
if [[ ${GPU_CHECK_SANITIZE:-1} == 0 ]]; then
  record sanitizers "skipped (GPU_CHECK_SANITIZE=0)"
elif ! command -v compute-sanitizer >/dev/null; then
  say "SKIPPED compute-sanitizer memcheck and racecheck: compute-sanitizer is not on PATH"
  record sanitizers "SKIPPED: compute-sanitizer not on PATH"
else
  for tool in memcheck racecheck; do
    estimate=$((took_ms[tests] * slowdown))
    if [[ $tool == racecheck && -n ${took_ms[memcheck]:-} ]] && ((took_ms[memcheck] > estimate)); then
      estimate=${took_ms[memcheck]}
    fi
    stage_fits "$tool" "$estimate" || continue
    tool_args=(--tool "$tool")
    [[ $tool == racecheck ]] && tool_args+=(--racecheck-detect-level error)
    say "compute-sanitizer $tool (estimate ~$(seconds "$estimate") s)"
    # The tests of the stream test itself hold one stream with a spinning kernel and expect
    # other streams to run meanwhile; the tools serialise kernels, so they are left out here
    # (they test the harness, and ran above).
    run_timed "$tool" compute-sanitizer "${tool_args[@]}" --error-exitcode 3 --target-processes all \
      "$py" -m pytest "${pytest_args[@]}" -k "not fails_for_a_backend_that_ignores_the_stream" \
      "${test_paths[@]}"
    case $stage_rc in
      0) result="clean" ;;
      3) result="FAIL: errors found (see above)" ;;
      124 | 137) result="FAIL: incomplete, stopped at the time budget" ;;
      *) result="FAIL: exit $stage_rc (tests failed under the tool, or the tool could not run)" ;;
    esac
    record "$tool" "$result" "${took_ms[$tool]}"
    say "compute-sanitizer $tool: $result"
    [[ $result == clean ]] || failed=1
  done
fi
exit "$failed"
} 2>&1 | log
exit "${PIPESTATUS[0]}"
