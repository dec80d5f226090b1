/* The forward pass's activations, shared by the forward (src/model/forward.c) and the
 * backward (src/train/backward.c). Not part of the public API. */
#ifndef TRILL_FORWARD_INTERNAL_H
#define TRILL_FORWARD_INTERNAL_H

#include <stdbool.h>

#include "trill/lora.h"
#include "trill/model.h"

/* Module kinds that carry LoRA inputs x A^T, in layer_acts.xa. */
enum { XA_Q, XA_K, XA_V, XA_O, XA_GATE, XA_UP, XA_DOWN, XA_N };

/* Rows of lm_head + log-softmax per chunk: the full [T, V] logits would dominate memory. */
enum { LOGIT_CHUNK = 256 };

/* One decoder layer's activations. In inference every layer aliases one set of buffers; in
 * training each layer has its own, kept for the backward pass. */
typedef struct layer_acts {
    float *x_in;          /* [T, H]      residual stream entering the layer */
    float *xn1;           /* [T, H]      input_layernorm(x_in) */
    float *q_raw, *k_raw; /* [T, nh*hd], [T, nkv*hd] projections before q/k-norm */
    float *q, *k, *v;     /* after q/k-norm and RoPE; v as projected */
    float *att;           /* [T, nh*hd]  attention output, before o_proj */
    float *x_mid;         /* [T, H]      x_in + o_proj(att) */
    float *xn2;           /* [T, H]      post_attention_layernorm(x_mid) */
    float *gate, *up;     /* dense: [T, I]; MoE: [T*K, Im] rows in expert order */
    float *ye;            /* MoE: [T*K, H] each routed expert's output, rows in expert order */
    float *probs;         /* MoE: [T, E] router softmax */
    float *topw;          /* MoE: [T, K] gate weights */
    int *topi;            /* MoE: [T, K] routed logical expert ids */
    int *order;           /* MoE: [T*K]  (token * K + slot) sorted by expert */
    int *count;           /* MoE: [E+1]  end of each expert's rows in order */
    float *xa[XA_N];      /* LoRA: x A^T [rows, r] per adapted module (MoE rows in expert order) */
} layer_acts;

struct trill_forward_pass {
    const trill_model *m;
    int T, n_seqs;
    const int *tokens, *offsets; /* borrowed from the caller: must outlive the pass */
    bool training;
    bool recompute;       /* training: keep only each layer's input; the backward re-runs the layer */
    const uint16_t *replay; /* borrowed router-replay ids, or NULL */
    layer_acts *layers;   /* [L]; layers[l+1].x_in is layer l's output */
    float *x_final;       /* [T, H] residual stream after the last layer */
    float *xf;            /* [T, H] final norm */
    float *out;           /* [T, H] scratch: o_proj / MLP output */
    float *act;           /* [T*max(1,K), max(I, Im)] scratch: SwiGLU output */
    float *xe;            /* [T, H] scratch: one expert's gathered rows */
    int *pos;             /* [T] position within the sequence */
    float *inv_freq;      /* [hd/2] */
    const trill_lora *lora; /* adapters in use (attached and enabled), or NULL */
    float *xa_head;       /* [LOGIT_CHUNK, r] LoRA input of lm_head */
    void *block;          /* the one allocation everything above lives in */
};

/* Re-runs layer l's forward from its saved input (activation recomputation). Fails only when
 * a kernel's scratch cannot be allocated. */
trill_status trill_forward_layer(const trill_forward_pass *fp, int l);

/* logits[n, V] of rows t0..t0+n of the pass (lm_head and its adapter); keeps the adapter input
 * in xa_head. */
void trill_forward_logits(const trill_forward_pass *fp, float *logits, int t0, int n);

#endif
