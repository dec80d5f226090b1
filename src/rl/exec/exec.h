/* Executors: the work of one kind on one rollout batch, on the calling thread. The generator
 * makes batch ro->index (the prompts of that place in the stream, n samples each), the replay
 * executor reads the batch recorded for the step (rollouts.replay) in its place, the reward
 * executor scores a batch, the trainer trains on it (the update, its publication to the generator
 * and the step's figures in ro->m), and the evaluator runs the held-out evaluation after step
 * ro->index (its figures in ro->m; the batch is empty). An executor knows nothing of where it
 * runs: a transport (transport/transport.h) carries it on the controller's thread, a thread of its
 * own or ranks of its own, and the scheduler (sched/sched.h) meets it only through that transport. */
#ifndef TRILL_RL_EXEC_H
#define TRILL_RL_EXEC_H

#include "rl/run/run.h"

typedef enum rl_exec_kind { RL_EXEC_GENERATOR, RL_EXEC_REPLAY, RL_EXEC_REWARD, RL_EXEC_TRAINER, RL_EXEC_EVALUATOR } rl_exec_kind;

typedef struct rl_exec {
    rl_exec_kind kind;
    rl_run *r;
    /* the generator: runs before every engine step (the thread transport takes new weights there); NULL: none */
    trill_status (*between_steps)(void *ctx);
    void *between_ctx;
    /* the run's phase while it works (the controller's thread only; NULL: none) */
    void (*phase)(void *ctx, trill_run_phase phase);
    void *phase_ctx;
    /* the trainer: how its new weights reach the generator (the generator's port's publish) */
    rl_publish_fn publish;
    void *publish_ctx;
    double busy_s;                /* seconds in trill_rl_exec_work */
} rl_exec;

/* "generator", "replay", "reward", "trainer", "evaluator": in errors and summaries. */
const char *trill_rl_exec_name(rl_exec_kind kind);
/* An executor of run r (its generator, recorded rollouts or scorer, in this process). */
rl_exec trill_rl_exec_make(rl_run *r, rl_exec_kind kind);
/* The work on ro: generate batch ro->index (ro->redo kept: it is generated again), replay it,
 * score it, train on it, or evaluate after step ro->index. On an error ro may hold part of a batch
 * (trill_rl_rollout_free frees it). */
trill_status trill_rl_exec_work(rl_exec *e, rl_rollout *ro);

#endif
