#!/usr/bin/env bash
# Runs the benchmarks against a build directory: bench/run.sh BUILD_DIR (default build).
# Threads: OMP_NUM_THREADS / OPENBLAS_NUM_THREADS as set by the caller (default: all cores).
# bench_tokenizer runs only when TRILL_BENCH_TOKENIZER_DIRS names folders holding a
# tokenizer.json (space-separated); no tokenizer files ship in the repository.
set -euo pipefail
BUILD=${1:-build}
BIN="$BUILD/bench/bench_forward"
if [[ ! -x "$BIN" ]]; then
  echo "bench/run.sh: $BIN not found; build first (make build)" >&2
  exit 1
fi
"$BIN"
if [[ -n "${TRILL_BENCH_TOKENIZER_DIRS:-}" ]]; then
  TOK="$BUILD/bench/bench_tokenizer"
  if [[ ! -x "$TOK" ]]; then
    echo "bench/run.sh: $TOK not found; build first (make build)" >&2
    exit 1
  fi
  for dir in $TRILL_BENCH_TOKENIZER_DIRS; do
    echo
    "$TOK" --model "$dir"
  done
else
  echo
  echo "bench/run.sh: bench_tokenizer skipped (set TRILL_BENCH_TOKENIZER_DIRS to folders with a tokenizer.json)"
fi
