/* The Gated DeltaNet block's training forward (src/model/gdn.h; HF modeling_qwen3_next.py,
 * Qwen3NextGatedDeltaNet) and the pieces the backward and the generator share. The trainer runs
 * the delta rule's chunked form (trill_gdn_chunked_forward / _backward: GEMMs over chunks of 64
 * positions; bench_gdn at 16 heads of 128 x 128: forward 1.8x, backward 4.7x the recurrent
 * form). The generator keeps the recurrent form (src/infer/gen_gdn.c): a row's result must not
 * depend on how its sequence was cut into steps, which chunk boundaries would make it. */
#include "model/gdn.h"

#include <math.h>
#include <string.h>

#include "trill/kernels.h"

trill_gdn_dims trill_gdn_dims_of(const trill_config *c) {
    trill_gdn_dims d = { .nk = c->linear_num_key_heads, .nv = c->linear_num_value_heads, .dk = c->linear_key_head_dim,
                         .dv = c->linear_value_head_dim, .K = c->linear_conv_kernel_dim };
    d.r = d.nk > 0 ? d.nv / d.nk : 0;
    d.P = 2 * d.nk * d.dk + 2 * d.nv * d.dv;
    d.C = 2 * d.nk * d.dk + d.nv * d.dv;
    return d;
}

/* The four parts of key head h's block in a qkvz row, and of its ba block, where they go. */
#define FOR_PARTS(d, t, h, QKVZ, MIXED, Z)                                                                                               \
    const size_t blk = (size_t)(2 * (d)->dk + 2 * (d)->r * (d)->dv), rv = (size_t)(d)->r * (d)->dv;                                    \
    float *qkvz_h = (QKVZ) + (size_t)(t) * (d)->P + (size_t)(h) * blk;                                                                  \
    float *mq = (MIXED) + (size_t)(t) * (d)->C + (size_t)(h) * (d)->dk, *mk = mq + (size_t)(d)->nk * (d)->dk;                          \
    float *mv = (MIXED) + (size_t)(t) * (d)->C + 2 * (size_t)(d)->nk * (d)->dk + (size_t)(h) * rv;                                     \
    float *zz = (Z) + (size_t)(t) * (d)->nv * (d)->dv + (size_t)(h) * rv

void trill_gdn_split(const trill_gdn_dims *d, const float *qkvz, const float *ba, int n, float *mixed, float *z, float *b, float *a) {
    const size_t F = sizeof(float);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < d->nk; h++) {
            FOR_PARTS(d, t, h, (float *)qkvz, mixed, z);
            memcpy(mq, qkvz_h, F * d->dk);
            memcpy(mk, qkvz_h + d->dk, F * d->dk);
            memcpy(mv, qkvz_h + 2 * d->dk, F * rv);
            memcpy(zz, qkvz_h + 2 * d->dk + rv, F * rv);
            const float *bah = ba + (size_t)t * 2 * d->nv + (size_t)h * 2 * d->r;
            memcpy(b + (size_t)t * d->nv + (size_t)h * d->r, bah, F * d->r);
            memcpy(a + (size_t)t * d->nv + (size_t)h * d->r, bah + d->r, F * d->r);
        }
}

void trill_gdn_join(const trill_gdn_dims *d, const float *mixed, const float *z, const float *b, const float *a, int n, float *qkvz, float *ba) {
    const size_t F = sizeof(float);
    for (int t = 0; t < n; t++)
        for (int h = 0; h < d->nk; h++) {
            FOR_PARTS(d, t, h, qkvz, (float *)mixed, (float *)z);
            memcpy(qkvz_h, mq, F * d->dk);
            memcpy(qkvz_h + d->dk, mk, F * d->dk);
            memcpy(qkvz_h + 2 * d->dk, mv, F * rv);
            memcpy(qkvz_h + 2 * d->dk + rv, zz, F * rv);
            float *bah = ba + (size_t)t * 2 * d->nv + (size_t)h * 2 * d->r;
            memcpy(bah, b + (size_t)t * d->nv + (size_t)h * d->r, F * d->r);
            memcpy(bah + d->r, a + (size_t)t * d->nv + (size_t)h * d->r, F * d->r);
        }
}
#undef FOR_PARTS

void trill_gdn_gates(const trill_gdn_dims *d, const float *a, const float *b, const float *a_log, const float *dt_bias, int n, float *g,
                     float *beta) {
    for (size_t t = 0; t < (size_t)n; t++)
        for (int j = 0; j < d->nv; j++) {
            const size_t i = t * d->nv + j;
            const float x = a[i] + dt_bias[j], sp = x > 20.0f ? x : log1pf(expf(x)); /* torch's softplus (threshold 20) */
            g[i] = -expf(a_log[j]) * sp;
            beta[i] = 1.0f / (1.0f + expf(-b[i]));
        }
}

void trill_gdn_qkv(const trill_gdn_dims *d, const float *convo, int n, float *qc, float *kc, float *q, float *k, float *v) {
    const size_t F = sizeof(float), kd = (size_t)d->nk * d->dk, vd = (size_t)d->nv * d->dv;
    for (size_t t = 0; t < (size_t)n; t++) {
        memcpy(qc + t * kd, convo + t * d->C, F * kd);
        memcpy(kc + t * kd, convo + t * d->C + kd, F * kd);
        memcpy(v + t * vd, convo + t * d->C + 2 * kd, F * vd);
    }
    /* every key head's row normalised at once into q's and k's first n nk rows (one kernel call:
     * the rows' parallel regions are not per row), q scaled, then spread over the value heads
     * from the last row back (row (t, h)'s r copies start at or after its own place) */
    const float scale = 1.0f / sqrtf((float)d->dk);
    trill_l2norm_forward(q, qc, n * d->nk, d->dk, 1e-6f);
    trill_l2norm_forward(k, kc, n * d->nk, d->dk, 1e-6f);
    for (size_t i = 0; i < (size_t)n * kd; i++) q[i] *= scale;
    if (d->r == 1) return;
    for (size_t t = (size_t)n; t-- > 0;)
        for (int h = d->nk - 1; h >= 0; h--) { /* key head h serves value heads h r .. h r + r - 1 */
            const size_t from = (t * d->nk + (size_t)h) * d->dk, to = (t * d->nv + (size_t)h * d->r) * d->dk;
            for (int j = d->r - 1; j >= 0; j--) {
                memmove(q + to + (size_t)j * d->dk, q + from, F * d->dk);
                memmove(k + to + (size_t)j * d->dk, k + from, F * d->dk);
            }
        }
}

void trill_gdn_plan(const trill_config *c, trill_plan *p, size_t T, trill_gdn_acts *g) {
    const trill_gdn_dims d = trill_gdn_dims_of(c);
    const size_t F = sizeof(float), kd = (size_t)d.nk * d.dk, vd = (size_t)d.nv * d.dv;
    g->qkvz = trill_plan_take(p, T * d.P * F);
    g->ba = trill_plan_take(p, T * 2 * d.nv * F);
    g->mixed = trill_plan_take(p, T * d.C * F);
    g->convo = trill_plan_take(p, T * d.C * F);
    g->qc = trill_plan_take(p, T * kd * F);
    g->kc = trill_plan_take(p, T * kd * F);
    g->q = trill_plan_take(p, T * d.nv * d.dk * F);
    g->k = trill_plan_take(p, T * d.nv * d.dk * F);
    g->v = trill_plan_take(p, T * vd * F);
    g->z = trill_plan_take(p, T * vd * F);
    g->g = trill_plan_take(p, T * d.nv * F);
    g->beta = trill_plan_take(p, T * d.nv * F);
    g->o = trill_plan_take(p, T * vd * F);
    g->y = trill_plan_take(p, T * vd * F);
}

trill_status trill_gdn_forward(const trill_forward_pass *fp, const trill_decoder_weights *w, const trill_decoder_lora *ad,
                               trill_decoder_acts *a, float *out) {
    const trill_config *c = &fp->m->config;
    const trill_gdn_dims d = trill_gdn_dims_of(c);
    trill_gdn_acts *g = &a->gdn;
    const int T = fp->T, H = c->hidden_size, vd = d.nv * d.dv;
    trill_status st;
    /* b and a land in beta and g, which trill_gdn_gates turns into themselves */
    if (w->gdn_qkv.f32 || w->gdn_qkv.bf16) { /* Qwen3.5: each part its own projection */
        if ((st = trill_linear(fp, g->mixed, a->xn1, w->gdn_qkv, ad->gdn_qkv, a->xa[XA_GDN_QKV], T, H, d.C)) ||
            (st = trill_linear(fp, g->z, a->xn1, w->gdn_z, ad->gdn_z, a->xa[XA_GDN_Z], T, H, vd)) ||
            (st = trill_linear(fp, g->beta, a->xn1, w->gdn_b, ad->gdn_b, a->xa[XA_GDN_B], T, H, d.nv)) ||
            (st = trill_linear(fp, g->g, a->xn1, w->gdn_a, ad->gdn_a, a->xa[XA_GDN_A], T, H, d.nv)))
            return st;
    } else {
        st = trill_linear(fp, g->qkvz, a->xn1, w->gdn_qkvz, ad->gdn_qkvz, a->xa[XA_GDN_QKVZ], T, H, d.P);
        if (!st) st = trill_linear(fp, g->ba, a->xn1, w->gdn_ba, ad->gdn_ba, a->xa[XA_GDN_BA], T, H, 2 * d.nv);
        if (st) return st;
        trill_gdn_split(&d, g->qkvz, g->ba, T, g->mixed, g->z, g->beta, g->g);
    }
    trill_conv1d_causal_forward(g->convo, NULL, g->mixed, w->gdn_conv, NULL, fp->offsets, fp->n_seqs, d.C, d.K);
    trill_gdn_qkv(&d, g->convo, T, g->qc, g->kc, g->q, g->k, g->v);
    trill_gdn_gates(&d, g->g, g->beta, w->gdn_a_log, w->gdn_dt_bias, T, g->g, g->beta);
    if ((st = trill_gdn_chunked_forward(g->o, NULL, g->q, g->k, g->v, g->g, g->beta, NULL, fp->offsets, fp->n_seqs, d.nv, d.dk, d.dv)))
        return st;
    trill_rmsnorm_gated_forward(g->y, g->o, g->z, w->gdn_norm, T * d.nv, d.dv, (float)c->rms_norm_eps);
    return trill_linear_rowpar(fp, out, g->y, w->gdn_out, ad->gdn_out, a->xa[XA_GDN_OUT], T, vd, H); /* tensor parallelism: the heads' sum */
}
