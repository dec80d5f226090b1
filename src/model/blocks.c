/* Building blocks the families' decoder layers share (src/model/forward_internal.h): the SwiGLU
 * MLP with its adapters, and a MoE layer's routed experts once the router has chosen. */
#include <string.h>

#include "model/decoder.h"
#include "model/forward_internal.h"
#include "model/moe_ep.h"
#include "trill/kernels.h"

trill_status trill_mlp_forward(const trill_forward_pass *fp, float *out, const float *inp, const trill_mlp_weights *w, float *const *xa,
                               size_t row0, float *gate, float *up, float *act, int n, int H, int I) {
    const size_t at = fp->lora ? row0 * (size_t)fp->lora->config.rank : 0;
    trill_status st = trill_linear(fp, gate, inp, w->gate, w->a_gate, fp->lora ? xa[0] + at : NULL, n, H, I);
    if (!st) st = trill_linear(fp, up, inp, w->up, w->a_up, fp->lora ? xa[1] + at : NULL, n, H, I);
    if (st) return st;
    if (w->b_gate) trill_decoder_bias_forward(gate, w->b_gate, n, I);
    if (w->b_up) trill_decoder_bias_forward(up, w->b_up, n, I);
    trill_mlp_activation(w, act, gate, up, (size_t)n * I);
    st = (w->tp ? trill_linear_rowpar : trill_linear)(fp, out, act, w->down, w->a_down, fp->lora ? xa[2] + at : NULL, n, I, H);
    if (!st && w->b_down) trill_decoder_bias_forward(out, w->b_down, n, H);
    return st;
}

void trill_mlp_activation(const trill_mlp_weights *w, float *act, const float *gate, const float *up, size_t n) {
    if (w->act == TRILL_EXPERT_SWIGLU_CLAMPED) trill_swiglu_clamped_forward(act, gate, up, n, w->limit, w->alpha);
    else trill_swiglu_forward(act, gate, up, n);
}

trill_mlp_weights trill_moe_expert(const trill_moe_experts *x, int e, int H, int Im) { /* e: the local number */
    const trill_lora_pair none = { 0 };
    return (trill_mlp_weights){
        .gate = trill_weight_at(x->gate, (size_t)e * Im * H), .up = trill_weight_at(x->up, (size_t)e * Im * H),
        .down = trill_weight_at(x->down, (size_t)e * H * Im), .a_gate = x->a_gate ? x->a_gate[e] : none,
        .a_up = x->a_up ? x->a_up[e] : none, .a_down = x->a_down ? x->a_down[e] : none,
        .b_gate = x->b_gate ? x->b_gate + (size_t)e * Im : NULL, .b_up = x->b_up ? x->b_up + (size_t)e * Im : NULL,
        .b_down = x->b_down ? x->b_down + (size_t)e * H : NULL, .act = x->act, .limit = x->limit, .alpha = x->alpha,
    };
}

/* Counting sort of the (token, slot) pairs by expert; afterwards count[e] is the end of expert
 * e's group, so the group is order[count[e-1] .. count[e]). */
static void group_by_expert(trill_moe_acts *a, int T, int E, int K) {
    memset(a->count, 0, sizeof(int) * (E + 1));
    for (int i = 0; i < T * K; i++) a->count[a->topi[i] + 1]++;
    for (int e = 0; e < E; e++) a->count[e + 1] += a->count[e];
    for (int i = 0; i < T * K; i++) a->order[a->count[a->topi[i]]++] = i;
}

void trill_moe_combine(float *out, const trill_moe_acts *a, int T, int K, int H) {
    for (int i = 0; i < T * K; i++) {
        float g = a->topw[a->order[i]];
        float *o = out + (size_t)(a->order[i] / K) * H;
        const float *y = a->ye + (size_t)i * H;
        for (int j = 0; j < H; j++) o[j] += g * y[j];
    }
}

trill_status trill_moe_experts_forward(const trill_forward_pass *fp, float *out, const float *xn, const trill_moe_experts *x,
                                       trill_moe_acts *a, float *const *xa, float *xe, float *act, int T, int H, int E, int K, int Im,
                                       int ordinal) {
    group_by_expert(a, T, E, K);
    if (fp->m->ep) return trill_ep_experts_forward(fp, out, xn, x, a, ordinal, T, H, K, Im);
    for (int e = 0; e < E; e++) {
        const int first = e ? a->count[e - 1] : 0, n = a->count[e] - first;
        if (n == 0) continue;
        const int *rows = a->order + first;
        for (int r = 0; r < n; r++) memcpy(xe + (size_t)r * H, xn + (size_t)(rows[r] / K) * H, sizeof(float) * H);
        const trill_mlp_weights w = trill_moe_expert(x, e, H, Im);
        trill_status st = trill_mlp_forward(fp, a->ye + (size_t)first * H, xe, &w, xa, (size_t)first, a->gate + (size_t)first * Im,
                                            a->up + (size_t)first * Im, act, n, H, Im);
        if (st) return st;
    }
    trill_moe_combine(out, a, T, K, H);
    return TRILL_OK;
}

void trill_moe_replay(int *topi, const uint16_t *replay, int ordinal, int n_moe_layers, int T, int K) {
    if (!replay) return;
    for (int t = 0; t < T; t++) {
        const uint16_t *ids = replay + ((size_t)t * n_moe_layers + ordinal) * K;
        if (ids[0] == TRILL_REPLAY_NONE) continue; /* this token routes itself */
        for (int j = 0; j < K; j++) topi[t * K + j] = ids[j];
    }
}

void trill_moe_capture(uint16_t *experts, const int *topi, int ordinal, int n_moe_layers, int T, int K) {
    if (!experts) return;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) experts[((size_t)t * n_moe_layers + ordinal) * K + j] = (uint16_t)topi[t * K + j];
}
