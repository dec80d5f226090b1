/* The service's tenant trainer (trill/service.h) on a small MoE: every loss's gradient against
 * central finite differences of its own value through the whole model (PPO and CISPO in and
 * outside their clip band, DRO's penalty, weights, router replay, targets other than the next
 * token), a row's log-prob of any target, trainers sharing one base
 * without touching each other, saved states with and without the optimizer, and the refusals. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "trill/lora.h"
#include "trill/rng.h"
#include "trill/service.h"

static char *g_dir;
static trill_svc_base *g_base;

static int setup(void **state) {
    (void)state;
    g_dir = test_tmpdir("service");
    trill_model *m = test_small_moe(5, false, true);
    assert_int_equal(trill_model_save(m, g_dir, TRILL_F32, 0), TRILL_OK);
    assert_int_equal(trill_model_write_charlevel_files(g_dir, trill_model_config(m)), TRILL_OK);
    trill_model_free(m);
    assert_int_equal(trill_svc_base_load(g_dir, NULL, &g_base), TRILL_OK);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    trill_svc_base_free(g_base);
    test_rmdir(g_dir);
    free(g_dir);
    return 0;
}

/* A trainer whose adapters are all non-zero (B too), so every path has a gradient. */
static trill_svc_trainer *trainer(uint64_t seed) {
    trill_svc_trainer_config c = { .rank = 4, .seed = seed, .train_mlp = true, .train_attn = true, .train_unembed = true };
    trill_svc_trainer *t = NULL;
    assert_int_equal(trill_svc_trainer_create(g_base, &c, &t), TRILL_OK);
    size_t n;
    float *p = trill_lora_params(trill_svc_trainer_lora(t), &n);
    for (size_t i = 0; i < n; i++) p[i] = (float)(0.2 * (trill_rng_uniform(seed, i) - 0.5));
    return t;
}

enum { N_SEQ = 3, LEN = 9 };

/* Three sequences of LEN inputs; q: the sampler's log-probs, set around the trainer's so each
 * ratio sits well inside or outside the clip band [0.8, 1.2] (ratios e^0.5, 1, e^-0.5). */
typedef struct {
    int tokens[N_SEQ][LEN + 1], other[N_SEQ][LEN];
    float w[N_SEQ][LEN], q[N_SEQ][LEN], a[N_SEQ][LEN];
    trill_svc_datum d[N_SEQ];
} batch;

/* The batch; with `arbitrary`, sequence 1's targets are not its next tokens (a distillation-like
 * target on every row). */
static void make_batch(batch *b, trill_svc_trainer *t, bool arbitrary) {
    for (int s = 0; s < N_SEQ; s++) {
        for (int i = 0; i <= LEN; i++) b->tokens[s][i] = (int)(trill_rng_uniform(77 + s, (uint64_t)i) * 128) % 128;
        for (int i = 0; i < LEN; i++) b->other[s][i] = (b->tokens[s][i + 1] * 7 + 3) % 128;
        for (int i = 0; i < LEN; i++) b->w[s][i] = (float)(0.25 + 0.1 * i), b->a[s][i] = (float)(s == 1 ? -1.3 : 0.7 + 0.1 * i);
        b->d[s] = (trill_svc_datum){ .n = LEN, .tokens = b->tokens[s], .targets = arbitrary && s == 1 ? b->other[s] : b->tokens[s] + 1,
                                     .weights = b->w[s] };
    }
    float lp[N_SEQ * LEN];
    double loss;
    assert_int_equal(trill_svc_forward(t, b->d, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &(trill_svc_loss_config){ 0 }, false, lp, &loss), TRILL_OK);
    for (int s = 0; s < N_SEQ; s++) {
        for (int i = 0; i < LEN; i++) b->q[s][i] = lp[s * LEN + i] + (float)(((s + i) % 3) - 1) * 0.5f;
        b->d[s].logprobs = b->q[s], b->d[s].advantages = b->a[s];
    }
}

static double loss_at(trill_svc_trainer *t, const batch *b, trill_loss l, const trill_svc_loss_config *c) {
    float lp[N_SEQ * LEN];
    double loss = 0;
    assert_int_equal(trill_svc_forward(t, b->d, N_SEQ, l, c, false, lp, &loss), TRILL_OK);
    return loss;
}

/* What the gradient is the derivative of: the loss, but CISPO's clipped ratio is a constant
 * (stop-gradient), taken at the log-probs lp0 the gradient was computed at. */
static double surrogate_at(trill_svc_trainer *t, const batch *b, trill_loss l, const trill_svc_loss_config *c, const float *lp0) {
    if (l != TRILL_LOSS_CISPO) return loss_at(t, b, l, c);
    float lp[N_SEQ * LEN];
    double loss = 0, sum = 0;
    assert_int_equal(trill_svc_forward(t, b->d, N_SEQ, l, c, false, lp, &loss), TRILL_OK);
    for (int s = 0; s < N_SEQ; s++)
        for (int i = 0; i < LEN; i++)
            sum += -fmin(c->clip_high, fmax(c->clip_low, exp(lp0[s * LEN + i] - b->q[s][i]))) * b->a[s][i] * lp[s * LEN + i];
    return sum;
}

/* d loss / d adapters . v against (L(p + h v) - L(p - h v)) / 2h, for random directions v. */
static void check_gradient(trill_loss l, const trill_svc_loss_config *c, bool replay, bool arbitrary) {
    trill_svc_trainer *t = trainer(3 + (uint64_t)l);
    batch b;
    make_batch(&b, t, arbitrary);
    /* Routing is a step function of the weights: every sequence replays the routing it has now
     * (or, with `replay`, sequence 0 made-up experts (e, e + 1)), so the loss is smooth. */
    trill_model *m = trill_svc_base_model(g_base);
    const trill_config *mc = trill_model_config(m);
    uint16_t rep[N_SEQ][(LEN + 1) * 3 * 2];
    assert_int_equal(mc->n_moe_layers * mc->num_experts_per_tok, 3 * 2);
    trill_model_attach_lora(m, trill_svc_trainer_lora(t));
    for (int s = 0; s < N_SEQ; s++) {
        float own[LEN + 1];
        assert_int_equal(trill_model_forward(m, b.tokens[s], (int[]){ 0, LEN + 1 }, 1, NULL, own, rep[s]), TRILL_OK);
        b.d[s].routed_experts = rep[s];
    }
    trill_model_attach_lora(m, NULL);
    for (int i = 0; replay && i < LEN * mc->n_moe_layers; i++) rep[0][2 * i] = (uint16_t)(i % 7), rep[0][2 * i + 1] = (uint16_t)(i % 7 + 1);
    float lp[N_SEQ * LEN];
    double loss;
    assert_int_equal(trill_svc_forward(t, b.d, N_SEQ, l, c, true, lp, &loss), TRILL_OK);
    size_t n;
    const float *g = trill_svc_trainer_grads(t, &n);
    float *p = trill_lora_params(trill_svc_trainer_lora(t), &n), *p0 = malloc(sizeof(float) * n);
    memcpy(p0, p, sizeof(float) * n);
    for (int dir = 0; dir < 3; dir++) {
        double gv = 0, vv = 0;
        const double h = 1e-3;
        for (size_t i = 0; i < n; i++) {
            const double v = trill_rng_uniform(1000 + dir, i) - 0.5;
            gv += g[i] * v, vv += v * v;
        }
        for (size_t i = 0; i < n; i++) p[i] = (float)(p0[i] + h * (trill_rng_uniform(1000 + dir, i) - 0.5) / sqrt(vv));
        const double up = surrogate_at(t, &b, l, c, lp);
        for (size_t i = 0; i < n; i++) p[i] = (float)(p0[i] - h * (trill_rng_uniform(1000 + dir, i) - 0.5) / sqrt(vv));
        const double down = surrogate_at(t, &b, l, c, lp);
        memcpy(p, p0, sizeof(float) * n);
        const double fd = (up - down) / (2 * h), an = gv / sqrt(vv);
        if (fabs(fd - an) > 2e-2 * fmax(1.0, fabs(an)))
            fail_msg("%s%s%s: direction %d: analytic %.6g, finite differences %.6g", trill_loss_get(l)->name, replay ? " (replay)" : "",
                     arbitrary ? " (arbitrary targets)" : "", dir, an, fd);
    }
    free(p0);
    trill_svc_trainer_free(t);
}

static void test_gradients(void **state) {
    (void)state;
    trill_svc_loss_config c = trill_svc_loss_config_default();
    c.beta = 0.3;
    for (int l = 0; l < TRILL_N_LOSSES; l++) /* the service's losses */
        if (trill_loss_get((trill_loss)l)->where & TRILL_LOSS_IN_SERVE) check_gradient((trill_loss)l, &c, false, false);
    check_gradient(TRILL_LOSS_PPO, &c, true, false);
    check_gradient(TRILL_LOSS_CROSS_ENTROPY, &c, true, false);
    check_gradient(TRILL_LOSS_CROSS_ENTROPY, &c, false, true);
    check_gradient(TRILL_LOSS_IMPORTANCE_SAMPLING, &c, true, true);
}

/* A row scored on a target that is not the next token: its log-prob is the one the row gives
 * that token as the next input (the model is causal: row i reads inputs 0..i only), computed
 * with the sequence cut after row i and the target appended. */
static void test_arbitrary_targets(void **state) {
    (void)state;
    trill_svc_trainer *t = trainer(17);
    batch b;
    make_batch(&b, t, true);
    float lp[N_SEQ * LEN];
    double loss;
    assert_int_equal(trill_svc_forward(t, b.d, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &(trill_svc_loss_config){ 0 }, false, lp, &loss), TRILL_OK);
    for (int i = 0; i < LEN; i++) {
        int cut[LEN + 1];
        memcpy(cut, b.tokens[1], sizeof(int) * (size_t)(i + 1));
        cut[i + 1] = b.other[1][i];
        const trill_svc_datum one = { .n = i + 1, .tokens = cut, .targets = cut + 1 };
        float ref[LEN + 1];
        assert_int_equal(trill_svc_forward(t, &one, 1, TRILL_LOSS_CROSS_ENTROPY, &(trill_svc_loss_config){ 0 }, false, ref, &loss), TRILL_OK);
        if (fabsf(ref[i] - lp[LEN + i]) > 1e-5f) fail_msg("row %d: target %d scored %.7g, as the next token %.7g", i, b.other[1][i], lp[LEN + i], ref[i]);
    }
    trill_svc_trainer_free(t);
}

/* Tinker's definitions, evaluated here from the log-probs the trainer reports. */
static void test_loss_values(void **state) {
    (void)state;
    trill_svc_trainer *t = trainer(9);
    batch b;
    make_batch(&b, t, false);
    trill_svc_loss_config c = trill_svc_loss_config_default();
    c.beta = 0.3;
    for (int l = 0; l < TRILL_N_LOSSES; l++) {
        if (!(trill_loss_get((trill_loss)l)->where & TRILL_LOSS_IN_SERVE)) continue;
        float lp[N_SEQ * LEN];
        double loss = 0, want = 0;
        assert_int_equal(trill_svc_forward(t, b.d, N_SEQ, (trill_loss)l, &c, false, lp, &loss), TRILL_OK);
        for (int s = 0; s < N_SEQ; s++)
            for (int i = 0; i < LEN; i++) {
                const double x = lp[s * LEN + i], q = b.q[s][i], a = b.a[s][i], r = exp(x - q), cr = fmin(1.2, fmax(0.8, r));
                want += l == TRILL_LOSS_CROSS_ENTROPY ? -b.w[s][i] * x
                        : l == TRILL_LOSS_IMPORTANCE_SAMPLING ? -r * a
                        : l == TRILL_LOSS_PPO ? -fmin(r * a, cr * a)
                        : l == TRILL_LOSS_CISPO ? -cr * a * x
                        : -(x * a - 0.5 * c.beta * (x - q) * (x - q));
            }
        assert_true(fabs(loss - want) <= 1e-9 * fmax(1.0, fabs(want)));
    }
    trill_svc_trainer_free(t);
}

/* Trainers share the base: one's calls leave another's results as they were. */
static void test_tenants_share_the_base(void **state) {
    (void)state;
    trill_svc_trainer *a = trainer(21), *b2 = trainer(22);
    batch b;
    make_batch(&b, a, false);
    const trill_svc_loss_config c = trill_svc_loss_config_default();
    const double before = loss_at(a, &b, TRILL_LOSS_CROSS_ENTROPY, &c);
    float lp[N_SEQ * LEN];
    double loss, norm;
    assert_int_equal(trill_svc_forward(b2, b.d, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &c, true, lp, &loss), TRILL_OK);
    trill_svc_adam p = trill_svc_adam_default();
    p.learning_rate = 0.1;
    assert_int_equal(trill_svc_optim_step(b2, &p, &norm), TRILL_OK);
    assert_true(loss != loss_at(b2, &b, TRILL_LOSS_CROSS_ENTROPY, &c)); /* b2 did change */
    assert_true(before == loss_at(a, &b, TRILL_LOSS_CROSS_ENTROPY, &c));
    size_t n;
    const float *g = trill_svc_trainer_grads(a, &n);
    for (size_t i = 0; i < n; i++) assert_true(g[i] == 0.0f);
    trill_svc_trainer_free(a);
    trill_svc_trainer_free(b2);
}

static void test_states(void **state) {
    (void)state;
    trill_svc_trainer *t = trainer(31);
    batch b;
    make_batch(&b, t, false);
    const trill_svc_loss_config c = trill_svc_loss_config_default();
    float lp[N_SEQ * LEN];
    double loss, norm;
    trill_svc_adam p = trill_svc_adam_default();
    for (int step = 0; step < 2; step++) {
        assert_int_equal(trill_svc_forward(t, b.d, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &c, true, lp, &loss), TRILL_OK);
        assert_int_equal(trill_svc_optim_step(t, &p, &norm), TRILL_OK);
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/state", g_dir);
    assert_int_equal(trill_svc_trainer_save(t, dir, true), TRILL_OK);
    trill_svc_trainer *u = NULL, *w = NULL;
    assert_int_equal(trill_svc_trainer_load(g_base, dir, true, &u), TRILL_OK);
    assert_int_equal(trill_svc_trainer_load(g_base, dir, false, &w), TRILL_OK);
    assert_int_equal(trill_svc_trainer_step(u), 2);
    assert_int_equal(trill_svc_trainer_step(w), 0);
    /* the same next step from the state with its optimizer; a fresh optimizer steps otherwise */
    double l_t, l_u, l_w;
    for (trill_svc_trainer **x = (trill_svc_trainer *[]){ t, u, w, NULL }; *x; x++) {
        assert_int_equal(trill_svc_forward(*x, b.d, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &c, true, lp, &loss), TRILL_OK);
        assert_int_equal(trill_svc_optim_step(*x, &p, &norm), TRILL_OK);
    }
    l_t = loss_at(t, &b, TRILL_LOSS_CROSS_ENTROPY, &c), l_u = loss_at(u, &b, TRILL_LOSS_CROSS_ENTROPY, &c), l_w = loss_at(w, &b, TRILL_LOSS_CROSS_ENTROPY, &c);
    assert_true(l_t == l_u);
    assert_true(l_t != l_w);
    /* restore in place; a state of another rank is refused */
    assert_int_equal(trill_svc_trainer_restore(w, dir, true), TRILL_OK);
    assert_int_equal(trill_svc_trainer_step(w), 2);
    trill_svc_trainer_config c8 = { .rank = 8, .seed = 1, .train_mlp = true, .train_attn = true };
    trill_svc_trainer *r8 = NULL;
    assert_int_equal(trill_svc_trainer_create(g_base, &c8, &r8), TRILL_OK);
    assert_int_equal(trill_svc_trainer_restore(r8, dir, true), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "rank"));
    trill_svc_trainer_free(r8);
    trill_svc_trainer_free(t), trill_svc_trainer_free(u), trill_svc_trainer_free(w);
}

static void expect_refused(trill_svc_trainer *t, trill_svc_datum d, trill_loss l, const char *needle) {
    float lp[64];
    double loss;
    trill_svc_loss_config c = trill_svc_loss_config_default();
    assert_int_equal(trill_svc_forward(t, &d, 1, l, &c, true, lp, &loss), TRILL_ERR_INVALID);
    if (!strstr(trill_error_message(), needle)) fail_msg("expected \"%s\" in: %s", needle, trill_error_message());
}

static void test_refusals(void **state) {
    (void)state;
    trill_svc_trainer *t = trainer(41);
    int tok[4] = { 1, 2, 3, 4 }, big[4] = { 2, 3, 500, 0 };
    float w[3] = { 1, NAN, 1 };
    uint16_t rep[3 * 3 * 2] = { 0 };
    expect_refused(t, (trill_svc_datum){ .n = 3, .tokens = tok, .targets = big }, TRILL_LOSS_CROSS_ENTROPY, "outside the vocabulary");
    expect_refused(t, (trill_svc_datum){ .n = 3, .tokens = tok, .targets = tok + 1, .weights = w }, TRILL_LOSS_CROSS_ENTROPY, "weights[1]");
    expect_refused(t, (trill_svc_datum){ .n = 3, .tokens = tok, .targets = tok + 1 }, TRILL_LOSS_PPO, "logprobs");
    expect_refused(t, (trill_svc_datum){ .n = 3, .tokens = tok, .targets = tok + 1, .routed_experts = rep }, TRILL_LOSS_CROSS_ENTROPY,
                   "routed_experts");
    expect_refused(t, (trill_svc_datum){ .n = 0, .tokens = tok, .targets = tok }, TRILL_LOSS_CROSS_ENTROPY, "empty");
    trill_svc_trainer_config none = { .rank = 4 };
    trill_svc_trainer *u = NULL;
    assert_int_equal(trill_svc_trainer_create(g_base, &none, &u), TRILL_ERR_INVALID);
    double norm;
    trill_svc_adam p = trill_svc_adam_default();
    p.beta1 = 1.5;
    assert_int_equal(trill_svc_optim_step(t, &p, &norm), TRILL_ERR_INVALID);
    assert_int_equal(trill_svc_trainer_step(t), 0);
    trill_svc_trainer_free(t);
}

/* Top-k targets (distillation): K targets a position with weights [n][K]. Each target's log-prob
 * is the one the same row gives it as a single target, and the gradient of the weighted
 * cross-entropy over all of them matches central finite differences. */
static void test_top_k_targets(void **state) {
    (void)state;
    enum { K = 3 };
    trill_svc_trainer *t = trainer(23);
    batch b;
    make_batch(&b, t, false);
    int top[N_SEQ][LEN * K];
    float w[N_SEQ][LEN * K];
    trill_svc_datum d[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) {
        for (int i = 0; i < LEN * K; i++) top[s][i] = (b.tokens[s][i / K + 1] + 31 * (i % K)) % 128, w[s][i] = (float)(0.5 + 0.25 * (i % K));
        d[s] = (trill_svc_datum){ .n = LEN, .k = K, .tokens = b.tokens[s], .targets = top[s], .weights = w[s] };
    }
    float lp[N_SEQ * LEN * K], one[N_SEQ * LEN];
    double loss, single;
    const trill_svc_loss_config none = { 0 };
    assert_int_equal(trill_svc_forward(t, d, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &none, false, lp, &loss), TRILL_OK);
    for (int k = 0; k < K; k++) { /* target k of every position, as the only target */
        int only[N_SEQ][LEN];
        trill_svc_datum e[N_SEQ];
        for (int s = 0; s < N_SEQ; s++) {
            for (int i = 0; i < LEN; i++) only[s][i] = top[s][i * K + k];
            e[s] = (trill_svc_datum){ .n = LEN, .tokens = b.tokens[s], .targets = only[s] };
        }
        assert_int_equal(trill_svc_forward(t, e, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &none, false, one, &single), TRILL_OK);
        for (int i = 0; i < N_SEQ * LEN; i++)
            if (fabsf(one[i] - lp[i * K + k]) > 1e-5f) fail_msg("position %d target %d: %.7g as one of %d, %.7g alone", i, k, lp[i * K + k], K, one[i]);
    }
    /* refused: another loss, or k differing within a call */
    expect_refused(t, d[0], TRILL_LOSS_IMPORTANCE_SAMPLING, "top-k");
    trill_svc_datum mixed[2] = { d[0], b.d[1] };
    assert_int_equal(trill_svc_forward(t, mixed, 2, TRILL_LOSS_CROSS_ENTROPY, &none, false, lp, &loss), TRILL_ERR_INVALID);
    /* the gradient: d loss . v against finite differences along random directions */
    assert_int_equal(trill_svc_forward(t, d, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &none, true, lp, &loss), TRILL_OK);
    size_t n;
    const float *g = trill_svc_trainer_grads(t, &n);
    float *p = trill_lora_params(trill_svc_trainer_lora(t), &n), *p0 = malloc(sizeof(float) * n);
    memcpy(p0, p, sizeof(float) * n);
    for (int dir = 0; dir < 2; dir++) {
        double gv = 0, vv = 0, up, down;
        const double h = 1e-3;
        for (size_t i = 0; i < n; i++) {
            const double v = trill_rng_uniform(2000 + dir, i) - 0.5;
            gv += g[i] * v, vv += v * v;
        }
        for (size_t i = 0; i < n; i++) p[i] = (float)(p0[i] + h * (trill_rng_uniform(2000 + dir, i) - 0.5) / sqrt(vv));
        assert_int_equal(trill_svc_forward(t, d, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &none, false, lp, &up), TRILL_OK);
        for (size_t i = 0; i < n; i++) p[i] = (float)(p0[i] - h * (trill_rng_uniform(2000 + dir, i) - 0.5) / sqrt(vv));
        assert_int_equal(trill_svc_forward(t, d, N_SEQ, TRILL_LOSS_CROSS_ENTROPY, &none, false, lp, &down), TRILL_OK);
        memcpy(p, p0, sizeof(float) * n);
        const double fd = (up - down) / (2 * h), an = gv / sqrt(vv);
        if (fabs(fd - an) > 2e-2 * fmax(1.0, fabs(an))) fail_msg("top-k: direction %d: analytic %.6g, finite differences %.6g", dir, an, fd);
    }
    free(p0);
    trill_svc_trainer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients), cmocka_unit_test(test_arbitrary_targets), cmocka_unit_test(test_top_k_targets), cmocka_unit_test(test_loss_values), cmocka_unit_test(test_tenants_share_the_base),
        cmocka_unit_test(test_states),    cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
