#!/usr/bin/env bash
# Sync vs async RL, one run each with the same seed and steps, side by side:
#   1. the embedded demo (generation ~12% of a sync step: training-bound);
#   2. the `small` preset (85M parameters, random weights) on a shape where generation and
#      training cost about the same (4 samples of 1 prompt, 128 new tokens);
#   3. the demo scored by a slow external reward (2 ms a request, as a sandbox or an API would
#      be; 4 processes), the case where overlapping the reward with the rest pays.
# Prints the steady-state step time (median wall time between steps, first step excluded), tokens
# generated and trained per second of wall time, each executor's busy and idle fraction (each
# runs on its own core in async mode), held-out pass@1 (demo), and the weight transfer per version
# (publish into the channel and load on the generator side) for adapter and merge sync.
#   bench/rl_async.sh [TRILL] [STEPS]
set -euo pipefail
TRILL=$(realpath "${1:-build/trill}")
HERE=$(cd "$(dirname "$0")" && pwd)
STEPS=${2:-60}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
cd "$OUT"
source "$HERE/workloads.sh"
cat > slow_reward.py <<'PY'
import json, sys, time
for line in sys.stdin:
    r = json.loads(line)
    time.sleep(0.002)
    print(json.dumps({"reward": float(r["completion"].split("\n")[0] == r["ground_truth"])}), flush=True)
PY
DEMO=(steps=$STEPS)
SLOW=(steps=$((STEPS / 2)) reward.verifier_weight=0 "reward.external=/usr/bin/python3 slow_reward.py" reward.external_workers=4)
SMALL=("${SMALL_WORKLOAD[@]}" steps=$((STEPS / 6 > 4 ? STEPS / 6 : 4)))
run() { local name=$1; shift; "$TRILL" train run_dir="$name" "$@" 2>"$name.log" || { tail -5 "$name.log"; exit 1; }; }
run demo_sync "${DEMO[@]}"
run demo_async "${DEMO[@]}" mode=async async.max_staleness=1
run demo_async_merge steps=20 mode=async async.max_staleness=1 sync.mode=merge
run demo_sync_merge steps=20 sync.mode=merge
run small_sync "${SMALL[@]}"
run small_async "${SMALL[@]}" mode=async async.max_staleness=1
run slowreward_sync "${SLOW[@]}"
run slowreward_async "${SLOW[@]}" mode=async async.max_staleness=1
/usr/bin/python3 - <<'PY'
import json, os, re, statistics as st
def load(name):
    m = [json.loads(l) for l in open(f"{name}/metrics.jsonl")]
    log = open(f"{name}.log").read()
    acc = re.search(r"pass@1 ([\d.]+)% -> ([\d.]+)%", log)
    summ = json.load(open(f"{name}/async_summary.json")) if os.path.exists(f"{name}/async_summary.json") else None
    return m, acc, summ
def wall(x, asyn):
    return x["time"]["interval_s"] if asyn else x["time"]["step_s"]
print(f"{'run':18s} {'step ms':>8s} {'gen tok/s':>10s} {'train tok/s':>12s} {'gen busy':>9s} {'reward':>7s} {'train busy':>11s} {'idle gen/train core':>20s} {'pass@1':>15s} {'staleness':>9s}")
for work in ("demo", "small", "slowreward"):
    base = None
    for mode in ("sync", "async"):
        name = f"{work}_{mode}"
        m, acc, summ = load(name)
        asyn = mode == "async"
        steady = st.median(wall(x, asyn) for x in m[1:])
        total = sum(wall(x, asyn) for x in m)
        gen_tok = sum(x["response_len"] * x["trained_seqs"] for x in m)  # all sequences are trained here (no dynamic sampling)
        train_tok = sum(x["time"]["train_tokens_per_s"] * x["time"]["train_s"] for x in m)
        if asyn:
            w = summ["wall_s"]
            g, r, t = summ["generator_busy_s"] / w, summ["reward_busy_s"] / w, summ["trainer_busy_s"] / w
            idle = f"{100*(1-g):.0f}% / {100*(1-t):.0f}%"
        else:
            gs = sum(x["time"]["generate_s"] for x in m); rs = sum(x["time"]["reward_s"] for x in m); ts = sum(x["time"]["train_s"] + x["time"]["sync_s"] for x in m)
            g, r, t = gs / total, rs / total, ts / total
            idle = "(both cores, in turn)"
        lag = max(x.get("staleness_max", 0) for x in m)
        accs = f"{acc.group(1)}->{acc.group(2)}%" if acc else "-"
        print(f"{name:18s} {1000*steady:8.1f} {gen_tok/total:10.0f} {train_tok/total:12.0f} {100*g:8.0f}% {100*r:6.0f}% {100*t:10.0f}% {idle:>20s} {accs:>15s} {lag:9d}")
        if base is None: base = steady
        else: print(f"{'':18s} async/sync throughput: {base/steady:.2f}x (steady-state step time)")
print()
for name in ("demo_sync", "demo_async", "demo_sync_merge", "demo_async_merge"):
    m, _, _ = load(name)
    ms = st.median(x["sync_ms"] for x in m)
    ap = [x["time"].get("generator_apply_ms") for x in m if x["time"].get("generator_apply_ms") is not None]
    print(f"{name:18s} weight transfer per version: {m[-1]['sync_bytes']/1024:8.0f} KB, trainer side {1000*ms:8.0f} us"
          + (f", generator load {1000*st.median(ap):7.0f} us" if ap else " (direct engine update in the trainer's thread)"))
PY
