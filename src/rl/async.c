/* Asynchronous RL: generator, reward and trainer as concurrent executors on their own cores
 * (LlamaRL). They meet only through two bounded rollout queues (generator → reward → trainer)
 * and the weight channel (trainer → generator, trill/channel.h). The trainer runs on the
 * calling thread and owns the step counter, metrics and checkpoints; every stage is the same
 * code the synchronous loop runs (run.h).
 *
 * Staleness (the policy is sched/sched.h's, shared with async_ranks.c): batch k is trained with
 * the weights of version v0 + (trained steps), its tokens come from whatever versions the
 * generator held while producing it. With on_stale "wait" the generator does not start batch k
 * before the gate's version is published, so no batch is ever beyond the bound; with "drop" or
 * "regenerate" it runs ahead as far as the queues allow and the trainer drops a stale batch, or
 * has its prompts generated again (same request ids: same prompts, newer weights). Either way
 * the trainer checks every token.
 *
 * Failure: the first executor that fails records its error and closes both queues and the
 * channel; every blocked executor wakes, stops, and the run returns that error. Checkpoints
 * are written by the trainer between steps only, so the last one is always consistent. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"
#include "rl/sched/sched.h"
#include "base/alloc.h"
#include "trill/log.h"
#include "trill/channel.h"
#include "trill/fileio.h"
#include "base/json.h"
#include "trill/timing.h"

enum { QUEUE_MAX = 1024 };

typedef struct queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rl_rollout *items[QUEUE_MAX + 1];
    int n, capacity;
    bool closed;
} queue;

typedef struct async_state {
    rl_run *r;
    queue to_reward, to_trainer;
    trill_weight_channel *ch;
    pthread_mutex_t mu;             /* guards redo, failure, apply_ms / apply_bytes */
    pthread_cond_t cv;
    int64_t redo[QUEUE_MAX];        /* batch indices the trainer wants generated again */
    int n_redo;
    bool failed;
    bool stopping;                  /* the trainer is done: errors from closing are not failures */
    trill_status err_code;
    char err[2048];
    rl_sched sched;                 /* the staleness policy: the trainer's, but for k0 and v0 (read by the generator) */
    /* generator side */
    uint32_t gen_version;           /* the version the engine holds */
    trill_lora *gen_lora;           /* adapter mode: staging the engine converts from */
    trill_model *gen_model;         /* merge mode: staging fp32 model */
    double apply_ms;                /* last weight load on the generator side */
    size_t apply_bytes;
    int cpu_first[3], cpu_count[3]; /* generator, trainer, reward */
    int allowed[CPU_SETSIZE], n_allowed;
    /* busy seconds of each executor */
    double gen_busy, reward_busy;   /* (the trainer's: sched.train_busy) */
} async_state;

/* ---- failure ---- */

static void close_all(async_state *as) {
    queue *qs[2] = { &as->to_reward, &as->to_trainer };
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&qs[i]->mu);
        qs[i]->closed = true;
        pthread_cond_broadcast(&qs[i]->cv);
        pthread_mutex_unlock(&qs[i]->mu);
    }
    trill_channel_close(as->ch);
    pthread_mutex_lock(&as->mu);
    pthread_cond_broadcast(&as->cv);
    pthread_mutex_unlock(&as->mu);
}

/* Records the first failure (the message is per thread: copy it) and stops everyone. */
static void fail(async_state *as, trill_status st, const char *executor) {
    pthread_mutex_lock(&as->mu);
    if (!as->failed && !as->stopping) {
        as->failed = true;
        as->err_code = st;
        snprintf(as->err, sizeof as->err, "%s executor: %s", executor, trill_error_message());
    }
    pthread_mutex_unlock(&as->mu);
    close_all(as);
}

/* ---- queues ---- */

static void queue_init(queue *q, int capacity) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->capacity = capacity;
}

static void queue_destroy(queue *q) {
    for (int i = 0; i < q->n; i++) {
        trill_rl_rollout_free(q->items[i]);
        free(q->items[i]);
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

/* Blocks while full; a regenerated batch may take one slot beyond capacity, so a trainer
 * waiting for it can never be blocked by the batches queued behind it. */
static trill_status queue_push(queue *q, rl_rollout *ro) {
    pthread_mutex_lock(&q->mu);
    while (!q->closed && q->n >= q->capacity + (ro->redo ? 1 : 0)) pthread_cond_wait(&q->cv, &q->mu);
    const bool closed = q->closed;
    if (!closed) {
        q->items[q->n++] = ro;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return closed ? trill_error(TRILL_ERR_IO, "rollout queue closed") : TRILL_OK;
}

/* The oldest batch (FIFO), or else the smallest index. */
static rl_rollout *queue_pop(queue *q, bool fifo) {
    pthread_mutex_lock(&q->mu);
    rl_rollout *ro = NULL;
    while (!ro && !q->closed) {
        int best = -1;
        for (int i = 0; i < q->n; i++) {
            if (best < 0 || (!fifo && q->items[i]->index < q->items[best]->index)) best = i;
            if (fifo) break;
        }
        if (best >= 0) {
            ro = q->items[best];
            memmove(q->items + best, q->items + best + 1, sizeof(rl_rollout *) * (size_t)(q->n - best - 1));
            q->n--;
            pthread_cond_broadcast(&q->cv);
        } else {
            pthread_cond_wait(&q->cv, &q->mu);
        }
    }
    pthread_mutex_unlock(&q->mu);
    return ro;
}

/* ---- cores ---- */

/* Executor e runs on its own cores (OpenMP teams started from its thread inherit them). */
static void place_thread(const async_state *as, int e) {
    const trill_rl_config *c = as->r->c;
    const int threads[3] = { c->resources.generator_threads, c->resources.trainer_threads,
                             c->resources.reward_threads > 0 ? c->resources.reward_threads : 1 };
    omp_set_num_threads(threads[e]);
    if (!c->resources.pin || as->cpu_count[e] == 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < as->cpu_count[e]; i++) CPU_SET(as->allowed[as->cpu_first[e] + i], &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static trill_status plan_cores(async_state *as) {
    const trill_rl_config *c = as->r->c;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set)) return trill_error(TRILL_ERR_IO, "sched_getaffinity: %s", strerror(errno));
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &set)) as->allowed[as->n_allowed++] = i;
    const int want[3] = { c->resources.generator_threads, c->resources.trainer_threads, c->resources.reward_threads };
    const int total = want[0] + want[1] + want[2];
    if (c->resources.pin && total > as->n_allowed)
        return trill_error(TRILL_ERR_INVALID,
                           "resources: generator_threads %d + trainer_threads %d + reward_threads %d = %d cores, but this process "
                           "may use %d; lower them or set resources.pin false (executors would then share cores)",
                           want[0], want[1], want[2], total, as->n_allowed);
    for (int e = 0, at = 0; e < 3; e++) {
        as->cpu_first[e] = at;
        as->cpu_count[e] = want[e];
        at += want[e];
    }
    return TRILL_OK;
}

/* ---- the weight channel ---- */

/* Trainer side (the async scheduler's publish): the trainer's weights (merged first in merge
 * mode), one copy into the channel. */
static trill_status publish_channel(rl_run *r, void *ctx, double *ms, size_t *bytes) {
    async_state *as = ctx;
    const double t0 = trill_now();
    const float *src;
    size_t n;
    const trill_model *merged;
    trill_status st = trill_rl_trainer_export(r->trainer, &src, &n, &merged);
    trill_publish_info info = { 0 };
    if (!st) st = trill_channel_publish(as->ch, src, r->state.version, &info);
    *ms = (trill_now() - t0) * 1e3;
    *bytes = info.bytes;
    return st;
}

/* Generator side, before every engine step: the newest published weights, checked against
 * the publisher's checksum and loaded into the engine (which takes them at its next step). */
static trill_status take_weights(void *ctx) {
    async_state *as = ctx;
    rl_run *r = as->r;
    trill_weight_view view;
    trill_status st = trill_channel_acquire(as->ch, as->gen_version, &view);
    if (st || !view.data) return st;
    const double t0 = trill_now();
    size_t bytes = 0;
    if (trill_channel_checksum(view.data, view.n) != view.checksum) {
        st = trill_error(TRILL_ERR_INVALID, "weight channel: version %u arrived with a wrong checksum", view.version);
    } else if (r->c->sync.mode == TRILL_SYNC_ADAPTER) {
        memcpy(as->gen_lora->params, view.data, sizeof(float) * view.n);
        st = trill_rl_generator_load_adapter(r->gen, as->gen_lora, view.version, &bytes);
    } else {
        memcpy(as->gen_model->params, view.data, sizeof(float) * view.n);
        st = trill_rl_generator_load_weights(r->gen, as->gen_model, view.version, &bytes);
    }
    if (!st) {
        as->gen_version = view.version;
        pthread_mutex_lock(&as->mu); /* the trainer reads these for its metrics */
        as->apply_ms = (trill_now() - t0) * 1e3;
        as->apply_bytes = bytes;
        pthread_mutex_unlock(&as->mu);
    }
    trill_channel_release(as->ch, &view);
    return st;
}

/* ---- executors ---- */

static void *generator_main(void *arg) {
    async_state *as = arg;
    rl_run *r = as->r;
    place_thread(as, 0);
    int64_t next = as->sched.k0;
    for (;;) {
        int64_t k;
        bool redo = false;
        pthread_mutex_lock(&as->mu);
        const bool stop = as->failed || as->stopping;
        if (as->n_redo) {
            k = as->redo[0];
            memmove(as->redo, as->redo + 1, sizeof(int64_t) * (size_t)--as->n_redo);
            redo = true;
        } else {
            k = next;
        }
        pthread_mutex_unlock(&as->mu);
        if (stop) break;
        if (!redo) { /* on_stale "wait": start batch k only with weights recent enough that none of its tokens can be beyond the bound */
            const int64_t need = rl_sched_gate(&as->sched, k);
            uint32_t have;
            if (need > (int64_t)as->sched.v0 && trill_channel_wait(as->ch, (uint32_t)need, -1, &have)) break; /* closed */
        }
        rl_rollout *ro = trill_calloc(1, sizeof *ro);
        if (!ro) { fail(as, trill_error(TRILL_ERR_NOMEM, "out of memory"), "generator"); break; }
        const double t0 = trill_now();
        trill_status st = trill_rl_stage_generate(r, k, ro, take_weights, as);
        as->gen_busy += trill_now() - t0;
        ro->redo = redo;
        if (st) {
            trill_rl_rollout_free(ro);
            free(ro);
            fail(as, st, "generator"); /* ignored when the run is already stopping or failed */
            break;
        }
        if (!redo) next++;
        if (queue_push(&as->to_reward, ro)) { trill_rl_rollout_free(ro); free(ro); break; }
    }
    return NULL;
}

static void *reward_main(void *arg) {
    async_state *as = arg;
    place_thread(as, 2);
    rl_rollout *ro;
    while ((ro = queue_pop(&as->to_reward, true))) {
        const double t0 = trill_now();
        trill_status st = trill_rl_stage_reward(as->r, ro);
        as->reward_busy += trill_now() - t0;
        if (st) { fail(as, st, "reward"); trill_rl_rollout_free(ro); free(ro); break; }
        if (queue_push(&as->to_trainer, ro)) { trill_rl_rollout_free(ro); free(ro); break; }
    }
    return NULL;
}

struct rl_async {
    async_state *as;
    pthread_t gen_thread, reward_thread;
    bool gen_started, reward_started;
    double wall0;                  /* the executors' start */
};

static void async_free(rl_async *a) {
    async_state *as = a->as;
    if (as) {
        rl_sched_free(&as->sched);
        queue_destroy(&as->to_reward);
        queue_destroy(&as->to_trainer);
        trill_channel_free(as->ch);
        trill_lora_free(as->gen_lora);
        trill_model_free(as->gen_model);
        pthread_mutex_destroy(&as->mu);
        pthread_cond_destroy(&as->cv);
        free(as);
    }
    free(a);
}

trill_status trill_rl_async_start(rl_run *r, rl_async **out) {
    const trill_rl_config *c = r->c;
    rl_async *a = trill_calloc(1, sizeof *a);
    async_state *as = a ? trill_calloc(1, sizeof *as) : NULL;
    if (!as) {
        free(a);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    a->as = as;
    as->r = r;
    rl_sched_init(&as->sched, r);
    as->gen_version = r->state.version;
    pthread_mutex_init(&as->mu, NULL);
    pthread_cond_init(&as->cv, NULL);
    queue_init(&as->to_reward, c->async.queue);
    queue_init(&as->to_trainer, c->async.queue);
    const trill_model *policy = trill_rl_trainer_policy(r->trainer);
    size_t n = 0;
    trill_lora_params(trill_rl_trainer_lora(r->trainer), &n);
    if (c->sync.mode == TRILL_SYNC_MERGE) n = trill_model_n_params(policy); /* the merged model: every parameter, in fp32 */
    trill_status st = plan_cores(as);
    if (!st) st = trill_channel_create(n, &as->ch);
    if (!st && c->sync.mode == TRILL_SYNC_ADAPTER) st = trill_lora_create(policy, c->trainer.lora, 0, &as->gen_lora);
    if (!st && c->sync.mode == TRILL_SYNC_MERGE) st = trill_model_create(trill_model_config(policy), &as->gen_model);
    if (!st) {
        a->gen_started = pthread_create(&a->gen_thread, NULL, generator_main, as) == 0;
        a->reward_started = a->gen_started && pthread_create(&a->reward_thread, NULL, reward_main, as) == 0;
        if (!a->gen_started || !a->reward_started) st = trill_error(TRILL_ERR_IO, "cannot start the executor threads");
    }
    a->wall0 = trill_now();
    *out = a;
    return st; /* on failure the caller still stops it (trill_rl_async_stop) */
}

/* The policy's transport (sched.h): batches from the trainer's queue, the smallest index first;
 * a regenerated batch is put first in the generator's list. */
static trill_status next_queued(void *ctx, rl_rollout **out) {
    async_state *as = ctx;
    if ((*out = queue_pop(&as->to_trainer, false))) return TRILL_OK;
    pthread_mutex_lock(&as->mu); /* closed: an executor failed, its error */
    trill_status st = as->failed ? trill_error(as->err_code, "%s", as->err) : trill_error(TRILL_ERR_IO, "async: the rollout queues closed");
    pthread_mutex_unlock(&as->mu);
    return st;
}

static trill_status regenerate(void *ctx, int64_t index) {
    async_state *as = ctx;
    pthread_mutex_lock(&as->mu);
    as->redo[as->n_redo++] = index;
    pthread_mutex_unlock(&as->mu);
    return TRILL_OK;
}

/* The generator's last weight load, for the step's metrics. */
static trill_status apply_figures(void *ctx, trill_rl_metrics *m) {
    async_state *as = ctx;
    pthread_mutex_lock(&as->mu);
    m->time.generator_apply_ms = as->apply_ms;
    m->generator_apply_bytes = as->apply_bytes;
    pthread_mutex_unlock(&as->mu);
    return TRILL_OK;
}

static const rl_sched_transport threads_transport = { .next = next_queued, .regenerate = regenerate, .publish = publish_channel,
                                                      .after_train = apply_figures };

trill_status trill_rl_async_step(rl_async *a, trill_rl_metrics *m) {
    async_state *as = a->as;
    /* the trainer is the calling thread: its cores and thread count for this step, restored after */
    cpu_set_t saved_set;
    const int saved_threads = omp_get_max_threads();
    const bool restore = pthread_getaffinity_np(pthread_self(), sizeof saved_set, &saved_set) == 0;
    place_thread(as, 1);
    trill_status st = rl_sched_step(&as->sched, as->r, &threads_transport, as, m);
    if (st) {
        pthread_mutex_lock(&as->mu); /* another executor failed first (closing the channel the trainer published to): its error is the cause */
        if (as->failed) st = trill_error(as->err_code, "%s", as->err);
        pthread_mutex_unlock(&as->mu);
        fail(as, st, "trainer");
    }
    omp_set_num_threads(saved_threads);
    if (restore) pthread_setaffinity_np(pthread_self(), sizeof saved_set, &saved_set);
    return st;
}

/* RUN/async_summary.json (the executors' busy time, for benchmarks) and its log line. */
static trill_status write_summary(const rl_async *a, double wall) {
    const async_state *as = a->as;
    const trill_rl_config *c = as->r->c;
    trill_status st = rl_sched_write_summary(&as->sched, wall, json_pack("{s:f, s:f}", "generator_busy_s", as->gen_busy, "reward_busy_s", as->reward_busy),
                                             json_pack("{s:i, s:i, s:i}", "generator_threads", c->resources.generator_threads, "trainer_threads",
                                                       c->resources.trainer_threads, "reward_threads", c->resources.reward_threads));
    if (!st && wall > 0)
        trill_log(TRILL_LOG_INFO, "trill train: async executors over %.1f s: generator busy %.0f%% (idle %.0f%%), reward busy %.0f%%, trainer busy %.0f%% "
                "(idle %.0f%%, waiting for rollouts %.1f s); %ld batches dropped, %ld regenerated",
                wall, 100 * as->gen_busy / wall, 100 * (1 - as->gen_busy / wall), 100 * as->reward_busy / wall,
                100 * as->sched.train_busy / wall, 100 * (1 - as->sched.train_busy / wall), as->sched.trainer_wait, as->sched.dropped, as->sched.regenerated);
    return st;
}

trill_status trill_rl_async_stop(rl_async *a, trill_status st) {
    if (!a) return st;
    async_state *as = a->as;
    pthread_mutex_lock(&as->mu);
    as->stopping = true;
    pthread_mutex_unlock(&as->mu);
    close_all(as);
    if (a->gen_started) pthread_join(a->gen_thread, NULL);
    if (a->reward_started) pthread_join(a->reward_thread, NULL);
    const double wall = trill_now() - a->wall0;
    if (!st && as->failed) st = trill_error(as->err_code, "%s", as->err);
    if (!st) st = write_summary(a, wall);
    if (!st) { /* the generator may have stopped before taking the last version: evaluation must see it */
        double ms;
        size_t bytes;
        st = trill_rl_publish_direct(as->r, NULL, &ms, &bytes);
    }
    async_free(a);
    return st;
}
