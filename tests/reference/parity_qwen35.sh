#!/usr/bin/env bash
# Qwen3.5-MoE (qwen3_5_moe: Qwen3_5MoeForConditionalGeneration, the language model in
# text_config and its tensors under model.language_model., a vision tower and mtp.* tensors to
# skip; qwen3_5_moe_text: Qwen3_5MoeForCausalLM, flat) against the float64 PyTorch reference
# qwen3next_ref.py (written from the HF equations; its selfcheck-grad proves a Qwen3.5 model whose
# in_proj_qkv / in_proj_z / in_proj_b / in_proj_a are Qwen3-Next's in_proj_qkvz / in_proj_ba rows
# permuted computes what that Qwen3-Next model does, the stacked experts' layout against HF's own
# computation, the composite equal to the flat model). `trill score` on checkpoints the reference
# writes (the base: layers 0 and 2 linear, 1 and 3 full, 2 key / 4 value heads of 8, RoPE on a
# quarter of each head via rope_parameters with mrope_section / mrope_interleaved to accept and
# ignore, every layer MoE: 8 experts of width 32 top-2 always renormalised, a shared expert and its
# gate, the routed experts stacked (mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj
# [E, H, I]); f32, bf16 sharded, the flat type, tied embeddings (set at the top level and in
# text_config; only in text_config; the top level's false overriding text_config's true), mtp.*,
# YaRN in rope_parameters,
# and more shapes), sequences up to 300 tokens; full and LoRA gradients (grad_tool; per-expert
# names <prefix>layers.L.mlp.experts.E.{gate,up,down}_proj as trill's; LoRA on q/k/v/o_proj,
# in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj, the routed (per expert) and shared
# gate/up/down_proj, shared_expert_gate, lm_head but on a tied model) with and without router
# replay; trill merge; an adapter in PEFT's target_parameters form for the stacked experts (trill
# merge, and trill's load + save round trip read back by the reference); the generator on a
# reference-written qwen3_5_moe model.
# make test runs a sample of the cases; make test-full (TRILL_TEST_FULL=1) runs them all. The
# reference's selfcheck-grad (Qwen3.5's part included) runs in parity_qwen3next.sh's sample; here
# only in the full run.
# Usage: parity_qwen35.sh PATH/TO/trill PATH/TO/grad_tool
set -euo pipefail
TRILL=$1
TOOL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3   # Debian's python3 with python3-torch (pystep.sh runs it)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-qwen35-XXXXXX")
source "$HERE/pystep.sh"
trap 'pystep_stop; rm -rf "$WORK"' EXIT
pystep_start
REF=qwen3next_ref.py
source "$HERE/parity_lib.sh"
SAMPLE=" q35_f32 q35_bf16_sharded q35_text_f32 q35_tied q35_tied_text_only q35_mtp q35_yarn grad_q35_f32 grad_q35_text_f32 grad_q35_long lora_q35_f32 q35_peft_params "
source "$HERE/sample.sh"

# gen_train_inputs.py reads the MoE layers by model_type and knows no Qwen3.5 type: its
# --replay-model is the model's routing shape as a qwen3_next config (replay-config), on which
# alone its records depend.
train_inputs_for() { # dir [lengths [seed]]
  [ -f "$1.in.jsonl" ] && return 0
  pystep -o /dev/null "$REF" replay-config --model "$1" --out "$1.replaycfg"
  pystep -o /dev/null gen_train_inputs.py --vocab 97 --seed "${3:-5}" --lengths "${2:-2,9,33,70}" --out "$1.in.jsonl" --replay-model "$1.replaycfg"
}

if sampled selfcheck-grad; then
  if pystep -o "$WORK/selfcheck.txt" -E qwen3next_ref.py selfcheck-grad; then pass "reference selfcheck-grad"
  else fail "reference selfcheck-grad" "$WORK/selfcheck.txt"; fi
fi

# 300 tokens: the chunked delta rule's 5 chunks of 64, the last one partial
pystep -o /dev/null gen_inputs.py --vocab 97 --seed 11 --lengths 1,2,7,33,64,130,300 --out "$WORK/in.jsonl"
# name | make-model arguments (--arch qwen3_5_moe: `--set KEY=VALUE` sets text_config's KEY,
# tie_word_embeddings at the top level too; `--set top.KEY=VALUE` a top-level key; `KEY=` leaves
# KEY out: HF's default)
# YaRN in rope_parameters (factor 4 over an original context of 64, on 16 rotated dims of 32)
Q35_YARN='rope_parameters={"rope_type":"yarn","rope_theta":10000.0,"partial_rotary_factor":0.5,"factor":4.0,"original_max_position_embeddings":64,"mrope_section":[11,11,10],"mrope_interleaved":true}'
Q35_ROPE_HALF='rope_parameters={"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":0.5,"mrope_section":[11,11,10],"mrope_interleaved":true}'
cases=(
  "q35_f32|--arch qwen3_5_moe --dtype f32 --seed 1"
  "q35_bf16_sharded|--arch qwen3_5_moe --dtype bf16 --seed 2 --shards 3"
  "q35_text_f32|--arch qwen3_5_moe_text --dtype f32 --seed 3"
  "q35_tied|--arch qwen3_5_moe --dtype f32 --seed 4 --set tie_word_embeddings=true"
  "q35_tied_text_only|--arch qwen3_5_moe --dtype f32 --seed 5 --set tie_word_embeddings=true top.tie_word_embeddings="
  "q35_top_untied|--arch qwen3_5_moe --dtype f32 --seed 6 --set tie_word_embeddings=true top.tie_word_embeddings=false"
  "q35_text_tied|--arch qwen3_5_moe_text --dtype f32 --seed 7 --set tie_word_embeddings=true"
  "q35_mtp|--arch qwen3_5_moe --dtype bf16 --seed 8 --shards 2 --mtp"
  "q35_attention_bias|--arch qwen3_5_moe --dtype f32 --seed 9 --set attention_bias=true"
  "q35_linear_heavy|--arch qwen3_5_moe --dtype f32 --seed 10 --set layer_types=[\"linear_attention\",\"linear_attention\",\"full_attention\",\"linear_attention\"]"
  "q35_r1|--arch qwen3_5_moe --dtype f32 --seed 11 --set linear_num_value_heads=2"
  "q35_r4_dk16|--arch qwen3_5_moe_text --dtype bf16 --seed 12 --set linear_num_key_heads=1 linear_key_head_dim=16 linear_num_value_heads=4 linear_value_head_dim=8"
  "q35_hd32_rope_half|--arch qwen3_5_moe --dtype bf16 --seed 13 --set head_dim=32 $Q35_ROPE_HALF"
  "q35_experts16_top3|--arch qwen3_5_moe --dtype f32 --seed 14 --set num_experts=16 num_experts_per_tok=3 num_hidden_layers=5"
  "q35_hf_defaults|--arch qwen3_5_moe_text --dtype f32 --seed 15 --set head_dim= full_attention_interval="
  "q35_ignored_fields|--arch qwen3_5_moe_text --dtype f32 --seed 16 --set mlp_only_layers=[0] decoder_sparse_step=2 norm_topk_prob=false intermediate_size=7"
  "q35_long|--arch qwen3_5_moe --dtype f32 --seed 17 --set full_attention_interval=4"
  "q35_yarn|--arch qwen3_5_moe --dtype f32 --seed 18 --set head_dim=32 $Q35_YARN"
)
score_cases

for name in q35_f32 q35_text_f32 q35_tied q35_top_untied q35_linear_heavy q35_r4_dk16 q35_attention_bias q35_yarn; do
  sampled "grad_$name" || continue
  train_inputs "$name"
  grad_compare "grad $name" "$WORK/$name"
  grad_compare "grad $name replay" "$WORK/$name" --replay
done
# long sequences through the backward too: 257 and 300 tokens (the chunks' boundaries, a partial
# last chunk), three linear layers and one full
if sampled grad_q35_long; then
  model q35_long
  train_inputs_for "$WORK/q35_long" 3,257,300 6
  grad_compare "grad q35_long" "$WORK/q35_long"
  grad_compare "grad q35_long replay" "$WORK/q35_long" --replay
fi
# LoRA on every target (q/k/v/o_proj; in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
# every routed expert's (per expert) and the shared expert's gate/up/down_proj;
# shared_expert_gate; lm_head), B non-zero, the base frozen; then trill merge (the experts stacked
# back) scores as the base + adapter does. q35_tied: every target but lm_head (trill refuses an
# adapter on a tied lm_head), the merge written tied.
Q35_TARGETS=q_proj,k_proj,v_proj,o_proj,in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,out_proj,gate_proj,up_proj,down_proj,shared_expert_gate
for name in q35_f32 q35_text_f32 q35_tied; do
  sampled "lora_$name" || continue
  train_inputs "$name"
  targets=$Q35_TARGETS,lm_head
  [ "$name" = q35_tied ] && targets=$Q35_TARGETS
  lora_and_merge "$name" "$WORK/$name" "$targets"
done

# The form PEFT writes for the stacked experts (target_parameters: a ParamWrapper on
# mlp.experts.gate_up_proj [E, 2I, H], not transposed: lora_A [r*E, H], lora_B [2I, r*E], one A
# shared by gate (B's rows [0, I)) and up (rows [I, 2I)); and on mlp.experts.down_proj; q_proj and
# o_proj as modules) on qwen3_5_moe (names under model.language_model.): trill merge scored as the
# reference scores the base + adapter; then the adapter as trill loads it and writes it back
# (grad_tool --save-adapter: gate_up_proj as rank 2r block-diagonal, gate in rank slots [0, r) and
# rows [0, I), up in [r, 2r) and [I, 2I); rank_pattern / alpha_pattern 2r / 2 alpha) must be the
# same function to 1e-9 in the reference.
if sampled q35_peft_params; then peft_params_case q35_peft_params q35_f32; fi

# The generator (f32: the linear layers' conv and recurrent state, the full layers' KV cache) on
# the sequences it samples from a reference-written qwen3_5_moe model, with the tokenizer
# `trill init --preset qwen3next-tiny` writes: their log-probs as the reference computes them
tok="$WORK/trill_qwen3next-tiny"
"$TRILL" init --out "$tok" --preset qwen3next-tiny --seed 9 --dtype f32 2>/dev/null
dir="$WORK/gen_ref_written_q35"
pystep -o /dev/null "$REF" make-model --arch qwen3_5_moe --out "$dir" --std 0.1 --dtype f32 --seed 12 --set vocab_size=128 bos_token_id=0 eos_token_id=0
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$dir/"
generator_compare "generator f32 (reference-written qwen3_5_moe)" "$dir"

echo "$passed passed, $failed failed"
report_sampled
[ "$failed" -eq 0 ]
