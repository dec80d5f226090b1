#!/usr/bin/env bash
# This machine as a `trill plan` cluster (docs/plan.md): one node, one device (the whole CPU), its
# memory, the copy bandwidth and the bf16 peak that `trill bench generate` measures, and the
# efficiencies trill's own engines reach on it, measured here on MODEL (default: the `small`
# preset, made in a scratch folder):
#   decode_bw_util  batch-1 decode against the bandwidth bound (trill bench generate, bf16)
#   decode_mfu      batch-256 decode's GFLOP/s against the peak (64-token prompts)
#   prefill_mfu     a 512-token prompt's prefill, in plan's FLOPs (2 x the active parameters but
#                   the embedding and lm_head a token, plus attention), against the peak
#   train_mfu       trill bench train (LoRA, 4 x 134 tokens), in plan's FLOPs (2 passes of 2 x the
#                   active parameters but the embedding a token, plus attention), against the peak
#   split_gen_rate  batch-4 decode on half the cores (OMP_NUM_THREADS) over all of them: the rate
#   split_train_rate  trill train's async executors reach when they share the CPU; the same for training
# Each figure is the median of RUNS runs (default 3). Prints the YAML and writes it to OUT.
# Efficiencies depend on the shapes they are measured at; these set them (defaults in brackets):
#   PREFILL_PROMPT [512], PREFILL_BATCH [1]   the prefill's prompts: tokens each, at once
#   DECODE_PROMPT [64], DECODE_BATCH [256]    the compute-bound decode's prompts and batch
#   TRAIN_BATCH [4], TRAIN_SEQ [134]          the training step's sequences and their tokens
# A tiny model planned at its own shapes (the demo: PREFILL_PROMPT=6 PREFILL_BATCH=32
# DECODE_PROMPT=6 DECODE_BATCH=256 TRAIN_BATCH=256 TRAIN_SEQ=9) runs far from the defaults'
# efficiencies (docs/plan.md, calibration).
# Usage: bench/cluster_profile.sh [TRILL] [OUT.yaml] [MODEL]
set -euo pipefail
TRILL=$(realpath "${1:-build/trill}")
OUT=$(realpath -m "${2:-local_cluster.yaml}")
RUNS=${RUNS:-3}
PREFILL_PROMPT=${PREFILL_PROMPT:-512} PREFILL_BATCH=${PREFILL_BATCH:-1}
DECODE_PROMPT=${DECODE_PROMPT:-64} DECODE_BATCH=${DECODE_BATCH:-256}
TRAIN_BATCH=${TRAIN_BATCH:-4} TRAIN_SEQ=${TRAIN_SEQ:-134}
CORES=$(nproc)
HALF=$(( CORES / 2 > 0 ? CORES / 2 : 1 ))
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
MODEL=${3:-}
if [ -z "$MODEL" ]; then
    "$TRILL" init --out "$W/small" --preset small --seed 1 >/dev/null 2>&1
    MODEL=$W/small
fi
MODEL=$(realpath "$MODEL")
cd "$W"
"$TRILL" plan --model "$MODEL" --json > plan.json
for i in $(seq "$RUNS"); do
    "$TRILL" bench generate --model "$MODEL" --dtypes bf16 --batches 1 --prompt-len 512 --decode-only --steps 16 > gen_$i.txt 2>&1
    "$TRILL" bench generate --model "$MODEL" --dtypes bf16 --batches "$DECODE_BATCH" --prompt-len "$DECODE_PROMPT" --decode-only --steps 16 > dec_$i.txt 2>&1
    "$TRILL" bench generate --model "$MODEL" --dtypes bf16 --batches "$PREFILL_BATCH" --prompt-len "$PREFILL_PROMPT" --decode-only --steps 16 > pre_$i.txt 2>&1
    "$TRILL" bench train --model "$MODEL" --lora --batch "$TRAIN_BATCH" --seq "$TRAIN_SEQ" --runs 3 > train_$i.txt 2>&1
    # half the cores (trill train's async executors, one each on 2 cores): batch-4 decode and the same training step
    "$TRILL" bench generate --model "$MODEL" --dtypes bf16 --batches 4 --prompt-len 64 --decode-only --steps 32 > gen4_$i.txt 2>&1
    OMP_NUM_THREADS=$HALF "$TRILL" bench generate --model "$MODEL" --dtypes bf16 --batches 4 --prompt-len 64 --decode-only --steps 32 > gen4h_$i.txt 2>&1
    OMP_NUM_THREADS=$HALF "$TRILL" bench train --model "$MODEL" --lora --batch "$TRAIN_BATCH" --seq "$TRAIN_SEQ" --runs 3 > trainh_$i.txt 2>&1
done
/usr/bin/python3 - "$MODEL" "$OUT" "$RUNS" "$PREFILL_PROMPT" "$PREFILL_BATCH" "$DECODE_PROMPT" "$DECODE_BATCH" "$TRAIN_BATCH" "$TRAIN_SEQ" <<'PY'
import json, os, re, statistics, sys
model, out, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
P, PB, DP, DB, TB, TS = (int(x) for x in sys.argv[4:10])
cfg = json.load(open(os.path.join(model, "config.json")))
plan = json.load(open("plan.json"))
mods = plan["parameters"]["by_module"]
active_ne = plan["parameters"]["active"] - mods["embedding"]["total"]
head = mods["lm_head"]["total"]
H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
att = L * 4 * cfg["num_attention_heads"] * cfg.get("head_dim", H // cfg["num_attention_heads"])  # FLOPs a token per cached position
med = statistics.median
bw, peak, bwu, dec, pre, trn, sg, st = [], [], [], [], [], [], [], []
for i in range(1, runs + 1):
    g = open(f"gen_{i}.txt").read()
    bw.append(float(re.search(r"memory bandwidth \(512 MB copy, \d+ threads\): ([\d.]+) GB/s", g).group(1)))
    peak.append(float(re.search(r"peak (\d+) GFLOP/s", g).group(1)))
    bwu.append(float(re.search(r"batch +1: decode .*?([\d.]+)% of the bandwidth bound", g).group(1)) / 100)
    dec.append(float(re.search(rf"batch +{DB}: decode .*?= ([\d.]+)% of peak", open(f"dec_{i}.txt").read()).group(1)) / 100)
    p = float(re.search(rf"batch +{PB}: decode .*?prefill (\d+) tokens/s", open(f"pre_{i}.txt").read()).group(1))
    # the plan's FLOPs of a prompt token: the matrices but lm_head, attention, lm_head once a prompt
    pre.append(p * (2 * (active_ne - head) + att * P / 2 + 2 * head / P) / (peak[-1] * 1e9))
    t = float(re.search(r"(\d+) tokens/s", open(f"train_{i}.txt").read()).group(1))
    trn.append(t * 2 * (2 * active_ne + att * TS / 2) / (peak[-1] * 1e9))
    dec4 = lambda f: float(re.search(r"batch +4: decode +([\d.]+) tokens/s", open(f).read()).group(1))
    sg.append(dec4(f"gen4h_{i}.txt") / dec4(f"gen4_{i}.txt"))
    st.append(float(re.search(r"(\d+) tokens/s", open(f"trainh_{i}.txt").read()).group(1)) / t)
mem = int(open("/proc/meminfo").read().split("MemTotal:")[1].split()[0]) * 1024 / 1e9
cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
flags = open("/proc/cpuinfo").read()
isa = "AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else "AVX-512" if "avx512f" in flags else "AVX2"
spread = lambda xs: f"{min(xs):.3g}-{max(xs):.3g}"
yaml = f"""name: this machine ({os.cpu_count()} cores, {cpu}, {isa})
source: bench/cluster_profile.sh on {os.path.basename(model)} (prefill {PB} x {P} tokens, decode {DB} x {DP}, training {TB} x {TS}), medians of {runs} runs (copy bandwidth {spread(bw)} GB/s; efficiencies train {spread(trn)}, prefill {spread(pre)}, decode {spread(dec)}, bandwidth {spread(bwu)}; on half the cores generation {spread(sg)}, training {spread(st)})
nodes: 1
devices_per_node: 1
memory_gb: {mem:.1f}
bf16_tflops: {med(peak) / 1000:.4f}
memory_bw_gbs: {med(bw):.1f}
intra_bw_gbs: {med(bw):.1f}
inter_bw_gbs: 1.25
intra_latency_us: 1
inter_latency_us: 50
train_mfu: {med(trn):.3f}
prefill_mfu: {med(pre):.3f}
decode_mfu: {med(dec):.3f}
decode_bw_util: {med(bwu):.3f}
split_gen_rate: {min(med(sg), 1):.3f}
split_train_rate: {min(med(st), 1):.3f}
"""
open(out, "w").write(yaml)
print(yaml, end="")
PY
"$TRILL" plan --model "$MODEL" --cluster "$OUT" > /dev/null
echo "written: $OUT (inter_bw_gbs 1.25 = a 10 Gb/s network, and the latencies, are assumptions: one machine has no such link)" >&2
