/* The communicator layer (trill/dist.h) on however many ranks it is started with: every
 * collective's results and byte counts, sub-groups, and the rank-count-independent tree sum,
 * whose bits must equal a single process's for every split of the leaves over the ranks.
 * `test_comm [--expect N]`: ctest runs it alone (the single-process backend) and under
 * `mpirun -np 2` and `-np 4` (tests/dist/CMakeLists.txt); --expect fails a run that did not get
 * N ranks (an MPI launch that silently fell back to one process). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_test.h"
#include "trill/rng.h"

static void test_collectives(trill_comm *w) {
    const int r = trill_comm_rank(w), P = trill_comm_size(w);
    /* allreduce: sums of small multiples of 1/2 are exact in any order */
    float f[5];
    double d[5];
    for (int i = 0; i < 5; i++) f[i] = (float)(r + 1) + 0.5f * (float)i, d[i] = 2.0 * r + i;
    trill_comm_stats_reset(w);
    OK(trill_comm_allreduce_f32(w, f, 5));
    OK(trill_comm_allreduce_f64(w, d, 5));
    for (int i = 0; i < 5; i++) {
        CHECK(f[i] == (float)(P * (P + 1) / 2) + 0.5f * (float)(i * P));
        CHECK(d[i] == (double)(P * (P - 1) + i * P));
    }
    trill_comm_stats s = trill_comm_stats_get(w);
    CHECK(s.calls[TRILL_COMM_ALLREDUCE] == 2);
    CHECK(s.bytes[TRILL_COMM_ALLREDUCE] == (P > 1 ? 5 * sizeof(float) + 5 * sizeof(double) : 0));
    /* the ordered sum: the ranks' values added in rank order, the same bits everywhere, whatever
     * the order shows (values of mixed scales) */
    float of[3], want_f[3] = { 0 };
    double od[3], want_d[3] = { 0 };
    for (int i = 0; i < 3; i++) {
        for (int p = 0; p < P; p++) {
            want_f[i] += (float)trill_rng_normal(5, (uint64_t)(p * 3 + i)) * (p % 2 ? 1e6f : 1e-3f);
            want_d[i] += trill_rng_normal(6, (uint64_t)(p * 3 + i)) * (p % 2 ? 1e12 : 1e-6);
        }
        of[i] = (float)trill_rng_normal(5, (uint64_t)(r * 3 + i)) * (r % 2 ? 1e6f : 1e-3f);
        od[i] = trill_rng_normal(6, (uint64_t)(r * 3 + i)) * (r % 2 ? 1e12 : 1e-6);
    }
    trill_comm_stats_reset(w);
    OK(trill_comm_allreduce_ordered_f32(w, of, 3));
    OK(trill_comm_allreduce_ordered_f64(w, od, 3));
    CHECK(!memcmp(of, want_f, sizeof of) && !memcmp(od, want_d, sizeof od));
    s = trill_comm_stats_get(w);
    CHECK(s.calls[TRILL_COMM_ALLREDUCE] == (P > 1 ? 2 : 0) && s.bytes[TRILL_COMM_ALLREDUCE] == (uint64_t)(P - 1) * (3 * sizeof(float) + 3 * sizeof(double)));
    uint64_t mx;
    OK(trill_comm_allreduce_max_u64(w, (uint64_t)(r * 7 + 3), &mx));
    CHECK(mx == (uint64_t)((P - 1) * 7 + 3));
    /* broadcast from the last rank */
    char text[32] = "";
    if (r == P - 1) snprintf(text, sizeof text, "from rank %d", r);
    trill_comm_stats_reset(w);
    OK(trill_comm_bcast(w, text, sizeof text, P - 1));
    char want[32];
    snprintf(want, sizeof want, "from rank %d", P - 1);
    CHECK(strcmp(text, want) == 0);
    CHECK(trill_comm_stats_get(w).bytes[TRILL_COMM_BCAST] == (r == P - 1 ? sizeof text * (uint64_t)(P - 1) : 0));
    CHECK(trill_comm_bcast(w, text, 1, P) == TRILL_ERR_INVALID);
    /* allgather, allgatherv */
    int mine[3] = { r * 10, r * 10 + 1, r * 10 + 2 }, *all = malloc(sizeof(int) * 3 * (size_t)P);
    OK(trill_comm_allgather(w, mine, sizeof mine, all));
    for (int p = 0; p < P; p++)
        for (int j = 0; j < 3; j++) CHECK(all[p * 3 + j] == p * 10 + j);
    free(all);
    size_t *counts = malloc(sizeof(size_t) * (size_t)P), total = 0;
    for (int p = 0; p < P; p++) total += (counts[p] = (size_t)p + 1);
    unsigned char *v = malloc(total), send[64];
    memset(send, r, sizeof send);
    OK(trill_comm_allgatherv(w, send, counts, v));
    for (int p = 0, at = 0; p < P; at += p + 1, p++)
        for (int j = 0; j <= p; j++) CHECK(v[at + j] == p);
    free(v);
    free(counts);
}

/* The non-blocking broadcast: two in flight at once (a weight version and a small command), from
 * rank 0 and from the last rank, completed by waiting and by testing; the root's bytes counted
 * once each completes. */
static void test_ibcast(trill_comm *w) {
    const int r = trill_comm_rank(w), P = trill_comm_size(w);
    enum { N = 100000 };
    float *big = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) big[i] = r == 0 ? (float)i * 0.5f : -1.0f;
    int small[4] = { r, r, r, r };
    trill_comm_stats_reset(w);
    trill_comm_request *a = NULL, *b = NULL;
    OK(trill_comm_ibcast(w, big, sizeof(float) * N, 0, &a));
    OK(trill_comm_ibcast(w, small, sizeof small, P - 1, &b));
    CHECK((a == NULL) == (P == 1) && (b == NULL) == (P == 1));
    int done = 0;
    while (!done) OK(trill_comm_test(b, &done));
    OK(trill_comm_wait(a));
    for (int i = 0; i < N; i++) CHECK(big[i] == (float)i * 0.5f);
    for (int i = 0; i < 4; i++) CHECK(small[i] == P - 1);
    const trill_comm_stats s = trill_comm_stats_get(w);
    const uint64_t want = (r == 0 ? sizeof(float) * N : 0) + (r == P - 1 ? sizeof small : 0);
    CHECK(s.bytes[TRILL_COMM_BCAST] == want * (uint64_t)(P - 1));
    CHECK(s.calls[TRILL_COMM_BCAST] == (P > 1 ? 2 : 0));
    trill_comm_request *bad = NULL;
    CHECK(trill_comm_ibcast(w, small, 1, P, &bad) == TRILL_ERR_INVALID && bad == NULL);
    CHECK(trill_comm_wait(NULL) == TRILL_OK);
    free(big);
}

/* Rank r sends peer p (r + 2p + 1) floats of value 100 r + p; the count exchange first. */
static void test_alltoallv(trill_comm *w) {
    const int r = trill_comm_rank(w), P = trill_comm_size(w);
    size_t *sc = malloc(sizeof(size_t) * (size_t)P), *rc = malloc(sizeof(size_t) * (size_t)P), sb = 0, rb = 0;
    size_t *sbytes = malloc(sizeof(size_t) * (size_t)P), *rbytes = malloc(sizeof(size_t) * (size_t)P);
    for (int p = 0; p < P; p++) sc[p] = (size_t)(r + 2 * p + 1);
    trill_comm_stats_reset(w);
    OK(trill_comm_alltoall_counts(w, 1, sc, rc));
    uint64_t sent_others = 0;
    for (int p = 0; p < P; p++) {
        CHECK(rc[p] == (size_t)(p + 2 * r + 1));
        sbytes[p] = sc[p] * sizeof(float);
        rbytes[p] = rc[p] * sizeof(float);
        sb += sc[p];
        rb += rc[p];
        if (p != r) sent_others += sbytes[p];
    }
    float *sendv = malloc(sizeof(float) * sb), *recvv = malloc(sizeof(float) * rb);
    for (int p = 0, at = 0; p < P; at += (int)sc[p], p++)
        for (size_t j = 0; j < sc[p]; j++) sendv[at + j] = (float)(100 * r + p);
    OK(trill_comm_alltoallv(w, sendv, sbytes, recvv, rbytes));
    for (int p = 0, at = 0; p < P; at += (int)rc[p], p++)
        for (size_t j = 0; j < rc[p]; j++) CHECK(recvv[at + j] == (float)(100 * p + r));
    const trill_comm_stats s = trill_comm_stats_get(w);
    CHECK(s.calls[TRILL_COMM_ALLTOALLV] == 1 && s.calls[TRILL_COMM_COUNTS] == 1);
    /* the payload this rank sent to the others; the counts it told them apart */
    CHECK(s.bytes[TRILL_COMM_ALLTOALLV] == sent_others);
    CHECK(s.bytes[TRILL_COMM_COUNTS] == sizeof(size_t) * (uint64_t)(P - 1));
    /* three counts a peer, in peer order */
    size_t *sk = malloc(sizeof(size_t) * 3 * (size_t)P), *rk = malloc(sizeof(size_t) * 3 * (size_t)P);
    for (int p = 0; p < P; p++)
        for (int j = 0; j < 3; j++) sk[p * 3 + j] = (size_t)(1000 * r + 10 * p + j);
    OK(trill_comm_alltoall_counts(w, 3, sk, rk));
    for (int p = 0; p < P; p++)
        for (int j = 0; j < 3; j++) CHECK(rk[p * 3 + j] == (size_t)(1000 * p + 10 * r + j));
    CHECK(trill_comm_alltoall_counts(w, 0, sk, rk) == TRILL_ERR_INVALID);
    free(sk); free(rk);
    free(sc); free(rc); free(sbytes); free(rbytes); free(sendv); free(recvv);
}

/* A ring of sends, and the refusals. */
static void test_p2p(trill_comm *w) {
    const int r = trill_comm_rank(w), P = trill_comm_size(w);
    CHECK(trill_comm_send(w, &r, sizeof r, r, 0) == TRILL_ERR_INVALID); /* itself */
    CHECK(trill_comm_recv(w, NULL, 0, P, 0) == TRILL_ERR_INVALID);
    if (P < 2) return;
    int got = -1;
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    if (r % 2 == 0) {
        OK(trill_comm_send(w, &r, sizeof r, next, 7));
        OK(trill_comm_recv(w, &got, sizeof got, prev, 7));
    } else {
        OK(trill_comm_recv(w, &got, sizeof got, prev, 7));
        OK(trill_comm_send(w, &r, sizeof r, next, 7));
    }
    CHECK(got == prev);
}

/* Sub-groups: ranks of one parity (a 2-way "dp" grid) sum among themselves. */
static void test_split(trill_comm *w) {
    const int r = trill_comm_rank(w), P = trill_comm_size(w);
    trill_comm *g;
    OK(trill_comm_split(w, r % 2, r, &g));
    int expect_size = 0, expect_sum = 0;
    for (int p = 0; p < P; p++)
        if (p % 2 == r % 2) expect_size++, expect_sum += p;
    CHECK(trill_comm_size(g) == expect_size);
    CHECK(trill_comm_rank(g) == r / 2);
    double s = r;
    OK(trill_comm_allreduce_f64(g, &s, 1));
    CHECK(s == expect_sum);
    CHECK(trill_comm_stats_get(g).calls[TRILL_COMM_ALLREDUCE] == 1);
    trill_comm_free(g);
}

/* Leaf i of the tree tests: n floats with every mantissa bit in use, of mixed signs and scales,
 * so a different order of the additions shows in the bits. */
static void leaf(int64_t i, float *v, size_t n) {
    for (size_t j = 0; j < n; j++) v[j] = (float)(trill_rng_normal(77, (uint64_t)i * 1000 + j) * pow(10.0, (double)((i + (int64_t)j) % 5) - 2));
}

static void tree_over(trill_comm *c, size_t n, int64_t total, int64_t first, int64_t count, float *out) {
    trill_tree_sum *t;
    float *v = malloc(sizeof(float) * n);
    OK(trill_tree_sum_create(n, total, first, count, &t));
    for (int64_t i = first; i < first + count; i++) {
        leaf(i, v, n);
        OK(trill_tree_sum_add(t, v));
    }
    OK(trill_tree_sum_finish(t, c, out));
    trill_tree_sum_free(t);
    free(v);
}

/* The same sum with this rank's range [first, first + count) held by `parts` trees of consecutive
 * sub-ranges whose leaves arrive interleaved (as an expert's owner receives them, one rank's
 * micro-batch after another's), finished together. */
static void tree_over_parts(trill_comm *c, size_t n, int64_t total, int64_t first, int64_t count, int parts, float *out) {
    trill_tree_sum *t[4];
    int64_t lo[5];
    float *v = malloc(sizeof(float) * n);
    for (int k = 0; k <= parts; k++) lo[k] = first + count * k / parts;
    for (int k = 0; k < parts; k++) OK(trill_tree_sum_create(n, total, lo[k], lo[k + 1] - lo[k], &t[k]));
    for (int64_t i = 0; i < count; i++)
        for (int k = parts - 1; k >= 0; k--) /* round i: the i-th leaf of every part, last part first */
            if (lo[k] + i < lo[k + 1]) {
                leaf(lo[k] + i, v, n);
                OK(trill_tree_sum_add(t[k], v));
            }
    OK(trill_tree_sum_finish_many(t, parts, c, out));
    for (int k = 0; k < parts; k++) trill_tree_sum_free(t[k]);
    free(v);
}

static void test_tree_sum(trill_comm *w) {
    const int r = trill_comm_rank(w), P = trill_comm_size(w);
    enum { N = 7 };
    static const int64_t TOTALS[] = { 0, 1, 2, 3, 5, 8, 13, 16, 31, 64 };
    int differs_from_sequential = 0;
    for (size_t k = 0; k < sizeof TOTALS / sizeof TOTALS[0]; k++) {
        const int64_t M = TOTALS[k];
        float ref[N], got[N], v[N];
        tree_over(NULL, N, M, 0, M, ref); /* one process holding every leaf */
        double exact[N] = { 0 };
        float seq[N] = { 0 };
        for (int64_t i = 0; i < M; i++) {
            leaf(i, v, N);
            for (int j = 0; j < N; j++) exact[j] += v[j], seq[j] += v[j];
        }
        for (int j = 0; j < N; j++) CHECK(fabs(ref[j] - exact[j]) <= 1e-5 * (1 + fabs(exact[j])) * M);
        differs_from_sequential |= memcmp(ref, seq, sizeof ref) != 0;
        /* split 0: contiguous equal shares; 1: everything on the last rank; 2: rank r gets r+1 shares' worth, uneven */
        for (int split = 0; split < 3; split++) {
            int64_t first, count;
            if (split == 0) {
                first = M * r / P;
                count = M * (r + 1) / P - first;
            } else if (split == 1) {
                first = r == P - 1 ? 0 : M;
                count = r == P - 1 ? M : 0;
                if (r != P - 1) first = 0;
            } else {
                const int64_t w_all = (int64_t)P * (P + 1) / 2, w_before = (int64_t)r * (r + 1) / 2;
                first = M * w_before / w_all;
                count = M * (w_before + r + 1) / w_all - first;
            }
            tree_over(w, N, M, first, count, got);
            if (memcmp(got, ref, sizeof ref) != 0)
                fprintf(stderr, "test_comm: rank %d of %d: tree sum of %lld leaves, split %d, differs from one process's\n", r, P,
                        (long long)M, split);
            CHECK(memcmp(got, ref, sizeof ref) == 0);
        }
        /* the equal shares, each held by 1 to 3 trees finished together */
        for (int parts = 1; parts <= 3; parts++) {
            tree_over_parts(w, N, M, M * r / P, M * (r + 1) / P - M * r / P, parts, got);
            CHECK(memcmp(got, ref, sizeof ref) == 0);
        }
    }
    CHECK(differs_from_sequential); /* the leaves are such that the order shows */
    /* a rank adding a leaf beyond its range, or finishing early, is refused */
    trill_tree_sum *t;
    float v[N] = { 0 }, out[N];
    OK(trill_tree_sum_create(N, 4, 0, 1, &t));
    OK(trill_tree_sum_add(t, v));
    CHECK(trill_tree_sum_add(t, v) == TRILL_ERR_INVALID);
    trill_tree_sum_free(t);
    OK(trill_tree_sum_create(N, 4, 0, 2, &t));
    CHECK(trill_tree_sum_finish(t, NULL, out) == TRILL_ERR_INVALID);
    trill_tree_sum_free(t);
    CHECK(trill_tree_sum_create(N, 4, 3, 2, &t) == TRILL_ERR_INVALID);
}

int main(int argc, char **argv) {
    int expect;
    trill_comm *w = dist_test_begin("test_comm", argc, argv, &expect);
    const int P = trill_comm_size(w);
    CHECK(!strcmp(trill_comm_backend(w), P > 1 || expect ? "mpi" : "single"));
    test_collectives(w);
    test_alltoallv(w);
    test_p2p(w);
    test_ibcast(w);
    test_split(w);
    test_tree_sum(w);
    return dist_test_end(w);
}
