/* Model architecture read from a Hugging Face config.json.
 *
 * Field names and defaults are Hugging Face's, per architecture (Qwen3Config, Qwen3MoeConfig,
 * DeepseekV3Config, Kimi-K2's, MixtralConfig, Glm4MoeConfig): the shared fields are read in
 * src/model/config.c, each family's own in src/arch/<family>/config.c. Options trill does not
 * compute (rope scaling other than DeepSeek-V3's YaRN, sliding windows, other activations...) are
 * refused by name rather than approximated. */
#ifndef TRILL_CONFIG_H
#define TRILL_CONFIG_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "trill/error.h"

#define TRILL_MAX_LAYERS 1024
#define TRILL_MAX_EOS 8

/* The architectures trill computes (trill/families.def lists them). */
typedef enum trill_arch {
#define TRILL_ARCH(name) TRILL_ARCH_##name,
#include "trill/families.def"
#undef TRILL_ARCH
} trill_arch;

typedef struct trill_config {
    trill_arch arch;
    int vocab_size;
    int hidden_size;
    int intermediate_size;     /* dense MLP width */
    int num_hidden_layers;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    double initializer_range;
    bool tie_word_embeddings;
    /* MoE (zero experts for dense models) */
    int num_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int decoder_sparse_step;
    bool norm_topk_prob;
    bool mlp_only[TRILL_MAX_LAYERS]; /* mlp_only_layers as a per-layer flag */
    /* GQA's options: QK-norm (Qwen3 always, GLM-4.5 when use_qk_norm, Mixtral never), biases on
     * the q/k/v projections (GLM's attention_bias; o_proj has none), and RoPE on the first
     * partial_rotary_factor x head_dim dimensions of each head (1: all of them) */
    bool qk_norm;
    bool attention_bias;
    double partial_rotary_factor;
    /* gpt-oss (HF GptOssConfig): attention sinks and an o_proj bias (attention_bias: o_proj's too),
     * a router with a bias, experts with biases and a clamped SwiGLU */
    double swiglu_limit, swiglu_alpha; /* 7.0, 1.702 */
    bool mxfp4; /* quantization_config quant_method "mxfp4": experts stored as *_blocks and E8M0 *_scales */
    int sliding_window; /* a query sees the sliding_window latest positions, itself included (0: all) ... */
    bool sliding_layer[TRILL_MAX_LAYERS]; /* ... in the layers flagged here (HF's layer_types "sliding_attention") */
    /* Qwen3-Next (HF Qwen3NextConfig): Gated DeltaNet layers (layer_types "linear_attention")
     * between gated full-attention ones; every RMSNorm of the decoder zero-centred (1 + w); the
     * shared expert of shared_expert_intermediate_size under a sigmoid gate */
    bool linear_layer[TRILL_MAX_LAYERS];
    int linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim;
    int shared_expert_intermediate_size; /* 0: n_shared_experts x moe_intermediate_size (DeepSeek-V3, GLM) */
    bool norm_centered;    /* RMSNorm weights w applied as 1 + w (HF Qwen3NextRMSNorm) */
    bool attn_output_gate; /* q_proj twice as wide: per head q then a gate; attention output x sigmoid(gate) */
    /* DeepSeek-V3 (HF DeepseekV3Config; num_experts holds n_routed_experts): MLA attention, a
     * sigmoid router with a selection bias and group-limited top-k, shared experts, YaRN */
    int q_lora_rank;           /* 0: q_proj (HF null), else q_a_proj -> q_a_layernorm -> q_b_proj */
    int kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int n_shared_experts;
    int n_group, topk_group;   /* group-limited routing (1, 1: off) */
    double routed_scaling_factor;
    int first_k_dense_replace; /* layers below it are dense */
    int moe_layer_freq;
    bool rope_interleave;      /* RoPE on adjacent pairs (2i, 2i+1) */
    bool yarn;                 /* rope_scaling (or rope_parameters) rope_type yarn, with: */
    double yarn_factor, yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    double yarn_attention_factor; /* the cos/sin multiplier when the config gives it; 0: derived (mscale) */
    bool yarn_truncate;           /* round the correction range outwards (HF's default; gpt-oss: false) */
    int yarn_original_max_position_embeddings;
    int num_nextn_predict_layers; /* the MTP module's layers, stored after the decoder's: not
                                     loaded (as HF); a saved config says 0 (not saved) */
    /* Block-scaled FP8 checkpoint (quantization_config: quant_method "fp8", fmt "e4m3"): the
     * [rows, cols] of weight_block_size; a matrix stored F8_E4M3 comes with "<name>_scale_inv",
     * one F32 scale per block. 0, 0 when config.json has none. A saved config has none (trill
     * writes dequantized weights). */
    int fp8_block[2];
    /* Sequence classification (Qwen3ForSequenceClassification, Qwen3MoeForSequenceClassification:
     * a reward model has one label): the rows of score.weight [num_labels, H], which replaces
     * lm_head. 0 for a causal LM. From id2label's size (HF PretrainedConfig), else "num_labels",
     * else HF's default 2. */
    int num_labels;
    /* special tokens (-1 when absent) */
    int bos_token_id;
    int n_eos;
    int eos_token_ids[TRILL_MAX_EOS];
    int pad_token_id; /* read for classification only: HF pools at the last token that is not it */

    /* Layer map, derived: which layers are MoE and each MoE layer's ordinal.
     * Router-replay ids and captured experts are indexed by ordinal, never by layer. */
    int n_moe_layers;
    int16_t moe_ordinal[TRILL_MAX_LAYERS]; /* layer -> ordinal, -1 for a dense layer */
    int16_t moe_layer[TRILL_MAX_LAYERS];   /* ordinal -> layer */
} trill_config;

trill_status trill_config_load(const char *path, trill_config *out);
/* config.json text of `len` bytes; `what` names the source in error messages. */
trill_status trill_config_parse(const char *text, size_t len, const char *what, trill_config *out);

/* Whether `key` is a config.json field trill reads (used to reject typos in overrides). */
bool trill_config_known_key(const char *key);

/* "Qwen3MoeForCausalLM", "Qwen3ForSequenceClassification", ... */
const char *trill_config_architecture(const trill_config *c);
const char *trill_config_model_type(const trill_config *c);   /* "qwen3_moe", ... */
/* Whether c's architecture is a multimodal model's language model (config.json's text_config;
 * the vision tower is not read). */
bool trill_config_is_multimodal(const trill_config *c);

static inline bool trill_config_is_moe(const trill_config *c, int layer) {
    return c->moe_ordinal[layer] >= 0;
}

/* The width of a MoE layer's shared experts taken as one SwiGLU (0: none). */
static inline int trill_config_shared_width(const trill_config *c) {
    return c->shared_expert_intermediate_size > 0 ? c->shared_expert_intermediate_size : c->moe_intermediate_size * c->n_shared_experts;
}

/* Parameter counts: all weights, and those one token touches (top-k experts only); derived
 * from the family's tensor table (src/arch/). */
void trill_config_param_counts(const trill_config *c, int64_t *total, int64_t *active);


/* config.json text (malloc'ed) of a named preset ("tiny", "small", or a real model's), or NULL if
 * unknown (or out of memory: trill_error_message says which).
 * tiny:  a few M parameters, 1 dense + 3 MoE layers, 8 experts, top-2, char-level vocab.
 * small: the benchmark model, ~85M parameters (vocab 32000, hidden 512, 8 layers, 16 experts, top-4). */
char *trill_config_preset_text(const char *name);
const char *trill_config_preset_names(void); /* "tiny, small (qwen3), ..." for messages: every family's */
/* Whether a preset is a real model's configuration (deepseek-v3: DeepSeek-V3's, kimi-k2: Kimi
 * K2's), for config-only use: too large to create. */
bool trill_config_preset_is_real(const char *name);

/* config.json text (malloc'ed) of c, as a model folder holds it; NULL when out of memory. */
char *trill_config_to_text(const trill_config *c);

/* Parameters by the tensor table's kind (trill_tensor_kind, trill/arch.h: by_kind has
 * TRILL_TENSOR_N_KINDS entries), the routed experts' counted apart in *routed_experts. */
void trill_config_param_breakdown(const trill_config *c, int64_t *by_kind, int64_t *routed_experts);

#endif
