#!/usr/bin/env bash
# The GLM-4.5 family (glm4_moe) against its independent float64 PyTorch reference (glm_ref.py,
# written from the HF equations): the reference's self-check (autograd vs finite differences, the
# q/k/v biases included); `trill score` on checkpoints the reference writes (f32 with q/k/v biases
# and QK-norm, bf16 sharded, use_qk_norm false, attention_bias false, partial_rotary_factor 1.0
# and 0.25, tied embeddings, two dense layers and 16 experts top-3, 0 and 2 shared experts,
# norm_topk_prob false), every one with a random router correction bias that changes some
# routings, and on one `trill init --preset glm45-tiny` writes (its biases 0); full and
# LoRA gradients (grad_tool; LoRA on every linear: q/k/v/o_proj, dense, routed and shared
# gate/up/down_proj, lm_head) with and without router replay, the frozen correction bias without
# a gradient; trill merge; and the generator (f32) on the sequences it generates, with the
# trill-written model and with a reference-written one (its biases non-zero).
# make test runs a sample of the cases; make test-full (TRILL_TEST_FULL=1) runs them all. The
# Python steps run one by one in a single python3 (pystep.sh: pystep), which imports torch once
# for the whole script.
# Usage: parity_glm.sh PATH/TO/trill PATH/TO/grad_tool
set -euo pipefail
TRILL=$1
TOOL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3   # Debian's python3 with python3-torch (pystep.sh runs it)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-glm-XXXXXX")
source "$HERE/pystep.sh"
trap 'pystep_stop; rm -rf "$WORK"' EXIT
pystep_start
REF=glm_ref.py
source "$HERE/parity_lib.sh"
SAMPLE=" selfcheck-grad f32 bf16_sharded no_qk_norm no_attention_bias rope_full rope_quarter_gqa8_1 tied dense2_experts16_top3 shared0 shared2 nonorm_scale1 head_dim_absent glm45-tiny grad_f32 grad_rope_quarter_gqa8_1 lora_f32 "
source "$HERE/sample.sh"

if sampled selfcheck-grad; then
  if pystep -o "$WORK/selfcheck.txt" -E glm_ref.py selfcheck-grad; then pass "reference selfcheck-grad"
  else fail "reference selfcheck-grad" "$WORK/selfcheck.txt"; fi
fi

pystep -o /dev/null gen_inputs.py --vocab 97 --seed 11 --lengths 1,2,7,33,64,130 --out "$WORK/in.jsonl"
# name | make-model arguments (the base: 4 layers, layer 0 dense, hidden 64, 4 heads / 2 KV heads
# of 16 with q/k/v biases and QK-norm, RoPE on 8 of the 16 dims, 8 experts of width 32 top-2 and
# one shared, norm_topk_prob, routed_scaling_factor 2.5, rope_theta 1e6)
cases=(
  "f32|--dtype f32 --seed 1"
  "bf16_sharded|--dtype bf16 --seed 2 --shards 3"
  "no_qk_norm|--dtype f32 --seed 3 --set use_qk_norm=false"
  "no_attention_bias|--dtype bf16 --seed 4 --set attention_bias=false"
  "rope_full|--dtype f32 --seed 5 --set partial_rotary_factor=1.0"
  "rope_quarter_gqa8_1|--dtype f32 --seed 6 --set partial_rotary_factor=0.25 num_attention_heads=8 num_key_value_heads=1 head_dim=32"
  "tied|--dtype f32 --seed 7 --set tie_word_embeddings=true"
  "dense2_experts16_top3|--dtype f32 --seed 8 --set first_k_dense_replace=2 n_routed_experts=16 num_experts_per_tok=3 num_hidden_layers=5"
  "shared0|--dtype f32 --seed 9 --set n_shared_experts=0"
  "shared2|--dtype bf16 --seed 10 --set n_shared_experts=2"
  "nonorm_scale1|--dtype f32 --seed 11 --set norm_topk_prob=false routed_scaling_factor=1.0"
  "head_dim_absent|--dtype f32 --seed 12 --set head_dim= hidden_size=96 num_attention_heads=4 num_key_value_heads=2"
)
score_cases
# a checkpoint trill writes, read by the reference's own reader (which refuses any tensor or
# shape the config does not imply); the generator's model below
dir="$WORK/trill_glm45-tiny"
"$TRILL" init --out "$dir" --preset glm45-tiny --seed 9 --dtype f32 --set initializer_range=0.1 2>/dev/null
if sampled glm45-tiny; then score_and_compare "trill_written_glm45-tiny" "$dir"; fi

for name in f32 no_qk_norm no_attention_bias rope_quarter_gqa8_1 tied dense2_experts16_top3 shared0 nonorm_scale1; do
  sampled "grad_$name" || continue
  train_inputs "$name"
  grad_compare "grad $name" "$WORK/$name"
  [ "$name" = f32 ] && pystep -o /dev/null compare_grads.py "$WORK/f32.g.ref" --self-test
  grad_compare "grad $name replay" "$WORK/$name" --replay
done
# LoRA on every linear layer (q/k/v/o_proj, dense, routed and shared gate/up/down_proj, lm_head),
# B non-zero, the base (q/k/v biases included) frozen; then trill merge scores as the base +
# adapter does. The tied model's adapter leaves out lm_head (trill refuses to adapt a head tied to
# the embeddings).
for name in f32 tied shared2; do
  sampled "lora_$name" || continue
  train_inputs "$name"
  dir="$WORK/$name"
  targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head
  [ "$name" = tied ] && targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
  lora_and_merge "$name" "$dir" "$targets"
done

# The generator (f32, its KV cache) on the sequences it samples: their log-probs as the reference
# computes them
generator_compare "generator f32 (trill-written)" "$WORK/trill_glm45-tiny"
# ... and on a checkpoint the reference writes (trill init's q/k/v biases and correction biases
# are 0; these are not), with the tokenizer trill init wrote: its decode steps with the biases,
# partial RoPE at every position and the biased routing
dir="$WORK/gen_ref_written"
pystep -o /dev/null glm_ref.py make-model --out "$dir" --std 0.1 --dtype f32 --seed 12 --set vocab_size=128 bos_token_id=0 eos_token_id=0
cp "$WORK/trill_glm45-tiny/tokenizer.json" "$WORK/trill_glm45-tiny/tokenizer_config.json" "$dir/"
generator_compare "generator f32 (reference-written, biases)" "$dir"

echo "$passed passed, $failed failed"
report_sampled
[ "$failed" -eq 0 ]
