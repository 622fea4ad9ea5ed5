#!/usr/bin/env bash
# The README's first command: set up a TF 2.21 environment with only what the demo needs
# (two Debian header packages, TensorFlow and the build tools; no Bazel, no test or
# benchmark packages), build fusedopt into it with pip (warnings are not errors
# here), and run the end-to-end training demo. Extra arguments go to the demo (e.g. --quick).
# Each stage says what it does and about how long it takes (the steps before the demo
# print nothing of their own while they work).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
stage() { echo "run_demo: [$1/4] $2" >&2; }
stage 1 "Checking for the two header packages the build needs (installs them with apt-get if missing)"
tools/install_system_deps.sh --pip-build   # the headers TF's XLA headers include (no Bazel)
stage 2 "Setting up a Python environment with TensorFlow 2.21 (the first time: downloads about 300 MB, a few minutes; later: seconds)"
py=$(tools/setup_env.sh 2.21 --demo)
stage 3 "Building fusedopt's C++ ops into it (several minutes on 2 cores; nothing is printed meanwhile)"
FUSEDOPT_WERROR=0 tools/build_pip.sh "$py"
stage 4 "Running the demo: python -m fusedopt.demo $*"
cd /tmp && "$py" -m fusedopt.demo "$@"
