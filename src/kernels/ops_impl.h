/* Kernel bodies, written once and compiled twice: fp32 (ops_f32.c, the names in
 * trill/kernels.h) and fp64 (ops_f64.c, the same names with _f64, used by the gradient
 * checks so finite differences are exact enough to test the very same code).
 * The including file defines REAL, KN(name), GEMM and EXPR. No include guard on purpose. */

/* C = alpha op(A) op(B) + beta C, the longer side of C split across OpenMP threads, each
 * running a single-threaded BLAS call (see ops_common.c). */
static void KN(gemm)(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int Kd, REAL alpha, const REAL *A, int lda,
                     const REAL *B, int ldb, REAL beta, REAL *C, int ldc) {
    if (M == 0 || N == 0) return;
    kernels_blas_init();
    const int threads = omp_get_max_threads();
    if (threads == 1 || omp_in_parallel() || (double)M * N * Kd < 1e6) {
        GEMM(CblasRowMajor, ta, tb, M, N, Kd, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    const int split_m = M >= N, len = split_m ? M : N;
    const int block = ((len + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < threads; i++) {
        int lo = i * block, hi = lo + block < len ? lo + block : len;
        if (lo >= hi) continue;
        if (split_m)
            GEMM(CblasRowMajor, ta, tb, hi - lo, N, Kd, alpha, ta == CblasNoTrans ? A + (size_t)lo * lda : A + lo, lda, B, ldb,
                 beta, C + (size_t)lo * ldc, ldc);
        else
            GEMM(CblasRowMajor, ta, tb, M, hi - lo, Kd, alpha, A, lda, tb == CblasTrans ? B + (size_t)lo * ldb : B + lo, ldb,
                 beta, C + lo, ldc);
    }
}

void KN(matmul_forward)(REAL *out, const REAL *inp, const REAL *weight, int T, int K, int N) {
    KN(gemm)(CblasNoTrans, CblasTrans, T, N, K, 1, inp, K, weight, K, 0, out, N);
}

void KN(matmul_accumulate)(REAL *out, const REAL *inp, const REAL *weight, int T, int K, int N, REAL alpha) {
    KN(gemm)(CblasNoTrans, CblasTrans, T, N, K, alpha, inp, K, weight, K, 1, out, N);
}

void KN(matmul_backward)(REAL *dinp, REAL *dweight, const REAL *dout, const REAL *inp, const REAL *weight, int T, int K, int N) {
    if (dinp) KN(gemm)(CblasNoTrans, CblasNoTrans, T, K, N, 1, dout, N, weight, K, 1, dinp, K);   /* dinp += dout W */
    if (dweight) KN(gemm)(CblasTrans, CblasNoTrans, N, K, T, 1, dout, N, inp, K, 1, dweight, K);  /* dW += dout^T inp */
}

void KN(rmsnorm_forward)(REAL *out, const REAL *inp, const REAL *weight, int T, int C, REAL eps) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *x = inp + (size_t)t * C;
        REAL *o = out + (size_t)t * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
        REAL rstd = (REAL)(1.0 / sqrt(ss / C + eps));
        for (int i = 0; i < C; i++) o[i] = weight[i] * (x[i] * rstd);
    }
}

/* y = w * x * r, r = (mean(x^2) + eps)^-1/2:
 * dx = r (w dy) - x r^3 / C * sum(w dy x);  dw += dy x r. dweight is shared by all rows: each
 * thread sums its own rows, then the partial sums are added in thread order, so the result
 * does not depend on scheduling (training stays bit-reproducible). */
void KN(rmsnorm_backward)(REAL *dinp, REAL *dweight, const REAL *dout, const REAL *inp, const REAL *weight, int T, int C, REAL eps) {
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    REAL *partial = dweight ? calloc((size_t)threads * C, sizeof(REAL)) : NULL;
#pragma omp parallel num_threads(threads)
    {
        REAL *dw_local = partial ? partial + (size_t)omp_get_thread_num() * C : NULL;
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            const REAL *x = inp + (size_t)t * C, *dy = dout + (size_t)t * C;
            double ss = 0.0, dot = 0.0;
            for (int i = 0; i < C; i++) {
                ss += (double)x[i] * x[i];
                dot += (double)weight[i] * dy[i] * x[i];
            }
            double r = 1.0 / sqrt(ss / C + eps);
            REAL *dx = dinp + (size_t)t * C;
            REAL coef = (REAL)(dot * r * r * r / C);
            for (int i = 0; i < C; i++) dx[i] += (REAL)r * weight[i] * dy[i] - x[i] * coef;
            if (dw_local)
                for (int i = 0; i < C; i++) dw_local[i] += dy[i] * x[i] * (REAL)r;
        }
    }
    for (int th = 0; partial && th < threads; th++)
        for (int i = 0; i < C; i++) dweight[i] += partial[(size_t)th * C + i];
    free(partial);
}

void KN(rope_inv_freq)(REAL *inv_freq, int head_dim, double theta) {
    for (int i = 0; i < head_dim / 2; i++) {
        REAL exponent = (REAL)(2 * i) / (REAL)head_dim;
        inv_freq[i] = (REAL)1 / (REAL)pow((REAL)theta, exponent);
    }
}

/* The rotation of each (i, i + hd/2) pair by angle pos * inv_freq[i]; `sign` -1 rotates
 * back, which is the backward pass (a rotation's transpose is its inverse). */
static void KN(rope_rotate)(REAL *x, const int *pos, const REAL *inv_freq, int T, int n_heads, int head_dim, int sign) {
    int half = head_dim / 2;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            REAL angle = (REAL)pos[t] * inv_freq[i]; /* product in the working precision, as HF */
            REAL c = (REAL)cos((double)angle), s = (REAL)(sign * sin((double)angle));
            for (int h = 0; h < n_heads; h++) {
                REAL *xh = x + ((size_t)t * n_heads + h) * head_dim;
                REAL x1 = xh[i], x2 = xh[i + half];
                xh[i] = x1 * c - x2 * s;
                xh[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void KN(rope_forward)(REAL *x, const int *pos, const REAL *inv_freq, int T, int n_heads, int head_dim) {
    KN(rope_rotate)(x, pos, inv_freq, T, n_heads, head_dim, 1);
}

void KN(rope_backward)(REAL *dx, const int *pos, const REAL *inv_freq, int T, int n_heads, int head_dim) {
    KN(rope_rotate)(dx, pos, inv_freq, T, n_heads, head_dim, -1);
}

static int KN(max_seq_len)(const int *offsets, int n_seqs) {
    int m = 1;
    for (int s = 0; s < n_seqs; s++)
        if (offsets[s + 1] - offsets[s] > m) m = offsets[s + 1] - offsets[s];
    return m;
}

/* Softmax of scaled causal scores of query row t against keys 0..t; returns into p. */
static void KN(attention_probs)(REAL *p, const REAL *qt, const REAL *k, size_t kvstride, int t, int hd, REAL scale) {
    REAL maxv = -INFINITY;
    for (int j = 0; j <= t; j++) {
        const REAL *kj = k + (size_t)j * kvstride;
        REAL dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int i = 0; i < hd; i++) dot += qt[i] * kj[i];
        p[j] = dot * scale;
        if (p[j] > maxv) maxv = p[j];
    }
    REAL sum = 0;
    for (int j = 0; j <= t; j++) {
        p[j] = EXPR(p[j] - maxv);
        sum += p[j];
    }
    REAL inv = 1 / sum;
    for (int j = 0; j <= t; j++) p[j] *= inv;
}

void KN(attention_forward)(REAL *out, const REAL *q, const REAL *k, const REAL *v, const int *offsets, int n_seqs,
                           int nh, int nkv, int hd) {
    const REAL scale = 1 / SQRTR((REAL)hd);
    const int group = nh / nkv;
    const size_t qstride = (size_t)nh * hd, kvstride = (size_t)nkv * hd;
    const int max_len = KN(max_seq_len)(offsets, n_seqs);
#pragma omp parallel
    {
        REAL *p = malloc(sizeof(REAL) * (size_t)max_len);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seqs; s++)
            for (int h = 0; h < nh; h++) {
                const int base = offsets[s], len = offsets[s + 1] - offsets[s];
                const REAL *ks = k + (size_t)base * kvstride + (size_t)(h / group) * hd;
                const REAL *vs = v + (size_t)base * kvstride + (size_t)(h / group) * hd;
                for (int t = 0; t < len; t++) {
                    KN(attention_probs)(p, q + (size_t)(base + t) * qstride + (size_t)h * hd, ks, kvstride, t, hd, scale);
                    REAL *ot = out + (size_t)(base + t) * qstride + (size_t)h * hd;
                    memset(ot, 0, sizeof(REAL) * hd);
                    for (int j = 0; j <= t; j++) {
                        const REAL *vj = vs + (size_t)j * kvstride;
                        for (int i = 0; i < hd; i++) ot[i] += p[j] * vj[i];
                    }
                }
            }
        free(p);
    }
}

/* Recomputes each row's probabilities (nothing of size L^2 is stored). Work is split by
 * (sequence, kv head) so the dk/dv rows a thread accumulates into are its own. */
void KN(attention_backward)(REAL *dq, REAL *dk, REAL *dv, const REAL *dout, const REAL *q, const REAL *k, const REAL *v,
                            const int *offsets, int n_seqs, int nh, int nkv, int hd) {
    const REAL scale = 1 / SQRTR((REAL)hd);
    const int group = nh / nkv;
    const size_t qstride = (size_t)nh * hd, kvstride = (size_t)nkv * hd;
    const int max_len = KN(max_seq_len)(offsets, n_seqs);
#pragma omp parallel
    {
        REAL *p = malloc(sizeof(REAL) * (size_t)max_len), *dp = malloc(sizeof(REAL) * (size_t)max_len);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seqs; s++)
            for (int g = 0; g < nkv; g++) {
                const int base = offsets[s], len = offsets[s + 1] - offsets[s];
                const size_t kv_off = (size_t)base * kvstride + (size_t)g * hd;
                for (int h = g * group; h < (g + 1) * group; h++)
                    for (int t = 0; t < len; t++) {
                        const size_t qo = (size_t)(base + t) * qstride + (size_t)h * hd;
                        KN(attention_probs)(p, q + qo, k + kv_off, kvstride, t, hd, scale);
                        const REAL *dot = dout + qo;
                        REAL sum = 0;
                        for (int j = 0; j <= t; j++) {
                            const REAL *vj = v + kv_off + (size_t)j * kvstride;
                            REAL *dvj = dv + kv_off + (size_t)j * kvstride;
                            REAL d = 0;
#pragma omp simd reduction(+ : d)
                            for (int i = 0; i < hd; i++) d += dot[i] * vj[i];
                            for (int i = 0; i < hd; i++) dvj[i] += p[j] * dot[i];
                            dp[j] = d;
                            sum += p[j] * d;
                        }
                        for (int j = 0; j <= t; j++) {
                            REAL ds = p[j] * (dp[j] - sum) * scale; /* softmax backward, then the 1/sqrt(hd) */
                            const REAL *kj = k + kv_off + (size_t)j * kvstride;
                            REAL *dkj = dk + kv_off + (size_t)j * kvstride;
                            const REAL *qt = q + qo;
                            REAL *dqt = dq + qo;
                            for (int i = 0; i < hd; i++) {
                                dqt[i] += ds * kj[i];
                                dkj[i] += ds * qt[i];
                            }
                        }
                    }
            }
        free(p);
        free(dp);
    }
}

void KN(swiglu_forward)(REAL *out, const REAL *gate, const REAL *up, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        REAL g = gate[i];
        out[i] = g / (1 + EXPR(-g)) * up[i];
    }
}

/* out = silu(g) u;  silu'(g) = sig(g) (1 + g (1 - sig(g))) */
void KN(swiglu_backward)(REAL *dgate, REAL *dup, const REAL *dout, const REAL *gate, const REAL *up, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        REAL g = gate[i], sig = 1 / (1 + EXPR(-g));
        dgate[i] += dout[i] * up[i] * sig * (1 + g * (1 - sig));
        dup[i] += dout[i] * g * sig;
    }
}

void KN(residual_forward)(REAL *x, const REAL *y, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void KN(softmax_forward)(REAL *probs, const REAL *logits, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *x = logits + (size_t)t * C;
        REAL *p = probs + (size_t)t * C;
        REAL maxv = -INFINITY;
        for (int i = 0; i < C; i++) if (x[i] > maxv) maxv = x[i];
        double sum = 0.0;
        for (int i = 0; i < C; i++) { p[i] = EXPR(x[i] - maxv); sum += p[i]; }
        REAL inv = (REAL)(1.0 / sum);
        for (int i = 0; i < C; i++) p[i] *= inv;
    }
}

void KN(topk_forward)(int *idx, REAL *val, const REAL *probs, int T, int C, int k) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *p = probs + (size_t)t * C;
        int *ix = idx + (size_t)t * k;
        REAL *vx = val + (size_t)t * k;
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

void KN(router_gates_forward)(REAL *gates, const REAL *probs, const int *idx, int T, int E, int K, int norm_topk_prob) {
    for (int t = 0; t < T; t++) {
        const REAL *p = probs + (size_t)t * E;
        REAL *g = gates + (size_t)t * K, sum = 0;
        for (int j = 0; j < K; j++) sum += g[j] = p[idx[(size_t)t * K + j]];
        if (norm_topk_prob)
            for (int j = 0; j < K; j++) g[j] /= sum;
    }
}

/* gates g_j = p_{i_j} (/ S with S = sum_k p_{i_k} when normalised), p = softmax(logits):
 * dp_{i_j} = (dg_j - sum_k dg_k g_k) / S  (or dg_j);  dlogit_e += p_e (dp_e - sum_f dp_f p_f). */
void KN(router_gates_backward)(REAL *dlogits, const REAL *dgates, const REAL *probs, const int *idx, int T, int E, int K,
                               int norm_topk_prob) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *p = probs + (size_t)t * E, *dg = dgates + (size_t)t * K;
        const int *ix = idx + (size_t)t * K;
        REAL sum = 0, dot = 0;
        for (int j = 0; j < K; j++) sum += p[ix[j]];
        for (int j = 0; j < K; j++) dot += dg[j] * p[ix[j]] / sum;
        REAL pdp = 0; /* sum_e p_e dp_e over the selected experts */
        REAL dp[K];
        for (int j = 0; j < K; j++) {
            dp[j] = norm_topk_prob ? (dg[j] - dot) / sum : dg[j];
            pdp += p[ix[j]] * dp[j];
        }
        REAL *dl = dlogits + (size_t)t * E;
        for (int e = 0; e < E; e++) dl[e] -= p[e] * pdp;
        for (int j = 0; j < K; j++) dl[ix[j]] += p[ix[j]] * dp[j];
    }
}

double KN(logsumexp)(const REAL *x, int C) {
    REAL maxv = -INFINITY;
    for (int i = 0; i < C; i++) if (x[i] > maxv) maxv = x[i];
    double sum = 0.0; /* terms in the working precision, double accumulation */
    for (int i = 0; i < C; i++) sum += EXPR(x[i] - maxv);
    return maxv + log(sum);
}

void KN(token_logprob_forward)(REAL *logprob, const REAL *logits, const int *targets, int T, int V) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *row = logits + (size_t)t * V;
        logprob[t] = (REAL)((double)row[targets[t]] - KN(logsumexp)(row, V));
    }
}

/* logprob = logit[target] - logsumexp(logits): dlogit_v = dlogprob (1[v = target] - softmax_v).
 * Cross-entropy is -logprob: pass dlogprob = -dloss. Writes (not accumulates) dlogits. */
void KN(token_logprob_backward)(REAL *dlogits, const REAL *dlogprob, const REAL *logits, const int *targets, int T, int V) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *row = logits + (size_t)t * V;
        REAL *d = dlogits + (size_t)t * V;
        REAL lse = (REAL)KN(logsumexp)(row, V);
        for (int v = 0; v < V; v++) d[v] = -dlogprob[t] * EXPR(row[v] - lse);
        d[targets[t]] += dlogprob[t];
    }
}

void KN(embedding_forward)(REAL *out, const REAL *table, const int *tokens, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) memcpy(out + (size_t)t * C, table + (size_t)tokens[t] * C, sizeof(REAL) * C);
}

/* Rows of the table repeat across tokens, so threads split the channels, not the tokens. */
void KN(embedding_backward)(REAL *dtable, const REAL *dout, const int *tokens, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        for (int t = 0; t < T; t++) dtable[(size_t)tokens[t] * C + c] += dout[(size_t)t * C + c];
}
