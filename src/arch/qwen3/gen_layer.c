/* The Qwen3 family's part of the generator engine (trill_eng_family, src/infer/engine_internal.h):
 * the Qwen3 / Qwen3-MoE layer forward over a step's rows, the logits, the buffers they need and
 * the KV layout (K and V per kv head).
 *
 * A step's rows are (sequence, position) pairs. Every kernel computes a row on its own with a
 * fixed order of operations (infer/gemm.h is batch-invariant; attention reads the row's own
 * sequence from the cache), so a sequence's results do not depend on its neighbours in the
 * batch. Each row's K/V join its sequence's blocks before attention reads them; MoE rows are
 * grouped per expert (or per physical replica with EPLB) and every row sums its experts in
 * ascending logical id; adapters add their side path after each matrix they target. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch/qwen3/qwen3.h"
#include "base/alloc.h"
#include "infer/engine_internal.h"
#include "kernels/exp_nonpos.h"
#include "trill/kernels.h"

/* Loops fork threads only for this many elements or more (as the kernels do): a decode step's
 * few rows cost less than the fork. */
enum { PARALLEL_MIN = 16384 };

/* ---- what the forward supports, and its buffers ---- */

/* The forward's buffers (trill_engine.fwd), for rows.max rows. */
typedef struct qwen3_gen {
    float *x, *xn, *qkv, *q, *k, *v, *att, *out, *ff, *act, *probs, *topw, *xe, *ye, *logits;
    int *topi, *order, *count;
    int *where;           /* [R*K] position of each (row, slot) pair in order */
    int *phys;            /* EPLB: [R*K] physical slot of each (row, slot) pair */
    float *inv_freq;
    float *scores;        /* per thread: [group][max_context] attention scores */
    int max_context;
    int score_threads;    /* threads the scores are sized for */
    float *lora_xa, *lora_in, *lora_out; /* adapters: x A^T of the stacked parts, one part's, its B product */
    int lora_rank;        /* the rank these are sized for */
    int lora_cols;        /* lora_out's row stride for expert rows */
} qwen3_gen;

static inline qwen3_gen *S(const trill_engine *e) { return e->fwd; }

static trill_status forward_check(const trill_config *c) {
    if (c->head_dim % 8)
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: head_dim %d is not a multiple of 8 (the attention kernel's lanes)", c->head_dim);
    return TRILL_OK;
}

/* The buffers of the forward over e->rows.max rows (the MoE's counts cover every physical slot
 * when EPLB is on, so trill_eng_eplb_start comes first), and RoPE's frequencies. */
static trill_status forward_alloc(trill_engine *e) {
    const trill_config *c = &e->c;
    const size_t R = (size_t)e->rows.max, H = c->hidden_size, hd = c->head_dim;
    const size_t qd = (size_t)c->num_attention_heads * hd, kvd = (size_t)c->num_key_value_heads * hd;
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, E = c->num_experts > 0 ? c->num_experts : 1;
    const size_t I = c->intermediate_size, Im = c->moe_intermediate_size, ffw = I > Im ? I : Im;
    const size_t rows_ff = R * K > R ? R * K : R;
    qwen3_gen *f = trill_calloc(1, sizeof *f);
    if (!f) return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers");
    e->fwd = f;
    float **fl[] = { &f->x, &f->xn, &f->qkv, &f->q, &f->k, &f->v, &f->att, &f->out, &f->ff, &f->act, &f->probs, &f->topw, &f->xe,
                     &f->ye, &f->logits };
    const size_t fn[] = { R * H, R * H, R * (qd + 2 * kvd), R * qd, R * kvd, R * kvd, R * qd, R * H, rows_ff * 2 * ffw, rows_ff * ffw,
                          R * E, R * K, rows_ff * H, rows_ff * H, R * (size_t)c->vocab_size };
    bool ok = true;
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) ok &= (*fl[i] = trill_malloc(fn[i] * sizeof(float))) != NULL;
    f->topi = trill_malloc(R * K * sizeof(int));
    f->order = trill_malloc(R * K * sizeof(int));
    const size_t slots = e->eplb.window ? (size_t)e->eplb.plan.n_physical : E;
    f->count = trill_malloc((slots + 1) * sizeof(int));
    f->where = trill_malloc(R * K * sizeof(int));
    f->phys = trill_malloc(R * K * sizeof(int));
    f->inv_freq = trill_malloc(hd / 2 * sizeof(float));
    f->score_threads = omp_get_max_threads();
    ok &= f->topi && f->order && f->count && f->where && f->phys && f->inv_freq;
    if (!ok) return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers (%d rows)", e->rows.max);
    trill_rope_inv_freq(f->inv_freq, c->head_dim, c->rope_theta);
    e->logits = f->logits;
    return TRILL_OK;
}

static void forward_free(trill_engine *e) {
    qwen3_gen *f = S(e);
    if (!f) return;
    float *fl[] = { f->x, f->xn, f->qkv, f->q, f->k, f->v, f->att, f->out, f->ff, f->act, f->probs, f->topw, f->xe, f->ye, f->logits, f->scores,
                    f->lora_xa, f->lora_in, f->lora_out };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) free(fl[i]);
    free(f->topi); free(f->order); free(f->count); free(f->where); free(f->phys); free(f->inv_freq);
    free(f);
    e->fwd = NULL;
    e->logits = NULL;
}

/* What a token keeps in the cache, per layer: the keys and the values of every kv head. */
static void forward_kv_shape(const trill_config *c, kv_layer_shape *shape) {
    const int kvd = c->num_key_value_heads * c->head_dim;
    for (int l = 0; l < c->num_hidden_layers; l++) shape[l] = (kv_layer_shape){ .k_width = kvd, .v_width = kvd };
}

/* Attention scores for the step's longest context, per thread: for as many threads as the calling
 * thread's parallel regions get (an engine may be stepped from threads with different OpenMP
 * thread counts, as the async generator is). */
static trill_status ensure_scores(trill_engine *e, int R) {
    int need = 1;
    for (int r = 0; r < R; r++) if (e->rows.pos[r] + 1 > need) need = e->rows.pos[r] + 1;
    const int threads = omp_get_max_threads();
    if (threads > S(e)->score_threads) {
        S(e)->score_threads = threads;
        S(e)->max_context = 0; /* sized again below */
    }
    if (need <= S(e)->max_context) return TRILL_OK;
    const int group = e->c.num_attention_heads / e->c.num_key_value_heads;
    float *p = trill_realloc(S(e)->scores, sizeof(float) * (size_t)need * group * S(e)->score_threads);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory for attention over %d positions", need);
    S(e)->scores = p;
    S(e)->max_context = need;
    return TRILL_OK;
}

/* Buffers of the adapter path for rank r: sized for the largest matrix it can meet. */
static trill_status ensure_lora_buffers(trill_engine *e, int r) {
    if (r <= S(e)->lora_rank) return TRILL_OK;
    const trill_config *c = &e->c;
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, R = (size_t)e->rows.max, rows = R * K;
    const size_t qkv = (size_t)(c->num_attention_heads + 2 * c->num_key_value_heads) * c->head_dim;
    size_t cols = qkv;
    const size_t others[] = { (size_t)c->hidden_size, 2 * (size_t)c->intermediate_size, 2 * (size_t)c->moe_intermediate_size };
    for (int i = 0; i < 3; i++) if (others[i] > cols) cols = others[i];
    /* lora_out rows have a fixed stride so row offsets work; lm_head's rows (at most R) are wider */
    size_t out = rows * cols;
    if (R * (size_t)c->vocab_size > out) out = R * (size_t)c->vocab_size;
    /* the new buffers first: when they cannot be had, the adapters in use keep theirs */
    float *xa = trill_malloc(sizeof(float) * rows * 3 * (size_t)r), *in = trill_malloc(sizeof(float) * rows * (size_t)r);
    float *lout = trill_malloc(sizeof(float) * out);
    if (!xa || !in || !lout) {
        free(xa);
        free(in);
        free(lout);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for the adapter path (rank %d)", r);
    }
    free(S(e)->lora_xa);
    free(S(e)->lora_in);
    free(S(e)->lora_out);
    S(e)->lora_xa = xa;
    S(e)->lora_in = in;
    S(e)->lora_out = lout;
    S(e)->lora_cols = (int)cols;
    S(e)->lora_rank = r;
    return TRILL_OK;
}

/* ---- rows, and the adapters' side path ---- */

static void gather_rows(float *dst, const float *src, int rows, int width, int stride, int offset) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * width, src + (size_t)r * stride + offset, sizeof(float) * width);
}

/* y[T, width] += the adapter's side path on input x[T, K] (nothing if the matrix has none).
 * row0: where these rows sit among the step's expert rows, so concurrent callers (EPLB workers)
 * use disjoint parts of the buffers. Fails as trill_gen_matmul (the adapters are fp32: never). */
static trill_status apply_lora(trill_engine *e, const eng_lora *el, float *y, int width, const float *x, int T, int row0) {
    if (el->n_adapted == 0 || T == 0) return TRILL_OK;
    const int r = e->ad->rank, na = el->n_adapted;
    const float s = e->ad->scale;
    float *lxa = S(e)->lora_xa + (size_t)row0 * 3 * r, *lin = S(e)->lora_in + (size_t)row0 * r;
    float *lout = S(e)->lora_out + (size_t)row0 * S(e)->lora_cols;
    trill_status st = trill_gen_matmul(lxa, x, &el->A, T);
    for (int a = 0; a < na && !st; a++) {
        const float *xa = lxa;
        if (na > 1) { /* this part's columns of x A^T, contiguous */
            gather_rows(lin, lxa, T, r, na * r, a * r);
            xa = lin;
        }
        if ((st = trill_gen_matmul(lout, xa, &el->B[a], T))) break;
        const int cols = el->cols[a], col0 = el->col0[a];
#pragma omp parallel for if(parallel: (size_t)T * cols >= PARALLEL_MIN) schedule(static)
        for (int t = 0; t < T; t++) {
            float *yt = y + (size_t)t * width + col0;
            const float *d = lout + (size_t)t * cols;
            for (int j = 0; j < cols; j++) yt[j] += s * d[j];
        }
    }
    return st;
}

/* ---- paged attention ---- */

/* q . k in 8 lanes (lane l sums elements i = l mod 8, in order) reduced by a fixed tree: the same
 * arithmetic for a position whether it is computed alone or among 8 (batch invariance). */
enum { LANE = 8 };

static inline float reduce_lanes(const float *p) {
    return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

/* Element i of a cache row: fp32, or bf16 widened (exact). `half` is a constant at every call
 * site once inlined, so each loop is compiled for one element type. */
static inline __attribute__((always_inline)) float kv_at(const void *row, size_t i, const bool half) {
    return half ? trill_bf16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

static inline __attribute__((always_inline)) float dot_lanes(const float *q, const void *k, int hd, const bool half) {
    float part[LANE] = { 0 };
    for (int i = 0; i < hd; i += LANE)
        for (int l = 0; l < LANE; l++) part[l] += q[i + l] * kv_at(k, (size_t)i + l, half);
    return reduce_lanes(part);
}

/* out[j] = q . k_j for LANE keys k_j = k + j * stride elements: the lanes of all LANE keys stay
 * in registers. */
static inline __attribute__((always_inline)) void dot_lanes8(const float *q, const void *k, size_t stride, int hd, float *out,
                                                             const bool half) {
    float part[LANE][LANE] = { { 0 } };
    for (int i = 0; i < hd; i += LANE)
        for (int j = 0; j < LANE; j++)
            for (int l = 0; l < LANE; l++) part[j][l] += q[i + l] * kv_at(k, j * stride + i + l, half);
    for (int j = 0; j < LANE; j++) out[j] = reduce_lanes(part[j]);
}

/* o[0..W) = sum_j p_j v_j[col .. col+W) over the sequence's cached values, the sum over j in
 * order for every element; W is a compile-time constant at each call, so acc stays in registers
 * while the cache is read once per position. */
static inline __attribute__((always_inline)) void attend_values(const trill_engine *e, const seq *s, int layer, int col, const float *p,
                                                                int n_pos, float *o, const int W, const bool half) {
    const int bs = e->kv.block_size, v_stride = e->kv.shape[layer].v_width;
    float acc[128] = { 0 };
    for (int j0 = 0; j0 < n_pos; j0 += bs) {
        const char *vb = kv_value(&e->kv, s->kv.blocks[j0 / bs], layer, 0);
        const int n = n_pos - j0 < bs ? n_pos - j0 : bs;
        for (int j = 0; j < n; j++) {
            const float w = p[j0 + j];
            const size_t at = (size_t)j * v_stride + (size_t)col;
            for (int l = 0; l < W; l++) acc[l] += w * kv_at(vb, at + (size_t)l, half);
        }
    }
    memcpy(o, acc, sizeof(float) * W);
}

/* One task of the attention: row r and kv head kvh with its group of query heads, so each cached
 * key and value is read once for the group; the cache is walked block by block. sc: the
 * thread's [group][max_context] scores. */
static inline __attribute__((always_inline)) void attend_row_head(const trill_engine *e, int layer, int r, int kvh, float *sc,
                                                                  const bool half) {
    const trill_config *c = &e->c;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim, group = nh / nkv;
    const int bs = e->kv.block_size, k_stride = e->kv.shape[layer].k_width, elem = half ? 2 : 4;
    const float scale = 1.0f / sqrtf((float)hd);
    const seq *s = e->rows.seq[r];
    const int n_pos = e->rows.pos[r] + 1, ctx = S(e)->max_context;
    const float *q = S(e)->q + ((size_t)r * nh + (size_t)kvh * group) * hd;
    for (int j0 = 0; j0 < n_pos; j0 += bs) {
        const char *kb = (const char *)kv_key(&e->kv, s->kv.blocks[j0 / bs], layer, 0) + (size_t)kvh * hd * elem;
        const int n = n_pos - j0 < bs ? n_pos - j0 : bs;
        for (int g = 0; g < group; g++) {
            const float *qg = q + (size_t)g * hd;
            float *sg = sc + (size_t)g * ctx + j0;
            int j = 0;
            for (; j + LANE <= n; j += LANE) dot_lanes8(qg, kb + (size_t)j * k_stride * elem, (size_t)k_stride, hd, sg + j, half);
            for (; j < n; j++) sg[j] = dot_lanes(qg, kb + (size_t)j * k_stride * elem, hd, half);
        }
    }
    for (int g = 0; g < group; g++) { /* softmax over the positions, normalised in place */
        float *sg = sc + (size_t)g * ctx, mx = -INFINITY;
        for (int j = 0; j < n_pos; j++) {
            sg[j] *= scale;
            mx = sg[j] > mx ? sg[j] : mx;
        }
        double sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n_pos; j++) {
            sg[j] = exp_nonpos_f32(sg[j] - mx);
            sum += sg[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < n_pos; j++) sg[j] *= inv;
    }
    for (int g = 0; g < group; g++) {
        const float *pg = sc + (size_t)g * ctx;
        float *o = S(e)->att + ((size_t)r * nh + (size_t)kvh * group + g) * hd;
        /* the common head sizes get a constant width, so the accumulators stay in registers */
        if (hd == 64) attend_values(e, s, layer, kvh * hd, pg, n_pos, o, 64, half);
        else if (hd == 128)
            for (int i0 = 0; i0 < 128; i0 += 64) attend_values(e, s, layer, kvh * hd + i0, pg, n_pos, o + i0, 64, half);
        else
            for (int i0 = 0; i0 < hd; i0 += LANE) attend_values(e, s, layer, kvh * hd + i0, pg, n_pos, o + i0, LANE, half);
    }
}

/* Causal attention of each row over its own sequence's cached keys and values (fp32 or bf16
 * cache: each task is compiled for both and picks by the cache's element size). head_dim must
 * be a multiple of 8 (checked when the engine is made). */
static void paged_attention(trill_engine *e, int layer, int R) {
    const int nkv = e->c.num_key_value_heads, group = e->c.num_attention_heads / nkv;
    const bool half = e->kv.elem == 2;
#pragma omp parallel
    {
        float *sc = S(e)->scores + (size_t)omp_get_thread_num() * S(e)->max_context * group;
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int r = 0; r < R; r++)
            for (int kvh = 0; kvh < nkv; kvh++) {
                if (half) attend_row_head(e, layer, r, kvh, sc, true);
                else attend_row_head(e, layer, r, kvh, sc, false);
            }
    }
}

/* ---- elementwise ---- */

static void swiglu_fused(float *act, const float *gate_up, int rows, int I) {
#pragma omp parallel for if(parallel: (size_t)rows * I >= PARALLEL_MIN) schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *g = gate_up + (size_t)r * 2 * I, *u = g + I;
        float *a = act + (size_t)r * I;
        for (int i = 0; i < I; i++) {
            const float x = g[i], ex = exp_nonpos_f32(-fabsf(x)); /* silu(x) = x sigmoid(x), from exp(-|x|) <= 1 */
            a[i] = x * ((x < 0 ? ex : 1.0f) / (1.0f + ex)) * u[i];
        }
    }
}

static void add_rows(float *x, const float *y, size_t n) {
#pragma omp parallel for if(parallel: n >= PARALLEL_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* ---- MoE ---- */

/* Rows order[first .. first+n) of the step, all routed to logical expert x: gathered, through
 * the expert (and its adapter), into ye at the same positions. Every buffer is indexed by those
 * positions, so workers computing different experts never touch the same memory. Fails as
 * trill_gen_matmul (the message is on the calling thread). */
static trill_status expert_rows(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int x, int first, int n) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    float *xe = S(e)->xe + (size_t)first * H, *ff = S(e)->ff + (size_t)first * 2 * Im, *act = S(e)->act + (size_t)first * Im;
    float *ye = S(e)->ye + (size_t)first * H;
    for (int i = 0; i < n; i++) memcpy(xe + (size_t)i * H, S(e)->xn + (size_t)(S(e)->order[first + i] / K) * H, sizeof(float) * H);
    trill_status st = trill_gen_matmul(ff, xe, &L->experts[QWEN3_EXPERT_GATE][x], n);
    if (!st && A) st = apply_lora(e, &A->experts[QWEN3_EXPERT_GATE][x], ff, 2 * Im, xe, n, first);
    if (st) return st;
    swiglu_fused(act, ff, n, Im);
    st = trill_gen_matmul(ye, act, &L->experts[QWEN3_EXPERT_DOWN][x], n);
    if (!st && A) st = apply_lora(e, &A->experts[QWEN3_EXPERT_DOWN][x], ye, H, act, n, first);
    return st;
}

/* Counting sort of the step's (row, slot) pairs by key[i] in [0, n_keys): order[] lists them
 * grouped by key, count[k] ends group k. */
static void group_by(trill_engine *e, const int *key, int n, int n_keys) {
    memset(S(e)->count, 0, sizeof(int) * (size_t)(n_keys + 1));
    for (int i = 0; i < n; i++) S(e)->count[key[i] + 1]++;
    for (int k = 0; k < n_keys; k++) S(e)->count[k + 1] += S(e)->count[k];
    for (int i = 0; i < n; i++) S(e)->order[S(e)->count[key[i]]++] = i;
}

/* out = sum_k gate_k expert_k(xn) for every row, its experts combined in ascending logical id (as
 * the reference), so the sum is the same whatever the batch, the placement or the worker. */
static void combine_experts(trill_engine *e, int R) {
    const int H = e->c.hidden_size, K = e->c.num_experts_per_tok;
    for (int i = 0; i < R * K; i++) S(e)->where[S(e)->order[i]] = i;
#pragma omp parallel for if(parallel: (size_t)R * K * H >= PARALLEL_MIN) schedule(static)
    for (int r = 0; r < R; r++) {
        int slots[64];
        const int k_used = K < 64 ? K : 64;
        for (int j = 0; j < k_used; j++) { /* insertion sort of the row's slots by expert id */
            int v = r * K + j, at = j;
            while (at > 0 && S(e)->topi[slots[at - 1]] > S(e)->topi[v]) { slots[at] = slots[at - 1]; at--; }
            slots[at] = v;
        }
        float *o = S(e)->out + (size_t)r * H;
        memset(o, 0, sizeof(float) * H);
        for (int j = 0; j < k_used; j++) {
            const float g = S(e)->topw[slots[j]];
            const float *y = S(e)->ye + (size_t)S(e)->where[slots[j]] * H;
            for (int h = 0; h < H; h++) o[h] += g * y[h];
        }
    }
}

/* Router, top-k, capture, the experts, and out = sum_k gate_k expert_k(xn). Without EPLB each
 * expert's rows are one threaded GEMM; with it, rows go to physical replicas and each worker
 * (thread) computes the replicas it holds. */
static trill_status moe(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int ordinal, int R) {
    const trill_config *c = &e->c;
    const int E = c->num_experts, K = c->num_experts_per_tok;
    trill_status st = trill_gen_matmul(S(e)->probs, S(e)->xn, &L->m[QWEN3_ROUTER], R);
    if (st) return st;
    trill_softmax_forward(S(e)->probs, S(e)->probs, R, E);
    trill_topk_forward(S(e)->topi, S(e)->topw, S(e)->probs, R, E, K);
    trill_router_gates_forward(S(e)->topw, S(e)->probs, S(e)->topi, R, E, K, c->norm_topk_prob, 0.0f, 1.0f);
    /* capture and load count the logical ids, before any mapping to physical replicas */
    if (e->cfg.capture_experts)
        for (int r = 0; r < R; r++) {
            seq *s = e->rows.seq[r];
            uint16_t *dst = s->experts + ((size_t)e->rows.pos[r] * c->n_moe_layers + ordinal) * K;
            for (int j = 0; j < K; j++) dst[j] = (uint16_t)S(e)->topi[r * K + j];
        }
    if (e->eplb.window) {
        uint32_t *load = e->eplb.counts + (size_t)ordinal * E;
        for (int i = 0; i < R * K; i++) load[S(e)->topi[i]]++;
        const trill_eplb_plan *plan = &e->eplb.plan;
        for (int i = 0; i < R * K; i++) S(e)->phys[i] = trill_eplb_physical(plan, ordinal, S(e)->topi[i], (uint64_t)i);
        group_by(e, S(e)->phys, R * K, plan->n_physical);
        const int per = plan->n_physical / e->eplb.workers;
        /* a worker's failure leaves its message on its own thread: the first is copied out */
        int failed = 0;
        char message[512] = "";
#pragma omp parallel num_threads(e->eplb.workers)
        {
            const int w = omp_get_thread_num();
            for (int p = w * per; p < (w + 1) * per; p++) {
                const int first = p ? S(e)->count[p - 1] : 0, n = S(e)->count[p] - first;
                if (n > 0 && expert_rows(e, L, A, plan->phy2log[(size_t)ordinal * plan->n_physical + p], first, n)) {
#pragma omp critical(trill_eplb_failure)
                    if (!failed++) snprintf(message, sizeof message, "%s", trill_error_message());
                    break;
                }
            }
        }
        if (failed) return trill_error(TRILL_ERR_NOMEM, "EPLB worker: %s", message);
    } else {
        group_by(e, S(e)->topi, R * K, E);
        for (int x = 0; x < E && !st; x++) {
            const int first = x ? S(e)->count[x - 1] : 0, n = S(e)->count[x] - first;
            if (n > 0) st = expert_rows(e, L, A, x, first, n);
        }
        if (st) return st;
    }
    combine_experts(e, R);
    return TRILL_OK;
}

/* ---- the layers ---- */

/* Layer l's attention on xn: out = o(attention(rope(norm(q)), rope(norm(k)), v)), the rows' own
 * keys and values joining the cache before anyone reads. */
static trill_status attention_block(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int l, int R) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kvd = nkv * hd, width = qd + 2 * kvd;
    const float eps = (float)c->rms_norm_eps;
    trill_status st = trill_gen_matmul(S(e)->qkv, S(e)->xn, &L->m[QWEN3_Q], R);
    if (!st && A) st = apply_lora(e, &A->m[QWEN3_Q], S(e)->qkv, width, S(e)->xn, R, 0);
    if (st) return st;
    gather_rows(S(e)->q, S(e)->qkv, R, qd, width, 0);
    gather_rows(S(e)->k, S(e)->qkv, R, kvd, width, qd);
    gather_rows(S(e)->v, S(e)->qkv, R, kvd, width, qd + kvd);
    trill_rmsnorm_forward(S(e)->q, S(e)->q, L->vec[QWEN3_Q_NORM], R * nh, hd, eps);
    trill_rmsnorm_forward(S(e)->k, S(e)->k, L->vec[QWEN3_K_NORM], R * nkv, hd, eps);
    trill_rope_forward(S(e)->q, e->rows.pos, S(e)->inv_freq, R, nh, hd);
    trill_rope_forward(S(e)->k, e->rows.pos, S(e)->inv_freq, R, nkv, hd);
    for (int r = 0; r < R; r++) {
        const seq *s = e->rows.seq[r];
        const int p = e->rows.pos[r], b = s->kv.blocks[p / e->kv.block_size], slot = p % e->kv.block_size;
        trill_from_f32(kv_key(&e->kv, b, l, slot), S(e)->k + (size_t)r * kvd, e->kv.elem == 4 ? TRILL_F32 : TRILL_BF16, (size_t)kvd);
        trill_from_f32(kv_value(&e->kv, b, l, slot), S(e)->v + (size_t)r * kvd, e->kv.elem == 4 ? TRILL_F32 : TRILL_BF16, (size_t)kvd);
    }
    paged_attention(e, l, R);
    st = trill_gen_matmul(S(e)->out, S(e)->att, &L->m[QWEN3_O], R);
    if (!st && A) st = apply_lora(e, &A->m[QWEN3_O], S(e)->out, H, S(e)->att, R, 0);
    return st;
}

/* A dense layer's MLP on xn: out = down(silu(gate) * up). */
static trill_status dense_mlp(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int R) {
    const int H = e->c.hidden_size, I = e->c.intermediate_size;
    trill_status st = trill_gen_matmul(S(e)->ff, S(e)->xn, &L->m[QWEN3_GATE], R);
    if (!st && A) st = apply_lora(e, &A->m[QWEN3_GATE], S(e)->ff, 2 * I, S(e)->xn, R, 0);
    if (st) return st;
    swiglu_fused(S(e)->act, S(e)->ff, R, I);
    st = trill_gen_matmul(S(e)->out, S(e)->act, &L->m[QWEN3_DOWN], R);
    if (!st && A) st = apply_lora(e, &A->m[QWEN3_DOWN], S(e)->out, H, S(e)->act, R, 0);
    return st;
}

static trill_status forward_rows(trill_engine *e, int R) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size;
    const float eps = (float)c->rms_norm_eps;
    const eng_weights *w = e->w;
    if (w->embed_f32) trill_embedding_forward(S(e)->x, w->embed_f32, e->rows.token, R, H);
    else trill_embedding_forward_w(S(e)->x, (trill_weight){ NULL, w->embed_bf16 }, e->rows.token, R, H);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const eng_layer *L = &w->layers[l];
        const eng_lora_layer *A = e->ad ? &e->ad->layers[l] : NULL;
        trill_rmsnorm_forward(S(e)->xn, S(e)->x, L->vec[QWEN3_INPUT_NORM], R, H, eps);
        trill_status st = attention_block(e, L, A, l, R);
        if (st) return st;
        add_rows(S(e)->x, S(e)->out, (size_t)R * H);
        trill_rmsnorm_forward(S(e)->xn, S(e)->x, L->vec[QWEN3_POST_NORM], R, H, eps);
        st = trill_config_is_moe(c, l) ? moe(e, L, A, c->moe_ordinal[l], R) : dense_mlp(e, L, A, R);
        if (st) return st;
        add_rows(S(e)->x, S(e)->out, (size_t)R * H);
    }
    return TRILL_OK;
}

/* The final norm, lm_head and its adapter over the rows listed in rows.logit. */
static trill_status forward_logits(trill_engine *e, int n) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, V = c->vocab_size;
    for (int i = 0; i < n; i++) memcpy(S(e)->xn + (size_t)i * H, S(e)->x + (size_t)e->rows.logit[i] * H, sizeof(float) * H);
    trill_rmsnorm_forward(S(e)->xn, S(e)->xn, e->w->global.vec[QWEN3_FINAL_NORM], n, H, (float)c->rms_norm_eps);
    trill_status st = trill_gen_matmul(S(e)->logits, S(e)->xn, &e->w->global.m[QWEN3_LM_HEAD], n);
    if (!st && e->ad) st = apply_lora(e, &e->ad->global.m[QWEN3_LM_HEAD], S(e)->logits, V, S(e)->xn, n, 0);
    return st;
}

const trill_eng_family trill_qwen3_gen = {
    .check = forward_check,
    .kv_shape = forward_kv_shape,
    .alloc = forward_alloc,
    .free = forward_free,
    .ensure_scores = ensure_scores,
    .ensure_lora_buffers = ensure_lora_buffers,
    .rows = forward_rows,
    .logits = forward_logits,
};
