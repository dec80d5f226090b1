/* Split patterns of other regex engines for PCRE2 (tiktoken_pattern.h). */
#include "text/tiktoken_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/strbuf.h"

static const char *skip_space(const char *p) {
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (*p != '#') return p;
        while (*p && *p != '\n') p++; /* a comment */
    }
}

/* One Python string literal at p (r or no prefix; '...', "...", '''...''', """..."""); appends
 * its value to b and returns the text after it, or NULL if p is not one. */
static const char *literal(const char *p, trill_strbuf *b) {
    bool raw = false;
    if (*p == 'r' || *p == 'R') raw = true, p++;
    const char q = *p;
    if (q != '"' && q != '\'') return NULL;
    const bool triple = p[1] == q && p[2] == q;
    p += triple ? 3 : 1;
    for (;;) {
        if (!*p || (!triple && *p == '\n')) return NULL;
        if (triple ? (p[0] == q && p[1] == q && p[2] == q) : *p == q) return p + (triple ? 3 : 1);
        if (*p == '\\' && p[1]) {
            if (raw) trill_strbuf_put(b, p, 2); /* a raw string keeps the backslash */
            else if (p[1] == '\\' || p[1] == '"' || p[1] == '\'') trill_strbuf_put(b, p + 1, 1);
            else if (p[1] == 'n') trill_strbuf_put(b, "\n", 1);
            else if (p[1] == 'r') trill_strbuf_put(b, "\r", 1);
            else if (p[1] == 't') trill_strbuf_put(b, "\t", 1);
            else trill_strbuf_put(b, p, 2); /* an unknown escape stays, as Python keeps it */
            p += 2;
            continue;
        }
        trill_strbuf_put(b, p++, 1);
    }
}

/* After `name =` (a whole identifier, not `==`): the value's first character, or NULL. */
static const char *assignment(const char *src, const char *name) {
    const size_t len = strlen(name);
    for (const char *at = strstr(src, name); at; at = strstr(at + 1, name)) {
        const char before = at == src ? ' ' : at[-1];
        if (before == '_' || (before >= 'a' && before <= 'z') || (before >= 'A' && before <= 'Z') || (before >= '0' && before <= '9')) continue;
        const char *q = skip_space(at + len);
        if (*q == '=' && q[1] != '=') return skip_space(q + 1);
    }
    return NULL;
}

trill_status trill_tiktoken_pattern_from_python(const char *src, const char *what, char **out) {
    *out = NULL;
    const char *p = assignment(src, "pat_str");
    if (!p) p = assignment(src, "PAT_STR");
    if (!p) return trill_error(TRILL_ERR_INVALID, "%s: no `pat_str = ...` assignment (the tiktoken split pattern)", what);
    trill_strbuf b = { 0 }, sep = { 0 };
    const char *q = literal(p, &sep);
    bool ok = q != NULL;
    if (ok && strncmp(skip_space(q), ".join(", 6) == 0) { /* SEP.join([literal, ...]) */
        q = skip_space(skip_space(q) + 6);
        ok = *q == '[';
        if (ok) q = skip_space(q + 1);
        for (int i = 0; ok && *q != ']'; i++) {
            if (i && sep.s) trill_strbuf_put(&b, sep.s, sep.n);
            ok = (q = literal(q, &b)) != NULL;
            if (ok) q = skip_space(q);
            if (ok && *q == ',') q = skip_space(q + 1);
        }
        free(sep.s);
    } else {
        b = sep; /* a single literal */
    }
    if (!ok) {
        free(b.s);
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: pat_str must be a string literal or \"|\".join([literals])", what);
    }
    if (b.oom) { free(b.s); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    if (!b.s) b.s = trill_strdup("");
    *out = b.s;
    return b.s ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

enum { MAX_NESTING = 32 };

/* The end of the class starting at p ('['): the position after its ']', nested classes and
 * escapes skipped; NULL if unterminated or nested deeper than MAX_NESTING. A ']' right after
 * '[' or '[^' is a literal. */
static const char *class_end_at(const char *p, int depth) {
    if (depth > MAX_NESTING) return NULL;
    p++;
    if (*p == '^') p++;
    if (*p == ']') p++;
    while (*p && *p != ']') {
        if (*p == '\\' && p[1]) { p += 2; continue; }
        if (*p == '[') {
            if (!(p = class_end_at(p, depth + 1))) return NULL;
            continue;
        }
        p++;
    }
    return *p ? p + 1 : NULL;
}

static const char *class_end(const char *p) { return class_end_at(p, 0); }

/* Whether PCRE2 knows name as a script (\p{sc=name} compiles). */
static bool is_script(const char *name, size_t n) {
    char probe[96];
    if (n == 0 || n > 64 || memchr(name, '=', n) || memchr(name, ':', n) || name[0] == '^') return false;
    snprintf(probe, sizeof probe, "\\p{sc=%.*s}", (int)n, name);
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)probe, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    pcre2_code_free(re);
    return re != NULL;
}

/* Copies [p, e) with PCRE2's \s \S \w \W rewritten as the dialect means them (`word`: its \w
 * as a class body), inside a class (in_class) or outside one. */
static trill_status put_escaped(trill_strbuf *b, const char *p, const char *e, const char *word, bool in_class) {
    while (p < e) {
        const char *q = memchr(p, '\\', (size_t)(e - p));
        if (!q) q = e;
        trill_strbuf_put(b, p, (size_t)(q - p));
        if (q + 1 >= e) { trill_strbuf_put(b, q, (size_t)(e - q)); break; }
        switch (q[1]) {
        case 's': trill_strbuf_put(b, "\\p{White_Space}", 15); break;
        case 'S': trill_strbuf_put(b, "\\P{White_Space}", 15); break;
        case 'w':
            if (!in_class) trill_strbuf_put(b, "[", 1);
            trill_strbuf_put(b, word, strlen(word));
            if (!in_class) trill_strbuf_put(b, "]", 1);
            break;
        case 'W':
            if (in_class) return trill_error(TRILL_ERR_UNSUPPORTED, "regex: \\W inside a character class is not supported");
            trill_strbuf_put(b, "[^", 2);
            trill_strbuf_put(b, word, strlen(word));
            trill_strbuf_put(b, "]", 1);
            break;
        case 'p':
        case 'P': { /* a bare script name is its Script in both engines, its Script_Extensions in PCRE2 */
            const char *name = q + 3, *close = q + 2 < e && q[2] == '{' ? memchr(name, '}', (size_t)(e - name)) : NULL;
            if (!close || !is_script(name, (size_t)(close - name))) { trill_strbuf_put(b, q, 2); break; }
            trill_strbuf_put(b, q, 3);
            trill_strbuf_put(b, "sc=", 3);
            trill_strbuf_put(b, name, (size_t)(close - name + 1));
            p = close + 1;
            continue;
        }
        default: trill_strbuf_put(b, q, 2); /* \d is Nd in every dialect, and the rest means the same */
        }
        p = q + 2;
    }
    return TRILL_OK;
}

/* The class at [p, e) (from '[' to after ']'): its escapes rewritten, and && operands too. */
static trill_status translate_class(const char *p, const char *e, const char *word, trill_strbuf *b) {
    const char *body = p + 1, *stop = e - 1, *amp = NULL;
    for (const char *q = body; q < stop; q++) { /* the first && at this class's own depth */
        if (*q == '\\' && q + 1 < stop) { q++; continue; }
        if (*q == '[') { q = class_end(q) - 1; continue; }
        if (q[0] == '&' && q[1] == '&') { amp = q; break; }
    }
    if (!amp) return put_escaped(b, p, e, word, true);
    if (*body == '^') return trill_error(TRILL_ERR_UNSUPPORTED, "regex: a negated class with && is not supported: %.*s", (int)(e - p), p);
    trill_strbuf_put(b, "(?:", 3);
    trill_status st = TRILL_OK;
    for (const char *q = amp; q < stop && !st;) { /* each operand: && [..] */
        if (q[0] != '&' || q[1] != '&' || q[2] != '[')
            return trill_error(TRILL_ERR_UNSUPPORTED, "regex: an && operand must be a bracketed class: %.*s", (int)(e - p), p);
        const char *oe = class_end(q + 2);
        if (!oe || oe > stop) return trill_error(TRILL_ERR_INVALID, "regex: unterminated class: %.*s", (int)(e - p), p);
        const bool neg = q[3] == '^';
        trill_strbuf_put(b, neg ? "(?![" : "(?=[", 4);
        st = put_escaped(b, q + (neg ? 4 : 3), oe, word, true);
        trill_strbuf_put(b, ")", 1);
        q = oe;
    }
    trill_strbuf_put(b, "[", 1);
    if (!st) st = put_escaped(b, body, amp, word, true);
    trill_strbuf_put(b, "])", 2);
    return st;
}

trill_status trill_regex_translate(const char *pattern, trill_regex_dialect dialect, char **out) {
    *out = NULL;
    const char *word = dialect == TRILL_REGEX_RUST ? TRILL_RUST_WORD : TRILL_ONIG_WORD;
    trill_strbuf b = { 0 };
    trill_strbuf_put(&b, "", 0);
    trill_status st = TRILL_OK;
    for (const char *p = pattern; *p && !st;) {
        const char *q = p; /* the next class, past escapes; \Q...\E is copied as it is */
        while (*q && *q != '[' && !(q[0] == '\\' && q[1] == 'Q')) q += q[0] == '\\' && q[1] ? 2 : 1;
        st = put_escaped(&b, p, q, word, false);
        if (st || !*q) break;
        if (*q == '\\') {
            const char *end = strstr(q, "\\E");
            p = end ? end + 2 : q + strlen(q);
            trill_strbuf_put(&b, q, (size_t)(p - q));
            continue;
        }
        const char *e = class_end(q);
        if (!e) st = trill_error(TRILL_ERR_INVALID, "regex: a class unterminated or nested deeper than %d at offset %zu", MAX_NESTING,
                                 (size_t)(q - pattern));
        else st = translate_class(q, e, word, &b), p = e;
    }
    if (!st && b.oom) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (st) { free(b.s); return st; }
    *out = b.s;
    return TRILL_OK;
}
