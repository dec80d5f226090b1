/* The inline transport (transport.h): the executor works on the thread that collects from it:
 * the controller's in sync mode, and the trainer's and the evaluator's in both modes. Issued
 * batches wait in a list, the regenerated one first; a lock guards it because a port downstream
 * may collect on its own thread. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "rl/transport/ranks.h"
#include "rl/transport/transport.h"

typedef struct inline_port {
    rl_port base;
    pthread_mutex_t mu;
    rl_rollout **list;            /* issued, not yet collected */
    int n, cap;
} inline_port;

static trill_status issue(rl_port *p, rl_rollout *ro) {
    inline_port *q = (inline_port *)p;
    trill_status st = TRILL_OK;
    pthread_mutex_lock(&q->mu);
    if (q->n == q->cap) {
        const int cap = q->cap ? 2 * q->cap : 4;
        rl_rollout **l = trill_realloc(q->list, sizeof *l * (size_t)cap);
        if (l) {
            q->list = l;
            q->cap = cap;
        } else {
            st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        }
    }
    if (!st) {
        const int at = ro->redo ? 0 : q->n;
        memmove(q->list + at + 1, q->list + at, sizeof *q->list * (size_t)(q->n - at));
        q->list[at] = ro;
        q->n++;
    }
    pthread_mutex_unlock(&q->mu);
    if (st) {
        trill_rl_rollout_free(ro);
        free(ro);
    }
    return st;
}

static trill_status collect(rl_port *p, rl_rollout **out) {
    inline_port *q = (inline_port *)p;
    rl_rollout *ro = NULL;
    trill_status st = TRILL_OK;
    if (p->up) {
        st = p->up->ops->collect(p->up, &ro);
    } else {
        pthread_mutex_lock(&q->mu);
        if (q->n) {
            ro = q->list[0];
            memmove(q->list, q->list + 1, sizeof *q->list * (size_t)--q->n);
        }
        pthread_mutex_unlock(&q->mu);
        if (!ro) st = trill_error(TRILL_ERR_IO, "%s executor: no batch issued to wait for", trill_rl_exec_name(p->exec.kind));
    }
    if (!st) st = trill_rl_exec_work(&p->exec, ro);
    if (st && ro) {
        trill_rl_rollout_free(ro);
        free(ro);
        ro = NULL;
    }
    *out = ro;
    return st;
}

/* The trainer's weights straight into the engine (the generator's, or the replaying run's, which
 * evaluates on it), or to the replicas when they hold the generator (a replaying run's). */
static trill_status publish(rl_port *p, double *ms, size_t *bytes) {
    rl_run *r = p->exec.r;
    return trill_rl_ranks_remote_generator(r) ? trill_rl_publish_remote(r, NULL, ms, bytes) : trill_rl_publish_direct(r, NULL, ms, bytes);
}

static trill_status stop(rl_port *p, trill_status st, double *busy_s) {
    inline_port *q = (inline_port *)p;
    *busy_s = p->exec.busy_s;
    for (int i = 0; i < q->n; i++) {
        trill_rl_rollout_free(q->list[i]);
        free(q->list[i]);
    }
    free(q->list);
    pthread_mutex_destroy(&q->mu);
    free(q);
    return st;
}

/* the generator's (or the replay's): takes the trainer's weights; the others' take none */
static const rl_port_ops generator_ops = { .name = "inline", .issue = issue, .collect = collect, .publish = publish, .stop = stop };
static const rl_port_ops plain_ops = { .name = "inline", .issue = issue, .collect = collect, .stop = stop };

trill_status trill_rl_port_inline(rl_exec exec, rl_port *up, rl_port **out) {
    inline_port *q = trill_calloc(1, sizeof *q);
    if (!q) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    q->base = (rl_port){ .ops = exec.kind == RL_EXEC_GENERATOR || exec.kind == RL_EXEC_REPLAY ? &generator_ops : &plain_ops, .exec = exec, .up = up };
    pthread_mutex_init(&q->mu, NULL);
    *out = &q->base;
    return TRILL_OK;
}
