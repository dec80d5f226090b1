/* libFuzzer harness: arbitrary bytes as the Python source of a tiktoken tokenizer (its pat_str),
 * then the pattern's escapes and class intersections translated for PCRE2 (in both dialects). Whatever is extracted and
 * translated must either compile (as the loader compiles it) or be refused with a message; the
 * input as a pattern directly is translated too. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tiktoken_pattern.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_tiktoken_pattern: check failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static void translate_as(const char *pattern, trill_regex_dialect dialect) {
    char *out = NULL;
    if (trill_regex_translate(pattern, dialect, &out) != TRILL_OK) {
        CHECK(trill_error_message()[0] != '\0');
        CHECK(out == NULL);
        return;
    }
    CHECK(out != NULL);
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)out, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    pcre2_code_free(re); /* a pattern PCRE2 refuses is the loader's refusal: both are fine */
    free(out);
}

/* As tiktoken's regex crate and as Hugging Face's Oniguruma read it. */
static void translate(const char *pattern) {
    translate_as(pattern, TRILL_REGEX_RUST);
    translate_as(pattern, TRILL_REGEX_ONIG);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0'; /* a NUL inside ends the source, as a C string would */
    char *pattern = NULL;
    if (trill_tiktoken_pattern_from_python(text, "fuzz.py", &pattern) == TRILL_OK) {
        CHECK(pattern != NULL);
        translate(pattern);
        free(pattern);
    } else {
        CHECK(trill_error_message()[0] != '\0');
    }
    translate(text);
    free(text);
    return 0;
}
