#include "trill/chat.h"
#include "base/alloc.h"
#include "base/strbuf.h"
#include "text/chat_json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"
#include "base/json.h"

typedef enum { FAMILY_QWEN3, FAMILY_DEEPSEEK_V3, FAMILY_LLAMA2, FAMILY_MIXTRAL, FAMILY_MIXTRAL_8X22B } family;

struct trill_chat_template {
    family fam;
    const char *name; /* the KNOWN entry's */
    char *bos_token, *eos_token;
};

/* Known templates by FNV-1a 64 of their exact text: a renderer reproduces one template, so a
 * template that differs by a character is another template and is refused. The [INST] ones are
 * the chat_template texts of the Ollama library's GGUF files (tests/tokenizer/templates.mjs). */
static const struct { uint64_t hash; family fam; const char *name, *id; } KNOWN[] = {
    { 0x5dd4244f5f466bc0ull, FAMILY_QWEN3, "Qwen3", "qwen3" },
    { 0xf9e4bbe11a2467acull, FAMILY_DEEPSEEK_V3, "DeepSeek-V3", "deepseek_v3" },
    { 0xe3acb67a6ed6e53dull, FAMILY_LLAMA2, "Llama-2-chat", "llama2" },
    { 0xac84646d42735809ull, FAMILY_MIXTRAL, "Mixtral-8x7B-Instruct", "mixtral" },
    { 0x7bdf57ed576f9675ull, FAMILY_MIXTRAL_8X22B, "Mixtral-8x22B-Instruct", "mixtral_8x22b" },
};
#define N_KNOWN (sizeof KNOWN / sizeof KNOWN[0])

/* What an unknown template looks like, for its refusal: families trill does not render, or
 * another version of one it does. */
static const struct { const char *marker, *also, *what; } LOOKS_LIKE[] = {
    { "<|channel|>", "<|start|>", "OpenAI Harmony (gpt-oss), which trill does not render" },
    { "<|im_middle|>", "<|im_assistant|>", "Kimi (Moonshot), which trill does not render" },
    { "[INST]", "", "an [INST] template (Llama-2/Mistral) of another text than the ones trill renders" },
    { "<|im_start|>", "", "a ChatML template (Qwen) of another text than Qwen3's" },
    { "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", "", /* <｜Assistant｜> */ "a DeepSeek template of another text than DeepSeek-V3's" },
};

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

void trill_chat_template_free(trill_chat_template *t) {
    if (!t) return;
    free(t->bos_token);
    free(t->eos_token);
    free(t);
}

const char *trill_chat_template_family(const trill_chat_template *t) {
    for (size_t i = 0; i < N_KNOWN; i++)
        if (KNOWN[i].fam == t->fam) return KNOWN[i].id;
    return "";
}

static trill_status make_template(size_t known, const char *bos, const char *eos, trill_chat_template **out) {
    trill_chat_template *t = trill_calloc(1, sizeof *t);
    if (!t || !(t->bos_token = trill_strdup(bos)) || !(t->eos_token = trill_strdup(eos))) {
        trill_chat_template_free(t);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    t->fam = KNOWN[known].fam;
    t->name = KNOWN[known].name;
    *out = t;
    return TRILL_OK;
}

trill_status trill_chat_template_builtin(const char *id, const char *bos, const char *eos, trill_chat_template **out) {
    for (size_t i = 0; i < N_KNOWN; i++)
        if (strcmp(KNOWN[i].id, id) == 0) return make_template(i, bos, eos, out);
    return trill_error(TRILL_ERR_INVALID, "chat: no built-in template \"%s\"", id);
}

static trill_status refuse_template(const char *path, const char *text) {
    char known[256] = "";
    for (size_t i = 0; i < N_KNOWN; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", KNOWN[i].name);
    const char *what = "";
    for (size_t i = 0; i < sizeof LOOKS_LIKE / sizeof LOOKS_LIKE[0] && !*what; i++)
        if (strstr(text, LOOKS_LIKE[i].marker) && strstr(text, LOOKS_LIKE[i].also)) what = LOOKS_LIKE[i].what;
    return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"chat_template\": template %016llx%s%s is not one trill renders (known: %s)", path,
                       (unsigned long long)fnv1a(text), *what ? ", " : "", what, known);
}

/* A special token's text: a string, or an AddedToken dict's "content"; "" when absent or null. */
static const char *token_text(const json_t *root, const char *key) {
    const json_t *v = json_object_get(root, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : "";
}

trill_status trill_chat_template_load(const char *dir, trill_chat_template **out) {
    char *path = trill_path_join(dir, "tokenizer_config.json");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_t *root;
    trill_status st = trill_json_load_file(path, &root);
    if (st) { free(path); return st; }
    const json_t *tpl = json_object_get(root, "chat_template");
    if (!json_is_string(tpl)) {
        st = trill_error(TRILL_ERR_INVALID, "%s: field \"chat_template\": expected a string (the Jinja template)", path);
    } else {
        uint64_t h = fnv1a(json_string_value(tpl));
        size_t found = N_KNOWN;
        for (size_t i = 0; i < N_KNOWN; i++)
            if (KNOWN[i].hash == h) found = i;
        st = found < N_KNOWN ? make_template(found, token_text(root, "bos_token"), token_text(root, "eos_token"), out)
                             : refuse_template(path, json_string_value(tpl));
    }
    json_decref(root);
    free(path);
    return st;
}

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

/* A Qwen3 assistant turn: its reasoning (reasoning_content, or the text inside <think> before
 * </think>) and its content; the reasoning is kept in a <think> block after the last user query
 * when it is not empty, or always for the last message (last). */
static void render_qwen3_assistant(trill_strbuf *b, const trill_chat_message *x, bool last, bool after_query) {
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
    trill_strbuf_puts(b, "<|im_start|>assistant\n");
    if (after_query && (last || reasoning_len > 0)) {
        const char *r = reasoning;
        size_t rl = reasoning_len;
        strip_newlines(&r, &rl, true, true);
        trill_strbuf_puts(b, "<think>\n");
        trill_strbuf_put(b, r, rl);
        trill_strbuf_puts(b, "\n</think>\n\n");
        strip_newlines(&content, &content_len, true, false);
    }
    trill_strbuf_put(b, content, content_len);
    trill_strbuf_puts(b, "<|im_end|>\n");
}

/* Qwen3's template (without tools): thinking blocks kept only after the last real user query. */
static void render_qwen3(trill_strbuf *b, const trill_chat_message *m, size_t n, bool gen, int thinking) {
    if (strcmp(m[0].role, "system") == 0) {
        trill_strbuf_puts(b, "<|im_start|>system\n");
        trill_strbuf_puts(b, m[0].content);
        trill_strbuf_puts(b, "<|im_end|>\n");
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
            trill_strbuf_puts(b, "<|im_start|>");
            trill_strbuf_puts(b, x->role);
            trill_strbuf_puts(b, "\n");
            trill_strbuf_puts(b, x->content);
            trill_strbuf_puts(b, "<|im_end|>\n");
        } else if (strcmp(x->role, "assistant") == 0) {
            render_qwen3_assistant(b, x, i == n - 1, i > last_query);
        }
    }
    if (gen) {
        trill_strbuf_puts(b, "<|im_start|>assistant\n");
        if (thinking == 0) trill_strbuf_puts(b, "<think>\n\n</think>\n\n");
    }
}

/* DeepSeek-V3's template (without tools): system prompts joined first, after the BOS. */
static void render_deepseek_v3(trill_strbuf *b, const trill_chat_message *m, size_t n, bool gen, const char *bos) {
    trill_strbuf_puts(b, bos);
    bool first_system = true;
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].role, "system") == 0) {
            if (!first_system) trill_strbuf_puts(b, "\n\n");
            trill_strbuf_puts(b, m[i].content);
            first_system = false;
        }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(m[i].role, "user") == 0) {
            trill_strbuf_puts(b, "<\xef\xbd\x9cUser\xef\xbd\x9c>"); /* <｜User｜> */
            trill_strbuf_puts(b, m[i].content);
        } else if (strcmp(m[i].role, "assistant") == 0) {
            trill_strbuf_puts(b, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"); /* <｜Assistant｜> */
            trill_strbuf_puts(b, m[i].content);
            trill_strbuf_puts(b, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"); /* <｜end▁of▁sentence｜> */
        }
    }
    if (gen) trill_strbuf_puts(b, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
}

/* ---- the [INST] templates: Llama-2-chat, Mixtral-8x7B and -8x22B-Instruct ---- */

/* Python's str.isspace code points in UTF-8, past ASCII's \t\n\v\f\r \x1c-\x1f and space. */
static const char *const PY_SPACE[] = {
    "\xc2\x85", "\xc2\xa0", "\xe1\x9a\x80", "\xe2\x80\x80", "\xe2\x80\x81", "\xe2\x80\x82", "\xe2\x80\x83", "\xe2\x80\x84",
    "\xe2\x80\x85", "\xe2\x80\x86", "\xe2\x80\x87", "\xe2\x80\x88", "\xe2\x80\x89", "\xe2\x80\x8a", "\xe2\x80\xa8", "\xe2\x80\xa9",
    "\xe2\x80\xaf", "\xe2\x81\x9f", "\xe3\x80\x80",
};

/* The length of the whitespace character that s[0..n) starts (at_end: ends) with, or 0. */
static size_t py_space(const char *s, size_t n, bool at_end) {
    if (n == 0) return 0;
    unsigned char c = (unsigned char)(at_end ? s[n - 1] : s[0]);
    if (c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f)) return 1;
    for (size_t i = 0; i < sizeof PY_SPACE / sizeof PY_SPACE[0]; i++) {
        size_t k = strlen(PY_SPACE[i]);
        if (k <= n && memcmp(at_end ? s + n - k : s, PY_SPACE[i], k) == 0) return k;
    }
    return 0;
}

/* Python's str.strip() on [s, s+n). */
static void py_strip(const char **s, size_t *n) {
    for (size_t k; (k = py_space(*s, *n, false)) > 0;) { *s += k; *n -= k; }
    for (size_t k; (k = py_space(*s, *n, true)) > 0;) *n -= k;
}

/* The template's raise_exception: its message, and where in the conversation it was raised. */
static trill_status template_raise(const trill_chat_template *t, size_t i, const trill_chat_message *m, const char *message) {
    return trill_error(TRILL_ERR_INVALID, "chat: the %s template refuses this conversation at message %zu (%s): %s", t->name, i, m->role, message);
}

static const char ALTERNATE_LLAMA2[] = "Conversation roles must alternate user/assistant/user/assistant/...";
static const char ALTERNATE_MIXTRAL[] = "After the optional system message, conversation roles must alternate user/assistant/user/assistant/...";
static const char ROLES_MIXTRAL[] = "Only user and assistant roles are supported, with the exception of an initial optional system message!";

/* Llama-2-chat: a system prompt goes in <<SYS>> into the first turn; each turn is stripped; a
 * system message where an assistant turn belongs renders nothing. No generation prompt. */
static trill_status render_llama2(trill_strbuf *b, const trill_chat_message *m, size_t n, const trill_chat_template *t) {
    size_t first = strcmp(m[0].role, "system") == 0;
    trill_strbuf c = { 0 };
    trill_status st = TRILL_OK;
    for (size_t i = first; i < n && !st; i++) {
        bool user = strcmp(m[i].role, "user") == 0, assistant = strcmp(m[i].role, "assistant") == 0;
        if (user != ((i - first) % 2 == 0)) { st = template_raise(t, i, &m[i], ALTERNATE_LLAMA2); break; }
        c.n = 0;
        trill_strbuf_puts(&c, "");
        if (i == first && first) {
            trill_strbuf_puts(&c, "<<SYS>>\n");
            trill_strbuf_puts(&c, m[0].content);
            trill_strbuf_puts(&c, "\n<</SYS>>\n\n");
        }
        trill_strbuf_puts(&c, m[i].content);
        const char *text = c.s;
        size_t len = c.n;
        py_strip(&text, &len);
        if (user) {
            trill_strbuf_puts(b, t->bos_token);
            trill_strbuf_puts(b, "[INST] ");
            trill_strbuf_put(b, text, len);
            trill_strbuf_puts(b, " [/INST]");
        } else if (assistant) {
            trill_strbuf_puts(b, " ");
            trill_strbuf_put(b, text, len);
            trill_strbuf_puts(b, " ");
            trill_strbuf_puts(b, t->eos_token);
        }
    }
    if (c.oom) b->oom = true;
    free(c.s);
    return st;
}

/* Mixtral-8x7B-Instruct (" [INST] q [/INST]", the system prompt before the first user turn) and
 * -8x22B ("[INST] q[/INST]", the system prompt before the last message, if that is a user's). */
static trill_status render_mixtral(trill_strbuf *b, const trill_chat_message *m, size_t n, const trill_chat_template *t) {
    bool x22 = t->fam == FAMILY_MIXTRAL_8X22B;
    const char *open = x22 ? "[INST] " : " [INST] ", *close = x22 ? "[/INST]" : " [/INST]";
    size_t first = strcmp(m[0].role, "system") == 0;
    trill_strbuf_puts(b, t->bos_token);
    for (size_t i = first; i < n; i++) {
        bool user = strcmp(m[i].role, "user") == 0;
        if (user != ((i - first) % 2 == 0)) return template_raise(t, i, &m[i], ALTERNATE_MIXTRAL);
        if (user) {
            trill_strbuf_puts(b, open);
            if (first && i == (x22 ? n - 1 : first)) {
                trill_strbuf_puts(b, m[0].content);
                trill_strbuf_puts(b, "\n\n");
            }
            trill_strbuf_puts(b, m[i].content);
            trill_strbuf_puts(b, close);
        } else if (strcmp(m[i].role, "assistant") == 0) {
            trill_strbuf_puts(b, " ");
            trill_strbuf_puts(b, m[i].content);
            trill_strbuf_puts(b, t->eos_token);
        } else {
            return template_raise(t, i, &m[i], ROLES_MIXTRAL);
        }
    }
    return TRILL_OK;
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
    trill_strbuf b = { 0 };
    trill_strbuf_puts(&b, "");
    trill_status st = TRILL_OK;
    switch (t->fam) {
    case FAMILY_QWEN3: render_qwen3(&b, messages, n, add_generation_prompt, enable_thinking); break;
    case FAMILY_DEEPSEEK_V3: render_deepseek_v3(&b, messages, n, add_generation_prompt, t->bos_token); break;
    case FAMILY_LLAMA2: st = render_llama2(&b, messages, n, t); break;
    case FAMILY_MIXTRAL:
    case FAMILY_MIXTRAL_8X22B: st = render_mixtral(&b, messages, n, t); break;
    }
    if (!st && b.oom) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (st) { free(b.s); return st; }
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
