#!/usr/bin/env bash
# Qwen3-Next against the GQA and MLA families at one size (issue 40's figures): `qwen3next-small`
# (hidden 512, 8 layers: 6 Gated DeltaNet, 2 gated attention; 16 experts x 256 top-4 and a shared
# expert) beside `small` (Qwen3-MoE, GQA 8/4 heads of 64) and `k2-small` (MLA). Per model, in
# ROUNDS alternating rounds: what a sequence holds at context 512 and 8192 (KV cache per token x
# context, plus the linear layers' fixed state), bf16 decode tokens/s at batch 1 and 16 (8192: 1
# and 4) after prompts of that length, and `trill bench train` (LoRA rank 16, 4 x 256 tokens);
# then bench_gdn (the gated delta rule's kernels alone: the chunked form's GFLOP/s).
# Usage: bench/qwen3next.sh BUILD_DIR [ROUNDS]   (default 2)
set -euo pipefail
BUILD=${1:?usage: bench/qwen3next.sh BUILD_DIR [ROUNDS]}
ROUNDS=${2:-2}
TRILL=$BUILD/trill
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-qwen3next-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
MODELS=(small k2-small qwen3next-small)
for f in "${MODELS[@]}"; do
  "$TRILL" init --out "$WORK/$f" --preset "$f" --seed 1 --set max_position_embeddings=32768 2>/dev/null
  echo "$f: $("$TRILL" info --model "$WORK/$f" | grep '^parameters:')"
done
for r in $(seq 1 "$ROUNDS"); do
  for ctx in 512 8192; do
    batches=1,16
    [ "$ctx" -gt 1024 ] && batches=1,4
    for f in "${MODELS[@]}"; do
      gen=$("$TRILL" bench generate --model "$WORK/$f" --dtypes bf16 --batches "$batches" --prompt-len "$ctx" --steps 16 --decode-only 2>&1)
      dec=$(echo "$gen" | sed -n 's/^ *batch *\([0-9]*\): decode *\([0-9.]*\) tokens\/s.*prefill \([0-9]*\) tokens\/s/b\1 \2 (prefill \3)/p' | tr '\n' ' ')
      held=$(echo "$gen" | sed -n 's/.*KV cache \([0-9]*\) bytes per token\(.*\); at the prompt.* holds \([0-9]*\) bytes/\1 B\/token\2 -> \3 B a sequence/p' | head -1)
      printf 'round %s ctx %-5s %-16s decode bf16 tokens/s: %s| %s\n' "$r" "$ctx" "$f" "$dec" "$held"
    done
  done
  for f in "${MODELS[@]}"; do
    train=$("$TRILL" bench train --model "$WORK/$f" --lora --batch 4 --seq 256 --runs 3 2>&1)
    printf 'round %s %-16s train LoRA 4x256: %s\n' "$r" "$f" \
      "$(echo "$train" | sed -n 's/.*: \([0-9.]*\) tokens\/s, median.*(\([0-9.]*\)% of peak.*/\1 tokens\/s (\2% of peak)/p')"
  done
done
"$BUILD/bench/bench_gdn"
