#!/usr/bin/env bash
# The multi-turn demo (`trill train env.kind=guess`): the higher/lower game on the demo's sums. On
# the warm start that demo_warm_start.sh built (the ctest fixture demo_cache; DIR, else one is built
# here first), the run teaches it the game's format (TRILL_DEMO_TURNS_SFT_STEPS of SFT on
# transcripts, cached), then 40 RL steps of 3-turn episodes must raise held-out success (solved
# within 3 turns) by at least 12 points; a second run finds the multi-turn base in the cache.
# Measured on a warm start built on two threads: RL seeds 0, 1, 2: +22.6, +21.5, +21.1 points
# (49.7% -> 72.2%, 49.2% -> 70.7%, 49.6% -> 70.6%), 13-19 s a run; on the tests' (one thread):
# 52.3% -> 68.9% (+16.6).
# Usage: demo_turns.sh TRILL [DIR]
source "$(dirname "$0")/demo_common.sh" # TRILL, HERE, W, D, fail, LIMIT, run, pass1

run log1 train env.kind=guess env.max_turns=3 run_dir=turns1 steps=40 checkpoint.every=0
before=$(pass1 before log1) after=$(pass1 after log1)
[ -n "$before" ] && [ -n "$after" ] || { cat log1; fail "no held-out evaluation in the log"; }
echo "multi-turn demo, 40 RL steps: held-out success within 3 turns $before% -> $after%"
awk -v a="$before" -v b="$after" 'BEGIN { exit !(b - a >= 12) }' || fail "RL raised held-out success by less than 12 points ($before% -> $after%)"
/usr/bin/python3 - <<'PY'
import json
m = [json.loads(l) for l in open("turns1/metrics.jsonl")]
e0, e1 = m[0]["env"], m[-1]["env"]
assert all(x["env"]["turns"] > 1 for x in m[:5]), "the episodes take more than one turn"
print(f"   turns an episode {e0['turns']:.2f} -> {e1['turns']:.2f}; solved {e0['stop_done']} -> {e1['stop_done']} of 256; "
      f"sampled / injected tokens an episode {e1['sampled_tokens']:.1f} / {e1['injected_tokens']:.1f}")
PY
# the multi-turn base is cached: a second run does not teach the format again
run log2 train env.kind=guess env.max_turns=3 run_dir=turns2 steps=1 checkpoint.every=0
grep -q "teaching the warm start" log2 && fail "the multi-turn base was built again"
echo "the multi-turn base came from the cache"
