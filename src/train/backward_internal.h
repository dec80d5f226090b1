/* The backward pass shared by the generic driver (src/train/backward.c) and the decoder layer's
 * backward (src/train/decoder_backward.c). Not public. */
#ifndef TRILL_BACKWARD_INTERNAL_H
#define TRILL_BACKWARD_INTERNAL_H

#include "model/forward_internal.h"

/* Where gradients go: NULL pointers skip that kind (frozen base, or no adapters). */
typedef struct trill_grad_sinks {
    const trill_model *m;
    float *base;        /* [n_params] laid out like m->params */
    const trill_lora *lora;
    float *lora_grads;  /* laid out like lora->params from lora_first: [lora->n_params - lora_first] */
    size_t lora_first;
    /* expert parallelism: [group size] the held experts' adapter gradients from each source
     * rank's tokens, each laid out like lora->params[routed_first, n_params) (moe_ep.h) */
    float *const *expert_grads;
} trill_grad_sinks;

/* Scratch of the LoRA side path of trill_linear_backward, sized for the widest linear. */
typedef struct trill_lora_scratch {
    float *dv_lora; /* scale * dout of one linear, [rows, out] */
    float *dxa;     /* gradient of x A^T, [rows, r] */
} trill_lora_scratch;

/* The gradient slot of a base weight / an adapter tensor, or NULL when not wanted. */
static inline float *trill_grad_of(const trill_grad_sinks *sink, const float *p) {
    return sink->base ? sink->base + (p - sink->m->params) : NULL;
}
/* base gradients exist only with fp32 storage (checked on entry) */
static inline float *trill_grad_of_w(const trill_grad_sinks *sink, trill_weight w) { return trill_grad_of(sink, w.f32); }
static inline float *trill_lora_grad_of(const trill_grad_sinks *sink, const float *p) {
    return sink->lora_grads ? sink->lora_grads + ((size_t)(p - sink->lora->params) - sink->lora_first) : NULL;
}

/* Backward of trill_linear: y = x W^T + scale (x A^T) B^T with xa = x A^T; dinp += . Fails only
 * when a bf16 weight's panel buffer cannot be had (trill_matmul_backward_w). */
trill_status trill_linear_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *g, float *dinp,
                           const float *dout, const float *inp, trill_weight W, trill_lora_pair ad, const float *xa, int n, int K,
                           int N);

/* trill_linear_backward for a column-parallel projection (q/k/v, MLA's q_b/kv_b, a dense MLP's
 * gate/up): under tensor parallelism dinp gets this rank's part of the input gradient (the caller
 * sums it over the group once every such projection of the block has added its part), and the
 * adapter's x A^T gradient is summed over the group before A's gradient is formed (A is whole on
 * every rank); trill_linear_backward otherwise. */
trill_status trill_linear_backward_colpar(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *g,
                                          float *dinp, const float *dout, const float *inp, trill_weight W, trill_lora_pair ad,
                                          const float *xa, int n, int K, int N);

/* Scratch of the shared blocks' backward (src/train/blocks_backward.c): act, dact, dgate, dup
 * [rows, I] for the widest MLP; xe, dye, dxe [T, H] one expert's rows. */
typedef struct trill_mlp_scratch {
    float *act, *dact, *dgate, *dup;
    float *xe, *dye, *dxe;
} trill_mlp_scratch;

/* Backward of trill_mlp_forward given dout [n, H]: weight and adapter gradients, and dinp (+=).
 * gate/up are the forward's pre-activations, xa its adapter inputs (as passed to it). A
 * tensor-parallel MLP (w->tp) sums dinp over the group at the end: dinp must hold nothing else. */
trill_status trill_mlp_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *lg,
                                const trill_mlp_scratch *g, float *dinp, const float *dout, const float *inp, const float *gate,
                                const float *up, const trill_mlp_weights *w, float *const *xa, size_t row0, int n, int H, int I);
/* Backward of trill_moe_experts_forward given dout [T, H]: dxn [T, H] += the experts' input
 * gradient, dgates [T, K] = (writes) the gradient of each gate weight; expert and adapter
 * gradients into the sinks. */
trill_status trill_moe_experts_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *lg,
                                        const trill_mlp_scratch *g, float *dxn, float *dgates, const float *dout, const float *xn,
                                        const trill_moe_experts *x, const trill_moe_acts *a, float *const *xa, int T, int H, int E,
                                        int K, int Im, int ordinal);
/* Its expert-parallel form (src/train/moe_ep_backward.c): the output gradients to the experts'
 * holders and their input gradients back, adapter gradients into sink->expert_grads per source. */
trill_status trill_ep_experts_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, float *dxn, float *dgates,
                                       const float *dout, const trill_moe_experts *x, const trill_moe_acts *a, int ordinal, int T, int H,
                                       int K, int Im);

/* Lends `slot`'s buffer (src/base/tls.h: the memory of one step's backward serves the next) and
 * carves it into n float arrays, *ptrs[i] of sizes[i]; TRILL_ERR_NOMEM naming the T tokens. */
trill_status trill_backward_scratch(trill_tls_slot *slot, trill_tls_lease *lease, float **const *ptrs, const size_t *sizes, int n, int T);

/* One decoder layer's backward. */
typedef struct trill_layer_backward {
    /* Scratch for a pass's backward; *scratch freed with end. */
    trill_status (*begin)(const trill_forward_pass *fp, void **scratch);
    /* Layer l, its activations in the pass (recomputed first when fp->recompute): dx holds the
     * gradient of the layer's output on entry and of its input on return; weight and adapter
     * gradients accumulate into the sinks. Fails only when a kernel's scratch cannot be allocated
     * (gradients are then incomplete). */
    trill_status (*layer)(const trill_forward_pass *fp, int l, const trill_grad_sinks *sink, const trill_lora_scratch *lg,
                          void *scratch, float *dx);
    void (*end)(void *scratch);
} trill_layer_backward;

/* The decoder layer's, every family's (src/train/decoder_backward.c). */
extern const trill_layer_backward trill_decoder_backward;

#endif
