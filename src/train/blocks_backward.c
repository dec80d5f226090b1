/* The backward of the building blocks the families share (src/model/blocks.c): the SwiGLU MLP
 * and a MoE layer's routed experts. */
#include <string.h>

#include "model/decoder.h"
#include "train/backward_internal.h"
#include "trill/kernels.h"

static void zero(float *p, size_t n) { memset(p, 0, n * sizeof(float)); }

trill_status trill_mlp_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *lg,
                                const trill_mlp_scratch *g, float *dinp, const float *dout, const float *inp, const float *gate,
                                const float *up, const trill_mlp_weights *w, float *const *xa, size_t row0, int n, int H, int I) {
    const size_t at = fp->lora ? row0 * (size_t)fp->lora->config.rank : 0;
    trill_mlp_activation(w, g->act, gate, up, (size_t)n * I); /* recomputed: cheaper than storing */
    zero(g->dact, (size_t)n * I);
    trill_status st = trill_linear_backward(fp, sink, lg, g->dact, dout, g->act, w->down, w->a_down, fp->lora ? xa[2] + at : NULL, n, I, H);
    if (st) return st;
    zero(g->dgate, (size_t)n * I);
    zero(g->dup, (size_t)n * I);
    if (w->act == TRILL_EXPERT_SWIGLU_CLAMPED)
        trill_swiglu_clamped_backward(g->dgate, g->dup, g->dact, gate, up, (size_t)n * I, w->limit, w->alpha);
    else
        trill_swiglu_backward(g->dgate, g->dup, g->dact, gate, up, (size_t)n * I);
    if (w->b_down) trill_decoder_bias_backward(trill_grad_of(sink, w->b_down), dout, n, H);
    if (w->b_gate) trill_decoder_bias_backward(trill_grad_of(sink, w->b_gate), g->dgate, n, I);
    if (w->b_up) trill_decoder_bias_backward(trill_grad_of(sink, w->b_up), g->dup, n, I);
    if (w->tp && fp->m->tp) { /* gate and up column-parallel: their parts of dinp, then the group's sum */
        st = trill_linear_backward_colpar(fp, sink, lg, dinp, g->dgate, inp, w->gate, w->a_gate, fp->lora ? xa[0] + at : NULL, n, H, I);
        if (!st) st = trill_linear_backward_colpar(fp, sink, lg, dinp, g->dup, inp, w->up, w->a_up, fp->lora ? xa[1] + at : NULL, n, H, I);
        return st ? st : trill_tp_sum(fp, dinp, (size_t)n * H);
    }
    st = trill_linear_backward(fp, sink, lg, dinp, g->dgate, inp, w->gate, w->a_gate, fp->lora ? xa[0] + at : NULL, n, H, I);
    if (!st) st = trill_linear_backward(fp, sink, lg, dinp, g->dup, inp, w->up, w->a_up, fp->lora ? xa[1] + at : NULL, n, H, I);
    return st;
}

trill_status trill_moe_experts_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *lg,
                                        const trill_mlp_scratch *g, float *dxn, float *dgates, const float *dout, const float *xn,
                                        const trill_moe_experts *x, const trill_moe_acts *a, float *const *xa, int T, int H, int E,
                                        int K, int Im, int ordinal) {
    zero(dgates, (size_t)T * K);
    if (fp->m->ep) return trill_ep_experts_backward(fp, sink, dxn, dgates, dout, x, a, ordinal, T, H, K, Im);
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
            dgates[rows[r]] = (float)dot;
            memcpy(g->xe + (size_t)r * H, xn + (size_t)(rows[r] / K) * H, sizeof(float) * H);
        }
        zero(g->dxe, (size_t)n * H);
        const trill_mlp_weights w = trill_moe_expert(x, e, H, Im);
        trill_status st = trill_mlp_backward(fp, sink, lg, g, g->dxe, g->dye, g->xe, a->gate + (size_t)first * Im, a->up + (size_t)first * Im,
                                             &w, xa, (size_t)first, n, H, Im);
        if (st) return st;
        for (int r = 0; r < n; r++) {
            float *dx = dxn + (size_t)(rows[r] / K) * H;
            const float *src = g->dxe + (size_t)r * H;
            for (int i = 0; i < H; i++) dx[i] += src[i];
        }
    }
    return TRILL_OK;
}
