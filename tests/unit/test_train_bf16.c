/* The bf16 trainer (trainer.precision: bf16, trill_model_set_precision) against the fp32 one.
 *
 * The tolerance, derived: bf16 keeps 8 significant bits, so rounding an operand changes it by a
 * relative δ with |δ| <= u = 2^-8, uniform in practice (standard deviation u/√3). A product of
 * two rounded operands is off by δa + δb (deviation √(2/3) u ≈ 0.82 u), and the products'
 * errors are independent, so a sum of K of them is off by about 0.82 u relative to the sum's
 * size whatever K is (the fp32 sums add ~K 2^-24, negligible). A gradient goes through n such
 * products in sequence (forward to the loss and back); their errors add in quadrature, so its
 * relative error (Frobenius norm over the whole gradient) is about 0.82 u √n. The models here
 * have 3 layers and about 8 products per layer each way plus lm_head: n ≈ 50, an expected error
 * of 0.82 · 2^-8 · √50 ≈ 0.023 (measured: 0.015 to 0.028). The test asserts 0.08 — three and a
 * half times that, so it does not fail on an unlucky draw and still fails on any real bug (a
 * wrong transposition, a lost chunk or an unrounded operand give errors of order 1, or exactly
 * 0). Both paths of the bf16 GEMM compute the same bits, so every machine measures the same.
 *
 * Log-probs: the forward's n ≈ 25 products give a relative error of about 0.016 of the logits'
 * spread (about 2 nats here) per token, so ~0.03 nats, and a maximum over the 37 scored tokens
 * near 3σ ≈ 0.1 (measured: 0.04 to 0.08); asserted 0.25.
 *
 * Routing: the router's logits stay fp32, but its input carries bf16's error, so near-ties can
 * flip an expert; the bf16 pass replays the fp32 pass's experts (what RL does), so a flip cannot
 * turn a rounding difference into a different function. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/model_internal.h"
#include "testutil.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/rng.h"
#include "trill/train.h"

enum { T = 40, NS = 3 };
static const int OFFSETS[NS + 1] = { 0, 7, 22, T };
static const double GRAD_TOL = 0.08, LOGPROB_TOL = 0.25;

static int *tokens_for(const trill_model *m) {
    static int tok[T];
    for (int t = 0; t < T; t++) tok[t] = (int)(trill_rng_bits(99, (uint64_t)t) % (uint64_t)trill_model_config(m)->vocab_size);
    return tok;
}

/* One forward (train) + backward; grads of every weight (lora NULL) or of the adapter. */
static void step(trill_model *m, const uint16_t *replay, float *lp, uint16_t *experts, float *grads, float *lgrads) {
    const int *tok = tokens_for(m);
    float coef[T];
    for (int t = 0; t < T; t++) coef[t] = (float)((t * 37) % 11) / 5.0f - 1.0f;
    trill_forward_pass *pass;
    assert_int_equal(trill_model_forward_train(m, tok, OFFSETS, NS, replay, lp, experts, false, &pass), TRILL_OK);
    assert_int_equal(trill_model_backward(pass, coef, grads, lgrads), TRILL_OK);
    trill_forward_pass_free(pass);
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / den);
}

static double max_logprob_diff(const float *a, const float *b) {
    double d = 0;
    for (int s = 0; s < NS; s++)
        for (int t = OFFSETS[s] + 1; t < OFFSETS[s + 1]; t++) d = fmax(d, fabs((double)a[t] - b[t])); /* the first token has none */
    return d;
}

/* fp32, then bf16 replaying fp32's experts: both errors within the tolerances, and bf16 really ran
 * (the results differ). With lora, the adapter's gradients (B random, so A's are not zero). */
static void compare(trill_model *m, const char *what, bool lora_mode) {
    const trill_config *c = trill_model_config(m);
    const size_t routed = (size_t)T * (size_t)c->n_moe_layers * (size_t)c->num_experts_per_tok;
    uint16_t *experts = malloc(sizeof(uint16_t) * (routed ? routed : 1));
    float lp32[T], lp16[T];
    trill_lora *lora = NULL;
    size_t n = trill_model_n_params(m);
    if (lora_mode) {
        trill_lora_config lc = { .rank = 4, .alpha = 8 };
        assert_int_equal(trill_lora_parse_targets("all-linear,lm_head", &lc.targets), TRILL_OK);
        assert_int_equal(trill_lora_create(m, lc, 5, &lora), TRILL_OK);
        float *p = trill_lora_params(lora, &n);
        for (size_t i = 0; i < n; i++) p[i] = 0.1f * (float)trill_rng_normal(6, i); /* B too: A's gradients not 0 */
        trill_model_attach_lora(m, lora);
    }
    float *g32 = calloc(n, sizeof(float)), *g16 = calloc(n, sizeof(float));
    trill_model_set_precision(m, TRILL_PRECISION_FP32);
    step(m, NULL, lp32, routed ? experts : NULL, lora_mode ? NULL : g32, lora_mode ? g32 : NULL);
    trill_model_set_precision(m, TRILL_PRECISION_BF16);
    step(m, routed ? experts : NULL, lp16, NULL, lora_mode ? NULL : g16, lora_mode ? g16 : NULL);
    trill_model_set_precision(m, TRILL_PRECISION_FP32);
    const double ge = rel_err(g16, g32, n), le = max_logprob_diff(lp16, lp32);
    print_message("%s: gradient error %.4f (tolerance %.2f), log-prob error %.4f nats (tolerance %.2f)\n", what, ge, GRAD_TOL, le,
                  LOGPROB_TOL);
    assert_true(ge > 0 && ge < GRAD_TOL);
    assert_true(le > 0 && le < LOGPROB_TOL);
    if (lora) {
        trill_model_attach_lora(m, NULL);
        trill_lora_free(lora);
    }
    free(g32);
    free(g16);
    free(experts);
}

/* The estimate assumes each product passes a perturbation on with a gain of about 1; the test
 * models' matrices (initializer_range 0.3 at width 32) have a gain of 1.7 each and amplify any
 * perturbation, rounding included, far beyond it (DeepSeek-V3, without QK-norm: gradient error
 * 0.12 at that scale, 0.025 at 0.7x, 0.011 at 0.5x, falling smoothly as sensitivity does and a
 * bug would not). Scaled to 0.15 (a gain of about 0.85, as a trained model's layers keep the
 * residual stream's size), the error measures the arithmetic. */
static void condition(trill_model *m) {
    size_t n;
    const trill_param *t = trill_model_tensors(m, &n);
    for (size_t i = 0; i < n; i++)
        if (t[i].kind == TRILL_TENSOR_MATRIX)
            for (size_t k = 0; k < t[i].numel; k++) t[i].data[k] *= 0.5f;
}

static void test_qwen3_moe_full_and_lora(void **state) {
    (void)state;
    trill_model *m = test_small_moe(21, false, true);
    condition(m);
    compare(m, "qwen3-moe full", false);
    compare(m, "qwen3-moe lora", true);
    trill_model_free(m);
}

static void test_deepseek_full_and_lora(void **state) {
    (void)state;
    trill_model *m = test_small_deepseek(22);
    condition(m);
    compare(m, "deepseek-v3 full", false);
    compare(m, "deepseek-v3 lora", true);
    trill_model_free(m);
}

/* The precision is the model's: set back to fp32, the very same bits as a model never switched. */
static void test_fp32_is_unchanged(void **state) {
    (void)state;
    trill_model *a = test_small_moe(23, false, true), *b = test_small_moe(23, false, true);
    float lpa[T], lpb[T];
    float *ga = calloc(trill_model_n_params(a), sizeof(float)), *gb = calloc(trill_model_n_params(b), sizeof(float));
    trill_model_set_precision(b, TRILL_PRECISION_BF16);
    step(b, NULL, lpb, NULL, gb, NULL);
    trill_model_set_precision(b, TRILL_PRECISION_FP32);
    memset(gb, 0, sizeof(float) * trill_model_n_params(b));
    step(a, NULL, lpa, NULL, ga, NULL);
    step(b, NULL, lpb, NULL, gb, NULL);
    assert_memory_equal(lpa, lpb, sizeof lpa);
    assert_memory_equal(ga, gb, sizeof(float) * trill_model_n_params(a));
    assert_int_equal(trill_model_precision(a), TRILL_PRECISION_FP32);
    free(ga);
    free(gb);
    trill_model_free(a);
    trill_model_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_moe_full_and_lora),
        cmocka_unit_test(test_deepseek_full_and_lora),
        cmocka_unit_test(test_fp32_is_unchanged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
