/* Sync mode's transport (sched.h): each batch is made when the scheduler asks for it, on the
 * trainer's thread, with the newest weights: generated in process or by the generator replicas'
 * ranks, scored in process or by the scorer's rank, or read from recorded rollouts
 * (rollouts.replay); the weights go to the generator directly or to the replicas after each
 * update, and the held-out evaluation runs between steps when due. The scheduler's bound is 0:
 * every token trains at the version it was sampled with. */
#include <stdlib.h>

#include "base/alloc.h"
#include "rl/ranks.h"
#include "rl/run.h"
#include "rl/sched/sched.h"

struct rl_sync {
    rl_run *r;
    rl_sched sched;
    rl_sched_transport t;
    rl_sync_hooks hooks;
};

static void set_phase(rl_sync *y, trill_run_phase phase) {
    if (y->hooks.phase) y->hooks.phase(y->hooks.ctx, phase);
}

static void phase(void *ctx, trill_run_phase p) { set_phase(ctx, p); }

/* The batch of the data position now: replayed, or generated (not yet scored). */
static trill_status next(void *ctx, rl_rollout **out) {
    rl_sync *y = ctx;
    rl_run *r = y->r;
    rl_rollout *ro = trill_calloc(1, sizeof *ro);
    if (!ro) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const int64_t index = r->state.data_pos / r->c->generator.prompts_per_step;
    trill_status st;
    if (r->c->rollouts.replay[0]) {
        st = trill_rl_stage_replay(r, index, ro);
    } else {
        set_phase(y, TRILL_RUN_GENERATING);
        st = r->gen ? trill_rl_stage_generate(r, index, ro, NULL, NULL) : trill_rl_remote_generate(r, index, ro);
    }
    if (st) {
        trill_rl_rollout_free(ro);
        free(ro);
        return st;
    }
    *out = ro;
    return TRILL_OK;
}

static trill_status score(void *ctx, rl_rollout *ro) {
    rl_sync *y = ctx;
    set_phase(y, TRILL_RUN_SCORING);
    return y->r->scorer ? trill_rl_stage_reward(y->r, ro) : trill_rl_remote_score(y->r, ro);
}

static trill_status after_train(void *ctx, trill_rl_metrics *m) {
    rl_sync *y = ctx;
    return y->hooks.between_steps ? y->hooks.between_steps(y->hooks.ctx, m) : TRILL_OK;
}

trill_status trill_rl_sync_start(rl_run *r, const rl_sync_hooks *hooks, rl_sync **out) {
    rl_sync *y = trill_calloc(1, sizeof *y);
    if (!y) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const bool replay = r->c->rollouts.replay[0] != '\0';
    y->r = r;
    if (hooks) y->hooks = *hooks;
    rl_sched_init(&y->sched, r);
    /* with executors on ranks, rank 0 gets each batch and shares it; in process (or replaying), every trainer rank makes the same */
    y->t = (rl_sched_transport){ .shared = !replay && r->remote, .next = next, .score = replay ? NULL : score, .phase = phase,
                                 .publish = trill_rl_ranks_remote_generator(r) ? trill_rl_publish_remote : trill_rl_publish_direct,
                                 .after_train = after_train };
    *out = y;
    return TRILL_OK;
}

trill_status trill_rl_sync_step(rl_sync *y, trill_rl_metrics *m) { return rl_sched_step(&y->sched, y->r, &y->t, y, m); }

void trill_rl_sync_free(rl_sync *y) {
    if (!y) return;
    rl_sched_free(&y->sched);
    free(y);
}
