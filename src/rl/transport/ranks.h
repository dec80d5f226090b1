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
 *             (merged weights to an expert-parallel generator: each rank, point to point, only
 *             the tensors it keeps, as its last batch's answer listed them);
 *             each receiver checks the checksum, applies the weights and answers with its
 *             receive and apply times, or refuses a corrupted transfer by name.
 *   evaluate  replica 0 runs the held-out evaluation and sends its result.
 *   stop      at the end of the run (or when it fails): the executors leave their loops.
 * Asynchronous mode (ranks_port.c under the scheduler) sends the same commands ahead of need: batches are issued
 * within the staleness bound, weights go out without waiting for answers (each batch's answer
 * carries the replica's newest weights' figures), and `drain` ends the run's generation.
 * A replica's failure is its answer (status and message), which the controller reports with the
 * replica's rank; a rank that dies takes the job down (mpirun ends the others and names it). */
#ifndef TRILL_RL_RANKS_H
#define TRILL_RL_RANKS_H

#include "rl/run/run.h"

typedef enum rl_role { RL_ROLE_TRAINER, RL_ROLE_GENERATOR, RL_ROLE_SCORER } rl_role;

/* This rank's role under c's placement (*replica: its index among the generator replicas). */
rl_role trill_rl_role(const trill_run_config *c, int rank, int *replica);

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

/* ---- the protocol (ranks.c: placement, the controller's sync requests, the scorer; replica.c:
 * a generator replica's loop; ranks_port.c: the controller's port to the replicas) ---- */

enum { CMD_GENERATE = 1, CMD_WEIGHTS, CMD_EVAL, CMD_SCORE, CMD_DRAIN, CMD_STOP };
enum { TAG_REPLY = 7101, TAG_SCORE = 7102, TAG_SCORE_REPLY = 7103, TAG_WEIGHTS = 7104 };
/* What an answer answers: a batch's part, a weight version's arrival, an evaluation, the end of
 * an asynchronous run (every batch before it sent). */
enum { REPLY_BATCH = 1, REPLY_ACK, REPLY_EVAL, REPLY_DRAINED, REPLY_SCORES };
enum { MAX_REPLICAS = 64 }; /* trill_rl_metrics.receivers */

/* A command from the controller (broadcast over sync; sent to the scorer). */
typedef struct rl_cmd {
    int32_t op, merge;      /* merge: CMD_WEIGHTS carries merged weights, not adapters */
    uint32_t version;
    int32_t ack;            /* CMD_WEIGHTS: answer on arrival (sync mode); else the figures ride on the next batch */
    int64_t index;
    uint64_t bytes, checksum;
    /* CMD_WEIGHTS of merged weights to expert-parallel replicas: each generator rank is sent, point
     * to point, the tensors it keeps (every non-expert one and its experts), not the broadcast */
    int32_t partial, pad;
} rl_cmd;

/* An executor's answer: a status (its message as the payload when not TRILL_OK), then payload
 * bytes. Weight figures: the newest version the replica applied and what its transfer took. */
typedef struct rl_reply {
    int32_t status, kind;
    uint64_t bytes;
    int64_t index, tokens;
    double receive_ms, apply_ms, busy_s;
    uint64_t applied;       /* the bytes the engine converted */
    uint32_t version, pad;
    uint64_t held_bytes;    /* a batch's answer from an expert-parallel rank: its last held_bytes bytes are
                               the experts it keeps ([n_moe_layers][num_experts] bytes) */
} rl_reply;

struct rl_remote {
    trill_comm *group;      /* this rank's: the trainer ranks', or the executor ranks' (unused) */
    trill_comm *replicas_comm; /* the controller and the replicas (NULL elsewhere) */
    rl_role role;
    /* replicas: the generator ranks (each answers for its own share of the prompts; an
     * expert-parallel replica is ep of them, replica index j / ep); replica: this rank's j */
    int replica, replicas, ep, trainer_ranks, scorer_rank; /* scorer_rank -1: none */
    trill_comm *experts;    /* a generator rank's expert-parallel replica (parallel.generator.ep > 1) */
    bool stopped;
    /* the controller: the last weight transfer */
    int n_receivers;
    size_t transfer_bytes;
    uint64_t checksum;
    int recv_rank[MAX_REPLICAS];
    size_t recv_bytes[MAX_REPLICAS];
    uint8_t *held;          /* [replicas][n_moe_layers * num_experts]: each generator rank's experts, from its last batch */
    bool held_known[MAX_REPLICAS];
    double receive_ms[MAX_REPLICAS], apply_ms[MAX_REPLICAS], busy_s[MAX_REPLICAS];
    size_t applied[MAX_REPLICAS];
    /* a replica: the model its engine came from, and where received weights land */
    trill_model *model, *staging_model;
    trill_lora *staging_lora;
};

/* ranks.c, for the others: a non-blocking broadcast over sync waited for at once (every
 * broadcast over sync is non-blocking on every rank: MPI does not match a blocking broadcast with
 * a non-blocking one, and a replica generating ahead tests for the next command between decode
 * steps); receiving an answer and its payload; the answers of replicas [first, last), each of `kind`,
 * handed to `take` in order (all are read; the first error returned, the replica named). */
trill_status trill_rl_bcast_replicas(rl_remote *x, void *data, size_t bytes);
trill_status trill_rl_recv_reply(trill_comm *c, int from, int tag, const char *who, rl_reply *rep, char **payload);
void trill_rl_replica_name(const rl_remote *x, int j, char *out, size_t size);
trill_status trill_rl_gather_replies(rl_remote *x, int first, int last, int kind, trill_status (*take)(void *, int, const rl_reply *, char *),
                                     void *ctx);
/* The prompts of batch `index` to the replicas (the command and each prompt's replica). */
trill_status trill_rl_issue_batch(rl_run *r, int64_t index, int32_t *owner);
/* Batch `index`'s parts from every replica (each answers its batches in the order they were
 * issued), merged into ro->b (ro->gen_tokens: their tokens); each replica's weight figures noted. */
trill_status trill_rl_collect_batch(rl_run *r, int64_t index, const int32_t *owner, rl_rollout *ro);
/* The trainer's weights now to every replica: the command (ack: each answers on arrival, the
 * first one's engine bytes into *applied) and the non-blocking broadcast, waited for. */
trill_status trill_rl_send_weights(rl_run *r, bool ack, size_t *applied);

/* Whether a generator rank keeping the experts `held` ([n_moe_layers][num_experts], NULL: every
 * one) is sent tensor t in a merged update. */
bool trill_rl_tensor_wanted(const trill_config *c, const trill_param *t, const uint8_t *held);

/* replica.c: a generator replica's loop, in sync and asynchronous runs alike. */
trill_status trill_rl_serve_replica(rl_run *r);

#endif
