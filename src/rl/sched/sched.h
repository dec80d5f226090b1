/* The scheduler's staleness policy, written once for every asynchronous placement: the executors
 * on threads of one process (async.c) and the generator replicas on ranks of their own
 * (async_ranks.c). A placement moves batches; this decides which batch trains next and what
 * happens to a stale one:
 *   - the gate: with async.on_stale "wait", batch k is trained at version v0 + (k - k0), so it
 *     may start only with weights of version v0 + (k - k0) - max_staleness or newer, and no
 *     token can be older than the bound;
 *   - the next batch: the regenerated batch awaited, else the smallest index received;
 *   - a batch beyond the bound is an error under "wait" (the gate makes it impossible), dropped
 *     under "drop" (its prompts skipped) and generated again under "regenerate" (the batches
 *     received meanwhile are held until it arrives).
 * The trainer's thread owns an rl_sched; another thread may call rl_sched_gate (it reads only
 * what rl_sched_init set). */
#ifndef TRILL_RL_SCHED_H
#define TRILL_RL_SCHED_H

#include <stdint.h>

#include "rl/run.h"

/* How a placement moves batches and weights for the scheduler (sync.c: on the trainer's thread;
 * async.c: executor threads; async_ranks.c: generator replicas on ranks of their own). */
typedef struct rl_sched_transport {
    /* rank 0 gets each batch and shares it with the other trainer ranks (else every rank gets it) */
    bool shared;
    /* Before each wait for a batch (may be NULL): issue what the gate and queue allow. */
    trill_status (*before_next)(void *ctx);
    /* The next batch to arrive, waiting for it (an error, never NULL with TRILL_OK). */
    trill_status (*next)(void *ctx, rl_rollout **out);
    /* Have batch `index` generated again, with newer weights (NULL: never asked, the bound is never passed). */
    trill_status (*regenerate)(void *ctx, int64_t index);
    /* The rewards of the batch about to be trained (NULL: next's batches come scored). */
    trill_status (*score)(void *ctx, rl_rollout *ro);
    /* The run's phase before the update (may be NULL; the transport sets the others itself). */
    void (*phase)(void *ctx, trill_run_phase phase);
    /* How the new weights reach the generator after an update. */
    rl_publish_fn publish;
    /* After the update, before the step's metrics line (may be NULL): the placement's figures,
     * an evaluation when due. */
    trill_status (*after_train)(void *ctx, trill_rl_metrics *m);
} rl_sched_transport;

typedef struct rl_sched {
    const trill_rl_config *c;
    bool async;                   /* the step's metrics carry the async figures (batch, staleness, waits) */
    int bound;                    /* the largest lag trained: async.max_staleness, sync mode's 0 (replay: none) */
    trill_stale_policy on_stale;  /* sync mode: wait (a lag is an error) */
    int64_t k0;                   /* the first batch of this run */
    uint32_t v0;                  /* the policy version at its start */
    int64_t want;                 /* the batch being regenerated (-1: none) */
    long dropped, regenerated;
    rl_rollout **held;            /* received while a regenerated batch is awaited */
    int n_held, cap_held;
    double step_wait;             /* seconds waited for batches in this step */
    double last;                  /* the end of the previous step (async: the first one's start) */
    double trainer_wait, train_busy; /* the run's: seconds waited for batches, seconds training */
} rl_sched;

/* The policy for run r from its current state (data position and version): async mode's by
 * its async.* keys; sync mode's trains each batch at the version it was generated with (lag 0),
 * a replayed one at whatever version it was recorded with. */
void rl_sched_init(rl_sched *s, const rl_run *r);
/* Frees the batches held. */
void rl_sched_free(rl_sched *s);

/* The version batch k's generation must start from under async.on_stale "wait"; INT64_MIN under
 * "drop" and "regenerate", which do not hold the generator back. */
int64_t rl_sched_gate(const rl_sched *s, int64_t k);

/* One step: the next batch within the bound (rank 0's, shared with the other trainer ranks when
 * the transport says so), its rewards, the update and its publication, the transport's figures,
 * then the step's metrics line and checkpoint (trill_rl_finish_step). */
trill_status rl_sched_step(rl_sched *s, rl_run *r, const rl_sched_transport *t, void *ctx, trill_rl_metrics *m);

/* RUN/async_summary.json: wall_s, the placement's executors' busy seconds (`busy`, taken), the
 * trainer's busy and waiting seconds, the batches dropped and regenerated, then the placement's
 * layout (`layout`, taken). */
trill_status rl_sched_write_summary(const rl_sched *s, double wall, json_t *busy, json_t *layout);

#endif
