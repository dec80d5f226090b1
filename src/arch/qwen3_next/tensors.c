/* The Qwen3-Next tensor table (HF modeling_qwen3_next.py, the released checkpoints' names). Per
 * layer: input_layernorm; on a linear-attention layer the Gated DeltaNet's in_proj_qkvz,
 * in_proj_ba, conv1d, dt_bias, A_log, its gated norm and out_proj, on a full-attention layer
 * q_proj (twice as wide: per head the query, then its output gate), k/v/o_proj (with biases
 * under attention_bias), q_norm and k_norm; post_attention_layernorm; then the MoE (the router
 * mlp.gate, each routed expert's gate/up/down_proj, the shared expert mlp.shared_expert.* and
 * its gate mlp.shared_expert_gate [1, H]) or the dense MLP. The checkpoints' MTP module ("mtp.*")
 * is skipped on load, as HF does.
 *
 * Tensor parallelism splits the Gated DeltaNet by key heads, each with its value heads: the rows
 * of in_proj_qkvz and in_proj_ba (HF's layout keeps a key head's q, k, v, z and b, a together),
 * A_log and dt_bias, the columns of out_proj, and the conv's channels of q, k and v each
 * (TRILL_SPLIT_CHANNELS). */
#include <stddef.h>

#include "arch/family.h"
#include "arch/qwen3_next/qwen3_next.h"
#include "arch/rows.h"
#include "trill/lora.h"

enum dim { D_H, D_V, D_QD2, D_QD, D_KVD, D_HD, D_IM, D_E, D_I, D_SH, D_ONE, D_QKVZ, D_BA, D_CONVW, D_NV, D_DV, D_VD };

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
    case D_I: return c->intermediate_size;
    case D_SH: return c->shared_expert_intermediate_size;
    case D_ONE: return 1;
    case D_QKVZ: return 2 * nk * dk + 2 * nv * dv;
    case D_BA: return 2 * nv;
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
static bool dense(const trill_config *c, int l) { return !trill_config_is_moe(c, l); }
static bool untied(const trill_config *c, int l) { return !c->tie_word_embeddings; }

#define NOLORA TRILL_NO_LORA
#define NOF TRILL_NO_FIELD
#define GDN "model.layers.%d.linear_attn."
#define SHARED "model.layers.%d.mlp.shared_expert."

static const trill_tensor_row ROWS_[] = {
    ROW_EMBED(D_V, D_H),
    ROW_INPUT_NORM(D_H),
    { GDN "in_proj_qkvz.weight", MAT, L, linear, { D_QKVZ, D_H }, TRILL_ROLE_GDN_QKVZ, TRILL_LORA_IN_PROJ_QKVZ, NOFUSE, ROWS, LW(gdn_qkvz),
      LL(gdn_qkvz) },
    { GDN "in_proj_ba.weight", MAT, L, linear, { D_BA, D_H }, TRILL_ROLE_GDN_BA, TRILL_LORA_IN_PROJ_BA, NOFUSE, ROWS, LW(gdn_ba), LL(gdn_ba) },
    { GDN "conv1d.weight", TRILL_TENSOR_CONV, L, linear, { D_CONVW, NO }, TRILL_ROLE_GDN_CONV, NOLORA, NOFUSE, TRILL_SPLIT_CHANNELS, LW(gdn_conv),
      NOF },
    { GDN "dt_bias", TRILL_TENSOR_DECAY, L, linear, { D_NV, NO }, TRILL_ROLE_GDN_DT_BIAS, NOLORA, NOFUSE, ROWS, LW(gdn_dt_bias), NOF },
    { GDN "A_log", TRILL_TENSOR_DECAY, L, linear, { D_NV, NO }, TRILL_ROLE_GDN_A_LOG, NOLORA, NOFUSE, ROWS, LW(gdn_a_log), NOF },
    { GDN "norm.weight", NORM, L, linear, { D_DV, NO }, TRILL_ROLE_GDN_NORM, NOLORA, NOFUSE, REPL, LW(gdn_norm), NOF },
    { GDN "out_proj.weight", MAT, L, linear, { D_H, D_VD }, TRILL_ROLE_GDN_OUT, TRILL_LORA_OUT_PROJ, NOFUSE, COLS, LW(gdn_out), LL(gdn_out) },
    { "model.layers.%d.self_attn.q_proj.weight", MAT, L, full, { D_QD2, D_H }, TRILL_ROLE_Q, TRILL_LORA_Q, QKV(0), ROWS, LW(wq), LL(q) },
    ROW_Q_BIAS(full_bias, D_QD2),
    { "model.layers.%d.self_attn.k_proj.weight", MAT, L, full, { D_KVD, D_H }, TRILL_ROLE_K, TRILL_LORA_K, QKV(1), ROWS, LW(wk), LL(k) },
    ROW_K_BIAS(full_bias, D_KVD),
    { "model.layers.%d.self_attn.v_proj.weight", MAT, L, full, { D_KVD, D_H }, TRILL_ROLE_V, TRILL_LORA_V, QKV(2), ROWS, LW(wv), LL(v) },
    ROW_V_BIAS(full_bias, D_KVD),
    { "model.layers.%d.self_attn.o_proj.weight", MAT, L, full, { D_H, D_QD }, TRILL_ROLE_O, TRILL_LORA_O, NOFUSE, COLS, LW(wo), LL(o) },
    ROW_O_BIAS(full_bias, D_H),
    ROWS_QK_NORM(full, D_HD),
    ROW_POST_NORM(D_H),
    ROW_ROUTER(moe, D_E, D_H),
    ROWS_EXPERTS(moe, D_IM, D_H),
    { SHARED "gate_proj.weight", MAT, L, shared, { D_SH, D_H }, TRILL_ROLE_SHARED_GATE, TRILL_LORA_GATE, GU(0), ROWS, LW(shared_gate), LL(shared_gate) },
    { SHARED "up_proj.weight", MAT, L, shared, { D_SH, D_H }, TRILL_ROLE_SHARED_UP, TRILL_LORA_UP, GU(1), ROWS, LW(shared_up), LL(shared_up) },
    { SHARED "down_proj.weight", MAT, L, shared, { D_H, D_SH }, TRILL_ROLE_SHARED_DOWN, TRILL_LORA_DOWN, NOFUSE, COLS, LW(shared_down), LL(shared_down) },
    { "model.layers.%d.mlp.shared_expert_gate.weight", MAT, L, shared, { D_ONE, D_H }, TRILL_ROLE_SHARED_EXPERT_GATE, TRILL_LORA_SHARED_EXPERT_GATE,
      NOFUSE, REPL, LW(shared_expert_gate), LL(shared_expert_gate) },
    ROWS_DENSE_MLP(dense, D_I, D_H),
    ROW_FINAL_NORM(D_H),
    ROW_LM_HEAD(untied, D_V, D_H),
};

/* Full-attention layers only, averaged over the layers: scores Q K^T and values P V, head_dim
 * each, every query head. */
double trill_qwen3_next_attention_flops(const trill_config *c, double pairs) {
    int full_layers = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) full_layers += !c->linear_layer[l];
    return 2.0 * 2.0 * pairs * c->head_dim * c->num_attention_heads * full_layers / c->num_hidden_layers;
}

/* The Gated DeltaNet's recurrence per token, every linear layer: per value head the state's decay
 * (dk dv), S^T k (2 dk dv), the rank-one update (2 dk dv) and S^T q (2 dk dv). */
double trill_qwen3_next_token_flops(const trill_config *c) {
    int linear_layers = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) linear_layers += c->linear_layer[l];
    return 7.0 * c->linear_num_value_heads * c->linear_key_head_dim * c->linear_value_head_dim * linear_layers;
}

static const trill_arch_names ARCHS[] = {
    { TRILL_ARCH_QWEN3_NEXT, "qwen3_next", "Qwen3NextForCausalLM", NULL, NULL },
};

static const char *const IGNORED[] = { "mtp.", NULL };

#define BIT(t) (1u << (t))
#define LINEARS                                                                                                                           \
    (BIT(TRILL_LORA_Q) | BIT(TRILL_LORA_K) | BIT(TRILL_LORA_V) | BIT(TRILL_LORA_O) | BIT(TRILL_LORA_GATE) | BIT(TRILL_LORA_UP) |          \
     BIT(TRILL_LORA_DOWN) | BIT(TRILL_LORA_IN_PROJ_QKVZ) | BIT(TRILL_LORA_IN_PROJ_BA) | BIT(TRILL_LORA_OUT_PROJ) |                       \
     BIT(TRILL_LORA_SHARED_EXPERT_GATE))

const trill_family trill_family_qwen3_next = {
    .name = "qwen3_next",
    .archs = ARCHS,
    .n_archs = (int)(sizeof ARCHS / sizeof ARCHS[0]),
    .config_keys = trill_qwen3_next_config_keys,
    .config_defaults = trill_qwen3_next_config_defaults,
    .config_read = trill_qwen3_next_config_read,
    .config_write = trill_qwen3_next_config_write,
    .layer_is_moe = trill_qwen3_next_layer_is_moe,
    .describe = trill_qwen3_next_describe,
    .rows = ROWS_,
    .n_rows = (int)(sizeof ROWS_ / sizeof ROWS_[0]),
    .dim = dim,
    .lora_targets = LINEARS | BIT(TRILL_LORA_LM_HEAD),
    .all_linear = LINEARS,
    .tied_head_role = TRILL_ROLE_LM_HEAD,
    .attention_flops = trill_qwen3_next_attention_flops,
    .token_flops = trill_qwen3_next_token_flops,
    .presets = trill_qwen3_next_presets,
    .n_presets = &trill_qwen3_next_n_presets,
    .ignored_prefixes = IGNORED,
};
