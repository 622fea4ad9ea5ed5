# Sourced by tools/bazel_build.sh and tools/bazel_test.sh.
# Sets $PY: arg 1 if it is not a flag, else $PYTHON, else the active venv's python, else python3.
# The path stays absolute but unresolved: a venv's bin/python symlink is what selects the venv.
PY=${PYTHON:-${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}}
if [[ $# -gt 0 && $1 != -* ]]; then PY=$1; shift; fi
ARGS=("$@")
PY=${PY:-python3}
if [[ $PY != */* ]]; then
    PY=$(command -v "$PY") || { echo "error: $PY not found" >&2; exit 1; }
elif [[ $PY != /* ]]; then
    PY=$PWD/$PY
fi
[[ -x $PY ]] || { echo "error: $PY is not executable" >&2; exit 1; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
