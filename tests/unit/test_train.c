/* The training forward/backward: agreement with the inference forward, router replay, and
 * replay validation. (Gradient values are checked against PyTorch autograd in
 * tests/train/grad_parity.sh, and every backward kernel by finite differences.) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "arch/decoder.h"
#include "model/model_internal.h"
#include "trill/model.h"
#include "trill/train.h"


enum { T = 12, L = 3, K = 2 };
static const int TOKENS[T] = { 5, 9, 17, 3, 44, 2, 8, 8, 60, 1, 3, 7 };
static const int OFFSETS[3] = { 0, 5, 12 };

/* Forward (train) + backward with coefficients coef; returns the pass's log-probs and grads. */
static float *grads_of_mode(trill_model *m, const uint16_t *replay, float *logprobs, uint16_t *experts, bool recompute) {
    float coef[T];
    for (int t = 0; t < T; t++) coef[t] = (float)((t * 37) % 11) / 5.0f - 1.0f;
    trill_forward_pass *pass;
    assert_int_equal(trill_model_forward_train(m, TOKENS, OFFSETS, 2, replay, logprobs, experts, recompute, &pass), TRILL_OK);
    float *g = calloc(m->n_params, sizeof(float));
    assert_int_equal(trill_model_backward(pass, coef, g, NULL), TRILL_OK);
    trill_forward_pass_free(pass);
    return g;
}

static float *grads_of(trill_model *m, const uint16_t *replay, float *logprobs, uint16_t *experts) {
    return grads_of_mode(m, replay, logprobs, experts, false);
}

/* Activation checkpointing re-runs each layer in the backward: the very same gradients. */
static void test_recompute_is_identical(void **state) {
    (void)state;
    trill_model *m = test_small_moe(11, false, true);
    float lp_a[T], lp_b[T];
    uint16_t own[T * L * K], other[T * L * K];
    float *ga = grads_of_mode(m, NULL, lp_a, own, false), *gb = grads_of_mode(m, NULL, lp_b, NULL, true);
    assert_memory_equal(lp_a, lp_b, sizeof lp_a);
    assert_memory_equal(ga, gb, m->n_params * sizeof(float));
    free(ga);
    free(gb);
    for (int i = 0; i < T * L * K; i += K) { other[i] = (uint16_t)((own[i] + 1) % 8); other[i + 1] = (uint16_t)((own[i] + 2) % 8); }
    ga = grads_of_mode(m, other, lp_a, NULL, false); /* with replay the recomputed layers route the same way */
    gb = grads_of_mode(m, other, lp_b, NULL, true);
    assert_memory_equal(ga, gb, m->n_params * sizeof(float));
    free(ga);
    free(gb);
    trill_model_free(m);
}

static void test_train_forward_matches_inference(void **state) {
    (void)state;
    trill_model *m = test_small_moe(11, false, true);
    float lp_inf[T], lp_train[T];
    uint16_t ex_inf[T * L * K], ex_train[T * L * K];
    assert_int_equal(trill_model_forward(m, TOKENS, OFFSETS, 2, NULL, lp_inf, ex_inf), TRILL_OK);
    float *g = grads_of(m, NULL, lp_train, ex_train);
    assert_memory_equal(lp_inf, lp_train, sizeof lp_inf); /* the same code path: bit-identical */
    assert_memory_equal(ex_inf, ex_train, sizeof ex_inf);
    double norm = 0;
    for (size_t i = 0; i < m->n_params; i++) norm += (double)g[i] * g[i];
    assert_true(norm > 0 && isfinite(norm));
    free(g);
    trill_model_free(m);
}

static void test_replay_own_choice_is_identical(void **state) {
    (void)state;
    for (int norm = 0; norm < 2; norm++) {
        trill_model *m = test_small_moe(11, false, norm);
        float lp_a[T], lp_b[T];
        uint16_t own[T * L * K];
        float *ga = grads_of(m, NULL, lp_a, own);
        float *gb = grads_of(m, own, lp_b, NULL); /* replay exactly what the router chose */
        assert_memory_equal(lp_a, lp_b, sizeof lp_a);
        assert_memory_equal(ga, gb, m->n_params * sizeof(float));
        /* other experts: different log-probs and gradients, and the router still learns */
        uint16_t other[T * L * K];
        for (int i = 0; i < T * L * K; i += K) {
            other[i] = (uint16_t)((own[i] + 1) % 8);
            other[i + 1] = (uint16_t)((own[i] + 2) % 8);
        }
        uint16_t echoed[T * L * K];
        float *gc = grads_of(m, other, lp_b, echoed);
        assert_memory_equal(echoed, other, sizeof other); /* capture reports the replayed ids */
        int differ = 0;
        for (int t = 1; t < T; t++) differ += t != 5 && lp_a[t] != lp_b[t];
        assert_true(differ >= 9);
        const trill_decoder_weights *w = trill_model_layer(m, 2);
        double router_grad = 0;
        for (int i = 0; i < 8 * 32; i++) router_grad += fabs(gc[(w->router.f32 - m->params) + i]);
        assert_true(router_grad > 0);
        free(ga);
        free(gb);
        free(gc);
        trill_model_free(m);
    }
}

static void test_replay_rejects_bad_ids(void **state) {
    (void)state;
    trill_model *m = test_small_moe(11, false, true);
    float lp[T];
    uint16_t ids[T * L * K];
    for (int i = 0; i < T * L * K; i += K) { ids[i] = 0; ids[i + 1] = 1; }
    ids[(4 * L + 2) * K + 1] = 8; /* token 4, MoE layer 2: out of range */
    assert_int_equal(trill_model_forward(m, TOKENS, OFFSETS, 2, ids, lp, NULL), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "token 4, MoE layer 2: expert id 8 is outside [0, 8)"));
    ids[(4 * L + 2) * K + 1] = 0; /* now a duplicate */
    assert_int_equal(trill_model_forward(m, TOKENS, OFFSETS, 2, ids, lp, NULL), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "token 4, MoE layer 2: expert 0 appears twice"));
    trill_model_free(m);
}


/* A row marked TRILL_REPLAY_NONE routes itself: replaying the other ids plus, on that row, what
 * the router chose there gives the same log-probs bit for bit. */
static void test_replay_none_rows_route_themselves(void **state) {
    (void)state;
    trill_model *m = test_small_moe(11, false, true);
    float lp_a[T], lp_b[T];
    uint16_t own[T * L * K], ids[T * L * K], seen[T * L * K], seen2[T * L * K];
    assert_int_equal(trill_model_forward(m, TOKENS, OFFSETS, 2, NULL, lp_a, own), TRILL_OK);
    for (int i = 0; i < T * L * K; i += K) { ids[i] = (uint16_t)((own[i] + 1) % 8); ids[i + 1] = (uint16_t)((own[i] + 2) % 8); }
    const int free_token = 2; /* mid-sequence: later tokens attend to it */
    for (int l = 0; l < L; l++) ids[(free_token * L + l) * K] = TRILL_REPLAY_NONE;
    assert_int_equal(trill_model_forward(m, TOKENS, OFFSETS, 2, ids, lp_a, seen), TRILL_OK);
    for (int l = 0; l < L; l++)
        memcpy(ids + (free_token * L + l) * K, seen + (free_token * L + l) * K, sizeof(uint16_t) * K);
    assert_int_equal(trill_model_forward(m, TOKENS, OFFSETS, 2, ids, lp_b, seen2), TRILL_OK);
    assert_memory_equal(lp_a, lp_b, sizeof lp_a);
    assert_memory_equal(seen, seen2, sizeof seen);
    trill_model_free(m);
}

static int len_of(const void *ctx, int i) { return ((const int *)ctx)[i]; }

/* The packing rule every trainer uses: in order while the tokens fit, at least one item. */
static void test_micro_batch_take(void **state) {
    (void)state;
    const int lens[6] = { 3, 4, 2, 9, 1, 1 };
    assert_int_equal(trill_micro_batch_take(6, 9, len_of, lens), 3);      /* 3 + 4 + 2 = 9 fits, + 9 does not */
    assert_int_equal(trill_micro_batch_take(3, 9, len_of, lens + 3), 1);  /* 9 alone */
    assert_int_equal(trill_micro_batch_take(2, 9, len_of, lens + 4), 2);  /* the rest */
    assert_int_equal(trill_micro_batch_take(6, 1, len_of, lens), 1);      /* longer than the budget: alone */
    assert_int_equal(trill_micro_batch_take(0, 9, len_of, lens), 0);
    assert_int_equal(trill_micro_batch_take(6, 1 << 30, len_of, lens), 6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_forward_matches_inference),
        cmocka_unit_test(test_replay_own_choice_is_identical),
        cmocka_unit_test(test_replay_rejects_bad_ids),
        cmocka_unit_test(test_replay_none_rows_route_themselves),
        cmocka_unit_test(test_recompute_is_identical),
        cmocka_unit_test(test_micro_batch_take),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
