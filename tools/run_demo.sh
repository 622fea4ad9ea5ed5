#!/usr/bin/env bash
# The README's first command: set up a TF 2.21 environment with only what the demo needs
# (two Debian header packages, TensorFlow and the build tools; no Bazel, no test or
# benchmark packages), build fusedopt into it with pip (warnings are not errors
# here), and run the end-to-end training demo. Extra arguments go to the demo (e.g. --quick).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
tools/install_system_deps.sh --pip-build   # the headers TF's XLA headers include (no Bazel)
py=$(tools/setup_env.sh 2.21 --demo)
FUSEDOPT_WERROR=0 tools/build_pip.sh "$py"
cd /tmp && TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} "$py" -m fusedopt.demo "$@"
