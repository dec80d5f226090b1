#!/usr/bin/env bash
# `trill sft` learns a task that needs the prompt, with LoRA and with full fine-tuning: the
# completion " ok <first letter of the word>." is 7 tokens with EOS, of which only the letter (one
# of 8, uniform) depends on the prompt, so a model that ignores the prompt cannot get below
# log(8)/7 = 0.297 nats per token of held-out loss (a character unigram gets ~1.9); both runs must
# reach 0.15. The outputs are usable (the adapter merges, the full model scores), an interrupted
# run resumes bit-identically, and bad settings are refused. The settings are trill train's keys
# (model, run_dir, data.*, trainer.*, sft.*), on the command line or in a YAML file.
# make test-full (TRILL_TEST_FULL=1) also runs the bf16 trainer's LoRA run.
# Usage: test_sft.sh PATH/TO/trill
set -euo pipefail
TRILL=$1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-sft-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0
check() { if "${@:2}"; then passed=$((passed + 1)); else echo "FAIL: $1"; failed=$((failed + 1)); fi; }
# sft LOG ARGS...: trill sft exits 0 with no sanitizer report in LOG (a timeout is a failure)
sft() {
  local log=$1 rc=0
  shift
  timeout -k 5 "${TRILL_TEST_LIMIT_S:-600}" "$TRILL" sft "$@" 2>"$log" || rc=$?
  check "trill sft $* exits 0 (got $rc)" test "$rc" -eq 0
  check "no sanitizer report in $log" sh -c "! grep -nE 'Sanitizer|runtime error:' '$log'"
}

# The task: "Q: <word>\nA:" -> " ok <first letter of word>." (needs attention to the prompt).
/usr/bin/python3 - "$WORK" <<'PY'
import json, random, sys
r = random.Random(0)
def ex():
    w = ''.join(r.choice('abcdefgh') for _ in range(r.randint(3, 8)))
    return {"question": "Q: " + w + "\nA:", "answer": " ok " + w[0] + "."}
for name, n in (("train", 400), ("heldout", 50)):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for _ in range(n): f.write(json.dumps(ex()) + "\n")
PY
"$TRILL" init --out "$WORK/model" --preset tiny --seed 1 2>/dev/null

eval_loss() { sed -n 's/^eval loss \([0-9.]*\).*/\1/p' "$1" | tail -1; }
below() { awk -v x="$1" -v t="$2" 'BEGIN { exit !(x != "" && x < t) }'; }

# LoRA on a random base needs the head adapted too (its frozen random lm_head caps how sure it can be)
# (6 epochs: seeds 0-4 reach 0.029-0.072, one thread, AVX-512; 8 epochs reach 0.022)
sft "$WORK/lora.log" --model "$WORK/model" --data "$WORK/train.jsonl" --eval "$WORK/heldout.jsonl" --out "$WORK/lora" --lora \
  data.prompt_field=question data.completion_field=answer trainer.lr=3e-3 trainer.schedule=cosine trainer.micro_batch_tokens=512 \
  sft.epochs=6 trainer.lora.rank=16 trainer.lora.targets=q,k,v,o,gate,up,down,lm_head
lora_loss=$(eval_loss "$WORK/lora.log")
echo "LoRA: held-out loss $lora_loss after $(grep -c '^step [0-9]*/' "$WORK/lora.log") steps (threshold 0.15; ignoring the prompt: >= 0.297)"
check "LoRA held-out loss below 0.15" below "$lora_loss" 0.15
check "adapter written" test -s "$WORK/lora/adapter_model.safetensors"
check "adapter merges" "$TRILL" merge --model "$WORK/model" --adapter "$WORK/lora" --out "$WORK/merged" 2>/dev/null

# the bf16 trainer (bf16 operands, fp32 sums) learns as well: the same run, the same threshold
if [ "${TRILL_TEST_FULL:-0}" = 1 ]; then
sft "$WORK/lora16.log" --model "$WORK/model" --data "$WORK/train.jsonl" --eval "$WORK/heldout.jsonl" --out "$WORK/lora16" --lora \
  data.prompt_field=question data.completion_field=answer trainer.lr=3e-3 trainer.schedule=cosine trainer.micro_batch_tokens=512 \
  sft.epochs=6 trainer.lora.rank=16 trainer.lora.targets=q,k,v,o,gate,up,down,lm_head trainer.precision=bf16
lora16_loss=$(eval_loss "$WORK/lora16.log")
echo "LoRA, bf16 trainer: held-out loss $lora16_loss (fp32: $lora_loss; threshold 0.15)"
check "bf16 LoRA held-out loss below 0.15" below "$lora16_loss" 0.15
fi

# the same run from a YAML file (the keys trill train reads), the mode and the paths as flags
cat >"$WORK/full.yaml" <<YAML
data:
  prompt_field: question
  completion_field: answer
trainer:          # constant after a warm-up: under cosine decay the full run learns the prompt
  lr: 2e-3         # dependence for some data orders only (3 of 6 seeds below 0.15; this: seeds 0-6
  schedule: constant # reach 0.0004-0.077 in 5 epochs, one thread, AVX-512; 4 epochs are too few:
  warmup_steps: 20   # seed 0 stays at 0.24)
  micro_batch_tokens: 512
sft:
  epochs: 5
YAML
sft "$WORK/full.log" "$WORK/full.yaml" --model "$WORK/model" --data "$WORK/train.jsonl" --eval "$WORK/heldout.jsonl" --out "$WORK/full" --full
full_loss=$(eval_loss "$WORK/full.log")
echo "full: held-out loss $full_loss (threshold 0.15)"
check "full held-out loss below 0.15" below "$full_loss" 0.15
printf '{"text": "Q: abc\\nA: ok a."}\n' >"$WORK/score.jsonl"
check "trained model scores" "$TRILL" score --model "$WORK/full" --input "$WORK/score.jsonl" --output "$WORK/scored.jsonl"

# nothing lost on an interruption: stop after some steps, resume, and the result equals an
# uninterrupted run bit for bit (the data order, the schedule and every reduction are reproducible)
common=(data.prompt_field=question data.completion_field=answer trainer.micro_batch_tokens=512 trainer.schedule=cosine sft.epochs=1
        sft.save_every=4 trainer.lr=2e-3 sft.grad_accum=2)
for mode in lora full; do
  "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/$mode-a" --$mode "${common[@]}" 2>/dev/null
  "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/$mode-b" --$mode "${common[@]}" sft.stop_after=5 2>/dev/null
  "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/$mode-b" --$mode "${common[@]}" resume=auto 2>"$WORK/resume.log"
  check "$mode resume announced" grep -q resuming "$WORK/resume.log"
  weights=$([ $mode = lora ] && echo adapter_model.safetensors || echo model.safetensors)
  check "$mode resume is bit-identical" cmp -s "$WORK/$mode-a/$weights" "$WORK/$mode-b/$weights"
  check "$mode optimizer state identical" cmp -s "$WORK/$mode-a/optimizer.safetensors" "$WORK/$mode-b/optimizer.safetensors"
done

# usage and data errors name the problem
if "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/x" trainer.lr=abc 2>"$WORK/err"; then rc=0; else rc=$?; fi
check "bad setting is a usage error" test "$rc" -eq 2
check "bad setting named" grep -q 'trainer.lr: expected a number' "$WORK/err"
# the settings of the old key=value form name the key that replaced them
if "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/x" batch_tokens=512 2>"$WORK/err"; then rc=0; else rc=$?; fi
check "an old setting is a usage error" test "$rc" -eq 2
check "an old setting names its key" grep -q 'the setting batch_tokens is now the key trainer.micro_batch_tokens' "$WORK/err"
check "--print-config shows the sft section" sh -c "'$TRILL' sft --model '$WORK/model' --data '$WORK/train.jsonl' --out '$WORK/x' --full --print-config | grep -q 'mode: full'"
check "no sanitizer report" sh -c "! grep -nE 'Sanitizer|runtime error:' '$WORK/err'"
if "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/x" 2>"$WORK/err"; then rc=0; else rc=$?; fi
check "missing fields fail" test "$rc" -eq 1
check "missing field named" grep -q 'train.jsonl:1: expected string fields "prompt" and "completion"' "$WORK/err"
check "no sanitizer report" sh -c "! grep -nE 'Sanitizer|runtime error:' '$WORK/err'"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
