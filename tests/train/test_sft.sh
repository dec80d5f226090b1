#!/usr/bin/env bash
# `trill sft` learns a small synthetic task: held-out loss (nats per completion token, from ~4.9
# at random initialisation) must fall below a stated threshold, with LoRA and with full
# fine-tuning; the outputs are usable (the adapter merges, the full model scores).
# Usage: test_sft.sh PATH/TO/trill
set -euo pipefail
TRILL=$1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-sft-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0
check() { if "${@:2}"; then passed=$((passed + 1)); else echo "FAIL: $1"; failed=$((failed + 1)); fi; }

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

"$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --eval "$WORK/heldout.jsonl" --out "$WORK/lora" --lora \
  prompt_field=question completion_field=answer lr=3e-3 batch_tokens=512 epochs=2 eval_every=10 2>"$WORK/lora.log"
lora_loss=$(eval_loss "$WORK/lora.log")
echo "LoRA: held-out loss $lora_loss after $(grep -c '^step [0-9]*/' "$WORK/lora.log") steps (threshold 2.0)"
check "LoRA held-out loss below 2.0" below "$lora_loss" 2.0
check "adapter written" test -s "$WORK/lora/adapter_model.safetensors"
check "adapter merges" "$TRILL" merge --model "$WORK/model" --adapter "$WORK/lora" --out "$WORK/merged" 2>/dev/null

"$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --eval "$WORK/heldout.jsonl" --out "$WORK/full" --full \
  prompt_field=question completion_field=answer lr=1e-3 batch_tokens=512 epochs=3 grad_accum=2 2>"$WORK/full.log"
full_loss=$(eval_loss "$WORK/full.log")
echo "full: held-out loss $full_loss (threshold 1.0)"
check "full held-out loss below 1.0" below "$full_loss" 1.0
printf '{"text": "Q: abc\\nA: ok a."}\n' >"$WORK/score.jsonl"
check "trained model scores" "$TRILL" score --model "$WORK/full" --input "$WORK/score.jsonl" --output "$WORK/scored.jsonl"

# nothing lost on an interruption: stop after some steps, resume, and the result equals an
# uninterrupted run bit for bit (the data order, the schedule and every reduction are reproducible)
common=(prompt_field=question completion_field=answer batch_tokens=512 epochs=1 save_every=4)
for mode in lora full; do
  "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/$mode-a" --$mode "${common[@]}" lr=2e-3 grad_accum=2 2>/dev/null
  "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/$mode-b" --$mode "${common[@]}" lr=2e-3 grad_accum=2 stop_after=5 2>/dev/null
  "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/$mode-b" --$mode "${common[@]}" lr=2e-3 grad_accum=2 resume=true 2>"$WORK/resume.log"
  check "$mode resume announced" grep -q resuming "$WORK/resume.log"
  weights=$([ $mode = lora ] && echo adapter_model.safetensors || echo model.safetensors)
  check "$mode resume is bit-identical" cmp -s "$WORK/$mode-a/$weights" "$WORK/$mode-b/$weights"
  check "$mode optimizer state identical" cmp -s "$WORK/$mode-a/optimizer.safetensors" "$WORK/$mode-b/optimizer.safetensors"
done

# usage and data errors name the problem
if "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/x" lr=abc 2>"$WORK/err"; then rc=0; else rc=$?; fi
check "bad setting is a usage error" test "$rc" -eq 2
check "bad setting named" grep -q 'lr: expected a number' "$WORK/err"
if "$TRILL" sft --model "$WORK/model" --data "$WORK/train.jsonl" --out "$WORK/x" 2>"$WORK/err"; then rc=0; else rc=$?; fi
check "missing fields fail" test "$rc" -eq 1
check "missing field named" grep -q 'train.jsonl:1: expected string fields "prompt" and "completion"' "$WORK/err"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
