/* The backward of the decoder layer (src/model/decoder.c), every family's, with the options of its
 * layer description; the kernels' *_backward functions. Attention probabilities and SwiGLU
 * outputs are recomputed rather than stored. MLA's shared rope key gets the sum of the gradients
 * of the heads that read it; a router's gradient flows through the gates (the probabilities or
 * the unbiased sigmoid scores at the chosen ids), never through the choice or the sigmoid
 * router's correction bias, which gets none (a router's linear bias gets the logits'). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arch/family.h"
#include "base/alloc.h"
#include "model/decoder.h"
#include "train/backward_internal.h"
#include "train/gdn_backward.h"
#include "trill/kernels.h"

/* Scratch gradients of one pass's backward, carved from one allocation; the ones the model's
 * attention kind does not use are empty. */
typedef struct scratch {
    float *dxn;             /* [T, H] gradient of a normed block input */
    float *dq, *dk, *dv;    /* the attention's inputs' */
    float *datt;            /* its output's */
    float *dqr, *dkr;       /* GQA with QK-norm: before it */
    float *dkvb;            /* MLA: [T, nh*(nope + v)] */
    float *dckvn, *dckv;    /* MLA: [T, kv_lora_rank] */
    float *dkva;            /* MLA: [T, kv_lora_rank + rope] */
    float *dkrope;          /* MLA: [T, rope] the shared rope key's */
    float *dqan, *dqa;      /* MLA: [T, q_lora_rank] */
    float *dqg;             /* GQA with an output gate: [T, nh*2hd] q_proj's output's */
    float *dsh;             /* MoE with a shared expert gate: [T, H] the shared experts' output's */
    trill_mlp_scratch mlp;  /* dact, dgate, dup [T, widest MLP]; dye, dxe [T, H]; act, xe the pass's */
    float *dgates;          /* [T, K] */
    float *dlogits;         /* [T, E] router logits */
    trill_tls_lease block;  /* everything above lives in it */
} scratch;

static trill_tls_slot scratch_slot; /* reused from step to step (trill_backward_scratch) */

static trill_status begin(const trill_forward_pass *fp, void **out) {
    const trill_config *c = &fp->m->config;
    const trill_layer_desc d = trill_decoder_attention_desc(c);
    const size_t T = (size_t)fp->T, H = c->hidden_size, nh = c->num_attention_heads, Im = c->moe_intermediate_size;
    size_t ff = (size_t)c->intermediate_size > Im ? (size_t)c->intermediate_size : Im;
    if ((size_t)trill_config_shared_width(c) > ff) ff = (size_t)trill_config_shared_width(c);
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, E = c->num_experts > 0 ? c->num_experts : 1;
    size_t q = 0, k = 0, v = 0, att = 0, qr = 0, kr = 0, kvb = 0, kl = 0, kva = 0, dr = 0, ql = 0, qg = 0, sh = 0;
    if (d.attention == TRILL_ATTENTION_GQA) {
        q = att = nh * c->head_dim;
        k = v = (size_t)c->num_key_value_heads * c->head_dim;
        if (d.qk_norm) qr = q, kr = k;
        if (d.output_gate) qg = 2 * q;
    } else {
        const size_t dn = c->qk_nope_head_dim, dv = c->v_head_dim;
        dr = c->qk_rope_head_dim, kl = c->kv_lora_rank, ql = c->q_lora_rank;
        q = k = nh * (dn + dr);
        v = att = nh * dv;
        kvb = nh * (dn + dv);
        kva = kl + dr;
    }
    if (trill_config_shared_width(c) > 0) sh = H;
    scratch *g = trill_calloc(1, sizeof *g);
    if (!g) return trill_error(TRILL_ERR_NOMEM, "out of memory for the backward pass of %zu tokens", T);
    const size_t sizes[] = { T * H,  T * q,  T * k,   T * v,  T * att, T * qr, T * kr, T * kvb, T * kl, T * kl, T * kva,
                             T * dr, T * ql, T * ql,  T * ff, T * ff,  T * ff, T * H,  T * H,   T * K,  T * E, T * qg, T * sh };
    float **const ptrs[] = { &g->dxn,    &g->dq,  &g->dk,  &g->dv,       &g->datt,      &g->dqr,     &g->dkr,
                             &g->dkvb,   &g->dckvn, &g->dckv, &g->dkva,   &g->dkrope,    &g->dqan,    &g->dqa,
                             &g->mlp.dact, &g->mlp.dgate, &g->mlp.dup, &g->mlp.dye, &g->mlp.dxe, &g->dgates, &g->dlogits, &g->dqg, &g->dsh };
    trill_status st = trill_backward_scratch(&scratch_slot, &g->block, ptrs, sizes, (int)(sizeof sizes / sizeof sizes[0]), (int)T);
    if (st) {
        free(g);
        return st;
    }
    const trill_decoder_pass *p = fp->acts;
    g->mlp.act = p->act;
    g->mlp.xe = p->xe;
    *out = g;
    return TRILL_OK;
}

static void end(void *s) {
    scratch *g = s;
    if (!g) return;
    trill_tls_return(&g->block);
    free(g);
}

static void zero(float *p, size_t n) { memset(p, 0, n * sizeof(float)); }

static const trill_decoder_lora NO_ADAPTERS;

/* ---- MLP ---- */

/* MoE block: dout -> g->dxn (gradient of xn2): shared and routed experts, the router. */
static trill_status moe_backward(const trill_forward_pass *fp, const trill_layer_desc *desc, const trill_decoder_weights *w,
                                 const trill_decoder_lora *ad, const trill_decoder_acts *a, const trill_grad_sinks *sink,
                                 const trill_lora_scratch *lg, scratch *g, const float *dout, int ordinal) {
    const trill_config *c = &fp->m->config;
    const int T = fp->T, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    trill_status st = TRILL_OK;
    zero(g->dxn, (size_t)T * H);
    if (desc->shared_experts) {
        const trill_mlp_weights sw = { w->shared_gate, w->shared_up, w->shared_down, ad->shared_gate, ad->shared_up, ad->shared_down, .tp = false };
        const float *dsh = dout;
        if (desc->shared_expert_gate) { /* out = S sigmoid(l): dS = dout s, dl = (dout . S) s (1 - s) */
            for (size_t t = 0; t < (size_t)T; t++) {
                const float s = 1.0f / (1.0f + expf(-a->sh_logit[t]));
                double dot = 0;
                for (int i = 0; i < H; i++) {
                    dot += (double)dout[t * H + i] * a->sh_out[t * H + i];
                    g->dsh[t * H + i] = dout[t * H + i] * s;
                }
                g->dgates[t] = (float)dot * s * (1.0f - s); /* dgates is free until the routed experts' backward */
            }
            st = trill_linear_backward(fp, sink, lg, g->dxn, g->dgates, a->xn2, w->shared_expert_gate, ad->shared_expert_gate, a->xa[XA_SH_EGATE],
                                       T, H, 1);
            dsh = g->dsh;
        }
        if (!st)
            st = trill_mlp_backward(fp, sink, lg, &g->mlp, g->dxn, dsh, a->xn2, a->sgate, a->sup, &sw, a->xa + XA_SH_GATE, 0, T, H,
                                    trill_config_shared_width(c));
    }
    const trill_moe_experts x = trill_decoder_experts(c, desc, w, ad);
    if (!st) st = trill_moe_experts_backward(fp, sink, lg, &g->mlp, g->dxn, g->dgates, dout, a->xn2, &x, &a->moe, a->xa + XA_GATE, T, H, E, K, Im, ordinal);
    if (st) return st;
    zero(g->dlogits, (size_t)T * E);
    if (desc->router == TRILL_ROUTER_SOFTMAX) {
        trill_router_gates_backward(g->dgates, g->dgates, a->scores, a->moe.topi, T, E, K, c->norm_topk_prob, 0.0f, 1.0f); /* -> d probs at the ids */
        trill_router_softmax_backward(g->dlogits, g->dgates, a->scores, a->moe.topi, T, E, K);
    } else {
        trill_router_gates_backward(g->dgates, g->dgates, a->scores, a->moe.topi, T, E, K, c->norm_topk_prob, 1e-20f,
                                    (float)c->routed_scaling_factor); /* -> d scores at the ids */
        trill_router_sigmoid_backward(g->dlogits, g->dgates, a->scores, a->moe.topi, T, E, K);
    }
    if (desc->router_linear_bias) trill_decoder_bias_backward(trill_grad_of(sink, w->router_linear_bias), g->dlogits, T, E);
    return trill_matmul_backward_w(g->dxn, trill_grad_of_w(sink, w->router), g->dlogits, a->xn2, w->router, T, H, E);
}

/* ---- attention ---- */

void trill_decoder_bias_backward(float *db, const float *dy, int n, int N) {
    if (!db) return;
    for (size_t t = 0; t < (size_t)n; t++)
        for (int i = 0; i < N; i++) db[i] += dy[t * N + i];
}

/* RoPE's backward on each head's rotated dimensions (trill_decoder_rope_heads). */
static void rope_heads_backward(const trill_config *c, float *dx, const int *pos, const float *inv_freq, float cs, int n, int heads) {
    const int hd = c->head_dim, rd = trill_decoder_rope_dims(c);
    if (rd == hd && cs == 1.0f) trill_rope_backward(dx, pos, inv_freq, n, heads, hd);
    else trill_rope_partial_backward(dx, pos, inv_freq, n, heads, hd, 0, rd, ROPE_ROTATE_HALF, cs);
}

/* GQA: from dq, dk, dv (after the attention's backward) -> g->dxn, through RoPE, QK-norm, the
 * biases and the projections. */
static trill_status gqa_backward(const trill_forward_pass *fp, const trill_layer_desc *desc, const trill_decoder_weights *w,
                                 const trill_decoder_lora *ad, const trill_decoder_acts *a, const trill_grad_sinks *sink,
                                 const trill_lora_scratch *lg, scratch *g) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const float eps = (float)c->rms_norm_eps;
    rope_heads_backward(c, g->dq, fp->pos, d->inv_freq, d->rope_scale, T, nh);
    rope_heads_backward(c, g->dk, fp->pos, d->inv_freq, d->rope_scale, T, nkv);
    const float *dq = g->dq, *dk = g->dk;
    trill_status st;
    if (desc->qk_norm) {
        zero(g->dqr, (size_t)T * nh * hd);
        zero(g->dkr, (size_t)T * nkv * hd);
        if ((st = trill_rmsnorm_offset_backward(g->dqr, trill_grad_of(sink, w->q_norm), g->dq, a->q_raw, w->q_norm, trill_norm_offset(c, TRILL_ROLE_Q_NORM), T * nh, hd, eps)) ||
            (st = trill_rmsnorm_offset_backward(g->dkr, trill_grad_of(sink, w->k_norm), g->dk, a->k_raw, w->k_norm, trill_norm_offset(c, TRILL_ROLE_K_NORM), T * nkv, hd, eps)))
            return st;
        dq = g->dqr, dk = g->dkr;
    }
    int qw = nh * hd;
    if (desc->output_gate) { /* q_proj's output per head: q's gradient, then the gate's (the block left it in dqg's second half) */
        const size_t N = (size_t)T * nh;
        for (size_t i = 0; i < N; i++) { /* head i's writes never reach a later head's gate gradient: 2i + 2 <= N + i + 1 */
            memcpy(g->dqg + i * 2 * hd, dq + i * hd, sizeof(float) * hd);
            memmove(g->dqg + i * 2 * hd + hd, g->dqg + (N + i) * hd, sizeof(float) * hd);
        }
        dq = g->dqg, qw = 2 * nh * hd;
    }
    if (desc->qkv_bias) {
        trill_decoder_bias_backward(trill_grad_of(sink, w->q_bias), dq, T, qw);
        trill_decoder_bias_backward(trill_grad_of(sink, w->k_bias), dk, T, nkv * hd);
        trill_decoder_bias_backward(trill_grad_of(sink, w->v_bias), g->dv, T, nkv * hd);
    }
    zero(g->dxn, (size_t)T * H);
    if ((st = trill_linear_backward_colpar(fp, sink, lg, g->dxn, dq, a->xn1, w->wq, ad->q, a->xa[XA_Q], T, H, qw)) ||
        (st = trill_linear_backward_colpar(fp, sink, lg, g->dxn, dk, a->xn1, w->wk, ad->k, a->xa[XA_K], T, H, nkv * hd)) ||
        (st = trill_linear_backward_colpar(fp, sink, lg, g->dxn, g->dv, a->xn1, w->wv, ad->v, a->xa[XA_V], T, H, nkv * hd)))
        return st;
    return trill_tp_sum(fp, g->dxn, (size_t)T * H); /* the heads' parts, over the tensor-parallel group */
}

/* MLA: dk, dv -> the latent's gradient -> g->dxn += through kv_a_proj_with_mqa. */
static trill_status mla_keys_values_backward(const trill_forward_pass *fp, const trill_decoder_weights *w, const trill_decoder_lora *ad,
                                             const trill_decoder_acts *a, const trill_grad_sinks *sink, const trill_lora_scratch *lg, scratch *g) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, nh = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim;
    const int dv = c->v_head_dim, kl = c->kv_lora_rank, qk = dn + dr;
    zero(g->dkrope, (size_t)T * dr);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *dk = g->dk + ((size_t)t * nh + h) * qk;
            float *dst = g->dkvb + ((size_t)t * nh + h) * (dn + dv), *dkr = g->dkrope + (size_t)t * dr;
            memcpy(dst, dk, sizeof(float) * dn);
            memcpy(dst + dn, g->dv + ((size_t)t * nh + h) * dv, sizeof(float) * dv);
            for (int i = 0; i < dr; i++) dkr[i] += dk[dn + i];
        }
    trill_status st = trill_tp_sum(fp, g->dkrope, (size_t)T * dr); /* the rope key every head reads: the group's heads' parts */
    if (st) return st;
    trill_rope_partial_backward(g->dkrope, fp->pos, d->inv_freq, T, 1, dr, 0, dr, c->rope_interleave ? ROPE_ADJACENT : ROPE_ROTATE_HALF,
                                d->rope_scale);
    zero(g->dckvn, (size_t)T * kl);
    st = trill_linear_backward_colpar(fp, sink, lg, g->dckvn, g->dkvb, a->ckvn, w->kv_b, ad->kv_b, a->xa[XA_KV_B], T, kl, nh * (dn + dv));
    if (!st) st = trill_tp_sum(fp, g->dckvn, (size_t)T * kl);
    if (st) return st;
    zero(g->dckv, (size_t)T * kl);
    if ((st = trill_rmsnorm_backward(g->dckv, trill_grad_of(sink, w->kv_a_norm), g->dckvn, a->ckv, w->kv_a_norm, T, kl, (float)c->rms_norm_eps)))
        return st;
    for (int t = 0; t < T; t++) {
        memcpy(g->dkva + (size_t)t * (kl + dr), g->dckv + (size_t)t * kl, sizeof(float) * kl);
        memcpy(g->dkva + (size_t)t * (kl + dr) + kl, g->dkrope + (size_t)t * dr, sizeof(float) * dr);
    }
    return trill_linear_backward(fp, sink, lg, g->dxn, g->dkva, a->xn1, w->kv_a, ad->kv_a, a->xa[XA_KV_A], T, H, kl + dr);
}

/* MLA: dq -> g->dxn += through q_b, q_a_layernorm and q_a (or q_proj). */
static trill_status mla_queries_backward(const trill_forward_pass *fp, const trill_decoder_weights *w, const trill_decoder_lora *ad,
                                         const trill_decoder_acts *a, const trill_grad_sinks *sink, const trill_lora_scratch *lg, scratch *g) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, nh = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    const int ql = c->q_lora_rank;
    trill_rope_partial_backward(g->dq, fp->pos, d->inv_freq, T, nh, qk, c->qk_nope_head_dim, c->qk_rope_head_dim,
                                c->rope_interleave ? ROPE_ADJACENT : ROPE_ROTATE_HALF, d->rope_scale);
    trill_status st;
    if (!ql && fp->m->tp) { /* q_proj column-parallel: its part of the input gradient apart (dxn holds kv_a's whole one), summed, added */
        zero(g->mlp.dxe, (size_t)T * H);
        st = trill_linear_backward_colpar(fp, sink, lg, g->mlp.dxe, g->dq, a->xn1, w->wq, ad->q, a->xa[XA_Q], T, H, nh * qk);
        if (!st) st = trill_tp_sum(fp, g->mlp.dxe, (size_t)T * H);
        for (size_t i = 0; !st && i < (size_t)T * H; i++) g->dxn[i] += g->mlp.dxe[i];
        return st;
    }
    if (!ql) return trill_linear_backward(fp, sink, lg, g->dxn, g->dq, a->xn1, w->wq, ad->q, a->xa[XA_Q], T, H, nh * qk);
    zero(g->dqan, (size_t)T * ql);
    st = trill_linear_backward_colpar(fp, sink, lg, g->dqan, g->dq, a->qan, w->q_b, ad->q_b, a->xa[XA_Q_B], T, ql, nh * qk);
    if (!st) st = trill_tp_sum(fp, g->dqan, (size_t)T * ql);
    if (st) return st;
    zero(g->dqa, (size_t)T * ql);
    if ((st = trill_rmsnorm_backward(g->dqa, trill_grad_of(sink, w->q_a_norm), g->dqan, a->qa, w->q_a_norm, T, ql, (float)c->rms_norm_eps)))
        return st;
    return trill_linear_backward(fp, sink, lg, g->dxn, g->dqa, a->xn1, w->q_a, ad->q_a, a->xa[XA_Q_A], T, H, ql);
}

/* Attention block: dx (gradient of x_mid) += the attention branch's gradient of x_in. Fails only
 * when a kernel's scratch (attention's, rmsnorm's, a bf16 weight's panel) cannot be allocated. */
static trill_status attention_backward_block(const trill_forward_pass *fp, const trill_layer_desc *desc, const trill_decoder_weights *w,
                                             const trill_decoder_lora *ad, const trill_decoder_acts *a, const trill_grad_sinks *sink,
                                             const trill_lora_scratch *lg, scratch *g, float *dx) {
    const trill_config *c = &fp->m->config;
    const trill_decoder_pass *d = fp->acts;
    const bool gqa = desc->attention == TRILL_ATTENTION_GQA;
    const int T = fp->T, H = c->hidden_size, nh = c->num_attention_heads;
    const int kv_heads = gqa ? c->num_key_value_heads : nh, qk = gqa ? c->head_dim : c->qk_nope_head_dim + c->qk_rope_head_dim;
    const int dv = gqa ? c->head_dim : c->v_head_dim;
    if (desc->attention == TRILL_ATTENTION_GDN) {
        zero(g->dxn, (size_t)T * H);
        trill_status st = trill_gdn_backward(fp, sink, lg, w, ad, a, dx, g->dxn);
        if (st) return st;
        return trill_rmsnorm_offset_backward(dx, trill_grad_of(sink, w->input_norm), g->dxn, a->x_in, w->input_norm,
                                             trill_norm_offset(c, TRILL_ROLE_INPUT_NORM), T, H, (float)c->rms_norm_eps);
    }
    if (desc->o_bias) trill_decoder_bias_backward(trill_grad_of(sink, w->o_bias), dx, T, H);
    zero(g->datt, (size_t)T * nh * dv);
    trill_status st = trill_linear_backward(fp, sink, lg, g->datt, dx, desc->output_gate ? a->att_g : a->att, w->wo, ad->o, a->xa[XA_O], T,
                                            nh * dv, H);
    if (st) return st;
    if (desc->output_gate) { /* o_proj's input att s, s = sigmoid(gate): d att = d(att s) s; d gate = d(att s) att s (1 - s), kept in dqg's second half */
        const size_t N = (size_t)T * nh * dv;
        for (size_t i = 0; i < N; i++) {
            const float s = 1.0f / (1.0f + expf(-a->ogate[i])), dg = g->datt[i];
            g->datt[i] = dg * s;
            g->dqg[N + i] = dg * a->att[i] * s * (1.0f - s);
        }
    }
    zero(g->dq, (size_t)T * nh * qk);
    zero(g->dk, (size_t)T * kv_heads * qk);
    zero(g->dv, (size_t)T * kv_heads * dv);
    const trill_attention_opts opts = { .window = desc->window, .sinks = desc->sinks ? w->sinks : NULL,
                                        .dsinks = desc->sinks ? trill_grad_of(sink, w->sinks) : NULL };
    st = trill_attention_backward(g->dq, g->dk, g->dv, g->datt, a->q, a->k, a->v, fp->offsets, fp->n_seqs, nh, kv_heads, qk, dv, d->softmax_scale,
                                  fp->precision, desc->window || desc->sinks ? &opts : NULL);
    if (st) return st;
    if (gqa) {
        st = gqa_backward(fp, desc, w, ad, a, sink, lg, g);
    } else {
        zero(g->dxn, (size_t)T * H);
        if (!(st = mla_keys_values_backward(fp, w, ad, a, sink, lg, g))) st = mla_queries_backward(fp, w, ad, a, sink, lg, g);
    }
    if (st) return st;
    return trill_rmsnorm_offset_backward(dx, trill_grad_of(sink, w->input_norm), g->dxn, a->x_in, w->input_norm, trill_norm_offset(c, TRILL_ROLE_INPUT_NORM), T, H,
                                         (float)c->rms_norm_eps);
}

static trill_status layer(const trill_forward_pass *fp, int l, const trill_grad_sinks *sink, const trill_lora_scratch *lg, void *s,
                          float *dx) {
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const trill_decoder_pass *d = fp->acts;
    const trill_layer_desc desc = trill_layer_desc_of(c, l);
    scratch *g = s;
    const int T = fp->T, H = c->hidden_size;
    const trill_decoder_weights *w = trill_model_layer(m, l);
    const trill_decoder_lora *ad = fp->lora ? trill_lora_layer(fp->lora, l) : &NO_ADAPTERS;
    const trill_decoder_acts *a = &d->layers[l];
    /* dx: gradient of this layer's output = of x_mid through the residual, plus the MLP branch */
    trill_status st;
    if (desc.moe) {
        st = moe_backward(fp, &desc, w, ad, a, sink, lg, g, dx, c->moe_ordinal[l]);
    } else {
        const trill_mlp_weights mw = { w->mlp_gate, w->mlp_up, w->mlp_down, ad->gate, ad->up, ad->down, .tp = true };
        zero(g->dxn, (size_t)T * H);
        st = trill_mlp_backward(fp, sink, lg, &g->mlp, g->dxn, dx, a->xn2, a->moe.gate, a->moe.up, &mw, a->xa + XA_GATE, 0, T, H,
                                c->intermediate_size);
    }
    if (!st) st = trill_rmsnorm_offset_backward(dx, trill_grad_of(sink, w->post_norm), g->dxn, a->x_mid, w->post_norm, trill_norm_offset(c, TRILL_ROLE_POST_NORM), T,
                                                 H, (float)c->rms_norm_eps);
    if (st) return st;
    return attention_backward_block(fp, &desc, w, ad, a, sink, lg, g, dx);
}

const trill_layer_backward trill_decoder_backward = { .begin = begin, .layer = layer, .end = end };
