/* Sequence-classification checkpoints (reward models): config parsing of the label count, the
 * score head in the layout and checkpoints, the last-token hidden states of a packed batch,
 * and trill_reward_model's loading, scoring and refusals. */
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
#include "model/config_json.h"
#include "trill/config.h"
#include "base/json.h"
#include "model/model_internal.h"
#include "trill/model.h"
#include "trill/reward_model.h"
#include "text/tokenizer_json.h"
#include "trill/tokenizer.h"

/* The test_small_moe config as a classifier (architectures, then `extra` fields merged in). */
static json_t *classifier_json(const char *arch, const char *extra) {
    json_t *j = test_small_moe_json();
    if (strstr(arch, "Moe") == NULL) json_object_set_new(j, "model_type", json_string("qwen3"));
    json_object_set_new(j, "architectures", json_pack("[s]", arch));
    if (extra) {
        json_error_t err;
        json_t *e = json_loads(extra, 0, &err);
        assert_non_null(e);
        json_object_update(j, e);
        json_decref(e);
    }
    return j;
}

static trill_status parse(const char *arch, const char *extra, trill_config *c) {
    json_t *j = classifier_json(arch, extra);
    trill_status st = trill_config_from_json(j, "cfg.json", c);
    json_decref(j);
    return st;
}

static void expect_refused(const char *arch, const char *extra, const char *needle) {
    trill_config c;
    trill_status st = parse(arch, extra, &c);
    if (st == TRILL_OK || !strstr(trill_error_message(), needle))
        fail_msg("%s %s: expected an error containing \"%s\", got %s: %s", arch, extra ? extra : "", needle, trill_status_name(st),
                 trill_error_message());
}

static trill_model *small_classifier(const char *arch, const char *extra, uint64_t seed) {
    trill_config c;
    assert_int_equal(parse(arch, extra, &c), TRILL_OK);
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    trill_model_init_random(m, seed);
    return m;
}

static void test_config_num_labels(void **state) {
    (void)state;
    trill_config c;
    assert_int_equal(parse("Qwen3MoeForSequenceClassification", "{\"id2label\": {\"0\": \"LABEL_0\"}}", &c), TRILL_OK);
    assert_int_equal(c.num_labels, 1);
    assert_int_equal(c.arch, TRILL_ARCH_QWEN3_MOE);
    assert_int_equal(c.pad_token_id, -1);
    assert_string_equal(trill_config_architecture(&c), "Qwen3MoeForSequenceClassification");
    assert_int_equal(parse("Qwen3ForSequenceClassification", "{\"id2label\": {\"2\": \"c\", \"0\": \"a\", \"1\": \"b\"}, \"pad_token_id\": 5}", &c),
                     TRILL_OK);
    assert_int_equal(c.num_labels, 3);
    assert_int_equal(c.arch, TRILL_ARCH_QWEN3);
    assert_int_equal(c.pad_token_id, 5);
    assert_string_equal(trill_config_architecture(&c), "Qwen3ForSequenceClassification");
    /* HF PretrainedConfig: without id2label, "num_labels", else 2 */
    assert_int_equal(parse("Qwen3ForSequenceClassification", NULL, &c), TRILL_OK);
    assert_int_equal(c.num_labels, 2);
    assert_int_equal(parse("Qwen3ForSequenceClassification", "{\"num_labels\": 1}", &c), TRILL_OK);
    assert_int_equal(c.num_labels, 1);
    assert_int_equal(parse("Qwen3ForSequenceClassification", "{\"num_labels\": 1, \"id2label\": {\"0\": \"x\"}}", &c), TRILL_OK);
    /* a causal LM: no labels, id2label and pad_token_id ignored (HF configs often carry them) */
    assert_int_equal(parse("Qwen3MoeForCausalLM", "{\"id2label\": {\"0\": \"a\", \"1\": \"b\"}, \"pad_token_id\": 100000}", &c), TRILL_OK);
    assert_int_equal(c.num_labels, 0);
    assert_int_equal(c.pad_token_id, -1);
    assert_string_equal(trill_config_architecture(&c), "Qwen3MoeForCausalLM");

    const char *cls = "Qwen3ForSequenceClassification";
    expect_refused(cls, "{\"id2label\": [\"a\"]}", "field \"id2label\": expected an object");
    expect_refused(cls, "{\"id2label\": {}}", "field \"id2label\": 0 labels");
    expect_refused(cls, "{\"id2label\": {\"x\": \"a\"}}", "key \"x\": expected a label id in [0, 1)");
    expect_refused(cls, "{\"id2label\": {\"1\": \"a\"}}", "key \"1\": expected a label id in [0, 1)");
    expect_refused(cls, "{\"id2label\": {\"00\": \"a\"}}", "key \"00\"");
    expect_refused(cls, "{\"id2label\": {\"-0\": \"a\"}}", "key \"-0\"");
    expect_refused(cls, "{\"id2label\": {\"0\": 7}}", "key \"0\": expected a label name (string)");
    expect_refused(cls, "{\"id2label\": {\"0\": \"a\"}, \"num_labels\": 2}", "field \"num_labels\": 2 disagrees with the 1 labels");
    expect_refused(cls, "{\"num_labels\": 0}", "field \"num_labels\"");
    expect_refused(cls, "{\"pad_token_id\": 128}", "field \"pad_token_id\"");
    json_t *both = classifier_json(cls, NULL);
    json_object_set_new(both, "architectures", json_pack("[s, s]", "Qwen3ForCausalLM", cls));
    assert_int_equal(trill_config_from_json(both, "cfg.json", &c), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "names both"));
    json_decref(both);
    expect_refused("Qwen3MoeForSequenceClassification", "{\"model_type\": \"qwen3\"}", "not supported for model_type \"qwen3\"");
    expect_refused("LlamaForSequenceClassification", NULL, "\"LlamaForSequenceClassification\" is not supported");

    /* config.json written back parses to the same config */
    assert_int_equal(parse("Qwen3MoeForSequenceClassification", "{\"id2label\": {\"0\": \"reward\"}, \"pad_token_id\": 0}", &c), TRILL_OK);
    json_t *out = trill_config_to_json(&c, "float32");
    assert_string_equal(json_string_value(json_array_get(json_object_get(out, "architectures"), 0)), "Qwen3MoeForSequenceClassification");
    assert_int_equal(json_object_size(json_object_get(out, "id2label")), 1);
    trill_config back;
    assert_int_equal(trill_config_from_json(out, "written", &back), TRILL_OK);
    assert_int_equal(back.num_labels, 1);
    assert_int_equal(back.pad_token_id, 0);
    json_decref(out);
    /* a causal LM's config.json has no label fields */
    assert_int_equal(parse("Qwen3MoeForCausalLM", NULL, &c), TRILL_OK);
    out = trill_config_to_json(&c, NULL);
    assert_null(json_object_get(out, "id2label"));
    assert_null(json_object_get(out, "pad_token_id"));
    json_decref(out);
}

static const trill_param *find(const trill_model *m, const char *name) {
    for (size_t t = 0; t < m->n_tensors; t++)
        if (strcmp(m->tensors[t].name, name) == 0) return &m->tensors[t];
    return NULL;
}

static void test_layout_has_score_head(void **state) {
    (void)state;
    for (int tied = 0; tied < 2; tied++) {
        trill_model *m = small_classifier("Qwen3MoeForSequenceClassification",
                                          tied ? "{\"num_labels\": 1, \"tie_word_embeddings\": true}" : "{\"num_labels\": 1}", 1);
        const trill_param *last = &m->tensors[m->n_tensors - 1];
        assert_string_equal(last->name, "score.weight");
        assert_int_equal(last->ndim, 2);
        assert_int_equal(last->shape[0], 1);
        assert_int_equal(last->shape[1], 32);
        assert_ptr_equal(m->score.f32, last->data);
        assert_null(find(m, "lm_head.weight"));
        assert_null(m->lm_head.f32);
        assert_null(m->lm_head.bf16);
        assert_true(m->score.f32 != m->embed.f32); /* never tied */
        int64_t total, active;
        trill_config_param_counts(&m->config, &total, &active);
        assert_int_equal((size_t)total, m->n_params);
        trill_model_free(m);
    }
    trill_model *m = small_classifier("Qwen3ForSequenceClassification", "{\"id2label\": {\"0\": \"a\", \"1\": \"b\", \"2\": \"c\"}}", 1);
    assert_int_equal(m->tensors[m->n_tensors - 1].shape[0], 3);
    trill_model_free(m);
}

static void test_save_load_roundtrip(void **state) {
    (void)state;
    char *dir = test_tmpdir("rm-save");
    trill_model *m = small_classifier("Qwen3MoeForSequenceClassification", "{\"num_labels\": 1, \"pad_token_id\": 0}", 2), *back;
    assert_int_equal(trill_model_save(m, dir, TRILL_F32, 0), TRILL_OK);
    assert_int_equal(trill_model_load(dir, &back), TRILL_OK);
    assert_int_equal(back->config.num_labels, 1);
    assert_int_equal(back->config.pad_token_id, 0);
    assert_int_equal(back->n_params, m->n_params);
    assert_memory_equal(back->params, m->params, m->n_params * sizeof(float));
    assert_non_null(find(back, "score.weight"));
    trill_model_free(back);
    /* sharded bf16, kept as bf16 by the checkpoint storage: score.weight too */
    assert_int_equal(trill_model_save(m, dir, TRILL_BF16, 20000), TRILL_OK);
    assert_int_equal(trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &back), TRILL_OK);
    assert_non_null(back->score.bf16);
    for (int i = 0; i < 32; i++) assert_true(fabsf(trill_bf16_to_f32(back->score.bf16[i]) - m->score.f32[i]) <= fabsf(m->score.f32[i]) / 128);
    trill_model_free(back);
    test_rmdir(dir);

    /* a causal LM checkpoint under a classifier config.json: score.weight is missing */
    trill_model *lm = test_small_moe(2, false, true);
    assert_int_equal(trill_model_save(lm, dir, TRILL_F32, 0), TRILL_OK);
    json_t *cj = trill_config_to_json(&m->config, "float32");
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(trill_json_write_file(path, cj), TRILL_OK);
    assert_int_not_equal(trill_model_load(dir, &back), TRILL_OK);
    assert_non_null(strstr(trill_error_message(), "missing tensor \"score.weight\" (expected shape [1, 32]"));
    /* and a causal config over a classifier checkpoint: lm_head.weight missing */
    assert_int_equal(trill_model_save(m, dir, TRILL_F32, 0), TRILL_OK);
    json_decref(cj);
    cj = trill_config_to_json(&lm->config, "float32");
    assert_int_equal(trill_json_write_file(path, cj), TRILL_OK);
    assert_int_not_equal(trill_model_load(dir, &back), TRILL_OK);
    assert_non_null(strstr(trill_error_message(), "lm_head.weight"));
    json_decref(cj);
    trill_model_free(lm);
    trill_model_free(m);
    test_rmdir(dir);
    free(dir);
}

static float max_rel_diff(const float *a, const float *b, size_t n) {
    float scale = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        scale = fmaxf(scale, fabsf(b[i]));
        d = fmaxf(d, fabsf(a[i] - b[i]));
    }
    return d / fmaxf(scale, 1e-30f);
}

static void test_last_hidden_packed_equals_alone(void **state) {
    (void)state;
    trill_model *m = small_classifier("Qwen3MoeForSequenceClassification", "{\"num_labels\": 1}", 3);
    enum { N = 4, H = 32 };
    const int lens[N] = { 1, 9, 30, 5 };
    int offsets[N + 1] = { 0 }, tokens[64];
    for (int s = 0; s < N; s++) offsets[s + 1] = offsets[s] + lens[s];
    for (int t = 0; t < offsets[N]; t++) tokens[t] = (t * 37 + 11) % 128;
    float packed[N * H], alone[H];
    assert_int_equal(trill_model_forward_last_hidden(m, tokens, offsets, N, packed), TRILL_OK);
    for (int s = 0; s < N; s++) {
        const int one[2] = { 0, lens[s] };
        assert_int_equal(trill_model_forward_last_hidden(m, tokens + offsets[s], one, 1, alone), TRILL_OK);
        assert_true(max_rel_diff(packed + s * H, alone, H) < 1e-5f);
    }
    /* the final norm's output: RMS of hidden / norm weight (1 at init) is 1 */
    double ss = 0;
    for (int i = 0; i < H; i++) ss += (double)packed[i] * packed[i];
    assert_true(fabs(sqrt(ss / H) - 1.0) < 1e-3);
    /* refusals: an empty sequence, a token outside the vocabulary; the LM forward */
    const int empty[3] = { 0, 3, 3 };
    assert_int_equal(trill_model_forward_last_hidden(m, tokens, empty, 2, packed), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "sequence 1 is empty"));
    const int bad[2] = { 5, 128 }, one2[2] = { 0, 2 };
    assert_int_equal(trill_model_forward_last_hidden(m, bad, one2, 1, packed), TRILL_ERR_INVALID);
    float lp[64];
    assert_int_equal(trill_model_forward(m, tokens, offsets, N, NULL, lp, NULL), TRILL_ERR_UNSUPPORTED);
    assert_non_null(strstr(trill_error_message(), "no lm_head"));
    trill_model_free(m);
}

/* On a causal LM the last hidden state of a prefix, through lm_head, gives the log-prob the
 * LM forward reports for the next token: the same layers, the same final norm. */
static void test_last_hidden_matches_lm_forward(void **state) {
    (void)state;
    trill_model *m = test_small_moe(4, false, true);
    enum { T = 12, H = 32, V = 128 };
    int tokens[T], offsets[2] = { 0, T }, prefix[2] = { 0, T - 1 };
    for (int t = 0; t < T; t++) tokens[t] = (t * 53 + 7) % V;
    float lp[T], h[H];
    assert_int_equal(trill_model_forward(m, tokens, offsets, 1, NULL, lp, NULL), TRILL_OK);
    assert_int_equal(trill_model_forward_last_hidden(m, tokens, prefix, 1, h), TRILL_OK);
    double logits[V], mx = -INFINITY, sum = 0;
    for (int v = 0; v < V; v++) {
        logits[v] = 0;
        for (int i = 0; i < H; i++) logits[v] += (double)h[i] * m->lm_head.f32[(size_t)v * H + i];
        mx = fmax(mx, logits[v]);
    }
    for (int v = 0; v < V; v++) sum += exp(logits[v] - mx);
    const double want = logits[tokens[T - 1]] - mx - log(sum);
    assert_true(fabs(want - lp[T - 1]) < 1e-4);
    trill_model_free(m);
}

/* A reward-model folder: classifier weights + the character-level tokenizer. */
static char *write_reward_model(const char *extra, trill_dtype dtype, trill_model **model) {
    char *dir = test_tmpdir("rm");
    trill_model *m = small_classifier("Qwen3MoeForSequenceClassification", extra, 5);
    assert_int_equal(trill_model_save(m, dir, dtype, 0), TRILL_OK);
    json_t *tok = trill_tokenizer_charlevel_json();
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(trill_json_write_file(path, tok), TRILL_OK);
    json_decref(tok);
    if (model) *model = m;
    else trill_model_free(m);
    return dir;
}

/* The character-level tokenizer's ids: "\n" 2, printable ASCII c at 3 + c - 32. */
static double score_alone(const trill_model *m, const char *text) {
    int ids[8192], n = 0;
    for (const char *p = text; *p; p++) ids[n++] = *p == '\n' ? 2 : 3 + *p - 32;
    const int offsets[2] = { 0, n };
    float h[32];
    assert_int_equal(trill_model_forward_last_hidden(m, ids, offsets, 1, h), TRILL_OK);
    double s = 0;
    for (int i = 0; i < 32; i++) s += (double)h[i] * m->score.f32[i];
    return s;
}

static void test_reward_model_scores(void **state) {
    (void)state;
    trill_model *m;
    char *dir = write_reward_model("{\"id2label\": {\"0\": \"LABEL_0\"}}", TRILL_F32, &m);
    trill_reward_model *rm;
    assert_int_equal(trill_reward_model_load(dir, &rm), TRILL_OK);
    assert_int_equal(trill_reward_model_model(rm)->config.num_labels, 1);
    /* three texts long enough to need two packed batches, between short ones */
    char *long_text[3];
    for (int k = 0; k < 3; k++) {
        long_text[k] = malloc(2001);
        for (int i = 0; i < 2000; i++) long_text[k][i] = (char)(' ' + (i * (7 + k) + k) % 95);
        long_text[k][2000] = 0;
    }
    const char *texts[] = { "Hello, world!", long_text[0], "a", long_text[1], "Q: 2+2?\nA: 4", long_text[2] };
    enum { N = sizeof texts / sizeof texts[0] };
    double scores[N];
    assert_int_equal(trill_reward_model_score(rm, texts, N, scores), TRILL_OK);
    for (int i = 0; i < N; i++) {
        const double want = score_alone(m, texts[i]);
        assert_true(fabs(scores[i] - want) <= 1e-5 * fmax(1.0, fabs(want)));
    }
    assert_true(scores[0] != scores[2]);
    /* refusals: an empty text; scoring nothing is fine */
    const char *empty[] = { "ok", "" };
    assert_int_equal(trill_reward_model_score(rm, empty, 2, scores), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "text 1 is empty"));
    assert_int_equal(trill_reward_model_score(rm, texts, 0, scores), TRILL_OK);
    trill_reward_model_free(rm);
    for (int k = 0; k < 3; k++) free(long_text[k]);
    test_rmdir(dir);
    free(dir);
    trill_model_free(m);

    /* HF pools at the last token that is not pad_token_id (here the space, id 3) */
    dir = write_reward_model("{\"num_labels\": 1, \"pad_token_id\": 3}", TRILL_BF16, NULL);
    assert_int_equal(trill_reward_model_load(dir, &rm), TRILL_OK);
    assert_non_null(trill_reward_model_model(rm)->score.bf16); /* bf16 checkpoint kept as bf16 */
    const char *padded[] = { "abc", "abc   ", "   ", " " };
    double s[4];
    assert_int_equal(trill_reward_model_score(rm, padded, 4, s), TRILL_OK);
    /* equal up to where in the packed batch the rows fall (GEMM edge tiles) */
    assert_true(fabs(s[0] - s[1]) <= 1e-5 * fabs(s[0]));
    assert_true(fabs(s[2] - s[3]) <= 1e-5 * fabs(s[2])); /* all pad: the first token */
    assert_true(fabs(s[0] - s[2]) > 1e-3 * fabs(s[0]));
    trill_reward_model_free(rm);
    test_rmdir(dir);
    free(dir);
}

static void test_reward_model_refusals(void **state) {
    (void)state;
    trill_reward_model *rm = NULL;
    /* a causal LM */
    char *dir = test_tmpdir("rm-lm");
    trill_model *lm = test_small_moe(6, false, true);
    assert_int_equal(trill_model_save(lm, dir, TRILL_F32, 0), TRILL_OK);
    trill_model_free(lm);
    assert_int_equal(trill_reward_model_load(dir, &rm), TRILL_ERR_UNSUPPORTED);
    assert_non_null(strstr(trill_error_message(), "Qwen3MoeForCausalLM is a causal LM, not a reward model"));
    test_rmdir(dir);
    free(dir);
    /* two labels */
    dir = write_reward_model(NULL, TRILL_F32, NULL);
    assert_int_equal(trill_reward_model_load(dir, &rm), TRILL_ERR_UNSUPPORTED);
    assert_non_null(strstr(trill_error_message(), "a reward model has one label, this Qwen3MoeForSequenceClassification has 2"));
    test_rmdir(dir);
    free(dir);
    /* no tokenizer.json */
    dir = write_reward_model("{\"num_labels\": 1}", TRILL_F32, NULL);
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    remove(path);
    assert_int_not_equal(trill_reward_model_load(dir, &rm), TRILL_OK);
    assert_non_null(strstr(trill_error_message(), "tokenizer.json"));
    test_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_num_labels),
        cmocka_unit_test(test_layout_has_score_head),
        cmocka_unit_test(test_save_load_roundtrip),
        cmocka_unit_test(test_last_hidden_packed_equals_alone),
        cmocka_unit_test(test_last_hidden_matches_lm_forward),
        cmocka_unit_test(test_reward_model_scores),
        cmocka_unit_test(test_reward_model_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
