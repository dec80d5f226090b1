#!/usr/bin/env bash
# The model families side by side at one size: `small` (Qwen3-MoE), `k2-small` (DeepSeek-V3's MLA),
# and Mixtral, GLM-4.5 and gpt-oss shaped like `small` (hidden 512, 8 layers, 8 heads / 4 KV heads
# of 64, 16 routed experts x 256, top-4; GLM: layer 0 dense, q/k/v biases, QK-norm, RoPE on half of
# each head, a shared expert; Mixtral: every layer a MoE, no QK-norm; gpt-oss: every layer a MoE
# with biases and the clamped SwiGLU, q/k/v/o biases, sinks, a window of 128 on the even layers,
# YaRN; Qwen3-Next: `qwen3next-small`, 6 Gated DeltaNet layers and 2 gated attention ones, a shared
# expert). For each family, alternating in
# ROUNDS rounds so that a noisy neighbour hits every family alike: `trill bench generate` (bf16,
# decode at batch 1/16/64 and prefill) and `trill bench train` (LoRA rank 16, 4 x 256 tokens).
# Prints one line per family and round (the machine's noise shows in the rounds' spread).
# Usage: bench/families.sh BUILD_DIR [ROUNDS]   (default 2; OMP_NUM_THREADS as set, default all cores)
set -euo pipefail
BUILD=${1:?usage: bench/families.sh BUILD_DIR [ROUNDS]}
ROUNDS=${2:-2}
TRILL=$BUILD/trill
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-families-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SMALL=(--set vocab_size=32000 --set hidden_size=512 --set num_hidden_layers=8 --set num_attention_heads=8 --set num_key_value_heads=4
       --set head_dim=64 --set num_experts_per_tok=4 --set max_position_embeddings=32768)
"$TRILL" init --out "$WORK/small" --preset small --seed 1 2>/dev/null
"$TRILL" init --out "$WORK/k2-small" --preset k2-small --seed 1 2>/dev/null
"$TRILL" init --out "$WORK/mixtral" --preset mixtral-tiny "${SMALL[@]}" --set intermediate_size=256 --set num_local_experts=16 --seed 1 2>/dev/null
"$TRILL" init --out "$WORK/glm" --preset glm45-tiny "${SMALL[@]}" --set intermediate_size=1536 --set moe_intermediate_size=256 \
    --set n_routed_experts=16 --seed 1 2>/dev/null
"$TRILL" init --out "$WORK/gpt-oss" --preset gptoss-tiny "${SMALL[@]}" --set intermediate_size=256 --set num_local_experts=16 \
    --set sliding_window=128 --seed 1 2>/dev/null
"$TRILL" init --out "$WORK/qwen3next" --preset qwen3next-small --seed 1 2>/dev/null
FAMILIES=(small k2-small mixtral glm gpt-oss qwen3next)
for f in "${FAMILIES[@]}"; do
  echo "$f: $("$TRILL" info --model "$WORK/$f" | grep '^parameters:')"
done
for r in $(seq 1 "$ROUNDS"); do
  for f in "${FAMILIES[@]}"; do
    gen=$("$TRILL" bench generate --model "$WORK/$f" --dtypes bf16 --batches 1,16,64 --steps 16 2>&1)
    train=$("$TRILL" bench train --model "$WORK/$f" --lora --batch 4 --seq 256 --runs 3 2>&1)
    dec=$(echo "$gen" | sed -n 's/^ *batch *\([0-9]*\): decode *\([0-9.]*\) tokens\/s.*prefill \([0-9]*\) tokens\/s/b\1 \2 (prefill \3)/p' | tr '\n' ' ')
    kv=$(echo "$gen" | sed -n 's/.*KV cache \([0-9]*\) bytes per token.*/\1/p' | head -1)
    tr_=$(echo "$train" | sed -n 's/.*: \([0-9.]*\) tokens\/s, median.*(\([0-9.]*\)% of peak.*/\1 tokens\/s (\2% of peak)/p')
    printf 'round %s %-9s decode bf16 tokens/s: %s| KV %s B/token | train LoRA 4x256: %s\n' "$r" "$f" "$dec" "$kv" "$tr_"
  done
done
