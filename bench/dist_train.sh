#!/usr/bin/env bash
# The distributed trainer's figures (issue 17), from `trill bench train` in one run per preset,
# the layouts side by side and the whole sweep repeated (these machines are shared and noisy):
#   1 rank x 1 thread, 1 rank x 2 threads, DP 2, EP 2, EP 4, TP 2 (ranks x 1 thread each)
# and for each: tokens/s, the median step, the step's communication from rank 0 by kind (MB and
# ms), and every rank's peak RSS and weight bytes (the whole model's on one rank: what a shard
# saves). EP 4 oversubscribes 4 ranks on a 2-core machine: its step time is not a speed, its
# bytes and memory are.
# Usage: bench/dist_train.sh [BUILD_DIR] [PRESET ...]   (default: build, small k2-small)
# Env: ROUNDS (2), BATCH (8), SEQ (256), RUNS (3).
set -euo pipefail
BUILD=$(realpath "${1:-build}")
shift || true
PRESETS=("$@")
[ ${#PRESETS[@]} -gt 0 ] || PRESETS=(small k2-small)
TRILL="$BUILD/trill"
[ -x "$TRILL" ] || { echo "bench/dist_train.sh: $TRILL not found; build first (make build)" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "bench/dist_train.sh: needs mpirun (Open MPI: scripts/install-deps.sh)" >&2; exit 1; }
ROUNDS=${ROUNDS:-2} BATCH=${BATCH:-8} SEQ=${SEQ:-256} RUNS=${RUNS:-3}
W=$(mktemp -d "${TMPDIR:-/tmp}/trill-dist-bench-XXXXXX")
trap 'rm -rf "$W"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
echo "CPU: $(grep -m1 '^model name' /proc/cpuinfo | sed 's/.*: //'), $(grep -qw avx512f /proc/cpuinfo && echo "AVX-512 ($(grep -m1 -ow 'avx512_bf16\|avx512_vnni' /proc/cpuinfo | sort -u | tr '\n' ' '| sed 's/ $//'))" || echo "AVX2/FMA, no AVX-512")"
echo "$(nproc) cores; batch $BATCH x $SEQ tokens, LoRA rank 16 on all linear layers, fp32 matmuls, median of $RUNS steps"

layouts=("1x1|1|1|" "1x2|1|2|" "DP 2|2|1|" "EP 2|2|1|--ep 2" "EP 4|4|1|--ep 4" "TP 2|2|1|--tp 2")
for preset in "${PRESETS[@]}"; do
  "$TRILL" init --out "$W/$preset" --preset "$preset" --seed 1 >/dev/null 2>&1
  echo
  echo "## $preset"
  for round in $(seq "$ROUNDS"); do
    echo
    echo "round $round"
    echo "| layout | tokens/s | step ms | comm from rank 0 a step | peak RSS a rank (MB) | weights a rank (MB) |"
    echo "|---|---|---|---|---|---|"
    for l in "${layouts[@]}"; do
      IFS='|' read -r name np threads extra <<<"$l"
      args=(bench train --model "$W/$preset" --batch "$BATCH" --seq "$SEQ" --runs "$RUNS")
      # shellcheck disable=SC2206
      [ -n "$extra" ] && args+=($extra)
      if [ "$np" -eq 1 ]; then
        OMP_NUM_THREADS=$threads "$TRILL" "${args[@]}" >"$W/out" 2>/dev/null
      else
        OMP_NUM_THREADS=$threads mpirun -np "$np" --oversubscribe "$TRILL" "${args[@]}" >"$W/out" 2>/dev/null
      fi
      /usr/bin/python3 - "$name" "$W/out" <<'PY'
import re, sys
text = open(sys.argv[2]).read()
m = re.search(r"^trill train \(.*?: (\d+) tokens/s, median (\d+) ms", text, re.M)
comm = re.search(r"communication from rank 0:(.*?) \(percent", text)
kinds = re.findall(r"(\w+) ([\d.]+) MB ([\d.]+) ms", comm.group(1)) if comm else []
comm_s = ", ".join(f"{k} {float(mb):.2f} MB {float(ms):.0f} ms" for k, mb, ms in kinds if float(mb) > 0) or "-"
ranks = re.findall(r"^rank \d+: peak RSS (\d+) MB, weights ([\d.]+) MB", text, re.M)
if ranks:
    rss = " / ".join(r for r, _ in ranks)
    wts = " / ".join(w for _, w in ranks)
else:
    rss = re.search(r"peak RSS (\d+) MB\s*$", text, re.M).group(1)
    wts = re.search(r"^base weights: .*?, (\d+) MB", text, re.M).group(1)
print(f"| {sys.argv[1]} | {m.group(1)} | {m.group(2)} | {comm_s} | {rss} | {wts} |")
PY
    done
  done
done
