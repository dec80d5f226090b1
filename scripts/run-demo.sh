#!/usr/bin/env bash
# `make run`: the main job on its embedded default — no arguments, no downloads.
# `trill train` with no config runs the embedded RL demo: a tiny Qwen3-MoE (layer 0 dense, three
# MoE layers) learns two-digit addition. The first run builds the model and warm-starts it with
# a short SFT (cached in ~/.cache/trill, so later runs start RL at once), then LoRA GRPO with
# router replay and TIS raises held-out accuracy. The run folder is run/demo (config.yaml,
# metrics.jsonl, checkpoints/).
set -euo pipefail
TRILL=${1:-build/trill}
OUT=run/demo
rm -rf "$OUT"
mkdir -p run
echo "== trill train   (the embedded demo; run folder $OUT)"
start=$(date +%s)
"$TRILL" train run_dir="$OUT"
echo "== whole demo: $(( $(date +%s) - start )) s wall time; per-step figures in $OUT/metrics.jsonl"
