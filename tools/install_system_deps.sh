#!/usr/bin/env bash
# Debian packages the builds need: Bazel (Debian's bazel-bootstrap 4.2.3, offline-capable with
# the workarounds in WORKSPACE) and the rules_java it loads; the highwayhash and farmhash
# headers that TensorFlow's XLA headers include (the pip wheel does not ship them; the XLA
# kernels in cc/tf/xla_kernels.cc need them). Skips what is already there.
set -euo pipefail
missing=()
command -v bazel >/dev/null && [[ -d /usr/share/bazel/rules/java ]] || missing+=(bazel-bootstrap bazel-rules-java)
[[ -f /usr/include/highwayhash/sip_hash.h ]] || missing+=(libhighwayhash-dev)
[[ -f /usr/include/farmhash.h ]] || missing+=(libfarmhash-dev)
((${#missing[@]})) || exit 0
sudo=; [[ $(id -u) -eq 0 ]] || sudo=sudo
$sudo apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >/dev/null
