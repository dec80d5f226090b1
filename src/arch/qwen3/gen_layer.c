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
#include "infer/gen_blocks.h"
#include "trill/kernels.h"

/* ---- what the forward supports, and its buffers ---- */

/* The forward's buffers (trill_engine.fwd), for rows.max rows. */
typedef struct qwen3_gen {
    float *x, *xn, *qkv, *q, *k, *v, *att, *out, *probs, *logits;
    gen_moe moe;          /* the routed experts' (moe.ff / moe.act also serve the dense MLP) */
    float *inv_freq;
    gen_scores scores;    /* per thread: [group][max_context] attention scores */
    gen_lora_buf lora;    /* the adapters' side path */
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
    float **fl[] = { &f->x, &f->xn, &f->qkv, &f->q, &f->k, &f->v, &f->att, &f->out, &f->moe.ff, &f->moe.act, &f->probs, &f->moe.topw,
                     &f->moe.xe, &f->moe.ye, &f->logits };
    const size_t fn[] = { R * H, R * H, R * (qd + 2 * kvd), R * qd, R * kvd, R * kvd, R * qd, R * H, rows_ff * 2 * ffw, rows_ff * ffw,
                          R * E, R * K, rows_ff * H, rows_ff * H, R * (size_t)c->vocab_size };
    bool ok = true;
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) ok &= (*fl[i] = trill_malloc(fn[i] * sizeof(float))) != NULL;
    f->moe.topi = trill_malloc(R * K * sizeof(int));
    f->moe.order = trill_malloc(R * K * sizeof(int));
    const size_t slots = e->eplb.window ? (size_t)e->eplb.plan.n_physical : E;
    f->moe.count = trill_malloc((slots + 1) * sizeof(int));
    f->moe.where = trill_malloc(R * K * sizeof(int));
    f->moe.phys = trill_malloc(R * K * sizeof(int));
    f->inv_freq = trill_malloc(hd / 2 * sizeof(float));
    f->scores.threads = omp_get_max_threads();
    ok &= f->moe.topi && f->moe.order && f->moe.count && f->moe.where && f->moe.phys && f->inv_freq;
    if (!ok) return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers (%d rows)", e->rows.max);
    trill_rope_inv_freq(f->inv_freq, c->head_dim, c->rope_theta);
    e->logits = f->logits;
    return TRILL_OK;
}

static void forward_free(trill_engine *e) {
    qwen3_gen *f = S(e);
    if (!f) return;
    float *fl[] = { f->x, f->xn, f->qkv, f->q, f->k, f->v, f->att, f->out, f->moe.ff, f->moe.act, f->probs, f->moe.topw, f->moe.xe,
                    f->moe.ye, f->logits, f->scores.p };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) free(fl[i]);
    free(f->moe.topi); free(f->moe.order); free(f->moe.count); free(f->moe.where); free(f->moe.phys); free(f->inv_freq);
    trill_gen_lora_buf_free(&f->lora);
    free(f);
    e->fwd = NULL;
    e->logits = NULL;
}

/* What a token keeps in the cache, per layer: the keys and the values of every kv head. */
static void forward_kv_shape(const trill_config *c, kv_layer_shape *shape) {
    const int kvd = c->num_key_value_heads * c->head_dim;
    for (int l = 0; l < c->num_hidden_layers; l++) shape[l] = (kv_layer_shape){ .k_width = kvd, .v_width = kvd };
}

/* Attention scores for the step's longest context, per thread, a group of query heads each. */
static trill_status ensure_scores(trill_engine *e, int R) {
    return trill_gen_scores_ensure(e, &S(e)->scores, R, e->c.num_attention_heads / e->c.num_key_value_heads);
}

/* The adapter path's buffer for rank r: a shrink row for each of a step's rows and expert slots. */
static trill_status ensure_lora_buffers(trill_engine *e, int r) {
    const size_t K = e->c.num_experts_per_tok > 0 ? e->c.num_experts_per_tok : 1;
    return trill_gen_lora_buf_ensure(&S(e)->lora, r, (size_t)e->rows.max * K);
}

/* ---- paged attention ---- */

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
            for (int l = 0; l < W; l++) acc[l] += w * gen_kv_at(vb, at + (size_t)l, half);
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
    const int n_pos = e->rows.pos[r] + 1, ctx = S(e)->scores.max_context;
    const float *q = S(e)->q + ((size_t)r * nh + (size_t)kvh * group) * hd;
    for (int j0 = 0; j0 < n_pos; j0 += bs) {
        const char *kb = (const char *)kv_key(&e->kv, s->kv.blocks[j0 / bs], layer, 0) + (size_t)kvh * hd * elem;
        const int n = n_pos - j0 < bs ? n_pos - j0 : bs;
        for (int g = 0; g < group; g++) {
            const float *qg = q + (size_t)g * hd;
            float *sg = sc + (size_t)g * ctx + j0;
            int j = 0;
            for (; j + LANE <= n; j += LANE) gen_dot_lanes8(qg, kb + (size_t)j * k_stride * elem, (size_t)k_stride, hd, sg + j, half);
            for (; j < n; j++) sg[j] = gen_dot_lanes(qg, kb + (size_t)j * k_stride * elem, hd, half);
        }
    }
    for (int g = 0; g < group; g++) gen_softmax_scores(sc + (size_t)g * ctx, n_pos, scale); /* normalised in place */
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
        float *sc = S(e)->scores.p + (size_t)omp_get_thread_num() * S(e)->scores.max_context * group;
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int r = 0; r < R; r++)
            for (int kvh = 0; kvh < nkv; kvh++) {
                if (half) attend_row_head(e, layer, r, kvh, sc, true);
                else attend_row_head(e, layer, r, kvh, sc, false);
            }
    }
}

/* ---- MoE ---- */

/* Router, top-k and gates, then the routed experts (src/infer/gen_blocks.c). */
static trill_status moe(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int ordinal, int R) {
    const trill_config *c = &e->c;
    const int E = c->num_experts, K = c->num_experts_per_tok;
    gen_moe *b = &S(e)->moe;
    trill_status st = trill_gen_matmul(S(e)->probs, S(e)->xn, &L->m[QWEN3_ROUTER], R);
    if (st) return st;
    trill_softmax_forward(S(e)->probs, S(e)->probs, R, E);
    trill_topk_forward(b->topi, b->topw, S(e)->probs, R, E, K);
    trill_router_gates_forward(b->topw, S(e)->probs, b->topi, R, E, K, c->norm_topk_prob, 0.0f, 1.0f);
    const gen_expert_roles roles = { QWEN3_EXPERT_GATE, QWEN3_EXPERT_DOWN };
    return trill_gen_moe_experts(e, b, &S(e)->lora, S(e)->xn, S(e)->out, L, A, roles, ordinal, R);
}

/* ---- the layers ---- */

/* Layer l's attention on xn: out = o(attention(rope(norm(q)), rope(norm(k)), v)), the rows' own
 * keys and values joining the cache before anyone reads. */
static trill_status attention_block(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int l, int R) {
    const trill_config *c = &e->c;
    const int hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kvd = nkv * hd, width = qd + 2 * kvd;
    const float eps = (float)c->rms_norm_eps;
    trill_status st = trill_gen_linear(e, &S(e)->lora, &L->m[QWEN3_Q], &A->m[QWEN3_Q], GEN_STEP_ROWS, S(e)->qkv, S(e)->xn, R, 0);
    if (st) return st;
    trill_gen_gather_rows(S(e)->q, S(e)->qkv, R, qd, width, 0);
    trill_gen_gather_rows(S(e)->k, S(e)->qkv, R, kvd, width, qd);
    trill_gen_gather_rows(S(e)->v, S(e)->qkv, R, kvd, width, qd + kvd);
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
    return trill_gen_linear(e, &S(e)->lora, &L->m[QWEN3_O], &A->m[QWEN3_O], GEN_STEP_ROWS, S(e)->out, S(e)->att, R, 0);
}

/* A dense layer's MLP on xn: out = down(silu(gate) * up). */
static trill_status dense_mlp(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int R) {
    const int I = e->c.intermediate_size;
    trill_status st = trill_gen_linear(e, &S(e)->lora, &L->m[QWEN3_GATE], &A->m[QWEN3_GATE], GEN_STEP_ROWS, S(e)->moe.ff, S(e)->xn, R, 0);
    if (st) return st;
    trill_gen_swiglu_fused(S(e)->moe.act, S(e)->moe.ff, R, I);
    return trill_gen_linear(e, &S(e)->lora, &L->m[QWEN3_DOWN], &A->m[QWEN3_DOWN], GEN_STEP_ROWS, S(e)->out, S(e)->moe.act, R, 0);
}

static trill_status forward_rows(trill_engine *e, int R) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size;
    const float eps = (float)c->rms_norm_eps;
    const eng_weights *w = e->w;
    trill_gen_embed(e, S(e)->x, R);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const eng_layer *L = &w->layers[l];
        const eng_lora_layer *A = &e->layout->layers[l]; /* the adapters' layout: each row's slot picks its own */
        trill_rmsnorm_forward(S(e)->xn, S(e)->x, L->vec[QWEN3_INPUT_NORM], R, H, eps);
        trill_status st = attention_block(e, L, A, l, R);
        if (st) return st;
        trill_gen_add_rows(S(e)->x, S(e)->out, (size_t)R * H);
        trill_rmsnorm_forward(S(e)->xn, S(e)->x, L->vec[QWEN3_POST_NORM], R, H, eps);
        st = trill_config_is_moe(c, l) ? moe(e, L, A, c->moe_ordinal[l], R) : dense_mlp(e, L, A, R);
        if (st) return st;
        trill_gen_add_rows(S(e)->x, S(e)->out, (size_t)R * H);
    }
    return TRILL_OK;
}

/* The final norm, lm_head and its adapter over the rows listed in rows.logit. */
static trill_status forward_logits(trill_engine *e, int n) {
    return trill_gen_logits(e, &S(e)->lora, S(e)->x, S(e)->xn, S(e)->logits, QWEN3_FINAL_NORM, QWEN3_LM_HEAD, n);
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
