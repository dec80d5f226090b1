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
    /* the model's family's stacked expert tensors (trill_stacked, src/arch/family.h: their
     * adapters' file form is PEFT's target_parameters, src/model/lora_stacked.c), its experts */
    const struct trill_stacked *stacked;
    int n_stacked, n_experts;
} trill_lora;

/* ---- the adapters of experts the checkpoint stacks, in PEFT's target_parameters form
 * (src/model/lora_stacked.c) ---- */
enum { TRILL_MAX_STACKED = 16 };
struct json_t;
struct trill_st_file;
/* One stacked parameter of one layer as PEFT's lora.ParamWrapper holds it. */
typedef struct trill_lora_peft_param {
    char name[160];                /* "model.layers.L.mlp.experts.gate_up_proj" */
    char a_name[224], b_name[224]; /* its tensors' names */
    const char *suffix;            /* target_parameters' entry: "mlp.experts.gate_up_proj" */
    int layer, stride, rank;       /* rank: stride x trill's */
    double alpha;                  /* the alpha that gives trill's scale at that rank */
    int64_t in, out, experts;
    float *A, *B;                  /* [rank * experts, in], [out, rank * experts] */
} trill_lora_peft_param;
/* The trill_stacked of adapter tensor t (an A or B of a stacked expert tensor), or NULL. */
const struct trill_stacked *trill_lora_stacked_of(const trill_lora *lora, const trill_param *t);
/* The whole adapter's stacked parameters in PEFT's form, built from its per-expert pairs (n 0:
 * none). */
trill_status trill_lora_peft_params(const trill_lora *lora, trill_lora_peft_param **out, int *n);
void trill_lora_peft_params_free(trill_lora_peft_param *p, int n);
/* adapter_config.json's "target_parameters" (NULL or null: none) into LoRA target bits. */
trill_status trill_lora_read_target_parameters(const trill_config *c, const struct json_t *list, const char *what, unsigned *targets);
/* How many tensors the adapter's file holds: its module tensors and two per stacked parameter
 * of the targets `params` (the file's target_parameters; other targets' experts are read under
 * trill's per-expert module names, model.layers.L.mlp.experts.E.gate_proj). */
size_t trill_lora_file_tensors(const trill_lora *lora, const trill_model *m, unsigned params, unsigned modules, bool expert_modules);
/* Whether an adapter file whose target_parameters select `params` and target_modules `modules`
 * holds module p's adapter (a stacked expert's in its parameter's form counts): a module the
 * bits select only through target_parameters (Qwen3.5's shared expert beside its stacked
 * experts), and a stacked expert of nn.Linear's layout named as a module (PEFT has no such
 * module) unless the file holds trill's per-expert names (expert_modules), are not in it: their
 * adapters stay 0, no function and no gradient. */
bool trill_lora_in_file(const trill_lora *lora, const trill_param *p, unsigned params, unsigned modules, bool expert_modules);
/* Fills the adapter's stacked experts' pairs of the targets `params` from the file's PEFT tensors
 * (rank r or 2r, rank / alpha patterns of cfg, the adapter_config.json object). */
trill_status trill_lora_read_stacked(trill_lora *lora, unsigned params, const struct json_t *cfg, const char *cfg_path,
                                     const struct trill_st_file *f, const char *st_path);

/* Whether the adapters are the whole adapter (every expert, whole tensors), not a shard's part. */
static inline bool trill_lora_is_whole(const trill_lora *l) { return l->n_params == l->n_global; }

/* Layer l's adapters in the family's per-layer struct. */
static inline void *trill_lora_layer(const trill_lora *lora, int l) { return (char *)lora->layers + (size_t)l * lora->layer_size; }

#endif
