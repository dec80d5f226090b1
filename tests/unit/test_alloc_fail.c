/* Out of memory, everywhere (sqlite's malloc test). A unit of work that touches every large part
 * of the library — a small Qwen3-MoE made from config text, the reference forward with expert
 * capture and router replay, full-gradient and LoRA training (recompute on and off, an fp32 and
 * a bf16 base; then through expert parallelism's exchange in a group of one), a LoRA merge,
 * adapter and model checkpoints written and read back, the
 * generator in every format (capture on, once with EPLB) with forks, collection and a live
 * adapter update — is run once to count its allocations (trill_alloc_fail_after counts
 * jansson's too), then with the allocations after the first N failing, N = 0 ... count. Each
 * run must:
 *   - not crash or abort;
 *   - stop at a call that returns a status other than TRILL_OK with a message saying it ran
 *     out of memory (TRILL_ERR_NOMEM, or a message mentioning memory), and free everything made
 *     so far;
 *   - have computed exactly what the run without failures computed up to that call: every
 *     stage that returned TRILL_OK is compared with it by a digest of its outputs, so nothing
 *     is dropped silently;
 *   - when a generator step is what failed, leave the engine as good as before: injection ends
 *     there, the engine is stepped on to the end and its outputs must be those of the run
 *     without failures;
 *   - leak nothing: in the ASan build every run is checked (the allocator's bytes in use before
 *     and after), and LeakSanitizer checks again at exit (a leak makes the program exit 1).
 * Before every run each thread of the OpenMP team releases its per-thread scratch (the kernels'
 * panels, the generator's activations), so those first allocations are among the ones failed.
 *
 * Coverage (about 3,800 allocations on one OpenMP thread, 4,000 on two): make test-full
 * (TRILL_TEST_FULL=1) fails every N on one thread; on two (per-thread scratch failing in one
 * thread of a team and not the other, two EPLB workers) every N of the first stage, the generator
 * with EPLB, then every 7th. make test fails every 5th N on one thread in the release build and
 * every 7th in the ASan build (93 s for every N there; the two samples meet every 35th N, so
 * together they fail 31% of the Ns, each allocation site many times over), and on two every N
 * of the first stage, then every 13th. TRILL_ALLOC_FAIL_STRIDE=k multiplies the strides (a quick look). */
#include <ftw.h>
#include <limits.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#ifdef __SANITIZE_ADDRESS__
size_t __sanitizer_get_current_allocated_bytes(void); /* the sanitizers' allocator_interface.h */
#endif

#include "base/alloc.h"
#include "base/tls.h"
#include "testutil.h"
#include "trill/dist.h"
#include "trill/eplb.h"
#include "trill/infer.h"
#include "model/lora_internal.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/timing.h"
#include "trill/train.h"

/* A Qwen3-MoE small enough for thousands of runs: layer 0 dense, layer 1 MoE (4 experts, top-2). */
static const char CONFIG[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 32,"
    " \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 1, \"head_dim\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 8, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [0],"
    " \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"initializer_range\": 0.3,"
    " \"max_position_embeddings\": 256, \"bos_token_id\": 0, \"eos_token_id\": 0}";

enum { MAX_DIGESTS = 64, N_SEQS = 2, T = 11 };
static const int TOKENS[T] = { 1, 5, 9, 3, 7, 2, 30, 11, 4, 8, 6 };
static const int OFFSETS[N_SEQS + 1] = { 0, 6, T };

/* What one run of the unit did. */
typedef struct unit {
    const char *dir;          /* scratch folder for the checkpoints */
    bool armed;               /* failures are being injected */
    bool memory_back;         /* injection ended after a failed engine step: nothing may fail now */
    uint64_t digest[MAX_DIGESTS];
    int n_digest;             /* stages completed, each with the digest of its outputs */
    long made;                /* run without failures: allocations made by the stages done ... */
    long made_by[MAX_DIGESTS]; /* ... and by the end of each */
    const char *failed_call;  /* the call that failed (NULL: the unit completed) */
    trill_status status;
    char message[600];
    char problem[900];        /* a broken rule, or "" */
} unit;

/* FNV-1a over bytes. */
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
enum { FNV_SEED = 14695981039346656037ull };

static void stage_done(unit *u, uint64_t h) {
    if (u->n_digest == MAX_DIGESTS) return;
    if (!u->armed) u->made += trill_alloc_fail_after(LONG_MAX); /* the count so far (and on from 0) */
    u->made_by[u->n_digest] = u->made;
    u->digest[u->n_digest++] = h;
}

/* Records a failed call and whether it failed as it must. */
static void failed(unit *u, const char *call, trill_status st) {
    if (u->memory_back) { /* after a failed step, with every allocation served again */
        snprintf(u->problem, sizeof u->problem, "after %s failed: %s then failed with memory back: %s: %s", u->failed_call, call,
                 trill_status_name(st), trill_error_message());
        return;
    }
    u->failed_call = call;
    u->status = st;
    snprintf(u->message, sizeof u->message, "%s", trill_error_message());
    if (!u->armed)
        snprintf(u->problem, sizeof u->problem, "%s failed with nothing injected: %s: %s", call, trill_status_name(st), u->message);
    else if (!u->message[0])
        snprintf(u->problem, sizeof u->problem, "%s failed (%s) with an empty message", call, trill_status_name(st));
    else if (st != TRILL_ERR_NOMEM && !strstr(u->message, "memory"))
        snprintf(u->problem, sizeof u->problem, "%s failed with %s, not out of memory: %s", call, trill_status_name(st), u->message);
}

/* Runs a call that returns a trill_status; on failure the unit stops (goto out) and cleans up. */
#define CALL(expr)                                                                                                                       \
    do {                                                                                                                                 \
        trill_error(TRILL_OK, "%s", ""); /* a message left by an earlier call must not count */                                       \
        const trill_status st_ = (expr);                                                                                                 \
        if (st_ != TRILL_OK) {                                                                                                           \
            failed(u, #expr, st_);                                                                                                       \
            goto out;                                                                                                                    \
        }                                                                                                                                \
    } while (0)

/* A call that reports failure otherwise (NULL, -1): a status from its condition. */
#define CHECK(cond, what) CALL((cond) ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "test: out of memory for %s", what))

static trill_request request(uint64_t id, const int *prompt, int len, int n, int max_new) {
    trill_request r = { .id = id, .prompt = prompt, .prompt_len = len, .n = n, .max_new_tokens = max_new };
    r.sampling = trill_sampling_default();
    r.sampling.seed = 77;
    return r;
}

static uint64_t digest_outs(uint64_t h, const trill_sequence_out *o, int n, int per_token) {
    for (int i = 0; i < n; i++) {
        h = fnv(h, &o[i].request, sizeof o[i].request);
        h = fnv(h, &o[i].sample, sizeof o[i].sample);
        h = fnv(h, o[i].tokens, sizeof(int) * (size_t)(o[i].n_prompt + o[i].n_generated));
        h = fnv(h, o[i].logprobs, sizeof(float) * (size_t)o[i].n_generated);
        h = fnv(h, o[i].versions, sizeof(uint32_t) * (size_t)o[i].n_generated);
        if (o[i].experts)
            h = fnv(h, o[i].experts, sizeof(uint16_t) * (size_t)per_token * (size_t)(o[i].n_prompt + o[i].n_generated - 1));
    }
    return h;
}

enum { MAX_OUT = 8 };

/* Collects into out[*n...] and sorts by (request, sample): the finishing order is the engine's. */
static void collect(trill_engine *e, trill_sequence_out *out, int *n) {
    *n += trill_engine_collect(e, out + *n, MAX_OUT - *n);
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && (out[j].request < out[j - 1].request ||
                                  (out[j].request == out[j - 1].request && out[j].sample < out[j - 1].sample)); j--) {
            trill_sequence_out t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
}

/* Steps until every request has finished. A step that fails (out of memory) must leave the
 * engine as good as before: injection ends there, and the steps that follow must produce exactly
 * what the run without failures did (the stage's digest). */
#define RUN_ENGINE()                                                                                                                     \
    while (trill_engine_busy(e)) {                                                                                                       \
        trill_error(TRILL_OK, "%s", "");                                                                                                 \
        const trill_status st_ = trill_engine_step(e, NULL);                                                                             \
        if (st_ == TRILL_OK) continue;                                                                                                   \
        failed(u, "trill_engine_step(e, NULL)", st_);                                                                                    \
        if (u->problem[0]) goto out;                                                                                                     \
        trill_alloc_fail_after(-1);                                                                                                      \
        u->memory_back = true;                                                                                                           \
    }

/* The generator: create, two requests (one of two samples, held for a second turn), step to the
 * end, collect; the held samples continued with injected tokens and run to the end, one released;
 * a live adapter update, one more request run to the end; free (the other held sample with it). */
static void engine_stage(unit *u, const trill_model *m, const trill_lora *lora, trill_gen_format f, bool eplb) {
    trill_engine *e = NULL;
    trill_sequence_out out[MAX_OUT];
    int n_out = 0;
    const int per_token = m->config.n_moe_layers * m->config.num_experts_per_tok;
    trill_engine_config cfg = trill_engine_config_default();
    cfg.format = f;
    cfg.block_size = 4;
    cfg.kv_blocks = 24;
    cfg.max_batch_tokens = 8; /* the prompts prefill in chunks */
    cfg.capture_experts = true;
    cfg.eplb = eplb;
    cfg.eplb_workers = 0; /* one per OpenMP thread */
    cfg.eplb_interval = 2; /* re-planned while generating */
    cfg.eplb_window = 64; /* every step's load stays in the window, so a step counted twice shows in the imbalance */
    CALL(trill_engine_create(m, &cfg, &e));
    const trill_request r1 = request(1, TOKENS, 6, 1, 5);
    trill_request r2 = request(2, TOKENS + 6, 5, 2, 4);
    r2.hold = true;
    CALL(trill_engine_submit(e, &r1));
    CALL(trill_engine_submit(e, &r2));
    RUN_ENGINE();
    collect(e, out, &n_out);
    uint64_t turns = digest_outs(FNV_SEED, out, n_out, per_token); /* the continued outputs go back to the engine */
    for (int i = 0; i < n_out; i++)
        if (out[i].request == 2) CALL(trill_engine_continue(e, &out[i], TOKENS + 7, 2, 3));
    RUN_ENGINE();
    collect(e, out, &n_out);
    CHECK(trill_engine_release(e, 2, 0), "a held sample to release");
    CALL(trill_engine_update_adapter(e, lora, 1, NULL));
    const trill_request r3 = request(3, TOKENS + 2, 4, 1, 3);
    CALL(trill_engine_submit(e, &r3));
    RUN_ENGINE();
    collect(e, out, &n_out);
    uint64_t h = digest_outs(fnv(turns, &n_out, sizeof n_out), out, n_out, per_token);
    if (cfg.eplb) { /* the placement planned from the load seen, which a failed step must not count */
        CALL(trill_engine_step(e, NULL)); /* idle: makes a plan a failure left due */
        double imbalance[2];
        CALL(trill_engine_eplb_imbalance(e, &imbalance[0], &imbalance[1]));
        const trill_eplb_plan *plan = trill_engine_eplb_plan(e);
        h = fnv(h, plan->phy2log, sizeof(int) * (size_t)plan->n_layers * plan->n_physical);
        h = fnv(h, plan->logcnt, sizeof(int) * (size_t)plan->n_layers * plan->n_logical);
        h = fnv(h, imbalance, sizeof imbalance);
    }
    stage_done(u, h);
out:
    for (int i = 0; i < n_out; i++) trill_sequence_out_free(&out[i]);
    trill_engine_free(e);
}

/* One training step's forward and backward: the log-probs, and the gradients asked for. */
static trill_status train_step(const trill_model *m, const uint16_t *replay, bool recompute, float *grads, float *lora_grads,
                               float *logprobs, float *dlogprobs) {
    trill_forward_pass *pass = NULL;
    trill_status st = trill_model_forward_train(m, TOKENS, OFFSETS, N_SEQS, replay, logprobs, NULL, recompute, &pass);
    if (!st) st = trill_model_backward(pass, dlogprobs, grads, lora_grads);
    trill_forward_pass_free(pass);
    return st;
}

/* A group of one for expert parallelism (made once: the world is the process's). */
static trill_comm *g_group;

static char *path_in(const char *dir, const char *name) {
    static _Thread_local char buf[4][4200];
    static _Thread_local int next;
    char *p = buf[next++ % 4];
    snprintf(p, sizeof buf[0], "%s/%s", dir, name);
    return p;
}

static void run_unit(unit *u) {
    trill_model *m = NULL, *merged = NULL, *bf16 = NULL;
    trill_lora *lora = NULL, *back = NULL, *lora16 = NULL;
    float *grads = NULL, *lora_grads = NULL;
    float logprobs[T], replayed[T], dlogprobs[T];
    uint16_t experts[T * 1 * 2] = { 0 }; /* [T][MoE layers][top-k] */
    for (int t = 0; t < T; t++) dlogprobs[t] = 0.01f * (float)(t % 5) - 0.02f;

    /* the model, from config text */
    trill_config c;
    CALL(trill_config_parse(CONFIG, sizeof CONFIG - 1, "config.json", &c));
    CALL(trill_model_create(&c, &m));
    trill_model_init_random(m, 42);
    if ((size_t)m->config.n_moe_layers * m->config.num_experts_per_tok * T != sizeof experts / sizeof experts[0]) {
        snprintf(u->problem, sizeof u->problem, "the experts array does not fit the model");
        goto out;
    }
    /* LoRA on attention (q and v: the generator's fused q|k|v adapted in part), every MLP's and
     * expert's down projection and lm_head; B made nonzero so the adapter changes the model */
    const trill_lora_config lc = { .rank = 2, .alpha = 4,
                                   .targets = 1u << TRILL_LORA_Q | 1u << TRILL_LORA_V | 1u << TRILL_LORA_DOWN | 1u << TRILL_LORA_LM_HEAD };
    CALL(trill_lora_create(m, lc, 7, &lora));
    for (size_t i = 0; i < lora->n_params; i++)
        if (lora->params[i] == 0) lora->params[i] = 0.05f * (float)((int)(i % 7) - 3);

    /* the generator with EPLB first (stage 0): the two-thread sweep fails its every allocation */
    engine_stage(u, m, lora, TRILL_GEN_BF16, true);
    if (u->failed_call) goto out;

    /* the reference forward: experts captured, then replayed */
    CALL(trill_model_forward(m, TOKENS, OFFSETS, N_SEQS, NULL, logprobs, experts));
    CALL(trill_model_forward(m, TOKENS, OFFSETS, N_SEQS, experts, replayed, NULL));
    stage_done(u, fnv(fnv(fnv(FNV_SEED, logprobs, sizeof logprobs), experts, sizeof experts), replayed, sizeof replayed));

    /* full fine-tuning's gradients, with and without recomputation */
    CHECK((grads = trill_calloc(m->n_params, sizeof(float))) != NULL, "grads");
    CALL(train_step(m, experts, false, grads, NULL, logprobs, dlogprobs));
    CALL(train_step(m, NULL, true, grads, NULL, logprobs, dlogprobs));
    stage_done(u, fnv(fnv(FNV_SEED, grads, m->n_params * sizeof(float)), logprobs, sizeof logprobs));

    /* LoRA training */
    trill_model_attach_lora(m, lora);
    CHECK((lora_grads = trill_calloc(lora->n_params, sizeof(float))) != NULL, "lora grads");
    CALL(train_step(m, experts, true, NULL, lora_grads, logprobs, dlogprobs));
    CALL(train_step(m, NULL, false, NULL, lora_grads, logprobs, dlogprobs));
    trill_model_attach_lora(m, NULL);
    stage_done(u, fnv(fnv(FNV_SEED, lora_grads, lora->n_params * sizeof(float)), logprobs, sizeof logprobs));

    /* the same through expert parallelism's exchange (a group of one: its buffers, served rows,
     * the count and row exchanges), with and without recomputation */
    CALL(trill_model_set_expert_comm(m, g_group));
    trill_model_attach_lora(m, lora);
    memset(lora_grads, 0, lora->n_params * sizeof(float));
    CALL(train_step(m, experts, true, NULL, lora_grads, logprobs, dlogprobs));
    CALL(train_step(m, NULL, false, NULL, lora_grads, logprobs, dlogprobs));
    trill_model_attach_lora(m, NULL);
    CALL(trill_model_set_expert_comm(m, NULL));
    stage_done(u, fnv(fnv(FNV_SEED, lora_grads, lora->n_params * sizeof(float)), logprobs, sizeof logprobs));

    /* the merge into an fp32 copy */
    CALL(trill_model_create(&m->config, &merged));
    memcpy(merged->params, m->params, m->n_f32 * sizeof(float));
    CALL(trill_lora_merge(lora, merged));
    stage_done(u, fnv(FNV_SEED, merged->params, merged->n_f32 * sizeof(float)));
    trill_model_free(merged);
    merged = NULL;

    /* checkpoints: the adapter, and the model in bf16, read back */
    CALL(trill_lora_save(lora, path_in(u->dir, "lora")));
    CALL(trill_lora_load(m, path_in(u->dir, "lora"), &back));
    stage_done(u, fnv(FNV_SEED, back->params, back->n_params * sizeof(float)));
    CALL(trill_model_save(m, path_in(u->dir, "model"), TRILL_BF16, 0));
    CALL(trill_model_load_as(path_in(u->dir, "model"), TRILL_STORE_CHECKPOINT, &bf16));
    stage_done(u, fnv(fnv(FNV_SEED, bf16->params_bf16, bf16->n_bf16 * 2), bf16->params, bf16->n_f32 * sizeof(float)));

    /* LoRA on the bf16 base: the kernels widen its weights a panel at a time */
    CALL(trill_lora_create(bf16, lc, 8, &lora16));
    memcpy(lora16->params, lora->params, lora->n_params * sizeof(float));
    trill_model_attach_lora(bf16, lora16);
    memset(lora_grads, 0, lora->n_params * sizeof(float));
    CALL(train_step(bf16, experts, false, NULL, lora_grads, logprobs, dlogprobs));
    CALL(train_step(bf16, NULL, true, NULL, lora_grads, logprobs, dlogprobs));
    CALL(trill_model_forward(bf16, TOKENS, OFFSETS, N_SEQS, NULL, replayed, experts));
    trill_model_attach_lora(bf16, NULL);
    stage_done(u, fnv(fnv(fnv(FNV_SEED, lora_grads, lora->n_params * sizeof(float)), logprobs, sizeof logprobs), replayed,
                      sizeof replayed));

    /* the generator */
    engine_stage(u, m, lora, TRILL_GEN_F32, false);
    if (u->failed_call) goto out;
    engine_stage(u, m, lora, TRILL_GEN_BF16, false);
    if (u->failed_call) goto out;
    engine_stage(u, bf16, lora, TRILL_GEN_INT8, false);
out:
    trill_model_free(merged);
    trill_lora_free(back);
    trill_lora_free(lora16);
    trill_model_free(bf16);
    trill_lora_free(lora);
    trill_model_free(m);
    free(grads);
    free(lora_grads);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag;
    return ftw->level > 0 ? remove(path) : 0;
}

/* Bytes the process holds from malloc: exact in the sanitize build (ASan's allocator); the
 * release build does not measure (glibc's counts include its caches), LeakSanitizer's exit
 * check and this per-run one both need ASan. */
static size_t heap_in_use(void) {
#ifdef __SANITIZE_ADDRESS__
    return __sanitizer_get_current_allocated_bytes();
#else
    return 0;
#endif
}

/* Every thread of the team drops its scratch (the kernels' panels, the generator's
 * activations), so each run makes, and may fail, those allocations again. */
static void release_scratch(void) {
#pragma omp parallel
    trill_tls_release();
}

/* One run, the allocations after the first `fail_after` failing (LONG_MAX: none, but counted as
 * armed injection counts them, jansson's included); returns the allocations it made. *leaked:
 * what the process holds from malloc after the run beyond what it held before. */
static long run_once(unit *u, const char *dir, long fail_after, long *leaked) {
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); /* what an earlier run left */
    release_scratch();
    const size_t before = heap_in_use();
    *u = (unit){ .dir = dir, .armed = fail_after != LONG_MAX };
    trill_alloc_fail_after(fail_after);
    run_unit(u);
    const long made = trill_alloc_fail_after(-1) + u->made;
    release_scratch();
    *leaked = (long)(heap_in_use() - before);
    return made;
}

/* The unit once without failures (its allocation count and digests), then with the allocations
 * after the first n failing for n = 0, stride, 2 stride, ... up to the count, on `threads`
 * OpenMP threads; every n up to the end of the first stage when `dense_first`. */
static void sweep(int threads, long stride, bool dense_first) {
    omp_set_num_threads(threads);
    /* the checkpoints go to memory where there is a tmpfs: thousands of runs fsync them */
    if (!getenv("TMPDIR") && access("/dev/shm", W_OK) == 0) setenv("TMPDIR", "/dev/shm", 1);
    char *dir = test_tmpdir("allocfail");
    static unit ref, u;
    const double t0 = trill_now();
    long leaked;
    const long count = run_once(&ref, dir, LONG_MAX, &leaked);
    if (ref.problem[0]) fail_msg("%s", ref.problem);
    assert_null(ref.failed_call);
    assert_true(count > 0);
    /* the same again: the count and the results do not depend on what ran before (the first
     * run's first-time allocations of OpenMP and OpenBLAS are behind it) */
    assert_int_equal(run_once(&u, dir, LONG_MAX, &leaked), count);
    assert_int_equal(leaked, 0);
    assert_int_equal(u.n_digest, ref.n_digest);
    assert_memory_equal(u.digest, ref.digest, sizeof(uint64_t) * (size_t)ref.n_digest);
    long runs = 0, completed = 0, recovered = 0, problems = 0;
    char problem[1400], seen[40][160];
    int n_seen = 0;
    const long dense_to = dense_first ? ref.made_by[0] : -1;
    for (long n = 0; n <= count; n += n < dense_to ? 1 : stride, runs++) {
        run_once(&u, dir, n, &leaked);
        const char *call = u.failed_call ? u.failed_call : "no call failed";
        problem[0] = '\0';
        if (u.problem[0]) snprintf(problem, sizeof problem, "%s", u.problem);
        else if (leaked) snprintf(problem, sizeof problem, "%ld bytes not freed (%s: %s)", leaked, call, u.message);
        else if (u.failed_call && n == count)
            snprintf(problem, sizeof problem, "%s returned %s with every allocation served: %s", call, trill_status_name(u.status), u.message);
        else if (!u.failed_call && n < count) snprintf(problem, sizeof problem, "the unit completed with allocations failing");
        for (int i = 0; !problem[0] && i < u.n_digest; i++)
            if (u.digest[i] != ref.digest[i])
                snprintf(problem, sizeof problem, "stage %d returned TRILL_OK with other results than without failures (then %s: %s)", i,
                         call, u.message);
        if (problem[0]) { /* each kind once: the call that failed and how far the unit came */
            problems++;
            char sig[160];
            snprintf(sig, sizeof sig, "%s/%d/%d/%d", call, (int)u.status, u.n_digest, leaked != 0);
            bool known = false;
            for (int i = 0; i < n_seen && !known; i++) known = strcmp(seen[i], sig) == 0;
            if (!known && n_seen < 40) {
                snprintf(seen[n_seen++], sizeof seen[0], "%s", sig);
                print_error("%d threads, allocation %ld of %ld failing: %s\n", threads, n, count, problem);
            }
        }
        completed += !u.failed_call;
        recovered += u.memory_back;
    }
    char which[96];
    if (dense_to > 0) snprintf(which, sizeof which, "N = 0 ... %ld, then every %ld-th", dense_to, stride);
    else snprintf(which, sizeof which, "N = 0, %ld, %ld, ...", stride, 2 * stride);
    print_message("%d thread%s: %ld allocations in the unit; %ld runs (%s), %ld completed, %ld stepped an engine on after a failed "
                  "step; %.1f s\n", threads, threads > 1 ? "s" : "", count, runs, which, completed, recovered, trill_now() - t0);
    test_rmdir(dir);
    free(dir);
    if (problems) fail_msg("%ld of %ld runs broke a rule (each kind once above)", problems, runs);
}

/* The strides of the two sweeps (see the top), times TRILL_ALLOC_FAIL_STRIDE. */
static bool full_run(void) {
    const char *s = getenv("TRILL_TEST_FULL");
    return s && !strcmp(s, "1");
}
#ifdef __SANITIZE_ADDRESS__
enum { STRIDE_ONE_THREAD = 7 };
#else
enum { STRIDE_ONE_THREAD = 5 };
#endif

static long scaled(long base) {
    const char *s = getenv("TRILL_ALLOC_FAIL_STRIDE");
    return base * (s && atol(s) > 0 ? atol(s) : 1);
}

static void test_one_thread(void **state) {
    (void)state;
    sweep(1, scaled(full_run() ? 1 : STRIDE_ONE_THREAD), false);
}

/* Every N of the first stage (the engine with EPLB, whose second worker's first scratch fails in
 * the MoE, after the step's load was counted), then every 7th (make test-full) or 13th. */
static void test_two_threads(void **state) {
    (void)state;
    sweep(2, scaled(full_run() ? 7 : 13), true);
}

int main(int argc, char **argv) {
    if (trill_dist_init(&argc, &argv, 1, &g_group)) return 1; /* before any failure is injected */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_thread),
        cmocka_unit_test(test_two_threads),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    trill_dist_finalize(g_group);
    return rc;
}
