/* Asynchronous RL across ranks (run.h): the generator replicas on their own ranks generate ahead
 * of the trainer, within async.max_staleness; the controller (rank 0) keeps the batches it has
 * issued in order and trains them one a step, as async.c does with threads.
 *
 * Issuing is the staleness gate (the policy is sched/sched.h's, shared with async.c). Batch k is
 * trained at version v0 + (k - k0); with on_stale "wait" the controller issues batch k only once
 * the gate's version v0 + (k - k0) - max_staleness is published, and a replica finishes
 * receiving the weights announced before a batch before it starts it, so no token can be older
 * than the bound (max_staleness 0: every batch is generated with the newest weights, as in sync
 * mode, bit for bit). With "drop" or "regenerate" it keeps
 * async.queue + 1 batches issued whatever the version, and a batch found too stale is dropped
 * (its prompts skipped) or issued again (the same request ids, newer weights; the batches that
 * arrive meanwhile are held). Weights go out after every update by the non-blocking broadcast,
 * which the replicas test between decode steps: tokens keep the version they were sampled at,
 * and each batch's answer carries the replica's newest weights' receive and apply times.
 *
 * The other trainer ranks receive each batch from rank 0 (trill_rl_share_batch). Stop: `drain`
 * makes every replica drop its queued batches and answer once its last one is sent; the
 * controller reads and drops what is still on its way, so no send is left pending. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "ranks.h"
#include "rl/sched/sched.h"
#include "trill/fileio.h"
#include "trill/log.h"
#include "trill/timing.h"

typedef struct issued { int64_t index; int32_t *owner; } issued;

struct rl_async_ranks {
    rl_run *r;
    rl_sched sched;               /* the staleness policy */
    int64_t next;                 /* the next new batch to issue */
    issued *fifo;                 /* issued, not yet received, in issue order */
    int n_fifo, cap;
    double wall0;
};

/* ---- the controller's queue of issued batches ---- */

static trill_status issue(rl_async_ranks *a, int64_t k) {
    rl_run *r = a->r;
    if (a->n_fifo == a->cap) {
        const int cap = a->cap ? 2 * a->cap : 8;
        issued *f = trill_realloc(a->fifo, sizeof *f * (size_t)cap);
        if (!f) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        a->fifo = f;
        a->cap = cap;
    }
    int32_t *owner = trill_malloc(sizeof(int32_t) * (size_t)r->c->generator.prompts_per_step);
    trill_status st = owner ? trill_rl_issue_batch(r, k, owner) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (st) {
        free(owner);
        return st;
    }
    a->fifo[a->n_fifo++] = (issued){ .index = k, .owner = owner };
    return TRILL_OK;
}

/* New batches, as far as the staleness gate (wait) or the queue (drop, regenerate) allows. */
static trill_status fill(rl_async_ranks *a) {
    const trill_rl_config *c = a->r->c;
    trill_status st = TRILL_OK;
    /* no more than the steps left will train (a dropped batch is replaced by the next fill) */
    const int n_held = a->sched.n_held;
    while (!st && a->n_fifo + n_held < c->async.queue + 1 && a->n_fifo + n_held < c->steps - a->r->state.step) {
        if (rl_sched_gate(&a->sched, a->next) > (int64_t)a->r->state.version) break;
        st = issue(a, a->next++);
    }
    return st;
}

/* The oldest issued batch, received from the replicas and merged. */
static trill_status receive(rl_async_ranks *a, rl_rollout **out) {
    issued it = a->fifo[0];
    memmove(a->fifo, a->fifo + 1, sizeof *a->fifo * (size_t)--a->n_fifo);
    rl_rollout *ro = trill_calloc(1, sizeof *ro);
    const double t0 = trill_now();
    trill_status st = ro ? trill_rl_collect_batch(a->r, it.index, it.owner, ro) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(it.owner);
    if (ro) {
        ro->index = it.index;
        ro->gen_s = trill_now() - t0; /* the wait for it: the generation itself overlapped */
    }
    if (st) {
        if (ro) trill_rl_rollout_free(ro);
        free(ro);
        return st;
    }
    *out = ro;
    return TRILL_OK;
}

/* The policy's transport (sched.h): issue what the gate and queue allow, receive the oldest issued,
 * issue a stale batch again. */
static trill_status before_next(void *ctx) {
    return fill(ctx);
}

static trill_status next_issued(void *ctx, rl_rollout **out) {
    rl_async_ranks *a = ctx;
    if (!a->n_fifo) return trill_error(TRILL_ERR_IO, "async: no batch issued to wait for");
    return receive(a, out);
}

static trill_status issue_again(void *ctx, int64_t index) {
    return issue(ctx, index);
}

/* The accepted batch's rewards: the scorer here, or the scorer's rank. */
static trill_status score(void *ctx, rl_rollout *ro) {
    rl_run *r = ((rl_async_ranks *)ctx)->r;
    return r->scorer ? trill_rl_stage_reward(r, ro) : trill_rl_remote_score(r, ro);
}

static trill_status publish_async(rl_run *r, void *ctx, double *ms, size_t *bytes);

/* Replica 0's last weight load (its answers bring the figures), for the step's metrics. */
static trill_status apply_figures(void *ctx, trill_rl_metrics *m) {
    const rl_run *r = ((rl_async_ranks *)ctx)->r;
    if (r->rank == 0) {
        m->time.generator_apply_ms = r->remote->apply_ms[0];
        m->generator_apply_bytes = r->remote->applied[0];
    }
    return TRILL_OK;
}

static const rl_sched_transport ranks_transport = { .shared = true, .before_next = before_next, .next = next_issued, .regenerate = issue_again,
                                                    .score = score, .publish = publish_async, .after_train = apply_figures };

/* ---- the schedule ---- */

/* The async publish: the weights to every replica without waiting for their answers (the figures
 * come back with the next batches). */
static trill_status publish_async(rl_run *r, void *ctx, double *ms, size_t *bytes) {
    (void)ctx;
    *ms = 0;
    *bytes = 0;
    if (r->rank != 0) return TRILL_OK;
    const double t0 = trill_now();
    size_t applied = 0;
    trill_status st = trill_rl_send_weights(r, false, &applied);
    *bytes = r->remote->transfer_bytes;
    *ms = (trill_now() - t0) * 1e3;
    return st;
}

trill_status trill_rl_async_ranks_start(rl_run *r, rl_async_ranks **out) {
    rl_async_ranks *a = trill_calloc(1, sizeof *a);
    if (!a) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    a->r = r;
    rl_sched_init(&a->sched, r);
    a->next = a->sched.k0;
    a->wall0 = trill_now();
    *out = a;
    return r->rank == 0 ? fill(a) : TRILL_OK;
}

trill_status trill_rl_async_ranks_step(rl_async_ranks *a, trill_rl_metrics *m) {
    trill_status st = rl_sched_step(&a->sched, a->r, &ranks_transport, a, m);
    if (!st && a->r->rank == 0) st = fill(a);
    return st;
}

/* Every replica drops what it has queued and says so; what is on its way is read and dropped. */
static trill_status drain(rl_async_ranks *a) {
    rl_remote *x = a->r->remote;
    rl_cmd cmd = { .op = CMD_DRAIN };
    trill_status st = trill_rl_bcast_sync(x, &cmd, sizeof cmd);
    for (int j = 0; !st && j < x->replicas; j++) {
        char who[96];
        trill_rl_replica_name(x, j, who, sizeof who);
        for (;;) { /* batches on their way (failed or not) are dropped */
            rl_reply rep = { 0 };
            char *payload = NULL;
            trill_status got = trill_rl_recv_reply(x->sync, j + 1, TAG_REPLY, who, &rep, &payload);
            free(payload);
            if (got && rep.kind != REPLY_BATCH) return got; /* the transport, or a failure to drain */
            if (!got && rep.kind == REPLY_DRAINED) {
                x->busy_s[j] = rep.busy_s;
                break;
            }
        }
    }
    for (int i = 0; i < a->n_fifo; i++) free(a->fifo[i].owner);
    a->n_fifo = 0;
    return st;
}

/* RUN/async_summary.json and its log line: the executors' busy time. */
static trill_status write_summary(const rl_async_ranks *a, double wall) {
    const rl_run *r = a->r;
    const double gen_busy = r->remote->busy_s[0];
    trill_status st = rl_sched_write_summary(&a->sched, wall, json_pack("{s:f}", "generator_busy_s", gen_busy),
                                             json_pack("{s:i}", "generator_replicas", r->remote->replicas));
    if (!st && wall > 0)
        trill_log(TRILL_LOG_INFO, "trill train: async over ranks for %.1f s: generator replica 0 busy %.0f%%, trainer busy %.0f%% (waiting for "
                  "rollouts %.1f s); %ld batches dropped, %ld regenerated", wall, 100 * gen_busy / wall, 100 * a->sched.train_busy / wall,
                  a->sched.trainer_wait, a->sched.dropped, a->sched.regenerated);
    return st;
}

trill_status trill_rl_async_ranks_stop(rl_async_ranks *a, trill_status st) {
    if (!a) return st;
    rl_run *r = a->r;
    if (r->rank == 0) {
        const trill_status drained = drain(a);
        if (!st) st = drained;
        if (!st) st = write_summary(a, trill_now() - a->wall0);
    }
    for (int i = 0; i < a->n_fifo; i++) free(a->fifo[i].owner);
    rl_sched_free(&a->sched);
    free(a->fifo);
    free(a);
    return st;
}
