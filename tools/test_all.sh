#!/usr/bin/env bash
# The whole test suite on a fresh machine (this is what .ci/run calls):
#   1. TF 2.21 (Keras 3, tf_keras): built with pip (setup.py), full pytest suite.
#   2. TF 2.15 (+ Estimator): built with Bazel, full pytest suite against that build,
#      then `bazel test //...`.
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
section "TF 2.21: pip build"
tools/build_pip.sh "$py221"
section "TF 2.21: tests"
(cd tests && "$py221" -m fusedopt.info)
"$py221" -m pytest -q -p no:cacheprovider tests

section "TF 2.15: environment"
py215=$(tools/setup_env.sh 2.15)
section "TF 2.15: Bazel build"
pkg=$(tools/bazel_build.sh "$py215" | tail -n 1)
section "TF 2.15: tests against the Bazel build"
(cd tests && PYTHONPATH="$(dirname "$pkg")" "$py215" -m fusedopt.info)
PYTHONPATH="$(dirname "$pkg")" "$py215" -m pytest -q -p no:cacheprovider tests
section "TF 2.15: bazel test //..."
tools/bazel_test.sh "$py215"

section "all passed"
