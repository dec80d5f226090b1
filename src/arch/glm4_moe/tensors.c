/* The GLM-4.5 tensor table (HF modeling_glm4_moe.py, the checkpoints' names), in checkpoint
 * order. Per layer: input_layernorm; q/k/v projections with their biases (attention_bias), o_proj
 * without; q_norm and k_norm (use_qk_norm); post_attention_layernorm; then either the MoE block
 * (the router's gate.weight and e_score_correction_bias, each routed expert's gate/up/down,
 * experts of one projection back to back, the shared experts' gate/up/down) or the dense SwiGLU
 * MLP. The MTP layers (num_nextn_predict_layers) are not part of the model, as in HF. */
#include <stddef.h>

#include "arch/family.h"
#include "arch/glm4_moe/glm4_moe.h"
#include "arch/rows.h"
#include "trill/lora.h"

enum dim { D_H, D_V, D_HD, D_QD, D_KVD, D_I, D_IM, D_E, D_SH };

static int64_t dim(const trill_config *c, int id) {
    switch ((enum dim)id) {
    case D_H: return c->hidden_size;
    case D_V: return c->vocab_size;
    case D_HD: return c->head_dim;
    case D_QD: return (int64_t)c->num_attention_heads * c->head_dim;
    case D_KVD: return (int64_t)c->num_key_value_heads * c->head_dim;
    case D_I: return c->intermediate_size;
    case D_IM: return c->moe_intermediate_size;
    case D_E: return c->num_experts;
    case D_SH: return trill_config_shared_width(c);
    }
    return 0;
}

static bool moe(const trill_config *c, int l) { return trill_config_is_moe(c, l); }
static bool dense(const trill_config *c, int l) { return !trill_config_is_moe(c, l); }
static bool shared(const trill_config *c, int l) { return trill_config_is_moe(c, l) && c->n_shared_experts > 0; }
static bool bias(const trill_config *c, int l) { return c->attention_bias; }
static bool qk_norm(const trill_config *c, int l) { return c->qk_norm; }
static bool untied(const trill_config *c, int l) { return !c->tie_word_embeddings; }


static const trill_tensor_row ROWS_[] = {
    ROW_EMBED(D_V, D_H),
    ROW_INPUT_NORM(D_H),
    ROW_Q(D_QD, D_H),
    ROW_Q_BIAS(bias, D_QD),
    ROW_K(D_KVD, D_H),
    ROW_K_BIAS(bias, D_KVD),
    ROW_V(D_KVD, D_H),
    ROW_V_BIAS(bias, D_KVD),
    ROW_O(D_H, D_QD),
    ROWS_QK_NORM(qk_norm, D_HD),
    ROW_POST_NORM(D_H),
    ROW_ROUTER(moe, D_E, D_H),
    ROW_ROUTER_BIAS(moe, D_E),
    ROWS_EXPERTS(moe, D_IM, D_H),
    ROWS_SHARED_EXPERTS(shared, D_SH, D_H),
    ROWS_DENSE_MLP(dense, D_I, D_H),
    ROW_FINAL_NORM(D_H),
    ROW_LM_HEAD(untied, D_V, D_H),
};

/* scores Q K^T and values P V: 2 FLOPs per multiply-add, head_dim each, every query head */
static double attention_flops(const trill_config *c, double pairs) {
    return 2.0 * 2.0 * pairs * c->head_dim * c->num_attention_heads;
}

static const trill_arch_names ARCHS[] = {
    { TRILL_ARCH_GLM4_MOE, "glm4_moe", "Glm4MoeForCausalLM", NULL, NULL },
};

#define BIT(t) (1u << (t))

const trill_family trill_family_glm4_moe = {
    .name = "glm4_moe",
    .archs = ARCHS,
    .n_archs = (int)(sizeof ARCHS / sizeof ARCHS[0]),
    .config_keys = trill_glm4_moe_config_keys,
    .config_defaults = trill_glm4_moe_config_defaults,
    .config_read = trill_glm4_moe_config_read,
    .config_write = trill_glm4_moe_config_write,
    .layer_is_moe = trill_glm4_moe_layer_is_moe,
    .describe = trill_glm4_moe_describe,
    .rows = ROWS_,
    .n_rows = (int)(sizeof ROWS_ / sizeof ROWS_[0]),
    .dim = dim,
    .lora_targets = BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_K) | BIT(TRILL_LORA_V) | BIT(TRILL_LORA_O) | BIT(TRILL_LORA_GATE) | BIT(TRILL_LORA_UP) |
                    BIT(TRILL_LORA_DOWN) | BIT(TRILL_LORA_LM_HEAD),
    .all_linear = BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_K) | BIT(TRILL_LORA_V) | BIT(TRILL_LORA_O) | BIT(TRILL_LORA_GATE) | BIT(TRILL_LORA_UP) |
                  BIT(TRILL_LORA_DOWN),
    .tied_head_role = TRILL_ROLE_LM_HEAD,
    .attention_flops = attention_flops,
    .presets = trill_glm4_moe_presets,
    .n_presets = &trill_glm4_moe_n_presets,
};
