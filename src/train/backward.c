/* The backward pass: the generic driver, mirroring src/model/forward.c — lm_head and the final
 * norm, then the decoder layer's backward (src/train/decoder_backward.c) layer by layer in
 * reverse, then the embedding. Gradients accumulate into blocks laid out like the parameters
 * (base weights) and like the adapters (LoRA), so a value's gradient sits at the value's offset.
 * A NULL block is not computed at all: with frozen base weights only the cheap input gradients
 * and the adapters' gradients are formed. Logits are recomputed per chunk. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/backward_internal.h"
#include "arch/family.h"
#include "base/alloc.h"
#include "trill/kernels.h"
#include "trill/train.h"

/* The driver's scratch: the residual stream's gradient, the head's, the LoRA side path's. */
typedef struct grad_scratch {
    float *dx;      /* [T, H] gradient of the residual stream, walking down the layers */
    float *dxf;     /* [T, H] gradient of the final norm's output */
    float *dlogits; /* [LOGIT_CHUNK, V] one chunk of lm_head */
    trill_lora_scratch lora;
    trill_tls_lease block;
} grad_scratch;

trill_status trill_backward_scratch(trill_tls_slot *slot, trill_tls_lease *lease, float **const *ptrs, const size_t *sizes, int n, int T) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += sizes[i];
    *lease = trill_tls_lend(slot, total * sizeof(float));
    float *b = lease->p;
    if (!b) return trill_error(TRILL_ERR_NOMEM, "out of memory for the backward pass of %d tokens", T);
    for (int i = 0; i < n; i++) { *ptrs[i] = b; b += sizes[i]; }
    return TRILL_OK;
}

static trill_tls_slot grad_slot; /* the driver's scratch */

static trill_status scratch_alloc(grad_scratch *g, const trill_model *m, int T, int rank) {
    const trill_config *c = &m->config;
    const size_t H = c->hidden_size, V = c->vocab_size, chunk = (size_t)LOGIT_CHUNK * V;
    size_t widest = chunk; /* the LoRA path's [rows, out]: an lm_head chunk or T rows of the widest adapted matrix */
    for (size_t t = 0; rank && t < m->n_tensors; t++)
        if (m->tensors[t].lora_target >= 0 && (size_t)T * (size_t)m->tensors[t].shape[0] > widest)
            widest = (size_t)T * (size_t)m->tensors[t].shape[0];
    const size_t sizes[] = { T * H, T * H, chunk, rank ? widest : 0, (size_t)T * rank };
    float **const ptrs[] = { &g->dx, &g->dxf, &g->dlogits, &g->lora.dv_lora, &g->lora.dxa };
    return trill_backward_scratch(&grad_slot, &g->block, ptrs, sizes, (int)(sizeof sizes / sizeof sizes[0]), T);
}

trill_status trill_linear_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *g, float *dinp,
                                   const float *dout, const float *inp, trill_weight W, trill_lora_pair ad, const float *xa, int n, int K,
                                   int N) {
    trill_status st = trill_matmul_backward_wp(dinp, trill_grad_of_w(sink, W), dout, inp, W, n, K, N, fp->precision);
    if (st || !fp->lora || !ad.A) return st;
    const int r = fp->lora->config.rank;
    const float s = fp->lora->scale;
    for (size_t i = 0; i < (size_t)n * N; i++) g->dv_lora[i] = s * dout[i];
    memset(g->dxa, 0, sizeof(float) * (size_t)n * r);
    st = trill_matmul_backward_p(g->dxa, trill_lora_grad_of(sink, ad.B), g->dv_lora, xa, ad.B, n, r, N, fp->precision);
    return st ? st : trill_matmul_backward_p(dinp, trill_lora_grad_of(sink, ad.A), g->dxa, inp, ad.A, n, K, r, fp->precision);
}

trill_status trill_linear_backward_colpar(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *g,
                                          float *dinp, const float *dout, const float *inp, trill_weight W, trill_lora_pair ad,
                                          const float *xa, int n, int K, int N) {
    if (!fp->m->tp || !fp->lora || !ad.A) return trill_linear_backward(fp, sink, g, dinp, dout, inp, W, ad, xa, n, K, N);
    trill_status st = trill_matmul_backward_wp(dinp, trill_grad_of_w(sink, W), dout, inp, W, n, K, N, fp->precision);
    if (st) return st;
    const int r = fp->lora->config.rank;
    const float s = fp->lora->scale;
    for (size_t i = 0; i < (size_t)n * N; i++) g->dv_lora[i] = s * dout[i];
    memset(g->dxa, 0, sizeof(float) * (size_t)n * r);
    st = trill_matmul_backward_p(g->dxa, trill_lora_grad_of(sink, ad.B), g->dv_lora, xa, ad.B, n, r, N, fp->precision);
    /* this rank's part of dinp through A, then A's gradient from the whole of x A^T's */
    if (!st) st = trill_matmul_backward_p(dinp, NULL, g->dxa, inp, ad.A, n, K, r, fp->precision);
    if (!st) st = trill_tp_sum(fp, g->dxa, (size_t)n * r);
    return st ? st : trill_matmul_backward_p(NULL, trill_lora_grad_of(sink, ad.A), g->dxa, inp, ad.A, n, K, r, fp->precision);
}

static void zero(float *p, size_t n) { memset(p, 0, n * sizeof(float)); }

/* lm_head and the final norm: dlogprobs -> d x_final (g->dx), in chunks of rows. */
static trill_status head_backward(const trill_forward_pass *fp, const float *dlogprobs, const trill_grad_sinks *sink, grad_scratch *g) {
    const trill_model *m = fp->m;
    const int T = fp->T, H = m->config.hidden_size, V = m->config.vocab_size;
    const trill_lora_pair head = fp->lora ? fp->lora->lm_head : (trill_lora_pair){ 0 };
    float *dxf = g->dxf;
    zero(dxf, (size_t)T * H);
    const int K = fp->n_targets;
    int targets[LOGIT_CHUNK];
    float dlp[LOGIT_CHUNK];
    for (int t0 = 0; t0 < T; t0 += LOGIT_CHUNK) {
        int n = T - t0 < LOGIT_CHUNK ? T - t0 : LOGIT_CHUNK;
        for (int r = 0; r < n; r++) { /* row t predicts token t+1 (or its targets), unless t ends its sequence */
            int t = t0 + r;
            bool predicts = t + 1 < T && fp->pos[t + 1] != 0;
            targets[r] = predicts ? trill_forward_target(fp, t) : 0;
            dlp[r] = predicts ? dlogprobs[(size_t)(t + 1) * K] : 0.0f;
            for (int k = 1; predicts && k < K; k++) dlp[r] += dlogprobs[(size_t)(t + 1) * K + k];
        }
        float *logits = g->dlogits; /* recomputed (with the adapter input), then overwritten by their gradient */
        trill_status st = trill_forward_logits(fp, logits, t0, n);
        if (st) return st;
        trill_token_logprob_backward(g->dlogits, dlp, logits, targets, n, V);
        for (int r = 0; K > 1 && r < n; r++) { /* top-k targets: -(sum of k) softmax, then each target's own share */
            const int t = t0 + r;
            if (t + 1 >= T || fp->pos[t + 1] == 0) continue;
            float *d = g->dlogits + (size_t)r * V;
            d[targets[r]] -= dlp[r];
            for (int k = 0; k < K; k++) d[fp->targets[(size_t)t * K + k]] += dlogprobs[(size_t)(t + 1) * K + k];
        }
        st = trill_linear_backward(fp, sink, &g->lora, dxf + (size_t)t0 * H, g->dlogits, fp->xf + (size_t)t0 * H, m->lm_head, head,
                                   fp->xa_head, n, H, V);
        if (st) return st;
    }
    zero(g->dx, (size_t)T * H);
    return trill_rmsnorm_offset_backward(g->dx, trill_grad_of(sink, m->final_norm), dxf, fp->x_final, m->final_norm,
                                         trill_norm_offset(&m->config, TRILL_ROLE_FINAL_NORM), T, H, (float)m->config.rms_norm_eps);
}

trill_status trill_model_backward(const trill_forward_pass *fp, const float *dlogprobs, float *grads, float *lora_grads) {
    return trill_model_backward_ep(fp, dlogprobs, grads, lora_grads, NULL);
}

trill_status trill_model_backward_ep(const trill_forward_pass *fp, const float *dlogprobs, float *grads, float *lora_grads,
                                     float *const *expert_grads) {
    if (fp->m->ep && grads)
        return trill_error(TRILL_ERR_UNSUPPORTED, "backward: weight gradients of an expert-parallel model (full fine-tuning) are not built; "
                           "its adapters train");
    if (fp->m->ep && lora_grads && !expert_grads && fp->lora && fp->lora->routed_first < fp->lora->n_params)
        return trill_error(TRILL_ERR_INVALID, "backward: an expert-parallel model's adapters need a gradient buffer per source rank "
                           "for its experts' (expert_grads)");
    if (!fp->training) return trill_error(TRILL_ERR_INVALID, "backward: the forward pass did not keep activations (use trill_model_forward_train)");
    if (grads && fp->m->storage != TRILL_F32)
        return trill_error(TRILL_ERR_INVALID, "backward: weight gradients need fp32 weights, but this model keeps its base in bf16 (load it with TRILL_STORE_F32 for full fine-tuning)");
    if (lora_grads && !fp->lora) return trill_error(TRILL_ERR_INVALID, "backward: adapter gradients asked for, but no enabled adapters took part in the forward pass");
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const int T = fp->T, H = c->hidden_size;
    if (T == 0 && !m->ep) return TRILL_OK; /* an expert-parallel rank with no tokens still serves its experts */
    const trill_layer_backward *f = &trill_decoder_backward;
    const trill_grad_sinks sink = { .m = m, .base = grads, .lora = fp->lora, .lora_grads = lora_grads, .expert_grads = expert_grads };
    grad_scratch g;
    void *layer_scratch = NULL;
    trill_status st = scratch_alloc(&g, m, T, fp->lora ? fp->lora->config.rank : 0);
    if (st) return st;
    if ((st = f->begin(fp, &layer_scratch))) {
        trill_tls_return(&g.block);
        return st;
    }
    if ((st = head_backward(fp, dlogprobs, &sink, &g))) trill_error_context("backward, lm_head");
    for (int l = c->num_hidden_layers - 1; l >= 0 && !st; l--) {
        if (fp->recompute) st = trill_forward_layer(fp, l); /* refill the shared buffers from the layer's saved input */
        if (!st) st = f->layer(fp, l, &sink, &g.lora, layer_scratch, g.dx);
        if (st) trill_error_context("backward, layer %d", l);
    }
    if (!st && grads) trill_embedding_backward(trill_grad_of_w(&sink, m->embed), g.dx, fp->tokens, T, H);
    f->end(layer_scratch);
    trill_tls_return(&g.block);
    return st;
}
