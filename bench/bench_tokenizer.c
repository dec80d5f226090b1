/* bench_tokenizer: single-thread encode and decode throughput of a tokenizer.json
 * or a tiktoken vocabulary folder (trill_tokenizer_encode / trill_tokenizer_decode) on realistic text.
 *
 * A benchmark, not a test: it prints figures and fails only if it cannot run.
 *
 *   bench_tokenizer --model DIR [--text FILE] [--mb N] [--runs N]
 *
 * Text: FILE's bytes, or by default GSM8K's training set (each record's question, a newline,
 * its answer and a blank line) from ../shared/data/gsm8k/train.jsonl next to the source tree.
 * It is repeated or truncated to N MB (10^6 bytes; default 10), cut back to a line boundary,
 * and split into chunks of about 4 KB that end at a newline (documents of realistic size):
 * each chunk is one encode call, without add_special_tokens. Decode turns each chunk's ids
 * back into text (special tokens kept) and is measured in MB of text out per second.
 * One untimed warm-up pass over the first chunks, then `runs` timed passes of each; the
 * figures are the best and the median pass. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trill/timing.h"
#include "trill/fileio.h"
#include "trill/tokenizer.h"

#ifndef TRILL_SOURCE_DIR
#define TRILL_SOURCE_DIR "."
#endif
#define DEFAULT_TEXT TRILL_SOURCE_DIR "/../shared/data/gsm8k/train.jsonl"

enum { CHUNK = 4096, WARMUP_CHUNKS = 256 };

static void die(const char *msg) {
    fprintf(stderr, "bench_tokenizer: %s\n", msg);
    exit(1);
}

static void die_trill(const char *what) {
    fprintf(stderr, "bench_tokenizer: %s: %s\n", what, trill_error_message());
    exit(1);
}

static int parse_int(const char *opt, const char *s, int min) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min || v > 1 << 20) {
        fprintf(stderr, "bench_tokenizer: %s expects an integer >= %d, got '%s'\n", opt, min, s);
        exit(2);
    }
    return (int)v;
}

static double parse_mb(const char *opt, const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= 0.001 && v <= 4096)) {
        fprintf(stderr, "bench_tokenizer: %s expects a size in MB in [0.001, 4096], got '%s'\n", opt, s);
        exit(2);
    }
    return v;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_tokenizer --model DIR [--text FILE] [--mb N] [--runs N]\n"
               "  --model DIR  folder with tokenizer.json\n"
               "  --text FILE  text to encode (default: GSM8K questions and answers from\n"
               "               %s)\n"
               "  --mb N       MB (10^6 bytes) of text, the source repeated or cut at a line end (default 10)\n"
               "  --runs N     timed passes after a warm-up (default 3, at least 1)\n",
            DEFAULT_TEXT);
}

/* ---- the text ---------------------------------------------------------------------------- */

typedef struct text { char *p; size_t n, cap; } text;

static void text_add(text *t, const char *s, size_t n) {
    if (t->n + n + 1 > t->cap) {
        size_t cap = (t->n + n + 1) * 2;
        char *g = realloc(t->p, cap);
        if (!g) die("out of memory for the text");
        t->p = g;
        t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = '\0';
}

/* GSM8K jsonl: "question\nanswer\n\n" per record. */
static text gsm8k_text(const char *data, size_t len, const char *path) {
    text t = { 0 };
    size_t lineno = 0;
    for (const char *s = data, *end = data + len; s < end;) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        lineno++;
        if (e > s) {
            json_error_t err;
            json_t *rec = json_loadb(s, (size_t)(e - s), 0, &err);
            const json_t *q = json_object_get(rec, "question"), *a = json_object_get(rec, "answer");
            if (!json_is_string(q) || !json_is_string(a)) {
                fprintf(stderr, "bench_tokenizer: %s:%zu: expected {\"question\": string, \"answer\": string}\n", path, lineno);
                exit(1);
            }
            text_add(&t, json_string_value(q), json_string_length(q));
            text_add(&t, "\n", 1);
            text_add(&t, json_string_value(a), json_string_length(a));
            text_add(&t, "\n\n", 2);
            json_decref(rec);
        }
        s = e + 1;
    }
    return t;
}

/* Back from `at` to the start of a UTF-8 character. */
static size_t char_start(const char *s, size_t at) {
    while (at > 0 && ((unsigned char)s[at] & 0xc0) == 0x80) at--;
    return at;
}

/* src repeated until `target` bytes, then cut just after the last newline at or before it
 * (or at a character boundary when there is none in the second half). */
static text sized_text(const text *src, size_t target) {
    if (src->n == 0) die("the text is empty");
    text t = { 0 };
    while (t.n < target) text_add(&t, src->p, src->n < target - t.n ? src->n : target - t.n);
    size_t cut = t.n;
    while (cut > t.n / 2 && t.p[cut - 1] != '\n') cut--;
    if (cut <= t.n / 2) { /* no line end near: drop a character the cut split */
        size_t k = char_start(t.p, t.n - 1);
        unsigned char c = (unsigned char)t.p[k];
        size_t need = c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
        cut = k + need <= t.n ? t.n : k;
    }
    t.n = cut;
    t.p[cut] = '\0';
    return t;
}

/* Chunk ends: about CHUNK bytes each, just after a newline (the last one before CHUNK, else
 * the first after it), else at a character boundary. */
static size_t *chunk_ends(const text *t, size_t *n_chunks) {
    size_t cap = t->n / (CHUNK / 2) + 2, n = 0;
    size_t *ends = malloc(cap * sizeof *ends);
    if (!ends) die("out of memory for the chunks");
    for (size_t pos = 0; pos < t->n;) {
        size_t end = pos + CHUNK;
        if (end >= t->n) {
            end = t->n;
        } else {
            size_t e = end;
            while (e > pos && t->p[e - 1] != '\n') e--;
            if (e == pos) { /* no newline in the window: the next one, or a character boundary */
                const char *nl = memchr(t->p + end, '\n', t->n - end);
                e = nl ? (size_t)(nl - t->p) + 1 : char_start(t->p, end);
                if (e == pos) e = end;
            }
            end = e;
        }
        if (n == cap) {
            cap *= 2;
            size_t *g = realloc(ends, cap * sizeof *g);
            if (!g) die("out of memory for the chunks");
            ends = g;
        }
        ends[n++] = end;
        pos = end;
    }
    *n_chunks = n;
    return ends;
}

/* ---- main ------------------------------------------------------------------------------- */

typedef struct chunk_ids { int *ids; size_t n; } chunk_ids;

static void report(const char *label, double *times, int runs, double bytes, double tokens) {
    printf("  runs (s):");
    for (int r = 0; r < runs; r++) printf(" %.3f", times[r]);
    printf("\n");
    double med = trill_median(times, runs), best = times[0]; /* trill_median() sorted times */
    printf("  best   %8.3f s %9.2f MB/s %12.0f tokens/s\n", best, bytes / best * 1e-6, tokens / best);
    printf("  median %8.3f s %9.2f MB/s %12.0f tokens/s  (%s)\n", med, bytes / med * 1e-6, tokens / med, label);
}

int main(int argc, char **argv) {
    const char *model = NULL, *text_path = NULL;
    double mb = 10.0;
    int runs = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        int takes_value = !strcmp(a, "--model") || !strcmp(a, "--text") || !strcmp(a, "--mb") || !strcmp(a, "--runs");
        if (!takes_value) { fprintf(stderr, "bench_tokenizer: unknown option %s\n", a); usage(stderr); return 2; }
        if (i + 1 >= argc) { fprintf(stderr, "bench_tokenizer: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--model")) model = argv[++i];
        else if (!strcmp(a, "--text")) text_path = argv[++i];
        else if (!strcmp(a, "--mb")) mb = parse_mb(a, argv[++i]);
        else runs = parse_int(a, argv[++i], 1);
    }
    if (!model) { fprintf(stderr, "bench_tokenizer: --model DIR is required\n"); usage(stderr); return 2; }

    /* tokenizer */
    trill_tokenizer *tok = NULL;
    double t_load = trill_now();
    if (trill_tokenizer_load(model, &tok)) die_trill("loading the tokenizer");
    t_load = trill_now() - t_load;
    printf("tokenizer %s: %d ids, loaded in %.3f s\n", model, trill_tokenizer_size(tok), t_load);

    /* text */
    const char *src_path = text_path ? text_path : DEFAULT_TEXT;
    char *raw = NULL;
    size_t raw_len = 0;
    if (trill_read_file(src_path, &raw, &raw_len)) die_trill("reading the text (give one with --text FILE)");
    text src = { 0 };
    if (text_path) text_add(&src, raw, raw_len);
    else src = gsm8k_text(raw, raw_len, src_path);
    free(raw);
    text t = sized_text(&src, (size_t)(mb * 1e6));
    size_t n_chunks;
    size_t *ends = chunk_ends(&t, &n_chunks);
    printf("text: %s%s, %zu bytes of source -> %zu bytes (%.2f MB, %.2fx the source), %zu chunks of ~%d B cut after a newline (mean %.0f B)\n",
           text_path ? "" : "GSM8K questions + answers from ", src_path, src.n, t.n, t.n * 1e-6, (double)t.n / src.n,
           n_chunks, CHUNK, (double)t.n / n_chunks);
    free(src.p);

    chunk_ids *out = calloc(n_chunks, sizeof *out);
    double *times = malloc(sizeof(double) * runs);
    if (!out || !times) die("out of memory");

    /* encode: warm-up, then timed passes; the last pass's ids are kept for decode */
    for (size_t c = 0; c < n_chunks && c < WARMUP_CHUNKS; c++) {
        size_t start = c ? ends[c - 1] : 0;
        int *ids;
        size_t n;
        if (trill_tokenizer_encode(tok, t.p + start, ends[c] - start, false, &ids, &n)) die_trill("encode");
        free(ids);
    }
    size_t n_tokens = 0;
    for (int r = 0; r < runs; r++) {
        n_tokens = 0;
        double t0 = trill_now();
        for (size_t c = 0; c < n_chunks; c++) {
            size_t start = c ? ends[c - 1] : 0;
            free(out[c].ids);
            if (trill_tokenizer_encode(tok, t.p + start, ends[c] - start, false, &out[c].ids, &out[c].n)) die_trill("encode");
            n_tokens += out[c].n;
        }
        times[r] = trill_now() - t0;
    }
    printf("encode: %zu tokens, %.4f tokens/byte (%.3f bytes/token), %d timed pass(es) after a warm-up:\n", n_tokens,
           (double)n_tokens / t.n, (double)t.n / n_tokens, runs);
    report("MB of text in", times, runs, (double)t.n, (double)n_tokens);
    double enc_mbps = t.n / trill_median(times, runs) * 1e-6; /* report() sorted times; the median is unchanged */

    /* decode */
    size_t same = 0, out_bytes = 0;
    for (size_t c = 0; c < n_chunks && c < WARMUP_CHUNKS; c++) {
        char *s;
        size_t len;
        if (trill_tokenizer_decode(tok, out[c].ids, out[c].n, false, &s, &len)) die_trill("decode");
        free(s);
    }
    for (int r = 0; r < runs; r++) {
        out_bytes = 0;
        same = 0;
        double t0 = trill_now();
        for (size_t c = 0; c < n_chunks; c++) {
            char *s;
            size_t len;
            if (trill_tokenizer_decode(tok, out[c].ids, out[c].n, false, &s, &len)) die_trill("decode");
            out_bytes += len;
            size_t start = c ? ends[c - 1] : 0;
            same += len == ends[c] - start && memcmp(s, t.p + start, len) == 0;
            free(s);
        }
        times[r] = trill_now() - t0;
    }
    printf("decode: %zu bytes of text out; %zu of %zu chunks decode to their exact input; %d timed pass(es) after a warm-up:\n",
           out_bytes, same, n_chunks, runs);
    report("MB of text out", times, runs, (double)out_bytes, (double)n_tokens);
    double dec_mbps = out_bytes / trill_median(times, runs) * 1e-6;

    /* summary: medians */
    printf("tokenizer %s: encode %.2f MB/s, %.0f tokens/s, %.4f tokens/byte; decode %.2f MB/s (median of %d, 1 thread)\n",
           model, enc_mbps, enc_mbps * 1e6 * n_tokens / t.n, (double)n_tokens / t.n, dec_mbps, runs);

    for (size_t c = 0; c < n_chunks; c++) free(out[c].ids);
    free(out), free(times), free(ends), free(t.p);
    trill_tokenizer_free(tok);
    return 0;
}
