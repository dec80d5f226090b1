/* libFuzzer harness: arbitrary bytes as the JSON (or protobuf) body of a `trill serve` call (docs/service.md),
 * run through every parser the server runs on it: trill_svc_parse_loss, trill_svc_parse_data on the body's
 * "data" (under each loss), trill_svc_parse_adam, and trill_svc_job_parse for every job kind, the training
 * calls on a trainer and the sampling calls on a sampler of one small base model.
 *
 * The body is read as the server reads it (json_loadb with JSON_REJECT_DUPLICATES; anything but
 * an object stops there). Whatever a parser accepts must be what the workers can run: data within
 * the call's limits that trill_svc_datum_check accepts again, a sample that the engine's request
 * check would take (prompt and stop ids in the vocabulary, stop strings of 1 to 256 bytes, a valid
 * sampling), Adam parameters in their ranges. A refusal must leave a message.
 *
 * The base model (a small Qwen3-MoE, written once into a temporary folder with its
 * character-level tokenizer, loaded, then its files removed) and the state database (empty:
 * load_state's trill:// paths all resolve to not_found) are made at the first input; nothing is
 * written per input, and the folder is removed at exit.
 *
 * The same bytes are also read as the official Tinker protocol's forward_backward body (protobuf,
 * trill_tinker_forward_request): a refusal leaves a message and bad_request; what it decodes to
 * goes through every parser above. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nftw */
#endif
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "model/config_json.h"
#include "service/svc.h"
#include "trill/fileio.h"
#include "trill/service.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_service_request: check failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Stop at an init failure with its message (not a finding of the input). */
#define INIT(call)                                                                                           \
    do {                                                                                                     \
        if ((call) != TRILL_OK) {                                                                            \
            fprintf(stderr, "fuzz_service_request: setup failed: %s: %s\n", #call, trill_error_message()); \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

/* The server's limits (jobs.c) that what it accepts must keep. */
enum { MAX_DATA = 1024, MAX_CALL_TOKENS = 65536, MAX_PROMPT = 8192, MAX_NEW = 4096, MAX_SAMPLES = 64, MAX_STOPS = 16 };

static const char KEY_ID[] = "k-fuzz";

static char g_root[4096];  /* the temporary folder: base model and state */
static char g_state_dir[4200];
static svc g_svc;          /* one base, one trainer and one sampler on it, the store */
static trill_svc_base *g_bases[1];
static svc_tenant g_tenant, *g_tenants[1] = { &g_tenant };
static svc_sampler g_sampler, *g_samplers[1] = { &g_sampler };
static const trill_config *g_config;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void teardown(void) {
    trill_svc_store_close(g_svc.store);
    trill_svc_base_free(g_bases[0]);
    pthread_mutex_destroy(&g_svc.mu);
    if (g_root[0]) nftw(g_root, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* A small Qwen3-MoE (vocab 128, 1 dense + 3 MoE layers, 8 experts, top-2; test_small_moe's sizes). */
static void write_base(const char *dir) {
    json_t *j = trill_config_preset("tiny");
    CHECK(j != NULL);
    json_object_set_new(j, "hidden_size", json_integer(32));
    json_object_set_new(j, "head_dim", json_integer(8));
    json_object_set_new(j, "intermediate_size", json_integer(48));
    json_object_set_new(j, "moe_intermediate_size", json_integer(16));
    json_object_set_new(j, "max_position_embeddings", json_integer(512));
    static trill_config c; /* large: off the stack */
    INIT(trill_config_from_json(j, "fuzz base", &c));
    json_decref(j);
    trill_model *m = NULL;
    INIT(trill_model_create(&c, &m));
    trill_model_init_random(m, 1);
    INIT(trill_mkdir_p(dir));
    INIT(trill_model_save(m, dir, TRILL_F32, 0));
    INIT(trill_model_write_charlevel_files(dir, trill_model_config(m)));
    trill_model_free(m);
}

static void setup(void) {
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(g_root, sizeof g_root, "%s/trill-fuzz-service-XXXXXX", tmp);
    if (!mkdtemp(g_root)) {
        perror("fuzz_service_request: mkdtemp");
        abort();
    }
    atexit(teardown);
    char model_dir[4200];
    snprintf(model_dir, sizeof model_dir, "%s/fuzz-moe", g_root);
    snprintf(g_state_dir, sizeof g_state_dir, "%s/state", g_root);
    write_base(model_dir);
    INIT(trill_svc_base_load(model_dir, NULL, &g_bases[0]));
    /* Loaded (weights mapped, tokenizer read): its files can go now, so a run that stops at a
     * finding (abort: no atexit) leaves only the small state folder behind. */
    nftw(model_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    g_config = trill_model_config(trill_svc_base_model(g_bases[0]));

    g_svc.cfg = trill_serve_config_default();
    g_svc.cfg.state_dir = g_state_dir;
    INIT(trill_svc_store_open(g_state_dir, &g_svc.store));
    pthread_mutex_init(&g_svc.mu, NULL);
    g_svc.bases = g_bases, g_svc.n_bases = 1;
    snprintf(g_tenant.id, sizeof g_tenant.id, "t-fuzz");
    snprintf(g_tenant.key_id, sizeof g_tenant.key_id, "%s", KEY_ID);
    g_tenant.base = 0; /* the trainer itself is never touched by parsing */
    snprintf(g_sampler.id, sizeof g_sampler.id, "s-fuzz");
    snprintf(g_sampler.key_id, sizeof g_sampler.key_id, "%s", KEY_ID);
    g_sampler.base = 0; /* weights NULL: the base model */
    g_svc.tenants = g_tenants, g_svc.n_tenants = 1;
    g_svc.samplers = g_samplers, g_svc.n_samplers = 1;
}

static void check_refused(trill_status st) {
    CHECK(st != TRILL_OK);
    CHECK(trill_error_message()[0] != '\0');
}

static bool in_vocab(int id) { return id >= 0 && id < g_config->vocab_size; }

/* What trill_svc_parse_data accepted (n data, *tokens forwarded) under `loss`. */
static void check_data(trill_loss loss, const trill_svc_datum *x, int n, long tokens) {
    CHECK(x != NULL && n >= 1 && n <= MAX_DATA);
    long total = 0;
    for (int d = 0; d < n; d++) {
        CHECK(x[d].n >= 1 && x[d].tokens && x[d].targets);
        CHECK(trill_svc_datum_check(g_bases[0], loss, &x[d], d) == TRILL_OK);
        if (loss != TRILL_LOSS_CROSS_ENTROPY) CHECK(x[d].logprobs && x[d].advantages);
        total += x[d].n + 1;
    }
    CHECK(total == tokens && total <= MAX_CALL_TOKENS);
}

static void check_loss_config(trill_loss loss, const trill_svc_loss_config *c) {
    CHECK(trill_loss_get(loss) && (trill_loss_get(loss)->where & TRILL_LOSS_IN_SERVE));
    CHECK(c->clip_low >= 0 && c->clip_low <= c->clip_high && c->clip_high <= 1e9);
    if (loss == TRILL_LOSS_DRO) CHECK(isfinite(c->beta) && c->beta >= 0);
}

static void check_adam(const trill_svc_adam *p) {
    CHECK(p->learning_rate >= 0 && p->learning_rate <= 10);
    CHECK(p->beta1 >= 0 && p->beta1 < 1 && p->beta2 >= 0 && p->beta2 < 1);
    CHECK(p->eps > 0 && p->eps <= 1);
    CHECK(p->weight_decay >= 0 && p->weight_decay <= 10);
    CHECK(p->grad_clip_norm >= 0 && isfinite(p->grad_clip_norm));
}

/* A sample or compute_logprobs job the parser accepted: what the engine's request check takes. */
static void check_sample(const svc_job *j) {
    CHECK(j->prompt && j->prompt_len >= 1 && j->prompt_len <= MAX_PROMPT);
    for (int i = 0; i < j->prompt_len; i++) CHECK(in_vocab(j->prompt[i]));
    CHECK(j->cost >= j->prompt_len);
    if (j->kind == JOB_LOGPROBS) return;
    CHECK(j->num_samples >= 1 && j->num_samples <= MAX_SAMPLES);
    CHECK(j->max_tokens >= 1 && j->max_tokens <= MAX_NEW);
    CHECK(j->cost == (long)j->prompt_len + (long)j->num_samples * j->max_tokens);
    CHECK(j->n_stop_ids >= 0 && j->n_stop_ids <= MAX_STOPS && (j->n_stop_ids == 0 || j->stop_ids));
    for (int i = 0; i < j->n_stop_ids; i++) CHECK(in_vocab(j->stop_ids[i]));
    CHECK(j->n_stop_strings >= 0 && j->n_stop_strings <= MAX_STOPS && (j->n_stop_strings == 0 || j->stop_strings));
    CHECK(j->n_stop_ids == 0 || j->n_stop_strings == 0);
    /* trill/infer.h: stop strings are 1 to 256 bytes each (trill_engine_submit refuses others) */
    for (int i = 0; i < j->n_stop_strings; i++) {
        CHECK(j->stop_strings[i] != NULL);
        const size_t len = strlen(j->stop_strings[i]);
        CHECK(len >= 1 && len <= 256);
    }
    CHECK(trill_sampling_check(&j->sampling) == TRILL_OK);
}

static void check_job(const json_t *body, const svc_job *j) {
    switch (j->kind) {
    case JOB_FORWARD:
    case JOB_FORWARD_BACKWARD:
        check_loss_config(j->loss, &j->loss_config);
        check_data(j->loss, j->data, j->n_data, j->cost);
        break;
    case JOB_OPTIM_STEP:
        check_adam(&j->adam);
        CHECK(j->cost == 1);
        break;
    case JOB_SAVE_STATE:
    case JOB_SAVE_SAMPLER: {
        const size_t len = strlen(j->name);
        CHECK(len >= 1 && len <= 64 && j->name[0] != '.' && strchr(j->name, '/') == NULL);
        CHECK(strcmp(j->name, json_string_value(json_object_get(body, "name"))) == 0);
        CHECK(j->cost == 1);
        break;
    }
    case JOB_LOAD_STATE: CHECK(!"load_state accepted a path, but the store holds no saved state"); break;
    case JOB_SAMPLE:
    case JOB_LOGPROBS: check_sample(j); break;
    default: CHECK(!"unknown job kind");
    }
}

/* Every parser on one body (a JSON object). */
static void check_body(json_t *body) {
    /* loss_fn + loss_fn_config, then "data" under every loss (the named one among them) */
    trill_loss loss = TRILL_LOSS_CROSS_ENTROPY;
    trill_svc_loss_config lc;
    trill_status st = trill_svc_parse_loss(body, &loss, &lc);
    if (st) check_refused(st);
    else check_loss_config(loss, &lc);
    const json_t *jdata = json_object_get(body, "data");
    for (int l = 0; l < TRILL_N_LOSSES; l++) {
        if (!(trill_loss_get((trill_loss)l)->where & TRILL_LOSS_IN_SERVE)) continue;
        trill_svc_datum *x = (trill_svc_datum *)1;
        int n = -1;
        long tokens = -1;
        st = trill_svc_parse_data(g_bases[0], (trill_loss)l, jdata, &x, &n, &tokens);
        if (st) {
            check_refused(st);
            CHECK(x == NULL && n == 0 && tokens == 0);
        } else {
            check_data((trill_loss)l, x, n, tokens);
        }
        trill_svc_free_data(x, n); /* NULL, 0 after a refusal */
    }

    /* adam_params */
    trill_svc_adam adam;
    st = trill_svc_parse_adam(body, &adam);
    if (st) check_refused(st);
    else check_adam(&adam);

    /* every call that answers a future, as http.c's submit() makes its job */
    for (int k = JOB_FORWARD; k <= JOB_LOGPROBS; k++) {
        svc_job *j = trill_calloc(1, sizeof *j);
        CHECK(j != NULL);
        snprintf(j->key_id, sizeof j->key_id, "%s", KEY_ID);
        j->base = k < JOB_SAMPLE ? g_tenant.base : g_sampler.base; /* what submit() finds before parsing */
        st = trill_svc_job_parse(&g_svc, (job_kind)k, body, j);
        const char *code = trill_svc_take_code(); /* as the HTTP answer takes it, so none is left set (none: bad_request) */
        CHECK(j->kind == (job_kind)k);
        if (st) {
            check_refused(st);
            CHECK(!code || strcmp(code, "bad_request") == 0 || strcmp(code, "not_found") == 0);
        } else {
            check_job(body, j);
        }
        trill_svc_job_free(j);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static bool ready;
    if (!ready) setup(), ready = true;

    json_error_t err;
    json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &err);
    if (json_is_object(body)) check_body(body); /* else the server answers bad_request */
    json_decref(body);

    /* the same bytes as the Tinker protocol's protobuf forward_backward body: what it decodes to
     * goes through every parser as a JSON body would */
    char model[32];
    bool forward_only = true;
    trill_status st = trill_tinker_forward_request(data, size, &body, model, &forward_only);
    const char *code = trill_svc_take_code();
    if (st) {
        check_refused(st);
        CHECK(body == NULL && code && strcmp(code, "bad_request") == 0);
    } else {
        CHECK(json_is_object(body) && model[0] && strlen(model) < 32);
        check_body(body);
    }
    json_decref(body);
    return 0;
}
