/* The embedded demo: its task generator, data files, and the cached warm start. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "trill/dataset.h"
#include "trill/demo.h"
#include "trill/fileio.h"
#include "trill/infer.h"
#include "model/model_internal.h"
#include "trill/model.h"
#include "trill/reward.h"
#include "trill/eval.h"
#include "trill/run_config.h"

static void test_problem_is_deterministic(void **state) {
    (void)state;
    int differs = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        int a, b, a2, b2, a3, b3;
        trill_demo_problem(7, 3, i, &a, &b);
        trill_demo_problem(7, 3, i, &a2, &b2);
        trill_demo_problem(8, 3, i, &a3, &b3);
        assert_int_equal(a, a2);
        assert_int_equal(b, b2);
        assert_true(a >= 0 && a < 100 && b >= 0 && b < 100);
        differs += a != a3 || b != b3;
    }
    assert_true(differs > 900); /* another seed, other problems */
}

/* The format the reward checks: "a+b=" -> the digits of the sum, nothing else on the line. */
static void test_format_matches_reward(void **state) {
    (void)state;
    char prompt[16], answer[8];
    trill_demo_format(47, 38, prompt, answer);
    assert_string_equal(prompt, "47+38=");
    assert_string_equal(answer, "85");
    trill_demo_format(99, 99, prompt, answer);
    assert_string_equal(prompt, "99+99=");
    assert_string_equal(answer, "198");
    trill_demo_format(0, 0, prompt, answer);
    assert_string_equal(answer, "0");
    assert_true(trill_reward_demo("85", "85") == 1.0);
    assert_true(trill_reward_demo("85\n12+3=15", "85") == 1.0);
    assert_true(trill_reward_demo("085", "85") == 0.0);
    assert_true(trill_reward_demo("8", "85") == 0.0);
    assert_true(trill_reward_demo("85 ", "85") == 0.0);
    assert_true(trill_reward_demo("", "85") == 0.0);
}

typedef struct line { int a, b; char answer[8]; } line;

/* Parses a data file of {"prompt": "a+b=", "answer": "..."} lines. */
static line *read_lines(const char *dir, const char *name, int *n) {
    char *path = trill_path_join(dir, name), *text;
    size_t len;
    assert_int_equal(trill_read_file(path, &text, &len), TRILL_OK);
    line *out = NULL;
    *n = 0;
    for (char *p = text; *p;) {
        char *nl = strchr(p, '\n');
        assert_non_null(nl);
        *nl = 0;
        out = realloc(out, sizeof *out * (size_t)(*n + 1));
        line *l = &out[*n];
        assert_int_equal(sscanf(p, "{\"prompt\": \"%d+%d=\", \"answer\": \"%7[0-9]\"}", &l->a, &l->b, l->answer), 3);
        char want[16];
        snprintf(want, sizeof want, "%d", l->a + l->b);
        assert_string_equal(l->answer, want);
        (*n)++;
        p = nl + 1;
    }
    free(text);
    free(path);
    return out;
}

static void test_data_is_deterministic_and_disjoint(void **state) {
    (void)state;
    trill_demo_options o = trill_demo_defaults();
    o.n_train = 3000;
    o.n_eval = 150;
    o.n_dev = 100;
    char *d1 = test_tmpdir("demo_data1"), *d2 = test_tmpdir("demo_data2");
    assert_int_equal(trill_demo_write_data(d1, &o), TRILL_OK);
    assert_int_equal(trill_demo_write_data(d2, &o), TRILL_OK);
    const char *names[] = { "train.jsonl", "eval.jsonl", "dev.jsonl" };
    for (int f = 0; f < 3; f++) { /* same options, same bytes */
        char *p1 = trill_path_join(d1, names[f]), *p2 = trill_path_join(d2, names[f]), *t1, *t2;
        size_t n1, n2;
        assert_int_equal(trill_read_file(p1, &t1, &n1), TRILL_OK);
        assert_int_equal(trill_read_file(p2, &t2, &n2), TRILL_OK);
        assert_int_equal(n1, n2);
        assert_memory_equal(t1, t2, n1);
        free(t1), free(t2), free(p1), free(p2);
    }
    int n_train, n_eval, n_dev;
    line *train = read_lines(d1, "train.jsonl", &n_train), *eval = read_lines(d1, "eval.jsonl", &n_eval),
         *dev = read_lines(d1, "dev.jsonl", &n_dev);
    assert_int_equal(n_train, 3000);
    assert_int_equal(n_eval, 150);
    assert_int_equal(n_dev, 100);
    static uint8_t held[100][100]; /* 1: eval, 2: dev */
    memset(held, 0, sizeof held);
    for (int i = 0; i < n_eval; i++) {
        assert_int_equal(held[eval[i].a][eval[i].b], 0); /* distinct */
        held[eval[i].a][eval[i].b] = 1;
    }
    for (int i = 0; i < n_dev; i++) {
        assert_int_equal(held[dev[i].a][dev[i].b], 0); /* distinct, and not in eval */
        held[dev[i].a][dev[i].b] = 2;
    }
    int distinct_train = 0;
    static uint8_t seen[100][100];
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < n_train; i++) {
        assert_int_equal(held[train[i].a][train[i].b], 0); /* never a held-out prompt */
        distinct_train += !seen[train[i].a][train[i].b];
        seen[train[i].a][train[i].b] = 1;
    }
    assert_true(distinct_train > 2000); /* spread over the ~10^4 problems */
    free(train), free(eval), free(dev);
    test_rmdir(d1);
    test_rmdir(d2);
    free(d1), free(d2);
}

static bool exists_in(const char *dir, const char *name) {
    char *p = trill_path_join(dir, name);
    bool e = trill_file_exists(p);
    free(p);
    return e;
}

/* A very short warm start: the model loads, a second call is a cache hit, a folder without its
 * completion marker (a crash mid-way) is rebuilt. */
static void test_prepare_caches(void **state) {
    (void)state;
    trill_demo_options o = trill_demo_defaults();
    o.n_train = 400;
    o.n_eval = 16;
    o.n_dev = 16;
    o.first_check = 1;
    o.check_every = 1;
    o.max_sft_steps = 2;
    o.dev_k = 2;
    o.target_pass1 = 2.0; /* never reached: runs to max_sft_steps */
    char *cache = test_tmpdir("demo_cache");
    trill_demo_info info;
    assert_int_equal(trill_demo_prepare(cache, &o, &info), TRILL_OK);
    assert_false(info.cached);
    assert_int_equal(info.sft_steps, 2);
    /* the dev accuracy reported is the saved model's, sampled as the header says (dev_k samples
     * of every dev prompt at temperature 1 with the bf16 generator, keyed by the seed): the
     * same evaluation run again on the saved folder gives the same figures, bit for bit */
    char *dev = trill_path_join(info.dir, "dev.jsonl");
    trill_dataset_options dopt = { .prompt_field = "prompt", .answer_field = "answer", .template_ = "{prompt}", .max_prompt_tokens = 64 };
    trill_engine_config ec = trill_engine_config_default();
    ec.format = TRILL_GEN_BF16;
    trill_eval_options eo = { .k = o.dev_k, .temperature = 1.0, .max_new_tokens = TRILL_DEMO_RL_MAX_NEW_TOKENS,
                              .verifier = TRILL_VERIFIER_DEMO, .seed = o.seed };
    trill_eval_result r;
    assert_int_equal(trill_rl_evaluate_model(info.model_dir, NULL, dev, &dopt, &ec, &eo, &r), TRILL_OK);
    print_message("dev after %d SFT steps: pass@1 %.4f, pass@%d %.4f; evaluated again: %.4f, %.4f (mean length %.2f)\n",
                  info.sft_steps, info.dev_pass1, o.dev_k, info.dev_passk, r.pass1, r.passk, r.mean_len);
    assert_int_equal(r.prompts, o.n_dev);
    assert_true(r.pass1 == info.dev_pass1);
    assert_true(r.passk == info.dev_passk);
    free(dev);
    assert_true(strncmp(info.dir, cache, strlen(cache)) == 0);
    assert_true(trill_file_exists(info.train_path) && trill_file_exists(info.eval_path));
    assert_true(exists_in(info.dir, "demo.json"));
    trill_model *m = NULL;
    assert_int_equal(trill_model_load(info.model_dir, &m), TRILL_OK);
    assert_int_equal(m->config.hidden_size, 128);
    assert_int_equal(m->config.n_moe_layers, 3);
    assert_false(trill_config_is_moe(&m->config, 0));
    trill_model_free(m);
    assert_true(exists_in(info.model_dir, "tokenizer.json"));

    trill_demo_info again;
    assert_int_equal(trill_demo_prepare(cache, &o, &again), TRILL_OK);
    assert_true(again.cached);
    assert_string_equal(again.model_dir, info.model_dir);
    assert_int_equal(again.sft_steps, info.sft_steps);
    assert_true(again.dev_pass1 == info.dev_pass1);
    trill_demo_info_free(&again);

    /* other options, another folder; a target every model reaches (pass@1 >= 0) stops the warm
     * start at the first check, where the unreachable one ran to max_sft_steps */
    trill_demo_options o2 = o;
    o2.seed = 1;
    o2.target_pass1 = 0;
    trill_demo_info other;
    assert_int_equal(trill_demo_prepare(cache, &o2, &other), TRILL_OK);
    assert_false(other.cached);
    assert_string_not_equal(other.dir, info.dir);
    assert_int_equal(other.sft_steps, o2.first_check);
    trill_demo_info_free(&other);

    /* a crash before the marker: the folder is rebuilt, leftovers gone */
    char *marker = trill_path_join(info.dir, "demo.json");
    assert_int_equal(remove(marker), 0);
    test_write(info.dir, "leftover", "x", 1);
    assert_int_equal(trill_demo_prepare(cache, &o, &again), TRILL_OK);
    assert_false(again.cached);
    assert_false(exists_in(again.dir, "leftover"));
    assert_true(exists_in(again.dir, "demo.json"));
    trill_demo_info_free(&again);
    free(marker);

    trill_demo_info_free(&info);
    test_rmdir(cache);
    free(cache);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_problem_is_deterministic),
        cmocka_unit_test(test_format_matches_reward),
        cmocka_unit_test(test_data_is_deterministic_and_disjoint),
        cmocka_unit_test(test_prepare_caches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
