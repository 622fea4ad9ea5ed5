#!/usr/bin/env bash
# Run by `bazel test //:op_tests` (cwd = runfiles root of this workspace).
#   $1: file holding the interpreter path the extensions were built for (@local_config_tf)
#   $2: fusedopt/_build_info.json of the Bazel-assembled package
set -euo pipefail

python=$(cat "$1")
pkg_root=$(cd "$(dirname "$2")/.." && pwd)

# Tests must import the Bazel-built package, not python/ from the source tree.
export PYTHONPATH="$pkg_root"
export PYTHONDONTWRITEBYTECODE=1
# Keep Keras/TF caches (~/.keras) out of the real home directory.
export HOME="${TEST_TMPDIR:-/tmp}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

# Smoke check first: an undefined symbol or ABI mismatch shows up here as one clear error.
"$python" -c "
import tensorflow as tf
tf.load_op_library('$pkg_root/fusedopt/_fusedopt_ops.so')
import fusedopt._core
print('loaded _fusedopt_ops.so and _core with TF', tf.__version__)"

# CI's TF 2.15 stage has just run the whole suite against this same Bazel-built package
# (tools/test_all.sh); here: that `bazel test` itself works, on the op registry (every op
# and kernel of the library) and the core engine (fusedopt._core).
tests=()
for t in tests/ops/test_registry.py tests/core/test_core.py; do
    [[ -f $t ]] && tests+=("$t")
done
if [[ ${#tests[@]} -eq 0 ]]; then
    echo "no test files yet: only the smoke check ran" >&2
    exit 0
fi

# -p no:cacheprovider: runfiles are not a place for .pytest_cache.
exec "$python" -m pytest -q -p no:cacheprovider "${tests[@]}"
