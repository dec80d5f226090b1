/* Kernels on stored weights (trill/weight.h): fp32 goes straight to the fp32 kernels; bf16 is
 * widened to fp32 one panel of rows at a time, then multiplied by the threaded sgemm (in bf16
 * precision the bf16 GEMM packs the stored values as they are). Widening
 * costs one pass over the weight per call against 2*T multiply-adds per element, so it is
 * negligible for the batches training runs. The forward (and the embedding) is exactly the
 * fp32 kernels' on the widened values; the input gradient sums over the output rows panel by
 * panel, so it differs from one whole-matrix fp32 GEMM in the last bits (same order every call). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/tls.h"
#include "kernels_internal.h"
#include "trill/kernels.h"

/* Floats per widened panel (4 MB): large enough for efficient GEMMs, small next to the model. */
enum { WEIGHT_PANEL = 1 << 20 };

void trill_bf16_widen(float *dst, const uint16_t *src, size_t n) {
    uint32_t *d = (uint32_t *)(void *)dst;
#pragma omp simd
    for (size_t i = 0; i < n; i++) d[i] = (uint32_t)src[i] << 16;
}

/* Widens n elements with the team when called outside a parallel region. */
static void widen_parallel(float *dst, const uint16_t *src, size_t n) {
    if (n < 65536 || omp_in_parallel()) {
        trill_bf16_widen(dst, src, n);
        return;
    }
    const size_t chunk = 16384;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i += chunk) trill_bf16_widen(dst + i, src + i, n - i < chunk ? n - i : chunk);
}

/* The calling thread's panel buffer, grown on demand and kept (one per thread that runs
 * kernels: the trainer's thread in practice), freed when the thread exits. */
static trill_tls_slot panel_slot; /* widened bf16 weight panels */
static float *panel_buffer(size_t n) { return trill_tls_buffer(&panel_slot, n * sizeof(float)); }

static int panel_rows(int K, int N) {
    int rows = K > 0 ? WEIGHT_PANEL / K : N;
    if (rows < 1) rows = 1;
    return rows < N ? rows : N;
}

static trill_status no_panel(size_t n) {
    return trill_error(TRILL_ERR_NOMEM, "out of memory for a %.1f MB panel of widened bf16 weights", (double)n * sizeof(float) * 1e-6);
}

trill_status trill_matmul_forward_wp(float *out, const float *inp, trill_weight W, int T, int K, int N, trill_precision prec) {
    if (W.f32) return trill_matmul_forward_p(out, inp, W.f32, T, K, N, prec);
    if (T == 0 || N == 0) return TRILL_OK;
    if (prec == TRILL_PRECISION_BF16) /* the bf16 GEMM packs the stored bf16 directly */
        return trill_kernels_gemm(prec, CblasNoTrans, CblasTrans, T, N, K, 1, inp, K, NULL, W.bf16, K, 0, out, N);
    const int rows = panel_rows(K, N);
    float *panel = panel_buffer((size_t)rows * K);
    if (!panel) return no_panel((size_t)rows * K);
    for (int n0 = 0; n0 < N; n0 += rows) { /* out[:, n0:n0+nb] = inp @ W[n0:n0+nb]^T */
        const int nb = N - n0 < rows ? N - n0 : rows;
        widen_parallel(panel, W.bf16 + (size_t)n0 * K, (size_t)nb * K);
        trill_kernels_gemm(prec, CblasNoTrans, CblasTrans, T, nb, K, 1, inp, K, panel, NULL, K, 0, out + n0, N);
    }
    return TRILL_OK;
}

trill_status trill_matmul_backward_wp(float *dinp, float *dweight, const float *dout, const float *inp, trill_weight W, int T, int K, int N,
                                      trill_precision prec) {
    if (W.f32) return trill_matmul_backward_p(dinp, dweight, dout, inp, W.f32, T, K, N, prec);
    /* A programmer's error, not reachable with valid use: a bf16 weight is frozen, and every
     * caller refuses weight gradients of a bf16 model first (trill_model_backward). */
    if (dweight) abort();
    if (!dinp || T == 0 || N == 0) return TRILL_OK;
    if (prec == TRILL_PRECISION_BF16)
        return trill_kernels_gemm(prec, CblasNoTrans, CblasNoTrans, T, K, N, 1, dout, N, NULL, W.bf16, K, 1, dinp, K);
    const int rows = panel_rows(K, N);
    float *panel = panel_buffer((size_t)rows * K);
    if (!panel) return no_panel((size_t)rows * K);
    for (int n0 = 0; n0 < N; n0 += rows) { /* dinp += dout[:, n0:n0+nb] @ W[n0:n0+nb] */
        const int nb = N - n0 < rows ? N - n0 : rows;
        widen_parallel(panel, W.bf16 + (size_t)n0 * K, (size_t)nb * K);
        trill_kernels_gemm(prec, CblasNoTrans, CblasNoTrans, T, K, nb, 1, dout + n0, N, panel, NULL, K, 1, dinp, K);
    }
    return TRILL_OK;
}

trill_status trill_matmul_forward_w(float *out, const float *inp, trill_weight W, int T, int K, int N) {
    return trill_matmul_forward_wp(out, inp, W, T, K, N, TRILL_PRECISION_FP32);
}

trill_status trill_matmul_backward_w(float *dinp, float *dweight, const float *dout, const float *inp, trill_weight W, int T, int K, int N) {
    return trill_matmul_backward_wp(dinp, dweight, dout, inp, W, T, K, N, TRILL_PRECISION_FP32);
}

void trill_embedding_forward_w(float *out, trill_weight table, const int *tokens, int T, int C) {
    if (table.f32) {
        trill_embedding_forward(out, table.f32, tokens, T, C);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) trill_bf16_widen(out + (size_t)t * C, table.bf16 + (size_t)tokens[t] * C, (size_t)C);
}
