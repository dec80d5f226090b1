/* The DeepSeek-V3 / Kimi K2 family's presets (trill init --preset): toys to create and train —
 * Kimi K2's ratios at toy size (first layer dense, one shared expert, many routed experts, 8
 * active, one group, YaRN with K2's beta 1/1 and rope theta), a DeepSeek-V3-shaped one with 8
 * groups keeping 4 and q_proj through q_a/q_b, and k2-small, sized like small (the benchmark
 * model), token 0 bos and eos as tiny's — and the real configurations (the HF config.json fields
 * trill reads), for `trill init --config-only` and `trill info`: far too large to create here. */
#include "arch/family.h"
#include "arch/deepseek_v3/deepseek.h"

const trill_preset trill_deepseek_presets[] = {
    { "k2-tiny",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\", \"vocab_size\": 128, \"hidden_size\": 256,"
    " \"intermediate_size\": 768, \"moe_intermediate_size\": 64, \"num_hidden_layers\": 4, \"num_nextn_predict_layers\": 0,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"n_shared_experts\": 1, \"n_routed_experts\": 32,"
    " \"routed_scaling_factor\": 2.827, \"kv_lora_rank\": 64, \"q_lora_rank\": 96, \"qk_rope_head_dim\": 16, \"v_head_dim\": 32,"
    " \"qk_nope_head_dim\": 32, \"topk_method\": \"noaux_tc\", \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 4096, \"rope_theta\": 50000.0, \"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0,"
    " \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 128, \"type\": \"yarn\"},"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    { "dsv3-tiny",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": 128, \"hidden_size\": 256,"
    " \"intermediate_size\": 768, \"moe_intermediate_size\": 64, \"num_hidden_layers\": 4, \"num_nextn_predict_layers\": 0,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"n_shared_experts\": 1, \"n_routed_experts\": 32,"
    " \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 64, \"q_lora_rank\": 96, \"qk_rope_head_dim\": 16, \"v_head_dim\": 32,"
    " \"qk_nope_head_dim\": 32, \"topk_method\": \"noaux_tc\", \"n_group\": 8, \"topk_group\": 4, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 4096, \"rope_theta\": 10000.0, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1,"
    " \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 128, \"type\": \"yarn\"},"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    { "k2-small",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\", \"vocab_size\": 32000, \"hidden_size\": 512,"
    " \"intermediate_size\": 1536, \"moe_intermediate_size\": 128, \"num_hidden_layers\": 8, \"num_nextn_predict_layers\": 0,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 8, \"n_shared_experts\": 1, \"n_routed_experts\": 64,"
    " \"routed_scaling_factor\": 2.827, \"kv_lora_rank\": 128, \"q_lora_rank\": 192, \"qk_rope_head_dim\": 16, \"v_head_dim\": 32,"
    " \"qk_nope_head_dim\": 32, \"topk_method\": \"noaux_tc\", \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 32768, \"rope_theta\": 50000.0, \"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0,"
    " \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 1024, \"type\": \"yarn\"},"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    { "deepseek-v3",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": 129280, \"hidden_size\": 7168,"
    " \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61, \"num_nextn_predict_layers\": 1,"
    " \"num_attention_heads\": 128, \"num_key_value_heads\": 128, \"n_shared_experts\": 1, \"n_routed_experts\": 256,"
    " \"routed_scaling_factor\": 2.5, \"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"
    " \"qk_nope_head_dim\": 128, \"topk_method\": \"noaux_tc\", \"n_group\": 8, \"topk_group\": 4, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 3, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 163840, \"rope_theta\": 10000, \"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1,"
    " \"factor\": 40, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
    " \"tie_word_embeddings\": false, \"bos_token_id\": 0, \"eos_token_id\": 1}", true },
    { "kimi-k2",
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\", \"vocab_size\": 163840, \"hidden_size\": 7168,"
    " \"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61, \"num_nextn_predict_layers\": 0,"
    " \"num_attention_heads\": 64, \"num_key_value_heads\": 64, \"n_shared_experts\": 1, \"n_routed_experts\": 384,"
    " \"routed_scaling_factor\": 2.827, \"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, \"v_head_dim\": 128,"
    " \"qk_nope_head_dim\": 128, \"topk_method\": \"noaux_tc\", \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 8,"
    " \"moe_layer_freq\": 1, \"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"max_position_embeddings\": 131072, \"rope_theta\": 50000.0, \"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0,"
    " \"factor\": 32.0, \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096, \"type\": \"yarn\"},"
    " \"tie_word_embeddings\": false, \"bos_token_id\": 163584, \"eos_token_id\": 163585}", true },
};
const int trill_deepseek_n_presets = (int)(sizeof trill_deepseek_presets / sizeof trill_deepseek_presets[0]);
