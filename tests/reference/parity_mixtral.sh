#!/usr/bin/env bash
# The Mixtral family against its independent float64 PyTorch reference (mixtral_ref.py, written
# from the HF equations): the reference's self-check (autograd vs finite differences); `trill
# score` on checkpoints the reference writes (f32, bf16 sharded, tied embeddings, GQA 8/2 with
# head_dim 32, top-1 with MHA, head_dim absent or null and derived, 16 experts top-3) and on one
# `trill init --preset mixtral-tiny` writes; full and LoRA gradients (grad_tool; LoRA on every
# linear: q/k/v/o_proj, the experts' w1/w2/w3, lm_head) with and without router replay; trill
# merge; and the generator (f32) on the sequences it generates. No gradient case for top-1: its
# router gradient is exactly zero (the weight is p / p), and trill's fp32 rounding of it (~1e-7,
# where a top-2 router's is ~3) is above compare_grads.py's zero bound (1e-10 * the largest norm).
# make test runs a sample of the cases; make test-full (TRILL_TEST_FULL=1) runs them all. The
# Python steps run one by one in a single python3 (pystep.sh: pystep), which imports torch once
# for the whole script.
# Usage: parity_mixtral.sh PATH/TO/trill PATH/TO/grad_tool
set -euo pipefail
TRILL=$1
TOOL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3   # Debian's python3 with python3-torch (pystep.sh runs it)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-mixtral-XXXXXX")
source "$HERE/pystep.sh"
trap 'pystep_stop; rm -rf "$WORK"' EXIT
pystep_start
REF=mixtral_ref.py
source "$HERE/parity_lib.sh"
SAMPLE=" selfcheck-grad f32 gqa8_2_hd32 head_dim_absent experts16_top3 window5 yarn mixtral-tiny grad_f32 grad_window5 grad_yarn lora_f32 "
source "$HERE/sample.sh"

if sampled selfcheck-grad; then
  if pystep -o "$WORK/selfcheck.txt" -E mixtral_ref.py selfcheck-grad; then pass "reference selfcheck-grad"
  else fail "reference selfcheck-grad" "$WORK/selfcheck.txt"; fi
fi

pystep -o /dev/null gen_inputs.py --vocab 97 --seed 11 --lengths 1,2,7,33,64,130 --out "$WORK/in.jsonl"
# name | make-model arguments (the base: 4 layers, hidden 64, 4 heads / 2 KV heads of 16,
# 8 experts of width 32, top-2, rope_theta 1e6; `head_dim=` leaves head_dim out of config.json)
cases=(
  "f32|--dtype f32 --seed 1"
  "bf16_sharded|--dtype bf16 --seed 2 --shards 3"
  "tied|--dtype f32 --seed 3 --set tie_word_embeddings=true"
  "gqa8_2_hd32|--dtype bf16 --seed 4 --set num_attention_heads=8 num_key_value_heads=2 head_dim=32"
  "top1_mha|--dtype f32 --seed 5 --set num_experts_per_tok=1 num_key_value_heads=4 rope_theta=10000.0"
  "head_dim_absent|--dtype f32 --seed 6 --set head_dim= hidden_size=96 num_attention_heads=4 num_key_value_heads=2"
  "experts16_top3|--dtype f32 --seed 7 --set num_local_experts=16 num_experts_per_tok=3 num_hidden_layers=5"
  "head_dim_null|--dtype bf16 --seed 8 --set head_dim=null hidden_size=48 num_attention_heads=4 num_key_value_heads=1"
  "window5|--dtype f32 --seed 13 --set sliding_window=5"
  "yarn|--dtype f32 --seed 14 --set rope_scaling={\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32,\"attention_factor\":1.2}"
)
score_cases
# a checkpoint trill writes, read by the reference's own reader (which refuses any tensor or
# shape the config does not imply); the generator's model below
dir="$WORK/trill_mixtral-tiny"
"$TRILL" init --out "$dir" --preset mixtral-tiny --seed 9 --dtype f32 --set initializer_range=0.1 2>/dev/null
if sampled mixtral-tiny; then score_and_compare "trill_written_mixtral-tiny" "$dir"; fi

for name in f32 tied gqa8_2_hd32 experts16_top3 window5 yarn; do
  sampled "grad_$name" || continue
  train_inputs "$name"
  grad_compare "grad $name" "$WORK/$name"
  [ "$name" = f32 ] && pystep -o /dev/null compare_grads.py "$WORK/f32.g.ref" --self-test
  grad_compare "grad $name replay" "$WORK/$name" --replay
done
# LoRA on every linear layer (q/k/v/o_proj, the experts' w1/w2/w3, lm_head), B non-zero, the base
# frozen; then trill merge scores as the base + adapter does. The tied model's adapter leaves out
# lm_head (trill refuses to adapt a head tied to the embeddings).
for name in f32 tied; do
  sampled "lora_$name" || continue
  train_inputs "$name"
  dir="$WORK/$name"
  targets=q_proj,k_proj,v_proj,o_proj,w1,w2,w3,lm_head
  [ "$name" = tied ] && targets=q_proj,k_proj,v_proj,o_proj,w1,w2,w3
  lora_and_merge "$name" "$dir" "$targets"
done

# The generator (f32, its KV cache) on the sequences it samples: their log-probs as the reference
# computes them
generator_compare "generator f32" "$WORK/trill_mixtral-tiny"
# ... and with a sliding window of 8 (40 tokens decoded past a 6-token prompt: most of them slide)
"$TRILL" init --out "$WORK/trill_window" --preset mixtral-tiny --seed 9 --dtype f32 --set initializer_range=0.1 --set sliding_window=8 2>/dev/null
generator_compare "generator f32 (sliding window 8)" "$WORK/trill_window"
# ... and with YaRN (factor 4 over 16 original positions: the 46 positions stretch it)
"$TRILL" init --out "$WORK/trill_yarn" --preset mixtral-tiny --seed 9 --dtype f32 --set initializer_range=0.1 \
    --set 'rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}' 2>/dev/null
generator_compare "generator f32 (YaRN)" "$WORK/trill_yarn"

echo "$passed passed, $failed failed"
report_sampled
[ "$failed" -eq 0 ]
