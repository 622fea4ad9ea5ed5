#!/usr/bin/env bash
# Usage: tools/build_wheel.sh PYTHON [OUT_DIR]
#
# Builds fusedopt's wheel for PYTHON's TensorFlow the way a release is built: the sdist
# first, then the wheel from that sdist (so a file the sdist lacks fails the build here),
# both into OUT_DIR (default dist/). Prints the wheel's path as the last line.
#
# The wheel's version carries the TensorFlow minor it was built for, and its metadata pins
# that minor of the distribution PYTHON has (setup.py, wheel_version_and_pin):
#   tensorflow-cpu 2.21.x -> fusedopt-0.2.0+tf2.21.cpu, Requires-Dist tensorflow-cpu>=2.21.0,<2.22
#   tensorflow 2.21.x     -> fusedopt-0.2.0+tf2.21,     Requires-Dist tensorflow>=2.21.0,<2.22
# FUSEDOPT_TF_DIST=tensorflow|tensorflow-cpu pins the other one (the library is the same).
# The platform tag is linux_x86_64, not manylinux: the op library links the TensorFlow it was
# built against, which the pin installs.
# Needs in PYTHON's environment: TensorFlow, setuptools >= 77, pybind11, g++. setup.py's
# settings pass through (FUSEDOPT_XLA, FUSEDOPT_CUDA, FUSEDOPT_WERROR, FUSEDOPT_JOBS).
set -euo pipefail
py=${1:?"usage: tools/build_wheel.sh PYTHON [OUT_DIR]"}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$(realpath -m "${2:-$root/dist}")
cd "$root"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The sdist, via setuptools' PEP 517 backend (no `build` package needed); its log to stderr.
sdist=$("$py" - "$out" <<'EOF'
import contextlib, sys
from setuptools import build_meta
with contextlib.redirect_stdout(sys.stderr):
    name = build_meta.build_sdist(sys.argv[1])
print(name)
EOF
)
echo "build_wheel: sdist $out/$sdist" >&2
tar -xzf "$out/$sdist" -C "$tmp"
# Built from the unpacked sdist, not the checkout; not isolated (it compiles against this TF).
FUSEDOPT_WHEEL_FOR_TF=1 "$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation \
  --no-deps -w "$tmp/wheel" "$tmp/${sdist%.tar.gz}" >&2
wheel=$(ls "$tmp"/wheel/fusedopt-*.whl)
mv "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
