/* The ranks transport (transport.h): executors on MPI ranks of their own (ranks.h). The generator
 * replicas: a batch is issued by message (each prompt to the replica with the fewest pending
 * tokens) and received in the order issued; new weights go out by broadcast after every update,
 * waited for (ack: sync mode, every token sampled with the newest weights) or taken by the
 * replicas between decode steps (async mode; their answers bring the figures of the last load).
 * Stopping an async port drains the replicas: each drops what it has queued and says so, and what
 * is on its way is read and dropped, so no send is left pending. The scorer's rank: each batch
 * from upstream is sent to it and its rewards come back. Only the controller (rank 0) uses these
 * ports; the other trainer ranks receive each batch from it (trill_rl_share_batch). */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "rl/transport/ranks.h"
#include "rl/transport/transport.h"
#include "trill/timing.h"

typedef struct issued {
    int64_t index;
    int32_t *owner;               /* the replica of each prompt */
    double t0;                    /* when it was issued */
} issued;

typedef struct ranks_port {
    rl_port base;
    bool ack;
    issued *fifo;                 /* issued, not yet received, in issue order */
    int n_fifo, cap;
} ranks_port;

static trill_status issue(rl_port *p, rl_rollout *ro) {
    ranks_port *q = (ranks_port *)p;
    rl_run *r = p->exec.r;
    const int64_t k = ro->index;
    trill_rl_rollout_free(ro);
    free(ro);
    if (q->n_fifo == q->cap) {
        const int cap = q->cap ? 2 * q->cap : 8;
        issued *f = trill_realloc(q->fifo, sizeof *f * (size_t)cap);
        if (!f) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        q->fifo = f;
        q->cap = cap;
    }
    int32_t *owner = trill_malloc(sizeof(int32_t) * (size_t)r->c->generator.prompts_per_step);
    const double t0 = trill_now();
    trill_status st = owner ? trill_rl_issue_batch(r, k, owner) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (st) {
        free(owner);
        return st;
    }
    q->fifo[q->n_fifo++] = (issued){ .index = k, .owner = owner, .t0 = t0 };
    return TRILL_OK;
}

/* The oldest issued batch, received from the replicas and merged. Its gen_s: since it was issued
 * (sync), or the wait for it (async: the generation itself overlapped the training). */
static trill_status collect(rl_port *p, rl_rollout **out) {
    ranks_port *q = (ranks_port *)p;
    *out = NULL;
    if (!q->n_fifo) return trill_error(TRILL_ERR_IO, "generator replicas: no batch issued to wait for");
    const issued it = q->fifo[0];
    memmove(q->fifo, q->fifo + 1, sizeof *q->fifo * (size_t)--q->n_fifo);
    if (p->exec.phase) p->exec.phase(p->exec.phase_ctx, TRILL_RUN_GENERATING);
    rl_rollout *ro = trill_calloc(1, sizeof *ro);
    const double t0 = trill_now();
    trill_status st = ro ? trill_rl_collect_batch(p->exec.r, it.index, it.owner, ro) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(it.owner);
    if (ro) {
        ro->index = it.index;
        ro->gen_s = trill_now() - (q->ack ? it.t0 : t0);
    }
    p->exec.busy_s += trill_now() - t0;
    if (st) {
        if (ro) trill_rl_rollout_free(ro);
        free(ro);
        return st;
    }
    *out = ro;
    return TRILL_OK;
}

static trill_status publish(rl_port *p, double *ms, size_t *bytes) {
    ranks_port *q = (ranks_port *)p;
    rl_run *r = p->exec.r;
    if (q->ack) return trill_rl_publish_remote(r, NULL, ms, bytes);
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

/* Async: replica 0's last weight load (its answers bring the figures). */
static void figures(rl_port *p, trill_rl_metrics *m) {
    const rl_run *r = p->exec.r;
    if (((ranks_port *)p)->ack || r->rank != 0) return;
    m->time.generator_apply_ms = r->remote->apply_ms[0];
    m->generator_apply_bytes = r->remote->applied[0];
}

/* Every replica drops what it has queued and says so; what is on its way is read and dropped. */
static trill_status drain(ranks_port *q) {
    rl_remote *x = q->base.exec.r->remote;
    rl_cmd cmd = { .op = CMD_DRAIN };
    trill_status st = trill_rl_bcast_replicas(x, &cmd, sizeof cmd);
    for (int j = 0; !st && j < x->replicas; j++) {
        char who[96];
        trill_rl_replica_name(x, j, who, sizeof who);
        for (;;) { /* batches on their way (failed or not) are dropped */
            rl_reply rep = { 0 };
            char *payload = NULL;
            trill_status got = trill_rl_recv_reply(x->replicas_comm, j + 1, TAG_REPLY, who, &rep, &payload);
            free(payload);
            if (got && rep.kind != REPLY_BATCH) return got; /* the transport, or a failure to drain */
            if (!got && rep.kind == REPLY_DRAINED) {
                x->busy_s[j] = rep.busy_s;
                break;
            }
        }
    }
    return st;
}

/* *busy_s: replica 0's busy seconds (async: its answer to the drain). */
static trill_status stop(rl_port *p, trill_status st, double *busy_s) {
    ranks_port *q = (ranks_port *)p;
    if (!q->ack && p->exec.r->rank == 0) {
        const trill_status drained = drain(q);
        if (!st) st = drained;
    }
    *busy_s = p->exec.r->remote->busy_s[0];
    for (int i = 0; i < q->n_fifo; i++) free(q->fifo[i].owner);
    free(q->fifo);
    free(q);
    return st;
}

/* ---- the scorer's rank ---- */

static trill_status score_collect(rl_port *p, rl_rollout **out) {
    rl_rollout *ro = NULL;
    trill_status st = p->up->ops->collect(p->up, &ro);
    if (st) {
        *out = NULL;
        return st;
    }
    if (p->exec.phase) p->exec.phase(p->exec.phase_ctx, TRILL_RUN_SCORING);
    const double t0 = trill_now();
    st = trill_rl_remote_score(p->exec.r, ro);
    p->exec.busy_s += trill_now() - t0;
    if (st) {
        trill_rl_rollout_free(ro);
        free(ro);
        ro = NULL;
    }
    *out = ro;
    return st;
}

static trill_status score_stop(rl_port *p, trill_status st, double *busy_s) {
    *busy_s = p->exec.busy_s;
    free(p);
    return st;
}

static const rl_port_ops generator_ops = { .name = "ranks", .issue = issue, .collect = collect, .publish = publish, .figures = figures,
                                           .stop = stop };
static const rl_port_ops scorer_ops = { .name = "ranks", .collect = score_collect, .stop = score_stop };

trill_status trill_rl_port_ranks(rl_exec exec, rl_port *up, bool ack, rl_port **out) {
    *out = NULL;
    if (exec.kind == RL_EXEC_REWARD) {
        rl_port *p = up ? trill_calloc(1, sizeof *p) : NULL;
        if (!p) return up ? trill_error(TRILL_ERR_NOMEM, "out of memory") : trill_error(TRILL_ERR_INVALID, "the scorer's rank needs an upstream port");
        *p = (rl_port){ .ops = &scorer_ops, .exec = exec, .up = up };
        *out = p;
        return TRILL_OK;
    }
    if (exec.kind != RL_EXEC_GENERATOR) return trill_error(TRILL_ERR_INVALID, "ranks transport: no %s executor on ranks", trill_rl_exec_name(exec.kind));
    ranks_port *q = trill_calloc(1, sizeof *q);
    if (!q) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    q->base = (rl_port){ .ops = &generator_ops, .exec = exec, .up = up };
    q->ack = ack;
    *out = &q->base;
    return TRILL_OK;
}
