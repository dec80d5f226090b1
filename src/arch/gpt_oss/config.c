/* The gpt-oss family's config.json fields (HF GptOssConfig): their defaults, reading and checking
 * them, writing them, and the layer description. The fields every family shares are
 * src/model/config.c's. gpt-oss's intermediate_size is each expert's width (trill's
 * moe_intermediate_size): it has no dense MLP. */
#include <string.h>

#include "arch/family.h"
#include "arch/gpt_oss/gpt_oss.h"
#include "base/json.h"

const char *const trill_gpt_oss_config_keys[] = {
    "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling", "rope_parameters",
    "num_local_experts", "num_experts_per_tok", "sliding_window", "layer_types", "attention_bias", "swiglu_limit", "swiglu_alpha",
    "router_aux_loss_coef", "output_router_logits", "quantization_config", NULL,
};

/* HF GptOssConfig's defaults (gpt-oss-120b's shape). */
void trill_gpt_oss_config_defaults(trill_config *c) {
    c->vocab_size = 201088;
    c->hidden_size = 2880;
    c->moe_intermediate_size = 2880;
    c->num_hidden_layers = 36;
    c->num_attention_heads = 64;
    c->num_key_value_heads = 8;
    c->head_dim = 64;
    c->max_position_embeddings = 131072;
    c->rms_norm_eps = 1e-5;
    c->rope_theta = 150000;
    c->initializer_range = 0.02;
    c->num_experts = 128;
    c->num_experts_per_tok = 4;
    c->norm_topk_prob = true; /* a softmax over the top-k logits is the k probabilities renormalised */
    c->sliding_window = 128;
    c->attention_bias = true;
    c->swiglu_limit = 7.0;
    c->swiglu_alpha = 1.702;
}

/* rope_parameters / rope_scaling absent or null: HF's YaRN (factor 32 over 4096 positions,
 * beta_fast 32, beta_slow 1, truncate false). */
static trill_status read_rope(const json_t *root, const char *what, trill_config *c) {
    trill_status st = trill_arch_read_rope(root, what, c);
    if (st || c->yarn) return st;
    const json_t *a = json_object_get(root, "rope_scaling"), *b = json_object_get(root, "rope_parameters");
    if ((a && !json_is_null(a)) || (b && !json_is_null(b))) return TRILL_OK; /* given, and plain */
    json_t *def = json_pack("{s:s, s:f, s:f, s:f, s:b, s:i}", "rope_type", "yarn", "factor", 32.0, "beta_fast", 32.0, "beta_slow", 1.0,
                            "truncate", 0, "original_max_position_embeddings", 4096);
    if (!def) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    st = trill_arch_read_yarn(def, "rope_parameters", what, c);
    json_decref(def);
    return st;
}

/* layer_types (default: sliding_attention on the even layers, full_attention on the odd ones),
 * each sliding layer within sliding_window (null: none). */
static trill_status read_layer_types(const json_t *root, const char *what, trill_config *c) {
    trill_status st = trill_arch_get_int_or_null(root, "sliding_window", what, 1, 1 << 30, &c->sliding_window);
    if (st) return st;
    for (int l = 0; l < c->num_hidden_layers; l++) c->sliding_layer[l] = l % 2 == 0;
    if ((st = trill_arch_read_layer_types(root, what, c))) return st;
    for (int l = 0; l < c->num_hidden_layers; l++) c->sliding_layer[l] &= c->sliding_window > 0;
    return TRILL_OK;
}

/* quantization_config: absent or null, or MXFP4 experts (quant_method "mxfp4", as the released
 * checkpoints are): the loader dequantizes them (src/model/model.c). */
static trill_status read_quantization(const json_t *root, const char *what, trill_config *c) {
    const json_t *q = json_object_get(root, "quantization_config");
    c->mxfp4 = false;
    if (!q || json_is_null(q)) return TRILL_OK;
    const char *method = NULL;
    if (!json_is_object(q) || trill_json_get_string(q, "quant_method", what, &method) || !method)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"quantization_config\": expected an object with \"quant_method\", or null", what);
    if (strcmp(method, "mxfp4") != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"quantization_config\": quant_method \"%s\" is not supported for gpt-oss (expected \"mxfp4\")",
                           what, method);
    c->mxfp4 = true;
    return TRILL_OK;
}

trill_status trill_gpt_oss_config_read(const json_t *root, const char *what, trill_config *c) {
    const int BIG = 1 << 24;
    trill_status st;
    if ((st = trill_json_get_int(root, "intermediate_size", what, 1, BIG, &c->moe_intermediate_size)) ||
        (st = trill_json_get_int(root, "num_attention_heads", what, 1, 4096, &c->num_attention_heads)) ||
        (st = trill_json_get_int(root, "num_key_value_heads", what, 1, 4096, &c->num_key_value_heads)) ||
        (st = trill_json_get_int(root, "num_local_experts", what, 1, 65535, &c->num_experts)) ||
        (st = trill_json_get_int(root, "num_experts_per_tok", what, 1, 65535, &c->num_experts_per_tok)) ||
        (st = trill_json_get_bool(root, "attention_bias", what, &c->attention_bias)) ||
        (st = trill_json_get_double(root, "swiglu_limit", what, 1e-6, 1e6, &c->swiglu_limit)) ||
        (st = trill_json_get_double(root, "swiglu_alpha", what, 1e-6, 1e6, &c->swiglu_alpha)) ||
        (st = read_rope(root, what, c)) || (st = trill_arch_refuse_partial_rope(c, what)) || (st = read_layer_types(root, what, c)) ||
        (st = read_quantization(root, what, c)) || (st = trill_arch_get_int_or_null(root, "head_dim", what, 2, 1 << 16, &c->head_dim)))
        return st;
    if (c->head_dim == 0) c->head_dim = c->hidden_size / c->num_attention_heads; /* null */
    if ((st = trill_arch_check_gqa_moe(c, what, "num_local_experts"))) return st;
    c->intermediate_size = 0; /* no dense MLP */
    return TRILL_OK;
}

bool trill_gpt_oss_layer_is_moe(const trill_config *c, int l) {
    (void)l; /* every layer */
    return c->num_experts > 0;
}

trill_layer_desc trill_gpt_oss_describe(const trill_config *c, int l) {
    return (trill_layer_desc){ .attention = TRILL_ATTENTION_GQA, .qkv_bias = c->attention_bias, .o_bias = c->attention_bias, .sinks = true,
                               .window = c->sliding_layer[l] ? c->sliding_window : 0, .moe = trill_config_is_moe(c, l),
                               .router = TRILL_ROUTER_SOFTMAX, .router_linear_bias = true, .expert_act = TRILL_EXPERT_SWIGLU_CLAMPED,
                               .expert_bias = true };
}

bool trill_gpt_oss_config_write(const trill_config *c, json_t *j) {
    bool ok = true;
    ok &= json_object_set_new(j, "intermediate_size", json_integer(c->moe_intermediate_size)) == 0;
    ok &= json_object_set_new(j, "num_attention_heads", json_integer(c->num_attention_heads)) == 0;
    ok &= json_object_set_new(j, "num_key_value_heads", json_integer(c->num_key_value_heads)) == 0;
    ok &= json_object_set_new(j, "head_dim", json_integer(c->head_dim)) == 0;
    ok &= json_object_set_new(j, "rope_theta", json_real(c->rope_theta)) == 0;
    json_t *rs = trill_arch_rope_scaling_json(c);
    ok &= rs != NULL && json_object_set_new(j, "rope_scaling", rs) == 0;
    ok &= json_object_set_new(j, "num_local_experts", json_integer(c->num_experts)) == 0;
    ok &= json_object_set_new(j, "num_experts_per_tok", json_integer(c->num_experts_per_tok)) == 0;
    ok &= json_object_set_new(j, "sliding_window", c->sliding_window ? json_integer(c->sliding_window) : json_null()) == 0;
    json_t *types = json_array();
    ok &= types != NULL;
    for (int l = 0; ok && l < c->num_hidden_layers; l++)
        ok &= json_array_append_new(types, json_string(c->sliding_layer[l] ? "sliding_attention" : "full_attention")) == 0;
    ok &= json_object_set_new(j, "layer_types", types) == 0;
    ok &= json_object_set_new(j, "attention_bias", json_boolean(c->attention_bias)) == 0;
    ok &= json_object_set_new(j, "swiglu_limit", json_real(c->swiglu_limit)) == 0;
    ok &= json_object_set_new(j, "swiglu_alpha", json_real(c->swiglu_alpha)) == 0;
    return ok;
}
