/* The Qwen3 family's config.json fields (HF Qwen3Config, Qwen3MoeConfig): their defaults, reading
 * and checking them, writing them, and the layer map (which layers are MoE). The fields every
 * family shares (vocabulary, hidden size, layers, norms' eps, special tokens, labels) are
 * src/model/config.c's. */
#include <string.h>

#include "arch/family.h"
#include "arch/qwen3/qwen3.h"
#include "base/json.h"

const char *const trill_qwen3_config_keys[] = {
    "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling",
    "rope_parameters", "num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
    "norm_topk_prob", "mlp_only_layers", "use_sliding_window", "sliding_window", "max_window_layers", "attention_bias", "layer_types",
    "quantization_config", NULL,
};

/* HF's defaults of each architecture's config class (the shared fields included). */
void trill_qwen3_config_defaults(trill_config *c) {
    c->vocab_size = 151936;
    c->num_attention_heads = 32;
    c->max_position_embeddings = 32768;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->initializer_range = 0.02;
    c->qk_norm = true; /* always (no config field) */
    if (c->arch == TRILL_ARCH_QWEN3_MOE) {
        c->hidden_size = 2048;
        c->intermediate_size = 6144;
        c->num_hidden_layers = 24;
        c->num_key_value_heads = 4;
        c->head_dim = 0; /* HF: hidden_size / num_attention_heads when absent */
        c->num_experts = 128;
        c->num_experts_per_tok = 8;
        c->moe_intermediate_size = 768;
        c->decoder_sparse_step = 1;
    } else {
        c->hidden_size = 4096;
        c->intermediate_size = 22016;
        c->num_hidden_layers = 32;
        c->num_key_value_heads = 32;
        c->head_dim = 128;
    }
}

/* Sliding windows (HF Qwen3Config): sliding_window takes effect with use_sliding_window, on the
 * layers layer_types calls "sliding_attention"; without layer_types, the layers from
 * max_window_layers on. */
static trill_status read_sliding(const json_t *root, const char *what, trill_config *c) {
    bool use = false;
    int window = 4096, from = 28;
    trill_status st;
    if ((st = trill_json_get_bool(root, "use_sliding_window", what, &use)) ||
        (st = trill_arch_get_int_or_null(root, "sliding_window", what, 1, 1 << 30, &window)) ||
        (st = trill_json_get_int(root, "max_window_layers", what, 0, TRILL_MAX_LAYERS, &from)))
        return st;
    c->sliding_window = use && window > 0 ? window : 0;
    for (int l = 0; l < c->num_hidden_layers; l++) c->sliding_layer[l] = c->sliding_window && l >= from;
    if ((st = trill_arch_read_layer_types(root, what, c))) return st;
    for (int l = 0; l < c->num_hidden_layers; l++) c->sliding_layer[l] &= c->sliding_window > 0; /* HF: no window without use_sliding_window */
    return TRILL_OK;
}

static trill_status check_consistency(const trill_config *c, const char *what) {
    if (c->head_dim < 2) /* derived as hidden_size / num_attention_heads when absent */
        return trill_error(TRILL_ERR_INVALID, "%s: field \"head_dim\": %d (hidden_size %d / num_attention_heads %d) must be at least 2",
                           what, c->head_dim, c->hidden_size, c->num_attention_heads);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return trill_error(TRILL_ERR_INVALID, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                           what, c->num_attention_heads, c->num_key_value_heads);
    if (c->head_dim % 2 != 0)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"head_dim\": %d must be even for RoPE", what, c->head_dim);
    if (c->arch == TRILL_ARCH_QWEN3_MOE && c->num_experts > 0 &&
        (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"num_experts_per_tok\": %d must be in [1, num_experts=%d]",
                           what, c->num_experts_per_tok, c->num_experts);
    return TRILL_OK;
}

trill_status trill_qwen3_config_read(const json_t *root, const char *what, trill_config *c) {
    const int BIG = 1 << 24;
    trill_status st;
    if ((st = trill_json_get_int(root, "intermediate_size", what, 1, BIG, &c->intermediate_size)) ||
        (st = trill_json_get_int(root, "num_attention_heads", what, 1, 4096, &c->num_attention_heads)) ||
        (st = trill_json_get_int(root, "num_key_value_heads", what, 1, 4096, &c->num_key_value_heads)) ||
        (st = trill_arch_read_rope(root, what, c)))
        return st;
    if ((st = trill_arch_get_int_or_null(root, "head_dim", what, 2, 1 << 16, &c->head_dim))) return st;
    if (c->head_dim == 0) c->head_dim = c->hidden_size / c->num_attention_heads; /* absent or null (HF: None) */
    if (c->arch == TRILL_ARCH_QWEN3_MOE &&
        ((st = trill_json_get_int(root, "num_experts", what, 0, 65535, &c->num_experts)) ||
         (st = trill_json_get_int(root, "num_experts_per_tok", what, 1, 65535, &c->num_experts_per_tok)) ||
         (st = trill_json_get_int(root, "moe_intermediate_size", what, 1, BIG, &c->moe_intermediate_size)) ||
         (st = trill_json_get_int(root, "decoder_sparse_step", what, 1, TRILL_MAX_LAYERS, &c->decoder_sparse_step)) ||
         (st = trill_json_get_bool(root, "norm_topk_prob", what, &c->norm_topk_prob)) ||
         (st = trill_arch_read_mlp_only_layers(root, what, c))))
        return st;
    if (c->arch == TRILL_ARCH_QWEN3) c->num_experts = c->num_experts_per_tok = 0;
    if ((st = read_sliding(root, what, c)) ||
        (st = trill_arch_refuse_true(root, "attention_bias", what)) ||
        (st = trill_arch_read_fp8(root, what, c)) || (st = trill_arch_refuse_partial_rope(c, what)))
        return st;
    return check_consistency(c, what);
}

/* HF Qwen3MoeDecoderLayer: MoE iff not in mlp_only_layers and (i+1) % decoder_sparse_step == 0. */
bool trill_qwen3_layer_is_moe(const trill_config *c, int l) {
    return c->arch == TRILL_ARCH_QWEN3_MOE && !c->mlp_only[l] && c->num_experts > 0 && (l + 1) % c->decoder_sparse_step == 0;
}

/* GQA with QK-norm, sliding windows where layer_types says; every MoE layer's router a softmax
 * top-k. */
trill_layer_desc trill_qwen3_describe(const trill_config *c, int l) {
    return (trill_layer_desc){ .attention = TRILL_ATTENTION_GQA, .qk_norm = true, .window = c->sliding_layer[l] ? c->sliding_window : 0,
                               .moe = trill_config_is_moe(c, l), .router = TRILL_ROUTER_SOFTMAX };
}

bool trill_qwen3_config_write(const trill_config *c, json_t *j) {
    bool ok = true;
    ok &= json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size)) == 0;
    ok &= json_object_set_new(j, "num_attention_heads", json_integer(c->num_attention_heads)) == 0;
    ok &= json_object_set_new(j, "num_key_value_heads", json_integer(c->num_key_value_heads)) == 0;
    ok &= json_object_set_new(j, "head_dim", json_integer(c->head_dim)) == 0;
    ok &= json_object_set_new(j, "rope_theta", json_real(c->rope_theta)) == 0;
    json_t *rs = trill_arch_rope_scaling_json(c);
    ok &= rs != NULL && json_object_set_new(j, "rope_scaling", rs) == 0;
    ok &= json_object_set_new(j, "attention_bias", json_false()) == 0;
    ok &= json_object_set_new(j, "use_sliding_window", json_boolean(c->sliding_window > 0)) == 0;
    ok &= json_object_set_new(j, "sliding_window", c->sliding_window ? json_integer(c->sliding_window) : json_null()) == 0;
    json_t *types = json_array();
    ok &= types != NULL;
    for (int l = 0; ok && l < c->num_hidden_layers; l++)
        ok &= json_array_append_new(types, json_string(c->sliding_layer[l] ? "sliding_attention" : "full_attention")) == 0;
    ok &= json_object_set_new(j, "layer_types", types) == 0;
    if (c->arch == TRILL_ARCH_QWEN3_MOE) {
        ok &= json_object_set_new(j, "num_experts", json_integer(c->num_experts)) == 0;
        ok &= json_object_set_new(j, "num_experts_per_tok", json_integer(c->num_experts_per_tok)) == 0;
        ok &= json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_intermediate_size)) == 0;
        ok &= json_object_set_new(j, "decoder_sparse_step", json_integer(c->decoder_sparse_step)) == 0;
        ok &= json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk_prob)) == 0;
        json_t *mlp_only = json_array();
        ok &= mlp_only != NULL;
        for (int l = 0; ok && l < c->num_hidden_layers; l++)
            if (c->mlp_only[l]) ok &= json_array_append_new(mlp_only, json_integer(l)) == 0;
        ok &= json_object_set_new(j, "mlp_only_layers", mlp_only) == 0;
    }
    return ok;
}
