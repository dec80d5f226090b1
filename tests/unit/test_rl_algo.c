/* The RL numbers (trill/rl_algo.h) against hand-computed values (the arithmetic is in the
 * comments), and every loss's gradient against a finite difference of its loss value. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "trill/rl_algo.h"
#include "trill/rng.h"

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))

static trill_run_config loss_config(trill_rl_loss loss, trill_rl_agg agg) {
    trill_run_config c;
    memset(&c, 0, sizeof c);
    c.algo.loss = loss;
    c.algo.aggregation = agg;
    c.algo.clip_low = 0.2;
    c.algo.clip_high = 0.28;
    c.algo.aipo_rho = 1.3;
    return c;
}

static void test_group_advantages(void **state) {
    (void)state;
    /* group 0: mean 0.5, deviations ±0.5, unbiased var 4*0.25/3 = 1/3;
     * group 1: flat -> 0; group 2 (size 3, listed separately): [3,0,0], mean 1, deviations
     * [2,-1,-1], var 6/2 = 3 */
    const double r[8] = { 1, 0, 0, 1, 2, 2, 2, 2 };
    double adv[8];
    trill_rl_group_advantages(r, 2, 4, true, 1e-6, adv);
    const double a = 0.5 / (sqrt(1.0 / 3.0) + 1e-6);
    const double want[8] = { a, -a, -a, a, 0, 0, 0, 0 };
    for (int i = 0; i < 8; i++) assert_near(adv[i], want[i], 1e-12);
    /* Dr. GRPO: r - mean only */
    trill_rl_group_advantages(r, 2, 4, false, 1e-6, adv);
    for (int i = 0; i < 4; i++) assert_near(adv[i], r[i] - 0.5, 1e-15);
    const double r3[3] = { 3, 0, 0 };
    double adv3[3];
    trill_rl_group_advantages(r3, 1, 3, true, 0, adv3);
    assert_near(adv3[0], 2 / sqrt(3.0), 1e-12);
    assert_near(adv3[1], -1 / sqrt(3.0), 1e-12);
    /* groups of one sample get 0 */
    const double r1[2] = { 5, -3 };
    double adv1[2] = { 9, 9 };
    trill_rl_group_advantages(r1, 2, 1, true, 1e-6, adv1);
    assert_true(adv1[0] == 0 && adv1[1] == 0);

    const double flat[3] = { 1, 1, 1 }, not_flat[3] = { 1, 1, 2 };
    assert_true(trill_rl_group_is_flat(flat, 3));
    assert_false(trill_rl_group_is_flat(not_flat, 3));
    assert_true(trill_rl_group_is_flat(not_flat + 2, 1));
}

static void test_kl_estimators(void **state) {
    (void)state;
    /* x = logp - ref = -1 - (-1.5) = 0.5: k1 = 0.5, k2 = 0.125, k3 = e^-0.5 - 1 + 0.5 = 0.10653066;
     * gradients 1, x = 0.5, 1 - e^-0.5 = 0.39346934 */
    assert_near(trill_rl_kl_value(TRILL_KL_K1, -1, -1.5), 0.5, 1e-15);
    assert_near(trill_rl_kl_value(TRILL_KL_K2, -1, -1.5), 0.125, 1e-15);
    assert_near(trill_rl_kl_value(TRILL_KL_K3, -1, -1.5), 0.10653065971263342, 1e-14);
    assert_near(trill_rl_kl_grad(TRILL_KL_K1, -1, -1.5), 1, 1e-15);
    assert_near(trill_rl_kl_grad(TRILL_KL_K2, -1, -1.5), 0.5, 1e-15);
    assert_near(trill_rl_kl_grad(TRILL_KL_K3, -1, -1.5), 0.3934693402873666, 1e-14);
    /* k3 is 0 at x = 0 and never negative; the grad is the value's derivative */
    assert_near(trill_rl_kl_value(TRILL_KL_K3, -2, -2), 0, 1e-15);
    assert_true(trill_rl_kl_value(TRILL_KL_K3, -3, -1) > 0);
    for (int e = TRILL_KL_K1; e <= TRILL_KL_K3; e++) {
        const double lp = -0.7, ref = -1.9, h = 1e-5;
        const double fd = (trill_rl_kl_value(e, lp + h, ref) - trill_rl_kl_value(e, lp - h, ref)) / (2 * h);
        assert_near(trill_rl_kl_grad(e, lp, ref), fd, 1e-8);
    }
    /* far outside: clamped, finite */
    assert_true(isfinite(trill_rl_kl_value(TRILL_KL_K3, -200, 0)) && isfinite(trill_rl_kl_grad(TRILL_KL_K3, -200, 0)));
}

/* The hand example: old_logp = -1 everywhere, logp = -1 + ln r. Sequence 0 (A = +1) has ratios
 * [1.1, 1.5, 0.5], sequence 1 (A = -1) [1.5, 0.5]; band [0.8, 1.28] (DAPO clip-higher). PPO:
 *   t0 r 1.1 in band:            L = -1.1,              dL/dlogp = -r A = -1.1
 *   t1 r 1.5, A>0: 1.5 > 1.28:   clipped branch, L = -1.28, gradient 0        (clipped)
 *   t2 r 0.5, A>0: 0.5 < 0.8:    unclipped is the min, L = -0.5, -0.5
 *   t3 r 1.5, A<0: -1.5 < -1.28: unclipped is the min, L = 1.5,  +1.5
 *   t4 r 0.5, A<0: -0.5 > -0.8:  clipped branch, L = 0.8, gradient 0         (clipped) */
#define HAND_T 5
static const int HAND_OFFSETS[3] = { 0, 3, 5 };
static const double HAND_RATIO[HAND_T] = { 1.1, 1.5, 0.5, 1.5, 0.5 };
static const double HAND_ADV[2] = { 1, -1 };

typedef struct hand_batch {
    float logp[HAND_T], old_logp[HAND_T];
    rl_loss_batch b;
} hand_batch;

static void hand_init(hand_batch *h) {
    for (int t = 0; t < HAND_T; t++) {
        h->old_logp[t] = -1.0f;
        h->logp[t] = (float)(-1.0 + log(HAND_RATIO[t]));
    }
    h->b = (rl_loss_batch){ .n_seqs = 2, .offsets = HAND_OFFSETS, .logp = h->logp, .old_logp = h->old_logp,
                            .behav_logp = h->old_logp, .adv = HAND_ADV };
}

static void assert_grads(const float *dlogp, const double *want, int n) {
    for (int t = 0; t < n; t++) assert_near(dlogp[t], want[t], 2e-6);
}

static void test_ppo_hand(void **state) {
    (void)state;
    hand_batch h;
    hand_init(&h);
    float d[HAND_T];
    rl_loss_stats s;

    /* token-mean over 5 tokens: loss (-1.1 - 1.28 - 0.5 + 1.5 + 0.8) / 5 = -0.116;
     * clip_frac 2/5; ratio_mean 5.1 / 5 = 1.02 */
    trill_run_config c = loss_config(TRILL_LOSS_PPO, TRILL_AGG_TOKEN_MEAN);
    trill_rl_policy_loss(&c, &h.b, d, &s);
    assert_near(s.loss, -0.116, 1e-6);
    assert_near(s.pg_loss, -0.116, 1e-6);
    assert_true(s.kl_loss == 0);
    assert_near(s.clip_frac, 0.4, 1e-12);
    assert_near(s.ratio_mean, 1.02, 1e-6);
    assert_grads(d, (double[]){ -0.22, 0, -0.1, 0.3, 0 }, HAND_T);
    assert_true(d[1] == 0 && d[4] == 0); /* exactly: the clip removed them */

    /* token-mean over the whole rollout batch's 10 tokens: -0.58 / 10 */
    h.b.agg_tokens = 10;
    trill_rl_policy_loss(&c, &h.b, d, &s);
    assert_near(s.loss, -0.058, 1e-6);
    assert_grads(d, (double[]){ -0.11, 0, -0.05, 0.15, 0 }, HAND_T);
    h.b.agg_tokens = 0;

    /* t2 masked out: it leaves the loss and the count: (-1.1 - 1.28 + 1.5 + 0.8) / 4 = -0.02 */
    const uint8_t mask[HAND_T] = { 1, 1, 0, 1, 1 };
    h.b.mask = mask;
    trill_rl_policy_loss(&c, &h.b, d, &s);
    assert_near(s.loss, -0.02, 1e-6);
    assert_near(s.clip_frac, 0.5, 1e-12);
    assert_grads(d, (double[]){ -0.275, 0, 0, 0.375, 0 }, HAND_T);
    assert_true(d[2] == 0);
    h.b.mask = NULL;

    /* seq-mean-token-sum with TIS weights [0.5, 1, 1, 2, 1]:
     * (1/2) [(-1.1*0.5 - 1.28 - 0.5) + (1.5*2 + 0.8)] = (1/2)(-2.33 + 3.8) = 0.735;
     * gradients -1.1*0.5/2, 0, -0.5/2, 1.5*2/2, 0 */
    const float w[HAND_T] = { 0.5f, 1, 1, 2, 1 };
    h.b.is_weight = w;
    c.algo.aggregation = TRILL_AGG_SEQ_MEAN_TOKEN_SUM;
    trill_rl_policy_loss(&c, &h.b, d, &s);
    assert_near(s.loss, 0.735, 1e-6);
    assert_grads(d, (double[]){ -0.275, 0, -0.25, 1.5, 0 }, HAND_T);
    h.b.is_weight = NULL;

    /* seq-mean-token-mean: (1/2) [(-1.1 - 1.28 - 0.5)/3 + (1.5 + 0.8)/2] = (1/2)(-0.96 + 1.15) = 0.095;
     * gradients -1.1/6, 0, -0.5/6, 1.5/4, 0 */
    c.algo.aggregation = TRILL_AGG_SEQ_MEAN_TOKEN_MEAN;
    trill_rl_policy_loss(&c, &h.b, d, &s);
    assert_near(s.loss, 0.095, 1e-6);
    assert_grads(d, (double[]){ -1.1 / 6, 0, -0.5 / 6, 0.375, 0 }, HAND_T);

    /* clip-higher: with a symmetric band [0.8, 1.2], r = 1.25 with A > 0 is clipped; with
     * clip_high 0.28 it is not. One token, token-mean. */
    const int off1[2] = { 0, 1 };
    const double a1[1] = { 1 };
    float lp = (float)(-1.0 + log(1.25)), old = -1.0f, d1;
    rl_loss_batch one = { .n_seqs = 1, .offsets = off1, .logp = &lp, .old_logp = &old, .behav_logp = &old, .adv = a1 };
    c.algo.aggregation = TRILL_AGG_TOKEN_MEAN;
    trill_rl_policy_loss(&c, &one, &d1, &s);
    assert_near(d1, -1.25, 2e-6);
    assert_true(s.clip_frac == 0);
    c.algo.clip_high = 0.2;
    trill_rl_policy_loss(&c, &one, &d1, &s);
    assert_true(d1 == 0);
    assert_true(s.clip_frac == 1);
    assert_near(s.loss, -1.2, 1e-9);
    /* r = 1 exactly (a tie of both branches) keeps the gradient -A */
    lp = old;
    trill_rl_policy_loss(&c, &one, &d1, &s);
    assert_true(d1 == -1.0f && s.clip_frac == 0);
}

static void test_cispo_reinforce_hand(void **state) {
    (void)state;
    hand_batch h;
    hand_init(&h);
    float d[HAND_T];
    rl_loss_stats s;
    /* CISPO: weights clip(r, 0.8, 1.28) = [1.1, 1.28, 0.8, 1.28, 0.8], gradient -w A / 5 on every
     * token (the clip truncates the weight, never removes the gradient); loss -w A logp / 5 with
     * logp = -1 + ln r: t1/t3 and t2/t4 cancel (same w and logp, opposite A), leaving
     * 1.1 (1 - ln 1.1) / 5 = 0.19903176. clip_frac: 4 of 5 weights truncated. */
    trill_run_config c = loss_config(TRILL_LOSS_CISPO, TRILL_AGG_TOKEN_MEAN);
    trill_rl_policy_loss(&c, &h.b, d, &s);
    assert_grads(d, (double[]){ -0.22, -0.256, -0.16, 0.256, 0.16 }, HAND_T);
    assert_near(s.loss, 0.19903176044304852, 1e-6);
    assert_near(s.clip_frac, 0.8, 1e-12);

    /* REINFORCE: L = -r A, gradient -r A: loss -(1.1 + 1.5 + 0.5 - 1.5 - 0.5) / 5 = -0.22 */
    c.algo.loss = TRILL_LOSS_REINFORCE;
    trill_rl_policy_loss(&c, &h.b, d, &s);
    assert_grads(d, (double[]){ -0.22, -0.3, -0.1, 0.3, 0.1 }, HAND_T);
    assert_near(s.loss, -0.22, 1e-6);
    assert_true(s.clip_frac == 0);
    assert_near(s.ratio_mean, 1.02, 1e-6);
}

/* AIPO (rho 1.2) against mu = the hand batch's behaviour log-probs (= old here): weights
 * min(r, 1.2) = [1.1, 1.2, 0.5, 1.2, 0.5], gradient -w A / 5; loss -w A logp / 5 with
 * logp = -1 + ln r: t1/t3 and t2/t4 cancel, leaving 1.1 (1 - ln 1.1) / 5 = 0.19903176.
 * Its weight is its own correction: a TIS weight passed in is ignored. */
static void test_aipo_hand(void **state) {
    (void)state;
    hand_batch h;
    hand_init(&h);
    float d[HAND_T];
    rl_loss_stats s;
    trill_run_config c = loss_config(TRILL_LOSS_AIPO, TRILL_AGG_TOKEN_MEAN);
    c.algo.aipo_rho = 1.2;
    const float tis[HAND_T] = { 2, 2, 2, 2, 2 };
    h.b.is_weight = tis;
    trill_rl_policy_loss(&c, &h.b, d, &s);
    assert_grads(d, (double[]){ -0.22, -0.24, -0.1, 0.24, 0.1 }, HAND_T);
    assert_near(s.loss, 0.19903176044304852, 1e-6);
    assert_near(s.clip_frac, 0.4, 1e-12);
    /* the weight follows mu, not pi_old: with mu twice as likely as pi_old everywhere, w = r / 2 */
    float behav[HAND_T];
    for (int t = 0; t < HAND_T; t++) behav[t] = h.old_logp[t] + (float)log(2.0);
    h.b.behav_logp = behav;
    trill_rl_policy_loss(&c, &h.b, d, &s);
    assert_grads(d, (double[]){ -0.11, -0.15, -0.05, 0.15, 0.05 }, HAND_T);
    assert_true(s.clip_frac == 0);
}

static void test_gspo_hand(void **state) {
    (void)state;
    /* log-ratios: seq 0 (A = +1) [0.1, 0.2, 0.0] -> s0 = e^0.1 = 1.10517092, in band;
     * seq 1 (A = -1) [0.5, 0.3] -> s1 = e^0.4 = 1.49182470, -s1 < -1.28: unclipped is the min;
     * seq 2 (A = +1) [0.5] -> s2 = e^0.5 = 1.64872127 > 1.28: clipped, gradient 0.
     * seq-mean-token-mean: loss (1/3)(-s0 + s1 - 1.28) = -0.29778207; gradient -A s / n / 3:
     * seq 0: -s0/9 = -0.12279677 per token, seq 1: s1/6 = 0.24863745, seq 2: 0.
     * clip_frac 1/6 tokens; ratio_mean (s0 + s1 + s2)/3 = 1.41523896 */
    const int off[4] = { 0, 3, 5, 6 };
    const double adv[3] = { 1, -1, 1 };
    const double lr[6] = { 0.1, 0.2, 0.0, 0.5, 0.3, 0.5 };
    float logp[6], old[6], d[6];
    for (int t = 0; t < 6; t++) {
        old[t] = -2.0f;
        logp[t] = (float)(-2.0 + lr[t]);
    }
    rl_loss_batch b = { .n_seqs = 3, .offsets = off, .logp = logp, .old_logp = old, .behav_logp = old, .adv = adv };
    trill_run_config c = loss_config(TRILL_LOSS_GSPO, TRILL_AGG_SEQ_MEAN_TOKEN_MEAN);
    rl_loss_stats s;
    trill_rl_policy_loss(&c, &b, d, &s);
    assert_near(s.loss, -0.2977820734781258, 1e-6);
    const double g0 = -0.12279676867507197, g1 = 0.2486374496068784;
    assert_grads(d, (double[]){ g0, g0, g0, g1, g1, 0 }, 6);
    assert_near(s.clip_frac, 1.0 / 6, 1e-12);
    assert_near(s.ratio_mean, 1.4152389621390153, 1e-6);
    /* token-mean: each sequence's loss weighted n_i / 6: (-3 s0 + 2 s1 - 1.28) / 6 = -0.26864389;
     * gradient -A s / n_i * n_i / 6: seq 0 -s0/6, seq 1 s1/6 */
    c.algo.aggregation = TRILL_AGG_TOKEN_MEAN;
    trill_rl_policy_loss(&c, &b, d, &s);
    assert_near(s.loss, -0.2686438931574004, 1e-6);
    assert_grads(d, (double[]){ -exp(0.1) / 6, -exp(0.1) / 6, -exp(0.1) / 6, g1, g1, 0 }, 6);
}

static void test_kl_loss_term(void **state) {
    (void)state;
    /* A = 0 (no policy gradient); x = logp - ref = [0.5, 0]: k3 = [0.10653066, 0], d k3 = [0.39346934, 0];
     * kl_coef 0.1, token-mean over 2: kl_loss 0.1 * 0.10653066 / 2, gradient 0.1 * 0.39346934 / 2.
     * The TIS weight does not touch the KL term. */
    const int off[2] = { 0, 2 };
    const double adv[1] = { 0 };
    const float logp[2] = { -1, -2 }, ref[2] = { -1.5f, -2 }, w[2] = { 0.5f, 3 };
    float d[2];
    rl_loss_batch b = { .n_seqs = 1, .offsets = off, .logp = logp, .old_logp = logp, .behav_logp = logp,
                        .ref_logp = ref, .adv = adv, .is_weight = w };
    trill_run_config c = loss_config(TRILL_LOSS_PPO, TRILL_AGG_TOKEN_MEAN);
    c.algo.kl_coef = 0.1;
    c.algo.kl_estimator = TRILL_KL_K3;
    c.algo.kl_mode = TRILL_KL_LOSS;
    rl_loss_stats s;
    trill_rl_policy_loss(&c, &b, d, &s);
    assert_near(s.kl_loss, 0.1 * 0.10653065971263342 / 2, 1e-9);
    assert_near(s.loss, s.kl_loss, 1e-15);
    assert_true(s.pg_loss == 0);
    assert_near(d[0], 0.1 * 0.3934693402873666 / 2, 1e-8);
    assert_near(d[1], 0, 1e-12);
    /* as a reward penalty (the controller's job) or without ref_logp: no loss term */
    c.algo.kl_mode = TRILL_KL_REWARD;
    trill_rl_policy_loss(&c, &b, d, &s);
    assert_true(s.kl_loss == 0 && d[0] == 0);
    c.algo.kl_mode = TRILL_KL_LOSS;
    b.ref_logp = NULL;
    trill_rl_policy_loss(&c, &b, d, &s);
    assert_true(s.kl_loss == 0 && d[0] == 0);
}

/* Finite differences: 4 sequences (lengths 3, 4, 2, 2; the last fully masked out, token 4 masked
 * out), TIS weights, a KL loss term; ratios chosen well away from every clip boundary (both
 * sides of the band occur; GSPO clips sequence 2, whose mean log-ratio is 0.3 > ln 1.28). The derivative is (L(x+) - L(x-)) / (x+ - x-) with the float steps
 * actually taken. CISPO's weight is detached, so for it old_logp moves with logp (r stays fixed). */
#define FD_T 11
static const int FD_OFFSETS[5] = { 0, 3, 7, 9, 11 };
static const double FD_ADV[4] = { 0.7, -1.3, 0.4, 1.0 };
static const double FD_LOG_RATIO[FD_T] = { 0.05, 0.6, -0.5, -0.1, 0.45, -0.4, 0.15, 0.4, 0.2, 0.3, 0.1 };
static const float FD_OLD[FD_T] = { -1.2f, -0.3f, -2.5f, -0.8f, -1.7f, -0.05f, -3.1f, -0.6f, -1.4f, -0.9f, -2.2f };
static const float FD_REF[FD_T] = { -1.0f, -0.9f, -2.0f, -0.7f, -1.1f, -0.2f, -2.6f, -0.9f, -1.0f, -1.3f, -2.0f };
static const float FD_W[FD_T] = { 0.9f, 1.3f, 0.6f, 1.0f, 2.0f, 0.75f, 1.1f, 0.5f, 1.4f, 1.0f, 1.0f };
static const uint8_t FD_MASK[FD_T] = { 1, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0 };

static double loss_at(const trill_run_config *c, const rl_loss_batch *b) {
    float scratch[FD_T];
    rl_loss_stats s;
    trill_rl_policy_loss(c, b, scratch, &s);
    assert_near(s.loss, s.pg_loss + s.kl_loss, 1e-12);
    return s.loss;
}

static void test_gradients_match_finite_differences(void **state) {
    (void)state;
    const trill_rl_loss losses[5] = { TRILL_LOSS_PPO, TRILL_LOSS_GSPO, TRILL_LOSS_CISPO, TRILL_LOSS_REINFORCE, TRILL_LOSS_AIPO };
    const trill_rl_agg aggs[3] = { TRILL_AGG_TOKEN_MEAN, TRILL_AGG_SEQ_MEAN_TOKEN_SUM, TRILL_AGG_SEQ_MEAN_TOKEN_MEAN };
    float logp[FD_T], old[FD_T], d[FD_T];
    for (int li = 0; li < 5; li++)
        for (int ai = 0; ai < 3; ai++)
            for (int e = TRILL_KL_K1; e <= TRILL_KL_K3; e++) {
                trill_run_config c = loss_config(losses[li], aggs[ai]);
                c.algo.kl_coef = 0.05;
                c.algo.kl_estimator = e;
                for (int t = 0; t < FD_T; t++) {
                    old[t] = FD_OLD[t];
                    logp[t] = (float)(FD_OLD[t] + FD_LOG_RATIO[t]);
                }
                rl_loss_batch b = { .n_seqs = 4, .offsets = FD_OFFSETS, .logp = logp, .old_logp = old,
                                    .behav_logp = old, .ref_logp = FD_REF, .adv = FD_ADV, .mask = FD_MASK,
                                    .is_weight = FD_W };
                rl_loss_stats s;
                trill_rl_policy_loss(&c, &b, d, &s);
                assert_true(s.kl_loss != 0);
                assert_true(losses[li] == TRILL_LOSS_REINFORCE || s.clip_frac > 0); /* the clip is exercised */
                const bool move_old = losses[li] == TRILL_LOSS_CISPO || losses[li] == TRILL_LOSS_AIPO; /* detached weights stay put */
                for (int t = 0; t < FD_T; t++) {
                    const float x = logp[t], o = old[t];
                    const double h = 1.0 / 1024; /* a power of two: x ± h and old ± h are exact */
                    logp[t] = (float)(x + h);
                    if (move_old) old[t] = (float)(o + ((double)logp[t] - x));
                    const double up = loss_at(&c, &b), x_up = logp[t];
                    logp[t] = (float)(x - h);
                    if (move_old) old[t] = (float)(o + ((double)logp[t] - x));
                    const double down = loss_at(&c, &b), x_down = logp[t];
                    logp[t] = x;
                    old[t] = o;
                    const double fd = (up - down) / (x_up - x_down);
                    if (fabs(d[t] - fd) > 1e-4 * fabs(fd) + 2e-6)
                        fail_msg("loss %d agg %d kl %d token %d: dlogp %.8g, finite difference %.8g", li, ai, e, t,
                                 d[t], fd);
                    if (!FD_MASK[t]) assert_true(d[t] == 0);
                }
            }
}

/* old_logp - behav_logp per token (behav = -2): seq 0 [0.1, 1.0, -0.1], seq 1 [0.5, 0.5],
 * seq 2 [-0.3, -0.3], seq 3 [-0.8, -0.8]; MIS band [0.5, 2]. */
#define MIS_T 9
static const int MIS_OFFSETS[5] = { 0, 3, 5, 7, 9 };
static const double MIS_LOG_RATIO[MIS_T] = { 0.1, 1.0, -0.1, 0.5, 0.5, -0.3, -0.3, -0.8, -0.8 };

static int corrections(trill_mis_level level, double tis, uint8_t *mask, float *w) {
    float old[MIS_T], behav[MIS_T];
    for (int t = 0; t < MIS_T; t++) {
        behav[t] = -2.0f;
        old[t] = (float)(-2.0 + MIS_LOG_RATIO[t]);
    }
    trill_run_config c;
    memset(&c, 0, sizeof c);
    c.correction.tis = tis;
    c.correction.mis = true;
    c.correction.mis_low = 0.5;
    c.correction.mis_high = 2.0;
    c.correction.mis_level = level;
    return trill_rl_corrections(&c, 4, MIS_OFFSETS, old, behav, w, mask);
}

static void test_corrections(void **state) {
    (void)state;
    uint8_t mask[MIS_T];
    float w[MIS_T];
    /* token level: e^1.0 = 2.718 > 2 (t1) and e^-0.8 = 0.449 < 0.5 (t7, t8) are masked.
     * TIS cap 1.5: min(e^d, 1.5) = [1.10517, 1.5, 0.904837, 1.5, 1.5, 0.740818 x2, 0.449329 x2] */
    memset(mask, 1, sizeof mask);
    assert_int_equal(corrections(TRILL_MIS_TOKEN, 1.5, mask, w), 3);
    assert_memory_equal(mask, ((uint8_t[]){ 1, 0, 1, 1, 1, 1, 1, 0, 0 }), MIS_T);
    const double want_w[MIS_T] = { 1.1051709, 1.5, 0.9048374, 1.5, 1.5, 0.7408182, 0.7408182, 0.4493290, 0.4493290 };
    for (int t = 0; t < MIS_T; t++) assert_near(w[t], want_w[t], 1e-6);

    /* sequence level (product of ratios): seq 0 e^1.0 = 2.718 rejected, seq 1 e^1.0 rejected,
     * seq 2 e^-0.6 = 0.549 kept, seq 3 e^-1.6 = 0.202 rejected: 3 + 2 + 2 tokens. TIS off: 1. */
    memset(mask, 1, sizeof mask);
    assert_int_equal(corrections(TRILL_MIS_SEQUENCE, 0, mask, w), 7);
    assert_memory_equal(mask, ((uint8_t[]){ 0, 0, 0, 0, 0, 1, 1, 0, 0 }), MIS_T);
    for (int t = 0; t < MIS_T; t++) assert_true(w[t] == 1.0f);

    /* only masked-in tokens enter the product: with t1 already out, seq 0 is e^(0.1 - 0.1) = 1,
     * kept; t1 stays out and is not counted again */
    memset(mask, 1, sizeof mask);
    mask[1] = 0;
    assert_int_equal(corrections(TRILL_MIS_SEQUENCE, 0, mask, w), 4);
    assert_memory_equal(mask, ((uint8_t[]){ 1, 0, 1, 0, 0, 1, 1, 0, 0 }), MIS_T);

    /* geometric mean: seq 0 e^(1/3) = 1.40, seq 1 e^0.5 = 1.65, seq 2 e^-0.3 = 0.74 kept;
     * seq 3 e^-0.8 = 0.449 rejected */
    memset(mask, 1, sizeof mask);
    assert_int_equal(corrections(TRILL_MIS_GEOMETRIC, 0, mask, w), 2);
    assert_memory_equal(mask, ((uint8_t[]){ 1, 1, 1, 1, 1, 1, 1, 0, 0 }), MIS_T);

    /* MIS off: the mask is left as given, TIS still computed */
    float old[2] = { -1.0f, -1.0f }, behav[2] = { -1.0f, -1.5f };
    const int off[2] = { 0, 2 };
    uint8_t m2[2] = { 1, 0 };
    float w2[2];
    trill_run_config c;
    memset(&c, 0, sizeof c);
    c.correction.tis = 2.0;
    assert_int_equal(trill_rl_corrections(&c, 1, off, old, behav, w2, m2), 0);
    assert_true(m2[0] == 1 && m2[1] == 0);
    assert_near(w2[0], 1.0, 1e-7);
    assert_near(w2[1], exp(0.5), 1e-6);
}

static void test_mismatch(void **state) {
    (void)state;
    /* d = old - behav = [0.5, -1.0, 0]; rho = [1.6487213, 0.3678794, 1]:
     * mean|d| = 1.5/3 = 0.5; max 1.0; k1 = mean(-d) = 0.5/3;
     * k3 = mean(rho - 1 - d) = (0.1487213 + 0.3678794 + 0)/3 = 0.17220024;
     * chi2 = mean((rho - 1)^2) = (0.4208393 + 0.3995764 + 0)/3 = 0.27347190 */
    const float old[3] = { -1.0f, -2.0f, -0.25f }, behav[3] = { -1.5f, -1.0f, -0.25f };
    rl_mismatch m;
    trill_rl_mismatch_measure(old, behav, 3, &m);
    assert_near(m.mean_abs, 0.5, 1e-12);
    assert_near(m.max_abs, 1.0, 1e-12);
    assert_near(m.k1, 0.5 / 3, 1e-12);
    assert_near(m.k3, 0.1722002372905235, 1e-12);
    assert_near(m.chi2, 0.2734718959841724, 1e-12);
    assert_int_equal(m.n_tokens, 3);
    trill_rl_mismatch_measure(old, behav, 0, &m);
    assert_true(m.mean_abs == 0 && m.chi2 == 0 && m.n_tokens == 0);
}

/* The histograms on a fixed batch, by hand: Δ = 0, ±2, ±0.5, -2^-9, ±2^-20, 2^-15. */
static void test_histograms_hand(void **state) {
    (void)state;
    const float d[9] = { 0, -2, 2, -0.5f, 0.5f, -0.001953125f, 0x1p-20f, -0x1p-20f, 0x1p-15f };
    float old[9], behav[9], used[9];
    uint8_t mask[9];
    for (int t = 0; t < 9; t++) {
        behav[t] = -1.0f;
        old[t] = -1.0f + d[t];
        used[t] = fminf(expf(d[t]), 2.0f); /* TIS at 2 */
        mask[t] = t != 3;                  /* MIS masked the -0.5 token */
    }
    trill_rl_histograms h = { 0 };
    trill_rl_hist_tokens(&h, old, behav, used, mask, 9);
    /* log_ratio: bin 8 exactly 0; -2 bin 0, +2 bin 16; ∓0.5 bins 1 and 15; -2^-9 in [1e-3, 1e-2): bin 3;
     * ±2^-20 below 1e-6: bins 9 and 7; 2^-15 in [1e-5, 1e-4): bin 11 */
    const long ratio[TRILL_RL_HIST_RATIO_BINS] = { 1, 1, 0, 1, 0, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 1, 1 };
    /* raw weights: e^-2 = 0.135 bin 1, e^-0.5 = 0.61 bin 2, five within 1 +- 0.01 bin 6, e^0.5 = 1.65
     * bin 10, e^2 = 7.4 bin 12; used: the masked one in bin 0, e^2 capped at 2 in bin 11 */
    const long raw[TRILL_RL_HIST_WEIGHT_BINS] = { 0, 1, 1, 0, 0, 0, 5, 0, 0, 0, 1, 0, 1 };
    const long used_bins[TRILL_RL_HIST_WEIGHT_BINS] = { 1, 1, 0, 0, 0, 0, 5, 0, 0, 0, 1, 1, 0 };
    assert_memory_equal(h.log_ratio, ratio, sizeof ratio);
    assert_memory_equal(h.weight_raw, raw, sizeof raw);
    assert_memory_equal(h.weight_used, used_bins, sizeof used_bins);
    /* response lengths of at most 20 tokens: 0, 1 -> bin 0; 2 -> 1; 10 -> 5; 19, 20 -> 9 */
    const int lens[6] = { 0, 1, 2, 10, 19, 20 };
    for (int i = 0; i < 6; i++) trill_rl_hist_response(&h, lens[i], 20);
    const long len_bins[TRILL_RL_HIST_LEN_BINS] = { 2, 1, 0, 0, 0, 1, 0, 0, 0, 2 };
    assert_memory_equal(h.response_len, len_bins, sizeof len_bins);
    int n = 0;
    assert_non_null(trill_rl_hist_edges("log_ratio", &n));
    assert_int_equal(n, TRILL_RL_HIST_RATIO_BINS);
    assert_true(trill_rl_hist_edges("weight", &n)[6] == 0.99 && n == TRILL_RL_HIST_WEIGHT_BINS);
    assert_null(trill_rl_hist_edges("nope", &n));
}

/* The histograms of random tokens against a direct computation from the published edges
 * (log10 for the decades, a search of the weight edges). */
static void test_histograms_direct(void **state) {
    (void)state;
    enum { N = 20000 };
    float *old = malloc(sizeof(float) * N), *behav = malloc(sizeof(float) * N), *used = malloc(sizeof(float) * N);
    uint8_t *mask = malloc(N);
    trill_rl_histograms want = { 0 }, got = { 0 };
    int nr, nw;
    const double *wedge = trill_rl_hist_edges("weight", &nw);
    trill_rl_hist_edges("log_ratio", &nr);
    for (int t = 0; t < N; t++) {
        const double mag = pow(10.0, -8.0 + 9.0 * trill_rng_uniform(11, (uint64_t)t)); /* |Δ| from 1e-8 to 10 */
        const double sign = trill_rng_uniform(12, (uint64_t)t) < 0.5 ? -1 : 1;
        behav[t] = -2.0f;
        old[t] = t % 97 == 0 ? -2.0f : (float)(-2.0 + sign * mag);
        used[t] = fminf(expf(old[t] - behav[t]), 3.0f);
        mask[t] = t % 13 != 0;
        const double dd = (double)old[t] - (double)behav[t], a = fabs(dd);
        int decade = a < 1e-6 ? 0 : (int)floor(log10(a)) + 7;
        decade = decade > 7 ? 7 : decade;
        want.log_ratio[dd == 0 ? 8 : dd < 0 ? 7 - decade : 9 + decade]++;
        int br = 0, bu = 0;
        for (int b = 1; b < nw; b++) {
            if (exp(dd) >= wedge[b]) br = b;
            if (used[t] >= wedge[b]) bu = b;
        }
        want.weight_raw[br]++;
        want.weight_used[mask[t] ? bu : 0]++;
    }
    trill_rl_hist_tokens(&got, old, behav, used, mask, N);
    assert_memory_equal(got.log_ratio, want.log_ratio, sizeof want.log_ratio);
    assert_memory_equal(got.weight_raw, want.weight_raw, sizeof want.weight_raw);
    assert_memory_equal(got.weight_used, want.weight_used, sizeof want.weight_used);
    long total = 0;
    for (int b = 0; b < nr; b++) total += got.log_ratio[b];
    assert_int_equal(total, N);
    free(old);
    free(behav);
    free(used);
    free(mask);
}

static void test_routing_flips(void **state) {
    (void)state;
    /* [5 tokens][2 layers][k = 2]:
     * t0: {1,2}={2,1}, {3,4}={3,4}         same (reordered counts as equal)
     * t1: {1,2}!={1,3}, {5,6}={6,5}        flips in layer 0
     * t2: not captured (0xFFFF)            skipped
     * t3: {0,7}={7,0}, {1,2}!={1,4}        flips in layer 1
     * t4: layer 0 not captured by the trainer, {2,3}={2,3}
     * tokens: 2 flipped of 4 compared; layer 0: 1 of 3 rows, layer 1: 1 of 4 rows */
    const uint16_t gen[20] = { 1, 2, 3, 4, 1, 2, 5, 6, 0xFFFF, 0xFFFF, 0xFFFF, 0xFFFF, 0, 7, 1, 2, 9, 8, 2, 3 };
    const uint16_t train[20] = { 2, 1, 3, 4, 1, 3, 6, 5, 4, 5, 6, 7, 7, 0, 1, 4, 0xFFFF, 0xFFFF, 2, 3 };
    double token_frac, layer[2];
    trill_rl_routing_flips(gen, train, 5, 2, 2, &token_frac, layer);
    assert_near(token_frac, 0.5, 1e-15);
    assert_near(layer[0], 1.0 / 3, 1e-15);
    assert_near(layer[1], 0.25, 1e-15);
    /* a repeated id is not the same set as two distinct ones */
    const uint16_t a[2] = { 3, 3 }, b[2] = { 3, 4 };
    trill_rl_routing_flips(a, b, 1, 1, 2, &token_frac, layer);
    assert_true(token_frac == 1 && layer[0] == 1);
    trill_rl_routing_flips(a, b, 0, 1, 2, &token_frac, layer);
    assert_true(token_frac == 0 && layer[0] == 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_advantages),
        cmocka_unit_test(test_kl_estimators),
        cmocka_unit_test(test_ppo_hand),
        cmocka_unit_test(test_cispo_reinforce_hand),
        cmocka_unit_test(test_aipo_hand),
        cmocka_unit_test(test_gspo_hand),
        cmocka_unit_test(test_kl_loss_term),
        cmocka_unit_test(test_gradients_match_finite_differences),
        cmocka_unit_test(test_corrections),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_histograms_hand),
        cmocka_unit_test(test_histograms_direct),
        cmocka_unit_test(test_routing_flips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
