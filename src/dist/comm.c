/* The communicator (trill/dist.h): the single-process backend, the Open MPI one (built when CMake
 * finds MPI: TRILL_HAVE_MPI), and the statistics both keep. */
#include "trill/dist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "trill/timing.h"

#ifdef TRILL_HAVE_MPI
#include <mpi.h>
#endif

_Static_assert(sizeof(size_t) == sizeof(uint64_t), "counts travel as MPI_UINT64_T");

struct trill_comm {
    int rank, size;
    int mpi;      /* 1: MPI backend */
    int world;    /* 1: the world (finalized by trill_dist_finalize, never freed alone) */
#ifdef TRILL_HAVE_MPI
    MPI_Comm comm;
#endif
    trill_comm_stats stats;
};

const char *trill_comm_kind_name(trill_comm_kind k) {
    static const char *names[TRILL_COMM_KINDS] = { "allreduce", "alltoallv", "bcast", "gather", "p2p", "barrier", "counts" };
    return k >= 0 && k < TRILL_COMM_KINDS ? names[k] : "?";
}

int trill_dist_have_mpi(void) {
#ifdef TRILL_HAVE_MPI
    return 1;
#else
    return 0;
#endif
}

int trill_comm_rank(const trill_comm *c) { return c->rank; }
int trill_comm_size(const trill_comm *c) { return c->size; }
const char *trill_comm_backend(const trill_comm *c) { return c->mpi ? "mpi" : "single"; }
trill_comm_stats trill_comm_stats_get(const trill_comm *c) { return c->stats; }
void trill_comm_stats_reset(trill_comm *c) { memset(&c->stats, 0, sizeof c->stats); }

static void count(trill_comm *c, trill_comm_kind k, uint64_t bytes, double t0) {
    c->stats.calls[k]++;
    c->stats.bytes[k] += bytes;
    c->stats.ms[k] += (trill_now() - t0) * 1e3;
}

/* Launched by mpirun (Open MPI), or srun / another PMI launcher. */
static int launched_by_mpi(void) {
    static const char *vars[] = { "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK" };
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

#ifdef TRILL_HAVE_MPI
static trill_status mpi_error(int code, const char *what) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = snprintf(text, sizeof text, "error %d", code);
    return trill_error(TRILL_ERR_IO, "MPI %s: %.*s", what, len, text);
}
#define MPI_CHECK(call, what)                        \
    do {                                             \
        int mpi_rc_ = (call);                        \
        if (mpi_rc_ != MPI_SUCCESS) return mpi_error(mpi_rc_, what); \
    } while (0)

/* MPI counts are ints: larger payloads go in chunks of this many elements. */
enum { CHUNK = 1 << 30 };
#endif

trill_status trill_dist_init(int *argc, char ***argv, int force_single, trill_comm **world) {
    trill_comm *c = trill_calloc(1, sizeof *c);
    if (!c) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    c->size = 1;
    c->world = 1;
    if (!force_single && launched_by_mpi()) {
#ifdef TRILL_HAVE_MPI
        int provided = 0;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            free(c);
            return trill_error(TRILL_ERR_IO, "MPI_Init_thread failed (error %d)", rc);
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        if (provided < MPI_THREAD_FUNNELED) {
            MPI_Finalize();
            free(c);
            return trill_error(TRILL_ERR_UNSUPPORTED, "MPI provides thread level %d, trill needs MPI_THREAD_FUNNELED", provided);
        }
        c->mpi = 1;
        c->comm = MPI_COMM_WORLD;
        MPI_Comm_rank(c->comm, &c->rank);
        MPI_Comm_size(c->comm, &c->size);
#else
        free(c);
        return trill_error(TRILL_ERR_UNSUPPORTED, "this process was started by an MPI launcher, but trill was built without MPI "
                                                  "(install libopenmpi-dev and rebuild)");
#endif
    }
    (void)argc;
    (void)argv;
    *world = c;
    return TRILL_OK;
}

void trill_dist_finalize(trill_comm *world) {
    if (!world) return;
#ifdef TRILL_HAVE_MPI
    if (world->mpi) MPI_Finalize();
#endif
    free(world);
}

trill_status trill_comm_split(trill_comm *c, int color, int key, trill_comm **out) {
    trill_comm *s = trill_calloc(1, sizeof *s);
    if (!s) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    s->size = 1;
#ifdef TRILL_HAVE_MPI
    if (c->mpi) {
        const double t0 = trill_now();
        int rc = MPI_Comm_split(c->comm, color, key, &s->comm);
        count(c, TRILL_COMM_BARRIER, 0, t0);
        if (rc != MPI_SUCCESS) {
            free(s);
            return mpi_error(rc, "MPI_Comm_split");
        }
        MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
        s->mpi = 1;
        MPI_Comm_rank(s->comm, &s->rank);
        MPI_Comm_size(s->comm, &s->size);
    }
#else
    (void)c;
#endif
    (void)color;
    (void)key;
    *out = s;
    return TRILL_OK;
}

void trill_comm_free(trill_comm *c) {
    if (!c || c->world) return;
#ifdef TRILL_HAVE_MPI
    if (c->mpi) MPI_Comm_free(&c->comm);
#endif
    free(c);
}

#ifdef TRILL_HAVE_MPI
static trill_status allreduce(trill_comm *c, void *data, size_t n, size_t elem, MPI_Datatype type, MPI_Op op) {
    for (size_t at = 0; at < n; at += CHUNK) {
        const size_t k = n - at < CHUNK ? n - at : CHUNK;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, (char *)data + at * elem, (int)k, type, op, c->comm), "MPI_Allreduce");
    }
    return TRILL_OK;
}
#endif

/* The sum over the ranks of n floats (f64: doubles) in place. */
static trill_status allreduce_sum(trill_comm *c, void *data, size_t n, int f64) {
    const double t0 = trill_now();
    const size_t elem = f64 ? sizeof(double) : sizeof(float);
    trill_status st = TRILL_OK;
#ifdef TRILL_HAVE_MPI
    if (c->mpi && c->size > 1) st = allreduce(c, data, n, elem, f64 ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM);
#endif
    (void)data;
    count(c, TRILL_COMM_ALLREDUCE, c->size > 1 ? n * elem : 0, t0);
    return st;
}

trill_status trill_comm_allreduce_f32(trill_comm *c, float *data, size_t n) { return allreduce_sum(c, data, n, 0); }
trill_status trill_comm_allreduce_f64(trill_comm *c, double *data, size_t n) { return allreduce_sum(c, data, n, 1); }

/* The allgather, then each rank adds the ranks' values in rank order. */
static trill_status allreduce_ordered(trill_comm *c, void *data, size_t n, int f64) {
    if (c->size == 1) return TRILL_OK;
    const size_t elem = f64 ? sizeof(double) : sizeof(float), bytes = n * elem;
    char *all = trill_malloc(bytes * (size_t)c->size + 1);
    if (!all) return trill_error(TRILL_ERR_NOMEM, "out of memory for an ordered all-reduce of %zu values over %d ranks", n, c->size);
    const double t0 = trill_now();
    trill_status st = TRILL_OK;
#ifdef TRILL_HAVE_MPI
    for (size_t at = 0; !st && at < bytes; at += CHUNK) { /* in pieces under MPI's int counts */
        const size_t k = bytes - at < CHUNK ? bytes - at : CHUNK;
        char *piece = trill_malloc(k * (size_t)c->size);
        if (!piece) {
            st = trill_error(TRILL_ERR_NOMEM, "out of memory");
            break;
        }
        const int rc = MPI_Allgather((char *)data + at, (int)k, MPI_BYTE, piece, (int)k, MPI_BYTE, c->comm);
        if (rc != MPI_SUCCESS) st = mpi_error(rc, "MPI_Allgather");
        for (int r = 0; !st && r < c->size; r++) memcpy(all + (size_t)r * bytes + at, piece + (size_t)r * k, k);
        free(piece);
    }
#endif
    for (size_t i = 0; !st && i < n; i++) {
        if (f64) {
            double v = 0;
            for (int r = 0; r < c->size; r++) v += ((const double *)(const void *)(all + (size_t)r * bytes))[i];
            ((double *)data)[i] = v;
        } else {
            float v = 0;
            for (int r = 0; r < c->size; r++) v += ((const float *)(const void *)(all + (size_t)r * bytes))[i];
            ((float *)data)[i] = v;
        }
    }
    free(all);
    count(c, TRILL_COMM_ALLREDUCE, bytes * (uint64_t)(c->size - 1), t0);
    return st;
}

trill_status trill_comm_allreduce_ordered_f32(trill_comm *c, float *data, size_t n) { return allreduce_ordered(c, data, n, 0); }
trill_status trill_comm_allreduce_ordered_f64(trill_comm *c, double *data, size_t n) { return allreduce_ordered(c, data, n, 1); }

trill_status trill_comm_allreduce_max_u64(trill_comm *c, uint64_t v, uint64_t *out) {
    const double t0 = trill_now();
    *out = v;
    trill_status st = TRILL_OK;
#ifdef TRILL_HAVE_MPI
    if (c->mpi && c->size > 1) st = allreduce(c, out, 1, sizeof(uint64_t), MPI_UINT64_T, MPI_MAX);
#endif
    count(c, TRILL_COMM_ALLREDUCE, c->size > 1 ? sizeof(uint64_t) : 0, t0);
    return st;
}

trill_status trill_comm_agree(trill_comm *c, trill_status st, const char *what) {
    if (!c || c->size == 1) return st;
    uint64_t any = 0;
    const trill_status cst = trill_comm_allreduce_max_u64(c, st != TRILL_OK, &any);
    if (st || cst) return st ? st : cst;
    return any ? trill_error(TRILL_ERR_INVALID, "another rank of the job failed while %s (its message says why)", what) : TRILL_OK;
}

trill_status trill_comm_bcast(trill_comm *c, void *data, size_t bytes, int root) {
    if (root < 0 || root >= c->size) return trill_error(TRILL_ERR_INVALID, "broadcast: root %d of %d ranks", root, c->size);
    const double t0 = trill_now();
#ifdef TRILL_HAVE_MPI
    if (c->mpi && c->size > 1)
        for (size_t at = 0; at < bytes; at += CHUNK) {
            const size_t k = bytes - at < CHUNK ? bytes - at : CHUNK;
            MPI_CHECK(MPI_Bcast((char *)data + at, (int)k, MPI_BYTE, root, c->comm), "MPI_Bcast");
        }
#endif
    (void)data;
    count(c, TRILL_COMM_BCAST, c->rank == root ? bytes * (uint64_t)(c->size - 1) : 0, t0);
    return TRILL_OK;
}

struct trill_comm_request {
    trill_comm *c;
    trill_comm_kind kind;
    uint64_t bytes;      /* counted on completion (a broadcast: the root's bytes times the other ranks) */
    int n;
#ifdef TRILL_HAVE_MPI
    MPI_Request *reqs;   /* one per chunk under MPI's int counts */
#endif
};

trill_status trill_comm_ibcast(trill_comm *c, void *data, size_t bytes, int root, trill_comm_request **req) {
    *req = NULL;
    if (root < 0 || root >= c->size) return trill_error(TRILL_ERR_INVALID, "broadcast: root %d of %d ranks", root, c->size);
    (void)data;
#ifdef TRILL_HAVE_MPI
    if (!c->mpi || c->size == 1) return TRILL_OK;
    const double t0 = trill_now();
    const int chunks = bytes ? (int)((bytes + CHUNK - 1) / CHUNK) : 0;
    trill_comm_request *r = trill_calloc(1, sizeof *r);
    MPI_Request *reqs = r ? trill_malloc(sizeof(MPI_Request) * (size_t)(chunks + 1)) : NULL;
    if (!reqs) {
        free(r);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for a broadcast request");
    }
    *r = (trill_comm_request){ .c = c, .kind = TRILL_COMM_BCAST, .bytes = c->rank == root ? bytes * (uint64_t)(c->size - 1) : 0, .reqs = reqs };
    for (size_t at = 0; at < bytes; at += CHUNK, r->n++) {
        const size_t k = bytes - at < CHUNK ? bytes - at : CHUNK;
        const int rc = MPI_Ibcast((char *)data + at, (int)k, MPI_BYTE, root, c->comm, &reqs[r->n]);
        if (rc != MPI_SUCCESS) {
            MPI_Waitall(r->n, reqs, MPI_STATUSES_IGNORE);
            free(reqs);
            free(r);
            return mpi_error(rc, "MPI_Ibcast");
        }
    }
    c->stats.ms[TRILL_COMM_BCAST] += (trill_now() - t0) * 1e3;
    *req = r;
#else
    (void)c;
    (void)bytes;
#endif
    return TRILL_OK;
}

static trill_status check_peer(const trill_comm *c, int peer, const char *what);

trill_status trill_comm_isend(trill_comm *c, const void *data, size_t bytes, int peer, int tag, trill_comm_request **req) {
    *req = NULL;
    trill_status st = check_peer(c, peer, "send");
    if (st) return st;
    (void)data;
    (void)tag;
#ifdef TRILL_HAVE_MPI
    const int chunks = bytes ? (int)((bytes + CHUNK - 1) / CHUNK) : 1;
    trill_comm_request *r = trill_calloc(1, sizeof *r);
    MPI_Request *reqs = r ? trill_malloc(sizeof(MPI_Request) * (size_t)chunks) : NULL;
    if (!reqs) {
        free(r);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for a send request");
    }
    *r = (trill_comm_request){ .c = c, .kind = TRILL_COMM_P2P, .bytes = bytes, .reqs = reqs };
    size_t at = 0;
    do { /* as trill_comm_send: an empty message is one message too */
        const size_t k = bytes - at < CHUNK ? bytes - at : CHUNK;
        const int rc = MPI_Isend((const char *)data + at, (int)k, MPI_BYTE, peer, tag, c->comm, &reqs[r->n]);
        if (rc != MPI_SUCCESS) {
            MPI_Waitall(r->n, reqs, MPI_STATUSES_IGNORE);
            free(reqs);
            free(r);
            return mpi_error(rc, "MPI_Isend");
        }
        r->n++;
        at += k;
    } while (at < bytes);
    *req = r;
#else
    (void)bytes;
#endif
    return TRILL_OK;
}

static void request_done(trill_comm_request *r, double t0) {
    count(r->c, r->kind, r->bytes, t0);
#ifdef TRILL_HAVE_MPI
    free(r->reqs);
#endif
    free(r);
}

trill_status trill_comm_wait(trill_comm_request *r) {
    if (!r) return TRILL_OK;
    const double t0 = trill_now();
    trill_status st = TRILL_OK;
#ifdef TRILL_HAVE_MPI
    const int rc = MPI_Waitall(r->n, r->reqs, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) st = mpi_error(rc, "MPI_Waitall (a broadcast)");
#endif
    request_done(r, t0);
    return st;
}

trill_status trill_comm_test(trill_comm_request *r, int *done) {
    *done = 1;
    if (!r) return TRILL_OK;
    const double t0 = trill_now();
#ifdef TRILL_HAVE_MPI
    const int rc = MPI_Testall(r->n, r->reqs, done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        request_done(r, t0);
        return mpi_error(rc, "MPI_Testall (a broadcast)");
    }
#endif
    if (*done) request_done(r, t0);
    return TRILL_OK;
}

/* Byte counts and displacements as MPI's ints, or a refusal naming the payload. */
static trill_status int_counts(const size_t *bytes, int n, int *counts, int *displs, const char *what) {
    size_t at = 0;
    for (int p = 0; p < n; p++) {
        if (bytes[p] > INT_MAX || at > INT_MAX)
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: %zu bytes at offset %zu for rank %d: over MPI's 2 GiB per call", what, bytes[p], at, p);
        counts[p] = (int)bytes[p];
        displs[p] = (int)at;
        at += bytes[p];
    }
    return TRILL_OK;
}

trill_status trill_comm_allgather(trill_comm *c, const void *send, size_t bytes, void *recv) {
    const double t0 = trill_now();
    if (c->size == 1 || !c->mpi) {
        memmove(recv, send, bytes);
    } else {
#ifdef TRILL_HAVE_MPI
        if (bytes > INT_MAX) return trill_error(TRILL_ERR_UNSUPPORTED, "allgather: %zu bytes a rank: over MPI's 2 GiB per call", bytes);
        MPI_CHECK(MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->comm), "MPI_Allgather");
#endif
    }
    count(c, TRILL_COMM_GATHER, bytes * (uint64_t)(c->size - 1), t0);
    return TRILL_OK;
}

trill_status trill_comm_allgatherv(trill_comm *c, const void *send, const size_t *counts, void *recv) {
    const double t0 = trill_now();
    if (c->size == 1 || !c->mpi) {
        memmove(recv, send, counts[0]);
    } else {
#ifdef TRILL_HAVE_MPI
        int *n = trill_malloc(sizeof(int) * 2 * (size_t)c->size);
        if (!n) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        trill_status st = int_counts(counts, c->size, n, n + c->size, "allgatherv");
        int rc = st ? MPI_SUCCESS : MPI_Allgatherv(send, n[c->rank], MPI_BYTE, recv, n, n + c->size, MPI_BYTE, c->comm);
        free(n);
        if (st) return st;
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Allgatherv");
#endif
    }
    count(c, TRILL_COMM_GATHER, counts[c->rank] * (uint64_t)(c->size - 1), t0);
    return TRILL_OK;
}

trill_status trill_comm_alltoall_counts(trill_comm *c, int k, const size_t *send_counts, size_t *recv_counts) {
    if (k < 1) return trill_error(TRILL_ERR_INVALID, "alltoall counts: %d counts per peer", k);
    const double t0 = trill_now();
    if (c->size == 1 || !c->mpi) {
        memmove(recv_counts, send_counts, sizeof(size_t) * (size_t)k);
    } else {
#ifdef TRILL_HAVE_MPI
        MPI_CHECK(MPI_Alltoall(send_counts, k, MPI_UINT64_T, recv_counts, k, MPI_UINT64_T, c->comm), "MPI_Alltoall");
#endif
    }
    count(c, TRILL_COMM_COUNTS, sizeof(size_t) * (uint64_t)k * (uint64_t)(c->size - 1), t0);
    return TRILL_OK;
}

trill_status trill_comm_alltoallv(trill_comm *c, const void *send, const size_t *send_bytes, void *recv, const size_t *recv_bytes) {
    const double t0 = trill_now();
    uint64_t sent = 0;
    for (int p = 0; p < c->size; p++) sent += p == c->rank ? 0 : send_bytes[p];
    if (c->size == 1 || !c->mpi) {
        if (send_bytes[0] != recv_bytes[0])
            return trill_error(TRILL_ERR_INVALID, "alltoallv: %zu bytes sent to itself but %zu expected", send_bytes[0], recv_bytes[0]);
        memmove(recv, send, send_bytes[0]);
    } else {
#ifdef TRILL_HAVE_MPI
        int *n = trill_malloc(sizeof(int) * 4 * (size_t)c->size);
        if (!n) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        trill_status st = int_counts(send_bytes, c->size, n, n + c->size, "alltoallv (send)");
        if (!st) st = int_counts(recv_bytes, c->size, n + 2 * c->size, n + 3 * c->size, "alltoallv (receive)");
        int rc = st ? MPI_SUCCESS
                    : MPI_Alltoallv(send, n, n + c->size, MPI_BYTE, recv, n + 2 * c->size, n + 3 * c->size, MPI_BYTE, c->comm);
        free(n);
        if (st) return st;
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Alltoallv");
#endif
    }
    count(c, TRILL_COMM_ALLTOALLV, sent, t0);
    return TRILL_OK;
}

static trill_status check_peer(const trill_comm *c, int peer, const char *what) {
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return trill_error(TRILL_ERR_INVALID, "%s: peer %d is not another rank of %d", what, peer, c->size);
    return TRILL_OK;
}

trill_status trill_comm_send(trill_comm *c, const void *data, size_t bytes, int peer, int tag) {
    trill_status st = check_peer(c, peer, "send");
    if (st) return st;
    const double t0 = trill_now();
#ifdef TRILL_HAVE_MPI
    for (size_t at = 0; at < bytes || at == 0; at += CHUNK) {
        const size_t k = bytes - at < CHUNK ? bytes - at : CHUNK;
        MPI_CHECK(MPI_Send((const char *)data + at, (int)k, MPI_BYTE, peer, tag, c->comm), "MPI_Send");
        if (k == 0) break;
    }
#else
    (void)data;
    (void)tag;
#endif
    count(c, TRILL_COMM_P2P, bytes, t0);
    return TRILL_OK;
}

trill_status trill_comm_recv(trill_comm *c, void *data, size_t bytes, int peer, int tag) {
    trill_status st = check_peer(c, peer, "receive");
    if (st) return st;
    const double t0 = trill_now();
#ifdef TRILL_HAVE_MPI
    for (size_t at = 0; at < bytes || at == 0; at += CHUNK) {
        const size_t k = bytes - at < CHUNK ? bytes - at : CHUNK;
        MPI_Status status;
        MPI_CHECK(MPI_Recv((char *)data + at, (int)k, MPI_BYTE, peer, tag, c->comm, &status), "MPI_Recv");
        int got = 0;
        MPI_Get_count(&status, MPI_BYTE, &got);
        if ((size_t)got != k) return trill_error(TRILL_ERR_IO, "receive from rank %d: %d bytes, expected %zu", peer, got, k);
        if (k == 0) break;
    }
#else
    (void)data;
    (void)bytes;
    (void)tag;
#endif
    count(c, TRILL_COMM_P2P, 0, t0);
    return TRILL_OK;
}

trill_status trill_comm_barrier(trill_comm *c) {
    const double t0 = trill_now();
#ifdef TRILL_HAVE_MPI
    if (c->mpi && c->size > 1) MPI_CHECK(MPI_Barrier(c->comm), "MPI_Barrier");
#endif
    count(c, TRILL_COMM_BARRIER, 0, t0);
    return TRILL_OK;
}
