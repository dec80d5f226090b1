#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "model/config_json.h"
#include "trill/error.h"

const char *const trill_config_preset_names = "tiny, small, k2-tiny, dsv3-tiny, k2-small, deepseek-v3, kimi-k2";

/* The Qwen3-MoE presets: , layer 0 dense (mlp_only_layers [0]), norm_topk_prob, untied head,
 * token 0 ("<|endoftext|>" in the character-level tokenizer) as bos and eos. */
static const struct preset {
    const char *name;
    int vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, experts, top_k, moe_intermediate, max_pos;
    double rope_theta;
} PRESETS[] = {
    /* a few M parameters: 1 dense + 3 MoE layers, 8 experts, top-2 */
    { "tiny", 128, 256, 768, 4, 4, 2, 64, 8, 2, 128, 4096, 1e4 },
    /* the benchmark model, ~85M parameters */
    { "small", 32000, 512, 1536, 8, 8, 4, 64, 16, 4, 256, 32768, 1e6 },
};

/* A configuration as its config.json text. */
struct real { const char *name, *text; };

/* DeepSeek-V3-family toys, to create and train: Kimi K2's ratios at toy size (first layer dense,
 * one shared expert, many routed experts, 8 active, one group, YaRN with K2's beta 1/1 and rope
 * theta), a DeepSeek-V3-shaped one with 8 groups keeping 4 and q_proj through q_a/q_b, and
 * k2-small, sized like small (the benchmark model). Token 0 is bos and eos, as tiny's. */
static const struct real TOYS[] = {
    { "k2-tiny",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\", \"vocab_size\": 128, \"hidden_size\": 256,"
    " \"intermediate_size\": 768, \"moe_intermediate_size\": 64, \"num_hidden_layers\": 4, \"num_nextn_predict_layers\": 0,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"n_shared_experts\": 1, \"n_routed_experts\": 32,"
    " \"routed_scaling_factor\": 2.827, \"kv_lora_rank\": 64, \"q_lora_rank\": 96, \"qk_rope_head_dim\": 16, \"v_head_dim\": 32,"
    " \"qk_nope_head_dim\": 32, \"topk_method\": \"noaux_tc\", \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 4096, \"rope_theta\": 50000.0, \"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0,"
    " \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 128, \"type\": \"yarn\"},"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 0}" },
    { "dsv3-tiny",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": 128, \"hidden_size\": 256,"
    " \"intermediate_size\": 768, \"moe_intermediate_size\": 64, \"num_hidden_layers\": 4, \"num_nextn_predict_layers\": 0,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"n_shared_experts\": 1, \"n_routed_experts\": 32,"
    " \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 64, \"q_lora_rank\": 96, \"qk_rope_head_dim\": 16, \"v_head_dim\": 32,"
    " \"qk_nope_head_dim\": 32, \"topk_method\": \"noaux_tc\", \"n_group\": 8, \"topk_group\": 4, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 4096, \"rope_theta\": 10000.0, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1,"
    " \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 128, \"type\": \"yarn\"},"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 0}" },
    { "k2-small",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\", \"vocab_size\": 32000, \"hidden_size\": 512,"
    " \"intermediate_size\": 1536, \"moe_intermediate_size\": 128, \"num_hidden_layers\": 8, \"num_nextn_predict_layers\": 0,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 8, \"n_shared_experts\": 1, \"n_routed_experts\": 64,"
    " \"routed_scaling_factor\": 2.827, \"kv_lora_rank\": 128, \"q_lora_rank\": 192, \"qk_rope_head_dim\": 16, \"v_head_dim\": 32,"
    " \"qk_nope_head_dim\": 32, \"topk_method\": \"noaux_tc\", \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 32768, \"rope_theta\": 50000.0, \"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0,"
    " \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 1024, \"type\": \"yarn\"},"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 0}" },
};

/* The real configurations (their HF config.json fields that trill reads), for `trill init
 * --config-only` and `trill info`: far too large to create here. */
static const struct real REAL[] = {
    { "deepseek-v3",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": 129280, \"hidden_size\": 7168,"
    " \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61, \"num_nextn_predict_layers\": 1,"
    " \"num_attention_heads\": 128, \"num_key_value_heads\": 128, \"n_shared_experts\": 1, \"n_routed_experts\": 256,"
    " \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"
    " \"qk_nope_head_dim\": 128, \"topk_method\": \"noaux_tc\", \"n_group\": 8, \"topk_group\": 4, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 3, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 163840, \"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1,"
    " \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
    " \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1}" },
    { "kimi-k2",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\", \"vocab_size\": 163840, \"hidden_size\": 7168,"
    " \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61, \"num_nextn_predict_layers\": 0,"
    " \"num_attention_heads\": 64, \"num_key_value_heads\": 64, \"n_shared_experts\": 1, \"n_routed_experts\": 384,"
    " \"routed_scaling_factor\": 2.827, \"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"
    " \"qk_nope_head_dim\": 128, \"topk_method\": \"noaux_tc\", \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 131072, \"rope_theta\": 50000.0, \"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0,"
    " \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
    " \"tie_word_embeddings\": false, \"bos_token_id\": 163584, \"eos_token_id\": 163585}" },
};

bool trill_config_preset_is_real(const char *name) {
    for (size_t i = 0; i < sizeof REAL / sizeof REAL[0]; i++)
        if (strcmp(name, REAL[i].name) == 0) return true;
    return false;
}

json_t *trill_config_preset(const char *name) {
    for (size_t i = 0; i < sizeof REAL / sizeof REAL[0]; i++)
        if (strcmp(name, REAL[i].name) == 0) return json_loads(REAL[i].text, 0, NULL);
    for (size_t i = 0; i < sizeof TOYS / sizeof TOYS[0]; i++)
        if (strcmp(name, TOYS[i].name) == 0) return json_loads(TOYS[i].text, 0, NULL);
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++) {
        const struct preset *p = &PRESETS[i];
        if (strcmp(name, p->name) != 0) continue;
        return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:i, s:[i], s:f, s:f, s:b, s:i, s:i, s:i}",
                         "architectures", "Qwen3MoeForCausalLM", "model_type", "qwen3_moe",
                         "vocab_size", p->vocab, "hidden_size", p->hidden, "intermediate_size", p->intermediate,
                         "num_hidden_layers", p->layers, "num_attention_heads", p->heads,
                         "num_key_value_heads", p->kv_heads, "head_dim", p->head_dim, "num_experts", p->experts,
                         "num_experts_per_tok", p->top_k, "moe_intermediate_size", p->moe_intermediate,
                         "norm_topk_prob", 1, "decoder_sparse_step", 1, "mlp_only_layers", 0,
                         "rope_theta", p->rope_theta, "rms_norm_eps", 1e-6, "tie_word_embeddings", 0,
                         "max_position_embeddings", p->max_pos, "bos_token_id", 0, "eos_token_id", 0);
    }
    return NULL;
}

char *trill_config_preset_text(const char *name) {
    bool known = false;
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++) known |= strcmp(name, PRESETS[i].name) == 0;
    for (size_t i = 0; i < sizeof TOYS / sizeof TOYS[0]; i++) known |= strcmp(name, TOYS[i].name) == 0;
    known |= trill_config_preset_is_real(name);
    if (!known) {
        trill_error(TRILL_ERR_INVALID, "unknown preset \"%s\" (expected one of: %s)", name, trill_config_preset_names);
        return NULL;
    }
    json_t *j = trill_config_preset(name);
    if (!j) {
        trill_error(TRILL_ERR_NOMEM, "out of memory");
        return NULL;
    }
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    if (!text) trill_error(TRILL_ERR_NOMEM, "out of memory");
    return text;
}
