#!/usr/bin/env bash
# Usage: tools/test_matrix.sh [TF_MINOR...]        (default: 2.15 2.16 2.17 2.18 2.19 2.20 2.21)
#
# The support matrix: for each TensorFlow minor, one virtual environment (tensorflow-cpu of
# that minor, the Keras it installs, and tf_keras of the same minor), a pip build of fusedopt
# against it, and the op, compat.v1 and Keras tests (Keras 3 or 2.15, and the Keras 2 legacy
# optimizers through tf_keras). Not part of CI (about 10 minutes a version on 2 cores): run it
# when a TensorFlow release appears and copy the table into docs/install.md ("Supported versions").
#
# It tests the committed HEAD: a snapshot (git archive) in $MATRIX_DIR/src is built and
# tested, so edits made while it runs do not leak into later versions. Each version's row
# goes to $MATRIX_DIR/rows/tfX.Y.md as soon as it is known, so a rerun of some versions
# updates only their rows; the table of every row there is printed at the end and written
# to $MATRIX_DIR/table.md. Logs: $MATRIX_DIR/tfX.Y/{setup,build,tests}.log.
#
# Settings: MATRIX_DIR (default build/matrix), MATRIX_VENVS (where the venvs go, default
# $MATRIX_DIR/venvs; ~1.6 GB each, reused when present), FUSEDOPT_BASE_PYTHON (python3.11),
# FUSEDOPT_JOBS (parallel compiles, default 1 here).
# Exit status: 0 when every version asked for passed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
versions=("$@")
((${#versions[@]})) || versions=(2.15 2.16 2.17 2.18 2.19 2.20 2.21)
matrix=$(realpath -m "${MATRIX_DIR:-build/matrix}")
venvs=$(realpath -m "${MATRIX_VENVS:-$matrix/venvs}")
base=${FUSEDOPT_BASE_PYTHON:-python3.11}
export FUSEDOPT_JOBS=${FUSEDOPT_JOBS:-1}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
export PYTHONDONTWRITEBYTECODE=1
tests=(tests/ops/test_ops.py tests/frontends/test_compat_v1.py tests/frontends/test_keras.py tests/frontends/test_keras_legacy.py)
# Build and test tools, the same pins as tools/setup_env.sh.
tools=(setuptools==84.2.1 pybind11==3.1.0 pytest==9.2.0 hypothesis==6.170.17 wheel==0.48.0)
mkdir -p "$matrix/rows" "$venvs"
commit=$(git rev-parse --short HEAD)
rm -rf "$matrix/src"
mkdir -p "$matrix/src"
git archive HEAD | tar -x -C "$matrix/src"
cd "$matrix/src"
say() { printf '[matrix %s] %s\n' "$(date +%T)" "$*"; }

# row VERSION PYTHON RESULT: the version's table row, from what its venv has installed, with
# the date and the commit tested.
row() {
  local v=$1 py=$2 result=$3 installed
  installed=$("$py" - 2>/dev/null <<'EOF' || echo "- | - | -"
import importlib.metadata as md, platform
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "-"
print(f"{version('tensorflow-cpu')} | {version('keras')} / {version('tf-keras')} | "
      f"{platform.python_version()}")
EOF
)
  printf '| %s | %s | %s | %s | %s |\n' "$v" "$installed" "$result" "$(date -u +%F)" \
    "$commit" >"$matrix/rows/tf$v.md"
}

failed=0
for v in "${versions[@]}"; do
  [[ $v =~ ^2\.[0-9]+$ ]] || { echo "not a TensorFlow minor: $v (e.g. 2.17)" >&2; exit 2; }
  minor=${v#2.}
  dir=$matrix/tf$v
  venv=$venvs/tf$v
  py=$venv/bin/python
  mkdir -p "$dir"
  say "TF $v: environment ($venv)"
  packages=("tensorflow-cpu==$v.*" "${tools[@]}")
  if ! { [[ -x $py ]] || "$base" -m venv "$venv"; } >"$dir/setup.log" 2>&1 ||
     ! "$py" -m pip install -q --disable-pip-version-check "${packages[@]}" >>"$dir/setup.log" 2>&1; then
    say "TF $v: FAILED to set up (see $dir/setup.log)"
    row "$v" "$py" "FAIL: environment (pip: $(tail -n 1 "$dir/setup.log"))"
    failed=1
    continue
  fi
  # tf_keras (Keras 2, for fusedopt.keras.legacy) from 2.16 on, where tf.keras is Keras 3.
  # --no-deps: tf_keras requires `tensorflow`, which would install a second TensorFlow
  # over tensorflow-cpu.
  if ((minor >= 16)) &&
     ! "$py" -m pip install -q --disable-pip-version-check --no-deps "tf-keras==$v.*" \
       >>"$dir/setup.log" 2>&1; then
    say "TF $v: no tf_keras $v (see $dir/setup.log)"
    row "$v" "$py" "FAIL: no tf_keras $v"
    failed=1
    continue
  fi
  say "TF $v: build ($("$py" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null))"
  rm -rf "$dir/pkg"
  if ! "$py" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
       --target "$dir/pkg" . >"$dir/build.log" 2>&1; then
    say "TF $v: build FAILED (see $dir/build.log)"
    row "$v" "$py" "FAIL: build ($(grep -m 1 -E 'error' "$dir/build.log" | cut -c 1-160))"
    failed=1
    continue
  fi
  say "TF $v: tests"
  rc=0
  PYTHONPATH="$dir/pkg" "$py" -m pytest -q -rs -p no:cacheprovider "${tests[@]}" \
    >"$dir/tests.log" 2>&1 || rc=$?
  summary=$(grep -E '^=*.* in [0-9.]+s' "$dir/tests.log" | tail -n 1 | sed -E 's/^=+ //; s/ =+$//')
  if ((rc == 0)); then
    row "$v" "$py" "pass (${summary:-no summary})"
  else
    row "$v" "$py" "FAIL: tests (${summary:-exit $rc})"
    failed=1
  fi
  say "TF $v: ${summary:-exit $rc}"
done

{
  echo "| TF | tensorflow-cpu | Keras / tf_keras | Python | result (op, compat.v1, Keras, legacy Keras tests) | date | commit |"
  echo "|---|---|---|---|---|---|---|"
  for f in $(ls "$matrix/rows"/*.md | sort -V); do cat "$f"; done
} >"$matrix/table.md"
cat "$matrix/table.md"
exit "$failed"
