#!/usr/bin/env bash
# Debian packages the builds need: Bazel (Debian's bazel-bootstrap 4.2.3, offline-capable with
# the workarounds in WORKSPACE) and the rules_java it loads; the highwayhash and farmhash
# headers that TensorFlow's XLA headers include (the pip wheel does not ship them; the XLA
# kernels in cc/tf/xla_kernels.cc need them); Chromium, for the documentation site's browser
# test. Skips what is already there.
# --pip-build: only what the pip build needs (the headers; no Bazel, no Chromium): tools/run_demo.sh.
# Installing needs
# root: run as root, or with sudo usable without a password prompt; otherwise it names the
# packages and the command to run, and exits 1.
set -euo pipefail
missing=()
if [[ ${1:-} != --pip-build ]]; then
  command -v bazel >/dev/null && [[ -d /usr/share/bazel/rules/java ]] || missing+=(bazel-bootstrap bazel-rules-java)
fi
# Chromium: the documentation site's browser test (tests/docs/test_docs_site.py).
if [[ ${1:-} != --pip-build ]]; then
  command -v chromium >/dev/null || missing+=(chromium)
fi
[[ -f /usr/include/highwayhash/sip_hash.h ]] || missing+=(libhighwayhash-dev)
[[ -f /usr/include/farmhash.h ]] || missing+=(libfarmhash-dev)
((${#missing[@]})) || exit 0
sudo=
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    why="not root and there is no sudo"
  elif ! sudo -n true 2>/dev/null; then
    why="not root, and sudo asks for a password (no terminal to type it in here)"
  fi
  if [[ -n ${why:-} ]]; then
    echo "install_system_deps: cannot install ${missing[*]}: $why." >&2
    echo "  Install them once as root, then rerun:" >&2
    echo "    apt-get update && apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  sudo=sudo
fi
$sudo apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >/dev/null
