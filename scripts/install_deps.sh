#!/usr/bin/env bash
# Installs Debian packages, only those missing. Idempotent; needs root for apt-get.
#   scripts/install_deps.sh            the packages kvq builds against
#   scripts/install_deps.sh PKG...     the given packages (e.g. the fuzzing toolchain, from scripts/run_fuzz.sh)
set -euo pipefail
PKGS=(cmake g++ make pkg-config libeigen3-dev libopenblas-dev nlohmann-json3-dev libpcre2-dev libcli11-dev
      libcpp-httplib-dev libboost-dev libfmt-dev libgtest-dev libbenchmark-dev libicu-dev zlib1g-dev)
(($#)) && PKGS=("$@")
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kvq: installing missing packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
