/* Model layout, checkpoints round trip, and properties of the reference forward that
 * must hold whatever the weights: causality, batch independence, normalisation. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "trill/config.h"
#include "trill/fileio.h"
#include "trill/kernels.h"
#include "arch/decoder.h"
#include "model/model_internal.h"
#include "trill/model.h"
#include "trill/safetensors.h"

static void test_layout_and_layer_map(void **state) {
    (void)state;
    trill_model *m = test_small_moe(1, false, true);
    const trill_config *c = &m->config;
    assert_int_equal(c->n_moe_layers, 3);
    assert_int_equal(c->moe_ordinal[0], -1);
    assert_int_equal(c->moe_ordinal[1], 0);
    assert_int_equal(c->moe_ordinal[3], 2);
    assert_int_equal(c->moe_layer[0], 1);
    int64_t total, active;
    trill_config_param_counts(c, &total, &active);
    assert_int_equal((size_t)total, m->n_params); /* the analytic count matches the layout */
    assert_true(active < total);
    /* names in HF form, slices tile the block in order */
    assert_string_equal(m->tensors[0].name, "model.embed_tokens.weight");
    assert_string_equal(m->tensors[m->n_tensors - 1].name, "lm_head.weight");
    size_t offset = 0;
    for (size_t t = 0; t < m->n_tensors; t++) {
        assert_ptr_equal(m->tensors[t].data, m->params + offset);
        offset += m->tensors[t].numel;
    }
    assert_int_equal(offset, m->n_params);
    const trill_param *e7 = NULL;
    for (size_t t = 0; t < m->n_tensors; t++)
        if (strcmp(m->tensors[t].name, "model.layers.2.mlp.experts.7.down_proj.weight") == 0) e7 = &m->tensors[t];
    assert_non_null(e7);
    assert_int_equal(e7->shape[0], 32);
    assert_int_equal(e7->shape[1], 16);
    assert_ptr_equal(e7->data, ((const trill_decoder_weights *)trill_model_layer(m, 2))->expert_down.f32 + 7 * 32 * 16);
    trill_model_free(m);

    m = test_small_moe(1, true, true);
    assert_ptr_equal(m->lm_head.f32, m->embed.f32);
    assert_string_equal(m->tensors[m->n_tensors - 1].name, "model.norm.weight");
    trill_model_free(m);
}

static void test_init_deterministic(void **state) {
    (void)state;
    trill_model *a = test_small_moe(7, false, true), *b = test_small_moe(7, false, true), *c = test_small_moe(8, false, true);
    assert_memory_equal(a->params, b->params, a->n_params * sizeof(float));
    assert_memory_not_equal(a->params, c->params, a->n_params * sizeof(float));
    assert_true(a->final_norm[0] == 1.0f); /* norms start at one, as in HF */
    double ss = 0;
    for (size_t i = 0; i < (size_t)a->config.vocab_size * 32; i++) ss += (double)a->embed.f32[i] * a->embed.f32[i];
    double std = sqrt(ss / (a->config.vocab_size * 32.0));
    assert_true(fabs(std - 0.3) < 0.015); /* initializer_range 0.3 */
    trill_model_free(a);
    trill_model_free(b);
    trill_model_free(c);
}

static void test_save_load_roundtrip(void **state) {
    (void)state;
    char *dir = test_tmpdir("model");
    trill_model *m = test_small_moe(3, false, true), *back;
    assert_int_equal(trill_model_save(m, dir, TRILL_F32, 0), TRILL_OK);
    assert_int_equal(trill_model_load(dir, &back), TRILL_OK);
    assert_int_equal(back->n_params, m->n_params);
    assert_memory_equal(back->params, m->params, m->n_params * sizeof(float));
    trill_model_free(back);

    /* bf16, sharded: values come back rounded to bf16 */
    assert_int_equal(trill_model_save(m, dir, TRILL_BF16, 20000), TRILL_OK);
    assert_int_equal(trill_model_load(dir, &back), TRILL_OK);
    assert_int_equal(back->checkpoint_dtype, TRILL_BF16);
    for (size_t i = 0; i < m->n_params; i += 97)
        assert_true(back->params[i] == trill_bf16_to_f32(trill_f32_to_bf16(m->params[i])));
    trill_model_free(back);
    trill_model_free(m);
    test_rmdir(dir);
    free(dir);
}

/* Rewrites DIR/model.safetensors without tensor `drop` and, if given, with an extra tensor. */
static void rewrite_checkpoint(const char *dir, trill_model *m, const char *drop, const char *extra,
                               const char *reshape) {
    trill_tensor_out *outs = calloc(m->n_tensors + 1, sizeof *outs);
    size_t n = 0;
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        if (drop && strcmp(p->name, drop) == 0) continue;
        outs[n] = (trill_tensor_out){ .name = p->name, .ndim = p->ndim, .data = p->data, .src_dtype = TRILL_F32 };
        memcpy(outs[n].shape, p->shape, sizeof p->shape);
        if (reshape && strcmp(p->name, reshape) == 0) { outs[n].shape[0] = p->shape[1]; outs[n].shape[1] = p->shape[0]; }
        n++;
    }
    if (extra) outs[n++] = (trill_tensor_out){ .name = extra, .ndim = 1, .shape = { 4 }, .data = m->params, .src_dtype = TRILL_F32 };
    char *path = trill_path_join(dir, "model.safetensors");
    assert_int_equal(trill_st_write(path, outs, n, TRILL_F32), TRILL_OK);
    free(path);
    free(outs);
}

static void test_load_rejects_mismatched_checkpoints(void **state) {
    (void)state;
    char *dir = test_tmpdir("badmodel");
    trill_model *m = test_small_moe(3, false, true), *back = NULL;
    assert_int_equal(trill_model_save(m, dir, TRILL_F32, 0), TRILL_OK);

    rewrite_checkpoint(dir, m, "model.layers.2.mlp.experts.5.up_proj.weight", NULL, NULL);
    assert_int_equal(trill_model_load(dir, &back), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "missing tensor \"model.layers.2.mlp.experts.5.up_proj.weight\""));

    rewrite_checkpoint(dir, m, NULL, "model.layers.0.mlp.gate.weight", NULL);
    assert_int_equal(trill_model_load(dir, &back), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "unexpected tensor \"model.layers.0.mlp.gate.weight\""));

    rewrite_checkpoint(dir, m, NULL, NULL, "model.layers.1.self_attn.k_proj.weight");
    assert_int_equal(trill_model_load(dir, &back), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "k_proj.weight\": shape [32, 16] does not match config.json (expected [16, 32])"));
    assert_null(back);
    trill_model_free(m);
    test_rmdir(dir);
    free(dir);
}

static void test_forward_properties(void **state) {
    (void)state;
    trill_model *m = test_small_moe(5, false, true);
    const int K = m->config.num_experts_per_tok, L = m->config.n_moe_layers, V = m->config.vocab_size;
    enum { LEN_A = 9, LEN_B = 20 };
    int tokens[LEN_A + LEN_B];
    for (int i = 0; i < LEN_A + LEN_B; i++) tokens[i] = (i * 37 + 11) % V;
    float lp_batch[LEN_A + LEN_B], lp_alone[LEN_B], lp_prefix[LEN_B];
    uint16_t ex_batch[(LEN_A + LEN_B) * 3 * 2], ex_alone[LEN_B * 3 * 2];

    int offsets[3] = { 0, LEN_A, LEN_A + LEN_B };
    assert_int_equal(trill_model_forward(m, tokens, offsets, 2, NULL, lp_batch, ex_batch), TRILL_OK);
    int alone[2] = { 0, LEN_B };
    assert_int_equal(trill_model_forward(m, tokens + LEN_A, alone, 1, NULL, lp_alone, ex_alone), TRILL_OK);
    assert_true(isnan(lp_batch[0]) && isnan(lp_batch[LEN_A]) && isnan(lp_alone[0]));
    for (int t = 1; t < LEN_B; t++) {
        assert_true(fabsf(lp_batch[LEN_A + t] - lp_alone[t]) < 1e-5f); /* batch-independent */
        assert_true(lp_alone[t] < 0.0f);
    }
    assert_memory_equal(ex_batch + LEN_A * L * K, ex_alone, sizeof ex_alone);
    /* causal: a prefix scores the same as the start of the longer sequence */
    int prefix[2] = { 0, 12 };
    assert_int_equal(trill_model_forward(m, tokens + LEN_A, prefix, 1, NULL, lp_prefix, NULL), TRILL_OK);
    for (int t = 1; t < 12; t++) assert_true(fabsf(lp_prefix[t] - lp_alone[t]) < 1e-5f);
    /* experts: in range, distinct per token */
    for (int t = 0; t < LEN_B; t++)
        for (int l = 0; l < L; l++) {
            const uint16_t *e = ex_alone + (t * L + l) * K;
            assert_true(e[0] < m->config.num_experts && e[1] < m->config.num_experts && e[0] != e[1]);
        }
    trill_model_free(m);
}

static void test_forward_rejects_bad_batches(void **state) {
    (void)state;
    trill_model *m = test_small_moe(5, false, true);
    int tokens[4] = { 1, 2, 500, 3 };
    float lp[4];
    int offsets[2] = { 0, 4 };
    assert_int_equal(trill_model_forward(m, tokens, offsets, 1, NULL, lp, NULL), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "position 2: token id 500 is outside the vocabulary [0, 128)"));
    int bad_offsets[3] = { 0, 3, 2 };
    tokens[2] = 5;
    assert_int_equal(trill_model_forward(m, tokens, bad_offsets, 2, NULL, lp, NULL), TRILL_ERR_INVALID);
    /* an empty sequence in the batch is fine and touches nothing */
    int with_empty[4] = { 0, 2, 2, 4 };
    lp[2] = 42.0f;
    assert_int_equal(trill_model_forward(m, tokens, with_empty, 3, NULL, lp, NULL), TRILL_OK);
    assert_true(isnan(lp[0]) && isnan(lp[2]) && !isnan(lp[1]) && !isnan(lp[3]));
    trill_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_layer_map),
        cmocka_unit_test(test_init_deterministic),
        cmocka_unit_test(test_save_load_roundtrip),
        cmocka_unit_test(test_load_rejects_mismatched_checkpoints),
        cmocka_unit_test(test_forward_properties),
        cmocka_unit_test(test_forward_rejects_bad_batches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
