#!/usr/bin/env bash
# Usage: tools/build_pip.sh PYTHON
# Builds and installs fusedopt into PYTHON's environment the pip way (g++ + tf.sysconfig,
# no Bazel), against the TensorFlow installed there. Warnings stay warnings (a newer
# compiler must not break a user's build); CI sets FUSEDOPT_WERROR=1 itself.
set -euo pipefail
py=${1:?usage: tools/build_pip.sh PYTHON}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
"$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --force-reinstall .
