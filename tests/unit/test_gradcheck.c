/* Finite-difference gradient checks of every backward kernel, in double precision: the
 * kernels are compiled a second time with REAL = double (src/kernels/ops_f64.c), so the very
 * code trill runs in fp32 is checked to ~1e-9 here. For each kernel, loss = sum(G * f(x)) with
 * a random G; every input and weight element is perturbed by +-h and the central difference
 * compared with the backward pass's gradient. */
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels_f64.h"
#include "trill/kernels.h"
#include "trill/rng.h"

static uint64_t g_counter;

static double *randn(size_t n, double scale) {
    double *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = scale * trill_rng_normal(12345, g_counter++);
    return x;
}

static double *zeros(size_t n) { return calloc(n, sizeof(double)); }

typedef struct check {
    void (*forward)(struct check *c, double *out); /* f(current inputs) */
    void *ctx;
    size_t n_out;
    const double *G;                               /* upstream gradient */
} check;

static double loss(check *c) {
    double *out = zeros(c->n_out), l = 0;
    c->forward(c, out);
    for (size_t i = 0; i < c->n_out; i++) l += c->G[i] * out[i];
    free(out);
    return l;
}

/* Compares analytic[i] with the central difference of the loss in x[i]. */
static void expect_grad(check *c, const char *name, double *x, const double *analytic, size_t n) {
    const double h = 1e-5;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + h;
        double lp = loss(c);
        x[i] = saved - h;
        double lm = loss(c);
        x[i] = saved;
        double numeric = (lp - lm) / (2 * h);
        double err = fabs(numeric - analytic[i]) / fmax(1.0, fabs(numeric));
        if (err > worst) worst = err;
        if (err > 1e-7) {
            fprintf(stderr, "%s[%zu]: analytic %.12g numeric %.12g\n", name, i, analytic[i], numeric);
            fail();
        }
    }
    printf("  %-40s %5zu elements, max error %.2e\n", name, n, worst);
}

/* ---- matmul ---- */
typedef struct { double *inp, *w; int T, K, N; } mm_ctx;
static void mm_fwd(check *c, double *out) { mm_ctx *m = c->ctx; trill_matmul_forward_f64(out, m->inp, m->w, m->T, m->K, m->N); }

static void test_matmul(void **state) {
    (void)state;
    mm_ctx m = { randn(5 * 7, 1), randn(3 * 7, 1), 5, 7, 3 };
    double *G = randn(5 * 3, 1), *dinp = zeros(5 * 7), *dw = zeros(3 * 7);
    check c = { mm_fwd, &m, 15, G };
    trill_matmul_backward_f64(dinp, dw, G, m.inp, m.w, 5, 7, 3);
    expect_grad(&c, "matmul dinp", m.inp, dinp, 35);
    expect_grad(&c, "matmul dweight", m.w, dw, 21);
    free(m.inp); free(m.w); free(G); free(dinp); free(dw);
}

/* ---- rmsnorm ---- */
typedef struct { double *inp, *w; int T, C; } rn_ctx;
static void rn_fwd(check *c, double *out) { rn_ctx *r = c->ctx; trill_rmsnorm_forward_f64(out, r->inp, r->w, r->T, r->C, 1e-6); }

static void test_rmsnorm(void **state) {
    (void)state;
    rn_ctx r = { randn(4 * 6, 1), randn(6, 1), 4, 6 };
    double *G = randn(24, 1), *dx = zeros(24), *dw = zeros(6);
    check c = { rn_fwd, &r, 24, G };
    trill_rmsnorm_backward_f64(dx, dw, G, r.inp, r.w, 4, 6, 1e-6);
    expect_grad(&c, "rmsnorm dinp", r.inp, dx, 24);
    expect_grad(&c, "rmsnorm dweight", r.w, dw, 6);
    free(r.inp); free(r.w); free(G); free(dx); free(dw);
}

/* ---- rope ---- */
typedef struct { double *x, inv[4]; int pos[3]; } rope_ctx;
static void rope_fwd(check *c, double *out) {
    rope_ctx *r = c->ctx;
    memcpy(out, r->x, sizeof(double) * 3 * 2 * 8);
    trill_rope_forward_f64(out, r->pos, r->inv, 3, 2, 8);
}

static void test_rope(void **state) {
    (void)state;
    rope_ctx r = { randn(48, 1), { 0 }, { 0, 5, 17 } };
    trill_rope_inv_freq_f64(r.inv, 8, 10000.0);
    double *G = randn(48, 1), *dx = malloc(48 * sizeof(double));
    memcpy(dx, G, 48 * sizeof(double));
    trill_rope_backward_f64(dx, r.pos, r.inv, 3, 2, 8);
    check c = { rope_fwd, &r, 48, G };
    expect_grad(&c, "rope dx", r.x, dx, 48);
    free(r.x); free(G); free(dx);
}

/* ---- rope on part of each head: heads of 10, dims 3..8 rotated, both pairings, cos/sin x 1.3 ---- */
enum { RPT = 3, RPH = 2, RPS = 10, RPO = 3, RPD = 6 };
typedef struct { double *x, inv[RPD / 2]; int pos[RPT]; int pairing; double scale; } rope_part_ctx;
static void rope_part_fwd(check *c, double *out) {
    rope_part_ctx *r = c->ctx;
    memcpy(out, r->x, sizeof(double) * RPT * RPH * RPS);
    trill_rope_partial_forward_f64(out, r->pos, r->inv, RPT, RPH, RPS, RPO, RPD, r->pairing, r->scale);
}

static void test_rope_partial(void **state) {
    (void)state;
    for (int pairing = ROPE_ROTATE_HALF; pairing <= ROPE_ADJACENT; pairing++)
        for (int scaled = 0; scaled < 2; scaled++) {
            const size_t n = RPT * RPH * RPS;
            rope_part_ctx r = { randn(n, 1), { 0 }, { 3, 0, 41 }, pairing, scaled ? 1.3 : 1.0 };
            trill_rope_inv_freq_yarn_f64(r.inv, RPD, 10000.0, 8.0, 64, 32, 1, 0, 0, 1);
            double *G = randn(n, 1), *dx = malloc(n * sizeof(double));
            memcpy(dx, G, n * sizeof(double));
            trill_rope_partial_backward_f64(dx, r.pos, r.inv, RPT, RPH, RPS, RPO, RPD, pairing, r.scale);
            check c = { rope_part_fwd, &r, n, G };
            char name[64];
            snprintf(name, sizeof name, "rope partial %s%s dx", pairing == ROPE_ADJACENT ? "adjacent" : "half", scaled ? " x1.3" : "");
            expect_grad(&c, name, r.x, dx, n);
            free(r.x); free(G); free(dx);
        }
}

/* ---- attention: two sequences (3 and 5 tokens), 4 query heads over 2 kv heads; q/k heads of
 * hd, v heads of hv, softmax scale `scale`; a sliding window of `window` positions (0: none)
 * and per-head sinks (gpt-oss) when `sinks` ---- */
enum { AT = 8, ANH = 4, ANKV = 2 };
typedef struct { double *q, *k, *v; int offsets[3]; int hd, hv; double scale; trill_attention_opts_f64 opts; } at_ctx;
static void at_fwd(check *c, double *out) {
    at_ctx *a = c->ctx;
    assert_int_equal(trill_attention_forward_f64(out, a->q, a->k, a->v, a->offsets, 2, ANH, ANKV, a->hd, a->hv, a->scale, TRILL_PRECISION_FP32,
                                                 &a->opts), TRILL_OK);
}

static void attention_case(int hd, int hv, double scale, int window, bool sinks) {
    const size_t nq = AT * ANH * hd, nk = AT * ANKV * hd, nv = AT * ANKV * hv, no = AT * ANH * hv;
    at_ctx a = { randn(nq, 1), randn(nk, 1), randn(nv, 1), { 0, 3, 8 }, hd, hv, scale, { .window = window } };
    double *s = sinks ? randn(ANH, 1) : NULL, *ds = zeros(ANH);
    a.opts.sinks = s;
    double *G = randn(no, 1), *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nv);
    trill_attention_opts_f64 bo = { .window = window, .sinks = s, .dsinks = ds };
    assert_int_equal(trill_attention_backward_f64(dq, dk, dv, G, a.q, a.k, a.v, a.offsets, 2, ANH, ANKV, hd, hv, scale, TRILL_PRECISION_FP32, &bo),
                     TRILL_OK);
    check c = { at_fwd, &a, no, G };
    char name[4][96];
    for (int i = 0; i < 4; i++)
        snprintf(name[i], sizeof name[i], "attention %d/%d window %d%s d%s", hd, hv, window, sinks ? " sinks" : "",
                 i == 0 ? "q" : i == 1 ? "k" : i == 2 ? "v" : "sinks");
    expect_grad(&c, name[0], a.q, dq, nq);
    expect_grad(&c, name[1], a.k, dk, nk);
    expect_grad(&c, name[2], a.v, dv, nv);
    if (sinks) expect_grad(&c, name[3], s, ds, ANH);
    free(a.q); free(a.k); free(a.v); free(G); free(dq); free(dk); free(dv); free(s); free(ds);
}

static void test_attention(void **state) {
    (void)state;
    attention_case(4, 4, 1 / sqrt(4.0), 0, false); /* Qwen3: equal head sizes, 1/sqrt(hd) */
    attention_case(6, 3, 0.37, 0, false);          /* MLA-like: larger q/k heads, an explicit scale */
    attention_case(3, 5, 0.8, 0, false);           /* larger value heads */
    attention_case(4, 4, 0.5, 2, false);           /* a sliding window of 2 (the 5-token sequence slides) */
    attention_case(4, 4, 0.5, 0, true);            /* gpt-oss's sinks */
    attention_case(4, 4, 0.5, 3, true);            /* both, gpt-oss's sliding layers */
}

/* ---- swiglu ---- */
typedef struct { double *g, *u; } sw_ctx;
static void sw_fwd(check *c, double *out) { sw_ctx *s = c->ctx; trill_swiglu_forward_f64(out, s->g, s->u, 20); }

static void test_swiglu(void **state) {
    (void)state;
    sw_ctx s = { randn(20, 2), randn(20, 1) };
    double *G = randn(20, 1), *dg = zeros(20), *du = zeros(20);
    trill_swiglu_backward_f64(dg, du, G, s.g, s.u, 20);
    check c = { sw_fwd, &s, 20, G };
    expect_grad(&c, "swiglu dgate", s.g, dg, 20);
    expect_grad(&c, "swiglu dup", s.u, du, 20);
    free(s.g); free(s.u); free(G); free(dg); free(du);
}

/* gpt-oss's clamped SwiGLU, limit 0.8 and alpha 1.702: inputs N(0, 1.5), so both clamps cut some
 * (no input within 1e-3 of a bound, where the central difference would straddle the kink). */
static void swc_fwd(check *c, double *out) { sw_ctx *s = c->ctx; trill_swiglu_clamped_forward_f64(out, s->g, s->u, 40, 0.8, 1.702); }

static void test_swiglu_clamped(void **state) {
    (void)state;
    sw_ctx s = { randn(40, 1.5), randn(40, 1.5) };
    int cut_g = 0, cut_u = 0;
    for (int i = 0; i < 40; i++) {
        if (fabs(fabs(s.g[i]) - 0.8) < 1e-3) s.g[i] += 0.01;
        if (fabs(fabs(s.u[i]) - 0.8) < 1e-3) s.u[i] += 0.01;
        cut_g += s.g[i] > 0.8, cut_u += fabs(s.u[i]) > 0.8;
    }
    assert_true(cut_g > 0 && cut_u > 0 && cut_g < 40 && cut_u < 40);
    double *G = randn(40, 1), *dg = zeros(40), *du = zeros(40);
    trill_swiglu_clamped_backward_f64(dg, du, G, s.g, s.u, 40, 0.8, 1.702);
    check c = { swc_fwd, &s, 40, G };
    expect_grad(&c, "clamped swiglu dgate", s.g, dg, 40);
    expect_grad(&c, "clamped swiglu dup", s.u, du, 40);
    free(s.g); free(s.u); free(G); free(dg); free(du);
}

/* ---- the Gated DeltaNet layer's conv1d, l2norm and gated RMSNorm ---- */
enum { CV_C = 3, CV_K = 4 };
typedef struct { double *x, *w, *s0; int offsets[3]; } cv_ctx;
static void cv_fwd(check *c, double *out) { /* outputs, then the final states */
    cv_ctx *x = c->ctx;
    trill_conv1d_causal_forward_f64(out, out + (size_t)x->offsets[2] * CV_C, x->x, x->w, x->s0, x->offsets, 2, CV_C, CV_K);
}

/* Two sequences of 2 and 9 steps (the first shorter than the kernel: its state passes through
 * into the output state), each from a given state. */
static void test_conv1d(void **state) {
    (void)state;
    enum { T = 11 };
    const size_t n_s = 2 * CV_C * (CV_K - 1), n_out = T * CV_C + n_s;
    cv_ctx x = { randn(T * CV_C, 1), randn(CV_C * CV_K, 0.7), randn(n_s, 1), { 0, 2, T } };
    double *G = randn(n_out, 1), *dx = zeros(T * CV_C), *dw = zeros(CV_C * CV_K), *ds = zeros(n_s);
    trill_conv1d_causal_backward_f64(dx, dw, ds, G, x.x, x.w, x.s0, x.offsets, 2, CV_C, CV_K);
    /* the final states' gradient: it flows to the inputs (or the initial state) they copy */
    for (int sq = 0; sq < 2; sq++)
        for (int c = 0; c < CV_C; c++)
            for (int j = 0; j < CV_K - 1; j++) {
                const int n = x.offsets[sq + 1] - x.offsets[sq], p = n - (CV_K - 1) + j;
                const double gs = G[T * CV_C + ((size_t)sq * CV_C + c) * (CV_K - 1) + j];
                if (p >= 0) dx[(size_t)(x.offsets[sq] + p) * CV_C + c] += gs;
                else ds[((size_t)sq * CV_C + c) * (CV_K - 1) + CV_K - 1 + p] += gs;
            }
    check c = { cv_fwd, &x, n_out, G };
    expect_grad(&c, "conv1d dx", x.x, dx, T * CV_C);
    expect_grad(&c, "conv1d dweight", x.w, dw, CV_C * CV_K);
    expect_grad(&c, "conv1d dstate0", x.s0, ds, n_s);
    free(x.x); free(x.w); free(x.s0); free(G); free(dx); free(dw); free(ds);
}

typedef struct { double *x, *z, *w; } nz_ctx;
static void l2_fwd(check *c, double *out) { nz_ctx *n = c->ctx; trill_l2norm_forward_f64(out, n->x, 4, 6, 1e-6); }
static void rg_fwd(check *c, double *out) { nz_ctx *n = c->ctx; trill_rmsnorm_gated_forward_f64(out, n->x, n->z, n->w, 4, 6, 1e-6); }

static void test_norms_gdn(void **state) {
    (void)state;
    nz_ctx n = { randn(24, 1), randn(24, 1.5), randn(6, 1) };
    double *G = randn(24, 1), *dx = zeros(24), *dz = zeros(24), *dw = zeros(6);
    trill_l2norm_backward_f64(dx, G, n.x, 4, 6, 1e-6);
    check c = { l2_fwd, &n, 24, G };
    expect_grad(&c, "l2norm dx", n.x, dx, 24);
    memset(dx, 0, 24 * sizeof *dx);
    assert_int_equal(trill_rmsnorm_gated_backward_f64(dx, dz, dw, G, n.x, n.z, n.w, 4, 6, 1e-6), TRILL_OK);
    check r = { rg_fwd, &n, 24, G };
    expect_grad(&r, "gated rmsnorm dx", n.x, dx, 24);
    expect_grad(&r, "gated rmsnorm dz", n.z, dz, 24);
    expect_grad(&r, "gated rmsnorm dweight", n.w, dw, 6);
    free(n.x); free(n.z); free(n.w); free(G); free(dx); free(dz); free(dw);
}

/* ---- the gated delta rule (recurrent form) ---- */
enum { GDN_NH = 2, GDN_DK = 4, GDN_DV = 3 };
typedef struct { double *q, *k, *v, *g, *beta, *s0; int offsets[3]; int chunked; } gdn_ctx;
static void gdn_fwd(check *c, double *out) { /* out: the outputs, then the final states */
    gdn_ctx *x = c->ctx;
    const int T = x->offsets[2];
    if (x->chunked)
        assert_int_equal(trill_gdn_chunked_forward_f64(out, out + (size_t)T * GDN_NH * GDN_DV, x->q, x->k, x->v, x->g, x->beta, x->s0,
                                                       x->offsets, 2, GDN_NH, GDN_DK, GDN_DV),
                         TRILL_OK);
    else
        trill_gdn_recurrent_forward_f64(out, out + (size_t)T * GDN_NH * GDN_DV, x->q, x->k, x->v, x->g, x->beta, x->s0, x->offsets, 2, GDN_NH,
                                        GDN_DK, GDN_DV);
}

/* Two sequences, 5 and 70 steps (past one 64-step chunk of the backward's kept states), from
 * given states; the loss reads the outputs and the final states. The forward also equals the
 * recurrence written out here as HF writes it (to 1e-12). */
static void test_gdn(void **state) {
    (void)state;
    enum { T = 75 };
    const size_t nk = (size_t)T * GDN_NH * GDN_DK, nv = (size_t)T * GDN_NH * GDN_DV, ng = (size_t)T * GDN_NH;
    const size_t ns = 2 * (size_t)GDN_NH * GDN_DK * GDN_DV, n_out = nv + ns;
    gdn_ctx x = { randn(nk, 0.5), randn(nk, 0.5), randn(nv, 1), randn(ng, 0.5), randn(ng, 1), randn(ns, 0.5), { 0, 5, T }, 0 };
    for (size_t i = 0; i < ng; i++) {
        x.g[i] = -log1p(exp(x.g[i])) * 0.2;   /* log decay < 0: -softplus */
        x.beta[i] = 1 / (1 + exp(-x.beta[i])); /* sigmoid */
    }
    /* the recurrence as HF's torch_recurrent_gated_delta_rule writes it */
    double *out = zeros(n_out), *want = zeros(nv);
    trill_gdn_recurrent_forward_f64(out, out + nv, x.q, x.k, x.v, x.g, x.beta, x.s0, x.offsets, 2, GDN_NH, GDN_DK, GDN_DV);
    double worst_fwd = 0;
    for (int sq = 0; sq < 2; sq++)
        for (int h = 0; h < GDN_NH; h++) {
            double S[GDN_DK][GDN_DV];
            memcpy(S, x.s0 + ((size_t)sq * GDN_NH + h) * GDN_DK * GDN_DV, sizeof S);
            for (int t = x.offsets[sq]; t < x.offsets[sq + 1]; t++) {
                const double *q = x.q + ((size_t)t * GDN_NH + h) * GDN_DK, *k = x.k + ((size_t)t * GDN_NH + h) * GDN_DK;
                const double *v = x.v + ((size_t)t * GDN_NH + h) * GDN_DV;
                const double decay = exp(x.g[(size_t)t * GDN_NH + h]), b = x.beta[(size_t)t * GDN_NH + h];
                double kv_mem[GDN_DV] = { 0 };
                for (int i = 0; i < GDN_DK; i++)
                    for (int j = 0; j < GDN_DV; j++) S[i][j] *= decay, kv_mem[j] += S[i][j] * k[i];
                for (int i = 0; i < GDN_DK; i++)
                    for (int j = 0; j < GDN_DV; j++) S[i][j] += k[i] * (v[j] - kv_mem[j]) * b;
                for (int j = 0; j < GDN_DV; j++) {
                    double o = 0;
                    for (int i = 0; i < GDN_DK; i++) o += S[i][j] * q[i];
                    want[((size_t)t * GDN_NH + h) * GDN_DV + j] = o;
                    worst_fwd = fmax(worst_fwd, fabs(o - out[((size_t)t * GDN_NH + h) * GDN_DV + j]));
                }
            }
            for (int i = 0; i < GDN_DK; i++)
                for (int j = 0; j < GDN_DV; j++)
                    worst_fwd = fmax(worst_fwd, fabs(S[i][j] - out[nv + ((size_t)sq * GDN_NH + h) * GDN_DK * GDN_DV + (size_t)i * GDN_DV + j]));
        }
    printf("  gated delta rule forward vs HF's recurrence written out: max |d| %.2e\n", worst_fwd);
    assert_true(worst_fwd < 1e-12);
    /* the chunked form (70 steps: a chunk of 64 and one of 6): the same outputs and final states,
     * in double to 1e-11 and in float (both forms) within float rounding of double's */
    double *chunked = zeros(n_out);
    assert_int_equal(trill_gdn_chunked_forward_f64(chunked, chunked + nv, x.q, x.k, x.v, x.g, x.beta, x.s0, x.offsets, 2, GDN_NH, GDN_DK, GDN_DV),
                     TRILL_OK);
    double worst_chunk = 0, worst_f32 = 0;
    for (size_t i = 0; i < n_out; i++) worst_chunk = fmax(worst_chunk, fabs(chunked[i] - out[i]));
    float *f[8];
    const size_t sizes[8] = { nk, nk, nv, ng, ng, ns, n_out, n_out };
    const double *src[6] = { x.q, x.k, x.v, x.g, x.beta, x.s0 };
    for (int a = 0; a < 8; a++) {
        f[a] = calloc(sizes[a], sizeof(float));
        for (size_t i = 0; a < 6 && i < sizes[a]; i++) f[a][i] = (float)src[a][i];
    }
    trill_gdn_recurrent_forward(f[6], f[6] + nv, f[0], f[1], f[2], f[3], f[4], f[5], x.offsets, 2, GDN_NH, GDN_DK, GDN_DV);
    assert_int_equal(trill_gdn_chunked_forward(f[7], f[7] + nv, f[0], f[1], f[2], f[3], f[4], f[5], x.offsets, 2, GDN_NH, GDN_DK, GDN_DV), TRILL_OK);
    for (size_t i = 0; i < n_out; i++) worst_f32 = fmax(worst_f32, fmax(fabs(f[6][i] - out[i]), fabs(f[7][i] - out[i])));
    printf("  chunked vs recurrent: max |d| %.2e in double; both forms in float vs double: %.2e\n", worst_chunk, worst_f32);
    assert_true(worst_chunk < 1e-11);
    assert_true(worst_f32 < 1e-5);
    for (int a = 0; a < 8; a++) free(f[a]);
    free(chunked);
    /* and a longer one, 300 steps (4 whole chunks and a partial one) of heads 32 x 16 from zero:
     * the two forms agree to 1e-10 in double */
    {
        enum { TL = 300, DK = 32, DV = 16 };
        const int off[2] = { 0, TL };
        double *q = randn(TL * DK, 0.2), *k = randn(TL * DK, 0.2), *v = randn(TL * DV, 1), *g = randn(TL, 0.5), *b = randn(TL, 1);
        for (int i = 0; i < TL; i++) g[i] = -log1p(exp(g[i])) * 0.1, b[i] = 1 / (1 + exp(-b[i]));
        double *o1 = zeros(TL * DV + DK * DV), *o2 = zeros(TL * DV + DK * DV), worst = 0;
        trill_gdn_recurrent_forward_f64(o1, o1 + TL * DV, q, k, v, g, b, NULL, off, 1, 1, DK, DV);
        assert_int_equal(trill_gdn_chunked_forward_f64(o2, o2 + TL * DV, q, k, v, g, b, NULL, off, 1, 1, DK, DV), TRILL_OK);
        for (int i = 0; i < TL * DV + DK * DV; i++) worst = fmax(worst, fabs(o1[i] - o2[i]));
        printf("  chunked vs recurrent, 300 steps of 32 x 16: max |d| %.2e\n", worst);
        assert_true(worst < 1e-10);
        free(q); free(k); free(v); free(g); free(b); free(o1); free(o2);
    }
    double *G = randn(n_out, 1), *dq = zeros(nk), *dk = zeros(nk), *dv = zeros(nv), *dg = zeros(ng), *db = zeros(ng), *ds0 = zeros(ns);
    assert_int_equal(trill_gdn_recurrent_backward_f64(dq, dk, dv, dg, db, ds0, G, G + nv, x.q, x.k, x.v, x.g, x.beta, x.s0, x.offsets, 2, GDN_NH,
                                                      GDN_DK, GDN_DV), TRILL_OK);
    check c = { gdn_fwd, &x, n_out, G };
    expect_grad(&c, "gated delta rule dq", x.q, dq, nk);
    expect_grad(&c, "gated delta rule dk", x.k, dk, nk);
    expect_grad(&c, "gated delta rule dv", x.v, dv, nv);
    expect_grad(&c, "gated delta rule dg", x.g, dg, ng);
    expect_grad(&c, "gated delta rule dbeta", x.beta, db, ng);
    expect_grad(&c, "gated delta rule dstate0", x.s0, ds0, ns);
    /* the chunked form's backward: against finite differences of the chunked forward, and equal
     * to the recurrent form's in double */
    {
        double *cg[6] = { zeros(nk), zeros(nk), zeros(nv), zeros(ng), zeros(ng), zeros(ns) };
        const double *rg[6] = { dq, dk, dv, dg, db, ds0 };
        const size_t cn[6] = { nk, nk, nv, ng, ng, ns };
        assert_int_equal(trill_gdn_chunked_backward_f64(cg[0], cg[1], cg[2], cg[3], cg[4], cg[5], G, G + nv, x.q, x.k, x.v, x.g, x.beta, x.s0,
                                                        x.offsets, 2, GDN_NH, GDN_DK, GDN_DV),
                         TRILL_OK);
        gdn_ctx xc = x;
        xc.chunked = 1;
        check cc = { gdn_fwd, &xc, n_out, G };
        const char *names[6] = { "chunked dq", "chunked dk", "chunked dv", "chunked dg", "chunked dbeta", "chunked dstate0" };
        double *wrt[6] = { x.q, x.k, x.v, x.g, x.beta, x.s0 }, worst = 0;
        for (int a = 0; a < 6; a++) {
            expect_grad(&cc, names[a], wrt[a], cg[a], cn[a]);
            for (size_t i = 0; i < cn[a]; i++) worst = fmax(worst, fabs(cg[a][i] - rg[a][i]) / (1 + fabs(rg[a][i])));
            free(cg[a]);
        }
        printf("  chunked vs recurrent backward in double: max relative |d| %.2e\n", worst);
        assert_true(worst < 1e-10);
    }
    free(x.q); free(x.k); free(x.v); free(x.g); free(x.beta); free(x.s0);
    free(out); free(want); free(G); free(dq); free(dk); free(dv); free(dg); free(db); free(ds0);
}

/* The two forms in float against the recurrence in double, one head of 32 x 32 over 300 steps
 * (4 whole chunks and a partial one) under decays from mild to strong (g down to about -50 a
 * step, as A_log's init up to log 16 gives: a chunk's cumulative decay reaches -1e3 and more,
 * where a float cumulative sum would lose exp(G_i - G_j)'s digits between near positions; the
 * chunked form sums it in double): outputs, final state and every gradient within a few float
 * roundings of double's. */
static void test_gdn_float(void **state) {
    (void)state;
    enum { T = 300, D = 32 };
    const int off[2] = { 0, T };
    const size_t nk = (size_t)T * D, ng = T, ns = (size_t)D * D, n_out = nk + ns;
    const double scales[3] = { 0.01, 1, 16 };
    for (int sc = 0; sc < 3; sc++) {
        double *x[5] = { randn(nk, 1), randn(nk, 1), randn(nk, 1), randn(ng, 1.6), randn(ng, 1) };
        for (int t = 0; t < T; t++) {
            double nq = 0, nn = 0;
            for (int i = 0; i < D; i++) nq += x[0][t * D + i] * x[0][t * D + i], nn += x[1][t * D + i] * x[1][t * D + i];
            for (int i = 0; i < D; i++) x[0][t * D + i] /= sqrt(nq * D), x[1][t * D + i] /= sqrt(nn);
            x[3][t] = -scales[sc] * log1p(exp(x[3][t] + 1)), x[4][t] = 1 / (1 + exp(-x[4][t]));
        }
        const size_t n[5] = { nk, nk, nk, ng, ng };
        float *f[5];
        for (int a = 0; a < 5; a++) { /* the float inputs, and double's made exactly them */
            f[a] = malloc(n[a] * sizeof(float));
            for (size_t i = 0; i < n[a]; i++) f[a][i] = (float)x[a][i], x[a][i] = f[a][i];
        }
        double *want = zeros(n_out), *G = randn(n_out, 1), *dw[5];
        float *got[2], *Gf = malloc(n_out * sizeof(float)), *df[2][5];
        for (size_t i = 0; i < n_out; i++) Gf[i] = (float)G[i], G[i] = Gf[i];
        trill_gdn_recurrent_forward_f64(want, want + nk, x[0], x[1], x[2], x[3], x[4], NULL, off, 1, 1, D, D);
        for (int a = 0; a < 5; a++) dw[a] = zeros(n[a]), df[0][a] = calloc(n[a], sizeof(float)), df[1][a] = calloc(n[a], sizeof(float));
        assert_int_equal(trill_gdn_recurrent_backward_f64(dw[0], dw[1], dw[2], dw[3], dw[4], NULL, G, G + nk, x[0], x[1], x[2], x[3], x[4], NULL,
                                                          off, 1, 1, D, D),
                         TRILL_OK);
        double err_o[2] = { 0, 0 }, err_g[2] = { 0, 0 }, scale_o = 0;
        for (int form = 0; form < 2; form++) {
            got[form] = calloc(n_out, sizeof(float));
            if (form == 0) {
                trill_gdn_recurrent_forward(got[0], got[0] + nk, f[0], f[1], f[2], f[3], f[4], NULL, off, 1, 1, D, D);
                assert_int_equal(trill_gdn_recurrent_backward(df[0][0], df[0][1], df[0][2], df[0][3], df[0][4], NULL, Gf, Gf + nk, f[0], f[1], f[2],
                                                              f[3], f[4], NULL, off, 1, 1, D, D),
                                 TRILL_OK);
            } else {
                assert_int_equal(trill_gdn_chunked_forward(got[1], got[1] + nk, f[0], f[1], f[2], f[3], f[4], NULL, off, 1, 1, D, D), TRILL_OK);
                assert_int_equal(trill_gdn_chunked_backward(df[1][0], df[1][1], df[1][2], df[1][3], df[1][4], NULL, Gf, Gf + nk, f[0], f[1], f[2],
                                                            f[3], f[4], NULL, off, 1, 1, D, D),
                                 TRILL_OK);
            }
            for (size_t i = 0; i < n_out; i++) err_o[form] = fmax(err_o[form], fabs(got[form][i] - want[i])), scale_o = fmax(scale_o, fabs(want[i]));
            for (int a = 0; a < 5; a++) {
                double big = 0;
                for (size_t i = 0; i < n[a]; i++) big = fmax(big, fabs(dw[a][i]));
                for (size_t i = 0; i < n[a]; i++) err_g[form] = fmax(err_g[form], fabs(df[form][a][i] - dw[a][i]) / (big + 1e-30));
            }
        }
        printf("  float vs double, decay x%g: outputs and state (max %.2g): recurrent %.2e, chunked %.2e; gradients (relative to each "
               "one's largest): recurrent %.2e, chunked %.2e\n",
               scales[sc], scale_o, err_o[0], err_o[1], err_g[0], err_g[1]);
        assert_true(err_o[1] < 4e-7 * scale_o && err_o[0] < 4e-7 * scale_o);
        assert_true(err_g[1] < 1.5e-5 && err_g[0] < 1.5e-5);
        for (int a = 0; a < 5; a++) free(x[a]), free(f[a]), free(dw[a]), free(df[0][a]), free(df[1][a]);
        free(want); free(G); free(Gf); free(got[0]); free(got[1]);
    }
}

/* ---- router: logits -> softmax or sigmoid scores -> gates at the routed ids (own choice, or
 * replayed ids), renormalised (Qwen3: / sum; DeepSeek: / (sum + 1e-20)) or not, scaled ---- */
enum { RT = 3, RE = 8, RK = 2 };
typedef struct { double *logits; int idx[RT * RK]; int sigmoid, norm; double eps, scaling; } rt_ctx;
static void rt_scores(const rt_ctx *r, double *scores) {
    if (r->sigmoid) trill_sigmoid_forward_f64(scores, r->logits, RT * RE);
    else trill_softmax_forward_f64(scores, r->logits, RT, RE);
}
static void rt_fwd(check *c, double *out) {
    rt_ctx *r = c->ctx;
    double scores[RT * RE];
    rt_scores(r, scores);
    trill_router_gates_forward_f64(out, scores, r->idx, RT, RE, RK, r->norm, r->eps, r->scaling);
}

static void router_case(int sigmoid, int norm, double eps, double scaling, int replay) {
    rt_ctx r = { randn(RT * RE, 1.5), { 0 }, sigmoid, norm, eps, scaling };
    double scores[RT * RE], vals[RT * RK];
    rt_scores(&r, scores);
    if (replay) { /* ids another engine chose: not the top-k here */
        const int forced[RT * RK] = { 5, 0, 2, 7, 1, 4 };
        memcpy(r.idx, forced, sizeof forced);
    } else if (sigmoid) { /* DeepSeek's choice: a selection bias, the best 2 of 4 groups */
        const double bias[RE] = { 0.1, -0.2, 0.05, 0, 0.3, -0.1, 0, 0.2 };
        assert_int_equal(trill_router_topk_forward_f64(r.idx, vals, scores, bias, RT, RE, RK, 4, 2), TRILL_OK);
    } else {
        trill_topk_forward_f64(r.idx, vals, scores, RT, RE, RK);
    }
    double *G = randn(RT * RK, 1), *dsel = malloc(sizeof(double) * RT * RK), *dl = zeros(RT * RE);
    trill_router_gates_backward_f64(dsel, G, scores, r.idx, RT, RE, RK, norm, eps, scaling);
    if (sigmoid) trill_router_sigmoid_backward_f64(dl, dsel, scores, r.idx, RT, RE, RK);
    else trill_router_softmax_backward_f64(dl, dsel, scores, r.idx, RT, RE, RK);
    check c = { rt_fwd, &r, RT * RK, G };
    char name[80];
    snprintf(name, sizeof name, "router %s%s%s %s", sigmoid ? "sigmoid" : "softmax", norm ? " norm" : "", scaling != 1 ? " x2.5" : "",
             replay ? "replay" : "top-k");
    if (norm && eps) snprintf(name + strlen(name), sizeof name - strlen(name), " eps %g", eps);
    expect_grad(&c, name, r.logits, dl, RT * RE);
    free(r.logits); free(G); free(dsel); free(dl);
}

static void test_router(void **state) {
    (void)state;
    for (int sigmoid = 0; sigmoid < 2; sigmoid++)
        for (int replay = 0; replay < 2; replay++) {
            router_case(sigmoid, 0, 0, 1, replay);     /* gates = scores at the ids */
            router_case(sigmoid, 1, 0, 1, replay);     /* Qwen3 norm_topk_prob */
            router_case(sigmoid, 1, 1e-20, 2.5, replay); /* DeepSeek: norm with eps, routed_scaling_factor */
            router_case(sigmoid, 1, 0.05, 1, replay);  /* an eps large enough to count */
            router_case(sigmoid, 0, 0, 2.5, replay);
        }
    /* the gradient written in place over dgates equals the one written elsewhere */
    double scores[RE] = { 0.1, 0.3, 0.05, 0.2, 0.15, 0.1, 0.07, 0.03 }, dg[2] = { 0.7, -1.1 }, out[2];
    const int idx[2] = { 3, 1 };
    trill_router_gates_backward_f64(out, dg, scores, idx, 1, RE, 2, 1, 1e-20, 2.5);
    trill_router_gates_backward_f64(dg, dg, scores, idx, 1, RE, 2, 1, 1e-20, 2.5);
    assert_memory_equal(out, dg, sizeof out);
}

/* ---- token log-prob / cross-entropy ---- */
typedef struct { double *logits; int targets[3]; } lp_ctx;
static void lp_fwd(check *c, double *out) { lp_ctx *l = c->ctx; trill_token_logprob_forward_f64(out, l->logits, l->targets, 3, 11); }

static void test_token_logprob(void **state) {
    (void)state;
    lp_ctx l = { randn(33, 2), { 4, 0, 10 } };
    double *G = randn(3, 1), *dl = zeros(33);
    trill_token_logprob_backward_f64(dl, G, l.logits, l.targets, 3, 11);
    check c = { lp_fwd, &l, 3, G };
    expect_grad(&c, "token_logprob dlogits", l.logits, dl, 33);
    free(l.logits); free(G); free(dl);
}

/* ---- embedding (a token repeats: its gradient rows add up) ---- */
typedef struct { double *table; int tokens[4]; } em_ctx;
static void em_fwd(check *c, double *out) { em_ctx *e = c->ctx; trill_embedding_forward_f64(out, e->table, e->tokens, 4, 3); }

static void test_embedding(void **state) {
    (void)state;
    em_ctx e = { randn(5 * 3, 1), { 2, 0, 2, 4 } };
    double *G = randn(12, 1), *dt = zeros(15);
    trill_embedding_backward_f64(dt, G, e.tokens, 4, 3);
    check c = { em_fwd, &e, 12, G };
    expect_grad(&c, "embedding dtable", e.table, dt, 15);
    free(e.table); free(G); free(dt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),  cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_rope), cmocka_unit_test(test_rope_partial),
        cmocka_unit_test(test_attention), cmocka_unit_test(test_swiglu), cmocka_unit_test(test_swiglu_clamped), cmocka_unit_test(test_gdn), cmocka_unit_test(test_gdn_float),
        cmocka_unit_test(test_conv1d), cmocka_unit_test(test_norms_gdn),
        cmocka_unit_test(test_router),
        cmocka_unit_test(test_token_logprob), cmocka_unit_test(test_embedding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
