/* The GLM-4.5 presets (trill init --preset): glm45-tiny, a toy to create and train (tiny's sizes
 * with GLM-4.5's features: layer 0 dense, q/k/v biases, QK-norm, RoPE on half of each head, 16
 * routed experts top-4 behind the sigmoid router with its correction bias, one shared expert,
 * scaling 2.5; token 0 as bos and eos as tiny's), and the real configurations (HF config.json's
 * fields trill reads), for `trill init --config-only` and `trill info`: GLM-4.5 (355B published,
 * 32B active without the embeddings; 92 layers, 3 dense, QK-norm) and GLM-4.5-Air (106B, 12B
 * active; 46 layers, 1 dense, no QK-norm). GLM-4.6 and GLM-4.7 are GLM-4.5's architecture. */
#include "arch/family.h"
#include "arch/glm4_moe/glm4_moe.h"

const trill_preset trill_glm4_moe_presets[] = {
    { "glm45-tiny",
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"vocab_size\": 128, \"hidden_size\": 256,"
    " \"intermediate_size\": 768, \"moe_intermediate_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 64, \"partial_rotary_factor\": 0.5, \"attention_bias\": true, \"use_qk_norm\": true,"
    " \"n_routed_experts\": 16, \"n_shared_experts\": 1, \"num_experts_per_tok\": 4, \"first_k_dense_replace\": 1,"
    " \"routed_scaling_factor\": 2.5, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true, \"rope_theta\": 1000000.0,"
    " \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false, \"max_position_embeddings\": 4096, \"num_nextn_predict_layers\": 0,"
    " \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    { "glm-4.5",
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"vocab_size\": 151552, \"hidden_size\": 5120,"
    " \"intermediate_size\": 12288, \"moe_intermediate_size\": 1536, \"num_hidden_layers\": 92, \"num_attention_heads\": 96,"
    " \"num_key_value_heads\": 8, \"head_dim\": 128, \"partial_rotary_factor\": 0.5, \"attention_bias\": true, \"use_qk_norm\": true,"
    " \"n_routed_experts\": 160, \"n_shared_experts\": 1, \"num_experts_per_tok\": 8, \"first_k_dense_replace\": 3,"
    " \"routed_scaling_factor\": 2.5, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true, \"rope_theta\": 1000000.0,"
    " \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false, \"max_position_embeddings\": 131072, \"num_nextn_predict_layers\": 1,"
    " \"bos_token_id\": null, \"eos_token_id\": [151329, 151336, 151338]}", true },
    { "glm-4.5-air",
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"vocab_size\": 151552, \"hidden_size\": 4096,"
    " \"intermediate_size\": 10944, \"moe_intermediate_size\": 1408, \"num_hidden_layers\": 46, \"num_attention_heads\": 96,"
    " \"num_key_value_heads\": 8, \"head_dim\": 128, \"partial_rotary_factor\": 0.5, \"attention_bias\": true, \"use_qk_norm\": false,"
    " \"n_routed_experts\": 128, \"n_shared_experts\": 1, \"num_experts_per_tok\": 8, \"first_k_dense_replace\": 1,"
    " \"routed_scaling_factor\": 1.0, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true, \"rope_theta\": 1000000.0,"
    " \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false, \"max_position_embeddings\": 131072, \"num_nextn_predict_layers\": 1,"
    " \"bos_token_id\": null, \"eos_token_id\": [151329, 151336, 151338]}", true },
};
const int trill_glm4_moe_n_presets = (int)(sizeof trill_glm4_moe_presets / sizeof trill_glm4_moe_presets[0]);
