/* The RL run's parts on their own: the metrics struct's one serializer, and the scorer executor
 * (verifier, external reward pool, failures) on a hand-made batch. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "rl/scorer.h"
#include "testutil.h"
#include "trill/rl.h"

/* ---- metrics ---- */

static void test_metrics_json_sync(void **state) {
    (void)state;
    trill_rl_metrics *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->step = 3;
    m->reward = 0.5;
    m->accuracy = NAN; /* no verifier: null */
    m->kl_ref = INFINITY;
    m->trained_seqs = 16;
    m->n_moe_layers = 2;
    m->flip_layer[0] = 0.25;
    m->flip_layer[1] = 0;
    m->sync_mode = TRILL_SYNC_MERGE;
    m->sync_bytes = 1234;
    m->policy_version = 7;
    m->n_ext = 1;
    snprintf(m->ext_name[0], sizeof m->ext_name[0], "len");
    m->ext_value[0] = 2.5;
    m->time.generate_s = 1.5;
    m->has_eval = true;
    m->eval_pass1 = 0.75;
    m->eval_passk = 1;
    char *line = trill_rl_metrics_json(m);
    assert_non_null(line);
    json_error_t err;
    json_t *j = json_loads(line, 0, &err);
    assert_non_null(j);
    /* names, values, nulls for figures that do not apply */
    assert_int_equal(json_integer_value(json_object_get(j, "step")), 3);
    assert_true(json_real_value(json_object_get(j, "reward")) == 0.5);
    assert_true(json_is_null(json_object_get(j, "accuracy")));
    assert_true(json_is_null(json_object_get(j, "kl_ref")));
    assert_string_equal(json_string_value(json_object_get(j, "sync_mode")), "merge");
    assert_int_equal(json_integer_value(json_object_get(j, "sync_bytes")), 1234);
    assert_int_equal(json_array_size(json_object_get(j, "flip_layer")), 2);
    assert_true(json_real_value(json_array_get(json_object_get(j, "flip_layer"), 0)) == 0.25);
    assert_true(json_real_value(json_object_get(j, "reward_ext_len")) == 2.5);
    assert_true(json_real_value(json_object_get(json_object_get(j, "time"), "generate_s")) == 1.5);
    assert_true(json_real_value(json_object_get(j, "eval_pass1")) == 0.75);
    /* the async fields only in async mode */
    assert_null(json_object_get(j, "staleness_max"));
    assert_null(json_object_get(j, "generator_apply_bytes"));
    assert_null(json_object_get(json_object_get(j, "time"), "interval_s"));
    /* the historical key order: step first, then the batch, the trainer, ..., time, eval */
    const char *keys[] = { "step", "reward", "accuracy", "response_len", "flat_groups", "trained_seqs", "loss" };
    const char *at = line;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", keys[i]);
        const char *p = strstr(at, quoted);
        assert_non_null(p);
        at = p;
    }
    assert_true(strstr(line, "\"time\"") < strstr(line, "\"eval_pass1\""));
    json_decref(j);
    free(line);
    free(m);
}

static void test_metrics_json_async(void **state) {
    (void)state;
    trill_rl_metrics *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->step = 1;
    m->async = true;
    m->batch = 4;
    m->staleness_max = 2;
    m->staleness_tokens[0] = 5;
    m->staleness_tokens[1] = 0;
    m->staleness_tokens[2] = 9;
    m->staleness_tokens[3] = 77; /* beyond staleness_max: not written */
    m->generator_apply_bytes = 42;
    m->time.interval_s = 0.5;
    char *line = trill_rl_metrics_json(m);
    assert_non_null(line);
    assert_non_null(strstr(line, "\"step\":1,\"batch\":4,"));
    assert_non_null(strstr(line, "\"staleness_tokens\":[5,0,9],"));
    assert_non_null(strstr(line, "\"interval_s\":0.5}"));
    assert_non_null(strstr(line, "},\"generator_apply_bytes\":42}"));
    assert_null(strstr(line, "eval_pass1"));
    free(line);
    free(m);
}

/* ---- the scorer ---- */

typedef struct fixture {
    trill_dataset data;
    trill_example ex[2];
    rl_batch b;
    char *completion[4];
    int example[4];
    double reward[4], correct[4];
} fixture;

/* Two prompts (answers "4" and "9"), two completions each. */
static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    f->ex[0] = (trill_example){ .prompt = "2+2=", .answer = "4" };
    f->ex[1] = (trill_example){ .prompt = "4+5=", .answer = "9" };
    f->data = (trill_dataset){ .path = "mem.jsonl", .n = 2, .examples = f->ex };
    static const char *const text[4] = { "4", "5", "9", "99" };
    for (int s = 0; s < 4; s++) {
        f->completion[s] = (char *)text[s];
        f->example[s] = s / 2;
    }
    f->b = (rl_batch){ .n_seqs = 4, .group_size = 2, .example = f->example, .completion = f->completion, .reward = f->reward,
                       .correct = f->correct };
}

static trill_rl_config base_config(void) {
    trill_rl_config c;
    assert_int_equal(trill_rl_config_defaults(&c), TRILL_OK);
    c.reward.verifier = TRILL_VERIFIER_EXACT;
    c.reward.verifier_weight = 2;
    return c;
}

static void test_scorer_verifier_and_external(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    trill_rl_config c = base_config();
    /* the completion's length as the reward, and as a metric */
    free(c.reward.external);
    c.reward.external = strdup("/usr/bin/python3 -c \"import json,sys\n"
                               "for l in sys.stdin:\n"
                               " c=json.loads(l)['completion']; print(json.dumps({'reward': len(c), 'metrics': {'n': 1}}), flush=True)\"");
    c.reward.external_weight = 0.5;
    c.reward.external_workers = 2;
    rl_scorer *s;
    assert_int_equal(trill_rl_scorer_create(&c, &f.data, &s), TRILL_OK);
    json_t *ext = json_object();
    assert_int_equal(trill_rl_scorer_score(s, &f.b, ext), TRILL_OK);
    const double want_correct[4] = { 1, 0, 1, 0 };
    for (int i = 0; i < 4; i++) {
        assert_true(f.correct[i] == want_correct[i]);
        assert_true(f.reward[i] == 2 * want_correct[i] + 0.5 * (double)strlen(f.completion[i]));
    }
    assert_true(json_number_value(json_object_get(ext, "n")) == 4); /* summed over the batch */
    json_decref(ext);
    trill_rl_scorer_free(s);
    trill_rl_config_free(&c);
}

/* A reward process that crashes on every request: after external_max_failures in a row the
 * batch fails with a message naming the command. */
static void test_scorer_failing_process(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    trill_rl_config c = base_config();
    free(c.reward.external);
    c.reward.external = strdup("read line; exit 3");
    c.reward.external_max_failures = 2;
    c.reward.external_workers = 1;
    rl_scorer *s;
    assert_int_equal(trill_rl_scorer_create(&c, &f.data, &s), TRILL_OK);
    json_t *ext = json_object();
    const trill_status st = trill_rl_scorer_score(s, &f.b, ext);
    assert_int_not_equal(st, TRILL_OK);
    if (!strstr(trill_error_message(), "read line; exit 3")) fail_msg("the message does not name the command: %s", trill_error_message());
    json_decref(ext);
    trill_rl_scorer_free(s);
    trill_rl_config_free(&c);
}

/* A weight that overflows the reward stops the batch naming the source and the key. */
static void test_scorer_nonfinite_reward(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    trill_rl_config c = base_config();
    c.reward.verifier_weight = INFINITY; /* inf x a score of 0 */
    rl_scorer *s;
    assert_int_equal(trill_rl_scorer_create(&c, &f.data, &s), TRILL_OK);
    json_t *ext = json_object();
    assert_int_equal(trill_rl_scorer_score(s, &f.b, ext), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "reward.verifier_weight"));
    json_decref(ext);
    trill_rl_scorer_free(s);
    trill_rl_config_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_json_sync),
        cmocka_unit_test(test_metrics_json_async),
        cmocka_unit_test(test_scorer_verifier_and_external),
        cmocka_unit_test(test_scorer_failing_process),
        cmocka_unit_test(test_scorer_nonfinite_reward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
