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

typedef struct trill_lora_layer {
    trill_lora_pair q, k, v, o, gate, up, down; /* gate/up/down: the dense MLP */
    trill_lora_pair *expert_gate, *expert_up, *expert_down; /* [num_experts] for a MoE layer */
} trill_lora_layer;

typedef struct trill_lora {
    trill_lora_config config;
    float scale;
    bool enabled;
    float *params;          /* every A and B, one allocation */
    size_t n_params;
    trill_param *tensors;   /* PEFT names and slices of params */
    size_t n_tensors;
    trill_lora_layer *layers;
    trill_lora_pair *expert_pairs; /* storage the layers' expert_* arrays point into */
    trill_lora_pair lm_head;
} trill_lora;

#endif
