/* A model family: its tensor table, the single source of truth of its architecture.
 *
 * The table lists the family's tensors in checkpoint order as rows: a HF name pattern, a shape
 * in the family's named dimensions, the kind, where it occurs (once, in every layer that the
 * row's predicate admits, or once per routed expert of such a layer), its LoRA target, its
 * generator fusion group, its tensor-parallel split, and where the model's and the adapters'
 * structs keep a pointer to it. trill_arch_walk expands the rows for a config into concrete
 * tensors; everything else is derived from that walk: the parameter layout and contiguous
 * blocks, checkpoint load/save, parameter and FLOP counts, the LoRA layout and PEFT names,
 * merging, and the generator's fused weights. Internal to the library. */
#ifndef TRILL_ARCH_FAMILY_H
#define TRILL_ARCH_FAMILY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arch/decoder.h"
#include "trill/arch.h"
#include "trill/config.h"
#include "model/model_internal.h"
#include "trill/model.h"

typedef enum trill_row_scope {
    TRILL_ROW_GLOBAL, /* once (embedding, final norm, head) */
    TRILL_ROW_LAYER,  /* once per decoder layer its predicate admits */
    TRILL_ROW_EXPERT, /* once per routed expert of such a layer, experts back to back */
} trill_row_scope;

enum { TRILL_NO_FIELD = -1, TRILL_NO_DIM = -1, TRILL_NO_LORA = -1 };

typedef struct trill_tensor_row {
    const char *name;  /* printf pattern: the layer index, then the expert id */
    trill_tensor_kind kind;
    trill_row_scope scope;
    bool (*when)(const trill_config *c, int layer); /* NULL: always (layer is -1 for global rows) */
    int dims[2];       /* the family's dimension ids; dims[1] TRILL_NO_DIM for a vector */
    int role;          /* a trill_role (src/arch/decoder.h) */
    int lora_target;   /* TRILL_NO_LORA or a bit of the family's LoRA targets */
    trill_fuse fuse;
    int fuse_index;
    trill_split split;
    /* offsetof the trill_weight (matrices) or float * (vectors) that points at it: in
     * trill_decoder_weights for layer and expert rows (expert 0's, the others follow), in
     * trill_model for global rows; TRILL_NO_FIELD if none */
    int field;
    /* offsetof its adapter: a trill_lora_pair in trill_decoder_lora (layer rows) or trill_lora
     * (global rows), a trill_lora_pair * to num_experts pairs in trill_decoder_lora (expert
     * rows) */
    int lora_field;
} trill_tensor_row;

/* A routed expert's tensor that the checkpoint keeps with the layer's other experts in one
 * tensor (gpt-oss), by its role: that tensor's name (printf: the layer index), [E, cols, rows *
 * stride] for a matrix (HF's x @ W layout: transposed), [E, n * stride] for a vector; with stride
 * 2 two tensors interleave in it (gate_up_proj: gate at offset 0, up at 1), this one at `offset`.
 * MXFP4 checkpoints hold a matrix as "<name>_blocks" [E, rows * stride, cols / 32, 16] and
 * "<name>_scales" [E, rows * stride, cols / 32] (src/model/model.c). */
typedef struct trill_stacked {
    int role;
    const char *name;
    int stride, offset;
    /* nn.Linear's orientation instead, the parts one after the other (Qwen3.5's gate_up_proj [E,
     * 2I, H]: gate the rows [0, I), up [I, 2I); down_proj [E, H, I]): a matrix [E, rows * stride,
     * cols], this one the rows from offset * rows; a vector [E, n * stride] likewise */
    bool linear;
} trill_stacked;

/* A named configuration of a family (trill init --preset NAME): config.json's text; real: a
 * published model's, to count and plan with (--config-only), too large to create here. */
typedef struct trill_preset { const char *name, *config; bool real; } trill_preset;
struct json_t;              /* jansson's: config.json */

/* An architecture of a family by its Hugging Face names: config.json's "model_type" and the
 * "architectures" entries of its causal LM and of its sequence classifier (NULL: HF has none). */
typedef struct trill_arch_names {
    trill_arch arch;
    const char *model_type, *causal_lm, *classifier;
    /* a multimodal config: the language model's fields are config.json's "text_config" (whose own
     * model_type is text_model_type), the vision tower's ("vision_config") are not read; NULL: flat */
    const char *text_model_type;
} trill_arch_names;

typedef struct trill_family {
    const char *name;
    const trill_arch_names *archs;
    int n_archs;
    /* config.json: the fields it reads beyond the shared ones (src/model/config.c), NULL-ended */
    const char *const *config_keys;
    /* HF's defaults for c->arch's config class, the shared fields included */
    void (*config_defaults)(trill_config *c);
    /* Reads and checks its fields (the shared ones are read); errors name `what` and the field. */
    trill_status (*config_read)(const struct json_t *root, const char *what, trill_config *c);
    /* Adds its fields to a config.json object; false when out of memory. */
    bool (*config_write)(const trill_config *c, struct json_t *j);
    /* Whether decoder layer l is a MoE layer (the config's layer map is derived from it). */
    bool (*layer_is_moe)(const trill_config *c, int l);
    /* Layer l's options of the shared blocks (trill_layer_desc_of): its layer description. Every
     * attention layer (those not Gated DeltaNet) has the same kind, QK-norm and output gate. */
    trill_layer_desc (*describe)(const trill_config *c, int l);
    const trill_tensor_row *rows;
    int n_rows;
    int64_t (*dim)(const trill_config *c, int id); /* a dimension id's size */
    unsigned lora_targets; /* the trill_lora_target bits of the modules it has */
    unsigned all_linear;   /* the targets "all-linear" means (PEFT: every linear but the output head) */
    int tied_head_role;  /* the role a tied output head takes (it has no tensor: the embedding serves) */
    /* FLOPs of the attention scores and weighted values over `pairs` causal (query, key) pairs
     * of one layer, forward only */
    double (*attention_flops)(const trill_config *c, double pairs);
    /* FLOPs per token, forward, of the whole model's computation that is neither a matrix nor
     * attention over pairs (a linear attention's recurrence); NULL: none */
    double (*token_flops)(const trill_config *c);
    const trill_preset *presets; /* its presets (its folder's presets.c) */
    const trill_stacked *stacked; /* its experts' tensors the checkpoint stacks (NULL: none) */
    int n_stacked;
    const int *n_presets;
    /* checkpoint tensors under these prefixes are skipped on load (NULL-ended; Qwen3-Next's MTP
     * module "mtp.", as HF's _keys_to_ignore_on_load_unexpected; a multimodal checkpoint's vision
     * tower); NULL: none */
    const char *const *ignored_prefixes;
} trill_family;

/* Each family's, from its folder src/arch/<id>/ (trill/families.def). */
#define TRILL_FAMILY(id, model) extern const trill_family model;
#include "trill/families.def"
#undef TRILL_FAMILY

/* Every family trill computes, in trill/families.def's order (family.c). */
extern const trill_family *const trill_families[];
extern const int trill_n_families;

/* The family computing c (every trill_arch has one). */
const trill_family *trill_family_of(const trill_config *c);
/* The architecture whose config.json "model_type" is `model_type`, or NULL. */
const trill_arch_names *trill_arch_by_model_type(const char *model_type);
/* Layer l's options of the shared blocks: its family's description of it. */
trill_layer_desc trill_layer_desc_of(const trill_config *c, int l);
/* The HF names of c's architecture. */
const trill_arch_names *trill_arch_names_of(trill_arch arch);

/* Calls fn for every tensor of c in checkpoint order with the row it comes from and its
 * description (name, ndim, shape, numel and the row's facts; no storage). */
typedef void (*trill_tensor_fn)(void *ctx, const trill_tensor_row *row, const trill_param *t);
void trill_arch_walk(const trill_config *c, trill_tensor_fn fn, void *ctx);

/* config.json's "quantization_config" into c->fp8_block: absent or null (0 0: no FP8), or
 * block-scaled FP8 (quant_method "fp8", fmt "e4m3", activation_scheme "dynamic",
 * weight_block_size [rows, cols], default 128 x 128); anything else is refused by field. Both
 * families read it: the loader dequantizes F8_E4M3 matrices with their weight_scale_inv blocks. */
trill_status trill_arch_read_fp8(const struct json_t *root, const char *what, trill_config *c);

/* RoPE's theta and partial_rotary_factor: config.json's "rope_theta" and "partial_rotary_factor",
 * and "rope_scaling" / "rope_parameters" when present: rope_type "default" or "yarn" (its
 * parameters, trill_arch_read_yarn), their rope_theta and partial_rotary_factor; any other type
 * is refused by field. */
trill_status trill_arch_read_rope(const struct json_t *root, const char *what, trill_config *c);
/* YaRN's parameters from the object v (config.json's field `key`) into c (c->yarn set): factor,
 * original_max_position_embeddings (default max_position_embeddings), beta_fast (32), beta_slow
 * (1), mscale (1), mscale_all_dim (0), attention_factor (derived when absent), truncate (true). */
trill_status trill_arch_read_yarn(const struct json_t *v, const char *key, const char *what, trill_config *c);
/* config.json's "rope_scaling" of c: the YaRN object, or null; NULL when out of memory. */
struct json_t *trill_arch_rope_scaling_json(const trill_config *c);
/* An integer field that may be null (HF's None: q_lora_rank's q_proj, a head_dim derived from
 * hidden_size); null reads as 0, absent leaves *out as it is. */
trill_status trill_arch_get_int_or_null(const struct json_t *root, const char *key, const char *what, int lo, int hi, int *out);
/* Refuses a partial_rotary_factor other than 1 (a family whose RoPE turns the whole head). */
trill_status trill_arch_refuse_partial_rope(const trill_config *c, const char *what);
/* config.json's "layer_types" when present (absent or null: c->sliding_layer as it is): one
 * entry per layer, "full_attention" or "sliding_attention", into c->sliding_layer. */
trill_status trill_arch_read_layer_types(const struct json_t *root, const char *what, trill_config *c);
/* config.json's "layer_types" when present: one entry per layer, `flagged` or `other`, into
 * flags[l] (true for `flagged`); absent or null: flags as they are. */
trill_status trill_arch_read_layer_kinds(const struct json_t *root, const char *what, trill_config *c, const char *flagged, const char *other,
                                        bool *flags);
/* config.json's "mlp_only_layers" (absent or null: none): the layers flagged in c->mlp_only. */
trill_status trill_arch_read_mlp_only_layers(const struct json_t *root, const char *what, trill_config *c);
/* The checks of a GQA MoE whose experts_field (num_local_experts) sets num_experts: head_dim
 * even and at least 2, whole kv groups, 1 <= num_experts_per_tok <= num_experts. */
trill_status trill_arch_check_gqa_moe(const trill_config *c, const char *what, const char *experts_field);
/* Refuses a boolean field that is true (a feature trill does not compute); absent is false. */
trill_status trill_arch_refuse_true(const struct json_t *root, const char *key, const char *what);

/* Whether the RMSNorm weight of role `role` is zero-centred in c (applied as 1 + w): every
 * RMSNorm of the decoder when c->norm_centered (Qwen3-Next), never the Gated DeltaNet's gated
 * norm. */
static inline bool trill_norm_centered(const trill_config *c, int role) {
    return c->norm_centered && (role == TRILL_ROLE_INPUT_NORM || role == TRILL_ROLE_POST_NORM || role == TRILL_ROLE_FINAL_NORM ||
                                role == TRILL_ROLE_Q_NORM || role == TRILL_ROLE_K_NORM);
}

/* The offset trill_rmsnorm_offset_forward applies to role's weight in c: 1 zero-centred, else 0. */
static inline float trill_norm_offset(const trill_config *c, int role) { return trill_norm_centered(c, role) ? 1.0f : 0.0f; }

/* The shape a checkpoint stores tensor p under (its whole shape; a depthwise conv1d's [C * K]
 * as [C, 1, K]) into shape[3]; returns its number of dimensions. p's whole_shape must be set (a
 * model's tensors). */
int trill_param_file_shape(const trill_config *c, const trill_param *p, int64_t *shape);

/* Where the checkpoint keeps routed expert tensor t when it stacks the experts, or NULL. */
const trill_stacked *trill_arch_stacked(const trill_config *c, const trill_param *t);

/* The row a tensor came from. */
const trill_tensor_row *trill_arch_row(const trill_config *c, const trill_param *t);

/* How many of a tensor one token reads: 1, except a routed expert's — the top-k of num_experts
 * (expert ids below num_experts_per_tok stand for them, so counts stay integers). */
static inline bool trill_arch_active(const trill_config *c, const trill_param *t) {
    return t->expert < c->num_experts_per_tok;
}

/* Whether a tensor is a matrix one token multiplies by (an embedding is a lookup). */
static inline bool trill_arch_is_matmul(const trill_param *t) {
    return t->kind == TRILL_TENSOR_MATRIX || t->kind == TRILL_TENSOR_ROUTER || t->kind == TRILL_TENSOR_HEAD;
}

#endif
