/* The Qwen3.5 MoE presets (trill init --preset): qwen35-tiny, a toy to create and train in the
 * multimodal checkpoint's layout (the language model's fields in text_config, its tensors under
 * "model.language_model."; no vision tower), and the configuration of HF's Qwen3_5MoeTextConfig
 * defaults, which its docstring calls Qwen3.5-35B-A3B's, for `trill init --config-only` and
 * `trill info`. */
#include "arch/family.h"
#include "arch/qwen3_next/qwen3_next.h"

#define ROPE(theta, part) \
    "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": " theta ", \"partial_rotary_factor\": " part ", \"mrope_interleaved\": true"

const trill_preset trill_qwen3_5_moe_presets[] = {
    { "qwen35-tiny",
    "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": \"qwen3_5_moe\", \"tie_word_embeddings\": false,"
    " \"text_config\": {\"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": 128, \"hidden_size\": 256, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64, " ROPE("10000.0", "0.25") ", \"mrope_section\": [3, 3, 2]},"
    " \"full_attention_interval\": 4, \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 32, \"linear_value_head_dim\": 32,"
    " \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 128, \"shared_expert_intermediate_size\": 128, \"rms_norm_eps\": 1e-6,"
    " \"max_position_embeddings\": 4096, \"bos_token_id\": 0, \"eos_token_id\": 0}}", false },
    { "qwen3.5-35b-a3b",
    "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": \"qwen3_5_moe\", \"tie_word_embeddings\": false,"
    " \"text_config\": {\"model_type\": \"qwen3_5_moe_text\", \"vocab_size\": 248320, \"hidden_size\": 2048, \"num_hidden_layers\": 40,"
    " \"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 256, " ROPE("10000000", "0.25") ", \"mrope_section\": [11, 11, 10]},"
    " \"full_attention_interval\": 4, \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128,"
    " \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32, \"num_experts\": 256, \"num_experts_per_tok\": 8,"
    " \"moe_intermediate_size\": 512, \"shared_expert_intermediate_size\": 512, \"rms_norm_eps\": 1e-6, \"mtp_num_hidden_layers\": 1,"
    " \"max_position_embeddings\": 262144}}", true },
};
const int trill_qwen3_5_moe_n_presets = (int)(sizeof trill_qwen3_5_moe_presets / sizeof trill_qwen3_5_moe_presets[0]);
