#!/usr/bin/env bash
# trill's training step next to the same model and batch in PyTorch (bench/torch_train.py:
# HF-style eager modules, PEFT-style LoRA, 2 threads), one after the other in one run.
# Usage: bench/train_vs_torch.sh BUILD_DIR [MODEL_DIR]   (default model: a fresh `small` preset)
# PRECISIONS (default "fp32 bf16"): trill's trainer.precision beside torch in fp32 or under
# torch.autocast('cpu', bfloat16).
set -euo pipefail
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
TRILL="$BUILD/trill"
PY=/usr/bin/python3
MODEL=${2:-}
if [[ -z "$MODEL" ]]; then
  MODEL=$(mktemp -d "${TMPDIR:-/tmp}/trill-bench-small-XXXXXX")
  trap 'rm -rf "$MODEL"' EXIT
  "$TRILL" init --out "$MODEL" --preset small --dtype bf16 2>/dev/null
fi
BATCH=${BATCH:-8} SEQ=${SEQ:-512} RUNS=${RUNS:-3} PRECISIONS=${PRECISIONS:-fp32 bf16}
for prec in $PRECISIONS; do
for mode in lora full; do
  ours=$("$TRILL" bench train --model "$MODEL" --$mode --precision "$prec" --batch "$BATCH" --seq "$SEQ" --runs "$RUNS" 2>/dev/null | grep -e "^trill train" -e "^base weights" | paste -sd " ")
  theirs=$(OMP_NUM_THREADS=2 "$PY" "$HERE/torch_train.py" --model "$MODEL" --$mode $([ "$prec" = bf16 ] && echo --bf16) --batch "$BATCH" --seq "$SEQ" --runs "$RUNS" --threads 2 | tail -1)
  echo "$ours"
  echo "$theirs"
  a=$(sed -n 's/.*: \([0-9.]*\) tokens\/s.*/\1/p' <<<"$ours")
  b=$(sed -n 's/.*: \([0-9.]*\) tokens\/s.*/\1/p' <<<"$theirs")
  awk -v a="$a" -v b="$b" -v m="$mode $prec" 'BEGIN { if (b > 0) printf "%s: trill / torch tokens/s = %.2fx\n\n", m, a / b }'
done
done
