#!/usr/bin/env bash
# Installs the Debian packages trill needs to build and test, only those missing.
# Idempotent and silent when everything is already present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libopenblas-dev libjansson-dev libyaml-dev libcmocka-dev
  clang libclang-rt-14-dev           # libFuzzer harnesses
  python3 python3-torch python3-numpy # parity reference (tests only)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
