/* The communicator layer of the distributed trainer (src/dist): ranks, sub-groups for data,
 * expert and tensor parallelism, the collectives the trainer needs, and a sum whose result does
 * not depend on the number of ranks.
 *
 * Two backends behind one interface: Open MPI, when trill was built with it and the process was
 * started by mpirun or srun (the launcher's environment says so), and a single process, which
 * is every other run: size 1, collectives that copy, nothing to install. A run without mpirun
 * therefore behaves exactly as before the layer existed.
 *
 * Every collective counts, per kind, its calls, the payload bytes this rank sends (a rank's own
 * share, which stays local, is not counted) and the milliseconds it spends in the call, into the
 * communicator's statistics: the figures a step's metrics report as comm_bytes and comm_ms.
 *
 * Errors: a failing MPI call is TRILL_ERR_IO with MPI's message; bad arguments are
 * TRILL_ERR_INVALID. Under Open MPI the default error handler is replaced by one that returns, so
 * a peer that dies makes the survivors' calls fail (or the launcher end the job) instead of hang. */
#ifndef TRILL_DIST_H
#define TRILL_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "trill/error.h"

typedef struct trill_comm trill_comm;

typedef enum trill_comm_kind {
    TRILL_COMM_ALLREDUCE,
    TRILL_COMM_ALLTOALLV,
    TRILL_COMM_BCAST,
    TRILL_COMM_GATHER,    /* gather and allgather(v) */
    TRILL_COMM_P2P,       /* send and receive */
    TRILL_COMM_BARRIER,
    TRILL_COMM_COUNTS,    /* the count exchange before an all-to-all-v */
    TRILL_COMM_KINDS
} trill_comm_kind;

const char *trill_comm_kind_name(trill_comm_kind k); /* "allreduce", "alltoallv", ..., "counts" */

typedef struct trill_comm_stats {
    uint64_t calls[TRILL_COMM_KINDS];
    uint64_t bytes[TRILL_COMM_KINDS]; /* sent by this rank */
    double ms[TRILL_COMM_KINDS];
} trill_comm_stats;

/* The world: MPI's when launched by mpirun/srun and built with MPI (MPI_Init_thread with
 * MPI_THREAD_FUNNELED: collectives are called from one thread), else a single process. With
 * force_single the world is a single process whatever the environment. Once per process. */
trill_status trill_dist_init(int *argc, char ***argv, int force_single, trill_comm **world);
/* Ends the world (MPI_Finalize) after its sub-groups were freed. */
void trill_dist_finalize(trill_comm *world);

int trill_comm_rank(const trill_comm *c);
int trill_comm_size(const trill_comm *c);
const char *trill_comm_backend(const trill_comm *c); /* "mpi" or "single" */
/* Whether this build can run on MPI at all. */
int trill_dist_have_mpi(void);

/* Sub-groups: the ranks of c with the same color form one communicator, ordered by (key, rank).
 * Collective over c. Each sub-group has statistics of its own. */
trill_status trill_comm_split(trill_comm *c, int color, int key, trill_comm **out);
/* A sub-group (not the world). */
void trill_comm_free(trill_comm *c);

/* data[n] = its sum over the ranks, in place. The order MPI adds in depends on the rank count
 * (and the library): use trill_tree_sum where the result must not. */
trill_status trill_comm_allreduce_f32(trill_comm *c, float *data, size_t n);
trill_status trill_comm_allreduce_f64(trill_comm *c, double *data, size_t n);
/* The sum over the ranks added in rank order, so every rank gets the same bits (MPI's all-reduce
 * may add in another order on each rank): what tensor parallelism's replicated activations need.
 * An allgather: (size - 1) * n values received a rank. Counted as TRILL_COMM_ALLREDUCE. */
trill_status trill_comm_allreduce_ordered_f32(trill_comm *c, float *data, size_t n);
trill_status trill_comm_allreduce_ordered_f64(trill_comm *c, double *data, size_t n);
/* max over the ranks of v (e.g. peak memory), into *out. */
trill_status trill_comm_allreduce_max_u64(trill_comm *c, uint64_t v, uint64_t *out);
/* Every rank's status agreed (an all-reduce, so also a barrier): a rank that failed alone (rank 0
 * on a run folder in use, say) fails the others here, "another rank of the job failed while
 * <what> (its message says why)", instead of leaving them at a collective it never reaches.
 * c NULL or of one rank: st. */
trill_status trill_comm_agree(trill_comm *c, trill_status st, const char *what);
/* root's bytes[n] to every rank. */
trill_status trill_comm_bcast(trill_comm *c, void *data, size_t bytes, int root);
/* The same broadcast without blocking: it proceeds while the caller works (a generator between
 * decode steps) and completes in trill_comm_wait, or when trill_comm_test says so; data must stay
 * untouched until then. One request a call (NULL on the single-process backend or with one
 * rank: nothing to move). Counted as TRILL_COMM_BCAST when it completes, its milliseconds those
 * of the wait or the successful test. Every rank of c starts the same broadcasts in the same
 * order. */
typedef struct trill_comm_request trill_comm_request;
trill_status trill_comm_ibcast(trill_comm *c, void *data, size_t bytes, int root, trill_comm_request **req);
/* trill_comm_send without blocking (the receiver takes it with trill_comm_recv); data must stay
 * untouched until the request completes. Counted as TRILL_COMM_P2P when it does. */
trill_status trill_comm_isend(trill_comm *c, const void *data, size_t bytes, int peer, int tag, trill_comm_request **req);
/* Waits for req to complete and frees it (NULL: nothing to wait for). */
trill_status trill_comm_wait(trill_comm_request *req);
/* *done: whether req completed (it is then freed and must not be used again). A request that
 * fails is freed too. */
trill_status trill_comm_test(trill_comm_request *req, int *done);
/* Every rank's `bytes` bytes, in rank order, into recv (size × bytes) on every rank. */
trill_status trill_comm_allgather(trill_comm *c, const void *send, size_t bytes, void *recv);
/* Rank r's counts[r] bytes, in rank order, packed into recv on every rank (counts known to all). */
trill_status trill_comm_allgatherv(trill_comm *c, const void *send, const size_t *counts, void *recv);
/* Every rank's send_bytes[p] bytes (packed in peer order in send) to peer p, which receives them
 * packed in sender order in recv, recv_bytes[p] from sender p. Counts must agree pairwise (the
 * caller exchanges them first, e.g. with trill_comm_alltoall_counts). */
trill_status trill_comm_alltoallv(trill_comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes);
/* The count exchange before an all-to-all-v, k counts per peer: recv_counts[p k .. p k + k) =
 * peer p's send_counts[this rank's k]. Counted as TRILL_COMM_COUNTS, so the all-to-all-v's own
 * bytes are its payload alone. */
trill_status trill_comm_alltoall_counts(trill_comm *c, int k, const size_t *send_counts, size_t *recv_counts);
/* Point to point (blocking). */
trill_status trill_comm_send(trill_comm *c, const void *data, size_t bytes, int peer, int tag);
trill_status trill_comm_recv(trill_comm *c, void *data, size_t bytes, int peer, int tag);
trill_status trill_comm_barrier(trill_comm *c);

/* The statistics since the last reset (this communicator's own calls). */
trill_comm_stats trill_comm_stats_get(const trill_comm *c);
void trill_comm_stats_reset(trill_comm *c);

/* ---- a sum independent of the rank count ----
 *
 * The sum of `total` vectors of n floats ("leaves": one per micro-batch, say) defined as one
 * fixed binary tree over the leaf indices: [0, total) is cut into its maximal aligned blocks
 * [a, a + 2^k) (the binary digits of total, largest first); a block is the sum of its two halves,
 * left + right, down to the leaves; the blocks are added left to right. Each rank adds the
 * leaves of its own contiguous range [first, first + count) in order; the subtrees that lie
 * wholly in it are summed locally (at most 2 log2(total) + 1 partial sums kept), the partial sums
 * of every rank are gathered, and every rank completes the same tree from them. So 1, 2 or 4
 * ranks, however the leaves are split, give the same bits (a rank may hold no leaf). Cost: the
 * partials' bytes gathered to every rank (O(log total) vectors a rank) instead of a ring
 * all-reduce's 2 n floats, and up to log2(total) + 1 vectors of memory a rank. */
typedef struct trill_tree_sum trill_tree_sum;

trill_status trill_tree_sum_create(size_t n, int64_t total, int64_t first, int64_t count, trill_tree_sum **out);
/* The next leaf of this rank's range (copied). */
trill_status trill_tree_sum_add(trill_tree_sum *t, const float *leaf);
/* out[n] = the tree's sum over every rank's leaves; collective over c (every rank's ranges
 * together must cover [0, total) once, each rank having added all its leaves). c NULL: this
 * rank holds every leaf. */
trill_status trill_tree_sum_finish(trill_tree_sum *t, trill_comm *c, float *out);
/* The same over several trees of one sum on this rank, each holding its own contiguous range of
 * leaves (an expert's owner holds the gradient leaves of every rank that sent it tokens): their
 * partials together with every other rank's complete the tree. All n must agree. */
trill_status trill_tree_sum_finish_many(trill_tree_sum *const *trees, int n_trees, trill_comm *c, float *out);
void trill_tree_sum_free(trill_tree_sum *t);

#endif
