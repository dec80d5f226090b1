/* MLA in the generator (src/infer/gen_decoder.h): a compressed KV cache and the absorbed
 * attention (DeepSeek-V3, Kimi K2).
 *
 * The cache keeps, per token per layer, kv_a_layernorm(latent) and the rotated rope key:
 * kv_lora_rank + qk_rope_head_dim values, not per-head keys and values. Attention never forms
 * those: with kv_b_proj's rows of head h split into W_uk (k_nope = W_uk c) and W_uv (v = W_uv c),
 * q_nope . k_nope = (W_uk^T q_nope) . c, so each head's query is absorbed into the latent space,
 * [W_uk^T q_nope | q_rope], and scores one cache row [c | k_rope]; its output is W_uv applied to
 * the probability-weighted sum of the latents. The per-head W_uk^T and W_uv are derived from
 * kv_b_proj when the weights are built (derive_weights); an adapter on kv_b_proj adds its own
 * rank-r side paths per head (derive_adapter), so the absorbed path computes what kv_b_proj with
 * its adapter would. Every row is computed on its own in a fixed order (batch invariance). */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "base/alloc.h"
#include "infer/gen_decoder.h"
#include "trill/kernels.h"

/* The layers' heads slots: W_uk^T [kv_lora_rank, nope] and W_uv [v, kv_lora_rank] per head. */
enum { HEAD_UK_T = 0, HEAD_UV = 1 };

int trill_gen_mla_q_width(const trill_config *c) {
    return c->q_lora_rank ? c->q_lora_rank : c->num_attention_heads * (c->qk_nope_head_dim + c->qk_rope_head_dim);
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
        if (t[i].layer == l && t[i].role == TRILL_ROLE_KV_B) return &t[i];
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

trill_status trill_gen_mla_derive_weights(const trill_config *c, trill_gen_format f, const trill_model *m, eng_weights *w) {
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
        w->bytes -= L->m[TRILL_ROLE_KV_B].bytes; /* the absorbed path does not read kv_b_proj itself */
        trill_gen_matrix_free(&L->m[TRILL_ROLE_KV_B]);
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

trill_status trill_gen_mla_derive_adapter(const trill_engine *e, const trill_lora *lora, eng_adapter *ad) {
    const trill_config *c = &e->c;
    const int dn = c->qk_nope_head_dim, kl = c->kv_lora_rank, r = lora->config.rank;
    float *buf = trill_malloc(sizeof(float) * (size_t)r * (kl > dn ? kl : dn));
    if (!buf) return trill_error(TRILL_ERR_NOMEM, "out of memory deriving the absorbed attention's adapter");
    trill_status st = TRILL_OK;
    for (int l = 0; l < c->num_hidden_layers && !st; l++) {
        const trill_lora_pair *p = &((const trill_decoder_lora *)trill_lora_layer(lora, l))->kv_b;
        if (p->A) st = derive_adapter_layer(&ad->layers[l], c, p, r, ad->format, buf, &ad->resident);
    }
    free(buf);
    return st;
}

/* ---- absorbed attention over the latent cache ---- */

/* One task: row r, query heads h0 .. h0+n of it, reading the row's cache once for them. sc: the
 * thread's [MLA_HEADS_PER_TASK][max_context] scores. */
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
        const float *q = S(e)->qabs + ((size_t)r * nh + h0) * w;
        gen_qk_keys(q, n_heads, w, kb, (size_t)w * elem, n, half, sc + j0, (size_t)ctx);
    }
    for (int g = 0; g < n_heads; g++) gen_softmax_scores(sc + (size_t)g * ctx, n_pos, S(e)->softmax_scale, -INFINITY);
    /* the latents (the cache rows' first kl values) weighted */
    gen_weighted_heads(&e->kv, &s->kv, layer, false, w, 0, kl, sc, (size_t)ctx, 0, n_pos, NULL, S(e)->olat + ((size_t)r * nh + h0) * kl, (size_t)kl, n_heads,
                       half);
}

static void latent_attention(trill_engine *e, int layer, int R) {
    const int nh = e->c.num_attention_heads, threads = omp_get_max_threads();
    int per = nh < MLA_HEADS_PER_TASK ? nh : MLA_HEADS_PER_TASK;
    while (per > 1 && (long)R * ((nh + per - 1) / per) < threads) per = (per + 1) / 2; /* a task for every thread */
    const int tasks = (nh + per - 1) / per;
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
    gen_state *f = S(e);
    const int nh = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim, kl = c->kv_lora_rank;
    const int qw = trill_gen_mla_q_width(c), width = qw + kl + dr, ql = c->q_lora_rank, qk = dn + dr, pairing = c->rope_interleave ? ROPE_ADJACENT : ROPE_ROTATE_HALF;
    const float eps = (float)c->rms_norm_eps;
    const int role = ql ? TRILL_ROLE_Q_A : TRILL_ROLE_Q;
    trill_status st = trill_gen_linear(e, &f->lora, &L->m[role], &A->m[role], GEN_STEP_ROWS, f->qkva, f->xn, R, 0);
    if (st) return st;
    if (ql) {
        trill_gen_gather_rows(f->qa, f->qkva, R, ql, width, 0);
        trill_rmsnorm_forward(f->qa, f->qa, L->vec[TRILL_ROLE_Q_A_NORM], R, ql, eps);
        if ((st = trill_gen_linear(e, &f->lora, &L->m[TRILL_ROLE_Q_B], &A->m[TRILL_ROLE_Q_B], GEN_STEP_ROWS, f->q, f->qa, R, 0))) return st;
    } else {
        trill_gen_gather_rows(f->q, f->qkva, R, nh * qk, width, 0);
    }
    trill_gen_gather_rows(f->ckv, f->qkva, R, kl + dr, width, qw);
    for (int r = 0; r < R; r++) trill_rmsnorm_forward(f->ckv + (size_t)r * (kl + dr), f->ckv + (size_t)r * (kl + dr), L->vec[TRILL_ROLE_KV_A_NORM], 1, kl, eps);
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
    if (!sides) return trill_gen_products(e, list, nh);
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
    trill_status st = trill_gen_products(e, list, n);
    if (st || !n_expand) return st;
    return trill_gen_products(e, expand, n_expand);
}

/* qabs: each head's [W_uk^T q_nope (+ its adapter) | q_rope]. */
static trill_status absorb_queries(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int R) {
    const trill_config *c = &e->c;
    gen_state *f = S(e);
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
    gen_state *f = S(e);
    const int nh = c->num_attention_heads, dv = c->v_head_dim, kl = c->kv_lora_rank;
    return per_head(e, L->heads[HEAD_UV], &A->heads[HEAD_UV], f->att, (size_t)nh * dv, dv, f->olat, (size_t)nh * kl, kl, R);
}

trill_status trill_gen_mla_attention(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int l, int R) {
    gen_state *f = S(e);
    trill_status st = project(e, L, A, l, R);
    eng_phase(e, TRILL_PHASE_ATTENTION); /* the absorbed per-head products with it */
    if (!st) st = absorb_queries(e, L, A, R);
    if (st) return st;
    latent_attention(e, l, R);
    /* over the latent cache: q.[c | k_rope] and p.c per head */
    eng_count_attention(e, R, 0, 2.0 * e->c.num_attention_heads * (2.0 * e->c.kv_lora_rank + e->c.qk_rope_head_dim));
    if ((st = expand_values(e, L, A, R))) return st;
    eng_phase(e, TRILL_PHASE_PROJECT);
    return trill_gen_linear(e, &f->lora, &L->m[TRILL_ROLE_O], &A->m[TRILL_ROLE_O], GEN_STEP_ROWS, f->out, f->att, R, 0);
}

