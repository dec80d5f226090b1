/* The generator's decoder layer (trill_eng_forward, src/infer/engine_internal.h), every family's
 * with the options of its layer description (src/arch/decoder.h): the layer forward over a
 * step's rows, the logits, the buffers they need and the KV layout. GQA's attention is here (K
 * and V per kv head in the cache); MLA's absorbed attention over its latent cache is in
 * gen_mla.c.
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

#include "arch/family.h"
#include "base/alloc.h"
#include "infer/gen_decoder.h"
#include "model/decoder.h"
#include "trill/kernels.h"

_Static_assert((int)TRILL_N_ROLES <= (int)ENG_MAX_ROLES, "the engine files a layer's matrices by role");

/* ---- what the forward supports, and its buffers ---- */

static bool is_mla(const trill_config *c) { return trill_decoder_attention_kind(c) == TRILL_ATTENTION_MLA; }

static trill_status forward_check(const trill_config *c) {
    if (!is_mla(c) && (c->head_dim % 8 || c->head_dim > GEN_QK_MAX))
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: head_dim %d is not a multiple of 8 up to %d (the attention kernel's lanes and key buffer)",
                           c->head_dim, GEN_QK_MAX);
    if (is_mla(c) && c->kv_lora_rank + c->qk_rope_head_dim > GEN_QK_MAX)
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: kv_lora_rank %d + qk_rope_head_dim %d is more than %d (the attention kernel's key buffer)",
                           c->kv_lora_rank, c->qk_rope_head_dim, GEN_QK_MAX);
    if (is_mla(c) && (c->kv_lora_rank % 8 || c->qk_rope_head_dim % 8))
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: kv_lora_rank %d and qk_rope_head_dim %d must be multiples of 8 (the attention kernel's lanes)",
                           c->kv_lora_rank, c->qk_rope_head_dim);
    if (trill_layer_desc_of(c, 0).router == TRILL_ROUTER_SIGMOID_GROUPS && c->num_experts_per_tok > 64)
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: num_experts_per_tok %d is more than 64", c->num_experts_per_tok);
    return TRILL_OK;
}

/* The widest SwiGLU a row goes through (dense, shared or one routed expert). */
static size_t widest_mlp(const trill_config *c) {
    size_t w = (size_t)c->intermediate_size, sh = (size_t)trill_config_shared_width(c);
    if (sh > w) w = sh;
    return (size_t)c->moe_intermediate_size > w ? (size_t)c->moe_intermediate_size : w;
}

/* The buffers of the forward over e->rows.max rows (the MoE's counts cover every physical slot
 * when EPLB is on, so trill_eng_eplb_start comes first), and RoPE's frequencies. */
static trill_status forward_alloc(trill_engine *e) {
    const trill_config *c = &e->c;
    const size_t R = (size_t)e->rows.max, H = c->hidden_size, nh = c->num_attention_heads;
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, E = c->num_experts > 0 ? c->num_experts : 1;
    const size_t RK = R * K, rows_ff = RK > R ? RK : R, ff = widest_mlp(c);
    gen_state *f = trill_calloc(1, sizeof *f);
    if (!f) return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers");
    e->fwd = f;
    size_t qkv = 0, qkva = 0, qa = 0, q, k = 0, ckv = 0, qabs = 0, olat = 0, att;
    if (is_mla(c)) {
        const size_t qk = (size_t)c->qk_nope_head_dim + c->qk_rope_head_dim, kl = c->kv_lora_rank, dr = c->qk_rope_head_dim;
        qkva = R * ((size_t)trill_gen_mla_q_width(c) + kl + dr);
        qa = R * (size_t)(c->q_lora_rank ? c->q_lora_rank : 1);
        q = R * nh * qk;
        ckv = R * (kl + dr);
        qabs = R * nh * (kl + dr);
        olat = R * nh * kl;
        att = R * nh * c->v_head_dim;
    } else {
        const size_t qd = nh * c->head_dim, kvd = (size_t)c->num_key_value_heads * c->head_dim;
        const bool gate = trill_decoder_attention_desc(c).output_gate;
        qkv = R * ((gate ? 2 : 1) * qd + 2 * kvd);
        q = att = R * qd;
        k = R * kvd;
        if (gate && (!(f->qg = trill_malloc(sizeof(float) * 2 * R * qd)) || !(f->ogate = trill_malloc(sizeof(float) * R * qd))))
            return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers (%d rows)", e->rows.max);
    }
    if (trill_decoder_has_gdn(c)) {
        trill_status st = trill_gen_gdn_alloc(e);
        if (st) return st;
    }
    float **fl[] = { &f->x, &f->xn, &f->qkv, &f->qkva, &f->qa, &f->q, &f->k, &f->v, &f->ckv, &f->qabs, &f->olat, &f->att, &f->out,
                     &f->shared, &f->scores, &f->sel, &f->logits, &f->moe.topw, &f->moe.xe, &f->moe.ye, &f->moe.ff, &f->moe.act };
    const size_t fn[] = { R * H, R * H, qkv, qkva, qa, q, k, k, ckv, qabs, olat, att, R * H,
                          trill_config_shared_width(c) > 0 ? R * H : 0, R * E, R * K, R * (size_t)c->vocab_size, RK, rows_ff * H, rows_ff * H,
                          rows_ff * 2 * ff, rows_ff * ff };
    bool ok = true;
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++)
        if (fn[i]) ok &= (*fl[i] = trill_malloc(fn[i] * sizeof(float))) != NULL;
    const size_t slots = e->eplb.window ? (size_t)e->eplb.plan.n_physical : E;
    int **il[] = { &f->moe.topi, &f->moe.order, &f->moe.where, &f->moe.phys, &f->moe.count };
    const size_t in[] = { RK, RK, RK, RK, slots + 1 };
    for (size_t i = 0; i < sizeof il / sizeof il[0]; i++) ok &= (*il[i] = trill_malloc(in[i] * sizeof(int))) != NULL;
    ok &= (f->inv_freq = trill_malloc((size_t)trill_decoder_rope_dims(c) / 2 * sizeof(float))) != NULL;
    f->att_scores.threads = omp_get_max_threads();
    if (!ok) return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers (%d rows)", e->rows.max);
    trill_decoder_rope(c, f->inv_freq, &f->rope_scale, &f->softmax_scale);
    e->logits = f->logits;
    return TRILL_OK;
}

static void forward_free(trill_engine *e) {
    gen_state *f = S(e);
    if (!f) return;
    float *fl[] = { f->x, f->xn, f->qkv, f->qkva, f->qa, f->q, f->k, f->v, f->ckv, f->qabs, f->olat, f->att, f->out, f->shared,
                    f->scores, f->sel, f->logits, f->moe.topw, f->moe.xe, f->moe.ye, f->moe.ff, f->moe.act, f->inv_freq, f->att_scores.p };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) free(fl[i]);
    free(f->moe.topi); free(f->moe.order); free(f->moe.where); free(f->moe.phys); free(f->moe.count);
    trill_gen_lora_buf_free(&f->lora);
    free(f->head_u);
    free(f->qg);
    free(f->ogate);
    trill_gen_gdn_free(&f->gdn);
    free(f);
    e->fwd = NULL;
    e->logits = NULL;
}

/* What a token keeps in the cache, per layer: GQA the keys and the values of every kv head; MLA
 * one row of kv_lora_rank + rope values; a Gated DeltaNet nothing (its state is the sequence's). */
static void forward_kv_shape(const trill_config *c, kv_layer_shape *shape) {
    const int kvd = c->num_key_value_heads * c->head_dim;
    for (int l = 0; l < c->num_hidden_layers; l++)
        shape[l] = trill_layer_desc_of(c, l).attention == TRILL_ATTENTION_GDN ? (kv_layer_shape){ 0 }
                   : is_mla(c) ? (kv_layer_shape){ .k_width = c->kv_lora_rank + c->qk_rope_head_dim, .v_width = 0 }
                               : (kv_layer_shape){ .k_width = kvd, .v_width = kvd };
}

/* A GQA task's rows: one sequence's consecutive positions (a prompt's, in prefill), their query
 * heads of a kv head taking each cached key and value once for all of them (a decode row is a
 * tile of its own). At most GQA_TILE_ROWS rows, GQA_TILE_HEADS heads and GQA_TILE_FLOATS floats of
 * queries; none in windowed layers, where each row's window starts elsewhere. Small prompt,
 * bf16, a 512-token prompt: prefill attention 18.5-22 -> 12-13 ms a step. */
enum { GQA_TILE_ROWS = 4, GQA_TILE_HEADS = 16, GQA_TILE_FLOATS = 4096 };

static int gqa_tile_rows(const trill_config *c, int window) {
    const int group = c->num_attention_heads / c->num_key_value_heads;
    int m = window > 0 ? 1 : GQA_TILE_ROWS;
    while (m > 1 && (m * group > GQA_TILE_HEADS || m * group * c->head_dim > GQA_TILE_FLOATS)) m--;
    return m;
}

/* Attention scores for the step's longest context, per thread: a GQA task's query heads (its
 * tile's rows' groups), or an MLA task's heads. */
static trill_status ensure_scores(trill_engine *e, int R) {
    const int nh = e->c.num_attention_heads;
    const int per = is_mla(&e->c) ? (nh < MLA_HEADS_PER_TASK ? nh : MLA_HEADS_PER_TASK) : nh / e->c.num_key_value_heads * gqa_tile_rows(&e->c, 0);
    return trill_gen_scores_ensure(e, &S(e)->att_scores, R, per);
}

/* The adapter path's buffers for rank r: a shrink row for each of a step's rows and expert
 * slots, and MLA's per-head shrinks. */
static trill_status ensure_lora_buffers(trill_engine *e, int r) {
    const size_t K = e->c.num_experts_per_tok > 0 ? e->c.num_experts_per_tok : 1;
    gen_state *f = S(e);
    if (is_mla(&e->c) && r > f->head_u_rank) {
        float *u = trill_malloc(sizeof(float) * (size_t)e->rows.max * e->c.num_attention_heads * r);
        if (!u) return trill_error(TRILL_ERR_NOMEM, "out of memory for the absorbed attention's adapter path (rank %d)", r);
        free(f->head_u);
        f->head_u = u;
        f->head_u_rank = r;
    }
    return trill_gen_lora_buf_ensure(&f->lora, r, (size_t)e->rows.max * K);
}

/* ---- GQA: attention over the paged cache ---- */

/* GQA's K (and V) part of a block is head-major: kv head h's block_size slots of head_dim
 * elements each, in a row, so a head's keys (values) over a block are one contiguous run that the
 * reads below stream (token-major, a head's slots were 1 in nkv of the part's rows, and the reads
 * waited on memory). Slot `slot` of head kvh: */
static inline char *gqa_slot(const kv_cache *kc, int block, int layer, int slot, int kvh, int hd, bool value) {
    char *part = value ? kv_value(kc, block, layer, 0) : kv_key(kc, block, layer, 0);
    return part + ((size_t)kvh * kc->block_size + (size_t)slot) * hd * kc->elem;
}

/* Row r starts a tile: the first row, one that does not continue the row before it (another
 * sequence, or not the next position), or a position that is a multiple of the tile; so the
 * tiles depend on the rows alone, not on the threads. */
static inline bool gqa_tile_start(const trill_engine *e, int r, int tile) {
    return r == 0 || e->rows.seq[r] != e->rows.seq[r - 1] || e->rows.pos[r] != e->rows.pos[r - 1] + 1 || e->rows.pos[r] % tile == 0;
}

/* One task of the attention: the tile of rows r0 .. r0 + m - 1 and kv head kvh with its group of
 * query heads in each row, so each cached key and value is read once for the tile's heads; the
 * cache is walked block by block, from the block of the layer's window's first position (window
 * 0: the whole sequence), in the windowed layers' own cache when the engine splits them off
 * (kv_split). Every head's sums are those of its row alone: the q.k of a key its own chain, a
 * row's softmax over its own positions, p.V summed to its own last position. sc: the thread's
 * [tile heads][max_context] scores. */
static inline __attribute__((always_inline)) void attend_tile_head(const trill_engine *e, int layer, int r0, int m, int kvh, float *sc, int window,
                                                                   const float *sinks, const bool half, const bool own) {
    const trill_config *c = &e->c;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim, group = nh / nkv, G = m * group;
    const kv_cache *kc = own ? &e->kv_win : &e->kv;
    const seq *s = e->rows.seq[r0];
    const kv_table *t = own ? &s->kv_win : &s->kv;
    const int bs = kc->block_size, elem = half ? 2 : 4;
    const float scale = S(e)->softmax_scale;
    const int n0 = e->rows.pos[r0] + 1, n_end = n0 + m - 1, ctx = S(e)->att_scores.max_context;
    const int first = window > 0 && n0 > window ? n0 - window : 0; /* m is 1 in windowed layers */
    float qt[GQA_TILE_FLOATS] __attribute__((aligned(32))), ot[GQA_TILE_FLOATS] __attribute__((aligned(32)));
    int ends[GQA_TILE_HEADS];
    const float *q = S(e)->q + ((size_t)r0 * nh + (size_t)kvh * group) * hd;
    float *o = S(e)->att + ((size_t)r0 * nh + (size_t)kvh * group) * hd;
    if (m > 1) { /* the tile's queries in a row of heads; their outputs likewise, then put back */
        for (int i = 0; i < m; i++) memcpy(qt + (size_t)i * group * hd, q + (size_t)i * nh * hd, sizeof(float) * group * hd);
        q = qt;
        o = ot;
    }
    for (int j0 = first - first % bs; j0 < n_end; j0 += bs) {
        const char *kb = gqa_slot(kc, t->blocks[j0 / bs], layer, 0, kvh, hd, false);
        const int n = n_end - j0 < bs ? n_end - j0 : bs;
        if (j0 + bs < n_end) /* the next block's keys of this head on their way while these are read (another block, another run) */
            gen_prefetch_rows(gqa_slot(kc, t->blocks[j0 / bs + 1], layer, 0, kvh, hd, false), 1, 0,
                              (size_t)(n_end - j0 - bs < bs ? n_end - j0 - bs : bs) * hd * elem);
        gen_qk_keys(q, G, hd, kb, (size_t)hd * elem, n, half, sc + j0, (size_t)ctx);
    }
    for (int i = 0; i < m; i++)
        for (int g = 0; g < group; g++) { /* normalised in place (a sink's logit in the denominator) */
            gen_softmax_scores(sc + (size_t)(i * group + g) * ctx + first, n0 + i - first, scale, sinks ? sinks[kvh * group + g] : -INFINITY);
            if (m > 1) ends[i * group + g] = n0 + i;
        }
    gen_weighted_heads(kc, t, layer, true, hd, kvh * bs * hd, hd, sc, (size_t)ctx, first, n_end, m > 1 ? ends : NULL, /* a head's rows hd apart in its run */
                       o, (size_t)hd, G, half);
    if (m > 1)
        for (int i = 0; i < m; i++)
            memcpy(S(e)->att + ((size_t)(r0 + i) * nh + (size_t)kvh * group) * hd, ot + (size_t)i * group * hd, sizeof(float) * group * hd);
}

/* Causal attention of each row over its own sequence's cached keys and values, within the
 * layer's window, with the layer's sinks (NULL: none; fp32 or bf16 cache: each task is compiled for both and picks by the cache's
 * element size). head_dim must be a multiple of 8 (checked when the engine is made). */
static void paged_attention(trill_engine *e, int layer, int window, const float *sinks, int R) {
    const int nkv = e->c.num_key_value_heads, group = e->c.num_attention_heads / nkv, tile = gqa_tile_rows(&e->c, window);
    const bool half = e->kv.elem == 2, own = e->kv_split && window > 0; /* own: the windowed layers' cache */
    int tiles = 0;
    for (int r = 0; r < R; r++) tiles += gqa_tile_start(e, r, tile);
    /* many tiles: a task is a tile with all its kv heads, one after another (its cache blocks,
     * read head by head, stay in this core's caches); few: a tile and one kv head, so the threads
     * share even one long sequence. A task whose row starts no tile has nothing to do. */
    const int by_row = tiles >= 8 * omp_get_max_threads();
#pragma omp parallel
    {
        float *sc = S(e)->att_scores.p + (size_t)omp_get_thread_num() * S(e)->att_scores.max_context * group * gqa_tile_rows(&e->c, 0);
#pragma omp for schedule(dynamic, 1)
        for (int task = 0; task < (by_row ? R : R * nkv); task++) {
            const int r = by_row ? task : task / nkv;
            if (!gqa_tile_start(e, r, tile)) continue;
            int m = 1;
            while (m < tile && r + m < R && !gqa_tile_start(e, r + m, tile)) m++;
            for (int kvh = by_row ? 0 : task % nkv, end = by_row ? nkv : kvh + 1; kvh < end; kvh++) {
                /* each case compiled apart: the common one's code is the cache's alone */
                if (own && half) attend_tile_head(e, layer, r, m, kvh, sc, window, sinks, true, true);
                else if (own) attend_tile_head(e, layer, r, m, kvh, sc, window, sinks, false, true);
                else if (half) attend_tile_head(e, layer, r, m, kvh, sc, window, sinks, true, false);
                else attend_tile_head(e, layer, r, m, kvh, sc, window, sinks, false, false);
            }
        }
    }
}

/* Layer l's GQA on xn: out = o(attention(rope(norm(q)), rope(norm(k)), v)) (the projections'
 * biases and QK-norm when the layer has them; RoPE on each head's rotated dimensions), the rows'
 * own keys and values joining the cache before anyone reads. */
static trill_status gqa(trill_engine *e, const trill_layer_desc *desc, const eng_layer *L, const eng_lora_layer *A, int l, int R) {
    const trill_config *c = &e->c;
    const int hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kvd = nkv * hd, qw = (desc->output_gate ? 2 : 1) * qd, width = qw + 2 * kvd;
    const float eps = (float)c->rms_norm_eps;
    trill_status st = trill_gen_linear(e, &S(e)->lora, &L->m[TRILL_ROLE_Q], &A->m[TRILL_ROLE_Q], GEN_STEP_ROWS, S(e)->qkv, S(e)->xn, R, 0);
    if (st) return st;
    if (desc->output_gate) { /* q_proj per head: q, then its output gate */
        trill_gen_gather_rows(S(e)->qg, S(e)->qkv, R, qw, width, 0);
        if (desc->qkv_bias) trill_decoder_bias_forward(S(e)->qg, L->vec[TRILL_ROLE_Q_BIAS], R, qw);
        for (size_t i = 0; i < (size_t)R * nh; i++) {
            memcpy(S(e)->q + i * hd, S(e)->qg + i * 2 * hd, sizeof(float) * hd);
            memcpy(S(e)->ogate + i * hd, S(e)->qg + i * 2 * hd + hd, sizeof(float) * hd);
        }
    } else {
        trill_gen_gather_rows(S(e)->q, S(e)->qkv, R, qd, width, 0);
    }
    trill_gen_gather_rows(S(e)->k, S(e)->qkv, R, kvd, width, qw);
    trill_gen_gather_rows(S(e)->v, S(e)->qkv, R, kvd, width, qw + kvd);
    if (desc->qkv_bias) {
        if (!desc->output_gate) trill_decoder_bias_forward(S(e)->q, L->vec[TRILL_ROLE_Q_BIAS], R, qd);
        trill_decoder_bias_forward(S(e)->k, L->vec[TRILL_ROLE_K_BIAS], R, kvd);
        trill_decoder_bias_forward(S(e)->v, L->vec[TRILL_ROLE_V_BIAS], R, kvd);
    }
    if (desc->qk_norm) {
        trill_rmsnorm_forward(S(e)->q, S(e)->q, L->vec[TRILL_ROLE_Q_NORM], R * nh, hd, eps);
        trill_rmsnorm_forward(S(e)->k, S(e)->k, L->vec[TRILL_ROLE_K_NORM], R * nkv, hd, eps);
    }
    trill_decoder_rope_heads(c, S(e)->q, e->rows.pos, S(e)->inv_freq, S(e)->rope_scale, R, nh);
    trill_decoder_rope_heads(c, S(e)->k, e->rows.pos, S(e)->inv_freq, S(e)->rope_scale, R, nkv);
    const bool own = e->kv_split && desc->window > 0; /* the windowed layers' cache */
    const kv_cache *kc = own ? &e->kv_win : &e->kv;
    eng_phase(e, TRILL_PHASE_ATTENTION);
    for (int r = 0; r < R; r++) {
        const seq *s = e->rows.seq[r];
        const kv_table *t = own ? &s->kv_win : &s->kv;
        const int p = e->rows.pos[r], b = t->blocks[p / kc->block_size], slot = p % kc->block_size;
        for (int h = 0; h < nkv; h++) {
            const size_t at = (size_t)r * kvd + (size_t)h * hd;
            trill_from_f32(gqa_slot(kc, b, l, slot, h, hd, false), S(e)->k + at, kc->elem == 4 ? TRILL_F32 : TRILL_BF16, (size_t)hd);
            trill_from_f32(gqa_slot(kc, b, l, slot, h, hd, true), S(e)->v + at, kc->elem == 4 ? TRILL_F32 : TRILL_BF16, (size_t)hd);
        }
    }
    paged_attention(e, l, desc->window, desc->sinks ? L->vec[TRILL_ROLE_SINKS] : NULL, R);
    eng_count_attention(e, R, desc->window, 4.0 * nh * hd); /* q.k and p.v, 2 FLOPs a multiply-add */
    if (desc->output_gate)
        for (size_t i = 0; i < (size_t)R * qd; i++) S(e)->att[i] /= 1.0f + expf(-S(e)->ogate[i]);
    eng_phase(e, TRILL_PHASE_PROJECT);
    st = trill_gen_linear(e, &S(e)->lora, &L->m[TRILL_ROLE_O], &A->m[TRILL_ROLE_O], GEN_STEP_ROWS, S(e)->out, S(e)->att, R, 0);
    if (!st && desc->o_bias) trill_decoder_bias_forward(S(e)->out, L->vec[TRILL_ROLE_O_BIAS], R, c->hidden_size);
    return st;
}

/* ---- MLPs ---- */

/* out[R, H] = down(silu(gate) * up) of xn, gate|up fused under role gu, width I. */
static trill_status mlp(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int gu, int down, float *out, int R, int I) {
    gen_state *f = S(e);
    trill_status st = trill_gen_linear(e, &f->lora, &L->m[gu], &A->m[gu], GEN_STEP_ROWS, f->moe.ff, f->xn, R, 0);
    if (st) return st;
    trill_gen_swiglu_fused(f->moe.act, f->moe.ff, R, I);
    return trill_gen_linear(e, &f->lora, &L->m[down], &A->m[down], GEN_STEP_ROWS, out, f->moe.act, R, 0);
}

/* The router (softmax top-k; or sigmoid scores, group-limited top-k on scores + correction bias,
 * gates from the unbiased scores), the routed experts (src/infer/gen_blocks.c), then the shared
 * experts added. */
static trill_status moe(trill_engine *e, const trill_layer_desc *desc, const eng_layer *L, const eng_lora_layer *A, int ordinal, int R) {
    const trill_config *c = &e->c;
    gen_state *f = S(e);
    const int E = c->num_experts, K = c->num_experts_per_tok;
    const gen_product router = { .out = f->scores, .inp = f->xn, .W = &L->m[TRILL_ROLE_ROUTER], .T = R };
    trill_status st = trill_gen_products(e, &router, 1);
    if (st) return st;
    if (desc->router_linear_bias) trill_decoder_bias_forward(f->scores, L->vec[TRILL_ROLE_ROUTER_LINEAR_BIAS], R, E);
    if (desc->router == TRILL_ROUTER_SOFTMAX) {
        trill_softmax_forward(f->scores, f->scores, R, E);
        trill_topk_forward(f->moe.topi, f->moe.topw, f->scores, R, E, K);
        trill_router_gates_forward(f->moe.topw, f->scores, f->moe.topi, R, E, K, c->norm_topk_prob, 0.0f, 1.0f);
    } else {
        trill_sigmoid_forward(f->scores, f->scores, (size_t)R * E);
        if ((st = trill_router_topk_forward(f->moe.topi, f->sel, f->scores, L->vec[TRILL_ROLE_ROUTER_BIAS], R, E, K, c->n_group, c->topk_group)))
            return st;
        trill_router_gates_forward(f->moe.topw, f->scores, f->moe.topi, R, E, K, c->norm_topk_prob, 1e-20f, (float)c->routed_scaling_factor);
    }
    const gen_expert_roles roles = { TRILL_ROLE_EXPERT_GATE, TRILL_ROLE_EXPERT_DOWN, desc->expert_bias, desc->expert_act, (float)c->swiglu_limit,
                                     (float)c->swiglu_alpha };
    if ((st = trill_gen_moe_experts(e, &f->moe, &f->lora, f->xn, f->out, L, A, roles, ordinal, R))) return st;
    if (!desc->shared_experts) return TRILL_OK;
    eng_phase(e, TRILL_PHASE_MLP);
    if ((st = mlp(e, L, A, TRILL_ROLE_SHARED_GATE, TRILL_ROLE_SHARED_DOWN, f->shared, R, trill_config_shared_width(c))))
        return st;
    if (desc->shared_expert_gate) { /* the shared experts' output x sigmoid(shared_expert_gate(xn)) */
        const int H = c->hidden_size;
        if ((st = trill_gen_linear(e, &f->lora, &L->m[TRILL_ROLE_SHARED_EXPERT_GATE], &A->m[TRILL_ROLE_SHARED_EXPERT_GATE], GEN_STEP_ROWS, f->sel,
                                   f->xn, R, 0)))
            return st;
        for (size_t r = 0; r < (size_t)R; r++) {
            const float s = 1.0f / (1.0f + expf(-f->sel[r]));
            for (int i = 0; i < H; i++) f->shared[r * H + i] *= s;
        }
    }
    trill_gen_add_rows(f->out, f->shared, (size_t)R * c->hidden_size);
    return TRILL_OK;
}

/* ---- the layers ---- */

static trill_status forward_rows(trill_engine *e, int R) {
    const trill_config *c = &e->c;
    gen_state *f = S(e);
    const int H = c->hidden_size;
    const float eps = (float)c->rms_norm_eps;
    const eng_weights *w = e->w;
    trill_gen_embed(e, f->x, R);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const trill_layer_desc desc = trill_layer_desc_of(c, l);
        const eng_layer *L = &w->layers[l];
        const eng_lora_layer *A = &e->layout->layers[l]; /* the adapters' layout: each row's slot picks its own */
        trill_rmsnorm_forward(f->xn, f->x, L->vec[TRILL_ROLE_INPUT_NORM], R, H, eps);
        eng_phase(e, TRILL_PHASE_PROJECT);
        trill_status st = desc.attention == TRILL_ATTENTION_MLA ? trill_gen_mla_attention(e, L, A, l, R)
                          : desc.attention == TRILL_ATTENTION_GDN ? trill_gen_gdn(e, L, A, l, R)
                                                                  : gqa(e, &desc, L, A, l, R);
        if (st) return st;
        eng_phase(e, TRILL_PHASE_OTHER);
        trill_gen_add_rows(f->x, f->out, (size_t)R * H);
        trill_rmsnorm_forward(f->xn, f->x, L->vec[TRILL_ROLE_POST_NORM], R, H, eps);
        eng_phase(e, desc.moe ? TRILL_PHASE_ROUTE : TRILL_PHASE_MLP);
        st = desc.moe ? moe(e, &desc, L, A, c->moe_ordinal[l], R) : mlp(e, L, A, TRILL_ROLE_GATE, TRILL_ROLE_DOWN, f->out, R, c->intermediate_size);
        if (st) return st;
        eng_phase(e, TRILL_PHASE_OTHER);
        trill_gen_add_rows(f->x, f->out, (size_t)R * H);
    }
    return TRILL_OK;
}

/* The final norm, lm_head and its adapter over the rows listed in rows.logit. */
static trill_status forward_logits(trill_engine *e, int n) {
    return trill_gen_logits(e, &S(e)->lora, S(e)->x, S(e)->xn, S(e)->logits, TRILL_ROLE_FINAL_NORM, TRILL_ROLE_LM_HEAD, n);
}

static trill_status derive_weights(const trill_config *c, trill_gen_format f, const trill_model *m, eng_weights *w) {
    return is_mla(c) ? trill_gen_mla_derive_weights(c, f, m, w) : TRILL_OK;
}

static trill_status derive_adapter(const trill_engine *e, const trill_lora *lora, eng_adapter *ad) {
    return is_mla(&e->c) ? trill_gen_mla_derive_adapter(e, lora, ad) : TRILL_OK;
}

const trill_eng_forward trill_eng_decoder = {
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
