/* Chat templates: the [INST] renderers (Llama-2-chat, Mixtral) on hand-worked conversations, the
 * conversations their templates refuse, and what an unknown template is refused as; for
 * multi-turn RL, what follows a turn (and where that is the re-render's text and where not) and
 * the tool calls parsed from a turn. The renderers, tools included, are checked against the Jinja
 * oracle on the real template texts by tests/tokenizer/parity.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "text/chat_json.h"
#include "testutil.h"
#include "trill/chat.h"

#include <jansson.h>

#define S(c) { .role = "system", .content = c }
#define U(c) { .role = "user", .content = c }
#define A(c) { .role = "assistant", .content = c }

static void expect(const char *family, const trill_chat_message *m, size_t n, const char *want) {
    trill_chat_template *t = NULL;
    assert_int_equal(trill_chat_template_builtin(family, "<s>", "</s>", &t), TRILL_OK);
    assert_string_equal(trill_chat_template_family(t), family);
    char *out = NULL;
    trill_status st = trill_chat_render(t, m, n, true, -1, &out);
    if (st) fail_msg("%s: %s", family, trill_error_message());
    if (strcmp(out, want) != 0) fail_msg("%s: got\n%s\nwant\n%s", family, out, want);
    free(out);
    trill_chat_template_free(t);
}
#define EXPECT(family, want, ...) do { const trill_chat_message m_[] = { __VA_ARGS__ }; expect(family, m_, sizeof m_ / sizeof m_[0], want); } while (0)

/* The template refuses the conversation: the message names the template, the message and its
 * role, and says the template's own words. */
static void refused(const char *family, const trill_chat_message *m, size_t n, const char *where, const char *words) {
    trill_chat_template *t = NULL;
    assert_int_equal(trill_chat_template_builtin(family, "<s>", "</s>", &t), TRILL_OK);
    char *out = NULL;
    assert_int_equal(trill_chat_render(t, m, n, false, -1, &out), TRILL_ERR_INVALID);
    assert_null(out);
    const char *msg = trill_error_message();
    if (!strstr(msg, where) || !strstr(msg, words)) fail_msg("%s: %s", family, msg);
    trill_chat_template_free(t);
}
#define REFUSED(family, where, words, ...) do { const trill_chat_message m_[] = { __VA_ARGS__ }; refused(family, m_, sizeof m_ / sizeof m_[0], where, words); } while (0)

static void test_llama2(void **state) {
    (void)state;
    EXPECT("llama2", "<s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nq1 [/INST] a1 </s><s>[INST] q2 [/INST]", S("sys"), U("q1"), A(" a1\n"), U("q2"));
    /* Python's str.strip: U+3000, U+0085 and \x1f go, U+FEFF and U+200B stay; an all-blank turn
     * after the system prompt strips into its "\n\n" */
    EXPECT("llama2", "<s>[INST] x [/INST] \xef\xbb\xbf y\xe2\x80\x8b </s>", U("\xe3\x80\x80\xc2\x85x\x1f\t"), A("\xef\xbb\xbf y\xe2\x80\x8b\xe2\x80\xa8"));
    EXPECT("llama2", "<s>[INST] <<SYS>>\nsys\n<</SYS>> [/INST]", S("sys"), U(" \n"));
    /* an empty system prompt is still one ('' != false in Python) */
    EXPECT("llama2", "<s>[INST] <<SYS>>\n\n<</SYS>>\n\nq [/INST]", S(""), U("q"));
    /* a system message where an assistant turn belongs renders nothing */
    EXPECT("llama2", "<s>[INST] q1 [/INST]<s>[INST] q2 [/INST]", U("q1"), S("ignored"), U("q2"));
    EXPECT("llama2", "", S("only a system prompt"));
    REFUSED("llama2", "message 1 (user)", "Conversation roles must alternate", U("q1"), U("q2"));
    REFUSED("llama2", "message 0 (assistant)", "Conversation roles must alternate", A("a"), U("q"));
    REFUSED("llama2", "message 1 (system)", "Llama-2-chat template", S("s1"), S("s2"), U("q"));
}

static void test_mixtral(void **state) {
    (void)state;
    /* 8x7B: the system prompt before the first user turn, nothing stripped */
    EXPECT("mixtral", "<s> [INST] sys\n\nq1 [/INST]  a1</s> [INST] q2 [/INST]", S("sys"), U("q1"), A(" a1"), U("q2"));
    EXPECT("mixtral", "<s>", S("sys"));
    /* 8x22B: before the last message, and only if that is a user's */
    EXPECT("mixtral_8x22b", "<s>[INST] q1[/INST] a1</s>[INST] sys\n\nq2[/INST]", S("sys"), U("q1"), A("a1"), U("q2"));
    EXPECT("mixtral_8x22b", "<s>[INST] q1[/INST] a1</s>", S("sys"), U("q1"), A("a1"));
    REFUSED("mixtral", "message 1 (system)", "Only user and assistant roles are supported", U("q1"), S("s"));
    REFUSED("mixtral_8x22b", "message 2 (user)", "After the optional system message, conversation roles must alternate", S("s"), U("q1"), U("q2"));
}

/* A tokenizer_config.json whose chat_template is text: what loading it says. */
static trill_status load_template(const char *dir, const char *text, trill_chat_template **t) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"chat_template\": \"%s\", \"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\"}", text);
    fclose(f);
    return trill_chat_template_load(dir, t);
}

static void test_unknown_templates(void **state) {
    (void)state;
    char *dir = test_tmpdir("chat");
    trill_chat_template *t = NULL;
    const struct { const char *text, *named; } cases[] = {
        { "{{- '<|start|>assistant<|channel|>final<|message|>' }}", "OpenAI Harmony (gpt-oss)" },
        { "{{- '<|im_assistant|>assistant<|im_middle|>' }}", "Kimi" },
        { "{{ bos_token }}{{ '[INST] ' + messages[0]['content'] + ' [/INST]' }}", "[INST] template (Llama-2/Mistral) of another text" },
        { "{{ '<|im_start|>user' }}", "ChatML" },
        { "{{ 'hello' }}", "known: Qwen3, DeepSeek-V3, Llama-2-chat, Mixtral-8x7B-Instruct, Mixtral-8x22B-Instruct" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(load_template(dir, cases[i].text, &t), TRILL_ERR_UNSUPPORTED);
        const char *msg = trill_error_message();
        if (!strstr(msg, cases[i].named) || !strstr(msg, "tokenizer_config.json") || !strstr(msg, "chat_template")) fail_msg("%s", msg);
    }
    assert_int_equal(trill_chat_template_builtin("harmony", "", "", &t), TRILL_ERR_INVALID);
    test_rmdir(dir);
    free(dir);
}

#define DS(x) "<\xef\xbd\x9c" x "\xef\xbd\x9c>"
#define SEP "\xe2\x96\x81"

/* What follows a turn: a tool's result (Qwen3: a user turn of <tool_response>, then the generation
 * prompt; DeepSeek-V3: its output markers, no Assistant tag after them) or a user message; and it
 * is exactly what a re-render of the whole conversation writes after the turn's end, where the
 * template extends its prefix (Qwen3 after tool results; not when a new user query strips the
 * earlier turn's thinking, which trill keeps as sampled). */
static void test_after_turn(void **state) {
    (void)state;
    static const struct { const char *family, *role, *want; } cases[] = {
        { "qwen3", "tool", "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n<|im_start|>assistant\n" },
        { "qwen3", "user", "\n<|im_start|>user\n42<|im_end|>\n<|im_start|>assistant\n" },
        { "deepseek_v3", "tool", DS("tool" SEP "outputs" SEP "begin") DS("tool" SEP "output" SEP "begin") "42" DS("tool" SEP "output" SEP "end")
                                 DS("tool" SEP "outputs" SEP "end") },
        { "deepseek_v3", "user", DS("User") "42" DS("Assistant") },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trill_chat_template *t = NULL;
        assert_int_equal(trill_chat_template_builtin(cases[i].family, "<s>", "</s>", &t), TRILL_OK);
        const trill_chat_message next[] = { { .role = cases[i].role, .content = "42" } };
        char *out = NULL;
        assert_int_equal(trill_chat_render_after_turn(t, next, 1, true, -1, &out), TRILL_OK);
        if (strcmp(out, cases[i].want) != 0) fail_msg("%s after a turn, %s: got \"%s\"", cases[i].family, cases[i].role, out);
        free(out);
        trill_chat_template_free(t);
    }
    /* Qwen3, a thinking turn after the query: a tool result extends the re-render's prefix, a user
     * query does not (the re-render drops the turn's <think> block, the sampled tokens keep it) */
    trill_chat_template *t = NULL;
    assert_int_equal(trill_chat_template_builtin("qwen3", "", "<|im_end|>", &t), TRILL_OK);
    const char *roles[2] = { "tool", "user" };
    for (int k = 0; k < 2; k++) {
        const trill_chat_message conv[] = { U("q"), { .role = "assistant", .content = "<think>\nwhy\n</think>\n\ncall" },
                                            { .role = roles[k], .content = "42" } };
        char *upto = NULL, *after = NULL, *whole = NULL;
        assert_int_equal(trill_chat_render(t, conv, 2, false, -1, &upto), TRILL_OK);
        assert_int_equal(trill_chat_render_after_turn(t, conv + 2, 1, true, -1, &after), TRILL_OK);
        assert_int_equal(trill_chat_render(t, conv, 3, true, -1, &whole), TRILL_OK);
        upto[strlen(upto) - strlen("<|im_end|>\n")] = '\0'; /* the sampled turn, up to the <|im_end|> that ends it */
        const size_t n = strlen(upto);
        const bool same = strncmp(whole, upto, n) == 0 && strncmp(whole + n, "<|im_end|>", 10) == 0 && strcmp(whole + n + 10, after) == 0;
        if (same != (k == 0)) fail_msg("%s after a thinking turn: the re-render %s the turn's tokens and what follows", roles[k],
                                       same ? "keeps" : "differs from");
        free(upto), free(after), free(whole);
    }
    trill_chat_template_free(t);
}

/* Tool calls parsed from a turn in each template's format; a malformed one is an entry with its
 * error, counted. */
static void test_parse_tool_calls(void **state) {
    (void)state;
    static const struct { const char *family, *text; int calls, errors; const char *first_name; } cases[] = {
        { "qwen3", "I will call.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"x\": \"2+2\"}}\n</tool_call>\n<tool_call>\n"
                   "{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", 2, 0, "calc" },
        { "qwen3", "<tool_call>\n{\"name\": \"calc\", \"arguments\": [1]}\n</tool_call><tool_call>{not json</tool_call><tool_call>{", 0, 3, NULL },
        { "qwen3", "no calls here", 0, 0, NULL },
        { "deepseek_v3", DS("tool" SEP "calls" SEP "begin") DS("tool" SEP "call" SEP "begin") "function" DS("tool" SEP "sep") "calc\n```json\n"
                         "{\"x\": 1}\n```" DS("tool" SEP "call" SEP "end") DS("tool" SEP "call" SEP "begin") "function" DS("tool" SEP "sep")
                         "bad\n```json\n[]\n```" DS("tool" SEP "call" SEP "end") DS("tool" SEP "calls" SEP "end"), 1, 1, "calc" },
        { "llama2", "<tool_call>\n{\"name\": \"calc\", \"arguments\": {}}\n</tool_call>", 0, 0, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trill_chat_template *t = NULL;
        assert_int_equal(trill_chat_template_builtin(cases[i].family, "<s>", "</s>", &t), TRILL_OK);
        char *json = NULL;
        int calls = -1, errors = -1;
        assert_int_equal(trill_chat_parse_tool_calls(t, cases[i].text, &json, &calls, &errors), TRILL_OK);
        if (calls != cases[i].calls || errors != cases[i].errors) fail_msg("case %zu: %d calls, %d errors: %s", i, calls, errors, json);
        json_t *j = json_loads(json, 0, NULL);
        assert_int_equal(json_array_size(j), (size_t)(calls + errors));
        if (cases[i].first_name) assert_string_equal(json_string_value(json_object_get(json_array_get(j, 0), "name")), cases[i].first_name);
        json_decref(j);
        free(json);
        trill_chat_template_free(t);
    }
}

/* What a template writes for an assistant turn's tool calls parses back to those calls (names and
 * arguments), in both families. */
static void test_tool_calls_round_trip(void **state) {
    (void)state;
    static const char *const families[2] = { "qwen3", "deepseek_v3" };
    const trill_chat_tool_call calls[2] = {
        { .type = "function", .name = "calculator", .arguments = "{\"expression\": \"(48 + 24) / 2\", \"precision\": 0.5}", .arguments_is_text = true },
        { .type = "function", .name = "search", .arguments = "{\"q\": \"line\\nbreak \\\" quote\", \"n\": [1, 2]}", .arguments_is_text = true },
    };
    for (int f = 0; f < 2; f++) {
        trill_chat_template *t = NULL;
        assert_int_equal(trill_chat_template_builtin(families[f], "", "", &t), TRILL_OK);
        const trill_chat_message conv[2] = { U("q"), { .role = "assistant", .content = f ? NULL : "", .tool_calls = calls, .n_tool_calls = 2 } };
        char *text = NULL, *json = NULL;
        assert_int_equal(trill_chat_render(t, conv, 2, false, -1, &text), TRILL_OK);
        int n = 0, errors = 0;
        assert_int_equal(trill_chat_parse_tool_calls(t, text, &json, &n, &errors), TRILL_OK);
        if (n != 2 || errors) fail_msg("%s: %d calls, %d errors parsed from %s", families[f], n, errors, text);
        json_t *got = json_loads(json, 0, NULL);
        for (int k = 0; k < 2; k++) {
            json_t *want = json_loads(calls[k].arguments, 0, NULL), *call = json_array_get(got, (size_t)k);
            assert_string_equal(json_string_value(json_object_get(call, "name")), calls[k].name);
            if (!json_equal(json_object_get(call, "arguments"), want)) fail_msg("%s: call %d's arguments: %s", families[f], k, json);
            json_decref(want);
        }
        json_decref(got);
        free(text), free(json);
        trill_chat_template_free(t);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama2),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_unknown_templates),
        cmocka_unit_test(test_after_turn),
        cmocka_unit_test(test_parse_tool_calls),
        cmocka_unit_test(test_tool_calls_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
