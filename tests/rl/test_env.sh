#!/usr/bin/env bash
# Multi-turn episodes end to end, on the tiny random MoE of fixture.sh: the environment process
# (examples/envs/guess.py) plays turn for turn what the built-in guess does; on-policy mode stays
# exact over many turns; async mode runs episodes; a failing environment (a crash, a hang,
# garbage, a huge observation, resets that always fail) is an error naming it or a marked
# episode, as configured, and nothing hangs.
set -euo pipefail
TRILL=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
EXAMPLES=$(cd "$HERE/../../examples/envs" && pwd)
source "$HERE/fixture.sh"

# guess.py, except as the arguments say, on the K-th step request (counted across restarts in the
# file `steps`): `crash K` exits 3, `hang K` sleeps, `garbage K` answers a line that is not JSON;
# `huge` answers every step with a 100,000-character observation; `reset_fail` exits at a reset.
cat > bad_env.py <<PY
import json, os, subprocess, sys, time
how, k = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
guess = subprocess.Popen([sys.executable, "$EXAMPLES/guess.py"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "reset" and how == "reset_fail":
        print("cannot reset", file=sys.stderr, flush=True)
        sys.exit(4)
    if req["op"] == "step":
        n = int(open("steps").read()) + 1 if os.path.exists("steps") else 1
        open("steps", "w").write(str(n))
        if n == k and how == "crash":
            print("boom at step", n, file=sys.stderr, flush=True)
            sys.exit(3)
        if n == k and how == "hang":
            time.sleep(600)
        if n == k and how == "garbage":
            print("this is not json", flush=True)
            continue
    guess.stdin.write(line)
    guess.stdin.flush()
    reply = guess.stdout.readline()
    if how == "huge" and req["op"] == "step":
        r = json.loads(reply)
        r["done"], r["messages"] = False, [{"role": "user", "content": "x" * 100000}]
        reply = json.dumps(r) + "\n"
    sys.stdout.write(reply)
    sys.stdout.flush()
PY

ENV=(model=model data.train=train.jsonl reward.verifier=none generator.prompts_per_step=4 generator.n=4 generator.max_new_tokens=4
     env.max_turns=4 trainer.schedule=constant trainer.lr=1e-2 generator.kv_cache_mb=16 checkpoint.keep=0)

echo "== the environment process plays what the built-in plays"
must_pass log_builtin "$TRILL" train "${ENV[@]}" env.kind=guess run_dir=builtin steps=2 rollouts.save=true
must_pass log_process "$TRILL" train "${ENV[@]}" env.kind=process "env.command=$PY $EXAMPLES/guess.py" run_dir=process steps=2 rollouts.save=true
PYTHONPATH="$HERE/../reference" $PY - <<'PY'
import json
import numpy as np
import rollouts
for step in (1, 2):
    a, b = (rollouts.read(f"{run}/rollouts/step-{step:08d}.bin") for run in ("builtin", "process"))
    assert a["format"] == b["format"] == 3, (a["format"], b["format"])
    for key in ("tokens", "behav_logp", "version", "experts", "seg_offsets", "segs", "reward"):
        assert np.array_equal(a[key], b[key], equal_nan=key == "behav_logp"), f"step {step}: {key} differs"
    ea, eb = a["episodes"], b["episodes"]
    for key in ("env_return", "turns", "stop", "cut_turns"):
        assert np.array_equal(ea[key], eb[key]), f"step {step}: episodes' {key} differ"
    mask = rollouts.loss_mask(a)
    assert np.array_equal(np.isfinite(a["behav_logp"]), mask.astype(bool)), "log-probs exactly on the sampled tokens"
    assert ea["turns"].min() >= 1 and (ea["turns"] > 1).any(), ea["turns"]
m = [json.loads(l) for l in open("process/metrics.jsonl")]
mb = [json.loads(l) for l in open("builtin/metrics.jsonl")]
assert [x["env"]["metrics"] for x in m] == [x["env"]["metrics"] for x in mb], "the environments' own metrics differ"
e = m[0]["env"]
assert e["injected_tokens"] > 0 and e["sampled_tokens"] > 0 and e["prefill_tokens"] < e["rerender_prefill_tokens"], e
print(f"   2 steps alike; step 1: {e['turns']:.2f} turns, {e['sampled_tokens']:.1f} sampled and {e['injected_tokens']:.1f} injected "
      f"tokens an episode, {e['prefill_tokens']} rows prefilled against {e['rerender_prefill_tokens']} re-rendering every turn")
PY

echo "== on-policy mode is exact over every turn"
must_pass log_onp "$TRILL" train "${ENV[@]}" env.kind=guess generator.on_policy=true "reward.external=$PY digits.py" run_dir=onp steps=3
$PY - <<'PY'
import json
m = [json.loads(l) for l in open("onp/metrics.jsonl")]
for x in m:
    assert x["on_policy_exact"] and x["on_policy_differing"] == 0, x
    assert x["mismatch_max_abs"] == 0 and x["flip_token_frac"] == 0, x
    assert x["env"]["turns"] > 1 and x["grad_norm"] > 0, x
print("   mismatch 0, flips 0 over", [round(x["env"]["turns"], 2) for x in m], "turns an episode")
PY

echo "== async mode: episodes across weight updates"
must_pass log_async "$TRILL" train "${ENV[@]}" env.kind=process "env.command=$PY $EXAMPLES/guess.py" "reward.external=$PY digits.py" \
    mode=async async.max_staleness=1 run_dir=async steps=4
$PY - <<'PY'
import json
m = [json.loads(l) for l in open("async/metrics.jsonl")]
assert len(m) == 4 and all(x["staleness_max"] <= 1 and x["env"]["turns"] >= 1 for x in m), m
print("   4 steps, staleness", [x["staleness_max"] for x in m])
PY

echo "== a failing environment"
DEADLINE=$(reply_deadline)
fails() { # fails NAME EXPECTED-MESSAGE ARGS...: the run stops with exit 1 and the message
    local name=$1 want=$2
    shift 2
    rm -f steps
    must_exit 1 "log_$name" "$TRILL" train "${ENV[@]}" env.kind=process run_dir="fail_$name" steps=2 "env.timeout_s=$DEADLINE" "$@"
    grep -q -- "$want" "log_$name" || { tail -3 "log_$name" >&2; fail "$name: the message lacks '$want'"; }
    echo "   $name: $(grep -o 'environment process.*' "log_$name" | head -1 | cut -c1-160)"
}
fails crash 'request step: no reply: it exited with status 3 (1 failure in a row); last stderr line: "boom at step 5"' \
    "env.command=$PY bad_env.py crash 5"
fails hang "request step: no reply within $DEADLINE s (killed)" "env.command=$PY bad_env.py hang 5"
fails garbage 'request step: reply is not JSON' "env.command=$PY bad_env.py garbage 5"
fails reset 'request reset: no reply: it exited with status 4 (3 failures in a row); last stderr line: "cannot reset"' \
    "env.command=$PY bad_env.py reset_fail"
# marked: the crashed step's episode and every other one the process held end as env_error, the run goes on
rm -f steps
must_pass log_mark "$TRILL" train "${ENV[@]}" env.kind=process "env.command=$PY bad_env.py crash 5" env.mark_failures=true \
    run_dir=mark steps=2
# a huge observation never fits: the episode ends with stop reason context, nothing cut
must_pass log_huge "$TRILL" train "${ENV[@]}" env.kind=process "env.command=$PY bad_env.py huge" run_dir=huge steps=1 rollouts.save=true
PYTHONPATH="$HERE/../reference" $PY - <<'PY'
import json
import rollouts
m = [json.loads(l) for l in open("mark/metrics.jsonl")]
lost = m[0]["env"]["stop_env_error"]
assert lost >= 1 and m[0]["trained_seqs"] == 16 - lost and m[1]["env"]["stop_env_error"] == 0, m
h = json.loads(open("huge/metrics.jsonl").readline())["env"]
b = rollouts.read("huge/rollouts/step-00000001.bin")
unsolved = (b["episodes"]["stop"] != 0).sum()
assert h["stop_context"] == unsolved and unsolved > 0 and b["episodes"]["turns"].max() == 1, (h, b["episodes"])
print(f"   marked: {lost} episodes of step 1 lost (not trained), step 2 whole; huge observations: {unsolved} episodes "
      "ended with stop reason context after one turn")
PY

echo "== the GSM8K example environment (examples/envs/gsm8k_tools.py)"
$PY - "$EXAMPLES/gsm8k_tools.py" <<'PY'
import json, subprocess, sys
p = subprocess.Popen([sys.executable, sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
def ask(req):
    p.stdin.write(json.dumps(req) + "\n"); p.stdin.flush()
    return json.loads(p.stdout.readline())
task = {"prompt": "Natalia sold 48 clips in April and half as many in May. How many in all?", "answer": "48/2 = 24\n#### 72"}
r = ask({"op": "reset", "episode": 1, "task": task, "seed": 5})
assert r["tools"][0]["function"]["name"] == "calculator" and r["messages"][-1]["content"] == task["prompt"], r
calc = lambda e: {"name": "calculator", "arguments": {"expression": e}}
r = ask({"op": "step", "episode": 1, "turn": "...", "tool_calls": [calc("48/2 + 48"), calc("2**100000"), calc("__import__('os')"),
                                                                     {"error": "bad", "text": "{"}, {"name": "python", "arguments": {}}]})
got = [m["content"] for m in r["messages"]]
assert got[0] == "72" and got[1] == "error: power too large" and got[2].startswith("error: only numbers") and \
    got[3].startswith("error: malformed") and got[4] == "error: no tool named 'python'" and not r["done"] and r["metrics"]["calls"] == 1, got
r = ask({"op": "step", "episode": 1, "turn": 'Let me check. <tool_call>{"name": "calculator", "arguments": {"expression": "(2+3)*4"}}</tool_call>',
         "tool_calls": []})
assert [m["content"] for m in r["messages"]] == ["20"], r
assert ask({"op": "step", "episode": 1, "turn": "So 72 in all.\n#### 72", "tool_calls": []}) == \
    {"messages": [], "reward": 1.0, "done": True, "metrics": {"correct": 1.0}}
ask({"op": "end", "episode": 1})
r = ask({"op": "reset", "episode": 2, "task": task, "seed": 5})
assert ask({"op": "step", "episode": 2, "turn": "#### 71", "tool_calls": []})["reward"] == 0.0
p.stdin.close(); assert p.wait(5) == 0
print("   calls run (a malformed one, an unknown tool and unsafe or huge expressions answered with errors), "
      "<tool_call> blocks read from plain text, the final answer scored")
PY
head -4 "$HERE/../../../shared/data/gsm8k/train.jsonl" > gsm8k4.jsonl 2>/dev/null || $PY - <<'PY'
import json
with open("gsm8k4.jsonl", "w") as f:
    for q, a in (("What is 3 apples plus 4 apples?", "3+4=7\n#### 7"), ("Tom has 10 pens and gives 4 away. How many are left?", "#### 6")):
        f.write(json.dumps({"question": q, "answer": a}) + "\n")
PY
must_pass log_gsm8k "$TRILL" train "${ENV[@]}" data.train=gsm8k4.jsonl data.prompt_field=question data.max_prompt_tokens=400 \
    generator.prompts_per_step=2 env.kind=process "env.command=$PY $EXAMPLES/gsm8k_tools.py" env.max_tokens=1024 run_dir=gsm8k steps=1
grep -q '"env":' gsm8k/metrics.jsonl || fail "the GSM8K run has no episode metrics"
echo "   trill train on GSM8K lines with the example environment: one step"
