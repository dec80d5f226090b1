/* The embedded demo: two-digit addition data, the tiny model and its SFT warm start, cached. */
#include "trill/log.h"
#include "base/alloc.h"
#include "trill/demo.h"

#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/config_json.h"
#include "trill/config.h"
#include "trill/dataset.h"
#include "trill/fileio.h"
#include "trill/infer.h"
#include "base/json.h"
#include "model/model_internal.h"
#include "trill/model.h"
#include "trill/eval.h"
#include "trill/run_config.h"
#include "trill/rng.h"
#include "trill/sft.h"
#include "trill/timing.h"
#include "trill/tokenizer.h"

enum { STREAM_EVAL = 1, STREAM_DEV = 2, STREAM_TRAIN = 3, MAX_HELD = 4000 /* of the ~10^4 distinct prompts */ };

char *trill_demo_cache_dir(void) {
    const char *dir = getenv("TRILL_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (dir && *dir) return trill_strdup(dir);
    if (xdg && *xdg) return trill_path_join(xdg, "trill");
    if (home && *home) return trill_path_join(home, ".cache/trill");
    return trill_strdup(".trill-cache");
}

trill_demo_options trill_demo_defaults(void) {
    return (trill_demo_options){ .seed = 0, .n_train = 60000, .n_eval = 200, .n_dev = 200, .target_pass1 = 0.30,
                                 .first_check = 200, .check_every = 25, .max_sft_steps = 1000, .dev_k = 8 };
}

/* ---- the task ---- */

void trill_demo_problem(uint64_t seed, uint64_t stream, uint64_t index, int *a, int *b) {
    const uint64_t key = trill_rng_key(trill_rng_key(seed, stream), index);
    const uint64_t r = trill_rng_bits(key, 0);
    *a = (int)((r & 0xffffffffu) % 100);
    *b = (int)((r >> 32) % 100);
}

void trill_demo_format(int a, int b, char prompt[16], char answer[8]) {
    snprintf(prompt, 16, "%d+%d=", a, b);
    snprintf(answer, 8, "%d", a + b);
}

static trill_status check_options(const trill_demo_options *o) {
    if (o->n_train < 1 || o->n_eval < 1 || o->n_dev < 1 || o->n_eval + o->n_dev > MAX_HELD)
        return trill_error(TRILL_ERR_INVALID, "demo: n_train, n_eval and n_dev must be >= 1 and n_eval + n_dev <= %d", MAX_HELD);
    if (o->first_check < 1 || o->check_every < 1 || o->max_sft_steps < 1 || o->dev_k < 1 || !(o->target_pass1 >= 0))
        return trill_error(TRILL_ERR_INVALID, "demo: first_check, check_every, max_sft_steps and dev_k must be >= 1, target_pass1 >= 0");
    return TRILL_OK;
}

/* Appends one JSONL line {"prompt", "answer"}; prompts and answers need no escaping. */
static trill_status append_line(trill_atomic_file *f, int a, int b) {
    char prompt[16], answer[8], line[64];
    trill_demo_format(a, b, prompt, answer);
    int n = snprintf(line, sizeof line, "{\"prompt\": \"%s\", \"answer\": \"%s\"}\n", prompt, answer);
    return trill_atomic_write(f, line, (size_t)n);
}

/* The first n distinct prompts of a stream that are not marked in `taken`, marking them. */
static trill_status write_distinct(const char *path, const trill_demo_options *o, uint64_t stream, int n, uint8_t taken[100][100]) {
    trill_atomic_file f;
    trill_status st = trill_atomic_open(&f, path);
    for (uint64_t i = 0; !st && n > 0; i++) {
        int a, b;
        trill_demo_problem(o->seed, stream, i, &a, &b);
        if (taken[a][b]) continue;
        taken[a][b] = 1;
        st = append_line(&f, a, b);
        n--;
    }
    if (!st) st = trill_atomic_commit(&f);
    else trill_atomic_abort(&f);
    return st;
}

trill_status trill_demo_write_data(const char *dir, const trill_demo_options *o) {
    trill_status st = check_options(o);
    uint8_t(*taken)[100] = st ? NULL : trill_calloc(100, sizeof *taken);
    if (!st && !taken) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    char *eval = trill_path_join(dir, "eval.jsonl"), *dev = trill_path_join(dir, "dev.jsonl"), *train = trill_path_join(dir, "train.jsonl");
    if (!st && (!eval || !dev || !train)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_mkdir_p(dir);
    if (!st) st = write_distinct(eval, o, STREAM_EVAL, o->n_eval, taken);
    if (!st) st = write_distinct(dev, o, STREAM_DEV, o->n_dev, taken);
    trill_atomic_file f;
    if (!st) st = trill_atomic_open(&f, train);
    for (uint64_t i = 0, n = 0; !st && n < (uint64_t)o->n_train; i++) { /* repeats allowed, held-out prompts never */
        int a, b;
        trill_demo_problem(o->seed, STREAM_TRAIN, i, &a, &b);
        if (taken[a][b]) continue;
        st = append_line(&f, a, b);
        n++;
        if (st) trill_atomic_abort(&f);
    }
    if (!st) st = trill_atomic_commit(&f);
    free(taken);
    free(eval);
    free(dev);
    free(train);
    return st;
}

/* ---- the model ---- */

/* The tiny preset narrowed to hidden 128 (see demo.h). */
trill_status trill_demo_config(trill_config *c) {
    json_t *j = trill_config_preset("tiny"); /* NULL: out of memory (the preset exists) */
    if (!j) return trill_error(TRILL_ERR_NOMEM, "demo: out of memory for its config");
    if (json_object_set_new(j, "hidden_size", json_integer(128)) || json_object_set_new(j, "head_dim", json_integer(32)) ||
        json_object_set_new(j, "intermediate_size", json_integer(384)) || json_object_set_new(j, "moe_intermediate_size", json_integer(64))) {
        json_decref(j);
        return trill_error(TRILL_ERR_NOMEM, "demo: out of memory for its config");
    }
    trill_status st = trill_config_from_json(j, "demo config (tiny preset + demo sizes)", c);
    json_decref(j);
    return st;
}

static trill_status create_model(const char *dir, uint64_t seed) {
    trill_config c;
    trill_model *m = NULL;
    trill_status st = trill_demo_config(&c);
    if (!st) st = trill_model_create(&c, &m);
    if (!st) {
        trill_model_init_random(m, seed);
        st = trill_model_save(m, dir, TRILL_F32, 5000000000u);
    }
    if (!st) st = trill_model_write_charlevel_files(dir, &c);
    trill_model_free(m);
    return st;
}

/* ---- the warm start ---- */

/* dev pass@1 and pass@k of the model in dir, sampled at temperature 1 with the bf16 generator. */
static trill_status dev_accuracy(const char *model_dir, const char *dev_path, const trill_demo_options *o, double *pass1, double *passk) {
    trill_dataset_options dopt = { .prompt_field = "prompt", .answer_field = "answer", .template_ = "{prompt}", .max_prompt_tokens = 64 };
    trill_engine_config ec = trill_engine_config_default();
    ec.kv_cache_mb = 64;
    ec.max_batch_tokens = 2048;
    trill_eval_options eo = { .k = o->dev_k, .temperature = 1.0, .max_new_tokens = TRILL_DEMO_RL_MAX_NEW_TOKENS,
                              .verifier = TRILL_VERIFIER_DEMO, .seed = o->seed };
    trill_eval_result r;
    trill_status st = trill_rl_evaluate_model(model_dir, NULL, dev_path, &dopt, &ec, &eo, &r);
    if (!st) {
        *pass1 = r.pass1;
        *passk = r.passk;
    }
    return st;
}

/* trill_sft_run with its per-step lines appended to log_path. */
static trill_status sft_logged(const trill_run_config *c, const char *log_path) {
    FILE *log = fopen(log_path, "a");
    if (!log) return trill_error(TRILL_ERR_IO, "%s: cannot open for appending (%s)", log_path, strerror(errno));
    const trill_sft_options so = { .log = log };
    trill_sft_result res;
    trill_status st = trill_sft_run(c, &so, &res);
    fclose(log);
    return st;
}

/* s, owned by the config (its string fields are freed with it). */
static trill_status set_string(char **field, const char *s) {
    char *copy = trill_strdup(s);
    if (!copy) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(*field);
    *field = copy;
    return TRILL_OK;
}

/* The warm start's SFT settings: every weight, constant lr 2e-3 after 20 warm-up steps. */
static trill_status sft_config(const char *init, const char *train, const char *out, const trill_demo_options *o, trill_run_config *c) {
    trill_status st = trill_run_config_defaults(c);
    if (st) return st;
    static const char *const sets[] = { "sft.mode=full", "trainer.lr=2e-3", "trainer.schedule=constant", "trainer.warmup_steps=20",
                                        "trainer.micro_batch_tokens=1024", "sft.epochs=1000000" /* the steps end it */ };
    for (size_t i = 0; !st && i < sizeof sets / sizeof sets[0]; i++) st = trill_run_config_set(c, sets[i]);
    if (!st) st = set_string(&c->model, init);
    if (!st) st = set_string(&c->data.train, train);
    if (!st) st = set_string(&c->run_dir, out);
    if (!st) st = set_string(&c->data.completion_field, "answer");
    c->sft.max_steps = o->max_sft_steps;
    c->seed = o->seed;
    return st;
}

static trill_status warm_start(const char *dir, const trill_demo_options *o, trill_demo_info *info) {
    char *init = trill_path_join(dir, "init"), *train = trill_path_join(dir, "train.jsonl"), *dev = trill_path_join(dir, "dev.jsonl"),
         *log = trill_path_join(dir, "sft.log");
    trill_run_config c;
    memset(&c, 0, sizeof c);
    const double t0 = trill_now();
    trill_status st = init && train && dev && log ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = sft_config(init, train, info->model_dir, o, &c);
    int step = 0;
    while (!st && step < o->max_sft_steps) {
        int next = step == 0 ? o->first_check : step + o->check_every;
        if (next > o->max_sft_steps) next = o->max_sft_steps;
        c.sft.stop_after = next;
        if (step > 0 && (st = set_string(&c.resume, "auto"))) break;
        if ((st = sft_logged(&c, log))) break;
        step = next;
        if ((st = dev_accuracy(info->model_dir, dev, o, &info->dev_pass1, &info->dev_passk))) break;
        trill_log(TRILL_LOG_INFO, "trill demo: warm start step %d (%.0f s): dev pass@1 %.1f%%, pass@%d %.1f%% (stops at pass@1 >= %.0f%%)", step,
                trill_now() - t0, 100 * info->dev_pass1, o->dev_k, 100 * info->dev_passk, 100 * o->target_pass1);
        if (info->dev_pass1 >= o->target_pass1) break;
    }
    info->sft_steps = step;
    info->sft_seconds = trill_now() - t0;
    if (st) trill_error_context("demo warm start (SFT log: %s)", log);
    trill_run_config_free(&c);
    free(init);
    free(train);
    free(dev);
    free(log);
    return st;
}

/* ---- the cache ---- */

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static trill_status fill_paths(const char *cache_dir, const trill_demo_options *o, trill_demo_info *info) {
    char spec[512], key[64];
    snprintf(spec, sizeof spec, "v%d seed=%llu train=%d eval=%d dev=%d target=%.6f first=%d every=%d max=%d k=%d",
             TRILL_DEMO_TASK_VERSION, (unsigned long long)o->seed, o->n_train, o->n_eval, o->n_dev, o->target_pass1, o->first_check,
             o->check_every, o->max_sft_steps, o->dev_k);
    snprintf(key, sizeof key, "addition-v%d-%016llx", TRILL_DEMO_TASK_VERSION, (unsigned long long)fnv1a(spec));
    info->dir = trill_path_join(cache_dir, key);
    info->model_dir = info->dir ? trill_path_join(info->dir, "model") : NULL;
    info->train_path = info->dir ? trill_path_join(info->dir, "train.jsonl") : NULL;
    info->eval_path = info->dir ? trill_path_join(info->dir, "eval.jsonl") : NULL;
    return info->dir && info->model_dir && info->train_path && info->eval_path ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

static trill_status read_marker(const char *path, trill_demo_info *info) {
    json_t *j = NULL;
    trill_status st = trill_json_load_file(path, &j);
    if (!st) st = trill_json_get_int(j, "sft_steps", path, 0, INT32_MAX, &info->sft_steps);
    if (!st) st = trill_json_get_double(j, "sft_seconds", path, 0, INFINITY, &info->sft_seconds);
    if (!st) st = trill_json_get_double(j, "dev_pass1", path, 0, 1, &info->dev_pass1);
    if (!st) st = trill_json_get_double(j, "dev_passk", path, 0, 1, &info->dev_passk);
    json_decref(j);
    return st;
}

/* DIR.lock beside the demo's folder, held (waiting for it if need be) while the folder is checked
 * and, if absent, built: processes started at once on an empty cache (the ranks of an mpirun
 * job, two runs, a run and trill serve) build it once, and none removes a folder another is still
 * writing. The kernel drops the lock however its holder ends. *fd is -1 on failure. */
static trill_status lock_demo(const char *cache_dir, const char *dir, int *fd) {
    *fd = -1;
    const size_t n = strlen(dir) + sizeof ".lock";
    char *path = trill_malloc(n);
    trill_status st = path ? trill_mkdir_p(cache_dir) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        snprintf(path, n, "%s.lock", dir);
        st = trill_lock_file_wait(path, "trill demo", fd);
    }
    free(path);
    return st;
}

trill_status trill_demo_prepare(const char *cache_dir, const trill_demo_options *opt, trill_demo_info *out) {
    memset(out, 0, sizeof *out);
    const trill_demo_options o = opt ? *opt : trill_demo_defaults();
    trill_status st = check_options(&o);
    int lock = -1;
    if (!st) st = fill_paths(cache_dir, &o, out);
    if (!st) st = lock_demo(cache_dir, out->dir, &lock);
    char *marker = st ? NULL : trill_path_join(out->dir, "demo.json"), *init = st ? NULL : trill_path_join(out->dir, "init");
    if (!st && trill_file_exists(marker) && read_marker(marker, out) == TRILL_OK) {
        out->cached = true;
        trill_log(TRILL_LOG_INFO, "trill demo: using the cached warm start in %s (%d SFT steps, dev pass@1 %.1f%%)", out->dir, out->sft_steps,
                100 * out->dev_pass1);
    } else if (!st) {
        /* absent or incomplete (no marker: a crash mid-way): start over */
        if (trill_file_exists(out->dir) && nftw(out->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
            st = trill_error(TRILL_ERR_IO, "%s: cannot remove the incomplete demo folder", out->dir);
        trill_log(TRILL_LOG_INFO, "trill demo: preparing two-digit addition and the tiny MoE model in %s", out->dir);
        if (!st) st = trill_demo_write_data(out->dir, &o);
        if (!st) st = create_model(init, o.seed);
        if (!st) st = warm_start(out->dir, &o, out);
        if (!st) {
            json_t *j = json_pack("{s:s, s:i, s:s, s:s, s:s, s:i, s:f, s:f, s:f, s:i}", "task", "addition", "version", TRILL_DEMO_TASK_VERSION,
                                  "model", "model", "train", "train.jsonl", "eval", "eval.jsonl", "sft_steps", out->sft_steps,
                                  "sft_seconds", out->sft_seconds, "dev_pass1", out->dev_pass1, "dev_passk", out->dev_passk, "dev_k", o.dev_k);
            st = j ? trill_json_write_file(marker, j) : trill_error(TRILL_ERR_NOMEM, "out of memory");
            json_decref(j);
        }
        if (!st)
            trill_log(TRILL_LOG_INFO, "trill demo: warm start done: %d SFT steps in %.1f s, dev pass@1 %.1f%%, pass@%d %.1f%%", out->sft_steps,
                    out->sft_seconds, 100 * out->dev_pass1, o.dev_k, 100 * out->dev_passk);
    }
    if (lock >= 0) close(lock);
    free(marker);
    free(init);
    if (st) {
        trill_error_context("demo");
        trill_demo_info_free(out);
    }
    return st;
}

/* ---- the multi-turn demo's base ---- */

enum { STREAM_TURNS = 4 };

/* One transcript of the higher/lower game on problem a+b (index i of the stream): 0, 1 or 2 wrong
 * guesses (the sum off by 1 to 10, each answered as the environment would), then the sum. */
static trill_status append_transcript(trill_atomic_file *f, uint64_t seed, uint64_t i, int a, int b) {
    const int sum = a + b;
    const uint64_t key = trill_rng_key(trill_rng_key(seed, STREAM_TURNS), i);
    uint64_t r = trill_rng_bits(key, 0);
    const int wrong = (int)(r % 4 + 1) / 2; /* 0, 1, 1, 2 */
    char prompt[160];
    int n = snprintf(prompt, sizeof prompt, "%d+%d=", a, b);
    for (int k = 0; k < wrong; k++) {
        r = trill_rng_bits(key, (uint64_t)k + 1);
        int guess = sum + (r & 1 ? 1 : -1) * (int)(1 + (r >> 1) % 10);
        if (guess < 0) guess = sum + 1 + (int)((r >> 8) % 10);
        n += snprintf(prompt + n, sizeof prompt - (size_t)n, "%d<|endoftext|>%s\\n", guess, guess < sum ? "higher" : "lower");
    }
    char line[256];
    const int len = snprintf(line, sizeof line, "{\"prompt\": \"%s\", \"answer\": \"%d\"}\n", prompt, sum);
    return trill_atomic_write(f, line, (size_t)len);
}

/* The transcripts of the first n problems of train.jsonl (held-out prompts never among them). */
static trill_status write_transcripts(const char *train, const char *path, uint64_t seed, int n) {
    FILE *in = fopen(train, "r");
    if (!in) return trill_error(TRILL_ERR_IO, "%s: cannot open (%s)", train, strerror(errno));
    trill_atomic_file f;
    trill_status st = trill_atomic_open(&f, path);
    char line[256];
    for (int i = 0; !st && i < n && fgets(line, sizeof line, in); i++) {
        int a, b;
        if (sscanf(line, "{\"prompt\": \"%d+%d=\"", &a, &b) != 2)
            st = trill_error(TRILL_ERR_INVALID, "%s: line %d is not a demo problem", train, i + 1);
        else st = append_transcript(&f, seed, (uint64_t)i, a, b);
        if (st) trill_atomic_abort(&f);
    }
    fclose(in);
    return st ? st : trill_atomic_commit(&f);
}

trill_status trill_demo_prepare_turns(const char *cache_dir, const trill_demo_options *opt, trill_demo_info *out) {
    const trill_demo_options o = opt ? *opt : trill_demo_defaults();
    trill_status st = trill_demo_prepare(cache_dir, &o, out);
    int lock = -1;
    if (!st) st = lock_demo(cache_dir, out->dir, &lock);
    char *dir = st ? NULL : trill_path_join(out->dir, "turns");
    char *marker = dir ? trill_path_join(dir, "demo.json") : NULL, *model = dir ? trill_path_join(dir, "model") : NULL;
    char *data = dir ? trill_path_join(dir, "transcripts.jsonl") : NULL, *log = dir ? trill_path_join(dir, "sft.log") : NULL;
    if (!st && (!marker || !model || !data || !log)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_t *j = NULL;
    const bool cached = !st && trill_file_exists(marker) && trill_json_load_file(marker, &j) == TRILL_OK;
    json_decref(j);
    if (!st && !cached) {
        const double t0 = trill_now();
        trill_log(TRILL_LOG_INFO, "trill demo: teaching the warm start the higher/lower game's format (%d SFT steps on transcripts)",
                  TRILL_DEMO_TURNS_SFT_STEPS);
        if (trill_file_exists(dir) && nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
            st = trill_error(TRILL_ERR_IO, "%s: cannot remove the incomplete folder", dir);
        if (!st) st = trill_mkdir_p(dir);
        if (!st) st = write_transcripts(out->train_path, data, o.seed, 20 * TRILL_DEMO_TURNS_SFT_STEPS * 8);
        trill_run_config c;
        memset(&c, 0, sizeof c);
        if (!st) st = sft_config(out->model_dir, data, model, &o, &c);
        if (!st) {
            c.sft.max_steps = TRILL_DEMO_TURNS_SFT_STEPS;
            c.trainer.warmup_steps = 0;
            st = sft_logged(&c, log);
        }
        trill_run_config_free(&c);
        json_t *m = st ? NULL : json_pack("{s:s, s:i, s:f}", "task", "higher/lower on addition", "sft_steps", TRILL_DEMO_TURNS_SFT_STEPS,
                                          "sft_seconds", trill_now() - t0);
        if (!st) st = m ? trill_json_write_file(marker, m) : trill_error(TRILL_ERR_NOMEM, "out of memory");
        json_decref(m);
        if (!st) trill_log(TRILL_LOG_INFO, "trill demo: the game's format taught in %.1f s", trill_now() - t0);
    }
    if (!st) {
        free(out->model_dir);
        out->model_dir = model;
        model = NULL;
    }
    if (lock >= 0) close(lock);
    free(dir); free(marker); free(model); free(data); free(log);
    if (st) {
        trill_error_context("multi-turn demo");
        trill_demo_info_free(out);
    }
    return st;
}

void trill_demo_info_free(trill_demo_info *info) {
    free(info->dir);
    free(info->model_dir);
    free(info->train_path);
    free(info->eval_path);
    memset(info, 0, sizeof *info);
}
