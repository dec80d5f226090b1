#!/usr/bin/env bash
# What a real run meets sooner or later, on the tiny random MoE of fixture.sh: rewards that
# overflow, a NaN step, two runs on one folder, a resume against another model or a damaged
# checkpoint, Ctrl-C and SIGTERM, a full disk, a batch too large for memory, data without its
# answers, and the small ones.
# Nothing may hang (every command runs under a timeout), be checkpointed broken, or be lost.
set -euo pipefail
TRILL=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/fixture.sh"

# A reward process answering like digits.py, except as the arguments say: `huge A B` answers A
# and B alternately; `block N` answers N requests, then writes "blocked" and waits for a file
# "go" before going on; `twice` writes every reply twice.
cat > reward.py <<'PY'
import json, os, sys, time
how = sys.argv[1]
parent = os.getppid()
n = 0
for line in sys.stdin:
    n += 1
    c = json.loads(line)["completion"]
    r = sum(ch.isdigit() for ch in c) / max(len(c), 1)
    if how == "huge":
        r = float(sys.argv[2] if n % 2 else sys.argv[3])
    if how == "block" and n == int(sys.argv[2]) + 1:
        open("blocked", "w").close()
        while not os.path.exists("go"):
            if os.getppid() != parent:  # trill is gone (a second signal): so is this
                sys.exit(0)
            time.sleep(0.01)
    out = json.dumps({"reward": r, "metrics": {"len": len(c)}})
    # twice: both lines in one write, so the surplus one is there before the next request (two
    # writes race with it: trill may send the next request between them, and see the line later)
    print(out + "\n" + out if how == "twice" else out, flush=True)
PY
wait_for() { # wait_for FILE PID: until FILE exists (the run is where the test wants it), or PID ended
    for _ in $(seq 1 "$((LIMIT * 10))"); do [ -e "$1" ] && return 0; kill -0 "$2" 2>/dev/null || break; sleep 0.1; done
    [ -e "$1" ] || fail "the run never got to the point the test waits for ($1)"
}
full_run() { # the uninterrupted run the interrupted ones must equal
    [ -d full ] || must_pass log_full "$TRILL" train "${COMMON[@]}" run_dir=full steps=6 checkpoint.every=1 checkpoint.keep=0
}
verify_all() { # every checkpoint left in RUN is complete: resume=auto skips none
    for d in "$1"/checkpoints/step-*; do
        [ -f "$d/manifest.json" ] || fail "$d has no manifest"
    done
    [ -z "$(ls -A "$1/checkpoints" | grep -v '^step-' || true)" ] || fail "left in $1/checkpoints: $(ls -A "$1/checkpoints")"
}

overflow() {
    echo "== rewards that overflow"
    # finite but enormous rewards: the group statistics are scaled, so the advantages are finite and it trains
    must_pass log_huge "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py huge 1e308 1.7e308" run_dir=huge steps=3
    $PY - <<'PY'
import json, math
m = [json.loads(l) for l in open("huge/metrics.jsonl")]
assert len(m) == 3 and all(math.isfinite(x["loss"]) and math.isfinite(x["grad_norm"]) and x["grad_norm"] > 0 for x in m), m
print("   rewards 1e308 / 1.7e308: loss", [round(x["loss"], 4) for x in m], "grad norm", [round(x["grad_norm"], 4) for x in m])
PY
    # a weighted sum beyond the largest double stops the step before it is trained
    must_exit 1 log_inf "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py huge 1e308 1e308" reward.external_weight=1e300 \
        run_dir=inf steps=3 checkpoint.every=1
    grep -q "sequence 0 of the batch: its reward is inf after adding the external process's score (reward.external_weight 1e+300" log_inf \
        || { cat log_inf; fail "overflowing reward: message"; }
    [ ! -d inf/checkpoints ] || [ -z "$(ls inf/checkpoints)" ] || fail "a checkpoint of the overflowing step"
    # Dr. GRPO keeps the rewards' scale: advantages of 1e308 make the loss overflow. The step is never
    # applied: an error naming it, or with trainer.skip_nonfinite a skipped step that leaves the adapter as it was.
    must_pass log_ok2 "$TRILL" train "${COMMON[@]}" run_dir=nan steps=2 checkpoint.every=1
    must_exit 1 log_nan "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py huge 1e308 -1e308" algo.std_norm=false \
        run_dir=nan steps=4 checkpoint.every=1 resume=auto
    grep -qE "step 3: the (loss|gradient norm) is (nan|inf|-inf)" log_nan || { cat log_nan; fail "non-finite step: message"; }
    [ "$(ls nan/checkpoints)" = "$(printf 'step-%08d\n' 1 2)" ] || fail "checkpoints after a non-finite step: $(ls nan/checkpoints)"
    must_pass log_skip "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py huge 1e308 -1e308" algo.std_norm=false \
        trainer.skip_nonfinite=true run_dir=nan steps=3 checkpoint.every=1 resume=auto
    $PY -c "import json
m = [json.loads(l) for l in open('nan/metrics.jsonl')]
assert [x['skipped_nonfinite'] for x in m] == [0, 0, 1] and m[2]['policy_version'] == 2, [(x['skipped_nonfinite'], x['policy_version']) for x in m]"
    cmp nan/checkpoints/step-00000002/adapter/adapter_model.safetensors nan/checkpoints/step-00000003/adapter/adapter_model.safetensors \
        || fail "a skipped step changed the adapter"
    echo "   Dr. GRPO with rewards +-1e308: $(grep -oE "step 3: the [a-z ]+ is [a-z-]+" log_nan); skipped with trainer.skip_nonfinite"
    # weights that are not numbers are refused where they enter the generator, never a hang
    cp -r nan/checkpoints/step-00000002/adapter nan_adapter
    $PY - <<'PY'
import json, struct
path = "nan_adapter/adapter_model.safetensors"
data = bytearray(open(path, "rb").read())
(n,) = struct.unpack_from("<Q", data, 0)
header = json.loads(data[8:8 + n])
name, t = next((k, v) for k, v in header.items() if k != "__metadata__")
struct.pack_into("<f", data, 8 + n + t["data_offsets"][0], float("nan"))
open(path, "wb").write(data)
PY
    must_exit 1 log_nan_eval "$TRILL" eval --model model --data eval.jsonl --verifier demo --adapter nan_adapter --max-new-tokens 6
    grep -q "engine: adapter tensor .* is nan: refused" log_nan_eval || { cat log_nan_eval; fail "NaN adapter: message"; }
    # every group flat under dynamic sampling: nothing trains, no update, no new version; the next
    # batches are still issued (the scheduler's gate counts steps, not versions), sync and async
    for mode in sync async; do
        must_pass "log_flat_$mode" "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py huge 0.5 0.5" algo.dynamic_sampling=true \
            mode=$mode run_dir="flat_$mode" steps=3
        $PY - "flat_$mode" <<'PY'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert len(m) == 3 and all(x["trained_seqs"] == 0 and x["policy_version"] == 0 for x in m), m
PY
    done
    echo "   every group flat: 3 steps without an update, sync and async"
}

lock() {
    echo "== one process per run folder"
    "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py block 16" run_dir=busy steps=3 2>log_busy &
    pid=$!
    wait_for blocked $pid
    must_exit 1 log_second "$TRILL" train "${COMMON[@]}" run_dir=busy steps=3
    grep -q "run_dir busy is in use by another trill train (process $pid holds busy/.lock)" log_second || { cat log_second; fail "lock: message"; }
    touch go
    rc=0; wait $pid || rc=$?
    [ "$rc" -eq 0 ] || { cat log_busy; fail "the first run failed ($rc)"; }
    rm -f blocked go
    must_pass log_after "$TRILL" train "${COMMON[@]}" run_dir=busy steps=4 resume=auto # the lock went with its process
}

resume() {
    echo "== resume checks what it resumes"
    full_run
    "$TRILL" init --out model2 --preset tiny --set hidden_size=64 --set intermediate_size=128 --set moe_intermediate_size=32 \
        --set head_dim=16 --seed 4 2>/dev/null # the same shape, other weights
    cp -r full part
    rm -rf part/checkpoints/step-0000000[4-6]
    must_exit 1 log_other "$TRILL" train "${COMMON[@]}" model=model2 run_dir=part steps=6 checkpoint.every=1 checkpoint.keep=0 resume=auto
    grep -q "part/checkpoints/step-00000003: made for another base model .* model model2 has config.json" log_other \
        || { cat log_other; fail "another base model: message"; }
    # damaged newest checkpoints: resume=auto says so and continues from the newest intact one. Step 3
    # cut short (the size check); step 2 with one byte of its adapter's data flipped, the size kept
    # (the XXH64 check alone sees it)
    truncate -s 1000 part/checkpoints/step-00000003/optimizer.safetensors
    $PY - part/checkpoints/step-00000002/adapter/adapter_model.safetensors <<'PY'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
(n,) = struct.unpack_from("<Q", data, 0)
data[8 + n + 5] ^= 0x10  # a mantissa bit of the first tensor's second value
open(sys.argv[1], "wb").write(data)
PY
    mkdir part/checkpoints/.tmp-step-00000004 # left by a run killed while writing it: removed at the next start
    must_pass log_fallback "$TRILL" train "${COMMON[@]}" run_dir=part steps=6 checkpoint.every=1 checkpoint.keep=0 resume=auto
    grep -q "skipping checkpoint part/checkpoints/step-00000003: part/checkpoints/step-00000003/optimizer.safetensors is 1000 bytes, the manifest says" \
        log_fallback || { cat log_fallback; fail "fallback: message"; }
    grep -qE "skipping checkpoint part/checkpoints/step-00000002: part/checkpoints/step-00000002/adapter/adapter_model.safetensors has checksum [0-9a-f]{16}, the manifest says [0-9a-f]{16}" \
        log_fallback || { cat log_fallback; fail "a flipped byte: no checksum message"; }
    grep -q "resuming from part/checkpoints/step-00000001 at step 1" log_fallback || { cat log_fallback; fail "did not resume from step 1"; }
    cmp full/checkpoints/step-00000006/adapter/adapter_model.safetensors part/checkpoints/step-00000006/adapter/adapter_model.safetensors \
        || fail "the resumed run differs from the uninterrupted one"
    verify_all part
    rm part/checkpoints/step-00000006/manifest.json
    must_exit 1 log_explicit "$TRILL" train "${COMMON[@]}" run_dir=part2 steps=7 --resume part/checkpoints/step-00000006
    grep -q "no manifest.json (it is written last: the checkpoint is incomplete)" log_explicit || { cat log_explicit; fail "explicit resume of a damaged checkpoint"; }
}

signals() {
    echo "== Ctrl-C and SIGTERM: the current step finishes and is saved"
    full_run
    for sig in INT TERM; do
        rm -f blocked go
        # (a background job of a script ignores SIGINT; env gives it back the default, as a terminal's job has)
        env --default-signal=INT "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py block 32" run_dir=sig_$sig steps=6 \
            checkpoint.every=100 checkpoint.keep=0 2>log_sig_$sig &
        pid=$!
        wait_for blocked $pid # in step 3
        kill -$sig $pid
        sleep 0.2
        touch go
        rc=0; wait $pid || rc=$?
        want=$((128 + $(kill -l $sig)))
        [ "$rc" -eq "$want" ] || { cat log_sig_$sig; fail "SIG$sig: exit status $rc, expected $want"; }
        clean_log log_sig_$sig
        grep -q "stopped on request after step 3 of 6 (checkpoint written); continue with resume=auto" log_sig_$sig \
            || { cat log_sig_$sig; fail "SIG$sig: message"; }
        [ "$(ls sig_$sig/checkpoints)" = "step-00000003" ] || fail "SIG$sig: checkpoints $(ls -A sig_$sig/checkpoints)"
        must_pass log_sig_resume "$TRILL" train "${COMMON[@]}" run_dir=sig_$sig steps=6 checkpoint.every=100 checkpoint.keep=0 resume=auto
        cmp full/checkpoints/step-00000006/adapter/adapter_model.safetensors sig_$sig/checkpoints/step-00000006/adapter/adapter_model.safetensors \
            || fail "SIG$sig: the resumed run differs from the uninterrupted one"
    done
    # async mode: the trainer stops after its step, the executors with it
    rm -f blocked go
    env --default-signal=INT "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py block 32" mode=async run_dir=sig_async \
        steps=8 checkpoint.every=100 2>log_sig_async &
    pid=$!
    wait_for blocked $pid
    kill -INT $pid
    sleep 0.2
    touch go
    rc=0; wait $pid || rc=$?
    [ "$rc" -eq 130 ] || { cat log_sig_async; fail "async SIGINT: exit status $rc"; }
    k=$(sed -n 's/.*stopped on request after step \([0-9]*\) of 8 (checkpoint written).*/\1/p' log_sig_async)
    [ -n "$k" ] && [ "$(ls sig_async/checkpoints)" = "$(printf 'step-%08d' "$k")" ] || { cat log_sig_async; fail "async SIGINT: checkpoint"; }
    must_pass log_sig_async2 "$TRILL" train "${COMMON[@]}" mode=async run_dir=sig_async steps=8 checkpoint.every=100 resume=auto
    # a second signal quits at once, mid-step, leaving only complete checkpoints
    rm -f blocked go
    env --default-signal=INT "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py block 32" run_dir=sig2 steps=6 checkpoint.every=1 \
        2>log_sig2 &
    pid=$!
    wait_for blocked $pid
    kill -INT $pid
    sleep 0.2
    kill -INT $pid
    rc=0; wait $pid || rc=$?
    touch go # the reward script trill left blocked (it quit at once) finishes instead of polling on
    [ "$rc" -eq 130 ] || { cat log_sig2; fail "a second SIGINT: exit status $rc"; }
    verify_all sig2
    must_pass log_sig2_resume "$TRILL" train "${COMMON[@]}" run_dir=sig2 steps=6 checkpoint.every=1 resume=auto
    grep -q "resuming from sig2/checkpoints/step-00000002 at step 2" log_sig2_resume || fail "a second SIGINT: resumed from the wrong step"
}

disk() {
    echo "== a full disk is an error, and the checkpoints before it are kept"
    must_pass log_disk1 "$TRILL" train "${COMMON[@]}" run_dir=disk steps=2 checkpoint.every=1 checkpoint.keep=1
    # ulimit -f counts 1024-byte blocks: the 297 KB adapter of step 3 does not fit in 100
    must_exit 1 log_disk2 bash -c 'ulimit -f 100; exec "$0" "$@"' "$TRILL" train "${COMMON[@]}" run_dir=disk steps=4 checkpoint.every=1 \
        checkpoint.keep=1 resume=auto
    grep -qE "disk/checkpoints/.tmp-step-00000003/adapter/adapter_model.safetensors.*(File too large|write failed)" log_disk2 \
        || { cat log_disk2; fail "full disk: message"; }
    [ "$(ls -A disk/checkpoints)" = "step-00000002" ] || fail "full disk: $(ls -A disk/checkpoints)"
    must_pass log_disk3 "$TRILL" train "${COMMON[@]}" run_dir=disk steps=4 checkpoint.every=1 checkpoint.keep=1 resume=auto
}

memory() {
    echo "== a batch too large for memory is an error, not a crash"
    # 10M prompts x 4 samples cannot be queued in 1 GB of address space: the generator runs out
    # of memory while submitting them. (ASan reserves terabytes of shadow address space, so there
    # its allocator is capped by resident size instead, and returns NULL as malloc does; its
    # notice of the cap goes to a log of its own, where nothing else may be.)
    # (the default 256 MB KV cache, as a user's run has: with the fixture's 16 MB the run gets further
    # into its 10M prompts before memory runs out, 37 s instead of 2)
    if [[ "$(ldd "$TRILL")" == *libasan* ]]; then
        ASAN_OPTIONS="${ASAN_OPTIONS:-}:allocator_may_return_null=1:soft_rss_limit_mb=1000:log_path=$PWD/asan_mem" must_exit 1 log_mem \
            "$TRILL" train "${COMMON[@]}" generator.prompts_per_step=10000000 generator.kv_cache_mb=256 run_dir=mem steps=1
        ! cat asan_mem.* | grep -v "soft rss limit exhausted" | grep . || fail "a sanitizer report (above)"
    else
        must_exit 1 log_mem bash -c 'ulimit -v 1000000; exec "$0" "$@"' "$TRILL" train "${COMMON[@]}" generator.prompts_per_step=10000000 \
            generator.kv_cache_mb=256 run_dir=mem steps=1
    fi
    grep -q "trill train: .*out of memory" log_mem || { cat log_mem; fail "a batch too large for memory: message"; }
    echo "   generator.prompts_per_step=10000000: $(grep -o "out of memory.*" log_mem)"
}

data() {
    echo "== data without its answers, and the small ones"
    $PY -c "import json
with open('noanswer.jsonl', 'w') as f:
    for l in open('train.jsonl'):
        f.write(json.dumps({'prompt': json.loads(l)['prompt']}) + '\n')"
    must_exit 1 log_noans "$TRILL" train "${COMMON[@]}" data.train=noanswer.jsonl run_dir=noans steps=1
    grep -q 'noanswer.jsonl:1: no answer field "answer"' log_noans || { cat log_noans; fail "missing answer: message"; }
    must_exit 1 log_typo "$TRILL" train "${COMMON[@]}" data.answer_field=anwser run_dir=typo steps=1
    grep -q 'train.jsonl:1: no answer field "anwser"' log_typo || { cat log_typo; fail "answer field typo: message"; }
    must_pass log_allow "$TRILL" train "${COMMON[@]}" data.train=noanswer.jsonl data.allow_missing_answer=true reward.verifier=none data.eval= \
        run_dir=allow steps=1
    must_exit 2 log_bogus "$TRILL" train --bogus
    grep -q "invalid option --bogus" log_bogus || { cat log_bogus; fail "--bogus: message"; }
    must_exit 1 log_dir "$TRILL" train "${COMMON[@]}" data.train=model run_dir=dirdata steps=1
    grep -q "model: is a directory, expected a JSONL file" log_dir || { cat log_dir; fail "a directory as data: message"; }
    must_exit 2 log_both "$TRILL" sft --model model --data train.jsonl --out sftout --lora --full
    grep -q -- "--lora and --full exclude each other" log_both || { cat log_both; fail "sft --lora --full: message"; }
    "$TRILL" init --out short --preset tiny --set hidden_size=64 --set intermediate_size=128 --set moe_intermediate_size=32 \
        --set head_dim=16 --set max_position_embeddings=10 --seed 3 2>/dev/null
    must_exit 1 log_long "$TRILL" train "${COMMON[@]}" model=short run_dir=long steps=1
    grep -q "train.jsonl:1: the prompt has 6 tokens: with up to 6 new ones (generator.max_new_tokens) its sequence would pass the model's max_position_embeddings (10)" \
        log_long || { cat log_long; fail "prompt beyond max_position_embeddings: message"; }
    must_exit 1 log_twice "$TRILL" train "${COMMON[@]}" "reward.external=$PY reward.py twice" reward.external_max_failures=1 run_dir=twice steps=1
    grep -q "wrote a line before it was sent a request (more replies than requests)" log_twice || { cat log_twice; fail "extra reply lines: message"; }
}

# TRILL_TEST_SECTIONS picks some (e.g. to see each fail on an older build); all by default
for section in ${TRILL_TEST_SECTIONS:-overflow lock resume signals disk memory data}; do $section; done
echo "all reliability tests passed"
