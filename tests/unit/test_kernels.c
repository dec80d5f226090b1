/* Kernels against hand-computed values. */
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

#include "trill/kernels.h"
#include "trill/rng.h"

#define CLOSE(a, b) assert_true(fabs((double)(a) - (double)(b)) < 1e-6)

static void test_matmul(void **state) {
    (void)state;
    const float inp[2 * 3] = { 1, 2, 3, 4, 5, 6 };
    const float w[2 * 3] = { 1, 0, -1, 0.5f, 0.5f, 0.5f }; /* [out=2, in=3] */
    float out[4];
    trill_matmul_forward(out, inp, w, 2, 3, 2);
    CLOSE(out[0], -2); CLOSE(out[1], 3); CLOSE(out[2], -2); CLOSE(out[3], 7.5);
}

static void test_rmsnorm(void **state) {
    (void)state;
    const float x[2 * 2] = { 3, 4, 0, 0 };
    const float w[2] = { 1, 2 };
    float out[4];
    trill_rmsnorm_forward(out, x, w, 2, 2, 0.0f);
    /* rms of (3,4) = sqrt(12.5) */
    CLOSE(out[0], 3 / sqrt(12.5)); CLOSE(out[1], 2 * 4 / sqrt(12.5));
    trill_rmsnorm_forward(out, x, w, 2, 2, 1e-6f);
    CLOSE(out[2], 0); CLOSE(out[3], 0); /* eps keeps a zero row finite */
}

static void test_rope(void **state) {
    (void)state;
    float inv[2];
    trill_rope_inv_freq(inv, 4, 10000.0);
    CLOSE(inv[0], 1.0); CLOSE(inv[1], 0.01); /* 1/10000^(2/4) */
    /* one head of dim 4 at positions 0 and 1: rotate-half pairs (0,2) and (1,3) */
    float x[2 * 4] = { 1, 2, 3, 4, 1, 2, 3, 4 };
    const int pos[2] = { 0, 1 };
    trill_rope_forward(x, pos, inv, 2, 1, 4);
    CLOSE(x[0], 1); CLOSE(x[1], 2); CLOSE(x[2], 3); CLOSE(x[3], 4); /* position 0: identity */
    CLOSE(x[4], 1 * cos(1.0) - 3 * sin(1.0));
    CLOSE(x[6], 3 * cos(1.0) + 1 * sin(1.0));
    CLOSE(x[5], 2 * cos(0.01) - 4 * sin(0.01));
    CLOSE(x[7], 4 * cos(0.01) + 2 * sin(0.01));
}

/* trill_rope_partial_forward: the rotary part of each head only, either pairing, a cos/sin scale */
static void test_rope_partial(void **state) {
    (void)state;
    enum { T = 3, NH = 2, STRIDE = 11, OFF = 3, RD = 6 };
    const int pos[T] = { 0, 7, 300 };
    float inv[RD / 2];
    trill_rope_inv_freq(inv, RD, 10000.0);
    float x[T * NH * STRIDE], y[T * NH * STRIDE];
    for (int i = 0; i < T * NH * STRIDE; i++) x[i] = (float)(trill_rng_uniform(77, i) * 2 - 1);

    /* rotate-half on the part at OFF is trill_rope_forward on that part, bit for bit; the rest untouched */
    memcpy(y, x, sizeof x);
    trill_rope_partial_forward(y, pos, inv, T, NH, STRIDE, OFF, RD, ROPE_ROTATE_HALF, 1.0f);
    float part[T * NH * RD];
    for (int r = 0; r < T * NH; r++) memcpy(part + r * RD, x + r * STRIDE + OFF, sizeof(float) * RD);
    trill_rope_forward(part, pos, inv, T, NH, RD);
    for (int r = 0; r < T * NH; r++) {
        assert_memory_equal(y + r * STRIDE + OFF, part + r * RD, sizeof(float) * RD);
        assert_memory_equal(y + r * STRIDE, x + r * STRIDE, sizeof(float) * OFF);
        assert_memory_equal(y + r * STRIDE + OFF + RD, x + r * STRIDE + OFF + RD, sizeof(float) * (STRIDE - OFF - RD));
    }

    /* adjacent pairs (2i, 2i+1), hand values */
    memcpy(y, x, sizeof x);
    trill_rope_partial_forward(y, pos, inv, T, NH, STRIDE, OFF, RD, ROPE_ADJACENT, 1.0f);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < RD / 2; i++) {
                const float *xr = x + (t * NH + h) * STRIDE + OFF, *yr = y + (t * NH + h) * STRIDE + OFF;
                const double a = (double)(float)((float)pos[t] * inv[i]);
                CLOSE(yr[2 * i], xr[2 * i] * cos(a) - xr[2 * i + 1] * sin(a));
                CLOSE(yr[2 * i + 1], xr[2 * i + 1] * cos(a) + xr[2 * i] * sin(a));
            }

    /* a cos/sin scale of 1 is no scale; another scales the rotation; the backward undoes the
     * rotation and applies the scale again (the transpose) */
    for (int pairing = ROPE_ROTATE_HALF; pairing <= ROPE_ADJACENT; pairing++) {
        float z[T * NH * STRIDE];
        memcpy(y, x, sizeof x);
        memcpy(z, x, sizeof x);
        trill_rope_partial_forward(y, pos, inv, T, NH, STRIDE, OFF, RD, pairing, 1.0f);
        trill_rope_partial_forward(z, pos, inv, T, NH, STRIDE, OFF, RD, pairing, 1.25f);
        for (int r = 0; r < T * NH; r++)
            for (int i = 0; i < RD; i++) CLOSE(z[r * STRIDE + OFF + i], 1.25 * y[r * STRIDE + OFF + i]);
        trill_rope_partial_backward(z, pos, inv, T, NH, STRIDE, OFF, RD, pairing, 1.25f);
        for (int r = 0; r < T * NH; r++)
            for (int i = 0; i < STRIDE; i++) {
                const bool rotary = i >= OFF && i < OFF + RD;
                CLOSE(z[r * STRIDE + i], (rotary ? 1.5625 : 1) * x[r * STRIDE + i]);
            }
    }
}

/* YaRN at DeepSeek-V3's settings: rotary dim 64, theta 1e4, factor 40 over 4096 positions,
 * beta 32/1: correction dims floor(10.47) = 10 and ceil(22.5) = 23. Below: plain RoPE
 * frequencies; above: divided by the factor; between: the linear blend. */
static void test_rope_yarn(void **state) {
    (void)state;
    float inv[32], plain[32];
    trill_rope_inv_freq(plain, 64, 10000.0);
    double af = trill_rope_inv_freq_yarn(inv, 64, 10000.0, 40.0, 4096, 32, 1, 1.0, 1.0, 1);
    assert_true(af == 1.0); /* mscale == mscale_all_dim: no cos/sin scale (the softmax scale takes mscale^2) */
    for (int i = 0; i < 32; i++) {
        const float pf = (float)pow(10000.0f, (float)(2 * i) / 64.0f);
        if (i <= 10) assert_true(inv[i] == plain[i]);
        else if (i >= 23) assert_true(inv[i] == 1 / (40.0f * pf));
        else {
            const double ramp = (i - 10) / 13.0;
            assert_true(fabs(inv[i] - (1 / (40.0 * pf) * ramp + 1 / pf * (1 - ramp))) < 1e-6 * inv[i]);
        }
        if (i > 0) assert_true(inv[i] < inv[i - 1]);
    }
    /* attention_factor: 0.1 ln(factor) + 1 without mscales; their ratio with both */
    volatile double p = 0.1 * log(40.0);
    assert_true(trill_rope_inv_freq_yarn(inv, 64, 10000.0, 40.0, 4096, 32, 1, 0, 0, 1) == p + 1.0);
    assert_true(trill_rope_yarn_mscale(40.0, 1.0) == p + 1.0);
    assert_true(trill_rope_yarn_mscale(1.0, 1.0) == 1.0 && trill_rope_yarn_mscale(0.5, 3.0) == 1.0);
    const double ratio = trill_rope_yarn_mscale(32.0, 0.707) / trill_rope_yarn_mscale(32.0, 1.0);
    assert_true(trill_rope_inv_freq_yarn(inv, 64, 50000.0, 32.0, 4096, 32, 1, 0.707, 1.0, 1) == ratio);
    /* without truncation the ramp starts at 10.47: entry 10 is still plain, 11 blended */
    trill_rope_inv_freq_yarn(inv, 64, 10000.0, 40.0, 4096, 32, 1, 0, 0, 0);
    assert_true(inv[10] == plain[10] && inv[11] < plain[11] && inv[11] > plain[11] / 40);
}

static void test_attention(void **state) {
    (void)state;
    /* 2 query heads sharing 1 kv head (GQA), head_dim 2, one sequence of 2 tokens and one of 1 */
    const float q[3 * 4] = { 0, 0, 1, 0, /* t0 */ 0, 0, 1, 0, /* t1 */ 5, 5, 5, 5 /* seq 2 */ };
    const float k[3 * 2] = { 1, 0, -1, 0, 3, 3 };
    const float v[3 * 2] = { 1, 2, 3, 4, 7, 8 };
    const int offsets[3] = { 0, 2, 3 };
    float out[3 * 4];
    assert_int_equal(trill_attention_forward(out, q, k, v, offsets, 2, 2, 1, 2, 2, 1 / sqrtf(2.0f), TRILL_PRECISION_FP32, NULL), TRILL_OK);
    CLOSE(out[0], 1); CLOSE(out[1], 2); /* first token attends only to itself */
    CLOSE(out[4], 2); CLOSE(out[5], 3); /* head 0, t1: q = 0 -> uniform over t0, t1 */
    /* head 1, t1: scores (1, -1)/sqrt(2) */
    double p0 = 1 / (1 + exp(-2 / sqrt(2.0)));
    CLOSE(out[6], p0 * 1 + (1 - p0) * 3);
    CLOSE(out[7], p0 * 2 + (1 - p0) * 4);
    CLOSE(out[8], 7); CLOSE(out[11], 8); /* separate sequence: sees only itself */

    /* by hand, gpt-oss's sinks: head 0's sink logit 0, head 1's ln 3. Head 0 at t0 scores 0 for
     * itself: p = e^0 / (e^0 + e^0) = 1/2 of v0; at t1, 1/3 each of v0, v1 (the sink the third).
     * Head 1 at t0 scores 1/sqrt(2): e^s / (e^s + 3) of v0. A window of 1: each token sees only
     * itself and the sink. */
    const float sinks[2] = { 0, logf(3) };
    const trill_attention_opts so = { .sinks = sinks };
    assert_int_equal(trill_attention_forward(out, q, k, v, offsets, 2, 2, 1, 2, 2, 1 / sqrtf(2.0f), TRILL_PRECISION_FP32, &so), TRILL_OK);
    CLOSE(out[0], 0.5); CLOSE(out[1], 1);                       /* head 0, t0: v0 / 2 */
    const double p0s = exp(1 / sqrt(2.0)) / (exp(1 / sqrt(2.0)) + 3);
    CLOSE(out[2], p0s * 1); CLOSE(out[3], p0s * 2);             /* head 1, t0 */
    CLOSE(out[4], (1 + 3) / 3.0); CLOSE(out[5], (2 + 4) / 3.0); /* head 0, t1: (v0 + v1) / 3 */
    const trill_attention_opts wo = { .window = 1, .sinks = sinks };
    assert_int_equal(trill_attention_forward(out, q, k, v, offsets, 2, 2, 1, 2, 2, 1 / sqrtf(2.0f), TRILL_PRECISION_FP32, &wo), TRILL_OK);
    CLOSE(out[4], 1.5); CLOSE(out[5], 2);                       /* head 0, t1: v1 / 2, t0 out of the window */
    const double p1 = exp(-1 / sqrt(2.0)) / (exp(-1 / sqrt(2.0)) + 3); /* head 1, t1: its score for v1 against the sink's 3 */
    CLOSE(out[6], p1 * 3); CLOSE(out[7], p1 * 4);
}

/* ---- attention (blocked GEMMs) against a naive double-precision reference ---- */

/* Row by row, in double: out = softmax(scale q k^T, causal) v and, given dout, the gradients
 * dq, dk, dv (written, not accumulated). q/k heads of hd, v/out heads of hv. With a window, a
 * query at position t sees keys t - window + 1 .. t; with sinks (HF gpt-oss's eager attention:
 * the head's sink logit concatenated to the scaled scores, the softmax taken, the sink's column
 * dropped), dsinks[nh] gets their gradients (written). */
static void attention_reference(double *out, double *dq, double *dk, double *dv, const float *dout, const float *q,
                                const float *k, const float *v, const int *offsets, int n_seqs, int nh, int nkv, int hd, int hv,
                                double scale, int window, const float *sinks, double *dsinks) {
    const int T = offsets[n_seqs], group = nh / nkv;
    const size_t qs = (size_t)nh * hd, ks = (size_t)nkv * hd, vs = (size_t)nkv * hv, os = (size_t)nh * hv;
    memset(dq, 0, sizeof(double) * T * qs);
    memset(dk, 0, sizeof(double) * T * ks);
    memset(dv, 0, sizeof(double) * T * vs);
    if (dsinks) memset(dsinks, 0, sizeof(double) * nh);
    double *p = malloc(sizeof(double) * (T + 1)), *dp = malloc(sizeof(double) * (T + 1));
    assert_non_null(p), assert_non_null(dp);
    for (int s = 0; s < n_seqs; s++)
        for (int h = 0; h < nh; h++)
            for (int t = offsets[s]; t < offsets[s + 1]; t++) {
                const int g = h / group, n = t - offsets[s] + 1, j0 = window > 0 && n > window ? n - window : 0;
                const float *qt = q + t * qs + h * hd, *dot = dout + t * os + h * hv;
                double maxv = sinks ? sinks[h] : -INFINITY, sum = 0, pdp = 0;
                for (int j = j0; j < n; j++) {
                    const float *kj = k + (offsets[s] + j) * ks + g * hd;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)qt[i] * kj[i];
                    p[j] = d * scale;
                    if (p[j] > maxv) maxv = p[j];
                }
                for (int j = j0; j < n; j++) sum += p[j] = exp(p[j] - maxv);
                const double psink = sinks ? exp(sinks[h] - maxv) : 0;
                sum += psink;
                for (int j = j0; j < n; j++) p[j] /= sum;
                for (int i = 0; i < hv; i++) {
                    double o = 0;
                    for (int j = j0; j < n; j++) o += p[j] * v[(offsets[s] + j) * vs + g * hv + i];
                    out[t * os + h * hv + i] = o;
                }
                for (int j = j0; j < n; j++) {
                    const size_t r = (size_t)(offsets[s] + j) * vs + g * hv;
                    double d = 0;
                    for (int i = 0; i < hv; i++) d += (double)dot[i] * v[r + i], dv[r + i] += p[j] * dot[i];
                    dp[j] = d;
                    pdp += p[j] * d;
                }
                for (int j = j0; j < n; j++) {
                    const size_t r = (size_t)(offsets[s] + j) * ks + g * hd;
                    const double ds = p[j] * (dp[j] - pdp) * scale;
                    for (int i = 0; i < hd; i++) dq[t * qs + h * hd + i] += ds * k[r + i], dk[r + i] += ds * qt[i];
                }
                if (dsinks) dsinks[h] -= psink / sum * pdp; /* the sink's column: value 0, probability psink / sum */
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

/* q/k heads of hd, v/out heads of hv, softmax scale `scale`; a sliding window (0: none) and
 * sinks (random, a few units) when `sinks` */
static void check_attention_opts(int nh, int nkv, int hd, int hv, float scale, const int *lens, int n_seqs, int window, bool sinks) {
    int *offsets = malloc(sizeof(int) * (n_seqs + 1));
    assert_non_null(offsets);
    offsets[0] = 0;
    for (int s = 0; s < n_seqs; s++) offsets[s + 1] = offsets[s] + lens[s];
    const int T = offsets[n_seqs];
    const size_t nq = (size_t)T * nh * hd, nk = (size_t)T * nkv * hd, nv = (size_t)T * nkv * hv, no = (size_t)T * nh * hv;
    const uint64_t key = (uint64_t)nh * 1000 + nkv * 100 + hd + (hd != hv ? (uint64_t)hv * 1000000 : 0);
    /* scores of a few units: peaked softmax rows, not saturated ones */
    float *q = uniform_array(nq, key + 1, -1.5, 1.5), *k = uniform_array(nk, key + 2, -1.5, 1.5);
    float *v = uniform_array(nv, key + 3, -1, 1), *dout = uniform_array(no, key + 4, -1, 1);
    float *dq0 = uniform_array(nq, key + 5, -1, 1), *dk0 = uniform_array(nk, key + 6, -1, 1), *dv0 = uniform_array(nv, key + 7, -1, 1);
    float *out = malloc(sizeof(float) * (no ? no : 1)), *dq = malloc(sizeof(float) * (nq ? nq : 1));
    float *dk = malloc(sizeof(float) * (nk ? nk : 1)), *dv = malloc(sizeof(float) * (nv ? nv : 1));
    double *rout = malloc(sizeof(double) * (no ? no : 1)), *rdq = malloc(sizeof(double) * (nq ? nq : 1));
    double *rdk = malloc(sizeof(double) * (nk ? nk : 1)), *rdv = malloc(sizeof(double) * (nv ? nv : 1));
    assert_true(out && dq && dk && dv && rout && rdq && rdk && rdv);
    float *sk = sinks ? uniform_array((size_t)nh, key + 8, -2, 3) : NULL, ds[64] = { 0 }, ds1[64];
    double rds[64];
    assert_true(nh <= 64);
    attention_reference(rout, rdq, rdk, rdv, dout, q, k, v, offsets, n_seqs, nh, nkv, hd, hv, scale, window, sk, sinks ? rds : NULL);
    const trill_attention_opts fo = { .window = window, .sinks = sk }, bo = { .window = window, .sinks = sk, .dsinks = sinks ? ds : NULL };

    /* the gradients accumulate: start from dq0/dk0/dv0 */
    assert_int_equal(trill_attention_forward(out, q, k, v, offsets, n_seqs, nh, nkv, hd, hv, scale, TRILL_PRECISION_FP32, &fo), TRILL_OK);
    memcpy(dq, dq0, sizeof(float) * nq), memcpy(dk, dk0, sizeof(float) * nk), memcpy(dv, dv0, sizeof(float) * nv);
    assert_int_equal(trill_attention_backward(dq, dk, dv, dout, q, k, v, offsets, n_seqs, nh, nkv, hd, hv, scale, TRILL_PRECISION_FP32, &bo), TRILL_OK);
    double e[5] = { rel_err(out, NULL, rout, no), rel_err(dq, dq0, rdq, nq), rel_err(dk, dk0, rdk, nk), rel_err(dv, dv0, rdv, nv),
                    sinks ? rel_err(ds, NULL, rds, (size_t)nh) : 0 };
    printf("attention nh %d nkv %d hd %d/%d scale %.4f window %d%s, %d seqs (T %d): relative error out %.2e dq %.2e dk %.2e dv %.2e"
           " dsinks %.2e\n", nh, nkv, hd, hv, scale, window, sinks ? " sinks" : "", n_seqs, T, e[0], e[1], e[2], e[3], e[4]);
    for (int i = 0; i < 5; i++) assert_true(e[i] < 1e-5);

    /* bit-identical whatever the number of threads */
    const int threads = omp_get_max_threads();
    float *out1 = malloc(sizeof(float) * (no ? no : 1)), *dq1 = malloc(sizeof(float) * (nq ? nq : 1));
    float *dk1 = malloc(sizeof(float) * (nk ? nk : 1)), *dv1 = malloc(sizeof(float) * (nv ? nv : 1));
    assert_true(out1 && dq1 && dk1 && dv1);
    for (int nt = 1; nt <= 3; nt += 2) {
        omp_set_num_threads(nt);
        assert_int_equal(trill_attention_forward(out1, q, k, v, offsets, n_seqs, nh, nkv, hd, hv, scale, TRILL_PRECISION_FP32, &fo), TRILL_OK);
        memcpy(dq1, dq0, sizeof(float) * nq), memcpy(dk1, dk0, sizeof(float) * nk), memcpy(dv1, dv0, sizeof(float) * nv);
        memset(ds1, 0, sizeof ds1);
        const trill_attention_opts bo1 = { .window = window, .sinks = sk, .dsinks = sinks ? ds1 : NULL };
        assert_int_equal(trill_attention_backward(dq1, dk1, dv1, dout, q, k, v, offsets, n_seqs, nh, nkv, hd, hv, scale, TRILL_PRECISION_FP32, &bo1), TRILL_OK);
        assert_memory_equal(ds1, ds, sizeof(float) * (size_t)nh);
        assert_memory_equal(out1, out, sizeof(float) * no);
        assert_memory_equal(dq1, dq, sizeof(float) * nq);
        assert_memory_equal(dk1, dk, sizeof(float) * nk);
        assert_memory_equal(dv1, dv, sizeof(float) * nv);
    }
    omp_set_num_threads(threads);
    free(q), free(k), free(v), free(dout), free(dq0), free(dk0), free(dv0), free(out), free(dq), free(dk), free(dv);
    free(out1), free(dq1), free(dk1), free(dv1), free(rout), free(rdq), free(rdk), free(rdv), free(offsets), free(sk);
}

static void check_attention_shape(int nh, int nkv, int hd, int hv, float scale, const int *lens, int n_seqs) {
    check_attention_opts(nh, nkv, hd, hv, scale, lens, n_seqs, 0, false);
}

/* Qwen3's attention: equal head sizes, scale 1/sqrt(hd) computed as its call sites do. */
static void check_attention(int nh, int nkv, int hd, const int *lens, int n_seqs) {
    check_attention_shape(nh, nkv, hd, hd, 1 / sqrtf((float)hd), lens, n_seqs);
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
    /* query/key heads larger than value heads, an explicit scale: DeepSeek MLA's 192/128 with
     * qk_head_dim^-0.5 * mscale^2 (YaRN factor 40, mscale_all_dim 1) */
    const double m = 0.1 * log(40.0) + 1;
    const int mla[] = { 130, 1, 64, 7 };
    check_attention_shape(4, 4, 192, 128, (float)(1 / sqrt(192.0) * m * m), mla, 4);
    check_attention_shape(8, 2, 48, 24, 0.3f, lens, n); /* GQA, group 4 */
    check_attention_shape(4, 2, 16, 40, 0.2f, mla, 4);  /* value heads larger */
}

/* gpt-oss's attention: sliding windows (shorter than a tile, and spanning several) and sinks,
 * apart and together, against the reference written from HF's eager attention. */
static void test_attention_window_sinks(void **state) {
    (void)state;
    const int lens[] = { 1, 63, 65, 200, 0, 300 };
    const int n = (int)(sizeof lens / sizeof lens[0]);
    check_attention_opts(8, 4, 64, 64, 0.125f, lens, n, 128, false); /* gpt-oss's window, 128 */
    check_attention_opts(8, 2, 32, 32, 0.2f, lens, n, 7, false);
    check_attention_opts(4, 4, 16, 16, 0.25f, lens, n, 0, true);
    check_attention_opts(8, 1, 64, 64, 0.125f, lens, n, 128, true); /* gpt-oss: 64 heads over 8 kv heads, head_dim 64 */
    check_attention_opts(4, 2, 16, 24, 0.3f, lens, n, 1, true);      /* a window of one: the token itself and the sink */
}

static void test_softmax_topk(void **state) {
    (void)state;
    const float logits[5] = { 1, 3, 3, -1, 2 };
    float p[5];
    trill_softmax_forward(p, logits, 1, 5);
    double z = exp(1) + 2 * exp(3) + exp(-1) + exp(2);
    CLOSE(p[1], exp(3) / z);
    CLOSE(p[0] + p[1] + p[2] + p[3] + p[4], 1);
    int idx[3];
    float val[3];
    trill_topk_forward(idx, val, p, 1, 5, 3);
    assert_int_equal(idx[0], 1); /* tie between 1 and 2: lower index first */
    assert_int_equal(idx[1], 2);
    assert_int_equal(idx[2], 4);
    CLOSE(val[2], exp(2) / z);
    CLOSE(trill_logsumexp(logits, 5), log(z));
}

static void test_sigmoid(void **state) {
    (void)state;
    const float x[6] = { 0, 2, -2, -100, 100, -30 };
    float y[6];
    trill_sigmoid_forward(y, x, 6);
    CLOSE(y[0], 0.5); CLOSE(y[1], 1 / (1 + exp(-2.0))); CLOSE(y[2], 1 / (1 + exp(2.0)));
    assert_true(y[3] >= 0 && y[3] < 1e-30); assert_true(y[4] == 1.0f);
    assert_true(fabs(y[5] - 1 / (1 + exp(30.0))) < 1e-6 * 1 / (1 + exp(30.0)));
}

/* Group-limited choice on a designed row: 8 experts in 4 groups of 2, the best 2 groups, top-2. */
static void test_router_groups(void **state) {
    (void)state;
    /* groups (0,1): 0.9 + 0.05 = 0.95, (2,3): 0.6 + 0.5 = 1.1, (4,5): 0.55 + 0.52 = 1.07, (6,7): 0.3 */
    const float s[8] = { 0.9f, 0.05f, 0.6f, 0.5f, 0.55f, 0.52f, 0.1f, 0.2f };
    int idx[2], idx2[2];
    float val[2], val2[2], gates[2];
    trill_topk_forward(idx, val, s, 1, 8, 2); /* plain top-2: 0 and 2 */
    assert_int_equal(idx[0], 0); assert_int_equal(idx[1], 2);
    assert_int_equal(trill_router_topk_forward(idx, val, s, NULL, 1, 8, 2, 4, 2), TRILL_OK); /* groups 1, 2 only */
    assert_int_equal(idx[0], 2); assert_int_equal(idx[1], 4);
    assert_true(val[0] == 0.6f && val[1] == 0.55f);
    /* one group allowed: the top group (2,3) alone */
    assert_int_equal(trill_router_topk_forward(idx, val, s, NULL, 1, 8, 2, 4, 1), TRILL_OK);
    assert_int_equal(idx[0], 2); assert_int_equal(idx[1], 3);
    /* a selection bias raises expert 5 (and its group) above 2; the gates stay unbiased */
    const float bias[8] = { 0, 0, 0, 0, 0, 0.1f, 0, 0 };
    assert_int_equal(trill_router_topk_forward(idx, val, s, bias, 1, 8, 2, 4, 2), TRILL_OK);
    assert_int_equal(idx[0], 5); assert_int_equal(idx[1], 2);
    assert_true(val[0] == 0.52f + 0.1f);
    trill_router_gates_forward(gates, s, idx, 1, 8, 2, 0, 0.0f, 1.0f);
    assert_true(gates[0] == 0.52f && gates[1] == 0.6f);
    trill_router_gates_forward(gates, s, idx, 1, 8, 2, 1, 1e-20f, 2.5f); /* DeepSeek: / (sum + 1e-20), * scaling */
    CLOSE(gates[0], 2.5 * 0.52 / 1.12); CLOSE(gates[1], 2.5 * 0.6 / 1.12);
    trill_router_gates_forward(gates, s, idx, 1, 8, 2, 1, 0.0f, 1.0f); /* Qwen3: / sum */
    assert_true(gates[0] == 0.52f / (0.52f + 0.6f) && gates[1] == 0.6f / (0.52f + 0.6f));

    /* ties: every group scores 0.5, so the lower groups are kept; equal experts come lower id first */
    const float tie[8] = { 0.25f, 0.25f, 0.5f, 0.0f, 0.5f, 0.0f, 0.125f, 0.375f };
    assert_int_equal(trill_router_topk_forward(idx, val, tie, NULL, 1, 8, 2, 4, 3), TRILL_OK); /* groups 0, 1, 2 */
    assert_int_equal(idx[0], 2); assert_int_equal(idx[1], 4);
    assert_int_equal(trill_router_topk_forward(idx, val, tie, NULL, 1, 8, 2, 4, 2), TRILL_OK); /* groups 0, 1: 2, then 0 before 1 */
    assert_int_equal(idx[0], 2); assert_int_equal(idx[1], 0);
    int idx3[3];
    float val3[3];
    assert_int_equal(trill_router_topk_forward(idx3, val3, tie, NULL, 1, 8, 3, 4, 2), TRILL_OK);
    assert_int_equal(idx3[0], 2); assert_int_equal(idx3[1], 0); assert_int_equal(idx3[2], 1);

    /* no groups and no bias: trill_topk_forward exactly, on many rows */
    enum { RT = 300, RE = 24, RK = 5 };
    float *p = uniform_array(RT * RE, 5, 0, 1);
    int a[RT * RK], b[RT * RK];
    float va[RT * RK], vb[RT * RK];
    trill_topk_forward(a, va, p, RT, RE, RK);
    assert_int_equal(trill_router_topk_forward(b, vb, p, NULL, RT, RE, RK, 1, 1), TRILL_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_equal(va, vb, sizeof va);
    /* with groups: every chosen expert lies in a kept group and beats every eligible expert
     * left out (checked against the definition, row by row) */
    float *bi = uniform_array(RE, 6, -0.1, 0.1);
    assert_int_equal(trill_router_topk_forward(b, vb, p, bi, RT, RE, RK, 6, 3), TRILL_OK);
    for (int t = 0; t < RT; t++) {
        float sel[RE], gs[6];
        for (int e = 0; e < RE; e++) sel[e] = p[t * RE + e] + bi[e];
        for (int g = 0; g < 6; g++) {
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int e = 4 * g; e < 4 * g + 4; e++)
                if (sel[e] > m1) m2 = m1, m1 = sel[e];
                else if (sel[e] > m2) m2 = sel[e];
            gs[g] = m1 + m2;
        }
        bool kept[6];
        for (int g = 0; g < 6; g++) {
            int above = 0;
            for (int h = 0; h < 6; h++) above += gs[h] > gs[g] || (gs[h] == gs[g] && h < g);
            kept[g] = above < 3;
        }
        for (int j = 0; j < RK; j++) {
            const int e = b[t * RK + j];
            assert_true(kept[e / 4]);
            assert_true(vb[t * RK + j] == sel[e]);
            if (j) assert_true(vb[t * RK + j] <= vb[t * RK + j - 1]);
            for (int f = 0; f < RE; f++) {
                bool chosen = false;
                for (int i = 0; i < RK; i++) chosen |= b[t * RK + i] == f;
                if (!chosen && kept[f / 4]) assert_true(sel[f] <= sel[e]);
            }
        }
    }
    free(p);
    free(bi);

    /* shapes it refuses */
    assert_int_equal(trill_router_topk_forward(idx2, val2, s, NULL, 1, 8, 2, 3, 2), TRILL_ERR_INVALID); /* 8 % 3 */
    assert_int_equal(trill_router_topk_forward(idx2, val2, s, NULL, 1, 8, 2, 8, 2), TRILL_ERR_INVALID); /* groups of 1 */
    assert_int_equal(trill_router_topk_forward(idx2, val2, s, NULL, 1, 8, 3, 4, 1), TRILL_ERR_INVALID); /* 3 > 1 group of 2 */
    assert_int_equal(trill_router_topk_forward(idx2, val2, s, NULL, 1, 8, 2, 4, 5), TRILL_ERR_INVALID);
    assert_int_equal(trill_router_topk_forward(idx2, val2, s, NULL, 1, 8, 9, 1, 1), TRILL_ERR_INVALID);
    float *wide = uniform_array(2 * (ROUTER_MAX_GROUPS + 1), 8, 0, 1); /* one group too many */
    assert_int_equal(trill_router_topk_forward(idx2, val2, wide, NULL, 1, 2 * (ROUTER_MAX_GROUPS + 1), 2, ROUTER_MAX_GROUPS + 1, 2),
                     TRILL_ERR_INVALID);
    assert_int_equal(trill_router_topk_forward(idx2, val2, wide, NULL, 1, 2 * ROUTER_MAX_GROUPS, 2, ROUTER_MAX_GROUPS, 2), TRILL_OK);
    free(wide);
}

static void test_swiglu(void **state) {
    (void)state;
    const float g[2] = { 0, 2 }, u[2] = { 5, 3 };
    float out[2];
    trill_swiglu_forward(out, g, u, 2);
    CLOSE(out[0], 0);
    CLOSE(out[1], 2 / (1 + exp(-2.0)) * 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),   cmocka_unit_test(test_rmsnorm),      cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_partial), cmocka_unit_test(test_rope_yarn), cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_blocked), cmocka_unit_test(test_attention_window_sinks), cmocka_unit_test(test_softmax_topk), cmocka_unit_test(test_sigmoid),
        cmocka_unit_test(test_router_groups), cmocka_unit_test(test_swiglu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
