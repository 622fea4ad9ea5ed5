#!/usr/bin/env bash
# Usage: tools/bazel_build.sh [PYTHON] [extra bazel build flags...]
# Builds everything with Bazel for PYTHON's TensorFlow and copies the assembled package to
# build/bazel-pkg/fusedopt, so that `PYTHONPATH=build/bazel-pkg PYTHON -c "import fusedopt"` works.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/bazel_common.sh"

"$BAZEL" build //... --repo_env=PYTHON_BIN_PATH="$PY" "${ARGS[@]}"

# bazel-bin's files are read-only links into Bazel's cache: copy real, writable files.
dest=build/bazel-pkg/fusedopt
rm -rf "$dest"
mkdir -p "$dest"
cp -rL bazel-bin/fusedopt_pkg/fusedopt/. "$dest/"
chmod -R u+w "$dest"
find "$dest" -type f ! -name '*.so' -exec chmod a-x {} +
echo "$ROOT/$dest"
