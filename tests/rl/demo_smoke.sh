#!/usr/bin/env bash
# Smoke run of the embedded demo's config (`trill train` with no config file): the warm start is
# built into a fresh cache, a few RL steps run, the held-out accuracy is printed before and
# after, and a second run finds the warm start in the cache.
set -euo pipefail
TRILL=$(realpath "$1")
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cd "$W"
export TRILL_CACHE_DIR="$W/cache"
fail() { echo "FAIL: $*" >&2; exit 1; }

"$TRILL" train run_dir=run1 steps=4 checkpoint.every=2 2>log1 || { cat log1; fail "demo run"; }
cat log1
grep -q "warm start done" log1 || fail "no warm start"
grep -q "held-out before: pass@1" log1 && grep -q "held-out after: pass@1" log1 || fail "no held-out accuracy"
[ "$(wc -l <run1/metrics.jsonl)" -eq 4 ] || fail "metrics.jsonl should have 4 lines"
[ -f run1/config.yaml ] && [ -d run1/checkpoints/step-00000004/adapter ] || fail "run folder incomplete"
/usr/bin/python3 -c "import json
m=[json.loads(l) for l in open('run1/metrics.jsonl')]
for k in ('reward','accuracy','mismatch_k3','flip_token_frac','sync_bytes','sync_ms','time','grad_norm'):
    assert k in m[-1], k
assert m[-1]['flip_token_frac'] == 0, m[-1]   # router replay is on in the demo
assert m[-1]['policy_version'] == 4"
"$TRILL" train run_dir=run2 steps=1 2>log2 || { cat log2; fail "second demo run"; }
grep -q "cached warm start" log2 || { cat log2; fail "the warm start was not cached"; }
grep -q "warm start done" log2 && fail "the warm start ran again"
# the resolved config reads back
"$TRILL" train run1/config.yaml --print-config >resolved.yaml || fail "config.yaml does not load"
echo "demo smoke test passed"
