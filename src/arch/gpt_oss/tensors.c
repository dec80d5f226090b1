/* The gpt-oss tensor table (HF modeling_gpt_oss.py, the checkpoints' names). Per layer:
 * input_layernorm; q/k/v/o projections with their biases (attention_bias); the attention sinks;
 * post_attention_layernorm; the router (mlp.router.weight and .bias); the routed experts.
 *
 * HF keeps a layer's experts in four stacked tensors: mlp.experts.gate_up_proj [E, H, 2I] (x @ W,
 * gate and up interleaved: gate in the even columns, up in the odd), gate_up_proj_bias [E, 2I]
 * (interleaved alike), down_proj [E, I, H] and down_proj_bias [E, H]; the released checkpoints
 * hold the two matrices in MXFP4 (*_blocks, *_scales). trill keeps each expert's gate, up and down
 * as nn.Linear matrices of their own ([I, H], [I, H], [H, I]) and biases, like every other family's
 * experts (one GEMM per expert, LoRA per expert, expert parallelism by expert), under its own names
 * ("model.layers.L.mlp.experts.E.gate_proj.weight", ...); the family's `stacked` list says where each
 * is in HF's tensors, which the loader reads and the saver writes. */
#include <stddef.h>

#include "arch/family.h"
#include "arch/gpt_oss/gpt_oss.h"
#include "arch/rows.h"
#include "trill/lora.h"

enum dim { D_H, D_V, D_NH, D_QD, D_KVD, D_IM, D_E };

static int64_t dim(const trill_config *c, int id) {
    switch ((enum dim)id) {
    case D_H: return c->hidden_size;
    case D_V: return c->vocab_size;
    case D_NH: return c->num_attention_heads;
    case D_QD: return (int64_t)c->num_attention_heads * c->head_dim;
    case D_KVD: return (int64_t)c->num_key_value_heads * c->head_dim;
    case D_IM: return c->moe_intermediate_size;
    case D_E: return c->num_experts;
    }
    return 0;
}

static bool moe(const trill_config *c, int l) { return trill_config_is_moe(c, l); }
static bool bias(const trill_config *c, int l) { return c->attention_bias; }
static bool untied(const trill_config *c, int l) { return !c->tie_word_embeddings; }

#define NOLORA TRILL_NO_LORA
#define NOF TRILL_NO_FIELD
#define LBIAS TRILL_TENSOR_LINEAR_BIAS
#define EXPERTS "model.layers.%d.mlp.experts."

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
    ROW_O_BIAS(bias, D_H),
    { "model.layers.%d.self_attn.sinks", TRILL_TENSOR_SINKS, L, NULL, { D_NH, NO }, TRILL_ROLE_SINKS, NOLORA, NOFUSE, ROWS, LW(sinks), NOF },
    ROW_POST_NORM(D_H),
    { "model.layers.%d.mlp.router.weight", TRILL_TENSOR_ROUTER, L, moe, { D_E, D_H }, TRILL_ROLE_ROUTER, NOLORA, NOFUSE, REPL, LW(router), NOF },
    { "model.layers.%d.mlp.router.bias", LBIAS, L, moe, { D_E, NO }, TRILL_ROLE_ROUTER_LINEAR_BIAS, NOLORA, NOFUSE, REPL,
      LW(router_linear_bias), NOF },
    { EXPERTS "%d.gate_proj.weight", MAT, X, moe, { D_IM, D_H }, TRILL_ROLE_EXPERT_GATE, TRILL_LORA_GATE, GU(0), ROWS, LW(expert_gate),
      LL(expert_gate) },
    { EXPERTS "%d.up_proj.weight", MAT, X, moe, { D_IM, D_H }, TRILL_ROLE_EXPERT_UP, TRILL_LORA_UP, GU(1), ROWS, LW(expert_up),
      LL(expert_up) },
    { EXPERTS "%d.down_proj.weight", MAT, X, moe, { D_H, D_IM }, TRILL_ROLE_EXPERT_DOWN, TRILL_LORA_DOWN, NOFUSE, COLS, LW(expert_down),
      LL(expert_down) },
    { EXPERTS "%d.gate_proj.bias", LBIAS, X, moe, { D_IM, NO }, TRILL_ROLE_EXPERT_GATE_BIAS, NOLORA, NOFUSE, ROWS, LW(expert_gate_bias), NOF },
    { EXPERTS "%d.up_proj.bias", LBIAS, X, moe, { D_IM, NO }, TRILL_ROLE_EXPERT_UP_BIAS, NOLORA, NOFUSE, ROWS, LW(expert_up_bias), NOF },
    { EXPERTS "%d.down_proj.bias", LBIAS, X, moe, { D_H, NO }, TRILL_ROLE_EXPERT_DOWN_BIAS, NOLORA, NOFUSE, REPL, LW(expert_down_bias), NOF },
    ROW_FINAL_NORM(D_H),
    ROW_LM_HEAD(untied, D_V, D_H),
};

/* HF's stacked expert tensors. */
static const trill_stacked STACKED[] = {
    { TRILL_ROLE_EXPERT_GATE, EXPERTS "gate_up_proj", 2, 0, false },
    { TRILL_ROLE_EXPERT_UP, EXPERTS "gate_up_proj", 2, 1, false },
    { TRILL_ROLE_EXPERT_DOWN, EXPERTS "down_proj", 1, 0, false },
    { TRILL_ROLE_EXPERT_GATE_BIAS, EXPERTS "gate_up_proj_bias", 2, 0, false },
    { TRILL_ROLE_EXPERT_UP_BIAS, EXPERTS "gate_up_proj_bias", 2, 1, false },
    { TRILL_ROLE_EXPERT_DOWN_BIAS, EXPERTS "down_proj_bias", 1, 0, false },
};

/* scores Q K^T and values P V: 2 FLOPs per multiply-add, head_dim each, every query head */
static double attention_flops(const trill_config *c, double pairs) {
    return 2.0 * 2.0 * pairs * c->head_dim * c->num_attention_heads;
}

static const trill_arch_names ARCHS[] = {
    { TRILL_ARCH_GPT_OSS, "gpt_oss", "GptOssForCausalLM", NULL, NULL },
};

#define BIT(t) (1u << (t))

const trill_family trill_family_gpt_oss = {
    .name = "gpt_oss",
    .archs = ARCHS,
    .n_archs = (int)(sizeof ARCHS / sizeof ARCHS[0]),
    .config_keys = trill_gpt_oss_config_keys,
    .config_defaults = trill_gpt_oss_config_defaults,
    .config_read = trill_gpt_oss_config_read,
    .config_write = trill_gpt_oss_config_write,
    .layer_is_moe = trill_gpt_oss_layer_is_moe,
    .describe = trill_gpt_oss_describe,
    .rows = ROWS_,
    .n_rows = (int)(sizeof ROWS_ / sizeof ROWS_[0]),
    .dim = dim,
    .lora_targets = BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_K) | BIT(TRILL_LORA_V) | BIT(TRILL_LORA_O) | BIT(TRILL_LORA_GATE) | BIT(TRILL_LORA_UP) |
                    BIT(TRILL_LORA_DOWN) | BIT(TRILL_LORA_LM_HEAD),
    .all_linear = BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_K) | BIT(TRILL_LORA_V) | BIT(TRILL_LORA_O) | BIT(TRILL_LORA_GATE) | BIT(TRILL_LORA_UP) |
                  BIT(TRILL_LORA_DOWN),
    .tied_head_role = TRILL_ROLE_LM_HEAD,
    .attention_flops = attention_flops,
    .presets = trill_gpt_oss_presets,
    .n_presets = &trill_gpt_oss_n_presets,
    .stacked = STACKED,
    .n_stacked = (int)(sizeof STACKED / sizeof STACKED[0]),
};
