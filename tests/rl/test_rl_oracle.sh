#!/usr/bin/env bash
# The RL option matrix against an independent float64 PyTorch oracle of one training step
# (tests/reference/rl_step_ref.py): a recorded batch, perturbed per case (behaviour log-probs
# so TIS caps and MIS masks, rewards with a flat group), trained by trill from a step-1
# checkpoint with rollouts.replay; the adapter after the step, the update and the step's
# metrics must match the oracle's.
# Usage: test_rl_oracle.sh TRILL [--verbose]
set -euo pipefail
TRILL=$(realpath "$1")
shift
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/fixture.sh"
COMMON+=(trainer.precision=fp32) # the oracle's tolerances are fp32's (auto picks bf16 on CPUs with AVX-512 BF16)
export OMP_NUM_THREADS=1 # tiny model: one thread is several times faster, and results are thread-independent

# The recordings: a step-2 checkpoint (nonzero LoRA B and Adam moments of every tensor) and the
# step-3 batch. rec_wd: a step-2 checkpoint made with weight decay (a resumed run keeps its
# checkpoint's optimizer settings).
must_pass log_rec "$TRILL" train "${COMMON[@]}" data.eval= run_dir=rec steps=3 rollouts.save=true checkpoint.every=1
must_pass log_rec_wd "$TRILL" train "${COMMON[@]}" data.eval= run_dir=rec_wd steps=2 checkpoint.every=1 trainer.weight_decay=0.5
[ -f rec/rollouts/step-00000003.bin ] && [ -d rec/checkpoints/step-00000002 ] && [ -d rec_wd/checkpoints/step-00000002 ] \
    || fail "recordings incomplete"

timeout -k 5 "$LIMIT" $PY "$HERE/../reference/rl_step_ref.py" suite --trill "$TRILL" "$@" -- "${COMMON[@]}" \
    || fail "trill's RL step differs from the oracle (see above)"
