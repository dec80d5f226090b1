#!/usr/bin/env bash
# Data-parallel `trill sft` on MPI (parallel.trainer.dp): 1, 2 and 4 ranks (and no mpirun at all)
# write byte-identical adapters, optimizer state and held-out loss after 3 steps of LoRA, and the
# same for full fine-tuning on 1 and 2; a job whose rank count is not dp x ep x tp is refused with
# the arithmetic, and so are tensor parallelism and the commands that run on one process;
# expert parallelism (the tiny preset's 8 experts over EP 2, EP 4 and DP 2 x EP 2) writes the same
# bytes as one process, resumes across layouts, and refuses 3 ranks (8 experts) and full
# fine-tuning; tensor parallelism (TP 2, DP 2 x TP 2) reaches the same held-out loss and adapters
# within 1e-3 of the adapter's largest value after 3 AdamW steps (its gradients are within 1e-5
# relative of one rank's: test_tp), and its slicing and gathering are exact: a finished run's
# checkpoint loaded under TP 2 is written back byte for byte;
# trill bench train shares its batch over 2 ranks; a run stopped on one rank count resumes on another
# to the same bytes; a killed rank ends the job within seconds, naming the rank, and resume=auto
# continues.
# Usage: test_sft_dp.sh TRILL MPIEXEC
set -euo pipefail
TRILL=$(realpath "$1")
MPIEXEC=$2
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/trill-sft-dp-XXXXXX")
trap 'rm -rf "$W"' EXIT
cd "$W"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
# In the ASan build, leak checking is off under mpirun: Open MPI's own allocations (in plugins it
# unloads at MPI_Finalize, so no suppression can name them) are reported as leaks. The runs
# without mpirun, and the tree sum in test_comm alone, keep it on.
source "$HERE/../rl/checks.sh" # must_pass, must_exit (exact status, within LIMIT, no sanitizer report), numeric, fail
source "$HERE/kill_rank.sh"
MPI=(env "ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0" "$MPIEXEC")
/usr/bin/python3 - <<'PY'
import json, random
r = random.Random(0)
def ex():
    w = ''.join(r.choice('abcdefgh') for _ in range(r.randint(3, 8)))
    return {"prompt": "Q: " + w + "\nA:", "completion": " ok " + w[0] + "."}
for name, n in (("train", 96), ("heldout", 20)):
    with open(f"{name}.jsonl", "w") as f:
        for _ in range(n): f.write(json.dumps(ex()) + "\n")
PY
"$TRILL" init --out model --preset tiny --seed 1 2>/dev/null
# 3 steps of 4 micro-batches of ~128 tokens: each rank count splits them differently (4 ranks: one each)
common=(--model model --data train.jsonl --eval heldout.jsonl trainer.micro_batch_tokens=128 sft.grad_accum=4 sft.max_steps=3
        trainer.lr=3e-3 trainer.lora.targets=q,k,v,o,gate,up,down,lm_head
        trainer.precision=fp32) # tensor parallelism's tolerance is fp32's (auto picks bf16 on CPUs with AVX-512 BF16)
run() { # run NP OUT ARGS...: trill sft on NP ranks (0: no mpirun), exit 0 within LIMIT, its log OUT.log clean
  local np=$1 out=$2
  shift 2
  if [ "$np" -eq 0 ]; then
    must_pass "$out.log" "$TRILL" sft "${common[@]}" --out "$out" "$@"
  else
    must_pass "$out.log" "${MPI[@]}" -np "$np" --oversubscribe "$TRILL" sft "${common[@]}" --out "$out" parallel.trainer.dp="$np" "$@"
  fi
}
same_loss() { # same_loss A B: the last held-out loss of A.log and B.log, both numbers, equal
  local a b
  a=$(sed -n 's/.*eval loss \([0-9.]*\) (.*/\1/p' "$1.log" | tail -1)
  b=$(sed -n 's/.*eval loss \([0-9.]*\) (.*/\1/p' "$2.log" | tail -1)
  numeric "$1: the held-out loss" "$a"
  numeric "$2: the held-out loss" "$b"
  [ "$a" = "$b" ] || fail "held-out loss of $1 $a vs $2 $b"
  loss=$a
}
close() { # close A B: adapters within 1e-3 of the largest value of the first (tensor parallelism's order of sums)
  /usr/bin/python3 "$HERE/st_close.py" "$1/adapter_model.safetensors" "$2/adapter_model.safetensors" 1e-3 || fail "$1 and $2: adapters differ"
}
same() { # same A B FILES...: byte-identical
  local a=$1 b=$2
  shift 2
  for f in "$@"; do cmp -s "$a/$f" "$b/$f" || fail "$a/$f and $b/$f differ"; done
}

run 0 lora0 --lora
for np in 1 2 4; do
  run "$np" "lora$np" --lora
  same lora0 "lora$np" adapter_model.safetensors optimizer.safetensors
  same_loss lora0 "lora$np"
  grep -q "data-parallel" "lora$np.log" || [ "$np" -eq 1 ] || fail "the $np-rank run does not say it is data-parallel"
  echo "LoRA, $np rank(s): adapter and optimizer byte-identical to one process; held-out loss $loss"
done
[ "$(grep -c '^step 3/3' lora4.log)" -eq 1 ] || fail "the 4-rank run logged its steps $(grep -c '^step 3/3' lora4.log) times (rank 0 alone logs)"
for layout in "2 1 2" "4 1 4" "4 2 2"; do # ranks, dp, ep
  read -r np dp ep <<<"$layout"
  run "$np" "ep$np$dp" --lora parallel.trainer.dp="$dp" parallel.trainer.ep="$ep"
  same lora0 "ep$np$dp" adapter_model.safetensors optimizer.safetensors
  same_loss lora0 "ep$np$dp"
  echo "LoRA, dp $dp x ep $ep: adapter and optimizer byte-identical to one process"
done
for layout in "2 1 2" "4 2 2"; do # ranks, dp, tp
  read -r np dp tp <<<"$layout"
  run "$np" "tp$np$dp" --lora parallel.trainer.dp="$dp" parallel.trainer.tp="$tp"
  close lora0 "tp$np$dp"
  same_loss lora0 "tp$np$dp"
  echo "LoRA, dp $dp x tp $tp: the same held-out loss, adapters within 1e-3 of one process's"
done
# the merged checkpoints (W + scale B A, fp32): within the adapters' tolerance
must_pass merge0.log "$TRILL" merge --model model --adapter lora0 --out merged0 --dtype f32
must_pass merge2.log "$TRILL" merge --model model --adapter tp21 --out merged2 --dtype f32
/usr/bin/python3 "$HERE/st_close.py" merged0/model.safetensors merged2/model.safetensors 1e-3 || fail "the merged checkpoints of one process and of TP 2 differ"
cp -r lora0 tpgather
run 2 tpgather --lora parallel.trainer.dp=1 parallel.trainer.tp=2 resume=auto # every step taken: loaded in slices, gathered, saved
same lora0 tpgather adapter_model.safetensors optimizer.safetensors
echo "a finished run's checkpoint loaded under TP 2 is written back byte for byte (slices loaded and gathered exactly)"
run 0 full0 --full
run 2 full2 --full
same full0 full2 model.safetensors optimizer.safetensors
echo "full fine-tuning, 2 ranks: model and optimizer byte-identical to one process"

# resume on another rank count: 2 ranks stop after 6 of 12 steps, 1 rank finishes; 1 rank stops, 4
# finish; both equal one process's uninterrupted 12 steps byte for byte
long=(sft.max_steps=12 sft.epochs=10 sft.save_every=4)
run 0 whole --lora "${long[@]}"
run 2 r21 --lora "${long[@]}" sft.stop_after=6
cp r21/trainer_state.json r21.state
run 0 r21 --lora "${long[@]}" resume=auto
grep -q '"step": *6' r21.state || fail "the 2-rank run did not stop at step 6: $(cat r21.state)"
same whole r21 adapter_model.safetensors optimizer.safetensors
run 0 r14 --lora "${long[@]}" sft.stop_after=6
run 4 r14 --lora "${long[@]}" resume=auto
same whole r14 adapter_model.safetensors optimizer.safetensors
run 2 re21 --lora "${long[@]}" sft.stop_after=6 parallel.trainer.dp=1 parallel.trainer.ep=2
run 0 re21 --lora "${long[@]}" resume=auto
same whole re21 adapter_model.safetensors optimizer.safetensors
run 0 re14 --lora "${long[@]}" sft.stop_after=6
run 4 re14 --lora "${long[@]}" resume=auto parallel.trainer.dp=2 parallel.trainer.ep=2
same whole re14 adapter_model.safetensors optimizer.safetensors
echo "resumed on another rank count (2 -> 1, 1 -> 4; EP 2 -> 1, 1 -> DP 2 x EP 2): byte-identical to an uninterrupted run"

# a rank killed mid-run ends the job within seconds, naming the rank; resume=auto continues
timeout -k 5 120 "${MPI[@]}" -np 2 --oversubscribe "$TRILL" sft "${common[@]}" --out killed \
    --lora parallel.trainer.dp=2 sft.max_steps=100000 sft.epochs=100000 sft.save_every=2 >killed.log 2>&1 &
job=$!
kill_rank_1 "$job" "$TRILL sft" killed.log
step=$(ls -d killed/checkpoints/step-* 2>/dev/null | tail -1 | sed 's/.*step-0*//')
[ -n "$step" ] && [ "$step" -ge 2 ] || fail "no checkpoint from before the kill"
run 2 killed --lora sft.max_steps=100000 sft.epochs=100000 sft.save_every=2 resume=auto sft.stop_after=$((step + 2))
grep -q "resuming" killed.log || fail "the run after the kill did not resume"
grep -q "^step $((step + 2))/" killed.log || fail "the resumed run did not continue from step $step"
echo "resume=auto after the kill continued from step $step"

# refusals: the arithmetic, expert/tensor parallelism, a command that runs on one process
must_exit 1 bad.log "${MPI[@]}" -np 2 --oversubscribe "$TRILL" sft "${common[@]}" --out bad parallel.trainer.dp=4 --lora
grep -q "dp 4 x ep 1 x tp 1 = 4 trainer ranks, but the job has 2 ranks" bad.log || { cat bad.log; fail "a wrong rank count was not refused"; }
must_exit 1 bad.log "${MPI[@]}" -np 3 --oversubscribe "$TRILL" sft "${common[@]}" --out bad parallel.trainer.ep=3 --lora
grep -q "parallel.trainer.ep: 3 expert-parallel ranks need routed experts in a multiple of 3, but this Qwen3MoeForCausalLM has 8" bad.log \
  || { cat bad.log; fail "ep 3 over 8 experts was not refused"; }
must_exit 1 bad.log "${MPI[@]}" -np 4 --oversubscribe "$TRILL" sft "${common[@]}" --out bad parallel.trainer.tp=4 --lora
grep -q "parallel.trainer.tp: 4 tensor-parallel ranks split the attention heads (4, 2 key-value)" bad.log \
  || { cat bad.log; fail "tp 4 over 2 key-value heads was not refused"; }
must_exit 1 bad.log "${MPI[@]}" -np 4 --oversubscribe "$TRILL" sft "${common[@]}" --out bad parallel.trainer.tp=2 parallel.trainer.ep=2 --lora
grep -q "expert and tensor parallelism together are not built" bad.log || { cat bad.log; fail "ep with tp was not refused"; }
must_exit 1 bad.log "${MPI[@]}" -np 2 --oversubscribe "$TRILL" sft "${common[@]}" --out bad parallel.trainer.ep=2 --full
grep -q "sft.mode full: full fine-tuning with parallel.trainer.ep 2 is not built" bad.log || { cat bad.log; fail "full fine-tuning under EP was not refused"; }
must_exit 1 bad.log "${MPI[@]}" -np 2 --oversubscribe "$TRILL" sft "${common[@]}" --out bad parallel.trainer.tp=2 --full
grep -q "sft.mode full: full fine-tuning with parallel.trainer.tp 2 is not built" bad.log || { cat bad.log; fail "full fine-tuning under TP was not refused"; }
must_exit 2 bad.log "${MPI[@]}" -np 2 --oversubscribe "$TRILL" info --model model # a usage error (EXIT_USAGE)
grep -q "trill info: runs on one process, but this job has 2 ranks" bad.log || { cat bad.log; fail "trill info on 2 ranks was not refused"; }
# trill bench train shares its batch over the ranks
must_pass bench.log "${MPI[@]}" -np 2 --oversubscribe "$TRILL" bench train --model model --batch 2 --seq 16 --runs 1 >bench.out
out=$(cat bench.out)
grep -q "2 ranks, 2 data-parallel (1 sequences each" <<<"$out" && grep -q "^trill train (lora" <<<"$out" || { echo "$out"; fail "bench train on 2 ranks printed no data-parallel figures"; }
must_exit 2 bad.log "${MPI[@]}" -np 2 --oversubscribe "$TRILL" bench train --model model --batch 1 --seq 16
grep -q "fewer sequences than the job's 2 ranks" bad.log || { cat bad.log; fail "bench train with fewer sequences than ranks was not refused"; }
echo "sft data-parallel test passed"
