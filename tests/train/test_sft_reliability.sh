#!/usr/bin/env bash
# trill sft keeps its run folder as trill train does (issue 34, items 13-17), on the tiny random
# MoE of tests/rl/fixture.sh: checkpoints in step folders with a manifest, whole or absent after a
# kill -9 or a full disk; one process a run folder; a resume refuses another base model, mode or
# adapter shape by the key's name and falls back past a damaged checkpoint; SIGINT checkpoints and
# exits 130; an example longer than the model or sft.max_seq_len allows is refused by line, or cut
# with sft.truncate. Every interrupted run, resumed, ends byte-identical to an uninterrupted one.
# Usage: test_sft_reliability.sh PATH/TO/trill   (TRILL_TEST_SECTIONS picks sections)
set -euo pipefail
TRILL=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../rl/fixture.sh"

# 64 two-digit sums as prompt/completion pairs; LoRA rank 4; a checkpoint every step, two kept
SFT=(--model model --data train.jsonl data.completion_field=answer trainer.micro_batch_tokens=128 sft.epochs=2 trainer.lr=2e-3
     trainer.lora.rank=4 sft.save_every=1 checkpoint.keep=2)
must_pass log_ref "$TRILL" sft "${SFT[@]}" --out ref
STEPS=$(sed -n 's/.* \([0-9]*\) steps (LoRA.*/\1/p' log_ref)
[ -n "$STEPS" ] && [ "$STEPS" -ge 8 ] || fail "the reference run: $(cat log_ref)"
FILES=(adapter_model.safetensors adapter_config.json optimizer.safetensors optimizer.json)
same_as_ref() { # same_as_ref DIR: DIR's result is the uninterrupted run's, byte for byte
    for f in "${FILES[@]}"; do cmp -s "ref/$f" "$1/$f" || fail "$1/$f differs from the uninterrupted run's"; done
}
complete_only() { # every checkpoint of DIR verifies (a resume skips none) and nothing temporary is left
    [ -z "$(ls -A "$1/checkpoints" | grep -v '^step-' || true)" ] || fail "left in $1/checkpoints: $(ls -A "$1/checkpoints")"
    for d in "$1"/checkpoints/step-*; do [ -f "$d/manifest.json" ] || fail "$d has no manifest"; done
}

lock_signal() {
    echo "== one run a run folder; SIGINT checkpoints the step and exits 130"
    # 50 steps; the run is frozen (SIGSTOP) while it is checked, so no machine is too fast for the test
    local long=(sft.epochs=10 sft.save_every=10) steps
    must_pass log_ref_sig "$TRILL" sft "${SFT[@]}" "${long[@]}" --out ref_sig
    steps=$(sed -n 's/.* \([0-9]*\) steps (LoRA.*/\1/p' log_ref_sig)
    # (a background job of a script ignores SIGINT; env gives it back the default, as a terminal's job has)
    env --default-signal=INT "$TRILL" sft "${SFT[@]}" "${long[@]}" --out sig 2>log_sig &
    local pid=$! rc=0
    for ((i = 0; i < LIMIT * 1000; i++)); do grep -q '^step 2/' log_sig && break; kill -0 $pid 2>/dev/null || break; done
    kill -STOP $pid
    grep -q '^step 2/' log_sig || { cat log_sig; fail "the run never reached step 2"; }
    must_exit 1 log_second "$TRILL" sft "${SFT[@]}" "${long[@]}" --out sig
    grep -q "run_dir sig is in use by another trill sft (process $pid holds sig/.lock)" log_second || { cat log_second; fail "lock: message"; }
    kill -INT $pid
    kill -CONT $pid
    wait $pid || rc=$?
    [ "$rc" -eq 130 ] || { cat log_sig; fail "SIGINT: exit status $rc, expected 130"; }
    grep -qE "trill sft: stopped on request after step [0-9]+ of $steps \(checkpoint written\); continue with resume=auto" log_sig \
        || { cat log_sig; fail "SIGINT: message"; }
    clean_log log_sig
    complete_only sig
    must_pass log_sig_resume "$TRILL" sft "${SFT[@]}" "${long[@]}" --out sig resume=auto
    grep -q "resuming from sig/checkpoints/step-" log_sig_resume || { cat log_sig_resume; fail "SIGINT: no resume"; }
    for f in "${FILES[@]}"; do cmp -s "ref_sig/$f" "sig/$f" || fail "sig/$f differs from the uninterrupted run's"; done
    # a fresh run into a folder with checkpoints is refused (resume=auto continues it)
    must_exit 1 log_fresh "$TRILL" sft "${SFT[@]}" "${long[@]}" --out sig
    grep -q "run_dir sig already has checkpoints" log_fresh || { cat log_fresh; fail "fresh run over checkpoints: message"; }
}

kills() {
    echo "== kill -9 during checkpoints: every restart resumes from a complete one, and the end is the uninterrupted run's"
    # full fine-tuning of the tiny preset: a 44 MB checkpoint takes a good part of each step to write;
    # 12 epochs (about 5-7 s) so that twelve runs killed at most 0.9 s in do not reach the end (with
    # 8, a faster machine's resumed runs finished before the 10th kill)
    "$TRILL" init --out big --preset tiny --seed 3 2>/dev/null
    local full=(--model big --full --data train.jsonl data.completion_field=answer trainer.micro_batch_tokens=256 sft.epochs=12
                trainer.lr=1e-3 sft.save_every=1 checkpoint.keep=2)
    must_pass log_ref_full "$TRILL" sft "${full[@]}" --out ref_full
    local kills=0 mid_save=0
    for i in $(seq 1 12); do
        "$TRILL" sft "${full[@]}" --out killed resume=auto 2>log_kill &
        local pid=$!
        if [ $((i % 2)) -eq 1 ]; then # just after a step's line: its checkpoint is being written
            for ((i = 0; i < LIMIT * 1000; i++)); do grep -q '^step [0-9]*/' log_kill && break; kill -0 $pid 2>/dev/null || break; done
        else
            sleep "0.$((RANDOM % 9 + 1))"
        fi
        if kill -9 $pid 2>/dev/null; then kills=$((kills + 1)); fi
        wait $pid 2>/dev/null || true
        clean_log log_kill
        compgen -G "killed/checkpoints/.tmp-step-*" >/dev/null && mid_save=$((mid_save + 1))
        for d in killed/checkpoints/step-*; do [ -e "$d" ] || continue; [ -f "$d/manifest.json" ] || fail "$d has no manifest"; done
    done
    must_pass log_killed_end "$TRILL" sft "${full[@]}" --out killed resume=auto
    complete_only killed
    for f in model.safetensors config.json optimizer.safetensors optimizer.json; do
        cmp -s "ref_full/$f" "killed/$f" || fail "killed/$f differs from the uninterrupted run's"
    done
    echo "   $kills kills, $mid_save of them while a checkpoint was being written; the resumed run equals the uninterrupted one"
    [ "$kills" -ge 10 ] || fail "only $kills of the runs were still running when killed"
}

disk() {
    echo "== a full disk mid-run is an error naming the file; the checkpoints before it stay whole"
    local one
    one=$(du -sk "$(ls -d ref/checkpoints/step-* | tail -1)" | cut -f1)
    mkdir -p small
    if ! mount -t tmpfs -o size=$((one * 3 / 2 + 64))k tmpfs small 2>/dev/null; then
        echo "   SKIP: cannot mount a tmpfs here (the ulimit -f case of test_reliability.sh covers a full disk)"
        return
    fi
    local rc=0
    timeout -k 5 "$LIMIT" "$TRILL" sft "${SFT[@]}" checkpoint.keep=1 --out small/run 2>log_disk || rc=$?
    [ "$rc" -eq 1 ] || { umount small; cat log_disk; fail "full disk: exit status $rc, expected 1"; }
    grep -qE "small/run/checkpoints/.tmp-step-[0-9]+/.*(No space left on device|write failed)" log_disk \
        || { umount small; cat log_disk; fail "full disk: message"; }
    cp -a small/run disk_copy
    umount small
    clean_log log_disk
    complete_only disk_copy
    [ "$(ls disk_copy/checkpoints | wc -l)" -eq 1 ] || fail "full disk: $(ls disk_copy/checkpoints)"
    must_pass log_disk_resume "$TRILL" sft "${SFT[@]}" --out disk_copy resume=auto
    same_as_ref disk_copy
}

resume_checks() {
    echo "== a resume keeps the base model, sft.mode and the adapter; a damaged checkpoint is skipped"
    cp -a ref other
    "$TRILL" init --out model2 --preset tiny --set hidden_size=64 --set intermediate_size=128 --set moe_intermediate_size=32 \
        --set head_dim=16 --seed 4 2>/dev/null
    must_exit 1 log_model "$TRILL" sft "${SFT[@]}" --model model2 --out other resume=auto
    grep -q "made for another base model" log_model || { cat log_model; fail "another base model: message"; }
    must_exit 1 log_rank "$TRILL" sft "${SFT[@]}" trainer.lora.rank=8 --out other resume=auto
    grep -q "trainer.lora.rank is 4 in the checkpoint, 8 in this config" log_rank || { cat log_rank; fail "another rank: message"; }
    must_exit 1 log_mode "$TRILL" sft "${SFT[@]}" --full --out other resume=auto
    grep -q "sft.mode is lora in the checkpoint, full in this config" log_mode || { cat log_mode; fail "another mode: message"; }
    # one byte changed in the newest checkpoint's adapter (same size: only the checksum can tell)
    local newest
    newest=$(ls -d other/checkpoints/step-* | tail -1)
    $PY -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-5]^=1; open(p,'wb').write(b)" "$newest/adapter_model.safetensors"
    must_pass log_fallback "$TRILL" sft "${SFT[@]}" --out other resume=auto
    grep -q "skipping checkpoint $newest: $newest/adapter_model.safetensors has checksum" log_fallback || { cat log_fallback; fail "fallback: message"; }
    same_as_ref other
}

lengths() {
    echo "== an example longer than sft.max_seq_len or the model's positions is refused by line, or cut with sft.truncate"
    $PY - <<'PY'
import json
with open("long.jsonl", "w") as f:
    f.write(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    f.write(json.dumps({"prompt": "2+2=", "answer": "4" * 40}) + "\n")
PY
    must_exit 1 log_len "$TRILL" sft "${SFT[@]}" --data long.jsonl sft.max_seq_len=16 --out len
    grep -q "long.jsonl:2: the example has .* tokens (prompt .*), more than sft.max_seq_len (16)" log_len || { cat log_len; fail "length: message"; }
    must_pass log_trunc "$TRILL" sft "${SFT[@]}" --data long.jsonl sft.max_seq_len=16 sft.truncate=true --out trunc
    "$TRILL" init --out short --preset tiny --set hidden_size=64 --set intermediate_size=128 --set moe_intermediate_size=32 \
        --set head_dim=16 --set max_position_embeddings=16 --seed 3 2>/dev/null
    must_exit 1 log_pos "$TRILL" sft "${SFT[@]}" --model short --data long.jsonl --out pos
    grep -q "long.jsonl:2: the example has .* more than the model's max_position_embeddings (16)" log_pos || { cat log_pos; fail "positions: message"; }
    must_exit 1 log_prompt "$TRILL" sft "${SFT[@]}" --data long.jsonl sft.max_seq_len=4 sft.truncate=true --out prompt
    grep -q "long.jsonl:1: the prompt has .* tokens, so no completion token fits in sft.max_seq_len (4)" log_prompt \
        || { cat log_prompt; fail "prompt too long to truncate: message"; }
}

for section in ${TRILL_TEST_SECTIONS:-lock_signal kills disk resume_checks lengths}; do $section; done
echo "all sft reliability tests passed"
