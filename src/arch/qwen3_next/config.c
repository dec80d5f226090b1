/* The Qwen3-Next family's config.json fields (HF Qwen3NextConfig): their defaults, reading and
 * checking them, writing them, the layer map and the layer description. The fields every family
 * shares are src/model/config.c's. The MTP module (mtp_num_hidden_layers, tensors "mtp.*") is
 * not computed, as HF does not: its tensors are skipped on load. */
#include <string.h>

#include "arch/family.h"
#include "arch/qwen3_next/qwen3_next.h"
#include "base/json.h"

const char *const trill_qwen3_next_config_keys[] = {
    "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling", "rope_parameters",
    "partial_rotary_factor", "attention_bias", "attention_dropout", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers", "layer_types",
    "full_attention_interval", "linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
    "linear_num_value_heads", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings", "router_aux_loss_coef", "output_router_logits",
    "text_config", "vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id", NULL,
};

/* Qwen3.5 MoE: the multimodal model's language model or the text model alone. */
static bool is_qwen35(const trill_config *c) { return c->arch == TRILL_ARCH_QWEN3_5_MOE || c->arch == TRILL_ARCH_QWEN3_5_MOE_TEXT; }

/* HF Qwen3NextConfig's defaults (Qwen3_5MoeTextConfig's: Qwen3-Next's with its own vocabulary,
 * layers and experts, every layer a MoE whose router always renormalises). */
void trill_qwen3_next_config_defaults(trill_config *c) {
    c->vocab_size = 151936;
    c->hidden_size = 2048;
    c->intermediate_size = 5632;
    c->num_hidden_layers = 48;
    c->num_attention_heads = 16;
    c->num_key_value_heads = 2;
    c->head_dim = 256;
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->partial_rotary_factor = 0.25;
    c->initializer_range = 0.02;
    c->qk_norm = true;
    c->attn_output_gate = true;
    c->norm_centered = true;
    c->linear_conv_kernel_dim = 4;
    c->linear_key_head_dim = 128;
    c->linear_value_head_dim = 128;
    c->linear_num_key_heads = 16;
    c->linear_num_value_heads = 32;
    c->decoder_sparse_step = 1;
    c->moe_intermediate_size = 512;
    c->shared_expert_intermediate_size = 512;
    c->num_experts_per_tok = 10;
    c->num_experts = 512;
    c->norm_topk_prob = true;
    if (is_qwen35(c)) {
        c->intermediate_size = 0; /* no dense MLP */
        c->vocab_size = 248320;
        c->num_hidden_layers = 40;
        c->num_experts_per_tok = 8;
        c->num_experts = 256;
    }
}

/* layer_types ("linear_attention" or "full_attention" per layer); absent or null: full attention
 * on every full_attention_interval-th layer (default 4), linear attention elsewhere. */
static trill_status read_layer_types(const json_t *root, const char *what, trill_config *c) {
    int interval = 4;
    trill_status st = trill_json_get_int(root, "full_attention_interval", what, 1, TRILL_MAX_LAYERS, &interval);
    if (st) return st;
    for (int l = 0; l < c->num_hidden_layers; l++) c->linear_layer[l] = (l + 1) % interval != 0;
    return trill_arch_read_layer_kinds(root, what, c, "linear_attention", "full_attention", c->linear_layer);
}

static trill_status check(const trill_config *c, const char *what) {
    trill_status st = c->num_experts > 0 ? trill_arch_check_gqa_moe(c, what, "num_experts") : TRILL_OK;
    if (st) return st;
    if (c->head_dim < 2 || c->head_dim % 2)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"head_dim\": %d must be even and at least 2 (RoPE)", what, c->head_dim);
    const int rd = (int)(c->head_dim * c->partial_rotary_factor);
    if (rd < 2 || rd % 2 || c->partial_rotary_factor <= 0 || c->partial_rotary_factor > 1)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"partial_rotary_factor\": %g of head_dim %d rotates %d dimensions (expected an even number, at least 2)",
                           what, c->partial_rotary_factor, c->head_dim, rd);
    if (c->linear_num_value_heads % c->linear_num_key_heads)
        return trill_error(TRILL_ERR_INVALID, "%s: linear_num_value_heads (%d) must be a multiple of linear_num_key_heads (%d)", what,
                           c->linear_num_value_heads, c->linear_num_key_heads);
    if (c->linear_conv_kernel_dim < 1 || c->linear_conv_kernel_dim > 16)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"linear_conv_kernel_dim\": %d (expected 1 to 16)", what, c->linear_conv_kernel_dim);
    return TRILL_OK;
}

trill_status trill_qwen3_next_config_read(const json_t *root, const char *what, trill_config *c) {
    const int BIG = 1 << 24;
    trill_status st;
    if ((st = trill_json_get_int(root, "intermediate_size", what, 1, BIG, &c->intermediate_size)) ||
        (st = trill_json_get_int(root, "num_attention_heads", what, 1, 4096, &c->num_attention_heads)) ||
        (st = trill_json_get_int(root, "num_key_value_heads", what, 1, 4096, &c->num_key_value_heads)) ||
        (st = trill_arch_get_int_or_null(root, "head_dim", what, 2, 1 << 16, &c->head_dim)) ||
        (st = trill_arch_read_rope(root, what, c)) || (st = trill_json_get_bool(root, "attention_bias", what, &c->attention_bias)) ||
        (st = trill_json_get_int(root, "num_experts", what, 0, 65535, &c->num_experts)) ||
        (st = trill_json_get_int(root, "num_experts_per_tok", what, 1, 65535, &c->num_experts_per_tok)) ||
        (st = trill_json_get_int(root, "moe_intermediate_size", what, 1, BIG, &c->moe_intermediate_size)) ||
        (st = trill_json_get_int(root, "shared_expert_intermediate_size", what, 0, BIG, &c->shared_expert_intermediate_size)) ||
        (c->arch == TRILL_ARCH_QWEN3_NEXT && /* Qwen3.5: every layer a MoE, the top-k always renormalised (no such fields) */
         ((st = trill_json_get_int(root, "decoder_sparse_step", what, 1, TRILL_MAX_LAYERS, &c->decoder_sparse_step)) ||
          (st = trill_json_get_bool(root, "norm_topk_prob", what, &c->norm_topk_prob)) ||
          (st = trill_arch_read_mlp_only_layers(root, what, c)))) ||
        (st = trill_json_get_int(root, "linear_conv_kernel_dim", what, 1, 64, &c->linear_conv_kernel_dim)) ||
        (st = trill_json_get_int(root, "linear_key_head_dim", what, 1, 1 << 12, &c->linear_key_head_dim)) ||
        (st = trill_json_get_int(root, "linear_value_head_dim", what, 1, 1 << 12, &c->linear_value_head_dim)) ||
        (st = trill_json_get_int(root, "linear_num_key_heads", what, 1, 4096, &c->linear_num_key_heads)) ||
        (st = trill_json_get_int(root, "linear_num_value_heads", what, 1, 4096, &c->linear_num_value_heads)) ||
        (st = read_layer_types(root, what, c)))
        return st;
    if (c->head_dim == 0) c->head_dim = c->hidden_size / c->num_attention_heads; /* null (HF: None) */
    return check(c, what);
}

/* HF Qwen3NextDecoderLayer: MoE iff not in mlp_only_layers, num_experts > 0 and (l + 1) %
 * decoder_sparse_step == 0. */
bool trill_qwen3_next_layer_is_moe(const trill_config *c, int l) {
    return !c->mlp_only[l] && c->num_experts > 0 && (l + 1) % c->decoder_sparse_step == 0;
}

/* Gated DeltaNet on the linear layers, gated GQA with QK-norm (and q/k/v/o biases with
 * attention_bias) on the others; MoE: a softmax top-k router, the shared expert under its
 * sigmoid gate. */
trill_layer_desc trill_qwen3_next_describe(const trill_config *c, int l) {
    const bool moe = trill_config_is_moe(c, l), shared = moe && c->shared_expert_intermediate_size > 0;
    const bool full = !c->linear_layer[l];
    return (trill_layer_desc){ .attention = full ? TRILL_ATTENTION_GQA : TRILL_ATTENTION_GDN, .qk_norm = true,
                               .qkv_bias = full && c->attention_bias, .o_bias = full && c->attention_bias, .output_gate = true, .moe = moe,
                               .router = TRILL_ROUTER_SOFTMAX, .shared_experts = shared, .shared_expert_gate = shared,
                               .gdn_split_proj = is_qwen35(c) };
}

bool trill_qwen3_next_config_write(const trill_config *c, json_t *j) {
    bool ok = true;
#define SETI(k, v) ok &= json_object_set_new(j, k, json_integer(v)) == 0
    const bool v35 = is_qwen35(c); /* Qwen3_5MoeTextConfig has no dense MLP, sparse step or norm_topk_prob */
    if (!v35) SETI("intermediate_size", c->intermediate_size);
    SETI("num_attention_heads", c->num_attention_heads);
    SETI("num_key_value_heads", c->num_key_value_heads);
    SETI("head_dim", c->head_dim);
    if (v35) { /* rope_parameters as its configs have them: mrope's sections, equal for text (plain RoPE) */
        const int n = (int)(c->head_dim * c->partial_rotary_factor) / 2, s0 = (n + 2) / 3;
        json_t *rp = json_pack("{s:s, s:f, s:f, s:[i,i,i], s:b}", "rope_type", "default", "rope_theta", c->rope_theta, "partial_rotary_factor",
                               c->partial_rotary_factor, "mrope_section", s0, s0, n - 2 * s0, "mrope_interleaved", 1);
        ok &= rp != NULL && json_object_set_new(j, "rope_parameters", rp) == 0;
    } else {
        ok &= json_object_set_new(j, "rope_theta", json_real(c->rope_theta)) == 0;
        ok &= json_object_set_new(j, "partial_rotary_factor", json_real(c->partial_rotary_factor)) == 0;
        json_t *rs = trill_arch_rope_scaling_json(c);
        ok &= rs != NULL && json_object_set_new(j, "rope_scaling", rs) == 0;
    }
    ok &= json_object_set_new(j, "attention_bias", json_boolean(c->attention_bias)) == 0;
    SETI("num_experts", c->num_experts);
    SETI("num_experts_per_tok", c->num_experts_per_tok);
    SETI("moe_intermediate_size", c->moe_intermediate_size);
    SETI("shared_expert_intermediate_size", c->shared_expert_intermediate_size);
    if (!v35) {
        SETI("decoder_sparse_step", c->decoder_sparse_step);
        ok &= json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk_prob)) == 0;
    }
    SETI("linear_conv_kernel_dim", c->linear_conv_kernel_dim);
    SETI("linear_key_head_dim", c->linear_key_head_dim);
    SETI("linear_value_head_dim", c->linear_value_head_dim);
    SETI("linear_num_key_heads", c->linear_num_key_heads);
    SETI("linear_num_value_heads", c->linear_num_value_heads);
#undef SETI
    json_t *mlp_only = json_array(), *types = json_array();
    ok &= mlp_only != NULL && types != NULL;
    for (int l = 0; ok && l < c->num_hidden_layers; l++) {
        if (c->mlp_only[l]) ok &= json_array_append_new(mlp_only, json_integer(l)) == 0;
        ok &= json_array_append_new(types, json_string(c->linear_layer[l] ? "linear_attention" : "full_attention")) == 0;
    }
    if (v35) json_decref(mlp_only);
    else ok &= json_object_set_new(j, "mlp_only_layers", mlp_only) == 0;
    ok &= json_object_set_new(j, "layer_types", types) == 0;
    return ok;
}
