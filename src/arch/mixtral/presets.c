/* The Mixtral presets (trill init --preset): mixtral-tiny, a toy to create and train (tiny's
 * sizes, every layer a MoE of 8 experts, top-2, token 0 as bos and eos as tiny's), and the real
 * configurations (HF config.json's fields trill reads), for `trill init --config-only` and
 * `trill info`: Mixtral-8x7B (46.7B, 12.9B active) and Mixtral-8x22B (141B, 39B active). */
#include "arch/family.h"
#include "arch/mixtral/mixtral.h"

const trill_preset trill_mixtral_presets[] = {
    { "mixtral-tiny",
    "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": 128, \"hidden_size\": 256,"
    " \"intermediate_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64,"
    " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-5, \"sliding_window\": null,"
    " \"tie_word_embeddings\": false, \"max_position_embeddings\": 4096, \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    { "mixtral-8x7b",
    "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": 32000, \"hidden_size\": 4096,"
    " \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
    " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-5, \"sliding_window\": null,"
    " \"tie_word_embeddings\": false, \"max_position_embeddings\": 32768, \"bos_token_id\": 1, \"eos_token_id\": 2}", true },
    { "mixtral-8x22b",
    "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": 32768, \"hidden_size\": 6144,"
    " \"intermediate_size\": 16384, \"num_hidden_layers\": 56, \"num_attention_heads\": 48, \"num_key_value_heads\": 8,"
    " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-5, \"sliding_window\": null,"
    " \"tie_word_embeddings\": false, \"max_position_embeddings\": 65536, \"bos_token_id\": 1, \"eos_token_id\": 2}", true },
};
const int trill_mixtral_n_presets = (int)(sizeof trill_mixtral_presets / sizeof trill_mixtral_presets[0]);
