/* The RL controller (`trill train`): sets a run up (inputs, the run folder's lock, the state to
 * start from, the executors), owns the step counter, checkpoints and metrics, and schedules the
 * steps through the one scheduler over the executors' placement (sched/placement.c). */
#include <errno.h>
#include <pthread.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rl/run/checkpoint.h"
#include "base/alloc.h"
#include "rl/data/rollout.h"
#include "rl/transport/ranks.h"
#include "rl/run/run.h"
#include "trill/log.h"
#include "trill/chat.h"
#include "trill/config.h"
#include "trill/dataset.h"
#include "trill/demo.h"
#include "trill/fileio.h"
#include "base/json.h"
#include "trill/lora.h"
#include "trill/run_config.h"
#include "trill/rl_metrics.h"
#include "trill/run.h"
#include "trill/timing.h"

/* ---- setup ---- */

static char *xstrdup(const char *s) { return s ? trill_strdup(s) : NULL; }

static trill_status resolve_inputs(rl_run *r) {
    const trill_run_config *c = r->c;
    if (c->model[0]) {
        r->model_dir = xstrdup(c->model);
        r->train_path = xstrdup(c->data.train);
        r->eval_path = xstrdup(c->data.eval);
        if (!c->data.train[0]) return trill_error(TRILL_ERR_INVALID, "data.train: a training JSONL file is required with model \"%s\"", c->model);
        return r->model_dir && r->train_path && r->eval_path ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    /* the embedded demo: its model (SFT warm-started, cached) and data, unless the config names data;
     * with the guess environment, the multi-turn demo's base (the warm start taught the game's format) */
    char *cache = trill_demo_cache_dir();
    trill_demo_info info = { 0 };
    const bool turns = strcmp(c->env.kind, "guess") == 0;
    trill_status st = !cache ? trill_error(TRILL_ERR_NOMEM, "out of memory")
                      : turns ? trill_demo_prepare_turns(cache, NULL, &info) : trill_demo_prepare(cache, NULL, &info);
    free(cache);
    if (st) { trill_error_context("preparing the embedded demo"); return st; }
    if (info.cached) trill_log(TRILL_LOG_INFO, "trill train: demo base model from the cache (%s)", info.dir);
    r->model_dir = xstrdup(info.model_dir);
    r->train_path = xstrdup(c->data.train[0] ? c->data.train : info.train_path);
    r->eval_path = xstrdup(c->data.eval[0] ? c->data.eval : info.eval_path);
    trill_demo_info_free(&info);
    return r->model_dir && r->train_path && r->eval_path ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

/* env.render chat or auto: the model's chat template, if it renders multi-turn episodes (auto:
 * plain otherwise). */
static trill_status env_renderer(rl_run *r) {
    const bool must = r->c->env.render == TRILL_ENV_RENDER_CHAT;
    trill_status st = r->chat ? TRILL_OK : trill_chat_template_load(r->model_dir, &r->chat);
    if (st && !must) return TRILL_OK;
    if (st) {
        trill_error_context("env.render: chat");
        return st;
    }
    if (!trill_chat_turn_end(r->chat)) {
        return must ? trill_error(TRILL_ERR_UNSUPPORTED, "env.render: chat: the model's chat template (%s) does not render multi-turn "
                                  "episodes (Qwen3 and DeepSeek-V3 do)", trill_chat_template_family(r->chat))
                    : TRILL_OK;
    }
    r->env_chat = r->chat;
    return TRILL_OK;
}

static trill_status load_data(rl_run *r) {
    const trill_run_config *c = r->c;
    trill_config mc = { 0 };
    char *config_path = trill_path_join(r->model_dir, "config.json");
    trill_status st = config_path ? trill_config_load(config_path, &mc) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(config_path);
    if (!st) st = trill_tokenizer_load(r->model_dir, &r->tok);
    if (!st && strcmp(c->data.template_, "chat") == 0) st = trill_chat_template_load(r->model_dir, &r->chat);
    if (!st && c->env.kind[0] && c->env.render != TRILL_ENV_RENDER_PLAIN) st = env_renderer(r);
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
    const trill_run_config *c = r->c;
    trill_status st = trill_trainer_create(c, r->model_dir, ckpt, r->world, &r->trainer);
    /* with executors on ranks of their own, the controller (rank 0) alone runs the ones that are
     * not (the others receive each step's batch from it) */
    const bool mine = !r->remote || r->rank == 0;
    const bool local_gen = mine && !trill_rl_ranks_remote_generator(r), local_scorer = mine && !c->parallel.scorer;
    /* the generator serves every expert: an expert-parallel trainer's shard does not have them,
     * so the engine is made from the whole model, loaded for it alone */
    trill_model *whole = NULL;
    if (!st && local_gen && trill_trainer_sharded(r->trainer)) st = trill_model_load_as(r->model_dir, TRILL_STORE_CHECKPOINT, &whole);
    if (!st && local_gen) st = trill_rl_generator_create(c, whole ? whole : trill_trainer_policy(r->trainer), r->tok, r->train, &r->gen);
    if (!st && local_gen) trill_rl_generator_set_chat(r->gen, r->env_chat);
    trill_model_free(whole);
    if (!st && local_scorer && !c->rollouts.replay[0]) st = trill_rl_scorer_create(c, r->train, &r->scorer); /* replayed batches bring their rewards */
    double ms;
    size_t bytes;
    /* the generator serves the policy being trained */
    if (!st) st = trill_rl_ranks_remote_generator(r) ? trill_rl_publish_remote(r, NULL, &ms, &bytes)
                  : r->gen                          ? trill_rl_publish_direct(r, NULL, &ms, &bytes)
                                                    : TRILL_OK;
    return st;
}

static void run_free(rl_run *r) {
    if (r->metrics) fclose(r->metrics);
    if (r->evals) fclose(r->evals);
    if (r->lock_fd >= 0) close(r->lock_fd); /* releases the lock */
    trill_rl_scorer_free(r->scorer);
    trill_rl_generator_free(r->gen);
    trill_trainer_free(r->trainer);
    trill_dataset_free(r->train);
    trill_dataset_free(r->eval);
    trill_chat_template_free(r->chat);
    trill_tokenizer_free(r->tok);
    free(r->model_dir);
    free(r->train_path);
    free(r->eval_path);
    trill_rl_ranks_free(r); /* the executors on other ranks stop; the groups go after the engine that used them */
}

/* ---- the run ---- */

/* RUN/name (a JSON line a step) opened for appending, keeping only the lines up to `step` (a
 * resumed run rewrites what came after). */
static trill_status open_steps(const char *run_dir, const char *name, int step, FILE **out) {
    char *path = trill_path_join(run_dir, name);
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
    if (!st && !(*out = fopen(path, "a"))) st = trill_error(TRILL_ERR_IO, "%s: cannot open for appending (%s)", path, strerror(errno));
    free(path);
    return st;
}

/* metrics.jsonl and eval.jsonl, up to `step`. */
static trill_status open_metrics(rl_run *r, const char *run_dir, int step) {
    trill_status st = open_steps(run_dir, "metrics.jsonl", step, &r->metrics);
    if (!st) st = open_steps(run_dir, "eval.jsonl", step, &r->evals);
    if (!st) getrusage(RUSAGE_SELF, &r->usage); /* a step's page faults and CPU time count from here */
    return st;
}

/* The checkpoint to continue from (none: a fresh run), its state, and the keys that must not change. */
static trill_status start_state(rl_run *r, char **ckpt) {
    const trill_run_config *c = r->c;
    trill_status st = trill_rl_checkpoint_choose(c->run_dir, c->resume, "trill train", r->rank == 0, ckpt);
    if (st) return st;
    r->state = (rl_state){ .seed = c->seed };
    if (!*ckpt) return TRILL_OK;
    trill_run_config saved;
    char *path = NULL;
    st = trill_run_config_defaults(&saved);
    if (!st) st = (path = trill_path_join(*ckpt, "config.yaml")) ? trill_run_config_load(&saved, path) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_run_config_check_resume(&saved, c, *ckpt);
    if (!st) st = trill_rl_checkpoint_read_state(*ckpt, &r->state);
    trill_run_config_free(&saved);
    free(path);
    return st;
}

/* ---- one process per run folder; stopping on request ---- */

/* Lock-free atomics: safe from a signal handler and from any thread. */
static atomic_int g_stop_requested;

void trill_rl_request_stop(void) { atomic_store(&g_stop_requested, 1); }
bool trill_rl_stop_requested(void) { return atomic_load(&g_stop_requested) != 0; }
void trill_rl_stop_reset(void) { atomic_store(&g_stop_requested, 0); }

/* ---- the run handle ---- */

struct trill_run {
    trill_run_config cfg;          /* the run's own copy (run_dir resolved) */
    trill_run_options opt;
    rl_run r;
    rl_schedule *sched;           /* the executors and their scheduler, from create to finish (trainer ranks) */
    double t_start;
    int first;                    /* the step the run started from */
    trill_rl_result result;
    bool done, finished;
    trill_status err;             /* the status a finished run keeps returning */
    char err_msg[2048];
    atomic_int cancel;            /* set by trill_run_cancel from any thread or a signal handler */
    pthread_mutex_t mu;           /* guards status */
    trill_run_status status;
};

static void set_phase(trill_run *h, trill_run_phase phase) {
    pthread_mutex_lock(&h->mu);
    h->status.phase = phase;
    h->status.step = h->r.state.step;
    h->status.policy_version = h->r.state.version;
    pthread_mutex_unlock(&h->mu);
}

/* Ends the run with st (its message kept for the calls after). */
static trill_status end_run(trill_run *h, trill_status st) {
    h->done = true;
    h->err = st;
    snprintf(h->err_msg, sizeof h->err_msg, "%s", st ? trill_error_message() : "");
    set_phase(h, TRILL_RUN_DONE);
    return st;
}

/* Under data parallelism the ranks agree (any rank's request stops all, at the same step). */
static bool cancel_requested(trill_run *h) {
    const bool mine = atomic_load(&h->cancel) || trill_rl_stop_requested();
    if (!h->r.world || trill_comm_size(h->r.world) < 2) return mine;
    uint64_t any = 0;
    if (trill_comm_allreduce_max_u64(h->r.world, mine, &any)) return true; /* a lost peer: stop here */
    return any != 0;
}

/* Cancelled: the steps trained are checkpointed (unless the newest already is), then the run
 * ends with TRILL_ERR_INTERRUPTED. */
static trill_status interrupt(trill_run *h) {
    const trill_run_config *c = &h->cfg;
    rl_run *r = &h->r;
    trill_status st = TRILL_OK;
    pthread_mutex_lock(&h->mu);
    h->status.cancelled = true;
    pthread_mutex_unlock(&h->mu);
    if (r->state.step > h->first && r->saved_step != r->state.step) {
        set_phase(h, TRILL_RUN_CHECKPOINTING);
        st = trill_rl_save_checkpoint(r);
    }
    if (!st)
        st = trill_error(TRILL_ERR_INTERRUPTED, "stopped on request after step %d of %d%s; continue with resume=auto", r->state.step,
                         c->steps, r->state.step > h->first ? " (checkpoint written)" : "");
    return end_run(h, st);
}

/* The config as resolved (RUN/config.yaml) and the run's opening lines. */
static trill_status announce(trill_run *h, const char *ckpt) {
    const trill_run_config *c = &h->cfg;
    rl_run *r = &h->r;
    char *path = trill_path_join(c->run_dir, "config.yaml");
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    trill_status st = path && f ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_run_config_write(c, f);
    if (f) fclose(f);
    if (!st && r->rank == 0) st = trill_write_file_atomic(path, buf, len);
    free(buf);
    free(path);
    if (st) return st;
    const trill_config *mc = trill_model_config(trill_trainer_policy(r->trainer));
    size_t n_adapter;
    trill_lora_params(trill_trainer_lora(r->trainer), &n_adapter);
    char note[128];
    trill_log(TRILL_LOG_INFO, "trill train: %s (%d layers, %d MoE, %d experts top-%d), %d train / %d held-out prompts, LoRA r%d (%zu "
            "parameters, %s), generator %s, loss %s, router replay %s, TIS %g, sync %s%s",
            r->model_dir, mc->num_hidden_layers, mc->n_moe_layers, mc->num_experts, mc->num_experts_per_tok, r->train->n,
            r->eval ? r->eval->n : 0, c->trainer.lora.rank, n_adapter,
            trill_trainer_precision_note(r->trainer, note, sizeof note), trill_gen_format_name(c->generator.dtype),
            trill_loss_get(c->algo.loss)->name, c->router_replay ? "on" : "off",
            c->correction.tis, c->sync.mode == TRILL_WEIGHT_SYNC_ADAPTER ? "adapter" : "merge", ckpt ? " (resumed)" : "");
    if (ckpt) trill_log(TRILL_LOG_INFO, "trill train: resuming from %s at step %d", ckpt, r->state.step);
    return TRILL_OK;
}

/* Every rank's status so far, agreed: one failing alone fails the others here. */
static trill_status agree(rl_run *r, trill_status st) { return trill_comm_agree(r->job, st, "setting the run up"); }

/* Sync mode's hook (run.h, rl_step_hooks): the run's phase, set by the executors on this thread. */
static void sync_phase(void *ctx, trill_run_phase phase) { set_phase(ctx, phase); }

/* Everything before the first step: the run folder and its lock, the state to start from, the
 * inputs, the executors, the resolved config, metrics.jsonl, the evaluation before training. */
static trill_status set_up(trill_run *h) {
    const trill_run_config *c = &h->cfg;
    rl_run *r = &h->r;
    char *ckpt = NULL;
    const bool executor = trill_rl_ranks_executor(r);
    /* rank 0 owns the run folder (and builds the demo's cache); the others start after it */
    trill_status st = r->rank == 0 ? trill_mkdir_p(c->run_dir) : TRILL_OK;
    if (!st && r->rank == 0) st = trill_lock_dir(c->run_dir, "run_dir", "trill train", &r->lock_fd);
    st = agree(r, st);
    if (!st && !executor) st = start_state(r, &ckpt);
    if (!st && r->rank == 0) st = resolve_inputs(r);
    st = agree(r, st);
    if (!st && r->rank != 0) st = resolve_inputs(r);
    if (executor) { /* a generator replica or the scorer on a rank of its own */
        if (!st) st = load_data(r);
        if (!st) st = trill_rl_make_executor(r);
        return st;
    }
    if (!st) st = trill_rl_model_identity(r->model_dir, &r->base);
    if (!st && ckpt) st = trill_rl_checkpoint_check_base(ckpt, &r->base, r->model_dir);
    if (!st) st = load_data(r);
    if (!st) st = make_executors(r, ckpt);
    if (!st) st = announce(h, ckpt);
    if (!st && r->rank == 0) st = open_metrics(r, c->run_dir, r->state.step);
    if (!st && r->rank != 0) getrusage(RUSAGE_SELF, &r->usage);
    if (!st && r->eval && r->state.step == 0) {
        set_phase(h, TRILL_RUN_EVALUATING);
        st = trill_rl_stage_evaluate(r, 0, "before", &h->result.eval_before, &h->result.passk_before);
    }
    h->first = r->state.step;
    /* sync mode: the phases and the evaluation when due on this thread; async mode: the executors on theirs */
    if (!st)
        st = trill_rl_schedule_start(r, c->mode == TRILL_MODE_ASYNC ? NULL : &(rl_step_hooks){ .phase = sync_phase, .ctx = h },
                                     &h->sched);
    free(ckpt);
    return st;
}

trill_status trill_run_create(const trill_run_config *c, const trill_run_options *o, trill_run **out) {
    *out = NULL;
    trill_status st = trill_run_config_validate(c);
    const int ranks = o && o->world ? trill_comm_size(o->world) : 1;
    if (!st) st = trill_rl_parallel_check(c, ranks);
    if (!st && c->parallel.generator.ep > 1 && !c->parallel.generator.replicas)
        st = trill_error(TRILL_ERR_INVALID, "parallel.generator.ep %d: expert-parallel generator ranks need parallel.generator.replicas",
                         c->parallel.generator.ep);
    if (!st && c->parallel.generator.ep > 1 && c->mode == TRILL_MODE_ASYNC)
        st = trill_error(TRILL_ERR_UNSUPPORTED, "parallel.generator.ep %d: an expert-parallel generator runs in mode: sync (asynchronous "
                         "mode with it is not built yet)", c->parallel.generator.ep);
    if (!st && ranks > 1 && c->mode == TRILL_MODE_ASYNC && !c->parallel.generator.replicas)
        st = c->parallel.scorer ? trill_error(TRILL_ERR_UNSUPPORTED, "parallel.scorer: asynchronous mode across ranks needs "
                                              "parallel.generator.replicas (the generator on ranks of its own)")
                                : trill_error(TRILL_ERR_UNSUPPORTED, "parallel.trainer.dp: %d ranks need mode: sync (the asynchronous executors run "
                                              "in one process, or set parallel.generator.replicas)", ranks);
    if (st) return st;
    if (c->generator.temperature != 1.0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "generator.temperature: the trainer computes log-probs at temperature 1, so "
                           "training needs generator.temperature 1 (got %g)", c->generator.temperature);
    trill_run *h = trill_calloc(1, sizeof *h);
    if (!h) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    if ((st = trill_run_config_copy(&h->cfg, c))) {
        free(h);
        return st;
    }
    if (!h->cfg.run_dir[0]) { /* a fresh folder per run */
        char dir[64];
        time_t now = time(NULL);
        strftime(dir, sizeof dir, "runs/%Y%m%d-%H%M%S", localtime(&now));
        char *named = trill_strdup(dir);
        if (!named) {
            trill_run_config_free(&h->cfg);
            free(h);
            return trill_error(TRILL_ERR_NOMEM, "out of memory");
        }
        free(h->cfg.run_dir);
        h->cfg.run_dir = named;
    }
    if (o) h->opt = *o;
    pthread_mutex_init(&h->mu, NULL);
    h->t_start = trill_now();
    h->result = (trill_rl_result){ .eval_before = NAN, .eval_after = NAN, .passk_before = NAN, .passk_after = NAN };
    h->r = (rl_run){ .c = &h->cfg, .lock_fd = -1, .world = o ? o->world : NULL, .rank = o && o->world ? trill_comm_rank(o->world) : 0 };
    h->status.steps = h->cfg.steps;
    trill_rl_stop_reset();
    if ((st = trill_rl_ranks_create(&h->r, h->r.world)) || (st = set_up(h))) {
        trill_run_free(h);
        return st;
    }
    set_phase(h, TRILL_RUN_IDLE);
    *out = h;
    return TRILL_OK;
}

/* The newest step into the status, and the progress line to the callback (or the log sink);
 * step_wall_s: the step's wall time (async: since the previous step), for the ETA. */
static void report(trill_run *h, const trill_rl_metrics *m, double step_wall_s) {
    pthread_mutex_lock(&h->mu);
    h->status.step = h->r.state.step;
    h->status.policy_version = h->r.state.version;
    h->status.phase = TRILL_RUN_IDLE;
    h->status.has_metrics = true;
    h->status.last = *m;
    pthread_mutex_unlock(&h->mu);
    char line[512];
    trill_run_progress_line(&h->status, step_wall_s, h->cfg.mode == TRILL_MODE_ASYNC, line, sizeof line);
    if (h->opt.progress) h->opt.progress(h->opt.progress_ctx, &h->status, line);
    else trill_log(TRILL_LOG_INFO, "%s", line);
}

trill_status trill_run_step(trill_run *h) {
    if (h->done) return h->err ? trill_error(h->err, "%s", h->err_msg) : TRILL_OK;
    if (trill_rl_ranks_executor(&h->r)) return end_run(h, trill_rl_serve_executor(&h->r)); /* until the controller says stop */
    if (h->r.state.step >= h->cfg.steps) return end_run(h, TRILL_OK);
    if (cancel_requested(h)) return interrupt(h);
    trill_rl_metrics *m = trill_calloc(1, sizeof *m);
    if (!m) return end_run(h, trill_error(TRILL_ERR_NOMEM, "out of memory"));
    trill_status st;
    const double t0 = trill_now();
    const bool async = h->cfg.mode == TRILL_MODE_ASYNC;
    if (async) set_phase(h, TRILL_RUN_TRAINING);
    st = trill_rl_schedule_step(h->sched, m);
    if (!st) report(h, m, async ? m->time.interval_s : trill_now() - t0);
    free(m);
    if (st) return end_run(h, st);
    if (h->r.state.step < h->cfg.steps && cancel_requested(h)) return interrupt(h);
    if (h->r.state.step >= h->cfg.steps) end_run(h, TRILL_OK);
    return TRILL_OK;
}

void trill_run_get_status(trill_run *h, trill_run_status *out) {
    pthread_mutex_lock(&h->mu);
    *out = h->status;
    pthread_mutex_unlock(&h->mu);
}

void trill_run_cancel(trill_run *h) { atomic_store(&h->cancel, 1); }

trill_status trill_run_checkpoint(trill_run *h) {
    rl_run *r = &h->r;
    if (r->saved_step == r->state.step || r->state.step == 0) return TRILL_OK;
    set_phase(h, TRILL_RUN_CHECKPOINTING);
    trill_status st = trill_rl_save_checkpoint(r);
    set_phase(h, h->done ? TRILL_RUN_DONE : TRILL_RUN_IDLE);
    return st;
}

trill_status trill_run_finish(trill_run *h, trill_rl_result *result) {
    const trill_run_config *c = &h->cfg;
    rl_run *r = &h->r;
    trill_status st = h->done ? h->err : TRILL_OK;
    if (st) trill_error(st, "%s", h->err_msg);
    if (h->sched) { /* an interruption is not the executors' failure: their summary is still written */
        const trill_status kept = st, passed = st == TRILL_ERR_INTERRUPTED ? TRILL_OK : st;
        st = trill_rl_schedule_stop(h->sched, passed);
        h->sched = NULL;
        if (!st && kept) st = trill_error(kept, "%s", h->err_msg);
    }
    if (!st && r->eval && r->state.step == c->steps) {
        set_phase(h, TRILL_RUN_EVALUATING);
        st = trill_rl_stage_evaluate(r, r->state.step, "after", &h->result.eval_after, &h->result.passk_after);
    }
    h->result.steps_done = r->state.step - h->first;
    h->result.seconds = trill_now() - h->t_start;
    if (!st)
        trill_log(TRILL_LOG_INFO, "trill train: %d steps in %.1f s (generation %.1f s at %.0f tok/s, training %.1f s at %.0f tok/s); run folder %s",
                  h->result.steps_done, h->result.seconds, r->gen_s, r->gen_s > 0 ? r->gen_tokens / r->gen_s : 0, r->train_s,
                  r->train_s > 0 ? r->train_tokens / r->train_s : 0, c->run_dir);
    if (result) *result = h->result;
    h->finished = true;
    if (!h->done || !h->err) end_run(h, st);
    return st;
}

void trill_run_free(trill_run *h) {
    if (!h) return;
    trill_rl_schedule_stop(h->sched, TRILL_ERR_INTERRUPTED);
    run_free(&h->r);
    trill_run_config_free(&h->cfg);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

trill_status trill_rl_run(const trill_run_config *c, trill_rl_result *result) {
    *result = (trill_rl_result){ .eval_before = NAN, .eval_after = NAN, .passk_before = NAN, .passk_after = NAN };
    trill_run *h;
    trill_status st = trill_run_create(c, NULL, &h);
    if (st) return st;
    while (!(st = trill_run_step(h)) && !h->done) {}
    trill_status fin = trill_run_finish(h, result);
    if (!st) st = fin;
    else if (st != fin) trill_error(st, "%s", h->err_msg); /* the step's error, not finish's echo of it */
    trill_run_free(h);
    return st;
}
