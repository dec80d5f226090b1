/* The C side of the tokenizer parity test (tests/tokenizer/parity.sh). Reads stdin:
 *   tok_tool encode DIR   hex lines (raw bytes, so newlines and invalid UTF-8 survive) -> JSON id arrays
 *   tok_tool decode DIR   JSON id arrays -> hex lines of the decoded UTF-8 bytes
 *   tok_tool chat DIR     conversation JSON lines -> JSON strings (the rendered chat template),
 *                         or {"raise": true} where the template refuses the conversation */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_json.h"
#include "text/tokenizer_json.h"
#include "trill/chat.h"
#include "base/json.h"
#include "trill/tokenizer.h"

static int hexval(int c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; }

static int encode(const trill_tokenizer *tok, char *line, size_t len, size_t lineno) {
    if (len % 2) { fprintf(stderr, "line %zu: odd hex length\n", lineno); return 1; }
    char *bytes = malloc(len / 2 + 1);
    for (size_t i = 0; i < len / 2; i++) {
        int hi = hexval(line[2 * i]), lo = hexval(line[2 * i + 1]);
        if (hi < 0 || lo < 0) { fprintf(stderr, "line %zu: bad hex\n", lineno); free(bytes); return 1; }
        bytes[i] = (char)(hi * 16 + lo);
    }
    int *ids;
    size_t n;
    if (trill_tokenizer_encode(tok, bytes, len / 2, false, &ids, &n)) {
        fprintf(stderr, "line %zu: %s\n", lineno, trill_error_message());
        free(bytes);
        return 1;
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    puts("]");
    free(ids);
    free(bytes);
    return 0;
}

static int decode(const trill_tokenizer *tok, char *line, size_t len, size_t lineno) {
    json_t *arr;
    if (trill_json_parse("stdin", line, len, &arr) || !json_is_array(arr)) { fprintf(stderr, "line %zu: expected a JSON array\n", lineno); return 1; }
    size_t n = json_array_size(arr);
    int *ids = malloc((n + 1) * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = (int)json_integer_value(json_array_get(arr, i));
    char *text;
    size_t tlen;
    int rc = 0;
    if (trill_tokenizer_decode(tok, ids, n, false, &text, &tlen)) {
        fprintf(stderr, "line %zu: %s\n", lineno, trill_error_message());
        rc = 1;
    } else {
        for (size_t i = 0; i < tlen; i++) printf("%02x", (unsigned char)text[i]);
        putchar('\n');
        free(text);
    }
    free(ids);
    json_decref(arr);
    return rc;
}

static int chat(const trill_chat_template *tpl, char *line, size_t len, size_t lineno) {
    json_t *conv;
    if (trill_json_parse("stdin", line, len, &conv)) { fprintf(stderr, "line %zu: %s\n", lineno, trill_error_message()); return 1; }
    char *out = NULL;
    int rc = 0;
    if (trill_chat_render_json(tpl, conv, &out)) {
        if (strstr(trill_error_message(), "template refuses this conversation")) {
            puts("{\"raise\": true}"); /* the template's raise_exception, as the oracle writes it */
        } else {
            fprintf(stderr, "line %zu: %s\n", lineno, trill_error_message());
            rc = 1;
        }
    } else {
        json_t *s = json_string(out);
        char *dump = json_dumps(s, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
        puts(dump);
        free(dump);
        json_decref(s);
        free(out);
    }
    json_decref(conv);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: tok_tool encode|decode|chat DIR < input\n"); return 2; }
    trill_tokenizer *tok = NULL;
    trill_chat_template *tpl = NULL;
    int is_chat = strcmp(argv[1], "chat") == 0;
    if (is_chat ? trill_chat_template_load(argv[2], &tpl) : trill_tokenizer_load(argv[2], &tok)) {
        fprintf(stderr, "%s\n", trill_error_message());
        return 1;
    }
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t len;
    int failed = 0;
    while ((len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n') line[--len] = '\0';
        if (strcmp(argv[1], "encode") == 0) failed |= encode(tok, line, (size_t)len, lineno);
        else if (strcmp(argv[1], "decode") == 0) failed |= decode(tok, line, (size_t)len, lineno);
        else if (is_chat) failed |= chat(tpl, line, (size_t)len, lineno);
        else { fprintf(stderr, "unknown mode %s\n", argv[1]); return 2; }
    }
    free(line);
    trill_tokenizer_free(tok);
    trill_chat_template_free(tpl);
    return failed;
}
