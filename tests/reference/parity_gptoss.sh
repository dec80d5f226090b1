#!/usr/bin/env bash
# The gpt-oss family (gpt_oss) against its independent float64 PyTorch reference (gptoss_ref.py,
# written from the HF equations): the reference's self-check (autograd vs finite differences: the
# sinks, every bias, the router and its bias, the clamped swiglu binding and not, per-expert LoRA,
# replay; the MXFP4 dequantization on a hand-made block); `trill score` on checkpoints the
# reference writes (f32 and bf16 sharded with q/k/v/o biases, sinks, alternating sliding / full
# layers with a window of 4 and YaRN stretching the test's lengths; attention_bias false; a
# swiglu_limit of 0.5 whose clamps cut about a third of the gate and half the up values; every
# layer full; a window of one position; rope_scaling absent: HF's default YaRN, factor 32 over
# 4096; GQA 8/1 with head_dim 32; 16 experts top-3; the experts in MXFP4; tied embeddings;
# head_dim null), and on one `trill init --preset gptoss-tiny` writes; full and LoRA gradients
# (grad_tool; the stacked experts compared per expert under trill's names; LoRA on q/k/v/o_proj,
# every expert's gate/up/down_proj, lm_head) with and without router replay; trill merge; an
# adapter in PEFT's target_parameters form for the stacked experts (trill merge, and trill's
# load + save round trip read back by the reference); and the
# generator (f32) on the sequences it generates, with the trill-written model and with a
# reference-written one.
# make test runs a sample of the cases; make test-full (TRILL_TEST_FULL=1) runs them all. The
# Python steps run one by one in a single python3 (pystep.sh: pystep), which imports torch once
# for the whole script.
# Usage: parity_gptoss.sh PATH/TO/trill PATH/TO/grad_tool
set -euo pipefail
TRILL=$1
TOOL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3   # Debian's python3 with python3-torch (pystep.sh runs it)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-gptoss-XXXXXX")
source "$HERE/pystep.sh"
trap 'pystep_stop; rm -rf "$WORK"' EXIT
pystep_start
REF=gptoss_ref.py
source "$HERE/parity_lib.sh"
SAMPLE=" selfcheck-grad f32 no_attention_bias tight_clamp all_full window1 yarn_default mxfp4 gptoss-tiny grad_f32 grad_tight_clamp grad_all_full lora_f32 peft_params "
source "$HERE/sample.sh"

if sampled selfcheck-grad; then
  if pystep -o "$WORK/selfcheck.txt" -E gptoss_ref.py selfcheck-grad; then pass "reference selfcheck-grad"
  else fail "reference selfcheck-grad" "$WORK/selfcheck.txt"; fi
fi

pystep -o /dev/null gen_inputs.py --vocab 97 --seed 11 --lengths 1,2,7,33,64,130 --out "$WORK/in.jsonl"
# name | make-model arguments (the base: 4 layers, hidden 64, 4 heads / 2 KV heads of 16 with
# q/k/v/o biases and sinks, layers 0 and 2 sliding (window 4), 1 and 3 full, YaRN factor 4 over
# 16 original positions, 8 experts of width 32 top-2 with biases, swiglu_limit 7, rope_theta 1.5e5)
cases=(
  "f32|--dtype f32 --seed 1"
  "bf16_sharded|--dtype bf16 --seed 2 --shards 3"
  "no_attention_bias|--dtype f32 --seed 3 --set attention_bias=false"
  "tight_clamp|--dtype f32 --seed 4 --set swiglu_limit=0.5"
  "all_full|--dtype f32 --seed 5 --set layer_types=[\"full_attention\",\"full_attention\",\"full_attention\",\"full_attention\"]"
  "window1|--dtype f32 --seed 6 --set sliding_window=1"
  "yarn_default|--dtype f32 --seed 7 --set rope_scaling="
  "gqa8_1|--dtype bf16 --seed 8 --set num_attention_heads=8 num_key_value_heads=1 head_dim=32"
  "top3_experts16|--dtype f32 --seed 9 --set num_local_experts=16 num_experts_per_tok=3 num_hidden_layers=5"
  "mxfp4|--dtype bf16 --seed 10 --mxfp4"
  "tied|--dtype f32 --seed 11 --set tie_word_embeddings=true"
  "head_dim_null|--dtype f32 --seed 12 --set head_dim=null hidden_size=96 num_attention_heads=4 num_key_value_heads=2"
)
score_cases
# a checkpoint trill writes, read by the reference's own reader (which refuses any tensor or
# shape the config does not imply); the generator's model below
dir="$WORK/trill_gptoss-tiny"
"$TRILL" init --out "$dir" --preset gptoss-tiny --seed 9 --dtype f32 --set initializer_range=0.1 2>/dev/null
if sampled gptoss-tiny; then score_and_compare "trill_written_gptoss-tiny" "$dir"; fi

for name in f32 tight_clamp no_attention_bias all_full tied top3_experts16; do
  sampled "grad_$name" || continue
  train_inputs "$name"
  grad_compare "grad $name" "$WORK/$name"
  [ "$name" = f32 ] && pystep -o /dev/null compare_grads.py "$WORK/f32.g.ref" --self-test
  grad_compare "grad $name replay" "$WORK/$name" --replay
done
# LoRA on q/k/v/o_proj, every expert's gate/up/down_proj (trill's per-expert modules) and lm_head,
# B non-zero, the base (biases and sinks included) frozen; then trill merge scores as the base +
# adapter does.
for name in f32 tight_clamp; do
  sampled "lora_$name" || continue
  train_inputs "$name"
  lora_and_merge "$name" "$WORK/$name" q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head
done
# The form PEFT writes for the stacked experts (target_parameters: a ParamWrapper on
# mlp.experts.gate_up_proj, one A shared by gate and up, and on mlp.experts.down_proj; q_proj and
# o_proj as modules): trill merge scored as the reference scores the base + adapter; then the
# adapter as trill loads it and writes it back (grad_tool --save-adapter: gate_up_proj as rank 2r
# block-diagonal, rank_pattern / alpha_pattern 2r / 2 alpha) must be the same function to 1e-9 in
# the reference.
if sampled peft_params; then peft_params_case peft_params f32; fi

# The generator (f32, its KV cache) on the sequences it samples: their log-probs as the reference
# computes them (sliding layers of window 8 over 46 positions, the sinks, default YaRN)
generator_compare "generator f32 (trill-written)" "$dir"
# ... and on a checkpoint the reference writes (window 4, YaRN over 16 original positions), with
# the tokenizer trill init wrote
dir="$WORK/gen_ref_written"
pystep -o /dev/null gptoss_ref.py make-model --out "$dir" --std 0.1 --dtype f32 --seed 12 --set vocab_size=128 bos_token_id=0 eos_token_id=0
cp "$WORK/trill_gptoss-tiny/tokenizer.json" "$WORK/trill_gptoss-tiny/tokenizer_config.json" "$dir/"
generator_compare "generator f32 (reference-written)" "$dir"

echo "$passed passed, $failed failed"
report_sampled
[ "$failed" -eq 0 ]
