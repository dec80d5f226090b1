/* The backward of the DeepSeek-V3 decoder layer (layer.c); part of the train layer. The shared
 * rope key's gradient is the sum over the heads that read it; the router's gradient flows
 * through the gates (the unbiased sigmoid scores at the chosen ids), never through the choice
 * or the correction bias, which gets none. */
#include <stdlib.h>
#include <string.h>

#include "arch/deepseek_v3/deepseek.h"
#include "base/alloc.h"
#include "train/backward_internal.h"
#include "trill/kernels.h"

/* Scratch gradients of one pass's backward, carved from one allocation. */
typedef struct scratch {
    float *dxn;             /* [T, H] gradient of a normed block input */
    float *dq, *dk;         /* [T, nh*qk] */
    float *dv, *datt;       /* [T, nh*v] */
    float *dkvb;            /* [T, nh*(nope + v)] */
    float *dckvn, *dckv;    /* [T, kv_lora_rank] */
    float *dkva;            /* [T, kv_lora_rank + rope] */
    float *dkr;             /* [T, rope] */
    float *dqan, *dqa;      /* [T, q_lora_rank] */
    trill_mlp_scratch mlp;  /* dact, dgate, dup [T, widest MLP]; dye, dxe [T, H]; act, xe the pass's */
    float *dgates;          /* [T, K] */
    float *dlogits;         /* [T, E] router logits */
    trill_tls_lease block;  /* everything above lives in it */
} scratch;

static trill_tls_slot scratch_slot; /* reused from step to step (trill_backward_scratch) */

static trill_status begin(const trill_forward_pass *fp, void **out) {
    const trill_config *c = &fp->m->config;
    const size_t T = (size_t)fp->T, H = c->hidden_size, nh = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim;
    const size_t dv = c->v_head_dim, kl = c->kv_lora_rank, ql = c->q_lora_rank, Im = c->moe_intermediate_size;
    size_t ff = (size_t)c->intermediate_size > Im ? (size_t)c->intermediate_size : Im;
    if (Im * c->n_shared_experts > ff) ff = Im * c->n_shared_experts;
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, E = c->num_experts > 0 ? c->num_experts : 1;
    scratch *g = trill_calloc(1, sizeof *g);
    if (!g) return trill_error(TRILL_ERR_NOMEM, "out of memory for the backward pass of %zu tokens", T);
    const size_t sizes[] = { T * H, T * nh * (dn + dr), T * nh * (dn + dr), T * nh * dv, T * nh * dv, T * nh * (dn + dv), T * kl, T * kl,
                             T * (kl + dr), T * dr, T * ql, T * ql, T * ff, T * ff, T * ff, T * H, T * H, T * K, T * E };
    float **const ptrs[] = { &g->dxn, &g->dq, &g->dk, &g->dv, &g->datt, &g->dkvb, &g->dckvn, &g->dckv, &g->dkva, &g->dkr, &g->dqan, &g->dqa,
                       &g->mlp.dact, &g->mlp.dgate, &g->mlp.dup, &g->mlp.dye, &g->mlp.dxe, &g->dgates, &g->dlogits };
    trill_status st = trill_backward_scratch(&scratch_slot, &g->block, ptrs, sizes, (int)(sizeof sizes / sizeof sizes[0]), (int)T);
    if (st) {
        free(g);
        return st;
    }
    const deepseek_acts *d = fp->acts;
    g->mlp.act = d->act;
    g->mlp.xe = d->xe;
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

static const deepseek_lora_layer NO_ADAPTERS;

/* MoE block: dout -> g->dxn (gradient of xn2): shared and routed experts, the router. */
static trill_status moe_backward(const trill_forward_pass *fp, const deepseek_layer_weights *w, const deepseek_lora_layer *ad,
                                 const deepseek_layer_acts *a, const trill_grad_sinks *sink, const trill_lora_scratch *lg, scratch *g,
                                 const float *dout, int ordinal) {
    const trill_config *c = &fp->m->config;
    const int T = fp->T, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    trill_status st = TRILL_OK;
    zero(g->dxn, (size_t)T * H);
    if (c->n_shared_experts > 0) {
        const trill_mlp_weights sw = { w->shared_gate, w->shared_up, w->shared_down, ad->shared_gate, ad->shared_up, ad->shared_down, .tp = false };
        st = trill_mlp_backward(fp, sink, lg, &g->mlp, g->dxn, dout, a->xn2, a->sgate, a->sup, &sw, a->xa + DXA_SH_GATE, 0, T, H,
                                Im * c->n_shared_experts);
    }
    const trill_moe_experts x = { w->expert_gate, w->expert_up, w->expert_down, ad->expert_gate, ad->expert_up, ad->expert_down };
    if (!st) st = trill_moe_experts_backward(fp, sink, lg, &g->mlp, g->dxn, g->dgates, dout, a->xn2, &x, &a->moe, a->xa + DXA_GATE, T, H, E, K, Im, ordinal);
    if (st) return st;
    zero(g->dlogits, (size_t)T * E);
    trill_router_gates_backward(g->dgates, g->dgates, a->scores, a->moe.topi, T, E, K, c->norm_topk_prob, 1e-20f,
                                (float)c->routed_scaling_factor); /* -> d scores at the ids */
    trill_router_sigmoid_backward(g->dlogits, g->dgates, a->scores, a->moe.topi, T, E, K);
    return trill_matmul_backward_w(g->dxn, trill_grad_of_w(sink, w->router), g->dlogits, a->xn2, w->router, T, H, E);
}

/* dk, dv -> the latent's gradient -> g->dxn += through kv_a_proj_with_mqa. */
static trill_status keys_values_backward(const trill_forward_pass *fp, const deepseek_layer_weights *w, const deepseek_lora_layer *ad,
                                         const deepseek_layer_acts *a, const trill_grad_sinks *sink, const trill_lora_scratch *lg, scratch *g) {
    const trill_config *c = &fp->m->config;
    const deepseek_acts *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, nh = c->num_attention_heads, dn = c->qk_nope_head_dim, dr = c->qk_rope_head_dim;
    const int dv = c->v_head_dim, kl = c->kv_lora_rank, qk = dn + dr;
    zero(g->dkr, (size_t)T * dr);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *dk = g->dk + ((size_t)t * nh + h) * qk;
            float *dst = g->dkvb + ((size_t)t * nh + h) * (dn + dv), *dkr = g->dkr + (size_t)t * dr;
            memcpy(dst, dk, sizeof(float) * dn);
            memcpy(dst + dn, g->dv + ((size_t)t * nh + h) * dv, sizeof(float) * dv);
            for (int i = 0; i < dr; i++) dkr[i] += dk[dn + i];
        }
    trill_status st = trill_tp_sum(fp, g->dkr, (size_t)T * dr); /* the rope key every head reads: the group's heads' parts */
    if (st) return st;
    trill_rope_partial_backward(g->dkr, fp->pos, d->inv_freq, T, 1, dr, 0, dr, c->rope_interleave ? ROPE_ADJACENT : ROPE_ROTATE_HALF,
                                d->rope_scale);
    zero(g->dckvn, (size_t)T * kl);
    st = trill_linear_backward_colpar(fp, sink, lg, g->dckvn, g->dkvb, a->ckvn, w->kv_b, ad->kv_b, a->xa[DXA_KV_B], T, kl, nh * (dn + dv));
    if (!st) st = trill_tp_sum(fp, g->dckvn, (size_t)T * kl);
    if (st) return st;
    zero(g->dckv, (size_t)T * kl);
    if ((st = trill_rmsnorm_backward(g->dckv, trill_grad_of(sink, w->kv_a_norm), g->dckvn, a->ckv, w->kv_a_norm, T, kl, (float)c->rms_norm_eps)))
        return st;
    for (int t = 0; t < T; t++) {
        memcpy(g->dkva + (size_t)t * (kl + dr), g->dckv + (size_t)t * kl, sizeof(float) * kl);
        memcpy(g->dkva + (size_t)t * (kl + dr) + kl, g->dkr + (size_t)t * dr, sizeof(float) * dr);
    }
    return trill_linear_backward(fp, sink, lg, g->dxn, g->dkva, a->xn1, w->kv_a, ad->kv_a, a->xa[DXA_KV_A], T, H, kl + dr);
}

/* dq -> g->dxn += through q_b, q_a_layernorm and q_a (or q_proj). */
static trill_status queries_backward(const trill_forward_pass *fp, const deepseek_layer_weights *w, const deepseek_lora_layer *ad,
                                     const deepseek_layer_acts *a, const trill_grad_sinks *sink, const trill_lora_scratch *lg, scratch *g) {
    const trill_config *c = &fp->m->config;
    const deepseek_acts *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, nh = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    const int ql = c->q_lora_rank;
    trill_rope_partial_backward(g->dq, fp->pos, d->inv_freq, T, nh, qk, c->qk_nope_head_dim, c->qk_rope_head_dim,
                                c->rope_interleave ? ROPE_ADJACENT : ROPE_ROTATE_HALF, d->rope_scale);
    trill_status st;
    if (!ql && fp->m->tp) { /* q_proj column-parallel: its part of the input gradient apart (dxn holds kv_a's whole one), summed, added */
        zero(g->mlp.dxe, (size_t)T * H);
        st = trill_linear_backward_colpar(fp, sink, lg, g->mlp.dxe, g->dq, a->xn1, w->q, ad->q, a->xa[DXA_Q], T, H, nh * qk);
        if (!st) st = trill_tp_sum(fp, g->mlp.dxe, (size_t)T * H);
        for (size_t i = 0; !st && i < (size_t)T * H; i++) g->dxn[i] += g->mlp.dxe[i];
        return st;
    }
    if (!ql) return trill_linear_backward(fp, sink, lg, g->dxn, g->dq, a->xn1, w->q, ad->q, a->xa[DXA_Q], T, H, nh * qk);
    zero(g->dqan, (size_t)T * ql);
    st = trill_linear_backward_colpar(fp, sink, lg, g->dqan, g->dq, a->qan, w->q_b, ad->q_b, a->xa[DXA_Q_B], T, ql, nh * qk);
    if (!st) st = trill_tp_sum(fp, g->dqan, (size_t)T * ql);
    if (st) return st;
    zero(g->dqa, (size_t)T * ql);
    if ((st = trill_rmsnorm_backward(g->dqa, trill_grad_of(sink, w->q_a_norm), g->dqan, a->qa, w->q_a_norm, T, ql, (float)c->rms_norm_eps)))
        return st;
    return trill_linear_backward(fp, sink, lg, g->dxn, g->dqa, a->xn1, w->q_a, ad->q_a, a->xa[DXA_Q_A], T, H, ql);
}

/* Attention block: dx (gradient of x_mid) += the attention branch's gradient of x_in. */
static trill_status attention_backward_block(const trill_forward_pass *fp, const deepseek_layer_weights *w, const deepseek_lora_layer *ad,
                                             const deepseek_layer_acts *a, const trill_grad_sinks *sink, const trill_lora_scratch *lg,
                                             scratch *g, float *dx) {
    const trill_config *c = &fp->m->config;
    const deepseek_acts *d = fp->acts;
    const int T = fp->T, H = c->hidden_size, nh = c->num_attention_heads, qk = c->qk_nope_head_dim + c->qk_rope_head_dim;
    const int dv = c->v_head_dim;
    zero(g->datt, (size_t)T * nh * dv);
    trill_status st = trill_linear_backward(fp, sink, lg, g->datt, dx, a->att, w->o, ad->o, a->xa[DXA_O], T, nh * dv, H);
    if (st) return st;
    zero(g->dq, (size_t)T * nh * qk);
    zero(g->dk, (size_t)T * nh * qk);
    zero(g->dv, (size_t)T * nh * dv);
    st = trill_attention_backward(g->dq, g->dk, g->dv, g->datt, a->q, a->k, a->v, fp->offsets, fp->n_seqs, nh, nh, qk, dv, d->softmax_scale, fp->precision);
    if (st) return st;
    zero(g->dxn, (size_t)T * H);
    if ((st = keys_values_backward(fp, w, ad, a, sink, lg, g)) || (st = queries_backward(fp, w, ad, a, sink, lg, g))) return st;
    return trill_rmsnorm_backward(dx, trill_grad_of(sink, w->input_norm), g->dxn, a->x_in, w->input_norm, T, H, (float)c->rms_norm_eps);
}

static trill_status layer(const trill_forward_pass *fp, int l, const trill_grad_sinks *sink, const trill_lora_scratch *lg, void *s,
                          float *dx) {
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const deepseek_acts *d = fp->acts;
    scratch *g = s;
    const int T = fp->T, H = c->hidden_size;
    const deepseek_layer_weights *w = trill_model_layer(m, l);
    const deepseek_lora_layer *ad = fp->lora ? trill_lora_layer(fp->lora, l) : &NO_ADAPTERS;
    const deepseek_layer_acts *a = &d->layers[l];
    /* dx: gradient of this layer's output = of x_mid through the residual, plus the MLP branch */
    trill_status st;
    if (trill_config_is_moe(c, l)) {
        st = moe_backward(fp, w, ad, a, sink, lg, g, dx, c->moe_ordinal[l]);
    } else {
        const trill_mlp_weights mw = { w->mlp_gate, w->mlp_up, w->mlp_down, ad->gate, ad->up, ad->down, .tp = true };
        zero(g->dxn, (size_t)T * H);
        st = trill_mlp_backward(fp, sink, lg, &g->mlp, g->dxn, dx, a->xn2, a->moe.gate, a->moe.up, &mw, a->xa + DXA_GATE, 0, T, H,
                                c->intermediate_size);
    }
    if (!st) st = trill_rmsnorm_backward(dx, trill_grad_of(sink, w->post_norm), g->dxn, a->x_mid, w->post_norm, T, H, (float)c->rms_norm_eps);
    if (st) return st;
    return attention_backward_block(fp, w, ad, a, sink, lg, g, dx);
}

const trill_family_backward trill_deepseek_backward = { .begin = begin, .layer = layer, .end = end };
