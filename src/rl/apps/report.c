/* `trill report` (trill/report.h): metrics.jsonl of one or more runs as one HTML page of inline
 * SVG charts. Each chart is an <svg class="chart"> in a <figure> with a data-chart name; a line
 * chart draws one <polyline> per run and figure (several runs overlay, a legend names them), a
 * heatmap and the histograms draw <rect>s; axes carry their units. No script, no external file.
 * A file is read line by line, twice (the first pass checks every line and finds where the steps
 * go back, the second draws), and what is kept is bounded by the page, not by the run: a long
 * run's steps are cut into ranges (BUCKETS for the lines and the time split, HEAT_COLUMNS for
 * the heatmap) and each range keeps a few numbers. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "trill/fileio.h"
#include "trill/log.h"
#include "trill/report.h"

enum { W = 480, H = 280, X0 = 64, X1 = 468, Y0 = 34, Y1 = 236, MAX_RUNS = 8, BUCKETS = 1000, HEAT_COLUMNS = 200 };
static const char *const COLORS[MAX_RUNS] = { "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2" };

/* A line chart: metric `key` (and `key2` dashed, when given) times `scale` over the steps of every
 * run; on a log axis only the positive values. */
typedef struct line_spec {
    const char *id, *title, *ylabel, *key, *key2;
    double scale;
    bool log;
} line_spec;

enum { C_REWARD, C_ACCURACY, C_EVAL, C_LOSS, C_KL, C_RESPONSE_LEN, C_MISMATCH, C_K3, C_FLIP_RATE, C_THROUGHPUT, C_SYNC_BYTES, N_CHARTS };
static const line_spec CHARTS[N_CHARTS] = {
    [C_REWARD] = { "reward", "Reward (batch mean)", "reward", "reward", NULL, 1, false },
    [C_ACCURACY] = { "accuracy", "Training accuracy", "% of samples correct", "accuracy", NULL, 100, false },
    [C_EVAL] = { "eval", "Held-out evaluation (pass@1 solid, pass@k dashed)", "% of prompts", "eval_pass1", "eval_passk", 100, false },
    [C_LOSS] = { "loss", "Loss", "loss per optimizer step", "loss", NULL, 1, false },
    [C_KL] = { "kl", "KL to the reference (kl_ref)", "nats per token", "kl_ref", NULL, 1, false },
    [C_RESPONSE_LEN] = { "response_len", "Response length", "tokens (mean)", "response_len", NULL, 1, false },
    [C_MISMATCH] = { "mismatch", "|log pi_train - log mu| (mean solid, max dashed)", "nats (log scale)", "mismatch_mean_abs",
                     "mismatch_max_abs", 1, true },
    [C_K3] = { "k3", "k3 estimate of KL(mu || pi_train)", "nats per token (log scale)", "mismatch_k3", NULL, 1, true },
    [C_FLIP_RATE] = { "flip_rate", "Routing flips", "% of tokens with another expert set", "flip_token_frac", NULL, 100, false },
    [C_THROUGHPUT] = { "throughput", "Throughput (generated solid, trained dashed)", "tokens per second", "time.gen_tokens_per_s",
                       "time.train_tokens_per_s", 1, false },
    [C_SYNC_BYTES] = { "sync_bytes", "Weight sync per version", "KB", "sync_bytes", NULL, 1.0 / 1024, false },
};
/* eval.jsonl's evaluations (before training and after the last step included), drawn instead of
 * the metrics' periodic ones when every run has them. */
static const line_spec EVAL_FILE = { "eval", "Held-out evaluation, from before training (step 0) to after (pass@1 solid, pass@k dashed)",
                                     "% of prompts", "pass1", "passk", 100, false };

/* A figure in one range of steps: its lowest and highest value with their steps. Drawn in step
 * order, the two keep every spike and dip and the axis's exact range, where an average or every
 * k-th step would flatten or skip them; and unlike LTTB they need no look at the next range, so
 * they are kept in one pass. */
typedef struct bucket { double lo_x, lo_y, hi_x, hi_y; bool any; } bucket;

/* One file of a run as drawn: the steps kept (each step's latest record), their range, and each
 * chart's figures in n_buckets ranges of it. */
typedef struct source {
    long n;
    long long lo, hi;
    int n_buckets;   /* min(hi - lo + 1, BUCKETS) */
    int last_bucket; /* the range of the step added last */
    bool thinned;    /* a range holds several steps: the page says so */
    bucket *lines;   /* [chart][key, key2][n_buckets] */
} source;

/* The time split of a range: the sums of its steps and of each stage's seconds, over n steps. The
 * stages stack, so a range is drawn at its means, which keep each band's area (its share of the
 * time) where one stage's extreme would not fit on another's. */
typedef struct time_bucket { double x, stage[4]; int n; } time_bucket;

typedef struct run_data {
    const char *dir;
    source metrics, evals;
    json_t *at[3];          /* the records of the first, middle and last steps (the histograms) */
    int n_layers, columns;  /* the heatmap: flip_layer's length at the first step; step ranges */
    double *flips;          /* [columns][n_layers]: each range's highest share, NAN where it has no step */
    time_bucket *time;      /* [metrics.n_buckets] */
    char *config;           /* config.yaml, or NULL */
} run_data;

static const char *const TIME_KEYS[4] = { "time.generate_s", "time.reward_s", "time.train_s", "time.sync_s" };

/* A number at a dotted path ("time.train_s"), NAN when absent or null. */
static double field(const json_t *o, const char *path) {
    char key[64];
    while (o && *path) {
        const char *dot = strchr(path, '.');
        const size_t n = dot ? (size_t)(dot - path) : strlen(path);
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = json_object_get(o, key);
        path += n + (dot != NULL);
    }
    return json_is_number(o) ? json_number_value(o) : NAN;
}

/* ---- reading ---- */

/* Where the steps of a file do not increase (a run resumed from an older checkpoint appended to
 * it, or files joined by hand), a new segment starts. A step is kept from the last segment that
 * has it, and a segment's steps from the next one's first on are not kept at all: that is the
 * file the later run would have written (trill train cuts metrics.jsonl back to the checkpoint
 * it resumes from), where keeping them would join two runs' histories into one line. */
typedef struct segment { long long first, cut; } segment; /* cut: the steps kept are those below it */

typedef struct jsonl {
    char *path;
    FILE *f;
    char *line;
    size_t cap;
    long lines;       /* complete lines */
    long long last;   /* the last line's step */
    segment *seg;
    long n_seg;
} jsonl;

/* The next complete line (*j NULL at the end of the file, or at a last line without its newline:
 * a step still being written) as an object with its integer step. `number` names it. */
static trill_status next_record(jsonl *r, long number, json_t **j, long long *step) {
    *j = NULL;
    errno = 0;
    const ssize_t len = getline(&r->line, &r->cap, r->f);
    if (len < 0 && errno == ENOMEM) return trill_error(TRILL_ERR_NOMEM, "%s: out of memory for line %ld", r->path, number);
    if (len < 0 && ferror(r->f)) return trill_error(TRILL_ERR_IO, "%s: read error: %s", r->path, strerror(errno));
    if (len <= 0 || r->line[len - 1] != '\n') return TRILL_OK;
    json_error_t e;
    *j = json_loadb(r->line, (size_t)len - 1, 0, &e);
    if (*j && json_is_integer(json_object_get(*j, "step"))) {
        *step = json_integer_value(json_object_get(*j, "step"));
        return TRILL_OK;
    }
    trill_status st = trill_error(TRILL_ERR_INVALID, "%s: line %ld: %s", r->path, number,
                                  *j ? "expected a JSON object with an integer \"step\"" : e.text);
    json_decref(*j);
    *j = NULL;
    return st;
}

/* The first pass: every line checked, the segments and their cuts. */
static trill_status scan(jsonl *r) {
    trill_status st = TRILL_OK;
    long long prev = 0;
    for (;;) {
        json_t *j;
        long long step;
        if ((st = next_record(r, r->lines + 1, &j, &step)) || !j) break;
        json_decref(j);
        if (r->lines == 0 || step <= prev) {
            if (r->lines)
                trill_log(TRILL_LOG_WARN, "trill report: %s: line %ld: step %lld after step %lld: the steps go back (a run resumed from an "
                          "older checkpoint appended to the file?); steps %lld and later are drawn from this line on", r->path, r->lines + 1, step,
                          prev, step);
            segment *grown = trill_realloc(r->seg, sizeof *grown * (size_t)(r->n_seg + 1));
            if (!grown) return trill_error(TRILL_ERR_NOMEM, "%s: out of memory", r->path);
            (r->seg = grown)[r->n_seg++] = (segment){ step, LLONG_MAX };
        }
        r->last = prev = step;
        r->lines++;
    }
    for (long s = r->n_seg - 2; s >= 0; s--)
        r->seg[s].cut = r->seg[s + 1].first < r->seg[s + 1].cut ? r->seg[s + 1].first : r->seg[s + 1].cut;
    return st;
}

/* The steps from src's first to its last (in double: steps are any integers), and which of n
 * equal ranges of them holds `step`. */
static double span(const source *src) { return (double)src->hi - (double)src->lo + 1; }
static int bucket_of(const source *src, long long step, int n) {
    const int b = (int)(((double)step - (double)src->lo) / span(src) * n);
    return b < 0 ? 0 : b < n ? b : n - 1;
}

/* The ranges of one chart's key (which 0) or key2 (which 1). */
static bucket *series(const source *src, int chart, int which) {
    return src->lines + ((size_t)chart * 2 + (size_t)which) * (size_t)src->n_buckets;
}

static void add_value(bucket *b, double x, double y, bool log_scale) {
    if (!isfinite(y) || (log_scale && y <= 0)) return;
    if (!b->any || y < b->lo_y) b->lo_x = x, b->lo_y = y;
    if (!b->any || y > b->hi_y) b->hi_x = x, b->hi_y = y;
    b->any = true;
}

/* A kept record into the source's charts (specs[0..n_specs)) and, for metrics.jsonl (d given),
 * the histograms' steps, the heatmap and the time split. */
static trill_status add_record(source *src, const line_spec *specs, int n_specs, run_data *d, json_t *j, long long step) {
    const int b = bucket_of(src, step, src->n_buckets);
    src->thinned |= src->n > 0 && b == src->last_bucket;
    src->last_bucket = b;
    src->n++;
    for (int c = 0; c < n_specs; c++)
        for (int k = 0; k < 2 && (k == 0 || specs[c].key2); k++)
            add_value(&series(src, c, k)[b], (double)step, field(j, k ? specs[c].key2 : specs[c].key) * specs[c].scale, specs[c].log);
    if (!d) return TRILL_OK;
    if (src->n == 1) d->at[0] = json_incref(j);
    if (!d->at[1] && (double)step >= (double)src->lo + floor(span(src) / 2)) d->at[1] = json_incref(j);
    if (step == src->hi) d->at[2] = json_incref(j);
    const json_t *flips = json_object_get(j, "flip_layer");
    if (src->n == 1 && (d->n_layers = (int)json_array_size(flips)) > 0) {
        d->columns = span(src) < HEAT_COLUMNS ? (int)span(src) : HEAT_COLUMNS;
        if (!(d->flips = trill_malloc(sizeof(double) * (size_t)d->columns * (size_t)d->n_layers)))
            return trill_error(TRILL_ERR_NOMEM, "out of memory for the report's heatmap");
        for (size_t i = 0; i < (size_t)d->columns * (size_t)d->n_layers; i++) d->flips[i] = NAN;
    }
    for (int l = 0; l < d->n_layers; l++) {
        double *cell = &d->flips[(size_t)bucket_of(src, step, d->columns) * (size_t)d->n_layers + (size_t)l];
        *cell = fmax(*cell, json_number_value(json_array_get(flips, (size_t)l))); /* fmax(NAN, v) = v */
    }
    time_bucket *t = &d->time[b];
    t->x += (double)step;
    for (int k = 0; k < 4; k++) {
        const double seconds = field(j, TIME_KEYS[k]);
        t->stage[k] += isfinite(seconds) ? seconds : 0;
    }
    t->n++;
    return TRILL_OK;
}

/* RUN/name for drawing into src (the charts specs[0..n_specs); with d, metrics.jsonl's other
 * figures too): the first pass, then the second one over the records kept. A missing file is no
 * line when `optional`. A file rewritten between the passes (a run resuming meanwhile) is an
 * error, as a file not read whole would be. */
static trill_status read_jsonl(const char *dir, const char *name, bool optional, source *src, const line_spec *specs, int n_specs,
                               run_data *d) {
    jsonl r = { .path = trill_path_join(dir, name) };
    if (!r.path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (optional && !trill_file_exists(r.path)) {
        free(r.path);
        return TRILL_OK;
    }
    trill_status st = (r.f = fopen(r.path, "r")) ? scan(&r) : trill_error(TRILL_ERR_IO, "%s: cannot open: %s", r.path, strerror(errno));
    if (!st && !optional && r.lines == 0) st = trill_error(TRILL_ERR_INVALID, "%s: no complete step yet", r.path);
    if (!st && r.lines > 0) {
        for (long s = r.n_seg - 1; s >= 0; s--)
            if (r.seg[s].first < r.seg[s].cut) src->lo = r.seg[s].first; /* the first segment that keeps a step */
        src->hi = r.last;
        src->n_buckets = span(src) < BUCKETS ? (int)span(src) : BUCKETS;
        src->lines = trill_calloc((size_t)n_specs * 2 * (size_t)src->n_buckets, sizeof *src->lines);
        if (d) d->time = trill_calloc((size_t)src->n_buckets, sizeof *d->time);
        if (!src->lines || (d && !d->time)) st = trill_error(TRILL_ERR_NOMEM, "out of memory for the report of %s", r.path);
        if (!st) rewind(r.f);
    }
    long long prev = 0;
    for (long i = 0, s = -1; !st && i < r.lines; i++) {
        json_t *j;
        long long step = 0;
        if ((st = next_record(&r, i + 1, &j, &step))) break;
        const bool starts = i == 0 || step <= prev;
        s += starts;
        /* as the first pass saw it */
        const bool same = j && s < r.n_seg && (!starts || step == r.seg[s].first) && (i + 1 < r.lines || step == src->hi);
        if (!same || (step < r.seg[s].cut && (step < src->lo || step > src->hi)))
            st = trill_error(TRILL_ERR_INVALID, "%s: line %ld changed while the report read the file", r.path, i + 1);
        else if (step < r.seg[s].cut)
            st = add_record(src, specs, n_specs, d, j, step);
        json_decref(j);
        prev = step;
    }
    if (r.f) fclose(r.f);
    free(r.line);
    free(r.seg);
    free(r.path);
    return st;
}

static trill_status read_run(run_data *d) {
    size_t len;
    trill_status st = read_jsonl(d->dir, "metrics.jsonl", false, &d->metrics, CHARTS, N_CHARTS, d);
    if (!st) st = read_jsonl(d->dir, "eval.jsonl", true, &d->evals, &EVAL_FILE, 1, NULL);
    if (st) return st;
    char *cfg = trill_path_join(d->dir, "config.yaml");
    if (cfg && trill_file_exists(cfg)) st = trill_read_file(cfg, &d->config, &len);
    free(cfg);
    return st;
}

static void free_run(run_data *d) {
    for (int k = 0; k < 3; k++) json_decref(d->at[k]);
    free(d->metrics.lines);
    free(d->evals.lines);
    free(d->flips);
    free(d->time);
    free(d->config);
}

/* ---- drawing ---- */

static void escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
    }
}

/* The 1-2-5 step that cuts [lo, hi] in about 4. */
static double nice_step(double lo, double hi) {
    const double raw = (hi - lo) / 4, mag = pow(10, floor(log10(raw)));
    const double r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

typedef struct axis { double lo, hi; bool log; } axis;

static double map(const axis *a, double v, double p0, double p1) {
    const double t = a->log ? (log10(v) - a->lo) / (a->hi - a->lo) : (v - a->lo) / (a->hi - a->lo);
    return p0 + t * (p1 - p0);
}

/* Range of the finite values (positive ones on a log axis), widened when flat. */
static axis range_of(const double *v, int n, bool log_scale) {
    axis a = { INFINITY, -INFINITY, log_scale };
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i]) || (log_scale && v[i] <= 0)) continue;
        const double x = log_scale ? log10(v[i]) : v[i];
        a.lo = fmin(a.lo, x);
        a.hi = fmax(a.hi, x);
    }
    if (!isfinite(a.lo)) a.lo = 0, a.hi = 1;
    if (a.hi - a.lo < 1e-12) { /* one value: a band around it */
        const double pad = log_scale || a.lo == 0 ? 0.5 : fabs(a.lo) * 0.1;
        a.lo -= pad;
        a.hi += pad;
    }
    return a;
}

static void axes(FILE *f, const axis *xa, const axis *ya, const char *xlabel, const char *ylabel) {
    fprintf(f, "<line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#444'/><line x1='%d' y1='%d' x2='%d' y2='%d' stroke='#444'/>\n", X0, Y1, X1, Y1,
            X0, Y0, X0, Y1);
    if (ya->log) {
        for (int e = (int)ceil(ya->lo); e <= (int)floor(ya->hi); e++) {
            const double y = Y1 + (e - ya->lo) / (ya->hi - ya->lo) * (Y0 - Y1);
            fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='#eee'/><text x='%d' y='%.1f' class='t' text-anchor='end'>1e%d</text>\n",
                    X0, y, X1, y, X0 - 4, y + 4, e);
        }
    } else {
        const double s = nice_step(ya->lo, ya->hi);
        for (double v = ceil(ya->lo / s) * s; v <= ya->hi + s * 1e-9; v += s) {
            const double y = map(ya, v, Y1, Y0);
            fprintf(f, "<line x1='%d' y1='%.1f' x2='%d' y2='%.1f' stroke='#eee'/><text x='%d' y='%.1f' class='t' text-anchor='end'>%.3g</text>\n",
                    X0, y, X1, y, X0 - 4, y + 4, fabs(v) < s * 1e-9 ? 0.0 : v);
        }
    }
    const double s = nice_step(xa->lo, xa->hi) < 1 ? 1 : nice_step(xa->lo, xa->hi);
    for (double v = ceil(xa->lo / s) * s; v <= xa->hi + 1e-9; v += s)
        fprintf(f, "<text x='%.1f' y='%d' class='t' text-anchor='middle'>%g</text>\n", map(xa, v, X0, X1), Y1 + 16, v);
    fprintf(f, "<text x='%d' y='%d' class='l' text-anchor='middle'>%s</text>\n", (X0 + X1) / 2, H - 8, xlabel);
    fprintf(f, "<text x='14' y='%d' class='l' text-anchor='middle' transform='rotate(-90 14 %d)'>", (Y0 + Y1) / 2, (Y0 + Y1) / 2);
    escape(f, ylabel);
    fputs("</text>\n", f);
}

static void figure_open(FILE *f, const char *id, const char *title) {
    fprintf(f, "<figure data-chart='%s'><figcaption>", id);
    escape(f, title);
    fprintf(f, "</figcaption><svg class='chart' viewBox='0 0 %d %d' role='img'>\n", W, H);
}

static void legend(FILE *f, const run_data *runs, int n, const char *solid, const char *dashed) {
    fputs("</svg><div class='legend'>", f);
    for (int r = 0; r < n; r++) {
        fprintf(f, "<span style='color:%s'>&#9632; ", COLORS[r % MAX_RUNS]);
        escape(f, runs[r].dir);
        fputs("</span> ", f);
    }
    if (dashed) fprintf(f, "<span>solid: %s, dashed: %s</span>", solid, dashed);
    fputs("</div></figure>\n", f);
}

static void point(FILE *f, const axis *xa, const axis *ya, double x, double y) {
    fprintf(f, "%.1f,%.1f ", map(xa, x, X0, X1), map(ya, y, Y1, Y0));
}

/* A line chart over the steps of every run: eval.jsonl's evaluations (`evals`, EVAL_FILE), else
 * metrics.jsonl's CHARTS[chart]. Each line goes through its step ranges' lowest and highest values. */
static void line_chart(FILE *f, const run_data *runs, int n, bool evals, int chart) {
    const line_spec *c = evals ? &EVAL_FILE : &CHARTS[chart];
    const int lines = c->key2 ? 2 : 1;
    double xs[2 * MAX_RUNS], ys[2] = { INFINITY, -INFINITY };
    for (int r = 0; r < n; r++) {
        const source *src = evals ? &runs[r].evals : &runs[r].metrics;
        xs[2 * r] = (double)src->lo;
        xs[2 * r + 1] = (double)src->hi;
        for (int which = 0; which < lines; which++)
            for (const bucket *b = series(src, evals ? 0 : chart, which), *end = b + src->n_buckets; b < end; b++)
                if (b->any) ys[0] = fmin(ys[0], b->lo_y), ys[1] = fmax(ys[1], b->hi_y);
    }
    if (ys[0] > ys[1]) { /* e.g. KL without a reference term: said, not drawn as an empty frame */
        fprintf(f, "<figure data-chart='%s' data-empty='1'><figcaption>", c->id);
        escape(f, c->title);
        fprintf(f, "</figcaption><p class='legend'>no values of %s in these runs</p></figure>\n", c->key);
        return;
    }
    const axis xa = range_of(xs, 2 * n, false), ya = range_of(ys, 2, c->log);
    figure_open(f, c->id, c->title);
    axes(f, &xa, &ya, "step", c->ylabel);
    for (int r = 0; r < n; r++)
        for (int which = 0; which < lines; which++) {
            fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.6'%s points='", COLORS[r % MAX_RUNS],
                    which ? " stroke-dasharray='4 3'" : "");
            const source *src = evals ? &runs[r].evals : &runs[r].metrics;
            for (const bucket *b = series(src, evals ? 0 : chart, which), *end = b + src->n_buckets; b < end; b++) {
                if (!b->any) continue;
                if (b->lo_x <= b->hi_x) point(f, &xa, &ya, b->lo_x, b->lo_y);
                if (b->hi_x != b->lo_x) point(f, &xa, &ya, b->hi_x, b->hi_y); /* one step: one point */
                if (b->lo_x > b->hi_x) point(f, &xa, &ya, b->lo_x, b->lo_y);
            }
            fputs("'/>\n", f);
        }
    legend(f, runs, n, c->key, c->key2);
}

/* Routing flips per MoE layer over the steps of one run: a cell per (step range, layer), darker = more. */
static void flip_heatmap(FILE *f, const run_data *d, int r) {
    const int L = d->n_layers;
    if (L == 0) return;
    double top = 0;
    for (size_t i = 0; i < (size_t)d->columns * (size_t)L; i++) top = fmax(top, d->flips[i]);
    char id[32], title[256];
    snprintf(id, sizeof id, "flips-%d", r);
    snprintf(title, sizeof title, "Routing flips per MoE layer (%s; darkest = %.3g%% of the tokens)", d->dir, 100 * top);
    figure_open(f, id, title);
    const axis xa = { (double)d->metrics.lo - 0.5, (double)d->metrics.hi + 0.5, false }, ya = { 0, L, false };
    axes(f, &xa, &ya, "step", "MoE layer (ordinal)");
    const double cw = (double)(X1 - X0) / d->columns, ch = (double)(Y1 - Y0) / L;
    for (int i = 0; i < d->columns; i++)
        for (int l = 0; l < L; l++) {
            const double v = d->flips[(size_t)i * (size_t)L + (size_t)l];
            if (isnan(v)) continue; /* no step in this range */
            fprintf(f, "<rect x='%.1f' y='%.1f' width='%.2f' height='%.2f' fill='%s' fill-opacity='%.3f'/>\n", X0 + i * cw, Y1 - (l + 1) * ch,
                    cw + 0.05, ch + 0.05, COLORS[r % MAX_RUNS], top > 0 ? 0.08 + 0.92 * v / top : 0.08);
        }
    fprintf(f, "</svg><div class='legend'>each cell: the share of a step's tokens routed differently by the trainer in that layer%s</div>"
               "</figure>\n", d->metrics.hi - d->metrics.lo + 1 > d->columns ? " (the highest of the steps the cell covers)" : "");
}

/* Bars of a histogram (hist.<name>) at the first, middle and last steps of one run. */
static void hist_chart(FILE *f, const run_data *d, int r, const char *name, const char *title, const char *xlabel) {
    const json_t *h0 = json_object_get(json_object_get(d->at[0], "hist"), name);
    const int bins = (int)json_array_size(h0);
    if (!bins) return;
    char id[48], full[256];
    snprintf(id, sizeof id, "hist-%s-%d", name, r);
    snprintf(full, sizeof full, "%s (%s): steps %g, %g, %g", title, d->dir, field(d->at[0], "step"), field(d->at[1], "step"),
             field(d->at[2], "step"));
    double top = 1;
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < bins; b++)
            top = fmax(top, json_number_value(json_array_get(json_object_get(json_object_get(d->at[k], "hist"), name), (size_t)b)));
    figure_open(f, id, full);
    const axis xa = { 0, bins, false }, ya = { 0, top, false };
    axes(f, &xa, &ya, xlabel, "tokens");
    static const char *const shades[3] = { "#9ecae1", "#4292c6", "#08306b" };
    const double bw = (double)(X1 - X0) / bins;
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < bins; b++) {
            const double v = json_number_value(json_array_get(json_object_get(json_object_get(d->at[k], "hist"), name), (size_t)b));
            const double y = map(&ya, v, Y1, Y0);
            fprintf(f, "<rect x='%.1f' y='%.1f' width='%.2f' height='%.1f' fill='%s'/>\n", X0 + b * bw + k * bw / 3, y, bw / 3, Y1 - y, shades[k]);
        }
    fputs("</svg><div class='legend'>light to dark: first, middle, last step</div></figure>\n", f);
}

/* Seconds a step spent generating, scoring, training and syncing, stacked (one run): each step
 * range at its mean step and mean seconds. */
static void time_split(FILE *f, const run_data *d, int r) {
    static const char *const fills[4] = { "#6baed6", "#fd8d3c", "#74c476", "#9e9ac8" };
    const time_bucket *t = d->time;
    double top = 0;
    int first = -1, last = -1;
    for (int b = 0; b < d->metrics.n_buckets; b++) {
        if (!t[b].n) continue;
        top = fmax(top, (t[b].stage[0] + t[b].stage[1] + t[b].stage[2] + t[b].stage[3]) / t[b].n);
        first = first < 0 ? b : first;
        last = b;
    }
    char id[32], title[256];
    snprintf(id, sizeof id, "time-%d", r);
    snprintf(title, sizeof title, "Where a step goes (%s)", d->dir);
    figure_open(f, id, title);
    const axis xa = range_of((double[]){ (double)d->metrics.lo, (double)d->metrics.hi }, 2, false);
    const axis ya = { 0, top > 0 ? top : 1, false };
    axes(f, &xa, &ya, "step", "seconds");
    for (int k = 3; k >= 0; k--) { /* each layer: the sum of the stages up to it, drawn from the top one down */
        fprintf(f, "<polygon fill='%s' points='%d,%d ", fills[k], (int)map(&xa, t[first].x / t[first].n, X0, X1), Y1);
        for (int b = first; b <= last; b++) {
            if (!t[b].n) continue;
            double s = 0;
            for (int j = 0; j <= k; j++) s += t[b].stage[j];
            point(f, &xa, &ya, t[b].x / t[b].n, s / t[b].n);
        }
        fprintf(f, "%d,%d'/>\n", (int)map(&xa, t[last].x / t[last].n, X0, X1), Y1);
    }
    fputs("</svg><div class='legend'><span style='color:#6baed6'>&#9632; generate</span> <span style='color:#fd8d3c'>&#9632; score</span> "
          "<span style='color:#74c476'>&#9632; train</span> <span style='color:#9e9ac8'>&#9632; sync</span></div></figure>\n", f);
}

/* Held-out evaluations: eval.jsonl's (before training and after the last step included) when
 * every run has one, else the metrics' periodic ones. */
static void eval_chart(FILE *f, const run_data *runs, int n) {
    bool all = true;
    for (int r = 0; r < n; r++) all &= runs[r].evals.n > 0;
    line_chart(f, runs, n, all, C_EVAL);
}

static const char STYLE[] =
    "body{font:14px system-ui,sans-serif;margin:16px;color:#222;max-width:1500px}"
    ".grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:12px}"
    "figure{margin:0;border:1px solid #ddd;border-radius:6px;padding:8px}figcaption{font-weight:600;margin-bottom:4px}"
    "svg.chart{width:100%;height:auto;display:block}.t{font-size:11px;fill:#555}.l{font-size:12px;fill:#222}"
    ".legend{font-size:12px;color:#444;overflow-wrap:anywhere}pre{background:#f6f6f6;padding:8px;overflow:auto;font-size:12px}";

static void write_page(FILE *f, const run_data *runs, int n) {
    fprintf(f, "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><meta name='viewport' content='width=device-width, "
               "initial-scale=1'><title>trill report</title><style>%s</style></head><body>\n<h1>trill report</h1>\n<p>", STYLE);
    for (int r = 0; r < n; r++) {
        fprintf(f, "<span style='color:%s'>&#9632;</span> ", COLORS[r % MAX_RUNS]);
        escape(f, runs[r].dir);
        const source *m = &runs[r].metrics;
        fprintf(f, ": steps %lld to %lld", m->lo, m->hi);
        if (m->thinned)
            fprintf(f, " (%ld steps, drawn in %d ranges of steps: a line through each range's lowest and highest value, at most %d "
                       "points)", m->n, m->n_buckets, 2 * m->n_buckets);
        fputs(r + 1 < n ? "; " : "", f);
    }
    fputs("</p>\n<h2>Learning</h2><div class='grid'>\n", f);
    for (int c = C_REWARD; c <= C_RESPONSE_LEN; c++)
        if (c == C_EVAL) eval_chart(f, runs, n);
        else line_chart(f, runs, n, false, c);
    fputs("</div>\n<h2>Training-inference mismatch</h2><div class='grid'>\n", f);
    for (int c = C_MISMATCH; c <= C_FLIP_RATE; c++) line_chart(f, runs, n, false, c);
    for (int r = 0; r < n; r++) flip_heatmap(f, &runs[r], r);
    for (int r = 0; r < n; r++) {
        hist_chart(f, &runs[r], r, "log_ratio", "log(pi_train / mu) per token", "bin: |delta| decades, negative | 0 | positive");
        hist_chart(f, &runs[r], r, "weight_used", "Importance weight the loss uses (bin 0: masked)", "bin: weight");
    }
    fputs("</div>\n<h2>Speed and sync</h2><div class='grid'>\n", f);
    for (int c = C_THROUGHPUT; c <= C_SYNC_BYTES; c++) line_chart(f, runs, n, false, c);
    for (int r = 0; r < n; r++) time_split(f, &runs[r], r);
    fputs("</div>\n<h2>Resolved config</h2>\n", f);
    for (int r = 0; r < n; r++) {
        fputs("<details><summary>", f);
        escape(f, runs[r].dir);
        fputs("</summary><pre>", f);
        escape(f, runs[r].config ? runs[r].config : "(no config.yaml)");
        fputs("</pre></details>\n", f);
    }
    fputs("</body></html>\n", f);
}

trill_status trill_report_write(const char *const *dirs, int n, const char *out, long *steps) {
    if (n < 1 || n > MAX_RUNS) return trill_error(TRILL_ERR_INVALID, "report: %d runs, expected 1 to %d", n, MAX_RUNS);
    run_data runs[MAX_RUNS] = { 0 };
    trill_status st = TRILL_OK;
    long total = 0;
    for (int r = 0; r < n && !st; r++) {
        runs[r].dir = dirs[r];
        st = read_run(&runs[r]);
        total += runs[r].metrics.n;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *f = st ? NULL : open_memstream(&buf, &len);
    if (!st && !f) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (f) {
        write_page(f, runs, n);
        if (fclose(f) != 0 || !buf) st = trill_error(TRILL_ERR_NOMEM, "out of memory for the report");
    }
    if (!st) st = trill_write_file_atomic(out, buf, len);
    free(buf);
    for (int r = 0; r < n; r++) free_run(&runs[r]);
    if (steps) *steps = total;
    return st;
}
