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

# Training step, and the side-by-side with PyTorch when Debian's python3-torch is there.
echo
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  bash "$(dirname "$0")/train_vs_torch.sh" "$BUILD"
else
  echo "bench/run.sh: train_vs_torch.sh skipped (needs Debian's python3-torch)"
fi

# Kernels of the trainer's attention, the gated delta rule and the generator, then the generator engine on `small`.
echo
"$BUILD/bench/bench_attention"
echo
"$BUILD/bench/bench_gdn"
echo
"$BUILD/bench/bench_gen_gemm"
echo
"$BUILD/bench/bench_turns"
echo
SMALL=$(mktemp -d "${TMPDIR:-/tmp}/trill-bench-gen-XXXXXX")
trap 'rm -rf "$SMALL"' EXIT
"$BUILD/trill" init --out "$SMALL" --preset small --dtype bf16 2>/dev/null
"$BUILD/trill" bench generate --model "$SMALL"
