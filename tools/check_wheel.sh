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
#   - `python -m fusedopt.info` (exit 0), fusedopt imported from the new venv, the version
#     carrying the running TensorFlow's minor, then the op tests (tests/ops/test_ops.py).
# VENV_DIR defaults to build/wheel-venv (recreated each run).
set -euo pipefail
py=${1:?"usage: tools/check_wheel.sh PYTHON WHEEL [VENV_DIR]"}
wheel=$(realpath "${2:?"usage: tools/check_wheel.sh PYTHON WHEEL [VENV_DIR]"}")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(realpath -m "${3:-$root/build/wheel-venv}")
rm -rf "$venv"
"$py" -m venv "$venv"
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
new_site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$site" >"$new_site/_tensorflow_env.pth"
cd "$(mktemp -d)"  # not the checkout: python/fusedopt must not shadow the installed package
# A fusedopt already in PYTHON's environment would satisfy pip ("already installed") and be
# what the checks below import: refuse rather than test the wrong build.
if installed=$("$venv/bin/python" -c "import importlib.util as u; s = u.find_spec('fusedopt'); print(s.origin if s else '')") &&
   [[ -n $installed ]]; then
  echo "check_wheel: $py's environment already has fusedopt ($installed); uninstall it" \
    "first (pip uninstall fusedopt): the clean venv sees that environment's packages" >&2
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
version = importlib.metadata.version("fusedopt")
major_minor = ".".join(tf.__version__.split(".")[:2])
assert f"+tf{major_minor}" in version, (version, tf.__version__)
dist = _loader.tensorflow_distribution(tf.__version__)
requires = importlib.metadata.requires("fusedopt")
from packaging.requirements import Requirement  # a TensorFlow dependency
wanted = Requirement(_loader.tensorflow_requirement(tf.__version__, dist))
# Compared parsed: the metadata may order the specifiers differently.
assert any(r.name == wanted.name and r.specifier == wanted.specifier
           for r in map(Requirement, requires)), (requires, str(wanted))
print(f"check_wheel: fusedopt {version} from {os.path.dirname(fusedopt.__file__)}, "
      f"requires {requires}, TF {tf.__version__} ({dist})")
EOF
TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2} "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  --rootdir "$root" "$root/tests/ops/test_ops.py"
