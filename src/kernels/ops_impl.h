/* Kernel bodies, written once and compiled twice: fp32 (ops_f32.c, the names in
 * trill/kernels.h) and fp64 (ops_f64.c, the same names with _f64, used by the gradient
 * checks so finite differences are exact enough to test the very same code).
 * The including file defines REAL, KN(name), GEMM and EXPR. No include guard on purpose. */

/* Elementwise and per-row kernels fork threads only for this many elements or more: below it
 * (a decode step's few rows) the fork costs more than the work. Results do not depend on it. */
#ifndef PARALLEL_MIN
#define PARALLEL_MIN 16384
#endif

/* One single-threaded GEMM in precision prec: 0, or -1 when the bf16 GEMM's per-thread packing
 * buffer cannot be had. B16 (fp32 only) is B stored as bf16, or NULL; fp32 takes B. The fp64
 * instantiation has no bf16 (GEMM_BF16 undefined): prec is ignored there. */
static int KN(gemm_part)(trill_precision prec, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int Kd, REAL alpha,
                         const REAL *A, int lda, const REAL *B, const uint16_t *B16, int ldb, REAL beta, REAL *C, int ldc) {
#ifdef GEMM_BF16
    if (prec == TRILL_PRECISION_BF16) return GEMM_BF16(ta, tb, M, N, Kd, alpha, A, lda, B, B16, ldb, beta, C, ldc);
#endif
    (void)prec;
    (void)B16;
    GEMM(CblasRowMajor, ta, tb, M, N, Kd, alpha, A, lda, B, ldb, beta, C, ldc);
    return 0;
}

static trill_status KN(gemm_nomem)(void) {
    return trill_error(TRILL_ERR_NOMEM, "out of memory for the bf16 GEMM's packing buffers (2 MB per thread)");
}

/* C = alpha op(A) op(B) + beta C, the longer side of C split across OpenMP threads, each
 * running a single-threaded GEMM (see ops_common.c). Every element of C is computed by one
 * call over the whole K, so the thread count never changes a result. */
static trill_status KN(gemm)(trill_precision prec, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int Kd, REAL alpha,
                             const REAL *A, int lda, const REAL *B, const uint16_t *B16, int ldb, REAL beta, REAL *C, int ldc) {
    if (M == 0 || N == 0) return TRILL_OK;
    trill_kernels_blas_init();
    const int threads = omp_get_max_threads();
    if (threads == 1 || omp_in_parallel() || (double)M * N * Kd < 1e6)
        return KN(gemm_part)(prec, ta, tb, M, N, Kd, alpha, A, lda, B, B16, ldb, beta, C, ldc) ? KN(gemm_nomem)() : TRILL_OK;
    const int split_m = M >= N, len = split_m ? M : N;
    const int block = ((len + threads - 1) / threads + 15) / 16 * 16;
    int failed = 0;
#pragma omp parallel for schedule(static) reduction(| : failed)
    for (int i = 0; i < threads; i++) {
        int lo = i * block, hi = lo + block < len ? lo + block : len;
        if (lo >= hi) continue;
        const size_t b_off = tb == CblasTrans ? (size_t)lo * ldb : (size_t)lo;
        if (split_m)
            failed |= KN(gemm_part)(prec, ta, tb, hi - lo, N, Kd, alpha, ta == CblasNoTrans ? A + (size_t)lo * lda : A + lo, lda, B, B16,
                                    ldb, beta, C + (size_t)lo * ldc, ldc);
        else
            failed |= KN(gemm_part)(prec, ta, tb, M, hi - lo, Kd, alpha, A, lda, B ? B + b_off : NULL, B16 ? B16 + b_off : NULL, ldb,
                                    beta, C + lo, ldc);
    }
    return failed ? KN(gemm_nomem)() : TRILL_OK;
}

/* exp(x) for x <= 0 (kernels/exp_nonpos.h): it was most of the attention time with libm's scalar
 * expf, and a tenth of a training step in lm_head's softmax and SwiGLU. fp64 (gradient checks):
 * libm's exp. */
static inline REAL KN(exp_nonpos)(REAL x) {
    if (sizeof(REAL) != sizeof(float)) return EXPR(x);
    return exp_nonpos_f32((float)x);
}

/* 1 / (1 + exp(-x)) as (x < 0 ? e : 1) / (1 + e) with e = exp(-|x|) <= 1: never overflows, and
 * the choice is made on the sign bit (no branch), so loops over it vectorise. */
static inline REAL KN(sigmoid)(REAL x) {
    if (sizeof(REAL) != sizeof(float)) return 1 / (1 + EXPR(-x));
    const float xf = (float)x, e = KN(exp_nonpos)(-fabsf(xf)), one = 1.0f;
    unsigned xb, eb, ob, nb;
    memcpy(&xb, &xf, sizeof xb);
    memcpy(&eb, &e, sizeof eb);
    memcpy(&ob, &one, sizeof ob);
    const unsigned neg = -(xb >> 31); /* all ones when x < 0 */
    nb = (eb & neg) | (ob & ~neg);
    float num;
    memcpy(&num, &nb, sizeof num);
    return num / (1.0f + e);
}

trill_status KN(trill_matmul_forward_p)(REAL *out, const REAL *inp, const REAL *weight, int T, int K, int N, trill_precision prec) {
    return KN(gemm)(prec, CblasNoTrans, CblasTrans, T, N, K, 1, inp, K, weight, NULL, K, 0, out, N);
}

trill_status KN(trill_matmul_accumulate_p)(REAL *out, const REAL *inp, const REAL *weight, int T, int K, int N, REAL alpha,
                                           trill_precision prec) {
    return KN(gemm)(prec, CblasNoTrans, CblasTrans, T, N, K, alpha, inp, K, weight, NULL, K, 1, out, N);
}

trill_status KN(trill_matmul_backward_p)(REAL *dinp, REAL *dweight, const REAL *dout, const REAL *inp, const REAL *weight, int T, int K,
                                         int N, trill_precision prec) {
    trill_status st = TRILL_OK;
    if (dinp) st = KN(gemm)(prec, CblasNoTrans, CblasNoTrans, T, K, N, 1, dout, N, weight, NULL, K, 1, dinp, K); /* dinp += dout W */
    if (!st && dweight) st = KN(gemm)(prec, CblasTrans, CblasNoTrans, N, K, T, 1, dout, N, inp, NULL, K, 1, dweight, K); /* dW += dout^T inp */
    return st;
}

/* fp32 cannot fail (no scratch) */
void KN(trill_matmul_forward)(REAL *out, const REAL *inp, const REAL *weight, int T, int K, int N) {
    (void)KN(trill_matmul_forward_p)(out, inp, weight, T, K, N, TRILL_PRECISION_FP32);
}

void KN(trill_matmul_accumulate)(REAL *out, const REAL *inp, const REAL *weight, int T, int K, int N, REAL alpha) {
    (void)KN(trill_matmul_accumulate_p)(out, inp, weight, T, K, N, alpha, TRILL_PRECISION_FP32);
}

void KN(trill_matmul_backward)(REAL *dinp, REAL *dweight, const REAL *dout, const REAL *inp, const REAL *weight, int T, int K, int N) {
    (void)KN(trill_matmul_backward_p)(dinp, dweight, dout, inp, weight, T, K, N, TRILL_PRECISION_FP32);
}

void KN(trill_rmsnorm_offset_forward)(REAL *out, const REAL *inp, const REAL *weight, REAL offset, int T, int C, REAL eps) {
#pragma omp parallel for if(parallel: (size_t)T * C >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *x = inp + (size_t)t * C;
        REAL *o = out + (size_t)t * C;
        double ss = 0.0;
        for (int i = 0; i < C; i++) ss += (double)x[i] * x[i];
        REAL rstd = (REAL)(1.0 / sqrt(ss / C + eps));
        for (int i = 0; i < C; i++) o[i] = (offset + weight[i]) * (x[i] * rstd);
    }
}

void KN(trill_rmsnorm_forward)(REAL *out, const REAL *inp, const REAL *weight, int T, int C, REAL eps) {
    KN(trill_rmsnorm_offset_forward)(out, inp, weight, 0, T, C, eps); /* 0 + w is w exactly */
}

/* y = w * x * r, r = (mean(x^2) + eps)^-1/2:
 * dx = r (w dy) - x r^3 / C * sum(w dy x);  dw += dy x r. dweight is shared by all rows: each
 * thread sums its own rows, then the partial sums are added in thread order, so the result
 * does not depend on scheduling (training stays bit-reproducible). TRILL_ERR_NOMEM (nothing
 * computed) when those partial sums cannot be allocated. */
trill_status KN(trill_rmsnorm_offset_backward)(REAL *dinp, REAL *dweight, const REAL *dout, const REAL *inp, const REAL *weight, REAL offset,
                                               int T, int C, REAL eps) {
    const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    REAL *partial = dweight ? trill_calloc((size_t)threads * C, sizeof(REAL)) : NULL;
    if (dweight && !partial)
        return trill_error(TRILL_ERR_NOMEM, "rmsnorm backward: out of memory for %d threads' weight gradients of %d", threads, C);
#pragma omp parallel num_threads(threads)
    {
        REAL *dw_local = partial ? partial + (size_t)omp_get_thread_num() * C : NULL;
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            const REAL *x = inp + (size_t)t * C, *dy = dout + (size_t)t * C;
            double ss = 0.0, dot = 0.0;
            for (int i = 0; i < C; i++) {
                ss += (double)x[i] * x[i];
                dot += (double)(offset + weight[i]) * dy[i] * x[i];
            }
            double r = 1.0 / sqrt(ss / C + eps);
            REAL *dx = dinp + (size_t)t * C;
            REAL coef = (REAL)(dot * r * r * r / C);
            for (int i = 0; i < C; i++) dx[i] += (REAL)r * (offset + weight[i]) * dy[i] - x[i] * coef;
            if (dw_local)
                for (int i = 0; i < C; i++) dw_local[i] += dy[i] * x[i] * (REAL)r;
        }
    }
    for (int th = 0; partial && th < threads; th++)
        for (int i = 0; i < C; i++) dweight[i] += partial[(size_t)th * C + i];
    free(partial);
    return TRILL_OK;
}

trill_status KN(trill_rmsnorm_backward)(REAL *dinp, REAL *dweight, const REAL *dout, const REAL *inp, const REAL *weight, int T, int C,
                                 REAL eps) {
    return KN(trill_rmsnorm_offset_backward)(dinp, dweight, dout, inp, weight, 0, T, C, eps);
}

void KN(trill_rope_inv_freq)(REAL *inv_freq, int head_dim, double theta) {
    for (int i = 0; i < head_dim / 2; i++) {
        REAL exponent = (REAL)(2 * i) / (REAL)head_dim;
        inv_freq[i] = (REAL)1 / (REAL)pow((REAL)theta, exponent);
    }
}

/* x rounded to the working precision on its own: keeps the compiler from fusing a product
 * into the sum it feeds (-ffp-contract=fast), where a formula must round as torch does. */
static inline REAL KN(rounded)(REAL x) {
    volatile REAL v = x;
    return v;
}

/* HF find_correction_dim: the dimension whose wavelength turns num_rotations times over
 * max_pos positions, in double as Python evaluates it. */
static double KN(yarn_correction_dim)(double num_rotations, int dim, double theta, int max_pos) {
    return (dim * log(max_pos / (num_rotations * 2 * M_PI))) / (2 * log(theta));
}

/* The steps of HF _compute_yarn_parameters, each in the working precision (torch's float32
 * tensor ops with Python scalars cast to float32), the correction range in double. */
double KN(trill_rope_inv_freq_yarn)(REAL *inv_freq, int dim, double theta, double factor, int original_max_position_embeddings,
                              double beta_fast, double beta_slow, double mscale, double mscale_all_dim, int truncate) {
    double low = KN(yarn_correction_dim)(beta_fast, dim, theta, original_max_position_embeddings);
    double high = KN(yarn_correction_dim)(beta_slow, dim, theta, original_max_position_embeddings);
    if (truncate) low = floor(low), high = ceil(high);
    if (low < 0) low = 0;                 /* max(low, 0) */
    if (high > dim - 1) high = dim - 1;   /* min(high, dim - 1) */
    if (low == high) high += 0.001;       /* linear_ramp_factor: "prevent singularity" */
    const REAL lo = (REAL)low, span = (REAL)(high - low), f = (REAL)factor;
    for (int i = 0; i < dim / 2; i++) {
        const REAL pos_freq = (REAL)pow((REAL)theta, (REAL)(2 * i) / (REAL)dim);
        const REAL extrapolation = 1 / pos_freq, interpolation = 1 / (f * pos_freq);
        REAL ramp = ((REAL)i - lo) / span;
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const REAL extrapolation_factor = 1 - ramp;
        inv_freq[i] = KN(rounded)(interpolation * (1 - extrapolation_factor)) + KN(rounded)(extrapolation * extrapolation_factor);
    }
    if (mscale != 0 && mscale_all_dim != 0) return trill_rope_yarn_mscale(factor, mscale) / trill_rope_yarn_mscale(factor, mscale_all_dim);
    return trill_rope_yarn_mscale(factor, 1);
}

/* The rotation of each pair of the rotary part (see enum rope_pairing) by angle
 * pos * inv_freq[i], cos and sin times cs_scale; `sign` -1 rotates back, which is the backward
 * pass (a rotation's transpose is its inverse; the scale is symmetric). */
static void KN(rope_rotate)(REAL *x, const int *pos, const REAL *inv_freq, int T, int n_heads, int head_stride, int rot_offset,
                            int rot_dim, int pairing, REAL cs_scale, int sign) {
    const int half = rot_dim / 2, step = pairing == ROPE_ADJACENT ? 2 : 1, partner = pairing == ROPE_ADJACENT ? 1 : half;
#pragma omp parallel for if(parallel: (size_t)T * n_heads * rot_dim >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            REAL angle = (REAL)pos[t] * inv_freq[i]; /* product in the working precision, as HF */
            REAL c = (REAL)cos((double)angle), s = (REAL)(sign * sin((double)angle));
            if (cs_scale != 1) c *= cs_scale, s *= cs_scale; /* HF: cos() * attention_scaling */
            const int a = i * step, b = a + partner;
            for (int h = 0; h < n_heads; h++) {
                REAL *xh = x + ((size_t)t * n_heads + h) * head_stride + rot_offset;
                REAL x1 = xh[a], x2 = xh[b];
                xh[a] = x1 * c - x2 * s;
                xh[b] = x2 * c + x1 * s;
            }
        }
    }
}

void KN(trill_rope_forward)(REAL *x, const int *pos, const REAL *inv_freq, int T, int n_heads, int head_dim) {
    KN(rope_rotate)(x, pos, inv_freq, T, n_heads, head_dim, 0, head_dim, ROPE_ROTATE_HALF, 1, 1);
}

void KN(trill_rope_backward)(REAL *dx, const int *pos, const REAL *inv_freq, int T, int n_heads, int head_dim) {
    KN(rope_rotate)(dx, pos, inv_freq, T, n_heads, head_dim, 0, head_dim, ROPE_ROTATE_HALF, 1, -1);
}

void KN(trill_rope_partial_forward)(REAL *x, const int *pos, const REAL *inv_freq, int T, int n_heads, int head_stride,
                              int rot_offset, int rot_dim, int pairing, REAL cs_scale) {
    KN(rope_rotate)(x, pos, inv_freq, T, n_heads, head_stride, rot_offset, rot_dim, pairing, cs_scale, 1);
}

void KN(trill_rope_partial_backward)(REAL *dx, const int *pos, const REAL *inv_freq, int T, int n_heads, int head_stride,
                               int rot_offset, int rot_dim, int pairing, REAL cs_scale) {
    KN(rope_rotate)(dx, pos, inv_freq, T, n_heads, head_stride, rot_offset, rot_dim, pairing, cs_scale, -1);
}

static int KN(max_seq_len)(const int *offsets, int n_seqs) {
    int m = 1;
    for (int s = 0; s < n_seqs; s++)
        if (offsets[s + 1] - offsets[s] > m) m = offsets[s + 1] - offsets[s];
    return m;
}

/* Query positions per tile: a tile stacks this many rows of each query head of one kv group
 * (about 128 rows in all), so the score GEMMs are tall enough to run near peak while the
 * causal waste in the diagonal block (half a tile per row on average) stays small. A pure
 * function of the shapes: the blocking, hence the rounding, never depends on threads. */
static int KN(attention_tile)(int group) {
    int tb = 128 / group;
    return tb < 16 ? 16 : tb;
}

/* In place on one row of scaled scores p[0..n): softmax over columns first..last (the causal
 * prefix, or its sliding window), exact zeros elsewhere; with a sink logit, it joins the
 * denominator, and its probability is returned (0 without). */
static REAL KN(attention_softmax_row)(REAL *p, int first, int last, int n, const REAL *sink) {
    REAL maxv = sink && *sink > p[first] ? *sink : p[first];
#pragma omp simd reduction(max : maxv)
    for (int j = first + 1; j <= last; j++) maxv = p[j] > maxv ? p[j] : maxv;
    REAL sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = first; j <= last; j++) {
        REAL e = KN(exp_nonpos)(p[j] - maxv);
        p[j] = e;
        sum += e;
    }
    const REAL es = sink ? KN(exp_nonpos)(*sink - maxv) : 0;
    const REAL inv = 1 / (sum + es);
#pragma omp simd
    for (int j = first; j <= last; j++) p[j] *= inv;
    for (int j = 0; j < first; j++) p[j] = 0;
    for (int j = last + 1; j < n; j++) p[j] = 0;
    return es * inv;
}

/* The first key position a query at position t attends to. */
static inline int KN(attention_first)(const KN(trill_attention_opts) *opts, int t) {
    return opts && opts->window > 0 && t - opts->window + 1 > 0 ? t - opts->window + 1 : 0;
}

/* One tile: the nb query positions t0..t0+nb-1 of every head of kv group g, stacked head by
 * head into xs[group * nb, hd] (row a * nb + r is head g * group + a at position t0 + r). */
static void KN(attention_gather)(REAL *xs, const REAL *x, size_t qstride, int t0, int nb, int h0, int group, int hd) {
    for (int a = 0; a < group; a++)
        for (int r = 0; r < nb; r++)
            memcpy(xs + ((size_t)a * nb + r) * hd, x + (size_t)(t0 + r) * qstride + (size_t)(h0 + a) * hd, sizeof(REAL) * hd);
}

/* The tile's probabilities P[rows, end] (end = t0 + nb: the keys up to its last position):
 * P = causal softmax(scale Qs K[0:end]^T), over hd = hd_qk, within opts' window and with its
 * sinks (row a * nb + r is query head h0 + a); each row's sink probability into ps[rows] when
 * there are sinks. The forward and the backward both call this, so the backward recomputes
 * bit-identical probabilities. Single-threaded BLAS. */
static int KN(attention_tile_probs)(REAL *p, REAL *ps, const REAL *qs, const REAL *ks, size_t kstride, int t0, int nb, int rows,
                                    int hd, REAL scale, trill_precision prec, const KN(trill_attention_opts) *opts, int h0) {
    const int end = t0 + nb;
    if (KN(gemm_part)(prec, CblasNoTrans, CblasTrans, rows, end, hd, scale, qs, hd, ks, NULL, (int)kstride, 0, p, end)) return -1;
    const REAL *sinks = opts ? opts->sinks : NULL;
    for (int row = 0; row < rows; row++) {
        const int t = t0 + row % nb;
        const REAL s = KN(attention_softmax_row)(p + (size_t)row * end, KN(attention_first)(opts, t), t, end,
                                                 sinks ? &sinks[h0 + row / nb] : NULL);
        if (sinks) ps[row] = s;
    }
    return 0;
}

/* Per-thread scratch of the attention kernels, the calling thread's own and kept from call to
 * call (base/tls.h: no fresh pages every step): n buffers of sizes[i] elements carved from it,
 * or all NULL (and *failed set) when it cannot be had. */
static trill_tls_slot KN(attention_slot);

static void KN(attention_scratch)(REAL **bufs, const size_t *sizes, int n, int *failed) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (sizes[i] + 15) & ~(size_t)15; /* each 64-byte aligned */
    REAL *b = trill_tls_buffer(&KN(attention_slot), sizeof(REAL) * total);
    for (int i = 0; i < n; i++) {
        bufs[i] = b;
        if (b) b += (sizes[i] + 15) & ~(size_t)15;
    }
    if (bufs[0]) return;
#pragma omp atomic write
    *failed = 1;
}

/* Blocked: per (sequence, query tile, kv head) one task; its heads' rows are stacked so K and
 * V are read once per tile: S = scale Q K^T (GEMM over the causal prefix), masked row softmax,
 * O = P V (GEMM). Memory per thread: a [128-ish, max_len] score block. Every output element is
 * computed by one task in a fixed order, so results do not depend on the threads. */
trill_status KN(trill_attention_forward)(REAL *out, const REAL *q, const REAL *k, const REAL *v, const int *offsets, int n_seqs,
                                   int nh, int nkv, int hd_qk, int hd_v, REAL scale, trill_precision prec,
                                   const KN(trill_attention_opts) *opts) {
    const int group = nh / nkv, tb = KN(attention_tile)(group);
    const size_t qstride = (size_t)nh * hd_qk, kstride = (size_t)nkv * hd_qk, vstride = (size_t)nkv * hd_v;
    const size_t ostride = (size_t)nh * hd_v;
    const int max_len = KN(max_seq_len)(offsets, n_seqs), max_tiles = (max_len + tb - 1) / tb;
    /* tasks (sequence, tile), last tiles (the most keys) first for the dynamic schedule */
    int n_tasks = 0;
    for (int s = 0; s < n_seqs; s++) n_tasks += (offsets[s + 1] - offsets[s] + tb - 1) / tb;
    if (n_tasks == 0) return TRILL_OK;
    int *tasks = trill_malloc(sizeof(int) * 2 * (size_t)n_tasks), n = 0;
    if (!tasks) return trill_error(TRILL_ERR_NOMEM, "attention: out of memory for %d tasks", n_tasks);
    for (int i = max_tiles - 1; i >= 0; i--)
        for (int s = 0; s < n_seqs; s++)
            if ((offsets[s + 1] - offsets[s] + tb - 1) / tb > i) tasks[2 * n] = s, tasks[2 * n + 1] = i, n++;
    trill_kernels_blas_init();
    const size_t max_rows = (size_t)group * tb;
    const size_t sizes[4] = { max_rows * max_len, max_rows * hd_qk, max_rows * hd_v, max_rows };
    int failed = 0, gemm_failed = 0;
#pragma omp parallel
    {
        REAL *bufs[4];
        KN(attention_scratch)(bufs, sizes, 4, &failed);
        REAL *p = bufs[0], *qs = bufs[1], *os = bufs[2], *ps = bufs[3];
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < n_tasks * nkv; i++) {
            if (!p) continue;
            const int s = tasks[2 * (i / nkv)], t0 = tasks[2 * (i / nkv) + 1] * tb, g = i % nkv;
            const int base = offsets[s], len = offsets[s + 1] - base, nb = len - t0 < tb ? len - t0 : tb;
            const int end = t0 + nb, rows = group * nb;
            const REAL *ks = k + (size_t)base * kstride + (size_t)g * hd_qk, *vs = v + (size_t)base * vstride + (size_t)g * hd_v;
            KN(attention_gather)(qs, q + (size_t)base * qstride, qstride, t0, nb, g * group, group, hd_qk);
            if (KN(attention_tile_probs)(p, ps, qs, ks, kstride, t0, nb, rows, hd_qk, scale, prec, opts, g * group) ||
                KN(gemm_part)(prec, CblasNoTrans, CblasNoTrans, rows, hd_v, end, 1, p, end, vs, NULL, (int)vstride, 0, os, hd_v)) {
#pragma omp atomic write
                gemm_failed = 1;
                continue;
            }
            for (int a = 0; a < group; a++)
                for (int r = 0; r < nb; r++)
                    memcpy(out + (size_t)(base + t0 + r) * ostride + (size_t)(g * group + a) * hd_v, os + ((size_t)a * nb + r) * hd_v,
                           sizeof(REAL) * hd_v);
        }
    }
    free(tasks);
    if (gemm_failed) return KN(gemm_nomem)();
    if (failed)
        return trill_error(TRILL_ERR_NOMEM, "attention: out of memory for the per-thread scratch (%.1f MB each)",
                           (double)(sizes[0] + sizes[1] + sizes[2] + sizes[3]) * sizeof(REAL) * 1e-6);
    return TRILL_OK;
}

/* qsort order of (length, index) pairs: longer first, then lower index (a total order). */
static int KN(attention_longer_first)(const void *a, const void *b) {
    const int *x = a, *y = b;
    return x[0] != y[0] ? (x[0] < y[0] ? 1 : -1) : (x[1] > y[1]) - (x[1] < y[1]);
}

/* Blocked like the forward; recomputes each tile's probabilities (nothing of size L^2 is
 * stored). Per tile: dP = dO V^T, dV += P^T dO, dS = P o (dP - rowsum(P o dP)),
 * dQ += scale dS K, dK += scale dS^T Q (GEMMs over the causal prefix). A sink s with
 * probability p_s (its value is zero) gets d s = -p_s rowsum(P o dP) from each of its rows.
 * Work is split by (sequence, kv head), tiles in order within it, so the dk/dv rows a task
 * accumulates into are its own and the order of every sum is fixed whatever the threads; the
 * sinks' gradients are summed per sequence, then over the sequences in order. */
trill_status KN(trill_attention_backward)(REAL *dq, REAL *dk, REAL *dv, const REAL *dout, const REAL *q, const REAL *k, const REAL *v,
                                    const int *offsets, int n_seqs, int nh, int nkv, int hd_qk, int hd_v, REAL scale,
                                    trill_precision prec, const KN(trill_attention_opts) *opts) {
    const int group = nh / nkv, tb = KN(attention_tile)(group);
    const size_t qstride = (size_t)nh * hd_qk, kstride = (size_t)nkv * hd_qk, vstride = (size_t)nkv * hd_v;
    const size_t ostride = (size_t)nh * hd_v;
    const int max_len = KN(max_seq_len)(offsets, n_seqs);
    /* longest sequences first for the dynamic schedule: pairs (length, index), sorted */
    int *order = trill_malloc(sizeof(int) * 2 * (size_t)(n_seqs > 0 ? n_seqs : 1));
    if (!order) return trill_error(TRILL_ERR_NOMEM, "attention backward: out of memory for %d sequences", n_seqs);
    for (int s = 0; s < n_seqs; s++) order[2 * s] = offsets[s + 1] - offsets[s], order[2 * s + 1] = s;
    qsort(order, (size_t)n_seqs, 2 * sizeof(int), KN(attention_longer_first));
    const int sink_grads = opts && opts->sinks && opts->dsinks;
    REAL *dsink_seq = sink_grads ? trill_calloc((size_t)n_seqs * nh, sizeof(REAL)) : NULL; /* [sequence][head] */
    if (sink_grads && !dsink_seq) {
        free(order);
        return trill_error(TRILL_ERR_NOMEM, "attention backward: out of memory for the sinks' gradients");
    }
    trill_kernels_blas_init();
    const size_t max_rows = (size_t)group * tb;
    const size_t sizes[6] = { max_rows * max_len, max_rows * max_len, max_rows * hd_qk, max_rows * hd_v, max_rows * hd_qk, max_rows };
    int failed = 0, gemm_failed = 0;
#pragma omp parallel
    {
        REAL *bufs[6];
        KN(attention_scratch)(bufs, sizes, 6, &failed);
        REAL *p = bufs[0], *dp = bufs[1], *qs = bufs[2], *dos = bufs[3], *dqs = bufs[4], *ps = bufs[5];
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < n_seqs * nkv; i++) {
            if (!p) continue;
            const int s = order[2 * (i / nkv) + 1], g = i % nkv;
            const int base = offsets[s], len = offsets[s + 1] - base;
            const size_t k_off = (size_t)base * kstride + (size_t)g * hd_qk, v_off = (size_t)base * vstride + (size_t)g * hd_v;
            const REAL *ks = k + k_off, *vs = v + v_off;
            for (int t0 = 0; t0 < len; t0 += tb) {
                const int nb = len - t0 < tb ? len - t0 : tb, end = t0 + nb, rows = group * nb;
                KN(attention_gather)(qs, q + (size_t)base * qstride, qstride, t0, nb, g * group, group, hd_qk);
                KN(attention_gather)(dos, dout + (size_t)base * ostride, ostride, t0, nb, g * group, group, hd_v);
                if (KN(attention_tile_probs)(p, ps, qs, ks, kstride, t0, nb, rows, hd_qk, scale, prec, opts, g * group) ||
                    KN(gemm_part)(prec, CblasNoTrans, CblasTrans, rows, end, hd_v, 1, dos, hd_v, vs, NULL, (int)vstride, 0, dp, end) ||
                    KN(gemm_part)(prec, CblasTrans, CblasNoTrans, end, hd_v, rows, 1, p, end, dos, NULL, hd_v, 1, dv + v_off, (int)vstride)) {
#pragma omp atomic write
                    gemm_failed = 1;
                    break;
                }
                for (int row = 0; row < rows; row++) { /* softmax backward; dS overwrites dP */
                    const int last = t0 + row % nb, first = KN(attention_first)(opts, last);
                    const REAL *pr = p + (size_t)row * end;
                    REAL *dr = dp + (size_t)row * end, sum = 0;
#pragma omp simd reduction(+ : sum)
                    for (int j = first; j <= last; j++) sum += pr[j] * dr[j];
#pragma omp simd
                    for (int j = first; j <= last; j++) dr[j] = pr[j] * (dr[j] - sum);
                    for (int j = 0; j < first; j++) dr[j] = 0;
                    for (int j = last + 1; j < end; j++) dr[j] = 0;
                    if (sink_grads) dsink_seq[(size_t)s * nh + g * group + row / nb] -= ps[row] * sum;
                }
                if (KN(gemm_part)(prec, CblasNoTrans, CblasNoTrans, rows, hd_qk, end, scale, dp, end, ks, NULL, (int)kstride, 0, dqs, hd_qk) ||
                    KN(gemm_part)(prec, CblasTrans, CblasNoTrans, end, hd_qk, rows, scale, dp, end, qs, NULL, hd_qk, 1, dk + k_off, (int)kstride)) {
#pragma omp atomic write
                    gemm_failed = 1;
                    break;
                }
                for (int a = 0; a < group; a++)
                    for (int r = 0; r < nb; r++) {
                        REAL *dqr = dq + (size_t)(base + t0 + r) * qstride + (size_t)(g * group + a) * hd_qk;
                        const REAL *src = dqs + ((size_t)a * nb + r) * hd_qk;
#pragma omp simd
                        for (int c = 0; c < hd_qk; c++) dqr[c] += src[c];
                    }
            }
        }
    }
    free(order);
    if (sink_grads && !gemm_failed && !failed)
        for (int s = 0; s < n_seqs; s++)
            for (int h = 0; h < nh; h++) opts->dsinks[h] += dsink_seq[(size_t)s * nh + h];
    free(dsink_seq);
    if (gemm_failed) return KN(gemm_nomem)();
    if (failed)
        return trill_error(TRILL_ERR_NOMEM, "attention backward: out of memory for the per-thread scratch (%.1f MB each)",
                           (double)(sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4] + sizes[5]) * sizeof(REAL) * 1e-6);
    return TRILL_OK;
}

void KN(trill_swiglu_forward)(REAL *out, const REAL *gate, const REAL *up, size_t n) {
#pragma omp parallel for simd if(parallel: n >= PARALLEL_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
        REAL g = gate[i];
        out[i] = g * KN(sigmoid)(g) * up[i];
    }
}

/* out = silu(g) u;  silu'(g) = sig(g) (1 + g (1 - sig(g))) */
void KN(trill_swiglu_backward)(REAL *dgate, REAL *dup, const REAL *dout, const REAL *gate, const REAL *up, size_t n) {
#pragma omp parallel for simd if(parallel: n >= PARALLEL_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
        REAL g = gate[i], sig = KN(sigmoid)(g);
        dgate[i] += dout[i] * up[i] * sig * (1 + g * (1 - sig));
        dup[i] += dout[i] * g * sig;
    }
}

void KN(trill_swiglu_clamped_forward)(REAL *out, const REAL *gate, const REAL *up, size_t n, REAL limit, REAL alpha) {
#pragma omp parallel for simd if(parallel: n >= PARALLEL_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
        const REAL g = gate[i] > limit ? limit : gate[i], u = up[i] > limit ? limit : up[i] < -limit ? -limit : up[i];
        out[i] = g * KN(sigmoid)(alpha * g) * (u + 1);
    }
}

/* d/dg [g sig(a g)] = sig(a g) (1 + a g (1 - sig(a g))) */
void KN(trill_swiglu_clamped_backward)(REAL *dgate, REAL *dup, const REAL *dout, const REAL *gate, const REAL *up, size_t n, REAL limit,
                                       REAL alpha) {
#pragma omp parallel for simd if(parallel: n >= PARALLEL_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) {
        const REAL g = gate[i] > limit ? limit : gate[i], u = up[i] > limit ? limit : up[i] < -limit ? -limit : up[i];
        const REAL sig = KN(sigmoid)(alpha * g);
        if (gate[i] <= limit) dgate[i] += dout[i] * (u + 1) * sig * (1 + alpha * g * (1 - sig));
        if (up[i] >= -limit && up[i] <= limit) dup[i] += dout[i] * g * sig;
    }
}

void KN(trill_sigmoid_forward)(REAL *out, const REAL *inp, size_t n) {
#pragma omp parallel for simd if(parallel: n >= PARALLEL_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = KN(sigmoid)(inp[i]);
}

void KN(trill_residual_forward)(REAL *x, const REAL *y, size_t n) {
#pragma omp parallel for if(parallel: n >= PARALLEL_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void KN(trill_softmax_forward)(REAL *probs, const REAL *logits, int T, int C) {
#pragma omp parallel for if(parallel: (size_t)T * C >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *x = logits + (size_t)t * C;
        REAL *p = probs + (size_t)t * C;
        REAL maxv = -INFINITY;
        for (int i = 0; i < C; i++) if (x[i] > maxv) maxv = x[i];
        double sum = 0.0;
        for (int i = 0; i < C; i++) { p[i] = KN(exp_nonpos)(x[i] - maxv); sum += p[i]; }
        REAL inv = (REAL)(1.0 / sum);
        for (int i = 0; i < C; i++) p[i] *= inv;
    }
}

/* The k largest of p[i] (+ bias[i] when bias is not NULL) over the experts i whose group
 * i / group_size is marked in `keep` (all when keep is NULL), descending into vx[k] with their
 * ids in ix[k], ties to the lower index. Insertion into a sorted list of k: C is small
 * (experts), k smaller. At least k experts must be eligible. */
static inline void KN(topk_row)(int *ix, REAL *vx, const REAL *p, const REAL *bias, const unsigned char *keep, int group_size,
                                int C, int k) {
    int n = 0;
    for (int i = 0; i < C; i++) {
        if (keep && !keep[i / group_size]) continue;
        const REAL pi = bias ? p[i] + bias[i] : p[i];
        if (n == k && pi <= vx[k - 1]) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && vx[j - 1] < pi) { vx[j] = vx[j - 1]; ix[j] = ix[j - 1]; j--; }
        vx[j] = pi;
        ix[j] = i;
    }
}

void KN(trill_topk_forward)(int *idx, REAL *val, const REAL *probs, int T, int C, int k) {
#pragma omp parallel for if(parallel: (size_t)T * C >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) KN(topk_row)(idx + (size_t)t * k, val + (size_t)t * k, probs + (size_t)t * C, NULL, NULL, 1, C, k);
}

trill_status KN(trill_router_topk_forward)(int *idx, REAL *val, const REAL *scores, const REAL *bias, int T, int E, int K, int n_group,
                                     int topk_group) {
    if (K < 1 || K > E) return trill_error(TRILL_ERR_INVALID, "router: top-%d of %d experts", K, E);
    const int grouped = n_group > 1, gsize = grouped ? E / n_group : E;
    if (grouped) {
        if (n_group > ROUTER_MAX_GROUPS || E % n_group || gsize < 2)
            return trill_error(TRILL_ERR_INVALID, "router: %d experts cannot form %d groups of 2 or more (at most %d groups)", E,
                               n_group, ROUTER_MAX_GROUPS);
        if (topk_group < 1 || topk_group > n_group || K > topk_group * gsize)
            return trill_error(TRILL_ERR_INVALID, "router: top-%d experts from the best %d of %d groups of %d", K, topk_group,
                               n_group, gsize);
    }
#pragma omp parallel for if(parallel: (size_t)T * E >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *p = scores + (size_t)t * E;
        unsigned char keep[ROUTER_MAX_GROUPS];
        if (grouped) {
            REAL gscore[ROUTER_MAX_GROUPS];
            for (int g = 0; g < n_group; g++) { /* the sum of the group's two best selection scores */
                REAL best = -INFINITY, second = -INFINITY;
                for (int i = g * gsize; i < (g + 1) * gsize; i++) {
                    const REAL si = bias ? p[i] + bias[i] : p[i];
                    if (si > best) second = best, best = si;
                    else if (si > second) second = si;
                }
                gscore[g] = best + second;
            }
            for (int g = 0; g < n_group; g++) { /* kept: fewer than topk_group groups rank above it */
                int above = 0;
                for (int h = 0; h < n_group; h++) above += gscore[h] > gscore[g] || (gscore[h] == gscore[g] && h < g);
                keep[g] = above < topk_group;
            }
        }
        KN(topk_row)(idx + (size_t)t * K, val + (size_t)t * K, p, bias, grouped ? keep : NULL, gsize, E, K);
    }
    return TRILL_OK;
}

void KN(trill_router_gates_forward)(REAL *gates, const REAL *scores, const int *idx, int T, int E, int K, int norm_topk_prob,
                              REAL norm_eps, REAL scaling) {
    for (int t = 0; t < T; t++) {
        const REAL *p = scores + (size_t)t * E;
        REAL *g = gates + (size_t)t * K, sum = 0;
        for (int j = 0; j < K; j++) sum += g[j] = p[idx[(size_t)t * K + j]];
        if (norm_topk_prob) {
            const REAL denominator = sum + norm_eps; /* exactly sum for norm_eps 0 */
            for (int j = 0; j < K; j++) g[j] /= denominator;
        }
        if (scaling != 1)
            for (int j = 0; j < K; j++) g[j] *= scaling;
    }
}

/* gates g_j = c u_j, u_j = p_{i_j} / D with D = sum_k p_{i_k} + eps (normalised) or u_j = p_{i_j},
 * c the scaling: with du_j = c dg_j, dp_{i_j} = (du_j - sum_k du_k u_k) / D (or du_j). */
void KN(trill_router_gates_backward)(REAL *dsel, const REAL *dgates, const REAL *scores, const int *idx, int T, int E, int K,
                               int norm_topk_prob, REAL norm_eps, REAL scaling) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *p = scores + (size_t)t * E, *dg = dgates + (size_t)t * K;
        const int *ix = idx + (size_t)t * K;
        REAL *ds = dsel + (size_t)t * K;
        if (!norm_topk_prob) {
            for (int j = 0; j < K; j++) ds[j] = scaling != 1 ? dg[j] * scaling : dg[j];
            continue;
        }
        REAL sum = 0, dot = 0;
        for (int j = 0; j < K; j++) sum += p[ix[j]];
        const REAL denominator = sum + norm_eps;
        for (int j = 0; j < K; j++) {
            const REAL du = scaling != 1 ? dg[j] * scaling : dg[j];
            dot += du * p[ix[j]] / denominator;
        }
        for (int j = 0; j < K; j++) { /* reads dg[j] before writing ds[j]: they may alias */
            const REAL du = scaling != 1 ? dg[j] * scaling : dg[j];
            ds[j] = (du - dot) / denominator;
        }
    }
}

/* p = softmax(logits), the gradient dp only at the ids: dlogit_e += p_e (dp_e - sum_j p_{i_j} dp_j). */
void KN(trill_router_softmax_backward)(REAL *dlogits, const REAL *dsel, const REAL *probs, const int *idx, int T, int E, int K) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *p = probs + (size_t)t * E, *dp = dsel + (size_t)t * K;
        const int *ix = idx + (size_t)t * K;
        REAL pdp = 0; /* sum_e p_e dp_e over the selected experts */
        for (int j = 0; j < K; j++) pdp += p[ix[j]] * dp[j];
        REAL *dl = dlogits + (size_t)t * E;
        for (int e = 0; e < E; e++) dl[e] -= p[e] * pdp;
        for (int j = 0; j < K; j++) dl[ix[j]] += p[ix[j]] * dp[j];
    }
}

/* s = sigmoid(logit): dlogit = ds s (1 - s), at the ids. */
void KN(trill_router_sigmoid_backward)(REAL *dlogits, const REAL *dsel, const REAL *scores, const int *idx, int T, int E, int K) {
#pragma omp parallel for if(parallel: (size_t)T * K >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *s = scores + (size_t)t * E, *ds = dsel + (size_t)t * K;
        const int *ix = idx + (size_t)t * K;
        REAL *dl = dlogits + (size_t)t * E;
        for (int j = 0; j < K; j++) dl[ix[j]] += ds[j] * s[ix[j]] * (1 - s[ix[j]]);
    }
}

double KN(trill_logsumexp)(const REAL *x, int C) {
    REAL maxv = -INFINITY;
    for (int i = 0; i < C; i++) if (x[i] > maxv) maxv = x[i];
    double sum = 0.0; /* terms in the working precision, double accumulation */
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < C; i++) sum += (double)KN(exp_nonpos)(x[i] - maxv);
    return maxv + log(sum);
}

void KN(trill_token_logprob_forward)(REAL *logprob, const REAL *logits, const int *targets, int T, int V) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *row = logits + (size_t)t * V;
        logprob[t] = (REAL)((double)row[targets[t]] - KN(trill_logsumexp)(row, V));
    }
}

/* logprob = logit[target] - trill_logsumexp(logits): dlogit_v = dlogprob (1[v = target] - softmax_v).
 * Cross-entropy is -logprob: pass dlogprob = -dloss. Writes (not accumulates) dlogits. */
void KN(trill_token_logprob_backward)(REAL *dlogits, const REAL *dlogprob, const REAL *logits, const int *targets, int T, int V) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *row = logits + (size_t)t * V;
        REAL *d = dlogits + (size_t)t * V;
        REAL lse = (REAL)KN(trill_logsumexp)(row, V);
        const REAL g = -dlogprob[t];
#pragma omp simd
        for (int v = 0; v < V; v++) d[v] = g * KN(exp_nonpos)(row[v] - lse);
        d[targets[t]] += dlogprob[t];
    }
}

void KN(trill_embedding_forward)(REAL *out, const REAL *table, const int *tokens, int T, int C) {
#pragma omp parallel for if(parallel: (size_t)T * C >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) memcpy(out + (size_t)t * C, table + (size_t)tokens[t] * C, sizeof(REAL) * C);
}

/* Rows of the table repeat across tokens, so threads split the channels, not the tokens. */
void KN(trill_embedding_backward)(REAL *dtable, const REAL *dout, const int *tokens, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        for (int t = 0; t < T; t++) dtable[(size_t)tokens[t] * C + c] += dout[(size_t)t * C + c];
}

#include "gdn_impl.h" /* the gated delta rule */
