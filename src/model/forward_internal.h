/* The training forward pass shared by the generic drivers (src/model/forward.c, the backward in
 * src/train/backward.c) and the families' layer code (src/arch/<family>/). Not public.
 *
 * The drivers own what every family has: the packed batch, the embedding, the residual stream
 * between layers, the final norm, lm_head and the log-probs. A family owns one decoder layer:
 * its activations (planned into the pass's one allocation), its forward, and (in the train
 * layer, trill_family_backward) its backward. */
#ifndef TRILL_FORWARD_INTERNAL_H
#define TRILL_FORWARD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "model/lora_internal.h"
#include "trill/lora.h"
#include "trill/model.h"

/* Rows of lm_head + log-softmax per chunk: the full [T, V] logits would dominate memory. */
enum { LOGIT_CHUNK = 256 };

/* One allocation carved in two passes: measure (base NULL: take returns NULL), then assign. */
typedef struct trill_plan { char *base; size_t used; } trill_plan;

static inline void *trill_plan_take(trill_plan *p, size_t bytes) {
    void *at = p->base ? p->base + p->used : NULL;
    p->used += (bytes + 63) & ~(size_t)63; /* 64-byte aligned slices */
    return at;
}

typedef struct trill_forward_pass trill_forward_pass;

/* The model layer's part of a family: one decoder layer's forward. */
typedef struct trill_family_layers {
    /* Lays out the family's activations for fp->T rows (fp->training, fp->recompute and fp->lora
     * say what to keep) with trill_plan_take, sets fp->acts, fp->x_first (layer 0's input) and
     * fp->x_final (the last layer's output); called twice, measuring then assigning. */
    void (*plan)(trill_forward_pass *fp, trill_plan *p);
    /* Per-pass set-up before the first layer (e.g. RoPE tables from fp->pos). */
    void (*begin)(trill_forward_pass *fp);
    /* Layer l: its input -> the next layer's input (or x_final). replay / experts as in
     * trill_model_forward; experts may be NULL. Also re-runs a layer for recomputation. Fails
     * only when a kernel's scratch (or a bf16 weight's panel buffer) cannot be allocated. */
    trill_status (*layer)(const trill_forward_pass *fp, int l, const uint16_t *replay, uint16_t *experts);
} trill_family_layers;

/* The family's layer code for c (src/model/families.c). */
const trill_family_layers *trill_family_layers_of(const trill_config *c);

struct trill_forward_pass {
    const trill_model *m;
    const trill_family_layers *f;
    int T, n_seqs;
    const int *tokens, *offsets; /* borrowed from the caller: must outlive the pass */
    bool training;
    bool recompute;       /* training: keep only each layer's input; the backward re-runs the layer */
    const uint16_t *replay; /* borrowed router-replay ids, or NULL */
    const trill_lora *lora; /* adapters in use (attached and enabled), or NULL */
    int *pos;             /* [T] position within the sequence */
    float *x_first;       /* [T, H] layer 0's input: the embeddings (the family's buffer) */
    float *x_final;       /* [T, H] residual stream after the last layer (the family's buffer) */
    float *xf;            /* [T, H] final norm */
    float *xa_head;       /* [LOGIT_CHUNK, r] LoRA input of lm_head */
    void *acts;           /* the family's activations */
    void *block;          /* the one allocation everything above lives in */
};

/* out[n, N] = inp W^T, plus scale (inp A^T) B^T when the module has an adapter in use; the
 * LoRA input inp A^T is kept in xa for the backward pass. Fails only when a bf16 weight's panel
 * buffer cannot be had (trill_matmul_forward_w). */
trill_status trill_linear(const trill_forward_pass *fp, float *out, const float *inp, trill_weight W, trill_lora_pair ad, float *xa, int n,
                  int K, int N);

/* Re-runs layer l's forward from its saved input (activation recomputation). Fails only when
 * a kernel's scratch cannot be allocated. */
trill_status trill_forward_layer(const trill_forward_pass *fp, int l);

/* logits[n, V] of rows t0..t0+n of the pass (lm_head and its adapter); keeps the adapter input
 * in xa_head. Fails as trill_linear. */
trill_status trill_forward_logits(const trill_forward_pass *fp, float *logits, int t0, int n);

#endif
