/* The scheduler's staleness policy (sched.h). */
#include "rl/sched/sched.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "rl/transport/ranks.h"
#include "rl/transport/transport.h"
#include "trill/fileio.h"
#include "trill/log.h"
#include "trill/timing.h"

void trill_rl_sched_init(rl_sched *s, const rl_run *r) {
    memset(s, 0, sizeof *s);
    s->c = r->c;
    s->k0 = r->state.data_pos / r->c->generator.prompts_per_step;
    s->s0 = r->state.step;
    s->want = -1;
    s->next = s->k0;
    s->async = r->c->mode == TRILL_MODE_ASYNC;
    s->window = s->async ? r->c->async.queue + 1 : 1;
    s->bound = s->async ? r->c->async.max_staleness : r->c->rollouts.replay[0] ? INT_MAX : 0;
    s->on_stale = s->async ? r->c->async.on_stale : TRILL_STALE_WAIT;
    s->last = trill_now();
}

void trill_rl_sched_free(rl_sched *s) {
    for (int i = 0; i < s->n_held; i++) {
        trill_rl_rollout_free(s->held[i]);
        free(s->held[i]);
    }
    free(s->held);
    s->held = NULL;
    s->n_held = s->cap_held = 0;
}

/* The steps that must have been trained before batch k's generation starts, under async.on_stale
 * "wait"; INT64_MIN under "drop" and "regenerate", which do not hold the generator back. */
static int64_t rl_sched_gate(const rl_sched *s, int64_t k) {
    if (s->on_stale != TRILL_STALE_WAIT) return INT64_MIN;
    return (int64_t)s->s0 + (k - s->k0) - s->bound;
}

/* Policy version lag of a batch's response tokens at training version v: mean, max, and the
 * number of tokens at each lag 0 .. max (up to TRILL_RL_MAX_LAG entries; a batch more stale than
 * async.max_staleness is not trained, and max_staleness is below TRILL_RL_MAX_LAG). */
static void staleness(const rl_batch *b, uint32_t v, trill_rl_metrics *m) {
    double sum = 0;
    long n = 0;
    m->staleness_max = 0;
    memset(m->staleness_tokens, 0, sizeof m->staleness_tokens);
    for (int s = 0; s < b->n_seqs; s++)
        for (int t = b->offsets[s] + b->prompt_len[s]; t < b->offsets[s + 1]; t++) {
            if (!rl_sampled(b, t)) continue; /* injected: no version */
            const uint32_t lag = v - b->version[t];
            sum += (int)lag;
            n++;
            if ((int)lag > m->staleness_max) m->staleness_max = (int)lag;
            if (lag < TRILL_RL_MAX_LAG) m->staleness_tokens[lag]++;
        }
    m->staleness_mean = n ? sum / n : 0;
}

static trill_status hold(rl_sched *s, rl_rollout *ro) {
    if (s->n_held == s->cap_held) {
        const int cap = s->cap_held ? 2 * s->cap_held : 8;
        rl_rollout **h = trill_realloc(s->held, sizeof *h * (size_t)cap);
        if (!h) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        s->held = h;
        s->cap_held = cap;
    }
    s->held[s->n_held++] = ro;
    return TRILL_OK;
}

/* Batch k to the generator's port (redo: generated again, ahead of the others). */
static trill_status issue(rl_sched *s, rl_placement *p, int64_t k, bool redo) {
    rl_rollout *ro = trill_calloc(1, sizeof *ro);
    if (!ro) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    ro->index = k;
    ro->redo = redo;
    trill_status st = p->ports[0]->ops->issue(p->ports[0], ro);
    if (!st) s->in_flight++;
    return st;
}

/* New batches while fewer than `left` (the steps left to train: no more will train; a dropped batch
 * is replaced by the next fill) and the window are issued or held, and the gate allows. */
static trill_status fill(rl_sched *s, const rl_run *r, rl_placement *p, int64_t left) {
    trill_status st = TRILL_OK;
    while (!st && s->in_flight + s->n_held < s->window && s->in_flight + s->n_held < left) {
        if (rl_sched_gate(s, s->next) > (int64_t)r->state.step) break;
        if (!(st = issue(s, p, s->next, false))) s->next++;
    }
    return st;
}

trill_status trill_rl_sched_fill(rl_sched *s, const rl_run *r, rl_placement *p) { return fill(s, r, p, r->c->steps - r->state.step); }

/* The next batch to train: the regenerated batch awaited, else the smallest index held, else the
 * next to arrive. */
static trill_status next_batch(rl_sched *s, rl_placement *p, rl_rollout **out) {
    *out = NULL;
    for (;;) {
        if (s->want < 0 && s->n_held) {
            int best = 0;
            for (int i = 1; i < s->n_held; i++)
                if (s->held[i]->index < s->held[best]->index) best = i;
            *out = s->held[best];
            s->held[best] = s->held[--s->n_held];
            return TRILL_OK;
        }
        rl_rollout *ro = NULL;
        rl_port *last = p->ports[p->n_ports - 1];
        trill_status st = last->ops->collect(last, &ro);
        if (st || !ro) return st;
        s->in_flight--;
        if (s->want < 0 || ro->index == s->want) {
            *out = ro;
            return TRILL_OK;
        }
        if ((st = hold(s, ro))) {
            trill_rl_rollout_free(ro);
            free(ro);
            return st;
        }
    }
}

/* The next batch to train at version r->state.version, within the bound: stale ones dropped
 * (r->state.data_pos moved past them) or regenerated. m's staleness figures describe the batch
 * returned. */
static trill_status fresh_batch(rl_sched *s, rl_run *r, rl_placement *p, trill_rl_metrics *m, rl_rollout **out) {
    const trill_run_config *c = s->c;
    *out = NULL;
    for (;;) {
        trill_status st = trill_rl_sched_fill(s, r, p);
        rl_rollout *ro = NULL;
        const double tw = trill_now();
        if (!st) st = next_batch(s, p, &ro);
        s->step_wait += trill_now() - tw;
        if (st || !ro) return st;
        s->want = -1;
        staleness(&ro->b, r->state.version, m);
        const int lag = m->staleness_max;
        if (lag <= s->bound) {
            *out = ro;
            return TRILL_OK;
        }
        const int64_t k = ro->index;
        trill_rl_rollout_free(ro);
        free(ro);
        if (!s->async) /* generated with the newest weights: impossible */
            return trill_error(TRILL_ERR_INVALID, "sync: batch %lld has tokens %d versions older than the policy it trains", (long long)k, lag);
        if (s->on_stale == TRILL_STALE_WAIT) /* the gate makes this impossible */
            return trill_error(TRILL_ERR_INVALID, "async: batch %lld is %d versions stale, beyond async.max_staleness %d", (long long)k, lag,
                               c->async.max_staleness);
        if (s->on_stale == TRILL_STALE_DROP) {
            s->dropped++;
            trill_log(TRILL_LOG_INFO, "trill train: dropped batch %lld (%d versions stale > %d)", (long long)k, lag, c->async.max_staleness);
            r->state.data_pos = (k + 1) * c->generator.prompts_per_step;
        } else {
            s->regenerated++;
            s->want = k;
            if ((st = issue(s, p, k, true))) return st;
        }
    }
}

/* The seconds waited for batches since the last call (the step's trainer_wait_s). */
static double take_wait(rl_sched *s) {
    const double w = s->step_wait;
    s->step_wait = 0;
    return w;
}

/* The step's figures of the batch's wait and the async policy. */
static void async_figures(rl_sched *s, const rl_rollout *ro, trill_rl_metrics *m) {
    const double wait = take_wait(s);
    if (!s->async) return;
    m->async = true;
    m->batch = ro->index;
    m->dropped_batches = s->dropped;
    m->regenerated_batches = s->regenerated;
    m->time.trainer_wait_s = wait;
    s->trainer_wait += wait;
}

/* Work for a port on the calling thread: job issued, then collected (*out: the job done; NULL on an error). */
static trill_status run_on(rl_port *port, rl_rollout *job, rl_rollout **out) {
    *out = NULL;
    trill_status st = port->ops->issue(port, job);
    return st ? st : port->ops->collect(port, out);
}

/* The held-out evaluation after this step, every eval.every steps (the last step's is the run's
 * evaluation "after"), through the evaluator's port; its figures in m. */
static trill_status evaluate(const rl_run *r, rl_placement *p, trill_rl_metrics *m) {
    const int step = r->state.step + 1;
    if (!p->evaluator || step >= r->c->steps || step % r->c->eval.every != 0) return TRILL_OK;
    rl_rollout *job = trill_calloc(1, sizeof *job), *done = NULL;
    if (!job) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    job->index = step;
    job->m = m;
    const trill_status st = run_on(p->evaluator, job, &done);
    if (done) trill_rl_rollout_free(done);
    free(done);
    return st;
}

trill_status trill_rl_sched_step(rl_sched *s, rl_run *r, rl_placement *p, trill_rl_metrics *m) {
    rl_rollout empty = { 0 }, *ro = NULL;
    trill_status st = TRILL_OK;
    const bool mine = !p->shared || r->rank == 0; /* this rank gets the batches */
    if (mine) st = fresh_batch(s, r, p, m, &ro);
    else if (!(ro = trill_calloc(1, sizeof *ro))) st = trill_error(TRILL_ERR_NOMEM, "out of memory"); /* rank 0's, shared */
    if (p->shared) st = trill_rl_share_batch(r, ro ? ro : &empty, st);
    if (!st) {
        m->step = r->state.step + 1;
        async_figures(s, ro, m);
        ro->m = m;
        const double t0 = trill_now();
        st = run_on(p->trainer, ro, &ro); /* ro taken; the batch trained back */
        s->train_busy += trill_now() - t0;
        if (ro) r->gen_s += ro->gen_s, r->gen_tokens += ro->gen_tokens;
        /* async: the generator goes on with the new weights while this step ends (this step has trained) */
        if (!st && s->async && mine) st = fill(s, r, p, r->c->steps - r->state.step - 1);
    }
    if (ro) trill_rl_rollout_free(ro);
    free(ro);
    trill_rl_rollout_free(&empty);
    for (int i = 0; !st && i < p->n_ports; i++)
        if (p->ports[i]->ops->figures) p->ports[i]->ops->figures(p->ports[i], m);
    if (!st) st = evaluate(r, p, m);
    const double now = trill_now();
    m->time.interval_s = now - s->last; /* wall time since the previous step */
    s->last = now;
    if (!st) st = trill_rl_finish_step(r, m);
    return st;
}

trill_status trill_rl_sched_write_summary(const rl_sched *s, double wall, json_t *busy, json_t *layout) {
    json_t *j = json_pack("{s:f}", "wall_s", wall);
    if (j && busy) json_object_update(j, busy);
    json_t *mine = json_pack("{s:f, s:f, s:I, s:I}", "trainer_busy_s", s->train_busy, "trainer_wait_s", s->trainer_wait, "dropped",
                             (json_int_t)s->dropped, "regenerated", (json_int_t)s->regenerated);
    if (j && mine) json_object_update(j, mine);
    if (j && layout) json_object_update(j, layout);
    char *path = trill_path_join(s->c->run_dir, "async_summary.json");
    trill_status st = j && busy && mine && layout && path ? trill_json_write_file(path, j) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_decref(j);
    json_decref(busy);
    json_decref(mine);
    json_decref(layout);
    free(path);
    return st;
}
