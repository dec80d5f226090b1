#!/usr/bin/env bash
# Asynchronous RL end to end (tiny random MoE): async with max_staleness 0 reproduces sync mode
# exactly; the staleness bound holds for every policy; executors that fail stop the run cleanly.
set -euo pipefail
TRILL=$(realpath "$1")
source "$(dirname "$0")/fixture.sh"

same_run() {
    $PY - "$1" "$2" <<'PY'
import json, sys
keys = ("reward", "accuracy", "response_len", "loss", "grad_norm", "mismatch_mean_abs", "mismatch_k3", "flip_token_frac",
        "trained_seqs", "policy_version")
a = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
b = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
assert len(a) == len(b), (len(a), len(b))
for x, y in zip(a, b):
    for k in keys:
        assert x[k] == y[k], (x["step"], k, x[k], y[k])
print("   identical over", len(a), "steps")
PY
}

echo "== async with max_staleness 0 reproduces sync mode (tokens, metrics, adapters)"
for sync in adapter merge; do
    must_pass log_sync "$TRILL" train "${COMMON[@]}" run_dir=sync_$sync steps=6 sync.mode=$sync
    must_pass log_async "$TRILL" train "${COMMON[@]}" run_dir=async_$sync steps=6 sync.mode=$sync mode=async async.max_staleness=0
    same_run sync_$sync async_$sync
    # the held-out evaluation after the run sees the final weights in both modes
    grep -q "held-out after: .*policy version 6," log_async || { grep "held-out after" log_async; fail "final evaluation not on the final weights ($sync)"; }
    [ "$(grep -o 'held-out after: .*policy version [0-9]*' log_sync)" = \
      "$(grep -o 'held-out after: .*policy version [0-9]*' log_async)" ] || fail "final evaluation differs ($sync)"
    cmp sync_$sync/checkpoints/step-00000006/adapter/adapter_model.safetensors \
        async_$sync/checkpoints/step-00000006/adapter/adapter_model.safetensors || fail "adapters differ ($sync)"
done

echo "== the reward executor on the trainer's thread (async.reward: trainer): the same run, without a reward thread"
must_pass log_rt "$TRILL" train "${COMMON[@]}" run_dir=async_rt steps=6 mode=async async.max_staleness=0 async.reward=trainer
same_run sync_adapter async_rt
cmp sync_adapter/checkpoints/step-00000006/adapter/adapter_model.safetensors \
    async_rt/checkpoints/step-00000006/adapter/adapter_model.safetensors || fail "adapters differ (async.reward trainer)"
$PY - async_rt/async_summary.json <<'PY' || fail "async.reward trainer: the summary"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["reward_busy_s"] > 0 and s["generator_busy_s"] > 0, s
PY

echo "== the staleness bound holds on every token, whatever the policy, and the generator does run ahead"
# A reward that takes 10 ms a completion (0.16 s a batch) while the generator makes a batch in a few
# ms: the generator is always ahead, so stale tokens (wait), dropped batches (drop) and regenerated
# ones (regenerate) must all happen, not just be allowed.
cat > digits_slow.py <<'PY'
import json, sys, time
for line in sys.stdin:
    time.sleep(0.01)
    c = json.loads(line)["completion"]
    print(json.dumps({"reward": sum(ch.isdigit() for ch in c) / max(len(c), 1), "metrics": {"len": len(c)}}), flush=True)
PY
for pol in wait drop regenerate; do
    for s in 1 2; do
        must_pass log_st "$TRILL" train "${COMMON[@]}" "reward.external=$PY digits_slow.py" run_dir=st_${pol}_$s steps=6 mode=async \
            async.max_staleness=$s async.queue=3 async.on_stale=$pol
        $PY - st_${pol}_$s/metrics.jsonl $s $pol <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
s, pol = int(sys.argv[2]), sys.argv[3]
assert len(m) == 6
lags = [x["staleness_max"] for x in m]
assert all(0 <= v <= s for v in lags), lags
for x in m: # every token counted once, none beyond the bound
    assert len(x["staleness_tokens"]) == x["staleness_max"] + 1 <= s + 1, x["staleness_tokens"]
    assert sum(x["staleness_tokens"]) == round(x["response_len"] * x["trained_seqs"]), (x["staleness_tokens"], x["response_len"])
assert all(x["policy_version"] == i + 1 for i, x in enumerate(m))
stale = sum(sum(x["staleness_tokens"][1:]) for x in m)
assert stale > 0, ("the generator never ran ahead", lags)
batches = [x["batch"] for x in m]
dropped, regenerated = m[-1]["dropped_batches"], m[-1]["regenerated_batches"]
if pol == "wait":
    assert batches == list(range(6)) and dropped == regenerated == 0, (batches, dropped, regenerated)
    assert max(lags) == s, ("wait lets the generator run exactly max_staleness ahead", lags)
elif pol == "drop":
    assert dropped > 0 and regenerated == 0, (dropped, regenerated)
    assert len(set(batches)) == 6 and batches == sorted(batches) and batches[-1] == 5 + dropped, batches  # dropped ones skipped
else:
    assert regenerated > 0 and dropped == 0 and batches == list(range(6)), (batches, dropped, regenerated)
print(f"   {pol:10s} bound {s}: staleness max per step {lags}, {stale} stale tokens, batches {batches}, "
      f"{dropped} dropped, {regenerated} regenerated")
PY
    done
done
# With the fast reward and longer completions (32 tokens) a batch takes longer to generate than a
# training step, so the trainer's updates land while the generator is inside a batch: its first
# tokens are older than its last. At max_staleness 0 such a batch is dropped by its oldest token
# (its mean lag is below 1): every trained token is at lag 0, and batches are dropped.
must_pass log_st "$TRILL" train "${COMMON[@]}" generator.max_new_tokens=32 run_dir=st_drop_0 steps=6 mode=async async.max_staleness=0 \
    async.queue=3 async.on_stale=drop
$PY - st_drop_0/metrics.jsonl <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
assert len(m) == 6 and all(x["staleness_max"] == 0 and len(x["staleness_tokens"]) == 1 for x in m), [x["staleness_tokens"] for x in m]
assert m[-1]["dropped_batches"] > 0, "no batch dropped"
print(f"   drop       bound 0, fast reward: every token at lag 0, {m[-1]['dropped_batches']} batches dropped")
PY
grep -q "async executors over" log_st || fail "no executor summary"

echo "== a resumed async run (max_staleness 0) continues exactly"
must_pass log_res1 "$TRILL" train "${COMMON[@]}" run_dir=res steps=3 mode=async async.max_staleness=0
must_pass log_res2 "$TRILL" train "${COMMON[@]}" run_dir=res steps=6 mode=async async.max_staleness=0 resume=auto
same_run sync_adapter res

echo "== failing executors stop the run with the error and a consistent checkpoint"
# A reward process that works for 40 requests (counted across restarts), then crashes or hangs.
cat > fail_later.py <<'PY'
import json, os, sys, time
how = sys.argv[1]
n = int(open(how + ".count").read()) if os.path.exists(how + ".count") else 0
for line in sys.stdin:
    n += 1
    open(how + ".count", "w").write(str(n))
    if n > 40 and how == "crash":
        sys.stderr.write("reward script gave up at request %d\n" % n)
        sys.exit(7)
    if n > 40:
        time.sleep(60)
    print(json.dumps({"reward": n % 3 / 2.0}), flush=True)
PY
timeout_s=$(reply_deadline)
for case in "crash:exited with status 7" "hang:no reply within $timeout_s s"; do
    IFS=: read -r name expect <<<"$case"
    start=$(date +%s.%N)
    must_exit 1 log_fail_$name "$TRILL" train "${COMMON[@]}" run_dir=fail_$name steps=20 checkpoint.every=1 mode=async async.max_staleness=1 \
        "reward.external=$PY fail_later.py $name" reward.external_timeout_s=$timeout_s reward.external_max_failures=2
    grep -q "reward executor: .*$expect" log_fail_$name || { tail -3 log_fail_$name; fail "$name: message"; }
    grep -q "steps in" log_fail_$name && fail "$name: the run reported success"
    n=$(ls -d fail_$name/checkpoints/step-* | wc -l)
    [ "$n" -ge 1 ] && [ "$n" -lt 20 ] || fail "$name: $n checkpoints (the reward fails after 40 requests, 16 a step)"
    for d in fail_$name/checkpoints/step-*; do
        [ -f "$d/state.json" ] && [ -f "$d/adapter/adapter_model.safetensors" ] && [ -f "$d/optimizer.safetensors" ] || fail "incomplete $d"
    done
    echo "   $name: stopped after $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s with $n complete checkpoints (reply deadline $timeout_s s): $(grep -o "reward executor.*" log_fail_$name | cut -c1-150)"
    must_pass log_resume_$name "$TRILL" train "${COMMON[@]}" run_dir=fail_$name steps=$((n + 2)) checkpoint.every=1 mode=async \
        async.max_staleness=1 resume=auto
    grep -q "resuming from fail_$name/checkpoints/step-0*$n at step $n" log_resume_$name || { grep resum log_resume_$name; fail "$name: resumed from the wrong checkpoint"; }
done
echo "all async end-to-end tests passed"
