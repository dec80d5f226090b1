/* What the tensor table of a model family says about each tensor (src/arch/: one table per
 * family, the single source of truth for the parameter layout, checkpoint names, parameter and
 * FLOP counts, LoRA targets and the generator's fused matrices). Every trill_param (trill/model.h,
 * trill/lora.h) carries these facts next to its storage. */
#ifndef TRILL_ARCH_H
#define TRILL_ARCH_H

typedef enum trill_tensor_kind {
    TRILL_TENSOR_EMBEDDING, /* [V, H] token embeddings (a lookup, not a matmul) */
    TRILL_TENSOR_NORM,      /* [n] RMSNorm weight */
    TRILL_TENSOR_BIAS,      /* [n] a router's selection bias (DeepSeek's e_score_correction_bias): frozen */
    TRILL_TENSOR_MATRIX,    /* [out, in] a linear layer */
    TRILL_TENSOR_ROUTER,    /* [E, H] a MoE router */
    TRILL_TENSOR_HEAD,      /* [V, H] lm_head, or [num_labels, H] a classifier's score */
    TRILL_TENSOR_LINEAR_BIAS, /* [out] a linear layer's bias (GLM's q/k/v): trained */
    TRILL_TENSOR_SINKS,     /* [heads] attention sinks (gpt-oss): a logit per head, trained */
    TRILL_TENSOR_CONV,      /* [C * K] a depthwise conv1d's weight (checkpoint [C, 1, K]; Gated DeltaNet's), trained */
    TRILL_TENSOR_DECAY,     /* [heads] Gated DeltaNet's A_log or dt_bias, trained */
    TRILL_TENSOR_N_KINDS
} trill_tensor_kind;

/* Whether gradient descent trains a tensor of this kind: all but the selection bias, which
 * shifts which experts are chosen and nothing else (DeepSeek adjusts it by load statistics,
 * outside the gradient; it never gets a gradient, weight decay or an update here). */
static inline int trill_tensor_trainable(trill_tensor_kind k) { return k != TRILL_TENSOR_BIAS; }

/* The generator fuses matrices that read the same input into one (their rows stacked). */
typedef enum trill_fuse {
    TRILL_FUSE_NONE,
    TRILL_FUSE_QKV,     /* q, k, v projections */
    TRILL_FUSE_GATE_UP, /* gate and up projections of a SwiGLU MLP (each expert's own) */
} trill_fuse;

/* How tensor parallelism would split it (Megatron's terms); experts are placed whole by id. */
typedef enum trill_split {
    TRILL_SPLIT_NONE, /* replicated */
    TRILL_SPLIT_ROWS, /* the output dimension (column-parallel linear, vocab-parallel embedding) */
    TRILL_SPLIT_COLS, /* the input dimension (row-parallel linear) */
    TRILL_SPLIT_CHANNELS, /* a Gated DeltaNet conv's channels q | k | v, each part split by heads (the rank's heads' channels) */
} trill_split;


#endif
