#!/usr/bin/env bash
# Runs the benchmarks against a build directory: bench/run.sh BUILD_DIR (default build).
# Threads: OMP_NUM_THREADS / OPENBLAS_NUM_THREADS as set by the caller (default: all cores).
set -euo pipefail
BUILD=${1:-build}
BIN="$BUILD/bench/bench_forward"
if [[ ! -x "$BIN" ]]; then
  echo "bench/run.sh: $BIN not found; build first (make build)" >&2
  exit 1
fi
"$BIN"
