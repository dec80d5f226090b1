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
    /* [num_hidden_layers] the family's per-layer struct of adapter pairs (for Qwen3,
     * qwen3_lora_layer), layer_size bytes each: trill_lora_layer; a routed expert's row holds a
     * trill_lora_pair * to num_experts pairs in expert_pairs */
    void *layers;
    size_t layer_size;
    trill_lora_pair *expert_pairs;
    trill_lora_pair lm_head;
} trill_lora;

/* Layer l's adapters in the family's per-layer struct. */
static inline void *trill_lora_layer(const trill_lora *lora, int l) { return (char *)lora->layers + (size_t)l * lora->layer_size; }

#endif
