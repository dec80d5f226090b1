#include "trill/chat.h"
#include "base/alloc.h"
#include "model/chat_json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"
#include "base/json.h"

typedef enum { FAMILY_QWEN3, FAMILY_DEEPSEEK_V3 } family;

struct trill_chat_template {
    family fam;
    char *bos_token;
};

/* Known templates by FNV-1a 64 of their exact text: a renderer reproduces one template, so a
 * template that differs by a character is another template and is refused. */
static const struct { uint64_t hash; family fam; const char *name; } KNOWN[] = {
    { 0x5dd4244f5f466bc0ull, FAMILY_QWEN3, "Qwen3" },
    { 0xf9e4bbe11a2467acull, FAMILY_DEEPSEEK_V3, "DeepSeek-V3" },
};

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

void trill_chat_template_free(trill_chat_template *t) {
    if (!t) return;
    free(t->bos_token);
    free(t);
}

const char *trill_chat_template_family(const trill_chat_template *t) {
    return t->fam == FAMILY_QWEN3 ? "qwen3" : "deepseek_v3";
}

trill_status trill_chat_template_load(const char *dir, trill_chat_template **out) {
    char *path = trill_path_join(dir, "tokenizer_config.json");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_t *root;
    trill_status st = trill_json_load_file(path, &root);
    if (st) { free(path); return st; }
    const json_t *tpl = json_object_get(root, "chat_template");
    const json_t *bos = json_object_get(root, "bos_token");
    if (json_is_object(bos)) bos = json_object_get(bos, "content"); /* an AddedToken dict */
    trill_chat_template *t = NULL;
    if (!json_is_string(tpl)) {
        st = trill_error(TRILL_ERR_INVALID, "%s: field \"chat_template\": expected a string (the Jinja template)", path);
    } else {
        uint64_t h = fnv1a(json_string_value(tpl));
        int found = -1;
        for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++)
            if (KNOWN[i].hash == h) found = (int)i;
        if (found < 0) {
            st = trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"chat_template\": template %016llx is not one trill renders (known: Qwen3, DeepSeek-V3)",
                             path, (unsigned long long)h);
        } else if (!(t = trill_calloc(1, sizeof *t)) || !(t->bos_token = trill_strdup(json_is_string(bos) ? json_string_value(bos) : ""))) {
            st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        } else {
            t->fam = KNOWN[found].fam;
        }
    }
    json_decref(root);
    free(path);
    if (st) { trill_chat_template_free(t); return st; }
    *out = t;
    return TRILL_OK;
}

/* ---- a growable string ---- */

typedef struct sbuf { char *s; size_t n, cap; bool oom; } sbuf;

static void put_n(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *g = trill_realloc(b->s, cap);
        if (!g) { b->oom = true; return; }
        b->s = g;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void put(sbuf *b, const char *s) { put_n(b, s, strlen(s)); }

/* Python's str.strip/lstrip/rstrip('\n') on [s, s+n): returns the kept range. */
static void strip_newlines(const char **s, size_t *n, bool left, bool right) {
    while (left && *n && **s == '\n') { (*s)++; (*n)--; }
    while (right && *n && (*s)[*n - 1] == '\n') (*n)--;
}

/* The last occurrence of needle within s[0..n), or NULL. */
static const char *find_last(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;)
        if (memcmp(s + i, needle, k) == 0) return s + i;
    return NULL;
}

static bool starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static bool ends_with(const char *s, const char *p) {
    size_t a = strlen(s), b = strlen(p);
    return a >= b && strcmp(s + a - b, p) == 0;
}

/* Qwen3's template (without tools): thinking blocks kept only after the last real user query. */
static void render_qwen3(sbuf *b, const trill_chat_message *m, size_t n, bool gen, int thinking) {
    if (strcmp(m[0].role, "system") == 0) {
        put(b, "<|im_start|>system\n");
        put(b, m[0].content);
        put(b, "<|im_end|>\n");
    }
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;)
        if (strcmp(m[k].role, "user") == 0 &&
            !(starts_with(m[k].content, "<tool_response>") && ends_with(m[k].content, "</tool_response>"))) {
            last_query = k;
            break;
        }
    for (size_t i = 0; i < n; i++) {
        const trill_chat_message *x = &m[i];
        if (strcmp(x->role, "user") == 0 || (strcmp(x->role, "system") == 0 && i > 0)) {
            put(b, "<|im_start|>");
            put(b, x->role);
            put(b, "\n");
            put(b, x->content);
            put(b, "<|im_end|>\n");
        } else if (strcmp(x->role, "assistant") == 0) {
            const char *content = x->content, *reasoning = "";
            size_t content_len = strlen(content), reasoning_len = 0;
            if (x->reasoning_content) {
                reasoning = x->reasoning_content;
                reasoning_len = strlen(reasoning);
            } else if (strstr(x->content, "</think>")) {
                /* content = split('</think>')[-1].lstrip('\n') */
                content = find_last(x->content, content_len, "</think>") + strlen("</think>");
                content_len = strlen(content);
                strip_newlines(&content, &content_len, true, false);
                /* reasoning = split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                size_t head = (size_t)(strstr(x->content, "</think>") - x->content);
                const char *r = x->content;
                strip_newlines(&r, &head, false, true);
                const char *open = find_last(r, head, "<think>");
                if (open) {
                    head -= (size_t)(open + strlen("<think>") - r);
                    r = open + strlen("<think>");
                }
                strip_newlines(&r, &head, true, false);
                reasoning = r;
                reasoning_len = head;
            }
            put(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || reasoning_len > 0)) {
                const char *r = reasoning;
                size_t rl = reasoning_len;
                strip_newlines(&r, &rl, true, true);
                put(b, "<think>\n");
                put_n(b, r, rl);
                put(b, "\n</think>\n\n");
                strip_newlines(&content, &content_len, true, false);
            }
            put_n(b, content, content_len);
            put(b, "<|im_end|>\n");
        }
    }
    if (gen) {
        put(b, "<|im_start|>assistant\n");
        if (thinking == 0) put(b, "<think>\n\n</think>\n\n");
    }
}

/* DeepSeek-V3's template (without tools): system prompts joined first, after the BOS. */
static void render_deepseek_v3(sbuf *b, const trill_chat_message *m, size_t n, bool gen, const char *bos) {
    put(b, bos);
    bool first_system = true;
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].role, "system") == 0) {
            if (!first_system) put(b, "\n\n");
            put(b, m[i].content);
            first_system = false;
        }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].role, "user") == 0) {
            put(b, "<\xef\xbd\x9cUser\xef\xbd\x9c>"); /* <｜User｜> */
            put(b, m[i].content);
        } else if (strcmp(m[i].role, "assistant") == 0) {
            put(b, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"); /* <｜Assistant｜> */
            put(b, m[i].content);
            put(b, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"); /* <｜end▁of▁sentence｜> */
        }
    }
    if (gen) put(b, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
}

trill_status trill_chat_render(const trill_chat_template *t, const trill_chat_message *messages, size_t n,
                               bool add_generation_prompt, int enable_thinking, char **out) {
    if (n == 0) return trill_error(TRILL_ERR_INVALID, "chat: the conversation has no messages");
    for (size_t i = 0; i < n; i++) {
        const char *r = messages[i].role;
        if (!r || (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0))
            return trill_error(TRILL_ERR_UNSUPPORTED, "chat: message %zu: role \"%s\" is not supported (expected system, user or assistant)", i, r ? r : "(missing)");
        if (!messages[i].content) return trill_error(TRILL_ERR_INVALID, "chat: message %zu: \"content\" must be a string", i);
    }
    sbuf b = { 0 };
    put(&b, "");
    if (t->fam == FAMILY_QWEN3) render_qwen3(&b, messages, n, add_generation_prompt, enable_thinking);
    else render_deepseek_v3(&b, messages, n, add_generation_prompt, t->bos_token);
    if (b.oom) { free(b.s); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    *out = b.s;
    return TRILL_OK;
}

trill_status trill_chat_render_json(const trill_chat_template *t, const json_t *conv, char **out) {
    const json_t *msgs = json_object_get(conv, "messages");
    if (!json_is_array(msgs)) return trill_error(TRILL_ERR_INVALID, "chat: field \"messages\": expected a list");
    size_t n = json_array_size(msgs);
    trill_chat_message *m = trill_calloc(n + 1, sizeof *m);
    if (!m) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    for (size_t i = 0; i < n && !st; i++) {
        const json_t *x = json_array_get(msgs, i);
        const char *what = "chat: message";
        if (trill_json_get_string(x, "role", what, &m[i].role) || trill_json_get_string(x, "content", what, &m[i].content) ||
            trill_json_get_string(x, "reasoning_content", what, &m[i].reasoning_content))
            st = TRILL_ERR_INVALID;
    }
    bool gen = false, thinking = true;
    const json_t *et = json_object_get(conv, "enable_thinking");
    if (!st && (trill_json_get_bool(conv, "add_generation_prompt", "chat", &gen) || trill_json_get_bool(conv, "enable_thinking", "chat", &thinking)))
        st = TRILL_ERR_INVALID;
    if (!st) st = trill_chat_render(t, m, n, gen, et ? (int)thinking : -1, out);
    free(m);
    return st;
}
