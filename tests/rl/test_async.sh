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
    "$TRILL" train "${COMMON[@]}" run_dir=sync_$sync steps=6 sync.mode=$sync 2>log_sync || { cat log_sync; fail "sync run"; }
    timeout 120 "$TRILL" train "${COMMON[@]}" run_dir=async_$sync steps=6 sync.mode=$sync mode=async async.max_staleness=0 \
        2>log_async || { cat log_async; fail "async run ($sync)"; }
    same_run sync_$sync async_$sync
    # the held-out evaluation after the run sees the final weights in both modes
    grep -q "held-out after: .*policy version 6," log_async || { grep "held-out after" log_async; fail "final evaluation not on the final weights ($sync)"; }
    [ "$(grep -o 'held-out after: .*policy version [0-9]*' log_sync)" = \
      "$(grep -o 'held-out after: .*policy version [0-9]*' log_async)" ] || fail "final evaluation differs ($sync)"
    cmp sync_$sync/checkpoints/step-00000006/adapter/adapter_model.safetensors \
        async_$sync/checkpoints/step-00000006/adapter/adapter_model.safetensors || fail "adapters differ ($sync)"
done

echo "== the staleness bound holds on every token, whatever the policy"
for pol in wait drop regenerate; do
    for s in 1 2; do
        timeout 120 "$TRILL" train "${COMMON[@]}" run_dir=st_${pol}_$s steps=10 mode=async async.max_staleness=$s async.queue=3 \
            async.on_stale=$pol 2>log_st || { cat log_st; fail "async $pol $s"; }
        $PY - st_${pol}_$s/metrics.jsonl $s $pol <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
s = int(sys.argv[2])
assert len(m) == 10
lags = [x["staleness_max"] for x in m]
assert all(0 <= v <= s for v in lags), lags
for x in m: # every token counted once, none beyond the bound
    assert len(x["staleness_tokens"]) == x["staleness_max"] + 1 <= s + 1, x["staleness_tokens"]
    assert sum(x["staleness_tokens"]) == round(x["response_len"] * x["trained_seqs"]), (x["staleness_tokens"], x["response_len"])
assert all(x["policy_version"] == i + 1 for i, x in enumerate(m))
print(f"   {sys.argv[3]:10s} bound {s}: staleness max per step {lags}, batches {[x['batch'] for x in m]}")
PY
    done
done
grep -q "async executors over" log_st || fail "no executor summary"

echo "== a resumed async run (max_staleness 0) continues exactly"
timeout 120 "$TRILL" train "${COMMON[@]}" run_dir=res steps=3 mode=async async.max_staleness=0 2>/dev/null || fail "first half"
timeout 120 "$TRILL" train "${COMMON[@]}" run_dir=res steps=6 mode=async async.max_staleness=0 resume=auto 2>/dev/null || fail "resumed half"
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
for case in "crash:exited with status 7" "hang:no reply within"; do
    IFS=: read -r name expect <<<"$case"
    start=$(date +%s)
    if timeout 120 "$TRILL" train "${COMMON[@]}" run_dir=fail_$name steps=20 checkpoint.every=1 mode=async async.max_staleness=1 \
        "reward.external=$PY fail_later.py $name" reward.external_timeout_s=0.5 reward.external_max_failures=2 2>log_fail_$name; then
        fail "$name: the run did not fail"
    fi
    rc=$?
    [ $rc -ne 124 ] || fail "$name: the run hung (deadlock)"
    grep -q "reward executor" log_fail_$name && grep -q "$expect" log_fail_$name || { tail -3 log_fail_$name; fail "$name: message"; }
    for d in fail_$name/checkpoints/step-*; do
        [ -f "$d/state.json" ] && [ -f "$d/adapter/adapter_model.safetensors" ] && [ -f "$d/optimizer.safetensors" ] || fail "incomplete $d"
    done
    n=$(ls -d fail_$name/checkpoints/step-* | wc -l)
    echo "   $name: stopped after $(( $(date +%s) - start )) s with $n complete checkpoints: $(grep -o "reward executor.*" log_fail_$name | cut -c1-150)"
    timeout 120 "$TRILL" train "${COMMON[@]}" run_dir=fail_$name steps=$((n + 2)) checkpoint.every=1 mode=async async.max_staleness=1 \
        resume=auto 2>log_resume_$name || { tail -3 log_resume_$name; fail "$name: resume from the last checkpoint"; }
done
echo "all async end-to-end tests passed"
