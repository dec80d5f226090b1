#include "trill/chat.h"
#include "base/alloc.h"
#include "base/strbuf.h"
#include "text/chat_json.h"

#include <math.h>
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

/* ---- tojson: Python's json.dumps(x, ensure_ascii=False), as transformers' tojson filter ---- */

/* repr(float): the shortest digits that read back to d, in fixed notation for decimal exponents
 * -4 .. 15 (at least one digit after the point), else d.ddde+XX (two exponent digits at least). */
static void py_float(trill_strbuf *b, double d) {
    if (d != d) { trill_strbuf_puts(b, "NaN"); return; }
    if (d == INFINITY || d == -INFINITY) { trill_strbuf_puts(b, d > 0 ? "Infinity" : "-Infinity"); return; }
    char sci[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(sci, sizeof sci, "%.*e", p - 1, d);
        if (strtod(sci, NULL) == d) break;
    }
    char digits[24], *at = sci, *e = strchr(sci, 'e');
    int n = 0, exp = atoi(e + 1);
    if (*at == '-') { trill_strbuf_puts(b, "-"); at++; }
    for (; at < e; at++) if (*at != '.') digits[n++] = *at;
    while (n > 1 && digits[n - 1] == '0') n--;
    char out[64];
    int k = 0;
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            k += snprintf(out + k, sizeof out - (size_t)k, "0.");
            for (int i = 0; i < -exp - 1; i++) out[k++] = '0';
            for (int i = 0; i < n; i++) out[k++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++) out[k++] = i < n ? digits[i] : '0';
            out[k++] = '.';
            if (n > exp + 1) for (int i = exp + 1; i < n; i++) out[k++] = digits[i];
            else out[k++] = '0';
        }
        out[k] = 0;
    } else {
        out[k++] = digits[0];
        if (n > 1) {
            out[k++] = '.';
            for (int i = 1; i < n; i++) out[k++] = digits[i];
        }
        snprintf(out + k, sizeof out - (size_t)k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
    trill_strbuf_puts(b, out);
}

static void py_string(trill_strbuf *b, const char *s, size_t n) {
    trill_strbuf_puts(b, "\"");
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)s[i];
        char esc[8];
        switch (c) {
        case '"': trill_strbuf_puts(b, "\\\""); break;
        case '\\': trill_strbuf_puts(b, "\\\\"); break;
        case '\n': trill_strbuf_puts(b, "\\n"); break;
        case '\r': trill_strbuf_puts(b, "\\r"); break;
        case '\t': trill_strbuf_puts(b, "\\t"); break;
        case '\b': trill_strbuf_puts(b, "\\b"); break;
        case '\f': trill_strbuf_puts(b, "\\f"); break;
        default:
            if (c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", c);
                trill_strbuf_puts(b, esc);
            } else {
                trill_strbuf_put(b, s + i, 1);
            }
        }
    }
    trill_strbuf_puts(b, "\"");
}

static void py_dumps(trill_strbuf *b, const json_t *v) {
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *x;
        bool first = true;
        trill_strbuf_puts(b, "{");
        json_object_foreach((json_t *)v, key, x) {
            if (!first) trill_strbuf_puts(b, ", ");
            first = false;
            py_string(b, key, strlen(key));
            trill_strbuf_puts(b, ": ");
            py_dumps(b, x);
        }
        trill_strbuf_puts(b, "}");
        break;
    }
    case JSON_ARRAY:
        trill_strbuf_puts(b, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) trill_strbuf_puts(b, ", ");
            py_dumps(b, json_array_get(v, i));
        }
        trill_strbuf_puts(b, "]");
        break;
    case JSON_STRING: py_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        trill_strbuf_puts(b, num);
        break;
    case JSON_REAL: py_float(b, json_real_value(v)); break;
    case JSON_TRUE: trill_strbuf_puts(b, "true"); break;
    case JSON_FALSE: trill_strbuf_puts(b, "false"); break;
    case JSON_NULL: trill_strbuf_puts(b, "null"); break;
    }
}

/* The JSON text `text` as tojson writes it; false (b untouched) when it is not JSON. */
static bool py_dumps_text(trill_strbuf *b, const char *text) {
    json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (!v) return false;
    py_dumps(b, v);
    json_decref(v);
    return true;
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
    const bool has_content = content_len > 0; /* the template's `content`, not lstripped */
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
    for (size_t i = 0; i < x->n_tool_calls; i++) { /* `content` before its lstrip decides the first newline */
        const trill_chat_tool_call *call = &x->tool_calls[i];
        if (i > 0 || has_content) trill_strbuf_puts(b, "\n");
        trill_strbuf_puts(b, "<tool_call>\n{\"name\": \"");
        trill_strbuf_puts(b, call->name);
        trill_strbuf_puts(b, "\", \"arguments\": ");
        if (call->arguments_is_text || !py_dumps_text(b, call->arguments)) trill_strbuf_puts(b, call->arguments);
        trill_strbuf_puts(b, "}\n</tool_call>");
    }
    trill_strbuf_puts(b, "<|im_end|>\n");
}

/* Qwen3's system block with tools: the system prompt, then each tool's tojson in <tools>. */
static void render_qwen3_tools(trill_strbuf *b, const trill_chat_message *m, const json_t *tools) {
    trill_strbuf_puts(b, "<|im_start|>system\n");
    if (strcmp(m[0].role, "system") == 0) {
        trill_strbuf_puts(b, m[0].content);
        trill_strbuf_puts(b, "\n\n");
    }
    trill_strbuf_puts(b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
                         "signatures within <tools></tools> XML tags:\n<tools>");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        trill_strbuf_puts(b, "\n");
        py_dumps(b, json_array_get(tools, i));
    }
    trill_strbuf_puts(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                         "</tool_call><|im_end|>\n");
}

/* A tool message: consecutive ones share one user turn of <tool_response> blocks. */
static void render_qwen3_tool(trill_strbuf *b, const trill_chat_message *m, size_t n, size_t i) {
    if (i == 0 || strcmp(m[i - 1].role, "tool") != 0) trill_strbuf_puts(b, "<|im_start|>user");
    trill_strbuf_puts(b, "\n<tool_response>\n");
    trill_strbuf_puts(b, m[i].content);
    trill_strbuf_puts(b, "\n</tool_response>");
    if (i == n - 1 || strcmp(m[i + 1].role, "tool") != 0) trill_strbuf_puts(b, "<|im_end|>\n");
}

/* Qwen3's template: thinking blocks kept only after the last real user query (a user message that
 * is not a <tool_response>), tools in the system turn. tools: a JSON array, or NULL. */
static void render_qwen3(trill_strbuf *b, const trill_chat_message *m, size_t n, const json_t *tools, bool gen, int thinking) {
    if (tools && json_array_size(tools) > 0) {
        render_qwen3_tools(b, m, tools);
    } else if (strcmp(m[0].role, "system") == 0) {
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
        } else if (strcmp(x->role, "tool") == 0) {
            render_qwen3_tool(b, m, n, i);
        }
    }
    if (gen) {
        trill_strbuf_puts(b, "<|im_start|>assistant\n");
        if (thinking == 0) trill_strbuf_puts(b, "<think>\n\n</think>\n\n");
    }
}

#define DS_(s) "<\xef\xbd\x9c" s "\xef\xbd\x9c>" /* <｜s｜>; the ▁ in names below is \xe2\x96\x81 */
#define DS_SEP "\xe2\x96\x81"

/* An assistant turn of tool calls only (content none), as the template writes it: the first call
 * of the conversation opens the block, later ones (the template's is_first is never reset) add a
 * call and close the block. */
static void render_deepseek_calls(trill_strbuf *b, const trill_chat_message *x, bool *is_first) {
    for (size_t k = 0; k < x->n_tool_calls; k++) {
        const trill_chat_tool_call *call = &x->tool_calls[k];
        if (!*is_first) trill_strbuf_puts(b, DS_("Assistant") DS_("tool" DS_SEP "calls" DS_SEP "begin") DS_("tool" DS_SEP "call" DS_SEP "begin"));
        else trill_strbuf_puts(b, "\n" DS_("tool" DS_SEP "call" DS_SEP "begin"));
        trill_strbuf_puts(b, call->type ? call->type : "function");
        trill_strbuf_puts(b, DS_("tool" DS_SEP "sep"));
        trill_strbuf_puts(b, call->name);
        trill_strbuf_puts(b, "\n```json\n");
        trill_strbuf_puts(b, call->arguments);
        trill_strbuf_puts(b, "\n```" DS_("tool" DS_SEP "call" DS_SEP "end"));
        if (*is_first) trill_strbuf_puts(b, DS_("tool" DS_SEP "calls" DS_SEP "end") DS_("end" DS_SEP "of" DS_SEP "sentence"));
        *is_first = true;
    }
}

/* DeepSeek-V3's template: system prompts joined first, after the BOS; tool calls and outputs with
 * its markers (tools themselves are not rendered). */
static void render_deepseek_v3(trill_strbuf *b, const trill_chat_message *m, size_t n, bool gen, const char *bos) {
    trill_strbuf_puts(b, bos);
    bool first_system = true, is_first = false, is_tool = false, output_first = true;
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].role, "system") == 0) {
            if (!first_system) trill_strbuf_puts(b, "\n\n");
            trill_strbuf_puts(b, m[i].content);
            first_system = false;
        }
    for (size_t i = 0; i < n; i++) {
        const trill_chat_message *x = &m[i];
        if (strcmp(x->role, "user") == 0) {
            is_tool = false;
            trill_strbuf_puts(b, DS_("User"));
            trill_strbuf_puts(b, x->content);
        } else if (strcmp(x->role, "assistant") == 0 && !x->content) {
            is_tool = false;
            render_deepseek_calls(b, x, &is_first);
        } else if (strcmp(x->role, "assistant") == 0) {
            trill_strbuf_puts(b, is_tool ? DS_("tool" DS_SEP "outputs" DS_SEP "end") : DS_("Assistant"));
            trill_strbuf_puts(b, x->content);
            trill_strbuf_puts(b, DS_("end" DS_SEP "of" DS_SEP "sentence"));
            is_tool = false;
        } else if (strcmp(x->role, "tool") == 0) {
            is_tool = true;
            trill_strbuf_puts(b, output_first ? DS_("tool" DS_SEP "outputs" DS_SEP "begin") DS_("tool" DS_SEP "output" DS_SEP "begin")
                                              : "\n" DS_("tool" DS_SEP "output" DS_SEP "begin"));
            trill_strbuf_puts(b, x->content);
            trill_strbuf_puts(b, DS_("tool" DS_SEP "output" DS_SEP "end"));
            output_first = false;
        }
    }
    if (is_tool) trill_strbuf_puts(b, DS_("tool" DS_SEP "outputs" DS_SEP "end"));
    if (gen && !is_tool) trill_strbuf_puts(b, DS_("Assistant"));
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

/* What a template can render of message i: its role, its content, its tool calls. */
static trill_status check_message(const trill_chat_template *t, const trill_chat_message *x, size_t i) {
    const bool tools = t->fam == FAMILY_QWEN3 || t->fam == FAMILY_DEEPSEEK_V3;
    const char *r = x->role;
    if (!r || (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 && strcmp(r, "tool") != 0))
        return trill_error(TRILL_ERR_UNSUPPORTED, "chat: message %zu: role \"%s\" is not supported (expected system, user, assistant or tool)", i,
                           r ? r : "(missing)");
    if (!tools && (strcmp(r, "tool") == 0 || x->n_tool_calls))
        return trill_error(TRILL_ERR_UNSUPPORTED, "chat: message %zu: the %s template has no tool calls or tool messages", i, t->name);
    if (!x->content && !(t->fam == FAMILY_DEEPSEEK_V3 && strcmp(r, "assistant") == 0 && x->n_tool_calls))
        return trill_error(TRILL_ERR_INVALID, "chat: message %zu: \"content\" must be a string%s", i,
                           x->n_tool_calls ? " (only DeepSeek-V3's template takes an assistant turn of tool calls without content)" : "");
    for (size_t k = 0; k < x->n_tool_calls; k++) {
        const trill_chat_tool_call *c = &x->tool_calls[k];
        json_t *args = c->arguments && !c->arguments_is_text ? json_loads(c->arguments, 0, NULL) : NULL;
        const bool ok = c->name && c->arguments && (c->arguments_is_text || json_is_object(args));
        json_decref(args);
        if (!ok)
            return trill_error(TRILL_ERR_INVALID, "chat: message %zu, tool call %zu: expected a name and arguments (a JSON object, or text)", i, k);
        if (t->fam == FAMILY_DEEPSEEK_V3 && !c->arguments_is_text)
            return trill_error(TRILL_ERR_INVALID, "chat: message %zu, tool call %zu: DeepSeek-V3's template writes the arguments as they are: "
                               "give them as text (a JSON string)", i, k);
    }
    return TRILL_OK;
}

trill_status trill_chat_render_tools(const trill_chat_template *t, const trill_chat_message *messages, size_t n, const char *tools,
                                     bool add_generation_prompt, int enable_thinking, char **out) {
    if (n == 0) return trill_error(TRILL_ERR_INVALID, "chat: the conversation has no messages");
    for (size_t i = 0; i < n; i++) {
        trill_status st = check_message(t, &messages[i], i);
        if (st) return st;
    }
    json_t *tool_list = tools ? json_loads(tools, 0, NULL) : NULL;
    if (tools && !json_is_array(tool_list)) {
        json_decref(tool_list);
        return trill_error(TRILL_ERR_INVALID, "chat: tools: expected a JSON array of tool definitions");
    }
    trill_strbuf b = { 0 };
    trill_strbuf_puts(&b, "");
    trill_status st = TRILL_OK;
    switch (t->fam) {
    case FAMILY_QWEN3: render_qwen3(&b, messages, n, tool_list, add_generation_prompt, enable_thinking); break;
    case FAMILY_DEEPSEEK_V3: render_deepseek_v3(&b, messages, n, add_generation_prompt, t->bos_token); break;
    case FAMILY_LLAMA2: st = render_llama2(&b, messages, n, t); break;
    case FAMILY_MIXTRAL:
    case FAMILY_MIXTRAL_8X22B: st = render_mixtral(&b, messages, n, t); break;
    }
    json_decref(tool_list);
    if (!st && b.oom) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (st) { free(b.s); return st; }
    *out = b.s;
    return TRILL_OK;
}

trill_status trill_chat_render(const trill_chat_template *t, const trill_chat_message *messages, size_t n,
                               bool add_generation_prompt, int enable_thinking, char **out) {
    return trill_chat_render_tools(t, messages, n, NULL, add_generation_prompt, enable_thinking, out);
}

/* Message x's "tool_calls" ([{"type"?, "function": {"name", "arguments"}}] or [{"name", "arguments"}];
 * arguments an object or a string) into calls[*n]; an object's arguments are written to *texts
 * (freed by the caller). */
static trill_status read_tool_calls(const json_t *x, size_t i, trill_chat_tool_call **calls, size_t *n, char ***texts) {
    const json_t *list = json_object_get(x, "tool_calls");
    *calls = NULL;
    *n = 0;
    if (!list || json_is_null(list)) return TRILL_OK;
    if (!json_is_array(list)) return trill_error(TRILL_ERR_INVALID, "chat: message %zu: field \"tool_calls\": expected a list", i);
    const size_t count = json_array_size(list);
    *calls = trill_calloc(count + 1, sizeof **calls);
    *texts = trill_calloc(count + 1, sizeof **texts);
    if (!*calls || !*texts) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t k = 0; k < count; k++, (*n)++) {
        const json_t *call = json_array_get(list, k), *fn = json_object_get(call, "function");
        if (!fn) fn = call;
        const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments"), *type = json_object_get(call, "type");
        if (!json_is_string(name) || !(json_is_string(args) || json_is_object(args)) || (type && !json_is_string(type)))
            return trill_error(TRILL_ERR_INVALID, "chat: message %zu, tool call %zu: expected {\"type\"?: string, \"function\": {\"name\": "
                               "string, \"arguments\": object or string}}", i, k);
        trill_chat_tool_call *c = &(*calls)[k];
        c->type = type ? json_string_value(type) : NULL;
        c->name = json_string_value(name);
        c->arguments_is_text = json_is_string(args);
        if (c->arguments_is_text) c->arguments = json_string_value(args);
        else if (!(c->arguments = (*texts)[k] = json_dumps(args, JSON_COMPACT))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    return TRILL_OK;
}

/* A JSON conversation's messages as trill_chat_messages (pointing into msgs; *texts: the arguments
 * written for them, freed by free_messages). */
static trill_status read_messages(const json_t *msgs, trill_chat_message **out, char ****texts) {
    if (!json_is_array(msgs)) return trill_error(TRILL_ERR_INVALID, "chat: field \"messages\": expected a list");
    const size_t n = json_array_size(msgs);
    trill_chat_message *m = *out = trill_calloc(n + 1, sizeof *m);
    char ***t = *texts = trill_calloc(n + 1, sizeof *t);
    trill_status st = m && t ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && !st; i++) {
        const json_t *x = json_array_get(msgs, i);
        const char *what = "chat: message";
        if (trill_json_get_string(x, "role", what, &m[i].role) ||
            (!json_is_null(json_object_get(x, "content")) && trill_json_get_string(x, "content", what, &m[i].content)) ||
            trill_json_get_string(x, "reasoning_content", what, &m[i].reasoning_content))
            st = TRILL_ERR_INVALID;
        if (!st) st = read_tool_calls(x, i, (trill_chat_tool_call **)&m[i].tool_calls, &m[i].n_tool_calls, &t[i]);
    }
    return st;
}

static void free_messages(trill_chat_message *m, char ***texts, size_t n) {
    for (size_t i = 0; m && texts && i < n; i++) {
        for (size_t k = 0; texts[i] && k < m[i].n_tool_calls + 1; k++) free(texts[i][k]);
        free(texts[i]);
        free((void *)m[i].tool_calls);
    }
    free(texts);
    free(m);
}

trill_status trill_chat_render_json(const trill_chat_template *t, const json_t *conv, char **out) {
    const json_t *msgs = json_object_get(conv, "messages"), *tools = json_object_get(conv, "tools");
    trill_chat_message *m = NULL;
    char ***texts = NULL;
    trill_status st = read_messages(msgs, &m, &texts);
    bool gen = false, thinking = true;
    const json_t *et = json_object_get(conv, "enable_thinking");
    if (!st && (trill_json_get_bool(conv, "add_generation_prompt", "chat", &gen) || trill_json_get_bool(conv, "enable_thinking", "chat", &thinking)))
        st = TRILL_ERR_INVALID;
    char *tools_text = !st && tools && !json_is_null(tools) ? json_dumps(tools, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if (!st) st = trill_chat_render_tools(t, m, json_array_size(msgs), tools_text, gen, et ? (int)thinking : -1, out);
    free(tools_text);
    free_messages(m, texts, json_array_size(msgs));
    return st;
}

trill_status trill_chat_render_after_turn_json(const trill_chat_template *t, const json_t *msgs, bool add_generation_prompt,
                                               int enable_thinking, char **out) {
    trill_chat_message *m = NULL;
    char ***texts = NULL;
    trill_status st = read_messages(msgs, &m, &texts);
    if (!st) st = trill_chat_render_after_turn(t, m, json_array_size(msgs), add_generation_prompt, enable_thinking, out);
    free_messages(m, texts, json_array_size(msgs));
    return st;
}

/* ---- multi-turn RL: what follows a turn, and the turn's tool calls ---- */

/* The text a template ends an assistant turn with (the token the model samples to end it). */
const char *trill_chat_turn_end(const trill_chat_template *t) {
    switch (t->fam) {
    case FAMILY_QWEN3: return "<|im_end|>";
    case FAMILY_DEEPSEEK_V3: return DS_("end" DS_SEP "of" DS_SEP "sentence");
    default: return NULL;
    }
}

trill_status trill_chat_render_after_turn(const trill_chat_template *t, const trill_chat_message *messages, size_t n,
                                          bool add_generation_prompt, int enable_thinking, char **out) {
    static const char SENTINEL[] = "\x01trill: the turn ends here\x01";
    const char *end = trill_chat_turn_end(t);
    if (!end) return trill_error(TRILL_ERR_UNSUPPORTED, "chat: the %s template is not used for multi-turn episodes", t->name);
    if (n == 0) return trill_error(TRILL_ERR_INVALID, "chat: no messages after the turn");
    trill_chat_message *all = trill_calloc(n + 2, sizeof *all);
    if (!all) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    all[0] = (trill_chat_message){ .role = "user", .content = "x" };
    all[1] = (trill_chat_message){ .role = "assistant", .content = SENTINEL };
    memcpy(all + 2, messages, sizeof *all * n);
    char *text = NULL;
    trill_status st = trill_chat_render_tools(t, all, n + 2, NULL, add_generation_prompt, enable_thinking, &text);
    free(all);
    if (st) return st;
    char *at = strstr(text, SENTINEL);
    if (!at || strncmp(at + strlen(SENTINEL), end, strlen(end)) != 0) {
        free(text);
        return trill_error(TRILL_ERR_INVALID, "chat: the %s template does not end an assistant turn with %s here", t->name, end);
    }
    at += strlen(SENTINEL) + strlen(end);
    memmove(text, at, strlen(at) + 1);
    *out = text;
    return TRILL_OK;
}

/* A parsed call {"name", "arguments"} from the JSON text of its arguments; NULL when they are not an object. */
static json_t *call_object(const char *name, size_t name_len, const char *args, size_t args_len) {
    json_t *a = json_loadb(args, args_len, 0, NULL);
    if (!json_is_object(a)) {
        json_decref(a);
        return NULL;
    }
    return json_pack("{s:s%, s:o}", "name", name, name_len, "arguments", a);
}

static bool add_failed(json_t *calls, const char *why, const char *text, size_t len) {
    return json_array_append_new(calls, json_pack("{s:s, s:s%}", "error", why, "text", text, len)) == 0;
}

/* Qwen3: each <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>. */
static bool parse_qwen3_calls(const char *text, json_t *calls, int *errors) {
    static const char OPEN[] = "<tool_call>", CLOSE[] = "</tool_call>";
    bool ok = true;
    for (const char *at = strstr(text, OPEN); ok && at; at = strstr(at, OPEN)) {
        const char *body = at + strlen(OPEN), *close = strstr(body, CLOSE);
        const size_t len = close ? (size_t)(close - body) : strlen(body);
        json_t *j = json_loadb(body, len, 0, NULL), *name = json_object_get(j, "name"), *args = json_object_get(j, "arguments");
        json_t *call = NULL;
        if (close && json_is_string(name) && json_is_object(args))
            call = json_pack("{s:O, s:O}", "name", name, "arguments", args);
        json_decref(j);
        if (call) ok = json_array_append_new(calls, call) == 0;
        else {
            ++*errors;
            ok = add_failed(calls, close ? "expected {\"name\": string, \"arguments\": object}" : "no </tool_call>", body, len);
        }
        at = close ? close + strlen(CLOSE) : body + len;
    }
    return ok;
}

/* DeepSeek-V3: each <｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>. */
static bool parse_deepseek_calls(const char *text, json_t *calls, int *errors) {
    static const char OPEN[] = DS_("tool" DS_SEP "call" DS_SEP "begin"), CLOSE[] = DS_("tool" DS_SEP "call" DS_SEP "end"),
                      SEP[] = DS_("tool" DS_SEP "sep"), FENCE[] = "\n```json\n", FENCE_END[] = "\n```";
    bool ok = true;
    for (const char *at = strstr(text, OPEN); ok && at; at = strstr(at, OPEN)) {
        const char *body = at + strlen(OPEN), *close = strstr(body, CLOSE);
        const size_t len = close ? (size_t)(close - body) : strlen(body);
        const char *sep = close ? strstr(body, SEP) : NULL, *name = sep ? sep + strlen(SEP) : NULL;
        const char *fence = name ? strstr(name, FENCE) : NULL, *args = fence ? fence + strlen(FENCE) : NULL;
        json_t *call = NULL;
        if (args && args < close && close - args >= (ptrdiff_t)strlen(FENCE_END) &&
            memcmp(close - strlen(FENCE_END), FENCE_END, strlen(FENCE_END)) == 0)
            call = call_object(name, (size_t)(fence - name), args, (size_t)(close - strlen(FENCE_END) - args));
        if (call) ok = json_array_append_new(calls, call) == 0;
        else {
            ++*errors;
            ok = add_failed(calls, close ? "expected TYPE<｜tool▁sep｜>NAME\\n```json\\nARGUMENTS\\n```" : "no <｜tool▁call▁end｜>", body, len);
        }
        at = close ? close + strlen(CLOSE) : body + len;
    }
    return ok;
}

trill_status trill_chat_parse_tool_calls_json(const trill_chat_template *t, const char *text, json_t **calls, int *errors) {
    *errors = 0;
    if (!(*calls = json_array())) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    bool ok = true;
    if (t && t->fam == FAMILY_QWEN3) ok = parse_qwen3_calls(text, *calls, errors);
    else if (t && t->fam == FAMILY_DEEPSEEK_V3) ok = parse_deepseek_calls(text, *calls, errors);
    if (ok) return TRILL_OK;
    json_decref(*calls);
    *calls = NULL;
    return trill_error(TRILL_ERR_NOMEM, "out of memory");
}

trill_status trill_chat_parse_tool_calls(const trill_chat_template *t, const char *text, char **calls_json, int *n_calls, int *n_errors) {
    json_t *calls;
    trill_status st = trill_chat_parse_tool_calls_json(t, text, &calls, n_errors);
    if (st) return st;
    *n_calls = (int)json_array_size(calls) - *n_errors;
    *calls_json = json_dumps(calls, JSON_COMPACT);
    json_decref(calls);
    return *calls_json ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}
