#!/usr/bin/env bash
# The cost of on-policy mode (generator.on_policy: true, router replay off) against the default
# (router replay + TIS) on the embedded demo, with a bf16 and an int8 generator, in one run:
# per step the mean wall time, training time and the scorer's teacher-forcing time, the
# mismatch the trainer saw, and held-out pass@1 before and after. The modes alternate per
# generator format so drift on this shared machine hits both.
# Usage: bench/on_policy.sh BUILD_DIR [STEPS]   (default 40 steps; the warm start is cached in
# TRILL_CACHE_DIR, default a temporary folder: the first run builds it)
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-40}
TRILL=$(realpath "$BUILD/trill")
W=$(mktemp -d "${TMPDIR:-/tmp}/trill-onpolicy-XXXXXX")
trap 'rm -rf "$W"' EXIT
export TRILL_CACHE_DIR=${TRILL_CACHE_DIR:-$W/cache}
cd "$W"
for dt in bf16 int8; do
  for mode in default on_policy; do
    args=(generator.dtype=$dt)
    [ "$mode" = on_policy ] && args+=(generator.on_policy=true router_replay=false)
    "$TRILL" train run_dir="run_${dt}_$mode" steps="$STEPS" checkpoint.every=0 "${args[@]}" 2>"log_${dt}_$mode"
    /usr/bin/python3 - "run_${dt}_$mode/metrics.jsonl" "log_${dt}_$mode" "$dt" "$mode" <<'PY'
import json, re, sys
m = [json.loads(l) for l in open(sys.argv[1])]
log = open(sys.argv[2]).read()
acc = re.search(r"held-out pass@1 ([0-9.]+)% -> ([0-9.]+)%", log)
n = len(m)
mean = lambda f: sum(f(x) for x in m) / n
print(f"{sys.argv[3]} generator, {sys.argv[4]:9s}: step {1e3 * mean(lambda x: x['time']['step_s']):6.1f} ms "
      f"(train {1e3 * mean(lambda x: x['time']['train_s']):6.1f} ms, of which scoring {1e3 * mean(lambda x: x['time'].get('score_s', 0)):5.1f} ms; "
      f"generate {1e3 * mean(lambda x: x['time']['generate_s']):5.1f} ms) | mismatch k3 {mean(lambda x: x['mismatch_k3']):.2e} "
      f"max|d| {max(x['mismatch_max_abs'] for x in m):.3f} flips {100 * mean(lambda x: x['flip_token_frac']):.2f}% | "
      f"held-out pass@1 {acc.group(1)}% -> {acc.group(2)}% over {n} steps")
PY
  done
done
