/* The Qwen3-Next presets (trill init --preset): qwen3next-tiny, a toy to create and train (tiny's
 * vocabulary, 4 layers: three Gated DeltaNet layers and a full-attention one, 8 experts top-2
 * and a shared expert); qwen3next-small, the benchmark model's size class (small's vocabulary and
 * width, 8 layers); and the released Qwen3-Next-80B-A3B's configuration (80B, 3B active) for
 * `trill init --config-only` and `trill info`. */
#include "arch/family.h"
#include "arch/qwen3_next/qwen3_next.h"

const trill_preset trill_qwen3_next_presets[] = {
    { "qwen3next-tiny",
    "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\", \"vocab_size\": 128, \"hidden_size\": 256,"
    " \"intermediate_size\": 512, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64,"
    " \"partial_rotary_factor\": 0.25, \"rope_theta\": 10000.0, \"full_attention_interval\": 4, \"linear_conv_kernel_dim\": 4,"
    " \"linear_key_head_dim\": 32, \"linear_value_head_dim\": 32, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4,"
    " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 128, \"shared_expert_intermediate_size\": 128,"
    " \"decoder_sparse_step\": 1, \"norm_topk_prob\": true, \"mlp_only_layers\": [], \"rms_norm_eps\": 1e-6,"
    " \"tie_word_embeddings\": false, \"max_position_embeddings\": 4096, \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    { "qwen3next-small",
    "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\", \"vocab_size\": 32000, \"hidden_size\": 512,"
    " \"intermediate_size\": 1536, \"num_hidden_layers\": 8, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"head_dim\": 128,"
    " \"partial_rotary_factor\": 0.25, \"rope_theta\": 1000000.0, \"full_attention_interval\": 4, \"linear_conv_kernel_dim\": 4,"
    " \"linear_key_head_dim\": 64, \"linear_value_head_dim\": 64, \"linear_num_key_heads\": 4, \"linear_num_value_heads\": 8,"
    " \"num_experts\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 256, \"shared_expert_intermediate_size\": 256,"
    " \"decoder_sparse_step\": 1, \"norm_topk_prob\": true, \"mlp_only_layers\": [], \"rms_norm_eps\": 1e-6,"
    " \"tie_word_embeddings\": false, \"max_position_embeddings\": 32768, \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    { "qwen3-next-80b-a3b",
    "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\", \"vocab_size\": 151936, \"hidden_size\": 2048,"
    " \"intermediate_size\": 5120, \"num_hidden_layers\": 48, \"num_attention_heads\": 16, \"num_key_value_heads\": 2, \"head_dim\": 256,"
    " \"partial_rotary_factor\": 0.25, \"rope_theta\": 10000000, \"full_attention_interval\": 4, \"linear_conv_kernel_dim\": 4,"
    " \"linear_key_head_dim\": 128, \"linear_value_head_dim\": 128, \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 32,"
    " \"num_experts\": 512, \"num_experts_per_tok\": 10, \"moe_intermediate_size\": 512, \"shared_expert_intermediate_size\": 512,"
    " \"decoder_sparse_step\": 1, \"norm_topk_prob\": true, \"mlp_only_layers\": [], \"rms_norm_eps\": 1e-6, \"mtp_num_hidden_layers\": 1,"
    " \"tie_word_embeddings\": false, \"max_position_embeddings\": 262144, \"bos_token_id\": 151643, \"eos_token_id\": 151645}", true },
};
const int trill_qwen3_next_n_presets = (int)(sizeof trill_qwen3_next_presets / sizeof trill_qwen3_next_presets[0]);
