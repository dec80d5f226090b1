/* Executors on MPI ranks of their own (parallel.generator.replicas, parallel.scorer): the
 * placement, the controller's side of talking to them, and the loop an executor rank serves.
 *
 * Placement. Ranks [0, T) are the trainer's (T = dp x ep x tp; rank 0 is also the controller),
 * ranks [T, T + R) the generator replicas, and with parallel.scorer the last rank scores. The
 * controller and the replicas form the `sync` group (the controller its rank 0).
 *
 * Protocol, sync mode (every exchange is the controller's initiative, in this order a step):
 *   generate  the command (broadcast over sync) with the batch index, then which replica takes
 *             each of its prompts (the fewest pending tokens: (prompt + max_new_tokens) x n);
 *             each replica generates its prompts (request ids by position in the stream, so
 *             sampling does not depend on the replica) and sends back its part as packed rollout
 *             bytes, checked on unpacking; the controller merges the parts in prompt order.
 *   score     with a scorer rank: the packed batch to it, its rewards (and the external process's
 *             metrics) back.
 *   weights   after an update: the command (version, bytes, XXH64), then the adapters' vector or
 *             the merged weights by a non-blocking broadcast over sync (a replica waits for it
 *             between commands; the same call lets a replica test for it between decode steps);
 *             each receiver checks the checksum, applies the weights and answers with its
 *             receive and apply times, or refuses a corrupted transfer by name.
 *   evaluate  replica 0 runs the held-out evaluation and sends its result.
 *   stop      at the end of the run (or when it fails): the executors leave their loops.
 * A replica's failure is its answer (status and message), which the controller reports with the
 * replica's rank; a rank that dies takes the job down (mpirun ends the others and names it). */
#ifndef TRILL_RL_RANKS_H
#define TRILL_RL_RANKS_H

#include "run.h"

typedef enum rl_role { RL_ROLE_TRAINER, RL_ROLE_GENERATOR, RL_ROLE_SCORER } rl_role;

/* This rank's role under c's placement (*replica: its index among the generator replicas). */
rl_role trill_rl_role(const trill_rl_config *c, int rank, int *replica);

/* Collective over the job: r->world becomes the trainer ranks' group (on every rank; an executor
 * rank's own group of executors is unused) and, with executors on ranks of their own, r->remote
 * the controller's link to them. */
trill_status trill_rl_ranks_create(rl_run *r, trill_comm *job);
/* Ends the executors' loops (the controller; once) and frees the groups. */
void trill_rl_ranks_free(rl_run *r);
/* Whether this rank runs an executor for the controller (not the trainer). */
bool trill_rl_ranks_executor(const rl_run *r);
/* Whether the generator runs on ranks of its own (then only the controller talks to it). */
bool trill_rl_ranks_remote_generator(const rl_run *r);

/* The controller's side (rank 0). */
trill_status trill_rl_remote_generate(rl_run *r, int64_t index, rl_rollout *ro);
trill_status trill_rl_remote_score(rl_run *r, rl_rollout *ro);
/* rl_publish_fn: the trainer's weights to every replica; the transfer's figures go to the next
 * trill_rl_remote_transfer_metrics. */
trill_status trill_rl_publish_remote(rl_run *r, void *ctx, double *ms, size_t *bytes);
void trill_rl_remote_transfer_metrics(const rl_run *r, trill_rl_metrics *m);
trill_status trill_rl_remote_evaluate(rl_run *r, trill_eval_result *out);
/* The executors leave their loops (sent once; later calls do nothing). */
void trill_rl_remote_stop(rl_run *r);

/* Rank 0 has the step's batch: every trainer rank gets it (with its rewards, the external
 * metrics and the generation figures); st is rank 0's status so far, which the others return as
 * theirs (a failed step fails on every rank). Collective over r->world. */
trill_status trill_rl_share_batch(rl_run *r, rl_rollout *ro, trill_status st);

/* An executor rank's executor, after the inputs are loaded: a replica's engine (for the base
 * model, loaded for it; its weights come from the controller) or the scorer. */
trill_status trill_rl_make_executor(rl_run *r);
/* An executor rank: serves the controller until it says stop. */
trill_status trill_rl_serve_executor(rl_run *r);

#endif
