/* The backward of the Qwen3 / Qwen3-MoE decoder layer (layer.c), with the kernels' *_backward
 * functions; part of the train layer. Attention probabilities and SwiGLU outputs are recomputed
 * rather than stored. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arch/qwen3/qwen3.h"
#include "base/alloc.h"
#include "train/backward_internal.h"
#include "trill/kernels.h"

/* Scratch gradients of one pass's backward, carved from one allocation. */
typedef struct scratch {
    float *dxn;         /* [T, H]  gradient of a normed block input */
    float *dq, *dk, *dv;/* attention */
    float *dqr, *dkr;   /* before q/k-norm */
    float *datt;
    trill_mlp_scratch mlp; /* dact, dgate, dup [rows, max(I, Im)]; dye, dxe [T, H]; act, xe the pass's */
    float *dgates;      /* [T, K] */
    float *dlogits;     /* [T, E] router logits */
    trill_tls_lease block; /* everything above lives in it */
} scratch;

static trill_tls_slot scratch_slot; /* reused from step to step (trill_backward_scratch) */

static trill_status begin(const trill_forward_pass *fp, void **out) {
    const trill_config *c = &fp->m->config;
    const size_t T = (size_t)fp->T, H = c->hidden_size, qd = (size_t)c->num_attention_heads * c->head_dim,
                 kvd = (size_t)c->num_key_value_heads * c->head_dim;
    const size_t I = c->intermediate_size, Im = c->moe_intermediate_size, ff = I > Im ? I : Im;
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, E = c->num_experts > 0 ? c->num_experts : 1;
    scratch *g = trill_calloc(1, sizeof *g);
    if (!g) return trill_error(TRILL_ERR_NOMEM, "out of memory for the backward pass of %zu tokens", T);
    const size_t sizes[] = { T * H, T * qd, T * kvd, T * kvd, T * qd, T * kvd, T * qd, T * ff, T * ff, T * ff, T * H, T * H, T * K, T * E };
    float **const ptrs[] = { &g->dxn, &g->dq, &g->dk, &g->dv, &g->dqr, &g->dkr, &g->datt, &g->mlp.dact, &g->mlp.dgate, &g->mlp.dup,
                       &g->mlp.dye, &g->mlp.dxe, &g->dgates, &g->dlogits };
    trill_status st = trill_backward_scratch(&scratch_slot, &g->block, ptrs, sizes, (int)(sizeof sizes / sizeof sizes[0]), (int)T);
    if (st) {
        free(g);
        return st;
    }
    const qwen3_acts *q = fp->acts;
    g->mlp.act = q->act;
    g->mlp.xe = q->xe;
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

static const qwen3_lora_layer NO_ADAPTERS;

/* MoE block: dout -> g->dxn (gradient of xn2), expert, adapter and router gradients. */
static trill_status moe_backward(const trill_forward_pass *fp, const qwen3_layer_weights *w, const qwen3_lora_layer *ad,
                         const qwen3_layer_acts *a, const trill_grad_sinks *sink, const trill_lora_scratch *lg, scratch *g,
                         const float *dout, int ordinal) {
    const trill_config *c = &fp->m->config;
    const int T = fp->T, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    const trill_moe_experts x = { w->expert_gate, w->expert_up, w->expert_down, ad->expert_gate, ad->expert_up, ad->expert_down };
    zero(g->dxn, (size_t)T * H);
    trill_status st = trill_moe_experts_backward(fp, sink, lg, &g->mlp, g->dxn, g->dgates, dout, a->xn2, &x, &a->moe, a->xa + XA_GATE, T, H,
                                                 E, K, Im, ordinal);
    if (st) return st;
    zero(g->dlogits, (size_t)T * E);
    trill_router_gates_backward(g->dgates, g->dgates, a->probs, a->moe.topi, T, E, K, c->norm_topk_prob, 0.0f, 1.0f); /* -> d probs at the ids */
    trill_router_softmax_backward(g->dlogits, g->dgates, a->probs, a->moe.topi, T, E, K);
    return trill_matmul_backward_w(g->dxn, trill_grad_of_w(sink, w->router), g->dlogits, a->xn2, w->router, T, H, E);
}

/* Attention block: dx (gradient of x_mid) += the attention branch's gradient of x_in. Fails only
 * when a kernel's scratch (attention's, rmsnorm's, a bf16 weight's panel) cannot be allocated. */
static trill_status attention_backward_block(const trill_forward_pass *fp, const qwen3_layer_weights *w, const qwen3_lora_layer *ad,
                                     const qwen3_layer_acts *a, const trill_grad_sinks *sink, const trill_lora_scratch *lg,
                                     scratch *g, float *dx) {
    const trill_config *c = &fp->m->config;
    const qwen3_acts *q = fp->acts;
    const int T = fp->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const float eps = (float)c->rms_norm_eps;
    zero(g->datt, (size_t)T * nh * hd);
    trill_status st = trill_linear_backward(fp, sink, lg, g->datt, dx, a->att, w->wo, ad->o, a->xa[XA_O], T, nh * hd, H);
    if (st) return st;
    zero(g->dq, (size_t)T * nh * hd);
    zero(g->dk, (size_t)T * nkv * hd);
    zero(g->dv, (size_t)T * nkv * hd);
    st = trill_attention_backward(g->dq, g->dk, g->dv, g->datt, a->q, a->k, a->v, fp->offsets, fp->n_seqs, nh, nkv, hd, hd, 1 / sqrtf((float)hd), fp->precision);
    if (st) return st;
    trill_rope_backward(g->dq, fp->pos, q->inv_freq, T, nh, hd);
    trill_rope_backward(g->dk, fp->pos, q->inv_freq, T, nkv, hd);
    zero(g->dqr, (size_t)T * nh * hd);
    zero(g->dkr, (size_t)T * nkv * hd);
    if ((st = trill_rmsnorm_backward(g->dqr, trill_grad_of(sink, w->q_norm), g->dq, a->q_raw, w->q_norm, T * nh, hd, eps)) ||
        (st = trill_rmsnorm_backward(g->dkr, trill_grad_of(sink, w->k_norm), g->dk, a->k_raw, w->k_norm, T * nkv, hd, eps)))
        return st;
    zero(g->dxn, (size_t)T * H);
    if ((st = trill_linear_backward_colpar(fp, sink, lg, g->dxn, g->dqr, a->xn1, w->wq, ad->q, a->xa[XA_Q], T, H, nh * hd)) ||
        (st = trill_linear_backward_colpar(fp, sink, lg, g->dxn, g->dkr, a->xn1, w->wk, ad->k, a->xa[XA_K], T, H, nkv * hd)) ||
        (st = trill_linear_backward_colpar(fp, sink, lg, g->dxn, g->dv, a->xn1, w->wv, ad->v, a->xa[XA_V], T, H, nkv * hd)) ||
        (st = trill_tp_sum(fp, g->dxn, (size_t)T * H))) /* the heads' parts, over the tensor-parallel group */
        return st;
    return trill_rmsnorm_backward(dx, trill_grad_of(sink, w->input_norm), g->dxn, a->x_in, w->input_norm, T, H, eps);
}

static trill_status layer(const trill_forward_pass *fp, int l, const trill_grad_sinks *sink, const trill_lora_scratch *lg, void *s,
                          float *dx) {
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const qwen3_acts *q = fp->acts;
    scratch *g = s;
    const int T = fp->T, H = c->hidden_size;
    const qwen3_layer_weights *w = trill_model_layer(m, l);
    const qwen3_lora_layer *ad = fp->lora ? trill_lora_layer(fp->lora, l) : &NO_ADAPTERS;
    const qwen3_layer_acts *a = &q->layers[l];
    /* dx: gradient of this layer's output = of x_mid through the residual, plus the MLP branch */
    trill_status st;
    if (trill_config_is_moe(c, l)) {
        st = moe_backward(fp, w, ad, a, sink, lg, g, dx, c->moe_ordinal[l]);
    } else {
        const trill_mlp_weights mw = { w->mlp_gate, w->mlp_up, w->mlp_down, ad->gate, ad->up, ad->down, .tp = true };
        zero(g->dxn, (size_t)T * H);
        st = trill_mlp_backward(fp, sink, lg, &g->mlp, g->dxn, dx, a->xn2, a->moe.gate, a->moe.up, &mw, a->xa + XA_GATE, 0, T, H,
                                c->intermediate_size);
    }
    if (!st) st = trill_rmsnorm_backward(dx, trill_grad_of(sink, w->post_norm), g->dxn, a->x_mid, w->post_norm, T, H, (float)c->rms_norm_eps);
    if (st) return st;
    return attention_backward_block(fp, w, ad, a, sink, lg, g, dx);
}

const trill_family_backward trill_qwen3_backward = { .begin = begin, .layer = layer, .end = end };
