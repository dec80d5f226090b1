#include "testutil.h"

#include "model/config_json.h"
#include "trill/kernels.h"
#include "trill/rng.h"

#include <setjmp.h>
#include <stdarg.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every unit test starts with OpenBLAS's kernels for this CPU (trill_blas_restart): run from the
 * program's initialisers, which glibc calls with main's arguments. */
__attribute__((constructor)) static void blas_for_this_cpu(int argc, char **argv, char **envp) {
    (void)argc;
    (void)envp;
    trill_blas_restart(argv);
}

char *test_tmpdir(const char *tag) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char *path = malloc(strlen(base) + strlen(tag) + 32);
    sprintf(path, "%s/trill-%s-XXXXXX", base, tag);
    if (!mkdtemp(path)) { perror("mkdtemp"); abort(); }
    return path;
}

void test_rmdir(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

void test_write(const char *dir, const char *name, const void *data, size_t len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) { perror(path); abort(); }
    fclose(f);
}

json_t *test_small_moe_json(void) {
    json_t *j = trill_config_preset("tiny");
    json_object_set_new(j, "hidden_size", json_integer(32));
    json_object_set_new(j, "head_dim", json_integer(8));
    json_object_set_new(j, "intermediate_size", json_integer(48));
    json_object_set_new(j, "moe_intermediate_size", json_integer(16));
    json_object_set_new(j, "initializer_range", json_real(0.3));
    return j;
}

trill_model *test_small_moe(uint64_t seed, bool tied, bool norm_topk_prob) {
    json_t *j = test_small_moe_json();
    json_object_set_new(j, "tie_word_embeddings", json_boolean(tied));
    json_object_set_new(j, "norm_topk_prob", json_boolean(norm_topk_prob));
    trill_config c;
    assert_int_equal(trill_config_from_json(j, "test", &c), TRILL_OK);
    json_decref(j);
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    trill_model_init_random(m, seed);
    return m;
}

json_t *test_small_deepseek_json(void) {
    json_t *j = trill_config_preset("k2-tiny");
    json_object_set_new(j, "model_type", json_string("deepseek_v3"));
    json_object_set_new(j, "hidden_size", json_integer(32));
    json_object_set_new(j, "intermediate_size", json_integer(48));
    json_object_set_new(j, "moe_intermediate_size", json_integer(16));
    json_object_set_new(j, "num_attention_heads", json_integer(2));
    json_object_set_new(j, "num_key_value_heads", json_integer(2));
    json_object_set_new(j, "n_routed_experts", json_integer(8));
    json_object_set_new(j, "num_experts_per_tok", json_integer(2));
    json_object_set_new(j, "n_group", json_integer(2));
    json_object_set_new(j, "topk_group", json_integer(1));
    json_object_set_new(j, "q_lora_rank", json_integer(16));
    json_object_set_new(j, "kv_lora_rank", json_integer(16));
    json_object_set_new(j, "qk_nope_head_dim", json_integer(8));
    json_object_set_new(j, "qk_rope_head_dim", json_integer(8));
    json_object_set_new(j, "v_head_dim", json_integer(8));
    json_object_set_new(j, "initializer_range", json_real(0.3));
    return j;
}

/* A model of config j (taken) with weights N(0, initializer_range) from seed, every selection
 * bias N(0, 0.05) from seed + 1, so that it changes some choices, and every linear bias (HF
 * starts them at 0) N(0, initializer_range) from seed + 2. */
static trill_model *model_with_bias(json_t *j, uint64_t seed) {
    trill_config c;
    assert_int_equal(trill_config_from_json(j, "test", &c), TRILL_OK);
    json_decref(j);
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    trill_model_init_random(m, seed);
    size_t n;
    const trill_param *t = trill_model_tensors(m, &n);
    for (size_t i = 0; i < n; i++)
        if (t[i].kind == TRILL_TENSOR_BIAS)
            for (size_t k = 0; k < t[i].numel; k++) t[i].data[k] = 0.05f * (float)trill_rng_normal(seed + 1, i * 1000 + k);
        else if (t[i].kind == TRILL_TENSOR_LINEAR_BIAS)
            for (size_t k = 0; k < t[i].numel; k++) t[i].data[k] = (float)c.initializer_range * (float)trill_rng_normal(seed + 2, i * 1000 + k);
    return m;
}

trill_model *test_small_deepseek(uint64_t seed) { return model_with_bias(test_small_deepseek_json(), seed); }

json_t *test_small_mixtral_json(void) {
    json_t *j = trill_config_preset("mixtral-tiny");
    json_object_set_new(j, "hidden_size", json_integer(32));
    json_object_set_new(j, "head_dim", json_integer(8));
    json_object_set_new(j, "intermediate_size", json_integer(16));
    json_object_set_new(j, "num_hidden_layers", json_integer(3));
    json_object_set_new(j, "initializer_range", json_real(0.3));
    return j;
}

trill_model *test_small_mixtral(uint64_t seed) { return model_with_bias(test_small_mixtral_json(), seed); }

json_t *test_small_glm_json(void) {
    json_t *j = trill_config_preset("glm45-tiny");
    json_object_set_new(j, "hidden_size", json_integer(32));
    json_object_set_new(j, "head_dim", json_integer(8));
    json_object_set_new(j, "intermediate_size", json_integer(48));
    json_object_set_new(j, "moe_intermediate_size", json_integer(16));
    json_object_set_new(j, "n_routed_experts", json_integer(8));
    json_object_set_new(j, "num_experts_per_tok", json_integer(2));
    json_object_set_new(j, "initializer_range", json_real(0.3));
    return j;
}

trill_model *test_small_glm(uint64_t seed) { return model_with_bias(test_small_glm_json(), seed); }

json_t *test_small_gptoss_json(void) {
    json_t *j = trill_config_preset("gptoss-tiny");
    json_object_set_new(j, "hidden_size", json_integer(32));
    json_object_set_new(j, "head_dim", json_integer(8));
    json_object_set_new(j, "intermediate_size", json_integer(16));
    json_object_set_new(j, "num_hidden_layers", json_integer(3));
    json_object_set_new(j, "sliding_window", json_integer(5));
    json_object_set_new(j, "swiglu_limit", json_real(0.5)); /* small: both clamps cut */
    json_object_set_new(j, "initializer_range", json_real(0.3));
    return j;
}

trill_model *test_small_gptoss(uint64_t seed) { return model_with_bias(test_small_gptoss_json(), seed); }

json_t *test_small_qwen3next_json(void) {
    json_t *j = trill_config_preset("qwen3next-tiny");
    json_object_set_new(j, "hidden_size", json_integer(32));
    json_object_set_new(j, "head_dim", json_integer(8));
    json_object_set_new(j, "partial_rotary_factor", json_real(0.5));
    json_object_set_new(j, "intermediate_size", json_integer(32));
    json_object_set_new(j, "moe_intermediate_size", json_integer(16));
    json_object_set_new(j, "shared_expert_intermediate_size", json_integer(16));
    json_object_set_new(j, "linear_key_head_dim", json_integer(8));
    json_object_set_new(j, "linear_value_head_dim", json_integer(8));
    json_object_set_new(j, "full_attention_interval", json_integer(2));
    json_object_set_new(j, "mlp_only_layers", json_pack("[i]", 0));
    json_object_set_new(j, "attention_bias", json_true());
    json_object_set_new(j, "initializer_range", json_real(0.3));
    return j;
}

void test_json_set(json_t *j, const char *key, json_t *value) {
    json_t *text = json_object_get(j, "text_config");
    json_object_set_new(json_is_object(text) ? text : j, key, value);
}

json_t *test_small_qwen35_json(void) {
    json_t *j = trill_config_preset("qwen35-tiny");
    test_json_set(j, "hidden_size", json_integer(32));
    test_json_set(j, "head_dim", json_integer(8));
    test_json_set(j, "rope_parameters", json_pack("{s:s, s:f, s:f}", "rope_type", "default", "rope_theta", 10000.0, "partial_rotary_factor", 0.5));
    test_json_set(j, "moe_intermediate_size", json_integer(16));
    test_json_set(j, "shared_expert_intermediate_size", json_integer(16));
    test_json_set(j, "linear_key_head_dim", json_integer(8));
    test_json_set(j, "linear_value_head_dim", json_integer(8));
    test_json_set(j, "full_attention_interval", json_integer(2));
    test_json_set(j, "num_hidden_layers", json_integer(3));
    test_json_set(j, "initializer_range", json_real(0.3));
    return j;
}

static trill_model *with_gdn_vectors(trill_model *m, uint64_t seed);

trill_model *test_small_qwen35(uint64_t seed) { return with_gdn_vectors(model_with_bias(test_small_qwen35_json(), seed), seed); }

/* Its norms and Gated DeltaNet vectors drawn too: (1 + w) with w N(0, 0.1); the gated norm's 1 +
 * N(0, 0.1); dt_bias N(-2, 1), so the decay reaches from fast to slow. */
trill_model *test_small_qwen3next(uint64_t seed) { return with_gdn_vectors(model_with_bias(test_small_qwen3next_json(), seed), seed); }

static trill_model *with_gdn_vectors(trill_model *m, uint64_t seed) {
    size_t n;
    const trill_param *t = trill_model_tensors(m, &n);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; t[i].data && (t[i].kind == TRILL_TENSOR_NORM || t[i].kind == TRILL_TENSOR_DECAY) && k < t[i].numel; k++) {
            const float z = (float)trill_rng_normal(seed + 3, i * 1000 + k);
            if (t[i].kind == TRILL_TENSOR_DECAY) t[i].data[k] = strstr(t[i].name, "dt_bias") ? -2.0f + z : t[i].data[k];
            else t[i].data[k] += 0.1f * z;
        }
    return m;
}
