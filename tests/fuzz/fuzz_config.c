/* libFuzzer harness: arbitrary bytes as config.json. Whatever is accepted must survive
 * trill_config_to_json -> trill_config_from_json unchanged. */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config_json.h"
#include "trill/config.h"

#define CHECK(cond)                                                                       \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "fuzz_config: check failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

static trill_config a, b; /* large: keep them off the stack */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t err;
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &err);
    if (!root) return 0;
    if (trill_config_from_json(root, "fuzz.json", &a) != TRILL_OK) {
        CHECK(trill_error_message()[0] != '\0');
        json_decref(root);
        return 0;
    }
    json_decref(root);
    CHECK(a.head_dim > 0 && a.num_hidden_layers > 0 && a.num_hidden_layers <= TRILL_MAX_LAYERS);
    CHECK(a.n_moe_layers >= 0 && a.n_moe_layers <= a.num_hidden_layers);
    for (int k = 0; k < a.n_moe_layers; k++) CHECK(a.moe_ordinal[a.moe_layer[k]] == k);
    int64_t total, active;
    trill_config_param_counts(&a, &total, &active);
    CHECK(active <= total);

    json_t *j = trill_config_to_json(&a, "bfloat16");
    CHECK(j != NULL);
    CHECK(trill_config_from_json(j, "round trip", &b) == TRILL_OK);
    json_decref(j);
    CHECK(a.arch == b.arch && a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size);
    CHECK(a.intermediate_size == b.intermediate_size && a.num_hidden_layers == b.num_hidden_layers);
    CHECK(a.num_attention_heads == b.num_attention_heads && a.num_key_value_heads == b.num_key_value_heads);
    CHECK(a.head_dim == b.head_dim && a.max_position_embeddings == b.max_position_embeddings);
    CHECK(a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta && a.initializer_range == b.initializer_range);
    CHECK(a.tie_word_embeddings == b.tie_word_embeddings && a.norm_topk_prob == b.norm_topk_prob);
    CHECK(a.num_experts == b.num_experts && a.num_experts_per_tok == b.num_experts_per_tok);
    CHECK(a.moe_intermediate_size == b.moe_intermediate_size && a.decoder_sparse_step == b.decoder_sparse_step);
    CHECK(a.bos_token_id == b.bos_token_id && a.n_eos == b.n_eos);
    CHECK(memcmp(a.eos_token_ids, b.eos_token_ids, sizeof(int) * (size_t)a.n_eos) == 0);
    CHECK(a.n_moe_layers == b.n_moe_layers);
    CHECK(memcmp(a.moe_ordinal, b.moe_ordinal, sizeof(int16_t) * (size_t)a.num_hidden_layers) == 0);
    CHECK(memcmp(a.mlp_only, b.mlp_only, sizeof a.mlp_only) == 0);
    return 0;
}
