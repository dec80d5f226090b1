/* One RL run: the executors it owns, the state the controller keeps, and the stages of a step —
 * the executors' work (exec/exec.h) and the trainer's, called by the one scheduler
 * (sched/sched.h) through the transports that carry them (transport/transport.h).
 *
 * Who owns what. The run (controller.c) creates and frees everything here. The generator
 * executor (generator.h) is used by one thread at a time: the controller's in sync mode, the
 * generator thread's in async mode. The scorer (scorer.h) likewise: the controller's or the
 * reward thread's (or the trainer's: async.reward "trainer"). The trainer (trainer.h), `state`,
 * the metrics file and checkpoints belong to the controller's thread in both modes. The datasets,
 * tokenizer and config are read-only once the run starts; in async mode every other exchange goes
 * through the thread transport's queues (rollouts) and the weight channel (versions). */
#ifndef TRILL_RL_RUN_H
#define TRILL_RL_RUN_H

#include <jansson.h>
#include <stdio.h>
#include <sys/resource.h>

#include "rl/run/checkpoint.h"
#include "rl/exec/generator.h"
#include "rl/data/rollout.h"
#include "rl/exec/scorer.h"
#include "rl/exec/trainer.h"
#include "trill/dist.h"
#include "trill/chat.h"
#include "trill/dataset.h"
#include "trill/run_config.h"
#include "trill/rl_metrics.h"
#include "trill/run.h"

typedef struct rl_remote rl_remote;

typedef struct rl_run {
    const trill_run_config *c;
    char *model_dir, *train_path, *eval_path;
    trill_tokenizer *tok;
    trill_chat_template *chat;
    const trill_chat_template *env_chat; /* the episodes' renderer (env.render): chat, or NULL for plain */
    trill_dataset *train, *eval;
    trill_trainer *trainer;
    rl_generator *gen;
    rl_scorer *scorer;            /* NULL when replaying recorded rollouts */
    rl_state state;
    rl_identity base;             /* the base model's identity, recorded in every checkpoint */
    int lock_fd;                  /* run_dir/.lock, held (flock) for the run */
    int saved_step;               /* the step of the newest checkpoint written by this run */
    FILE *metrics;
    FILE *evals;                  /* RUN/eval.jsonl: every held-out evaluation (rank 0) */
    struct rusage usage;          /* the process's at the end of the previous step (or at the metrics' opening) */
    double gen_s, train_s;        /* the run's totals, for its summary */
    long gen_tokens, train_tokens;
    /* data parallelism (parallel.trainer.dp): every trainer rank runs the loop and holds the same
     * state; rank 0 alone writes the run folder (lock, config, metrics, checkpoints, rollouts) */
    trill_comm *world;            /* NULL: one process */
    int rank;                     /* in the job */
    /* executors on ranks of their own (parallel.generator.replicas, parallel.scorer; ranks.h):
     * world is then the trainer ranks' group of the job (NULL on an executor rank) */
    trill_comm *job;
    rl_remote *remote;            /* NULL: every trainer rank runs its executors in-process */
} rl_run;

/* The run's checkpoint of its state now (rank 0 writes it; every rank notes it as saved). */
trill_status trill_rl_save_checkpoint(rl_run *r);

/* One rollout batch on its way through the stages. */
typedef struct rl_rollout {
    int64_t index;                /* batch index: prompts [index * prompts_per_step, ...) of the stream */
    rl_batch b;
    json_t *ext_metrics;          /* the external reward's metrics, summed over the batch */
    double gen_s, reward_s;
    long gen_tokens;
    bool redo;                    /* generated again after the trainer found it too stale */
    /* the step it is trained in (the scheduler's, not owned): the trainer's and the evaluator's
     * figures go there */
    trill_rl_metrics *m;
} rl_rollout;

/* How new weights reach the generator after an update (the scheduler's choice): sync mode calls
 * the generator in the trainer's thread (trill_rl_publish_direct), async mode publishes to the
 * weight channel. *ms and *bytes describe the transfer. */
typedef trill_status (*rl_publish_fn)(rl_run *r, void *ctx, double *ms, size_t *bytes);
trill_status trill_rl_publish_direct(rl_run *r, void *ctx, double *ms, size_t *bytes);

/* stages.c */
trill_status trill_rl_stage_generate(rl_run *r, int64_t index, rl_rollout *ro, trill_status (*between_steps)(void *), void *ctx);
trill_status trill_rl_stage_reward(rl_run *r, rl_rollout *ro);
/* In place of generating and scoring: the batch recorded for the next step (rollouts.replay). */
trill_status trill_rl_stage_replay(rl_run *r, int64_t index, rl_rollout *ro);
/* The trainer's step on the batch, then version + 1 and publish when it updated; fills the
 * batch's, the trainer's, the mismatch, the sync and the time figures of *m. */
trill_status trill_rl_stage_train(rl_run *r, rl_rollout *ro, rl_publish_fn publish, void *ctx, trill_rl_metrics *m, double *train_s,
                                  long *train_tokens);
/* The held-out evaluation after `step` (0: before training; when: "before", "now", "after") on
 * the generator (a replica on a rank of its own: its replica 0, asked by rank 0; the other trainer
 * ranks skip it, NAN), logged and written to RUN/eval.jsonl. */
trill_status trill_rl_stage_evaluate(rl_run *r, int step, const char *when, double *pass1, double *passk);
void trill_rl_rollout_free(rl_rollout *ro);
/* After a trained step: the step counter, its metrics line, the checkpoint when due. */
trill_status trill_rl_finish_step(rl_run *r, const trill_rl_metrics *m);

/* trill_rl_request_stop was called (a signal handler, an embedder): end after the current step. */
bool trill_rl_stop_requested(void);
/* Forgets an earlier request: a run starting now runs until asked again. */
void trill_rl_stop_reset(void);

/* The run's steps (sched/placement.c): the executors placed on the transports the config asks for
 * (inline, threads, ranks) and the one scheduler over them (sched/sched.h), sync mode being its
 * staleness 0. hooks (may be NULL; sync mode's, on the controller's thread): the run handle's
 * phase, set by each executor working on that thread.
 * Each step trains the next batch within the bound on the calling thread (metrics line, progress
 * and checkpoint included). Stop is called once after a start, whatever happened: it stops the
 * executors, writes RUN/async_summary.json in async mode and returns st, or an executor's error.
 * With executors on ranks, step and stop are collective over the trainer ranks. */
typedef struct rl_schedule rl_schedule;
typedef struct rl_step_hooks {
    void (*phase)(void *ctx, trill_run_phase phase);
    void *ctx;
} rl_step_hooks;
trill_status trill_rl_schedule_start(rl_run *r, const rl_step_hooks *hooks, rl_schedule **out);
trill_status trill_rl_schedule_step(rl_schedule *y, trill_rl_metrics *m);
trill_status trill_rl_schedule_stop(rl_schedule *y, trill_status st);

#endif
