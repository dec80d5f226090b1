#!/usr/bin/env bash
# End-to-end checks of the trill command: exit codes, messages, outputs.
# Usage: test_cli.sh PATH/TO/trill
set -uo pipefail
TRILL=$1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-cli-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0

check() { # check NAME CONDITION-COMMAND...
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); else echo "FAIL: $name"; failed=$((failed + 1)); fi
}
# expect_exit CODE STDERR-SUBSTRING COMMAND...: exactly this exit code (a timeout is 124: a failure),
# the message on stderr, and no sanitizer or runtime-error report after it
expect_exit() {
  local code=$1 needle=$2; shift 2
  timeout -k 5 "${TRILL_TEST_LIMIT_S:-300}" "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  if [ "$rc" -ne "$code" ] || ! grep -qF -- "$needle" "$WORK/err" || grep -qE "Sanitizer|runtime error:" "$WORK/err"; then
    echo "FAIL: '$*' exited $rc (want $code), stderr: $(head -c 300 "$WORK/err") (want '$needle')"
    failed=$((failed + 1))
  else
    passed=$((passed + 1))
  fi
}

# help and usage errors (exit 2)
for cmd in init info score generate tokenize merge sft; do
  check "$cmd --help" "$TRILL" "$cmd" --help >/dev/null
done
expect_exit 2 "usage: trill COMMAND" "$TRILL"
expect_exit 2 'unknown command "frobnicate"' "$TRILL" frobnicate
expect_exit 2 "--out is required" "$TRILL" init
expect_exit 2 'unknown preset "huge"' "$TRILL" init --out "$WORK/x" --preset huge
expect_exit 2 'unknown config.json field "num_expert"' "$TRILL" init --out "$WORK/x" --set num_expert=4
expect_exit 2 "--dtype: expected bf16 or f32" "$TRILL" init --out "$WORK/x" --dtype f64
expect_exit 2 "--seed: expected an integer" "$TRILL" init --out "$WORK/x" --seed abc
expect_exit 2 "--model is required" "$TRILL" info
expect_exit 2 "--adapter and --out are required" "$TRILL" merge --model x
# the option tables' refusals (src/cli/opts.c): a choice, a missing argument, an unknown option, an extra argument
expect_exit 2 '--verifier: expected numeric, exact or demo, got "x"' "$TRILL" eval --model a --data b --verifier x
expect_exit 2 "--k needs an argument" "$TRILL" eval --model a --data b --k
expect_exit 2 "--temperature: expected a number in [0, 100]" "$TRILL" eval --model a --data b --temperature -1
expect_exit 2 "invalid option --bogus" "$TRILL" tokenize --bogus
expect_exit 2 'unexpected argument "extra"' "$TRILL" info --model x extra
expect_exit 2 "a run folder is required" "$TRILL" report
expect_exit 2 "expected the benchmark name: train or generate" "$TRILL" bench
check "bench --help" "$TRILL" bench train --help

# failures (exit 1) name the file and the problem
expect_exit 1 "$WORK/nope/config.json: cannot open" "$TRILL" info --model "$WORK/nope"
expect_exit 1 'field "num_experts_per_tok": 9 must be in [1, num_experts=8]' \
  "$TRILL" init --out "$WORK/x" --set num_experts_per_tok=9
expect_exit 1 'field "rope_scaling": rope type "dynamic" is not supported' \
  "$TRILL" init --out "$WORK/x" --set 'rope_scaling={"rope_type":"dynamic","factor":4}'

# init + info: the tiny preset's layer map and counts
check "init tiny" "$TRILL" init --out "$WORK/tiny" --seed 1 2>/dev/null
for f in config.json model.safetensors tokenizer.json tokenizer_config.json generation_config.json; do
  check "init wrote $f" test -s "$WORK/tiny/$f"
done
"$TRILL" info --model "$WORK/tiny" >"$WORK/info"
check "info layer map" grep -qF "layer map:     0 dense, 1-3 moe(ordinals 0-2)" "$WORK/info"
check "info parameters" grep -qE "^parameters: +[0-9]+ total, [0-9]+ active" "$WORK/info"
check "info attention" grep -qF "attention:     GQA, QK-norm, RoPE on 64 of 64 dims" "$WORK/info"
check "info dtype" grep -qF ", BF16)" "$WORK/info"
disk_mb=$(stat -c %s "$WORK/tiny/model.safetensors" | awk '{ printf "%.1f", $1 / 1e6 }')
check "info: the bytes on disk are the weight files' ($disk_mb MB)" grep -qF "bytes:         $disk_mb MB on disk (1 safetensors file, BF16)" "$WORK/info"
# the tiny preset by hand: embedding and head 128 x 256; per layer q, o 256 x 256 and k, v 128 x 256;
# dense MLP 3 x 768 x 256; 3 MoE layers of 8 experts x 3 x 128 x 256 and a router 8 x 256
check "info by kind" grep -qF "by kind:       embedding 32768, matrices 1376256, routed experts 2359296, routers 6144, norms 2816, biases 0, linear biases 0, sinks 0, convs 0, decays 0, head 32768" "$WORK/info"
# the real DeepSeek-V3 and Kimi K2 configurations, config only: their published sizes (671B / 37B;
# 1T / 32B, 1.03T / 32.9B counted with the embeddings and the head), described without weights
check "init --config-only kimi-k2" "$TRILL" init --out "$WORK/k2" --preset kimi-k2 --config-only 2>/dev/null
check "config only: no weights written" test ! -e "$WORK/k2/model.safetensors"
"$TRILL" info --model "$WORK/k2" >"$WORK/info_k2"
check "info kimi-k2 parameters" grep -qF "parameters:    1026408232448 total, 32861500928 active" "$WORK/info_k2"
check "info kimi-k2 layer map" grep -qF "layer map:     0 dense, 1-60 moe(ordinals 0-59)" "$WORK/info_k2"
check "info kimi-k2 config only" grep -qF "config only (no weights)" "$WORK/info_k2"
# trill plan: a config-only folder and a preset count alike; no model plans the demo; refusals
"$TRILL" plan --model "$WORK/k2" --json trainer.lora.rank=32 >"$WORK/plan_k2.json"
"$TRILL" plan --model kimi-k2 --json trainer.lora.rank=32 >"$WORK/plan_k2_preset.json"
check "plan kimi-k2: the folder and the preset agree" cmp "$WORK/plan_k2.json" <(sed 's|"model": "kimi-k2"|"model": "'"$WORK/k2"'"|' "$WORK/plan_k2_preset.json")
check "plan kimi-k2: the tensor table's total, LoRA r=32's count" /usr/bin/python3 -c "import json,sys; p=json.load(open(sys.argv[1]))['parameters']; assert p['total'] == 1026408232448 and p['lora'] == 20561913856, p" "$WORK/plan_k2.json"
check "plan with no model: the demo's" grep -qF "model:     the embedded demo" <("$TRILL" plan --cluster h800)
expect_exit 1 "neither a cluster file nor a profile" "$TRILL" plan --model kimi-k2 --cluster a100
expect_exit 1 "the cluster has 8 (1 nodes x 8)" "$TRILL" plan --model kimi-k2 parallel.trainer.ep=16
expect_exit 1 "no config.json there, and no preset of that name" "$TRILL" plan --model "$WORK/nope"
expect_exit 2 "--spread" "$TRILL" plan --spread lognormal
check "plan --search: the fastest layouts, then the best one's plan" grep -qF "the plan of the fastest:" <("$TRILL" plan --model qwen3-30b-a3b --cluster h100-sxm:2 --search)
expect_exit 1 "none of the" "$TRILL" plan --model kimi-k2 --cluster h100-sxm --search
expect_exit 1 "set parallel.generator.replicas" "$TRILL" plan --model qwen3-30b-a3b --gen-tp 2
check "plan --gen-tp: generators of ep x tp devices" grep -qF "2 replicas x ep 2 x tp 2 = 8 devices" \
    <("$TRILL" plan --model qwen3-30b-a3b --cluster h100-sxm:2 --gen-tp 2 parallel.trainer.ep=8 parallel.generator.replicas=2 parallel.generator.ep=2)
check "plan: the published runs' script plans every row" /usr/bin/python3 -c "import subprocess,sys; out = subprocess.run([sys.executable, sys.argv[1], sys.argv[2]], check=True, capture_output=True, text=True).stdout; assert out.count(chr(10)) == 27 and 'nan' not in out and 'inf' not in out, out" "$(dirname "$0")/../../bench/plan_published.py" "$TRILL"
check "init --config-only deepseek-v3" "$TRILL" init --out "$WORK/dsv3" --preset deepseek-v3 --config-only 2>/dev/null
"$TRILL" info --model "$WORK/dsv3" >"$WORK/info_dsv3"
check "info deepseek-v3 parameters" grep -qF "parameters:    671026419200 total, 37552297472 active" "$WORK/info_dsv3"
expect_exit 2 "--preset kimi-k2 is the real model's configuration, too large to create here: add --config-only" \
  "$TRILL" init --out "$WORK/x" --preset kimi-k2
check "info total = sum by kind" test "$(sed -n 's/^parameters: *\([0-9]*\) total.*/\1/p' "$WORK/info")" = $((32768 + 1376256 + 2359296 + 6144 + 2816 + 32768))

# dense model through --set, f32
check "init dense" "$TRILL" init --out "$WORK/dense" --set model_type=qwen3 --set num_hidden_layers=2 --dtype f32 2>/dev/null
"$TRILL" info --model "$WORK/dense" >"$WORK/info2"
check "dense info" grep -qF "Qwen3ForCausalLM" "$WORK/info2"
check "dense layer map" grep -qF "layer map:     0-1 dense" "$WORK/info2"

# score: tokens and text lines, shapes of the outputs
printf '{"tokens": [5, 6, 7, 8]}\n\n{"text": "Hello"}\n{"tokens": [3]}\n' >"$WORK/in.jsonl"
check "score" "$TRILL" score --model "$WORK/tiny" --input "$WORK/in.jsonl" --output "$WORK/out.jsonl"
check "score output" /usr/bin/python3 - "$WORK/out.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 3, len(rows)
assert rows[0]["tokens"] == [5, 6, 7, 8]
assert rows[1]["tokens"] == [43, 72, 79, 79, 82]          # H e l l o in the char vocab
for r in rows:
    n = len(r["tokens"])
    assert r["logprobs"][0] is None and len(r["logprobs"]) == n
    assert all(lp < 0 for lp in r["logprobs"][1:])
    assert len(r["experts"]) == n
    assert all(len(t) == 3 and all(len(k) == 2 and len(set(k)) == 2 and max(k) < 8 for k in t) for t in r["experts"])
PY
printf '{"tokens": [5, 999]}\n' >"$WORK/bad.jsonl"
expect_exit 1 "bad.jsonl:1: field \"tokens\": entry 1: expected a token id in [0, 128)" \
  "$TRILL" score --model "$WORK/tiny" --input "$WORK/bad.jsonl"
printf '{"tokens": [5, 6]}\n{"tokens": ' >"$WORK/bad2.jsonl"
expect_exit 1 "bad2.jsonl:2: invalid JSON" "$TRILL" score --model "$WORK/tiny" --input "$WORK/bad2.jsonl" --output "$WORK/never.jsonl"
check "no partial output on failure" test ! -e "$WORK/never.jsonl"

# weights and adapters that are not finite numbers are refused by name, and nothing is written:
# a bf16 NaN in the model, and a rank-2 PEFT adapter on every q_proj (4 layers, 256 x 256) with
# one NaN (its finite twin merges, so the files are right)
cp -r "$WORK/tiny" "$WORK/nan_model"
/usr/bin/python3 - "$WORK/nan_model/model.safetensors" "$WORK/adapter" "$WORK/nan_adapter" <<'PY'
import json, os, struct, sys
import numpy as np
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
(n,) = struct.unpack_from("<Q", data, 0)
t = json.loads(data[8:8 + n])["model.layers.1.self_attn.q_proj.weight"]
assert t["dtype"] == "BF16", t
struct.pack_into("<H", data, 8 + n + t["data_offsets"][0] + 2 * 5, 0x7fc0)
open(path, "wb").write(data)
def write_adapter(d, nan):
    os.makedirs(d)
    with open(f"{d}/adapter_config.json", "w") as f:
        json.dump({"peft_type": "LORA", "r": 2, "lora_alpha": 2, "use_rslora": False, "target_modules": ["q_proj"]}, f)
    header, blobs, at = {}, [], 0
    for layer in range(4):
        for part, shape in (("lora_A", [2, 256]), ("lora_B", [256, 2])):
            a = np.full(shape, 0.01, dtype="<f4")
            if nan and layer == 2 and part == "lora_A":
                a.flat[3] = np.nan
            header[f"base_model.model.model.layers.{layer}.self_attn.q_proj.{part}.weight"] = {
                "dtype": "F32", "shape": shape, "data_offsets": [at, at + a.nbytes]}
            blobs.append(a.tobytes())
            at += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(f"{d}/adapter_model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
write_adapter(sys.argv[2], False)
write_adapter(sys.argv[3], True)
PY
expect_exit 1 "trill score: $WORK/nan_model: weight model.layers.1.self_attn.q_proj.weight[5] is not a finite number: refused" \
  "$TRILL" score --model "$WORK/nan_model" --input "$WORK/in.jsonl"
check "score of a NaN model: nothing on stdout" test ! -s "$WORK/out"
expect_exit 1 "weight model.layers.1.self_attn.q_proj.weight[5] is not a finite number: refused" \
  "$TRILL" score --model "$WORK/nan_model" --input "$WORK/in.jsonl" --output "$WORK/nan_scores.jsonl"
check "score of a NaN model: no output file" test ! -e "$WORK/nan_scores.jsonl"
check "merge of a finite adapter" "$TRILL" merge --model "$WORK/tiny" --adapter "$WORK/adapter" --out "$WORK/merged" 2>/dev/null
expect_exit 1 "trill merge: $WORK/nan_adapter: adapter tensor base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight[3] is nan: refused" \
  "$TRILL" merge --model "$WORK/tiny" --adapter "$WORK/nan_adapter" --out "$WORK/nan_merged"
check "merge of a NaN adapter: no model written" test ! -e "$WORK/nan_merged"

# a damaged checkpoint is refused with the file named
cp -r "$WORK/tiny" "$WORK/broken"
truncate -s 100000 "$WORK/broken/model.safetensors"
expect_exit 1 "$WORK/broken/model.safetensors: " "$TRILL" info --model "$WORK/broken"

# tokenize round trip
printf 'Hello, world!\nline two\n' >"$WORK/text"
"$TRILL" tokenize --model "$WORK/tiny" <"$WORK/text" >"$WORK/ids"
check "tokenize lines" test "$(wc -l <"$WORK/ids")" -eq 2
"$TRILL" tokenize --model "$WORK/tiny" --decode <"$WORK/ids" >"$WORK/text2"
check "tokenize round trip" cmp -s "$WORK/text" "$WORK/text2"
expect_exit 1 "stdin line 1: position 0: token id 4000 is not in the vocabulary" \
  sh -c "echo '[4000]' | '$TRILL' tokenize --model '$WORK/tiny' --decode"

# generate: same seed, same text; greedy is deterministic too
gen() { "$TRILL" generate --model "$WORK/tiny" --prompt "Hi" --max-new-tokens 12 --json --dtype f32 "$@" 2>>"$WORK/gen.err"; }
a=$(gen --seed 4 --top-k 20) && b=$(gen --seed 4 --top-k 20) && c=$(gen --seed 5 --top-k 20) && g1=$(gen --temperature 0 --seed 1) &&
  g2=$(gen --temperature 0 --seed 2)
check "generate runs" test $? -eq 0
check "generate reproducible" /usr/bin/python3 -c '
import json, sys
a, b, c, g1, g2 = (json.loads(x) for x in sys.argv[1:])
assert len(a["tokens"]) == 12 and a["finish"] == "length", a       # a real completion, not an empty string
assert a == b, (a, b)                                                 # same seed: same tokens and log-probs
assert a["tokens"] != c["tokens"], "another seed samples other tokens"
assert g1["tokens"] == g2["tokens"], "greedy does not depend on the seed"
' "$a" "$b" "$c" "$g1" "$g2"
expect_exit 2 "--top-p: expected a number" "$TRILL" generate --model "$WORK/tiny" --prompt x --top-p 2
expect_exit 2 "--dtype: expected bf16, int8 or f32" "$TRILL" generate --model "$WORK/tiny" --prompt x --dtype fp8
expect_exit 2 "one of --prompt TEXT or --prompts FILE" "$TRILL" generate --model "$WORK/tiny"
# --json: one object per sample with what RL needs; experts have one row per MoE layer (3 of 4 layers)
printf '{"prompt": "Hi"}\n{"prompt": "Q: 1+1?"}\n' >"$WORK/prompts.jsonl"
"$TRILL" generate --model "$WORK/tiny" --prompts "$WORK/prompts.jsonl" --n 3 --max-new-tokens 5 --json --capture-experts \
  --dtype f32 >"$WORK/gen.jsonl" 2>/dev/null
check "generate --json: 2 prompts x 3 samples" test "$(wc -l <"$WORK/gen.jsonl")" -eq 6
check "generate --json fields" /usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    o = json.loads(line)
    n = len(o["tokens"])
    assert n == len(o["logprobs"]) == len(o["versions"]) >= 1, o
    assert len(o["experts"]) == len(o["prompt_tokens"]) + n - 1
    assert all(len(t) == 3 and all(len(k) == 2 for k in t) for t in o["experts"])
    assert all(lp <= 0 for lp in o["logprobs"]) and o["finish"] in ("length", "stop_id", "stop_string")
' "$WORK/gen.jsonl"
# EPLB changes where experts run, never what they compute: the same samples, logical experts captured
"$TRILL" generate --model "$WORK/tiny" --prompts "$WORK/prompts.jsonl" --n 3 --max-new-tokens 5 --json --capture-experts \
  --dtype f32 --eplb --eplb-workers 2 --eplb-redundant 3 --eplb-interval 1 --eplb-window 4 >"$WORK/gen_eplb.jsonl" 2>/dev/null
check "generate --eplb: identical output" cmp -s "$WORK/gen.jsonl" "$WORK/gen_eplb.jsonl"
expect_exit 2 "--eplb-window: expected" "$TRILL" generate --model "$WORK/tiny" --prompt x --eplb --eplb-window 0
# stop strings: take a character the greedy completion produces, then stop on it
check "generate --stop" /usr/bin/python3 -c '
import json, subprocess, sys
trill, model = sys.argv[1], sys.argv[2]
def run(*extra):
    out = subprocess.run([trill, "generate", "--model", model, "--prompt", "Hello", "--temperature", "0",
                          "--max-new-tokens", "40", "--json", "--dtype", "f32", *extra], capture_output=True, text=True, check=True).stdout
    return json.loads(out)
free = run()
chars = [c for c in free["text"][3:] if c.isalpha()]
assert chars, free["text"]
stop = chars[0]
o = run("--stop", stop)
assert o["finish"] == "stop_string", o
assert o["text"].endswith(stop) and stop not in o["text"][:-1], (o["text"], stop)
assert free["text"].startswith(o["text"])
' "$TRILL" "$WORK/tiny"
expect_exit 1 "bad.jsonl:2: expected a string field \"prompt\"" sh -c "printf '{\"prompt\": \"a\"}\n{\"text\": 1}\n' >'$WORK/bad.jsonl'; '$TRILL' generate --model '$WORK/tiny' --prompts '$WORK/bad.jsonl'"
expect_exit 1 "need 63 KV blocks of 16 tokens, but the cache holds 15" "$TRILL" generate --model "$WORK/tiny" --prompt "Hi" --max-new-tokens 1000 --kv-cache-mb 1 --dtype f32
# TRILL_GEN_ISA pins the generator's kernels (src/infer/gemm.c): an unknown name is refused; each
# instruction set this CPU has (its /proc/cpuinfo flags: the ones gemm.c asks the CPU for) must run,
# exit 0 with its samples (trill refusing one the CPU has is a failure, never a skip), and one it
# lacks is refused by name; generic and AVX2 give the same bits (AVX-512's bf16 does not, by design)
expect_exit 1 "TRILL_GEN_ISA=sse4: unknown instruction set (expected generic, avx2 or avx512)" \
  env TRILL_GEN_ISA=sse4 "$TRILL" generate --model "$WORK/tiny" --prompt "Hi" --max-new-tokens 2
cpu_has() { local f; for f in "$@"; do grep -qw -- "$f" /proc/cpuinfo || return 1; done; }
isa_ran() { # isa_ran ISA DTYPE: generates with the ISA pinned into $WORK/isa_ISA_DTYPE; exit 0, a sample, no report
  local out="$WORK/isa_$1_$2" rc=0
  TRILL_GEN_ISA=$1 timeout -k 5 "${TRILL_TEST_LIMIT_S:-300}" "$TRILL" generate --model "$WORK/tiny" --prompt "Hi" --max-new-tokens 12 \
    --json --dtype "$2" --seed 3 >"$out" 2>"$out.err" || rc=$?
  [ "$rc" -eq 0 ] && grep -qE '"tokens":\[[0-9]+(,[0-9]+){11}\]' "$out" && ! grep -qE "Sanitizer|runtime error:" "$out.err" \
    || { echo "TRILL_GEN_ISA=$1 --dtype $2: exit $rc, $(wc -c <"$out") bytes of samples: $(head -c 300 "$out.err")"; return 1; }
}
isa_have=(generic)
cpu_has avx2 fma && isa_have+=(avx2)
cpu_has avx512f avx512_bf16 avx512_vnni && isa_have+=(avx512)
for isa in generic avx2 avx512; do
  if [[ " ${isa_have[*]} " == *" $isa "* ]]; then
    for dt in bf16 int8; do check "TRILL_GEN_ISA=$isa ($dt) runs on a CPU that has it" isa_ran $isa $dt; done
  else
    expect_exit 1 "TRILL_GEN_ISA=$isa: this CPU lacks that instruction set" \
      env TRILL_GEN_ISA=$isa "$TRILL" generate --model "$WORK/tiny" --prompt "Hi" --max-new-tokens 2
  fi
done
if [[ " ${isa_have[*]} " == *" avx2 "* ]]; then
  for dt in bf16 int8; do check "TRILL_GEN_ISA generic = avx2 ($dt)" cmp -s "$WORK/isa_generic_$dt" "$WORK/isa_avx2_$dt"; done
fi
echo "TRILL_GEN_ISA: this CPU has ${isa_have[*]} (each must run), the others must be refused"

check "bench train runs" "$TRILL" bench train --model "$WORK/tiny" --batch 1 --seq 8 --runs 1
# one format: each adds a peak loop, a decode sweep and three adapter-mode comparisons (12 s under ASan)
"$TRILL" bench generate --model "$WORK/tiny" --dtypes int8 --batches 1,4 --steps 2 --prompt-len 8 >"$WORK/bgen" 2>&1
check "bench generate runs" grep -q "batch    4: decode" "$WORK/bgen"
expect_exit 1 "$WORK/tiny/adapter_config.json: cannot open" "$TRILL" merge --model "$WORK/tiny" --adapter "$WORK/tiny" --out "$WORK/m2"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
