/* A step's metrics (trill_rl_metrics, trill/rl.h) as a metrics.jsonl line: the one serializer.
 * Keys keep their historical order; a figure that does not apply (NAN, inf) is null. */
#include <math.h>
#include <stdio.h>

#include "base/json.h"
#include "trill/run_config.h"
#include "trill/rl_metrics.h"
#include "trill/run.h"

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

typedef struct writer { json_t *o; bool ok; } writer;

static void put(writer *w, json_t *obj, const char *key, json_t *v) { w->ok &= v != NULL && json_object_set_new(obj, key, v) == 0; }

static json_t *int_array_l(const long *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i]))) { json_decref(a); return NULL; }
    return a;
}

static json_t *num_array(const double *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, num(v[i]))) { json_decref(a); return NULL; }
    return a;
}

/* "hist": the per-token distributions in their fixed bins (trill/rl.h), counts only. */
static void put_hist(writer *w, json_t *o, const trill_rl_histograms *h) {
    json_t *j = json_object();
    put(w, o, "hist", j);
    if (!j) return;
    put(w, j, "log_ratio", int_array_l(h->log_ratio, TRILL_RL_HIST_RATIO_BINS));
    put(w, j, "weight_raw", int_array_l(h->weight_raw, TRILL_RL_HIST_WEIGHT_BINS));
    put(w, j, "weight_used", int_array_l(h->weight_used, TRILL_RL_HIST_WEIGHT_BINS));
    put(w, j, "response_len", int_array_l(h->response_len, TRILL_RL_HIST_LEN_BINS));
}

/* "transfer": {"bytes": .., "checksum": "hex", "receivers": [{"rank": .., "receive_ms": .., "apply_ms": ..}, ...]} */
static void put_transfer(writer *w, json_t *o, const trill_rl_metrics *m) {
    json_t *t = json_object(), *list = json_array();
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)m->transfer_checksum);
    put(w, o, "transfer", t);
    if (!t) return;
    put(w, t, "bytes", json_integer((json_int_t)m->transfer_bytes));
    put(w, t, "checksum", json_string(hex));
    put(w, t, "receivers", list);
    for (int i = 0; list && i < m->n_receivers; i++) {
        json_t *e = json_object();
        w->ok &= e && json_array_append_new(list, e) == 0;
        if (!e) return;
        put(w, e, "rank", json_integer(m->receivers[i].rank));
        put(w, e, "bytes", json_integer((json_int_t)m->receivers[i].bytes));
        put(w, e, "receive_ms", num(m->receivers[i].receive_ms));
        put(w, e, "apply_ms", num(m->receivers[i].apply_ms));
    }
}

/* "comm": {"allreduce": {"bytes": .., "ms": ..}, ...}, the kinds the step used. */
static void put_comm(writer *w, json_t *o, const trill_rl_metrics *m) {
    json_t *cm = json_object();
    put(w, o, "comm", cm);
    for (int k = 0; cm && k < TRILL_COMM_KINDS; k++) {
        if (!m->comm_bytes[k] && m->comm_ms[k] == 0) continue;
        json_t *e = json_object();
        put(w, cm, trill_comm_kind_name((trill_comm_kind)k), e);
        if (e) {
            put(w, e, "bytes", json_integer((json_int_t)m->comm_bytes[k]));
            put(w, e, "ms", num(m->comm_ms[k]));
        }
    }
}

/* "time": the step's phases, throughput and what the process spent (CPU, faults, peak memory). */
static void put_time(writer *w, json_t *o, const trill_rl_metrics *m) {
    json_t *t = json_object();
    put(w, o, "time", t);
    if (t) {
        put(w, t, "generate_s", num(m->time.generate_s));
        put(w, t, "reward_s", num(m->time.reward_s));
        put(w, t, "train_s", num(m->time.train_s));
        put(w, t, "sync_s", num(m->time.sync_s));
        put(w, t, "step_s", num(m->time.step_s));
        put(w, t, "gen_tokens_per_s", num(m->time.gen_tokens_per_s));
        put(w, t, "train_tokens_per_s", num(m->time.train_tokens_per_s));
        put(w, t, "system_s", num(m->time.system_s));
        put(w, t, "user_s", num(m->time.user_s));
        put(w, t, "minor_faults", json_integer((json_int_t)m->time.minor_faults));
        put(w, t, "rss_peak_mb", num(m->time.rss_peak_mb));
        if (m->time.rss_peak_max_mb > 0) put(w, t, "rss_peak_max_mb", num(m->time.rss_peak_max_mb));
        if (m->on_policy) put(w, t, "score_s", num(m->time.score_s));
        if (m->async) {
            put(w, t, "trainer_wait_s", num(m->time.trainer_wait_s));
            put(w, t, "generator_apply_ms", num(m->time.generator_apply_ms));
            put(w, t, "interval_s", num(m->time.interval_s)); /* wall time since the previous step */
        }
    }
}

/* The async policy's figures of the batch trained. */
static void put_async(writer *w, json_t *o, const trill_rl_metrics *m) {
    put(w, o, "batch", json_integer(m->batch));
    put(w, o, "staleness_mean", num(m->staleness_mean));
    put(w, o, "staleness_max", json_integer(m->staleness_max));
    put(w, o, "staleness_tokens", int_array_l(m->staleness_tokens, m->staleness_max + 1)); /* tokens at lag 0, 1, ... */
    put(w, o, "dropped_batches", json_integer(m->dropped_batches));
    put(w, o, "regenerated_batches", json_integer(m->regenerated_batches));
}

/* The batch's and the update's figures. */
static void put_update(writer *w, json_t *o, const trill_rl_metrics *m) {
    put(w, o, "reward", num(m->reward));
    put(w, o, "accuracy", num(m->accuracy));
    put(w, o, "response_len", num(m->response_len));
    put(w, o, "flat_groups", json_integer(m->flat_groups));
    put(w, o, "trained_seqs", json_integer(m->trained_seqs));
    put(w, o, "loss", num(m->loss));
    put(w, o, "pg_loss", num(m->pg_loss));
    put(w, o, "kl_loss", num(m->kl_loss));
    put(w, o, "kl_ref", num(m->kl_ref));
    put(w, o, "clip_frac", num(m->clip_frac));
    put(w, o, "ratio_mean", num(m->ratio_mean));
    put(w, o, "grad_norm", num(m->grad_norm));
    put(w, o, "skipped_nonfinite", json_integer(m->skipped_nonfinite));
    put(w, o, "lr", num(m->lr));
}

/* The training-inference mismatch and its corrections. */
static void put_mismatch(writer *w, json_t *o, const trill_rl_metrics *m) {
    put(w, o, "mismatch_mean_abs", num(m->mismatch_mean_abs));
    put(w, o, "mismatch_max_abs", num(m->mismatch_max_abs));
    put(w, o, "mismatch_k1", num(m->mismatch_k1));
    put(w, o, "mismatch_k3", num(m->mismatch_k3));
    put(w, o, "mismatch_chi2", num(m->mismatch_chi2));
    put(w, o, "mismatch_tokens", json_integer(m->mismatch_tokens));
    put(w, o, "tis_mean", num(m->tis_mean));
    put(w, o, "tis_capped_frac", num(m->tis_capped_frac));
    put(w, o, "mis_masked_frac", num(m->mis_masked_frac));
    put(w, o, "flip_token_frac", num(m->flip_token_frac));
    put(w, o, "flip_layer", num_array(m->flip_layer, m->n_moe_layers));
}

/* The episodes' figures (env.kind). */
static void put_env(writer *w, json_t *o, const trill_rl_metrics *m) {
    json_t *e = json_object();
    if (!e) {
        w->ok = false;
        return;
    }
    put(w, e, "turns", num(m->env.turns));
    put(w, e, "cut_turns", num(m->env.cut_turns));
    put(w, e, "sampled_tokens", num(m->env.sampled_tokens));
    put(w, e, "injected_tokens", num(m->env.injected_tokens));
    put(w, e, "return", num(m->env.return_mean));
    put(w, e, "tool_calls", num(m->env.tool_calls));
    put(w, e, "parse_errors", num(m->env.parse_errors));
    put(w, e, "stop_done", json_integer(m->env.stops[0]));
    put(w, e, "stop_max_turns", json_integer(m->env.stops[1]));
    put(w, e, "stop_context", json_integer(m->env.stops[2]));
    put(w, e, "stop_env_error", json_integer(m->env.stops[3]));
    put(w, e, "env_s", num(m->env.env_s));
    put(w, e, "prefill_tokens", json_integer(m->env.prefill_tokens));
    put(w, e, "rerender_prefill_tokens", json_integer(m->env.rerender_prefill_tokens));
    json_t *own = json_object();
    for (int i = 0; own && i < m->env.n_metrics; i++) put(w, own, m->env.metric_name[i], num(m->env.metric_value[i]));
    put(w, e, "metrics", own);
    put(w, o, "env", e);
}

static json_t *to_json(const trill_rl_metrics *m) {
    writer w = { .o = json_object(), .ok = true };
    json_t *o = w.o;
    if (!o) return NULL;
    put(&w, o, "step", json_integer(m->step));
    if (m->async) put_async(&w, o, m);
    put_update(&w, o, m);
    put_mismatch(&w, o, m);
    if (m->has_env) put_env(&w, o, m);
    if (m->has_hist) put_hist(&w, o, &m->hist);
    if (m->has_comm) put_comm(&w, o, m);
    if (m->on_policy) {
        put(&w, o, "on_policy_exact", json_boolean(m->on_policy_differing == 0));
        put(&w, o, "on_policy_differing", json_integer(m->on_policy_differing));
    }
    put(&w, o, "sync_mode", json_string(m->sync_mode == TRILL_WEIGHT_SYNC_ADAPTER ? "adapter" : "merge"));
    put(&w, o, "sync_bytes", json_integer((json_int_t)m->sync_bytes));
    put(&w, o, "sync_ms", num(m->sync_ms));
    put(&w, o, "policy_version", json_integer(m->policy_version));
    if (m->n_receivers) put_transfer(&w, o, m);
    for (int i = 0; i < m->n_ext; i++) {
        char name[80];
        snprintf(name, sizeof name, "reward_ext_%s", m->ext_name[i]);
        put(&w, o, name, num(m->ext_value[i]));
    }
    put_time(&w, o, m);
    if (m->async) put(&w, o, "generator_apply_bytes", json_integer((json_int_t)m->generator_apply_bytes));
    if (m->has_eval) {
        put(&w, o, "eval_pass1", num(m->eval_pass1));
        put(&w, o, "eval_passk", num(m->eval_passk));
    }
    if (!w.ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *trill_rl_metrics_json(const trill_rl_metrics *m) {
    json_t *o = to_json(m);
    char *line = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(o);
    return line;
}

/* ---- the progress line ---- */

static void format_duration(double s, char *out, size_t n) {
    if (!isfinite(s) || s < 0) snprintf(out, n, "?");
    else if (s < 60) snprintf(out, n, "%.0fs", s);
    else if (s < 3600) snprintf(out, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(out, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

enum { FIGURE_CHARS = 32 };
/* A figure for the line in `fmt`, "n/a" where it does not apply or is not a number (NAN, inf:
 * null in metrics.jsonl), never a 0 that reads as a value. */
static const char *shown(const char *fmt, double v, char buf[FIGURE_CHARS]) {
    if (!isfinite(v)) return "n/a";
    snprintf(buf, FIGURE_CHARS, fmt, v);
    return buf;
}

void trill_run_progress_line(const trill_run_status *s, double step_wall_s, bool async, char *out, size_t size) {
    const trill_rl_metrics *m = &s->last;
    char eta[32], f[12][FIGURE_CHARS], turns[48] = "";
    if (m->has_env) snprintf(turns, sizeof turns, " turns %.1f", m->env.turns);
    format_duration(step_wall_s * (s->steps - s->step), eta, sizeof eta);
    const double per = step_wall_s > 0 ? step_wall_s : 1;
    snprintf(out, size,
             "step %d/%d | reward %s acc %s%s | loss %s kl %s | mismatch |d| %s k3 %s flips %s | gen %s train %s | "
             "time gen %s train %s sync %s%s | ETA %s",
             s->step, s->steps, shown("%.3f", m->reward, f[0]), shown("%.1f%%", 100 * m->accuracy, f[1]), turns, shown("%+.4f", m->loss, f[2]),
             shown("%.2e", m->kl_ref, f[3]), shown("%.2e", m->mismatch_mean_abs, f[4]), shown("%.2e", m->mismatch_k3, f[5]),
             shown("%.1f%%", 100 * m->flip_token_frac, f[6]), shown("%.0f tok/s", m->time.gen_tokens_per_s, f[7]),
             shown("%.0f tok/s", m->time.train_tokens_per_s, f[8]), shown("%.0f%%", 100 * m->time.generate_s / per, f[9]),
             shown("%.0f%%", 100 * m->time.train_s / per, f[10]), shown("%.1f ms", m->sync_ms, f[11]), async ? " (async: overlapped)" : "",
             eta);
}
