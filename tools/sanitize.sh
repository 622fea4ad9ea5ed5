#!/usr/bin/env bash
# Usage: tools/sanitize.sh [PYTHON] [pytest args...]
#
# Builds the TF op library and the pybind11 module with AddressSanitizer +
# UndefinedBehaviorSanitizer (g++, setup.py's flags plus the sanitizer flags) into
# build/asan/fusedopt, then runs the op and core tests against that build with the ASan
# runtime preloaded into PYTHON (which is not instrumented itself).
#   - ASan: halt_on_error=1 (any report fails the run); detect_leaks=0, since LeakSanitizer
#     reports TensorFlow's and CPython's intentional process-lifetime allocations.
#   - UBSan: -fno-sanitize-recover=all, so any undefined behaviour in our code aborts.
# Default tests: tests/ops/test_ops.py tests/ops/test_errors.py tests/core/test_core.py tests/ops/test_fuzz.py
# (pass pytest args to run others). SANITIZE_OPT (default -O0: half -O1's compile time on
# these template-heavy files, and nothing optimised away from the checks) sets the level;
# FUSEDOPT_JOBS (default 2) caps parallel compiles.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
PY=${1:-python3}
shift || true
tests=("$@")
[[ ${#tests[@]} -gt 0 ]] || tests=(tests/ops/test_ops.py tests/ops/test_errors.py tests/core/test_core.py tests/ops/test_fuzz.py)
CXX=${CXX:-g++}
out=$root/build/asan
pkg=$out/fusedopt
obj=$out/obj
mkdir -p "$obj"
jobs=${FUSEDOPT_JOBS:-2}
# -g1: line tables only (ASan and UBSan reports name function, file and line); full -g
# debug info made the build ~40% slower (52 -> 37 s a kernel file).
san=(-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g1)
# g++ 12 rejects TF 2.21's absl headers with -fsanitize=null (+nonnull checks): "function
# pointer == nullptr ... is not a constant expression" in hash_policy_traits.h. Those three
# checks are dropped for the TF op library only (ASan still traps null dereferences there).
tf_san=(-fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute)
opt=(${SANITIZE_OPT:--O0} -fno-math-errno)
t0=$SECONDS

# TF flags (-I -> -isystem, as setup.py), pybind11 includes, source lists, extension suffix.
mapfile -t info < <("$PY" - <<'EOF'
import sysconfig, tensorflow as tf, pybind11
ns = {}
exec(open("cc/sources.bzl").read(), ns)
cflags = [f.replace("-I", "-isystem", 1) if f.startswith("-I") else f for f in tf.sysconfig.get_compile_flags()]
print(tf.__version__)
print(" ".join(cflags))
print(" ".join(tf.sysconfig.get_link_flags()))
print(" ".join(ns["TF_SRCS"]))
print(" ".join(ns["PYBIND_SRCS"]))
print("-isystem " + pybind11.get_include() + " -isystem " + sysconfig.get_paths()["include"])
print(sysconfig.get_config_var("EXT_SUFFIX"))
EOF
)
tf_version=${info[0]}
read -r -a tf_cflags <<<"${info[1]}"
read -r -a tf_lflags <<<"${info[2]}"
read -r -a tf_srcs <<<"${info[3]}"
read -r -a py_srcs <<<"${info[4]}"
read -r -a py_incs <<<"${info[5]}"
ext_suffix=${info[6]}
echo "sanitize: TF $tf_version, $CXX ${san[*]} ${opt[*]}, $jobs jobs" >&2

# Rebuild only what changed (objects newer than every source and header under cc/).
newest_cc=$(find cc -type f -printf '%T@\n' | sort -n | tail -1)
compile() {  # compile SRC OBJ FLAGS...
  local src=$1 o=$2
  shift 2
  if [[ -f $o ]] && awk -v a="$(stat -c %Y "$o")" -v b="$newest_cc" 'BEGIN{exit !(a>b)}'; then
    return 0
  fi
  echo "  $CXX -c $src" >&2
  "$CXX" "$@" -c "$src" -o "$o"
}
pids=()
wait_slot() {
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n; done
}
for src in "${tf_srcs[@]}"; do
  wait_slot
  compile "$src" "$obj/$(basename "$src").o" -std=c++17 -fPIC "${opt[@]}" "${san[@]}" \
    "${tf_san[@]}" -Wall -Wextra -I "$root" "${tf_cflags[@]}" &
  pids+=($!)
done
for src in "${py_srcs[@]}"; do
  wait_slot
  compile "$src" "$obj/$(basename "$src").o" -std=c++20 -fPIC -fvisibility=hidden \
    "${opt[@]}" "${san[@]}" -Wall -Wextra -I "$root" "${py_incs[@]}" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

# The package: Python sources from python/fusedopt, the sanitized libraries, build info.
rm -rf "$pkg"
mkdir -p "$pkg"
(cd python/fusedopt && find . -name '*.py' -exec cp --parents {} "$pkg/" \;)
tf_objs=()
for src in "${tf_srcs[@]}"; do tf_objs+=("$obj/$(basename "$src").o"); done
"$CXX" -shared "${san[@]}" "${tf_objs[@]}" -o "$pkg/_fusedopt_ops.so" "${tf_lflags[@]}"
py_objs=()
for src in "${py_srcs[@]}"; do py_objs+=("$obj/$(basename "$src").o"); done
"$CXX" -shared "${san[@]}" "${py_objs[@]}" -o "$pkg/_core$ext_suffix"
# Build info as the other builds write it, with each library's size and sha256.
PYTHONPATH="$root/python" "$PY" - "$pkg" "$tf_version" "$("$CXX" --version | head -1)" <<'EOF'
import glob, json, os, sys
from fusedopt._loader import library_record
pkg, tf_version, compiler = sys.argv[1:]
info = {"tensorflow_version": tf_version, "build_system": "sanitize.sh", "compiler": compiler,
        "cuda": False, "sanitizers": "address,undefined",
        "libraries": {os.path.basename(p): library_record(p)
                      for p in sorted(glob.glob(os.path.join(pkg, "*.so")))}}
with open(os.path.join(pkg, "_build_info.json"), "w") as f:
    json.dump(info, f, indent=1)
EOF
echo "sanitize: built in $((SECONDS - t0)) s -> $pkg" >&2

# Run the tests with the runtimes preloaded (ASan must come first in the process).
preload="$("$CXX" -print-file-name=libasan.so) $("$CXX" -print-file-name=libubsan.so)"
export LD_PRELOAD="$preload"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:detect_odr_violation=0:alloc_dealloc_mismatch=0:allocator_may_return_null=1:print_summary=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export PYTHONPATH="$out${PYTHONPATH:+:$PYTHONPATH}"
export FUSEDOPT_OPS_LIBRARY="$pkg/_fusedopt_ops.so"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
# Check that the sanitized build is what gets imported.
"$PY" -c "import fusedopt, fusedopt._core as c; import sys; assert c.__file__.startswith('$pkg'), c.__file__; print('sanitize: using', c.__file__)"
t1=$SECONDS
"$PY" -m pytest -q -p no:cacheprovider "${tests[@]}"
echo "sanitize: tests clean in $((SECONDS - t1)) s (total $((SECONDS - t0)) s)" >&2
