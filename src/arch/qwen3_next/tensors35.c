/* The Qwen3.5 / 3.6 MoE tensor table (HF modeling_qwen3_5_moe.py, Qwen3_5MoeForConditionalGeneration:
 * its language model, the released checkpoints' names under "model.language_model."). Qwen3-Next's
 * computation (src/arch/qwen3_next/tensors.c) with its own names and three differences: the Gated
 * DeltaNet's projections are in_proj_qkv [C, H] (the conv's channels q | k | v as they are),
 * in_proj_z, in_proj_b and in_proj_a; every layer is a MoE; the checkpoint stacks a layer's routed
 * experts in nn.Linear's orientation, mlp.experts.gate_up_proj [E, 2I, H] (gate the rows [0, I),
 * up [I, 2I)) and mlp.experts.down_proj [E, H, I] (trill_stacked, `linear`), which trill holds per
 * expert under its own names ("...mlp.experts.E.gate_proj.weight", ...). The vision tower
 * ("model.visual.*") and the MTP module ("mtp.*") are skipped on load: trill trains the language
 * model. */
#include <stddef.h>

#include "arch/family.h"
#include "arch/qwen3_next/qwen3_next.h"
#include "arch/rows.h"
#include "trill/lora.h"

enum dim { D_H, D_V, D_QD2, D_QD, D_KVD, D_HD, D_IM, D_E, D_SH, D_ONE, D_C, D_CONVW, D_NV, D_DV, D_VD };

static int64_t dim(const trill_config *c, int id) {
    const int64_t nk = c->linear_num_key_heads, nv = c->linear_num_value_heads, dk = c->linear_key_head_dim, dv = c->linear_value_head_dim;
    switch ((enum dim)id) {
    case D_H: return c->hidden_size;
    case D_V: return c->vocab_size;
    case D_QD2: return 2 * (int64_t)c->num_attention_heads * c->head_dim;
    case D_QD: return (int64_t)c->num_attention_heads * c->head_dim;
    case D_KVD: return (int64_t)c->num_key_value_heads * c->head_dim;
    case D_HD: return c->head_dim;
    case D_IM: return c->moe_intermediate_size;
    case D_E: return c->num_experts;
    case D_SH: return c->shared_expert_intermediate_size;
    case D_ONE: return 1;
    case D_C: return 2 * nk * dk + nv * dv;
    case D_CONVW: return (2 * nk * dk + nv * dv) * c->linear_conv_kernel_dim;
    case D_NV: return nv;
    case D_DV: return dv;
    case D_VD: return nv * dv;
    }
    return 0;
}

static bool linear(const trill_config *c, int l) { return c->linear_layer[l]; }
static bool full(const trill_config *c, int l) { return !c->linear_layer[l]; }
static bool full_bias(const trill_config *c, int l) { return !c->linear_layer[l] && c->attention_bias; }
static bool moe(const trill_config *c, int l) { return trill_config_is_moe(c, l); }
static bool shared(const trill_config *c, int l) { return trill_config_is_moe(c, l) && c->shared_expert_intermediate_size > 0; }
static bool untied(const trill_config *c, int l) { return !c->tie_word_embeddings; }

#define NOLORA TRILL_NO_LORA
#define NOF TRILL_NO_FIELD
#define LBIAS TRILL_TENSOR_LINEAR_BIAS

/* The rows under the language model's name prefix P: "model.language_model." in the multimodal
 * checkpoint, "model." in the text model's (Qwen3_5MoeForCausalLM). */
#define ROWS35(P) \
    { P "embed_tokens.weight", TRILL_TENSOR_EMBEDDING, G, NULL, { D_V, D_H }, TRILL_ROLE_EMBED, NOLORA, NOFUSE, ROWS, MW(embed), NOF }, \
    { P "layers.%d.input_layernorm.weight", NORM, L, NULL, { D_H, NO }, TRILL_ROLE_INPUT_NORM, NOLORA, NOFUSE, REPL, LW(input_norm), NOF }, \
    { P "layers.%d.linear_attn.in_proj_qkv.weight", MAT, L, linear, { D_C, D_H }, TRILL_ROLE_GDN_QKV, TRILL_LORA_IN_PROJ_QKV, NOFUSE, TRILL_SPLIT_CHANNELS, LW(gdn_qkv), LL(gdn_qkv) }, \
    { P "layers.%d.linear_attn.in_proj_z.weight", MAT, L, linear, { D_VD, D_H }, TRILL_ROLE_GDN_Z, TRILL_LORA_IN_PROJ_Z, NOFUSE, ROWS, LW(gdn_z), LL(gdn_z) }, \
    { P "layers.%d.linear_attn.in_proj_b.weight", MAT, L, linear, { D_NV, D_H }, TRILL_ROLE_GDN_B, TRILL_LORA_IN_PROJ_B, NOFUSE, ROWS, LW(gdn_b), LL(gdn_b) }, \
    { P "layers.%d.linear_attn.in_proj_a.weight", MAT, L, linear, { D_NV, D_H }, TRILL_ROLE_GDN_A, TRILL_LORA_IN_PROJ_A, NOFUSE, ROWS, LW(gdn_a), LL(gdn_a) }, \
    { P "layers.%d.linear_attn.conv1d.weight", TRILL_TENSOR_CONV, L, linear, { D_CONVW, NO }, TRILL_ROLE_GDN_CONV, NOLORA, NOFUSE, TRILL_SPLIT_CHANNELS, LW(gdn_conv), NOF }, \
    { P "layers.%d.linear_attn.dt_bias", TRILL_TENSOR_DECAY, L, linear, { D_NV, NO }, TRILL_ROLE_GDN_DT_BIAS, NOLORA, NOFUSE, ROWS, LW(gdn_dt_bias), NOF }, \
    { P "layers.%d.linear_attn.A_log", TRILL_TENSOR_DECAY, L, linear, { D_NV, NO }, TRILL_ROLE_GDN_A_LOG, NOLORA, NOFUSE, ROWS, LW(gdn_a_log), NOF }, \
    { P "layers.%d.linear_attn.norm.weight", NORM, L, linear, { D_DV, NO }, TRILL_ROLE_GDN_NORM, NOLORA, NOFUSE, REPL, LW(gdn_norm), NOF }, \
    { P "layers.%d.linear_attn.out_proj.weight", MAT, L, linear, { D_H, D_VD }, TRILL_ROLE_GDN_OUT, TRILL_LORA_OUT_PROJ, NOFUSE, COLS, LW(gdn_out), LL(gdn_out) }, \
    { P "layers.%d.self_attn.q_proj.weight", MAT, L, full, { D_QD2, D_H }, TRILL_ROLE_Q, TRILL_LORA_Q, QKV(0), ROWS, LW(wq), LL(q) }, \
    { P "layers.%d.self_attn.q_proj.bias", LBIAS, L, full_bias, { D_QD2, NO }, TRILL_ROLE_Q_BIAS, NOLORA, NOFUSE, ROWS, LW(q_bias), NOF }, \
    { P "layers.%d.self_attn.k_proj.weight", MAT, L, full, { D_KVD, D_H }, TRILL_ROLE_K, TRILL_LORA_K, QKV(1), ROWS, LW(wk), LL(k) }, \
    { P "layers.%d.self_attn.k_proj.bias", LBIAS, L, full_bias, { D_KVD, NO }, TRILL_ROLE_K_BIAS, NOLORA, NOFUSE, ROWS, LW(k_bias), NOF }, \
    { P "layers.%d.self_attn.v_proj.weight", MAT, L, full, { D_KVD, D_H }, TRILL_ROLE_V, TRILL_LORA_V, QKV(2), ROWS, LW(wv), LL(v) }, \
    { P "layers.%d.self_attn.v_proj.bias", LBIAS, L, full_bias, { D_KVD, NO }, TRILL_ROLE_V_BIAS, NOLORA, NOFUSE, ROWS, LW(v_bias), NOF }, \
    { P "layers.%d.self_attn.o_proj.weight", MAT, L, full, { D_H, D_QD }, TRILL_ROLE_O, TRILL_LORA_O, NOFUSE, COLS, LW(wo), LL(o) }, \
    { P "layers.%d.self_attn.o_proj.bias", LBIAS, L, full_bias, { D_H, NO }, TRILL_ROLE_O_BIAS, NOLORA, NOFUSE, REPL, LW(o_bias), NOF }, \
    { P "layers.%d.self_attn.q_norm.weight", NORM, L, full, { D_HD, NO }, TRILL_ROLE_Q_NORM, NOLORA, NOFUSE, REPL, LW(q_norm), NOF }, \
    { P "layers.%d.self_attn.k_norm.weight", NORM, L, full, { D_HD, NO }, TRILL_ROLE_K_NORM, NOLORA, NOFUSE, REPL, LW(k_norm), NOF }, \
    { P "layers.%d.post_attention_layernorm.weight", NORM, L, NULL, { D_H, NO }, TRILL_ROLE_POST_NORM, NOLORA, NOFUSE, REPL, LW(post_norm), NOF }, \
    { P "layers.%d.mlp.gate.weight", TRILL_TENSOR_ROUTER, L, moe, { D_E, D_H }, TRILL_ROLE_ROUTER, NOLORA, NOFUSE, REPL, LW(router), NOF }, \
    { P "layers.%d.mlp.experts.%d.gate_proj.weight", MAT, X, moe, { D_IM, D_H }, TRILL_ROLE_EXPERT_GATE, TRILL_LORA_GATE, GU(0), ROWS, LW(expert_gate), \
      LL(expert_gate) }, \
    { P "layers.%d.mlp.experts.%d.up_proj.weight", MAT, X, moe, { D_IM, D_H }, TRILL_ROLE_EXPERT_UP, TRILL_LORA_UP, GU(1), ROWS, LW(expert_up), \
      LL(expert_up) }, \
    { P "layers.%d.mlp.experts.%d.down_proj.weight", MAT, X, moe, { D_H, D_IM }, TRILL_ROLE_EXPERT_DOWN, TRILL_LORA_DOWN, NOFUSE, COLS, LW(expert_down), \
      LL(expert_down) }, \
    { P "layers.%d.mlp.shared_expert.gate_proj.weight", MAT, L, shared, { D_SH, D_H }, TRILL_ROLE_SHARED_GATE, TRILL_LORA_GATE, GU(0), ROWS, \
      LW(shared_gate), LL(shared_gate) }, \
    { P "layers.%d.mlp.shared_expert.up_proj.weight", MAT, L, shared, { D_SH, D_H }, TRILL_ROLE_SHARED_UP, TRILL_LORA_UP, GU(1), ROWS, LW(shared_up), \
      LL(shared_up) }, \
    { P "layers.%d.mlp.shared_expert.down_proj.weight", MAT, L, shared, { D_H, D_SH }, TRILL_ROLE_SHARED_DOWN, TRILL_LORA_DOWN, NOFUSE, COLS, \
      LW(shared_down), LL(shared_down) }, \
    { P "layers.%d.mlp.shared_expert_gate.weight", MAT, L, shared, { D_ONE, D_H }, TRILL_ROLE_SHARED_EXPERT_GATE, TRILL_LORA_SHARED_EXPERT_GATE, NOFUSE, \
      REPL, LW(shared_expert_gate), LL(shared_expert_gate) }, \
    { P "norm.weight", NORM, G, NULL, { D_H, NO }, TRILL_ROLE_FINAL_NORM, NOLORA, NOFUSE, REPL, MW(final_norm), NOF }, \
    ROW_LM_HEAD(untied, D_V, D_H),

/* The checkpoint's stacked experts: nn.Linear's orientation, gate then up in gate_up_proj. */
#define STACKED35(P) \
    { TRILL_ROLE_EXPERT_GATE, P "layers.%d.mlp.experts.gate_up_proj", 2, 0, true }, \
    { TRILL_ROLE_EXPERT_UP, P "layers.%d.mlp.experts.gate_up_proj", 2, 1, true }, \
    { TRILL_ROLE_EXPERT_DOWN, P "layers.%d.mlp.experts.down_proj", 1, 0, true },

static const trill_tensor_row ROWS_MM[] = { ROWS35("model.language_model.") };
static const trill_tensor_row ROWS_TEXT[] = { ROWS35("model.") };
static const trill_stacked STACKED_MM[] = { STACKED35("model.language_model.") };
static const trill_stacked STACKED_TEXT[] = { STACKED35("model.") };

static const trill_arch_names ARCHS_MM[] = {
    { TRILL_ARCH_QWEN3_5_MOE, "qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", NULL, "qwen3_5_moe_text" },
};
static const trill_arch_names ARCHS_TEXT[] = {
    { TRILL_ARCH_QWEN3_5_MOE_TEXT, "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", NULL, NULL },
};

static const char *const IGNORED[] = { "mtp.", "model.visual.", NULL };
static const int NO_PRESETS = 0;

#define BIT(t) (1u << (t))
#define LINEARS                                                                                                                           \
    (BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_K) | BIT(TRILL_LORA_V) | BIT(TRILL_LORA_O) | BIT(TRILL_LORA_GATE) | BIT(TRILL_LORA_UP) |          \
     BIT(TRILL_LORA_DOWN) | BIT(TRILL_LORA_IN_PROJ_QKV) | BIT(TRILL_LORA_IN_PROJ_Z) | BIT(TRILL_LORA_IN_PROJ_B) |                       \
     BIT(TRILL_LORA_IN_PROJ_A) | BIT(TRILL_LORA_OUT_PROJ) | BIT(TRILL_LORA_SHARED_EXPERT_GATE))

/* The two families, each its rows under its prefix, its stacked experts and its presets. */
#define FAMILY35(NAME, ARCHS_, ROWS__, STACKED_, N_PRESETS)                                                                          \
    {                                                                                                                                  \
        .name = NAME, .archs = ARCHS_, .n_archs = 1, .config_keys = trill_qwen3_next_config_keys,                                     \
        .config_defaults = trill_qwen3_next_config_defaults, .config_read = trill_qwen3_next_config_read,                             \
        .config_write = trill_qwen3_next_config_write, .layer_is_moe = trill_qwen3_next_layer_is_moe,                                 \
        .describe = trill_qwen3_next_describe, .rows = ROWS__, .n_rows = (int)(sizeof ROWS__ / sizeof ROWS__[0]), .dim = dim,         \
        .lora_targets = LINEARS | BIT(TRILL_LORA_LM_HEAD), .all_linear = LINEARS, .tied_head_role = TRILL_ROLE_LM_HEAD,              \
        .attention_flops = trill_qwen3_next_attention_flops, .token_flops = trill_qwen3_next_token_flops,                             \
        .presets = trill_qwen3_5_moe_presets, .n_presets = N_PRESETS, .stacked = STACKED_,                                             \
        .n_stacked = (int)(sizeof STACKED_ / sizeof STACKED_[0]), .ignored_prefixes = IGNORED,                                         \
    }

const trill_family trill_family_qwen3_5_moe = FAMILY35("qwen3_5_moe", ARCHS_MM, ROWS_MM, STACKED_MM, &trill_qwen3_5_moe_n_presets);
/* The text model's (Qwen3_5MoeForCausalLM: the same tensors under "model."; the presets are the
 * multimodal family's, whose language model this is). */
const trill_family trill_family_qwen3_5_moe_text = FAMILY35("qwen3_5_moe_text", ARCHS_TEXT, ROWS_TEXT, STACKED_TEXT, &NO_PRESETS);
