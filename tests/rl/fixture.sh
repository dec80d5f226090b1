# Sourced by the RL end-to-end tests: a scratch folder, a tiny random MoE (layer 0 dense, then
# MoE layers), two-digit addition prompts, a graded external reward, and the common overrides.
# Expects TRILL (the binary); defines PY, W, reply_deadline and COMMON, and (checks.sh) LIMIT, fail,
# clean_log, must_pass, must_exit and numeric.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/checks.sh" # fail, LIMIT, clean_log, must_pass, must_exit, numeric
PY=/usr/bin/python3
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
# A reward process's reply deadline for tests of its failures: relative to how long a Python
# process takes to start on this machine now (a restarted process's first reply includes it), so
# a loaded machine does not time out what should crash or answer: 10 x, at least 0.5 s.
reply_deadline() {
    $PY - <<'PY'
import subprocess, sys, time
t = time.monotonic()
subprocess.run([sys.executable, "-c", "import json, os, sys, time"], check=True)
print(f"{round(max(0.5, 10 * (time.monotonic() - t)), 2):g}")
PY
}
source "$(dirname "${BASH_SOURCE[0]}")/fixture_data.sh"
fixture_data "$TRILL"
# A 16 MB KV cache (thousands of the tiny model's tokens, more than any test's batch holds): under
# ASan, making and freeing the default 256 MB poisons its 32 MB of shadow each time, 0.18 of a
# trill train run's 0.47 s.
COMMON=(model=model data.train=train.jsonl data.eval=eval.jsonl data.eval_size=4 reward.verifier=demo
        "reward.external=$PY digits.py" generator.prompts_per_step=4 generator.n=4 generator.max_new_tokens=6 eval.k=2
        checkpoint.keep=0 trainer.schedule=constant trainer.lr=1e-2 generator.kv_cache_mb=16)
