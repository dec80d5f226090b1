/* The DeepSeek-V3 tensor table (HF modeling_deepseek_v3.py), in checkpoint order. Per layer:
 * input_layernorm; MLA (q_a_proj, q_a_layernorm, q_b_proj when q_lora_rank is set, else q_proj;
 * kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj); post_attention_layernorm; then either
 * the MoE block (the router's gate.weight and its e_score_correction_bias, each routed expert's
 * gate/up/down, experts of one projection back to back, the shared experts' gate/up/down, one MLP
 * of n_shared_experts x moe_intermediate_size) or the dense SwiGLU MLP. The MTP layer
 * (num_nextn_predict_layers) is not part of the model, as in HF. */
#include <stddef.h>

#include "arch/deepseek_v3/deepseek.h"
#include "arch/family.h"
#include "arch/rows.h"
#include "trill/lora.h"

enum dim { D_H, D_V, D_QL, D_Q, D_KVA, D_KVL, D_KVB, D_O, D_I, D_IM, D_E, D_SH, D_LABELS };

static int64_t dim(const trill_config *c, int id) {
    const int64_t nh = c->num_attention_heads;
    switch ((enum dim)id) {
    case D_H: return c->hidden_size;
    case D_V: return c->vocab_size;
    case D_QL: return c->q_lora_rank;
    case D_Q: return nh * (c->qk_nope_head_dim + c->qk_rope_head_dim);
    case D_KVA: return (int64_t)c->kv_lora_rank + c->qk_rope_head_dim;
    case D_KVL: return c->kv_lora_rank;
    case D_KVB: return nh * (c->qk_nope_head_dim + c->v_head_dim);
    case D_O: return nh * c->v_head_dim;
    case D_I: return c->intermediate_size;
    case D_IM: return c->moe_intermediate_size;
    case D_E: return c->num_experts;
    case D_SH: return trill_config_shared_width(c);
    case D_LABELS: return c->num_labels;
    }
    return 0;
}

static bool moe(const trill_config *c, int l) { return trill_config_is_moe(c, l); }
static bool dense(const trill_config *c, int l) { return !trill_config_is_moe(c, l); }
static bool shared(const trill_config *c, int l) { return trill_config_is_moe(c, l) && c->n_shared_experts > 0; }
static bool q_lora(const trill_config *c, int l) { return c->q_lora_rank > 0; }
static bool q_full(const trill_config *c, int l) { return c->q_lora_rank == 0; }
static bool causal_untied(const trill_config *c, int l) { return c->num_labels == 0 && !c->tie_word_embeddings; }

#define NOLORA TRILL_NO_LORA
#define NOF TRILL_NO_FIELD

static const trill_tensor_row ROWS_[] = {
    ROW_EMBED(D_V, D_H),
    ROW_INPUT_NORM(D_H),
    /* name                                                  kind  scope when     dims             role                 LoRA target       fusion  split field          adapter */
    { "model.layers.%d.self_attn.q_a_proj.weight",           MAT,  L, q_lora,  { D_QL, D_H },   TRILL_ROLE_Q_A,         TRILL_LORA_Q_A,   QKV(0), REPL, LW(q_a),          LL(q_a) },
    { "model.layers.%d.self_attn.q_a_layernorm.weight",      NORM, L, q_lora,  { D_QL, NO },    TRILL_ROLE_Q_A_NORM,    NOLORA,           NOFUSE, REPL, LW(q_a_norm),     NOF },
    { "model.layers.%d.self_attn.q_b_proj.weight",           MAT,  L, q_lora,  { D_Q, D_QL },   TRILL_ROLE_Q_B,         TRILL_LORA_Q_B,   NOFUSE, ROWS, LW(q_b),          LL(q_b) },
    { "model.layers.%d.self_attn.q_proj.weight",             MAT,  L, q_full,  { D_Q, D_H },    TRILL_ROLE_Q,           TRILL_LORA_Q,     QKV(0), ROWS, LW(wq),            LL(q) },
    { "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", MAT,  L, NULL,    { D_KVA, D_H },  TRILL_ROLE_KV_A,        TRILL_LORA_KV_A,  QKV(1), REPL, LW(kv_a),         LL(kv_a) },
    { "model.layers.%d.self_attn.kv_a_layernorm.weight",     NORM, L, NULL,    { D_KVL, NO },   TRILL_ROLE_KV_A_NORM,   NOLORA,           NOFUSE, REPL, LW(kv_a_norm),    NOF },
    { "model.layers.%d.self_attn.kv_b_proj.weight",          MAT,  L, NULL,    { D_KVB, D_KVL },TRILL_ROLE_KV_B,        TRILL_LORA_KV_B,  NOFUSE, ROWS, LW(kv_b),         LL(kv_b) },
    ROW_O(D_H, D_O),
    ROW_POST_NORM(D_H),
    ROW_ROUTER(moe, D_E, D_H),
    ROW_ROUTER_BIAS(moe, D_E),
    ROWS_EXPERTS(moe, D_IM, D_H),
    ROWS_SHARED_EXPERTS(shared, D_SH, D_H),
    ROWS_DENSE_MLP(dense, D_I, D_H),
    ROW_FINAL_NORM(D_H),
    ROW_LM_HEAD(causal_untied, D_V, D_H),
};

static const trill_arch_names ARCHS[] = {
    { TRILL_ARCH_DEEPSEEK_V3, "deepseek_v3", "DeepseekV3ForCausalLM", "DeepseekV3ForSequenceClassification", NULL },
    { TRILL_ARCH_KIMI_K2, "kimi_k2", "DeepseekV3ForCausalLM", "DeepseekV3ForSequenceClassification", NULL },
    { TRILL_ARCH_GLM4_MOE_LITE, "glm4_moe_lite", "Glm4MoeLiteForCausalLM", NULL, NULL },
};

/* scores Q K^T over nope + rope dimensions, values P V over v_head_dim: 2 FLOPs per
 * multiply-add, every head */
static double attention_flops(const trill_config *c, double pairs) {
    return 2.0 * pairs * c->num_attention_heads * (double)(c->qk_nope_head_dim + c->qk_rope_head_dim + c->v_head_dim);
}

#define BIT(t) (1u << (t))

const trill_family trill_family_deepseek_v3 = {
    .name = "deepseek_v3",
    .archs = ARCHS,
    .n_archs = (int)(sizeof ARCHS / sizeof ARCHS[0]),
    .config_keys = trill_deepseek_config_keys,
    .config_defaults = trill_deepseek_config_defaults,
    .config_read = trill_deepseek_config_read,
    .config_write = trill_deepseek_config_write,
    .layer_is_moe = trill_deepseek_layer_is_moe,
    .describe = trill_deepseek_describe,
    .rows = ROWS_,
    .n_rows = (int)(sizeof ROWS_ / sizeof ROWS_[0]),
    .dim = dim,
    .lora_targets = BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_Q_A) | BIT(TRILL_LORA_Q_B) | BIT(TRILL_LORA_KV_A) | BIT(TRILL_LORA_KV_B) |
                    BIT(TRILL_LORA_O) | BIT(TRILL_LORA_GATE) | BIT(TRILL_LORA_UP) | BIT(TRILL_LORA_DOWN) | BIT(TRILL_LORA_LM_HEAD),
    .all_linear = BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_Q_A) | BIT(TRILL_LORA_Q_B) | BIT(TRILL_LORA_KV_A) | BIT(TRILL_LORA_KV_B) |
                  BIT(TRILL_LORA_O) | BIT(TRILL_LORA_GATE) | BIT(TRILL_LORA_UP) | BIT(TRILL_LORA_DOWN),
    .tied_head_role = TRILL_ROLE_LM_HEAD,
    .attention_flops = attention_flops,
    .presets = trill_deepseek_presets,
    .n_presets = &trill_deepseek_n_presets,
};
