/* The gpt-oss presets (trill init --preset): gptoss-tiny, a toy to create and train (tiny's sizes,
 * 8 experts, top-2, a sliding window of 8 on the even layers, YaRN as the released models have
 * it, token 0 as bos and eos as tiny's), and the released configurations (HF config.json's
 * fields trill reads), for `trill init --config-only` and `trill info`: gpt-oss-120b (117B, 5.1B
 * active) and gpt-oss-20b (21B, 3.6B active). */
#include "arch/family.h"
#include "arch/gpt_oss/gpt_oss.h"

#define YARN "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 32.0, \"beta_fast\": 32.0, \"beta_slow\": 1.0, \"truncate\": false," \
             " \"original_max_position_embeddings\": 4096}"

const trill_preset trill_gpt_oss_presets[] = {
    { "gptoss-tiny",
    "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": 128, \"hidden_size\": 256,"
    " \"intermediate_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64,"
    " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"rope_theta\": 150000.0, " YARN ", \"rms_norm_eps\": 1e-5,"
    " \"sliding_window\": 8, \"attention_bias\": true, \"swiglu_limit\": 7.0, \"tie_word_embeddings\": false,"
    " \"max_position_embeddings\": 131072, \"bos_token_id\": 0, \"eos_token_id\": 0}", false },
    { "gpt-oss-120b",
    "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": 201088, \"hidden_size\": 2880,"
    " \"intermediate_size\": 2880, \"num_hidden_layers\": 36, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, \"head_dim\": 64,"
    " \"num_local_experts\": 128, \"num_experts_per_tok\": 4, \"rope_theta\": 150000, " YARN ", \"rms_norm_eps\": 1e-5,"
    " \"sliding_window\": 128, \"attention_bias\": true, \"swiglu_limit\": 7.0, \"tie_word_embeddings\": false,"
    " \"max_position_embeddings\": 131072, \"bos_token_id\": 199998, \"eos_token_id\": 200002}", true },
    { "gpt-oss-20b",
    "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": 201088, \"hidden_size\": 2880,"
    " \"intermediate_size\": 2880, \"num_hidden_layers\": 24, \"num_attention_heads\": 64, \"num_key_value_heads\": 8, \"head_dim\": 64,"
    " \"num_local_experts\": 32, \"num_experts_per_tok\": 4, \"rope_theta\": 150000, " YARN ", \"rms_norm_eps\": 1e-5,"
    " \"sliding_window\": 128, \"attention_bias\": true, \"swiglu_limit\": 7.0, \"tie_word_embeddings\": false,"
    " \"max_position_embeddings\": 131072, \"bos_token_id\": 199998, \"eos_token_id\": 200002}", true },
};
const int trill_gpt_oss_n_presets = (int)(sizeof trill_gpt_oss_presets / sizeof trill_gpt_oss_presets[0]);
