#!/usr/bin/env bash
# Data-parallel `trill train` (parallel.trainer.dp) on the embedded demo, in micro-batches of 256
# tokens so that every rank count splits them differently: every rank runs the loop,
# trains its share of each minibatch's micro-batches and sums the gradients with the fixed tree, so
# no mpirun, 1, 2 and 4 ranks end with byte-identical adapters and optimizer state and the same
# metrics; also with two minibatches per step and a KL loss (the pre-pass of old and reference
# log-probs split over the ranks too). Rank 0 alone writes the run folder; a run checkpointed on one
# rank count resumes on another to the same bytes; a killed rank ends the job within seconds, naming
# the rank, and resume=auto continues. async mode is refused. Expert parallelism (parallel.trainer.ep,
# router replay on: the replayed ids decide the dispatch): EP 2 and DP 2 x EP 2 give the same
# adapters, optimizer state and metrics as one process, in adapter and in merge sync, and a run
# checkpointed under EP 2 resumes on one process to the same bytes. Tensor parallelism (TP 2, and
# merge sync under TP 2): the first step's gradient norm within 1e-5 relative of one process's (its
# loss within 1e-6); the adapters after 3 steps within 1e-3 of their largest value; under merge sync,
# what step 2 generates from the merged weights.
# The demo's warm start comes from the ctest fixture demo_cache (TRILL_TEST_DEMO_DIR, made by
# tests/rl/demo_warm_start.sh); without it the first run builds one here.
# Usage: test_rl_dp.sh TRILL MPIEXEC
set -euo pipefail
TRILL=$(realpath "$1")
MPIEXEC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/trill-rl-dp-XXXXXX")
trap 'rm -rf "$W"' EXIT
cd "$W"
export TRILL_CACHE_DIR="${TRILL_TEST_DEMO_DIR:-$W}/cache" OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
# (leak checking off under mpirun in the ASan build: Open MPI's own allocations; see test_sft_dp.sh)
source "$HERE/../rl/checks.sh" # must_pass, must_exit (exact status, within LIMIT, no sanitizer report), fail
LIMIT=${TRILL_TEST_LIMIT_S:-600} # a command's limit: the first run may make the demo's warm start
source "$HERE/kill_rank.sh"
MPI=(env "ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0" "$MPIEXEC")
# fp32: tensor parallelism's tolerance is fp32's, and every run here is compared with another
# (auto would pick bf16 on CPUs with AVX-512 BF16 only)
FP32=(trainer.precision=fp32)
run() { # run NP DIR ARGS...: trill train on NP ranks (0: no mpirun), exit 0 within LIMIT, its log DIR.log clean
  local np=$1 dir=$2
  shift 2
  if [ "$np" -eq 0 ]; then
    must_pass "$dir.log" "$TRILL" train run_dir="$dir" checkpoint.every=0 "${FP32[@]}" "$@"
  else
    must_pass "$dir.log" "${MPI[@]}" -np "$np" --oversubscribe "$TRILL" train run_dir="$dir" checkpoint.every=0 parallel.trainer.dp="$np" "${FP32[@]}" "$@"
  fi
}
same() { # same A B STEPS: the last checkpoint's adapter and optimizer, and the metrics (STEPS lines) but for times
  local a=$1 b=$2 ck="checkpoints/step-0000000$3"
  for f in adapter/adapter_model.safetensors optimizer.safetensors; do
    cmp -s "$a/$ck/$f" "$b/$ck/$f" || fail "$a/$ck/$f and $b/$ck/$f differ"
  done
  /usr/bin/python3 - "$a/metrics.jsonl" "$b/metrics.jsonl" "$3" <<'PY' || fail "$a and $b: the metrics differ"
import json, sys
def load(p):
    out = []
    for l in open(p):
        m = json.loads(l)
        for k in ("time", "sync_ms", "comm"): m.pop(k, None)
        out.append(m)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(b) == int(sys.argv[3]), ("metrics lines", len(a), len(b), "expected", sys.argv[3])
assert a == b, [(k, x[k], y[k]) for x, y in zip(a, b) for k in x if x[k] != y.get(k)][:5]
PY
}

run 0 one steps=3 trainer.micro_batch_tokens=256
for np in 1 2 4; do
  run "$np" "dp$np" steps=3 trainer.micro_batch_tokens=256
  same one "dp$np" 3
  echo "demo, 3 steps on $np rank(s): adapter, optimizer and metrics identical to one process"
done
[ "$(grep -c '^step 3/3' dp4.log)" -eq 1 ] || fail "the 4-rank run logged its steps $(grep -c '^step 3/3' dp4.log) times (rank 0 alone logs)"
/usr/bin/python3 - dp2/metrics.jsonl one/metrics.jsonl <<'PY' || fail "the 2-rank metrics do not carry the step's communication"
import json, sys
dp = [json.loads(l) for l in open(sys.argv[1])]
one = [json.loads(l) for l in open(sys.argv[2])]
assert all("comm" not in m for m in one), "a one-process run reports communication"
for m in dp:
    c = m["comm"]
    assert c["gather"]["bytes"] > 0 and c["allreduce"]["bytes"] > 0 and c["gather"]["ms"] >= 0, c
print("2 ranks, a step's communication from rank 0:", {k: (v["bytes"], round(v["ms"], 2)) for k, v in dp[-1]["comm"].items()})
PY
run 0 mb1 steps=2 trainer.micro_batch_tokens=256 algo.minibatches=2 algo.kl_coef=0.01 algo.kl_mode=loss
run 2 mb2 steps=2 trainer.micro_batch_tokens=256 algo.minibatches=2 algo.kl_coef=0.01 algo.kl_mode=loss
same mb1 mb2 2
echo "two minibatches a step with a KL loss on 2 ranks: identical to one process"
# a run checkpointed on one rank count resumes on another: 2 ranks -> 1 and 1 -> 4, byte-identical
# to 4 uninterrupted steps (the checkpoints are rank 0's; every rank reads them)
long=(trainer.micro_batch_tokens=256 checkpoint.every=2)
run 0 whole steps=4 "${long[@]}"
run 2 r21 steps=2 "${long[@]}"
run 0 r21 steps=4 "${long[@]}" resume=auto
run 0 r14 steps=2 "${long[@]}"
run 4 r14 steps=4 "${long[@]}" resume=auto
grep -q "resuming from" r14.log || fail "the 4-rank run did not resume"
for d in r21 r14; do
  for f in adapter/adapter_model.safetensors optimizer.safetensors; do
    cmp -s "whole/checkpoints/step-00000004/$f" "$d/checkpoints/step-00000004/$f" || fail "$d: $f differs from an uninterrupted run's"
  done
done
echo "resumed on another rank count (2 -> 1, 1 -> 4): byte-identical to an uninterrupted run"
# a rank killed mid-run ends the job within seconds, naming the rank; resume=auto continues
timeout -k 5 300 "${MPI[@]}" -np 2 --oversubscribe "$TRILL" train run_dir=killed \
  parallel.trainer.dp=2 steps=100000 checkpoint.every=2 "${long[@]:0:1}" "${FP32[@]}" >killed.log 2>&1 &
job=$!
kill_rank_1 "$job" "$TRILL train" killed.log
ls killed/checkpoints | grep step- >/dev/null || fail "no checkpoint from before the kill"
run 2 killed steps=6 checkpoint.every=2 "${long[@]:0:1}" resume=auto
grep -q "resuming from" killed.log || fail "the run after the kill did not resume"
echo "resume=auto after the kill continued: $(grep -o 'resuming from [^ ]* at step [0-9]*' killed.log)"
# expert parallelism: the demo's 8 experts in shards of 4 (EP 2) and over 2 x 2 ranks
run 2 ep2 steps=3 trainer.micro_batch_tokens=256 parallel.trainer.dp=1 parallel.trainer.ep=2
same one ep2 3
run 4 dp2ep2 steps=3 trainer.micro_batch_tokens=256 parallel.trainer.dp=2 parallel.trainer.ep=2
same one dp2ep2 3
/usr/bin/python3 - ep2/metrics.jsonl <<'PY' || fail "the EP 2 metrics do not carry the all-to-all"
import json, sys
for l in open(sys.argv[1]):
    c = json.loads(l)["comm"]
    assert c["alltoallv"]["bytes"] > 0 and c["alltoallv"]["bytes"] % (256 * 4) == 0 and c["counts"]["bytes"] > 0, c
PY
echo "demo, 3 steps under EP 2 and DP 2 x EP 2: adapter, optimizer and metrics identical to one process"
run 0 merge1 steps=2 trainer.micro_batch_tokens=256 sync.mode=merge
run 2 merge2 steps=2 trainer.micro_batch_tokens=256 sync.mode=merge parallel.trainer.dp=1 parallel.trainer.ep=2
same merge1 merge2 2
run 2 rep steps=2 "${long[@]}" parallel.trainer.dp=1 parallel.trainer.ep=2
run 0 rep steps=4 "${long[@]}" resume=auto
for f in adapter/adapter_model.safetensors optimizer.safetensors; do
  cmp -s "whole/checkpoints/step-00000004/$f" "rep/checkpoints/step-00000004/$f" || fail "rep: $f differs from an uninterrupted run's"
done
echo "merge sync under EP 2 identical to one process; EP 2 -> 1 process resumed byte-identical"
# tensor parallelism: the heads and the dense MLP split over 2 ranks, within the reductions' order
# near A B: step 1's gradient norm within 1e-5 relative and its loss within 1e-6 (the loss is a
# mean of advantage-weighted ratios of order 1 that cancel to about 1e-4 at step 1: its rounding
# is the terms' size, 1e-5 of the loss itself is below float32's); the last adapters within 1e-3
# of their largest value
near() {
  /usr/bin/python3 - "$1" "$2" <<'PY' || fail "$1 and $2: the first step's figures differ"
import json, sys
a, b = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in sys.argv[1:3])
assert abs(a[0]["loss"] - b[0]["loss"]) <= 1e-6, ("loss", a[0]["loss"], b[0]["loss"])
assert abs(a[0]["grad_norm"] - b[0]["grad_norm"]) <= 1e-5 * abs(a[0]["grad_norm"]), ("grad_norm", a[0]["grad_norm"], b[0]["grad_norm"])
print(f"  step 1: loss {a[0]['loss']:.9g} vs {b[0]['loss']:.9g}, gradient norm {a[0]['grad_norm']:.9g} vs {b[0]['grad_norm']:.9g}")
PY
  local last
  last=$(ls "$1/checkpoints" | tail -1)
  /usr/bin/python3 "$HERE/st_close.py" "$1/checkpoints/$last/adapter/adapter_model.safetensors" "$2/checkpoints/$last/adapter/adapter_model.safetensors" 1e-3 \
    || fail "$1 and $2: adapters differ"
}
run 2 tp2 steps=3 trainer.micro_batch_tokens=256 parallel.trainer.dp=1 parallel.trainer.tp=2
near one tp2
# merge sync under TP 2: the first step's figures as above; then what the merged weights generate at
# step 2 against one process's (the same sequences, log-probs within the bf16 rounding of weights
# merged in another reduction order). Not the adapters after it: the generator's log-probs enter
# the TIS weights, and AdamW's first steps move a weight by about lr whatever its gradient's size,
# so the 3e-3 between log-probs moved the adapters by 0.3-0.5% of their largest value.
run 0 merge1r steps=2 trainer.micro_batch_tokens=256 sync.mode=merge rollouts.save=true
run 2 mergetp steps=2 trainer.micro_batch_tokens=256 sync.mode=merge parallel.trainer.dp=1 parallel.trainer.tp=2 rollouts.save=true
PYTHONPATH="$HERE/../reference" /usr/bin/python3 - merge1r mergetp <<'PY' || fail "merge sync under TP 2: step 2's rollouts differ from one process's"
import json, sys
import numpy as np
import rollouts
a_dir, b_dir = sys.argv[1:3]
ma, mb = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in (a_dir, b_dir))
assert abs(ma[0]["loss"] - mb[0]["loss"]) <= 1e-6 and abs(ma[0]["grad_norm"] - mb[0]["grad_norm"]) <= 1e-5 * abs(ma[0]["grad_norm"]), (ma[0], mb[0])
a, b = (rollouts.read(d + "/rollouts/step-00000002.bin") for d in (a_dir, b_dir))
same = [s for s in range(a["n_seqs"]) if np.array_equal(a["tokens"][a["offsets"][s]:a["offsets"][s + 1]], b["tokens"][b["offsets"][s]:b["offsets"][s + 1]])]
assert len(same) >= 0.9 * a["n_seqs"], f"{len(same)} of {a['n_seqs']} sequences alike"
d = max(float(np.nanmax(np.abs(a["behav_logp"][a["offsets"][s]:a["offsets"][s + 1]] - b["behav_logp"][b["offsets"][s]:b["offsets"][s + 1]]))) for s in same)
assert d <= 0.02, f"log-probs {d} apart"
print(f"  merge sync, step 2: {len(same)} of {a['n_seqs']} sequences alike, log-probs within {d:.2g}")
PY
echo "demo under TP 2 (adapter and merge sync): within the reductions' order of one process"
must_exit 1 bad.log "${MPI[@]}" -np 2 --oversubscribe "$TRILL" train run_dir=bad parallel.trainer.ep=2 generator.on_policy=true steps=1
grep -q "generator.on_policy: its scoring engine needs the whole model, and parallel.trainer.ep 2 shards it" bad.log || { cat bad.log; fail "on-policy mode under EP was not refused"; }
must_exit 1 bad.log "${MPI[@]}" -np 2 --oversubscribe "$TRILL" train run_dir=bad parallel.trainer.dp=2 mode=async steps=1
grep -q "parallel.trainer.dp: 2 ranks need mode: sync" bad.log || { cat bad.log; fail "async on 2 ranks was not refused"; }
echo "rl data-parallel test passed"
