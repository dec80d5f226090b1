/* trill score: per-token log-probs and routed experts of token sequences (reference forward). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/fileio.h"
#include "base/json.h"
#include "trill/model.h"
#include "trill/tokenizer.h"


enum { BATCH_TOKENS = 4096, BATCH_SEQS = 64 };

typedef struct batch {
    int *tokens;
    int offsets[BATCH_SEQS + 1];
    int n_seqs;
    size_t cap;
} batch;

/* Reads one input line into the batch. */
static trill_status parse_line(const char *path, size_t lineno, const char *line, size_t len,
                               const trill_model *m, trill_tokenizer **tok, const char *dir, batch *b) {
    char what[4200];
    snprintf(what, sizeof what, "%s:%zu", path, lineno);
    json_t *obj;
    trill_status st = trill_json_parse(what, line, len, &obj);
    if (st) return st;
    const json_t *tokens = json_object_get(obj, "tokens"), *text = json_object_get(obj, "text");
    int *ids = NULL;
    size_t n = 0;
    if (json_is_array(tokens)) {
        n = json_array_size(tokens);
        ids = malloc((n ? n : 1) * sizeof *ids);
        for (size_t i = 0; ids && i < n; i++) {
            const json_t *v = json_array_get(tokens, i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= trill_model_config(m)->vocab_size) {
                st = trill_error(TRILL_ERR_INVALID, "%s: field \"tokens\": entry %zu: expected a token id in [0, %d)",
                                 what, i, trill_model_config(m)->vocab_size);
                break;
            }
            ids[i] = (int)json_integer_value(v);
        }
        if (!ids) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    } else if (json_is_string(text)) {
        if (!*tok && (st = trill_tokenizer_load(dir, tok))) trill_error_context("%s: field \"text\" needs a tokenizer", what);
        if (!st && (st = trill_tokenizer_encode(*tok, json_string_value(text), json_string_length(text), false, &ids, &n)))
            trill_error_context("%s: field \"text\"", what);
        for (size_t i = 0; !st && i < n; i++)
            if (ids[i] >= trill_model_config(m)->vocab_size)
                st = trill_error(TRILL_ERR_INVALID, "%s: tokenizer id %d exceeds the model's vocab_size %d", what, ids[i], trill_model_config(m)->vocab_size);
    } else {
        st = trill_error(TRILL_ERR_INVALID, "%s: expected an object with \"tokens\": [ids] or \"text\": string", what);
    }
    json_decref(obj);
    if (!st) {
        size_t used = (size_t)b->offsets[b->n_seqs];
        if (used + n > b->cap) {
            size_t cap = (used + n) * 2;
            int *grown = realloc(b->tokens, cap * sizeof *grown);
            if (!grown) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
            else { b->tokens = grown; b->cap = cap; }
        }
        if (!st) {
            memcpy(b->tokens + used, ids, n * sizeof *ids);
            b->offsets[++b->n_seqs] = (int)(used + n);
        }
    }
    free(ids);
    return st;
}

static void write_results(FILE *out, const trill_model *m, const batch *b, const float *logprobs, const uint16_t *experts) {
    const int L = trill_model_config(m)->n_moe_layers, K = trill_model_config(m)->num_experts_per_tok;
    for (int s = 0; s < b->n_seqs; s++) {
        const int t0 = b->offsets[s], t1 = b->offsets[s + 1];
        fputs("{\"tokens\": [", out);
        for (int t = t0; t < t1; t++) fprintf(out, t > t0 ? ", %d" : "%d", b->tokens[t]);
        fputs("], \"logprobs\": [", out);
        for (int t = t0; t < t1; t++) {
            if (t > t0) fputs(", ", out);
            if (isnan(logprobs[t])) fputs("null", out);
            else fprintf(out, "%.9g", logprobs[t]);
        }
        fputs("], \"experts\": [", out);
        for (int t = t0; t < t1; t++) {
            fputs(t > t0 ? ", [" : "[", out);
            for (int l = 0; l < L; l++) {
                fputs(l ? ", [" : "[", out);
                for (int k = 0; k < K; k++) fprintf(out, k ? ", %u" : "%u", experts[((size_t)t * L + l) * K + k]);
                fputs("]", out);
            }
            fputs("]", out);
        }
        fputs("]}\n", out);
    }
}

static trill_status flush_batch(FILE *out, const trill_model *m, batch *b) {
    if (b->n_seqs == 0) return TRILL_OK;
    const size_t T = (size_t)b->offsets[b->n_seqs];
    const size_t per_token = (size_t)trill_model_config(m)->n_moe_layers * trill_model_config(m)->num_experts_per_tok;
    float *logprobs = malloc((T ? T : 1) * sizeof *logprobs);
    uint16_t *experts = malloc((T * per_token + 1) * sizeof *experts);
    trill_status st = logprobs && experts ? trill_model_forward(m, b->tokens, b->offsets, b->n_seqs, NULL, logprobs, experts)
                                          : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) write_results(out, m, b, logprobs, experts);
    free(logprobs);
    free(experts);
    b->n_seqs = 0;
    return st;
}

int cmd_score(int argc, char **argv) {
    const char *dir = NULL, *input = NULL, *output = NULL;
    const cli_opt opts[] = {
        { "model", CLI_STR, "DIR", "the model folder", .str = &dir, .required = true },
        { "input", CLI_STR, "IN.jsonl", "token sequences or texts, one JSON object a line", .str = &input, .required = true },
        { "output", CLI_STR, "OUT.jsonl", "where the results go, written atomically (default: stdout)", .str = &output, .no_default = true },
    };
    const cli_spec spec = { "score", NULL,
                            "Input lines: {\"tokens\": [ids]} or {\"text\": \"...\"} (text needs DIR/tokenizer.json).\n"
                            "Output lines: {\"tokens\", \"logprobs\" (first null; entry t = log p(token t | tokens < t)),\n"
                            "\"experts\" ([token][moe_layer][k], descending router weight)}.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;

    trill_model *m;
    if (trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &m)) return cli_fail("score");
    trill_status st = trill_model_check_finite(m);
    if (st) trill_error_context("%s", dir);
    char *text = NULL;
    size_t len = 0;
    if (!st) st = trill_read_file(input, &text, &len);
    trill_atomic_file af = { 0 };
    FILE *out = stdout;
    if (!st && output && !(st = trill_atomic_open(&af, output))) out = af.f;

    trill_tokenizer *tok = NULL;
    batch b = { 0 };
    size_t lineno = 0;
    for (char *line = text; !st && line && line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        lineno++;
        if (strspn(line, " \t\r") < n) st = parse_line(input, lineno, line, n, m, &tok, dir, &b);
        if (!st && (b.n_seqs == BATCH_SEQS || b.offsets[b.n_seqs] >= BATCH_TOKENS)) st = flush_batch(out, m, &b);
        line = nl ? nl + 1 : NULL;
    }
    if (!st) st = flush_batch(out, m, &b);
    if (af.f) {
        if (st) trill_atomic_abort(&af);
        else st = trill_atomic_commit(&af);
    }
    free(text);
    free(b.tokens);
    trill_tokenizer_free(tok);
    trill_model_free(m);
    return st ? cli_fail("score") : 0;
}
