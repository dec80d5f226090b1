#include "trill/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"
#include "trill/json.h"

struct trill_tokenizer {
    json_t *root;      /* owns every string below */
    json_t *vocab;     /* token string -> id (jansson objects are hash tables) */
    const char **id_to_token; /* [size] */
    int size;
    int unk_id;        /* -1 when the tokenizer has no unk_token */
    int n_added;
    const char **added;   /* added tokens, matched before the model, longest first */
    int *added_ids;
};

void trill_tokenizer_free(trill_tokenizer *tok) {
    if (!tok) return;
    json_decref(tok->root);
    free(tok->id_to_token);
    free(tok->added);
    free(tok->added_ids);
    free(tok);
}

static int cmp_len_desc(const void *a, const void *b) {
    size_t la = strlen(*(const char *const *)a), lb = strlen(*(const char *const *)b);
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static trill_status read_model(trill_tokenizer *tok, const char *path) {
    const json_t *model = json_object_get(tok->root, "model");
    if (!json_is_object(model)) return trill_error(TRILL_ERR_INVALID, "%s: field \"model\": expected an object", path);
    const char *type = "(missing)";
    trill_json_get_string(model, "type", path, &type);
    if (strcmp(type, "WordLevel") != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"model.type\": \"%s\" is not supported yet (expected \"WordLevel\")", path, type);
    tok->vocab = json_object_get(model, "vocab");
    if (!json_is_object(tok->vocab)) return trill_error(TRILL_ERR_INVALID, "%s: field \"model.vocab\": expected an object {token: id}", path);
    const char *key;
    json_t *id;
    json_object_foreach(tok->vocab, key, id) {
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 24))
            return trill_error(TRILL_ERR_INVALID, "%s: field \"model.vocab\": token \"%s\": expected an id in [0, 2^24)", path, key);
        if (json_integer_value(id) >= tok->size) tok->size = (int)json_integer_value(id) + 1;
    }
    const json_t *pre = json_object_get(tok->root, "pre_tokenizer");
    const json_t *pattern = pre ? json_object_get(json_object_get(pre, "pattern"), "Regex") : NULL;
    if (!json_is_string(pattern) || strcmp(json_string_value(pattern), "[\\s\\S]") != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"pre_tokenizer\": only the character-level Split on \"[\\\\s\\\\S]\" is supported here", path);
    const char *unk = NULL;
    tok->unk_id = -1;
    trill_json_get_string(model, "unk_token", path, &unk);
    if (unk) {
        const json_t *u = json_object_get(tok->vocab, unk);
        if (!u) return trill_error(TRILL_ERR_INVALID, "%s: field \"model.unk_token\": \"%s\" is not in the vocabulary", path, unk);
        tok->unk_id = (int)json_integer_value(u);
    }
    return TRILL_OK;
}

static trill_status read_added(trill_tokenizer *tok, const char *path) {
    const json_t *added = json_object_get(tok->root, "added_tokens");
    if (!added || json_is_null(added)) return TRILL_OK;
    if (!json_is_array(added)) return trill_error(TRILL_ERR_INVALID, "%s: field \"added_tokens\": expected a list", path);
    size_t n = json_array_size(added), i;
    tok->added = calloc(n + 1, sizeof *tok->added);
    tok->added_ids = calloc(n + 1, sizeof *tok->added_ids);
    if (!tok->added || !tok->added_ids) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const json_t *a;
    json_array_foreach(added, i, a) {
        const json_t *content = json_object_get(a, "content"), *id = json_object_get(a, "id");
        if (!json_is_string(content) || json_string_length(content) == 0 || !json_is_integer(id) ||
            json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 24))
            return trill_error(TRILL_ERR_INVALID, "%s: added_tokens[%zu]: expected {\"id\": id, \"content\": non-empty string}", path, i);
        tok->added[tok->n_added++] = json_string_value(content);
        if (json_integer_value(id) >= tok->size) tok->size = (int)json_integer_value(id) + 1;
    }
    qsort(tok->added, (size_t)tok->n_added, sizeof *tok->added, cmp_len_desc);
    for (int k = 0; k < tok->n_added; k++) {
        json_array_foreach(added, i, a)
            if (strcmp(json_string_value(json_object_get(a, "content")), tok->added[k]) == 0)
                tok->added_ids[k] = (int)json_integer_value(json_object_get(a, "id"));
    }
    return TRILL_OK;
}

trill_status trill_tokenizer_load(const char *dir, trill_tokenizer **out) {
    char *path = trill_path_join(dir, "tokenizer.json");
    trill_tokenizer *tok = calloc(1, sizeof *tok);
    trill_status st = path && tok ? trill_json_load_file(path, &tok->root) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = read_model(tok, path);
    if (!st) st = read_added(tok, path);
    if (!st) {
        tok->id_to_token = calloc((size_t)tok->size + 1, sizeof *tok->id_to_token);
        if (!tok->id_to_token) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    if (!st) {
        const char *key;
        json_t *id;
        json_object_foreach(tok->vocab, key, id) tok->id_to_token[json_integer_value(id)] = key;
        for (int k = 0; k < tok->n_added; k++) tok->id_to_token[tok->added_ids[k]] = tok->added[k];
    }
    free(path);
    if (st) { trill_tokenizer_free(tok); return st; }
    *out = tok;
    return TRILL_OK;
}

int trill_tokenizer_size(const trill_tokenizer *tok) { return tok->size; }

/* Length of the UTF-8 character at s (1 for an invalid byte, which then maps to unk). */
static size_t utf8_len(const unsigned char *s, size_t avail) {
    size_t n = s[0] < 0x80 ? 1 : (s[0] >> 5) == 0x6 ? 2 : (s[0] >> 4) == 0xe ? 3 : (s[0] >> 3) == 0x1e ? 4 : 1;
    if (n > avail) return 1;
    for (size_t i = 1; i < n; i++)
        if ((s[i] & 0xc0) != 0x80) return 1;
    return n;
}

trill_status trill_tokenizer_encode(const trill_tokenizer *tok, const char *text, size_t len, int **ids, size_t *n) {
    int *out = malloc((len ? len : 1) * sizeof *out); /* at most one id per byte */
    if (!out) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        int matched = 0;
        for (int a = 0; a < tok->n_added && !matched; a++) {
            size_t al = strlen(tok->added[a]);
            if (al <= len - i && memcmp(text + i, tok->added[a], al) == 0) {
                out[k++] = tok->added_ids[a];
                i += al;
                matched = 1;
            }
        }
        if (matched) continue;
        size_t cl = utf8_len((const unsigned char *)text + i, len - i);
        char ch[5] = { 0 };
        memcpy(ch, text + i, cl);
        const json_t *id = json_object_get(tok->vocab, ch);
        if (!id && tok->unk_id < 0) {
            free(out);
            return trill_error(TRILL_ERR_INVALID, "byte %zu: character not in the vocabulary and the tokenizer has no unk_token", i);
        }
        out[k++] = id ? (int)json_integer_value(id) : tok->unk_id;
        i += cl;
    }
    *ids = out;
    *n = k;
    return TRILL_OK;
}

trill_status trill_tokenizer_decode(const trill_tokenizer *tok, const int *ids, size_t n, char **text, size_t *len) {
    size_t total = 1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok->size || !tok->id_to_token[ids[i]])
            return trill_error(TRILL_ERR_INVALID, "position %zu: token id %d is not in the vocabulary", i, ids[i]);
        total += strlen(tok->id_to_token[ids[i]]);
    }
    char *out = malloc(total), *p = out;
    if (!out) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(tok->id_to_token[ids[i]]);
        memcpy(p, tok->id_to_token[ids[i]], l);
        p += l;
    }
    *p = '\0';
    *text = out;
    *len = (size_t)(p - out);
    return TRILL_OK;
}

static json_t *added_token(int id, const char *content) {
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "single_word", 0,
                     "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

json_t *trill_tokenizer_charlevel_json(void) {
    json_t *vocab = json_object();
    json_object_set_new(vocab, "<|endoftext|>", json_integer(0));
    json_object_set_new(vocab, "<unk>", json_integer(1));
    json_object_set_new(vocab, "\n", json_integer(2));
    for (int c = 32; c < 127; c++) {
        char s[2] = { (char)c, 0 };
        json_object_set_new(vocab, s, json_integer(3 + c - 32));
    }
    return json_pack("{s:s, s:n, s:n, s:[o,o], s:n, s:{s:s, s:{s:s}, s:s, s:b}, s:n, s:{s:s, s:o, s:s}, s:{s:s}}",
                     "version", "1.0", "truncation", "padding", "added_tokens", added_token(0, "<|endoftext|>"),
                     added_token(1, "<unk>"), "normalizer", "pre_tokenizer", "type", "Split", "pattern", "Regex",
                     "[\\s\\S]", "behavior", "Isolated", "invert", 0, "post_processor", "model", "type", "WordLevel",
                     "vocab", vocab, "unk_token", "<unk>", "decoder", "type", "Fuse");
}
