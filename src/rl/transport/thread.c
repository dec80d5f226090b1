/* The thread transport (transport.h): the executor on a thread of its own and its own cores
 * (LlamaRL's executors), finished batches in a bounded queue. The generator's thread takes new
 * weights from a weight channel (trill/channel.h) before every engine step: the trainer publishes
 * one copy, checked by checksum on arrival, and the engine takes it at its next step.
 *
 * Failure: an executor that fails records its error and closes its queues; whoever waits on them
 * (the port downstream, the scheduler) wakes with that error, and the scheduler's stop closes and
 * joins every port. */
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "rl/transport/transport.h"
#include "trill/channel.h"
#include "trill/timing.h"

enum { QUEUE_MAX = 1024 };

typedef struct queue {
    rl_rollout *items[QUEUE_MAX + 1];
    int n, capacity;
} queue;

typedef struct thread_port {
    rl_port base;
    rl_cores cores;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;           /* guards everything below */
    pthread_cond_t cv;
    queue in, out;                /* issued (no upstream); finished */
    bool closed;                  /* stopping or failed: no more work */
    trill_status err_code;        /* the executor's failure (TRILL_OK: none) */
    char err[2048];
    /* the generator's weights */
    trill_weight_channel *ch;
    uint32_t version;             /* the version the engine holds */
    trill_lora *lora;             /* adapter sync: staging the engine converts from */
    trill_model *model;           /* merge sync: the fp32 staging model */
    double apply_ms;              /* the last weight load */
    size_t apply_bytes;
} thread_port;

/* ---- the queues (under mu) ---- */

static void close_port(thread_port *t) {
    pthread_mutex_lock(&t->mu);
    t->closed = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (t->ch) trill_channel_close(t->ch);
}

/* Records the executor's failure (the message is per thread: copy it; from upstream: as it is). */
static void fail(thread_port *t, trill_status st, bool upstream) {
    pthread_mutex_lock(&t->mu);
    if (!t->err_code && !t->closed) {
        t->err_code = st;
        if (upstream) snprintf(t->err, sizeof t->err, "%s", trill_error_message());
        else snprintf(t->err, sizeof t->err, "%s executor: %s", trill_rl_exec_name(t->base.exec.kind), trill_error_message());
    }
    pthread_mutex_unlock(&t->mu);
    close_port(t);
}

/* The port's error, or that it was closed. */
static trill_status closed_error(thread_port *t) {
    pthread_mutex_lock(&t->mu);
    trill_status st = t->err_code ? trill_error(t->err_code, "%s", t->err)
                                  : trill_error(TRILL_ERR_IO, "%s executor: stopped", trill_rl_exec_name(t->base.exec.kind));
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* Blocks while full (a regenerated batch may take one slot more, so that a trainer waiting for it
 * is never blocked by the batches queued behind it); a regenerated batch goes first. */
static bool push(thread_port *t, queue *q, rl_rollout *ro) {
    pthread_mutex_lock(&t->mu);
    while (!t->closed && q->n >= q->capacity + (ro->redo ? 1 : 0)) pthread_cond_wait(&t->cv, &t->mu);
    const bool ok = !t->closed;
    if (ok) {
        const int at = ro->redo ? 0 : q->n;
        memmove(q->items + at + 1, q->items + at, sizeof(rl_rollout *) * (size_t)(q->n - at));
        q->items[at] = ro;
        q->n++;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}

/* The regenerated batch, else the smallest index; NULL once closed. */
static rl_rollout *pop(thread_port *t, queue *q) {
    pthread_mutex_lock(&t->mu);
    rl_rollout *ro = NULL;
    while (!ro && !t->closed) {
        int best = -1;
        for (int i = 0; i < q->n && !(best >= 0 && q->items[best]->redo); i++)
            if (best < 0 || q->items[i]->redo || q->items[i]->index < q->items[best]->index) best = i;
        if (best >= 0) {
            ro = q->items[best];
            memmove(q->items + best, q->items + best + 1, sizeof(rl_rollout *) * (size_t)(q->n - best - 1));
            q->n--;
            pthread_cond_broadcast(&t->cv);
        } else {
            pthread_cond_wait(&t->cv, &t->mu);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return ro;
}

static void free_queue(queue *q) {
    for (int i = 0; i < q->n; i++) {
        trill_rl_rollout_free(q->items[i]);
        free(q->items[i]);
    }
    q->n = 0;
}

/* ---- cores ---- */

void trill_rl_cores_enter(const rl_cores *k) {
    omp_set_num_threads(k->threads);
    if (k->n == 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < k->n; i++) CPU_SET(k->cpu[i], &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

trill_status trill_rl_cores_plan(const trill_run_config *c, rl_cores out[3]) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set)) return trill_error(TRILL_ERR_IO, "sched_getaffinity: %s", strerror(errno));
    int allowed[CPU_SETSIZE], n_allowed = 0;
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &set)) allowed[n_allowed++] = i;
    const int want[3] = { c->resources.generator_threads, c->resources.trainer_threads, c->resources.reward_threads };
    const int total = want[0] + want[1] + want[2];
    if (c->resources.pin && total > n_allowed)
        return trill_error(TRILL_ERR_INVALID,
                           "resources: generator_threads %d + trainer_threads %d + reward_threads %d = %d cores, but this process "
                           "may use %d; lower them or set resources.pin false (executors would then share cores)",
                           want[0], want[1], want[2], total, n_allowed);
    for (int e = 0, at = 0; e < 3; e++) {
        out[e].threads = want[e] > 0 ? want[e] : 1;
        out[e].n = c->resources.pin ? want[e] : 0;
        for (int i = 0; i < out[e].n; i++) out[e].cpu[i] = allowed[at + i];
        at += want[e];
    }
    return TRILL_OK;
}

/* ---- the generator's weights ---- */

/* The trainer's side (the port's publish): its weights (merged first in merge sync), one copy into
 * the channel. */
static trill_status publish(rl_port *p, double *ms, size_t *bytes) {
    thread_port *t = (thread_port *)p;
    rl_run *r = p->exec.r;
    const double t0 = trill_now();
    const float *src;
    size_t n;
    const trill_model *merged;
    trill_status st = trill_trainer_export(r->trainer, &src, &n, &merged);
    trill_publish_info info = { 0 };
    if (!st) st = trill_channel_publish(t->ch, src, r->state.version, &info);
    *ms = (trill_now() - t0) * 1e3;
    *bytes = info.bytes;
    return st;
}

/* The generator's side, before every engine step: the newest published weights, checked against
 * the publisher's checksum and loaded into the engine (which takes them at its next step). */
static trill_status take_weights(void *ctx) {
    thread_port *t = ctx;
    rl_run *r = t->base.exec.r;
    trill_weight_view view;
    trill_status st = trill_channel_acquire(t->ch, t->version, &view);
    if (st || !view.data) return st;
    const double t0 = trill_now();
    size_t bytes = 0;
    if (trill_channel_checksum(view.data, view.n) != view.checksum) {
        st = trill_error(TRILL_ERR_INVALID, "weight channel: version %u arrived with a wrong checksum", view.version);
    } else if (r->c->sync.mode == TRILL_WEIGHT_SYNC_ADAPTER) {
        memcpy(t->lora->params, view.data, sizeof(float) * view.n);
        st = trill_rl_generator_load_adapter(r->gen, t->lora, view.version, &bytes);
    } else {
        memcpy(t->model->params, view.data, sizeof(float) * view.n);
        st = trill_rl_generator_load_weights(r->gen, t->model, view.version, &bytes);
    }
    if (!st) {
        t->version = view.version;
        pthread_mutex_lock(&t->mu); /* the trainer reads these for its metrics */
        t->apply_ms = (trill_now() - t0) * 1e3;
        t->apply_bytes = bytes;
        pthread_mutex_unlock(&t->mu);
    }
    trill_channel_release(t->ch, &view);
    return st;
}

/* The channel and staging for the trainer's weights: its adapters, or every parameter in fp32. */
static trill_status open_channel(thread_port *t) {
    rl_run *r = t->base.exec.r;
    const trill_model *policy = trill_trainer_policy(r->trainer);
    size_t n = 0;
    trill_lora_params(trill_trainer_lora(r->trainer), &n);
    if (r->c->sync.mode == TRILL_WEIGHT_SYNC_MERGE) n = trill_model_n_params(policy);
    trill_status st = trill_channel_create(n, &t->ch);
    if (!st && r->c->sync.mode == TRILL_WEIGHT_SYNC_ADAPTER) st = trill_lora_create(policy, r->c->trainer.lora, 0, &t->lora);
    if (!st && r->c->sync.mode == TRILL_WEIGHT_SYNC_MERGE) st = trill_model_create(trill_model_config(policy), &t->model);
    t->version = r->state.version;
    t->base.exec.between_steps = take_weights;
    t->base.exec.between_ctx = t;
    return st;
}

static void figures(rl_port *p, trill_rl_metrics *m) {
    thread_port *t = (thread_port *)p;
    pthread_mutex_lock(&t->mu);
    m->time.generator_apply_ms = t->apply_ms;
    m->generator_apply_bytes = t->apply_bytes;
    pthread_mutex_unlock(&t->mu);
}

/* ---- the executor's thread ---- */

static void *thread_main(void *arg) {
    thread_port *t = arg;
    rl_port *p = &t->base;
    trill_rl_cores_enter(&t->cores);
    for (;;) {
        rl_rollout *ro = NULL;
        if (p->up) {
            trill_status st = p->up->ops->collect(p->up, &ro);
            if (st) {
                fail(t, st, true); /* ignored when the port is already closed */
                break;
            }
        } else if (!(ro = pop(t, &t->in))) {
            break; /* closed */
        }
        trill_status st = trill_rl_exec_work(&p->exec, ro);
        if (st) {
            trill_rl_rollout_free(ro);
            free(ro);
            fail(t, st, false);
            break;
        }
        if (!push(t, &t->out, ro)) {
            trill_rl_rollout_free(ro);
            free(ro);
            break;
        }
    }
    return NULL;
}

static trill_status issue(rl_port *p, rl_rollout *ro) {
    thread_port *t = (thread_port *)p;
    if (push(t, &t->in, ro)) return TRILL_OK;
    trill_rl_rollout_free(ro);
    free(ro);
    return closed_error(t);
}

static trill_status collect(rl_port *p, rl_rollout **out) {
    thread_port *t = (thread_port *)p;
    return (*out = pop(t, &t->out)) ? TRILL_OK : closed_error(t);
}

static trill_status failure(rl_port *p) {
    thread_port *t = (thread_port *)p;
    pthread_mutex_lock(&t->mu);
    const trill_status failed = t->err_code;
    pthread_mutex_unlock(&t->mu);
    return failed ? closed_error(t) : TRILL_OK;
}

static void close_op(rl_port *p) { close_port((thread_port *)p); }

static trill_status stop(rl_port *p, trill_status st, double *busy_s) {
    thread_port *t = (thread_port *)p;
    if (!st) st = failure(p);
    close_port(t);
    if (t->started) pthread_join(t->thread, NULL);
    t->started = false;
    *busy_s = p->exec.busy_s; /* the thread's, joined */
    /* the generator may have stopped before taking the last version: evaluation must see it */
    double ms;
    size_t bytes;
    if (!st && t->ch) st = trill_rl_publish_direct(p->exec.r, NULL, &ms, &bytes);
    free_queue(&t->in);
    free_queue(&t->out);
    trill_channel_free(t->ch);
    trill_lora_free(t->lora);
    trill_model_free(t->model);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
    return st;
}

static const rl_port_ops generator_ops = { .name = "thread", .issue = issue, .collect = collect, .publish = publish, .figures = figures,
                                           .failure = failure, .close = close_op, .stop = stop };
static const rl_port_ops work_ops = { .name = "thread", .issue = issue, .collect = collect, .failure = failure, .close = close_op, .stop = stop };

trill_status trill_rl_port_thread(rl_exec exec, rl_port *up, const rl_cores *k, int capacity, rl_port **out) {
    *out = NULL;
    if (capacity < 1 || capacity > QUEUE_MAX - 1) return trill_error(TRILL_ERR_INVALID, "thread transport: a queue of %d batches", capacity);
    thread_port *t = trill_calloc(1, sizeof *t);
    if (!t) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    t->base = (rl_port){ .ops = exec.kind == RL_EXEC_GENERATOR ? &generator_ops : &work_ops, .exec = exec, .up = up };
    t->base.exec.phase = NULL; /* not the controller's thread */
    t->cores = *k;
    t->in.capacity = QUEUE_MAX - 1;
    t->out.capacity = capacity;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    *out = &t->base;
    trill_status st = exec.kind == RL_EXEC_GENERATOR ? open_channel(t) : TRILL_OK;
    if (!st) {
        t->started = pthread_create(&t->thread, NULL, thread_main, t) == 0;
        if (!t->started) st = trill_error(TRILL_ERR_IO, "cannot start the %s executor's thread", trill_rl_exec_name(exec.kind));
    }
    return st; /* on failure the caller still stops it */
}
