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

# What the Bazel build needs, checked before Bazel starts (one message naming the packages
# and the command, as setup.py does): Bazel, a C++ compiler, TensorFlow and pybind11 in $PY,
# and the two header packages TF's XLA headers include. $BAZEL and $CXX choose the programs;
# $FUSEDOPT_SYSTEM_INCLUDE_DIRS (':'-separated) replaces the compiler's header search.
BAZEL=${BAZEL:-bazel}
problems=()
command -v "$BAZEL" >/dev/null ||
    problems+=("Bazel is not on PATH (Debian: sudo apt-get install bazel-bootstrap bazel-rules-java; or set BAZEL)")
cxx=${CXX:-g++}
have_cxx=1
command -v "$cxx" >/dev/null || { have_cxx=0; problems+=("no C++ compiler: $cxx is not on PATH (Debian: sudo apt-get install g++; or set CXX)"); }
"$PY" -c "import tensorflow" >/dev/null 2>&1 ||
    problems+=("$PY cannot import TensorFlow (pip install tensorflow-cpu==<the version you use>)")
"$PY" -c "import pybind11" >/dev/null 2>&1 || problems+=("$PY has no pybind11 (pip install pybind11)")
missing=()
for pair in highwayhash/arch_specific.h:libhighwayhash-dev farmhash.h:libfarmhash-dev; do
    header=${pair%%:*}
    if [[ -n ${FUSEDOPT_SYSTEM_INCLUDE_DIRS+set} ]]; then
        found=0
        IFS=: read -ra dirs <<<"$FUSEDOPT_SYSTEM_INCLUDE_DIRS"
        for d in "${dirs[@]}"; do [[ -n $d && -e $d/$header ]] && found=1; done
    elif [[ $have_cxx == 1 ]]; then
        found=0
        printf '#include <%s>\n' "$header" | "$cxx" -x c++ -E - >/dev/null 2>&1 && found=1
    else
        found=0
        [[ -e /usr/include/$header || -e /usr/local/include/$header ]] && found=1
    fi
    [[ $found == 1 ]] || missing+=("${pair#*:}")
done
[[ ${#missing[@]} == 0 ]] ||
    problems+=("TF's XLA headers include highwayhash's and farmhash's, which are not installed (Debian: sudo apt-get install ${missing[*]}, or tools/install_system_deps.sh)")
if [[ ${#problems[@]} -gt 0 ]]; then
    msg="fusedopt's Bazel build cannot run here: ${problems[0]}"
    for p in "${problems[@]:1}"; do msg+="; $p"; done
    echo "$msg." >&2
    exit 1
fi
unset problems missing found dirs header pair have_cxx cxx msg
