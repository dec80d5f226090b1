/* The DeepSeek-V3 family's config.json fields (HF DeepseekV3Config; Kimi K2's config is the same
 * class under model_type "kimi_k2"; GLM-4.7-Flash's Glm4MoeLiteConfig is DeepSeek-V3's MLA and
 * router with a per-layer mlp_layer_types and plain RoPE): defaults, reading and checking,
 * writing, the layer map. What the family does not compute is refused by field (another
 * scoring_func or topk_method, a rope scaling other than YaRN, attention biases, a quantization
 * other than block-scaled FP8, GLM's expert groups). */
#include <string.h>

#include "arch/deepseek_v3/deepseek.h"
#include "arch/family.h"
#include "base/json.h"

const char *const trill_deepseek_config_keys[] = {
    "intermediate_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads", "n_shared_experts", "n_routed_experts",
    "num_experts_per_tok", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
    "v_head_dim", "topk_method", "n_group", "topk_group", "first_k_dense_replace", "moe_layer_freq", "norm_topk_prob",
    "scoring_func", "rope_theta", "rope_scaling", "rope_interleave", "attention_bias", "attention_dropout", "ep_size",
    "num_nextn_predict_layers", "aux_loss_alpha", "seq_aux", "quantization_config", "pretraining_tp", "head_dim", "mlp_layer_types",
    "rope_parameters", NULL,
};

/* HF DeepseekV3Config's defaults (DeepSeek-V3's shape). */
void trill_deepseek_config_defaults(trill_config *c) {
    c->vocab_size = 129280;
    c->hidden_size = 7168;
    c->intermediate_size = 18432;
    c->moe_intermediate_size = 2048;
    c->num_hidden_layers = 61;
    c->num_attention_heads = 128;
    c->num_key_value_heads = 128;
    c->n_shared_experts = 1;
    c->num_experts = 256;
    c->routed_scaling_factor = 2.5;
    c->kv_lora_rank = 512;
    c->q_lora_rank = 1536;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    c->qk_nope_head_dim = 128;
    c->n_group = 8;
    c->topk_group = 4;
    c->num_experts_per_tok = 8;
    c->first_k_dense_replace = 3;
    c->moe_layer_freq = 1;
    c->norm_topk_prob = true;
    c->max_position_embeddings = 4096;
    c->initializer_range = 0.02;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->rope_interleave = true;
    if (c->arch == TRILL_ARCH_GLM4_MOE_LITE) { /* HF Glm4MoeLiteConfig's (GLM-4.7-Flash's shape) */
        c->vocab_size = 154880;
        c->hidden_size = 2048;
        c->intermediate_size = 10240;
        c->moe_intermediate_size = 1536;
        c->num_hidden_layers = 47;
        c->num_attention_heads = c->num_key_value_heads = 20;
        c->num_experts = 64;
        c->routed_scaling_factor = 1.8;
        c->q_lora_rank = 768;
        c->v_head_dim = 256;
        c->qk_nope_head_dim = 192;
        c->n_group = c->topk_group = 1;
        c->num_experts_per_tok = 4;
        c->first_k_dense_replace = 1; /* mlp_layer_types' default: the first layer dense */
        c->max_position_embeddings = 202752;
        c->rms_norm_eps = 1e-5;
    }
}

/* GLM-4.7-Flash's "mlp_layer_types": "dense" or "sparse" per layer (HF's default when absent:
 * the first dense, the others sparse), kept as the per-layer mlp_only flags. */
static trill_status read_mlp_layer_types(const json_t *root, const char *what, trill_config *c) {
    const json_t *v = json_object_get(root, "mlp_layer_types");
    for (int l = 0; l < c->num_hidden_layers; l++) c->mlp_only[l] = l < c->first_k_dense_replace;
    if (!v || json_is_null(v)) return TRILL_OK;
    if (!json_is_array(v) || json_array_size(v) != (size_t)c->num_hidden_layers)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"mlp_layer_types\": expected a list of %d entries (one per layer), got %s", what,
                           c->num_hidden_layers, json_is_array(v) ? "another length" : trill_json_type_name(v));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const char *t = json_string_value(json_array_get(v, (size_t)l));
        if (!t || (strcmp(t, "dense") != 0 && strcmp(t, "sparse") != 0))
            return trill_error(TRILL_ERR_INVALID, "%s: field \"mlp_layer_types\": entry %d: expected \"dense\" or \"sparse\"", what, l);
        c->mlp_only[l] = strcmp(t, "dense") == 0;
    }
    return TRILL_OK;
}

/* GLM-4.7-Flash's RoPE: plain (Glm4MoeRotaryEmbedding over qk_rope_head_dim), from rope_theta or
 * rope_parameters; its router groups must be one (HF masks the groups not kept with 0.0,
 * DeepSeek's reference with -inf). */
static trill_status read_glm_lite(const json_t *root, const char *what, trill_config *c) {
    trill_status st = trill_arch_read_rope(root, what, c);
    if (!st) st = trill_arch_refuse_partial_rope(c, what);
    if (!st) st = read_mlp_layer_types(root, what, c);
    if (st) return st;
    if (c->n_group != 1 || c->topk_group != 1)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"n_group\": %d groups (topk_group %d) are not supported for Glm4MoeLite (expected 1 and 1: "
                           "HF masks the groups not kept with 0.0, DeepSeek's reference with -inf)", what, c->n_group, c->topk_group);
    return TRILL_OK;
}

/* A field that must name the one method trill computes. */
static trill_status expect_string(const json_t *root, const char *key, const char *want, const char *what) {
    const char *v = want;
    trill_status st = trill_json_get_string(root, key, what, &v);
    if (st) return st;
    if (strcmp(v, want) != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"%s\": \"%s\" is not supported (expected \"%s\")", what, key, v, want);
    return TRILL_OK;
}

/* rope_scaling: null (plain RoPE) or YaRN with its parameters (HF's defaults for the missing ones). */
static trill_status read_rope_scaling(const json_t *root, const char *what, trill_config *c) {
    const json_t *v = json_object_get(root, "rope_scaling");
    c->yarn = false;
    if (!v || json_is_null(v)) return TRILL_OK;
    if (!json_is_object(v))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"rope_scaling\": expected an object or null, got %s", what, trill_json_type_name(v));
    const char *type = NULL;
    trill_status st = trill_json_get_string(v, "rope_type", what, &type);
    if (!st && !type) st = trill_json_get_string(v, "type", what, &type);
    if (st) return st;
    if (!type || strcmp(type, "yarn") != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"rope_scaling\": rope type \"%s\" is not supported (expected \"yarn\", or null)", what,
                           type ? type : "(missing)");
    return trill_arch_read_yarn(v, "rope_scaling", what, c);
}

static trill_status check(const trill_config *c, const char *what) {
    if (c->num_experts > 0) {
        if (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts)
            return trill_error(TRILL_ERR_INVALID, "%s: field \"num_experts_per_tok\": %d must be in [1, n_routed_experts=%d]", what,
                               c->num_experts_per_tok, c->num_experts);
        if (c->num_experts % c->n_group)
            return trill_error(TRILL_ERR_INVALID, "%s: field \"n_group\": %d does not divide n_routed_experts (%d)", what, c->n_group, c->num_experts);
        if (c->topk_group > c->n_group)
            return trill_error(TRILL_ERR_INVALID, "%s: field \"topk_group\": %d is more than n_group (%d)", what, c->topk_group, c->n_group);
        if (c->num_experts_per_tok > c->topk_group * (c->num_experts / c->n_group))
            return trill_error(TRILL_ERR_INVALID, "%s: num_experts_per_tok (%d) is more than the experts of topk_group (%d) groups of %d", what,
                               c->num_experts_per_tok, c->topk_group, c->num_experts / c->n_group);
    }
    if (c->qk_rope_head_dim % 2)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"qk_rope_head_dim\": %d must be even for RoPE", what, c->qk_rope_head_dim);
    return TRILL_OK;
}

trill_status trill_deepseek_config_read(const json_t *root, const char *what, trill_config *c) {
    const int BIG = 1 << 24;
    trill_status st;
    bool bias = false;
    if ((st = trill_json_get_int(root, "intermediate_size", what, 1, BIG, &c->intermediate_size)) ||
        (st = trill_json_get_int(root, "moe_intermediate_size", what, 1, BIG, &c->moe_intermediate_size)) ||
        (st = trill_json_get_int(root, "num_attention_heads", what, 1, 4096, &c->num_attention_heads)) ||
        (st = trill_json_get_int(root, "num_key_value_heads", what, 1, 4096, &c->num_key_value_heads)) ||
        (st = trill_json_get_int(root, "n_shared_experts", what, 0, 64, &c->n_shared_experts)) ||
        (st = trill_json_get_int(root, "n_routed_experts", what, 0, 65535, &c->num_experts)) ||
        (st = trill_json_get_int(root, "num_experts_per_tok", what, 1, 65535, &c->num_experts_per_tok)) ||
        (st = trill_json_get_double(root, "routed_scaling_factor", what, 0, 1e6, &c->routed_scaling_factor)) ||
        (st = trill_json_get_int(root, "kv_lora_rank", what, 1, BIG, &c->kv_lora_rank)) ||
        (st = trill_arch_get_int_or_null(root, "q_lora_rank", what, 1, BIG, &c->q_lora_rank)) ||
        (st = trill_json_get_int(root, "qk_rope_head_dim", what, 2, 1 << 16, &c->qk_rope_head_dim)) ||
        (st = trill_json_get_int(root, "qk_nope_head_dim", what, 0, 1 << 16, &c->qk_nope_head_dim)) ||
        (st = trill_json_get_int(root, "v_head_dim", what, 1, 1 << 16, &c->v_head_dim)) ||
        (st = trill_json_get_int(root, "n_group", what, 1, 65535, &c->n_group)) ||
        (st = trill_json_get_int(root, "topk_group", what, 1, 65535, &c->topk_group)) ||
        (st = trill_json_get_int(root, "first_k_dense_replace", what, 0, TRILL_MAX_LAYERS, &c->first_k_dense_replace)) ||
        (st = trill_json_get_int(root, "moe_layer_freq", what, 1, TRILL_MAX_LAYERS, &c->moe_layer_freq)) ||
        (st = trill_json_get_bool(root, "norm_topk_prob", what, &c->norm_topk_prob)) ||
        (st = trill_json_get_double(root, "rope_theta", what, 1e-3, 1e12, &c->rope_theta)) ||
        (st = trill_json_get_bool(root, "rope_interleave", what, &c->rope_interleave)) ||
        (st = trill_json_get_bool(root, "attention_bias", what, &bias)) ||
        (st = trill_arch_get_int_or_null(root, "num_nextn_predict_layers", what, 0, 64, &c->num_nextn_predict_layers)) ||
        (st = expect_string(root, "scoring_func", "sigmoid", what)) ||
        (st = expect_string(root, "topk_method", "noaux_tc", what)) || (st = trill_arch_read_fp8(root, what, c)) ||
        (st = c->arch == TRILL_ARCH_GLM4_MOE_LITE ? read_glm_lite(root, what, c) : read_rope_scaling(root, what, c)))
        return st;
    if (bias) return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"attention_bias\": true is not supported (expected false)", what);
    c->head_dim = c->qk_rope_head_dim; /* as HF's config: the RoPE dimension */
    return check(c, what);
}

/* HF DeepseekV3DecoderLayer: MoE from first_k_dense_replace on, every moe_layer_freq-th layer;
 * Glm4MoeLiteDecoderLayer: where mlp_layer_types says "sparse". */
bool trill_deepseek_layer_is_moe(const trill_config *c, int l) {
    if (c->arch == TRILL_ARCH_GLM4_MOE_LITE) return c->num_experts > 0 && !c->mlp_only[l];
    return c->num_experts > 0 && l >= c->first_k_dense_replace && l % c->moe_layer_freq == 0;
}

/* MLA; every MoE layer's router sigmoid with groups, with n_shared_experts beside. */
trill_layer_desc trill_deepseek_describe(const trill_config *c, int l) {
    const bool moe = trill_config_is_moe(c, l);
    return (trill_layer_desc){ .attention = TRILL_ATTENTION_MLA, .moe = moe, .router = TRILL_ROUTER_SIGMOID_GROUPS,
                               .shared_experts = moe && c->n_shared_experts > 0 };
}

bool trill_deepseek_config_write(const trill_config *c, json_t *j) {
    bool ok = true;
    ok &= json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size)) == 0;
    ok &= json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_intermediate_size)) == 0;
    ok &= json_object_set_new(j, "num_attention_heads", json_integer(c->num_attention_heads)) == 0;
    ok &= json_object_set_new(j, "num_key_value_heads", json_integer(c->num_key_value_heads)) == 0;
    ok &= json_object_set_new(j, "n_shared_experts", json_integer(c->n_shared_experts)) == 0;
    ok &= json_object_set_new(j, "n_routed_experts", json_integer(c->num_experts)) == 0;
    ok &= json_object_set_new(j, "num_experts_per_tok", json_integer(c->num_experts_per_tok)) == 0;
    ok &= json_object_set_new(j, "routed_scaling_factor", json_real(c->routed_scaling_factor)) == 0;
    ok &= json_object_set_new(j, "kv_lora_rank", json_integer(c->kv_lora_rank)) == 0;
    ok &= json_object_set_new(j, "q_lora_rank", c->q_lora_rank ? json_integer(c->q_lora_rank) : json_null()) == 0;
    ok &= json_object_set_new(j, "qk_rope_head_dim", json_integer(c->qk_rope_head_dim)) == 0;
    ok &= json_object_set_new(j, "qk_nope_head_dim", json_integer(c->qk_nope_head_dim)) == 0;
    ok &= json_object_set_new(j, "v_head_dim", json_integer(c->v_head_dim)) == 0;
    ok &= json_object_set_new(j, "n_group", json_integer(c->n_group)) == 0;
    ok &= json_object_set_new(j, "topk_group", json_integer(c->topk_group)) == 0;
    ok &= json_object_set_new(j, "topk_method", json_string("noaux_tc")) == 0;
    ok &= json_object_set_new(j, "scoring_func", json_string("sigmoid")) == 0;
    if (c->arch == TRILL_ARCH_GLM4_MOE_LITE) {
        json_t *types = json_array();
        ok &= types != NULL;
        for (int l = 0; ok && l < c->num_hidden_layers; l++) ok &= json_array_append_new(types, json_string(c->mlp_only[l] ? "dense" : "sparse")) == 0;
        ok &= json_object_set_new(j, "mlp_layer_types", types) == 0;
    } else {
        ok &= json_object_set_new(j, "first_k_dense_replace", json_integer(c->first_k_dense_replace)) == 0;
        ok &= json_object_set_new(j, "moe_layer_freq", json_integer(c->moe_layer_freq)) == 0;
    }
    ok &= json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk_prob)) == 0;
    ok &= json_object_set_new(j, "rope_theta", json_real(c->rope_theta)) == 0;
    ok &= json_object_set_new(j, "rope_interleave", json_boolean(c->rope_interleave)) == 0;
    ok &= json_object_set_new(j, "attention_bias", json_false()) == 0;
    /* the weights trill writes: no MTP layers, not FP8 (so no quantization_config) */
    ok &= json_object_set_new(j, "num_nextn_predict_layers", json_integer(0)) == 0;
    json_t *rs = trill_arch_rope_scaling_json(c);
    ok &= rs != NULL && json_object_set_new(j, "rope_scaling", rs) == 0;
    return ok;
}
