/* Kernels against hand-computed values. */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "trill/kernels.h"
#include "trill/rng.h"

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

/* ---- attention (blocked GEMMs) against a naive double-precision reference ---- */

/* Row by row, in double: out = softmax(scale q k^T, causal) v and, given dout, the gradients
 * dq, dk, dv (written, not accumulated). */
static void attention_reference(double *out, double *dq, double *dk, double *dv, const float *dout, const float *q,
                                const float *k, const float *v, const int *offsets, int n_seqs, int nh, int nkv, int hd) {
    const int T = offsets[n_seqs], group = nh / nkv;
    const double scale = 1 / sqrt((double)hd);
    const size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd;
    memset(dq, 0, sizeof(double) * T * qs);
    memset(dk, 0, sizeof(double) * T * ks);
    memset(dv, 0, sizeof(double) * T * ks);
    double *p = malloc(sizeof(double) * (T + 1)), *dp = malloc(sizeof(double) * (T + 1));
    assert_non_null(p), assert_non_null(dp);
    for (int s = 0; s < n_seqs; s++)
        for (int h = 0; h < nh; h++)
            for (int t = offsets[s]; t < offsets[s + 1]; t++) {
                const int g = h / group, n = t - offsets[s] + 1;
                const float *qt = q + t * qs + h * hd, *dot = dout + t * qs + h * hd;
                double maxv = -INFINITY, sum = 0, pdp = 0;
                for (int j = 0; j < n; j++) {
                    const float *kj = k + (offsets[s] + j) * ks + g * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)qt[i] * kj[i];
                    p[j] = d * scale;
                    if (p[j] > maxv) maxv = p[j];
                }
                for (int j = 0; j < n; j++) sum += p[j] = exp(p[j] - maxv);
                for (int j = 0; j < n; j++) p[j] /= sum;
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int j = 0; j < n; j++) o += p[j] * v[(offsets[s] + j) * ks + g * hd + i];
                    out[t * qs + h * hd + i] = o;
                }
                for (int j = 0; j < n; j++) {
                    const size_t r = (size_t)(offsets[s] + j) * ks + g * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)dot[i] * v[r + i], dv[r + i] += p[j] * dot[i];
                    dp[j] = d;
                    pdp += p[j] * d;
                }
                for (int j = 0; j < n; j++) {
                    const size_t r = (size_t)(offsets[s] + j) * ks + g * hd;
                    const double ds = p[j] * (dp[j] - pdp) * scale;
                    for (int i = 0; i < hd; i++) dq[t * qs + h * hd + i] += ds * k[r + i], dk[r + i] += ds * qt[i];
                }
            }
    free(p), free(dp);
}

/* max |got - (base + ref)| / max |ref| over n values */
static double rel_err(const float *got, const float *base, const double *ref, size_t n) {
    double err = 0, mag = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ((base ? base[i] : 0) + ref[i]));
        if (!(e <= err)) err = e; /* NaN counts */
        if (fabs(ref[i]) > mag) mag = fabs(ref[i]);
    }
    return err / mag;
}

static float *uniform_array(size_t n, uint64_t key, double lo, double hi) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * trill_rng_uniform(key, i));
    return x;
}

static void check_attention(int nh, int nkv, int hd, const int *lens, int n_seqs) {
    int *offsets = malloc(sizeof(int) * (n_seqs + 1));
    assert_non_null(offsets);
    offsets[0] = 0;
    for (int s = 0; s < n_seqs; s++) offsets[s + 1] = offsets[s] + lens[s];
    const int T = offsets[n_seqs];
    const size_t nq = (size_t)T * nh * hd, nk = (size_t)T * nkv * hd;
    const uint64_t key = (uint64_t)nh * 1000 + nkv * 100 + hd;
    /* scores of a few units: peaked softmax rows, not saturated ones */
    float *q = uniform_array(nq, key + 1, -1.5, 1.5), *k = uniform_array(nk, key + 2, -1.5, 1.5);
    float *v = uniform_array(nk, key + 3, -1, 1), *dout = uniform_array(nq, key + 4, -1, 1);
    float *dq0 = uniform_array(nq, key + 5, -1, 1), *dk0 = uniform_array(nk, key + 6, -1, 1), *dv0 = uniform_array(nk, key + 7, -1, 1);
    float *out = malloc(sizeof(float) * (nq ? nq : 1)), *dq = malloc(sizeof(float) * (nq ? nq : 1));
    float *dk = malloc(sizeof(float) * (nk ? nk : 1)), *dv = malloc(sizeof(float) * (nk ? nk : 1));
    double *rout = malloc(sizeof(double) * (nq ? nq : 1)), *rdq = malloc(sizeof(double) * (nq ? nq : 1));
    double *rdk = malloc(sizeof(double) * (nk ? nk : 1)), *rdv = malloc(sizeof(double) * (nk ? nk : 1));
    assert_true(out && dq && dk && dv && rout && rdq && rdk && rdv);
    attention_reference(rout, rdq, rdk, rdv, dout, q, k, v, offsets, n_seqs, nh, nkv, hd);

    /* the gradients accumulate: start from dq0/dk0/dv0 */
    attention_forward(out, q, k, v, offsets, n_seqs, nh, nkv, hd);
    memcpy(dq, dq0, sizeof(float) * nq), memcpy(dk, dk0, sizeof(float) * nk), memcpy(dv, dv0, sizeof(float) * nk);
    attention_backward(dq, dk, dv, dout, q, k, v, offsets, n_seqs, nh, nkv, hd);
    double e[4] = { rel_err(out, NULL, rout, nq), rel_err(dq, dq0, rdq, nq), rel_err(dk, dk0, rdk, nk), rel_err(dv, dv0, rdv, nk) };
    printf("attention nh %d nkv %d hd %d, %d seqs (T %d): relative error out %.2e dq %.2e dk %.2e dv %.2e\n", nh, nkv, hd,
           n_seqs, T, e[0], e[1], e[2], e[3]);
    for (int i = 0; i < 4; i++) assert_true(e[i] < 1e-5);

    /* bit-identical whatever the number of threads */
    const int threads = omp_get_max_threads();
    float *out1 = malloc(sizeof(float) * (nq ? nq : 1)), *dq1 = malloc(sizeof(float) * (nq ? nq : 1));
    float *dk1 = malloc(sizeof(float) * (nk ? nk : 1)), *dv1 = malloc(sizeof(float) * (nk ? nk : 1));
    assert_true(out1 && dq1 && dk1 && dv1);
    for (int nt = 1; nt <= 3; nt += 2) {
        omp_set_num_threads(nt);
        attention_forward(out1, q, k, v, offsets, n_seqs, nh, nkv, hd);
        memcpy(dq1, dq0, sizeof(float) * nq), memcpy(dk1, dk0, sizeof(float) * nk), memcpy(dv1, dv0, sizeof(float) * nk);
        attention_backward(dq1, dk1, dv1, dout, q, k, v, offsets, n_seqs, nh, nkv, hd);
        assert_memory_equal(out1, out, sizeof(float) * nq);
        assert_memory_equal(dq1, dq, sizeof(float) * nq);
        assert_memory_equal(dk1, dk, sizeof(float) * nk);
        assert_memory_equal(dv1, dv, sizeof(float) * nk);
    }
    omp_set_num_threads(threads);
    free(q), free(k), free(v), free(dout), free(dq0), free(dk0), free(dv0), free(out), free(dq), free(dk), free(dv);
    free(out1), free(dq1), free(dk1), free(dv1), free(rout), free(rdq), free(rdk), free(rdv), free(offsets);
}

static void test_attention_blocked(void **state) {
    (void)state;
    /* lengths around the query tile (64 rows per head at 2 heads per kv head), one longer
     * than several tiles, single tokens and an empty sequence */
    const int lens[] = { 1, 63, 64, 65, 200, 0, 513, 1 };
    const int n = (int)(sizeof lens / sizeof lens[0]);
    check_attention(4, 4, 64, lens, n); /* group 1: 128-row tiles */
    check_attention(8, 4, 64, lens, n); /* group 2 (the small preset) */
    check_attention(8, 2, 32, lens, n); /* group 4 */
    const int one[] = { 300 };
    check_attention(16, 2, 16, one, 1); /* group 8: 16-row tiles */
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
        cmocka_unit_test(test_attention), cmocka_unit_test(test_attention_blocked), cmocka_unit_test(test_softmax_topk), cmocka_unit_test(test_swiglu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
