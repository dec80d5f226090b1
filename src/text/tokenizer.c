#include "trill/tokenizer.h"
#include "base/alloc.h"
#include "text/tokenizer_json.h"
#include "text/tiktoken_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <ctype.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "base/hashmap.h"
#include "base/utf8.h"
#include "trill/fileio.h"
#include "base/json.h"

/* ---- growable int array --------------------------------------------------------------- */

typedef struct ivec { int *v; size_t n, cap; } ivec;

static int ivec_push(ivec *a, int x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        int *g = trill_realloc(a->v, cap * sizeof *g);
        if (!g) return -1;
        a->v = g;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* ---- the tokenizer ----------------------------------------------------------------------- */

enum { MAX_STEPS = 16, BYTE_CP_LIMIT = 324, SHORT_WORD = 64 };

typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } split_behavior;

typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } prepend_scheme;

typedef struct pre_step {
    pcre2_code *re;          /* NULL: a ByteLevel prefix-space step, or a Metaspace one */
    split_behavior behavior;
    bool invert;
    bool add_prefix_space;   /* ByteLevel: prepend ' ' to a piece that lacks one */
    const char *metaspace;   /* Metaspace: its replacement character (UTF-8): ' ' becomes it */
    prepend_scheme prepend;  /* and when a piece gets one in front */
} pre_step;

/* A normalizer: a Unicode normal form, Prepend (a string before non-empty text) or Replace (a
 * literal string or a regex, every match replaced by a literal). */
typedef enum { NORM_FORM, NORM_PREPEND, NORM_REPLACE } norm_kind;
typedef struct norm_step {
    norm_kind kind;
    utf8proc_option_t form;
    const char *text, *with; /* Prepend's string; Replace's literal pattern (NULL: re) and content */
    size_t text_len, with_len;
    pcre2_code *re;
} norm_step;

/* A decoder of the chain, applied to the list of token strings (HF's decode_chain). */
typedef enum { DEC_BYTELEVEL, DEC_FUSE, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_STRIP, DEC_METASPACE } dec_kind;
typedef struct dec_step {
    dec_kind kind;
    const char *a, *b;       /* Replace: pattern -> content; Strip: the character; Metaspace: the replacement */
    size_t a_len, b_len;
    int start, stop;         /* Strip: at most this many from the start and the end */
    prepend_scheme prepend;  /* Metaspace */
} dec_step;

typedef struct added_token {
    const char *content;
    size_t len;
    int id;
    bool special, lstrip, rstrip, normalized;
} added_token;

struct trill_tokenizer {
    json_t *root;            /* owns every string the tables point to */
    bool bpe;                /* BPE (byte-level or over characters); else WordLevel */
    bool byte_level;         /* BPE over GPT-2's byte symbols; else over characters (SentencePiece-style) */
    bool tiktoken;           /* a tiktoken vocabulary: tokens are raw bytes, a merge's rank is the merged token's */
    char *arena;             /* tiktoken: every token's bytes (owned) */
    bool byte_fallback, fuse_unk; /* character BPE: a character outside the vocabulary as its <0xNN> byte tokens, unknowns fused */
    int fallback_id[256];    /* <0xNN>'s id, -1 when missing */
    trill_strmap vocab;      /* token string -> id */
    const char **id_str;     /* [size] token strings (vocabulary and added) */
    size_t *id_len;
    bool *id_special;
    int size, id_cap;        /* ids in use, ids allocated */
    trill_u64map merges;     /* (left id << 32 | right id) -> (rank << 32 | merged id) */
    uint32_t byte_cp[256];   /* byte -> its byte-level code point */
    int16_t cp_byte[BYTE_CP_LIMIT]; /* and back; -1 for other code points */
    int byte_id[256];        /* id of each byte's byte-level symbol */
    bool ignore_merges;
    int unk_id;
    int n_norm;
    norm_step norm[MAX_STEPS];
    int n_pre;
    pre_step pre[MAX_STEPS];
    int n_added;
    added_token *added;      /* sorted by first byte, then longest first */
    int added_first[257];    /* added tokens starting with byte b: [added_first[b], added_first[b+1]) */
    uint8_t added_second[256][32]; /* bitset: second bytes of the added tokens starting with byte b */
    bool has_decoder;        /* without one, HF joins the tokens with spaces */
    int n_dec;
    dec_step dec[MAX_STEPS];
    ivec prefix, suffix;     /* TemplateProcessing single: ids around the sequence */
};

/* GPT-2's byte <-> unicode map: printable bytes stand for themselves, the others take the
 * code points from 256 up, in byte order. */
static void build_byte_map(trill_tokenizer *t) {
    for (int i = 0; i < BYTE_CP_LIMIT; i++) t->cp_byte[i] = -1;
    int shifted = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        t->byte_cp[b] = printable ? (uint32_t)b : 256u + (uint32_t)shifted++;
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
}

void trill_tokenizer_free(trill_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    for (int i = 0; i < t->n_norm; i++) pcre2_code_free(t->norm[i].re);
    trill_strmap_free(&t->vocab);
    trill_u64map_free(&t->merges);
    free(t->id_str);
    free(t->id_len);
    free(t->id_special);
    free(t->added);
    free(t->prefix.v);
    free(t->suffix.v);
    free(t->arena);
    json_decref(t->root);
    free(t);
}

int trill_tokenizer_size(const trill_tokenizer *t) { return t->size; }

int trill_tokenizer_token_id(const trill_tokenizer *t, const char *token) {
    size_t len = strlen(token);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && memcmp(t->added[i].content, token, len) == 0) return t->added[i].id;
    return trill_strmap_get(&t->vocab, token, len);
}

/* ---- loading ------------------------------------------------------------------------------ */

static const char *type_of(const json_t *obj) {
    const json_t *t = json_object_get(obj, "type");
    return json_is_string(t) ? json_string_value(t) : "(missing)";
}

static bool flag(const json_t *obj, const char *key, bool dflt) {
    const json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

typedef trill_status (*step_loader)(trill_tokenizer *t, const json_t *x, const char *what);

/* A Sequence (of normalizers, post-processors or decoders): each part of its list `key` loaded in
 * order by `load`; `kind` names it in messages. */
static trill_status load_sequence(trill_tokenizer *t, const json_t *seq, const char *kind, const char *key, const char *what, step_loader load) {
    const json_t *list = json_object_get(seq, key);
    if (!json_is_array(list)) return trill_error(TRILL_ERR_INVALID, "%s: %s Sequence: \"%s\" must be a list", what, kind, key);
    size_t i;
    const json_t *x;
    json_array_foreach(list, i, x) {
        trill_status st = load(t, x, what);
        if (st) return st;
    }
    return TRILL_OK;
}

static trill_status load_normalizer(trill_tokenizer *t, const json_t *n, const char *what) {
    if (!n || json_is_null(n)) return TRILL_OK;
    const char *type = type_of(n);
    if (strcmp(type, "Sequence") == 0) return load_sequence(t, n, "normalizer", "normalizers", what, load_normalizer);
    if (t->n_norm == MAX_STEPS) return trill_error(TRILL_ERR_UNSUPPORTED, "%s: more than %d normalizers", what, MAX_STEPS);
    norm_step *x = &t->norm[t->n_norm];
    static const struct { const char *name; utf8proc_option_t opt; } forms[] = {
        { "NFC", UTF8PROC_COMPOSE }, { "NFD", UTF8PROC_DECOMPOSE },
        { "NFKC", UTF8PROC_COMPOSE | UTF8PROC_COMPAT }, { "NFKD", UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT },
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
        if (strcmp(type, forms[i].name) == 0) {
            *x = (norm_step){ .kind = NORM_FORM, .form = forms[i].opt | UTF8PROC_STABLE };
            t->n_norm++;
            return TRILL_OK;
        }
    if (strcmp(type, "Prepend") == 0) {
        const json_t *v = json_object_get(n, "prepend");
        if (!json_is_string(v)) return trill_error(TRILL_ERR_INVALID, "%s: normalizer Prepend: \"prepend\" must be a string", what);
        *x = (norm_step){ .kind = NORM_PREPEND, .text = json_string_value(v), .text_len = json_string_length(v) };
        t->n_norm++;
        return TRILL_OK;
    }
    if (strcmp(type, "Replace") == 0) {
        const json_t *pat = json_object_get(n, "pattern"), *with = json_object_get(n, "content");
        const json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        if ((!json_is_string(re) && !json_is_string(lit)) || !json_is_string(with))
            return trill_error(TRILL_ERR_INVALID, "%s: normalizer Replace: expected \"pattern\": {\"String\" or \"Regex\": ...} and \"content\": a string", what);
        if (json_is_string(lit) && json_string_length(lit) == 0) return trill_error(TRILL_ERR_INVALID, "%s: normalizer Replace: an empty pattern", what);
        *x = (norm_step){ .kind = NORM_REPLACE, .with = json_string_value(with), .with_len = json_string_length(with) };
        if (json_is_string(lit)) x->text = json_string_value(lit), x->text_len = json_string_length(lit);
        else {
            int code;
            PCRE2_SIZE off;
            char *pcre = NULL;
            trill_status st = trill_regex_translate(json_string_value(re), TRILL_REGEX_ONIG, &pcre);
            if (st) { trill_error_context("%s: normalizer Replace", what); return st; }
            x->re = pcre2_compile((PCRE2_SPTR)pcre, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
            free(pcre);
            if (!x->re) return trill_error(TRILL_ERR_INVALID, "%s: normalizer Replace: the regex does not compile at offset %zu", what, (size_t)off);
        }
        t->n_norm++;
        return TRILL_OK;
    }
    return trill_error(TRILL_ERR_UNSUPPORTED, "%s: normalizer \"%s\" is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence)", what, type);
}

static trill_status add_pre(trill_tokenizer *t, const char *what, const char *pattern, bool literal,
                            split_behavior behavior, bool invert, bool add_prefix_space) {
    if (t->n_pre == MAX_STEPS) return trill_error(TRILL_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizer steps", what, MAX_STEPS);
    pre_step *p = &t->pre[t->n_pre];
    *p = (pre_step){ .behavior = behavior, .invert = invert, .add_prefix_space = add_prefix_space };
    if (pattern) {
        int code;
        PCRE2_SIZE offset;
        char *pcre = NULL; /* the pattern as its engine reads it (Oniguruma's, or tiktoken's regex crate's) */
        trill_status st = literal ? TRILL_OK : trill_regex_translate(pattern, t->tiktoken ? TRILL_REGEX_RUST : TRILL_REGEX_ONIG, &pcre);
        if (st) { trill_error_context("%s: pre-tokenizer regex \"%s\"", what, pattern); return st; }
        p->re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : pcre), PCRE2_ZERO_TERMINATED,
                              literal ? PCRE2_LITERAL | PCRE2_UTF : PCRE2_UTF | PCRE2_UCP, &code, &offset, NULL);
        free(pcre);
        if (!p->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof msg);
            return trill_error(code == PCRE2_ERROR_HEAP_FAILED ? TRILL_ERR_NOMEM : TRILL_ERR_UNSUPPORTED, "%s: pre-tokenizer regex \"%s\": %s at offset %zu", what, pattern, (char *)msg, (size_t)offset);
        }
        pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    }
    t->n_pre++;
    return TRILL_OK;
}

/* HF's SplitDelimiterBehavior by name, in split_behavior's order; -1 for anything else. */
static int split_behavior_of(const json_t *b) {
    static const char *const names[] = { "Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous" };
    for (int i = 0; i < 5; i++)
        if (json_is_string(b) && strcmp(json_string_value(b), names[i]) == 0) return i;
    return -1;
}

/* The Rust predicates HF uses, in PCRE2: char::is_whitespace and the regex crate's \s are
 * White_Space; the regex crate's Unicode \w is Alphabetic, marks, Nd, Pc and Join_Control
 * (UTS #18) (both class bodies, for [...] and [^...]). Punctuation (one character) is
 * char::is_ascii_punctuation (the ASCII symbols $+<=>^`|~ too) or the unicode_categories
 * crate's is_punctuation, whose tables are Unicode 8.0's P* categories: so not the P*
 * characters that Unicode 9.0 to 14.0 added (PCRE2 10.42 knows up to 14.0), and U+166D and
 * U+111C9, P* in 8.0 and So/Mn since, are in. Checked code point by code point against the
 * crate (tests/tokenizer/pretok.mjs sweep). */
#define WHITE_SPACE "\\p{White_Space}"
#define RUST_WORD TRILL_RUST_WORD
#define HF_PUNCTUATION                                                                                   \
    "(?![\\x{61D}\\x{9FD}\\x{A76}\\x{C77}\\x{C84}\\x{1B7D}\\x{1B7E}\\x{2E43}-\\x{2E4F}\\x{2E52}-\\x{2E5D}"         \
    "\\x{10EAD}\\x{10F55}-\\x{10F59}\\x{10F86}-\\x{10F89}\\x{1144B}-\\x{1144F}\\x{1145A}\\x{1145B}\\x{1145D}"     \
    "\\x{11660}-\\x{1166C}\\x{116B9}\\x{1183B}\\x{11944}-\\x{11946}\\x{119E2}\\x{11A3F}-\\x{11A46}"              \
    "\\x{11A9A}-\\x{11A9C}\\x{11A9E}-\\x{11AA2}\\x{11C41}-\\x{11C45}\\x{11C70}\\x{11C71}\\x{11EF7}\\x{11EF8}"     \
    "\\x{11FFF}\\x{12FF1}\\x{12FF2}\\x{16E97}-\\x{16E9A}\\x{16FE2}\\x{1E95E}\\x{1E95F}])"                        \
    "[\\p{P}!-/:-@\\[-`{-~\\x{166D}\\x{111C9}]"

static int prepend_scheme_of(const json_t *v) {
    const char *x = json_string_value(v);
    return !x ? -1 : strcmp(x, "always") == 0 ? PREPEND_ALWAYS : strcmp(x, "first") == 0 ? PREPEND_FIRST : strcmp(x, "never") == 0 ? PREPEND_NEVER : -1;
}

static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* A Split pre-tokenizer: a regex or a literal, its behavior, inverted or not. */
static trill_status load_split(trill_tokenizer *t, const json_t *p, const char *what) {
    const json_t *pat = json_object_get(p, "pattern");
    const json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
    if (!json_is_string(re) && !json_is_string(lit))
        return trill_error(TRILL_ERR_INVALID, "%s: pre_tokenizer Split: \"pattern\" must be {\"Regex\": ...} or {\"String\": ...}", what);
    const json_t *b = json_object_get(p, "behavior");
    int behavior = split_behavior_of(b);
    if (behavior < 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: pre_tokenizer Split: behavior %s is not supported (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)",
                           what, json_is_string(b) ? json_string_value(b) : "(missing)");
    return add_pre(t, what, json_string_value(json_is_string(re) ? re : lit), !json_is_string(re),
                   (split_behavior)behavior, flag(p, "invert", false), false);
}

/* A Metaspace pre-tokenizer: spaces replaced by one character, prepended by the scheme, split before it. */
static trill_status load_metaspace(trill_tokenizer *t, const json_t *p, const char *what) {
    const json_t *rep = json_object_get(p, "replacement"), *scheme = json_object_get(p, "prepend_scheme");
    uint32_t cp;
    if (!json_is_string(rep) || json_string_length(rep) == 0 ||
        (size_t)trill_utf8_decode(json_string_value(rep), &cp) != json_string_length(rep))
        return trill_error(TRILL_ERR_INVALID, "%s: pre_tokenizer Metaspace: \"replacement\" must be one character", what);
    int ps = scheme ? prepend_scheme_of(scheme) : flag(p, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
    if (ps < 0) return trill_error(TRILL_ERR_INVALID, "%s: pre_tokenizer Metaspace: prepend_scheme must be always, first or never", what);
    trill_status st = add_pre(t, what, NULL, false, SPLIT_ISOLATED, false, false);
    if (st) return st;
    t->pre[t->n_pre - 1].metaspace = json_string_value(rep);
    t->pre[t->n_pre - 1].prepend = (prepend_scheme)ps;
    /* split: each piece starts at a replacement character (HF: MergedWithNext on it) */
    return flag(p, "split", true) ? add_pre(t, what, json_string_value(rep), true, SPLIT_MERGED_NEXT, false, false) : TRILL_OK;
}

static trill_status load_pre_tokenizer(trill_tokenizer *t, const json_t *p, const char *what, bool *byte_level) {
    if (!p || json_is_null(p)) return TRILL_OK;
    const char *type = type_of(p);
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list)) return trill_error(TRILL_ERR_INVALID, "%s: pre_tokenizer Sequence: \"pretokenizers\" must be a list", what);
        size_t i;
        const json_t *x;
        json_array_foreach(list, i, x) {
            trill_status st = load_pre_tokenizer(t, x, what, byte_level);
            if (st) return st;
        }
        return TRILL_OK;
    }
    if (strcmp(type, "Split") == 0) return load_split(t, p, what);
    if (strcmp(type, "ByteLevel") == 0) {
        *byte_level = true;
        trill_status st = TRILL_OK;
        bool prefix = flag(p, "add_prefix_space", true);
        if (prefix) st = add_pre(t, what, NULL, false, SPLIT_ISOLATED, false, true);
        if (!st && flag(p, "use_regex", true)) st = add_pre(t, what, GPT2_PATTERN, false, SPLIT_ISOLATED, false, false);
        return st;
    }
    if (strcmp(type, "Digits") == 0) /* Rust char::is_numeric: categories Nd, Nl, No */
        return add_pre(t, what, flag(p, "individual_digits", false) ? "\\p{N}" : "\\p{N}+", false, SPLIT_ISOLATED, false, false);
    /* The four below split by a character predicate in HF (each matching character is one
     * delimiter, so Contiguous is what merges runs): one-character classes here. */
    if (strcmp(type, "WhitespaceSplit") == 0)
        return add_pre(t, what, "[" WHITE_SPACE "]", false, SPLIT_REMOVED, false, false);
    if (strcmp(type, "Whitespace") == 0) /* keeps the matches of \w+|[^\w\s]+, drops the rest */
        return add_pre(t, what, "[" RUST_WORD "]+|[^" RUST_WORD WHITE_SPACE "]+", false, SPLIT_REMOVED, true, false);
    if (strcmp(type, "BertPreTokenizer") == 0) {
        trill_status st = add_pre(t, what, "[" WHITE_SPACE "]", false, SPLIT_REMOVED, false, false);
        return st ? st : add_pre(t, what, HF_PUNCTUATION, false, SPLIT_ISOLATED, false, false);
    }
    if (strcmp(type, "Punctuation") == 0) {
        const json_t *b = json_object_get(p, "behavior");
        int behavior = b ? split_behavior_of(b) : SPLIT_ISOLATED; /* HF's default when absent */
        if (behavior < 0)
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: pre_tokenizer Punctuation: behavior %s is not supported (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)",
                               what, json_is_string(b) ? json_string_value(b) : "(not a string)");
        return add_pre(t, what, HF_PUNCTUATION, false, (split_behavior)behavior, false, false);
    }
    if (strcmp(type, "Metaspace") == 0) return load_metaspace(t, p, what);
    return trill_error(TRILL_ERR_UNSUPPORTED, "%s: pre_tokenizer \"%s\" is not supported (supported: Split, ByteLevel, Digits, Whitespace, WhitespaceSplit, Punctuation, BertPreTokenizer, Metaspace, Sequence)", what, type);
}

static trill_status set_token(trill_tokenizer *t, const char *what, const char *s, size_t len, json_int_t id) {
    if (id < 0 || id >= (1 << 24)) return trill_error(TRILL_ERR_INVALID, "%s: token \"%s\": id %lld out of range [0, 2^24)", what, s, (long long)id);
    if (id >= t->id_cap) { /* geometric growth: vocabularies arrive in id order */
        size_t cap = (size_t)id + 1 > 2 * (size_t)t->id_cap ? (size_t)id + 1 : 2 * (size_t)t->id_cap;
        const char **ns = trill_realloc(t->id_str, cap * sizeof *ns);
        if (ns) t->id_str = ns;
        size_t *nl = trill_realloc(t->id_len, cap * sizeof *nl);
        if (nl) t->id_len = nl;
        bool *nsp = trill_realloc(t->id_special, cap * sizeof *nsp);
        if (nsp) t->id_special = nsp;
        if (!ns || !nl || !nsp) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        t->id_cap = (int)cap;
    }
    if (id >= t->size) {
        for (int i = t->size; i <= id; i++) { t->id_str[i] = NULL; t->id_len[i] = 0; t->id_special[i] = false; }
        t->size = (int)id + 1;
    }
    t->id_str[id] = s;
    t->id_len[id] = len;
    return TRILL_OK;
}

static trill_status load_vocab(trill_tokenizer *t, const json_t *model, const char *what) {
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return trill_error(TRILL_ERR_INVALID, "%s: field \"model.vocab\": expected an object {token: id}", what);
    if (trill_strmap_init(&t->vocab, json_object_size(vocab))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const char *key;
    json_t *id;
    json_object_foreach((json_t *)vocab, key, id) {
        if (!json_is_integer(id)) return trill_error(TRILL_ERR_INVALID, "%s: field \"model.vocab\": token \"%s\": expected an integer id", what, key);
        size_t len = strlen(key);
        trill_status st = set_token(t, what, key, len, json_integer_value(id));
        if (st) return st;
        if (trill_strmap_put(&t->vocab, key, len, (int32_t)json_integer_value(id))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    const json_t *unk = json_object_get(model, "unk_token");
    t->unk_id = -1;
    if (json_is_string(unk)) {
        t->unk_id = trill_strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk));
        if (t->unk_id < 0) return trill_error(TRILL_ERR_INVALID, "%s: field \"model.unk_token\": \"%s\" is not in the vocabulary", what, json_string_value(unk));
    }
    return TRILL_OK;
}

static trill_status load_merges(trill_tokenizer *t, const json_t *model, const char *what) {
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) return trill_error(TRILL_ERR_INVALID, "%s: field \"model.merges\": expected a list", what);
    if (trill_u64map_init(&t->merges, json_array_size(merges))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t rank;
    const json_t *m;
    char buf[1024];
    json_array_foreach(merges, rank, m) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) { /* "left right" */
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) return trill_error(TRILL_ERR_INVALID, "%s: model.merges[%zu]: expected \"left right\"", what, rank);
            a = s; la = (size_t)(sp - s); b = sp + 1; lb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)); la = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1)); lb = json_string_length(json_array_get(m, 1));
        } else {
            return trill_error(TRILL_ERR_INVALID, "%s: model.merges[%zu]: expected \"left right\" or [left, right]", what, rank);
        }
        if (la + lb >= sizeof buf) return trill_error(TRILL_ERR_INVALID, "%s: model.merges[%zu]: merged token too long", what, rank);
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int ia = trill_strmap_get(&t->vocab, a, la), ib = trill_strmap_get(&t->vocab, b, lb);
        int im = trill_strmap_get(&t->vocab, buf, la + lb);
        if (ia < 0 || ib < 0 || im < 0)
            return trill_error(TRILL_ERR_INVALID, "%s: model.merges[%zu]: \"%.*s\" + \"%.*s\" uses a token missing from the vocabulary",
                               what, rank, (int)la, a, (int)lb, b);
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib, old;
        if (trill_u64map_get(&t->merges, key, &old)) continue; /* a repeated merge keeps its first rank */
        if (trill_u64map_put(&t->merges, key, (uint64_t)rank << 32 | (uint32_t)im)) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    return TRILL_OK;
}

static trill_status load_model(trill_tokenizer *t, const json_t *model, const char *what, bool byte_level) {
    if (!json_is_object(model)) return trill_error(TRILL_ERR_INVALID, "%s: field \"model\": expected an object", what);
    const char *type = type_of(model);
    trill_status st;
    if (strcmp(type, "WordLevel") == 0) return load_vocab(t, model, what);
    if (strcmp(type, "BPE") != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: model \"%s\" is not supported (supported: BPE, WordLevel)", what, type);
    const json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) != 0.0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: model.dropout: BPE dropout is not supported", what);
    const char *affixes[] = { "continuing_subword_prefix", "end_of_word_suffix" };
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(model, affixes[i]);
        if (json_is_string(v) && json_string_length(v) > 0)
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: model.%s \"%s\" is not supported (expected empty or null)", what, affixes[i], json_string_value(v));
    }
    t->bpe = true;
    t->byte_level = byte_level;
    t->ignore_merges = flag(model, "ignore_merges", false);
    t->byte_fallback = flag(model, "byte_fallback", false);
    t->fuse_unk = flag(model, "fuse_unk", false);
    if ((st = load_vocab(t, model, what)) || (st = load_merges(t, model, what))) return st;
    if (!byte_level) { /* BPE over characters (SentencePiece-style): a character is a symbol; <0xNN> tokens for byte fallback */
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->fallback_id[b] = trill_strmap_get(&t->vocab, name, 6);
        }
        return TRILL_OK;
    }
    for (int b = 0; b < 256; b++) {
        char s[4];
        int n = trill_utf8_encode(t->byte_cp[b], s);
        t->byte_id[b] = trill_strmap_get(&t->vocab, s, (size_t)n);
        if (t->byte_id[b] < 0)
            return trill_error(TRILL_ERR_INVALID, "%s: model.vocab lacks the byte-level symbol \"%.*s\" for byte 0x%02x", what, n, s, b);
    }
    return TRILL_OK;
}

static int cmp_added(const void *x, const void *y) {
    const added_token *a = x, *b = y;
    unsigned char fa = (unsigned char)a->content[0], fb = (unsigned char)b->content[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    return a->len < b->len ? 1 : a->len > b->len ? -1 : 0;
}

static trill_status load_added(trill_tokenizer *t, const json_t *list, const char *what) {
    if (!list || json_is_null(list)) return TRILL_OK;
    if (!json_is_array(list)) return trill_error(TRILL_ERR_INVALID, "%s: field \"added_tokens\": expected a list", what);
    t->added = trill_calloc(json_array_size(list) + 1, sizeof *t->added);
    if (!t->added) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t i;
    const json_t *a;
    json_array_foreach(list, i, a) {
        const json_t *content = json_object_get(a, "content"), *id = json_object_get(a, "id");
        if (!json_is_string(content) || json_string_length(content) == 0 || !json_is_integer(id))
            return trill_error(TRILL_ERR_INVALID, "%s: added_tokens[%zu]: expected {\"id\": integer, \"content\": non-empty string}", what, i);
        if (flag(a, "single_word", false))
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: added_tokens[%zu] \"%s\": single_word true is not supported", what, i, json_string_value(content));
        added_token *x = &t->added[t->n_added++];
        *x = (added_token){ .content = json_string_value(content), .len = json_string_length(content),
                            .id = (int)json_integer_value(id), .special = flag(a, "special", false),
                            .lstrip = flag(a, "lstrip", false), .rstrip = flag(a, "rstrip", false),
                            .normalized = flag(a, "normalized", !flag(a, "special", false)) };
        trill_status st = set_token(t, what, x->content, x->len, json_integer_value(id));
        if (st) return st;
        t->id_special[x->id] = x->special;
    }
    qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < t->n_added && (unsigned char)t->added[k].content[0] < b) k++;
        t->added_first[b] = k;
    }
    for (int k = 0; k < t->n_added; k++) { /* a one-byte token sets every bit: any next byte may follow */
        unsigned char b = (unsigned char)t->added[k].content[0];
        if (t->added[k].len == 1) memset(t->added_second[b], 0xff, sizeof t->added_second[b]);
        else {
            unsigned char c = (unsigned char)t->added[k].content[1];
            t->added_second[b][c >> 3] |= (uint8_t)(1u << (c & 7));
        }
    }
    return TRILL_OK;
}

static trill_status load_post_processor(trill_tokenizer *t, const json_t *p, const char *what) {
    if (!p || json_is_null(p)) return TRILL_OK;
    const char *type = type_of(p);
    if (strcmp(type, "ByteLevel") == 0) return TRILL_OK; /* only adjusts offsets */
    if (strcmp(type, "Sequence") == 0) return load_sequence(t, p, "post_processor", "processors", what, load_post_processor);
    if (strcmp(type, "TemplateProcessing") != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: post_processor \"%s\" is not supported (supported: TemplateProcessing, ByteLevel, Sequence)", what, type);
    const json_t *single = json_object_get(p, "single"), *specials = json_object_get(p, "special_tokens");
    if (!json_is_array(single)) return trill_error(TRILL_ERR_INVALID, "%s: post_processor.single: expected a list", what);
    bool after = false;
    size_t i;
    const json_t *piece;
    json_array_foreach(single, i, piece) {
        const json_t *sp = json_object_get(piece, "SpecialToken");
        if (json_object_get(piece, "Sequence")) { after = true; continue; }
        const json_t *name = json_object_get(sp, "id");
        const json_t *ids = json_object_get(json_object_get(specials, json_string_value(name) ? json_string_value(name) : ""), "ids");
        if (!json_is_string(name) || !json_is_array(ids))
            return trill_error(TRILL_ERR_INVALID, "%s: post_processor.single[%zu]: expected a Sequence or a SpecialToken listed in special_tokens", what, i);
        size_t k;
        const json_t *id;
        json_array_foreach(ids, k, id) {
            if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= t->size || !t->id_str[json_integer_value(id)])
                return trill_error(TRILL_ERR_INVALID, "%s: post_processor special token \"%s\": id %lld is not a token of the vocabulary",
                                   what, json_string_value(name), json_is_integer(id) ? (long long)json_integer_value(id) : -1LL);
            if (ivec_push(after ? &t->suffix : &t->prefix, (int)json_integer_value(id))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        }
    }
    return TRILL_OK;
}

static trill_status load_decoder(trill_tokenizer *t, const json_t *d, const char *what) {
    if (!d || json_is_null(d)) return TRILL_OK;
    t->has_decoder = true;
    const char *type = type_of(d);
    if (strcmp(type, "Sequence") == 0) return load_sequence(t, d, "decoder", "decoders", what, load_decoder);
    if (t->n_dec == MAX_STEPS) return trill_error(TRILL_ERR_UNSUPPORTED, "%s: more than %d decoders", what, MAX_STEPS);
    dec_step *x = &t->dec[t->n_dec];
    *x = (dec_step){ 0 };
    if (strcmp(type, "ByteLevel") == 0) x->kind = DEC_BYTELEVEL;
    else if (strcmp(type, "Fuse") == 0) x->kind = DEC_FUSE;
    else if (strcmp(type, "ByteFallback") == 0) x->kind = DEC_BYTEFALLBACK;
    else if (strcmp(type, "Replace") == 0) {
        const json_t *lit = json_object_get(json_object_get(d, "pattern"), "String"), *with = json_object_get(d, "content");
        if (!json_is_string(lit) || json_string_length(lit) == 0 || !json_is_string(with))
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: decoder Replace: only a non-empty {\"String\": ...} pattern and a string content are supported", what);
        *x = (dec_step){ .kind = DEC_REPLACE, .a = json_string_value(lit), .a_len = json_string_length(lit), .b = json_string_value(with),
                         .b_len = json_string_length(with) };
    } else if (strcmp(type, "Strip") == 0) {
        const json_t *c = json_object_get(d, "content"), *start = json_object_get(d, "start"), *stop = json_object_get(d, "stop");
        uint32_t cp;
        if (!json_is_string(c) || json_string_length(c) == 0 || (size_t)trill_utf8_decode(json_string_value(c), &cp) != json_string_length(c) ||
            !json_is_integer(start) || !json_is_integer(stop) || json_integer_value(start) < 0 || json_integer_value(stop) < 0)
            return trill_error(TRILL_ERR_INVALID, "%s: decoder Strip: expected \"content\" (one character), \"start\" and \"stop\" (counts)", what);
        *x = (dec_step){ .kind = DEC_STRIP, .a = json_string_value(c), .a_len = json_string_length(c),
                         .start = (int)json_integer_value(start), .stop = (int)json_integer_value(stop) };
    } else if (strcmp(type, "Metaspace") == 0) {
        const json_t *rep = json_object_get(d, "replacement"), *scheme = json_object_get(d, "prepend_scheme");
        const int ps = scheme ? prepend_scheme_of(scheme) : flag(d, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
        if (!json_is_string(rep) || json_string_length(rep) == 0 || ps < 0)
            return trill_error(TRILL_ERR_INVALID, "%s: decoder Metaspace: expected a \"replacement\" and a prepend_scheme of always, first or never", what);
        *x = (dec_step){ .kind = DEC_METASPACE, .a = json_string_value(rep), .a_len = json_string_length(rep), .prepend = (prepend_scheme)ps };
    } else {
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported (supported: ByteLevel, Fuse, ByteFallback, Replace, "
                           "Strip, Metaspace, Sequence)", what, type);
    }
    t->n_dec++;
    return TRILL_OK;
}

trill_status trill_tokenizer_from_json(const json_t *root, const char *what, trill_tokenizer **out) {
    if (!json_is_object(root)) return trill_error(TRILL_ERR_INVALID, "%s: expected a JSON object", what);
    trill_tokenizer *t = trill_calloc(1, sizeof *t);
    if (!t) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    t->root = json_incref((json_t *)root);
    build_byte_map(t);
    bool byte_level = false;
    trill_status st;
    if (!(st = load_normalizer(t, json_object_get(root, "normalizer"), what)) &&
        !(st = load_pre_tokenizer(t, json_object_get(root, "pre_tokenizer"), what, &byte_level)) &&
        !(st = load_model(t, json_object_get(root, "model"), what, byte_level)) &&
        !(st = load_added(t, json_object_get(root, "added_tokens"), what)) &&
        !(st = load_post_processor(t, json_object_get(root, "post_processor"), what)))
        st = load_decoder(t, json_object_get(root, "decoder"), what);
    if (st) { trill_tokenizer_free(t); return st; }
    *out = t;
    return TRILL_OK;
}

/* ---- tiktoken vocabularies (Kimi-K2's tiktoken.model, OpenAI's *.tiktoken) ---------------- */

static int b64_value(unsigned char c) {
    return c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52 : c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* Base64 (with '=' padding) at s[0..n) into dst; its length, or -1 if it is not base64. */
static long b64_decode(const char *s, size_t n, unsigned char *dst) {
    long o = 0;
    unsigned acc = 0;
    int bits = 0;
    size_t i = 0;
    for (; i < n && s[i] != '='; i++) {
        const int v = b64_value((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (unsigned)v, bits += 6;
        if (bits >= 8) bits -= 8, dst[o++] = (unsigned char)(acc >> bits);
    }
    for (; i < n; i++) if (s[i] != '=') return -1;
    return o;
}

/* A token's bytes for a message: printable ASCII as they are, other bytes as \xNN; cut to fit. */
static const char *token_text(const char *s, size_t len, char *buf, size_t size) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 5 < size; i++) {
        const unsigned char c = (unsigned char)s[i];
        o += (size_t)snprintf(buf + o, size - o, c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? "%c" : "\\x%02x", c);
    }
    buf[o] = '\0';
    return buf;
}

/* The ranks file: one "base64-token rank" line per token; every byte must be a token. A token
 * on two ranks or two tokens on one are refused, as tiktoken's CoreBPE refuses an encoder and
 * decoder of different sizes: decoding would depend on which came last. */
static trill_status tiktoken_ranks(trill_tokenizer *t, const char *path) {
    char *data = NULL;
    size_t len = 0;
    trill_status st = trill_read_file(path, &data, &len);
    if (st) return st;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += data[i] == '\n';
    t->arena = trill_malloc(len + 1); /* decoded tokens are shorter than their base64 */
    if (!t->arena || trill_strmap_init(&t->vocab, lines)) { free(data); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    size_t used = 0, line = 0;
    char was[160], now[160];
    for (char *p = data, *end = data + len; p < end && !st; line++) {
        char *nl = memchr(p, '\n', (size_t)(end - p)), *stop = nl ? nl : end, *sp = memchr(p, ' ', (size_t)(stop - p));
        if (stop == p || (stop == p + 1 && *p == '\r')) { p = stop + 1; continue; } /* an empty line */
        char *num_end = NULL;
        const long rank = sp ? strtol(sp + 1, &num_end, 10) : -1;
        const long blen = sp ? b64_decode(p, (size_t)(sp - p), (unsigned char *)t->arena + used) : -1;
        const int32_t before = blen > 0 ? trill_strmap_get(&t->vocab, t->arena + used, (size_t)blen) : -1; /* the token's earlier rank */
        if (blen <= 0 || rank < 0 || rank >= (1L << 24) || (num_end != stop && !(num_end + 1 == stop && *num_end == '\r')))
            st = trill_error(TRILL_ERR_INVALID, "%s: line %zu: expected \"<base64 token> <rank>\"", path, line + 1);
        else if (before >= 0)
            st = trill_error(TRILL_ERR_INVALID, "%s: line %zu: the token \"%s\" is listed twice: rank %d before, rank %ld here", path, line + 1,
                             token_text(t->arena + used, (size_t)blen, now, sizeof now), before, rank);
        else if (rank < t->size && t->id_str[rank])
            st = trill_error(TRILL_ERR_INVALID, "%s: line %zu: rank %ld is given twice: to \"%s\" before, to \"%s\" here", path, line + 1, rank,
                             token_text(t->id_str[rank], t->id_len[rank], was, sizeof was), token_text(t->arena + used, (size_t)blen, now, sizeof now));
        else if (!(st = set_token(t, path, t->arena + used, (size_t)blen, rank)) &&
                 trill_strmap_put(&t->vocab, t->arena + used, (size_t)blen, (int32_t)rank))
            st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        used += blen > 0 ? (size_t)blen : 0;
        p = stop + 1;
    }
    free(data);
    for (int b = 0; b < 256 && !st; b++) {
        const char c = (char)b;
        if (trill_strmap_get(&t->vocab, &c, 1) < 0) st = trill_error(TRILL_ERR_INVALID, "%s: byte 0x%02x is not a token (every byte must be)", path, b);
    }
    return st;
}

/* The split pattern from the folder's Python tokenizer (tokenization_*.py's pat_str), read as
 * tiktoken's regex crate reads it (add_pre); only the matches are pieces, as tiktoken's find_iter. */
static trill_status tiktoken_pattern(trill_tokenizer *t, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return trill_error(TRILL_ERR_IO, "%s: cannot list the folder", dir);
    char name[256] = "";
    for (struct dirent *e; (e = readdir(d));) {
        const size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "tokenization_", 13) == 0 && l > 16 && strcmp(e->d_name + l - 3, ".py") == 0 && l < sizeof name &&
            (!name[0] || strcmp(e->d_name, name) < 0))
            snprintf(name, sizeof name, "%s", e->d_name);
    }
    closedir(d);
    if (!name[0]) return trill_error(TRILL_ERR_INVALID, "%s: a tiktoken vocabulary needs its split pattern: no tokenization_*.py with pat_str", dir);
    char *path = trill_path_join(dir, name), *src = NULL, *pattern = NULL;
    size_t len;
    trill_status st = path ? trill_read_file(path, &src, &len) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_tiktoken_pattern_from_python(src, path, &pattern);
    if (!st) st = add_pre(t, path, pattern, false, SPLIT_REMOVED, true, false);
    free(path), free(src), free(pattern);
    return st;
}

/* Special tokens: tokenizer_config.json's added_tokens_decoder {"id": {"content", "special"}}, on
 * ranks the vocabulary (the file `vocab`) leaves free. */
static trill_status tiktoken_specials(trill_tokenizer *t, const char *dir, const char *vocab) {
    char *path = trill_path_join(dir, "tokenizer_config.json");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    json_t *cfg = NULL, *list = json_array();
    if (trill_file_exists(path) && !(st = trill_json_load_file(path, &cfg))) {
        const char *key;
        json_t *v;
        json_object_foreach(json_object_get(cfg, "added_tokens_decoder"), key, v) {
            char *end = NULL;
            const long id = strtol(key, &end, 10);
            if (*end || id < 0 || !json_is_string(json_object_get(v, "content"))) {
                st = trill_error(TRILL_ERR_INVALID, "%s: added_tokens_decoder \"%s\": expected an id and {\"content\": ...}", path, key);
                break;
            }
            if (id < t->size && t->id_str[id]) {
                char had[160];
                st = trill_error(TRILL_ERR_INVALID, "%s: added_tokens_decoder \"%s\": the special token \"%s\" is on rank %ld, which %s gives to \"%s\"",
                                 path, key, json_string_value(json_object_get(v, "content")), id, vocab,
                                 token_text(t->id_str[id], t->id_len[id], had, sizeof had));
                break;
            }
            json_array_append_new(list, json_pack("{s:I, s:O, s:b, s:b, s:b, s:b}", "id", (json_int_t)id, "content", json_object_get(v, "content"),
                                                  "special", flag(v, "special", true), "lstrip", flag(v, "lstrip", false), "rstrip",
                                                  flag(v, "rstrip", false), "normalized", 0));
        }
    }
    if (!st) st = load_added(t, list, path);
    if (!st) json_object_set_new(t->root, "tiktoken_added", list); /* the strings load_added points to live in t->root */
    else json_decref(list);
    json_decref(cfg);
    free(path);
    return st;
}

/* DIR's tiktoken.model or *.tiktoken (the first by name), when it has no tokenizer.json. */
static bool tiktoken_file(const char *dir, char *out, size_t cap) {
    snprintf(out, cap, "%s/tiktoken.model", dir);
    if (trill_file_exists(out)) return true;
    DIR *d = opendir(dir);
    char best[256] = "";
    for (struct dirent *e; d && (e = readdir(d));) {
        const size_t l = strlen(e->d_name);
        if (l > 9 && l < sizeof best && strcmp(e->d_name + l - 9, ".tiktoken") == 0 && (!best[0] || strcmp(e->d_name, best) < 0))
            snprintf(best, sizeof best, "%s", e->d_name);
    }
    if (d) closedir(d);
    snprintf(out, cap, "%s/%s", dir, best);
    return best[0] != '\0';
}

static trill_status tiktoken_load(const char *dir, const char *file, trill_tokenizer **out) {
    trill_tokenizer *t = trill_calloc(1, sizeof *t);
    if (!t || !(t->root = json_object())) { free(t); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    build_byte_map(t);
    t->bpe = t->tiktoken = true;
    t->unk_id = -1;
    t->has_decoder = true; /* the tokens' bytes, joined */
    trill_status st = tiktoken_ranks(t, file);
    if (!st) st = tiktoken_pattern(t, dir);
    if (!st) st = tiktoken_specials(t, dir, file);
    if (st) { trill_tokenizer_free(t); return st; }
    *out = t;
    return TRILL_OK;
}

trill_status trill_tokenizer_load(const char *dir, trill_tokenizer **out) {
    char *path = trill_path_join(dir, "tokenizer.json");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    char tk[4096];
    if (!trill_file_exists(path) && tiktoken_file(dir, tk, sizeof tk)) {
        free(path);
        return tiktoken_load(dir, tk, out);
    }
    json_t *root;
    trill_status st = trill_json_load_file(path, &root);
    if (!st) {
        st = trill_tokenizer_from_json(root, path, out);
        json_decref(root);
    }
    free(path);
    return st;
}

trill_status trill_tokenizer_parse(const char *text, size_t len, const char *what, trill_tokenizer **out) {
    json_t *root;
    trill_status st = trill_json_parse(what, text, len, &root);
    if (st) return st;
    st = trill_tokenizer_from_json(root, what, out);
    json_decref(root);
    return st;
}

/* ---- encoding ----------------------------------------------------------------------------- */

typedef struct span { size_t start, end; } span;
typedef struct spans { span *v; size_t n, cap; } spans;

static int spans_push(spans *s, size_t start, size_t end) {
    if (start == end) return 0; /* empty pieces vanish, as in HF */
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        span *g = trill_realloc(s->v, cap * sizeof *g);
        if (!g) return -1;
        s->v = g;
        s->cap = cap;
    }
    s->v[s->n++] = (span){ start, end };
    return 0;
}

static bool is_unicode_space(uint32_t cp) {
    return cp == ' ' || (cp >= 9 && cp <= 13) || cp == 0x85 || utf8proc_category((utf8proc_int32_t)cp) == UTF8PROC_CATEGORY_ZS ||
           cp == 0x2028 || cp == 0x2029;
}

/* A stretch of a piece: the pattern's match (m) or the text between matches. */
typedef struct seg { size_t s, e; bool m; } seg;

/* The piece cut into the pattern's matches and the text between them, in order (inverted when the
 * step says so); *segs malloc'ed. Fails when out of memory (PCRE2's included) or when PCRE2 gives
 * up on the piece (its match limits). */
static trill_status find_segments(const pre_step *p, const char *text, span piece, pcre2_match_data *md, seg **segs_out, size_t *n_out) {
    seg *segs = NULL;
    size_t n = 0, cap = 0, prev = piece.start, at = piece.start;
    while (at <= piece.end) {
        int rc = pcre2_match(p->re, (PCRE2_SPTR)text, piece.end, at, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { /* never read as "no more matches": the text would be cut silently */
            free(segs);
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return trill_error(rc == PCRE2_ERROR_NOMEMORY ? TRILL_ERR_NOMEM : TRILL_ERR_UNSUPPORTED, "pre-tokenizer regex: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step one character */
            if (ms >= piece.end) break;
            uint32_t cp;
            at = ms + (size_t)trill_utf8_decode(text + ms, &cp);
            continue;
        }
        if (n + 2 > cap) {
            cap = cap ? cap * 2 : 16;
            seg *g = trill_realloc(segs, cap * sizeof *g);
            if (!g) { free(segs); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
            segs = g;
        }
        if (ms > prev) segs[n++] = (seg){ prev, ms, false };
        segs[n++] = (seg){ ms, me, true };
        prev = at = me;
    }
    if (prev < piece.end) {
        seg *g = trill_realloc(segs, (n + 1) * sizeof *g);
        if (!g) { free(segs); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
        segs = g;
        segs[n++] = (seg){ prev, piece.end, false };
    }
    if (p->invert)
        for (size_t i = 0; i < n; i++) segs[i].m = !segs[i].m;
    *segs_out = segs;
    *n_out = n;
    return TRILL_OK;
}

/* Splits one piece by a regex, applying HF's SplitDelimiterBehavior to its segments. */
static trill_status split_piece(const pre_step *p, const char *text, span piece, pcre2_match_data *md, spans *out) {
    seg *segs = NULL;
    size_t n = 0;
    trill_status st = find_segments(p, text, piece, md, &segs, &n);
    if (st) return st;
    int err = 0;
    switch (p->behavior) {
    case SPLIT_REMOVED:
        for (size_t i = 0; i < n && !err; i++)
            if (!segs[i].m) err = spans_push(out, segs[i].s, segs[i].e);
        break;
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < n && !err; i++) err = spans_push(out, segs[i].s, segs[i].e);
        break;
    case SPLIT_MERGED_PREV: { /* a delimiter joins the piece before it */
        size_t first = out->n;
        bool prev_match = false;
        for (size_t i = 0; i < n && !err; i++) {
            if (segs[i].m && !prev_match && out->n > first) out->v[out->n - 1].end = segs[i].e;
            else err = spans_push(out, segs[i].s, segs[i].e);
            prev_match = segs[i].m;
        }
        break;
    }
    case SPLIT_MERGED_NEXT: { /* a delimiter joins the piece after it: walk backwards */
        size_t first = out->n;
        bool prev_match = false;
        for (size_t i = n; i-- > 0 && !err;) {
            if (segs[i].m && !prev_match && out->n > first) out->v[out->n - 1].start = segs[i].s;
            else err = spans_push(out, segs[i].s, segs[i].e);
            prev_match = segs[i].m;
        }
        for (size_t a = first, b = out->n; a + 1 < b; a++, b--) { span tmp = out->v[a]; out->v[a] = out->v[b - 1]; out->v[b - 1] = tmp; }
        break;
    }
    case SPLIT_CONTIGUOUS: { /* runs of delimiters become one piece */
        size_t first = out->n;
        bool prev_match = false;
        for (size_t i = 0; i < n && !err; i++) {
            if (segs[i].m == prev_match && out->n > first) out->v[out->n - 1].end = segs[i].e;
            else err = spans_push(out, segs[i].s, segs[i].e);
            prev_match = segs[i].m;
        }
        break;
    }
    }
    free(segs);
    return err ? trill_error(TRILL_ERR_NOMEM, "out of memory") : TRILL_OK;
}

/* Byte-level BPE (bpe() below) keeps HF's merge order: lowest rank first, leftmost on ties. */
typedef struct bpe_pair { uint32_t rank, left; int32_t left_id, right_id, merged; } bpe_pair;

static bool pair_less(const bpe_pair *a, const bpe_pair *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(bpe_pair *h, size_t *n, bpe_pair x) {
    size_t i = (*n)++;
    while (i > 0 && pair_less(&x, &h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = x;
}

static bpe_pair heap_pop(bpe_pair *h, size_t *n) {
    bpe_pair top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && pair_less(&h[c + 1], &h[c])) c++;
        if (!pair_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Pushes the pair starting at symbol `left` if the vocabulary has a merge for it. */
static void push_pair(const trill_tokenizer *t, bpe_pair *h, size_t *n, const int *ids, const int *next, int left) {
    if (left < 0 || next[left] < 0) return;
    uint64_t v;
    int a = ids[left], b = ids[next[left]];
    if (trill_u64map_get(&t->merges, (uint64_t)(uint32_t)a << 32 | (uint32_t)b, &v))
        heap_push(h, n, (bpe_pair){ (uint32_t)(v >> 32), (uint32_t)left, a, b, (int32_t)(uint32_t)v });
}

/* The merge of symbols (a, b): rank << 32 | merged id, or UINT64_MAX when there is none. */
static uint64_t merge_of(const trill_tokenizer *t, int a, int b) {
    uint64_t v;
    return trill_u64map_get(&t->merges, (uint64_t)(uint32_t)a << 32 | (uint32_t)b, &v) ? v : UINT64_MAX;
}

/* Short words (nearly all of them): a scan over cached pair merges, re-looking up only the two
 * pairs a merge changes. Same order as the heap: lowest rank, leftmost on ties. */
static int bpe_short(const trill_tokenizer *t, int *ids, size_t n, ivec *out) {
    uint64_t merge[SHORT_WORD];
    for (size_t i = 0; i + 1 < n; i++) merge[i] = merge_of(t, ids[i], ids[i + 1]);
    while (n > 1) {
        size_t at = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (merge[i] < merge[at]) at = i;
        if (merge[at] == UINT64_MAX) break;
        ids[at] = (int)(uint32_t)merge[at];
        memmove(ids + at + 1, ids + at + 2, (n - at - 2) * sizeof *ids);
        memmove(merge + at + 1, merge + at + 2, (n > at + 3 ? n - at - 3 : 0) * sizeof *merge);
        n--;
        if (at > 0) merge[at - 1] = merge_of(t, ids[at - 1], ids[at]);
        if (at + 1 < n) merge[at] = merge_of(t, ids[at], ids[at + 1]);
    }
    int err = 0;
    for (size_t i = 0; i < n && !err; i++) err = ivec_push(out, ids[i]);
    return err;
}

/* Long words: symbols in a linked list, candidate pairs in a min-heap keyed (rank, position);
 * entries made stale by an earlier merge are skipped when popped. O(n log n), so a long
 * unbroken word (base64, a run of CJK) cannot stall encode. */
static int bpe_long(const trill_tokenizer *t, const int *first_ids, size_t n, ivec *out) {
    /* the heap starts with n-1 pairs; each merge pops one and pushes <= 2: never above 2n */
    unsigned char *block = trill_malloc(n * (3 * sizeof(int) + 2 * sizeof(bpe_pair)));
    if (!block) return -1;
    bpe_pair *heap = (bpe_pair *)block;
    int *ids = (int *)(heap + 2 * n), *prev = ids + n, *next = prev + n;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        ids[i] = first_ids[i];
        prev[i] = (int)i - 1;
        next[i] = i + 1 < n ? (int)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, heap, &hn, ids, next, (int)i);
    while (hn > 0) {
        bpe_pair p = heap_pop(heap, &hn);
        int l = (int)p.left, r = next[l];
        if (ids[l] != p.left_id || r < 0 || ids[r] != p.right_id) continue; /* stale */
        ids[l] = p.merged;
        ids[r] = -1; /* r leaves the list */
        next[l] = next[r];
        if (next[r] >= 0) prev[next[r]] = l;
        push_pair(t, heap, &hn, ids, next, prev[l]);
        push_pair(t, heap, &hn, ids, next, l);
    }
    int err = 0;
    for (int i = 0; i >= 0 && !err; i = next[i]) err = ivec_push(out, ids[i]);
    free(block);
    return err;
}

/* Byte-level BPE of one pre-token, as HF: its bytes' symbols, then merges by rank. */
static int bpe(const trill_tokenizer *t, const unsigned char *s, size_t n, ivec *out) {
    if (n == 0) return 0;
    if (t->ignore_merges) {
        char *mapped = trill_calloc(n * 2 + 1, 1);
        if (!mapped) return -1;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) m += (size_t)trill_utf8_encode(t->byte_cp[s[i]], mapped + m);
        int id = trill_strmap_get(&t->vocab, mapped, m);
        free(mapped);
        if (id >= 0) return ivec_push(out, id);
    }
    int stack_ids[SHORT_WORD], *ids = n <= SHORT_WORD ? stack_ids : trill_malloc(n * sizeof *ids);
    if (!ids) return -1;
    for (size_t i = 0; i < n; i++) ids[i] = t->byte_id[s[i]];
    int err = n <= SHORT_WORD ? bpe_short(t, ids, n, out) : bpe_long(t, ids, n, out);
    if (ids != stack_ids) free(ids);
    return err;
}

/* BPE over characters (SentencePiece-style tokenizer.json, as HF): each character is a symbol;
 * one outside the vocabulary becomes its bytes' <0xNN> tokens with byte_fallback (when all are
 * there), else unk_token (a run of them one unk with fuse_unk); then the merges by rank. */
static trill_status bpe_chars(const trill_tokenizer *t, const char *s, size_t n, ivec *out) {
    if (n == 0) return TRILL_OK;
    if (t->ignore_merges) {
        const int id = trill_strmap_get(&t->vocab, s, n);
        if (id >= 0) return ivec_push(out, id) ? trill_error(TRILL_ERR_NOMEM, "out of memory") : TRILL_OK;
    }
    int stack_ids[SHORT_WORD], *ids = n <= SHORT_WORD ? stack_ids : trill_malloc(n * sizeof *ids); /* a symbol per byte at most */
    if (!ids) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        const size_t l = (size_t)trill_utf8_decode(s + i, &cp);
        const int id = trill_strmap_get(&t->vocab, s + i, l);
        bool bytes = t->byte_fallback;
        for (size_t k = 0; bytes && k < l; k++) bytes = t->fallback_id[(unsigned char)s[i + k]] >= 0;
        if (id >= 0) ids[m++] = id;
        else if (bytes) for (size_t k = 0; k < l; k++) ids[m++] = t->fallback_id[(unsigned char)s[i + k]];
        else if (t->unk_id >= 0) {
            if (!(t->fuse_unk && m > 0 && ids[m - 1] == t->unk_id)) ids[m++] = t->unk_id;
        } else {
            if (ids != stack_ids) free(ids);
            return trill_error(TRILL_ERR_INVALID, "\"%.*s\" is not in the vocabulary, and the tokenizer has neither byte_fallback "
                               "tokens for it nor an unk_token", (int)l, s + i);
        }
        i += l;
    }
    const int err = m <= SHORT_WORD ? bpe_short(t, ids, m, out) : bpe_long(t, ids, m, out);
    if (ids != stack_ids) free(ids);
    return err ? trill_error(TRILL_ERR_NOMEM, "out of memory") : TRILL_OK;
}

/* tiktoken's byte-pair merge of one piece: the piece itself when it is a token; else its bytes,
 * merging the adjacent pair whose joined bytes have the lowest rank (leftmost on ties) until no
 * joined pair is a token. A symbol is a span of the piece, so a pair's rank is one lookup. */
static trill_status bpe_ranks(const trill_tokenizer *t, const char *s, size_t n, ivec *out) {
    if (n == 0) return TRILL_OK;
    int id = trill_strmap_get(&t->vocab, s, n);
    if (id >= 0) return ivec_push(out, id) ? trill_error(TRILL_ERR_NOMEM, "out of memory") : TRILL_OK;
    size_t *start = trill_malloc(sizeof *start * (n + 1));
    int32_t *rank = trill_malloc(sizeof *rank * (n + 1)); /* rank[i]: of symbols i and i + 1 joined, INT32_MAX: not a token */
    if (!start || !rank) { free(start), free(rank); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    size_t m = n;
    for (size_t i = 0; i <= n; i++) start[i] = i;
    for (size_t i = 0; i + 1 < m; i++) {
        const int r = trill_strmap_get(&t->vocab, s + start[i], start[i + 2] - start[i]);
        rank[i] = r >= 0 ? r : INT32_MAX;
    }
    while (m > 1) {
        size_t at = 0;
        for (size_t i = 1; i + 1 < m; i++)
            if (rank[i] < rank[at]) at = i;
        if (rank[at] == INT32_MAX) break;
        memmove(start + at + 1, start + at + 2, (m - at - 1) * sizeof *start); /* symbols at and at + 1 become one */
        memmove(rank + at + 1, rank + at + 2, (m > at + 3 ? m - at - 3 : 0) * sizeof *rank);
        m--;
        for (size_t i = at ? at - 1 : 0; i <= at && i + 1 < m; i++) {
            const int r = trill_strmap_get(&t->vocab, s + start[i], start[i + 2] - start[i]);
            rank[i] = r >= 0 ? r : INT32_MAX;
        }
    }
    trill_status st = TRILL_OK;
    for (size_t i = 0; i < m && !st; i++) /* every byte is a token (checked at load), so every symbol is */
        if (ivec_push(out, trill_strmap_get(&t->vocab, s + start[i], start[i + 1] - start[i]))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(start), free(rank);
    return st;
}

/* Metaspace: each piece's spaces become the replacement character, and (by the prepend scheme)
 * a piece that does not start with one gets it in front — "first": only the input's first
 * piece (at_start: this text starts the input). Rebuilds the text into *buf. */
static trill_status metaspace(const pre_step *p, const char **text, size_t *len, spans *cur, spans *next, char **buf, bool at_start) {
    const size_t rl = strlen(p->metaspace);
    size_t need = 0;
    for (size_t k = 0; k < cur->n; k++) {
        for (size_t i = cur->v[k].start; i < cur->v[k].end; i++) need += (*text)[i] == ' ' ? rl : 1;
        need += rl;
    }
    char *nb = trill_malloc(need + 1);
    if (!nb) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t o = 0;
    for (size_t k = 0; k < cur->n; k++) {
        const size_t s0 = o;
        for (size_t i = cur->v[k].start; i < cur->v[k].end; i++) {
            if ((*text)[i] == ' ') memcpy(nb + o, p->metaspace, rl), o += rl;
            else nb[o++] = (*text)[i];
        }
        const bool starts = o - s0 >= rl && memcmp(nb + s0, p->metaspace, rl) == 0;
        if (!starts && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && at_start && cur->v[k].start == 0))) {
            memmove(nb + s0 + rl, nb + s0, o - s0);
            memcpy(nb + s0, p->metaspace, rl);
            o += rl;
        }
        if (spans_push(next, s0, o)) { free(nb); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    }
    free(*buf);
    *buf = nb;
    *text = nb;
    *len = o;
    return TRILL_OK;
}

/* ByteLevel's add_prefix_space: the text rebuilt with ' ' before each piece of cur that lacks it
 * (*buf owns the new text), its pieces into next. */
static trill_status prefix_spaces(const char **text, size_t *len, const spans *cur, spans *next, char **buf) {
    size_t extra = 0;
    for (size_t k = 0; k < cur->n; k++) extra += (*text)[cur->v[k].start] != ' ';
    char *nb = trill_malloc(*len + extra + 1);
    if (!nb) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    size_t o = 0;
    for (size_t k = 0; k < cur->n; k++) {
        size_t s0 = o;
        if ((*text)[cur->v[k].start] != ' ') nb[o++] = ' ';
        memcpy(nb + o, *text + cur->v[k].start, cur->v[k].end - cur->v[k].start);
        o += cur->v[k].end - cur->v[k].start;
        if (spans_push(next, s0, o)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    free(*buf);
    *buf = nb;
    *text = nb;
    *len = o;
    return st;
}

/* One pre-tokenized piece s[0..n) by the model: tiktoken ranks, BPE over characters or bytes, or a
 * word-level vocabulary (with its unk_token). */
static trill_status encode_piece(const trill_tokenizer *t, const char *s, size_t n, ivec *out) {
    if (t->tiktoken) return bpe_ranks(t, s, n, out);
    if (t->bpe && !t->byte_level) return bpe_chars(t, s, n, out);
    int err;
    if (t->bpe) {
        err = bpe(t, (const unsigned char *)s, n, out);
    } else {
        int id = trill_strmap_get(&t->vocab, s, n);
        if (id < 0 && t->unk_id < 0)
            return trill_error(TRILL_ERR_INVALID, "\"%.*s\" is not in the vocabulary and the tokenizer has no unk_token", (int)n, s);
        err = ivec_push(out, id >= 0 ? id : t->unk_id);
    }
    return err ? trill_error(TRILL_ERR_NOMEM, "out of memory") : TRILL_OK;
}

/* Pre-tokenises and encodes one normalised piece of text (no added tokens inside); at_start:
 * the piece begins the input (Metaspace's "first" scheme). */
static trill_status encode_plain(const trill_tokenizer *t, const char *text, size_t len, pcre2_match_data *md, ivec *out, bool at_start) {
    char *buf = NULL; /* owned copy when a ByteLevel step prepends spaces */
    spans cur = { 0 }, next = { 0 };
    trill_status st = TRILL_OK;
    if (spans_push(&cur, 0, len)) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < t->n_pre && !st; i++) {
        const pre_step *p = &t->pre[i];
        next.n = 0;
        if (p->metaspace) {
            st = metaspace(p, &text, &len, &cur, &next, &buf, at_start);
        } else if (!p->re) {
            st = prefix_spaces(&text, &len, &cur, &next, &buf);
        } else {
            for (size_t k = 0; k < cur.n && !st; k++)
                st = split_piece(p, text, cur.v[k], md, &next);
        }
        spans tmp = cur; cur = next; next = tmp;
    }
    for (size_t k = 0; k < cur.n && !st; k++) st = encode_piece(t, text + cur.v[k].start, cur.v[k].end - cur.v[k].start, out);
    free(cur.v);
    free(next.v);
    free(buf);
    return st;
}

/* s with every occurrence of x's literal pattern, or match of its regex, replaced by its content
 * (HF's Replace normalizer), into *out (malloc'ed). */
static trill_status replace_all(const norm_step *x, const char *s, size_t n, char **out, size_t *out_len) {
    if (x->re) {
        PCRE2_SIZE cap = n + 64;
        for (int attempt = 0; attempt < 2; attempt++) {
            char *dst = trill_malloc(cap + 1);
            if (!dst) return trill_error(TRILL_ERR_NOMEM, "out of memory");
            PCRE2_SIZE got = cap + 1;
            int rc = pcre2_substitute(x->re, (PCRE2_SPTR)s, n, 0, PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_LITERAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH,
                                      NULL, NULL, (PCRE2_SPTR)x->with, x->with_len, (PCRE2_UCHAR *)dst, &got);
            if (rc >= 0) { *out = dst, *out_len = got; return TRILL_OK; }
            free(dst);
            if (rc != PCRE2_ERROR_NOMEMORY) return trill_error(TRILL_ERR_INVALID, "normalizer Replace: the regex failed (PCRE2 error %d)", rc);
            cap = got; /* the length it needs */
        }
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    size_t count = 0;
    for (size_t i = 0; i + x->text_len <= n;) {
        if (memcmp(s + i, x->text, x->text_len) == 0) count++, i += x->text_len;
        else i++;
    }
    char *dst = trill_malloc(n + count * x->with_len + 1);
    if (!dst) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        if (i + x->text_len <= n && memcmp(s + i, x->text, x->text_len) == 0) {
            memcpy(dst + o, x->with, x->with_len), o += x->with_len, i += x->text_len;
        } else dst[o++] = s[i++];
    }
    dst[o] = '\0';
    *out = dst, *out_len = o;
    return TRILL_OK;
}

static trill_status normalize(const trill_tokenizer *t, const char *s, size_t n, char **out, size_t *out_len) {
    char *cur = trill_malloc(n + 1);
    if (!cur) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    memcpy(cur, s, n);
    cur[n] = '\0';
    bool ascii = true; /* every Unicode normal form leaves ASCII unchanged */
    for (size_t i = 0; i < n && ascii; i++) ascii = (unsigned char)s[i] < 0x80;
    for (int i = 0; i < t->n_norm; i++) {
        const norm_step *x = &t->norm[i];
        char *next = NULL;
        size_t m = 0;
        trill_status st = TRILL_OK;
        if (x->kind == NORM_FORM) {
            if (ascii) continue;
            utf8proc_uint8_t *dst = NULL;
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)n, &dst, x->form);
            if (r < 0) st = trill_error(r == UTF8PROC_ERROR_NOMEM ? TRILL_ERR_NOMEM : TRILL_ERR_INVALID, "normalization failed: %s", utf8proc_errmsg(r));
            next = (char *)dst, m = r < 0 ? 0 : (size_t)r;
        } else if (x->kind == NORM_PREPEND) {
            if (n == 0) continue; /* HF prepends to non-empty text only */
            if (!(next = trill_malloc(x->text_len + n + 1))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
            else memcpy(next, x->text, x->text_len), memcpy(next + x->text_len, cur, n + 1), m = x->text_len + n;
        } else {
            st = replace_all(x, cur, n, &next, &m);
        }
        free(cur);
        if (st) { free(next); return st; }
        cur = next, n = m;
        for (size_t k = 0; k < n && ascii; k++) ascii = (unsigned char)cur[k] < 0x80;
    }
    *out = cur;
    *out_len = n;
    return TRILL_OK;
}

/* The leftmost-longest added token (of the given normalized-ness) at or after `from`. */
static const added_token *find_added(const trill_tokenizer *t, const char *s, size_t from, size_t n, bool normalized, size_t *at) {
    for (size_t i = from; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        if (t->added_first[b] == t->added_first[b + 1]) continue;
        if (i + 1 < n) { /* most candidates share a first byte ('<'): the second rules them out */
            unsigned char c = (unsigned char)s[i + 1];
            if (!(t->added_second[b][c >> 3] & (1u << (c & 7)))) continue;
        }
        for (int k = t->added_first[b]; k < t->added_first[b + 1]; k++) {
            const added_token *a = &t->added[k];
            if (a->normalized == normalized && a->len <= n - i && memcmp(s + i, a->content, a->len) == 0) {
                *at = i;
                return a;
            }
        }
    }
    return NULL;
}

/* Encodes s[0..n), splitting on added tokens of one kind; `normalized` false is the first,
 * raw-text phase, whose remaining pieces are normalised and go through the second phase. */
static trill_status encode_phase(const trill_tokenizer *t, const char *s, size_t n, bool normalized, pcre2_match_data *md, ivec *out,
                                 bool at_start) {
    size_t pos = 0;
    trill_status st = TRILL_OK;
    while (pos <= n && !st) {
        size_t at = n;
        const added_token *a = pos < n ? find_added(t, s, pos, n, normalized, &at) : NULL;
        size_t text_end = a ? at : n, resume = a ? at + a->len : n;
        if (a && a->lstrip) /* the token absorbs whitespace on its left */
            while (text_end > pos) {
                size_t k = text_end - 1;
                while (k > pos && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
                uint32_t cp;
                trill_utf8_decode(s + k, &cp);
                if (!is_unicode_space(cp)) break;
                text_end = k;
            }
        if (a && a->rstrip)
            while (resume < n) {
                uint32_t cp;
                int l = trill_utf8_decode(s + resume, &cp);
                if (!is_unicode_space(cp)) break;
                resume += (size_t)l;
            }
        if (text_end > pos) {
            if (normalized) {
                st = encode_plain(t, s + pos, text_end - pos, md, out, at_start && pos == 0);
            } else {
                char *norm = NULL;
                size_t nl = 0;
                if (!(st = normalize(t, s + pos, text_end - pos, &norm, &nl))) {
                    st = encode_phase(t, norm, nl, true, md, out, at_start && pos == 0);
                    free(norm);
                }
            }
        }
        if (!st && a && ivec_push(out, a->id)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!a) break;
        pos = resume;
    }
    return st;
}

trill_status trill_tokenizer_encode(const trill_tokenizer *t, const char *text, size_t len, bool add_special_tokens,
                                    int **ids, size_t *n) {
    size_t clean_len;
    char *clean = trill_utf8_sanitize(text, len, &clean_len);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    ivec out = { 0 };
    trill_status st = clean && md ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && add_special_tokens)
        for (size_t i = 0; i < t->prefix.n && !st; i++)
            if (ivec_push(&out, t->prefix.v[i])) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = encode_phase(t, clean, clean_len, false, md, &out, true);
    if (!st && add_special_tokens)
        for (size_t i = 0; i < t->suffix.n && !st; i++)
            if (ivec_push(&out, t->suffix.v[i])) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && !out.v && !(out.v = trill_malloc(sizeof(int)))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    pcre2_match_data_free(md);
    free(clean);
    if (st) { free(out.v); return st; }
    *ids = out.v;
    *n = out.n;
    return TRILL_OK;
}

/* ---- decoding ----------------------------------------------------------------------------- */

/* The decoder chain works on a list of token strings, as HF's decode_chain. */
typedef struct dstr { char *s; size_t len; } dstr;

static void dlist_free(dstr *v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i].s);
    free(v);
}

static bool dstr_set(dstr *d, const char *s, size_t len) {
    char *c = trill_malloc(len + 1);
    if (!c) return false;
    memcpy(c, s, len);
    c[len] = '\0';
    free(d->s);
    d->s = c, d->len = len;
    return true;
}

/* ByteLevel: every token's characters back to their bytes (a token with any other character
 * keeps its own bytes), all of them one string. */
static bool dec_bytelevel(const trill_tokenizer *t, dstr *v, size_t *n) {
    if (*n == 0) return true;
    size_t total = 0;
    for (size_t i = 0; i < *n; i++) total += v[i].len;
    char *raw = trill_malloc(total + 1);
    if (!raw) return false;
    size_t o = 0;
    for (size_t i = 0; i < *n; i++) {
        const size_t start = o;
        bool mapped = true;
        for (size_t k = 0; k < v[i].len && mapped;) {
            uint32_t cp;
            k += (size_t)trill_utf8_decode(v[i].s + k, &cp);
            const int b = cp < BYTE_CP_LIMIT ? t->cp_byte[cp] : -1;
            if (b < 0) mapped = false;
            else raw[o++] = (char)b;
        }
        if (!mapped) memcpy(raw + start, v[i].s, v[i].len), o = start + v[i].len;
    }
    for (size_t i = 0; i < *n; i++) free(v[i].s), v[i] = (dstr){ 0 };
    v[0] = (dstr){ raw, o };
    *n = 1;
    return true;
}

/* Every a in token d becomes with (the Replace and Metaspace decoders). */
static bool replace_token(dstr *d, const char *a, size_t a_len, const char *with, size_t with_len) {
    norm_step r = { .kind = NORM_REPLACE, .text = a, .text_len = a_len, .with = with, .with_len = with_len };
    char *out = NULL;
    size_t len = 0;
    if (replace_all(&r, d->s, d->len, &out, &len)) return false;
    free(d->s);
    *d = (dstr){ out, len };
    return true;
}

/* ByteFallback: runs of <0xNN> tokens become the text of their bytes, or one U+FFFD per byte
 * when those are not valid UTF-8. */
static bool dec_bytefallback(dstr *v, size_t *n) {
    size_t o = 0;
    for (size_t i = 0; i < *n;) {
        unsigned char bytes[256];
        size_t nb = 0, j = i;
        unsigned int x;
        char tail;
        while (j < *n && nb < sizeof bytes && v[j].len == 6 && sscanf(v[j].s, "<0x%2X%c", &x, &tail) == 2 && tail == '>' &&
               isxdigit((unsigned char)v[j].s[3]) && isxdigit((unsigned char)v[j].s[4]))
            bytes[nb++] = (unsigned char)x, j++;
        if (nb == 0) { /* moved, the old place emptied: on failure every string is freed once */
            const dstr d = v[i];
            v[i++] = (dstr){ 0 };
            v[o++] = d;
            continue;
        }
        for (size_t k = i; k < j; k++) free(v[k].s), v[k] = (dstr){ 0 };
        size_t clean_len;
        char *clean = trill_utf8_sanitize((const char *)bytes, nb, &clean_len);
        const bool valid = clean && clean_len == nb && memcmp(clean, bytes, nb) == 0;
        free(clean);
        dstr d = { 0 };
        if (valid) { if (!dstr_set(&d, (const char *)bytes, nb)) return false; }
        else {
            char *r = trill_malloc(3 * nb + 1);
            if (!r) return false;
            for (size_t k = 0; k < nb; k++) memcpy(r + 3 * k, "\xef\xbf\xbd", 3);
            d = (dstr){ r, 3 * nb };
        }
        v[o++] = d;
        i = j;
    }
    *n = o;
    return true;
}

static bool dec_step_apply(const trill_tokenizer *t, const dec_step *x, dstr *v, size_t *n) {
    switch (x->kind) {
    case DEC_BYTELEVEL: return dec_bytelevel(t, v, n);
    case DEC_BYTEFALLBACK: return dec_bytefallback(v, n);
    case DEC_FUSE: {
        if (*n <= 1) return true;
        size_t total = 0;
        for (size_t i = 0; i < *n; i++) total += v[i].len;
        char *all = trill_malloc(total + 1);
        if (!all) return false;
        size_t o = 0;
        for (size_t i = 0; i < *n; i++) memcpy(all + o, v[i].s, v[i].len), o += v[i].len, free(v[i].s), v[i] = (dstr){ 0 };
        all[o] = '\0';
        v[0] = (dstr){ all, o };
        *n = 1;
        return true;
    }
    case DEC_REPLACE:
        for (size_t i = 0; i < *n; i++)
            if (!replace_token(&v[i], x->a, x->a_len, x->b, x->b_len)) return false;
        return true;
    case DEC_STRIP:
        for (size_t i = 0; i < *n; i++) {
            size_t from = 0, to = v[i].len;
            for (int k = 0; k < x->start && to - from >= x->a_len && memcmp(v[i].s + from, x->a, x->a_len) == 0; k++) from += x->a_len;
            for (int k = 0; k < x->stop && to - from >= x->a_len && memcmp(v[i].s + to - x->a_len, x->a, x->a_len) == 0; k++) to -= x->a_len;
            memmove(v[i].s, v[i].s + from, to - from);
            v[i].len = to - from;
            v[i].s[v[i].len] = '\0';
        }
        return true;
    case DEC_METASPACE: /* the replacement becomes ' ', and vanishes from the first token unless the scheme is never */
        for (size_t i = 0; i < *n; i++) {
            const bool drop = i == 0 && x->prepend != PREPEND_NEVER;
            if (!replace_token(&v[i], x->a, x->a_len, drop ? "" : " ", drop ? 0 : 1)) return false;
        }
        return true;
    }
    return true;
}

trill_status trill_tokenizer_decode(const trill_tokenizer *t, const int *ids, size_t n, bool skip_special_tokens,
                                    char **text, size_t *len) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= t->size || !t->id_str[ids[i]])
            return trill_error(TRILL_ERR_INVALID, "position %zu: token id %d is not in the vocabulary", i, ids[i]);
    dstr *v = trill_calloc(n + 1, sizeof *v);
    size_t m = 0;
    bool ok = v != NULL;
    for (size_t i = 0; ok && i < n; i++)
        if (!(skip_special_tokens && t->id_special[ids[i]])) ok = dstr_set(&v[m++], t->id_str[ids[i]], t->id_len[ids[i]]);
    for (int k = 0; ok && k < t->n_dec; k++) ok = dec_step_apply(t, &t->dec[k], v, &m);
    size_t total = 1;
    for (size_t i = 0; ok && i < m; i++) total += v[i].len + 1;
    char *raw = ok ? trill_malloc(total) : NULL;
    size_t o = 0;
    for (size_t i = 0; raw && i < m; i++) {
        if (!t->has_decoder && i > 0) raw[o++] = ' '; /* no decoder: HF joins the tokens with spaces */
        memcpy(raw + o, v[i].s, v[i].len), o += v[i].len;
    }
    if (v) dlist_free(v, m);
    char *clean = raw ? trill_utf8_sanitize(raw, o, len) : NULL; /* bytes of a split character: U+FFFD, as HF */
    free(raw);
    if (!clean) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    *text = clean;
    return TRILL_OK;
}

/* ---- the character-level tokenizer of `trill init` ---------------------------------------- */

static json_t *added_token_json(int id, const char *content) {
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "single_word", 0,
                     "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1);
}

json_t *trill_tokenizer_charlevel_json(void) {
    json_t *vocab = json_object(), *eot = added_token_json(0, "<|endoftext|>"), *unk = added_token_json(1, "<unk>");
    bool ok = vocab && eot && unk; /* every insertion checked: never a vocabulary missing a token */
    ok = ok && !json_object_set_new(vocab, "<|endoftext|>", json_integer(0)) && !json_object_set_new(vocab, "<unk>", json_integer(1)) &&
         !json_object_set_new(vocab, "\n", json_integer(2));
    for (int c = 32; ok && c < 127; c++) {
        char s[2] = { (char)c, 0 };
        ok = !json_object_set_new(vocab, s, json_integer(3 + c - 32));
    }
    json_t *j = ok ? json_pack("{s:s, s:n, s:n, s:[O,O], s:n, s:{s:s, s:{s:s}, s:s, s:b}, s:n, s:{s:s, s:O, s:s}, s:{s:s}}",
                               "version", "1.0", "truncation", "padding", "added_tokens", eot, unk, "normalizer", "pre_tokenizer",
                               "type", "Split", "pattern", "Regex", "[\\s\\S]", "behavior", "Isolated", "invert", 0, "post_processor",
                               "model", "type", "WordLevel", "vocab", vocab, "unk_token", "<unk>", "decoder", "type", "Fuse")
                   : NULL;
    json_decref(vocab);
    json_decref(eot);
    json_decref(unk);
    return j;
}

/* The text of ids; an id the tokenizer has no string for (a random model's vocabulary can be
 * larger than its tokenizer's) is written as <id>. */
trill_status trill_tokenizer_decode_lenient(const trill_tokenizer *tok, const int *ids, int n, char **text, size_t *len) {
    trill_status st = trill_tokenizer_decode(tok, ids, (size_t)n, false, text, len);
    if (st != TRILL_ERR_INVALID) return st;
    size_t cap = 16 * (size_t)n + 1, at = 0;
    char *out = trill_malloc(cap);
    if (!out) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n;) { /* runs of known ids decode together, so multi-byte characters survive */
        int j = i;
        char *piece = NULL;
        size_t plen = 0;
        while (j < n && ids[j] >= 0 && ids[j] < trill_tokenizer_size(tok)) {
            st = trill_tokenizer_decode(tok, ids + j, 1, false, &piece, &plen);
            if (st == TRILL_ERR_NOMEM) { free(out); return st; } /* not an unknown id */
            if (st) break;
            free(piece);
            j++;
        }
        if (j > i) { /* ids that decode one by one decode together, unless out of memory */
            if ((st = trill_tokenizer_decode(tok, ids + i, (size_t)(j - i), false, &piece, &plen))) { free(out); return st; }
            char *grown = at + plen + 24 > cap ? trill_realloc(out, cap = 2 * (at + plen + 24)) : out;
            if (!grown) { free(out); free(piece); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
            out = grown;
            memcpy(out + at, piece, plen);
            at += plen;
            free(piece);
        }
        if (j < n) {
            char *grown = at + 24 > cap ? trill_realloc(out, cap = 2 * (at + 24)) : out;
            if (!grown) { free(out); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
            out = grown;
            at += (size_t)snprintf(out + at, cap - at, "<%d>", ids[j]);
            j++;
        }
        i = j;
    }
    out[at] = 0;
    *text = out;
    *len = at;
    return TRILL_OK;
}
