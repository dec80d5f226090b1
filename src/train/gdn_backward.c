/* The Gated DeltaNet block's backward (src/model/gdn.h): out_proj, the gated RMSNorm, the delta
 * rule (the chunked form's backward, the state kept before each chunk of 64), the value heads' shares of
 * their key head summed, l2norm, the conv1d with SiLU, the gates (through softplus and the
 * sigmoid), then in_proj_qkvz and in_proj_ba with their adapters. */
#include "train/gdn_backward.h"

#include <math.h>
#include <string.h>

#include "trill/kernels.h"

static trill_tls_slot gdn_slot; /* the block's gradients, reused from layer to layer and step to step */

trill_status trill_gdn_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *lg,
                                const trill_decoder_weights *w, const trill_decoder_lora *ad, const trill_decoder_acts *a, const float *dout,
                                float *dxn) {
    const trill_config *c = &fp->m->config;
    const trill_gdn_dims d = trill_gdn_dims_of(c);
    const trill_gdn_acts *ga = &a->gdn;
    const size_t T = (size_t)fp->T, H = c->hidden_size, kd = (size_t)d.nk * d.dk, vd = (size_t)d.nv * d.dv, qe = (size_t)d.nv * d.dk;
    float *dy, *dox, *dz, *dq, *dk, *dv, *dg, *dbeta, *dqc, *dkc, *dconvo, *dmixed, *dqkvz, *dba, *dqn, *dkn;
    const size_t sizes[] = { T * vd, T * vd, T * vd, T * qe, T * qe, T * vd, T * d.nv, T * d.nv, T * kd, T * kd, T * d.C, T * d.C, T * d.P, T * 2 * d.nv,
                             T * kd, T * kd };
    float **const ptrs[] = { &dy, &dox, &dz, &dq, &dk, &dv, &dg, &dbeta, &dqc, &dkc, &dconvo, &dmixed, &dqkvz, &dba, &dqn, &dkn };
    trill_tls_lease lease;
    trill_status st = trill_backward_scratch(&gdn_slot, &lease, ptrs, sizes, (int)(sizeof sizes / sizeof sizes[0]), (int)T);
    if (st) return st;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) memset(*ptrs[i], 0, sizes[i] * sizeof(float));
    const float eps = (float)c->rms_norm_eps;
    st = trill_linear_backward(fp, sink, lg, dy, dout, ga->y, w->gdn_out, ad->gdn_out, a->xa[XA_GDN_OUT], (int)T, (int)vd, (int)H);
    if (!st) st = trill_rmsnorm_gated_backward(dox, dz, trill_grad_of(sink, w->gdn_norm), dy, ga->o, ga->z, w->gdn_norm, (int)T * d.nv, d.dv, eps);
    if (!st)
        st = trill_gdn_chunked_backward(dq, dk, dv, dg, dbeta, NULL, dox, NULL, ga->q, ga->k, ga->v, ga->g, ga->beta, NULL, fp->offsets,
                                        fp->n_seqs, d.nv, d.dk, d.dv);
    if (st) {
        trill_tls_return(&lease);
        return st;
    }
    /* each key head's gradient: the sum over the value heads that read it (q's times the scale),
     * then l2norm's backward over every row at once */
    const float scale = 1.0f / sqrtf((float)d.dk);
    for (size_t t = 0; t < T; t++)
        for (int h = 0; h < d.nk; h++) {
            const float *sq = dq + (t * d.nv + (size_t)h * d.r) * d.dk, *sk = dk + (t * d.nv + (size_t)h * d.r) * d.dk;
            float *oq = dqn + (t * d.nk + (size_t)h) * d.dk, *ok = dkn + (t * d.nk + (size_t)h) * d.dk;
            for (int i = 0; i < d.dk; i++) {
                float sa = sq[i], sb = sk[i];
                for (int j = 1; j < d.r; j++) sa += sq[(size_t)j * d.dk + i], sb += sk[(size_t)j * d.dk + i];
                oq[i] = sa * scale, ok[i] = sb;
            }
        }
    trill_l2norm_backward(dqc, dqn, ga->qc, (int)T * d.nk, d.dk, 1e-6f);
    trill_l2norm_backward(dkc, dkn, ga->kc, (int)T * d.nk, d.dk, 1e-6f);
    for (size_t t = 0; t < T; t++) {
        memcpy(dconvo + t * d.C, dqc + t * kd, sizeof(float) * kd);
        memcpy(dconvo + t * d.C + kd, dkc + t * kd, sizeof(float) * kd);
        memcpy(dconvo + t * d.C + 2 * kd, dv + t * vd, sizeof(float) * vd);
    }
    trill_conv1d_causal_backward(dmixed, trill_grad_of(sink, w->gdn_conv), NULL, dconvo, ga->mixed, w->gdn_conv, NULL, fp->offsets, fp->n_seqs,
                                 d.C, d.K);
    /* beta = sigmoid(b): db = dbeta beta (1 - beta), in place; g = -exp(A_log) sp, sp = softplus(a + dt_bias):
     * dA_log += dg g, d(a + dt_bias) = dg (-exp(A_log)) sigmoid(a + dt_bias), sigmoid = 1 - exp(-sp) */
    float *da_log = trill_grad_of(sink, w->gdn_a_log), *ddt = trill_grad_of(sink, w->gdn_dt_bias);
    for (size_t t = 0; t < T; t++)
        for (int j = 0; j < d.nv; j++) {
            const size_t i = t * d.nv + j;
            const float beta = ga->beta[i], A = expf(w->gdn_a_log[j]), sp = -ga->g[i] / A, sig = -expm1f(-sp);
            dbeta[i] *= beta * (1.0f - beta);
            if (da_log) da_log[j] += dg[i] * ga->g[i];
            dg[i] *= -A * sig;
            if (ddt) ddt[j] += dg[i];
        }
    const int n = (int)T, h = (int)H;
    if (w->gdn_qkv.f32 || w->gdn_qkv.bf16) { /* Qwen3.5: each part's own projection */
        if (!(st = trill_linear_backward_colpar(fp, sink, lg, dxn, dmixed, a->xn1, w->gdn_qkv, ad->gdn_qkv, a->xa[XA_GDN_QKV], n, h, d.C)) &&
            !(st = trill_linear_backward_colpar(fp, sink, lg, dxn, dz, a->xn1, w->gdn_z, ad->gdn_z, a->xa[XA_GDN_Z], n, h, (int)vd)) &&
            !(st = trill_linear_backward_colpar(fp, sink, lg, dxn, dbeta, a->xn1, w->gdn_b, ad->gdn_b, a->xa[XA_GDN_B], n, h, d.nv)) &&
            !(st = trill_linear_backward_colpar(fp, sink, lg, dxn, dg, a->xn1, w->gdn_a, ad->gdn_a, a->xa[XA_GDN_A], n, h, d.nv)))
            st = trill_tp_sum(fp, dxn, T * H); /* the heads' parts, over the tensor-parallel group */
    } else {
        trill_gdn_join(&d, dmixed, dz, dbeta, dg, n, dqkvz, dba);
        st = trill_linear_backward_colpar(fp, sink, lg, dxn, dqkvz, a->xn1, w->gdn_qkvz, ad->gdn_qkvz, a->xa[XA_GDN_QKVZ], n, h, d.P);
        if (!st) st = trill_linear_backward_colpar(fp, sink, lg, dxn, dba, a->xn1, w->gdn_ba, ad->gdn_ba, a->xa[XA_GDN_BA], n, h, 2 * d.nv);
        if (!st) st = trill_tp_sum(fp, dxn, T * H); /* the heads' parts, over the tensor-parallel group */
    }
    trill_tls_return(&lease);
    return st;
}
