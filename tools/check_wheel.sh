#!/usr/bin/env bash
# Usage: tools/check_wheel.sh PYTHON WHEEL [VENV_DIR]
#
# Installs WHEEL (tools/build_wheel.sh) into a new, empty virtual environment and smoke-tests
# it there, from outside the checkout:
#   - the venv sees no packages but its own and PYTHON's site-packages (a .pth file; creating
#     it with --system-site-packages would expose the base interpreter's packages instead), so
#     TensorFlow is not downloaded again;
#   - pip installs the wheel WITH its requirements but --no-index: numpy and the pinned
#     TensorFlow must be met by what PYTHON has. A pin on another TensorFlow minor, or on the
#     other distribution (tensorflow vs tensorflow-cpu: pip would install a second TensorFlow
#     over the first), fails here;
#   - the wheel is manylinux-tagged and `auditwheel show` agrees with its tag (TensorFlow's
#     own libraries aside, which the pin provides);
#   - no compiler works from here on (PATH and CC/CXX lead to stand-ins that fail), so
#     neither the install nor the tests can build anything;
#   - `python -m fusedopt.info` (exit 0), fusedopt imported from the new venv, installed
#     under the wheel name for the running TensorFlow (fusedopt-tf2.21-cpu) with fusedopt's
#     version, then the op tests (tests/ops/test_ops.py).
# VENV_DIR defaults to build/wheel-venv (recreated each run).
set -euo pipefail
py=${1:?"usage: tools/check_wheel.sh PYTHON WHEEL [VENV_DIR]"}
wheel=$(realpath "${2:?"usage: tools/check_wheel.sh PYTHON WHEEL [VENV_DIR]"}")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(realpath -m "${3:-$root/build/wheel-venv}")
case $(basename "$wheel") in
  *-manylinux_*.whl) ;;
  *) echo "check_wheel: $(basename "$wheel") is not manylinux-tagged" >&2; exit 1 ;;
esac
aw=$("$root/tools/auditwheel_env.sh" "$py")
report=$(mktemp)
"$aw" show --json "$wheel" >"$report"
# The tag the wheel carries is the one its symbol versions allow, the only libraries it
# needs outside the manylinux policy are TensorFlow's, and none was grafted into it.
"$py" - "$report" "$wheel" <<'EOF'
import json, re, sys, zipfile
report = json.load(open(sys.argv[1]))
tag = sys.argv[2].rsplit("-", 1)[-1][:-len(".whl")]
tensorflow = {"libtensorflow_framework.so.2", "libtensorflow_cc.so.2"}
def glibc(t):  # manylinux_2_27_x86_64 -> (2, 27)
    m = re.match(r"manylinux_(\d+)_(\d+)_", t)
    assert m, f"not a manylinux tag: {t}"
    return int(m[1]), int(m[2])
# The symbol versions allow the wheel's tag (or an older glibc still).
assert glibc(report["sym_tag"]) <= glibc(tag), f"symbols need {report['sym_tag']}, wheel says {tag}"
assert set(report["external_libs"]) <= tensorflow, report["external_libs"]
assert not report["unsupported_isa"], report["unsupported_isa"]
grafted = [n for n in zipfile.ZipFile(sys.argv[2]).namelist() if ".libs/" in n]
assert not grafted, f"libraries copied into the wheel: {grafted}"
print(f"check_wheel: auditwheel: tagged {tag}, symbol versions allow {report['sym_tag']}, external libraries "
      f"{sorted(report['external_libs'])} only")
EOF
rm -rf "$venv"
"$py" -m venv "$venv"
# Compiler stand-ins that fail, first on PATH: nothing below may compile.
nocc=$(mktemp -d)
for c in cc gcc g++ c++ clang clang++ nvcc; do
  printf '#!/bin/sh\necho "check_wheel: no compiler here ($0)" >&2\nexit 1\n' >"$nocc/$c"
  chmod +x "$nocc/$c"
done
export PATH="$nocc:$PATH" CC="$nocc/cc" CXX="$nocc/c++"
if g++ --version >/dev/null 2>&1; then echo "check_wheel: a compiler still runs" >&2; exit 1; fi
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
new_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$site" >"$new_site/_tensorflow_env.pth"
cd "$(mktemp -d)"  # not the checkout: python/fusedopt must not shadow the installed package
# A fusedopt already in PYTHON's environment would satisfy pip ("already installed") and be
# what the checks below import: refuse rather than test the wrong build.
if installed=$("$venv/bin/python" -c "import importlib.util as u; s = u.find_spec('fusedopt'); print(s.origin if s else '')") &&
   [[ -n $installed ]]; then
  echo "check_wheel: $py's environment already has fusedopt ($installed); uninstall it" \
    "first (pip uninstall fusedopt, or the fusedopt-tf<major>.<minor>[-cpu] wheel): the clean venv sees that environment's packages" >&2
  exit 1
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index "$wheel"
TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} "$venv/bin/python" -m fusedopt.info
"$venv/bin/python" - "$new_site" <<'EOF'
import importlib.metadata, os, sys
import tensorflow as tf
import fusedopt
from fusedopt import _loader
site = sys.argv[1]
assert fusedopt.__file__.startswith(site), f"fusedopt from {fusedopt.__file__}, not {site}"
dist = _loader.tensorflow_distribution(tf.__version__)
name = _loader.wheel_name(tf.__version__, dist)
version = importlib.metadata.version(name)
assert version == fusedopt.__version__, (name, version, fusedopt.__version__)
requires = importlib.metadata.requires(name)
from packaging.requirements import Requirement  # a TensorFlow dependency
wanted = Requirement(_loader.tensorflow_requirement(tf.__version__, dist))
# Compared parsed: the metadata may order the specifiers differently.
assert any(r.name == wanted.name and r.specifier == wanted.specifier
           for r in map(Requirement, requires)), (requires, str(wanted))
print(f"check_wheel: {name} {version} from {os.path.dirname(fusedopt.__file__)}, "
      f"requires {requires}, TF {tf.__version__} ({dist})")
EOF
TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir "$root" "$root/tests/ops/test_ops.py"
