#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "trill/kernels.h"

/* OpenBLAS here is the pthreads build: its threads and OpenMP's would fight over the same
 * cores. trill keeps one thread pool, OpenMP's, and runs single-threaded sgemm inside it. */
void openblas_set_num_threads(int n);
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void) { openblas_set_num_threads(1); }

void matmul_forward(float *out, const float *inp, const float *weight, int T, int K, int N) {
    if (T == 0 || N == 0) return;
    pthread_once(&g_blas_once, blas_single_threaded);
    const int threads = omp_get_max_threads();
    if (threads == 1 || omp_in_parallel() || (double)T * N * K < 1e6) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, N, K, 1.0f, inp, K, weight, K, 0.0f, out, N);
        return;
    }
    /* split the longer side of the output across threads, in blocks of 16 */
    const int split_rows = T >= N, len = split_rows ? T : N;
    const int block = ((len + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < threads; i++) {
        int lo = i * block, hi = lo + block < len ? lo + block : len;
        if (lo >= hi) continue;
        if (split_rows)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, N, K, 1.0f, inp + (size_t)lo * K, K,
                        weight, K, 0.0f, out + (size_t)lo * N, N);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, hi - lo, K, 1.0f, inp, K,
                        weight + (size_t)lo * K, K, 0.0f, out + lo, N);
    }
}

void rmsnorm_forward(float *out, const float *inp, const float *weight, int T, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *x = inp + (size_t)t * C;
        float *o = out + (size_t)t * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
        float rstd = (float)(1.0 / sqrt(ss / C + eps));
        for (int i = 0; i < C; i++) o[i] = weight[i] * (x[i] * rstd);
    }
}

void rope_inv_freq(float *inv_freq, int head_dim, double theta) {
    for (int i = 0; i < head_dim / 2; i++) {
        float exponent = (float)(2 * i) / (float)head_dim;
        inv_freq[i] = 1.0f / powf((float)theta, exponent);
    }
}

void rope_forward(float *x, const int *pos, const float *inv_freq, int T, int n_heads, int head_dim) {
    int half = head_dim / 2;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[t] * inv_freq[i]; /* fp32 product, as HF */
            float c = (float)cos((double)angle), s = (float)sin((double)angle);
            for (int h = 0; h < n_heads; h++) {
                float *xh = x + ((size_t)t * n_heads + h) * head_dim;
                float x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * c - x2 * s;
                xh[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void attention_forward(float *out, const float *q, const float *k, const float *v,
                       const int *offsets, int n_seqs, int nh, int nkv, int hd) {
    const float scale = 1.0f / sqrtf((float)hd);
    const int group = nh / nkv;
    const size_t qstride = (size_t)nh * hd, kvstride = (size_t)nkv * hd;
    int max_len = 0;
    for (int s = 0; s < n_seqs; s++)
        if (offsets[s + 1] - offsets[s] > max_len) max_len = offsets[s + 1] - offsets[s];
#pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * (max_len ? max_len : 1));
        /* one work item per (sequence, head, query row) keeps threads balanced */
#pragma omp for schedule(dynamic, 16) collapse(2)
        for (int s = 0; s < n_seqs; s++) {
            for (int h = 0; h < nh; h++) {
                const int base = offsets[s], len = offsets[s + 1] - offsets[s];
                const int kvh = h / group;
                for (int t = 0; t < len; t++) {
                    const float *qt = q + (size_t)(base + t) * qstride + (size_t)h * hd;
                    float maxv = -INFINITY;
                    for (int j = 0; j <= t; j++) {
                        const float *kj = k + (size_t)(base + j) * kvstride + (size_t)kvh * hd;
                        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                        for (int i = 0; i < hd; i++) dot += qt[i] * kj[i];
                        scores[j] = dot * scale;
                        if (scores[j] > maxv) maxv = scores[j];
                    }
                    float sum = 0.0f;
                    for (int j = 0; j <= t; j++) {
                        scores[j] = expf(scores[j] - maxv);
                        sum += scores[j];
                    }
                    float inv = 1.0f / sum;
                    float *ot = out + (size_t)(base + t) * qstride + (size_t)h * hd;
                    memset(ot, 0, sizeof(float) * hd);
                    for (int j = 0; j <= t; j++) {
                        const float *vj = v + (size_t)(base + j) * kvstride + (size_t)kvh * hd;
                        float p = scores[j] * inv;
                        for (int i = 0; i < hd; i++) ot[i] += p * vj[i];
                    }
                }
            }
        }
        free(scores);
    }
}

void swiglu_forward(float *out, const float *gate, const float *up, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void residual_forward(float *x, const float *y, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void softmax_forward(float *probs, const float *logits, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *x = logits + (size_t)t * C;
        float *p = probs + (size_t)t * C;
        float maxv = -INFINITY;
        for (int i = 0; i < C; i++) if (x[i] > maxv) maxv = x[i];
        double sum = 0.0;
        for (int i = 0; i < C; i++) { p[i] = expf(x[i] - maxv); sum += p[i]; }
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < C; i++) p[i] *= inv;
    }
}

void topk_forward(int *idx, float *val, const float *probs, int T, int C, int k) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *p = probs + (size_t)t * C;
        int *ix = idx + (size_t)t * k;
        float *vx = val + (size_t)t * k;
        /* insertion into a sorted list of k: C is small (experts), k smaller */
        int n = 0;
        for (int i = 0; i < C; i++) {
            if (n == k && p[i] <= vx[k - 1]) continue;
            int j = n < k ? n++ : k - 1;
            while (j > 0 && vx[j - 1] < p[i]) { vx[j] = vx[j - 1]; ix[j] = ix[j - 1]; j--; }
            vx[j] = p[i];
            ix[j] = i;
        }
    }
}

double logsumexp(const float *x, int C) {
    float maxv = -INFINITY;
    for (int i = 0; i < C; i++) if (x[i] > maxv) maxv = x[i];
    double sum = 0.0; /* fp32 terms, double accumulation */
    for (int i = 0; i < C; i++) sum += expf(x[i] - maxv);
    return maxv + log(sum);
}
