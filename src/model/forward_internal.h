/* The training forward pass shared by the generic drivers (src/model/forward.c, the backward in
 * src/train/backward.c) and the decoder layer (src/model/decoder.c). Not public.
 *
 * The drivers own the packed batch, the embedding, the residual stream between layers, the final
 * norm, lm_head and the log-probs. The decoder layer, every family's with the options of its
 * layer description, owns its activations (planned into the pass's one allocation), its forward,
 * and (in the train layer, trill_layer_backward) its backward. */
#ifndef TRILL_FORWARD_INTERNAL_H
#define TRILL_FORWARD_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "arch/decoder.h"
#include "base/tls.h"
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

/* One decoder layer's forward (the decoder's, src/model/decoder.c). */
typedef struct trill_layer_forward {
    /* Lays out the layers' activations for fp->T rows (fp->training, fp->recompute and fp->lora
     * say what to keep) with trill_plan_take, sets fp->acts, fp->x_first (layer 0's input) and
     * fp->x_final (the last layer's output); called twice, measuring then assigning. */
    void (*plan)(trill_forward_pass *fp, trill_plan *p);
    /* Per-pass set-up before the first layer (e.g. RoPE tables from fp->pos). */
    void (*begin)(trill_forward_pass *fp);
    /* Layer l: its input -> the next layer's input (or x_final). replay / experts as in
     * trill_model_forward; experts may be NULL. Also re-runs a layer for recomputation. Fails
     * only when a kernel's scratch (or a bf16 weight's panel buffer) cannot be allocated. */
    trill_status (*layer)(const trill_forward_pass *fp, int l, const uint16_t *replay, uint16_t *experts);
} trill_layer_forward;

struct trill_forward_pass {
    const trill_model *m;
    const trill_layer_forward *f;
    int T, n_seqs;
    const int *tokens, *offsets; /* borrowed from the caller: must outlive the pass */
    const int *targets;   /* borrowed: [T][n_targets] the tokens row t is scored on; NULL: the next input token */
    int n_targets;        /* targets a row (1 without targets); logprobs are [T][n_targets] */
    bool training;
    bool recompute;       /* training: keep only each layer's input; the backward re-runs the layer */
    const uint16_t *replay; /* borrowed router-replay ids, or NULL */
    const trill_lora *lora; /* adapters in use (attached and enabled), or NULL */
    trill_precision precision; /* the model's, when the pass began: of every matmul but the router's */
    int *pos;             /* [T] position within the sequence */
    float *x_first;       /* [T, H] layer 0's input: the embeddings (the decoder's buffer) */
    float *x_final;       /* [T, H] residual stream after the last layer (the decoder's buffer) */
    float *xf;            /* [T, H] final norm */
    float *xa_head;       /* [LOGIT_CHUNK, r] LoRA input of lm_head */
    void *acts;           /* the decoder's activations (trill_decoder_pass) */
    struct trill_ep_served_set *ep_served; /* expert parallelism: what this rank serves in the pass (src/model/moe_ep.h) */
    trill_tls_lease block; /* the one allocation everything above lives in (the thread's, reused) */
};

/* out[n, N] = inp W^T, plus scale (inp A^T) B^T when the module has an adapter in use; the
 * LoRA input inp A^T is kept in xa for the backward pass. Fails only when a bf16 weight's panel
 * buffer cannot be had (trill_matmul_forward_w). */
trill_status trill_linear(const trill_forward_pass *fp, float *out, const float *inp, trill_weight W, trill_lora_pair ad, float *xa, int n,
                  int K, int N);

/* ---- tensor parallelism (src/model/tp.c) ---- */

/* data[n] summed over the model's tensor-parallel group in rank order (nothing without one). */
trill_status trill_tp_sum(const trill_forward_pass *fp, float *data, size_t n);
/* trill_linear for a row-parallel projection (o_proj, a dense MLP's down_proj): under tensor
 * parallelism inp and W hold this rank's share of the input features, and out is the group's sum
 * of inp W^T plus scale (the group's sum of inp A^T) B^T, the same on every rank; trill_linear
 * otherwise. */
trill_status trill_linear_rowpar(const trill_forward_pass *fp, float *out, const float *inp, trill_weight W, trill_lora_pair ad, float *xa,
                                 int n, int K, int N);

/* ---- building blocks the families share (src/model/blocks.c) ---- */

/* A SwiGLU MLP: down(silu(gate(x)) * up(x)), with its adapters (A NULL: none); or with the
 * options of a routed expert: biases after gate, up and down (NULL: none), the clamped
 * activation (trill_expert_act, src/arch/decoder.h). */
typedef struct trill_mlp_weights {
    trill_weight gate, up, down;
    trill_lora_pair a_gate, a_up, a_down;
    bool tp; /* split over the tensor-parallel group (a dense MLP; experts never are) */
    const float *b_gate, *b_up, *b_down; /* [I], [I], [H] */
    trill_expert_act act;
    float limit, alpha; /* TRILL_EXPERT_SWIGLU_CLAMPED's */
} trill_mlp_weights;

/* The routed experts of a MoE layer: [E, Im, H] gate and up, [E, H, Im] down, back to back;
 * adapters [E] per projection, or NULL; biases [E, Im], [E, Im], [E, H] or NULL; the activation. */
typedef struct trill_moe_experts {
    trill_weight gate, up, down;
    const trill_lora_pair *a_gate, *a_up, *a_down;
    const float *b_gate, *b_up, *b_down;
    trill_expert_act act;
    float limit, alpha;
} trill_moe_experts;

/* A MoE layer's routing and its experts' activations, kept for the backward pass. */
typedef struct trill_moe_acts {
    int *topi;        /* [T, K] the chosen (or replayed) logical expert ids */
    float *topw;      /* [T, K] their gate weights */
    int *order;       /* [T*K] (token * K + slot) sorted by expert */
    int *count;       /* [E+1] end of each expert's rows in order */
    float *gate, *up; /* [T*K, Im] pre-activations, rows in expert order */
    float *ye;        /* [T*K, H] each routed expert's output, rows in expert order */
} trill_moe_acts;

/* out[n, H] = the MLP of inp[n, H] (width I), keeping the pre-activations gate/up [n, I]; act
 * [n, I] is scratch. The adapters' inputs go to xa[0..2] (gate, up, down) from row `row0`. */
trill_status trill_mlp_forward(const trill_forward_pass *fp, float *out, const float *inp, const trill_mlp_weights *w, float *const *xa,
                               size_t row0, float *gate, float *up, float *act, int n, int H, int I);
/* act[n] = the MLP's activation of its pre-activations gate and up (after their biases). */
void trill_mlp_activation(const trill_mlp_weights *w, float *act, const float *gate, const float *up, size_t n);
/* The weights and adapters of the model's held expert number `local` (expert first + local of
 * the layer: trill_model.expert_first; the id itself in a model that holds every expert). */
trill_mlp_weights trill_moe_expert(const trill_moe_experts *x, int local, int H, int Im);
/* out[T, H] += sum_k topw[t,k] * expert_{topi[t,k]}(xn[t]): the (token, slot) pairs grouped by
 * expert (a counting sort into a->order / a->count) so each expert is one GEMM over its rows
 * (gathered into xe [T, H]; act [T, Im] scratch); adapter inputs in xa[0..2], rows in expert
 * order. In an expert-parallel model (trill_model_set_expert_comm) the experts run on the ranks
 * that hold them (src/model/moe_ep.h): `ordinal` is the layer's MoE ordinal. */
trill_status trill_moe_experts_forward(const trill_forward_pass *fp, float *out, const float *xn, const trill_moe_experts *x,
                                       trill_moe_acts *a, float *const *xa, float *xe, float *act, int T, int H, int E, int K, int Im,
                                       int ordinal);
/* out[T, H] += topw * ye over the rows in expert order: each token adds its experts' outputs in
 * ascending expert id. */
void trill_moe_combine(float *out, const trill_moe_acts *a, int T, int K, int H);
/* Router replay: topi[T, K] of MoE layer `ordinal` replaced by the replayed ids of every token
 * that has them (trill_model_forward's layout); nothing when replay is NULL. */
void trill_moe_replay(int *topi, const uint16_t *replay, int ordinal, int n_moe_layers, int T, int K);
/* Routed-expert capture: experts[t][ordinal][k] = topi[t, k]; nothing when experts is NULL. */
void trill_moe_capture(uint16_t *experts, const int *topi, int ordinal, int n_moe_layers, int T, int K);

/* Re-runs layer l's forward from its saved input (activation recomputation). Fails only when
 * a kernel's scratch cannot be allocated. */
trill_status trill_forward_layer(const trill_forward_pass *fp, int l);

/* logits[n, V] of rows t0..t0+n of the pass (lm_head and its adapter); keeps the adapter input
 * in xa_head. Fails as trill_linear. */
trill_status trill_forward_logits(const trill_forward_pass *fp, float *logits, int t0, int n);

/* The (first) token row t of the pass is scored on (the row is not the last of its sequence). */
static inline int trill_forward_target(const trill_forward_pass *fp, int t) {
    return fp->targets ? fp->targets[(size_t)t * fp->n_targets] : fp->tokens[t + 1];
}

#endif
