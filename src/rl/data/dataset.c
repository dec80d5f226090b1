#include "trill/dataset.h"
#include "base/alloc.h"
#include "rl/data/dataset_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/strbuf.h"
#include "trill/rng.h"

trill_status trill_render_template(const char *template_, const json_t *fields, const char *what, char **out) {
    trill_strbuf b = { 0 };
    trill_status st = TRILL_OK;
    trill_strbuf_put(&b, "", 0);
    for (const char *p = template_; *p && !st;) {
        if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) {
            trill_strbuf_put(&b, p, 1);
            p += 2;
        } else if (*p == '{') {
            const char *end = strchr(p, '}');
            if (!end) { st = trill_error(TRILL_ERR_INVALID, "template \"%s\": unclosed '{' (write \"{{\" for a literal brace)", template_); break; }
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(end - p - 1), p + 1);
            const json_t *v = json_object_get(fields, name);
            char num[64];
            const char *text = NULL;
            if (json_is_string(v)) text = json_string_value(v);
            else if (json_is_integer(v)) { snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v)); text = num; }
            else if (json_is_real(v)) { snprintf(num, sizeof num, "%.17g", json_real_value(v)); text = num; }
            if (!text) {
                st = trill_error(TRILL_ERR_INVALID, "%s: template field \"%s\": expected a string or number, got %s", what, name,
                                 v ? (json_is_null(v) ? "null" : "a non-scalar value") : "nothing (no such field)");
                break;
            }
            trill_strbuf_puts(&b, text);
            p = end + 1;
        } else if (*p == '}') {
            st = trill_error(TRILL_ERR_INVALID, "template \"%s\": stray '}' (write \"}}\" for a literal brace)", template_);
        } else {
            size_t n = strcspn(p, "{}");
            trill_strbuf_put(&b, p, n);
            p += n;
        }
    }
    if (!st && b.oom) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (st) { free(b.s); return st; }
    *out = b.s;
    return TRILL_OK;
}

static trill_status render_prompt(const trill_dataset_options *opt, const json_t *line, const char *what, char **out) {
    if (!opt->template_[0]) { /* the prompt field as it is: the template "{<prompt_field>}" */
        char *t = NULL;
        if (asprintf(&t, "{%s}", opt->prompt_field) < 0) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        trill_status st = trill_render_template(t, line, what, out);
        free(t);
        return st;
    }
    if (strcmp(opt->template_, "chat") != 0) return trill_render_template(opt->template_, line, what, out);
    if (!opt->chat) return trill_error(TRILL_ERR_INVALID, "data.template \"chat\": the model has no chat template");
    const char *content = json_string_value(json_object_get(line, opt->prompt_field));
    if (!content) return trill_error(TRILL_ERR_INVALID, "%s: expected a string field \"%s\"", what, opt->prompt_field);
    trill_chat_message msg = { .role = "user", .content = content };
    return trill_chat_render(opt->chat, &msg, 1, true, -1, out);
}

/* SFT: an example of n prompt tokens, *nc completion tokens and the end-of-sequence token within
 * the longest sequence allowed; with opt->truncate the completion is cut to fit. */
static trill_status fit_example(const trill_dataset_options *opt, const char *what, size_t n, int *nc) {
    const bool by_model = opt->max_position_embeddings > 0 && (opt->max_seq_len <= 0 || opt->max_position_embeddings < opt->max_seq_len);
    const long limit = by_model ? opt->max_position_embeddings : opt->max_seq_len, total = (long)n + *nc + 1;
    if (limit <= 0 || total <= limit) return TRILL_OK;
    if (opt->truncate && (long)n + 2 <= limit) {
        *nc = (int)(limit - (long)n - 1);
        return TRILL_OK;
    }
    char rule[160];
    if (by_model) snprintf(rule, sizeof rule, "the model's max_position_embeddings (%ld)", limit);
    else snprintf(rule, sizeof rule, "sft.max_seq_len (%ld)", limit);
    if (opt->truncate)
        return trill_error(TRILL_ERR_INVALID, "%s: the prompt has %zu tokens, so no completion token fits in %s", what, n, rule);
    return trill_error(TRILL_ERR_INVALID, "%s: the example has %ld tokens (prompt %zu, completion %d, end of sequence 1), more than %s; "
                       "shorten it%s, or set sft.truncate: true to cut the end of such completions", what, total, n, *nc, rule,
                       by_model ? "" : ", raise sft.max_seq_len");
}

static trill_status read_line(trill_dataset *d, const json_t *j, const trill_tokenizer *tok, const trill_dataset_options *opt,
                              const char *what) {
    trill_example *e = &d->examples[d->n];
    memset(e, 0, sizeof *e);
    if (!json_is_object(j)) return trill_error(TRILL_ERR_INVALID, "%s: expected a JSON object", what);
    const char *completion = opt->completion_field ? json_string_value(json_object_get(j, opt->completion_field)) : NULL;
    if (opt->completion_field && (!completion || !json_is_string(json_object_get(j, opt->prompt_field))))
        return trill_error(TRILL_ERR_INVALID, "%s: expected string fields \"%s\" and \"%s\"", what, opt->prompt_field, opt->completion_field);
    trill_status st = render_prompt(opt, j, what, &e->prompt);
    if (st) return st;
    const json_t *a = json_object_get(j, opt->answer_field);
    char num[64];
    const char *answer = "";
    if (json_is_string(a)) answer = json_string_value(a);
    else if (json_is_integer(a)) { snprintf(num, sizeof num, "%lld", (long long)json_integer_value(a)); answer = num; }
    else if (json_is_real(a)) { snprintf(num, sizeof num, "%.17g", json_real_value(a)); answer = num; }
    else if (a && !json_is_null(a))
        st = trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": expected a string or number", what, opt->answer_field);
    else if (!opt->allow_missing_answer && !opt->completion_field)
        st = trill_error(TRILL_ERR_INVALID, "%s: no answer field \"%s\" (the verifier's ground truth; set data.answer_field, or "
                         "data.allow_missing_answer: true when only a reward process or model scores)", what, opt->answer_field);
    if (!st && !(e->answer = trill_strdup(answer))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t n = 0;
    bool chat = strcmp(opt->template_, "chat") == 0; /* the rendered template holds its special tokens */
    if (!st) st = trill_tokenizer_encode(tok, e->prompt, strlen(e->prompt), !chat, &e->ids, &n);
    if (!st && n == 0) st = trill_error(TRILL_ERR_INVALID, "%s: the prompt is empty after tokenisation", what);
    size_t nc = 0;
    if (!st && completion) st = trill_tokenizer_encode(tok, completion, strlen(completion), false, &e->completion_ids, &nc);
    e->n_completion = (int)nc;
    if (!st && completion) st = fit_example(opt, what, n, &e->n_completion);
    if (!st && !completion && (int)n > opt->max_prompt_tokens)
        st = trill_error(TRILL_ERR_INVALID, "%s: the prompt has %zu tokens, more than data.max_prompt_tokens (%d)", what, n,
                         opt->max_prompt_tokens);
    if (!st && !completion && opt->max_position_embeddings > 0 && (long)n + opt->max_new_tokens > opt->max_position_embeddings)
        st = trill_error(TRILL_ERR_INVALID, "%s: the prompt has %zu tokens: with up to %d new ones (generator.max_new_tokens) its "
                         "sequence would pass the model's max_position_embeddings (%d)", what, n, opt->max_new_tokens,
                         opt->max_position_embeddings);
    e->n_ids = (int)n;
    if (!st) d->n++;
    else { free(e->prompt); free(e->answer); free(e->ids); free(e->completion_ids); }
    return st;
}

trill_status trill_dataset_load(const char *path, const trill_tokenizer *tok, const trill_dataset_options *opt,
                                trill_dataset **out) {
    FILE *f = fopen(path, "r");
    if (!f) return trill_error(TRILL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return trill_error(TRILL_ERR_IO, "%s: is a directory, expected a JSONL file", path);
    }
    trill_dataset *d = trill_calloc(1, sizeof *d);
    if (!d || !(d->path = trill_strdup(path))) { fclose(f); free(d); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    char *line = NULL;
    size_t cap = 0;
    int line_no = 0, have = 0;
    trill_status st = TRILL_OK;
    while (!st && (opt->limit <= 0 || d->n < opt->limit) && getline(&line, &cap, f) > 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        char what[512];
        snprintf(what, sizeof what, "%s:%d", path, line_no);
        json_error_t jerr;
        json_t *j = json_loads(line, 0, &jerr);
        if (!j) { st = trill_error(TRILL_ERR_INVALID, "%s: not JSON (%s)", what, jerr.text); break; }
        if (d->n == have) {
            trill_example *grown = trill_realloc(d->examples, sizeof *grown * (size_t)(have = have ? 2 * have : 64));
            if (!grown) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
            else d->examples = grown;
        }
        if (!st) st = read_line(d, j, tok, opt, what);
        json_decref(j);
    }
    free(line);
    fclose(f);
    if (!st && d->n == 0) st = trill_error(TRILL_ERR_INVALID, "%s: no examples", path);
    if (st) { trill_dataset_free(d); return st; }
    *out = d;
    return TRILL_OK;
}

void trill_dataset_free(trill_dataset *d) {
    if (!d) return;
    for (int i = 0; i < d->n; i++) {
        free(d->examples[i].prompt);
        free(d->examples[i].answer);
        free(d->examples[i].ids);
        free(d->examples[i].completion_ids);
    }
    free(d->examples);
    free(d->path);
    free(d);
}

/* Fisher–Yates keyed by (seed, epoch). */
static void permutation(int *perm, int n, uint64_t seed, int64_t epoch) {
    for (int k = 0; k < n; k++) perm[k] = k;
    const uint64_t key = trill_rng_key(trill_rng_key(seed, 0x64617461 /* "data" */), (uint64_t)epoch);
    for (int k = 0; k < n - 1; k++) {
        int j = k + (int)(trill_rng_uniform(key, (uint64_t)k) * (double)(n - k));
        int t = perm[k]; perm[k] = perm[j]; perm[j] = t;
    }
}

trill_status trill_dataset_order(const trill_dataset *d, uint64_t seed, bool shuffle, int64_t pos, int count, int *out) {
    const int n = d->n;
    int *perm = shuffle ? trill_malloc(sizeof(int) * (size_t)n) : NULL;
    if (shuffle && !perm) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    int64_t epoch = -1;
    for (int c = 0; c < count; c++, pos++) {
        if (shuffle && pos / n != epoch) permutation(perm, n, seed, epoch = pos / n);
        out[c] = shuffle ? perm[pos % n] : (int)(pos % n);
    }
    free(perm);
    return TRILL_OK;
}
