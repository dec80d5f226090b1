#!/usr/bin/env bash
# The embedded demo's warm start, built once for the tests that run the demo (the ctest fixture
# demo_cache of rl_demo_learns and dist_rl_dp): DIR/cache is emptied and two `trill train` runs
# start on it at once, as the ranks of an mpirun job or two users' runs would. One builds the warm
# start (SFT to its target); the other waits for it, then finds it cached: neither removes or
# rewrites the folder the other is writing, and the SFT runs once. The first run's 4 RL steps
# (checkpoints every 2) must leave a complete run folder. DIR/cache, DIR/first.log and DIR/run1
# stay for rl_demo_learns.
# Usage: demo_warm_start.sh TRILL DIR
set -euo pipefail
TRILL=$(realpath "$1")
D=$2
source "$(cd "$(dirname "$0")" && pwd)/checks.sh" # fail, LIMIT, must_pass, clean_log
LIMIT=${TRILL_TEST_LIMIT_S:-600}
rm -rf "$D"
mkdir -p "$D"
cd "$D"
export TRILL_CACHE_DIR="$D/cache"

must_pass first.log "$TRILL" train run_dir=run1 steps=4 checkpoint.every=2 &
first=$!
# the second run starts while the first holds the cache's lock and builds the warm start
for _ in $(seq 600); do grep -q "preparing two-digit addition" first.log 2>/dev/null && break; sleep 0.1; done
grep -q "preparing two-digit addition" first.log || { cat first.log; fail "the first run never started the warm start"; }
must_pass second.log "$TRILL" train run_dir=run2 steps=1 checkpoint.every=0
wait "$first" || fail "the first run failed (above)"

grep "warm start done\|held-out" first.log
grep -q "warm start done" first.log || fail "the first run did not build the warm start"
grep -q "trill demo: another process holds .*\.lock; waiting for it" second.log || { cat second.log; fail "the second run did not wait for the first"; }
grep -q "using the cached warm start" second.log || { cat second.log; fail "the second run did not use the warm start the first built"; }
grep -q "warm start done\|preparing two-digit" second.log && fail "the second run built the warm start too"
pass1() { sed -n "s/.*held-out $1: pass@1 \([0-9.]*\)%.*/\1/p" "$2"; }
[ -n "$(pass1 before first.log)" ] && [ -n "$(pass1 after first.log)" ] || fail "no held-out accuracy"
[ "$(pass1 before first.log)" = "$(pass1 before second.log)" ] || fail "the same warm start evaluated differently: $(pass1 before first.log)% vs $(pass1 before second.log)%"
[ "$(wc -l <run1/metrics.jsonl)" -eq 4 ] || fail "metrics.jsonl should have 4 lines"
[ -f run1/config.yaml ] && [ -d run1/checkpoints/step-00000004/adapter ] || fail "run folder incomplete"
/usr/bin/python3 -c "import json
m=[json.loads(l) for l in open('run1/metrics.jsonl')]
for k in ('reward','accuracy','mismatch_k3','flip_token_frac','sync_bytes','sync_ms','time','grad_norm'):
    assert k in m[-1], k
assert all(x['flip_token_frac'] == 0 for x in m), m   # router replay is on in the demo
assert [x['policy_version'] for x in m] == [1, 2, 3, 4]"
"$TRILL" train run1/config.yaml --print-config >resolved.yaml || fail "run1/config.yaml does not load"
echo "the demo's warm start: built once by the first of two runs started together, the second waited and used it"
