/* The Qwen3-MoE presets (trill init --preset): layer 0 dense (mlp_only_layers [0]),
 * norm_topk_prob, untied head, token 0 ("<|endoftext|>" in the character-level tokenizer) as bos
 * and eos. tiny: a few M parameters, 1 dense + 3 MoE layers, 8 experts, top-2; small: the
 * benchmark model, ~85M parameters; qwen3-30b-a3b and qwen3-235b-a22b: the published models'
 * configurations, to count and plan with. */
#include "arch/family.h"
#include "arch/qwen3/qwen3.h"

const trill_preset trill_qwen3_presets[] = {
    { "tiny",
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 128, \"hidden_size\": 256,"
    " \"intermediate_size\": 768, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64,"
    " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 128, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1,"
    " \"mlp_only_layers\": [0], \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
    " \"max_position_embeddings\": 4096, \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    { "small",
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 32000, \"hidden_size\": 512,"
    " \"intermediate_size\": 1536, \"num_hidden_layers\": 8, \"num_attention_heads\": 8, \"num_key_value_heads\": 4, \"head_dim\": 64,"
    " \"num_experts\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 256, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1,"
    " \"mlp_only_layers\": [0], \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
    " \"max_position_embeddings\": 32768, \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    /* the published models' configurations (Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B on the
     * Hugging Face hub), config-only: every layer a MoE */
    { "qwen3-30b-a3b",
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 151936, \"hidden_size\": 2048,"
    " \"intermediate_size\": 6144, \"num_hidden_layers\": 48, \"num_attention_heads\": 32, \"num_key_value_heads\": 4, \"head_dim\": 128,"
    " \"num_experts\": 128, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 768, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1,"
    " \"mlp_only_layers\": [], \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
    " \"max_position_embeddings\": 40960, \"bos_token_id\": 151643, \"eos_token_id\": 151645}", true },
    { "qwen3-235b-a22b",
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 151936, \"hidden_size\": 4096,"
    " \"intermediate_size\": 12288, \"num_hidden_layers\": 94, \"num_attention_heads\": 64, \"num_key_value_heads\": 4, \"head_dim\": 128,"
    " \"num_experts\": 128, \"num_experts_per_tok\": 8, \"moe_intermediate_size\": 1536, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1,"
    " \"mlp_only_layers\": [], \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
    " \"max_position_embeddings\": 40960, \"bos_token_id\": 151643, \"eos_token_id\": 151645}", true },
};
const int trill_qwen3_n_presets = (int)(sizeof trill_qwen3_presets / sizeof trill_qwen3_presets[0]);
