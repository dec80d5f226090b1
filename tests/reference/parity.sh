#!/usr/bin/env bash
# Parity of `trill score` with the independent PyTorch reference (qwen3_ref.py), both ways:
# checkpoints written by the Python side and loaded by trill (the loader is tested too), and
# checkpoints written by `trill init` and loaded by the reference's own reader; YaRN and sliding
# windows on some layers (layer_types), and the generator with both.
# The Python steps run one by one in a single python3 (pystep.sh: pystep), which imports torch
# once for the whole script rather than once per step (~2 s of CPU each).
# Usage: parity.sh PATH/TO/trill
set -euo pipefail
TRILL=$1
HERE=$(cd "$(dirname "$0")" && pwd)
PY=/usr/bin/python3   # Debian's python3 with python3-torch (pystep.sh runs it)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/trill-parity-XXXXXX")
source "$HERE/pystep.sh"
trap 'pystep_stop; rm -rf "$WORK"' EXIT
pystep_start
REF=qwen3_ref.py TOOL=
source "$HERE/parity_lib.sh"

# Several sequence lengths share each batch.
pystep -o /dev/null gen_inputs.py --vocab 97 --seed 11 --lengths 1,2,7,33,64,130 --out "$WORK/in.jsonl"

# name | make-model arguments
cases=(
  "moe_f32|--dtype f32 --seed 1"
  "moe_bf16_sharded_nonorm|--dtype bf16 --seed 2 --shards 3 --set norm_topk_prob=false"
  "moe_sparse_step2_tied|--dtype f32 --seed 3 --set decoder_sparse_step=2 mlp_only_layers=[] tie_word_embeddings=true"
  "moe_gqa4_dense_first2|--dtype bf16 --seed 4 --set num_attention_heads=8 num_key_value_heads=2 head_dim=32 num_experts=16 num_experts_per_tok=4 mlp_only_layers=[0,1] num_hidden_layers=5"
  "moe_mha_top1|--dtype f32 --seed 5 --set num_key_value_heads=4 num_experts_per_tok=1 rope_theta=1000000.0"
  "dense_f32_tied|--dtype f32 --seed 6 --set model_type=qwen3 tie_word_embeddings=true"
  "dense_bf16_sharded|--dtype bf16 --seed 7 --shards 2 --set model_type=qwen3"
  "moe_yarn|--dtype f32 --seed 8 --set rope_scaling={\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":32}"
  "moe_yarn_v5_notrunc|--dtype f32 --seed 9 --set rope_theta=150000.0 rope_parameters={\"rope_type\":\"yarn\",\"rope_theta\":150000.0,\"factor\":8.0,\"original_max_position_embeddings\":16,\"truncate\":false}"
  "moe_sliding_from2|--dtype f32 --seed 10 --set use_sliding_window=true sliding_window=6 max_window_layers=2"
  "moe_sliding_types|--dtype bf16 --seed 11 --set use_sliding_window=true sliding_window=5 layer_types=[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"full_attention\"]"
)
for c in "${cases[@]}"; do
  name=${c%%|*}
  # shellcheck disable=SC2086
  pystep -o /dev/null qwen3_ref.py make-model --out "$WORK/$name" --std 0.1 ${c#*|}
  score_and_compare "$name" "$WORK/$name"
done
# the comparer itself must catch a perturbed log-prob and a swapped expert
pystep -o /dev/null compare.py "$WORK/moe_f32.ref.jsonl" --self-test

for dtype in f32 bf16; do
  dir="$WORK/trill_written_$dtype"
  "$TRILL" init --out "$dir" --preset tiny --seed 9 --dtype "$dtype" --set initializer_range=0.1 2>/dev/null
  score_and_compare "trill_written_$dtype" "$dir"
done

# The generator (f32) on windowed and full layers mixed, with YaRN: its decode reads each sliding
# layer's window only (gpt-oss's layout), against the reference on what it samples.
dir="$WORK/trill_sliding"
"$TRILL" init --out "$dir" --preset tiny --seed 9 --dtype f32 --set initializer_range=0.1 --set use_sliding_window=true \
    --set sliding_window=7 --set max_window_layers=2 --set 'rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}' \
    2>/dev/null
generator_compare "generator f32 (sliding layers 2-3, YaRN)" "$dir"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
