#!/usr/bin/env bash
# The DeepSeek-V3 / Kimi K2 family against its independent float64 PyTorch reference
# (deepseek_ref.py, written from the HF equations): the reference's self-checks (autograd vs
# finite differences, hand-made group-limited routing, the E4M3 codec); `trill score` on
# checkpoints the reference writes in f32, bf16 and FP8 (block-scaled, partial edge blocks) with
# q_lora_rank set and null, groups on and off, YaRN on and off (and its cos/sin factor != 1),
# interleave on and off, 1 and 2 shared experts, tied embeddings, and on checkpoints `trill init`
# writes; malformed FP8 scales refused by name; full and LoRA gradients (grad_tool) with and
# without router replay; trill merge; and the generator (f32) on the sequences it generates.
# make test runs a sample of the cases (every model feature at least once); make test-full
# (TRILL_TEST_FULL=1) runs them all. The Python steps run one by one in a single python3
# (pystep.sh: pystep), which imports torch once for the whole script rather than once per step
# (~2 s of CPU each: nine tenths of this script's time when each step was a python3 of its own).
# Usage: parity_deepseek.sh PATH/TO/trill PATH/TO/grad_tool
set -euo pipefail
TRILL=$1
TOOL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3   # Debian's python3 with python3-torch (pystep.sh runs it)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-dsv3-XXXXXX")
source "$HERE/pystep.sh"
trap 'pystep_stop; rm -rf "$WORK"' EXIT
pystep_start
REF=deepseek_ref.py
source "$HERE/parity_lib.sh"
SAMPLE=" selfcheck-grad f32 q_proj_nonorm yarn_factor_v12 kimi_k2_freq2 16,8 wrong-shape k2-tiny grad_f32 grad_yarn_factor_v12 lora_f32 "
source "$HERE/sample.sh"

for check in selfcheck-grad selfcheck-router selfcheck-fp8; do
  sampled "$check" || continue
  if pystep -o "$WORK/$check.txt" -E deepseek_ref.py $check; then pass "reference $check"; else fail "reference $check" "$WORK/$check.txt"; fi
done

pystep -o /dev/null gen_inputs.py --vocab 97 --seed 11 --lengths 1,2,7,33,64,130 --out "$WORK/in.jsonl"
YARN_FACTOR='rope_scaling={"type":"yarn","factor":4,"original_max_position_embeddings":64,"beta_fast":32,"beta_slow":1,"mscale":0.7,"mscale_all_dim":1.3}'
# name | make-model arguments (the base: 4 layers, first dense, 16 experts in 4 groups keeping 2,
# top-4, 1 shared, q_lora 24, kv_lora 16, YaRN, interleaved RoPE)
cases=(
  "f32|--dtype f32 --seed 1"
  "bf16_sharded|--dtype bf16 --seed 2 --shards 3"
  "q_proj_nonorm|--dtype f32 --seed 3 --set q_lora_rank=null norm_topk_prob=false"
  "no_yarn_no_interleave|--dtype bf16 --seed 4 --set rope_scaling=null rope_interleave=false"
  "one_group_two_shared_tied|--dtype f32 --seed 5 --set n_group=1 topk_group=1 n_shared_experts=2 tie_word_embeddings=true"
  "yarn_factor_v12|--dtype f32 --seed 6 --set v_head_dim=12 $YARN_FACTOR"
  "kimi_k2_freq2|--dtype f32 --seed 7 --set model_type=kimi_k2 moe_layer_freq=2 num_hidden_layers=5"
)
for c in "${cases[@]}"; do
  name=${c%%|*}
  sampled "$name" || continue
  # shellcheck disable=SC2086
  pystep -o /dev/null deepseek_ref.py make-model --out "$WORK/$name" --std 0.1 ${c#*|}
  score_and_compare "$name" "$WORK/$name"
done
# FP8 E4M3 with 128x128-style block scales (8x8 and 16x8 here, leaving partial edge blocks): the
# frozen base keeps the dequantized weights in bf16, as the reference does with --fp8-as bf16
for block in 8,8 16,8; do
  sampled "$block" || continue
  dir="$WORK/fp8_${block/,/x}"
  pystep -o /dev/null deepseek_ref.py make-model --out "$dir" --std 0.1 --dtype fp8 --block "$block" --seed 8
  score_and_compare "fp8 block $block" "$dir" --fp8-as bf16
done
# malformed FP8 scales are refused by name
for brk in missing-scale wrong-shape wrong-dtype; do
  sampled "$brk" || continue
  dir="$WORK/fp8_$brk"
  pystep -o /dev/null -E deepseek_ref.py make-model --out "$dir" --std 0.1 --dtype fp8 --block 8,8 --seed 9 --fp8-break "$brk"
  if "$TRILL" score --model "$dir" --input "$WORK/in.jsonl" --output "$dir.out" 2>"$dir.err"; then
    echo "trill score accepted a checkpoint with $brk" >"$dir.err"; fail "fp8 $brk refused" "$dir.err"
  elif grep -q 'model.layers.0.self_attn.q_a_proj.weight' "$dir.err"; then pass "fp8 $brk refused: $(head -1 "$dir.err")"
  else fail "fp8 $brk refused by name" "$dir.err"; fi
done
# checkpoints trill writes, read by the reference's own reader
for preset in k2-tiny dsv3-tiny; do
  sampled "$preset" || continue
  dir="$WORK/trill_$preset"
  "$TRILL" init --out "$dir" --preset "$preset" --seed 9 --dtype f32 --set initializer_range=0.1 2>/dev/null
  score_and_compare "trill_written_$preset" "$dir"
done

# Gradients: loss = sum of random coefficients * log-probs; full-parameter and LoRA, within 1e-3.
for name in f32 q_proj_nonorm one_group_two_shared_tied yarn_factor_v12; do
  sampled "grad_$name" || continue
  dir="$WORK/$name"
  train_inputs_for "$dir"
  grad_compare "grad $name" "$dir"
  grad_compare "grad $name replay" "$dir" --replay
done
# LoRA on every linear layer (MLA's four projections, o_proj, dense, routed and shared experts,
# lm_head), B non-zero, the base frozen; then trill merge scores as the base + adapter does
for name in f32 q_proj_nonorm; do
  sampled "lora_$name" || continue
  dir="$WORK/$name"
  targets=q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,gate_proj,up_proj,down_proj,lm_head
  [ "$name" = q_proj_nonorm ] && targets=q_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,gate_proj,down_proj
  lora_and_merge "$name" "$dir" "$targets"
done

# The generator (f32, the absorbed attention over the latent cache) on the sequences it samples:
# their log-probs as the reference computes them
generator_compare "generator f32" "$WORK/trill_k2-tiny"

echo "$passed passed, $failed failed"
report_sampled
[ "$failed" -eq 0 ]
