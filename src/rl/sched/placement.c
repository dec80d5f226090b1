/* Placements: which transport carries each executor, chosen from the config — the one place where
 * they are decided. The scheduler (sched.c) drives every placement the same way.
 *   sync, in process         generator inline, reward inline (or on the scorer's rank)
 *   sync, replaying          the recorded batches inline (rollouts.replay), no reward
 *   sync, replicas           generator on its replicas' ranks (each update waited for), reward inline or on its rank
 *   async, in process        generator and reward on threads of their own, each on its own cores
 *                            (resources.*), the trainer on the calling thread's share; with
 *                            async.reward "trainer", the reward inline on the trainer's thread
 *   async, replicas          generator on its replicas' ranks, ahead of the trainer within the bound
 * In every placement the trainer and the evaluator (eval.every, sync mode) are inline on the
 * calling thread, and the trainer publishes its weights through the generator's port.
 * Start, step and stop are the run handle's (run.h); stop writes RUN/async_summary.json in async mode. */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/json.h"
#include "rl/transport/ranks.h"
#include "rl/run/run.h"
#include "rl/sched/sched.h"
#include "trill/log.h"
#include "trill/timing.h"

struct rl_schedule {
    rl_run *r;
    rl_sched sched;
    rl_placement p;
    double wall0;                 /* the executors' start */
};

/* Keeps a port that was made (also when the call failed: stop frees it). */
static trill_status add_port(rl_placement *p, trill_status st, rl_port **port) {
    if (*port) p->ports[p->n_ports++] = *port;
    *port = NULL;
    return st;
}

/* The generator's port's publish (ctx), as the trainer's step calls it. */
static trill_status publish(rl_run *r, void *ctx, double *ms, size_t *bytes) {
    rl_port *gen = ctx;
    (void)r;
    *ms = 0;
    *bytes = 0;
    return gen->ops->publish ? gen->ops->publish(gen, ms, bytes) : TRILL_OK;
}

/* The generator's and the reward executor's ports for r's config (gen, reward: theirs, made). */
static trill_status place_rollouts(rl_run *r, rl_exec gen, rl_exec reward, rl_placement *p) {
    const trill_run_config *c = r->c;
    const bool replay = c->rollouts.replay[0] != '\0', async = c->mode == TRILL_MODE_ASYNC;
    /* with executors on ranks, rank 0 gets each batch and shares it; in process (or replaying), every trainer rank makes the same */
    p->shared = !replay && r->remote;
    rl_port *port = NULL;
    trill_status st;
    if (replay) {
        st = trill_rl_port_inline(gen, NULL, &port);
        return add_port(p, st, &port);
    }
    if (trill_rl_ranks_remote_generator(r)) {
        p->layout = "generator replicas on ranks";
        st = trill_rl_port_ranks(gen, NULL, !async, &port);
        st = add_port(p, st, &port);
    } else if (async) {
        rl_cores k[3];
        p->layout = "threads";
        st = trill_rl_cores_plan(c, k);
        if (!st) st = add_port(p, trill_rl_port_thread(gen, NULL, &k[0], c->async.queue, &port), &port);
        if (!st && c->async.reward == TRILL_REWARD_TRAINER) st = add_port(p, trill_rl_port_inline(reward, p->ports[0], &port), &port);
        else if (!st) st = add_port(p, trill_rl_port_thread(reward, p->ports[0], &k[2], c->async.queue, &port), &port);
        p->pin_trainer = true;
        p->trainer_cores = k[1];
        return st;
    } else {
        st = trill_rl_port_inline(gen, NULL, &port);
        st = add_port(p, st, &port);
    }
    if (!st) st = r->scorer ? trill_rl_port_inline(reward, p->ports[0], &port) : trill_rl_port_ranks(reward, p->ports[0], false, &port);
    return add_port(p, st, &port);
}

/* Every executor's port for r's config (hooks: the run handle's, on the controller's thread): the
 * trainer and the evaluator inline on the calling thread, the trainer publishing through the
 * generator's port. */
static trill_status place(rl_run *r, const rl_step_hooks *hooks, rl_placement *p) {
    rl_exec e[4];
    const rl_exec_kind kinds[4] = { r->c->rollouts.replay[0] ? RL_EXEC_REPLAY : RL_EXEC_GENERATOR, RL_EXEC_REWARD, RL_EXEC_TRAINER, RL_EXEC_EVALUATOR };
    for (int i = 0; i < 4; i++) {
        e[i] = trill_rl_exec_make(r, kinds[i]);
        if (hooks) e[i].phase = hooks->phase, e[i].phase_ctx = hooks->ctx;
    }
    trill_status st = place_rollouts(r, e[0], e[1], p);
    if (st) return st;
    e[2].publish = publish;
    e[2].publish_ctx = p->ports[0];
    st = trill_rl_port_inline(e[2], NULL, &p->trainer);
    if (!st && r->eval && r->c->eval.every > 0) st = trill_rl_port_inline(e[3], NULL, &p->evaluator);
    return st;
}

trill_status trill_rl_schedule_start(rl_run *r, const rl_step_hooks *hooks, rl_schedule **out) {
    rl_schedule *y = trill_calloc(1, sizeof *y);
    if (!y) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    y->r = r;
    trill_rl_sched_init(&y->sched, r);
    y->wall0 = trill_now();
    *out = y;
    trill_status st = place(r, hooks, &y->p);
    /* async: the generator starts at once (rank 0's, when it shares the batches) */
    if (!st && y->sched.async && (!y->p.shared || r->rank == 0)) st = trill_rl_sched_fill(&y->sched, r, &y->p);
    return st; /* on failure the caller still stops it */
}

/* A failed step's cause: an executor that failed first on a thread of its own (closing what the
 * trainer waited on or published to), else st. */
static trill_status cause(rl_schedule *y, trill_status st) {
    for (int i = 0; i < y->p.n_ports; i++) {
        rl_port *port = y->p.ports[i];
        const trill_status failed = port->ops->failure ? port->ops->failure(port) : TRILL_OK;
        if (failed) return failed;
    }
    return st;
}

trill_status trill_rl_schedule_step(rl_schedule *y, trill_rl_metrics *m) {
    /* the trainer is the calling thread: its cores and thread count for this step, restored after */
    cpu_set_t saved_set;
    const int saved_threads = omp_get_max_threads();
    const bool restore = y->p.pin_trainer && pthread_getaffinity_np(pthread_self(), sizeof saved_set, &saved_set) == 0;
    if (y->p.pin_trainer) trill_rl_cores_enter(&y->p.trainer_cores);
    trill_status st = trill_rl_sched_step(&y->sched, y->r, &y->p, m);
    if (st) st = cause(y, st);
    if (y->p.pin_trainer) omp_set_num_threads(saved_threads);
    if (restore) pthread_setaffinity_np(pthread_self(), sizeof saved_set, &saved_set);
    return st;
}

/* RUN/async_summary.json (the executors' busy time, for benchmarks) and its log line. */
static trill_status write_summary(const rl_schedule *y, const double *busy, double wall) {
    const trill_run_config *c = y->r->c;
    const rl_sched *s = &y->sched;
    const bool threads = y->p.pin_trainer;
    json_t *layout = threads ? json_pack("{s:i, s:i, s:i}", "generator_threads", c->resources.generator_threads, "trainer_threads",
                                         c->resources.trainer_threads, "reward_threads", c->resources.reward_threads)
                             : json_pack("{s:i}", "generator_replicas", c->parallel.generator.replicas);
    trill_status st = trill_rl_sched_write_summary(s, wall, json_pack("{s:f, s:f}", "generator_busy_s", busy[0], "reward_busy_s", busy[1]), layout);
    if (!st && wall > 0)
        trill_log(TRILL_LOG_INFO, "trill train: async executors over %.1f s (%s): generator busy %.0f%% (idle %.0f%%), reward busy %.0f%%, "
                  "trainer busy %.0f%% (idle %.0f%%, waiting for rollouts %.1f s); %ld batches dropped, %ld regenerated",
                  wall, y->p.layout, 100 * busy[0] / wall, 100 * (1 - busy[0] / wall), 100 * busy[1] / wall, 100 * s->train_busy / wall,
                  100 * (1 - s->train_busy / wall), s->trainer_wait, s->dropped, s->regenerated);
    return st;
}

trill_status trill_rl_schedule_stop(rl_schedule *y, trill_status st) {
    if (!y) return st;
    double busy[2] = { 0, 0 }, idle;
    rl_port *here[2] = { y->p.evaluator, y->p.trainer }; /* inline on this thread: nothing in flight */
    for (int i = 0; i < 2; i++)
        if (here[i]) st = here[i]->ops->stop(here[i], st, &idle);
    for (int i = y->p.n_ports - 1; i >= 0; i--) /* every port stops taking work before any is joined */
        if (y->p.ports[i]->ops->close) y->p.ports[i]->ops->close(y->p.ports[i]);
    for (int i = y->p.n_ports - 1; i >= 0; i--) /* downstream first: a thread may be waiting on its upstream port */
        st = y->p.ports[i]->ops->stop(y->p.ports[i], st, &busy[i]);
    const bool mine = !y->p.shared || y->r->rank == 0;
    if (!st && y->sched.async && mine) st = write_summary(y, busy, trill_now() - y->wall0);
    trill_rl_sched_free(&y->sched);
    free(y);
    return st;
}
