/* Expert-parallel load balancing against DeepSeek's eplb.py (the README example and plans printed
 * by eplb.rebalance_experts under torch 1.13), a case worked by hand, the invariants of every plan
 * on random loads, validation, dispatch and the load window. Many more random cases are compared
 * with a PyTorch reference by tests/reference/eplb_ref.py (ctest's eplb_torch, release build). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "trill/eplb.h"
#include "trill/rng.h"

/* github.com/deepseek-ai/EPLB README: 2 layers, 12 experts, 16 replicas, 4 groups, 2 nodes, 8 GPUs. */
static const double README_LOAD[2][12] = {
    { 90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86 },
    { 20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27 },
};

static void expect_ints(const int *got, const int *want, int n) {
    for (int i = 0; i < n; i++) {
        if (got[i] != want[i]) print_error("index %d: got %d, expected %d\n", i, got[i], want[i]);
        assert_int_equal(got[i], want[i]);
    }
}

static void test_readme_example(void **state) {
    (void)state;
    static const int phy2log[2][16] = {
        { 5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1 },
        { 7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1 },
    };
    /* eplb.rebalance_experts' log2phy and logcnt for the same call */
    static const int log2phy[2][12][2] = {
        { { 12, -1 }, { 15, 13 }, { 11, -1 }, { 6, -1 }, { 7, 5 }, { 0, 2 },
          { 1, -1 }, { 3, -1 }, { 4, -1 }, { 9, -1 }, { 8, 10 }, { 14, -1 } },
        { { 13, -1 }, { 15, 11 }, { 8, -1 }, { 14, -1 }, { 9, -1 }, { 10, 12 },
          { 2, 4 }, { 0, -1 }, { 6, 3 }, { 7, -1 }, { 1, -1 }, { 5, -1 } },
    };
    static const int logcnt[2][12] = {
        { 1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1 },
        { 1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1 },
    };
    trill_eplb_plan p;
    assert_int_equal(trill_eplb_rebalance(&README_LOAD[0][0], 2, 12, 16, 4, 2, 8, &p), TRILL_OK);
    assert_int_equal(p.n_layers, 2);
    assert_int_equal(p.n_logical, 12);
    assert_int_equal(p.n_physical, 16);
    assert_int_equal(p.max_replicas, 2);
    expect_ints(p.phy2log, &phy2log[0][0], 32);
    expect_ints(p.log2phy, &log2phy[0][0][0], 48);
    expect_ints(p.logcnt, &logcnt[0][0], 24);
    trill_eplb_plan_free(&p);
    assert_null(p.phy2log);
    trill_eplb_plan_free(&p); /* twice is harmless */
}

/* Global policy (4 groups do not divide among 3 nodes), worked by hand:
 * replication: loads 10 4 6 2, slot 4 -> expert 0 (10 is the largest), slot 5 -> expert 2 (6 beats
 * 10/2 = 5); per-replica loads by slot 5 4 3 2 5 3; sorted (equal loads in slot order) slots
 * 0 4 1 2 5 3 into 3 workers of 2: 0 -> w0, 4 -> w1 (w0 is not lighter), 1 -> w2, 2 -> w2 (4 is
 * the lightest; w2 is full at 7), 5 -> w0 (w0 = w1 = 5, lowest index), 3 -> w1.
 * Worker w's slots are 2w, 2w+1 in placement order: w0 {0, 5}, w1 {4, 3}, w2 {1, 2} -> experts
 * 0 2 | 0 3 | 1 2, loads 8 7 7. */
static void test_global_policy_by_hand(void **state) {
    (void)state;
    const double load[4] = { 10, 4, 6, 2 };
    static const int phy2log[6] = { 0, 2, 0, 3, 1, 2 };
    static const int log2phy[4][2] = { { 0, 2 }, { 4, -1 }, { 5, 1 }, { 3, -1 } };
    static const int logcnt[4] = { 2, 1, 2, 1 };
    trill_eplb_plan p;
    assert_int_equal(trill_eplb_rebalance(load, 1, 4, 6, 4, 3, 3, &p), TRILL_OK);
    expect_ints(p.phy2log, phy2log, 6);
    assert_int_equal(p.max_replicas, 2);
    expect_ints(p.log2phy, &log2phy[0][0], 8);
    expect_ints(p.logcnt, logcnt, 4);
    double wl[3];
    assert_int_equal(trill_eplb_worker_load(&p, load, 3, wl), TRILL_OK);
    assert_true(wl[0] == 8 && wl[1] == 7 && wl[2] == 7);
    trill_eplb_plan_free(&p);
}

/* The README loads with 3 groups on 2 nodes (global policy) and with 4 groups on 1 node
 * (hierarchical: groups are reordered by load inside the node, which changes the replica order),
 * as eplb.rebalance_experts prints them. */
static void test_matches_eplb_py(void **state) {
    (void)state;
    static const int global[2][16] = {
        { 10, 6, 10, 7, 0, 2, 11, 4, 5, 9, 5, 4, 8, 3, 1, 1 },
        { 1, 10, 2, 4, 5, 11, 5, 0, 6, 7, 6, 3, 8, 8, 9, 7 },
    };
    static const int one_node[2][16] = {
        { 10, 8, 3, 7, 10, 1, 1, 4, 0, 5, 4, 2, 11, 5, 9, 6 },
        { 1, 9, 3, 11, 2, 8, 8, 10, 5, 6, 7, 0, 5, 6, 7, 4 },
    };
    static const int four_nodes[2][16] = {
        { 0, 2, 1, 1, 4, 3, 5, 5, 6, 7, 8, 8, 10, 11, 10, 9 },
        { 2, 0, 1, 1, 5, 3, 5, 4, 8, 6, 7, 6, 9, 11, 9, 10 },
    };
    trill_eplb_plan p;
    assert_int_equal(trill_eplb_rebalance(&README_LOAD[0][0], 2, 12, 16, 3, 2, 8, &p), TRILL_OK);
    expect_ints(p.phy2log, &global[0][0], 32);
    trill_eplb_plan_free(&p);
    assert_int_equal(trill_eplb_rebalance(&README_LOAD[0][0], 2, 12, 16, 4, 1, 4, &p), TRILL_OK);
    expect_ints(p.phy2log, &one_node[0][0], 32);
    trill_eplb_plan_free(&p);
    assert_int_equal(trill_eplb_rebalance(&README_LOAD[0][0], 2, 12, 16, 4, 4, 8, &p), TRILL_OK);
    expect_ints(p.phy2log, &four_nodes[0][0], 32);
    trill_eplb_plan_free(&p);
}

/* All loads equal (zero): every tie rule decides. eplb.py gives [0 1 2 3 0 0 0 0]: each extra
 * replica goes to the first expert (torch max reports the first maximum), and with equal weights
 * the packing keeps slot order and fills the lowest-index pack first. */
static void test_ties_all_zero(void **state) {
    (void)state;
    const double load[4] = { 0, 0, 0, 0 };
    static const int phy2log[8] = { 0, 1, 2, 3, 0, 0, 0, 0 };
    static const int logcnt[4] = { 5, 1, 1, 1 };
    trill_eplb_plan p;
    assert_int_equal(trill_eplb_rebalance(load, 1, 4, 8, 1, 1, 4, &p), TRILL_OK);
    expect_ints(p.phy2log, phy2log, 8);
    expect_ints(p.logcnt, logcnt, 4);
    assert_int_equal(p.max_replicas, 5);
    static const int e0[5] = { 0, 4, 5, 6, 7 };
    expect_ints(p.log2phy, e0, 5);
    trill_eplb_plan_free(&p);
}

/* Checks what holds for every plan: counts, the two maps agree, dispatch, node locality of the
 * hierarchical policy, and the replication rule: an expert given r >= 2 replicas had, with r - 1,
 * the largest per-replica load of its node then, so w_e / (r - 1) >= w_f / r_f for every f there
 * (float32, as the planner compares). */
static void check_plan(const trill_eplb_plan *p, const double *load, int L, int E, int P, int G, int N, int W) {
    assert_int_equal(p->n_layers, L);
    assert_int_equal(p->n_logical, E);
    assert_int_equal(p->n_physical, P);
    if (G % N != 0) G = N = 1; /* the global policy is the hierarchical one on one node */
    int R = p->max_replicas, maxcnt = 0;
    int *seen = malloc((size_t)P * sizeof *seen), *node_of = malloc((size_t)E * sizeof *node_of);
    assert_non_null(seen);
    assert_non_null(node_of);
    for (int l = 0; l < L; l++) {
        const int *phy2log = p->phy2log + (size_t)l * P, *cnt = p->logcnt + (size_t)l * E;
        const double *w = load + (size_t)l * E;
        int total = 0;
        for (int e = 0; e < E; e++) {
            assert_true(cnt[e] >= 1);
            total += cnt[e];
            if (cnt[e] > maxcnt) maxcnt = cnt[e];
        }
        assert_int_equal(total, P);
        for (int s = 0; s < P; s++) {
            assert_true(phy2log[s] >= 0 && phy2log[s] < E);
            seen[s] = 0;
        }
        for (int e = 0; e < E; e++) {
            node_of[e] = -1;
            const int *slots = p->log2phy + ((size_t)l * E + e) * R;
            for (int r = 0; r < R; r++) {
                if (r >= cnt[e]) {
                    assert_int_equal(slots[r], -1);
                    continue;
                }
                assert_true(slots[r] >= 0 && slots[r] < P);
                assert_int_equal(phy2log[slots[r]], e);
                seen[slots[r]]++;
                int node = slots[r] / (P / N);
                if (node_of[e] < 0) node_of[e] = node;
                assert_int_equal(node, node_of[e]); /* replicas stay on their expert's node */
                for (uint64_t t = r; t < 3 * (uint64_t)cnt[e]; t += (uint64_t)cnt[e])
                    assert_int_equal(trill_eplb_physical(p, l, e, t), slots[r]);
            }
        }
        for (int s = 0; s < P; s++) assert_int_equal(seen[s], 1); /* every slot listed exactly once */
        /* whole groups on a node, G / N groups (E / N experts) per node */
        int gs = E / G;
        for (int n = 0; n < N; n++) {
            int experts = 0;
            for (int e = 0; e < E; e++) {
                assert_int_equal(node_of[e], node_of[e - e % gs]);
                experts += node_of[e] == n;
            }
            assert_int_equal(experts, E / N);
        }
        for (int e = 0; e < E; e++) {
            if (cnt[e] < 2) continue;
            float lead = (float)w[e] / (float)(cnt[e] - 1);
            for (int f = 0; f < E; f++)
                if (node_of[f] == node_of[e]) assert_true(lead >= (float)w[f] / (float)cnt[f]);
        }
    }
    assert_int_equal(R, maxcnt);
    free(seen);
    free(node_of);
}

/* Random configurations, both policies, loads with many ties, skewed counts and fractions. */
static void test_invariants_random(void **state) {
    (void)state;
    static const int nodes[] = { 1, 1, 2, 3, 4 }, wmul[] = { 1, 2, 3, 4, 8 }, gsz[] = { 1, 2, 3, 4, 8 };
    static const int groups[] = { 1, 2, 3, 4, 6, 8 }, extra[] = { 0, 0, 1, 2, 5 };
    int hier = 0, glob = 0;
    for (uint64_t c = 0; c < 400; c++) {
        uint64_t key = trill_rng_key(2024, c);
        uint64_t k = 0;
#define PICK(a) (a)[trill_rng_bits(key, k++) % (sizeof(a) / sizeof((a)[0]))]
        int N = PICK(nodes), W = N * PICK(wmul), G = PICK(groups);
        if (c % 2 == 0) G = N * (1 + (int)(trill_rng_bits(key, k++) % 3)); /* hierarchical */
        else /* global: groups that do not divide among >= 2 nodes */
            while (G % N == 0) N = 2 + (int)(trill_rng_bits(key, k++) % 3), W = N * PICK(wmul);
        int E = G * PICK(gsz), L = 1 + (int)(trill_rng_bits(key, k++) % 3);
        int P = W * ((E + W - 1) / W + PICK(extra));
#undef PICK
        int kind = (int)(c % 4);
        double *load = malloc((size_t)L * E * sizeof *load);
        assert_non_null(load);
        for (int i = 0; i < L * E; i++) {
            double u = trill_rng_uniform(key, 100 + (uint64_t)i);
            load[i] = kind == 0 ? floor(u * 4)                        /* many ties */
                    : kind == 1 ? floor(100000 / pow(1 + u * E, 1.2)) /* skewed counts */
                    : kind == 2 ? u * 100                             /* fractions */
                                : floor(u * 1000);
        }
        trill_eplb_plan p;
        assert_int_equal(trill_eplb_rebalance(load, L, E, P, G, N, W, &p), TRILL_OK);
        check_plan(&p, load, L, E, P, G, N, W);
        if (G % N == 0) hier++;
        else glob++;
        trill_eplb_plan_free(&p);
        free(load);
    }
    print_message("%d hierarchical, %d global plans\n", hier, glob);
    assert_true(hier == 200 && glob == 200); /* both policies were exercised */
}

static double max_of(const double *x, int n) {
    double m = x[0];
    for (int i = 1; i < n; i++) m = fmax(m, x[i]);
    return m;
}

/* What EPLB is for: with skewed loads the busiest worker does much less than under the identity
 * placement. 16 experts with Zipf-like loads on 4 workers; EPLB gets 4 extra slots. */
static void test_balances_skewed_load(void **state) {
    (void)state;
    enum { E = 16, W = 4, CASES = 50 };
    double ratio_id = 0, ratio_eplb = 0;
    for (uint64_t c = 0; c < CASES; c++) {
        double load[E], total = 0, wl[W];
        for (int e = 0; e < E; e++) {
            load[e] = floor(10000 / pow(1 + trill_rng_uniform(trill_rng_key(7, c), (uint64_t)e) * E, 1.5));
            total += load[e];
        }
        trill_eplb_plan id, p;
        assert_int_equal(trill_eplb_identity(1, E, &id), TRILL_OK);
        assert_int_equal(trill_eplb_worker_load(&id, load, W, wl), TRILL_OK);
        ratio_id += max_of(wl, W) / (total / W);
        assert_int_equal(trill_eplb_rebalance(load, 1, E, E + W, 1, 1, W, &p), TRILL_OK);
        assert_int_equal(trill_eplb_worker_load(&p, load, W, wl), TRILL_OK);
        double sum = 0;
        for (int k = 0; k < W; k++) sum += wl[k];
        assert_true(fabs(sum - total) < 1e-9 * total); /* replicas share their expert's load */
        ratio_eplb += max_of(wl, W) / (total / W);
        assert_true(max_of(wl, W) >= total / W - 1e-9);
        trill_eplb_plan_free(&id);
        trill_eplb_plan_free(&p);
    }
    ratio_id /= CASES;
    ratio_eplb /= CASES;
    print_message("mean max/mean worker load: identity %.3f, eplb %.3f\n", ratio_id, ratio_eplb);
    assert_true(ratio_id > 1.4);
    assert_true(ratio_eplb < 1.1);
}

/* One slot per worker and no extra slots: nothing to replicate or pack, slot i holds expert i
 * (eplb.py's one-item-per-pack shortcut), as the identity plan does. */
static void test_identity(void **state) {
    (void)state;
    const double load[2][6] = { { 5, 1, 9, 2, 7, 3 }, { 1, 2, 3, 4, 5, 6 } };
    trill_eplb_plan p, id;
    assert_int_equal(trill_eplb_rebalance(&load[0][0], 2, 6, 6, 1, 1, 6, &p), TRILL_OK);
    assert_int_equal(trill_eplb_identity(2, 6, &id), TRILL_OK);
    assert_int_equal(id.n_physical, 6);
    assert_int_equal(id.max_replicas, 1);
    for (int i = 0; i < 12; i++) {
        assert_int_equal(p.phy2log[i], i % 6);
        assert_int_equal(id.phy2log[i], i % 6);
        assert_int_equal(id.log2phy[i], i % 6);
        assert_int_equal(id.logcnt[i], 1);
    }
    assert_int_equal(trill_eplb_physical(&id, 1, 4, 12345), 4);
    check_plan(&id, &load[0][0], 2, 6, 6, 1, 1, 6);
    trill_eplb_plan_free(&p);
    trill_eplb_plan_free(&id);
}

static void expect_invalid(trill_status st, const char *needle) {
    assert_int_equal(st, TRILL_ERR_INVALID);
    if (!strstr(trill_error_message(), needle)) print_error("message: %s\n", trill_error_message());
    assert_non_null(strstr(trill_error_message(), needle));
}

static void test_validation(void **state) {
    (void)state;
    const double *ld = &README_LOAD[0][0];
    trill_eplb_plan p;
    expect_invalid(trill_eplb_rebalance(ld, 2, 12, 18, 4, 2, 8, &p), "n_physical = 18: expected a multiple of n_workers = 8");
    assert_null(p.phy2log);
    expect_invalid(trill_eplb_rebalance(ld, 2, 12, 8, 4, 2, 8, &p), "n_physical = 8: expected at least n_logical = 12");
    expect_invalid(trill_eplb_rebalance(ld, 2, 12, 16, 5, 1, 8, &p), "n_logical = 12: expected a multiple of n_groups = 5");
    expect_invalid(trill_eplb_rebalance(ld, 2, 12, 18, 4, 2, 3, &p), "n_workers = 3: expected a multiple of n_nodes = 2");
    expect_invalid(trill_eplb_rebalance(ld, 2, 12, 16, 4, 0, 8, &p), "n_nodes = 0");
    expect_invalid(trill_eplb_rebalance(ld, 2, 12, 16, 0, 2, 8, &p), "n_groups = 0");
    expect_invalid(trill_eplb_rebalance(ld, 2, 12, 16, 4, 2, 0, &p), "n_workers = 0");
    expect_invalid(trill_eplb_rebalance(ld, 0, 12, 16, 4, 2, 8, &p), "n_layers = 0");
    expect_invalid(trill_eplb_rebalance(ld, 2, 0, 16, 4, 2, 8, &p), "n_logical = 0");
    expect_invalid(trill_eplb_rebalance(NULL, 2, 12, 16, 4, 2, 8, &p), "load is NULL");
    double bad[2][12];
    memcpy(bad, README_LOAD, sizeof bad);
    bad[1][3] = -1;
    expect_invalid(trill_eplb_rebalance(&bad[0][0], 2, 12, 16, 4, 2, 8, &p), "load[1][3] = -1: expected a finite number >= 0");
    bad[1][3] = NAN;
    expect_invalid(trill_eplb_rebalance(&bad[0][0], 2, 12, 16, 4, 2, 8, &p), "load[1][3] = nan");
    bad[1][3] = INFINITY;
    expect_invalid(trill_eplb_rebalance(&bad[0][0], 2, 12, 16, 4, 2, 8, &p), "load[1][3] = inf");
    bad[1][3] = 1e300; /* infinite in float32, as eplb.py computes */
    expect_invalid(trill_eplb_rebalance(&bad[0][0], 2, 12, 16, 4, 2, 8, &p), "load[1][3] = 1e+300");
    assert_null(p.phy2log);
    expect_invalid(trill_eplb_identity(0, 4, &p), "n_layers = 0");
    trill_eplb_window *w;
    expect_invalid(trill_eplb_window_create(1, 4, 0, &w), "window = 0: expected at least 1 step");
    assert_null(w);
    assert_int_equal(trill_eplb_rebalance(ld, 2, 12, 16, 4, 2, 8, &p), TRILL_OK);
    double wl[16];
    expect_invalid(trill_eplb_worker_load(&p, ld, 3, wl), "n_workers = 3: expected a positive divisor");
    trill_eplb_plan_free(&p);
}

/* The window sums exactly the last `window` steps, fewer while it fills. */
static void test_window(void **state) {
    (void)state;
    enum { L = 2, E = 3, WIN = 3, STEPS = 7 };
    trill_eplb_window *w;
    assert_int_equal(trill_eplb_window_create(L, E, WIN, &w), TRILL_OK);
    uint32_t counts[STEPS][L * E];
    double load[L * E];
    trill_eplb_window_load(w, load);
    for (int i = 0; i < L * E; i++) assert_true(load[i] == 0);
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < L * E; i++) counts[s][i] = (uint32_t)(trill_rng_bits(99, (uint64_t)(s * 100 + i)) % 1000);
        counts[s][0] = UINT32_MAX; /* sums go past 32 bits */
        trill_eplb_window_add(w, counts[s]);
        assert_int_equal(trill_eplb_window_steps(w), s + 1 < WIN ? s + 1 : WIN);
        trill_eplb_window_load(w, load);
        for (int i = 0; i < L * E; i++) {
            double want = 0;
            for (int t = s; t >= 0 && t > s - WIN; t--) want += counts[t][i];
            assert_true(load[i] == want);
        }
    }
    trill_eplb_window_free(w);
    trill_eplb_window_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_example),
        cmocka_unit_test(test_global_policy_by_hand),
        cmocka_unit_test(test_matches_eplb_py),
        cmocka_unit_test(test_ties_all_zero),
        cmocka_unit_test(test_invariants_random),
        cmocka_unit_test(test_balances_skewed_load),
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
