# The checks every family's parity script makes against its float64 reference (parity_deepseek.sh,
# parity_mixtral.sh, parity_glm.sh), sourced after pystep.sh with TRILL, TOOL (grad_tool), WORK
# and REF (the family's reference script, e.g. glm_ref.py) set. Each check prints a PASS or FAIL
# line with its figures and counts it in `passed` / `failed`; a failing trill command is a FAIL,
# not an abort.
# shellcheck shell=bash
passed=0 failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; cat "$2"; failed=$((failed + 1)); }

# Log-probs within 1e-4 and expert ids equal except near-ties (compare.py), on WORK/in.jsonl.
score_and_compare() { # name dir [reference forward flags]
  local name=$1 dir=$2; shift 2
  pystep -o /dev/null "$REF" forward --model "$dir" --input "$WORK/in.jsonl" --output "$dir.ref.jsonl" "$@"
  if ! "$TRILL" score --model "$dir" --input "$WORK/in.jsonl" --output "$dir.trill.jsonl" 2>"$dir.err"; then
    fail "$name: trill score failed" "$dir.err"; return 0
  fi
  if pystep -o "$dir.cmp.txt" compare.py "$dir.ref.jsonl" "$dir.trill.jsonl" --atol 1e-4 --tie 1e-6; then
    pass "$name: $(grep 'max |d logprob|' "$dir.cmp.txt"), $(grep 'expert comparisons' "$dir.cmp.txt")"
  else
    fail "$name" "$dir.cmp.txt"
  fi
}

# WORK/NAME (once), from its make-model arguments in the script's `cases` ("name|arguments").
model() { # name
  local c args=""
  [ -d "$WORK/$1" ] && return 0
  # shellcheck disable=SC2154
  for c in "${cases[@]}"; do [ "${c%%|*}" = "$1" ] && args=${c#*|}; done
  # shellcheck disable=SC2086
  pystep -o /dev/null "$REF" make-model --out "$WORK/$1" --std 0.1 $args
}

# Every case of `cases` the sample takes, scored by trill against the reference; then the
# comparer's own self-test (it must catch a perturbed log-prob and a swapped expert) on f32's.
score_cases() {
  local c name
  # shellcheck disable=SC2154
  for c in "${cases[@]}"; do
    name=${c%%|*}
    sampled "$name" || continue
    model "$name"
    score_and_compare "$name" "$WORK/$name"
  done
  if [ -f "$WORK/f32.ref.jsonl" ]; then pystep -o /dev/null compare.py "$WORK/f32.ref.jsonl" --self-test; fi
}

# Training inputs WORK/NAME.in.jsonl of a case's model (once).
train_inputs() { model "$1"; train_inputs_for "$WORK/$1"; } # name

# Training inputs DIR.in.jsonl (once): random tokens, coefficients and router-replay experts.
train_inputs_for() { # dir
  [ -f "$1.in.jsonl" ] && return 0
  pystep -o /dev/null gen_train_inputs.py --vocab 97 --seed 5 --lengths 2,9,33,70 --out "$1.in.jsonl" --replay-model "$1"
}

# Gradients of loss = sum of random coefficients * log-probs on DIR.in.jsonl: full-parameter or
# LoRA (--adapter), within 1e-3 relative (compare_grads.py).
grad_compare() { # name dir [grad flags]
  local name=$1 dir=$2; shift 2
  pystep -o /dev/null "$REF" grad --model "$dir" --input "$dir.in.jsonl" --output "$dir.g.ref" "$@"
  if ! "$TOOL" "$dir" "$dir.in.jsonl" "$dir.g.ours" "$@" >/dev/null 2>"$dir.g.err"; then
    fail "$name: grad_tool failed" "$dir.g.err"; return 0
  fi
  if pystep -o "$dir.g.txt" compare_grads.py "$dir.g.ref" "$dir.g.ours" --rtol 1e-3; then pass "$name: $(grep 'overall worst' "$dir.g.txt")"
  else fail "$name" "$dir.g.txt"; fi
}

# A rank-4 adapter (B non-zero) on TARGETS: its gradients with and without replay, then trill
# merge scored as the reference scores the base with the adapter.
lora_and_merge() { # name dir targets
  local name=$1 dir=$2 targets=$3
  pystep -o /dev/null "$REF" make-adapter --model "$dir" --out "$dir.adapter" --rank 4 --alpha 8 --targets "$targets" --seed 9
  grad_compare "lora $name" "$dir" --adapter "$dir.adapter"
  grad_compare "lora $name replay" "$dir" --adapter "$dir.adapter" --replay
  pystep -o /dev/null "$REF" forward --model "$dir" --adapter "$dir.adapter" --input "$WORK/in.jsonl" --output "$dir.lora.ref.jsonl"
  merge_matches "merge $name" "$dir" "$dir.adapter" "$dir.lora.ref.jsonl" "$dir"
}

# trill merge of ADAPTER into DIR, scored on WORK/in.jsonl, against REF (the reference's log-probs
# of the base with the adapter); its files are OUT.merged, OUT.merge.err and OUT.merge.txt.
merge_matches() { # name dir adapter ref out
  local name=$1 dir=$2 adapter=$3 ref=$4 out=$5
  if ! { "$TRILL" merge --model "$dir" --adapter "$adapter" --out "$out.merged" --dtype f32 &&
         "$TRILL" score --model "$out.merged" --input "$WORK/in.jsonl" --output "$out.merged.jsonl"; } 2>"$out.merge.err" >/dev/null; then
    fail "$name: trill merge or score failed" "$out.merge.err"
  elif pystep -o "$out.merge.txt" compare.py "$ref" "$out.merged.jsonl" --atol 1e-4 --tie 1e-6; then
    pass "$name: $(grep 'max |d logprob|' "$out.merge.txt"), $(grep 'expert comparisons' "$out.merge.txt")"
  else fail "$name" "$out.merge.txt"; fi
}

# The generator (f32, its KV cache) on the sequences it samples from DIR: their log-probs as the
# reference computes them (gen_compare.py: within 1e-4 over >= 60 tokens). PROMPT (default
# "12+34=") and more `trill generate` options may follow.
generator_compare() { # name dir [prompt [generate options...]]
  local name=$1 dir=$2 prompt=${3:-12+34=} out
  shift 2; [ $# -gt 0 ] && shift
  out="$WORK/gen_$(basename "$dir")_$(printf %s "$name" | md5sum | cut -c1-8)"
  if ! "$TRILL" generate --model "$dir" --prompt "$prompt" --n 3 --max-new-tokens 40 --dtype f32 --json --seed 5 "$@" >"$out.jsonl" 2>"$out.err"; then
    fail "$name: trill generate failed" "$out.err"; return 0
  fi
  pystep -o /dev/null gen_compare.py inputs "$out.jsonl" "$out.in.jsonl"
  pystep -o /dev/null "$REF" forward --model "$dir" --input "$out.in.jsonl" --output "$out.ref.jsonl"
  if pystep -o "$out.txt" gen_compare.py compare "$out.jsonl" "$out.ref.jsonl"; then pass "$name vs reference: $(sed "s/^.*vs reference: //" "$out.txt")"
  else fail "$name" "$out.txt"; fi
}

# An adapter in PEFT's target_parameters form (make-adapter --peft-params: q_proj and o_proj as
# modules, the stacked experts' gate_up_proj and down_proj as ParamWrappers) on WORK/CASE: trill
# merge scored against the reference's base + adapter, then the adapter as trill loads and saves
# it (grad_tool --save-adapter) read back by the reference as the same function to 1e-9.
peft_params_case() { # name case
  local name=$1 pdir="$WORK/$2" pa="$WORK/$2.peft_params"
  train_inputs "$2"
  pystep -o /dev/null "$REF" make-adapter --model "$pdir" --out "$pa" --rank 4 --alpha 8 --targets q_proj,o_proj,gate_proj,up_proj,down_proj --seed 9 --peft-params
  pystep -o /dev/null "$REF" forward --model "$pdir" --adapter "$pa" --input "$WORK/in.jsonl" --output "$pa.ref.jsonl"
  merge_matches "$name merge" "$pdir" "$pa" "$pa.ref.jsonl" "$pa"
  rm -rf "$pa.saved"
  if ! "$TOOL" "$pdir" "$pdir.in.jsonl" /dev/null --adapter "$pa" --save-adapter "$pa.saved" >/dev/null 2>"$pa.save.err"; then
    { echo "grad_tool $pdir $pdir.in.jsonl /dev/null --adapter $pa --save-adapter $pa.saved failed (a grad_tool without --save-adapter, or trill cannot load or save this adapter):"
      cat "$pa.save.err"; } >"$pa.save.txt"
    fail "$name round trip: grad_tool --save-adapter failed" "$pa.save.txt"
  elif ! pystep -o "$pa.saved.txt" -E "$REF" forward --model "$pdir" --adapter "$pa.saved" --input "$WORK/in.jsonl" --output "$pa.saved.ref.jsonl"; then
    fail "$name round trip: the reference refuses the adapter trill saved" "$pa.saved.txt"
  elif pystep -o "$pa.rt.txt" compare.py "$pa.ref.jsonl" "$pa.saved.ref.jsonl" --atol 1e-9 --tie 1e-12; then
    pass "$name round trip (reference forward, saved vs original adapter): $(grep 'max |d logprob|' "$pa.rt.txt")"
  else fail "$name round trip (reference forward, saved vs original adapter)" "$pa.rt.txt"; fi
}
