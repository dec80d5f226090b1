/* RL datasets: templates, JSONL reading with errors that name the line, and the seeded order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "text/tokenizer_json.h"
#include "rl/data/dataset_internal.h"
#include "trill/dataset.h"
#include "trill/fileio.h"

static void expect_error(trill_status st, const char *fragment) {
    assert_int_not_equal(st, TRILL_OK);
    if (!strstr(trill_error_message(), fragment)) fail_msg("message lacks '%s': %s", fragment, trill_error_message());
}

static void test_template(void **state) {
    (void)state;
    json_t *line = json_pack("{s:s, s:i, s:f, s:n, s:[]}", "q", "2+2", "n", 7, "x", 0.5, "nothing", "list");
    char *out;
    assert_int_equal(trill_render_template("Q: {q} (n={n}, x={x}) {{literal}}", line, "f:1", &out), TRILL_OK);
    assert_string_equal(out, "Q: 2+2 (n=7, x=0.5) {literal}");
    free(out);
    expect_error(trill_render_template("{missing}", line, "f:1", &out), "f:1: template field \"missing\": expected a string or number, got nothing");
    expect_error(trill_render_template("{nothing}", line, "f:1", &out), "got null");
    expect_error(trill_render_template("{list}", line, "f:1", &out), "got a non-scalar value");
    expect_error(trill_render_template("Q: {q", line, "f:1", &out), "unclosed '{'");
    expect_error(trill_render_template("Q: }", line, "f:1", &out), "stray '}'");
    json_decref(line);
}

static trill_tokenizer *charlevel(void) {
    json_t *j = trill_tokenizer_charlevel_json();
    trill_tokenizer *tok;
    assert_int_equal(trill_tokenizer_from_json(j, "char-level", &tok), TRILL_OK);
    json_decref(j);
    return tok;
}

static void test_load_and_errors(void **state) {
    (void)state;
    char *dir = test_tmpdir("dataset");
    trill_tokenizer *tok = charlevel();
    trill_dataset_options o = { .prompt_field = "question", .answer_field = "answer", .template_ = "Q: {question}\nA:",
                                .max_prompt_tokens = 32 };
    const char good[] = "{\"question\": \"1+1\", \"answer\": 2}\n\n{\"question\": \"2+2\", \"answer\": \"4\"}\n{\"question\": \"x\"}\n";
    test_write(dir, "good.jsonl", good, sizeof good - 1);
    char *path = trill_path_join(dir, "good.jsonl");
    trill_dataset *d;
    /* a line without the answer field is an error unless the options allow it */
    expect_error(trill_dataset_load(path, tok, &o, &d), "good.jsonl:4: no answer field \"answer\"");
    o.allow_missing_answer = true;
    assert_int_equal(trill_dataset_load(path, tok, &o, &d), TRILL_OK);
    assert_int_equal(d->n, 3); /* the blank line is skipped */
    assert_string_equal(d->examples[0].prompt, "Q: 1+1\nA:");
    assert_string_equal(d->examples[0].answer, "2"); /* a number answer becomes text */
    assert_string_equal(d->examples[2].answer, "");  /* no answer field: empty */
    assert_int_equal(d->examples[0].n_ids, (int)strlen("Q: 1+1\nA:"));
    trill_dataset_free(d);
    o.limit = 2;
    assert_int_equal(trill_dataset_load(path, tok, &o, &d), TRILL_OK);
    assert_int_equal(d->n, 2);
    trill_dataset_free(d);
    o.limit = 0;
    free(path);

    struct { const char *text, *fragment; } bad[] = {
        { "{\"question\": \"a\"}\nnot json\n", "bad.jsonl:2: not JSON" },
        { "[1, 2]\n", "bad.jsonl:1: expected a JSON object" },
        { "{\"q\": \"a\"}\n", "bad.jsonl:1: template field \"question\"" },
        { "{\"question\": \"a\", \"answer\": [1]}\n", "bad.jsonl:1: field \"answer\": expected a string or number" },
        { "{\"question\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}\n", "has 46 tokens, more than data.max_prompt_tokens (32)" },
        { "{\"question\": \"aaaaaaaaaaaaaaaaaaaaaa\"}\n", "the prompt has 28 tokens: with up to 8 new ones (generator.max_new_tokens) its "
                                                       "sequence would pass the model's max_position_embeddings (30)" },
        { "\n\n", "bad.jsonl: no examples" },
    };
    o.max_position_embeddings = 30;
    o.max_new_tokens = 8;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        test_write(dir, "bad.jsonl", bad[i].text, strlen(bad[i].text));
        path = trill_path_join(dir, "bad.jsonl");
        expect_error(trill_dataset_load(path, tok, &o, &d), bad[i].fragment);
        free(path);
    }
    path = trill_path_join(dir, "missing.jsonl");
    expect_error(trill_dataset_load(path, tok, &o, &d), "missing.jsonl: cannot open: No such file or directory");
    free(path);
    expect_error(trill_dataset_load(dir, tok, &o, &d), ": is a directory, expected a JSONL file");
    path = NULL;
    free(path);
    trill_tokenizer_free(tok);
    test_rmdir(dir);
    free(dir);
}

/* Each epoch is a permutation keyed by (seed, epoch); positions can be asked for in any chunks. */
static void test_order(void **state) {
    (void)state;
    enum { N = 50 };
    trill_dataset d = { .n = N };
    int a[3 * N], b[3 * N];
    assert_int_equal(trill_dataset_order(&d, 7, true, 0, 3 * N, a), TRILL_OK);
    for (int e = 0; e < 3; e++) {
        int seen[N] = { 0 };
        for (int i = 0; i < N; i++) seen[a[e * N + i]]++;
        for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);
    }
    assert_memory_not_equal(a, a + N, sizeof(int) * N); /* reshuffled each epoch */
    for (int at = 0; at < 3 * N; at += 7) /* the same positions from any starting point */
        assert_int_equal(trill_dataset_order(&d, 7, true, at, at + 7 <= 3 * N ? 7 : 3 * N - at, b + at), TRILL_OK);
    assert_memory_equal(a, b, sizeof a);
    assert_int_equal(trill_dataset_order(&d, 8, true, 0, N, b), TRILL_OK);
    assert_memory_not_equal(a, b, sizeof(int) * N); /* another seed, another order */
    assert_int_equal(trill_dataset_order(&d, 7, false, N + 3, 4, b), TRILL_OK);
    assert_true(b[0] == 3 && b[1] == 4 && b[2] == 5 && b[3] == 6); /* file order */
}

/* The empty template is the prompt field alone, whatever its name; SFT lines need the prompt and
 * the completion and get the completion's tokens. */
static void test_default_template_and_completion(void **state) {
    (void)state;
    char *dir = test_tmpdir("dataset_sft");
    trill_tokenizer *tok = charlevel();
    const char text[] = "{\"question\": \"1+1=\", \"target\": \" 2\"}\n";
    test_write(dir, "sft.jsonl", text, sizeof text - 1);
    char *path = trill_path_join(dir, "sft.jsonl");
    trill_dataset_options o = { .prompt_field = "question", .answer_field = "answer", .template_ = "", .max_prompt_tokens = 32,
                                .completion_field = "target" };
    trill_dataset *d;
    assert_int_equal(trill_dataset_load(path, tok, &o, &d), TRILL_OK);
    assert_string_equal(d->examples[0].prompt, "1+1=");
    assert_int_equal(d->examples[0].n_completion, 2);
    assert_non_null(d->examples[0].completion_ids);
    trill_dataset_free(d);
    o.completion_field = "completion";
    expect_error(trill_dataset_load(path, tok, &o, &d), "sft.jsonl:1: expected string fields \"question\" and \"completion\"");
    free(path);
    trill_tokenizer_free(tok);
    test_rmdir(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_template_and_completion),
        cmocka_unit_test(test_template),
        cmocka_unit_test(test_load_and_errors),
        cmocka_unit_test(test_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
