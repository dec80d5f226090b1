#!/usr/bin/env bash
# Executors on MPI ranks of their own (parallel.generator.replicas, parallel.scorer) on the RL
# tests' tiny MoE with its graded external reward (tests/rl/fixture.sh): one trainer rank (the
# controller) and 2 generator replicas give the same rollouts (every token, log-prob and routed
# expert: rollouts.save), adapters, optimizer state and metrics (the held-out evaluation too) as
# one process, in adapter and in merge sync, and so do multi-turn episodes, and so do 2 data-parallel trainer ranks with one
# replica and a scorer rank (the external process's metrics cross with the rewards); every
# version's transfer reaches every receiver with its checksum; asynchronous mode across ranks at
# max_staleness 0 equals sync mode (1 and 2 replicas, DP 2), and at 1 and 2 (wait, drop,
# regenerate) keeps every token within the bound; a transfer corrupted on arrival (test hook) is
# refused with the receiving rank named, in both modes; a placement that does not add up is refused
# with its arithmetic; runs resume on other placements to the bytes of an uninterrupted run; a
# killed generator rank ends the job naming the rank, and resume=auto continues.
# Usage: test_executors.sh TRILL MPIEXEC
set -euo pipefail
TRILL=$(realpath "$1")
MPIEXEC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../rl/fixture.sh"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
source "$HERE/kill_rank.sh"
common=("${COMMON[@]}" trainer.micro_batch_tokens=64 checkpoint.every=0 rollouts.save=true eval.every=2)
run() { # run NP DIR ARGS...: trill train on NP ranks (0: no mpirun)
  local np=$1 dir=$2
  shift 2
  if [ "$np" -eq 0 ]; then
    must_pass "$dir.log" "$TRILL" train run_dir="$dir" "${common[@]}" "$@"
  else
    ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" must_pass "$dir.log" "$MPIEXEC" -np "$np" --oversubscribe "$TRILL" train \
      run_dir="$dir" "${common[@]}" "$@"
  fi
}
same_bytes() { # same_bytes A B STEPS: every step's rollouts and the last checkpoint
  local ck="checkpoints/step-0000000$3"
  for f in adapter/adapter_model.safetensors optimizer.safetensors; do
    cmp -s "$1/$ck/$f" "$2/$ck/$f" || fail "$1/$ck/$f and $2/$ck/$f differ"
  done
  for f in "$1"/rollouts/step-*.bin; do
    cmp -s "$f" "$2/rollouts/$(basename "$f")" || fail "$f and $2/rollouts/$(basename "$f") differ (the tokens, log-probs or experts)"
  done
}
same() { # same A B STEPS: same_bytes, and the metrics but for times and transfers
  local a=$1 b=$2
  same_bytes "$@"
  /usr/bin/python3 - "$a/metrics.jsonl" "$b/metrics.jsonl" "$3" <<'PY' || fail "$a and $b: the metrics differ"
import json, sys
def load(p):
    out = []
    for l in open(p):
        m = json.loads(l)
        for k in ("time", "sync_ms", "comm", "transfer"): m.pop(k, None)
        out.append(m)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == int(sys.argv[3]), ("metrics lines", len(a), len(b), "expected", sys.argv[3])
assert a == b, [(k, x[k], y.get(k)) for x, y in zip(a, b) for k in x if x[k] != y.get(k)][:5]
PY
}
transfers() { # transfers DIR RECEIVERS...: every version reached each receiver rank, the bytes and checksum stated
  /usr/bin/python3 - "$@" <<'PY' || fail "$1: the weight transfers are not reported"
import json, sys
ranks = [int(r) for r in sys.argv[2:]]
for l in open(sys.argv[1] + "/metrics.jsonl"):
    m = json.loads(l)
    t = m["transfer"]
    assert t["bytes"] > 0 and len(t["checksum"]) == 16, t
    assert [x["rank"] for x in t["receivers"]] == ranks, t
    assert all(x["receive_ms"] >= 0 and x["apply_ms"] >= 0 for x in t["receivers"]), t
print(f"  step {m['step']}: {t['bytes']} bytes, XXH64 {t['checksum']}, per receiver (rank, receive ms, apply ms):",
      [(x["rank"], round(x["receive_ms"], 2), round(x["apply_ms"], 2)) for x in t["receivers"]])
PY
}

run 0 one steps=3
run 3 rep2 steps=3 parallel.generator.replicas=2
same one rep2 3
transfers rep2 1 2
echo "1 trainer rank + 2 generator replicas, adapter sync: rollouts, adapter, optimizer and metrics identical to one process"
# multi-turn episodes (the built-in guess environment) on the replicas: each replica plays its
# groups' episodes; every token, segment, log-prob and expert as one process (the episodes' seconds
# in the environment aside), the same adapter
run 0 env1 steps=2 env.kind=guess env.max_turns=3 reward.verifier=none eval.every=0
run 3 env2 steps=2 env.kind=guess env.max_turns=3 reward.verifier=none eval.every=0 parallel.generator.replicas=2
cmp -s env1/checkpoints/step-00000002/adapter/adapter_model.safetensors env2/checkpoints/step-00000002/adapter/adapter_model.safetensors ||
    fail "episodes on 2 replicas: the adapter differs from one process's"
PYTHONPATH="$HERE/../reference" /usr/bin/python3 - env1 env2 <<'PY' || fail "episodes on 2 replicas: the rollouts differ from one process's"
import sys
import numpy as np
import rollouts
for step in (1, 2):
    a, b = (rollouts.read(f"{d}/rollouts/step-{step:08d}.bin") for d in sys.argv[1:3])
    assert a["format"] == b["format"] == 3
    for key in ("tokens", "behav_logp", "version", "experts", "seg_offsets", "segs", "reward"):
        assert np.array_equal(a[key], b[key], equal_nan=True), (step, key)
    for key in ("env_return", "turns", "stop", "cut_turns"):
        assert np.array_equal(a["episodes"][key], b["episodes"][key]), (step, key)
PY
echo "episodes on 2 generator replicas: rollouts (but the seconds in the environment) and adapter identical to one process"
run 0 merge1 steps=2 sync.mode=merge
run 3 merge2 steps=2 sync.mode=merge parallel.generator.replicas=2
same merge1 merge2 2
transfers merge2 1 2
echo "the same in merge sync"
run 4 dp2 steps=3 parallel.trainer.dp=2 parallel.generator.replicas=1 parallel.scorer=1
same one dp2 3
transfers dp2 2
echo "2 data-parallel trainer ranks + 1 replica + a scorer rank: identical to one process"
# an expert-parallel replica over 2 ranks, EPLB placing 2 redundant replicas a rank (physical slots
# are not logical ids) and re-planning every 2 engine steps from the pair's summed load: the same
# rollouts (captured ids logical: a physical slot recorded would differ), adapters and metrics
eplb=(generator.eplb=true generator.eplb_redundant=2 generator.eplb_window=2 generator.eplb_interval=2)
run 3 gep steps=3 parallel.generator.replicas=1 parallel.generator.ep=2 "${eplb[@]}"
same one gep 3
/usr/bin/python3 - gep/metrics.jsonl <<'PY' || fail "replay flips under the expert-parallel generator"
import json, sys
assert all(json.loads(l)["flip_token_frac"] == 0 for l in open(sys.argv[1]))
PY
run 5 gep2 steps=2 parallel.generator.replicas=2 parallel.generator.ep=2 "${eplb[@]}" sync.mode=merge
same merge1 gep2 2
/usr/bin/python3 - gep2/metrics.jsonl <<'PY' || fail "merge sync sent an expert-parallel rank experts it does not keep"
import json, sys
for l in open(sys.argv[1]):  # after a batch the controller knows each rank's experts: each gets its own
    t = json.loads(l)["transfer"]
    assert all(0 < r["bytes"] < t["bytes"] for r in t["receivers"]), t
print("  merged weights per expert-parallel rank:", [r["bytes"] for r in t["receivers"]], "of", t["bytes"], "bytes")
PY
echo "expert-parallel generator replicas (1 x EP 2 adapter, 2 x EP 2 merge) with EPLB re-planning: identical to one process, flip rate 0"

# asynchronous mode across ranks: at max_staleness 0 the replicas generate every batch with the
# newest weights, so the rollouts, adapter and optimizer equal sync mode's in one process
async=(mode=async eval.every=0)
run 2 as0 steps=3 "${async[@]}" async.max_staleness=0 parallel.generator.replicas=1
same_bytes one as0 3
run 3 as0r2 steps=3 "${async[@]}" async.max_staleness=0 parallel.generator.replicas=2
same_bytes one as0r2 3
run 3 as0dp steps=3 "${async[@]}" async.max_staleness=0 parallel.trainer.dp=2 parallel.generator.replicas=1
same_bytes one as0dp 3
grep -q "async executors over .* (generator replicas on ranks)" as0.log && [ -f as0/async_summary.json ] || fail "no async summary"
echo "async across ranks at max_staleness 0 (1 and 2 replicas, and DP 2 + a replica): rollouts, adapter and optimizer identical to sync mode"
bound() { # bound DIR S POLICY STEPS: every trained token within S versions, and the generator did run ahead: stale
  # tokens under wait, batches dropped under drop, regenerated under regenerate (the replica generates a batch in a few ms,
  # the trainer's step takes tens: the batches issued ahead are generated at older weights, structurally, not by chance)
  /usr/bin/python3 - "$@" <<'PY' || fail "$1: a token beyond the staleness bound, or the policy never acted"
import json, sys
d, S, pol, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
m = [json.loads(l) for l in open(d + "/metrics.jsonl")]
assert len(m) == steps, (len(m), steps)
assert all(x["staleness_max"] <= S for x in m), [x["staleness_max"] for x in m]
lags = [0] * (S + 1)
for x in m:
    for i, n in enumerate(x["staleness_tokens"]): lags[i] += n
a = m[-1]
dropped, regenerated, batches = a["dropped_batches"], a["regenerated_batches"], [x["batch"] for x in m]
if pol == "wait":
    assert sum(lags[1:]) > 0 and dropped == regenerated == 0, ("the generator never ran ahead", lags, dropped, regenerated)
    assert batches == list(range(steps)), batches
elif pol == "drop":
    assert dropped > 0 and regenerated == 0, ("no batch dropped", dropped, regenerated)
    assert batches == sorted(set(batches)) and batches[-1] == steps - 1 + dropped, batches  # the dropped ones skipped
else:
    assert regenerated > 0 and dropped == 0, ("no batch regenerated", dropped, regenerated)
    assert batches == list(range(steps)), batches
print(f"  {d}: max_staleness {S}, {pol}: tokens at lag 0..{S}: {lags}; batches {batches}; dropped {dropped}, regenerated {regenerated}")
PY
}
for S in 1 2; do
  run 2 "as$S" steps=6 "${async[@]}" async.max_staleness=$S parallel.generator.replicas=1
  bound "as$S" "$S" wait 6
done
run 3 asdrop steps=6 "${async[@]}" async.max_staleness=1 async.on_stale=drop async.queue=3 parallel.generator.replicas=2
bound asdrop 1 drop 6
run 2 asregen steps=6 "${async[@]}" async.max_staleness=1 async.on_stale=regenerate async.queue=3 parallel.generator.replicas=1
bound asregen 1 regenerate 6
run 2 asaipo steps=4 "${async[@]}" async.max_staleness=1 algo.loss=aipo parallel.generator.replicas=1
bound asaipo 1 wait 4
echo "async across ranks at max_staleness 1 and 2 (wait, drop, regenerate; AIPO's loss): every token within the bound, stale tokens, dropped and regenerated batches seen"

# a transfer corrupted on arrival at version 2 is refused by the receiver, which the controller names
TRILL_TEST_CORRUPT_TRANSFER=2 ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" must_exit 1 corrupt.log "$MPIEXEC" -np 3 --oversubscribe \
  "$TRILL" train run_dir=corrupt steps=3 "${common[@]}" parallel.generator.replicas=2
grep -q "generator replica 0 (rank 1): weights version 2: received .* the transfer is corrupted and was refused" corrupt.log \
  || { tail -5 corrupt.log; fail "a corrupted transfer was not refused by name"; }
echo "a corrupted transfer: $(grep -o 'generator replica 0 (rank 1): .*refused' corrupt.log | head -1)"
TRILL_TEST_CORRUPT_TRANSFER=2 ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" must_exit 1 corrupt.log "$MPIEXEC" -np 2 --oversubscribe \
  "$TRILL" train run_dir=corrupt_async steps=4 "${common[@]}" "${async[@]}" parallel.generator.replicas=1
grep -q "generator replica 0 (rank 1): weights version 2: received .* the transfer is corrupted and was refused" corrupt.log \
  || { tail -5 corrupt.log; fail "a corrupted transfer in async mode was not refused by name"; }
echo "and in async mode, with the replica's next batch"

ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" must_exit 1 bad.log "$MPIEXEC" -np 3 --oversubscribe "$TRILL" train run_dir=bad "${common[@]}" parallel.generator.replicas=1 steps=1
grep -q "parallel: trainer dp 1 x ep 1 x tp 1 = 1 ranks + parallel.generator.replicas 1 x ep 1 + parallel.scorer 0 = 2 ranks, but the job has 3 ranks" bad.log \
  || { cat bad.log; fail "a placement that does not add up was not refused with its arithmetic"; }
ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" must_exit 1 bad.log "$MPIEXEC" -np 2 --oversubscribe "$TRILL" train run_dir=bad "${common[@]}" parallel.scorer=1 "${async[@]}" steps=1
grep -q "parallel.scorer: asynchronous mode across ranks needs parallel.generator.replicas" bad.log || { cat bad.log; fail "async with a scorer rank alone was not refused"; }
echo "placements that do not add up, and async with a scorer rank but no replica, are refused"
# rank 0 failing alone while setting up (its run folder in use) fails every rank, at once
mkdir -p busy
flock busy/.lock sleep 60 >/dev/null 2>&1 &
holder=$!
sleep 0.2
ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" LIMIT=60 must_exit 1 busy.log "$MPIEXEC" -np 3 --oversubscribe "$TRILL" train run_dir=busy "${common[@]}" parallel.generator.replicas=2 steps=1
pkill -P "$holder" sleep || true # flock's child holds the lock too
wait "$holder" 2>/dev/null || true
grep -q "run_dir busy is in use by another trill train" busy.log && grep -q "another rank of the job failed while setting the run up" busy.log \
  || { cat busy.log; fail "a run folder in use did not fail every rank"; }
echo "a run folder in use on rank 0 fails the whole job at once"

# a run checkpointed with 2 replicas resumes on one process, and one of one process resumes with
# a replica and a scorer rank: both end with the bytes of an uninterrupted run
long=(checkpoint.every=2 rollouts.save=false)
run 0 whole steps=4 "${long[@]}"
run 3 moved steps=2 "${long[@]}" parallel.generator.replicas=2
run 0 moved steps=4 "${long[@]}" resume=auto
run 0 back steps=2 "${long[@]}"
run 3 back steps=4 "${long[@]}" resume=auto parallel.generator.replicas=1 parallel.scorer=1
for d in moved back; do
  grep -q "resuming from" "$d.log" || fail "$d did not resume"
  for f in adapter/adapter_model.safetensors optimizer.safetensors; do
    cmp -s "whole/checkpoints/step-00000004/$f" "$d/checkpoints/step-00000004/$f" || fail "$d: $f differs from an uninterrupted run's"
  done
done
echo "resumed on another placement (2 replicas -> one process -> a replica and a scorer): byte-identical to an uninterrupted run"

# a generator rank killed mid-run ends the job, naming the rank; resume=auto continues
ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" timeout -k 5 300 "$MPIEXEC" -np 3 --oversubscribe "$TRILL" train run_dir=killed \
  "${common[@]}" steps=100000 "${long[@]}" parallel.generator.replicas=2 >killed.log 2>&1 &
job=$!
kill_rank_1 "$job" "$TRILL train" killed.log
ls killed/checkpoints | grep step- >/dev/null || fail "no checkpoint from before the kill"
run 3 killed steps=6 "${long[@]}" resume=auto parallel.generator.replicas=2
grep -q "resuming from" killed.log || fail "the run after the kill did not resume"
echo "resume=auto after the generator rank's kill continued: $(grep -o 'resuming from [^ ]* at step [0-9]*' killed.log)"
echo "executors test passed"
