#!/usr/bin/env bash
# Usage: tools/bazel_test.sh [PYTHON] [extra bazel test flags...]
# Builds and runs //:op_tests (pytest on the Bazel-built package) for PYTHON's TensorFlow.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bazel_common.sh"

exec "$BAZEL" test //... --repo_env=PYTHON_BIN_PATH="$PY" "${ARGS[@]}"
