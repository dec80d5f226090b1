#!/usr/bin/env bash
# Executors on MPI ranks of their own against one process, side by side in one invocation:
#   the embedded demo (training-bound) and the `small` preset on a shape where generation and
#   training cost about the same (4 samples of 1 prompt, 128 new tokens), each
#     1 process x 2 threads, sync          (OMP_NUM_THREADS=2: both stages use both cores in turn)
#     1 process, async                     (generator and trainer threads on a core each)
#     2 ranks x 1 thread, sync             (rank 0 trainer + controller, rank 1 a generator replica)
#     2 ranks x 1 thread, async            (the replica generates ahead, async.max_staleness 1)
# Prints the steady-state step time (median wall time between steps, first excluded), tokens
# generated and trained per second of wall time, where a step's time goes (generate / score /
# train / weight sync), the ceiling of the async speedup from the one-core stage times of the
# 2-rank sync run ((gen + score + train + sync) / max(gen + score, train + sync)) and how much of it
# the 2-rank async run reaches, and the weight transfer per version over MPI (bytes, the
# controller's ms, each receiver's receive and apply ms) in adapter and merge sync.
#   bench/executors.sh [TRILL] [STEPS]
set -euo pipefail
TRILL=$(realpath "${1:-build/trill}")
HERE=$(cd "$(dirname "$0")" && pwd)
STEPS=${2:-30}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
cd "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
source "$HERE/workloads.sh"
DEMO=(steps=$STEPS checkpoint.every=0)
SMALL=("${SMALL_WORKLOAD[@]}" steps=$((STEPS / 3 > 4 ? STEPS / 3 : 4)))
ASYNC=(mode=async async.max_staleness=1)
one() { local name=$1; shift; OMP_NUM_THREADS=2 "$TRILL" train run_dir="$name" "$@" 2>"$name.log" || { tail -5 "$name.log"; exit 1; }; }
two() { local name=$1; shift; OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe "$TRILL" train run_dir="$name" parallel.generator.replicas=1 "$@" \
          2>"$name.log" >/dev/null || { tail -5 "$name.log"; exit 1; }; }
for w in demo small; do
  if [ "$w" = demo ]; then args=("${DEMO[@]}"); else args=("${SMALL[@]}"); fi
  one "${w}_1p_sync" "${args[@]}"
  one "${w}_1p_async" "${args[@]}" "${ASYNC[@]}"
  two "${w}_2r_sync" "${args[@]}"
  two "${w}_2r_async" "${args[@]}" "${ASYNC[@]}"
done
two demo_2r_merge steps=10 checkpoint.every=0 sync.mode=merge
echo "$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; AVX-512: $(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
/usr/bin/python3 - <<'PY'
import json, statistics as st
def load(name): return [json.loads(l) for l in open(f"{name}/metrics.jsonl")]
def wall(x): return x["time"]["interval_s"] if "interval_s" in x["time"] else x["time"]["step_s"]
print(f"{'run':16s} {'step ms':>8s} {'gen tok/s':>10s} {'train tok/s':>12s}   where a step goes (gen / score / train / sync, % of wall)")
for w in ("demo", "small"):
    steady = {}
    for run in ("1p_sync", "1p_async", "2r_sync", "2r_async"):
        m = load(f"{w}_{run}")
        steady[run] = st.median(wall(x) for x in m[1:])
        total = sum(wall(x) for x in m)
        gen_tok = sum(x["response_len"] * x["trained_seqs"] for x in m)
        train_tok = sum(x["time"]["train_tokens_per_s"] * x["time"]["train_s"] for x in m)
        parts = [sum(x["time"][k] for x in m) / total for k in ("generate_s", "reward_s", "train_s", "sync_s")]
        note = " (gen = waiting for rollouts)" if "async" in run else ""
        print(f"{w + '_' + run:16s} {1000 * steady[run]:8.1f} {gen_tok / total:10.0f} {train_tok / total:12.0f}   "
              + " / ".join(f"{100 * p:.0f}%" for p in parts) + note)
    m = load(f"{w}_2r_sync")[1:]
    g = st.median(x["time"]["generate_s"] + x["time"]["reward_s"] for x in m)
    t = st.median(x["time"]["train_s"] + x["time"]["sync_s"] for x in m)
    ceiling = (g + t) / max(g, t)
    got = steady["2r_sync"] / steady["2r_async"]
    print(f"{w}: one-core stage times {1000 * g:.1f} ms generate+score, {1000 * t:.1f} ms train+sync: async ceiling {ceiling:.2f}x; "
          f"2 ranks async/sync {got:.2f}x ({100 * (got - 1) / (ceiling - 1) if ceiling > 1 else 0:.0f}% of the possible gain); "
          f"2 ranks sync / 1 process x 2 threads sync {steady['1p_sync'] / steady['2r_sync']:.2f}x, "
          f"2 ranks async / 1 process async {steady['1p_async'] / steady['2r_async']:.2f}x")
print()
for name in ("demo_2r_sync", "demo_2r_merge", "demo_2r_async"):
    m = load(name)
    t = [x["transfer"] for x in m]
    rec = [r for x in t for r in x["receivers"]]
    print(f"{name:16s} weight transfer per version: {t[-1]['bytes'] / 1024:8.0f} KB; controller {st.median(x['sync_ms'] for x in m):6.2f} ms; "
          f"receiver (rank {rec[0]['rank']}) receive {st.median(r['receive_ms'] for r in rec):6.2f} ms, apply {st.median(r['apply_ms'] for r in rec):6.2f} ms (medians)")
PY
