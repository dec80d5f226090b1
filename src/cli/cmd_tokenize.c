/* trill tokenize: text lines to JSON arrays of ids (one per line), or back with --decode. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "base/json.h"
#include "trill/tokenizer.h"


static trill_status encode_line(const trill_tokenizer *tok, const char *line, size_t len) {
    int *ids;
    size_t n;
    trill_status st = trill_tokenizer_encode(tok, line, len, false, &ids, &n);
    if (st) return st;
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    puts("]");
    free(ids);
    return TRILL_OK;
}

static trill_status decode_line(const trill_tokenizer *tok, const char *line, size_t len) {
    json_t *arr;
    trill_status st = trill_json_parse("input", line, len, &arr);
    if (st) return st;
    size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
    int *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!json_is_array(arr)) st = trill_error(TRILL_ERR_INVALID, "expected a JSON array of token ids");
    else if (!ids) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < n; i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 30))
            st = trill_error(TRILL_ERR_INVALID, "entry %zu: expected a token id", i);
        else ids[i] = (int)json_integer_value(v);
    }
    char *text;
    size_t tlen;
    if (!st && !(st = trill_tokenizer_decode(tok, ids, n, false, &text, &tlen))) {
        fwrite(text, 1, tlen, stdout);
        putchar('\n');
        free(text);
    }
    free(ids);
    json_decref(arr);
    return st;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL;
    bool decode = false;
    const cli_opt opts[] = {
        { "model", CLI_STR, "DIR", "the model folder (only its tokenizer.json is read)", .str = &dir, .required = true },
        { "decode", CLI_FLAG, NULL, "JSON arrays of ids to text lines", .flag = &decode },
    };
    const cli_spec spec = { "tokenize", NULL,
                            "Reads stdin: each text line becomes a JSON array of ids; with --decode each JSON\n"
                            "array of ids becomes a text line.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    trill_tokenizer *tok;
    if (trill_tokenizer_load(dir, &tok)) return cli_fail("tokenize");
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t len;
    trill_status st = TRILL_OK;
    while (!st && (len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n') len--;
        st = decode ? decode_line(tok, line, (size_t)len) : encode_line(tok, line, (size_t)len);
        if (st) trill_error_context("stdin line %zu", lineno);
    }
    free(line);
    trill_tokenizer_free(tok);
    return st ? cli_fail("tokenize") : 0;
}
