#!/usr/bin/env bash
# The mismatch study (docs/mismatch.md): does router replay keep MoE RL stable where the
# generator-trainer mismatch is large? A deeper MoE than the demo (8 layers, 7 of them MoE with 32
# experts, top-2), warm-started by full SFT on three-number addition written as two steps
# ("12+34+56=" -> "12+34=46;46+56=102", ~17 response tokens), then RL with an int8 generator
# (W8A8: the largest mismatch trill's generator has) and the numeric verifier, arms:
#   replay on / off  x  no correction / TIS 2 / TIS 2 + MIS [0.5, 5] (token)
#   + a bf16 generator with replay and TIS + MIS (the control)
#   + a stress pair: no correction at 5x the learning rate, replay on and off
# each with SEEDS seeds (3), two runs at a time on one core each. Prints per arm: held-out pass@1
# before and after (mean, min-max over seeds), the last eval's spread, mean k3 and |dlogp|, flip
# rate, tokens capped by TIS and masked by MIS, and whether any run degraded (final pass@1 more
# than 10 points under its start) or failed; writes OUT/report.html (trill report of seed 0 of
# the main arms), OUT/report_stress.html (every seed of the stress pair) and OUT/summary.json.
#   bench/mismatch_study.sh [TRILL] [OUT] [STEPS] [SEEDS]
set -euo pipefail
TRILL=$(realpath "${1:-build/trill}")
OUT=$(realpath -m "${2:-mismatch-study}")
STEPS=${3:-60}
SEEDS=${4:-3}
mkdir -p "$OUT"
cd "$OUT"
export OMP_NUM_THREADS=1
if [ ! -f warm/model.safetensors ]; then
  "$TRILL" init --out init --preset tiny --set hidden_size=128 --set head_dim=32 --set intermediate_size=384 \
    --set moe_intermediate_size=64 --set num_hidden_layers=8 --set num_experts=32 --set num_experts_per_tok=2 --dtype f32 --seed 7 2>/dev/null
  /usr/bin/python3 - <<'PY'
import json, random
r = random.Random(7)
seen = set()
def line(f):
    while True:
        a, b, c = r.randrange(10, 100), r.randrange(10, 100), r.randrange(10, 100)
        if (a, b, c) not in seen: break
    seen.add((a, b, c))
    f.write(json.dumps({"prompt": f"{a}+{b}+{c}=", "answer": f"{a}+{b}={a + b};{a + b}+{c}={a + b + c}"}) + "\n")
for name, n in (("eval.jsonl", 200), ("train.jsonl", 50000)):
    with open(name, "w") as f:
        for _ in range(n): line(f)
PY
  echo "mismatch study: warm start (full SFT, ${SFT_STEPS:-800} steps)..." >&2
  OMP_NUM_THREADS=2 "$TRILL" sft model=init data.train=train.jsonl data.completion_field=answer run_dir=warm sft.mode=full \
    trainer.lr=2e-3 trainer.schedule=constant trainer.warmup_steps=20 trainer.micro_batch_tokens=1024 sft.epochs=1000 sft.max_steps=${SFT_STEPS:-800} \
    2>warm.log
fi
COMMON=(model=warm data.train=train.jsonl data.eval=eval.jsonl data.eval_size=200 reward.verifier=numeric generator.max_new_tokens=24
        steps=$STEPS eval.every=20 checkpoint.every=0)
declare -A ARMS=(
  [replay_none]="router_replay=true correction.tis=0 correction.mis=false generator.dtype=int8"
  [replay_tis]="router_replay=true correction.tis=2 correction.mis=false generator.dtype=int8"
  [replay_tis_mis]="router_replay=true correction.tis=2 generator.dtype=int8"
  [noreplay_none]="router_replay=false correction.tis=0 correction.mis=false generator.dtype=int8"
  [noreplay_tis]="router_replay=false correction.tis=2 correction.mis=false generator.dtype=int8"
  [noreplay_tis_mis]="router_replay=false correction.tis=2 generator.dtype=int8"
  [bf16_control]="router_replay=true correction.tis=2 generator.dtype=bf16"
  [stress_replay]="router_replay=true correction.tis=0 correction.mis=false generator.dtype=int8 trainer.lr=5e-3"
  [stress_noreplay]="router_replay=false correction.tis=0 correction.mis=false generator.dtype=int8 trainer.lr=5e-3"
)
ORDER=(replay_none replay_tis replay_tis_mis noreplay_none noreplay_tis noreplay_tis_mis bf16_control stress_replay stress_noreplay)
jobs=()
for arm in "${ORDER[@]}"; do
  for ((s = 0; s < SEEDS; s++)); do
    [ -f "$arm-$s/done" ] || jobs+=("$arm $s")
  done
done
one() { # one ARM SEED
  local arm=$1 seed=$2 rc=0
  # shellcheck disable=SC2086
  "$TRILL" train run_dir="$arm-$seed" "${COMMON[@]}" seed=$((seed + 1)) ${ARMS[$arm]} 2>"$arm-$seed.log" || rc=$?
  echo "$rc" >"$arm-$seed/done"
  echo "  $arm seed $seed: exit $rc, $(grep -o 'held-out pass@1 [^,]*' "$arm-$seed.log" | tail -1)" >&2
}
export -f one
export TRILL
echo "mismatch study: ${#jobs[@]} runs of $STEPS steps, two at a time" >&2
for j in "${jobs[@]}"; do
  # shellcheck disable=SC2086
  one $j &
  while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n; done
done
wait
main=() stress=()
for arm in "${ORDER[@]:0:7}"; do main+=("$arm-0"); done # seed 0 of the main arms (a page overlays 8 runs at most)
for ((s = 0; s < SEEDS && s < 4; s++)); do stress+=("stress_replay-$s" "stress_noreplay-$s"); done
"$TRILL" report "${main[@]}" --out report.html 2>/dev/null
"$TRILL" report "${stress[@]}" --out report_stress.html 2>/dev/null
/usr/bin/python3 - "$SEEDS" "${ORDER[@]}" <<'PY'
import json, re, statistics as st, sys
seeds, arms = int(sys.argv[1]), sys.argv[2:]
rows = {}
print(f"{'arm':18s} {'pass@1 before':>13s} {'after: mean':>12s} {'min-max':>13s} {'k3 mean':>9s} {'|dlogp|':>9s} {'flips':>7s} {'capped':>7s} "
      f"{'masked':>7s} {'degraded/failed':>15s}")
for arm in arms:
    before, after, k3, dl, fl, cap, mask, bad = [], [], [], [], [], [], [], 0
    curves = []
    for s in range(seeds):
        d = f"{arm}-{s}"
        rc = int(open(f"{d}/done").read())
        log = open(f"{d}.log").read()
        acc = re.search(r"held-out pass@1 ([\d.]+)% -> ([\d.]+)%", log)
        m = [json.loads(l) for l in open(f"{d}/metrics.jsonl")] if rc == 0 else []
        if rc != 0 or not acc:
            bad += 1
            continue
        b, a = float(acc.group(1)), float(acc.group(2))
        before.append(b); after.append(a)
        bad += a < b - 10
        k3.append(st.mean(x["mismatch_k3"] for x in m)); dl.append(st.mean(x["mismatch_mean_abs"] for x in m))
        fl.append(st.mean(x["flip_token_frac"] for x in m)); cap.append(st.mean(x["tis_capped_frac"] for x in m))
        mask.append(st.mean(x["mis_masked_frac"] for x in m))
        curves.append([(x["step"], x["eval_pass1"]) for x in m if "eval_pass1" in x])
    f = lambda v: st.mean(v) if v else float("nan")
    rows[arm] = dict(before=before, after=after, k3=f(k3), dlogp=f(dl), flips=f(fl), capped=f(cap), masked=f(mask), bad=bad, curves=curves)
    print(f"{arm:18s} {f(before):12.1f}% {f(after):11.1f}% {min(after, default=float('nan')):6.1f}-{max(after, default=float('nan')):5.1f}% "
          f"{f(k3):9.2e} {f(dl):9.2e} {100 * f(fl):6.2f}% {100 * f(cap):6.2f}% {100 * f(mask):6.2f}% {bad:>15d}")
json.dump(rows, open("summary.json", "w"), indent=1)
PY
echo "mismatch study: report $OUT/report.html, summary $OUT/summary.json" >&2
