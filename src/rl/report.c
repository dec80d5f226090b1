/* `trill report` (trill/report.h): metrics.jsonl of one or more runs as one HTML page of inline
 * SVG charts. Each chart is an <svg class="chart"> in a <figure> with a data-chart name; a line
 * chart draws one <polyline> per run and figure (several runs overlay, a legend names them), a
 * heatmap and the histograms draw <rect>s; axes carry their units. No script, no external file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/json.h"
#include "trill/fileio.h"
#include "trill/report.h"

enum { W = 480, H = 280, X0 = 64, X1 = 468, Y0 = 34, Y1 = 236, MAX_RUNS = 8 };
static const char *const COLORS[MAX_RUNS] = { "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2" };

typedef struct run_data {
    const char *dir;
    json_t **steps;
    int n;
    json_t **evals; /* eval.jsonl's lines: every held-out evaluation, before training included */
    int n_evals;
    char *config;   /* config.yaml, or NULL */
} run_data;

/* ---- reading ---- */

/* RUN/name's lines (each an object with an integer step; a last line without its newline left
 * out) into *lines; a missing file is no line when `optional`. */
static trill_status read_lines(const char *dir, const char *name, bool optional, json_t ***lines, int *n) {
    char *path = trill_path_join(dir, name), *text = NULL;
    size_t len = 0;
    if (path && optional && !trill_file_exists(path)) {
        free(path);
        return TRILL_OK;
    }
    trill_status st = path ? trill_read_file(path, &text, &len) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    int line = 0;
    for (size_t at = 0; !st && at < len; line++) {
        const char *nl = memchr(text + at, '\n', len - at);
        if (!nl) break; /* a line still being written: the run is reported up to its last complete step */
        json_error_t e;
        json_t *j = json_loadb(text + at, (size_t)(nl - text - at), 0, &e);
        if (!j || !json_is_integer(json_object_get(j, "step")))
            st = trill_error(TRILL_ERR_INVALID, "%s: line %d: %s", path, line + 1,
                             j ? "expected a JSON object with an integer \"step\"" : e.text);
        json_t **grown = st ? NULL : trill_realloc(*lines, sizeof *grown * (size_t)(*n + 1));
        if (!st && !grown) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (st) json_decref(j);
        else (*lines = grown)[(*n)++] = j;
        at = (size_t)(nl - text) + 1;
    }
    if (!st && !optional && *n == 0) st = trill_error(TRILL_ERR_INVALID, "%s: no complete step yet", path);
    free(text);
    free(path);
    return st;
}

static trill_status read_metrics(run_data *d) {
    size_t len;
    trill_status st = read_lines(d->dir, "metrics.jsonl", false, &d->steps, &d->n);
    if (!st) st = read_lines(d->dir, "eval.jsonl", true, &d->evals, &d->n_evals);
    if (st) return st;
    char *cfg = trill_path_join(d->dir, "config.yaml");
    if (cfg && trill_file_exists(cfg)) st = trill_read_file(cfg, &d->config, &len);
    free(cfg);
    return st;
}

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

/* One line chart of metric `key` (and `key2` dashed, when given) over the steps of every run. */
static void line_chart(FILE *f, const run_data *runs, int n, const char *id, const char *title, const char *ylabel, const char *key,
                       const char *key2, double scale, bool log_scale) {
    int total = 0;
    for (int r = 0; r < n; r++) total += runs[r].n;
    double *xs = trill_malloc(sizeof(double) * (size_t)(2 * total + 1)), *ys = trill_malloc(sizeof(double) * (size_t)(2 * total + 1));
    if (!xs || !ys) { free(xs); free(ys); return; }
    int k = 0;
    for (int r = 0; r < n; r++)
        for (int i = 0; i < runs[r].n; i++) {
            xs[k] = field(runs[r].steps[i], "step");
            ys[k++] = field(runs[r].steps[i], key) * scale;
            if (key2) xs[k] = xs[k - 1], ys[k++] = field(runs[r].steps[i], key2) * scale;
        }
    int finite = 0;
    for (int i = 0; i < k; i++) finite += isfinite(ys[i]) && (!log_scale || ys[i] > 0);
    if (!finite) { /* e.g. KL without a reference term: said, not drawn as an empty frame */
        fprintf(f, "<figure data-chart='%s' data-empty='1'><figcaption>", id);
        escape(f, title);
        fprintf(f, "</figcaption><p class='legend'>no values of %s in these runs</p></figure>\n", key);
        free(xs);
        free(ys);
        return;
    }
    const axis xa = range_of(xs, k, false), ya = range_of(ys, k, log_scale);
    figure_open(f, id, title);
    axes(f, &xa, &ya, "step", ylabel);
    for (int r = 0; r < n; r++)
        for (int which = 0; which < (key2 ? 2 : 1); which++) {
            fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.6'%s points='", COLORS[r % MAX_RUNS],
                    which ? " stroke-dasharray='4 3'" : "");
            for (int i = 0; i < runs[r].n; i++) {
                const double x = field(runs[r].steps[i], "step"), y = field(runs[r].steps[i], which ? key2 : key) * scale;
                if (isfinite(y) && (!log_scale || y > 0)) fprintf(f, "%.1f,%.1f ", map(&xa, x, X0, X1), map(&ya, y, Y1, Y0));
            }
            fputs("'/>\n", f);
        }
    legend(f, runs, n, key, key2);
    free(xs);
    free(ys);
}

/* Routing flips per MoE layer over the steps of one run: a cell per (step, layer), darker = more. */
static void flip_heatmap(FILE *f, const run_data *d, int r) {
    const json_t *first = json_object_get(d->steps[0], "flip_layer");
    const int L = (int)json_array_size(first);
    if (L == 0) return;
    double top = 0;
    for (int i = 0; i < d->n; i++)
        for (int l = 0; l < L; l++) top = fmax(top, json_number_value(json_array_get(json_object_get(d->steps[i], "flip_layer"), (size_t)l)));
    char id[32], title[256];
    snprintf(id, sizeof id, "flips-%d", r);
    snprintf(title, sizeof title, "Routing flips per MoE layer (%s; darkest = %.3g%% of the tokens)", d->dir, 100 * top);
    figure_open(f, id, title);
    const axis xa = { field(d->steps[0], "step") - 0.5, field(d->steps[d->n - 1], "step") + 0.5, false }, ya = { 0, L, false };
    axes(f, &xa, &ya, "step", "MoE layer (ordinal)");
    const double cw = (double)(X1 - X0) / d->n, ch = (double)(Y1 - Y0) / L;
    for (int i = 0; i < d->n; i++)
        for (int l = 0; l < L; l++) {
            const double v = json_number_value(json_array_get(json_object_get(d->steps[i], "flip_layer"), (size_t)l));
            fprintf(f, "<rect x='%.1f' y='%.1f' width='%.2f' height='%.2f' fill='%s' fill-opacity='%.3f'/>\n", X0 + i * cw, Y1 - (l + 1) * ch,
                    cw + 0.05, ch + 0.05, COLORS[r % MAX_RUNS], top > 0 ? 0.08 + 0.92 * v / top : 0.08);
        }
    fputs("</svg><div class='legend'>each cell: the share of a step's tokens routed differently by the trainer in that layer</div></figure>\n", f);
}

/* Bars of a histogram (hist.<name>) at the first, middle and last steps of one run. */
static void hist_chart(FILE *f, const run_data *d, int r, const char *name, const char *title, const char *xlabel) {
    const int at[3] = { 0, d->n / 2, d->n - 1 };
    const json_t *h0 = json_object_get(json_object_get(d->steps[at[0]], "hist"), name);
    const int bins = (int)json_array_size(h0);
    if (!bins) return;
    char id[48], full[256];
    snprintf(id, sizeof id, "hist-%s-%d", name, r);
    snprintf(full, sizeof full, "%s (%s): steps %g, %g, %g", title, d->dir, field(d->steps[at[0]], "step"), field(d->steps[at[1]], "step"),
             field(d->steps[at[2]], "step"));
    double top = 1;
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < bins; b++)
            top = fmax(top, json_number_value(json_array_get(json_object_get(json_object_get(d->steps[at[k]], "hist"), name), (size_t)b)));
    figure_open(f, id, full);
    const axis xa = { 0, bins, false }, ya = { 0, top, false };
    axes(f, &xa, &ya, xlabel, "tokens");
    static const char *const shades[3] = { "#9ecae1", "#4292c6", "#08306b" };
    const double bw = (double)(X1 - X0) / bins;
    for (int k = 0; k < 3; k++)
        for (int b = 0; b < bins; b++) {
            const double v = json_number_value(json_array_get(json_object_get(json_object_get(d->steps[at[k]], "hist"), name), (size_t)b));
            const double y = map(&ya, v, Y1, Y0);
            fprintf(f, "<rect x='%.1f' y='%.1f' width='%.2f' height='%.1f' fill='%s'/>\n", X0 + b * bw + k * bw / 3, y, bw / 3, Y1 - y, shades[k]);
        }
    fputs("</svg><div class='legend'>light to dark: first, middle, last step</div></figure>\n", f);
}

/* Seconds a step spent generating, scoring, training and syncing, stacked (one run). */
static void time_split(FILE *f, const run_data *d, int r) {
    static const char *const keys[4] = { "time.generate_s", "time.reward_s", "time.train_s", "time.sync_s" };
    static const char *const fills[4] = { "#6baed6", "#fd8d3c", "#74c476", "#9e9ac8" };
    double top = 0;
    for (int i = 0; i < d->n; i++) {
        double s = 0;
        for (int k = 0; k < 4; k++) s += isfinite(field(d->steps[i], keys[k])) ? field(d->steps[i], keys[k]) : 0;
        top = fmax(top, s);
    }
    char id[32], title[256];
    snprintf(id, sizeof id, "time-%d", r);
    snprintf(title, sizeof title, "Where a step goes (%s)", d->dir);
    figure_open(f, id, title);
    const axis xa = range_of((double[]){ field(d->steps[0], "step"), field(d->steps[d->n - 1], "step") }, 2, false);
    const axis ya = { 0, top > 0 ? top : 1, false };
    axes(f, &xa, &ya, "step", "seconds");
    for (int k = 3; k >= 0; k--) { /* each layer: the sum of the stages up to it, drawn from the top one down */
        fprintf(f, "<polygon fill='%s' points='%d,%d ", fills[k], (int)map(&xa, field(d->steps[0], "step"), X0, X1), Y1);
        for (int i = 0; i < d->n; i++) {
            double s = 0;
            for (int j = 0; j <= k; j++) s += isfinite(field(d->steps[i], keys[j])) ? field(d->steps[i], keys[j]) : 0;
            fprintf(f, "%.1f,%.1f ", map(&xa, field(d->steps[i], "step"), X0, X1), map(&ya, s, Y1, Y0));
        }
        fprintf(f, "%d,%d'/>\n", (int)map(&xa, field(d->steps[d->n - 1], "step"), X0, X1), Y1);
    }
    fputs("</svg><div class='legend'><span style='color:#6baed6'>&#9632; generate</span> <span style='color:#fd8d3c'>&#9632; score</span> "
          "<span style='color:#74c476'>&#9632; train</span> <span style='color:#9e9ac8'>&#9632; sync</span></div></figure>\n", f);
    (void)r;
}

/* Held-out evaluations: eval.jsonl's (before training and after the last step included) when
 * every run has one, else the metrics' periodic ones. */
static void eval_chart(FILE *f, const run_data *runs, int n) {
    run_data view[MAX_RUNS];
    bool all = true;
    for (int r = 0; r < n; r++) {
        view[r] = runs[r];
        view[r].steps = runs[r].evals;
        view[r].n = runs[r].n_evals;
        all &= runs[r].n_evals > 0;
    }
    if (all)
        line_chart(f, view, n, "eval", "Held-out evaluation, from before training (step 0) to after (pass@1 solid, pass@k dashed)",
                   "% of prompts", "pass1", "passk", 100, false);
    else
        line_chart(f, runs, n, "eval", "Held-out evaluation (pass@1 solid, pass@k dashed)", "% of prompts", "eval_pass1", "eval_passk", 100, false);
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
        fprintf(f, ": steps %g to %g%s", field(runs[r].steps[0], "step"), field(runs[r].steps[runs[r].n - 1], "step"), r + 1 < n ? "; " : "");
    }
    fputs("</p>\n<h2>Learning</h2><div class='grid'>\n", f);
    line_chart(f, runs, n, "reward", "Reward (batch mean)", "reward", "reward", NULL, 1, false);
    line_chart(f, runs, n, "accuracy", "Training accuracy", "% of samples correct", "accuracy", NULL, 100, false);
    eval_chart(f, runs, n);
    line_chart(f, runs, n, "loss", "Loss", "loss per optimizer step", "loss", NULL, 1, false);
    line_chart(f, runs, n, "kl", "KL to the reference (kl_ref)", "nats per token", "kl_ref", NULL, 1, false);
    line_chart(f, runs, n, "response_len", "Response length", "tokens (mean)", "response_len", NULL, 1, false);
    fputs("</div>\n<h2>Training-inference mismatch</h2><div class='grid'>\n", f);
    line_chart(f, runs, n, "mismatch", "|log pi_train - log mu| (mean solid, max dashed)", "nats (log scale)", "mismatch_mean_abs",
               "mismatch_max_abs", 1, true);
    line_chart(f, runs, n, "k3", "k3 estimate of KL(mu || pi_train)", "nats per token (log scale)", "mismatch_k3", NULL, 1, true);
    line_chart(f, runs, n, "flip_rate", "Routing flips", "% of tokens with another expert set", "flip_token_frac", NULL, 100, false);
    for (int r = 0; r < n; r++) flip_heatmap(f, &runs[r], r);
    for (int r = 0; r < n; r++) {
        hist_chart(f, &runs[r], r, "log_ratio", "log(pi_train / mu) per token", "bin: |delta| decades, negative | 0 | positive");
        hist_chart(f, &runs[r], r, "weight_used", "Importance weight the loss uses (bin 0: masked)", "bin: weight");
    }
    fputs("</div>\n<h2>Speed and sync</h2><div class='grid'>\n", f);
    line_chart(f, runs, n, "throughput", "Throughput (generated solid, trained dashed)", "tokens per second", "time.gen_tokens_per_s",
               "time.train_tokens_per_s", 1, false);
    line_chart(f, runs, n, "sync_bytes", "Weight sync per version", "KB", "sync_bytes", NULL, 1.0 / 1024, false);
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
        st = read_metrics(&runs[r]);
        total += runs[r].n;
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
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < runs[r].n; i++) json_decref(runs[r].steps[i]);
        for (int i = 0; i < runs[r].n_evals; i++) json_decref(runs[r].evals[i]);
        free(runs[r].steps);
        free(runs[r].evals);
        free(runs[r].config);
    }
    if (steps) *steps = total;
    return st;
}
