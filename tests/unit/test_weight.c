/* Kernels on stored weights (trill/weight.h): a bf16 matrix gives exactly what the fp32
 * kernels give on its widened values, across several panels. The forward splits the output
 * columns into panels, which leaves every sum as it was: bit-identical to the whole-matrix fp32
 * forward. The input gradient's sum runs over the output dimension, which the panels split
 * (dinp += dout[:, panel] W[panel], panel after panel): bit-identical to the fp32 kernel applied
 * panel by panel, and within rounding of the whole-matrix one (only the association differs). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "trill/dtype.h"
#include "trill/kernels.h"
#include "trill/rng.h"

static void fill(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) x[i] = (float)trill_rng_normal(seed, i);
}

static void expect_equal(const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) fail_msg("element %zu: %.9g, expected %.9g", i, got[i], want[i]);
}

/* The floats the panelled kernels widen at a time (weight.c's WEIGHT_PANEL). */
enum { PANEL_FLOATS = 1 << 20 };

/* N*K above one panel (1 << 20 floats): three panels, the last one short. */
static void test_bf16_matmul_matches_widened_fp32(void **state) {
    (void)state;
    enum { T = 7, K = 1000, N = 2500 };
    float *inp = malloc(sizeof(float) * T * K), *w32 = malloc(sizeof(float) * (size_t)N * K);
    uint16_t *w16 = malloc(sizeof(uint16_t) * (size_t)N * K);
    float *want = malloc(sizeof(float) * T * N), *got = malloc(sizeof(float) * T * N);
    float *dout = malloc(sizeof(float) * T * N), *dwant = calloc(T * K, sizeof(float)), *dgot = calloc(T * K, sizeof(float));
    fill(inp, T * K, 1);
    fill(w32, (size_t)N * K, 2);
    fill(dout, T * N, 3);
    trill_from_f32(w16, w32, TRILL_BF16, (size_t)N * K);
    trill_to_f32(w32, w16, TRILL_BF16, (size_t)N * K); /* the values bf16 holds */

    trill_matmul_forward(want, inp, w32, T, K, N);
    trill_matmul_forward_w(got, inp, (trill_weight){ NULL, w16 }, T, K, N);
    expect_equal(got, want, T * N);

    /* the fp32 backward panel by panel: dout's columns of the panel, the panel's rows of W */
    const int rows = PANEL_FLOATS / K;
    assert_true(rows < N && 2 * rows < N && 3 * rows > N); /* three panels, the last one short */
    float *dpanel = malloc(sizeof(float) * T * rows), *dwhole = malloc(sizeof(float) * T * K);
    for (size_t i = 0; i < T * K; i++) dwant[i] = dgot[i] = dwhole[i] = 0.5f; /* accumulates */
    for (int n0 = 0; n0 < N; n0 += rows) {
        const int nb = N - n0 < rows ? N - n0 : rows;
        for (int t = 0; t < T; t++) memcpy(dpanel + (size_t)t * nb, dout + (size_t)t * N + n0, sizeof(float) * nb);
        trill_matmul_backward(dwant, NULL, dpanel, inp, w32 + (size_t)n0 * K, T, K, nb);
    }
    trill_matmul_backward_w(dgot, NULL, dout, inp, (trill_weight){ NULL, w16 }, T, K, N);
    expect_equal(dgot, dwant, T * K);
    /* the whole-matrix fp32 backward sums the same products associated otherwise: within a few
     * roundings of the sum of their magnitudes (measured: at most 0.7 * 2^-24 of it) */
    trill_matmul_backward(dwhole, NULL, dout, inp, w32, T, K, N);
    double *mag = malloc(sizeof(double) * T * K);
    for (int t = 0; t < T; t++) {
        double *mt = mag + (size_t)t * K;
        for (int k = 0; k < K; k++) mt[k] = 0.5;
        for (int n = 0; n < N; n++)
            for (int k = 0; k < K; k++) mt[k] += fabs((double)dout[(size_t)t * N + n] * w32[(size_t)n * K + k]);
    }
    for (size_t i = 0; i < T * K; i++)
        if (fabs((double)dgot[i] - dwhole[i]) > 0x1p-20 * mag[i]) fail_msg("dinp element %zu: %.9g vs the whole-matrix %.9g", i, dgot[i], dwhole[i]);
    free(mag);
    free(dpanel);
    free(dwhole);

    /* fp32 storage goes straight through */
    trill_matmul_forward_w(got, inp, (trill_weight){ w32, NULL }, T, K, N);
    assert_memory_equal(got, want, sizeof(float) * T * N);

    free(inp); free(w32); free(w16); free(want); free(got); free(dout); free(dwant); free(dgot);
}

static void test_bf16_embedding(void **state) {
    (void)state;
    enum { V = 50, C = 24, T = 6 };
    float table[V * C], want[T * C], got[T * C];
    uint16_t t16[V * C];
    const int tokens[T] = { 3, 49, 0, 3, 17, 8 };
    fill(table, V * C, 4);
    trill_from_f32(t16, table, TRILL_BF16, V * C);
    trill_to_f32(table, t16, TRILL_BF16, V * C);
    trill_embedding_forward(want, table, tokens, T, C);
    trill_embedding_forward_w(got, (trill_weight){ NULL, t16 }, tokens, T, C);
    assert_memory_equal(got, want, sizeof want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_matmul_matches_widened_fp32),
        cmocka_unit_test(test_bf16_embedding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
