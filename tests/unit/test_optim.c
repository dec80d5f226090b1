/* AdamW, clipping and schedules against values computed by PyTorch (torch 1.13,
 * torch.optim.AdamW in float64; the script is in the comments below). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <omp.h>

#include "testutil.h"
#include "trill/fileio.h"
#include "trill/optim.h"

/* p = [0.5, -1.25, 2.0, 0.0, 3.0]; AdamW(lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1);
 * three steps with grads [0.1,-0.2,0.3,0,-1], [0.05,0.4,-0.3,0.2,0.5], [1,1,1,1,1]. */
static const float GRADS[3][5] = { { 0.1f, -0.2f, 0.3f, 0.0f, -1.0f }, { 0.05f, 0.4f, -0.3f, 0.2f, 0.5f }, { 1, 1, 1, 1, 1 } };
static const double TORCH_P[5] = { 0.472160123, -1.2467535811, 1.9789377816, -0.0145604158, 3.0009434479 };
static const double TORCH_V[5] = { 0.05057, 0.059405, 0.05833625, 0.0519, 0.107 };

static trill_adamw *three_steps(float p[5]) {
    trill_adamw_config cfg = { .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1 };
    trill_adamw *o;
    assert_int_equal(trill_adamw_create(5, cfg, &o), TRILL_OK);
    const float init[5] = { 0.5f, -1.25f, 2.0f, 0.0f, 3.0f };
    memcpy(p, init, sizeof init);
    for (int s = 0; s < 3; s++) trill_adamw_step(o, p, GRADS[s], 0.01, NULL);
    return o;
}

static void test_adamw_matches_torch(void **state) {
    (void)state;
    float p[5];
    trill_adamw *o = three_steps(p);
    for (int i = 0; i < 5; i++) {
        assert_true(fabs(p[i] - TORCH_P[i]) < 2e-6);
        assert_true(fabs(o->exp_avg_sq[i] - TORCH_V[i]) < 1e-6);
    }
    assert_int_equal(o->step, 3);
    /* no_decay leaves a value's decay out: with zero gradients nothing moves at all */
    float q[2] = { 1.0f, 1.0f }, zero[2] = { 0, 0 };
    uint8_t mask[2] = { 1, 0 };
    trill_adamw *o2;
    assert_int_equal(trill_adamw_create(2, trill_adamw_defaults(), &o2), TRILL_OK);
    trill_adamw_step(o2, q, zero, 0.5, mask);
    assert_true(q[0] == 1.0f);
    assert_true(fabs(q[1] - (1.0 - 0.5 * 0.01)) < 1e-7);
    trill_adamw_free(o2);
    trill_adamw_free(o);
}

static void test_adamw_state_round_trip(void **state) {
    (void)state;
    char *dir = test_tmpdir("optim");
    char *prefix = trill_path_join(dir, "optimizer");
    float p[5], p2[5];
    trill_adamw *o = three_steps(p);
    assert_int_equal(trill_adamw_save(o, prefix), TRILL_OK);
    trill_adamw *back;
    assert_int_equal(trill_adamw_load(prefix, 5, &back), TRILL_OK);
    assert_int_equal(back->step, 3);
    assert_true(back->config.beta2 == 0.95);
    assert_memory_equal(back->exp_avg, o->exp_avg, 5 * sizeof(float));
    /* a resumed step equals an uninterrupted one */
    memcpy(p2, p, sizeof p);
    trill_adamw_step(o, p, GRADS[0], 0.01, NULL);
    trill_adamw_step(back, p2, GRADS[0], 0.01, NULL);
    assert_memory_equal(p, p2, sizeof p);
    trill_adamw_free(back);
    assert_int_equal(trill_adamw_load(prefix, 6, &back), TRILL_ERR_INVALID); /* wrong trainable size */
    assert_non_null(strstr(trill_error_message(), "expected F32 with 6 values"));
    trill_adamw_free(o);
    free(prefix);
    test_rmdir(dir);
    free(dir);
}

static void test_clip_and_schedules(void **state) {
    (void)state;
    /* torch.nn.utils.clip_grad_norm_([3, 4], 1.0) -> norm 5, grads [0.6, 0.8] (coefficient 1/(5+1e-6)) */
    float g[2] = { 3, 4 };
    assert_true(fabs(trill_clip_grad_norm(g, 2, 1.0) - 5.0) < 1e-12);
    assert_true(fabs(g[0] - 0.6) < 1e-6 && fabs(g[1] - 0.8) < 1e-6);
    assert_true(fabs(trill_clip_grad_norm(g, 2, 10.0) - 1.0) < 1e-6 && fabs(g[1] - 0.8) < 1e-6); /* under the bound: untouched */

    assert_true(fabs(trill_lr_at(TRILL_LR_CONSTANT, 1e-3, 0, 10, 100, 4) - 5e-4) < 1e-15); /* warm-up (step+1)/10 */
    assert_true(trill_lr_at(TRILL_LR_CONSTANT, 1e-3, 0, 10, 100, 50) == 1e-3);
    assert_true(fabs(trill_lr_at(TRILL_LR_LINEAR, 1e-3, 1e-4, 10, 110, 60) - 5.5e-4) < 1e-15);
    assert_true(fabs(trill_lr_at(TRILL_LR_COSINE, 1e-3, 0, 0, 100, 50) - 5e-4) < 1e-15);
    assert_true(fabs(trill_lr_at(TRILL_LR_COSINE, 1e-3, 1e-4, 0, 100, 100) - 1e-4) < 1e-15);
    trill_lr_schedule s;
    assert_int_equal(trill_lr_schedule_parse("cosine", &s), 0);
    assert_int_equal(s, TRILL_LR_COSINE);
    assert_int_equal(trill_lr_schedule_parse("step", &s), -1);
}

/* The tensor-by-tensor squared norm: each part's sum is trill_grad_sumsq's (fixed blocks of 16384
 * in order), whatever the thread count, and close to the exact sum. */
static void test_grad_sumsq_parts(void **state) {
    (void)state;
    enum { N = 100003 };
    float *g = malloc(sizeof(float) * N);
    assert_non_null(g);
    for (size_t i = 0; i < N; i++) g[i] = (float)(sin((double)i * 0.37) * pow(10.0, (double)(i % 7) - 3));
    const size_t offset[4] = { 0, 7, 40000, 40001 }, numel[4] = { 7, 39993, 1, N - 40001 };
    double got[4], again[4];
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        assert_int_equal(trill_grad_sumsq_parts(g, offset, numel, 4, threads == 1 ? got : again), TRILL_OK);
        if (threads > 1) assert_memory_equal(got, again, sizeof got);
    }
    for (int k = 0; k < 4; k++) {
        assert_true(got[k] == trill_grad_sumsq(g + offset[k], numel[k]));
        long double exact = 0;
        for (size_t i = 0; i < numel[k]; i++) exact += (long double)g[offset[k] + i] * g[offset[k] + i];
        assert_true(fabsl((long double)got[k] - exact) <= 1e-12L * exact);
    }
    /* more than one block: not the plain running sum */
    double running = 0;
    for (size_t i = 0; i < numel[3]; i++) running += (double)g[offset[3] + i] * g[offset[3] + i];
    assert_true(got[3] != running);
    float c[2] = { 3, 4 };
    trill_clip_grads_to(c, 2, 5.0, 1.0);
    assert_true(c[0] == (float)(3 * (float)(1.0 / (5.0 + 1e-6))) && fabs(c[1] - 0.8) < 1e-6);
    trill_clip_grads_to(c, 2, 1.0, 10.0); /* under the bound: untouched */
    assert_true(fabs(c[1] - 0.8) < 1e-6);
    free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_sumsq_parts),
        cmocka_unit_test(test_adamw_matches_torch),
        cmocka_unit_test(test_adamw_state_round_trip),
        cmocka_unit_test(test_clip_and_schedules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
