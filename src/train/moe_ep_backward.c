/* The backward of a MoE layer's routed experts over the expert-parallel group
 * (src/model/moe_ep.h): the output gradients travel the forward's routes to the experts'
 * holders, which run each source's rows through the SwiGLU backward as the single-rank layer
 * does, with the adapter gradients going to that source's buffer; the input gradients come back
 * in expert order and each token adds them in ascending expert id. */
#include <string.h>

#include "base/tls.h"
#include "model/lora_internal.h"
#include "model/moe_ep.h"
#include "train/backward_internal.h"

static trill_tls_slot scratch_slot; /* the holder's SwiGLU and adapter scratch, sized for its largest group */

trill_status trill_ep_experts_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, float *dxn, float *dgates,
                                       const float *dout, const trill_moe_experts *x, const trill_moe_acts *a, int ordinal, int T, int H,
                                       int K, int Im) {
    trill_ep *ep = fp->m->ep;
    const trill_ep_served *sv = trill_ep_served_of(fp, ordinal);
    const int P = ep->P, El = ep->El, r = fp->lora ? fp->lora->config.rank : 0;
    const size_t row = sizeof(float) * (size_t)H, TK = (size_t)T * K;
    size_t *sb = ep->bytes + 2 * P, *rb = ep->bytes + 3 * P;
    /* out[tok] += gate * y:  dy = gate * dout,  dgate = dout . y  (the single-rank layer's arithmetic) */
    trill_status st = trill_ep_reserve(&ep->send, &ep->send_cap, TK * (size_t)H);
    if (st) return st;
    for (size_t i = 0; i < TK; i++) {
        const int pair = a->order[i];
        const float *d = dout + (size_t)(pair / K) * H, *y = a->ye + i * (size_t)H;
        float *dy = ep->send + i * (size_t)H, gw = a->topw[pair];
        double dot = 0;
        for (int j = 0; j < H; j++) {
            dy[j] = gw * d[j];
            dot += (double)d[j] * y[j];
        }
        dgates[pair] = (float)dot;
    }
    size_t R = 0, widest = 0;
    for (int p = 0; p < P; p++) {
        size_t from = 0;
        for (int el = 0; el < El; el++) {
            const size_t n = sv->cnt[(size_t)p * El + el];
            from += n;
            widest = n > widest ? n : widest;
        }
        sb[p] = trill_ep_rows_for(ep, a->count, p) * row;
        rb[p] = from * row;
        R += from;
        if (p != ep->me) {
            ep->stats.rows_sent += sb[p] / row + from;
            ep->stats.rows_received += from + sb[p] / row;
        }
    }
    if (R != sv->R) return trill_error(TRILL_ERR_INVALID, "expert parallelism: MoE layer %d served %zu rows forward, %zu now", ordinal, sv->R, R);
    if ((st = trill_ep_reserve(&ep->recv, &ep->recv_cap, 2 * R * (size_t)H))) return st;
    float *dyr = ep->recv, *dxr = ep->recv + R * (size_t)H;
    if ((st = trill_comm_alltoallv(ep->comm, ep->send, sb, dyr, rb))) return st;
    /* the held experts' backward, source by source and expert by expert */
    const size_t wide = (size_t)(H > Im ? H : Im);
    trill_tls_lease lease = trill_tls_lend(&scratch_slot, sizeof(float) * widest * (4 * (size_t)Im + wide + (size_t)r));
    float *s = lease.p;
    if (!s) return trill_error(TRILL_ERR_NOMEM, "out of memory for the expert-parallel backward of %zu rows", widest);
    const trill_mlp_scratch g = { .act = s, .dact = s + widest * Im, .dgate = s + 2 * widest * Im, .dup = s + 3 * widest * Im };
    const trill_lora_scratch lg = { .dv_lora = s + 4 * widest * Im, .dxa = s + widest * (4 * (size_t)Im + wide) };
    memset(dxr, 0, sizeof(float) * R * (size_t)H);
    size_t off = 0;
    for (int src = 0; src < P && !st; src++) {
        trill_grad_sinks own = *sink; /* this source's micro-batch's gradient of the held experts' adapters */
        if (fp->lora && fp->lora->routed_first < fp->lora->n_params) { /* a shard's adapters: the experts' kept last */
            own.lora_grads = sink->lora_grads && sink->expert_grads ? sink->expert_grads[src] : NULL;
            own.lora_first = fp->lora->routed_first;
        }
        for (int el = 0; el < El && !st; el++) {
            const size_t n = sv->cnt[(size_t)src * El + el];
            if (n == 0) continue;
            const trill_mlp_weights w = trill_moe_expert(x, el, H, Im);
            st = trill_mlp_backward(fp, &own, &lg, &g, dxr + off * H, dyr + off * H, sv->x + off * H, sv->gate + off * Im, sv->up + off * Im,
                                    &w, (float *const *)sv->xa, off, (int)n, H, Im);
            off += n;
        }
    }
    trill_tls_return(&lease);
    /* the input gradients back, in expert order; each token adds its experts' in ascending id */
    if (!st) st = trill_comm_alltoallv(ep->comm, dxr, rb, ep->send, sb);
    for (size_t i = 0; !st && i < TK; i++) {
        float *dx = dxn + (size_t)(a->order[i] / K) * H;
        const float *src = ep->send + i * (size_t)H;
        for (int j = 0; j < H; j++) dx[j] += src[j];
    }
    return st;
}
