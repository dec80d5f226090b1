/* The adapters' fields, for the library and its tests (trill/lora.h is the public, opaque API). */
#ifndef TRILL_LORA_INTERNAL_H
#define TRILL_LORA_INTERNAL_H

#include "model/model_internal.h"
#include "trill/lora.h"

/* The adapter of one linear layer; A == NULL when the layer is not adapted. */
typedef struct trill_lora_pair {
    float *A; /* [r, in] */
    float *B; /* [out, r] */
} trill_lora_pair;

typedef struct trill_lora {
    trill_lora_config config;
    float scale;
    bool enabled;
    float *params;          /* every A and B, one allocation */
    size_t n_params;
    trill_param *tensors;   /* PEFT names and slices of params */
    size_t n_tensors;
    /* [num_hidden_layers] each layer's adapter pairs (trill_decoder_lora, src/arch/decoder.h),
     * layer_size bytes each: trill_lora_layer; a routed expert's row holds a
     * trill_lora_pair * to num_experts pairs in expert_pairs */
    void *layers;
    size_t layer_size;
    trill_lora_pair *expert_pairs;
    trill_lora_pair lm_head;
    /* expert parallelism: the routed experts it holds (a layer's pairs are indexed from
     * expert_first), all of them unless it was made for a shard's held ones */
    int expert_first, expert_count;
    /* a shard's adapters keep their routed experts' after all the others: params[routed_first,
     * n_params) (their gradients come from every rank that sent the experts tokens); n_params
     * in an adapter of every expert, laid out as the checkpoint is */
    size_t routed_first;
    /* where each tensor sits in the whole adapter (every expert, the checkpoint's layout):
     * global_offset[t] in its block of n_global values, global_index[t] among its
     * n_global_tensors tensors (t itself, and n_params and n_tensors, in a whole adapter) */
    size_t n_global, n_global_tensors;
    size_t *global_offset;
    int *global_index;
} trill_lora;

/* Whether the adapters are the whole adapter (every expert, whole tensors), not a shard's part. */
static inline bool trill_lora_is_whole(const trill_lora *l) { return l->n_params == l->n_global; }

/* Layer l's adapters in the family's per-layer struct. */
static inline void *trill_lora_layer(const trill_lora *lora, int l) { return (char *)lora->layers + (size_t)l * lora->layer_size; }

#endif
