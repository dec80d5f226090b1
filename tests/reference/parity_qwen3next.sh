#!/usr/bin/env bash
# The Qwen3-Next family (qwen3_next) against its independent float64 PyTorch reference
# (qwen3next_ref.py, written from the HF equations): the reference's self-check (autograd vs finite
# differences through the Gated DeltaNet's conv, l2norm, decay, beta and gated norm and the gated
# attention, the shared expert and its gate, replay, LoRA on every target; HF's chunked delta rule
# equal to the recurrence); `trill score` on checkpoints the reference writes (f32 and bf16
# sharded: layers 0 and 2 linear, 1 and 3 full, 2 key / 4 value heads of 8, RoPE on a quarter of
# each head, 8 experts of width 32 top-2 and a shared expert, zero-centred norms; attention_bias;
# every layer linear but one; nv == nk; 4 value heads per key head with dk 16 != dv 8; a dense
# layer by mlp_only_layers and by decoder_sparse_step 2; tied embeddings; head_dim 32 with RoPE on
# half; 16 experts top-3; norm_topk_prob false; mtp.* tensors to ignore; HF's defaults for
# head_dim (256), partial_rotary_factor (0.25) and full_attention_interval (4); YaRN on 16 rotated
# dims of 32, factor 4 over an original context of 64), every one over
# sequences up to 300 tokens (5 chunks of 64), and on one `trill init --preset qwen3next-tiny`
# writes; full and LoRA gradients (grad_tool; LoRA on q/k/v/o_proj, in_proj_qkvz, in_proj_ba,
# out_proj, the dense, routed and shared gate/up/down_proj, shared_expert_gate, lm_head) with and
# without router replay, one case over 257- and 300-token sequences; trill merge; and the
# generator (f32, its recurrent state and KV cache) on the sequences it generates, with the
# trill-written model and with a reference-written one.
# The reference's selfcheck-grad here also covers Qwen3.5-MoE (qwen3_5_moe, qwen3_5_moe_text), whose
# trill cases are parity_qwen35.sh's.
# make test runs a sample of the cases; make test-full (TRILL_TEST_FULL=1) runs them all. The
# Python steps run one by one in a single python3 (pystep.sh: pystep), which imports torch once
# for the whole script.
# Usage: parity_qwen3next.sh PATH/TO/trill PATH/TO/grad_tool
set -euo pipefail
TRILL=$1
TOOL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3   # Debian's python3 with python3-torch (pystep.sh runs it)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-qwen3next-XXXXXX")
source "$HERE/pystep.sh"
trap 'pystep_stop; rm -rf "$WORK"' EXIT
pystep_start
REF=qwen3next_ref.py
source "$HERE/parity_lib.sh"
SAMPLE=" selfcheck-grad f32 bf16_sharded linear_heavy r1 dense0 tied hd32_rope_half mtp yarn qwen3next-tiny grad_f32 grad_linear_heavy grad_long lora_f32 "
source "$HERE/sample.sh"

if sampled selfcheck-grad; then
  if pystep -o "$WORK/selfcheck.txt" -E qwen3next_ref.py selfcheck-grad; then pass "reference selfcheck-grad"
  else fail "reference selfcheck-grad" "$WORK/selfcheck.txt"; fi
fi

# 300 tokens: the chunked delta rule's 5 chunks of 64, the last one partial
pystep -o /dev/null gen_inputs.py --vocab 97 --seed 11 --lengths 1,2,7,33,64,130,300 --out "$WORK/in.jsonl"
# name | make-model arguments (the base: 4 layers, hidden 64, full_attention_interval 2 (layers 0
# and 2 linear, 1 and 3 full); full: 4 heads / 2 KV heads of 16, q_proj with the output gate,
# RoPE on 4 of the 16 dims; linear: 2 key heads of 8, 4 value heads of 8, conv kernel 4; every
# layer MoE: 8 experts of width 32 top-2, norm_topk_prob, a shared expert of width 48 and its gate;
# rope_theta 1e4; `KEY=` leaves KEY out of config.json: HF's default)
cases=(
  "f32|--dtype f32 --seed 1"
  "bf16_sharded|--dtype bf16 --seed 2 --shards 3"
  "attention_bias|--dtype f32 --seed 3 --set attention_bias=true"
  "linear_heavy|--dtype f32 --seed 4 --set layer_types=[\"linear_attention\",\"linear_attention\",\"full_attention\",\"linear_attention\"]"
  "r1|--dtype f32 --seed 5 --set linear_num_value_heads=2"
  "r4_dk16|--dtype bf16 --seed 6 --set linear_num_key_heads=1 linear_key_head_dim=16 linear_num_value_heads=4 linear_value_head_dim=8"
  "dense0|--dtype f32 --seed 7 --set mlp_only_layers=[0]"
  "sparse_step2|--dtype f32 --seed 8 --set decoder_sparse_step=2"
  "tied|--dtype f32 --seed 9 --set tie_word_embeddings=true"
  "hd32_rope_half|--dtype bf16 --seed 10 --set head_dim=32 partial_rotary_factor=0.5"
  "experts16_top3|--dtype f32 --seed 11 --set num_experts=16 num_experts_per_tok=3 num_hidden_layers=5"
  "nonorm|--dtype f32 --seed 12 --set norm_topk_prob=false"
  "mtp|--dtype bf16 --seed 13 --shards 2 --mtp"
  "hf_defaults|--dtype f32 --seed 14 --set head_dim= partial_rotary_factor= full_attention_interval="
  "long|--dtype f32 --seed 15 --set full_attention_interval=4"
  "yarn|--dtype f32 --seed 16 --set head_dim=32 partial_rotary_factor=0.5 rope_scaling={\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":64}"
)
score_cases
# a checkpoint trill writes, read by the reference's own reader (which refuses any tensor or
# shape the config does not imply); the generator's model below
dir="$WORK/trill_qwen3next-tiny"
"$TRILL" init --out "$dir" --preset qwen3next-tiny --seed 9 --dtype f32 --set initializer_range=0.1 2>/dev/null
if sampled qwen3next-tiny; then score_and_compare "trill_written_qwen3next-tiny" "$dir"; fi

for name in f32 linear_heavy r1 dense0 sparse_step2 tied attention_bias yarn; do
  sampled "grad_$name" || continue
  train_inputs "$name"
  grad_compare "grad $name" "$WORK/$name"
  [ "$name" = f32 ] && pystep -o /dev/null compare_grads.py "$WORK/f32.g.ref" --self-test
  grad_compare "grad $name replay" "$WORK/$name" --replay
done
# long sequences through the backward too: 257 and 300 tokens (the chunks' boundaries, a partial
# last chunk), three linear layers and one full
if sampled grad_long; then
  model long
  pystep -o /dev/null gen_train_inputs.py --vocab 97 --seed 6 --lengths 3,257,300 --out "$WORK/long.in.jsonl" --replay-model "$WORK/long"
  grad_compare "grad long" "$WORK/long"
  grad_compare "grad long replay" "$WORK/long" --replay
fi
# LoRA on every target (q/k/v/o_proj; in_proj_qkvz, in_proj_ba, out_proj; the dense MLP's, every
# routed expert's and the shared expert's gate/up/down_proj; shared_expert_gate; lm_head), B
# non-zero, the base (conv1d, A_log, dt_bias, norms, routers) frozen; then trill merge scores as
# the base + adapter does.
for name in f32 dense0; do
  sampled "lora_$name" || continue
  train_inputs "$name"
  lora_and_merge "$name" "$WORK/$name" q_proj,k_proj,v_proj,o_proj,in_proj_qkvz,in_proj_ba,out_proj,gate_proj,up_proj,down_proj,shared_expert_gate,lm_head
done

# The generator (f32: the linear layers' conv and recurrent state, the full layers' KV cache) on
# the sequences it samples: their log-probs as the reference computes them
generator_compare "generator f32 (trill-written)" "$dir"
# ... after a 300-character prompt (5 chunks of 64 positions) prefilled 100 rows a step: the
# linear layers' state carried across steps, then decoded from
long_prompt=$(for i in $(seq 1 30); do printf '%d+%d=%d;' $((i * 7 % 10)) $((i * 3 % 10)) $(((i * 7 % 10) + (i * 3 % 10))); done)
long_prompt=${long_prompt:0:300}
generator_compare "generator f32 (trill-written, 300-token prompt)" "$dir" "$long_prompt" --max-batch-tokens 100
# ... and on a checkpoint the reference writes, with the tokenizer trill init wrote
dir="$WORK/gen_ref_written"
pystep -o /dev/null qwen3next_ref.py make-model --out "$dir" --std 0.1 --dtype f32 --seed 12 --set vocab_size=128 bos_token_id=0 eos_token_id=0
cp "$WORK/trill_qwen3next-tiny/tokenizer.json" "$WORK/trill_qwen3next-tiny/tokenizer_config.json" "$dir/"
generator_compare "generator f32 (reference-written)" "$dir"

echo "$passed passed, $failed failed"
report_sampled
[ "$failed" -eq 0 ]
