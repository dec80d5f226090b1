# Sourced by tests/rl/fixture.sh and scripts/rl_identity.sh: fixture_data TRILL writes the RL
# tests' inputs into the current folder: a tiny random MoE (layer 0 dense, then MoE layers) in
# model/, two-digit addition prompts (train.jsonl, eval.jsonl; for SFT sft.jsonl, sft_eval.jsonl)
# and a graded external reward (digits.py).
fixture_data() {
    local TRILL=$1
    "$TRILL" init --out model --preset tiny --set hidden_size=64 --set intermediate_size=128 --set moe_intermediate_size=32 \
        --set head_dim=16 --seed 3 2>/dev/null
    /usr/bin/python3 - <<'PY'
import json, random
rl, sft = random.Random(0), random.Random(1)
for name, n, field, r in (("train.jsonl", 64, "answer", rl), ("eval.jsonl", 8, "answer", rl),
                          ("sft.jsonl", 64, "completion", sft), ("sft_eval.jsonl", 8, "completion", sft)):
    with open(name, "w") as f:
        for _ in range(n):
            a, b = r.randrange(10, 100), r.randrange(10, 100)
            f.write(json.dumps({"prompt": f"{a}+{b}=", field: str(a + b)}) + "\n")
PY
    # A random model never gets the sum right: a graded external reward (the share of digits in the
    # completion) gives the groups different rewards, so the adapters really train.
    cat > digits.py <<'PY'
import json, sys
for line in sys.stdin:
    c = json.loads(line)["completion"]
    print(json.dumps({"reward": sum(ch.isdigit() for ch in c) / max(len(c), 1), "metrics": {"len": len(c)}}), flush=True)
PY
}
