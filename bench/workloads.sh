# Sourced by bench/rl_async.sh and bench/executors.sh in their scratch folder, with TRILL set:
# the demo's cached warm start, the `small` preset (85M parameters, random weights) in ./small
# with 256 addition prompts in ./prompts.jsonl, and SMALL_WORKLOAD, the settings on which its
# generation and training cost about the same (4 samples of 1 prompt, 128 new tokens).
"$TRILL" train run_dir=warm steps=1 >/dev/null 2>&1
"$TRILL" init --out small --preset small --seed 1 2>/dev/null
/usr/bin/python3 - <<'PY'
import json, random
r = random.Random(0)
with open("prompts.jsonl", "w") as f:
    for _ in range(256):
        a, b = r.randrange(10, 100), r.randrange(10, 100)
        f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
PY
SMALL_WORKLOAD=(model=small data.train=prompts.jsonl reward.verifier=demo generator.prompts_per_step=1 generator.n=4
                generator.max_new_tokens=128 checkpoint.every=0)
