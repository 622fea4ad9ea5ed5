#!/usr/bin/env bash
# Debian packages the builds need: Bazel (Debian's bazel-bootstrap 4.2.3, offline-capable with
# the workarounds in WORKSPACE) and the rules_java it loads. Skips what is already there.
set -euo pipefail
if command -v bazel >/dev/null && [[ -d /usr/share/bazel/rules/java ]]; then
  exit 0
fi
sudo=; [[ $(id -u) -eq 0 ]] || sudo=sudo
$sudo apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q bazel-bootstrap bazel-rules-java >/dev/null
