/* libFuzzer harness: arbitrary bytes as tokenizer.json. Whatever trill_tokenizer_from_json
 * accepts must encode a fixed multilingual text (with and without add_special_tokens) to ids
 * in [0, size) and decode them again to valid, NUL-terminated UTF-8; ids from an encode
 * without the post-processor's template must always decode. */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "text/tokenizer_json.h"
#include "trill/tokenizer.h"

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fuzz_tokenizer_json: check failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

/* ASCII words, digits, punctuation, whitespace runs, a contraction, Latin with a combining
 * mark and a compatibility ligature, Greek, Cyrillic, Arabic, Devanagari, CJK, Hangul,
 * emoji with a skin tone and a ZWJ sequence, and special tokens written in the text. */
static const char TEXT[] =
    "Hello, World! It's 2024: 12345 apples.\n\n  \ttabs\r\n"
    "cafe\xcc\x81 caf\xc3\xa9 \xef\xac\x81 \xe2\x84\xab "                                 /* e+U+0301, é, ﬁ, Å (U+212B) */
    "\xce\x93\xce\xb5\xce\xb9\xce\xac \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 "   /* Γειά Привет */
    "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87 " /* مرحبا नमस्ते */
    "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88 " /* 你好世界。日本語のテキスト */
    "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 "                                                 /* 한국어 */
    "\xf0\x9f\x8e\x89\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 " /* 🎉👍🏽 👨‍👩‍👧 */
    "<|endoftext|> <s>x</s> [CLS] <unk> <tool_call>{\"a\": 1}</tool_call>\n";

static bool valid_utf8(const char *s, size_t n) {
    size_t m;
    char *clean = trill_utf8_sanitize(s, n, &m);
    CHECK(clean);
    bool same = m == n && memcmp(clean, s, n) == 0;
    free(clean);
    return same;
}

static void decode_check(const trill_tokenizer *tok, const int *ids, size_t n, bool must_decode) {
    for (int skip = 0; skip < 2; skip++) {
        char *text = NULL;
        size_t len = 0;
        if (trill_tokenizer_decode(tok, ids, n, skip, &text, &len) != TRILL_OK) {
            /* only a template id missing from the vocabulary may be refused */
            CHECK(!must_decode);
            CHECK(trill_error_message()[0] != '\0');
            continue;
        }
        CHECK(text[len] == '\0');
        CHECK(valid_utf8(text, len));
        free(text);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t err;
    json_t *root = json_loadb((const char *)data, size, 0, &err);
    if (!root) return 0;
    trill_tokenizer *tok = NULL;
    if (trill_tokenizer_from_json(root, "fuzz.json", &tok) != TRILL_OK) {
        CHECK(trill_error_message()[0] != '\0');
        json_decref(root);
        return 0;
    }
    json_decref(root); /* the tokenizer holds its own reference */
    const int size_ids = trill_tokenizer_size(tok);
    CHECK(size_ids >= 0);
    static const char *const probes[] = { "<|endoftext|>", "<unk>", "a", "" };
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        int id = trill_tokenizer_token_id(tok, probes[i]);
        CHECK(id >= -1 && id < size_ids);
    }
    for (int add = 0; add < 2; add++) {
        int *ids = NULL;
        size_t n = 0;
        if (trill_tokenizer_encode(tok, TEXT, sizeof TEXT - 1, add, &ids, &n) != TRILL_OK) {
            CHECK(trill_error_message()[0] != '\0'); /* e.g. WordLevel without unk_token */
            continue;
        }
        for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < size_ids);
        decode_check(tok, ids, n, !add);
        free(ids);
    }
    trill_tokenizer_free(tok);
    return 0;
}
