#!/usr/bin/env bash
# Whole-model gradient parity: trill's backward (grad_tool) against PyTorch autograd on the
# independent float64 reference (tests/reference/qwen3_ref.py), on checkpoints (and PEFT LoRA
# adapters) the reference writes: full-parameter gradients, and adapter gradients with the
# base frozen. loss = sum of random per-token coefficients * log-probs (some masked), so the check
# covers cross-entropy and policy-gradient losses alike; with and without router replay.
# make test runs a sample of the cases (an MoE f32 base with and without replay, tied embeddings with
# GQA and sparse steps, LoRA on a bf16 base); make test-full (TRILL_TEST_FULL=1) runs them all.
# The Python steps run one by one in a single python3 (tests/reference/pystep.sh: pystep), which
# imports torch once for the whole script rather than once per step (~2 s of CPU each).
# Usage: grad_parity.sh PATH/TO/grad_tool PATH/TO/trill
set -euo pipefail
TOOL=$1
TRILL=$2
REF=$(cd "$(dirname "$0")/../reference" && pwd)
PY=/usr/bin/python3   # Debian's python3 with python3-torch (pystep.sh runs it)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-grad-XXXXXX")
source "$REF/pystep.sh"
trap 'pystep_stop; rm -rf "$WORK"' EXIT
pystep_start
passed=0 failed=0
SAMPLE=" moe_f32_norm moe_tied_step2_gqa4 lora_bf16_all "
source "$REF/sample.sh"

pystep -o /dev/null qwen3_ref.py selfcheck-grad   # the reference's own autograd vs finite differences

# name | make-model arguments
cases=(
  "moe_f32_norm|--dtype f32 --seed 1"
  "moe_bf16_nonorm|--dtype bf16 --seed 2 --set norm_topk_prob=false"
  "moe_tied_step2_gqa4|--dtype f32 --seed 3 --set tie_word_embeddings=true decoder_sparse_step=2 mlp_only_layers=[] num_attention_heads=8 num_key_value_heads=2 head_dim=16"
  "dense_bf16|--dtype bf16 --seed 4 --set model_type=qwen3"
)
first=1
for c in "${cases[@]}"; do
  name=${c%%|*}
  sampled "$name" || continue
  dir="$WORK/$name"
  # shellcheck disable=SC2086
  pystep -o /dev/null qwen3_ref.py make-model --out "$dir" --std 0.1 ${c#*|}
  pystep -o /dev/null gen_train_inputs.py --vocab 97 --seed 5 --lengths 2,9,33,70 --out "$dir.in.jsonl" --replay-model "$dir"
  for mode in plain replay; do
    flag=""
    [ "$mode" = replay ] && flag="--replay"
    [ "$name" = dense_bf16 ] && [ "$mode" = replay ] && continue   # no MoE layers to replay
    pystep -o /dev/null qwen3_ref.py grad --model "$dir" --input "$dir.in.jsonl" --output "$dir.$mode.ref.safetensors" $flag
    "$TOOL" "$dir" "$dir.in.jsonl" "$dir.$mode.ours.safetensors" $flag >/dev/null
    if [ $first = 1 ]; then   # the comparer must catch a 1% error in one tensor
      pystep -o /dev/null compare_grads.py "$dir.$mode.ref.safetensors" --self-test
      first=0
    fi
    if pystep -o "$dir.$mode.txt" compare_grads.py "$dir.$mode.ref.safetensors" "$dir.$mode.ours.safetensors" --rtol 1e-3; then
      echo "PASS $name $mode: $(grep 'overall worst' "$dir.$mode.txt")"
      passed=$((passed + 1))
    else
      echo "FAIL $name $mode"; cat "$dir.$mode.txt"; failed=$((failed + 1))
    fi
  done
done
# Five AdamW steps (weight decay, clipping) on the same loss: trainable values within 1e-4 relative.
adamw_check() { # name model-dir [--adapter DIR]
  local name=$1 dir=$2; shift 2
  local opts=(--steps 5 --lr 1e-3 --weight-decay 0.1 --clip 5)
  pystep -o /dev/null qwen3_ref.py adamw-steps --model "$dir" "$@" --input "$dir.in.jsonl" --steps 5 --lr 1e-3 \
    --weight-decay 0.1 --betas 0.9,0.95 --eps 1e-8 --clip 5 --output "$dir.adamw.ref.safetensors"
  "$TOOL" "$dir" "$dir.in.jsonl" "$dir.adamw.ours.safetensors" "$@" "${opts[@]}" --beta2 0.95 2>/dev/null >/dev/null
  if pystep -o "$dir.adamw.txt" compare_grads.py "$dir.adamw.ref.safetensors" "$dir.adamw.ours.safetensors" --rtol 1e-4; then
    echo "PASS $name adamw x5: $(grep 'overall worst' "$dir.adamw.txt")"
    passed=$((passed + 1))
  else
    echo "FAIL $name adamw x5"; cat "$dir.adamw.txt"; failed=$((failed + 1))
  fi
}
adamw_check moe_f32_norm "$WORK/moe_f32_norm"

# LoRA (PEFT adapters written by the reference, B non-zero): adapter gradients only, base frozen.
# name | make-model arguments | make-adapter arguments | grad flags
lora_cases=(
  "lora_bf16_all|--dtype bf16 --seed 6|--rank 4 --alpha 8 --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head|"
  "lora_f32_rslora_replay|--dtype f32 --seed 7 --set norm_topk_prob=false|--rank 3 --alpha 6 --rslora --targets q_proj,v_proj,gate_proj,down_proj|--replay"
)
for c in "${lora_cases[@]}"; do
  IFS='|' read -r name model_args adapter_args flags <<<"$c"
  sampled "$name" || continue
  dir="$WORK/$name"
  # shellcheck disable=SC2086
  pystep -o /dev/null qwen3_ref.py make-model --out "$dir" --std 0.1 $model_args
  # shellcheck disable=SC2086
  pystep -o /dev/null qwen3_ref.py make-adapter --model "$dir" --out "$dir.adapter" --seed 9 $adapter_args
  pystep -o /dev/null gen_train_inputs.py --vocab 97 --seed 5 --lengths 2,9,33,70 --out "$dir.in.jsonl" --replay-model "$dir"
  # shellcheck disable=SC2086
  pystep -o /dev/null qwen3_ref.py grad --model "$dir" --adapter "$dir.adapter" --input "$dir.in.jsonl" --output "$dir.ref.safetensors" $flags
  # shellcheck disable=SC2086
  "$TOOL" "$dir" "$dir.in.jsonl" "$dir.ours.safetensors" --adapter "$dir.adapter" $flags >/dev/null
  if pystep -o "$dir.txt" compare_grads.py "$dir.ref.safetensors" "$dir.ours.safetensors" --rtol 1e-3; then
    echo "PASS $name: $(grep 'overall worst' "$dir.txt")"
    passed=$((passed + 1))
  else
    echo "FAIL $name"; cat "$dir.txt"; failed=$((failed + 1))
  fi
  adamw_check "$name" "$dir" --adapter "$dir.adapter"
  # trill merge: the merged checkpoint scores as the reference scores base + adapter
  pystep -o /dev/null gen_inputs.py --vocab 97 --seed 2 --lengths 3,40 --out "$dir.score.jsonl"
  "$TRILL" merge --model "$dir" --adapter "$dir.adapter" --out "$dir.merged" --dtype f32 2>/dev/null
  pystep -o /dev/null qwen3_ref.py forward --model "$dir" --adapter "$dir.adapter" --input "$dir.score.jsonl" --output "$dir.lora.ref.jsonl"
  "$TRILL" score --model "$dir.merged" --input "$dir.score.jsonl" --output "$dir.merged.jsonl"
  if pystep -o "$dir.merge.txt" compare.py "$dir.lora.ref.jsonl" "$dir.merged.jsonl" --atol 1e-4; then
    echo "PASS $name merge: $(grep 'max |d logprob|' "$dir.merge.txt")"
    passed=$((passed + 1))
  else
    echo "FAIL $name merge"; cat "$dir.merge.txt"; failed=$((failed + 1))
  fi
done

echo "$passed passed, $failed failed"
report_sampled
[ "$failed" -eq 0 ]
