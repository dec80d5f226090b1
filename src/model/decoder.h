/* The decoder layer's training forward (src/model/decoder.c): its activations, which the backward
 * (src/train/decoder_backward.c) reads. Every family's layer is this one, with the options of its
 * layer description (src/arch/decoder.h). Not public. */
#ifndef TRILL_MODEL_DECODER_H
#define TRILL_MODEL_DECODER_H

#include "arch/decoder.h"
#include "model/forward_internal.h"

/* Module kinds that carry LoRA inputs x A^T, in trill_decoder_acts.xa; each MLP's gate, up,
 * down are consecutive (trill_mlp_forward's xa[0..2]). */
enum {
    XA_Q, XA_K, XA_V, XA_O, XA_Q_A, XA_Q_B, XA_KV_A, XA_KV_B, XA_GATE, XA_UP, XA_DOWN, XA_SH_GATE, XA_SH_UP, XA_SH_DOWN,
    XA_SH_EGATE, XA_GDN_QKVZ, XA_GDN_BA, XA_GDN_OUT, XA_GDN_QKV, XA_GDN_Z, XA_GDN_B, XA_GDN_A, XA_N
};

/* A Gated DeltaNet layer's activations (src/model/gdn.c): nk key heads of dk, nv value heads of
 * dv, r = nv / nk, P = 2 nk dk + 2 nv dv, C = 2 nk dk + nv dv. */
typedef struct trill_gdn_acts {
    float *qkvz;       /* [T, P] in_proj_qkvz's output */
    float *ba;         /* [T, 2 nv] in_proj_ba's */
    float *mixed;      /* [T, C] q | k | v, the conv's input */
    float *convo;      /* [T, C] the conv's output (after SiLU) */
    float *qc, *kc;    /* [T, nk dk] its q and k parts, before l2norm */
    float *q, *k;      /* [T, nv, dk] l2-normalised (q times dk^-1/2), each key head repeated for its r value heads */
    float *v, *z;      /* [T, nv dv] */
    float *g, *beta;   /* [T, nv] log decay and the write strength */
    float *o;          /* [T, nv dv] the delta rule's output */
    float *y;          /* [T, nv dv] the gated RMSNorm's (out_proj's input) */
} trill_gdn_acts;


/* One decoder layer's activations in the training forward. In inference every layer aliases one
 * set of buffers; in training each layer has its own, kept for the backward pass (with
 * recomputation each keeps only x_in). A buffer the layer's options do not use is NULL. GQA: nh
 * heads, nkv kv heads of hd; MLA: nh heads, qk = nope + rope, values of v_head_dim. */
typedef struct trill_decoder_acts {
    float *x_in;          /* [T, H] residual stream entering the layer */
    float *xn1;           /* [T, H] input_layernorm(x_in) */
    float *q_raw, *k_raw; /* GQA with QK-norm: [T, nh*hd], [T, nkv*hd] projections before it */
    float *qa, *qan;      /* MLA: [T, q_lora_rank] q_a_proj's output, and q_a_layernorm of it (q_lora_rank > 0) */
    float *ckv, *ckvn;    /* MLA: [T, kv_lora_rank] the latent, and kv_a_layernorm of it */
    float *q, *k, *v;     /* the attention's inputs: GQA after QK-norm and RoPE, v as projected; MLA
                           * q [T, nh*qk] its rope part rotated, k [T, nh*qk] each head's k_nope then
                           * the shared rotated rope key, v [T, nh*v] */
    float *att;           /* [T, nh*hd] (MLA: [T, nh*v]) attention output, before o_proj */
    float *qg;            /* GQA with an output gate: [T, nh*2hd] q_proj's output (per head q, then gate) */
    float *ogate;         /* [T, nh*hd] the gate's logits */
    float *att_g;         /* [T, nh*hd] att x sigmoid(ogate): o_proj's input */
    trill_gdn_acts gdn;   /* a Gated DeltaNet layer's */
    float *x_mid;         /* [T, H] x_in + o_proj(att) */
    float *xn2;           /* [T, H] post_attention_layernorm(x_mid) */
    /* MoE: routing and the routed experts' activations; moe.gate / moe.up also hold the dense
     * MLP's pre-activations [T, I] in a dense layer */
    trill_moe_acts moe;
    float *scores;        /* MoE: [T, E] the router's softmax probabilities or sigmoid scores */
    float *sgate, *sup;   /* MoE with shared experts: [T, n_shared * Im] their pre-activations */
    float *sh_logit;      /* MoE with a shared expert gate: [T] its logit */
    float *sh_out;        /* [T, H] the shared experts' output before the gate (training) */
    float *xa[XA_N];      /* LoRA: x A^T [rows, r] per adapted module (routed rows in expert order) */
} trill_decoder_acts;

/* The decoder's activations in a pass (trill_forward_pass.acts). */
typedef struct trill_decoder_pass {
    trill_decoder_acts *layers; /* [L]; layers[l+1].x_in is layer l's output */
    float *out;           /* [T, H] scratch: o_proj / MLP output */
    float *act;           /* [T * max(1, K), widest MLP] scratch: SwiGLU output */
    float *xe;            /* [T, H] scratch: one expert's gathered rows */
    float *kva;           /* MLA: [T, kv_lora_rank + rope] scratch: kv_a_proj_with_mqa's output */
    float *kvb;           /* MLA: [T, nh*(nope + v)] scratch: kv_b_proj's output */
    float *kr;            /* MLA: [T, rope] scratch: the shared rope key */
    float *inv_freq;      /* [rotated dims / 2] RoPE's inverse frequencies */
    float rope_scale;     /* YaRN's attention factor on cos and sin (1 without YaRN) */
    float softmax_scale;  /* the attention's: 1/sqrt(qk dims), with YaRN's mscale */
    trill_attention_kind attention;
} trill_decoder_pass;

/* The kind of c's attention layers (GQA or MLA; GQA when every layer is a Gated DeltaNet), and
 * the description of its first attention layer (layer 0's when it has none). */
trill_attention_kind trill_decoder_attention_kind(const trill_config *c);
trill_layer_desc trill_decoder_attention_desc(const trill_config *c);
/* Whether any layer of c is a Gated DeltaNet. */
bool trill_decoder_has_gdn(const trill_config *c);

/* The decoder's layer (the forward's trill_layer_forward). */
extern const trill_layer_forward trill_decoder_layers;

/* RoPE of c's attention: inv_freq[rotated dims / 2], the cos/sin multiplier (*rope_scale) and
 * the softmax scale; the training forward's and the generator's. */
void trill_decoder_rope(const trill_config *c, float *inv_freq, float *rope_scale, float *softmax_scale);
/* The number of dimensions RoPE rotates per head (inv_freq holds half as many). */
int trill_decoder_rope_dims(const trill_config *c);
/* GQA's RoPE on x [n, heads * head_dim]: each head's first trill_decoder_rope_dims dimensions,
 * rotate-half, cos and sin times cs (YaRN's; the whole head at 1: trill_rope_forward). The
 * generator's too. */
void trill_decoder_rope_heads(const trill_config *c, float *x, const int *pos, const float *inv_freq, float cs, int n, int heads);
/* A MoE layer's routed experts with the options of its description. */
trill_moe_experts trill_decoder_experts(const trill_config *c, const trill_layer_desc *desc, const trill_decoder_weights *w,
                                        const trill_decoder_lora *ad);
/* y[n, N] += b[N] on every row (a linear layer's bias). */
void trill_decoder_bias_forward(float *y, const float *b, int n, int N);
/* db[N] += the sum over rows of dy[n, N]: its gradient (rows in order; db NULL: none wanted).
 * In src/train/decoder_backward.c. */
void trill_decoder_bias_backward(float *db, const float *dy, int n, int N);
/* The widest SwiGLU of c in intermediate units per row: the dense MLP, the shared experts, or
 * the K routed experts of a token side by side. */
size_t trill_decoder_widest_mlp(const trill_config *c);

#endif
