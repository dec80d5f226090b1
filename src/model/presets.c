#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "model/config_json.h"
#include "trill/error.h"

const char *const trill_config_preset_names = "tiny, small";

/* Both presets: Qwen3-MoE, layer 0 dense (mlp_only_layers [0]), norm_topk_prob, untied head,
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

json_t *trill_config_preset(const char *name) {
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
