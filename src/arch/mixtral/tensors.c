/* The Mixtral tensor table (HF modeling_mixtral.py, the checkpoints' names), in checkpoint order.
 * Per layer: input_layernorm, q/k/v/o projections, post_attention_layernorm, the router
 * (block_sparse_moe.gate) and each expert's w1 (gate), w2 (down), w3 (up), experts of one
 * projection back to back. PEFT names the experts' modules w1, w2, w3. */
#include <stddef.h>

#include "arch/family.h"
#include "arch/mixtral/mixtral.h"
#include "arch/rows.h"
#include "trill/lora.h"

enum dim { D_H, D_V, D_QD, D_KVD, D_IM, D_E, D_LABELS };

static int64_t dim(const trill_config *c, int id) {
    switch ((enum dim)id) {
    case D_H: return c->hidden_size;
    case D_V: return c->vocab_size;
    case D_QD: return (int64_t)c->num_attention_heads * c->head_dim;
    case D_KVD: return (int64_t)c->num_key_value_heads * c->head_dim;
    case D_IM: return c->moe_intermediate_size;
    case D_E: return c->num_experts;
    case D_LABELS: return c->num_labels;
    }
    return 0;
}

static bool causal_untied(const trill_config *c, int l) { return c->num_labels == 0 && !c->tie_word_embeddings; }
static bool classifier(const trill_config *c, int l) { return c->num_labels > 0; }

#define EXPERTS "model.layers.%d.block_sparse_moe.experts.%d."
static const trill_tensor_row ROWS_[] = {
    ROW_EMBED(D_V, D_H),
    ROW_INPUT_NORM(D_H),
    ROW_Q(D_QD, D_H), ROW_K(D_KVD, D_H), ROW_V(D_KVD, D_H), ROW_O(D_H, D_QD),
    ROW_POST_NORM(D_H),
    { "model.layers.%d.block_sparse_moe.gate.weight", TRILL_TENSOR_ROUTER, L, NULL, { D_E, D_H }, TRILL_ROLE_ROUTER, TRILL_NO_LORA, NOFUSE, REPL, LW(router), TRILL_NO_FIELD },
    { EXPERTS "w1.weight", MAT, X, NULL, { D_IM, D_H }, TRILL_ROLE_EXPERT_GATE, TRILL_LORA_W1, GU(0), ROWS, LW(expert_gate), LL(expert_gate) },
    { EXPERTS "w2.weight", MAT, X, NULL, { D_H, D_IM }, TRILL_ROLE_EXPERT_DOWN, TRILL_LORA_W2, NOFUSE, COLS, LW(expert_down), LL(expert_down) },
    { EXPERTS "w3.weight", MAT, X, NULL, { D_IM, D_H }, TRILL_ROLE_EXPERT_UP, TRILL_LORA_W3, GU(1), ROWS, LW(expert_up), LL(expert_up) },
    ROW_FINAL_NORM(D_H),
    /* HF MixtralForSequenceClassification: nn.Linear(H, num_labels, bias=False) */
    { "score.weight", TRILL_TENSOR_HEAD, G, classifier, { D_LABELS, D_H }, TRILL_ROLE_SCORE, TRILL_NO_LORA, NOFUSE, REPL, MW(score), TRILL_NO_FIELD },
    ROW_LM_HEAD(causal_untied, D_V, D_H),
};

/* scores Q K^T and values P V: 2 FLOPs per multiply-add, head_dim each, every query head */
static double attention_flops(const trill_config *c, double pairs) {
    return 2.0 * 2.0 * pairs * c->head_dim * c->num_attention_heads;
}

static const trill_arch_names ARCHS[] = {
    { TRILL_ARCH_MIXTRAL, "mixtral", "MixtralForCausalLM", "MixtralForSequenceClassification", NULL },
};

#define BIT(t) (1u << (t))

const trill_family trill_family_mixtral = {
    .name = "mixtral",
    .archs = ARCHS,
    .n_archs = (int)(sizeof ARCHS / sizeof ARCHS[0]),
    .config_keys = trill_mixtral_config_keys,
    .config_defaults = trill_mixtral_config_defaults,
    .config_read = trill_mixtral_config_read,
    .config_write = trill_mixtral_config_write,
    .layer_is_moe = trill_mixtral_layer_is_moe,
    .describe = trill_mixtral_describe,
    .rows = ROWS_,
    .n_rows = (int)(sizeof ROWS_ / sizeof ROWS_[0]),
    .dim = dim,
    .lora_targets = BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_K) | BIT(TRILL_LORA_V) | BIT(TRILL_LORA_O) | BIT(TRILL_LORA_W1) | BIT(TRILL_LORA_W2) |
                    BIT(TRILL_LORA_W3) | BIT(TRILL_LORA_LM_HEAD),
    .all_linear = BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_K) | BIT(TRILL_LORA_V) | BIT(TRILL_LORA_O) | BIT(TRILL_LORA_W1) | BIT(TRILL_LORA_W2) |
                  BIT(TRILL_LORA_W3),
    .tied_head_role = TRILL_ROLE_LM_HEAD,
    .attention_flops = attention_flops,
    .presets = trill_mixtral_presets,
    .n_presets = &trill_mixtral_n_presets,
};
