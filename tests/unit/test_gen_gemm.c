/* The generator's weight formats and matrix kernels (infer/gemm.h): each format against an
 * independent reference of its specified arithmetic, against exact (double) products within a
 * stated bound, every instruction set against the generic path, and batch invariance (a row's
 * outputs bit-identical alone, in batches of 37 and 256, on 1 or 2 threads).
 *
 * `test_gen_gemm --isa NAME` tests one instruction set (generic, avx2, avx512) and, unless it is
 * generic, compares it with the generic path; ctest runs one entry per instruction set
 * (tests/unit/CMakeLists.txt), and an entry whose instruction set this CPU lacks exits 77, which
 * ctest reports as skipped, never as passed. Without --isa: every instruction set the CPU has.
 * TRILL_TEST_NO_ISA=avx512,avx2 makes the test treat those as missing (to see the skips on a
 * CPU that has them). */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "infer/gemm.h"
#include "trill/dtype.h"
#include "trill/kernels.h"
#include "trill/rng.h"

static const trill_gen_format FORMATS[] = { TRILL_GEN_F32, TRILL_GEN_BF16, TRILL_GEN_INT8 };
static const gen_isa ISAS[] = { GEN_ISA_GENERIC, GEN_ISA_AVX2, GEN_ISA_AVX512 };
enum { N_FORMATS = 3, N_ISAS = 3 };

/* Odd shapes on purpose: N and K off the 16-lane blocks and the 2/4-element groups. */
static const struct shape { int N, K; } SHAPES[] = { { 37, 50 }, { 1, 1 }, { 16, 1 }, { 17, 3 }, { 64, 64 }, { 130, 257 }, { 48, 1030 } };
enum { N_SHAPES = sizeof SHAPES / sizeof SHAPES[0] };

static float *randn(size_t n, uint64_t key, double sd) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(sd * trill_rng_normal(key, i));
    return x;
}

/* The instruction set under test (--isa), or -1: every one this CPU has. */
static int g_isa = -1;

/* Supported by this CPU and not switched off by TRILL_TEST_NO_ISA (a comma-separated list). */
static bool isa_available(gen_isa isa) {
    const char *off = getenv("TRILL_TEST_NO_ISA");
    if (off) {
        const char *name = trill_gen_isa_name(isa);
        const size_t len = strlen(name);
        for (const char *p = off; (p = strstr(p, name)) != NULL; p += len)
            if ((p == off || p[-1] == ',') && (p[len] == '\0' || p[len] == ',')) return false;
    }
    return trill_gen_isa_supported(isa);
}

/* Whether the tests below run instruction set `isa`. */
static bool tested(gen_isa isa) { return g_isa >= 0 ? (int)isa == g_isa : isa_available(isa); }

/* The instruction set of the tests that run one: the one under test, or the best there is. */
static gen_isa one_isa(void) {
    if (g_isa >= 0) return (gen_isa)g_isa;
    for (int i = GEN_ISA_AVX512; i > GEN_ISA_GENERIC; i--)
        if (isa_available((gen_isa)i)) return (gen_isa)i;
    return GEN_ISA_GENERIC;
}

static float *run(const gen_matrix *m, const float *inp, int T, gen_isa isa) {
    float *out = malloc(sizeof(float) * (size_t)T * m->N + 1);
    assert_non_null(out);
    trill_gen_matmul_isa(out, inp, m, T, isa);
    return out;
}

static double bf16_round(float v) { return trill_bf16_to_f32(trill_f32_to_bf16(v)); }

/* The quantisation the header specifies, written out again: q = nearbyint(v * (127/absmax)). */
static float quantize(const float *v, int n, int8_t *q) {
    float absmax = 0;
    for (int i = 0; i < n; i++) absmax = fmaxf(absmax, fabsf(v[i]));
    const float inv = absmax > 0 ? 127.0f / absmax : 0.0f;
    for (int i = 0; i < n; i++) {
        float r = nearbyintf(v[i] * inv);
        q[i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
    }
    return absmax / 127.0f;
}

/* Sum over k of |w||x| per output: the scale every error bound below is relative to. */
static double abs_dot(const float *w, const float *x, int K) {
    double s = 0;
    for (int k = 0; k < K; k++) s += fabs((double)w[k] * x[k]);
    return s;
}

static void test_f32_matches_double(void **state) {
    (void)state;
    for (int si = 0; si < N_SHAPES; si++) {
        const int N = SHAPES[si].N, K = SHAPES[si].K, T = 5;
        float *w = randn((size_t)N * K, 1 + si, 1.0), *x = randn((size_t)T * K, 100 + si, 1.0);
        gen_matrix m;
        assert_int_equal(trill_gen_matrix_create(&m, TRILL_GEN_F32, w, NULL, N, K), TRILL_OK);
        float *trainer = malloc(sizeof(float) * (size_t)T * N);
        trill_matmul_forward(trainer, x, w, T, K, N);
        for (int ii = 0; ii < N_ISAS; ii++) {
            if (!tested(ISAS[ii])) continue;
            float *out = run(&m, x, T, ISAS[ii]);
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++) {
                    double ref = 0;
                    for (int k = 0; k < K; k++) ref += (double)w[(size_t)n * K + k] * x[(size_t)t * K + k];
                    const double scale = abs_dot(w + (size_t)n * K, x + (size_t)t * K, K) + 1e-30;
                    const float o = out[(size_t)t * N + n];
                    assert_true(fabs(o - ref) <= 1e-5 * scale);
                    assert_true(fabs(o - trainer[(size_t)t * N + n]) <= 1e-5 * scale); /* the trainer's fp32 forward */
                }
            free(out);
        }
        free(trainer);
        trill_gen_matrix_free(&m);
        free(w);
        free(x);
    }
}

/* bf16: against the same products of rounded values summed in double. The fp32 accumulation is
 * the only difference: ||out - ref|| <= 1e-6 ||ref|| over the output (measured 2.7e-7 at K = 1030),
 * and per element <= K * 2^-24 * sum |w||x| (the worst case of sequential summation). Against the
 * unrounded fp32 inputs: per element <= (2^-7 + K 2^-24) * sum |w||x| (bf16's unit roundoff is
 * 2^-8, once for the weight and once for the activation). */
static void test_bf16_matches_rounded_reference(void **state) {
    (void)state;
    for (int si = 0; si < N_SHAPES; si++) {
        const int N = SHAPES[si].N, K = SHAPES[si].K, T = 7;
        float *w = randn((size_t)N * K, 2 + si, 1.0), *x = randn((size_t)T * K, 200 + si, 1.0);
        gen_matrix m;
        assert_int_equal(trill_gen_matrix_create(&m, TRILL_GEN_BF16, w, NULL, N, K), TRILL_OK);
        for (int ii = 0; ii < N_ISAS; ii++) {
            if (!tested(ISAS[ii])) continue;
            float *out = run(&m, x, T, ISAS[ii]);
            double err2 = 0, ref2 = 0;
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++) {
                    double ref = 0, exact = 0;
                    for (int k = 0; k < K; k++) {
                        ref += bf16_round(w[(size_t)n * K + k]) * bf16_round(x[(size_t)t * K + k]);
                        exact += (double)w[(size_t)n * K + k] * x[(size_t)t * K + k];
                    }
                    const double scale = abs_dot(w + (size_t)n * K, x + (size_t)t * K, K);
                    const double o = out[(size_t)t * N + n];
                    assert_true(fabs(o - ref) <= K * 0x1p-24 * scale * 1.01);
                    assert_true(fabs(o - exact) <= (0x1p-7 + K * 0x1p-24) * scale);
                    err2 += (o - ref) * (o - ref);
                    ref2 += ref * ref;
                }
            assert_true(sqrt(err2) <= 1e-6 * sqrt(ref2));
            free(out);
        }
        trill_gen_matrix_free(&m);
        free(w);
        free(x);
    }
}

/* int8: the reference quantises by the specification and accumulates exactly in integers, then
 * scales as specified ((float)dot * scale_x * scale_w): the outputs must be identical. Against
 * the exact fp32 product: |x - qx sx| <= sx/2 and |w - qw sw| <= sw/2 bound the error per
 * element by sx/2 sum|w| + sw/2 sum|x| + K sx sw/4, plus fp32 rounding of the scaling. */
static void test_int8_matches_quantized_reference(void **state) {
    (void)state;
    for (int si = 0; si < N_SHAPES; si++) {
        const int N = SHAPES[si].N, K = SHAPES[si].K, T = 6;
        float *w = randn((size_t)N * K, 3 + si, 0.5), *x = randn((size_t)T * K, 300 + si, 2.0);
        if (si == 0) memset(x, 0, sizeof(float) * (size_t)K); /* an all-zero row: scale 0, outputs 0 */
        gen_matrix m;
        assert_int_equal(trill_gen_matrix_create(&m, TRILL_GEN_INT8, w, NULL, N, K), TRILL_OK);
        int8_t *qw = malloc((size_t)N * K), *qx = malloc((size_t)T * K);
        float *sw = malloc(sizeof(float) * N), *sx = malloc(sizeof(float) * T);
        for (int n = 0; n < N; n++) {
            sw[n] = quantize(w + (size_t)n * K, K, qw + (size_t)n * K);
            assert_true(sw[n] == m.scale[n]);
        }
        for (int t = 0; t < T; t++) sx[t] = quantize(x + (size_t)t * K, K, qx + (size_t)t * K);
        for (int ii = 0; ii < N_ISAS; ii++) {
            if (!tested(ISAS[ii])) continue;
            float *out = run(&m, x, T, ISAS[ii]);
            for (int t = 0; t < T; t++)
                for (int n = 0; n < N; n++) {
                    int64_t dot = 0;
                    double exact = 0, sum_w = 0, sum_x = 0;
                    for (int k = 0; k < K; k++) {
                        dot += qw[(size_t)n * K + k] * qx[(size_t)t * K + k];
                        exact += (double)w[(size_t)n * K + k] * x[(size_t)t * K + k];
                        sum_w += fabsf(w[(size_t)n * K + k]);
                        sum_x += fabsf(x[(size_t)t * K + k]);
                    }
                    const float ref = (float)dot * sx[t] * sw[n], o = out[(size_t)t * N + n];
                    assert_memory_equal(&o, &ref, sizeof o);
                    const double bound = 0.5 * sx[t] * sum_w + 0.5 * sw[n] * sum_x + 0.25 * K * sx[t] * sw[n];
                    assert_true(fabs(o - exact) <= bound * 1.001 + 1e-6 * fabs(exact));
                }
            free(out);
        }
        free(qw);
        free(qx);
        free(sw);
        free(sx);
        trill_gen_matrix_free(&m);
        free(w);
        free(x);
    }
}

/* Every instruction set against the generic path: bit-identical, except AVX-512's bf16, which is
 * the hardware's vdpbf16ps (its rounding of the pair sum and denormal flushing are its own). */
static void test_isas_agree_with_generic(void **state) {
    (void)state;
    int compared = 0;
    for (int T = 19; T <= 70; T += 51) /* activations converted per thread (small T) and shared */
    for (int fi = 0; fi < N_FORMATS; fi++) {
        const int N = 300, K = 333;
        float *w = randn((size_t)N * K, 4, 1.0), *x = randn((size_t)T * K, 400, 1.0);
        gen_matrix m;
        assert_int_equal(trill_gen_matrix_create(&m, FORMATS[fi], w, NULL, N, K), TRILL_OK);
        float *ref = run(&m, x, T, GEN_ISA_GENERIC);
        for (int ii = 1; ii < N_ISAS; ii++) {
            if (!tested(ISAS[ii])) continue;
            float *out = run(&m, x, T, ISAS[ii]);
            if (ISAS[ii] == GEN_ISA_AVX512 && FORMATS[fi] == TRILL_GEN_BF16) {
                for (size_t i = 0; i < (size_t)T * N; i++) assert_true(fabsf(out[i] - ref[i]) <= 1e-5f * (1 + fabsf(ref[i])));
            } else {
                assert_memory_equal(out, ref, sizeof(float) * (size_t)T * N);
            }
            compared++;
            free(out);
        }
        free(ref);
        trill_gen_matrix_free(&m);
        free(w);
        free(x);
    }
    for (int ii = 0; ii < N_ISAS; ii++)
        fprintf(stderr, "test_gen_gemm: %s %s\n", trill_gen_isa_name(ISAS[ii]),
                tested(ISAS[ii]) ? "tested" : isa_available(ISAS[ii]) ? "not selected" : "not available here");
    if (g_isa > GEN_ISA_GENERIC) assert_int_equal(compared, 2 * N_FORMATS); /* both batch sizes, every format */
}

/* The row under test alone (T = 1) and at a position inside batches of random other rows, and
 * the whole batch on 1, 2 or 3 threads (3: uneven splits of the blocks): the same bits. */
static void check_batch_invariance(trill_gen_format f, gen_isa isa, int N, int K) {
    float *w = randn((size_t)N * K, 5, 1.0), *row = randn((size_t)K, 500, 1.0);
    gen_matrix m;
    assert_int_equal(trill_gen_matrix_create(&m, f, w, NULL, N, K), TRILL_OK);
    float *alone = run(&m, row, 1, isa);
    static const struct { int T, at; } BATCHES[] = { { 2, 1 }, { 5, 3 }, { 37, 13 }, { 37, 36 }, { 256, 200 }, { 256, 0 } };
    for (size_t i = 0; i < sizeof BATCHES / sizeof BATCHES[0]; i++) {
        const int T = BATCHES[i].T, at = BATCHES[i].at;
        float *batch = randn((size_t)T * K, 600 + i, 3.0); /* other rows of other magnitudes */
        memcpy(batch + (size_t)at * K, row, sizeof(float) * K);
        float *out = run(&m, batch, T, isa);
        assert_memory_equal(out + (size_t)at * N, alone, sizeof(float) * N);
        const int threads = omp_get_max_threads();
        for (int nt = 1; nt <= 3; nt++) {
            omp_set_num_threads(nt);
            float *other = run(&m, batch, T, isa);
            assert_memory_equal(other, out, sizeof(float) * (size_t)T * N);
            free(other);
        }
        omp_set_num_threads(threads);
        free(out);
        free(batch);
    }
    free(alone);
    trill_gen_matrix_free(&m);
    free(w);
    free(row);
}

static void test_batch_invariance(void **state) {
    (void)state;
    for (int ii = 0; ii < N_ISAS; ii++) {
        if (!tested(ISAS[ii])) continue;
        for (int fi = 0; fi < N_FORMATS; fi++) {
            check_batch_invariance(FORMATS[fi], ISAS[ii], 37, 50);
            check_batch_invariance(FORMATS[fi], ISAS[ii], 200, 515);
        }
    }
}

/* A batch of products (trill_gen_matmul_many) against each product alone: the three formats
 * reading one shared input (converted once) and strided ones, row counts 0, 1, 5 and 37, products
 * stored into columns of a wider output and products added into columns with a scale
 * (fmaf(scale, product, out)); on 1, 2 and 3 threads and from inside a parallel region: the
 * same bits as trill_gen_matmul of each product followed by that store or fused multiply-add. */
enum { MANY = 7 };

static void test_many_products(void **state) {
    (void)state;
    static const struct { int f, N, K, T, ldi_extra, in_off, out_col, accumulate; float scale; } P[MANY] = {
        { 0, 37, 50, 5, 0, 0, 0, 0, 0 },      /* f32, shared input (x0) */
        { 1, 40, 50, 5, 0, 0, 40, 0, 0 },     /* bf16, same input: converted once */
        { 2, 33, 50, 5, 0, 0, 80, 0, 0 },     /* int8, same input */
        { 1, 20, 17, 37, 9, 5, 113, 1, 0.37f }, /* bf16 on columns 5.. of a wider input, added */
        { 0, 19, 16, 37, 4, 20, 133, 1, -2.5f }, /* f32 strided (an expand), added */
        { 2, 16, 64, 1, 0, 0, 152, 1, 1.0f }, /* int8, one row, added with scale 1 */
        { 1, 30, 8, 0, 0, 0, 168, 0, 0 },     /* no rows: nothing written */
    };
    enum { WIDTH = 200, ROWS = 37 };
    for (int ii = 0; ii < N_ISAS; ii++) {
        if (!tested(ISAS[ii])) continue;
        gen_matrix m[MANY];
        float *inputs[MANY], *w[MANY];
        size_t ldi[MANY];
        float *x0 = randn((size_t)5 * 50, 900, 1.0);
        for (int p = 0; p < MANY; p++) {
            w[p] = randn((size_t)P[p].N * P[p].K, 910 + p, 1.0);
            assert_int_equal(trill_gen_matrix_create(&m[p], FORMATS[P[p].f], w[p], NULL, P[p].N, P[p].K), TRILL_OK);
            ldi[p] = (size_t)P[p].K + P[p].ldi_extra + P[p].in_off;
            inputs[p] = p < 3 ? x0 : randn(ldi[p] * (P[p].T ? P[p].T : 1), 920 + p, 2.0);
            if (p < 3) ldi[p] = 50;
        }
        float *init = randn((size_t)ROWS * WIDTH, 930, 1.0), *want = malloc(sizeof(float) * ROWS * WIDTH);
        memcpy(want, init, sizeof(float) * ROWS * WIDTH);
        for (int p = 0; p < MANY; p++) { /* each alone: a compact input, trill_gen_matmul, then the store */
            if (!P[p].T) continue;
            float *x = malloc(sizeof(float) * (size_t)P[p].T * P[p].K);
            for (int t = 0; t < P[p].T; t++) memcpy(x + (size_t)t * P[p].K, inputs[p] + t * ldi[p] + P[p].in_off, sizeof(float) * P[p].K);
            float *o = run(&m[p], x, P[p].T, ISAS[ii]);
            for (int t = 0; t < P[p].T; t++)
                for (int n = 0; n < P[p].N; n++) {
                    float *d = &want[(size_t)t * WIDTH + P[p].out_col + n];
                    *d = P[p].accumulate ? fmaf(P[p].scale, o[(size_t)t * P[p].N + n], *d) : o[(size_t)t * P[p].N + n];
                }
            free(o);
            free(x);
        }
        gen_product list[MANY];
        for (int p = 0; p < MANY; p++)
            list[p] = (gen_product){ .out = init + P[p].out_col, .ldo = WIDTH, .inp = inputs[p] + P[p].in_off, .ldi = ldi[p], .W = &m[p],
                                     .T = P[p].T, .accumulate = P[p].accumulate, .scale = P[p].scale };
        const int threads = omp_get_max_threads();
        for (int mode = 0; mode < 4; mode++) { /* 1, 2, 3 threads, and inside a parallel region */
            float *got = malloc(sizeof(float) * ROWS * WIDTH);
            memcpy(got, init, sizeof(float) * ROWS * WIDTH);
            for (int p = 0; p < MANY; p++) list[p].out = got + P[p].out_col;
            if (mode < 3) {
                omp_set_num_threads(mode + 1);
                assert_int_equal(trill_gen_matmul_many_isa(list, MANY, ISAS[ii]), TRILL_OK);
            } else {
                omp_set_num_threads(threads);
                trill_status st = TRILL_OK;
#pragma omp parallel num_threads(2)
                {
#pragma omp single
                    st = trill_gen_matmul_many_isa(list, MANY, ISAS[ii]);
                }
                assert_int_equal(st, TRILL_OK);
            }
            assert_memory_equal(got, want, sizeof(float) * ROWS * WIDTH);
            free(got);
        }
        omp_set_num_threads(threads);
        for (int p = 0; p < MANY; p++) {
            trill_gen_matrix_free(&m[p]);
            free(w[p]);
            if (p >= 3) free(inputs[p]);
        }
        free(x0);
        free(init);
        free(want);
    }
    gen_product none = { 0 };
    assert_int_equal(trill_gen_matmul_many(&none, 0), TRILL_OK); /* an empty batch */
}

/* A bf16 source gives the same matrix as its fp32 widening; T = 0 writes nothing. */
static void test_bf16_source_and_empty_batch(void **state) {
    (void)state;
    const int N = 37, K = 50, T = 3;
    float *w = randn((size_t)N * K, 6, 1.0), *x = randn((size_t)T * K, 700, 1.0);
    uint16_t *wb = malloc(sizeof(uint16_t) * N * K);
    trill_from_f32(wb, w, TRILL_BF16, (size_t)N * K);
    trill_to_f32(w, wb, TRILL_BF16, (size_t)N * K);
    for (int fi = 0; fi < N_FORMATS; fi++) {
        gen_matrix a, b;
        assert_int_equal(trill_gen_matrix_create(&a, FORMATS[fi], w, NULL, N, K), TRILL_OK);
        assert_int_equal(trill_gen_matrix_create(&b, FORMATS[fi], NULL, wb, N, K), TRILL_OK);
        assert_int_equal(a.bytes, b.bytes);
        assert_memory_equal(a.data, b.data, a.bytes - (FORMATS[fi] == TRILL_GEN_INT8 ? (size_t)N * 8 : 0));
        float *oa = run(&a, x, T, one_isa()), *ob = run(&b, x, T, one_isa());
        assert_memory_equal(oa, ob, sizeof(float) * T * N);
        float sentinel = -7.0f;
        trill_gen_matmul(&sentinel, x, &a, 0);
        trill_gen_matmul_isa(&sentinel, x, &a, 0, one_isa());
        assert_true(sentinel == -7.0f);
        free(oa);
        free(ob);
        trill_gen_matrix_free(&a);
        trill_gen_matrix_free(&b);
    }
    free(wb);
    free(w);
    free(x);
}

static void test_refusals_and_names(void **state) {
    (void)state;
    float w[4] = { 1, 2, 3, 4 };
    uint16_t wb[4] = { 0 };
    gen_matrix m;
    assert_int_equal(trill_gen_matrix_create(&m, TRILL_GEN_F32, NULL, NULL, 2, 2), TRILL_ERR_INVALID);
    assert_int_equal(trill_gen_matrix_create(&m, TRILL_GEN_F32, w, wb, 2, 2), TRILL_ERR_INVALID);
    assert_int_equal(trill_gen_matrix_create(&m, TRILL_GEN_BF16, w, NULL, 0, 2), TRILL_ERR_INVALID);
    assert_int_equal(trill_gen_matrix_create(&m, TRILL_GEN_BF16, w, NULL, 2, -1), TRILL_ERR_INVALID);
    assert_int_equal(trill_gen_matrix_create(&m, (trill_gen_format)7, w, NULL, 2, 2), TRILL_ERR_INVALID);
    assert_int_equal(trill_gen_matrix_create(&m, TRILL_GEN_INT8, w, NULL, 1, GEN_INT8_MAX_K + 1), TRILL_ERR_UNSUPPORTED);
    assert_non_null(strstr(trill_error_message(), "int8"));
    assert_null(m.data);
    trill_gen_matrix_free(&m); /* safe after a failure */
    for (int fi = 0; fi < N_FORMATS; fi++) {
        trill_gen_format back;
        assert_int_equal(trill_gen_format_parse(trill_gen_format_name(FORMATS[fi]), &back), 0);
        assert_int_equal(back, FORMATS[fi]);
    }
    trill_gen_format back;
    assert_int_equal(trill_gen_format_parse("fp8", &back), -1);
    assert_true(trill_gen_isa_supported(trill_gen_isa_best()));
}

/* int8 scales of a matrix with a non-finite weight: that channel's outputs are NaN, the others
 * unaffected. */
static void test_int8_nonfinite_channel(void **state) {
    (void)state;
    const int N = 3, K = 8;
    float *w = randn((size_t)N * K, 8, 1.0), *x = randn(K, 800, 1.0);
    w[K + 2] = INFINITY;
    gen_matrix m;
    assert_int_equal(trill_gen_matrix_create(&m, TRILL_GEN_INT8, w, NULL, N, K), TRILL_OK);
    float out[3];
    trill_gen_matmul_isa(out, x, &m, 1, one_isa());
    assert_true(isfinite(out[0]) && isnan(out[1]) && isfinite(out[2]));
    trill_gen_matrix_free(&m);
    free(w);
    free(x);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--isa") == 0) {
        for (int ii = 0; ii < N_ISAS; ii++)
            if (strcmp(argv[2], trill_gen_isa_name(ISAS[ii])) == 0) g_isa = (int)ISAS[ii];
        if (g_isa < 0) {
            fprintf(stderr, "test_gen_gemm: unknown instruction set %s (generic, avx2, avx512)\n", argv[2]);
            return 2;
        }
        if (!isa_available((gen_isa)g_isa)) {
            fprintf(stderr, "test_gen_gemm: this CPU lacks %s%s: skipped\n", argv[2],
                    trill_gen_isa_supported((gen_isa)g_isa) ? " (TRILL_TEST_NO_ISA)" : "");
            return 77; /* ctest's SKIP_RETURN_CODE */
        }
    } else if (argc != 1) {
        fprintf(stderr, "usage: test_gen_gemm [--isa generic|avx2|avx512]\n");
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_matches_double),
        cmocka_unit_test(test_bf16_matches_rounded_reference),
        cmocka_unit_test(test_int8_matches_quantized_reference),
        cmocka_unit_test(test_isas_agree_with_generic),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_many_products),
        cmocka_unit_test(test_bf16_source_and_empty_batch),
        cmocka_unit_test(test_refusals_and_names),
        cmocka_unit_test(test_int8_nonfinite_channel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
