/* The DeepSeek-V3 family's part of the generator engine (trill_eng_family,
 * src/infer/engine_internal.h): MLA with a compressed KV cache and the absorbed attention, the
 * sigmoid router with its correction bias and groups, shared experts beside the routed ones.
 *
 * The cache keeps, per token per layer, kv_a_layernorm(latent) and the rotated rope key:
 * kv_lora_rank + qk_rope_head_dim values, not per-head keys and values. Attention never forms
 * those: with kv_b_proj's rows of head h split into W_uk (k_nope = W_uk c) and W_uv (v = W_uv c),
 * q_nope . k_nope = (W_uk^T q_nope) . c, so each head's query is absorbed into the latent space,
 * [W_uk^T q_nope | q_rope], and scores one cache row [c | k_rope]; its output is W_uv applied to
 * the probability-weighted sum of the latents. The per-head W_uk^T and W_uv are derived from
 * kv_b_proj when the weights are built (derive_weights); an adapter on kv_b_proj adds its own
 * rank-r side paths per head (derive_adapter), so the absorbed path computes what kv_b_proj with
 * its adapter would. Every row is computed on
 * its own in a fixed order (batch invariance, as the Qwen3 layer). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "arch/deepseek_v3/deepseek.h"
#include "base/alloc.h"
#include "infer/engine_internal.h"
#include "infer/gen_blocks.h"
#include "trill/kernels.h"

/* The layers' heads slots: W_uk^T [kv_lora_rank, nope] and W_uv [v, kv_lora_rank] per head. */
enum { HEAD_UK_T = 0, HEAD_UV = 1 };

/* The forward's buffers (trill_engine.fwd), for rows.max rows. */
typedef struct deepseek_gen {
    float *x, *xn;      /* [R, H] */
    float *qkva;        /* [R, q_a (or q) + kv_lora_rank + rope]: the fused q_a|kv_a (q|kv_a) output */
    float *qa;          /* [R, q_lora_rank] q_a_layernorm of q_a's */
    float *q;           /* [R, nh*qk] */
    float *ckv;         /* [R, kv_lora_rank + rope] the cache rows: normed latent | rotated rope key */
    float *qabs;        /* [R, nh*(kv_lora_rank + rope)] absorbed queries */
    float *olat;        /* [R, nh*kv_lora_rank] attention output in the latent space */
    float *att;         /* [R, nh*v] */
    float *out, *shared;/* [R, H] */
    float *scores, *sel;/* [R, E] router scores; [R, K] their selection values */
    float *logits;      /* [R, V] */
    gen_moe moe;        /* routed experts (moe.ff / moe.act also serve the dense and shared MLPs) */
    float *inv_freq;
    float rope_scale, softmax_scale;
    gen_scores att_scores; /* per thread: [heads of a task][max_context] */
    gen_lora_buf lora;
    float *head_u;      /* [R, nh * rank] the absorbed attention adapter's shrinks */
    int head_u_rank;
} deepseek_gen;

/* Query heads per attention task: a task reads its row's cache once for them. */
enum { HEADS_PER_TASK = 4 };

static inline deepseek_gen *S(const trill_engine *e) { return e->fwd; }

static int q_width(const trill_config *c) {
    return c->q_lora_rank ? c->q_lora_rank : c->num_attention_heads * (c->qk_nope_head_dim + c->qk_rope_head_dim);
}

static trill_status forward_check(const trill_config *c) {
    if (c->kv_lora_rank % 8 || c->qk_rope_head_dim % 8)
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: kv_lora_rank %d and qk_rope_head_dim %d must be multiples of 8 (the attention kernel's lanes)",
                           c->kv_lora_rank, c->qk_rope_head_dim);
    if (c->num_experts_per_tok > 64) return trill_error(TRILL_ERR_UNSUPPORTED, "engine: num_experts_per_tok %d is more than 64", c->num_experts_per_tok);
    return TRILL_OK;
}

/* The widest SwiGLU a row goes through (dense, shared or one routed expert). */
static size_t widest_mlp(const trill_config *c) {
    size_t w = (size_t)c->intermediate_size, sh = (size_t)c->moe_intermediate_size * c->n_shared_experts;
    if (sh > w) w = sh;
    return (size_t)c->moe_intermediate_size > w ? (size_t)c->moe_intermediate_size : w;
}

static trill_status forward_alloc(trill_engine *e) {
    const trill_config *c = &e->c;
    const size_t R = (size_t)e->rows.max, H = c->hidden_size, nh = c->num_attention_heads, dn = c->qk_nope_head_dim;
    const size_t dr = c->qk_rope_head_dim, dv = c->v_head_dim, kl = c->kv_lora_rank, qk = dn + dr;
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, E = c->num_experts > 0 ? c->num_experts : 1;
    const size_t RK = R * K, ff = widest_mlp(c);
    deepseek_gen *f = trill_calloc(1, sizeof *f);
    if (!f) return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers");
    e->fwd = f;
    float **fl[] = { &f->x, &f->xn, &f->qkva, &f->qa, &f->q, &f->ckv, &f->qabs, &f->olat, &f->att, &f->out,
                     &f->shared, &f->scores, &f->sel, &f->logits, &f->moe.topw, &f->moe.xe, &f->moe.ye, &f->moe.ff, &f->moe.act };
    const size_t rows_ff = RK > R ? RK : R;
    const size_t fn[] = { R * H, R * H, R * ((size_t)q_width(c) + kl + dr), R * (size_t)(c->q_lora_rank ? c->q_lora_rank : 1), R * nh * qk,
                          R * (kl + dr), R * nh * (kl + dr), R * nh * kl, R * nh * dv, R * H, R * H, R * E, R * K,
                          R * (size_t)c->vocab_size, RK, RK * H, RK * H, rows_ff * 2 * ff, rows_ff * ff };
    bool ok = true;
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) ok &= (*fl[i] = trill_malloc(fn[i] * sizeof(float))) != NULL;
    const size_t slots = e->eplb.window ? (size_t)e->eplb.plan.n_physical : E;
    int **il[] = { &f->moe.topi, &f->moe.order, &f->moe.where, &f->moe.phys, &f->moe.count };
    const size_t in[] = { RK, RK, RK, RK, slots + 1 };
    for (size_t i = 0; i < sizeof il / sizeof il[0]; i++) ok &= (*il[i] = trill_malloc(in[i] * sizeof(int))) != NULL;
    ok &= (f->inv_freq = trill_malloc(dr / 2 * sizeof(float))) != NULL;
    f->att_scores.threads = omp_get_max_threads();
    if (!ok) return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers (%d rows)", e->rows.max);
    trill_deepseek_rope(c, f->inv_freq, &f->rope_scale, &f->softmax_scale);
    e->logits = f->logits;
    return TRILL_OK;
}

static void forward_free(trill_engine *e) {
    deepseek_gen *f = S(e);
    if (!f) return;
    float *fl[] = { f->x, f->xn, f->qkva, f->qa, f->q, f->ckv, f->qabs, f->olat, f->att, f->out, f->shared,
                    f->scores, f->sel, f->logits, f->moe.topw, f->moe.xe, f->moe.ye, f->moe.ff, f->moe.act, f->inv_freq, f->att_scores.p };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) free(fl[i]);
    free(f->moe.topi); free(f->moe.order); free(f->moe.where); free(f->moe.phys); free(f->moe.count);
    trill_gen_lora_buf_free(&f->lora);
    free(f->head_u);
    free(f);
    e->fwd = NULL;
    e->logits = NULL;
}

/* What a token keeps in the cache, per layer: one row of kv_lora_rank + rope values. */
static void forward_kv_shape(const trill_config *c, kv_layer_shape *shape) {
    for (int l = 0; l < c->num_hidden_layers; l++) shape[l] = (kv_layer_shape){ .k_width = c->kv_lora_rank + c->qk_rope_head_dim, .v_width = 0 };
}

static trill_status ensure_scores(trill_engine *e, int R) {
    const int nh = e->c.num_attention_heads;
    return trill_gen_scores_ensure(e, &S(e)->att_scores, R, nh < HEADS_PER_TASK ? nh : HEADS_PER_TASK);
}

static trill_status ensure_lora_buffers(trill_engine *e, int r) {
    const size_t K = e->c.num_experts_per_tok > 0 ? e->c.num_experts_per_tok : 1;
    deepseek_gen *f = S(e);
    if (r > f->head_u_rank) {
        float *u = trill_malloc(sizeof(float) * (size_t)e->rows.max * e->c.num_attention_heads * r);
        if (!u) return trill_error(TRILL_ERR_NOMEM, "out of memory for the absorbed attention's adapter path (rank %d)", r);
        free(f->head_u);
        f->head_u = u;
        f->head_u_rank = r;
    }
    return trill_gen_lora_buf_ensure(&f->lora, r, (size_t)e->rows.max * K);
}

/* ---- derived matrices: the absorbed kv_b_proj ---- */

/* Element (i, j) of a [rows, cols] weight in either storage, as fp32 (bf16 widened: exact). */
static float weight_at(const trill_param *t, size_t i, size_t j) {
    const size_t at = i * (size_t)t->shape[1] + j;
    return t->data ? t->data[at] : trill_bf16_to_f32(t->bf16[at]);
}

/* The kv_b_proj tensor of layer l. */
static const trill_param *kv_b_of(const trill_param *t, size_t n, int l) {
    for (size_t i = 0; i < n; i++)
        if (t[i].layer == l && t[i].role == DS_KV_B) return &t[i];
    return NULL;
}

/* Per head, in format f from the weight's values (widened bf16 values are exact, so a bf16 model
 * keeps them in bf16): W_uk^T [kl, nope] and W_uv [v, kl]. */
static trill_status derive_head(gen_matrix *ukT, gen_matrix *uv, trill_gen_format f, const trill_config *c, const trill_param *kvb,
                                int h, float *buf) {
    const int dn = c->qk_nope_head_dim, dv = c->v_head_dim, kl = c->kv_lora_rank;
    const size_t row0 = (size_t)h * (dn + dv);
    for (int j = 0; j < kl; j++)
        for (int i = 0; i < dn; i++) buf[(size_t)j * dn + i] = weight_at(kvb, row0 + i, j);
    trill_status st = trill_gen_matrix_create(ukT, f, buf, NULL, kl, dn);
    if (st) return st;
    for (int i = 0; i < dv; i++)
        for (int j = 0; j < kl; j++) buf[(size_t)i * kl + j] = weight_at(kvb, row0 + dn + i, j);
    return trill_gen_matrix_create(uv, f, buf, NULL, dv, kl);
}

static trill_status derive_weights(const trill_config *c, trill_gen_format f, const trill_model *m, eng_weights *w) {
    const int nh = c->num_attention_heads, dn = c->qk_nope_head_dim, dv = c->v_head_dim, kl = c->kv_lora_rank;
    float *buf = trill_malloc(sizeof(float) * (size_t)kl * (dn > dv ? dn : dv));
    if (!buf) return trill_error(TRILL_ERR_NOMEM, "out of memory deriving the absorbed attention");
    trill_status st = TRILL_OK;
    for (int l = 0; l < c->num_hidden_layers && !st; l++) {
        eng_layer *L = &w->layers[l];
        const trill_param *kvb = kv_b_of(m->tensors, m->n_tensors, l);
        if (!kvb) { st = trill_error(TRILL_ERR_INVALID, "engine: layer %d has no kv_b_proj", l); break; }
        if (!(L->heads[HEAD_UK_T] = trill_calloc((size_t)nh, sizeof(gen_matrix))) || !(L->heads[HEAD_UV] = trill_calloc((size_t)nh, sizeof(gen_matrix)))) {
            st = trill_error(TRILL_ERR_NOMEM, "out of memory deriving the absorbed attention");
            break;
        }
        for (int h = 0; h < nh && !st; h++) {
            st = derive_head(&L->heads[HEAD_UK_T][h], &L->heads[HEAD_UV][h], f, c, kvb, h, buf);
            if (!st) w->bytes += L->heads[HEAD_UK_T][h].bytes + L->heads[HEAD_UV][h].bytes;
        }
        w->bytes -= L->m[DS_KV_B].bytes; /* the absorbed path does not read kv_b_proj itself */
        trill_gen_matrix_free(&L->m[DS_KV_B]);
    }
    free(buf);
    return st;
}

/* An adapter on kv_b_proj (A [r, kl], B [nh (nope + v), r]) as the absorbed path's rank-r side
 * paths, never formed as dense per-head matrices: the absorbed query gains scale A^T (B_uk,h^T
 * q_nope) (shrink per head: B_uk,h^T [r, nope]; expand shared: A^T [kl, r]) and the value
 * scale B_uv,h (A o_h) (shrink shared: A; expand per head: B_uv,h [v, r]). In the adapter format. */
static trill_status derive_adapter_layer(eng_lora_layer *L, const trill_config *c, const trill_lora_pair *p, int r, trill_gen_format f,
                                         float *buf, size_t *resident) {
    const int nh = c->num_attention_heads, dn = c->qk_nope_head_dim, dv = c->v_head_dim, kl = c->kv_lora_rank;
    eng_head_lora *uk = &L->heads[HEAD_UK_T], *uv = &L->heads[HEAD_UV];
    uk->shrink_per_head = uv->expand_per_head = 1;
    if (!(uk->shrink = trill_calloc((size_t)nh, sizeof(gen_matrix))) || !(uk->expand = trill_calloc(1, sizeof(gen_matrix))) ||
        !(uv->shrink = trill_calloc(1, sizeof(gen_matrix))) || !(uv->expand = trill_calloc((size_t)nh, sizeof(gen_matrix))))
        return trill_error(TRILL_ERR_NOMEM, "out of memory deriving the absorbed attention's adapter");
    for (int j = 0; j < kl; j++)
        for (int k = 0; k < r; k++) buf[(size_t)j * r + k] = p->A[(size_t)k * kl + j];
    trill_status st = trill_gen_matrix_create(uk->expand, f, buf, NULL, kl, r);
    if (!st) st = trill_gen_matrix_create(uv->shrink, f, p->A, NULL, r, kl);
    if (!st) *resident += uk->expand->bytes + uv->shrink->bytes;
    for (int h = 0; h < nh && !st; h++) {
        const size_t row0 = (size_t)h * (dn + dv);
        for (int k = 0; k < r; k++)
            for (int i = 0; i < dn; i++) buf[(size_t)k * dn + i] = p->B[(row0 + i) * r + k];
        st = trill_gen_matrix_create(&uk->shrink[h], f, buf, NULL, r, dn);
        if (!st) st = trill_gen_matrix_create(&uv->expand[h], f, p->B + (row0 + dn) * r, NULL, dv, r);
        if (!st) *resident += uk->shrink[h].bytes + uv->expand[h].bytes;
    }
    return st;
}

static trill_status derive_adapter(const trill_engine *e, const trill_lora *lora, eng_adapter *ad) {
    const trill_config *c = &e->c;
    const int dn = c->qk_nope_head_dim, kl = c->kv_lora_rank, r = lora->config.rank;
    float *buf = trill_malloc(sizeof(float) * (size_t)r * (kl > dn ? kl : dn));
    if (!buf) return trill_error(TRILL_ERR_NOMEM, "out of memory deriving the absorbed attention's adapter");
    trill_status st = TRILL_OK;
    for (int l = 0; l < c->num_hidden_layers && !st; l++) {
        const trill_lora_pair *p = &((const deepseek_lora_layer *)trill_lora_layer(lora, l))->kv_b;
        if (p->A) st = derive_adapter_layer(&ad->layers[l], c, p, r, ad->format, buf, &ad->resident);
    }
    free(buf);
    return st;
}

/* ---- absorbed attention over the latent cache ---- */

/* One task: row r, query heads h0 .. h0+n of it, reading the row's cache once for them. sc: the
 * thread's [HEADS_PER_TASK][max_context] scores. */
static inline __attribute__((always_inline)) void attend_heads(const trill_engine *e, int layer, int r, int h0, int n_heads, float *sc,
                                                               const bool half) {
    const trill_config *c = &e->c;
    const int nh = c->num_attention_heads, kl = c->kv_lora_rank, w = kl + c->qk_rope_head_dim;
    const int bs = e->kv.block_size, elem = half ? 2 : 4, ctx = S(e)->att_scores.max_context;
    const seq *s = e->rows.seq[r];
    const int n_pos = e->rows.pos[r] + 1;
    for (int j0 = 0; j0 < n_pos; j0 += bs) {
        const char *kb = kv_key(&e->kv, s->kv.blocks[j0 / bs], layer, 0);
        const int n = n_pos - j0 < bs ? n_pos - j0 : bs;
        for (int g = 0; g < n_heads; g++) {
            const float *qg = S(e)->qabs + ((size_t)r * nh + h0 + g) * w;
            float *sg = sc + (size_t)g * ctx + j0;
            int j = 0;
            for (; j + LANE <= n; j += LANE) gen_dot_lanes8(qg, kb + (size_t)j * w * elem, (size_t)w, w, sg + j, half);
            for (; j < n; j++) sg[j] = gen_dot_lanes(qg, kb + (size_t)j * w * elem, w, half);
        }
    }
    for (int g = 0; g < n_heads; g++) gen_softmax_scores(sc + (size_t)g * ctx, n_pos, S(e)->softmax_scale);
    for (int g = 0; g < n_heads; g++) { /* the latents weighted, 64 (or 8) columns at a time in registers */
        const float *pg = sc + (size_t)g * ctx;
        float *o = S(e)->olat + ((size_t)r * nh + h0 + g) * kl;
        const int W = kl % 64 == 0 ? 64 : LANE;
        for (int i0 = 0; i0 < kl; i0 += W) {
            float acc[64] = { 0 };
            for (int j0 = 0; j0 < n_pos; j0 += bs) {
                const char *kb = kv_key(&e->kv, s->kv.blocks[j0 / bs], layer, 0);
                const int n = n_pos - j0 < bs ? n_pos - j0 : bs;
                for (int j = 0; j < n; j++) {
                    const float p = pg[j0 + j];
                    const size_t at = (size_t)j * w + i0;
                    if (W == 64)
                        for (int l = 0; l < 64; l++) acc[l] += p * gen_kv_at(kb, at + l, half);
                    else
                        for (int l = 0; l < LANE; l++) acc[l] += p * gen_kv_at(kb, at + l, half);
                }
            }
            memcpy(o + i0, acc, sizeof(float) * W);
        }
    }
}

static void latent_attention(trill_engine *e, int layer, int R) {
    const int nh = e->c.num_attention_heads, per = nh < HEADS_PER_TASK ? nh : HEADS_PER_TASK, tasks = (nh + per - 1) / per;
    const bool half = e->kv.elem == 2;
#pragma omp parallel
    {
        float *sc = S(e)->att_scores.p + (size_t)omp_get_thread_num() * S(e)->att_scores.max_context * per;
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int r = 0; r < R; r++)
            for (int t = 0; t < tasks; t++) {
                const int h0 = t * per, n = nh - h0 < per ? nh - h0 : per;
                if (half) attend_heads(e, layer, r, h0, n, sc, true);
                else attend_heads(e, layer, r, h0, n, sc, false);
            }
    }
}

/* ---- the layers ---- */

/* q [R, nh*qk] and the cache rows ckv [R, kl + rope] from xn, both rotated; the rows join the
 * cache. */
static trill_status project(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int l, int R) {
    const trill_config *c = &e->c;
    deepseek_gen *f = S(e);
    const int nh = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, kl = c->kv_lora_rank;
    const int qw = q_width(c), width = qw + kl + dr, ql = c->q_lora_rank, qk = dn + dr, pairing = c->rope_interleave ? ROPE_ADJACENT : ROPE_ROTATE_HALF;
    const float eps = (float)c->rms_norm_eps;
    const int role = ql ? DS_Q_A : DS_Q;
    trill_status st = trill_gen_linear(e, &f->lora, &L->m[role], &A->m[role], GEN_STEP_ROWS, f->qkva, f->xn, R, 0);
    if (st) return st;
    if (ql) {
        trill_gen_gather_rows(f->qa, f->qkva, R, ql, width, 0);
        trill_rmsnorm_forward(f->qa, f->qa, L->vec[DS_Q_A_NORM], R, ql, eps);
        if ((st = trill_gen_linear(e, &f->lora, &L->m[DS_Q_B], &A->m[DS_Q_B], GEN_STEP_ROWS, f->q, f->qa, R, 0))) return st;
    } else {
        trill_gen_gather_rows(f->q, f->qkva, R, nh * qk, width, 0);
    }
    trill_gen_gather_rows(f->ckv, f->qkva, R, kl + dr, width, qw);
    for (int r = 0; r < R; r++) trill_rmsnorm_forward(f->ckv + (size_t)r * (kl + dr), f->ckv + (size_t)r * (kl + dr), L->vec[DS_KV_A_NORM], 1, kl, eps);
    trill_rope_partial_forward(f->q, e->rows.pos, f->inv_freq, R, nh, qk, dn, dr, pairing, f->rope_scale);
    trill_rope_partial_forward(f->ckv, e->rows.pos, f->inv_freq, R, 1, kl + dr, kl, dr, pairing, f->rope_scale);
    for (int r = 0; r < R; r++) {
        const seq *s = e->rows.seq[r];
        const int p = e->rows.pos[r], b = s->kv.blocks[p / e->kv.block_size], slot = p % e->kv.block_size;
        trill_from_f32(kv_key(&e->kv, b, l, slot), f->ckv + (size_t)r * (kl + dr), e->kv.elem == 4 ? TRILL_F32 : TRILL_BF16, (size_t)(kl + dr));
    }
    return TRILL_OK;
}

/* Every head's matrix of mats[nh] on its columns of x (row stride ldi, head h from column h *
 * in_w) into its columns of y (row stride ldo, from column h * out_w), with each row's adapter's
 * side path (at: the layout's entry; a run of rows per adapter slot): its shrinks into
 * f->head_u [R, nh r] in the same batch, then its expands added into y, y = fmaf(scale, ., y),
 * in a second. */
static trill_status per_head(const trill_engine *e, const gen_matrix *mats, const eng_head_lora *at, float *y, size_t ldo, int out_w,
                             const float *x, size_t ldi, int in_w, int R) {
    const int nh = e->c.num_attention_heads;
    const bool sides = trill_gen_any_adapter(e);
    gen_product *list = trill_gen_product_list((size_t)nh * (1 + (sides ? 2 * (e->rows.mixed ? (size_t)R : 1) : 0)));
    if (!list) return trill_error(TRILL_ERR_NOMEM, "out of memory for the list of %d heads' products", nh);
    for (int h = 0; h < nh; h++)
        list[h] = (gen_product){ .out = y + (size_t)h * out_w, .ldo = ldo, .inp = x + (size_t)h * in_w, .ldi = ldi, .W = &mats[h], .T = R };
    if (!sides) return trill_gen_matmul_many(list, nh);
    int n = nh, n_expand = 0;
    gen_product *expand = list + nh + (size_t)nh * (e->rows.mixed ? R : 1);
    for (int i0 = 0, i1; i0 < R; i0 = i1) {
        const int slot = trill_gen_row_slot(e, GEN_STEP_ROWS, i0);
        for (i1 = i0 + 1; i1 < R && trill_gen_row_slot(e, GEN_STEP_ROWS, i1) == slot; i1++) {}
        const eng_adapter *ad = trill_eng_slot_adapter(e, slot);
        const eng_head_lora *side = ad ? &ad->layers[at->layer].heads[at->slot] : NULL;
        if (!side || !side->shrink) continue;
        const int r = ad->rank;
        float *u = S(e)->head_u + (size_t)i0 * nh * S(e)->head_u_rank;
        for (int h = 0; h < nh; h++) {
            list[n++] = (gen_product){ .out = u + (size_t)h * r, .ldo = (size_t)nh * r, .inp = x + (size_t)i0 * ldi + (size_t)h * in_w, .ldi = ldi,
                                       .W = side->shrink + (side->shrink_per_head ? h : 0), .T = i1 - i0 };
            expand[n_expand++] = (gen_product){ .out = y + (size_t)i0 * ldo + (size_t)h * out_w, .ldo = ldo, .inp = u + (size_t)h * r,
                                                .ldi = (size_t)nh * r, .W = side->expand + (side->expand_per_head ? h : 0), .T = i1 - i0,
                                                .accumulate = 1, .scale = ad->scale };
        }
    }
    trill_status st = trill_gen_matmul_many(list, n);
    if (st || !n_expand) return st;
    return trill_gen_matmul_many(expand, n_expand);
}

/* qabs: each head's [W_uk^T q_nope (+ its adapter) | q_rope]. */
static trill_status absorb_queries(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int R) {
    const trill_config *c = &e->c;
    deepseek_gen *f = S(e);
    const int nh = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, kl = c->kv_lora_rank, qk = dn + dr;
    trill_status st = per_head(e, L->heads[HEAD_UK_T], &A->heads[HEAD_UK_T], f->qabs, (size_t)nh * (kl + dr), kl + dr, f->q,
                               (size_t)nh * qk, qk, R);
    if (st) return st;
    for (int r = 0; r < R; r++)
        for (int h = 0; h < nh; h++)
            memcpy(f->qabs + ((size_t)r * nh + h) * (kl + dr) + kl, f->q + (size_t)r * nh * qk + (size_t)h * qk + dn, sizeof(float) * dr);
    return TRILL_OK;
}

/* att: each head's W_uv (+ its adapter) applied to its latent output. */
static trill_status expand_values(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int R) {
    const trill_config *c = &e->c;
    deepseek_gen *f = S(e);
    const int nh = c->num_attention_heads, dv = c->v_head_dim, kl = c->kv_lora_rank;
    return per_head(e, L->heads[HEAD_UV], &A->heads[HEAD_UV], f->att, (size_t)nh * dv, dv, f->olat, (size_t)nh * kl, kl, R);
}

/* Layer l's MLA on xn: out = o_proj(attention). */
static trill_status attention_block(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int l, int R) {
    deepseek_gen *f = S(e);
    trill_status st = project(e, L, A, l, R);
    if (!st) st = absorb_queries(e, L, A, R);
    if (st) return st;
    latent_attention(e, l, R);
    if ((st = expand_values(e, L, A, R))) return st;
    return trill_gen_linear(e, &f->lora, &L->m[DS_O], &A->m[DS_O], GEN_STEP_ROWS, f->out, f->att, R, 0);
}

/* out[R, H] = down(silu(gate) * up) of xn, gate|up fused under role gu, width I. */
static trill_status mlp(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int gu, int down, float *out, int R, int I) {
    deepseek_gen *f = S(e);
    trill_status st = trill_gen_linear(e, &f->lora, &L->m[gu], &A->m[gu], GEN_STEP_ROWS, f->moe.ff, f->xn, R, 0);
    if (st) return st;
    trill_gen_swiglu_fused(f->moe.act, f->moe.ff, R, I);
    return trill_gen_linear(e, &f->lora, &L->m[down], &A->m[down], GEN_STEP_ROWS, out, f->moe.act, R, 0);
}

/* Sigmoid scores, group-limited top-k on scores + correction bias, gates from the unbiased
 * scores; the routed experts (src/infer/gen_blocks.c), then the shared experts added. */
static trill_status moe(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int ordinal, int R) {
    const trill_config *c = &e->c;
    deepseek_gen *f = S(e);
    const int E = c->num_experts, K = c->num_experts_per_tok;
    trill_status st = trill_gen_matmul(f->scores, f->xn, &L->m[DS_ROUTER], R);
    if (st) return st;
    trill_sigmoid_forward(f->scores, f->scores, (size_t)R * E);
    if ((st = trill_router_topk_forward(f->moe.topi, f->sel, f->scores, L->vec[DS_ROUTER_BIAS], R, E, K, c->n_group, c->topk_group))) return st;
    trill_router_gates_forward(f->moe.topw, f->scores, f->moe.topi, R, E, K, c->norm_topk_prob, 1e-20f, (float)c->routed_scaling_factor);
    const gen_expert_roles roles = { DS_EXPERT_GATE, DS_EXPERT_DOWN };
    if ((st = trill_gen_moe_experts(e, &f->moe, &f->lora, f->xn, f->out, L, A, roles, ordinal, R))) return st;
    if (c->n_shared_experts == 0) return TRILL_OK;
    if ((st = mlp(e, L, A, DS_SHARED_GATE, DS_SHARED_DOWN, f->shared, R, c->moe_intermediate_size * c->n_shared_experts))) return st;
    trill_gen_add_rows(f->out, f->shared, (size_t)R * c->hidden_size);
    return TRILL_OK;
}

static trill_status forward_rows(trill_engine *e, int R) {
    const trill_config *c = &e->c;
    deepseek_gen *f = S(e);
    const int H = c->hidden_size;
    const float eps = (float)c->rms_norm_eps;
    const eng_weights *w = e->w;
    trill_gen_embed(e, f->x, R);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const eng_layer *L = &w->layers[l];
        const eng_lora_layer *A = &e->layout->layers[l]; /* the adapters' layout: each row's slot picks its own */
        trill_rmsnorm_forward(f->xn, f->x, L->vec[DS_INPUT_NORM], R, H, eps);
        trill_status st = attention_block(e, L, A, l, R);
        if (st) return st;
        trill_gen_add_rows(f->x, f->out, (size_t)R * H);
        trill_rmsnorm_forward(f->xn, f->x, L->vec[DS_POST_NORM], R, H, eps);
        st = trill_config_is_moe(c, l) ? moe(e, L, A, c->moe_ordinal[l], R) : mlp(e, L, A, DS_GATE, DS_DOWN, f->out, R, c->intermediate_size);
        if (st) return st;
        trill_gen_add_rows(f->x, f->out, (size_t)R * H);
    }
    return TRILL_OK;
}

/* The final norm, lm_head and its adapter over the rows listed in rows.logit. */
static trill_status forward_logits(trill_engine *e, int n) {
    return trill_gen_logits(e, &S(e)->lora, S(e)->x, S(e)->xn, S(e)->logits, DS_FINAL_NORM, DS_LM_HEAD, n);
}

const trill_eng_family trill_deepseek_gen = {
    .check = forward_check,
    .kv_shape = forward_kv_shape,
    .alloc = forward_alloc,
    .free = forward_free,
    .ensure_scores = ensure_scores,
    .ensure_lora_buffers = ensure_lora_buffers,
    .rows = forward_rows,
    .logits = forward_logits,
    .derive_weights = derive_weights,
    .derive_adapter = derive_adapter,
};
