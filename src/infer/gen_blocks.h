/* Building blocks of the generator's decoder layer (src/infer/gen_decoder.c, gen_mla.c): the
 * adapters' side path, SwiGLU on a fused gate|up, a MoE layer's routed experts once the router
 * has chosen (capture, EPLB, grouping, the expert GEMMs, the batch-invariant combine), the
 * attention scores' per-thread buffers and the dot products in fixed lanes that keep attention
 * batch-invariant. Internal to the engine. */
#ifndef TRILL_INFER_GEN_BLOCKS_H
#define TRILL_INFER_GEN_BLOCKS_H

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "infer/engine_internal.h"
#include "kernels/exp_nonpos.h"

/* Loops fork threads only for this many elements or more (as the kernels do): a decode step's
 * few rows cost less than the fork. */
enum { PARALLEL_MIN = 16384 };

/* ---- the adapters' side path ---- */

/* Its buffer: x A^T of a matrix's stacked parts, [rows][3 r] (a matrix has at most 3 parts). */
typedef struct gen_lora_buf {
    float *xa;
    int rank;    /* the rank it is sized for */
    size_t rows; /* and the rows */
} gen_lora_buf;

/* Sized for rank r (the largest in use) and `rows` rows (a step's rows times its experts per row); the buffer in use
 * stays when a new one cannot be had (TRILL_ERR_NOMEM). */
trill_status trill_gen_lora_buf_ensure(gen_lora_buf *b, int r, size_t rows);
void trill_gen_lora_buf_free(gen_lora_buf *b);

/* Where a product's rows sit among the step's: x row i is step row idx[i] / div (idx NULL: row
 * i), whose adapter slot is e->rows.slot of it; div 0: rows that are not the step's (an
 * expert-parallel rank's served rows), all on slot 0, the engine's own adapter. */
typedef struct gen_rowmap { const int *idx; int div; } gen_rowmap;
#define GEN_STEP_ROWS ((gen_rowmap){ NULL, 1 })
#define GEN_SLOT0_ROWS ((gen_rowmap){ NULL, 0 })
/* The adapter slot of row i of a product placed by m. */
int trill_gen_row_slot(const trill_engine *e, gen_rowmap m, int i);
/* Whether any adapter is set (the engine's own or a slot's). */
bool trill_gen_any_adapter(const trill_engine *e);

/* trill_gen_matmul_many, the products' FLOPs counted to the engine's profile. */
trill_status trill_gen_products(const trill_engine *e, const gen_product *list, int n);
/* y[T, W.N] = x[T, W.K] W^T, plus the side path of each row's adapter (its slot's matrix at
 * layout entry `at`, trill_engine.layout; at NULL, or no adapter there: none): the base product
 * and the shrinks x A^T (a matrix's parts' A stacked: one product for all of q/k/v; one per run
 * of rows of one slot) in one parallel region, then every part's expand added straight into its
 * columns of y, y = fmaf(scale, (x A_p^T) B_p^T, y), in a second. Each row's result is what it
 * is alone with its adapter. row0: where these rows sit among the step's expert rows, so
 * concurrent callers (EPLB workers) use disjoint rows of the buffer. Fails as trill_gen_matmul. */
trill_status trill_gen_linear(const trill_engine *e, gen_lora_buf *b, const gen_matrix *W, const eng_lora *at, gen_rowmap m, float *y,
                              const float *x, int T, int row0);

/* The calling thread's list for n products (grown as needed, not kept across calls); NULL when
 * out of memory. */
gen_product *trill_gen_product_list(size_t n);

/* ---- elementwise ---- */

/* act[rows, I] = silu(gate) * up of rows [gate | up] of 2 I. */
void trill_gen_swiglu_fused(float *act, const float *gate_up, int rows, int I);
/* x[n] += y */
void trill_gen_add_rows(float *x, const float *y, size_t n);
/* dst[rows, width] = columns offset .. offset+width of src[rows, stride] */
void trill_gen_gather_rows(float *dst, const float *src, int rows, int width, int stride, int offset);

/* ---- the model's ends ---- */

/* x[R, H] = the embeddings of the step's rows' tokens, in the engine's format. */
void trill_gen_embed(const trill_engine *e, float *x, int R);
/* logits[n, V] of the n rows listed in rows.logit: their x rows gathered into xn, the final norm
 * (the global vector of role norm_role), lm_head (the global matrix of head_role) and its adapter. */
trill_status trill_gen_logits(const trill_engine *e, gen_lora_buf *lb, const float *x, float *xn, float *logits, int norm_role,
                              int head_role, int n);

/* ---- the routed experts of a MoE layer ---- */

/* A MoE layer's buffers for R rows of K slots: the router's choice (topi, topw [R*K]) and what
 * the experts need: order, count (every physical slot + 1), where and phys [R*K], the gathered
 * rows xe and outputs ye [R*K, H], fused gate|up ff [R*K, 2 Im], act [R*K, Im]. */
typedef struct gen_moe {
    int *topi, *order, *count, *where, *phys;
    float *topw, *xe, *ff, *act, *ye;
} gen_moe;

/* The routed experts of a layer: the fused gate|up and the down projection's roles, whether they
 * have biases (the layer's vec[TRILL_ROLE_EXPERT_*_BIAS], [E, width] each) and their activation
 * (trill_expert_act, src/arch/decoder.h: SwiGLU, or the clamped one with limit and alpha). */
typedef struct gen_expert_roles {
    int gate_up, down;
    bool bias;
    int act;
    float limit, alpha;
} gen_expert_roles;

/* After the router filled b->topi / b->topw for rows [0, R) of xn [R, H]: capture (logical ids,
 * MoE ordinal), EPLB's load counts and placement, the experts (grouped per expert, or per
 * physical replica on the EPLB workers), and out[R, H] = sum_k topw * expert_k(xn) with every
 * row's experts summed in ascending logical id, whatever the batch, placement or worker. */
trill_status trill_gen_moe_experts(trill_engine *e, gen_moe *b, gen_lora_buf *lb, const float *xn, float *out, const eng_layer *L,
                                   const eng_lora_layer *A, gen_expert_roles roles, int ordinal, int R); /* A: the layout's layer */

/* ---- attention ---- */

/* Per-thread attention scores: [group][max_context] floats for each of `threads` threads. */
typedef struct gen_scores {
    float *p;
    int max_context, threads;
} gen_scores;

/* Sized for rows [0, R)'s longest context and as many threads as the calling thread's parallel
 * regions get (an engine may be stepped from threads of different OpenMP thread counts). */
trill_status trill_gen_scores_ensure(const trill_engine *e, gen_scores *s, int R, int group);

/* q . k in 8 lanes (lane l sums elements i = l mod 8, in order) reduced by a fixed tree: the same
 * arithmetic for a position whether it is computed alone or among 8 (batch invariance). */
enum { LANE = 8 };

static inline float gen_reduce_lanes(const float *p) {
    return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

/* Element i of a cache row: fp32, or bf16 widened (exact). `half` is a constant at every call
 * site once inlined, so each loop is compiled for one element type. */
static inline __attribute__((always_inline)) float gen_kv_at(const void *row, size_t i, const bool half) {
    return half ? trill_bf16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

/* Prefetches `bytes` from each of n rows `stride` apart (a head's slice of a cache block). */
static inline void gen_prefetch_rows(const char *p, int n, size_t stride, size_t bytes) {
    for (int j = 0; j < n; j++)
        for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + (size_t)j * stride + b);
}

/* 16 floats, and the 16 bf16 or floats of a cache row read as them (GCC's vector extensions:
 * AVX-512 one register, AVX2 two). */
typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));

/* *acc += w *v, one rounding per element (fmaf's): explicit, so no build or ISA rounds it
 * otherwise. (Pointers, not vector arguments: a 64-byte vector passed by value is an ABI
 * question GCC warns about where AVX-512 is off.) */
static inline __attribute__((always_inline)) void v16_fma(v16f *acc, float w, const v16f *v) {
#if defined(__AVX512F__)
    _mm512_storeu_ps((float *)acc, _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps((const float *)v), _mm512_loadu_ps((const float *)acc)));
#elif defined(__FMA__)
    for (int h = 0; h < 16; h += 8)
        _mm256_storeu_ps((float *)acc + h, _mm256_fmadd_ps(_mm256_set1_ps(w), _mm256_loadu_ps((const float *)v + h), _mm256_loadu_ps((const float *)acc + h)));
#else
    for (int l = 0; l < 16; l++) (*acc)[l] = fmaf(w, (*v)[l], (*acc)[l]);
#endif
}

/* 16 elements of a cache row from element i: fp32, or bf16 widened (exact). */
static inline __attribute__((always_inline)) void v16_at(v16f *out, const char *row, size_t i, const bool half) {
    if (half) {
        v16h h;
        memcpy(&h, row + 2 * i, sizeof h);
        const v16u u = __builtin_convertvector(h, v16u) << 16;
        memcpy(out, &u, sizeof *out);
    } else {
        memcpy(out, row + 4 * i, sizeof *out);
    }
}

enum { GEN_QK_MAX = 1024 }; /* the widest key gen_qk_group takes: GQA head_dim, MLA kv_lora_rank + rope */

#if defined(__AVX2__) && defined(__FMA__)
/* gen_reduce_lanes of a register: ((p0 + p4) + (p1 + p5)) + ((p2 + p6) + (p3 + p7)). */
static inline float gen_reduce8(__m256 p) {
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps(p, 1)); /* p_l + p_{l+4} */
    const __m128 u = _mm_add_ps(t, _mm_shuffle_ps(t, t, _MM_SHUFFLE(2, 3, 0, 1)));        /* t0 + t1, ., t2 + t3, . */
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehl_ps(u, u)));
}
#endif

/* out[g * out_stride] = q_g . k for the G query heads q_g = q + g hd of one cached key (hd a
 * multiple of 8 up to GEN_QK_MAX), each the same way: 8 lanes, each summing its elements of the
 * head's chunks of 8 in order, every step one fused multiply-add, then gen_reduce_lanes' tree.
 * The key is widened once (bf16) for the G heads. */
static inline __attribute__((always_inline)) void gen_qk_group(const float *q, int G, int hd, const char *key, const bool half, float *out,
                                                               size_t out_stride) {
    float kf[GEN_QK_MAX] __attribute__((aligned(32)));
    const float *k = (const float *)key;
    if (half) {
        for (int i = 0; i < hd; i++) kf[i] = trill_bf16_to_f32(((const uint16_t *)key)[i]);
        k = kf;
    }
#if defined(__AVX2__) && defined(__FMA__)
    for (int g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * hd;
        __m256 part = _mm256_mul_ps(_mm256_loadu_ps(qg), _mm256_loadu_ps(k)); /* = fma(q, k, 0) */
        for (int i = 8; i < hd; i += 8) part = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i), _mm256_loadu_ps(k + i), part);
        out[(size_t)g * out_stride] = gen_reduce8(part);
    }
#else
    for (int g = 0; g < G; g++) {
        const float *qg = q + (size_t)g * hd;
        float part[LANE] = { 0 };
        for (int i = 0; i < hd; i += LANE)
            for (int l = 0; l < LANE; l++) part[l] = fmaf(qg[i + l], k[i + l], part[l]);
        out[(size_t)g * out_stride] = gen_reduce_lanes(part);
    }
#endif
}

/* gen_qk_group over n consecutive cached keys (key_stride bytes apart) into out[g * out_stride + j]:
 * the same sums, GEN_QK_KEYS keys at a time so their chains of fused multiply-adds (each key's
 * own, in the same order) are in flight together instead of one waiting on the last's latency. */
enum { GEN_QK_KEYS = 4 };
static inline __attribute__((always_inline)) void gen_qk_keys(const float *q, int G, int hd, const char *key, size_t key_stride, int n,
                                                              const bool half, float *out, size_t out_stride) {
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; j + GEN_QK_KEYS <= n; j += GEN_QK_KEYS) {
        float kf[GEN_QK_KEYS][GEN_QK_MAX] __attribute__((aligned(32)));
        const float *k[GEN_QK_KEYS];
        for (int p = 0; p < GEN_QK_KEYS; p++) {
            const char *kp = key + (size_t)(j + p) * key_stride;
            k[p] = (const float *)kp;
            if (half) {
                for (int i = 0; i < hd; i++) kf[p][i] = trill_bf16_to_f32(((const uint16_t *)kp)[i]);
                k[p] = kf[p];
            }
        }
        for (int g = 0; g < G; g++) {
            const float *qg = q + (size_t)g * hd;
            const __m256 q0 = _mm256_loadu_ps(qg);
            __m256 part[GEN_QK_KEYS];
            for (int p = 0; p < GEN_QK_KEYS; p++) part[p] = _mm256_mul_ps(q0, _mm256_loadu_ps(k[p])); /* = fma(q, k, 0) */
            for (int i = 8; i < hd; i += 8) {
                const __m256 qi = _mm256_loadu_ps(qg + i);
                for (int p = 0; p < GEN_QK_KEYS; p++) part[p] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k[p] + i), part[p]);
            }
            for (int p = 0; p < GEN_QK_KEYS; p++) out[(size_t)g * out_stride + j + p] = gen_reduce8(part[p]);
        }
    }
#endif
    for (; j < n; j++) gen_qk_group(q, G, hd, key + (size_t)j * key_stride, half, out + j, out_stride);
}

/* o_g[0..64) = sum_j p_g[j] row_j[col .. col + 64) for G heads at once (p_g = p + g p_stride,
 * o_g = o + g o_stride, G <= 4 a compile-time constant at each call) over a sequence's cached
 * rows first .. n_pos - 1 (layer's values, or its keys when !values: MLA's latents), row_stride
 * elements apart; with ends, head g's rows first .. ends[g] - 1 (ends[g] <= n_pos: the rows of
 * one sequence's consecutive positions, read once for them all): every element summed over j in order, each step an explicit fused multiply-add,
 * the accumulators in registers, each row read once for the G heads and the next block's rows
 * prefetched. */
static inline __attribute__((always_inline)) void gen_weighted_rows_64(const kv_cache *kc, const kv_table *t, int layer, const bool values,
                                                                       int row_stride, int col, const float *p, size_t p_stride, int first,
                                                                       int n_pos, const int *ends, float *o, size_t o_stride, const int G,
                                                                       const bool half) {
    const int bs = kc->block_size;
    const size_t elem = half ? 2 : 4;
    v16f acc[4][4] = { { { 0 } } }; /* [head][16-column part] */
    int common = n_pos; /* the rows every head sums */
    for (int g = 0; ends && g < G; g++) common = ends[g] < common ? ends[g] : common;
    for (int j0 = first - first % bs; j0 < n_pos; j0 += bs) {
        const char *vb = values ? kv_value(kc, t->blocks[j0 / bs], layer, 0) : kv_key(kc, t->blocks[j0 / bs], layer, 0);
        const int n = n_pos - j0 < bs ? n_pos - j0 : bs;
        if (j0 + bs < n_pos) {
            const int b = t->blocks[j0 / bs + 1];
            gen_prefetch_rows((const char *)(values ? kv_value(kc, b, layer, 0) : kv_key(kc, b, layer, 0)) + (size_t)col * elem,
                              n_pos - j0 - bs < bs ? n_pos - j0 - bs : bs, (size_t)row_stride * elem, 64 * elem);
        }
        for (int j = j0 < first ? first - j0 : 0; j < n; j++) {
            const size_t at = (size_t)j * row_stride + (size_t)col;
            v16f v[4];
            for (int c = 0; c < 4; c++) v16_at(&v[c], vb, at + 16 * (size_t)c, half);
            for (int g = 0; g < G; g++) {
                if (j0 + j >= common && (!ends || j0 + j >= ends[g])) continue; /* past head g's own rows */
                const float w = p[(size_t)g * p_stride + j0 + j];
                for (int c = 0; c < 4; c++) v16_fma(&acc[g][c], w, &v[c]);
            }
        }
    }
    for (int g = 0; g < G; g++) memcpy(o + (size_t)g * o_stride, acc[g], sizeof acc[g]);
}

/* gen_weighted_rows_64's sums for one head and 8 columns (widths that are no multiple of 64). */
static inline __attribute__((always_inline)) void gen_weighted_rows_8(const kv_cache *kc, const kv_table *t, int layer, const bool values,
                                                                      int row_stride, int col, const float *p, int first, int n_pos, float *o,
                                                                      const bool half) {
    const int bs = kc->block_size;
    float acc[LANE] = { 0 };
    for (int j0 = first - first % bs; j0 < n_pos; j0 += bs) {
        const char *vb = values ? kv_value(kc, t->blocks[j0 / bs], layer, 0) : kv_key(kc, t->blocks[j0 / bs], layer, 0);
        const int n = n_pos - j0 < bs ? n_pos - j0 : bs;
        for (int j = j0 < first ? first - j0 : 0; j < n; j++) {
            const size_t at = (size_t)j * row_stride + (size_t)col;
            for (int l = 0; l < LANE; l++) acc[l] = fmaf(p[j0 + j], gen_kv_at(vb, at + (size_t)l, half), acc[l]);
        }
    }
    memcpy(o, acc, sizeof acc);
}

/* Heads per gen_weighted_rows_64 pass: its accumulators (4 registers a head with AVX-512's 32, 8
 * of AVX2's 16). */
#ifdef __AVX512F__
enum { GEN_ROWS_HEADS = 4 };
#else
enum { GEN_ROWS_HEADS = 2 };
#endif

static inline int gen_max_end(const int *ends, int n) {
    int m = ends[0];
    for (int i = 1; i < n; i++) m = ends[i] > m ? ends[i] : m;
    return m;
}

/* The attention's output for G heads: head g's o + g o_stride [0, width) = sum_j p_g[j]
 * row_j[col0 .. col0 + width) (p_g = p + g p_stride; j from first to n_pos - 1, or to ends[g] - 1
 * with ends), 64 columns for up to GEN_ROWS_HEADS heads a
 * pass when width is a multiple of 64, else 8 columns of one head; the same sums either way. */
static inline __attribute__((always_inline)) void gen_weighted_heads(const kv_cache *kc, const kv_table *t, int layer, const bool values,
                                                                     int row_stride, int col0, int width, const float *p, size_t p_stride,
                                                                     int first, int n_pos, const int *ends, float *o, size_t o_stride, int G,
                                                                     const bool half) {
    if (width % 64) {
        for (int g = 0; g < G; g++)
            for (int i0 = 0; i0 < width; i0 += LANE)
                gen_weighted_rows_8(kc, t, layer, values, row_stride, col0 + i0, p + (size_t)g * p_stride, first, ends ? ends[g] : n_pos,
                                    o + (size_t)g * o_stride + i0, half);
        return;
    }
    for (int i0 = 0; i0 < width; i0 += 64)
        for (int g = 0; g < G;) {
            const int left = G - g, col = col0 + i0;
            const float *pg = p + (size_t)g * p_stride;
            const int pass = left >= 4 && GEN_ROWS_HEADS >= 4 ? 4 : left >= 2 ? 2 : 1;
            const int *eg = ends ? ends + g : NULL, np = ends ? gen_max_end(eg, pass) : n_pos;
            float *og = o + (size_t)g * o_stride + i0;
            if (pass == 4) gen_weighted_rows_64(kc, t, layer, values, row_stride, col, pg, p_stride, first, np, eg, og, o_stride, 4, half);
            else if (pass == 2) gen_weighted_rows_64(kc, t, layer, values, row_stride, col, pg, p_stride, first, np, eg, og, o_stride, 2, half);
            else gen_weighted_rows_64(kc, t, layer, values, row_stride, col, pg, p_stride, first, np, eg, og, o_stride, 1, half);
            g += pass;
        }
}

/* Softmax of n scores sg[0..n) times scale, normalised in place (exp of non-positive values in
 * fp32, the sum in double); a sink logit other than -INFINITY joins the denominator only
 * (gpt-oss's attention sinks). Inlined into each attention task: the vectorised sum's order is the
 * caller's compiled loop's, which batch invariance and the golden records hold fixed. */
static inline __attribute__((always_inline)) void gen_softmax_scores(float *sg, int n, float scale, float sink) {
    float mx = sink;
    for (int j = 0; j < n; j++) {
        sg[j] *= scale;
        mx = sg[j] > mx ? sg[j] : mx;
    }
    double sum = sink == -INFINITY ? 0 : exp_nonpos_f32(sink - mx);
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        sg[j] = exp_nonpos_f32(sg[j] - mx);
        sum += sg[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < n; j++) sg[j] *= inv;
}

#endif
