/* The bf16 GEMM of the trainer's bf16 precision (src/kernels/gemm_bf16.c).
 *
 * The generic path is checked against the definition — the fp64 sum of the products of the
 * bf16-rounded operands — within fp32 accumulation's bound, on every transposition, edge
 * shapes (M, N not multiples of the tile, odd K, K over one chunk), alpha and beta (beta 0 must
 * not read C: it holds NaN). With `--native` (registered as test_gemm_bf16_native; a skip where
 * the CPU lacks AVX-512 BF16) the vdpbf16ps path must equal the generic one bit for bit on the
 * same cases (normal numbers only: vdpbf16ps flushes denormals). Also: a bf16-stored B equals
 * its fp32 values, the threaded wrapper equals one call whatever the split, and the kernels
 * that take a precision give fp32 results for fp32 and results within bf16's bound for bf16. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels_internal.h"
#include "trill/dtype.h"
#include "trill/kernels.h"
#include "trill/rng.h"

static int g_native; /* --native: the vdpbf16ps path against the generic one */

static void fill(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) x[i] = (float)trill_rng_normal(seed, i);
}

static double bf(float v) { return (double)trill_bf16_to_f32(trill_f32_to_bf16(v)); }

typedef struct gcase {
    int ta, tb, M, N, K;
    float alpha, beta;
} gcase;

/* op(X)[i, k] of a row-major X */
static float at(const float *x, int trans, int ld, int i, int k) { return trans ? x[(size_t)k * ld + i] : x[(size_t)i * ld + k]; }

static void run_case(const gcase *c) {
    const int lda = c->ta ? c->M : c->K, ldb = c->tb ? c->K : c->N, ldc = c->N + 3; /* C with a gap after each row */
    float *A = malloc(sizeof(float) * (size_t)c->M * c->K), *B = malloc(sizeof(float) * (size_t)c->K * c->N);
    float *C0 = malloc(sizeof(float) * (size_t)c->M * ldc), *C = malloc(sizeof(float) * (size_t)c->M * ldc);
    fill(A, (size_t)c->M * c->K, 11 + c->M);
    fill(B, (size_t)c->K * c->N, 13 + c->N);
    for (size_t i = 0; i < (size_t)c->M * ldc; i++) C0[i] = c->beta == 0 ? NAN : (float)trill_rng_normal(17, i);
    memcpy(C, C0, sizeof(float) * (size_t)c->M * ldc);
    const enum CBLAS_TRANSPOSE ta = c->ta ? CblasTrans : CblasNoTrans, tb = c->tb ? CblasTrans : CblasNoTrans;
    assert_int_equal(trill_kernels_gemm_bf16(0, ta, tb, c->M, c->N, c->K, c->alpha, A, lda, B, NULL, ldb, c->beta, C, ldc), 0);
    for (int i = 0; i < c->M; i++)
        for (int j = 0; j < c->N; j++) {
            double sum = 0, mag = 0;
            for (int k = 0; k < c->K; k++) {
                const double p = bf(at(A, c->ta, lda, i, k)) * bf(at(B, c->tb, ldb, k, j));
                sum += p;
                mag += fabs(p);
            }
            const double c0 = C0[(size_t)i * ldc + j], want = c->alpha * sum + (c->beta == 0 ? 0 : c->beta * c0);
            /* fp32 sums of K exact products: |error| <= K u sum|p| (u = 2^-24), plus the combine */
            const double tol = (c->K + 2) * 0x1p-24 * (fabs(c->alpha) * mag + fabs(c->beta * (c->beta == 0 ? 0 : c0))) + 1e-30;
            const double got = C[(size_t)i * ldc + j];
            if (!(fabs(got - want) <= tol))
                fail_msg("case %c%c M%d N%d K%d: C[%d,%d] = %.9g, expected %.9g (tol %.3g)", c->ta ? 'T' : 'N', c->tb ? 'T' : 'N', c->M, c->N,
                         c->K, i, j, got, want, tol);
        }
    for (int i = 0; i < c->M; i++) /* the gap after each row untouched */
        for (int j = c->N; j < ldc; j++) assert_memory_equal(&C[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], sizeof(float));
    if (g_native) {
        float *Cn = malloc(sizeof(float) * (size_t)c->M * ldc);
        memcpy(Cn, C0, sizeof(float) * (size_t)c->M * ldc);
        assert_int_equal(trill_kernels_gemm_bf16(1, ta, tb, c->M, c->N, c->K, c->alpha, A, lda, B, NULL, ldb, c->beta, Cn, ldc), 0);
        for (size_t i = 0; i < (size_t)c->M * ldc; i++)
            if (memcmp(&Cn[i], &C[i], sizeof(float)))
                fail_msg("native %c%c M%d N%d K%d: element %zu is %.9g, generic %.9g", c->ta ? 'T' : 'N', c->tb ? 'T' : 'N', c->M, c->N,
                         c->K, i, Cn[i], C[i]);
        free(Cn);
    }
    free(A);
    free(B);
    free(C0);
    free(C);
}

static void test_definition_every_transpose_and_edge(void **state) {
    (void)state;
    static const int shapes[][3] = { { 1, 1, 1 }, { 13, 33, 7 }, { 12, 32, 256 }, { 25, 65, 301 }, { 97, 40, 520 }, { 5, 4100, 3 } };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                run_case(&(gcase){ ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 1, 0 });
                run_case(&(gcase){ ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], -0.5f, 1 });
                run_case(&(gcase){ ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], 2, 0.25f });
            }
}

/* B stored as bf16 gives what its fp32 values give, bit for bit (both paths). */
static void test_bf16_storage_equals_its_values(void **state) {
    (void)state;
    enum { M = 30, N = 70, K = 300 };
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *C1 = malloc(sizeof(float) * M * N),
          *C2 = malloc(sizeof(float) * M * N);
    uint16_t *B16 = malloc(sizeof(uint16_t) * K * N);
    fill(A, M * K, 1);
    fill(B, K * N, 2);
    trill_from_f32(B16, B, TRILL_BF16, K * N);
    for (int native = 0; native <= g_native; native++)
        for (int tb = 0; tb < 2; tb++) {
            const enum CBLAS_TRANSPOSE t = tb ? CblasTrans : CblasNoTrans;
            const int ldb = tb ? K : N;
            assert_int_equal(trill_kernels_gemm_bf16(native, CblasNoTrans, t, M, N, K, 1, A, K, B, NULL, ldb, 0, C1, N), 0);
            assert_int_equal(trill_kernels_gemm_bf16(native, CblasNoTrans, t, M, N, K, 1, A, K, NULL, B16, ldb, 0, C2, N), 0);
            assert_memory_equal(C1, C2, sizeof(float) * M * N);
        }
    free(A);
    free(B);
    free(B16);
    free(C1);
    free(C2);
}

/* Values whose bf16 rounding is a tie (low 16 bits 0x8000, both parities of the kept bit) or
 * near one, mixed with ordinary ones: rounding that is not nearest-even shows. */
static void fill_ties(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        union { float f; uint32_t u; } v = { .f = (float)trill_rng_normal(seed, i) };
        const uint32_t low[] = { 0x8000u, 0x8000u, 0x7fffu, 0x8001u, v.u & 0xffffu };
        v.u = (v.u & 0xffff0000u) | low[i % 5];
        x[i] = v.f;
    }
}

/* The packing rounds each operand as trill_f32_to_bf16 does and puts it in its place: op(A) E and
 * E op(B) with E an identity give the rounded operand exactly (every other product is an exact
 * zero), for each transpose, a K over two chunks and edges in every dimension. */
static void test_packing_rounds_each_operand_in_place(void **state) {
    (void)state;
    enum { M = 29, K = 300 };
    float *X = malloc(sizeof(float) * M * K), *E = calloc((size_t)K * K, sizeof(float)), *C = malloc(sizeof(float) * M * K);
    fill_ties(X, (size_t)M * K, 5);
    for (int k = 0; k < K; k++) E[(size_t)k * K + k] = 1;
    for (int native = 0; native <= g_native; native++)
        for (int t = 0; t < 2; t++) {
            const enum CBLAS_TRANSPOSE tx = t ? CblasTrans : CblasNoTrans;
            const int ldx = t ? M : K; /* X holds op(X) = the M x K matrix below, transposed when t */
            float *Xs = malloc(sizeof(float) * M * K);
            for (int i = 0; i < M; i++)
                for (int k = 0; k < K; k++) Xs[t ? (size_t)k * M + i : (size_t)i * K + k] = X[(size_t)i * K + k];
            /* op(A) = X: C[M, K] = X E */
            assert_int_equal(trill_kernels_gemm_bf16(native, tx, CblasNoTrans, M, K, K, 1, Xs, ldx, E, NULL, K, 0, C, K), 0);
            for (size_t i = 0; i < (size_t)M * K; i++)
                if (C[i] != (float)bf(X[i])) fail_msg("A %c native %d: element %zu is %.9g, expected %.9g", t ? 'T' : 'N', native, i, C[i], bf(X[i]));
            /* op(B) = X^T: C[K, M] = E X^T, so C^T = X rounded */
            const enum CBLAS_TRANSPOSE tb = t ? CblasNoTrans : CblasTrans;
            assert_int_equal(trill_kernels_gemm_bf16(native, CblasNoTrans, tb, K, M, K, 1, E, K, Xs, NULL, ldx, 0, C, M), 0);
            for (int i = 0; i < M; i++)
                for (int k = 0; k < K; k++)
                    if (C[(size_t)k * M + i] != (float)bf(X[(size_t)i * K + k]))
                        fail_msg("B %c native %d: (%d, %d) is %.9g, expected %.9g", t ? 'N' : 'T', native, i, k, C[(size_t)k * M + i],
                                 bf(X[(size_t)i * K + k]));
            free(Xs);
        }
    free(X);
    free(E);
    free(C);
}

/* The threaded wrapper splits M (or N) across threads; each element is still one call's sum. */
static void test_threads_do_not_change_results(void **state) {
    (void)state;
    static const int shapes[][3] = { { 300, 200, 129 }, { 40, 900, 260 } }; /* split along M, then N */
    for (size_t s = 0; s < 2; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K), *C1 = malloc(sizeof(float) * M * N),
              *C2 = malloc(sizeof(float) * M * N);
        fill(A, (size_t)M * K, 3);
        fill(B, (size_t)N * K, 4);
        assert_int_equal(trill_kernels_gemm(TRILL_PRECISION_BF16, CblasNoTrans, CblasTrans, M, N, K, 1, A, K, B, NULL, K, 0, C1, N), TRILL_OK);
        assert_int_equal(trill_kernels_gemm_bf16(trill_kernels_bf16_native(), CblasNoTrans, CblasTrans, M, N, K, 1, A, K, B, NULL, K, 0, C2, N), 0);
        assert_memory_equal(C1, C2, sizeof(float) * M * N);
        free(A);
        free(B);
        free(C1);
        free(C2);
    }
}

/* The kernels that take a precision: fp32 is the fp32 kernel bit for bit; bf16 is within bf16's
 * rounding of it (relative Frobenius error about 2^-9, far below 2%) and not equal to it. */
static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), den += (double)b[i] * b[i];
    return sqrt(num / den);
}

static void test_precision_kernels(void **state) {
    (void)state;
    enum { T = 64, K = 96, N = 80, NS = 2, NH = 4, NKV = 2, HD = 16 };
    float *x = malloc(sizeof(float) * T * K), *w = malloc(sizeof(float) * N * K), *o32 = malloc(sizeof(float) * T * N),
          *o16 = malloc(sizeof(float) * T * N), *ref = malloc(sizeof(float) * T * N);
    fill(x, T * K, 5);
    fill(w, N * K, 6);
    trill_matmul_forward(ref, x, w, T, K, N);
    assert_int_equal(trill_matmul_forward_p(o32, x, w, T, K, N, TRILL_PRECISION_FP32), TRILL_OK);
    assert_memory_equal(o32, ref, sizeof(float) * T * N);
    assert_int_equal(trill_matmul_forward_p(o16, x, w, T, K, N, TRILL_PRECISION_BF16), TRILL_OK);
    double e = rel_err(o16, ref, T * N);
    assert_true(e > 0 && e < 0.02);
    /* attention: q, k, v of two sequences */
    const int offsets[NS + 1] = { 0, 23, T };
    float *q = malloc(sizeof(float) * T * NH * HD), *k = malloc(sizeof(float) * T * NKV * HD), *v = malloc(sizeof(float) * T * NKV * HD);
    float *a32 = malloc(sizeof(float) * T * NH * HD), *a16 = malloc(sizeof(float) * T * NH * HD);
    fill(q, T * NH * HD, 7);
    fill(k, T * NKV * HD, 8);
    fill(v, T * NKV * HD, 9);
    assert_int_equal(trill_attention_forward(a32, q, k, v, offsets, NS, NH, NKV, HD, HD, 0.25f, TRILL_PRECISION_FP32, NULL), TRILL_OK);
    assert_int_equal(trill_attention_forward(a16, q, k, v, offsets, NS, NH, NKV, HD, HD, 0.25f, TRILL_PRECISION_BF16, NULL), TRILL_OK);
    e = rel_err(a16, a32, T * NH * HD);
    assert_true(e > 0 && e < 0.02);
    float *dq32 = calloc(T * NH * HD, sizeof(float)), *dk32 = calloc(T * NKV * HD, sizeof(float)), *dv32 = calloc(T * NKV * HD, sizeof(float));
    float *dq16 = calloc(T * NH * HD, sizeof(float)), *dk16 = calloc(T * NKV * HD, sizeof(float)), *dv16 = calloc(T * NKV * HD, sizeof(float));
    assert_int_equal(trill_attention_backward(dq32, dk32, dv32, a32, q, k, v, offsets, NS, NH, NKV, HD, HD, 0.25f, TRILL_PRECISION_FP32, NULL), TRILL_OK);
    assert_int_equal(trill_attention_backward(dq16, dk16, dv16, a32, q, k, v, offsets, NS, NH, NKV, HD, HD, 0.25f, TRILL_PRECISION_BF16, NULL), TRILL_OK);
    assert_true(rel_err(dq16, dq32, T * NH * HD) < 0.03);
    assert_true(rel_err(dk16, dk32, T * NKV * HD) < 0.03);
    assert_true(rel_err(dv16, dv32, T * NKV * HD) < 0.03);
    free(x), free(w), free(o32), free(o16), free(ref), free(q), free(k), free(v), free(a32), free(a16);
    free(dq32), free(dk32), free(dv32), free(dq16), free(dk16), free(dv16);
}

int main(int argc, char **argv) {
    g_native = argc > 1 && !strcmp(argv[1], "--native");
    if (g_native && !trill_kernels_bf16_native()) {
        printf("this CPU lacks AVX-512 BF16: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_definition_every_transpose_and_edge),
        cmocka_unit_test(test_bf16_storage_equals_its_values),
        cmocka_unit_test(test_packing_rounds_each_operand_in_place),
        cmocka_unit_test(test_threads_do_not_change_results),
        cmocka_unit_test(test_precision_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
