#!/usr/bin/env bash
# `make run`: the main job on its embedded default — no arguments, no downloads.
# Creates the tiny Qwen3-MoE model, describes it, scores a sentence (log-probs and routed
# experts per token) and samples completions with the generator engine. Outputs go to run/demo/.
set -euo pipefail
TRILL=${1:-build/trill}
OUT=run/demo
mkdir -p "$OUT"

step() { printf '\n== %s\n' "$*"; }

step "trill init --out $OUT/model --preset tiny --seed 0"
"$TRILL" init --out "$OUT/model" --preset tiny --seed 0

step "trill info --model $OUT/model"
"$TRILL" info --model "$OUT/model"

step "trill score (reference forward): log-probs and routed experts"
printf '{"text": "The answer is 42."}\n' >"$OUT/score_in.jsonl"
"$TRILL" score --model "$OUT/model" --input "$OUT/score_in.jsonl" --output "$OUT/score_out.jsonl"
head -c 400 "$OUT/score_out.jsonl"; echo " ..."

step "trill generate --n 4 (the batched engine; random weights: expect noise)"
"$TRILL" generate --model "$OUT/model" --prompt "Q: 2+2? A:" --n 4 --max-new-tokens 32 --seed 1

step "trill generate --json --capture-experts: per token logprob, policy version, routed experts"
"$TRILL" generate --model "$OUT/model" --prompt "Q: 2+2? A:" --max-new-tokens 8 --seed 1 --json --capture-experts \
  2>/dev/null | head -c 600; echo " ..."
echo
echo "outputs in $OUT/"
