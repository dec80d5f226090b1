/* The Mixtral family's config.json fields (HF MixtralConfig): their defaults, reading and checking
 * them, writing them, and the layer description. The fields every family shares are
 * src/model/config.c's. Mixtral's intermediate_size is each expert's width (trill's
 * moe_intermediate_size): it has no dense MLP. */
#include "arch/family.h"
#include "arch/mixtral/mixtral.h"
#include "base/json.h"

const char *const trill_mixtral_config_keys[] = {
    "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling", "rope_parameters",
    "num_local_experts", "num_experts_per_tok", "sliding_window", "router_jitter_noise", "quantization_config", NULL,
};

/* HF MixtralConfig's defaults (Mixtral-8x7B's shape). */
void trill_mixtral_config_defaults(trill_config *c) {
    c->vocab_size = 32000;
    c->hidden_size = 4096;
    c->moe_intermediate_size = 14336;
    c->num_hidden_layers = 32;
    c->num_attention_heads = 32;
    c->num_key_value_heads = 8;
    c->head_dim = 0; /* HF: hidden_size / num_attention_heads when absent or null */
    c->max_position_embeddings = 4096 * 32;
    c->rms_norm_eps = 1e-5;
    c->rope_theta = 1e6;
    c->initializer_range = 0.02;
    c->num_experts = 8;
    c->num_experts_per_tok = 2;
    c->norm_topk_prob = true; /* MixtralSparseMoeBlock renormalises the top-k always */
}

trill_status trill_mixtral_config_read(const json_t *root, const char *what, trill_config *c) {
    const int BIG = 1 << 24;
    trill_status st;
    if ((st = trill_json_get_int(root, "intermediate_size", what, 1, BIG, &c->moe_intermediate_size)) ||
        (st = trill_json_get_int(root, "num_attention_heads", what, 1, 4096, &c->num_attention_heads)) ||
        (st = trill_json_get_int(root, "num_key_value_heads", what, 1, 4096, &c->num_key_value_heads)) ||
        (st = trill_json_get_int(root, "num_local_experts", what, 1, 65535, &c->num_experts)) ||
        (st = trill_json_get_int(root, "num_experts_per_tok", what, 1, 65535, &c->num_experts_per_tok)) ||
        (st = trill_arch_read_rope(root, what, c)) || (st = trill_arch_read_fp8(root, what, c)) ||
        (st = trill_arch_refuse_partial_rope(c, what)))
        return st;
    if ((st = trill_arch_get_int_or_null(root, "head_dim", what, 2, 1 << 16, &c->head_dim))) return st;
    if (c->head_dim == 0) c->head_dim = c->hidden_size / c->num_attention_heads; /* absent or null */
    if ((st = trill_arch_get_int_or_null(root, "sliding_window", what, 1, 1 << 30, &c->sliding_window))) return st; /* null: none */
    for (int l = 0; l < c->num_hidden_layers; l++) c->sliding_layer[l] = c->sliding_window > 0; /* every layer (HF MixtralAttention) */
    double jitter = 0;
    if ((st = trill_json_get_double(root, "router_jitter_noise", what, 0, 1, &jitter))) return st;
    if (jitter != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"router_jitter_noise\": %g is not supported (expected 0: trill trains without router noise)",
                           what, jitter);
    if ((st = trill_arch_check_gqa_moe(c, what, "num_local_experts"))) return st;
    c->intermediate_size = 0; /* no dense MLP */
    return TRILL_OK;
}

bool trill_mixtral_layer_is_moe(const trill_config *c, int l) {
    (void)l; /* every layer */
    return c->num_experts > 0;
}

/* GQA without QK-norm (every layer within sliding_window when set); every layer a MoE behind a
 * softmax top-k router. */
trill_layer_desc trill_mixtral_describe(const trill_config *c, int l) {
    return (trill_layer_desc){ .attention = TRILL_ATTENTION_GQA, .window = c->sliding_layer[l] ? c->sliding_window : 0, .moe = trill_config_is_moe(c, l),
                               .router = TRILL_ROUTER_SOFTMAX };
}

bool trill_mixtral_config_write(const trill_config *c, json_t *j) {
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
    ok &= json_object_set_new(j, "router_jitter_noise", json_real(0)) == 0;
    return ok;
}
