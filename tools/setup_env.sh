#!/usr/bin/env bash
# Usage: tools/setup_env.sh {2.21|2.15} [VENV_DIR] [--demo]
# Creates (or reuses) a virtual environment with the pinned TensorFlow and prints its python.
# Default VENV_DIR: .venv-tf221 / .venv-tf215 in the repo root.
#   default: what the test suite and the benchmark need (test tools; on 2.21 tf_keras, the
#            benchmark peers torch and matplotlib, and the documentation tools of
#            docs/requirements.txt; on 2.15 tensorflow-estimator and tensorflow-addons);
#   --demo:  only what building fusedopt and running `python -m fusedopt.demo` need
#            (TensorFlow, setuptools, pybind11): tools/run_demo.sh.
set -euo pipefail
demo=0
args=()
for a in "$@"; do
  if [[ $a == --demo ]]; then demo=1; else args+=("$a"); fi
done
version=${args[0]:-}
[[ -n $version ]] || { echo "usage: tools/setup_env.sh 2.21|2.15 [VENV_DIR] [--demo]" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${args[1]:-$root/.venv-tf${version/./}}
base=${FUSEDOPT_BASE_PYTHON:-python3.11}
command -v "$base" >/dev/null || base=python3

# setuptools >= 77: PEP 639 license metadata (pyproject.toml); torch (benchmark peer) too.
build=(setuptools==84.2.1 pybind11==3.1.0)
# pytest-xdist: tools/test_all.sh runs each full suite on two workers (-n 2).
testing=(pytest==9.2.0 pytest-xdist==3.8.0 execnet==2.1.2 hypothesis==6.170.17 wheel==0.48.0)
case $version in
  2.21) tf=(tensorflow-cpu==2.21.0) ;;
  2.15) tf=(tensorflow-cpu==2.15.1 tensorflow-estimator==2.15.0) ;;
  *) echo "unsupported TensorFlow version $version (2.21 or 2.15)" >&2; exit 2 ;;
esac
packages=("${tf[@]}" "${build[@]}")
if ((!demo)); then
  packages+=("${testing[@]}")
  # tensorflow-addons 0.23 (the last release, TF 2.13-2.15): its LazyAdam is a benchmark peer
  # and the migration tests' reference (docs/MIGRATING.md).
  [[ $version == 2.15 ]] && packages+=(tensorflow-addons==0.23.0 "typeguard<3")
fi

[[ -x $venv/bin/python ]] || "$base" -m venv "$venv" >&2
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}" >&2
if [[ $version == 2.21 ]] && ((!demo)); then
  # torch (CPU build, from the machine's local wheel) and matplotlib: benchmark peers and the
  # plot. A separate call: resolved together with the pins above, pip reports a conflict.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 matplotlib==3.11.2 >&2
  # tf_keras without --no-deps would pull in the full `tensorflow` wheel next to tensorflow-cpu.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps tf-keras==2.21.0 >&2
  # The documentation site's tools (mkdocs.yml; tests/docs/test_docs_site.py builds it here).
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/docs/requirements.txt" >&2
fi
echo "$venv/bin/python"
