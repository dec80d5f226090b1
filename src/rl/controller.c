/* The RL controller (`trill train`): sets a run up (inputs, the run folder's lock, the state to
 * start from, the executors), owns the step counter, checkpoints and metrics, and schedules the
 * steps — synchronously here (generate, score, train, sync, in turn) or asynchronously (async.c). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "base/alloc.h"
#include "rollout.h"
#include "run.h"
#include "trill/log.h"
#include "trill/chat.h"
#include "trill/config.h"
#include "trill/dataset.h"
#include "trill/demo.h"
#include "trill/fileio.h"
#include "base/json.h"
#include "trill/lora.h"
#include "trill/rl.h"
#include "trill/timing.h"

/* ---- setup ---- */

static char *xstrdup(const char *s) { return s ? trill_strdup(s) : NULL; }

/* Where the demo's warm-started model is kept between runs: $TRILL_CACHE_DIR, else
 * $XDG_CACHE_HOME/trill, else ~/.cache/trill, else .trill-cache. */
static char *demo_cache_dir(void) {
    const char *dir = getenv("TRILL_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (dir && *dir) return trill_strdup(dir);
    if (xdg && *xdg) return trill_path_join(xdg, "trill");
    if (home && *home) return trill_path_join(home, ".cache/trill");
    return trill_strdup(".trill-cache");
}

static trill_status resolve_inputs(rl_run *r) {
    const trill_rl_config *c = r->c;
    if (c->model[0]) {
        r->model_dir = xstrdup(c->model);
        r->train_path = xstrdup(c->data.train);
        r->eval_path = xstrdup(c->data.eval);
        if (!c->data.train[0]) return trill_error(TRILL_ERR_INVALID, "data.train: a training JSONL file is required with model \"%s\"", c->model);
        return r->model_dir && r->train_path && r->eval_path ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    /* the embedded demo: its model (SFT warm-started, cached) and data, unless the config names data */
    char *cache = demo_cache_dir();
    trill_demo_info info = { 0 };
    trill_status st = cache ? trill_demo_prepare(cache, NULL, &info) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(cache);
    if (st) { trill_error_context("preparing the embedded demo"); return st; }
    if (info.cached) trill_log(TRILL_LOG_INFO, "trill train: demo base model from the cache (%s)", info.dir);
    r->model_dir = xstrdup(info.model_dir);
    r->train_path = xstrdup(c->data.train[0] ? c->data.train : info.train_path);
    r->eval_path = xstrdup(c->data.eval[0] ? c->data.eval : info.eval_path);
    trill_demo_info_free(&info);
    return r->model_dir && r->train_path && r->eval_path ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

static trill_status load_data(rl_run *r) {
    const trill_rl_config *c = r->c;
    trill_config mc = { 0 };
    char *config_path = trill_path_join(r->model_dir, "config.json");
    trill_status st = config_path ? trill_config_load(config_path, &mc) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(config_path);
    if (!st) st = trill_tokenizer_load(r->model_dir, &r->tok);
    if (!st && strcmp(c->data.template_, "chat") == 0) st = trill_chat_template_load(r->model_dir, &r->chat);
    trill_dataset_options o = { .prompt_field = c->data.prompt_field, .answer_field = c->data.answer_field,
                                .template_ = c->data.template_, .chat = r->chat, .max_prompt_tokens = c->data.max_prompt_tokens,
                                .allow_missing_answer = c->data.allow_missing_answer,
                                .max_position_embeddings = mc.max_position_embeddings,
                                .max_new_tokens = c->generator.max_new_tokens };
    if (!st) st = trill_dataset_load(r->train_path, r->tok, &o, &r->train);
    o.limit = c->data.eval_size;
    if (!st && r->eval_path[0]) st = trill_dataset_load(r->eval_path, r->tok, &o, &r->eval);
    return st;
}

/* The executors: the trainer (policy, adapters, optimizer; from the checkpoint when resuming),
 * the generator (an engine for the policy's base, sent the adapters at once) and the scorer. */
static trill_status make_executors(rl_run *r, const char *ckpt) {
    const trill_rl_config *c = r->c;
    trill_status st = trill_rl_trainer_create(c, r->model_dir, ckpt, &r->trainer);
    if (!st) st = trill_rl_generator_create(c, trill_rl_trainer_policy(r->trainer), r->tok, r->train, &r->gen);
    if (!st && !c->rollouts.replay[0]) st = trill_rl_scorer_create(c, r->train, &r->scorer); /* replayed batches bring their rewards */
    double ms;
    size_t bytes;
    if (!st) st = trill_rl_publish_direct(r, NULL, &ms, &bytes); /* the generator serves the policy being trained */
    return st;
}

static void run_free(rl_run *r) {
    if (r->metrics) fclose(r->metrics);
    if (r->lock_fd >= 0) close(r->lock_fd); /* releases the lock */
    trill_rl_scorer_free(r->scorer);
    trill_rl_generator_free(r->gen);
    trill_rl_trainer_free(r->trainer);
    trill_dataset_free(r->train);
    trill_dataset_free(r->eval);
    trill_chat_template_free(r->chat);
    trill_tokenizer_free(r->tok);
    free(r->model_dir);
    free(r->train_path);
    free(r->eval_path);
}

/* ---- the run ---- */

/* metrics.jsonl keeps only the steps up to `step` (a resumed run rewrites what came after). */
static trill_status open_metrics(rl_run *r, const char *run_dir, int step) {
    char *path = trill_path_join(run_dir, "metrics.jsonl");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    char *data = NULL;
    size_t len = 0, keep = 0;
    if (step > 0 && trill_file_exists(path) && trill_read_file(path, &data, &len) == TRILL_OK) {
        for (size_t at = 0; at < len;) {
            char *nl = memchr(data + at, '\n', len - at);
            if (!nl) break; /* a torn last line */
            json_t *j = json_loadb(data + at, (size_t)(nl - data - at), 0, NULL);
            json_t *s = j ? json_object_get(j, "step") : NULL;
            bool ok = json_is_integer(s) && json_integer_value(s) <= step;
            json_decref(j);
            if (!ok) break;
            at = (size_t)(nl - data) + 1;
            keep = at;
        }
    }
    trill_status st = trill_write_file_atomic(path, data ? data : "", keep);
    free(data);
    if (!st && !(r->metrics = fopen(path, "a"))) st = trill_error(TRILL_ERR_IO, "%s: cannot open for appending (%s)", path, strerror(errno));
    free(path);
    return st;
}

static trill_status evaluate(rl_run *r, const char *when, double *pass1, double *passk) {
    const trill_rl_config *c = r->c;
    trill_eval_result res;
    trill_status st = trill_rl_generator_evaluate(r->gen, r->eval, &res);
    if (st) return st;
    trill_log(TRILL_LOG_INFO, "trill train: held-out %s: pass@1 %.1f%%  pass@%d %.1f%%  (%d prompts x %d samples, T=%g, policy version %u, %.1f s)",
            when, 100 * res.pass1, res.k, 100 * res.passk, res.prompts, res.k, c->eval.temperature, trill_rl_generator_version(r->gen),
            res.seconds);
    *pass1 = res.pass1;
    *passk = res.passk;
    return TRILL_OK;
}

static void report_skipped(const char *ckpt, void *ctx) {
    int *n = ctx;
    (*n)++;
    trill_log(TRILL_LOG_WARN, "trill train: skipping checkpoint %s: %s", ckpt, trill_error_message());
}

static void count_skipped(const char *ckpt, void *ctx) { (void)ckpt; (*(int *)ctx)++; }

/* The checkpoint to continue from (none: a fresh run), its state, and the keys that must not change. */
static trill_status start_state(rl_run *r, char **ckpt) {
    const trill_rl_config *c = r->c;
    *ckpt = NULL;
    trill_status st = trill_rl_checkpoint_clean(c->run_dir);
    int skipped = 0;
    if (st) return st;
    if (strcmp(c->resume, "auto") == 0) {
        st = trill_rl_checkpoint_latest(c->run_dir, ckpt, report_skipped, &skipped);
        if (!st && !*ckpt && skipped)
            return trill_error(TRILL_ERR_INVALID, "run_dir %s: none of its %d checkpoints is complete (see above)", c->run_dir, skipped);
    } else if (c->resume[0]) {
        if (!(*ckpt = trill_strdup(c->resume))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        st = trill_rl_checkpoint_verify(*ckpt);
    } else {
        char *latest = NULL;
        st = trill_rl_checkpoint_latest(c->run_dir, &latest, count_skipped, &skipped);
        if (!st && (latest || skipped))
            st = trill_error(TRILL_ERR_INVALID, "run_dir %s already has checkpoints (%s): continue it with resume=auto "
                             "(or --resume), or choose another run_dir", c->run_dir, latest ? latest : "none complete");
        free(latest);
    }
    if (st) return st;
    r->state = (rl_state){ .seed = c->seed };
    if (!*ckpt) return TRILL_OK;
    trill_rl_config saved;
    char *path = NULL;
    st = trill_rl_config_defaults(&saved);
    if (!st) st = (path = trill_path_join(*ckpt, "config.yaml")) ? trill_rl_config_load(&saved, path) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_rl_config_check_resume(&saved, c, *ckpt);
    if (!st) st = trill_rl_checkpoint_read_state(*ckpt, &r->state);
    trill_rl_config_free(&saved);
    free(path);
    return st;
}

/* ---- one process per run folder; stopping on request ---- */

/* run_dir/.lock, held with flock for the whole run: the kernel releases it when the process
 * ends however it ends, so a stale lock never blocks a new run. The holder's pid is in it. */
static trill_status lock_run_dir(rl_run *r) {
    char *path = trill_path_join(r->c->run_dir, ".lock");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    r->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644); /* not inherited by reward processes */
    if (r->lock_fd < 0) st = trill_error(TRILL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    else if (flock(r->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t n = errno == EWOULDBLOCK ? pread(r->lock_fd, pid, sizeof pid - 1, 0) : -1;
        if (n > 0) pid[strcspn(pid, "\n")] = '\0';
        st = errno == EWOULDBLOCK || n >= 0
                 ? trill_error(TRILL_ERR_INVALID, "run_dir %s is in use by another trill train (process %s holds %s); wait for it to end "
                               "or choose another run_dir", r->c->run_dir, n > 0 ? pid : "?", path)
                 : trill_error(TRILL_ERR_IO, "%s: cannot lock: %s", path, strerror(errno));
        close(r->lock_fd);
        r->lock_fd = -1;
    } else {
        char pid[32];
        const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(r->lock_fd, 0) != 0 || pwrite(r->lock_fd, pid, (size_t)n, 0) != n)
            st = trill_error(TRILL_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    free(path);
    return st;
}

static volatile sig_atomic_t g_stop_requested;

void trill_rl_request_stop(void) { g_stop_requested = 1; }
bool trill_rl_stop_requested(void) { return g_stop_requested != 0; }

trill_status trill_rl_run(const trill_rl_config *c, trill_rl_result *result) {
    const double t_start = trill_now();
    trill_rl_config named;
    char auto_dir[64];
    if (!c->run_dir[0]) { /* a fresh folder per run */
        time_t now = time(NULL);
        strftime(auto_dir, sizeof auto_dir, "runs/%Y%m%d-%H%M%S", localtime(&now));
        named = *c;
        named.run_dir = auto_dir;
        c = &named;
    }
    *result = (trill_rl_result){ .eval_before = NAN, .eval_after = NAN, .passk_before = NAN, .passk_after = NAN };
    trill_status st = trill_rl_config_validate(c);
    if (st) return st;
    if (c->generator.temperature != 1.0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "generator.temperature: the trainer computes log-probs at temperature 1, so "
                           "training needs generator.temperature 1 (got %g)", c->generator.temperature);
    g_stop_requested = 0;
    rl_run r = { .c = c, .lock_fd = -1 };
    char *ckpt = NULL;
    if (!(st = trill_mkdir_p(c->run_dir))) st = lock_run_dir(&r);
    if (!st) st = start_state(&r, &ckpt);
    if (!st) st = resolve_inputs(&r);
    if (!st) st = trill_rl_model_identity(r.model_dir, &r.base);
    if (!st && ckpt) st = trill_rl_checkpoint_check_base(ckpt, &r.base, r.model_dir);
    if (!st) st = load_data(&r);
    if (!st) st = make_executors(&r, ckpt);
    if (!st) {
        char *path = trill_path_join(c->run_dir, "config.yaml");
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!path || !f) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st) st = trill_rl_config_write(c, f);
        if (f) fclose(f);
        if (!st) st = trill_write_file_atomic(path, buf, len);
        free(buf);
        free(path);
    }
    if (!st) st = open_metrics(&r, c->run_dir, r.state.step);
    if (!st) {
        const trill_config *mc = trill_model_config(trill_rl_trainer_policy(r.trainer));
        size_t n_adapter;
        trill_lora_params(trill_rl_trainer_lora(r.trainer), &n_adapter);
        trill_log(TRILL_LOG_INFO, "trill train: %s (%d layers, %d MoE, %d experts top-%d), %d train / %d held-out prompts, LoRA r%d (%zu "
                "parameters), generator %s, loss %s, router replay %s, TIS %g, sync %s%s",
                r.model_dir, mc->num_hidden_layers, mc->n_moe_layers, mc->num_experts, mc->num_experts_per_tok, r.train->n,
                r.eval ? r.eval->n : 0, c->trainer.lora.rank, n_adapter, trill_gen_format_name(c->generator.dtype),
                (const char *[]){ "ppo", "gspo", "cispo", "reinforce", "aipo" }[c->algo.loss], c->router_replay ? "on" : "off",
                c->correction.tis, c->sync.mode == TRILL_SYNC_ADAPTER ? "adapter" : "merge",
                ckpt ? " (resumed)" : "");
        if (ckpt) trill_log(TRILL_LOG_INFO, "trill train: resuming from %s at step %d", ckpt, r.state.step);
    }
    if (!st && r.eval && r.state.step == 0) st = evaluate(&r, "before", &result->eval_before, &result->passk_before);
    const int first = r.state.step;
    double gen_s = 0, train_s = 0;
    long gen_tok = 0, train_tok = 0;
    if (!st && c->mode == TRILL_MODE_ASYNC) st = trill_rl_async_loop(&r, &gen_s, &train_s, &gen_tok, &train_tok);
    while (!st && c->mode == TRILL_MODE_SYNC && r.state.step < c->steps && !trill_rl_stop_requested()) {
        trill_rl_metrics *m = trill_calloc(1, sizeof *m);
        if (!m) { st = trill_error(TRILL_ERR_NOMEM, "out of memory"); break; }
        m->step = r.state.step + 1;
        double trs = 0;
        long tt = 0;
        const double t0 = trill_now();
        rl_rollout ro;
        const int64_t index = r.state.data_pos / c->generator.prompts_per_step;
        if (c->rollouts.replay[0]) {
            st = trill_rl_stage_replay(&r, index, &ro);
        } else {
            st = trill_rl_stage_generate(&r, index, &ro, NULL, NULL);
            if (!st) st = trill_rl_stage_reward(&r, &ro);
        }
        if (!st) st = trill_rl_stage_train(&r, &ro, trill_rl_publish_direct, NULL, m, &trs, &tt);
        gen_s += ro.gen_s; train_s += trs; gen_tok += ro.gen_tokens; train_tok += tt;
        trill_rl_rollout_free(&ro);
        if (!st && r.eval && c->eval.every > 0 && r.state.step + 1 < c->steps && (r.state.step + 1) % c->eval.every == 0) {
            m->has_eval = true;
            st = evaluate(&r, "now", &m->eval_pass1, &m->eval_passk);
        }
        if (!st) st = trill_rl_finish_step(&r, m, trill_now() - t0);
        free(m);
    }
    if (!st && r.state.step < c->steps && trill_rl_stop_requested()) { /* the step in progress finished: keep it */
        if (r.state.step > first && r.saved_step != r.state.step)
            st = trill_rl_checkpoint_save(c->run_dir, c, &r.state, trill_rl_trainer_lora(r.trainer), trill_rl_trainer_optimizer(r.trainer), &r.base,
                                          c->checkpoint.keep);
        if (!st)
            st = trill_error(TRILL_ERR_INTERRUPTED, "stopped on request after step %d of %d%s; continue with resume=auto", r.state.step,
                             c->steps, r.state.step > first ? " (checkpoint written)" : "");
    }
    if (!st && r.eval && r.state.step == c->steps) st = evaluate(&r, "after", &result->eval_after, &result->passk_after);
    if (!st) {
        result->steps_done = r.state.step - first;
        result->seconds = trill_now() - t_start;
        trill_log(TRILL_LOG_INFO, "trill train: %d steps in %.1f s (generation %.1f s at %.0f tok/s, training %.1f s at %.0f tok/s); run folder %s",
                result->steps_done, result->seconds, gen_s, gen_s > 0 ? gen_tok / gen_s : 0, train_s, train_s > 0 ? train_tok / train_s : 0,
                c->run_dir);
    }
    free(ckpt);
    run_free(&r);
    return st;
}
