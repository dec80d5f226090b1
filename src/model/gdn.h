/* The Gated DeltaNet block (Qwen3-Next's linear attention, HF Qwen3NextGatedDeltaNet): its
 * training forward (src/model/gdn.c), its backward (src/train/gdn_backward.c), and the pieces the
 * generator shares with them. Not public.
 *
 *   qkvz = in_proj_qkvz(x), ba = in_proj_ba(x), regrouped (trill_gdn_split) into the channels
 *   q | k | v (nk dk, nk dk, nv dv), z (nv dv), b and a (nv); the channels through the depthwise
 *   causal conv1d (kernel K) and SiLU; q and k L2-normalised per key head, q times dk^-1/2, each
 *   key head read by its r = nv / nk value heads; beta = sigmoid(b),
 *   g = -exp(A_log) softplus(a + dt_bias); the gated delta rule per value head; the gated
 *   RMSNorm per value head, w o / rms(o) silu(z); out_proj. */
#ifndef TRILL_MODEL_GDN_H
#define TRILL_MODEL_GDN_H

#include "model/decoder.h"

/* c's Gated DeltaNet sizes. */
typedef struct trill_gdn_dims { int nk, nv, dk, dv, r, K, P, C; } trill_gdn_dims;
trill_gdn_dims trill_gdn_dims_of(const trill_config *c);

/* Regroups n rows of qkvz [n, P] and ba [n, 2 nv] (HF's per key head layout: q, k, its r value
 * heads' v, their z; b for the r, then a) into mixed [n, C] (q | k | v), z [n, nv dv], b and a
 * [n, nv]; trill_gdn_join writes the inverse (dqkvz, dba from the parts' gradients). */
void trill_gdn_split(const trill_gdn_dims *d, const float *qkvz, const float *ba, int n, float *mixed, float *z, float *b, float *a);
void trill_gdn_join(const trill_gdn_dims *d, const float *mixed, const float *z, const float *b, const float *a, int n, float *qkvz, float *ba);
/* g [n, nv] = -exp(A_log) softplus(a + dt_bias) (softplus x for x > 20, as torch), beta [n, nv]
 * = sigmoid(b). g may alias a, beta b. */
void trill_gdn_gates(const trill_gdn_dims *d, const float *a, const float *b, const float *a_log, const float *dt_bias, int n, float *g,
                     float *beta);
/* From the conv's output convo [n, C]: qc, kc [n, nk dk] (copies of its q and k parts), q and k
 * [n, nv, dk] (L2-normalised, q scaled, repeated per value head), v [n, nv dv]. */
void trill_gdn_qkv(const trill_gdn_dims *d, const float *convo, int n, float *qc, float *kc, float *q, float *k, float *v);

/* The block's training forward: a->gdn from a->xn1, out [T, H] = out_proj(...). Fails as
 * trill_linear, or without the chunked kernel's scratch. */
trill_status trill_gdn_forward(const trill_forward_pass *fp, const trill_decoder_weights *w, const trill_decoder_lora *ad,
                               trill_decoder_acts *a, float *out);
/* One layer's activations in the forward's plan (trill_plan_take each). */
void trill_gdn_plan(const trill_config *c, trill_plan *p, size_t T, trill_gdn_acts *g);

#endif
