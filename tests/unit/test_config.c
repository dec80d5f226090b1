/* config.json: Hugging Face defaults, the MoE layer map, refusals named by field,
 * and config_to_json -> config_from_json round trips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "model/config_json.h"
#include "trill/config.h"
#include "trill/error.h"
#include "trill/fileio.h"
#include "base/json.h"

/* Parses `text` (must be valid JSON) and runs trill_config_from_json on it. */
static trill_status from_text(const char *text, trill_config *c) {
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    if (!root) fail_msg("test JSON does not parse: %s: %s", err.text, text);
    trill_status st = trill_config_from_json(root, "cfg.json", c);
    json_decref(root);
    return st;
}

static trill_config *new_config(void) {
    trill_config *c = calloc(1, sizeof *c);
    assert_non_null(c);
    return c;
}

static void test_defaults_qwen3_moe(void **state) {
    (void)state;
    trill_config *c = new_config();
    assert_int_equal(from_text("{\"model_type\": \"qwen3_moe\"}", c), TRILL_OK);
    assert_int_equal(c->arch, TRILL_ARCH_QWEN3_MOE);
    assert_int_equal(c->vocab_size, 151936);
    assert_int_equal(c->hidden_size, 2048);
    assert_int_equal(c->intermediate_size, 6144);
    assert_int_equal(c->num_hidden_layers, 24);
    assert_int_equal(c->num_attention_heads, 32);
    assert_int_equal(c->num_key_value_heads, 4);
    assert_int_equal(c->head_dim, 2048 / 32);
    assert_int_equal(c->num_experts, 128);
    assert_int_equal(c->num_experts_per_tok, 8);
    assert_int_equal(c->moe_intermediate_size, 768);
    assert_int_equal(c->decoder_sparse_step, 1);
    assert_false(c->norm_topk_prob);
    assert_false(c->tie_word_embeddings);
    assert_true(c->rope_theta == 10000.0);
    assert_true(c->rms_norm_eps == 1e-6);
    assert_int_equal(c->bos_token_id, -1);
    assert_int_equal(c->n_eos, 0);
    assert_int_equal(c->n_moe_layers, 24);
    for (int l = 0; l < 24; l++) {
        assert_int_equal(c->moe_ordinal[l], l);
        assert_int_equal(c->moe_layer[l], l);
        assert_true(trill_config_is_moe(c, l));
    }
    assert_string_equal(trill_config_architecture(c), "Qwen3MoeForCausalLM");
    assert_string_equal(trill_config_model_type(c), "qwen3_moe");

    /* head_dim follows hidden_size / num_attention_heads when absent... */
    assert_int_equal(from_text("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 512, \"num_attention_heads\": 8}", c), TRILL_OK);
    assert_int_equal(c->head_dim, 64);
    /* ...and an explicit one wins. */
    assert_int_equal(from_text("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 512, \"num_attention_heads\": 8, \"head_dim\": 128}", c), TRILL_OK);
    assert_int_equal(c->head_dim, 128);
    free(c);
}

static void test_defaults_qwen3(void **state) {
    (void)state;
    trill_config *c = new_config();
    assert_int_equal(from_text("{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"],"
                               " \"num_experts\": 64, \"eos_token_id\": [1, 2], \"bos_token_id\": 0}", c), TRILL_OK);
    assert_int_equal(c->arch, TRILL_ARCH_QWEN3);
    assert_int_equal(c->hidden_size, 4096);
    assert_int_equal(c->num_hidden_layers, 32);
    assert_int_equal(c->num_key_value_heads, 32);
    assert_int_equal(c->head_dim, 128);
    assert_int_equal(c->num_experts, 0); /* MoE fields mean nothing for a dense model */
    assert_int_equal(c->num_experts_per_tok, 0);
    assert_int_equal(c->n_moe_layers, 0);
    for (int l = 0; l < c->num_hidden_layers; l++) assert_int_equal(c->moe_ordinal[l], -1);
    assert_int_equal(c->bos_token_id, 0);
    assert_int_equal(c->n_eos, 2);
    assert_int_equal(c->eos_token_ids[1], 2);
    assert_string_equal(trill_config_architecture(c), "Qwen3ForCausalLM");
    free(c);
}

static void test_layer_map(void **state) {
    (void)state;
    trill_config *c = new_config();
    assert_int_equal(from_text("{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 8, \"hidden_size\": 64,"
                               " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_experts\": 4,"
                               " \"num_experts_per_tok\": 2, \"mlp_only_layers\": [0, 1], \"decoder_sparse_step\": 2}", c),
                     TRILL_OK);
    /* MoE iff not mlp-only and (l+1) % 2 == 0: layers 3, 5, 7. */
    static const int16_t ordinal[8] = { -1, -1, -1, 0, -1, 1, -1, 2 };
    assert_int_equal(c->n_moe_layers, 3);
    for (int l = 0; l < 8; l++) assert_int_equal(c->moe_ordinal[l], ordinal[l]);
    assert_int_equal(c->moe_layer[0], 3);
    assert_int_equal(c->moe_layer[1], 5);
    assert_int_equal(c->moe_layer[2], 7);
    assert_true(c->mlp_only[0] && c->mlp_only[1] && !c->mlp_only[2]);

    /* Step 1 with mlp_only_layers [0, 5]: ordinals skip them. */
    assert_int_equal(from_text("{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 6, \"num_experts\": 4,"
                               " \"num_experts_per_tok\": 1, \"mlp_only_layers\": [5, 0]}", c), TRILL_OK);
    static const int16_t ordinal2[6] = { -1, 0, 1, 2, 3, -1 };
    assert_int_equal(c->n_moe_layers, 4);
    for (int l = 0; l < 6; l++) assert_int_equal(c->moe_ordinal[l], ordinal2[l]);
    for (int k = 0; k < 4; k++) assert_int_equal(c->moe_layer[k], k + 1);

    /* No experts: every layer dense. */
    assert_int_equal(from_text("{\"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 3, \"num_experts\": 0}", c), TRILL_OK);
    assert_int_equal(c->n_moe_layers, 0);
    free(c);
}

typedef struct {
    const char *json;
    trill_status want;
    const char *needle;  /* the field, as the message quotes it */
    const char *needle2; /* NULL or another distinctive part */
} refusal;

#define MOE "\"model_type\": \"qwen3_moe\", "

static const refusal REFUSALS[] = {
    { "{\"model_type\": \"llama\"}", TRILL_ERR_UNSUPPORTED, "field \"model_type\"", "\"llama\"" },
    { "{\"hidden_size\": 64}", TRILL_ERR_INVALID, "field \"model_type\" is missing", NULL },
    { "{\"model_type\": 3}", TRILL_ERR_INVALID, "field \"model_type\"", "expected a string" },
    { "{" MOE "\"architectures\": [\"Qwen3ForCausalLM\"]}", TRILL_ERR_UNSUPPORTED, "field \"architectures\"", "Qwen3MoeForCausalLM" },
    { "{\"model_type\": \"qwen3\", \"architectures\": [\"LlamaForCausalLM\"]}", TRILL_ERR_UNSUPPORTED, "field \"architectures\"", "\"LlamaForCausalLM\"" },
    { "{" MOE "\"architectures\": \"Qwen3MoeForCausalLM\"}", TRILL_ERR_INVALID, "field \"architectures\"", "expected a list" },
    { "{" MOE "\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4.0}}", TRILL_ERR_UNSUPPORTED, "field \"rope_scaling\"", "\"longrope\"" },
    { "{" MOE "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 0.5}}", TRILL_ERR_INVALID, "field \"factor\"", "" },
    { "{" MOE "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}}", TRILL_ERR_UNSUPPORTED, "field \"rope_scaling\"", "\"linear\"" },
    { "{" MOE "\"rope_scaling\": {\"factor\": 2.0}}", TRILL_ERR_UNSUPPORTED, "field \"rope_scaling\"", "(missing)" },
    { "{" MOE "\"rope_scaling\": \"yarn\"}", TRILL_ERR_INVALID, "field \"rope_scaling\"", "expected an object or null" },
    { "{" MOE "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 5e5}}", TRILL_ERR_UNSUPPORTED, "field \"rope_parameters\"", "\"llama3\"" },
    { "{" MOE "\"sliding_window\": 0}", TRILL_ERR_INVALID, "field \"sliding_window\"", NULL },
    { "{" MOE "\"use_sliding_window\": 1}", TRILL_ERR_INVALID, "field \"use_sliding_window\"", "expected true or false" },
    { "{" MOE "\"attention_bias\": true}", TRILL_ERR_UNSUPPORTED, "field \"attention_bias\"", NULL },
    { "{" MOE "\"hidden_act\": \"gelu\"}", TRILL_ERR_UNSUPPORTED, "field \"hidden_act\"", "\"gelu\"" },
    { "{" MOE "\"num_hidden_layers\": 2, \"layer_types\": [\"full_attention\", \"chunked_attention\"]}", TRILL_ERR_UNSUPPORTED,
      "field \"layer_types\"", "entry 1" },
    { "{" MOE "\"num_hidden_layers\": 2, \"layer_types\": [\"full_attention\"]}", TRILL_ERR_INVALID, "field \"layer_types\"", "2 entries" },
    { "{" MOE "\"num_experts\": 4, \"num_experts_per_tok\": 5}", TRILL_ERR_INVALID, "field \"num_experts_per_tok\"", "num_experts=4" },
    { "{" MOE "\"num_attention_heads\": 12, \"num_key_value_heads\": 8, \"hidden_size\": 768}", TRILL_ERR_INVALID,
      "num_attention_heads (12) must be a multiple of num_key_value_heads (8)", NULL },
    { "{" MOE "\"num_hidden_layers\": 4, \"mlp_only_layers\": [1, 4]}", TRILL_ERR_INVALID, "field \"mlp_only_layers\"", "entry 1" },
    { "{" MOE "\"mlp_only_layers\": [-1]}", TRILL_ERR_INVALID, "field \"mlp_only_layers\"", "entry 0" },
    { "{" MOE "\"mlp_only_layers\": 3}", TRILL_ERR_INVALID, "field \"mlp_only_layers\"", "got integer" },
    { "{" MOE "\"hidden_size\": \"512\"}", TRILL_ERR_INVALID, "field \"hidden_size\"", "expected an integer, got string" },
    { "{" MOE "\"num_hidden_layers\": 4.0}", TRILL_ERR_INVALID, "field \"num_hidden_layers\"", "got number" },
    { "{" MOE "\"num_hidden_layers\": 0}", TRILL_ERR_INVALID, "field \"num_hidden_layers\"", "out of range" },
    { "{" MOE "\"num_hidden_layers\": 5000}", TRILL_ERR_INVALID, "field \"num_hidden_layers\"", "out of range" },
    { "{" MOE "\"rms_norm_eps\": \"1e-6\"}", TRILL_ERR_INVALID, "field \"rms_norm_eps\"", "expected a number" },
    { "{" MOE "\"head_dim\": 63}", TRILL_ERR_INVALID, "field \"head_dim\"", "even" },
    { "{" MOE "\"hidden_size\": 28}", TRILL_ERR_INVALID, "field \"head_dim\"", "at least 2" }, /* derived 28/32 = 0 */
    { "{" MOE "\"norm_topk_prob\": \"yes\"}", TRILL_ERR_INVALID, "field \"norm_topk_prob\"", NULL },
    { "{" MOE "\"vocab_size\": 100, \"eos_token_id\": 100}", TRILL_ERR_INVALID, "field \"eos_token_id\"", "[0, 100)" },
    { "{" MOE "\"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", TRILL_ERR_INVALID, "field \"eos_token_id\"", "at most 8" },
    { "{" MOE "\"vocab_size\": 100, \"bos_token_id\": 100}", TRILL_ERR_INVALID, "field \"bos_token_id\"", "out of range" },
    { "[1, 2]", TRILL_ERR_INVALID, "expected a JSON object, got array", NULL },
};

static void test_refusals(void **state) {
    (void)state;
    trill_config *c = new_config();
    for (size_t i = 0; i < sizeof REFUSALS / sizeof REFUSALS[0]; i++) {
        const refusal *r = &REFUSALS[i];
        trill_status st = from_text(r->json, c);
        if (st != r->want)
            fail_msg("%s: status %d (%s), wanted %d; message: %s", r->json, st, trill_status_name(st), r->want,
                     trill_error_message());
        const char *m = trill_error_message();
        if (!strstr(m, "cfg.json")) fail_msg("%s: message lacks the source: %s", r->json, m);
        if (!strstr(m, r->needle)) fail_msg("%s: message lacks '%s': %s", r->json, r->needle, m);
        if (r->needle2 && !strstr(m, r->needle2)) fail_msg("%s: message lacks '%s': %s", r->json, r->needle2, m);
    }
    free(c);
}

static void test_accepted_variants(void **state) {
    (void)state;
    trill_config *c = new_config();
    assert_int_equal(from_text("{" MOE "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 5e5}}", c), TRILL_OK);
    assert_true(c->rope_theta == 5e5);
    assert_int_equal(from_text("{" MOE "\"rope_scaling\": null, \"rope_theta\": 1000000, \"use_sliding_window\": false,"
                               " \"attention_bias\": false, \"hidden_act\": \"silu\", \"num_hidden_layers\": 1, \"layer_types\": [\"full_attention\"],"
                               " \"architectures\": [\"Qwen3MoeForCausalLM\"], \"transformers_version\": \"4.51.0\","
                               " \"torch_dtype\": \"bfloat16\", \"eos_token_id\": 151645, \"bos_token_id\": null}", c),
                     TRILL_OK);
    assert_true(c->rope_theta == 1e6);
    assert_int_equal(c->sliding_window, 0);
    assert_int_equal(c->n_eos, 1);
    assert_int_equal(c->eos_token_ids[0], 151645);
    /* sliding windows as HF's Qwen3Config takes them: from max_window_layers on, or where
     * layer_types says, only with use_sliding_window */
    assert_int_equal(from_text("{" MOE "\"num_hidden_layers\": 4, \"use_sliding_window\": true, \"sliding_window\": 8, \"max_window_layers\": 2}", c),
                     TRILL_OK);
    assert_int_equal(c->sliding_window, 8);
    assert_true(!c->sliding_layer[0] && !c->sliding_layer[1] && c->sliding_layer[2] && c->sliding_layer[3]);
    assert_int_equal(from_text("{" MOE "\"num_hidden_layers\": 3, \"use_sliding_window\": true, \"sliding_window\": 8,"
                               " \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\"]}", c), TRILL_OK);
    assert_true(c->sliding_layer[0] && !c->sliding_layer[1] && c->sliding_layer[2]);
    assert_int_equal(from_text("{" MOE "\"num_hidden_layers\": 2, \"use_sliding_window\": false, \"sliding_window\": 8,"
                               " \"layer_types\": [\"sliding_attention\", \"full_attention\"]}", c), TRILL_OK);
    assert_true(c->sliding_window == 0 && !c->sliding_layer[0]);
    assert_int_equal(c->bos_token_id, -1);
    assert_true(trill_config_known_key("num_experts_per_tok"));
    assert_true(trill_config_known_key("rope_parameters"));
    assert_false(trill_config_known_key("num_expert"));
    free(c);
}

static void assert_config_equal(const trill_config *a, const trill_config *b) {
    assert_int_equal(a->arch, b->arch);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_int_equal(a->num_hidden_layers, b->num_hidden_layers);
    assert_int_equal(a->num_attention_heads, b->num_attention_heads);
    assert_int_equal(a->num_key_value_heads, b->num_key_value_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_true(a->rope_theta == b->rope_theta);
    assert_true(a->initializer_range == b->initializer_range);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->num_experts, b->num_experts);
    assert_int_equal(a->num_experts_per_tok, b->num_experts_per_tok);
    assert_int_equal(a->moe_intermediate_size, b->moe_intermediate_size);
    assert_int_equal(a->decoder_sparse_step, b->decoder_sparse_step);
    assert_int_equal(a->norm_topk_prob, b->norm_topk_prob);
    assert_memory_equal(a->mlp_only, b->mlp_only, sizeof a->mlp_only);
    assert_int_equal(a->bos_token_id, b->bos_token_id);
    assert_int_equal(a->n_eos, b->n_eos);
    assert_memory_equal(a->eos_token_ids, b->eos_token_ids, sizeof(int) * (size_t)a->n_eos);
    assert_int_equal(a->n_moe_layers, b->n_moe_layers);
    assert_memory_equal(a->moe_ordinal, b->moe_ordinal, sizeof(int16_t) * (size_t)a->num_hidden_layers);
    assert_memory_equal(a->moe_layer, b->moe_layer, sizeof(int16_t) * (size_t)a->n_moe_layers);
}

/* from_json -> to_json -> (text) -> from_json gives the same struct. */
static void round_trip(const char *text) {
    trill_config *a = new_config(), *b = new_config();
    assert_int_equal(from_text(text, a), TRILL_OK);
    json_t *j = trill_config_to_json(a, "bfloat16");
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "torch_dtype")), "bfloat16");
    assert_string_equal(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)), trill_config_architecture(a));
    char *dumped = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    assert_non_null(dumped);
    assert_int_equal(from_text(dumped, b), TRILL_OK);
    free(dumped);
    assert_config_equal(a, b);
    free(a);
    free(b);
}

static void test_round_trip(void **state) {
    (void)state;
    round_trip("{" MOE "\"vocab_size\": 1000, \"hidden_size\": 96, \"intermediate_size\": 200, \"num_hidden_layers\": 7,"
               " \"num_attention_heads\": 6, \"num_key_value_heads\": 3, \"head_dim\": 20, \"max_position_embeddings\": 4096,"
               " \"rms_norm_eps\": 1e-5, \"rope_theta\": 1234567.5, \"initializer_range\": 0.0137, \"tie_word_embeddings\": true,"
               " \"num_experts\": 6, \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 48, \"decoder_sparse_step\": 2,"
               " \"norm_topk_prob\": true, \"mlp_only_layers\": [1, 6], \"bos_token_id\": 3, \"eos_token_id\": [7, 9, 11]}");
    round_trip("{\"model_type\": \"qwen3\", \"vocab_size\": 500, \"hidden_size\": 64, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"eos_token_id\": 5}");
    round_trip("{" MOE "\"num_hidden_layers\": 3}");

    /* And through the file loader. */
    char *dir = test_tmpdir("cfg");
    trill_config *a = new_config(), *b = new_config();
    assert_int_equal(from_text("{" MOE "\"num_hidden_layers\": 5, \"mlp_only_layers\": [2], \"num_experts\": 8}", a), TRILL_OK);
    json_t *j = trill_config_to_json(a, NULL);
    assert_null(json_object_get(j, "torch_dtype"));
    char *path = trill_path_join(dir, "config.json");
    assert_int_equal(trill_json_write_file(path, j), TRILL_OK);
    json_decref(j);
    assert_int_equal(trill_config_load(path, b), TRILL_OK);
    assert_config_equal(a, b);
    assert_int_equal(b->n_moe_layers, 4);
    assert_int_equal(b->moe_ordinal[2], -1);
    assert_int_equal(b->moe_ordinal[3], 2);

    /* Loader errors name the file. */
    const char *broken_text = "{\"model_type\": ";
    test_write(dir, "broken.json", broken_text, strlen(broken_text));
    char *broken = trill_path_join(dir, "broken.json");
    assert_int_equal(trill_config_load(broken, b), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), broken));
    char *missing = trill_path_join(dir, "missing.json");
    assert_int_equal(trill_config_load(missing, b), TRILL_ERR_IO);
    assert_non_null(strstr(trill_error_message(), missing));
    const char *gelu_text = "{\"model_type\": \"qwen3\", \"hidden_act\": \"gelu\"}";
    test_write(dir, "gelu.json", gelu_text, strlen(gelu_text));
    char *gelu = trill_path_join(dir, "gelu.json");
    assert_int_equal(trill_config_load(gelu, b), TRILL_ERR_UNSUPPORTED);
    assert_non_null(strstr(trill_error_message(), gelu));
    assert_non_null(strstr(trill_error_message(), "\"hidden_act\""));

    free(gelu);
    free(missing);
    free(broken);
    free(path);
    free(a);
    free(b);
    test_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_qwen3_moe),
        cmocka_unit_test(test_defaults_qwen3),
        cmocka_unit_test(test_layer_map),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_accepted_variants),
        cmocka_unit_test(test_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
