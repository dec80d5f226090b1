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

/* The modules trill can adapt, by PEFT module name, over every family it computes; a family has
 * some of them (trill_lora_create refuses a module the model lacks). */
typedef enum trill_lora_target {
#define TRILL_LORA_TARGET(name, peft, alias) TRILL_LORA_##name,
#include "trill/families.def" /* the registry lists them */
#undef TRILL_LORA_TARGET
    TRILL_LORA_N_TARGETS
} trill_lora_target;

/* In trill_lora_config.targets: PEFT's "all-linear", every linear module of the model's family but
 * the output head; trill_lora_create replaces it by those modules' bits. */
#define TRILL_LORA_ALL_LINEAR (1u << 31)

typedef struct trill_lora_config {
    int rank;
    double alpha;
    bool use_rslora;
    unsigned targets; /* bit (1 << trill_lora_target) per adapted module kind, and TRILL_LORA_ALL_LINEAR */
} trill_lora_config;

/* A set of adapters for one model. Opaque: read it through the functions below. */
typedef struct trill_lora trill_lora;

const trill_lora_config *trill_lora_get_config(const trill_lora *lora);
/* alpha / rank, or alpha / sqrt(rank) with rsLoRA */
float trill_lora_scale(const trill_lora *lora);
/* Every A and B in one fp32 block (*n floats): the trainable vector. */
float *trill_lora_params(trill_lora *lora, size_t *n);
/* The A and B tensors with PEFT names, A before B for each adapted weight (*n tensors). */
const trill_param *trill_lora_tensors(const trill_lora *lora, size_t *n);
/* Disabled adapters leave the model they are attached to computing its base (the KL reference). */
void trill_lora_set_enabled(trill_lora *lora, bool enabled);
bool trill_lora_enabled(const trill_lora *lora);

/* The PEFT module name ("q_proj") and trill's short name ("q") of a target; NULL if out of range. */
const char *trill_lora_target_peft_name(int target);
const char *trill_lora_target_alias(int target);

/* "q,k,v,o,gate,up,down,lm_head" (HF names such as "q_proj" accepted too; "all-linear" sets
 * TRILL_LORA_ALL_LINEAR). 0 on success, else -1 with the unknown name in the error message. */
int trill_lora_parse_targets(const char *list, unsigned *targets);

/* Checks cfg for a model of config c (rank, alpha, targets the family has; lm_head neither tied
 * nor a score head) and resolves "all-linear" to the family's modules, as trill_lora_create does:
 * what trill plan counts is what trill train would adapt. */
trill_status trill_lora_config_resolve(const trill_config *c, trill_lora_config *cfg);

/* New adapters for m: A Kaiming-uniform from `seed`, B zero (so the model is unchanged). Their
 * config's targets are the modules adapted (all-linear resolved for m's family). */
trill_status trill_lora_create(const trill_model *m, trill_lora_config config, uint64_t seed, trill_lora **out);
/* For an expert-parallel shard (trill_model_create_shard), trill_lora_create and trill_lora_load
 * make the adapters of the experts it holds (each A from the whole adapter's seed and key, so
 * the values are the whole adapter's), and these make the adapters of every expert, zeroed: what
 * the checkpoint and the generator take once the shards' values are gathered into them. */
trill_status trill_lora_create_whole(const trill_model *m, trill_lora_config config, trill_lora **out);
/* A shard's adapters keep those of its routed experts last: params[trill_lora_routed_first, n)
 * (n, no such part, in adapters of every expert). */
size_t trill_lora_routed_first(const trill_lora *lora);
void trill_lora_free(trill_lora *lora);

trill_status trill_lora_save(const trill_lora *lora, const char *dir);
/* Reads a PEFT adapter for m, checking every tensor's name and shape (a shard's: the tensors it
 * holds, of a file that has every expert's). Saving needs the adapters of every expert. */
trill_status trill_lora_load(const trill_model *m, const char *dir, trill_lora **out);

/* Attaches (or with NULL detaches) adapters to the model's forward and backward passes. */
void trill_model_attach_lora(trill_model *m, trill_lora *lora);

/* Adapter values that are not finite numbers are refused, naming the tensor and the index, where
 * they would be used (the generator, merging), as weights are (trill_model_check_finite). */
trill_status trill_lora_check_finite(const trill_lora *lora);

/* W += scale * B A for every adapted layer: the merged model computes what the adapted one did.
 * Needs fp32 storage (TRILL_STORE_F32): merging into a bf16 base would round the sum. Adapters
 * that are not finite are refused before m is touched. */
trill_status trill_lora_merge(const trill_lora *lora, trill_model *m);

#endif
