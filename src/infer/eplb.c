/* Expert-parallel load balancing: DeepSeek's EPLB (eplb.py) one layer at a time.
 *
 * eplb.py works on whole [layers (x nodes), items] tensors, but every row is independent, so this
 * runs the same three steps per layer and per node. The float32 arithmetic and the tie rules are
 * eplb.py's (see trill/eplb.h); they decide which of two equally good placements is chosen, and a
 * plan that differs from the reference in a tie is still a different plan to compare against. */
#include "trill/eplb.h"
#include "base/alloc.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct item {
    float w;
    int i;
} item;

/* torch sort(descending=True) with equal weights in index order (the stable order; see eplb.h). */
static int item_cmp_desc(const void *pa, const void *pb) {
    const item *a = pa, *b = pb;
    if (a->w > b->w) return -1;
    if (a->w < b->w) return 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* eplb.py balanced_packing for one row: n items into n_packs packs of exactly n / n_packs items.
 * Heaviest item first, each into the lightest pack that still has room (lowest index among equal
 * ones); pack weights accumulate in float32 as the Python's tensor sums do. rank[i] is the item's
 * position within its pack. `items`, `pw`, `pc` are scratch of n, n_packs, n_packs. */
static void balanced_packing(const float *w, int n, int n_packs, int *pack, int *rank, item *items, float *pw,
                             int *pc) {
    int per_pack = n / n_packs;
    if (per_pack == 1) { /* eplb.py's shortcut: item i is pack i, not the sorted assignment */
        for (int i = 0; i < n; i++) {
            pack[i] = i;
            rank[i] = 0;
        }
        return;
    }
    for (int i = 0; i < n; i++) items[i] = (item){ w[i], i };
    qsort(items, (size_t)n, sizeof *items, item_cmp_desc);
    for (int p = 0; p < n_packs; p++) {
        pw[p] = 0.0f;
        pc[p] = 0;
    }
    for (int k = 0; k < n; k++) {
        int best = -1;
        for (int p = 0; p < n_packs; p++)
            if (pc[p] < per_pack && (best < 0 || pw[p] < pw[best])) best = p;
        assert(best >= 0);
        int i = items[k].i;
        pack[i] = best;
        rank[i] = pc[best]++;
        pw[best] += w[i];
    }
}

/* eplb.py replicate_experts for one row: n_log experts onto n_phy >= n_log slots. Slot i < n_log
 * holds expert i; each further slot goes to the expert with the largest float32 load per replica
 * (the first among equal ones, as torch's max(dim) reports). */
static void replicate_experts(const float *w, int n_log, int n_phy, int *phy2log, int *rank, int *cnt) {
    for (int i = 0; i < n_log; i++) {
        phy2log[i] = i;
        rank[i] = 0;
        cnt[i] = 1;
    }
    for (int i = n_log; i < n_phy; i++) {
        int best = 0;
        float best_q = w[0] / (float)cnt[0];
        for (int e = 1; e < n_log; e++) {
            float q = w[e] / (float)cnt[e];
            if (q > best_q) {
                best_q = q;
                best = e;
            }
        }
        phy2log[i] = best;
        rank[i] = cnt[best]++;
    }
}

/* Scratch for one layer of the hierarchical policy, sized once for all layers. */
typedef struct scratch {
    float *tpg;      /* [G] load per group */
    int *gpack;      /* [G] node of each group */
    int *grank;      /* [G] position of the group within its node */
    int *mlog2log;   /* [E] node-ordered expert -> logical expert */
    float *wm;       /* [E/N] loads of one node's experts in node order */
    int *phy2mlog;   /* [P/N] */
    int *phyrank;    /* [P/N] */
    int *mlogcnt;    /* [E/N] */
    float *tpp;      /* [P/N] load per replica */
    int *ppack;      /* [P/N] worker (within the node) of each replica */
    int *prank;      /* [P/N] position within the worker */
    item *items;     /* [max(G, P/N)] */
    float *pw;       /* [max(N, W/N)] */
    int *pc;         /* [max(N, W/N)] */
} scratch;

/* eplb.py rebalance_experts_hierarchical for one layer: w [E] float32 loads; writes phy2log [P],
 * phyrank [P] (replica rank of each slot) and logcnt [E]. */
static void rebalance_layer(const float *w, int E, int P, int G, int N, int W, scratch *s, int *phy2log, int *phyrank,
                            int *logcnt) {
    int group_size = E / G, groups_per_node = G / N, per_worker = P / W;
    int En = E / N, Pn = P / N, Wn = W / N;

    /* Step 1: pack groups onto nodes. A group's sum is rounded once from double, which equals
     * torch's float32 sum whenever that sum is exact (see eplb.h). */
    for (int g = 0; g < G; g++) {
        double sum = 0.0;
        for (int j = 0; j < group_size; j++) sum += (double)w[g * group_size + j];
        s->tpg[g] = (float)sum;
    }
    balanced_packing(s->tpg, G, N, s->gpack, s->grank, s->items, s->pw, s->pc);
    /* Node-ordered expert ids ("mlog"): node n holds [n * En, (n + 1) * En), its groups in packing
     * order, each group's experts in logical order. */
    for (int g = 0; g < G; g++)
        for (int j = 0; j < group_size; j++) {
            int mlog = (s->gpack[g] * groups_per_node + s->grank[g]) * group_size + j;
            s->mlog2log[mlog] = g * group_size + j;
        }

    for (int n = 0; n < N; n++) {
        const int *m2l = s->mlog2log + (size_t)n * En;
        /* Step 2: replicas within the node. */
        for (int m = 0; m < En; m++) s->wm[m] = w[m2l[m]];
        replicate_experts(s->wm, En, Pn, s->phy2mlog, s->phyrank, s->mlogcnt);
        for (int m = 0; m < En; m++) logcnt[m2l[m]] = s->mlogcnt[m];
        /* Step 3: pack the node's replicas onto its workers (float32 load per replica). */
        for (int p = 0; p < Pn; p++) {
            int m = s->phy2mlog[p];
            s->tpp[p] = s->wm[m] / (float)s->mlogcnt[m];
        }
        balanced_packing(s->tpp, Pn, Wn, s->ppack, s->prank, s->items, s->pw, s->pc);
        /* Worker (n * Wn + pack) owns slots [(n * Wn + pack) * per_worker, ...), so the node's
         * slots start at n * Pn and the contiguous-ownership rule holds by construction. */
        for (int p = 0; p < Pn; p++) {
            int slot = n * Pn + s->ppack[p] * per_worker + s->prank[p];
            phy2log[slot] = m2l[s->phy2mlog[p]];
            phyrank[slot] = s->phyrank[p];
        }
    }
}

static trill_status validate(const double *load, int L, int E, int P, int G, int N, int W) {
    if (L < 1) return trill_error(TRILL_ERR_INVALID, "eplb: n_layers = %d: expected at least 1 MoE layer", L);
    if (E < 1) return trill_error(TRILL_ERR_INVALID, "eplb: n_logical = %d: expected at least 1 expert", E);
    if (G < 1) return trill_error(TRILL_ERR_INVALID, "eplb: n_groups = %d: expected at least 1 group", G);
    if (N < 1) return trill_error(TRILL_ERR_INVALID, "eplb: n_nodes = %d: expected at least 1 node", N);
    if (W < 1) return trill_error(TRILL_ERR_INVALID, "eplb: n_workers = %d: expected at least 1 worker", W);
    if (P < E)
        return trill_error(TRILL_ERR_INVALID,
                           "eplb: n_physical = %d: expected at least n_logical = %d (every expert needs a slot)", P, E);
    if (P % W != 0)
        return trill_error(TRILL_ERR_INVALID,
                           "eplb: n_physical = %d: expected a multiple of n_workers = %d (every worker owns "
                           "n_physical / n_workers slots)", P, W);
    if (W % N != 0)
        return trill_error(TRILL_ERR_INVALID,
                           "eplb: n_workers = %d: expected a multiple of n_nodes = %d (every node has the same "
                           "number of workers)", W, N);
    if (E % G != 0)
        return trill_error(TRILL_ERR_INVALID,
                           "eplb: n_logical = %d: expected a multiple of n_groups = %d (groups of equal size)", E, G);
    if (!load) return trill_error(TRILL_ERR_INVALID, "eplb: load is NULL: expected [n_layers][n_logical] values");
    for (int l = 0; l < L; l++)
        for (int e = 0; e < E; e++) {
            double x = load[(size_t)l * E + e];
            /* float32 as eplb.py computes: a load beyond FLT_MAX would become infinity there */
            if (!(x >= 0.0) || !isfinite((float)x))
                return trill_error(TRILL_ERR_INVALID,
                                   "eplb: load[%d][%d] = %g: expected a finite number >= 0 (within float32 range)",
                                   l, e, x);
        }
    return TRILL_OK;
}

static void scratch_free(scratch *s) {
    free(s->tpg);
    free(s->gpack);
    free(s->grank);
    free(s->mlog2log);
    free(s->wm);
    free(s->phy2mlog);
    free(s->phyrank);
    free(s->mlogcnt);
    free(s->tpp);
    free(s->ppack);
    free(s->prank);
    free(s->items);
    free(s->pw);
    free(s->pc);
}

static int max_int(int a, int b) { return a > b ? a : b; }

/* Fills log2phy from phy2log and the replica rank of every slot (eplb.py's final scatter). */
static trill_status build_log2phy(trill_eplb_plan *p, const int *phyrank) {
    int L = p->n_layers, E = p->n_logical, P = p->n_physical, R = 1;
    for (size_t i = 0; i < (size_t)L * E; i++) R = max_int(R, p->logcnt[i]);
    p->max_replicas = R;
    p->log2phy = trill_malloc((size_t)L * E * R * sizeof *p->log2phy);
    if (!p->log2phy)
        return trill_error(TRILL_ERR_NOMEM, "eplb: out of memory for log2phy [%d][%d][%d]", L, E, R);
    for (size_t i = 0; i < (size_t)L * E * R; i++) p->log2phy[i] = -1;
    for (int l = 0; l < L; l++)
        for (int s = 0; s < P; s++) {
            int e = p->phy2log[(size_t)l * P + s], r = phyrank[(size_t)l * P + s];
            p->log2phy[((size_t)l * E + e) * R + r] = s;
        }
    return TRILL_OK;
}

trill_status trill_eplb_rebalance(const double *load, int n_layers, int n_logical, int n_physical, int n_groups,
                                  int n_nodes, int n_workers, trill_eplb_plan *out) {
    memset(out, 0, sizeof *out);
    trill_status st = validate(load, n_layers, n_logical, n_physical, n_groups, n_nodes, n_workers);
    if (st != TRILL_OK) return st;
    int L = n_layers, E = n_logical, P = n_physical, W = n_workers;
    /* eplb.py: hierarchical when groups divide evenly among nodes, else the same code with one
     * group on one node (the global policy). */
    int G = n_groups, N = n_nodes;
    if (G % N != 0) G = N = 1;

    int En = E / N, Pn = P / N;
    scratch s = {
        .tpg = trill_malloc((size_t)G * sizeof(float)),
        .gpack = trill_malloc((size_t)G * sizeof(int)),
        .grank = trill_malloc((size_t)G * sizeof(int)),
        .mlog2log = trill_malloc((size_t)E * sizeof(int)),
        .wm = trill_malloc((size_t)En * sizeof(float)),
        .phy2mlog = trill_malloc((size_t)Pn * sizeof(int)),
        .phyrank = trill_malloc((size_t)Pn * sizeof(int)),
        .mlogcnt = trill_malloc((size_t)En * sizeof(int)),
        .tpp = trill_malloc((size_t)Pn * sizeof(float)),
        .ppack = trill_malloc((size_t)Pn * sizeof(int)),
        .prank = trill_malloc((size_t)Pn * sizeof(int)),
        .items = trill_malloc((size_t)max_int(G, Pn) * sizeof(item)),
        .pw = trill_malloc((size_t)max_int(N, W / N) * sizeof(float)),
        .pc = trill_malloc((size_t)max_int(N, W / N) * sizeof(int)),
    };
    float *w = trill_malloc((size_t)E * sizeof *w);
    int *phyrank = trill_malloc((size_t)L * P * sizeof *phyrank);
    out->phy2log = trill_malloc((size_t)L * P * sizeof *out->phy2log);
    out->logcnt = trill_malloc((size_t)L * E * sizeof *out->logcnt);
    if (!s.tpg || !s.gpack || !s.grank || !s.mlog2log || !s.wm || !s.phy2mlog || !s.phyrank || !s.mlogcnt ||
        !s.tpp || !s.ppack || !s.prank || !s.items || !s.pw || !s.pc || !w || !phyrank || !out->phy2log ||
        !out->logcnt) {
        st = trill_error(TRILL_ERR_NOMEM, "eplb: out of memory planning %d layers x %d slots", L, P);
        goto done;
    }
    out->n_layers = L;
    out->n_logical = E;
    out->n_physical = P;
    for (int l = 0; l < L; l++) {
        for (int e = 0; e < E; e++) w[e] = (float)load[(size_t)l * E + e];
        rebalance_layer(w, E, P, G, N, W, &s, out->phy2log + (size_t)l * P, phyrank + (size_t)l * P,
                        out->logcnt + (size_t)l * E);
    }
    st = build_log2phy(out, phyrank);
done:
    scratch_free(&s);
    free(w);
    free(phyrank);
    if (st != TRILL_OK) trill_eplb_plan_free(out);
    return st;
}

trill_status trill_eplb_identity(int n_layers, int n_logical, trill_eplb_plan *out) {
    memset(out, 0, sizeof *out);
    if (n_layers < 1) return trill_error(TRILL_ERR_INVALID, "eplb: n_layers = %d: expected at least 1 MoE layer", n_layers);
    if (n_logical < 1) return trill_error(TRILL_ERR_INVALID, "eplb: n_logical = %d: expected at least 1 expert", n_logical);
    size_t n = (size_t)n_layers * n_logical;
    out->phy2log = trill_malloc(n * sizeof *out->phy2log);
    out->log2phy = trill_malloc(n * sizeof *out->log2phy);
    out->logcnt = trill_malloc(n * sizeof *out->logcnt);
    if (!out->phy2log || !out->log2phy || !out->logcnt) {
        trill_eplb_plan_free(out);
        return trill_error(TRILL_ERR_NOMEM, "eplb: out of memory for an identity plan of %d layers x %d experts",
                           n_layers, n_logical);
    }
    out->n_layers = n_layers;
    out->n_logical = out->n_physical = n_logical;
    out->max_replicas = 1;
    for (size_t i = 0; i < n; i++) {
        out->phy2log[i] = out->log2phy[i] = (int)(i % (size_t)n_logical);
        out->logcnt[i] = 1;
    }
    return TRILL_OK;
}

void trill_eplb_plan_free(trill_eplb_plan *p) {
    if (!p) return;
    free(p->phy2log);
    free(p->log2phy);
    free(p->logcnt);
    memset(p, 0, sizeof *p);
}

int trill_eplb_physical(const trill_eplb_plan *p, int layer, int logical, uint64_t token_index) {
    assert(layer >= 0 && layer < p->n_layers && logical >= 0 && logical < p->n_logical);
    size_t le = (size_t)layer * p->n_logical + logical;
    uint64_t r = token_index % (uint64_t)p->logcnt[le];
    return p->log2phy[le * p->max_replicas + r];
}

trill_status trill_eplb_worker_load(const trill_eplb_plan *p, const double *load, int n_workers, double *out) {
    if (n_workers < 1 || p->n_physical % n_workers != 0)
        return trill_error(TRILL_ERR_INVALID,
                           "eplb: n_workers = %d: expected a positive divisor of the plan's n_physical = %d",
                           n_workers, p->n_physical);
    int E = p->n_logical, P = p->n_physical, per = P / n_workers;
    for (int l = 0; l < p->n_layers; l++) {
        double *o = out + (size_t)l * n_workers;
        for (int k = 0; k < n_workers; k++) o[k] = 0.0;
        for (int s = 0; s < P; s++) {
            int e = p->phy2log[(size_t)l * P + s];
            o[s / per] += load[(size_t)l * E + e] / p->logcnt[(size_t)l * E + e];
        }
    }
    return TRILL_OK;
}

struct trill_eplb_window {
    int n_layers, n_logical, window;
    int steps; /* held, <= window */
    int next;  /* ring position the next step is written to (the oldest once full) */
    uint32_t *ring; /* [window][n_layers * n_logical] */
    uint64_t *sum;  /* [n_layers * n_logical] running sum of the steps held */
};

trill_status trill_eplb_window_create(int n_layers, int n_logical, int window, trill_eplb_window **out) {
    *out = NULL;
    if (n_layers < 1) return trill_error(TRILL_ERR_INVALID, "eplb window: n_layers = %d: expected at least 1", n_layers);
    if (n_logical < 1)
        return trill_error(TRILL_ERR_INVALID, "eplb window: n_logical = %d: expected at least 1", n_logical);
    if (window < 1)
        return trill_error(TRILL_ERR_INVALID, "eplb window: window = %d: expected at least 1 step", window);
    size_t n = (size_t)n_layers * n_logical;
    trill_eplb_window *w = trill_calloc(1, sizeof *w);
    if (w) {
        w->ring = trill_calloc((size_t)window * n, sizeof *w->ring);
        w->sum = trill_calloc(n, sizeof *w->sum);
    }
    if (!w || !w->ring || !w->sum) {
        trill_eplb_window_free(w);
        return trill_error(TRILL_ERR_NOMEM, "eplb window: out of memory for %d steps of %d layers x %d experts",
                           window, n_layers, n_logical);
    }
    w->n_layers = n_layers;
    w->n_logical = n_logical;
    w->window = window;
    *out = w;
    return TRILL_OK;
}

void trill_eplb_window_add(trill_eplb_window *w, const uint32_t *counts) {
    size_t n = (size_t)w->n_layers * w->n_logical;
    uint32_t *slot = w->ring + (size_t)w->next * n;
    /* the slot holds the oldest step once the window is full, zeros before */
    for (size_t i = 0; i < n; i++) {
        w->sum[i] = w->sum[i] - slot[i] + counts[i];
        slot[i] = counts[i];
    }
    w->next = (w->next + 1) % w->window;
    if (w->steps < w->window) w->steps++;
}

void trill_eplb_window_load(const trill_eplb_window *w, double *load) {
    size_t n = (size_t)w->n_layers * w->n_logical;
    for (size_t i = 0; i < n; i++) load[i] = (double)w->sum[i];
}

int trill_eplb_window_steps(const trill_eplb_window *w) { return w->steps; }

void trill_eplb_window_free(trill_eplb_window *w) {
    if (!w) return;
    free(w->ring);
    free(w->sum);
    free(w);
}
