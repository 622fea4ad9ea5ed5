#!/usr/bin/env bash
# Usage: tools/setup_env.sh {2.21|2.15} [VENV_DIR]
# Creates (or reuses) a virtual environment with the pinned TensorFlow and the test tools,
# and prints its python. Default VENV_DIR: .venv-tf221 / .venv-tf215 in the repo root.
set -euo pipefail
version=${1:?"usage: tools/setup_env.sh 2.21|2.15 [VENV_DIR]"}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${2:-$root/.venv-tf${version/./}}
base=${FUSEDOPT_BASE_PYTHON:-python3.11}
command -v "$base" >/dev/null || base=python3

common=(pybind11==3.1.0 pytest==9.2.0 hypothesis==6.170.17 wheel==0.48.0)
case $version in
  # setuptools >= 77: what torch (benchmark peer) requires, and PEP 639 license metadata.
  2.21) packages=(tensorflow-cpu==2.21.0 setuptools==84.2.1 "${common[@]}") ;;
  # tensorflow-addons 0.23 (the last release, TF 2.13-2.15): its LazyAdam is a benchmark peer.
  2.15) packages=(tensorflow-cpu==2.15.1 tensorflow-estimator==2.15.0 tensorflow-addons==0.23.0
                  "typeguard<3" "${common[@]}") ;;
  *) echo "unsupported TensorFlow version $version (2.21 or 2.15)" >&2; exit 2 ;;
esac

[[ -x $venv/bin/python ]] || "$base" -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}" >&2
if [[ $version == 2.21 ]]; then
  # torch (CPU build, from the machine's local wheel) and matplotlib: benchmark peers and the
  # plot. A separate call: resolved together with the pins above, pip reports a conflict.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 matplotlib==3.11.2 >&2
  # tf_keras without --no-deps would pull in the full `tensorflow` wheel next to tensorflow-cpu.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps tf-keras==2.21.0 >&2
fi
echo "$venv/bin/python"
