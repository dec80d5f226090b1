/* Built-in verifiers and the external reward process (trill/reward.h). */
#include "rl/reward/reward_process.h"
#include "base/alloc.h"
#include "trill/reward.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "base/json.h"
#include "rl/proc/process.h"

/* ---- verifiers ---------------------------------------------------------------------- */

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static bool has_prefix(const char *s, size_t len, size_t i, const char *prefix) {
    size_t n = strlen(prefix);
    return i <= len && len - i >= n && memcmp(s + i, prefix, n) == 0;
}

static size_t count_digits(const char *s, size_t len, size_t i) {
    size_t j = i;
    while (j < len && is_digit(s[j])) j++;
    return j - i;
}

/* A thousands separator at i: ",", LaTeX "{,}" or a thin space "\,", when exactly three
 * digits follow it. Returns its length (0: none). */
static size_t group_separator(const char *s, size_t len, size_t i) {
    size_t n = 0;
    if (has_prefix(s, len, i, ",")) n = 1;
    else if (has_prefix(s, len, i, "{,}")) n = 3;
    else if (has_prefix(s, len, i, "\\,")) n = 2;
    return n && count_digits(s, len, i + n) == 3 ? n : 0;
}

/* Decimal digits accumulated into mantissa * 10^exponent: the first 18 significant digits are
 * exact in the mantissa, later ones only move the exponent. */
typedef struct {
    uint64_t mantissa;
    int significant;
    long exponent;
} decimal;

static void decimal_digit(decimal *d, char c, bool after_point) {
    if (d->significant < 18) {
        d->mantissa = d->mantissa * 10 + (uint64_t)(c - '0');
        if (d->mantissa) d->significant++;
        if (after_point) d->exponent--;
    } else if (!after_point) {
        d->exponent++;
    }
}

static double decimal_value(const decimal *d) {
    double m = (double)d->mantissa;
    if (m == 0) return 0;
    if (d->exponent < 0) return d->exponent < -330 ? 0 : m / pow(10, (double)-d->exponent);
    return d->exponent > 330 ? INFINITY : m * pow(10, (double)d->exponent);
}

/* An unsigned decimal at s[i] (digits with thousands separators, then ".digits"; or ".digits"),
 * with an exponent when `exponent` is set. Returns the end (i: none). */
static size_t parse_unsigned(const char *s, size_t len, size_t i, bool exponent, double *value) {
    decimal d = {0, 0, 0};
    size_t j = i, lead = count_digits(s, len, i);
    if (lead == 0 && !(has_prefix(s, len, i, ".") && count_digits(s, len, i + 1) > 0)) return i;
    for (; j < i + lead; j++) decimal_digit(&d, s[j], false);
    if (lead > 0 && lead <= 3) {
        size_t sep;
        while ((sep = group_separator(s, len, j)) > 0) {
            for (size_t k = j + sep; k < j + sep + 3; k++) decimal_digit(&d, s[k], false);
            j += sep + 3;
        }
    }
    if (j < len && s[j] == '.' && count_digits(s, len, j + 1) > 0) {
        for (j++; j < len && is_digit(s[j]); j++) decimal_digit(&d, s[j], true);
    }
    if (exponent && j < len && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        bool negative = false;
        if (k < len && (s[k] == '+' || s[k] == '-')) negative = s[k++] == '-';
        size_t nd = count_digits(s, len, k);
        if (nd > 0 && !(k + nd < len && is_alpha(s[k + nd]))) {
            long e = 0;
            for (size_t t = k; t < k + nd; t++) e = e < 100000 ? e * 10 + (s[t] - '0') : e;
            d.exponent += negative ? -e : e;
            j = k + nd;
        }
    }
    *value = decimal_value(&d);
    return j;
}

/* "\frac{a}{b}" (also \dfrac, \tfrac) at s[i], a and b decimals. Returns the end (i: none). */
static size_t parse_latex_fraction(const char *s, size_t len, size_t i, double *value) {
    static const char *const names[] = {"\\frac{", "\\dfrac{", "\\tfrac{"};
    size_t j = i;
    for (int n = 0; n < 3 && j == i; n++)
        if (has_prefix(s, len, i, names[n])) j = i + strlen(names[n]);
    if (j == i) return i;
    double part[2];
    for (int k = 0; k < 2; k++) {
        if (k == 1) {
            if (!has_prefix(s, len, j, "{")) return i;
            j++;
        }
        while (j < len && is_space(s[j])) j++;
        bool negative = j < len && s[j] == '-';
        if (negative) j++;
        size_t end = parse_unsigned(s, len, j, false, &part[k]);
        if (end == j) return i;
        if (negative) part[k] = -part[k];
        j = end;
        while (j < len && is_space(s[j])) j++;
        if (!has_prefix(s, len, j, "}")) return i;
        j++;
    }
    if (part[1] == 0) return i;
    *value = part[0] / part[1];
    return j;
}

/* A number starting exactly at s[i] (no sign): a LaTeX fraction, or a decimal optionally
 * followed by "/decimal". Returns the end (i: none). */
static size_t parse_magnitude(const char *s, size_t len, size_t i, double *value) {
    size_t j = parse_latex_fraction(s, len, i, value);
    if (j > i) return j;
    if (i > 0 && s[i] == '.' && is_digit(s[i - 1])) return i; /* the tail of "1.2.3" */
    j = parse_unsigned(s, len, i, true, value);
    if (j == i) return i;
    double denominator;
    size_t k;
    if (j < len && s[j] == '/' && (k = parse_unsigned(s, len, j + 1, false, &denominator)) > j + 1 &&
        denominator != 0) {
        *value /= denominator;
        j = k;
    }
    return j;
}

/* A sign: '-', '+' or U+2212, not preceded by a letter or digit (so "3-4" is 3 and 4). */
static size_t sign_length(const char *s, size_t len, size_t i, bool *negative) {
    if (i > 0 && (is_digit(s[i - 1]) || is_alpha(s[i - 1]))) return 0;
    if (s[i] == '-' || s[i] == '+') {
        *negative = s[i] == '-';
        return 1;
    }
    if (has_prefix(s, len, i, "\xe2\x88\x92")) {
        *negative = true;
        return 3;
    }
    return 0;
}

/* A number starting exactly at s[i]: an optional sign (then an optional "$" or "\\$") and a
 * magnitude. Returns the end (i: none). */
static size_t number_at(const char *s, size_t len, size_t i, double *value) {
    bool negative = false;
    size_t start = i + sign_length(s, len, i, &negative);
    if (start > i) {
        if (has_prefix(s, len, start, "$")) start++;
        else if (has_prefix(s, len, start, "\\$")) start += 2;
    }
    size_t end = parse_magnitude(s, len, start, value);
    if (end == start) return i;
    if (negative) *value = -*value;
    return end;
}

/* The first number in s[*pos, len): sets *value and moves *pos past it; false when none. */
static bool next_number(const char *s, size_t len, size_t *pos, double *value) {
    for (size_t i = *pos; i < len; i++) {
        size_t end = number_at(s, len, i, value);
        if (end > i) {
            *pos = end;
            return true;
        }
    }
    *pos = len;
    return false;
}

static bool last_number(const char *s, size_t len, double *value) {
    size_t pos = 0;
    bool found = false;
    double v;
    while (next_number(s, len, &pos, &v)) {
        *value = v;
        found = true;
    }
    return found;
}

/* The last occurrence of `needle` in s[0, len), or NULL (scanning backwards, so repeated
 * searches with a shrinking len stay linear). */
static const char *last_occurrence(const char *s, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = len >= n ? len - n + 1 : 0; i-- > 0;)
        if (memcmp(s + i, needle, n) == 0) return s + i;
    return NULL;
}

/* The content of the last complete \boxed{...} (braces balanced, "\{" and "\}" not counted):
 * *start and *end bound it. False when there is none. An earlier \boxed{ that is still open
 * where a later unclosed one starts never closes either, so each scan stops there. */
static bool last_boxed(const char *s, size_t len, size_t *start, size_t *end) {
    size_t limit = len;
    const char *b;
    while ((b = last_occurrence(s, limit, "\\boxed{")) != NULL) {
        size_t open = (size_t)(b - s) + strlen("\\boxed{");
        long depth = 1;
        for (size_t i = open; i < limit; i++) {
            if (s[i] == '\\' && i + 1 < limit) i++;
            else if (s[i] == '{') depth++;
            else if (s[i] == '}' && --depth == 0) {
                *start = open;
                *end = i;
                return true;
            }
        }
        limit = (size_t)(b - s); /* unclosed (a truncated generation): look further back */
    }
    return false;
}

/* The number right after the last "####" that has one (spaces, "$" or "\\$" may come between):
 * a "#### Step 2" heading in a model's markdown is not the marker. */
static bool marked_number(const char *s, size_t len, double *value) {
    size_t limit = len;
    const char *m;
    while ((m = last_occurrence(s, limit, "####")) != NULL) {
        size_t i = (size_t)(m - s) + 4;
        while (i < len && (s[i] == ' ' || s[i] == '\t')) i++;
        if (has_prefix(s, len, i, "$")) i++;
        else if (has_prefix(s, len, i, "\\$")) i += 2;
        if (number_at(s, len, i, value) > i) return true;
        limit = (size_t)(m - s);
    }
    return false;
}

bool trill_reward_extract_number(const char *text, double *value) {
    if (!text) return false;
    size_t len = strlen(text);
    double v = 0;
    bool found;
    size_t start, end;
    if (marked_number(text, len, &v)) found = true;
    else if (last_boxed(text, len, &start, &end)) found = last_number(text + start, end - start, &v);
    else found = last_number(text, len, &v);
    if (!found || !isfinite(v)) return false;
    *value = v;
    return true;
}

double trill_reward_numeric(const char *completion, const char *truth) {
    double a, b;
    if (!trill_reward_extract_number(completion, &a) || !trill_reward_extract_number(truth, &b)) return 0.0;
    double diff = fabs(a - b);
    return diff <= 1e-9 || diff <= 1e-6 * fmax(fabs(a), fabs(b)) ? 1.0 : 0.0;
}

/* s without surrounding whitespace: *start and *len. */
static void trim(const char *s, const char **start, size_t *len) {
    size_t n = strlen(s);
    while (n > 0 && is_space(*s)) s++, n--;
    while (n > 0 && is_space(s[n - 1])) n--;
    *start = s;
    *len = n;
}

double trill_reward_exact(const char *completion, const char *truth) {
    if (!completion || !truth) return 0.0;
    const char *a, *b;
    size_t na, nb;
    trim(completion, &a, &na);
    trim(truth, &b, &nb);
    return na == nb && memcmp(a, b, na) == 0 ? 1.0 : 0.0;
}

double trill_reward_demo(const char *completion, const char *truth) {
    if (!completion || !truth) return 0.0;
    const char *t;
    size_t nt;
    trim(truth, &t, &nt);
    size_t line = strcspn(completion, "\n");
    return nt > 0 && line == nt && memcmp(completion, t, nt) == 0 ? 1.0 : 0.0;
}

/* ---- external reward process -------------------------------------------------------- */

static bool parse_reply(const char *line, size_t n, double *reward, json_t **metrics, char *why, size_t cap) {
    char shown[96];
    trill_rl_process_excerpt(line, n, shown);
    json_error_t jerr;
    json_t *root = json_loadb(line, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(why, cap, "reply is not JSON (%s): \"%s\"", jerr.text, shown);
        return false;
    }
    bool ok = false;
    json_t *r = json_is_object(root) ? json_object_get(root, "reward") : NULL;
    json_t *m = json_is_object(root) ? json_object_get(root, "metrics") : NULL;
    if (m && json_is_null(m)) m = NULL;
    if (!json_is_number(r) || !isfinite(json_number_value(r))) {
        snprintf(why, cap, "reply is not an object with a numeric \"reward\": \"%s\"", shown);
    } else if (m && !json_is_object(m)) {
        snprintf(why, cap, "reply's \"metrics\" is not an object (%s): \"%s\"", trill_json_type_name(m), shown);
    } else {
        ok = true;
        const char *key;
        json_t *v;
        if (m) json_object_foreach(m, key, v) {
            if (ok && (!json_is_number(v) || !isfinite(json_number_value(v)))) {
                snprintf(why, cap, "reply's metric \"%s\" is not a number (%s): \"%s\"", key, trill_json_type_name(v),
                         shown);
                ok = false;
            }
        }
    }
    if (ok) {
        *reward = json_number_value(r);
        if (metrics) *metrics = m ? json_incref(m) : NULL;
    }
    json_decref(root);
    return ok;
}

/* A JSON string of s (NULL: ""), invalid UTF-8 replaced by U+FFFD. */
static json_t *text_json(const char *s) {
    if (!s) return json_string("");
    json_t *j = json_string(s);
    if (j) return j;
    size_t n;
    char *clean = trill_utf8_sanitize(s, strlen(s), &n);
    if (!clean) return NULL;
    j = json_stringn(clean, n);
    free(clean);
    return j;
}

/* The request line (compact JSON and '\n'), malloc'ed; NULL when out of memory. */
static char *make_request(const char *prompt, const char *completion, const char *truth, size_t *len) {
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "prompt", text_json(prompt)) != 0 ||
        json_object_set_new(o, "completion", text_json(completion)) != 0 ||
        json_object_set_new(o, "ground_truth", text_json(truth)) != 0) {
        json_decref(o);
        return NULL;
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *line = trill_realloc(s, n + 2);
    if (!line) {
        free(s);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    *len = n + 1;
    return line;
}

struct reward_process {
    rl_process *proc;
    int max_failures;
};

trill_status trill_reward_process_start(const char *command, double timeout_s, int max_failures, reward_process **out) {
    *out = NULL;
    if (max_failures < 1)
        return trill_error(TRILL_ERR_INVALID, "reward process \"%s\": max_failures %d, expected at least 1", command ? command : "", max_failures);
    reward_process *p = trill_calloc(1, sizeof *p);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "reward process: out of memory");
    p->max_failures = max_failures;
    trill_status st = trill_rl_process_start("reward process", command, timeout_s, &p->proc);
    if (st) {
        free(p);
        return st;
    }
    *out = p;
    return TRILL_OK;
}

trill_status trill_reward_process_score(reward_process *p, const char *prompt, const char *completion, const char *truth,
                                  double *reward, json_t **metrics) {
    if (metrics) *metrics = NULL;
    const char *command = trill_rl_process_command(p->proc);
    size_t request_len;
    char *request = make_request(prompt, completion, truth, &request_len);
    if (!request) return trill_error(TRILL_ERR_NOMEM, "reward process \"%s\": out of memory", command);
    char why[640] = "";
    for (int failures = 0; failures < p->max_failures; failures++) {
        trill_status st = trill_rl_process_spawn(p->proc);
        if (st != TRILL_OK) {
            free(request);
            return st;
        }
        const char *line;
        size_t line_len;
        if (trill_rl_process_exchange(p->proc, request, request_len, &line, &line_len, why, sizeof why)) {
            bool ok = parse_reply(line, line_len, reward, metrics, why, sizeof why);
            trill_rl_process_consume(p->proc, line_len);
            if (ok) {
                free(request);
                return TRILL_OK;
            }
            trill_rl_process_kill(p->proc);
        }
    }
    free(request);
    const char *err_line = trill_rl_process_stderr(p->proc);
    return trill_error(TRILL_ERR_INVALID, "reward process \"%s\": %d consecutive failure%s; last: %s%s%s%s", command,
                       p->max_failures, p->max_failures == 1 ? "" : "s", why,
                       err_line[0] ? "; last stderr line: \"" : "", err_line, err_line[0] ? "\"" : "");
}

void trill_reward_process_free(reward_process *p) {
    if (!p) return;
    trill_rl_process_free(p->proc);
    free(p);
}
