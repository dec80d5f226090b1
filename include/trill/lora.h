/* LoRA adapters on every linear layer — attention, dense MLP, each expert, optionally lm_head —
 * in PEFT's conventions: A [r, in] Kaiming-uniform (bound 1/sqrt(in)), B [out, r] zero, and
 * y = x W^T + scale (x A^T) B^T with scale = alpha / r (alpha / sqrt(r) with rsLoRA).
 * All A and B live in one fp32 block (`params`): the trainable vector for the optimizer.
 * Attached to a model (trill_model_attach_lora), they join every forward and backward pass
 * while `enabled`; disabled, the same weights compute the base model (the KL reference) —
 * nothing is copied. On disk: adapter_config.json + adapter_model.safetensors with PEFT's
 * names (base_model.model.model.layers.N.mlp.experts.E.gate_proj.lora_A.weight, ...). */
#ifndef TRILL_LORA_H
#define TRILL_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trill/error.h"
#include "trill/model.h"

typedef enum trill_lora_target {
    TRILL_LORA_Q, TRILL_LORA_K, TRILL_LORA_V, TRILL_LORA_O,
    TRILL_LORA_GATE, TRILL_LORA_UP, TRILL_LORA_DOWN, /* dense MLPs and every expert */
    TRILL_LORA_LM_HEAD,
    TRILL_LORA_N_TARGETS
} trill_lora_target;

typedef struct trill_lora_config {
    int rank;
    double alpha;
    bool use_rslora;
    unsigned targets; /* bit (1 << trill_lora_target) per adapted module kind */
} trill_lora_config;

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

/* The PEFT module name ("q_proj") and trill's short name ("q") of a target; NULL if out of range. */
const char *trill_lora_target_peft_name(int target);
const char *trill_lora_target_alias(int target);

/* "q,k,v,o,gate,up,down,lm_head" (HF names such as "q_proj" accepted too; "all-linear" = all but
 * lm_head). 0 on success, else -1 with the unknown name in the error message. */
int trill_lora_parse_targets(const char *list, unsigned *targets);

/* New adapters for m: A Kaiming-uniform from `seed`, B zero (so the model is unchanged). */
trill_status trill_lora_create(const trill_model *m, trill_lora_config config, uint64_t seed, trill_lora **out);
void trill_lora_free(trill_lora *lora);

trill_status trill_lora_save(const trill_lora *lora, const char *dir);
/* Reads a PEFT adapter for m, checking every tensor's name and shape. */
trill_status trill_lora_load(const trill_model *m, const char *dir, trill_lora **out);

/* Attaches (or with NULL detaches) adapters to the model's forward and backward passes. */
void trill_model_attach_lora(trill_model *m, trill_lora *lora);

/* W += scale * B A for every adapted layer: the merged model computes what the adapted one did.
 * Needs fp32 storage (TRILL_STORE_F32): merging into a bf16 base would round the sum. */
trill_status trill_lora_merge(const trill_lora *lora, trill_model *m);

#endif
