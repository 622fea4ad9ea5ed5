#!/usr/bin/env bash
# Usage: tools/setup_fbgemm_env.sh [VENV_DIR]
# Creates (or reuses) the venv of FBGEMM's CPU build, the outside oracle of row-wise Adagrad
# and a peer of `python -m fusedopt.bench --scenarios sparse_fbgemm` (issues 32, 33), and
# prints its python: export FUSEDOPT_FBGEMM_PYTHON=$(tools/setup_fbgemm_env.sh).
# Default VENV_DIR: .venv-fbgemm in the repo root.
#
# A venv of its own: TensorFlow 2.21 and this torch crash when imported into one process,
# so FBGEMM always runs as a child process (python/fusedopt/bench/fbgemm_worker.py).
# fbgemm-gpu-cpu 1.9.0 declares no torch requirement, but its libraries are built against
# torch 2.14 (its own compatibility table, fbgemm_gpu/__init__.py) and do not load into
# 2.13 (undefined symbols). PyPI's torch 2.14.1 for Linux is the CUDA build (+ the NVIDIA
# runtime wheels, ~5.5 GB installed); the CPU-only builds are on PyTorch's own index, which
# the package registries here do not include. It runs on the CPU all the same.
# Fresh: about 70 s on 2 cores (the wheels are local); an existing venv: about 1 s.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${1:-$root/.venv-fbgemm}
base=${FUSEDOPT_BASE_PYTHON:-python3.11}
command -v "$base" >/dev/null || base=python3

packages=(fbgemm-gpu-cpu==1.9.0 torch==2.14.1 numpy==2.4.6)
wanted="fbgemm-gpu-cpu==1.9.0 torch==2.14.1 numpy==2.4.6"
installed() {  # the pinned distributions' versions in the venv, as "name==version ..."
  "$venv/bin/python" - <<'EOF' 2>/dev/null || true
from importlib.metadata import version
print(" ".join(f"{name}=={version(name)}" for name in ("fbgemm-gpu-cpu", "torch", "numpy")))
EOF
}

[[ -x $venv/bin/python ]] || "$base" -m venv "$venv" >&2
if [[ $(installed) != "$wanted" ]]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${packages[@]}" >&2
  # The pair must load together (a torch that does not match fails here, not in a test).
  "$venv/bin/python" -c "import fbgemm_gpu.split_table_batched_embeddings_ops_training" >&2
fi
echo "$venv/bin/python"
