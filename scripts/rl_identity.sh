#!/usr/bin/env bash
# The RL core's refactoring guard (issue 36's invariants): runs the RL configurations below with a
# trill binary and records what they wrote, so that a refactor can show it changed nothing:
# every checkpoint's tensors (adapter, optimizer, full weights), every step's saved rollouts
# (tokens, log-probs, versions, routed experts), metrics.jsonl and eval.jsonl less their timings,
# and the warm start the demo builds. Two records of the same tree are identical; compare the
# record of a refactor with the one of the commit before it.
#   scripts/rl_identity.sh record TRILL OUT   run everything into OUT (OUT/runs: the run folders;
#                                             OUT/digest: one line per file, sha256 and path)
#   scripts/rl_identity.sh compare A B        the files whose digests differ (exit 1 if any)
# Example: git worktree add /tmp/before HEAD~1 && make -C /tmp/before build
#          scripts/rl_identity.sh record /tmp/before/build/trill /tmp/id-before
#          scripts/rl_identity.sh record build/trill /tmp/id-after
#          scripts/rl_identity.sh compare /tmp/id-before /tmp/id-after
# The configurations: the embedded demo (3 steps on its warm start, built by this binary); the RL
# tests' fixture (tests/rl/fixture.sh); merge sync with a bf16 generator; the KL as a reward with
# 2 minibatches; the KL as a loss with GSPO, TIS, MIS and dynamic sampling; no router replay, an
# int8 generator and CISPO; async at max_staleness 0; 2 external reward workers; on MPI, DP 2,
# EP 2, 2 generator replicas + a scorer rank, async across ranks; and trill sft, LoRA and full.
# Runs on 2 OpenMP threads; the MPI runs need mpirun (skipped with a line if there is none).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

digest() { # digest OUT: sha256 of every recorded file, the timings taken out of the JSON lines
  local out=$1
  (cd "$out/runs" && find . -type f \( -name '*.safetensors' -o -path '*/rollouts/*' -o -name metrics.jsonl \
      -o -name eval.jsonl -o -name trainer_state.json \) | LC_ALL=C sort | while read -r f; do
    case "$f" in
      *.jsonl | *.json) /usr/bin/python3 - "$f" <<'PY'
import hashlib, json, re, sys
TIMING = re.compile(r"^(time|seconds|ms|s|.*_s|.*_ms|.*_per_s|rss_.*|.*_faults|wall.*)$")
def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if not TIMING.match(k)}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x
path = sys.argv[1]
text = open(path).read()
lines = text.splitlines() if path.endswith(".jsonl") else [text]
h = hashlib.sha256()
for line in lines:
    if line.strip():
        h.update(json.dumps(strip(json.loads(line)), sort_keys=True).encode() + b"\n")
print(h.hexdigest(), path)
PY
        ;;
      *) sha256sum "$f" ;;
    esac
  done) >"$out/digest"
  echo "$(wc -l <"$out/digest") files recorded in $out/digest"
}

record() {
  local trill out mpiexec
  trill=$(realpath "$1")
  out=$(mkdir -p "$2" && realpath "$2")
  rm -rf "$out/runs" && mkdir -p "$out/runs"
  cd "$out/runs"
  export OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=1 TRILL_CACHE_DIR="$out/runs/demo-cache"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
  local t0=$SECONDS
  run() { # run NAME ARGS...: trill ARGS, its log NAME.log; a failure stops the record
    local name=$1
    shift
    echo "  $name"
    "$@" >"$name.log" 2>&1 || { tail -20 "$name.log"; echo "rl_identity: $name failed (exit $?): $*" >&2; exit 1; }
  }
  echo "rl_identity: recording $trill into $out"
  run demo "$trill" train run_dir=demo steps=3 checkpoint.every=1
  # the RL tests' fixture (tests/rl/fixture_data.sh): a tiny MoE (layer 0 dense), two-digit sums,
  # a graded external reward; and SFT data of the same task
  source "$ROOT/tests/rl/fixture_data.sh"
  fixture_data "$trill"
  local common=(model=model data.train=train.jsonl data.eval=eval.jsonl data.eval_size=4 reward.verifier=demo
                "reward.external=/usr/bin/python3 digits.py" generator.prompts_per_step=4 generator.n=4 generator.max_new_tokens=6
                eval.k=2 eval.every=2 checkpoint.keep=0 checkpoint.every=2 trainer.schedule=constant trainer.lr=1e-2 rollouts.save=true
                trainer.micro_batch_tokens=64 steps=4)
  run fixture "$trill" train "${common[@]}" run_dir=fixture
  run merge_bf16 "$trill" train "${common[@]}" run_dir=merge_bf16 sync.mode=merge generator.dtype=bf16
  run kl_reward_mb2 "$trill" train "${common[@]}" run_dir=kl_reward_mb2 algo.kl_coef=0.05 algo.kl_mode=reward algo.minibatches=2
  run kl_loss_gspo "$trill" train "${common[@]}" run_dir=kl_loss_gspo algo.kl_coef=0.05 algo.kl_mode=loss algo.loss=gspo \
      correction.tis=2 "correction.mis=[0.5, 5]" correction.mis_level=sequence algo.dynamic_sampling=true
  run cispo_int8_noreplay "$trill" train "${common[@]}" run_dir=cispo_int8_noreplay router_replay=false generator.dtype=int8 algo.loss=cispo
  run async0 "$trill" train "${common[@]}" run_dir=async0 mode=async async.max_staleness=0 eval.every=0
  run workers2 "$trill" train "${common[@]}" run_dir=workers2 reward.external_workers=2
  run sft_lora "$trill" sft --model model --data sft.jsonl --eval sft_eval.jsonl --out sft_lora --lora trainer.micro_batch_tokens=64 \
      sft.max_steps=6 sft.save_every=3 trainer.lr=3e-3
  run sft_full "$trill" sft --model model --data sft.jsonl --eval sft_eval.jsonl --out sft_full --full trainer.micro_batch_tokens=64 \
      sft.max_steps=6 sft.save_every=3 trainer.lr=1e-3
  mpiexec=$(command -v mpiexec || true)
  if [ -n "$mpiexec" ]; then
    local mpi=("$mpiexec" --oversubscribe)
    run dp2 "${mpi[@]}" -np 2 "$trill" train "${common[@]}" run_dir=dp2 parallel.trainer.dp=2
    run ep2 "${mpi[@]}" -np 2 "$trill" train "${common[@]}" run_dir=ep2 parallel.trainer.ep=2
    run replicas2_scorer "${mpi[@]}" -np 4 "$trill" train "${common[@]}" run_dir=replicas2_scorer parallel.generator.replicas=2 \
        parallel.scorer=1
    run async_ranks "${mpi[@]}" -np 2 "$trill" train "${common[@]}" run_dir=async_ranks mode=async async.max_staleness=1 \
        parallel.generator.replicas=1 eval.every=0
  else
    echo "  (no mpiexec: the MPI configurations are not recorded)"
  fi
  digest "$out"
  echo "rl_identity: recorded in $((SECONDS - t0)) s"
}

compare() {
  local a=$1 b=$2
  if diff <(awk '{ print $2, $1 }' "$a/digest") <(awk '{ print $2, $1 }' "$b/digest") >/dev/null; then
    echo "rl_identity: $(wc -l <"$a/digest") files identical ($a, $b)"
  else
    echo "rl_identity: these files differ (path, digest; < $a, > $b):"
    diff <(awk '{ print $2, $1 }' "$a/digest") <(awk '{ print $2, $1 }' "$b/digest") | grep '^[<>]'
    return 1
  fi
}

case "${1:-}" in
  record) [ $# -eq 3 ] || { echo "usage: $0 record TRILL OUT" >&2; exit 2; }; record "$2" "$3" ;;
  compare) [ $# -eq 3 ] || { echo "usage: $0 compare A B" >&2; exit 2; }; compare "$2" "$3" ;;
  *) echo "usage: $0 record TRILL OUT | compare A B" >&2; exit 2 ;;
esac
