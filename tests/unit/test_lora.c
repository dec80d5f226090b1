/* LoRA adapters: the enable switch, PEFT files, merging, configuration errors. (Adapter
 * gradients are checked against PyTorch autograd in tests/train/grad_parity.sh.) */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "trill/fileio.h"
#include "model/lora_internal.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/rng.h"
#include "trill/train.h"


enum { T = 12 };
static const int TOKENS[T] = { 5, 9, 17, 3, 44, 2, 8, 8, 60, 1, 3, 7 };
static const int OFFSETS[3] = { 0, 5, 12 };

static void logprobs(const trill_model *m, float *lp) {
    assert_int_equal(trill_model_forward(m, TOKENS, OFFSETS, 2, NULL, lp, NULL), TRILL_OK);
}

static trill_lora_config all_targets(void) {
    trill_lora_config cfg = { .rank = 4, .alpha = 8 };
    assert_int_equal(trill_lora_parse_targets("q,k,v,o,gate,up,down,lm_head", &cfg.targets), 0);
    return cfg;
}

static void randomize_b(trill_lora *lora) {
    for (size_t t = 1; t < lora->n_tensors; t += 2) /* tensors alternate A, B */
        for (size_t i = 0; i < lora->tensors[t].numel; i++) lora->tensors[t].data[i] = 0.05f * (float)trill_rng_normal(7, t * 100003 + i);
}

static void test_switch_and_zero_init(void **state) {
    (void)state;
    trill_model *m = test_small_moe(21, false, true);
    float base[T], with[T], off[T];
    logprobs(m, base);
    trill_lora *lora;
    assert_int_equal(trill_lora_create(m, all_targets(), 1, &lora), TRILL_OK);
    assert_true(lora->scale == 2.0f);
    trill_model_attach_lora(m, lora);
    logprobs(m, with);
    assert_memory_equal(base, with, sizeof base); /* B = 0 at init: the model is unchanged */
    randomize_b(lora);
    logprobs(m, with);
    int differ = 0;
    for (int t = 1; t < T; t++) differ += t != 5 && with[t] != base[t];
    assert_int_equal(differ, 10);
    lora->enabled = false; /* the reference policy: the same weights, adapters off */
    logprobs(m, off);
    assert_memory_equal(base, off, sizeof base);
    trill_model_attach_lora(m, NULL);
    trill_lora_free(lora);
    trill_model_free(m);
}

static void test_peft_files_and_merge(void **state) {
    (void)state;
    char *dir = test_tmpdir("lora");
    trill_model *m = test_small_moe(21, false, true);
    trill_lora *lora, *back;
    trill_lora_config cfg = all_targets();
    cfg.use_rslora = true;
    assert_int_equal(trill_lora_create(m, cfg, 2, &lora), TRILL_OK);
    assert_true(fabsf(lora->scale - 4.0f) < 1e-6f); /* alpha / sqrt(r) */
    randomize_b(lora);
    assert_int_equal(trill_lora_save(lora, dir), TRILL_OK);
    assert_int_equal(trill_lora_load(m, dir, &back), TRILL_OK);
    assert_int_equal(back->n_params, lora->n_params);
    assert_memory_equal(back->params, lora->params, lora->n_params * sizeof(float));
    assert_true(back->config.use_rslora && back->config.rank == 4 && back->config.targets == cfg.targets);
    assert_string_equal(back->tensors[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    bool expert_named = false;
    for (size_t t = 0; t < back->n_tensors; t++)
        expert_named |= strcmp(back->tensors[t].name, "base_model.model.model.layers.2.mlp.experts.5.down_proj.lora_B.weight") == 0;
    assert_true(expert_named);

    float adapted[T], merged[T];
    trill_model_attach_lora(m, back);
    logprobs(m, adapted);
    trill_model_attach_lora(m, NULL);
    assert_int_equal(trill_lora_merge(back, m), TRILL_OK);
    logprobs(m, merged);
    for (int t = 1; t < T; t++)
        if (t != 5) assert_true(fabsf(adapted[t] - merged[t]) < 1e-5f);
    trill_lora_free(back);

    /* an adapter whose file lacks a tensor its config targets: the tensor is named */
    trill_lora_config fewer = { .rank = 4, .alpha = 8 };
    assert_int_equal(trill_lora_parse_targets("q", &fewer.targets), 0);
    trill_lora *small;
    assert_int_equal(trill_lora_create(m, fewer, 3, &small), TRILL_OK);
    char *weights = trill_path_join(dir, "adapter_model.safetensors"), *saved = trill_path_join(dir, "q_only.safetensors");
    assert_int_equal(trill_lora_save(small, dir), TRILL_OK); /* q-only weights ... */
    assert_int_equal(rename(weights, saved), 0);
    assert_int_equal(trill_lora_save(lora, dir), TRILL_OK); /* ... under an all-targets config */
    assert_int_equal(rename(saved, weights), 0);
    assert_int_equal(trill_lora_load(m, dir, &back), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "missing tensor \"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight\""));
    free(weights);
    free(saved);
    trill_lora_free(small);
    trill_lora_free(lora);
    trill_model_free(m);
    test_rmdir(dir);
    free(dir);
}

static void test_config_errors(void **state) {
    (void)state;
    unsigned targets;
    assert_int_equal(trill_lora_parse_targets("q_proj, down", &targets), 0);
    assert_int_equal(targets, (1u << TRILL_LORA_Q) | (1u << TRILL_LORA_DOWN));
    assert_int_equal(trill_lora_parse_targets("all-linear", &targets), 0);
    assert_int_equal(targets, TRILL_LORA_ALL_LINEAR);
    assert_int_equal(trill_lora_parse_targets("q,router", &targets), -1);
    assert_non_null(strstr(trill_error_message(), "unknown module \"router\""));

    trill_model *m = test_small_moe(21, true, true);
    trill_lora *lora;
    trill_lora_config cfg = all_targets();
    assert_int_equal(trill_lora_create(m, cfg, 1, &lora), TRILL_ERR_UNSUPPORTED);
    assert_non_null(strstr(trill_error_message(), "lm_head is tied"));
    cfg.rank = 0;
    assert_int_equal(trill_lora_create(m, cfg, 1, &lora), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "lora.rank"));
    trill_model_free(m);
}

/* A bf16 checkpoint under LoRA: the frozen base stays bf16 (no fp32 copy of the matrices) and
 * gives the log-probs and adapter gradients of the same values held in fp32. Weight gradients
 * and merging into it are refused. */
static void test_bf16_frozen_base(void **state) {
    (void)state;
    char *dir = test_tmpdir("bf16base");
    trill_model *src = test_small_moe(23, false, true);
    assert_int_equal(trill_model_save(src, dir, TRILL_BF16, 0), TRILL_OK);
    trill_model *f32, *b16, *plain;
    assert_int_equal(trill_model_load_as(dir, TRILL_STORE_F32, &f32), TRILL_OK);
    assert_int_equal(trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &b16), TRILL_OK);
    assert_int_equal(f32->storage, TRILL_F32);
    assert_int_equal(b16->storage, TRILL_BF16);
    assert_non_null(b16->params_bf16);
    assert_int_equal(b16->n_params, f32->n_params);
    assert_true(b16->n_f32 < b16->n_params / 20); /* only the norm vectors stay fp32 */
    assert_int_equal(b16->n_f32 + b16->n_bf16, b16->n_params);

    float lp32[T], lp16[T];
    uint16_t ex32[T * 3 * 2], ex16[T * 3 * 2];
    assert_int_equal(trill_model_forward(f32, TOKENS, OFFSETS, 2, NULL, lp32, ex32), TRILL_OK);
    assert_int_equal(trill_model_forward(b16, TOKENS, OFFSETS, 2, NULL, lp16, ex16), TRILL_OK);
    for (int t = 1; t < T; t++)
        if (t != 5) assert_true(fabsf(lp32[t] - lp16[t]) <= 1e-6f);
    assert_memory_equal(ex32, ex16, sizeof ex32);

    /* one adapter set, attached to each in turn: the same gradients */
    trill_lora *lora;
    assert_int_equal(trill_lora_create(f32, all_targets(), 3, &lora), TRILL_OK);
    randomize_b(lora);
    float *g[2], coef[T];
    for (int t = 0; t < T; t++) coef[t] = (float)((t * 37) % 11) / 5.0f - 1.0f;
    trill_model *both[2] = { f32, b16 };
    for (int i = 0; i < 2; i++) {
        trill_model_attach_lora(both[i], lora);
        trill_forward_pass *pass;
        assert_int_equal(trill_model_forward_train(both[i], TOKENS, OFFSETS, 2, NULL, lp32, NULL, false, &pass), TRILL_OK);
        g[i] = calloc(lora->n_params, sizeof(float));
        assert_int_equal(trill_model_backward(pass, coef, NULL, g[i]), TRILL_OK);
        if (i == 1) { /* frozen means frozen: no weight gradients from a bf16 base */
            float *full = calloc(b16->n_params, sizeof(float));
            assert_int_equal(trill_model_backward(pass, coef, full, NULL), TRILL_ERR_INVALID);
            free(full);
        }
        trill_forward_pass_free(pass);
        trill_model_attach_lora(both[i], NULL);
    }
    double worst = 0, scale = 0;
    for (size_t i = 0; i < lora->n_params; i++) {
        worst = fmax(worst, fabs((double)g[0][i] - g[1][i]));
        scale = fmax(scale, fabs((double)g[0][i]));
    }
    assert_true(scale > 0);
    assert_true(worst <= 1e-5 * scale);
    assert_int_equal(trill_lora_merge(lora, b16), TRILL_ERR_INVALID);

    /* saved again as bf16 it is the same file content; an fp32 checkpoint stays fp32 */
    char *again = test_tmpdir("bf16again");
    assert_int_equal(trill_model_save(b16, again, TRILL_BF16, 0), TRILL_OK);
    assert_int_equal(trill_model_load_as(again, TRILL_STORE_F32, &plain), TRILL_OK);
    assert_memory_equal(plain->params, f32->params, f32->n_params * sizeof(float));
    trill_model_free(plain);
    assert_int_equal(trill_model_save(src, again, TRILL_F32, 0), TRILL_OK);
    assert_int_equal(trill_model_load_as(again, TRILL_STORE_CHECKPOINT, &plain), TRILL_OK);
    assert_int_equal(plain->storage, TRILL_F32);
    trill_model_free(plain);

    free(g[0]);
    free(g[1]);
    trill_lora_free(lora);
    trill_model_free(src);
    trill_model_free(f32);
    trill_model_free(b16);
    test_rmdir(dir);
    test_rmdir(again);
    free(dir);
    free(again);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_switch_and_zero_init),
        cmocka_unit_test(test_peft_files_and_merge),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_bf16_frozen_base),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
