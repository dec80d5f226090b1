#!/usr/bin/env bash
# End-to-end tests of `trill train` and `trill eval` on a tiny random MoE (layer 0 dense, then MoE):
# router replay, mismatch, resume determinism, a SIGKILL mid-run, failing reward processes.
set -euo pipefail
TRILL=$(realpath "$1")
source "$(dirname "$0")/fixture.sh"

# metrics.jsonl field of every step, one per line
field() { $PY -c "import json,sys
for l in open(sys.argv[1]): v=json.loads(l)[sys.argv[2]]; print(json.dumps(v))" "$1" "$2"; }

echo "== router replay on: the trainer routes exactly as the generator did"
"$TRILL" train "${COMMON[@]}" run_dir=replay_on steps=2 router_replay=true generator.dtype=bf16 2>log_on || { cat log_on; fail "replay on run"; }
field replay_on/metrics.jsonl flip_token_frac | while read -r v; do [ "$v" = "0.0" ] || [ "$v" = "0" ] || fail "flip rate $v with replay on"; done
field replay_on/metrics.jsonl flip_layer | $PY -c "import sys,json
for l in sys.stdin: assert all(x == 0 for x in json.loads(l)), l"

echo "== router replay off with a bf16 generator: routing flips are measured"
"$TRILL" train "${COMMON[@]}" run_dir=replay_off steps=2 router_replay=false generator.prompts_per_step=8 generator.dtype=bf16 2>log_off || { cat log_off; fail "replay off run"; }
$PY -c "import json
m=[json.loads(l) for l in open('replay_off/metrics.jsonl')]
f=[x['flip_token_frac'] for x in m]
assert sum(f) > 0, f
print('   flip rates', f, 'per layer', m[0]['flip_layer'])"

echo "== f32 generator: the mismatch is rounding only"
"$TRILL" train "${COMMON[@]}" run_dir=f32 steps=2 generator.dtype=f32 2>log_f32 || { cat log_f32; fail "f32 run"; }
$PY -c "import json
m=[json.loads(l) for l in open('f32/metrics.jsonl')]
k3=[x['mismatch_k3'] for x in m]
assert all(abs(v) < 1e-8 for v in k3), k3
print('   k3', k3, 'max |dlogp|', [x['mismatch_max_abs'] for x in m])"

echo "== resume: 8 steps == 4 steps + resume to 8"
"$TRILL" train "${COMMON[@]}" run_dir=full steps=8 checkpoint.every=2 2>log_full || { cat log_full; fail "full run"; }
$PY -c "import json
m=[json.loads(l) for l in open('full/metrics.jsonl')]
assert all(x['grad_norm'] > 0 for x in m) and m[-1]['policy_version'] == 8, m[-1]
assert 'reward_ext_len' in m[0], m[0]"
"$TRILL" train "${COMMON[@]}" run_dir=split steps=4 checkpoint.every=2 2>log_split1 || { cat log_split1; fail "split run"; }
if "$TRILL" train "${COMMON[@]}" run_dir=split steps=8 checkpoint.every=2 2>log_refuse; then fail "a run_dir with checkpoints was reused without resume"; fi
grep -q "resume=auto" log_refuse || { cat log_refuse; fail "refusal message"; }
"$TRILL" train "${COMMON[@]}" run_dir=split steps=8 checkpoint.every=2 resume=auto 2>log_split2 || { cat log_split2; fail "resumed run"; }
compare_runs() {
    $PY - "$1" "$2" <<'PY'
import json, sys
def load(d):
    out = []
    for l in open(d + "/metrics.jsonl"):
        m = json.loads(l)
        for k in ("time", "sync_ms"): m.pop(k, None)
        out.append(m)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b), (len(a), len(b))
for x, y in zip(a, b):
    assert x == y, (x, y)
print("   metrics identical over", len(a), "steps")
PY
    cmp "$1/checkpoints/step-00000008/adapter/adapter_model.safetensors" "$2/checkpoints/step-00000008/adapter/adapter_model.safetensors" \
        || fail "adapters differ"
}
compare_runs full split

echo "== SIGKILL mid-run, then resume=auto"
"$TRILL" train "${COMMON[@]}" run_dir=killed steps=8 checkpoint.every=1 2>log_killed &
pid=$!
for _ in $(seq 1 600); do [ -d killed/checkpoints/step-00000002 ] && break; sleep 0.05; done
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
[ -d killed/checkpoints/step-00000002 ] || fail "no checkpoint before the kill"
grep -q "steps in" log_killed && fail "the run finished before it could be killed"
for d in killed/checkpoints/step-*; do
    [ -f "$d/state.json" ] && [ -f "$d/adapter/adapter_model.safetensors" ] && [ -f "$d/optimizer.safetensors" ] && [ -f "$d/config.yaml" ] \
        || fail "incomplete checkpoint $d"
done
"$TRILL" train "${COMMON[@]}" run_dir=killed steps=8 checkpoint.every=1 resume=auto 2>log_resumed || { cat log_resumed; fail "resume after kill"; }
[ -z "$(ls -A killed/checkpoints | grep tmp || true)" ] || fail "temporary checkpoint folder left behind"
compare_runs full killed

echo "== external reward processes that fail"
cat > crash.py <<'PY'
import sys
sys.stderr.write("boom: reward script crashed\n")
sys.exit(3)
PY
cat > hang.sh <<'SH'
#!/bin/sh
sleep 30
SH
cat > garbage.sh <<'SH'
#!/bin/sh
while read -r line; do echo "not json"; done
SH
for case in "crash:$PY crash.py:boom: reward script crashed" "hang:sh hang.sh:no reply within" "garbage:sh garbage.sh:not json"; do
    IFS=: read -r name cmd expect <<<"$case"
    if "$TRILL" train "${COMMON[@]}" run_dir=ext_$name steps=1 "reward.external=$cmd" reward.external_timeout_s=0.5 \
        reward.external_max_failures=2 2>log_ext_$name; then fail "$name reward process: the run did not fail"; fi
    grep -q "$cmd" log_ext_$name && grep -qi "$expect" log_ext_$name || { cat log_ext_$name; fail "$name: message"; }
    echo "   $name: $(grep -i "$expect" log_ext_$name | head -1 | cut -c1-160)"
done


echo "== every loss, aggregation, KL mode, correction level, sync mode and a reward model run"
"$TRILL" init --out rm --preset tiny --set hidden_size=64 --set intermediate_size=128 --set moe_intermediate_size=32 \
    --set head_dim=16 --set 'architectures=["Qwen3MoeForSequenceClassification"]' --set 'id2label={"0":"LABEL_0"}' --seed 5 2>/dev/null
i=0
while read -r opts; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    "$TRILL" train "${COMMON[@]}" run_dir=algo$i steps=2 $opts 2>log_algo$i || { cat log_algo$i; fail "options: $opts"; }
    $PY - "algo$i/metrics.jsonl" "$opts" <<'PY'
import json, math, sys
m = [json.loads(l) for l in open(sys.argv[1])]
assert len(m) == 2, sys.argv[2]
for x in m:
    for k in ("loss", "grad_norm", "mismatch_k3", "reward"):
        assert x[k] is not None and math.isfinite(x[k]), (sys.argv[2], k, x[k])
if "kl_coef" in sys.argv[2]:
    assert m[-1]["kl_ref"] is not None and m[-1]["kl_ref"] >= 0, m[-1]
if "sync.mode=merge" in sys.argv[2]:
    adapter = json.loads(open("replay_on/metrics.jsonl").readline())["sync_bytes"]
    assert m[-1]["sync_mode"] == "merge" and m[-1]["sync_bytes"] > adapter, (m[-1], adapter)
PY
done <<'OPTS'
algo.loss=ppo algo.aggregation=seq-mean-token-sum
algo.loss=gspo algo.aggregation=seq-mean-token-mean algo.clip_low=3e-4 algo.clip_high=4e-4
algo.loss=cispo algo.std_norm=false
algo.loss=reinforce correction.tis=0 correction.mis=off
algo.kl_coef=0.1 algo.kl_estimator=k1 algo.kl_mode=reward
algo.kl_coef=0.1 algo.kl_estimator=k2 algo.minibatches=2
algo.kl_coef=0.1 algo.kl_estimator=k3 correction.mis_level=sequence
algo.dynamic_sampling=true correction.mis_level=geometric generator.dtype=int8
sync.mode=merge
reward.model=rm reward.model_weight=0.5 trainer.recompute=true
OPTS
echo "   $i configurations ran"

echo "== micro-batching does not change the update"
"$TRILL" train "${COMMON[@]}" run_dir=mb_big steps=2 trainer.micro_batch_tokens=100000 2>/dev/null || fail "one micro-batch"
"$TRILL" train "${COMMON[@]}" run_dir=mb_small steps=2 trainer.micro_batch_tokens=16 2>/dev/null || fail "many micro-batches"
$PY - <<'PY'
import json
a = [json.loads(l) for l in open("mb_big/metrics.jsonl")]
b = [json.loads(l) for l in open("mb_small/metrics.jsonl")]
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "reward", "mismatch_k3"):
        assert abs(x[k] - y[k]) <= 1e-4 * max(1, abs(x[k])), (k, x[k], y[k])
print("   loss", [x["loss"] for x in a], "vs", [y["loss"] for y in b])
PY

echo "== a pool of external reward processes scores the same as one"
cat > digits_pid.py <<'PY'
import json, os, sys
open("pids", "a").write("%d\n" % os.getpid())
for line in sys.stdin:
    c = json.loads(line)["completion"]
    print(json.dumps({"reward": sum(ch.isdigit() for ch in c) / max(len(c), 1), "metrics": {"len": len(c)}}), flush=True)
PY
"$TRILL" train "${COMMON[@]}" "reward.external=$PY digits_pid.py" reward.external_workers=3 run_dir=pool steps=8 checkpoint.every=2 \
    2>log_pool || { cat log_pool; fail "reward pool"; }
[ "$(sort -u pids | wc -l)" -eq 3 ] || fail "expected 3 reward processes, got $(sort -u pids | wc -l)"
compare_runs full pool

echo "== trill eval"
"$TRILL" eval --model model --data eval.jsonl --verifier demo --k 2 --max-new-tokens 6 >eval.json 2>log_eval || { cat log_eval; fail "eval"; }
$PY -c "import json; r=json.load(open('eval.json')); assert r['prompts']==8 and r['k']==2 and 0<=r['pass@1']<=r['pass@2']<=1, r; print('  ', r)"
"$TRILL" eval --model model --data eval.jsonl --verifier demo --k 2 --max-new-tokens 6 \
    --adapter full/checkpoints/step-00000008/adapter >/dev/null 2>log_eval2 || { cat log_eval2; fail "eval with adapter"; }
echo "all RL end-to-end tests passed"
