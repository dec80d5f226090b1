/* The Qwen3 / Qwen3-MoE decoder layer of the training forward (fp32; HF modeling_qwen3_moe.py):
 * RMSNorm -> q/k/v projections -> per-head q/k RMSNorm -> RoPE (rotate-half) -> causal GQA
 * attention (blocked GEMMs, trill/kernels_decl.h) -> o_proj -> residual -> RMSNorm -> the dense
 * SwiGLU MLP, or the MoE block: router softmax -> top-k (or the replayed ids) -> gate weights ->
 * tokens grouped by expert (counting sort) so each expert is one GEMM -> weighted scatter-add. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arch/qwen3/qwen3.h"
#include "trill/kernels.h"

static void plan(trill_forward_pass *fp, trill_plan *p) {
    const trill_config *c = &fp->m->config;
    const size_t T = (size_t)fp->T, H = c->hidden_size, L = c->num_hidden_layers;
    const size_t qd = (size_t)c->num_attention_heads * c->head_dim, kvd = (size_t)c->num_key_value_heads * c->head_dim;
    const size_t E = c->num_experts > 0 ? c->num_experts : 1, K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
    const size_t I = c->intermediate_size, Im = c->moe_intermediate_size, ff = I > Im * K ? I : Im * K;
    const size_t F = sizeof(float);
    qwen3_acts *q = trill_plan_take(p, sizeof *q);
    qwen3_layer_acts *layers = trill_plan_take(p, L * sizeof(qwen3_layer_acts));
    for (size_t l = 0; l < L; l++) {
        if ((!fp->training || fp->recompute) && l > 0) { /* every layer reuses layer 0's buffers ... */
            float *x_in = fp->recompute ? trill_plan_take(p, T * H * F) : NULL; /* ... but recomputation keeps each input */
            if (layers) {
                layers[l] = layers[0];
                if (fp->recompute) layers[l].x_in = x_in;
            }
            continue;
        }
        qwen3_layer_acts a = {
            .x_in = trill_plan_take(p, T * H * F), .xn1 = trill_plan_take(p, T * H * F), .q_raw = trill_plan_take(p, T * qd * F),
            .k_raw = trill_plan_take(p, T * kvd * F), .q = trill_plan_take(p, T * qd * F), .k = trill_plan_take(p, T * kvd * F),
            .v = trill_plan_take(p, T * kvd * F), .att = trill_plan_take(p, T * qd * F), .x_mid = trill_plan_take(p, T * H * F),
            .xn2 = trill_plan_take(p, T * H * F),
        };
        const bool moe = trill_config_is_moe(c, (int)l), shared = !fp->training || fp->recompute;
        const size_t gate_rows = shared || !moe ? ff : K * Im;
        a.moe.gate = trill_plan_take(p, T * gate_rows * F);
        a.moe.up = trill_plan_take(p, T * gate_rows * F);
        if (shared || moe) {
            a.moe.ye = trill_plan_take(p, T * K * H * F);
            a.probs = trill_plan_take(p, T * E * F);
            a.moe.topw = trill_plan_take(p, T * K * F);
            a.moe.topi = trill_plan_take(p, T * K * sizeof(int));
            a.moe.order = trill_plan_take(p, T * K * sizeof(int));
            a.moe.count = trill_plan_take(p, (E + 1) * sizeof(int));
        }
        if (fp->lora)
            for (int x = 0; x < XA_N; x++) a.xa[x] = trill_plan_take(p, T * K * (size_t)fp->lora->config.rank * F);
        if (layers) layers[l] = a;
    }
    /* inference: the residual stream is updated in place, so every x_in/x_mid is one buffer */
    if (!fp->training && layers)
        for (size_t l = 0; l < L; l++) layers[l].x_mid = layers[l].x_in = layers[0].x_in;
    fp->x_final = fp->training ? trill_plan_take(p, T * H * F) : (layers ? layers[0].x_in : NULL);
    float *out = trill_plan_take(p, T * H * F), *act = trill_plan_take(p, T * ff * F), *xe = trill_plan_take(p, T * H * F);
    float *inv_freq = trill_plan_take(p, (size_t)c->head_dim / 2 * F);
    fp->acts = q;
    fp->x_first = layers ? layers[0].x_in : NULL;
    if (q) *q = (qwen3_acts){ .layers = layers, .out = out, .act = act, .xe = xe, .inv_freq = inv_freq };
}

static void begin(trill_forward_pass *fp) {
    const qwen3_acts *q = fp->acts;
    trill_rope_inv_freq(q->inv_freq, fp->m->config.head_dim, fp->m->config.rope_theta);
}

static const qwen3_lora_layer NO_ADAPTERS;

/* x_mid = x_in + o_proj(attn(rope(qk_norm(q, k)), v)), on xn1 = input_norm(x_in). Fails only
 * when the attention kernel's scratch or a bf16 weight's panel cannot be allocated. */
static trill_status attention_block(const trill_forward_pass *fp, const qwen3_layer_weights *w, const qwen3_lora_layer *ad,
                            qwen3_layer_acts *a) {
    const trill_config *c = &fp->m->config;
    const qwen3_acts *q = fp->acts;
    const int T = fp->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const float eps = (float)c->rms_norm_eps;
    trill_rmsnorm_forward(a->xn1, a->x_in, w->input_norm, T, H, eps);
    trill_status st = trill_linear(fp, a->q_raw, a->xn1, w->wq, ad->q, a->xa[XA_Q], T, H, nh * hd);
    if (!st) st = trill_linear(fp, a->k_raw, a->xn1, w->wk, ad->k, a->xa[XA_K], T, H, nkv * hd);
    if (!st) st = trill_linear(fp, a->v, a->xn1, w->wv, ad->v, a->xa[XA_V], T, H, nkv * hd);
    if (st) return st;
    trill_rmsnorm_forward(a->q, a->q_raw, w->q_norm, T * nh, hd, eps); /* per head, over head_dim */
    trill_rmsnorm_forward(a->k, a->k_raw, w->k_norm, T * nkv, hd, eps);
    trill_rope_forward(a->q, fp->pos, q->inv_freq, T, nh, hd);
    trill_rope_forward(a->k, fp->pos, q->inv_freq, T, nkv, hd);
    st = trill_attention_forward(a->att, a->q, a->k, a->v, fp->offsets, fp->n_seqs, nh, nkv, hd, hd, 1 / sqrtf((float)hd), fp->precision);
    if (!st) st = trill_linear_rowpar(fp, q->out, a->att, w->wo, ad->o, a->xa[XA_O], T, nh * hd, H);
    if (st) return st;
    if (a->x_mid != a->x_in) memcpy(a->x_mid, a->x_in, sizeof(float) * (size_t)T * H);
    trill_residual_forward(a->x_mid, q->out, (size_t)T * H);
    return TRILL_OK;
}

/* HF Qwen3MoeSparseMoeBlock: probs = softmax(router(x)); the top-k experts (or the replayed
 * ids); gate weights = probs at those ids, renormalised if norm_topk_prob;
 * out = sum_k w_k * expert_k(x). Each expert's tokens are grouped into one GEMM. */
static trill_status moe_block(const trill_forward_pass *fp, const qwen3_layer_weights *w, const qwen3_lora_layer *ad, qwen3_layer_acts *a,
                      int ordinal, const uint16_t *replay, uint16_t *experts) {
    const trill_config *c = &fp->m->config;
    const qwen3_acts *q = fp->acts;
    const int T = fp->T, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    trill_status st = trill_matmul_forward_w(a->probs, a->xn2, w->router, T, H, E);
    if (st) return st;
    trill_softmax_forward(a->probs, a->probs, T, E);
    trill_topk_forward(a->moe.topi, a->moe.topw, a->probs, T, E, K);
    trill_moe_replay(a->moe.topi, replay, ordinal, c->n_moe_layers, T, K);
    trill_router_gates_forward(a->moe.topw, a->probs, a->moe.topi, T, E, K, c->norm_topk_prob, 0.0f, 1.0f);
    trill_moe_capture(experts, a->moe.topi, ordinal, c->n_moe_layers, T, K);
    memset(q->out, 0, sizeof(float) * (size_t)T * H);
    const trill_moe_experts x = { w->expert_gate, w->expert_up, w->expert_down, ad->expert_gate, ad->expert_up, ad->expert_down };
    return trill_moe_experts_forward(fp, q->out, a->xn2, &x, &a->moe, a->xa + XA_GATE, q->xe, q->act, T, H, E, K, Im, ordinal);
}

/* The dense SwiGLU MLP on xn2 (pre-activations kept in moe.gate / moe.up). */
static trill_status dense_mlp(const trill_forward_pass *fp, const qwen3_layer_weights *w, const qwen3_lora_layer *ad, qwen3_layer_acts *a) {
    const qwen3_acts *q = fp->acts;
    const trill_mlp_weights mw = { w->mlp_gate, w->mlp_up, w->mlp_down, ad->gate, ad->up, ad->down, .tp = true };
    return trill_mlp_forward(fp, q->out, a->xn2, &mw, a->xa + XA_GATE, 0, a->moe.gate, a->moe.up, q->act, fp->T, fp->m->config.hidden_size,
                             fp->m->config.intermediate_size);
}

/* One decoder layer: layers[l].x_in -> the next layer's input (or x_final). */
static trill_status layer(const trill_forward_pass *fp, int l, const uint16_t *replay, uint16_t *experts) {
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const qwen3_acts *q = fp->acts;
    const int T = fp->T, H = c->hidden_size;
    const qwen3_layer_weights *w = trill_model_layer(m, l);
    qwen3_layer_acts *a = &q->layers[l];
    float *x_next = l + 1 < c->num_hidden_layers ? q->layers[l + 1].x_in : fp->x_final;
    const qwen3_lora_layer *ad = fp->lora ? trill_lora_layer(fp->lora, l) : &NO_ADAPTERS;
    trill_status st = attention_block(fp, w, ad, a);
    if (st) return st;
    trill_rmsnorm_forward(a->xn2, a->x_mid, w->post_norm, T, H, (float)c->rms_norm_eps);
    if (trill_config_is_moe(c, l))
        st = moe_block(fp, w, ad, a, c->moe_ordinal[l], replay, experts);
    else
        st = dense_mlp(fp, w, ad, a);
    if (st) return st;
    if (x_next != a->x_mid) memcpy(x_next, a->x_mid, sizeof(float) * (size_t)T * H);
    trill_residual_forward(x_next, q->out, (size_t)T * H);
    return TRILL_OK;
}

const trill_family_layers trill_qwen3_layers = { .plan = plan, .begin = begin, .layer = layer };
