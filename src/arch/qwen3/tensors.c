/* The Qwen3 / Qwen3-MoE tensor table (HF modeling_qwen3.py, modeling_qwen3_moe.py), in
 * checkpoint order. Per layer: input_layernorm, q/k/v/o projections, per-head q/k RMSNorm,
 * post_attention_layernorm, then either the MoE block (router, each expert's gate/up/down,
 * experts of one projection back to back) or the dense SwiGLU MLP. */
#include <stddef.h>

#include "arch/family.h"
#include "arch/rows.h"
#include "arch/qwen3/qwen3.h"
#include "model/lora_internal.h"
#include "trill/lora.h"

enum dim { D_H, D_V, D_HD, D_QD, D_KVD, D_I, D_IM, D_E, D_LABELS };

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
    case D_LABELS: return c->num_labels;
    }
    return 0;
}

static bool moe(const trill_config *c, int l) { return trill_config_is_moe(c, l); }
static bool dense(const trill_config *c, int l) { return !trill_config_is_moe(c, l); }
static bool causal_untied(const trill_config *c, int l) { return c->num_labels == 0 && !c->tie_word_embeddings; }
static bool classifier(const trill_config *c, int l) { return c->num_labels > 0; }


static const trill_tensor_row ROWS_[] = {
    ROW_EMBED(D_V, D_H),
    ROW_INPUT_NORM(D_H),
    ROW_Q(D_QD, D_H), ROW_K(D_KVD, D_H), ROW_V(D_KVD, D_H), ROW_O(D_H, D_QD),
    ROWS_QK_NORM(NULL, D_HD),
    ROW_POST_NORM(D_H),
    ROW_ROUTER(moe, D_E, D_H),
    ROWS_EXPERTS(moe, D_IM, D_H),
    ROWS_DENSE_MLP(dense, D_I, D_H),
    ROW_FINAL_NORM(D_H),
    /* HF *ForSequenceClassification: nn.Linear(H, num_labels, bias=False), never tied */
    { "score.weight", TRILL_TENSOR_HEAD, G, classifier, { D_LABELS, D_H }, TRILL_ROLE_SCORE, TRILL_NO_LORA, NOFUSE, REPL, MW(score), TRILL_NO_FIELD },
    ROW_LM_HEAD(causal_untied, D_V, D_H),
};

/* scores Q K^T and values P V: 2 FLOPs per multiply-add, head_dim each, every query head */
static double attention_flops(const trill_config *c, double pairs) {
    return 2.0 * 2.0 * pairs * c->head_dim * c->num_attention_heads;
}

/* The first name of each is the default model_type's architecture in messages. */
static const trill_arch_names ARCHS[] = {
    { TRILL_ARCH_QWEN3_MOE, "qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeForSequenceClassification", NULL },
    { TRILL_ARCH_QWEN3, "qwen3", "Qwen3ForCausalLM", "Qwen3ForSequenceClassification", NULL },
};

const trill_family trill_family_qwen3 = {
    .name = "qwen3",
    .archs = ARCHS,
    .n_archs = (int)(sizeof ARCHS / sizeof ARCHS[0]),
    .config_keys = trill_qwen3_config_keys,
    .config_defaults = trill_qwen3_config_defaults,
    .config_read = trill_qwen3_config_read,
    .config_write = trill_qwen3_config_write,
    .layer_is_moe = trill_qwen3_layer_is_moe,
    .describe = trill_qwen3_describe,
    .rows = ROWS_,
    .n_rows = (int)(sizeof ROWS_ / sizeof ROWS_[0]),
    .dim = dim,
    .lora_targets = 1u << TRILL_LORA_Q | 1u << TRILL_LORA_K | 1u << TRILL_LORA_V | 1u << TRILL_LORA_O | 1u << TRILL_LORA_GATE |
                    1u << TRILL_LORA_UP | 1u << TRILL_LORA_DOWN | 1u << TRILL_LORA_LM_HEAD,
    .all_linear = 1u << TRILL_LORA_Q | 1u << TRILL_LORA_K | 1u << TRILL_LORA_V | 1u << TRILL_LORA_O | 1u << TRILL_LORA_GATE |
                  1u << TRILL_LORA_UP | 1u << TRILL_LORA_DOWN,
    .tied_head_role = TRILL_ROLE_LM_HEAD,
    .attention_flops = attention_flops,
    .presets = trill_qwen3_presets,
    .n_presets = &trill_qwen3_n_presets,
};
