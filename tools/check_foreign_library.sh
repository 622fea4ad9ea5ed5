#!/usr/bin/env bash
# Usage: tools/check_foreign_library.sh PY_A LIB_B
#
# Checks that PY_A's TensorFlow refuses fusedopt's op library LIB_B, built for another
# TensorFlow, with the ImportError of python/fusedopt/_loader.py, along both paths:
#   1. pre-check: LIB_B with its _build_info.json beside it -> refused before dlopen; the
#      message names both TensorFlow versions and the rebuild command;
#   2. dlopen: LIB_B copied alone into a temp dir (no build info) -> TF's loader fails
#      (undefined symbol) and fusedopt turns that into an ImportError naming the running
#      version, "unknown version" for the library, and the loader's own words.
# Neither may crash the interpreter. Uses fusedopt's Python sources from this checkout
# (with the _core module of LIB's build).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${1:?"usage: tools/check_foreign_library.sh PY_A LIB_B"}
LIB=${2:?"usage: tools/check_foreign_library.sh PY_A LIB_B"}
LIB=$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")
[[ -f $LIB ]] || { echo "no such library: $LIB" >&2; exit 2; }
[[ -f $(dirname "$LIB")/_build_info.json ]] || {
  echo "$LIB has no _build_info.json beside it" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$LIB" "$tmp/_fusedopt_ops.so"
# fusedopt's Python sources from this checkout, plus the TF-free _core of LIB's build (the
# rule registry comes from it; it loads in any TensorFlow of the same Python).
mkdir -p "$tmp/src"
cp -r "$root/python/fusedopt" "$tmp/src/"
cp "$(dirname "$LIB")"/_core.*so "$tmp/src/fusedopt/"

check() {  # check MODE LIBRARY_PATH
  FUSEDOPT_OPS_LIBRARY=$2 PYTHONPATH="$tmp/src" TF_CPP_MIN_LOG_LEVEL=3 \
    "$PY" - "$1" "$2" <<'EOF'
import json, os, sys
mode, path = sys.argv[1], sys.argv[2]
import tensorflow as tf
from fusedopt import _loader
info_b = _loader.build_info(os.environ["LIB_INFO"])
built = info_b["tensorflow_version"]
running = tf.__version__
if _loader._major_minor(built) == _loader._major_minor(running):
    sys.exit(f"LIB_B was built for TF {built}, the same as PY_A's {running}: nothing to check")
try:
    import fusedopt.ops
    fusedopt.ops.load_library()
except ImportError as e:
    msg = str(e)
else:
    sys.exit(f"[{mode}] FAIL: TF {running} loaded a library built for TF {built}")
want = [f"TensorFlow {running} is running", "pip install --no-build-isolation", path]
if mode == "precheck":
    want += [f"built for TensorFlow {built}"]
    assert "loader said" not in msg, "pre-check should refuse before dlopen:\n" + msg
else:
    want += ["unknown version", "loader said", "undefined symbol"]
missing = [w for w in want if w not in msg]
if missing:
    sys.exit(f"[{mode}] FAIL: message lacks {missing}:\n{msg}")
print(f"[{mode}] ok: TF {running} refuses a TF {built} library:\n  " + msg.replace("\n", "\n  "))
EOF
}
export LIB_INFO=$LIB
check precheck "$LIB"
check dlopen "$tmp/_fusedopt_ops.so"
echo "check_foreign_library: ok ($PY, $LIB)"
