/* The decoder layer of the training forward (fp32), every family's, with the options of its layer
 * description (src/arch/decoder.h):
 *   RMSNorm -> attention -> o_proj -> residual -> RMSNorm -> dense SwiGLU MLP or MoE -> residual,
 * the RMSNorms zero-centred (1 + w) when the config says so (Qwen3-Next).
 * Attention:
 *   GQA (HF modeling_qwen3_moe.py, modeling_mixtral.py, modeling_gpt_oss.py): q/k/v projections
 *     (biases) -> per-head q/k RMSNorm (QK-norm) -> RoPE (rotate-half) -> causal attention
 *     (blocked GEMMs; a window, sinks) -> x sigmoid(gate) (an output gate:
 *     q_proj per head [q, gate], Qwen3-Next) -> o_proj (a bias);
 *   Gated DeltaNet (HF modeling_qwen3_next.py: a linear recurrence, no positions): src/model/gdn.c;
 *   MLA (HF modeling_deepseek_v3.py): q = q_b(RMSNorm(q_a(x))) or q_proj(x), per head nope | rope;
 *     c = kv_a(x) = latent | one rope key shared by the heads; k_nope | v per head =
 *     kv_b(RMSNorm(latent)); RoPE (YaRN, adjacent pairs with rope_interleave) on the rope parts;
 *     attention over nope + rope with values of v_head_dim.
 * MoE: the router (softmax top-k, or sigmoid with correction bias and groups; or the replayed
 *   ids; a linear bias on the logits) -> gate weights -> tokens grouped by expert so each expert is one GEMM
 *   (src/model/blocks.c) -> weighted scatter-add; shared experts added unweighted (or times
 *   sigmoid(shared_expert_gate(x)), Qwen3-Next). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arch/family.h"
#include "model/decoder.h"
#include "model/gdn.h"
#include "trill/kernels.h"

trill_layer_desc trill_decoder_attention_desc(const trill_config *c) {
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const trill_layer_desc d = trill_layer_desc_of(c, l);
        if (d.attention != TRILL_ATTENTION_GDN) return d;
    }
    trill_layer_desc d = trill_layer_desc_of(c, 0);
    d.attention = TRILL_ATTENTION_GQA;
    return d;
}

trill_attention_kind trill_decoder_attention_kind(const trill_config *c) { return trill_decoder_attention_desc(c).attention; }

bool trill_decoder_has_gdn(const trill_config *c) {
    for (int l = 0; l < c->num_hidden_layers; l++)
        if (trill_layer_desc_of(c, l).attention == TRILL_ATTENTION_GDN) return true;
    return false;
}

int trill_decoder_rope_dims(const trill_config *c) {
    if (trill_decoder_attention_kind(c) == TRILL_ATTENTION_MLA) return c->qk_rope_head_dim;
    return c->partial_rotary_factor > 0 && c->partial_rotary_factor < 1 ? (int)(c->head_dim * c->partial_rotary_factor) : c->head_dim; /* HF: int() */
}

/* inv_freq over `dims` rotated dimensions, plain or YaRN (HF's _compute_yarn_parameters); the
 * cos/sin multiplier: 1, YaRN's derived attention factor, or the config's. */
static double rope_tables(const trill_config *c, float *inv_freq, int dims) {
    if (!c->yarn) {
        trill_rope_inv_freq(inv_freq, dims, c->rope_theta);
        return 1.0;
    }
    const double cs = trill_rope_inv_freq_yarn(inv_freq, dims, c->rope_theta, c->yarn_factor, c->yarn_original_max_position_embeddings,
                                               c->yarn_beta_fast, c->yarn_beta_slow, c->yarn_mscale, c->yarn_mscale_all_dim, c->yarn_truncate);
    return c->yarn_attention_factor > 0 ? c->yarn_attention_factor : cs;
}

void trill_decoder_rope(const trill_config *c, float *inv_freq, float *rope_scale, float *softmax_scale) {
    if (trill_decoder_attention_kind(c) == TRILL_ATTENTION_GQA) { /* YaRN scales cos and sin only (HF's GQA attention) */
        *rope_scale = (float)rope_tables(c, inv_freq, trill_decoder_rope_dims(c));
        *softmax_scale = 1 / sqrtf((float)c->head_dim);
        return;
    }
    double softmax = 1.0 / sqrt((double)(c->qk_nope_head_dim + c->qk_rope_head_dim));
    const double cs = rope_tables(c, inv_freq, c->qk_rope_head_dim);
    if (c->yarn && c->yarn_mscale_all_dim != 0) { /* DeepSeek-V3's attention: the softmax scale times mscale(factor, mscale_all_dim)^2 */
        const double m = trill_rope_yarn_mscale(c->yarn_factor, c->yarn_mscale_all_dim);
        softmax *= m * m;
    }
    *rope_scale = (float)cs;
    *softmax_scale = (float)softmax;
}

size_t trill_decoder_widest_mlp(const trill_config *c) {
    size_t w = (size_t)c->intermediate_size, sh = (size_t)trill_config_shared_width(c);
    size_t routed = (size_t)c->moe_intermediate_size * (c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1);
    if (sh > w) w = sh;
    return routed > w ? routed : w;
}

/* A layer's attention activations: GQA's (its output gate's and QK-norm's too) or MLA's, by the
 * model's attention kind; a Gated DeltaNet layer's own have none unless the buffers are shared. */
static void plan_attention(const trill_forward_pass *fp, trill_plan *p, const trill_layer_desc *d, bool every, trill_decoder_acts *a) {
    const trill_config *c = &fp->m->config;
    const size_t T = (size_t)fp->T, F = sizeof(float), nh = c->num_attention_heads;
    if (d->attention == TRILL_ATTENTION_GDN && !every) return;
    if (trill_decoder_attention_kind(c) == TRILL_ATTENTION_GQA) {
        const trill_layer_desc ad = trill_decoder_attention_desc(c);
        const size_t qd = nh * c->head_dim, kvd = (size_t)c->num_key_value_heads * c->head_dim;
        if (ad.output_gate) {
            a->qg = trill_plan_take(p, T * 2 * qd * F);
            a->ogate = trill_plan_take(p, T * qd * F);
            a->att_g = trill_plan_take(p, T * qd * F);
        }
        if (ad.qk_norm) {
            a->q_raw = trill_plan_take(p, T * qd * F);
            a->k_raw = trill_plan_take(p, T * kvd * F);
        }
        a->q = trill_plan_take(p, T * qd * F);
        a->k = trill_plan_take(p, T * kvd * F);
        a->v = trill_plan_take(p, T * kvd * F);
        a->att = trill_plan_take(p, T * qd * F);
        return;
    }
    const size_t qk = (size_t)c->qk_nope_head_dim + c->qk_rope_head_dim, dv = c->v_head_dim, ql = c->q_lora_rank, kl = c->kv_lora_rank;
    if (ql) {
        a->qa = trill_plan_take(p, T * ql * F);
        a->qan = trill_plan_take(p, T * ql * F);
    }
    a->ckv = trill_plan_take(p, T * kl * F);
    a->ckvn = trill_plan_take(p, T * kl * F);
    a->q = trill_plan_take(p, T * nh * qk * F);
    a->k = trill_plan_take(p, T * nh * qk * F);
    a->v = trill_plan_take(p, T * nh * dv * F);
    a->att = trill_plan_take(p, T * nh * dv * F);
}

/* One layer's own activations. */
static trill_decoder_acts plan_layer(const trill_forward_pass *fp, trill_plan *p, int l) {
    const trill_config *c = &fp->m->config;
    const trill_layer_desc d = trill_layer_desc_of(c, l);
    const size_t T = (size_t)fp->T, H = c->hidden_size, F = sizeof(float);
    const size_t E = c->num_experts > 0 ? c->num_experts : 1, K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
    const size_t Im = c->moe_intermediate_size, ff = trill_decoder_widest_mlp(c);
    const bool every = !fp->training || fp->recompute; /* buffers every layer shares: the widest */
    trill_decoder_acts a = { .x_in = trill_plan_take(p, T * H * F), .xn1 = trill_plan_take(p, T * H * F) };
    /* shared buffers serve every layer: a Gated DeltaNet's and the attention's both when the model has both */
    const bool gdn = d.attention == TRILL_ATTENTION_GDN || (every && trill_decoder_has_gdn(c));
    if (gdn) trill_gdn_plan(c, p, T, &a.gdn);
    plan_attention(fp, p, &d, every, &a);
    a.x_mid = trill_plan_take(p, T * H * F);
    a.xn2 = trill_plan_take(p, T * H * F);
    const size_t gate_cols = every ? ff : d.moe ? K * Im : (size_t)c->intermediate_size;
    a.moe.gate = trill_plan_take(p, T * gate_cols * F);
    a.moe.up = trill_plan_take(p, T * gate_cols * F);
    const bool shared = d.shared_experts || (every && trill_config_shared_width(c) > 0);
    if (every || d.moe) {
        a.moe.ye = trill_plan_take(p, T * K * H * F);
        a.scores = trill_plan_take(p, T * E * F);
        a.moe.topw = trill_plan_take(p, T * K * F);
        a.moe.topi = trill_plan_take(p, T * K * sizeof(int));
        a.moe.order = trill_plan_take(p, T * K * sizeof(int));
        a.moe.count = trill_plan_take(p, (E + 1) * sizeof(int));
        if (shared) {
            const size_t sh = (size_t)trill_config_shared_width(c);
            a.sgate = trill_plan_take(p, T * sh * F);
            a.sup = trill_plan_take(p, T * sh * F);
            a.sh_logit = trill_plan_take(p, T * F);
            a.sh_out = trill_plan_take(p, T * H * F);
        }
    }
    for (int x = 0; fp->lora && x < XA_N; x++) { /* the adapters' inputs of the modules the layer can have */
        const bool routed = x == XA_GATE || x == XA_UP || x == XA_DOWN, gdn_x = x >= XA_GDN_QKVZ;
        if ((gdn_x && !gdn) || (x == XA_SH_EGATE && !shared)) continue;
        a.xa[x] = trill_plan_take(p, T * (routed ? K : 1) * (size_t)fp->lora->config.rank * F);
    }
    return a;
}

static void plan(trill_forward_pass *fp, trill_plan *p) {
    const trill_config *c = &fp->m->config;
    const size_t T = (size_t)fp->T, H = c->hidden_size, L = c->num_hidden_layers, F = sizeof(float), nh = c->num_attention_heads;
    const trill_attention_kind kind = trill_decoder_attention_kind(c);
    trill_decoder_pass *d = trill_plan_take(p, sizeof *d);
    trill_decoder_acts *layers = trill_plan_take(p, L * sizeof(trill_decoder_acts));
    for (size_t l = 0; l < L; l++) {
        if ((!fp->training || fp->recompute) && l > 0) { /* every layer reuses layer 0's buffers ... */
            float *x_in = fp->recompute ? trill_plan_take(p, T * H * F) : NULL; /* ... but recomputation keeps each input */
            if (layers) {
                layers[l] = layers[0];
                if (fp->recompute) layers[l].x_in = x_in;
            }
            continue;
        }
        const trill_decoder_acts a = plan_layer(fp, p, (int)l);
        if (layers) layers[l] = a;
    }
    /* inference: the residual stream is updated in place, so every x_in/x_mid is one buffer */
    if (!fp->training && layers)
        for (size_t l = 0; l < L; l++) layers[l].x_mid = layers[l].x_in = layers[0].x_in;
    fp->x_final = fp->training ? trill_plan_take(p, T * H * F) : (layers ? layers[0].x_in : NULL);
    trill_decoder_pass q = { .layers = layers, .attention = kind };
    if (kind == TRILL_ATTENTION_MLA) {
        q.kva = trill_plan_take(p, T * ((size_t)c->kv_lora_rank + c->qk_rope_head_dim) * F);
        q.kvb = trill_plan_take(p, T * nh * ((size_t)c->qk_nope_head_dim + c->v_head_dim) * F);
        q.kr = trill_plan_take(p, T * (size_t)c->qk_rope_head_dim * F);
    }
    q.out = trill_plan_take(p, T * H * F);
    q.act = trill_plan_take(p, T * trill_decoder_widest_mlp(c) * F);
    q.xe = trill_plan_take(p, T * H * F);
    q.inv_freq = trill_plan_take(p, (size_t)trill_decoder_rope_dims(c) / 2 * F);
    fp->acts = d;
    fp->x_first = layers ? layers[0].x_in : NULL;
    if (d) *d = q;
}

static void begin(trill_forward_pass *fp) {
    trill_decoder_pass *d = fp->acts;
    trill_decoder_rope(&fp->m->config, d->inv_freq, &d->rope_scale, &d->softmax_scale);
}

static const trill_decoder_lora NO_ADAPTERS;

/* ---- attention ---- */

void trill_decoder_bias_forward(float *y, const float *b, int n, int N) {
    for (size_t t = 0; t < (size_t)n; t++)
        for (int i = 0; i < N; i++) y[t * N + i] += b[i];
}

void trill_decoder_rope_heads(const trill_config *c, float *x, const int *pos, const float *inv_freq, float cs, int n, int heads) {
    const int hd = c->head_dim, rd = trill_decoder_rope_dims(c);
    if (rd == hd && cs == 1.0f) trill_rope_forward(x, pos, inv_freq, n, heads, hd);
    else trill_rope_partial_forward(x, pos, inv_freq, n, heads, hd, 0, rd, ROPE_ROTATE_HALF, cs);
}

/* GQA on xn1: q, k, v projections (with their biases when the layer has them), QK-norm when it
 * has it, RoPE on each head's rotated dimensions, attention into att. */
static trill_status gqa(const trill_forward_pass *fp, const trill_layer_desc *desc, const trill_decoder_weights *w,
                        const trill_decoder_lora *ad, trill_decoder_acts *a) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const float eps = (float)c->rms_norm_eps;
    float *q = desc->qk_norm ? a->q_raw : a->q, *k = desc->qk_norm ? a->k_raw : a->k;
    const int qw = (desc->output_gate ? 2 : 1) * nh * hd; /* q_proj's width: with an output gate, per head q then gate */
    float *qp = desc->output_gate ? a->qg : q;
    trill_status st = trill_linear(fp, qp, a->xn1, w->wq, ad->q, a->xa[XA_Q], T, H, qw);
    if (!st) st = trill_linear(fp, k, a->xn1, w->wk, ad->k, a->xa[XA_K], T, H, nkv * hd);
    if (!st) st = trill_linear(fp, a->v, a->xn1, w->wv, ad->v, a->xa[XA_V], T, H, nkv * hd);
    if (st) return st;
    if (desc->qkv_bias) trill_decoder_bias_forward(qp, w->q_bias, T, qw);
    if (desc->output_gate)
        for (size_t t = 0; t < (size_t)T; t++)
            for (int h = 0; h < nh; h++) {
                const float *src = a->qg + (t * nh + h) * 2 * hd;
                memcpy(q + (t * nh + h) * hd, src, sizeof(float) * hd);
                memcpy(a->ogate + (t * nh + h) * hd, src + hd, sizeof(float) * hd);
            }
    if (desc->qkv_bias) {
        trill_decoder_bias_forward(k, w->k_bias, T, nkv * hd);
        trill_decoder_bias_forward(a->v, w->v_bias, T, nkv * hd);
    }
    if (desc->qk_norm) {
        trill_rmsnorm_offset_forward(a->q, a->q_raw, w->q_norm, trill_norm_offset(c, TRILL_ROLE_Q_NORM), T * nh, hd, eps); /* per head, over head_dim */
        trill_rmsnorm_offset_forward(a->k, a->k_raw, w->k_norm, trill_norm_offset(c, TRILL_ROLE_K_NORM), T * nkv, hd, eps);
    }
    trill_decoder_rope_heads(c, a->q, fp->pos, d->inv_freq, d->rope_scale, T, nh);
    trill_decoder_rope_heads(c, a->k, fp->pos, d->inv_freq, d->rope_scale, T, nkv);
    const trill_attention_opts opts = { .window = desc->window, .sinks = desc->sinks ? w->sinks : NULL };
    return trill_attention_forward(a->att, a->q, a->k, a->v, fp->offsets, fp->n_seqs, nh, nkv, hd, hd, d->softmax_scale, fp->precision,
                                   desc->window || desc->sinks ? &opts : NULL);
}

/* MLA's q [T, nh*qk] from xn1: through q_a -> q_a_layernorm -> q_b, or q_proj; rope part rotated. */
static trill_status mla_queries(const trill_forward_pass *fp, const trill_decoder_weights *w, const trill_decoder_lora *ad,
                                trill_decoder_acts *a) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, nh = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    const int ql = c->q_lora_rank;
    trill_status st;
    if (ql) {
        if ((st = trill_linear(fp, a->qa, a->xn1, w->q_a, ad->q_a, a->xa[XA_Q_A], T, H, ql))) return st;
        trill_rmsnorm_forward(a->qan, a->qa, w->q_a_norm, T, ql, (float)c->rms_norm_eps);
        st = trill_linear(fp, a->q, a->qan, w->q_b, ad->q_b, a->xa[XA_Q_B], T, ql, nh * qk);
    } else {
        st = trill_linear(fp, a->q, a->xn1, w->wq, ad->q, a->xa[XA_Q], T, H, nh * qk);
    }
    if (st) return st;
    trill_rope_partial_forward(a->q, fp->pos, d->inv_freq, T, nh, qk, c->qk_nope_head_dim, c->qk_rope_head_dim,
                               c->rope_interleave ? ROPE_ADJACENT : ROPE_ROTATE_HALF, d->rope_scale);
    return TRILL_OK;
}

/* MLA's k [T, nh*qk] and v [T, nh*v] from xn1: the latent (kept in ckv, normed in ckvn) through
 * kv_b, each head's k_nope followed by the one rotated rope key. */
static trill_status mla_keys_values(const trill_forward_pass *fp, const trill_decoder_weights *w, const trill_decoder_lora *ad,
                                    trill_decoder_acts *a) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, nh = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim;
    const int dv = c->v_head_dim, kl = c->kv_lora_rank, qk = dn + dr;
    trill_status st = trill_linear(fp, d->kva, a->xn1, w->kv_a, ad->kv_a, a->xa[XA_KV_A], T, H, kl + dr);
    if (st) return st;
    for (int t = 0; t < T; t++) {
        memcpy(a->ckv + (size_t)t * kl, d->kva + (size_t)t * (kl + dr), sizeof(float) * kl);
        memcpy(d->kr + (size_t)t * dr, d->kva + (size_t)t * (kl + dr) + kl, sizeof(float) * dr);
    }
    trill_rmsnorm_forward(a->ckvn, a->ckv, w->kv_a_norm, T, kl, (float)c->rms_norm_eps);
    if ((st = trill_linear(fp, d->kvb, a->ckvn, w->kv_b, ad->kv_b, a->xa[XA_KV_B], T, kl, nh * (dn + dv)))) return st;
    trill_rope_partial_forward(d->kr, fp->pos, d->inv_freq, T, 1, dr, 0, dr, c->rope_interleave ? ROPE_ADJACENT : ROPE_ROTATE_HALF,
                               d->rope_scale);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *src = d->kvb + ((size_t)t * nh + h) * (dn + dv);
            float *k = a->k + ((size_t)t * nh + h) * qk;
            memcpy(k, src, sizeof(float) * dn);
            memcpy(k + dn, d->kr + (size_t)t * dr, sizeof(float) * dr);
            memcpy(a->v + ((size_t)t * nh + h) * dv, src + dn, sizeof(float) * dv);
        }
    return TRILL_OK;
}

static trill_status mla(const trill_forward_pass *fp, const trill_decoder_weights *w, const trill_decoder_lora *ad, trill_decoder_acts *a) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const int nh = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    trill_status st = mla_queries(fp, w, ad, a);
    if (!st) st = mla_keys_values(fp, w, ad, a);
    if (!st) st = trill_attention_forward(a->att, a->q, a->k, a->v, fp->offsets, fp->n_seqs, nh, nh, qk, c->v_head_dim, d->softmax_scale, fp->precision, NULL);
    return st;
}

/* x_mid = x_in + o_proj(attention(input_norm(x_in))). Fails only when a kernel's scratch or a
 * bf16 weight's panel cannot be allocated. */
static trill_status attention_block(const trill_forward_pass *fp, const trill_layer_desc *desc, const trill_decoder_weights *w,
                                    const trill_decoder_lora *ad, trill_decoder_acts *a) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, nh = c->num_attention_heads;
    const int att_w = nh * (desc->attention == TRILL_ATTENTION_GQA ? c->head_dim : c->v_head_dim);
    trill_rmsnorm_offset_forward(a->xn1, a->x_in, w->input_norm, trill_norm_offset(c, TRILL_ROLE_INPUT_NORM), T, H, (float)c->rms_norm_eps);
    trill_status st;
    if (desc->attention == TRILL_ATTENTION_GDN) {
        st = trill_gdn_forward(fp, w, ad, a, d->out);
    } else {
        st = desc->attention == TRILL_ATTENTION_GQA ? gqa(fp, desc, w, ad, a) : mla(fp, w, ad, a);
        const float *att = a->att;
        if (!st && desc->output_gate) { /* att x sigmoid(gate) */
            for (size_t i = 0; i < (size_t)T * att_w; i++) a->att_g[i] = a->att[i] / (1.0f + expf(-a->ogate[i]));
            att = a->att_g;
        }
        if (!st) st = trill_linear_rowpar(fp, d->out, att, w->wo, ad->o, a->xa[XA_O], T, att_w, H);
    }
    if (st) return st;
    if (desc->o_bias) trill_decoder_bias_forward(d->out, w->o_bias, T, H); /* after the tensor-parallel sum: once */
    if (a->x_mid != a->x_in) memcpy(a->x_mid, a->x_in, sizeof(float) * (size_t)T * H);
    trill_residual_forward(a->x_mid, d->out, (size_t)T * H);
    return TRILL_OK;
}

/* ---- MLP ---- */

/* The router on xn2: scores, the top-k ids (or the replayed ones) and their gates.
 * Softmax: gates = probabilities at the ids, renormalised if norm_topk_prob.
 * Sigmoid with groups: group-limited top-k of scores + correction bias; gates = the unbiased
 * scores at the ids, normalised (+1e-20) when norm_topk_prob, times routed_scaling_factor. */
static trill_status route(const trill_forward_pass *fp, const trill_layer_desc *desc, const trill_decoder_weights *w, trill_decoder_acts *a,
                          int ordinal, const uint16_t *replay, uint16_t *experts) {
    const trill_config *c = &fp->m->config;
    const int T = fp->T, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    trill_status st = trill_matmul_forward_w(a->scores, a->xn2, w->router, T, H, E);
    if (st) return st;
    if (desc->router_linear_bias) trill_decoder_bias_forward(a->scores, w->router_linear_bias, T, E);
    if (desc->router == TRILL_ROUTER_SOFTMAX) {
        trill_softmax_forward(a->scores, a->scores, T, E);
        trill_topk_forward(a->moe.topi, a->moe.topw, a->scores, T, E, K);
        trill_moe_replay(a->moe.topi, replay, ordinal, c->n_moe_layers, T, K);
        trill_router_gates_forward(a->moe.topw, a->scores, a->moe.topi, T, E, K, c->norm_topk_prob, 0.0f, 1.0f);
    } else {
        trill_sigmoid_forward(a->scores, a->scores, (size_t)T * E);
        if ((st = trill_router_topk_forward(a->moe.topi, a->moe.topw, a->scores, w->router_bias, T, E, K, c->n_group, c->topk_group)))
            return st;
        trill_moe_replay(a->moe.topi, replay, ordinal, c->n_moe_layers, T, K);
        trill_router_gates_forward(a->moe.topw, a->scores, a->moe.topi, T, E, K, c->norm_topk_prob, 1e-20f, (float)c->routed_scaling_factor);
    }
    trill_moe_capture(experts, a->moe.topi, ordinal, c->n_moe_layers, T, K);
    return TRILL_OK;
}

trill_moe_experts trill_decoder_experts(const trill_config *c, const trill_layer_desc *desc, const trill_decoder_weights *w,
                                        const trill_decoder_lora *ad) {
    const bool b = desc->expert_bias;
    return (trill_moe_experts){ w->expert_gate, w->expert_up, w->expert_down, ad->expert_gate, ad->expert_up, ad->expert_down,
                                b ? w->expert_gate_bias : NULL, b ? w->expert_up_bias : NULL, b ? w->expert_down_bias : NULL,
                                desc->expert_act, (float)c->swiglu_limit, (float)c->swiglu_alpha };
}

/* The MoE block on xn2: out = routed experts (weighted by the gates) + shared experts
 * (unweighted). */
static trill_status moe_block(const trill_forward_pass *fp, const trill_layer_desc *desc, const trill_decoder_weights *w,
                              const trill_decoder_lora *ad, trill_decoder_acts *a, int ordinal, const uint16_t *replay, uint16_t *experts) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    trill_status st = route(fp, desc, w, a, ordinal, replay, experts);
    if (st) return st;
    if (desc->shared_experts) {
        const trill_mlp_weights sw = { w->shared_gate, w->shared_up, w->shared_down, ad->shared_gate, ad->shared_up, ad->shared_down, .tp = false };
        float *sh = desc->shared_expert_gate && fp->training ? a->sh_out : d->out;
        st = trill_mlp_forward(fp, sh, a->xn2, &sw, a->xa + XA_SH_GATE, 0, a->sgate, a->sup, d->act, T, H, trill_config_shared_width(c));
        if (!st && desc->shared_expert_gate) /* the shared experts' output x sigmoid(shared_expert_gate(h)) */
            st = trill_linear(fp, a->sh_logit, a->xn2, w->shared_expert_gate, ad->shared_expert_gate, a->xa[XA_SH_EGATE], T, H, 1);
        if (st) return st;
        if (desc->shared_expert_gate)
            for (size_t t = 0; t < (size_t)T; t++) {
                const float s = 1.0f / (1.0f + expf(-a->sh_logit[t]));
                for (int i = 0; i < H; i++) d->out[t * H + i] = sh[t * H + i] * s;
            }
    } else {
        memset(d->out, 0, sizeof(float) * (size_t)T * H);
    }
    const trill_moe_experts x = trill_decoder_experts(c, desc, w, ad);
    return trill_moe_experts_forward(fp, d->out, a->xn2, &x, &a->moe, a->xa + XA_GATE, d->xe, d->act, T, H, E, K, Im, ordinal);
}

/* The dense SwiGLU MLP on xn2 (pre-activations kept in moe.gate / moe.up). */
static trill_status dense_mlp(const trill_forward_pass *fp, const trill_decoder_weights *w, const trill_decoder_lora *ad, trill_decoder_acts *a) {
    const trill_decoder_pass *d = fp->acts;
    const trill_mlp_weights mw = { w->mlp_gate, w->mlp_up, w->mlp_down, ad->gate, ad->up, ad->down, .tp = true };
    return trill_mlp_forward(fp, d->out, a->xn2, &mw, a->xa + XA_GATE, 0, a->moe.gate, a->moe.up, d->act, fp->T, fp->m->config.hidden_size,
                             fp->m->config.intermediate_size);
}

/* One decoder layer: layers[l].x_in -> the next layer's input (or x_final). */
static trill_status layer(const trill_forward_pass *fp, int l, const uint16_t *replay, uint16_t *experts) {
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const trill_decoder_pass *d = fp->acts;
    const trill_layer_desc desc = trill_layer_desc_of(c, l);
    const int T = fp->T, H = c->hidden_size;
    const trill_decoder_weights *w = trill_model_layer(m, l);
    trill_decoder_acts *a = &d->layers[l];
    float *x_next = l + 1 < c->num_hidden_layers ? d->layers[l + 1].x_in : fp->x_final;
    const trill_decoder_lora *ad = fp->lora ? trill_lora_layer(fp->lora, l) : &NO_ADAPTERS;
    trill_status st = attention_block(fp, &desc, w, ad, a);
    if (st) return st;
    trill_rmsnorm_offset_forward(a->xn2, a->x_mid, w->post_norm, trill_norm_offset(c, TRILL_ROLE_POST_NORM), T, H, (float)c->rms_norm_eps);
    st = desc.moe ? moe_block(fp, &desc, w, ad, a, c->moe_ordinal[l], replay, experts) : dense_mlp(fp, w, ad, a);
    if (st) return st;
    if (x_next != a->x_mid) memcpy(x_next, a->x_mid, sizeof(float) * (size_t)T * H);
    trill_residual_forward(x_next, d->out, (size_t)T * H);
    return TRILL_OK;
}

const trill_layer_forward trill_decoder_layers = { .plan = plan, .begin = begin, .layer = layer };
