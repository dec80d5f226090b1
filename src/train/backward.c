/* The backward pass, layer by layer in reverse, mirroring src/model/forward.c with the kernels'
 * *_backward functions. Gradients accumulate into blocks laid out like the parameters (base
 * weights) and like the adapters (LoRA), so a value's gradient sits at the value's offset. A
 * NULL block is not computed at all: with frozen base weights only the cheap input gradients
 * and the adapters' gradients are formed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_internal.h"
#include "trill/kernels.h"
#include "trill/train.h"

/* Scratch gradients for one step, carved from one allocation. */
typedef struct grad_scratch {
    float *dx;          /* [T, H]  gradient of the residual stream, walking down the layers */
    float *dxn;         /* [T, H]  gradient of a normed block input */
    float *dq, *dk, *dv;/* attention */
    float *dqr, *dkr;   /* before q/k-norm */
    float *datt;
    float *dact, *dgate, *dup; /* [rows, max(I, Im)] MLP */
    float *dye, *dxe;   /* [T, H] one expert's rows */
    float *dgates;      /* [T, K] */
    float *dlogits;     /* [max(T, LOGIT_CHUNK), max(E, V)]: router logits, then lm_head chunks */
    float *dv_lora;     /* LoRA: scale * dout of one linear, [rows, out] */
    float *dxa;         /* LoRA: gradient of x A^T, [T, r] */
    void *block;
} grad_scratch;

/* Where gradients go: NULL pointers skip that kind (frozen base, or no adapters). */
typedef struct grad_sinks {
    const trill_model *m;
    float *base;        /* [n_params] laid out like m->params */
    const trill_lora *lora;
    float *lora_grads;  /* [lora->n_params] laid out like lora->params */
} grad_sinks;

static trill_status scratch_alloc(grad_scratch *g, const trill_config *c, int T, int rank) {
    const size_t H = c->hidden_size, qd = (size_t)c->num_attention_heads * c->head_dim, kvd = (size_t)c->num_key_value_heads * c->head_dim;
    const size_t I = c->intermediate_size, Im = c->moe_intermediate_size, ff = I > Im ? I : Im;
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, E = c->num_experts > 0 ? c->num_experts : 1;
    const size_t rows = (size_t)T > LOGIT_CHUNK ? (size_t)T : LOGIT_CHUNK, cols = E > (size_t)c->vocab_size ? E : (size_t)c->vocab_size;
    size_t widest = rows * cols;
    const size_t outs[] = { qd, H, I, Im };
    for (size_t i = 0; i < 4; i++) if ((size_t)T * outs[i] > widest) widest = (size_t)T * outs[i];
    size_t sizes[] = { T * H, T * H, T * qd, T * kvd, T * kvd, T * qd, T * kvd, T * qd, T * ff, T * ff, T * ff, T * H, T * H, T * K, rows * cols,
                       rank ? widest : 0, (size_t)T * rank };
    float **ptrs[] = { &g->dx, &g->dxn, &g->dq, &g->dk, &g->dv, &g->dqr, &g->dkr, &g->datt, &g->dact, &g->dgate, &g->dup,
                       &g->dye, &g->dxe, &g->dgates, &g->dlogits, &g->dv_lora, &g->dxa };
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) total += sizes[i];
    float *b = malloc(total * sizeof(float));
    if (!b) return trill_error(TRILL_ERR_NOMEM, "out of memory for the backward pass of %d tokens", T);
    g->block = b;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) { *ptrs[i] = b; b += sizes[i]; }
    return TRILL_OK;
}

/* The gradient slot of a base weight / an adapter tensor, or NULL when not wanted. */
#define GRAD(ptr) (sink->base ? sink->base + ((ptr) - sink->m->params) : NULL)
#define GRADW(w) GRAD((w).f32) /* base gradients exist only with fp32 storage (checked on entry) */
#define LGRAD(ptr) (sink->lora_grads ? sink->lora_grads + ((ptr) - sink->lora->params) : NULL)

/* Backward of linear() (src/model/forward.c): y = x W^T + scale (x A^T) B^T with xa = x A^T. */
static void linear_backward(const trill_forward_pass *fp, const grad_sinks *sink, grad_scratch *g, float *dinp, const float *dout,
                            const float *inp, trill_weight W, trill_lora_pair ad, const float *xa, int n, int K, int N) {
    matmul_backward_w(dinp, GRADW(W), dout, inp, W, n, K, N);
    if (!fp->lora || !ad.A) return;
    const int r = fp->lora->config.rank;
    const float s = fp->lora->scale;
    for (size_t i = 0; i < (size_t)n * N; i++) g->dv_lora[i] = s * dout[i];
    memset(g->dxa, 0, sizeof(float) * (size_t)n * r);
    matmul_backward(g->dxa, LGRAD(ad.B), g->dv_lora, xa, ad.B, n, r, N);
    matmul_backward(dinp, LGRAD(ad.A), g->dxa, inp, ad.A, n, K, r);
}

static void zero(float *p, size_t n) { memset(p, 0, n * sizeof(float)); }

static const trill_lora_layer NO_ADAPTERS;

/* lm_head and the final norm: dlogprobs -> d x_final, in chunks of rows. */
static void head_backward(const trill_forward_pass *fp, const float *dlogprobs, const grad_sinks *sink, grad_scratch *g) {
    const trill_model *m = fp->m;
    const int T = fp->T, H = m->config.hidden_size, V = m->config.vocab_size;
    const trill_lora_pair head = fp->lora ? fp->lora->lm_head : (trill_lora_pair){ 0 };
    float *dxf = g->dxn;
    zero(dxf, (size_t)T * H);
    int targets[LOGIT_CHUNK];
    float dlp[LOGIT_CHUNK];
    for (int t0 = 0; t0 < T; t0 += LOGIT_CHUNK) {
        int n = T - t0 < LOGIT_CHUNK ? T - t0 : LOGIT_CHUNK;
        for (int r = 0; r < n; r++) { /* row t predicts token t+1, unless t ends its sequence */
            int t = t0 + r;
            bool predicts = t + 1 < T && fp->pos[t + 1] != 0;
            targets[r] = predicts ? fp->tokens[t + 1] : 0;
            dlp[r] = predicts ? dlogprobs[t + 1] : 0.0f;
        }
        float *logits = g->dlogits; /* recomputed (with the adapter input), then overwritten by their gradient */
        trill_forward_logits(fp, logits, t0, n);
        token_logprob_backward(g->dlogits, dlp, logits, targets, n, V);
        linear_backward(fp, sink, g, dxf + (size_t)t0 * H, g->dlogits, fp->xf + (size_t)t0 * H, m->lm_head, head, fp->xa_head,
                        n, H, V);
    }
    zero(g->dx, (size_t)T * H);
    rmsnorm_backward(g->dx, GRAD(m->final_norm), dxf, fp->x_final, m->final_norm, T, H, (float)m->config.rms_norm_eps);
}

/* SwiGLU MLP of n rows given dout: weight and adapter gradients, and dinp (+=). xa are the
 * adapters' inputs saved by the forward pass for these rows (NULL without adapters). */
static void mlp_backward(const trill_forward_pass *fp, const grad_sinks *sink, grad_scratch *g, float *dinp, const float *dout,
                         const float *inp, const float *gate, const float *up, trill_weight wg, trill_weight wu, trill_weight wd,
                         trill_lora_pair ag, trill_lora_pair au, trill_lora_pair adn, float *const *xa, size_t row0, int n, int H,
                         int I) {
    const size_t at = fp->lora ? row0 * (size_t)fp->lora->config.rank : 0;
    swiglu_forward(fp->act, gate, up, (size_t)n * I); /* recomputed: cheaper than storing */
    zero(g->dact, (size_t)n * I);
    linear_backward(fp, sink, g, g->dact, dout, fp->act, wd, adn, fp->lora ? xa[XA_DOWN] + at : NULL, n, I, H);
    zero(g->dgate, (size_t)n * I);
    zero(g->dup, (size_t)n * I);
    swiglu_backward(g->dgate, g->dup, g->dact, gate, up, (size_t)n * I);
    linear_backward(fp, sink, g, dinp, g->dgate, inp, wg, ag, fp->lora ? xa[XA_GATE] + at : NULL, n, H, I);
    linear_backward(fp, sink, g, dinp, g->dup, inp, wu, au, fp->lora ? xa[XA_UP] + at : NULL, n, H, I);
}

/* MoE block: dout (= g->dx) -> g->dxn (gradient of xn2), expert, adapter and router gradients. */
static void moe_backward(const trill_forward_pass *fp, const trill_layer_weights *w, const trill_lora_layer *ad, const layer_acts *a,
                         const grad_sinks *sink, grad_scratch *g) {
    const trill_config *c = &fp->m->config;
    const int T = fp->T, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    const float *dout = g->dx;
    const trill_lora_pair none = { 0 };
    zero(g->dxn, (size_t)T * H);
    zero(g->dgates, (size_t)T * K);
    for (int e = 0; e < E; e++) {
        const int first = e ? a->count[e - 1] : 0, n = a->count[e] - first;
        if (n == 0) continue;
        const int *rows = a->order + first;
        const float *ye = a->ye + (size_t)first * H;
        for (int r = 0; r < n; r++) { /* out[tok] += gate * y:  dy = gate * dout,  dgate = dout . y */
            const float *d = dout + (size_t)(rows[r] / K) * H, *y = ye + (size_t)r * H;
            float *dy = g->dye + (size_t)r * H, gw = a->topw[rows[r]];
            double dot = 0;
            for (int i = 0; i < H; i++) {
                dy[i] = gw * d[i];
                dot += (double)d[i] * y[i];
            }
            g->dgates[rows[r]] = (float)dot;
            memcpy(fp->xe + (size_t)r * H, a->xn2 + (size_t)(rows[r] / K) * H, sizeof(float) * H);
        }
        zero(g->dxe, (size_t)n * H);
        mlp_backward(fp, sink, g, g->dxe, g->dye, fp->xe, a->gate + (size_t)first * Im, a->up + (size_t)first * Im,
                     trill_weight_at(w->expert_gate, (size_t)e * Im * H), trill_weight_at(w->expert_up, (size_t)e * Im * H),
                     trill_weight_at(w->expert_down, (size_t)e * H * Im),
                     ad->expert_gate ? ad->expert_gate[e] : none, ad->expert_up ? ad->expert_up[e] : none,
                     ad->expert_down ? ad->expert_down[e] : none, a->xa, (size_t)first, n, H, Im);
        for (int r = 0; r < n; r++) {
            float *dx = g->dxn + (size_t)(rows[r] / K) * H;
            const float *src = g->dxe + (size_t)r * H;
            for (int i = 0; i < H; i++) dx[i] += src[i];
        }
    }
    zero(g->dlogits, (size_t)T * E);
    router_gates_backward(g->dgates, g->dgates, a->probs, a->topi, T, E, K, c->norm_topk_prob, 0.0f, 1.0f); /* -> d probs at the ids */
    router_softmax_backward(g->dlogits, g->dgates, a->probs, a->topi, T, E, K);
    matmul_backward_w(g->dxn, GRADW(w->router), g->dlogits, a->xn2, w->router, T, H, E);
}

/* Attention block: g->dx (gradient of x_mid) -> adds the attention branch's gradient of x_in.
 * Fails only when the attention kernel's scratch cannot be allocated. */
static trill_status attention_backward_block(const trill_forward_pass *fp, const trill_layer_weights *w, const trill_lora_layer *ad,
                                             const layer_acts *a, const grad_sinks *sink, grad_scratch *g) {
    const trill_config *c = &fp->m->config;
    const int T = fp->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const float eps = (float)c->rms_norm_eps;
    zero(g->datt, (size_t)T * nh * hd);
    linear_backward(fp, sink, g, g->datt, g->dx, a->att, w->wo, ad->o, a->xa[XA_O], T, nh * hd, H);
    zero(g->dq, (size_t)T * nh * hd);
    zero(g->dk, (size_t)T * nkv * hd);
    zero(g->dv, (size_t)T * nkv * hd);
    trill_status st = attention_backward(g->dq, g->dk, g->dv, g->datt, a->q, a->k, a->v, fp->offsets, fp->n_seqs, nh, nkv, hd, hd,
                                         1 / sqrtf((float)hd));
    if (st) return st;
    rope_backward(g->dq, fp->pos, fp->inv_freq, T, nh, hd);
    rope_backward(g->dk, fp->pos, fp->inv_freq, T, nkv, hd);
    zero(g->dqr, (size_t)T * nh * hd);
    zero(g->dkr, (size_t)T * nkv * hd);
    rmsnorm_backward(g->dqr, GRAD(w->q_norm), g->dq, a->q_raw, w->q_norm, T * nh, hd, eps);
    rmsnorm_backward(g->dkr, GRAD(w->k_norm), g->dk, a->k_raw, w->k_norm, T * nkv, hd, eps);
    zero(g->dxn, (size_t)T * H);
    linear_backward(fp, sink, g, g->dxn, g->dqr, a->xn1, w->wq, ad->q, a->xa[XA_Q], T, H, nh * hd);
    linear_backward(fp, sink, g, g->dxn, g->dkr, a->xn1, w->wk, ad->k, a->xa[XA_K], T, H, nkv * hd);
    linear_backward(fp, sink, g, g->dxn, g->dv, a->xn1, w->wv, ad->v, a->xa[XA_V], T, H, nkv * hd);
    rmsnorm_backward(g->dx, GRAD(w->input_norm), g->dxn, a->x_in, w->input_norm, T, H, eps);
    return TRILL_OK;
}

trill_status trill_model_backward(const trill_forward_pass *fp, const float *dlogprobs, float *grads, float *lora_grads) {
    if (!fp->training) return trill_error(TRILL_ERR_INVALID, "backward: the forward pass did not keep activations (use trill_model_forward_train)");
    if (grads && fp->m->storage != TRILL_F32)
        return trill_error(TRILL_ERR_INVALID, "backward: weight gradients need fp32 weights, but this model keeps its base in bf16 (load it with TRILL_STORE_F32 for full fine-tuning)");
    if (lora_grads && !fp->lora) return trill_error(TRILL_ERR_INVALID, "backward: adapter gradients asked for, but no enabled adapters took part in the forward pass");
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const int T = fp->T, H = c->hidden_size;
    if (T == 0) return TRILL_OK;
    const grad_sinks sinks = { .m = m, .base = grads, .lora = fp->lora, .lora_grads = lora_grads }, *sink = &sinks;
    grad_scratch g;
    trill_status st = scratch_alloc(&g, c, T, fp->lora ? fp->lora->config.rank : 0);
    if (st) return st;
    head_backward(fp, dlogprobs, sink, &g);
    for (int l = c->num_hidden_layers - 1; l >= 0; l--) {
        const trill_layer_weights *w = &m->layers[l];
        const trill_lora_layer *ad = fp->lora ? &fp->lora->layers[l] : &NO_ADAPTERS;
        const layer_acts *a = &fp->layers[l];
        if (fp->recompute && (st = trill_forward_layer(fp, l))) break; /* refill the shared buffers from the layer's saved input */
        /* g.dx: gradient of this layer's output = of x_mid through the residual, plus the MLP branch */
        if (trill_config_is_moe(c, l)) {
            moe_backward(fp, w, ad, a, sink, &g);
        } else {
            zero(g.dxn, (size_t)T * H);
            mlp_backward(fp, sink, &g, g.dxn, g.dx, a->xn2, a->gate, a->up, w->mlp_gate, w->mlp_up, w->mlp_down, ad->gate, ad->up,
                         ad->down, a->xa, 0, T, H, c->intermediate_size);
        }
        rmsnorm_backward(g.dx, GRAD(w->post_norm), g.dxn, a->x_mid, w->post_norm, T, H, (float)c->rms_norm_eps);
        if ((st = attention_backward_block(fp, w, ad, a, sink, &g))) {
            trill_error_context("backward, layer %d", l);
            break;
        }
    }
    if (!st && grads) embedding_backward(GRADW(m->embed), g.dx, fp->tokens, T, H);
    free(g.block);
    return st;
}
