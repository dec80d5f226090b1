/* The one scheduler, for every placement (placement.c: the executors inline, on threads or on
 * ranks, behind their transports' ports): it decides which batch is issued, which trains next and
 * what happens to a stale one; sync mode is its bound 0 with a window of one batch:
 *   - the gate: with async.on_stale "wait", batch k is trained in step s0 + (k - k0) + 1, so it
 *     is issued only once step s0 + (k - k0) - max_staleness has been trained (its weights
 *     published); a step raises the version by one at most (none when nothing trained: dynamic
 *     sampling dropped every group), so no token can be older than the bound; no more than the
 *     window are issued or held at once;
 *   - the next batch: the regenerated batch awaited, else the smallest index received;
 *   - a batch beyond the bound is an error under "wait" (the gate makes it impossible), dropped
 *     under "drop" (its prompts skipped) and generated again under "regenerate" (the batches
 *     received meanwhile are held until it arrives).
 * The trainer's thread owns an rl_sched. */
#ifndef TRILL_RL_SCHED_H
#define TRILL_RL_SCHED_H

#include <stdint.h>

#include "rl/run/run.h"
#include "rl/transport/transport.h"

/* Where the executors run (placement.c): the ports of the generator (or replay) and the reward
 * executor, chained (transport/transport.h), and the trainer's and the evaluator's. */
typedef struct rl_placement {
    rl_port *ports[2];            /* upstream first: the generator's (or the replay's), then the reward's (NULL: none) */
    int n_ports;
    rl_port *trainer;             /* each batch within the bound is issued to it and collected trained */
    rl_port *evaluator;           /* the held-out evaluation every eval.every steps (NULL: none between steps) */
    /* rank 0 gets each batch and shares it with the other trainer ranks (else every rank gets it) */
    bool shared;
    const char *layout;           /* the async summary's words for it: "threads", "generator replicas on ranks" */
    bool pin_trainer;             /* the trainer's steps on trainer_cores */
    rl_cores trainer_cores;
} rl_placement;

typedef struct rl_sched {
    const trill_run_config *c;
    bool async;                   /* the step's metrics carry the async figures (batch, staleness, waits) */
    int bound;                    /* the largest lag trained: async.max_staleness, sync mode's 0 (replay: none) */
    trill_stale_policy on_stale;  /* sync mode: wait (a lag is an error) */
    int64_t k0;                   /* the first batch of this run */
    int s0;                       /* the steps trained at its start */
    int64_t want;                 /* the batch being regenerated (-1: none) */
    int64_t next;                 /* the next new batch to issue */
    int window;                   /* batches issued and not yet trained, at most: sync 1, async async.queue + 1 */
    int in_flight;                /* issued, not yet collected */
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
void trill_rl_sched_init(rl_sched *s, const rl_run *r);
/* Frees the batches held. */
void trill_rl_sched_free(rl_sched *s);

/* New batches for the generator's port, as far as the gate, the window and the steps left allow. */
trill_status trill_rl_sched_fill(rl_sched *s, const rl_run *r, rl_placement *p);

/* One step: the next batch within the bound (rank 0's, shared with the other trainer ranks when
 * the placement says so), scored on its way through the ports, trained through the trainer's port
 * (the update and its publication to the generator's), then in async mode what the gate now
 * allows is issued; the ports' figures, the evaluation when due, the step's metrics line and
 * checkpoint (trill_rl_finish_step). */
trill_status trill_rl_sched_step(rl_sched *s, rl_run *r, rl_placement *p, trill_rl_metrics *m);

/* RUN/async_summary.json: wall_s, the placement's executors' busy seconds (`busy`, taken), the
 * trainer's busy and waiting seconds, the batches dropped and regenerated, then the placement's
 * layout (`layout`, taken). */
trill_status trill_rl_sched_write_summary(const rl_sched *s, double wall, json_t *busy, json_t *layout);

#endif
