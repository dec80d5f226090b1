/* Kernels against hand-computed values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "trill/kernels.h"

#define CLOSE(a, b) assert_true(fabs((double)(a) - (double)(b)) < 1e-6)

static void test_matmul(void **state) {
    (void)state;
    const float inp[2 * 3] = { 1, 2, 3, 4, 5, 6 };
    const float w[2 * 3] = { 1, 0, -1, 0.5f, 0.5f, 0.5f }; /* [out=2, in=3] */
    float out[4];
    matmul_forward(out, inp, w, 2, 3, 2);
    CLOSE(out[0], -2); CLOSE(out[1], 3); CLOSE(out[2], -2); CLOSE(out[3], 7.5);
}

static void test_rmsnorm(void **state) {
    (void)state;
    const float x[2 * 2] = { 3, 4, 0, 0 };
    const float w[2] = { 1, 2 };
    float out[4];
    rmsnorm_forward(out, x, w, 2, 2, 0.0f);
    /* rms of (3,4) = sqrt(12.5) */
    CLOSE(out[0], 3 / sqrt(12.5)); CLOSE(out[1], 2 * 4 / sqrt(12.5));
    rmsnorm_forward(out, x, w, 2, 2, 1e-6f);
    CLOSE(out[2], 0); CLOSE(out[3], 0); /* eps keeps a zero row finite */
}

static void test_rope(void **state) {
    (void)state;
    float inv[2];
    rope_inv_freq(inv, 4, 10000.0);
    CLOSE(inv[0], 1.0); CLOSE(inv[1], 0.01); /* 1/10000^(2/4) */
    /* one head of dim 4 at positions 0 and 1: rotate-half pairs (0,2) and (1,3) */
    float x[2 * 4] = { 1, 2, 3, 4, 1, 2, 3, 4 };
    const int pos[2] = { 0, 1 };
    rope_forward(x, pos, inv, 2, 1, 4);
    CLOSE(x[0], 1); CLOSE(x[1], 2); CLOSE(x[2], 3); CLOSE(x[3], 4); /* position 0: identity */
    CLOSE(x[4], 1 * cos(1.0) - 3 * sin(1.0));
    CLOSE(x[6], 3 * cos(1.0) + 1 * sin(1.0));
    CLOSE(x[5], 2 * cos(0.01) - 4 * sin(0.01));
    CLOSE(x[7], 4 * cos(0.01) + 2 * sin(0.01));
}

static void test_attention(void **state) {
    (void)state;
    /* 2 query heads sharing 1 kv head (GQA), head_dim 2, one sequence of 2 tokens and one of 1 */
    const float q[3 * 4] = { 0, 0, 1, 0, /* t0 */ 0, 0, 1, 0, /* t1 */ 5, 5, 5, 5 /* seq 2 */ };
    const float k[3 * 2] = { 1, 0, -1, 0, 3, 3 };
    const float v[3 * 2] = { 1, 2, 3, 4, 7, 8 };
    const int offsets[3] = { 0, 2, 3 };
    float out[3 * 4];
    attention_forward(out, q, k, v, offsets, 2, 2, 1, 2);
    CLOSE(out[0], 1); CLOSE(out[1], 2); /* first token attends only to itself */
    CLOSE(out[4], 2); CLOSE(out[5], 3); /* head 0, t1: q = 0 -> uniform over t0, t1 */
    /* head 1, t1: scores (1, -1)/sqrt(2) */
    double p0 = 1 / (1 + exp(-2 / sqrt(2.0)));
    CLOSE(out[6], p0 * 1 + (1 - p0) * 3);
    CLOSE(out[7], p0 * 2 + (1 - p0) * 4);
    CLOSE(out[8], 7); CLOSE(out[11], 8); /* separate sequence: sees only itself */
}

static void test_softmax_topk(void **state) {
    (void)state;
    const float logits[5] = { 1, 3, 3, -1, 2 };
    float p[5];
    softmax_forward(p, logits, 1, 5);
    double z = exp(1) + 2 * exp(3) + exp(-1) + exp(2);
    CLOSE(p[1], exp(3) / z);
    CLOSE(p[0] + p[1] + p[2] + p[3] + p[4], 1);
    int idx[3];
    float val[3];
    topk_forward(idx, val, p, 1, 5, 3);
    assert_int_equal(idx[0], 1); /* tie between 1 and 2: lower index first */
    assert_int_equal(idx[1], 2);
    assert_int_equal(idx[2], 4);
    CLOSE(val[2], exp(2) / z);
    CLOSE(logsumexp(logits, 5), log(z));
}

static void test_swiglu(void **state) {
    (void)state;
    const float g[2] = { 0, 2 }, u[2] = { 5, 3 };
    float out[2];
    swiglu_forward(out, g, u, 2);
    CLOSE(out[0], 0);
    CLOSE(out[1], 2 / (1 + exp(-2.0)) * 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),   cmocka_unit_test(test_rmsnorm),      cmocka_unit_test(test_rope),
        cmocka_unit_test(test_attention), cmocka_unit_test(test_softmax_topk), cmocka_unit_test(test_swiglu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
