/* The GLM-4.5 family's config.json fields (HF Glm4MoeConfig): their defaults, reading and
 * checking them, writing them, the layer map and the layer description. The fields every family
 * shares are src/model/config.c's. Refused by field: a rope scaling, more than one expert group
 * (HF's Glm4Moe masks the groups not kept with 0.0, DeepSeek's reference, which trill computes,
 * with -inf; every released GLM configuration has n_group 1), a quantization other than
 * block-scaled FP8. */
#include "arch/family.h"
#include "arch/glm4_moe/glm4_moe.h"
#include "base/json.h"

const char *const trill_glm4_moe_config_keys[] = {
    "intermediate_size", "moe_intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "partial_rotary_factor",
    "rope_theta", "rope_scaling", "rope_parameters", "attention_bias", "use_qk_norm", "n_routed_experts", "n_shared_experts",
    "num_experts_per_tok", "first_k_dense_replace", "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
    "num_nextn_predict_layers", "attention_dropout", "quantization_config", NULL,
};

/* HF Glm4MoeConfig's defaults (GLM-4.5-Air's shape). */
void trill_glm4_moe_config_defaults(trill_config *c) {
    c->vocab_size = 151552;
    c->hidden_size = 4096;
    c->intermediate_size = 10944;
    c->num_hidden_layers = 46;
    c->num_attention_heads = 96;
    c->num_key_value_heads = 8;
    c->head_dim = 0; /* HF: hidden_size / num_attention_heads when absent (every release says 128) */
    c->partial_rotary_factor = 0.5;
    c->max_position_embeddings = 131072;
    c->initializer_range = 0.02;
    c->rms_norm_eps = 1e-5;
    c->rope_theta = 10000.0;
    c->moe_intermediate_size = 1408;
    c->num_experts_per_tok = 8;
    c->num_experts = 128;
    c->n_shared_experts = 1;
    c->routed_scaling_factor = 1.0;
    c->n_group = c->topk_group = 1;
    c->first_k_dense_replace = 1;
    c->moe_layer_freq = 1;
    c->norm_topk_prob = true;
}

trill_status trill_glm4_moe_config_read(const json_t *root, const char *what, trill_config *c) {
    const int BIG = 1 << 24;
    trill_status st;
    if ((st = trill_json_get_int(root, "intermediate_size", what, 1, BIG, &c->intermediate_size)) ||
        (st = trill_json_get_int(root, "moe_intermediate_size", what, 1, BIG, &c->moe_intermediate_size)) ||
        (st = trill_json_get_int(root, "num_attention_heads", what, 1, 4096, &c->num_attention_heads)) ||
        (st = trill_json_get_int(root, "num_key_value_heads", what, 1, 4096, &c->num_key_value_heads)) ||
        (st = trill_arch_get_int_or_null(root, "head_dim", what, 2, 1 << 16, &c->head_dim)) ||
        (st = trill_json_get_bool(root, "attention_bias", what, &c->attention_bias)) ||
        (st = trill_json_get_bool(root, "use_qk_norm", what, &c->qk_norm)) ||
        (st = trill_json_get_int(root, "n_routed_experts", what, 0, 65535, &c->num_experts)) ||
        (st = trill_json_get_int(root, "n_shared_experts", what, 0, 64, &c->n_shared_experts)) ||
        (st = trill_json_get_int(root, "num_experts_per_tok", what, 1, 65535, &c->num_experts_per_tok)) ||
        (st = trill_json_get_int(root, "first_k_dense_replace", what, 0, TRILL_MAX_LAYERS, &c->first_k_dense_replace)) ||
        (st = trill_json_get_double(root, "routed_scaling_factor", what, 0, 1e6, &c->routed_scaling_factor)) ||
        (st = trill_json_get_int(root, "n_group", what, 1, 65535, &c->n_group)) ||
        (st = trill_json_get_int(root, "topk_group", what, 1, 65535, &c->topk_group)) ||
        (st = trill_json_get_bool(root, "norm_topk_prob", what, &c->norm_topk_prob)) ||
        (st = trill_json_get_int(root, "num_nextn_predict_layers", what, 0, 64, &c->num_nextn_predict_layers)) ||
        (st = trill_arch_read_rope(root, what, c)) || (st = trill_arch_read_fp8(root, what, c)))
        return st;
    if (c->head_dim == 0) c->head_dim = c->hidden_size / c->num_attention_heads;
    if (c->n_group != 1 || c->topk_group != 1)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"n_group\": %d groups (topk_group %d) are not supported for Glm4Moe (expected 1 and 1: HF "
                           "masks the groups not kept with 0.0, DeepSeek's reference with -inf)", what, c->n_group, c->topk_group);
    const int rope = (int)(c->head_dim * c->partial_rotary_factor);
    if (rope < 2 || rope % 2)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"partial_rotary_factor\": %g of head_dim %d rotates %d dimensions (expected an even number >= 2)",
                           what, c->partial_rotary_factor, c->head_dim, rope);
    if (c->num_attention_heads % c->num_key_value_heads)
        return trill_error(TRILL_ERR_INVALID, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", what,
                           c->num_attention_heads, c->num_key_value_heads);
    if (c->num_experts > 0 && c->num_experts_per_tok > c->num_experts)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"num_experts_per_tok\": %d must be in [1, n_routed_experts=%d]", what,
                           c->num_experts_per_tok, c->num_experts);
    return TRILL_OK;
}

/* HF Glm4MoeDecoderLayer: MoE from first_k_dense_replace on. */
bool trill_glm4_moe_layer_is_moe(const trill_config *c, int l) { return c->num_experts > 0 && l >= c->first_k_dense_replace; }

/* GQA (biases, QK-norm as the config says); every MoE layer's router sigmoid with the correction
 * bias, with n_shared_experts beside. */
trill_layer_desc trill_glm4_moe_describe(const trill_config *c, int l) {
    const bool moe = trill_config_is_moe(c, l);
    return (trill_layer_desc){ .attention = TRILL_ATTENTION_GQA, .qk_norm = c->qk_norm, .qkv_bias = c->attention_bias, .moe = moe,
                               .router = TRILL_ROUTER_SIGMOID_GROUPS, .shared_experts = moe && c->n_shared_experts > 0 };
}

bool trill_glm4_moe_config_write(const trill_config *c, json_t *j) {
    bool ok = true;
    ok &= json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size)) == 0;
    ok &= json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_intermediate_size)) == 0;
    ok &= json_object_set_new(j, "num_attention_heads", json_integer(c->num_attention_heads)) == 0;
    ok &= json_object_set_new(j, "num_key_value_heads", json_integer(c->num_key_value_heads)) == 0;
    ok &= json_object_set_new(j, "head_dim", json_integer(c->head_dim)) == 0;
    ok &= json_object_set_new(j, "partial_rotary_factor", json_real(c->partial_rotary_factor)) == 0;
    ok &= json_object_set_new(j, "rope_theta", json_real(c->rope_theta)) == 0;
    json_t *rs = trill_arch_rope_scaling_json(c);
    ok &= rs != NULL && json_object_set_new(j, "rope_scaling", rs) == 0;
    ok &= json_object_set_new(j, "attention_bias", json_boolean(c->attention_bias)) == 0;
    ok &= json_object_set_new(j, "use_qk_norm", json_boolean(c->qk_norm)) == 0;
    ok &= json_object_set_new(j, "n_routed_experts", json_integer(c->num_experts)) == 0;
    ok &= json_object_set_new(j, "n_shared_experts", json_integer(c->n_shared_experts)) == 0;
    ok &= json_object_set_new(j, "num_experts_per_tok", json_integer(c->num_experts_per_tok)) == 0;
    ok &= json_object_set_new(j, "first_k_dense_replace", json_integer(c->first_k_dense_replace)) == 0;
    ok &= json_object_set_new(j, "routed_scaling_factor", json_real(c->routed_scaling_factor)) == 0;
    ok &= json_object_set_new(j, "n_group", json_integer(c->n_group)) == 0;
    ok &= json_object_set_new(j, "topk_group", json_integer(c->topk_group)) == 0;
    ok &= json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk_prob)) == 0;
    ok &= json_object_set_new(j, "num_nextn_predict_layers", json_integer(0)) == 0;
    return ok;
}
