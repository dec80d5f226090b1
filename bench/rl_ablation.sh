#!/usr/bin/env bash
# The embedded demo run four ways, one run each, same seed: the default (router replay on, TIS
# 2, adapter sync), then router replay off, TIS off and merge sync. Prints held-out pass@1
# before/after, the mean mismatch (k3, |Δ log p|), the routing flip rate, sync bytes and ms, and
# the mean step time from each run's metrics.jsonl.
#   bench/rl_ablation.sh [TRILL] [extra overrides...]   e.g. steps=100 generator.dtype=int8
set -euo pipefail
TRILL=$(realpath "${1:-build/trill}")
shift || true
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
declare -a NAMES=("default (replay on, TIS 2, adapter)" "router replay off" "TIS off" "sync merge")
declare -a OPTS=("" "router_replay=false" "correction.tis=0" "sync.mode=merge")
"$TRILL" train run_dir="$OUT/warm" steps=1 "$@" >/dev/null 2>&1 # builds the cached warm start first
for i in "${!NAMES[@]}"; do
    # shellcheck disable=SC2086
    "$TRILL" train run_dir="$OUT/run$i" ${OPTS[$i]} "$@" 2>"$OUT/log$i" || { cat "$OUT/log$i"; exit 1; }
done
/usr/bin/python3 - "$OUT" "${NAMES[@]}" <<'PY'
import json, re, statistics as st, sys
out, names = sys.argv[1], sys.argv[2:]
print(f"{'run':38s} {'pass@1 before':>13s} {'after':>7s} {'k3 mean':>9s} {'|dlogp|':>9s} {'flips':>7s} {'sync KB':>9s} {'sync ms':>8s} {'step ms':>8s}")
for i, name in enumerate(names):
    m = [json.loads(l) for l in open(f"{out}/run{i}/metrics.jsonl")]
    log = open(f"{out}/log{i}").read()
    acc = re.search(r"pass@1 ([\d.]+)% -> ([\d.]+)%", log)
    mean = lambda k: st.mean(x[k] for x in m)
    print(f"{name:38s} {acc.group(1):>12s}% {acc.group(2):>6s}% {mean('mismatch_k3'):9.2e} {mean('mismatch_mean_abs'):9.2e} "
          f"{100*mean('flip_token_frac'):6.2f}% {mean('sync_bytes')/1024:9.0f} {mean('sync_ms'):8.2f} {1000*st.mean(x['time']['step_s'] for x in m):8.1f}")
PY
