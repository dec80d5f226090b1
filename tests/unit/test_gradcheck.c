/* Finite-difference gradient checks of every backward kernel, in double precision: the
 * kernels are compiled a second time with REAL = double (src/kernels/ops_f64.c), so the very
 * code trill runs in fp32 is checked to ~1e-9 here. For each kernel, loss = sum(G * f(x)) with
 * a random G; every input and weight element is perturbed by +-h and the central difference
 * compared with the backward pass's gradient. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels_f64.h"
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
    printf("  %-28s %5zu elements, max error %.2e\n", name, n, worst);
}

/* ---- matmul ---- */
typedef struct { double *inp, *w; int T, K, N; } mm_ctx;
static void mm_fwd(check *c, double *out) { mm_ctx *m = c->ctx; matmul_forward_f64(out, m->inp, m->w, m->T, m->K, m->N); }

static void test_matmul(void **state) {
    (void)state;
    mm_ctx m = { randn(5 * 7, 1), randn(3 * 7, 1), 5, 7, 3 };
    double *G = randn(5 * 3, 1), *dinp = zeros(5 * 7), *dw = zeros(3 * 7);
    check c = { mm_fwd, &m, 15, G };
    matmul_backward_f64(dinp, dw, G, m.inp, m.w, 5, 7, 3);
    expect_grad(&c, "matmul dinp", m.inp, dinp, 35);
    expect_grad(&c, "matmul dweight", m.w, dw, 21);
    free(m.inp); free(m.w); free(G); free(dinp); free(dw);
}

/* ---- rmsnorm ---- */
typedef struct { double *inp, *w; int T, C; } rn_ctx;
static void rn_fwd(check *c, double *out) { rn_ctx *r = c->ctx; rmsnorm_forward_f64(out, r->inp, r->w, r->T, r->C, 1e-6); }

static void test_rmsnorm(void **state) {
    (void)state;
    rn_ctx r = { randn(4 * 6, 1), randn(6, 1), 4, 6 };
    double *G = randn(24, 1), *dx = zeros(24), *dw = zeros(6);
    check c = { rn_fwd, &r, 24, G };
    rmsnorm_backward_f64(dx, dw, G, r.inp, r.w, 4, 6, 1e-6);
    expect_grad(&c, "rmsnorm dinp", r.inp, dx, 24);
    expect_grad(&c, "rmsnorm dweight", r.w, dw, 6);
    free(r.inp); free(r.w); free(G); free(dx); free(dw);
}

/* ---- rope ---- */
typedef struct { double *x, inv[4]; int pos[3]; } rope_ctx;
static void rope_fwd(check *c, double *out) {
    rope_ctx *r = c->ctx;
    memcpy(out, r->x, sizeof(double) * 3 * 2 * 8);
    rope_forward_f64(out, r->pos, r->inv, 3, 2, 8);
}

static void test_rope(void **state) {
    (void)state;
    rope_ctx r = { randn(48, 1), { 0 }, { 0, 5, 17 } };
    rope_inv_freq_f64(r.inv, 8, 10000.0);
    double *G = randn(48, 1), *dx = malloc(48 * sizeof(double));
    memcpy(dx, G, 48 * sizeof(double));
    rope_backward_f64(dx, r.pos, r.inv, 3, 2, 8);
    check c = { rope_fwd, &r, 48, G };
    expect_grad(&c, "rope dx", r.x, dx, 48);
    free(r.x); free(G); free(dx);
}

/* ---- attention: two sequences (3 and 5 tokens), 4 query heads over 2 kv heads ---- */
enum { AT = 8, ANH = 4, ANKV = 2, AHD = 4 };
typedef struct { double *q, *k, *v; int offsets[3]; } at_ctx;
static void at_fwd(check *c, double *out) {
    at_ctx *a = c->ctx;
    attention_forward_f64(out, a->q, a->k, a->v, a->offsets, 2, ANH, ANKV, AHD);
}

static void test_attention(void **state) {
    (void)state;
    at_ctx a = { randn(AT * ANH * AHD, 1), randn(AT * ANKV * AHD, 1), randn(AT * ANKV * AHD, 1), { 0, 3, 8 } };
    double *G = randn(AT * ANH * AHD, 1), *dq = zeros(AT * ANH * AHD), *dk = zeros(AT * ANKV * AHD), *dv = zeros(AT * ANKV * AHD);
    attention_backward_f64(dq, dk, dv, G, a.q, a.k, a.v, a.offsets, 2, ANH, ANKV, AHD);
    check c = { at_fwd, &a, AT * ANH * AHD, G };
    expect_grad(&c, "attention dq", a.q, dq, AT * ANH * AHD);
    expect_grad(&c, "attention dk", a.k, dk, AT * ANKV * AHD);
    expect_grad(&c, "attention dv", a.v, dv, AT * ANKV * AHD);
    free(a.q); free(a.k); free(a.v); free(G); free(dq); free(dk); free(dv);
}

/* ---- swiglu ---- */
typedef struct { double *g, *u; } sw_ctx;
static void sw_fwd(check *c, double *out) { sw_ctx *s = c->ctx; swiglu_forward_f64(out, s->g, s->u, 20); }

static void test_swiglu(void **state) {
    (void)state;
    sw_ctx s = { randn(20, 2), randn(20, 1) };
    double *G = randn(20, 1), *dg = zeros(20), *du = zeros(20);
    swiglu_backward_f64(dg, du, G, s.g, s.u, 20);
    check c = { sw_fwd, &s, 20, G };
    expect_grad(&c, "swiglu dgate", s.g, dg, 20);
    expect_grad(&c, "swiglu dup", s.u, du, 20);
    free(s.g); free(s.u); free(G); free(dg); free(du);
}

/* ---- router: logits -> softmax -> gates at the routed ids (own top-k, or replayed ids) ---- */
enum { RT = 3, RE = 6, RK = 2 };
typedef struct { double *logits; int idx[RT * RK]; int norm; } rt_ctx;
static void rt_fwd(check *c, double *out) {
    rt_ctx *r = c->ctx;
    double probs[RT * RE];
    softmax_forward_f64(probs, r->logits, RT, RE);
    router_gates_forward_f64(out, probs, r->idx, RT, RE, RK, r->norm);
}

static void router_case(int norm, int replay) {
    rt_ctx r = { randn(RT * RE, 1.5), { 0 }, norm };
    double probs[RT * RE], vals[RT * RK];
    softmax_forward_f64(probs, r.logits, RT, RE);
    if (replay) { /* ids another engine chose: not the top-k here */
        const int forced[RT * RK] = { 5, 0, 2, 3, 1, 4 };
        memcpy(r.idx, forced, sizeof forced);
    } else {
        topk_forward_f64(r.idx, vals, probs, RT, RE, RK);
    }
    double *G = randn(RT * RK, 1), *dl = zeros(RT * RE);
    router_gates_backward_f64(dl, G, probs, r.idx, RT, RE, RK, norm);
    check c = { rt_fwd, &r, RT * RK, G };
    char name[64];
    snprintf(name, sizeof name, "router %s%s", norm ? "norm_topk " : "", replay ? "replay" : "top-k");
    expect_grad(&c, name, r.logits, dl, RT * RE);
    free(r.logits); free(G); free(dl);
}

static void test_router(void **state) {
    (void)state;
    for (int norm = 0; norm < 2; norm++)
        for (int replay = 0; replay < 2; replay++) router_case(norm, replay);
}

/* ---- token log-prob / cross-entropy ---- */
typedef struct { double *logits; int targets[3]; } lp_ctx;
static void lp_fwd(check *c, double *out) { lp_ctx *l = c->ctx; token_logprob_forward_f64(out, l->logits, l->targets, 3, 11); }

static void test_token_logprob(void **state) {
    (void)state;
    lp_ctx l = { randn(33, 2), { 4, 0, 10 } };
    double *G = randn(3, 1), *dl = zeros(33);
    token_logprob_backward_f64(dl, G, l.logits, l.targets, 3, 11);
    check c = { lp_fwd, &l, 3, G };
    expect_grad(&c, "token_logprob dlogits", l.logits, dl, 33);
    free(l.logits); free(G); free(dl);
}

/* ---- embedding (a token repeats: its gradient rows add up) ---- */
typedef struct { double *table; int tokens[4]; } em_ctx;
static void em_fwd(check *c, double *out) { em_ctx *e = c->ctx; embedding_forward_f64(out, e->table, e->tokens, 4, 3); }

static void test_embedding(void **state) {
    (void)state;
    em_ctx e = { randn(5 * 3, 1), { 2, 0, 2, 4 } };
    double *G = randn(12, 1), *dt = zeros(15);
    embedding_backward_f64(dt, G, e.tokens, 4, 3);
    check c = { em_fwd, &e, 12, G };
    expect_grad(&c, "embedding dtable", e.table, dt, 15);
    free(e.table); free(G); free(dt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),  cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention), cmocka_unit_test(test_swiglu), cmocka_unit_test(test_router),
        cmocka_unit_test(test_token_logprob), cmocka_unit_test(test_embedding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
