#!/usr/bin/env bash
# Installs the Debian packages trill needs to build and test, only those missing.
# Idempotent and silent when everything is already present.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libopenblas-dev libjansson-dev libyaml-dev libcmocka-dev libpcre2-dev libutf8proc-dev libxxhash-dev
  libmicrohttpd-dev libsqlite3-dev libssl-dev   # trill serve: HTTP, its state, key hashes
  libprotobuf-c-dev protobuf-c-compiler          # trill serve: the Tinker protocol's protobuf bodies
  libcurl4-openssl-dev               # the C client of trill serve (clients/c)
  libopenmpi-dev openmpi-bin         # the distributed trainer's communicator (src/dist)
  clang libclang-rt-14-dev           # libFuzzer harnesses
  python3 python3-torch python3-numpy # parity reference (tests only)
  chromium                           # renders trill report's page in its browser test (tests only)
)

missing=()
# Node.js + npm for the tokenizer oracle (tests only); machines may carry their own build,
# so Debian's packages are added only when the commands are missing.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then missing+=(nodejs npm); fi
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
