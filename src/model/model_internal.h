/* The model's fields, for the library and its tests (trill/model.h is the public, opaque API). */
#ifndef TRILL_MODEL_INTERNAL_H
#define TRILL_MODEL_INTERNAL_H

#include <stdbool.h>

#include "trill/model.h"

typedef struct trill_model {
    trill_config config;
    size_t n_params;      /* every parameter, whatever its storage */
    trill_dtype storage;  /* of the matrices: TRILL_F32 (all in params) or TRILL_BF16 */
    float *params;        /* fp32 tensors, one allocation: all n_params with fp32 storage */
    size_t n_f32;         /* floats in params */
    uint16_t *params_bf16; /* bf16 storage: the matrices, one allocation; else NULL */
    size_t n_bf16;
    trill_param *tensors; /* in checkpoint order */
    size_t n_tensors;
    trill_weight embed;   /* [V, H] */
    float *final_norm;    /* [H] */
    trill_weight lm_head; /* [V, H]; the same storage as embed when tie_word_embeddings; none
                             (both pointers NULL) in a classifier */
    trill_weight score;   /* classifier (config.num_labels > 0): "score.weight" [num_labels, H],
                             never tied (HF's classifier has no output embeddings); else none */
    /* [num_hidden_layers] each layer's pointers into the blocks (trill_decoder_weights,
     * src/arch/decoder.h), layer_size bytes each: trill_model_layer */
    void *layers;
    size_t layer_size;
    trill_dtype checkpoint_dtype; /* storage dtype of the checkpoint loaded (F32 if created) */
    struct trill_lora *lora;      /* attached adapters (trill/lora.h), or NULL */
    /* expert parallelism: the routed experts held, [expert_first, expert_first + expert_count) of
     * every MoE layer (all of them unless the model is a shard: trill_model_create_shard); the
     * others are listed in `tensors` without storage */
    int ep_rank, ep_size, expert_first, expert_count;
    struct trill_ep *ep;          /* the exchange with the other shards (src/model/moe_ep.c), or NULL */
    /* tensor parallelism: share tp_rank of tp_size of the heads and the dense MLPs (config is the
     * share's, whole_config the model's), and the group, or NULL */
    int tp_rank, tp_size;
    trill_config whole_config;
    struct trill_comm *tp;
    trill_precision precision;    /* of the matrix products of its forward and backward passes */
} trill_model;

/* Frees the expert-parallel exchange (src/model/moe_ep.c), with the model. */
void trill_model_ep_free(trill_model *m);

/* Whether tensor t is a tensor-parallel slice of a larger one. */
static inline bool trill_param_sliced(const trill_param *t) {
    return t->whole_shape[0] != t->shape[0] || (t->ndim == 2 && t->whole_shape[1] != t->shape[1]);
}

/* Whether the model holds tensor t (every tensor but the routed experts of other shards). */
static inline bool trill_model_holds(const trill_model *m, const trill_param *t) {
    return t->expert < 0 || (t->expert >= m->expert_first && t->expert < m->expert_first + m->expert_count);
}

/* Layer l's weights in the family's per-layer struct. */
static inline void *trill_model_layer(const trill_model *m, int l) { return (char *)m->layers + (size_t)l * m->layer_size; }

#endif
