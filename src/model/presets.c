#include <string.h>

#include "trill/config.h"

const char *const trill_config_preset_names = "tiny, small";

json_t *trill_config_preset(const char *name) {
    if (strcmp(name, "tiny") == 0)
        return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:i, s:[i], s:f, s:f, s:b, s:i, s:i, s:i}",
                         "architectures", "Qwen3MoeForCausalLM", "model_type", "qwen3_moe",
                         "vocab_size", 128, "hidden_size", 256, "intermediate_size", 768,
                         "num_hidden_layers", 4, "num_attention_heads", 4, "num_key_value_heads", 2, "head_dim", 64,
                         "num_experts", 8, "num_experts_per_tok", 2, "moe_intermediate_size", 128,
                         "norm_topk_prob", 1, "decoder_sparse_step", 1, "mlp_only_layers", 0,
                         "rope_theta", 10000.0, "rms_norm_eps", 1e-6, "tie_word_embeddings", 0,
                         "max_position_embeddings", 4096, "bos_token_id", 0, "eos_token_id", 0);
    if (strcmp(name, "small") == 0)
        return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:i, s:[i], s:f, s:f, s:b, s:i, s:i, s:i}",
                         "architectures", "Qwen3MoeForCausalLM", "model_type", "qwen3_moe",
                         "vocab_size", 32000, "hidden_size", 512, "intermediate_size", 1536,
                         "num_hidden_layers", 8, "num_attention_heads", 8, "num_key_value_heads", 4, "head_dim", 64,
                         "num_experts", 16, "num_experts_per_tok", 4, "moe_intermediate_size", 256,
                         "norm_topk_prob", 1, "decoder_sparse_step", 1, "mlp_only_layers", 0,
                         "rope_theta", 1e6, "rms_norm_eps", 1e-6, "tie_word_embeddings", 0,
                         "max_position_embeddings", 32768, "bos_token_id", 0, "eos_token_id", 0);
    return NULL;
}
