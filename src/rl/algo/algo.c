/* Advantages, policy losses, KL estimators, importance-sampling corrections and mismatch
 * metrics (trill/rl_algo.h). The formulas, their sources and every convention are in
 * docs/algorithms.md; arithmetic is in double, gradients are written as float. */
#include "trill/rl_algo.h"
#include "trill/loss.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* exp of a log-ratio, clamped to [-20, 20] so that a wild token cannot produce inf (and then
 * NaN through 0 * inf); e^20 ≈ 4.85e8 is already far outside any clip band. */
static double exp_clamped(double log_ratio) {
    return exp(fmin(fmax(log_ratio, -20.0), 20.0));
}

static double clampd(double x, double lo, double hi) {
    return fmin(fmax(x, lo), hi);
}

void trill_rl_group_advantages(const double *rewards, int n_groups, int group_size, bool std_norm, double eps, double *adv) {
    for (int g = 0; g < n_groups; g++) {
        const double *r = rewards + (size_t)g * group_size;
        double *a = adv + (size_t)g * group_size;
        if (group_size == 1) {
            a[0] = 0;
            continue;
        }
        /* Rewards beyond 1e100 are scaled by the largest first, so that the sum and the squares
         * cannot overflow: any finite rewards give finite statistics (and ordinary ones the
         * plain formula's exact results). */
        double big = 0;
        for (int j = 0; j < group_size; j++) big = fmax(big, fabs(r[j]));
        const double unit = big > 1e100 ? big : 1.0;
        double mean = 0, ss = 0;
        for (int j = 0; j < group_size; j++) mean += r[j] / unit;
        mean /= group_size;
        for (int j = 0; j < group_size; j++) ss += (r[j] / unit - mean) * (r[j] / unit - mean);
        /* std_norm: (r - mean) / (std + eps) in units; Dr. GRPO: r - mean (beyond DBL_MAX only if the
         * rewards themselves span more than that) */
        const double scale = std_norm ? 1.0 / (sqrt(ss / (group_size - 1)) + eps / unit) : unit;
        for (int j = 0; j < group_size; j++) a[j] = (r[j] / unit - mean) * scale;
    }
}

bool trill_rl_group_is_flat(const double *rewards, int group_size) {
    for (int j = 1; j < group_size; j++)
        if (rewards[j] != rewards[0]) return false;
    return true;
}

double trill_rl_kl_value(trill_kl_estimator e, double logp, double ref_logp) {
    const double x = logp - ref_logp;
    switch (e) {
    case TRILL_KL_K1: return x;
    case TRILL_KL_K2: return 0.5 * x * x;
    case TRILL_KL_K3: return exp_clamped(-x) - 1.0 + x;
    }
    assert(!"unknown KL estimator");
    return 0;
}

double trill_rl_kl_grad(trill_kl_estimator e, double logp, double ref_logp) {
    const double x = logp - ref_logp;
    switch (e) {
    case TRILL_KL_K1: return 1.0;
    case TRILL_KL_K2: return x;
    case TRILL_KL_K3: return 1.0 - exp_clamped(-x);
    }
    assert(!"unknown KL estimator");
    return 0;
}

static bool masked_in(const rl_loss_batch *b, int t) {
    return !b->mask || b->mask[t];
}

/* The aggregation weight c of every masked-in token of a sequence with n masked-in tokens:
 * loss = sum_t c_t L_t. */
static double agg_weight(trill_rl_agg agg, double token_mean_denom, int n_seqs, int n) {
    switch (agg) {
    case TRILL_AGG_TOKEN_MEAN: return 1.0 / token_mean_denom;
    case TRILL_AGG_SEQ_MEAN_TOKEN_SUM: return 1.0 / n_seqs;
    case TRILL_AGG_SEQ_MEAN_TOKEN_MEAN: return 1.0 / ((double)n_seqs * n);
    }
    assert(!"unknown aggregation");
    return 0;
}

/* The per-token surrogates (the loss table, trill/loss.h): loss value and d loss / d logp of one
 * token (before the TIS and aggregation weights), the ratio against the old policy or, for AIPO,
 * the generator's; returns whether the clip changed it. */
static bool token_surrogate(const trill_run_config *cfg, double logp, double old_logp, double behav_logp, double a,
                            double *loss, double *grad, double *ratio) {
    const trill_loss_info *L = trill_loss_get((trill_loss)cfg->algo.loss);
    assert(L && L->token && "token_surrogate: unknown or sequence-level loss");
    const trill_loss_params p = { .lo = 1.0 - cfg->algo.clip_low, .hi = 1.0 + cfg->algo.clip_high, .rho = cfg->algo.aipo_rho };
    return L->token(&p, logp, L->ratio_to == TRILL_RATIO_SAMPLER ? behav_logp : old_logp, a, 1.0, loss, grad, ratio);
}

static long masked_count(const rl_loss_batch *b) {
    long n = 0;
    for (int t = b->offsets[0]; t < b->offsets[b->n_seqs]; t++) n += masked_in(b, t);
    return n;
}

/* The KL loss term of a token under the aggregation weight c (returned) and its gradient, added to *grad. */
static double kl_term(const trill_run_config *cfg, double c, double logp, double ref_logp, double *grad) {
    const double k = cfg->algo.kl_coef * c;
    *grad += k * trill_rl_kl_grad(cfg->algo.kl_estimator, logp, ref_logp);
    return k * trill_rl_kl_value(cfg->algo.kl_estimator, logp, ref_logp);
}

/* The masked-in tokens of [t0, t1): their count, the sum of their log-ratios to the old policy and
 * of their importance weights (1 without). */
static int masked_sums(const rl_loss_batch *b, int t0, int t1, double *log_ratio_sum, double *weight_sum) {
    int n = 0;
    *log_ratio_sum = *weight_sum = 0;
    for (int t = t0; t < t1; t++) {
        if (!masked_in(b, t)) continue;
        n++;
        *log_ratio_sum += (double)b->logp[t] - (double)b->old_logp[t];
        *weight_sum += b->is_weight ? b->is_weight[t] : 1.0;
    }
    return n;
}

/* GSPO: one sequence ratio s (the exp of the mean log-ratio), its clipped loss weighted by
 * sum_t c_t w_t (returned), its gradient spread evenly over the sequence's tokens
 * (d s / d logp[t] = s / n) into *seq_grad. */
static double gspo_sequence(double log_ratio_sum, int n, double a, double weight_sum, double lo, double hi, double *seq_grad,
                            bool *is_clipped, double *ratio) {
    const double s = exp_clamped(log_ratio_sum / n);
    const double unclipped = s * a, clipped = clampd(s, lo, hi) * a;
    *is_clipped = unclipped > clipped;
    *seq_grad = *is_clipped ? 0 : -a * s / n * weight_sum;
    *ratio = s;
    return -(*is_clipped ? clipped : unclipped) * weight_sum;
}

void trill_rl_policy_loss(const trill_run_config *cfg, const rl_loss_batch *b, float *dlogp, rl_loss_stats *stats) {
    memset(stats, 0, sizeof *stats);
    if (b->n_seqs <= 0) return;
    const int n_seqs = b->n_seqs;
    memset(dlogp + b->offsets[0], 0, (size_t)(b->offsets[n_seqs] - b->offsets[0]) * sizeof *dlogp);

    const long n_tokens = masked_count(b);
    const double token_mean_denom = b->agg_tokens > 0 ? b->agg_tokens : (double)n_tokens;
    if (n_tokens == 0) return;

    const trill_loss_info *L = trill_loss_get((trill_loss)cfg->algo.loss);
    /* GSPO: the sequence ratio below; a ratio to the generator (AIPO) is its own TIS weight */
    const bool gspo = L->sequence, own_is = L->ratio_to == TRILL_RATIO_SAMPLER;
    const bool kl_on = cfg->algo.kl_mode == TRILL_KL_LOSS && cfg->algo.kl_coef > 0 && b->ref_logp;
    const double lo = 1.0 - cfg->algo.clip_low, hi = 1.0 + cfg->algo.clip_high;
    double pg = 0, kl = 0, ratio_sum = 0;
    long n_clipped = 0, n_ratios = 0;

    for (int i = 0; i < n_seqs; i++) {
        const int t0 = b->offsets[i], t1 = b->offsets[i + 1];
        const double a = b->adv[i];
        double log_ratio_sum, weight_sum; /* of the masked-in tokens; weight_sum becomes sum_t c_t w_t */
        const int n = masked_sums(b, t0, t1, &log_ratio_sum, &weight_sum);
        if (n == 0) continue; /* contributes 0 (and still counts in the seq-mean modes' n_seqs) */
        const double c = agg_weight(cfg->algo.aggregation, token_mean_denom, n_seqs, n);
        weight_sum *= c;

        double seq_grad = 0;
        if (gspo) {
            bool is_clipped;
            double s;
            pg += gspo_sequence(log_ratio_sum, n, a, weight_sum, lo, hi, &seq_grad, &is_clipped, &s);
            n_clipped += is_clipped ? n : 0;
            ratio_sum += s;
            n_ratios++;
        }

        for (int t = t0; t < t1; t++) {
            if (!masked_in(b, t)) continue;
            double grad = seq_grad;
            if (!gspo) {
                double loss = 0, g = 0, r = 0;
                n_clipped += token_surrogate(cfg, b->logp[t], b->old_logp[t], b->behav_logp[t], a, &loss, &g, &r);
                const double w = c * (b->is_weight && !own_is ? b->is_weight[t] : 1.0);
                pg += w * loss;
                grad = w * g;
                ratio_sum += r;
                n_ratios++;
            }
            if (kl_on) kl += kl_term(cfg, c, b->logp[t], b->ref_logp[t], &grad);
            dlogp[t] = (float)grad;
        }
    }
    stats->pg_loss = pg;
    stats->kl_loss = kl;
    stats->loss = pg + kl;
    stats->clip_frac = (double)n_clipped / (double)n_tokens;
    stats->ratio_mean = n_ratios ? ratio_sum / (double)n_ratios : 0;
}

static bool outside(double ratio, double lo, double hi) {
    return ratio < lo || ratio > hi;
}

int trill_rl_corrections(const trill_run_config *cfg, int n_seqs, const int *offsets, const float *old_logp,
                   const float *behav_logp, float *tis_weight, uint8_t *mask) {
    const double cap = cfg->correction.tis, lo = cfg->correction.mis_low, hi = cfg->correction.mis_high;
    const int T = n_seqs > 0 ? offsets[n_seqs] : 0;
    /* not clamped here: exp overflowing to inf is truncated to the cap (TIS) or rejected (MIS) */
    for (int t = offsets[0]; t < T; t++)
        tis_weight[t] = cap > 0 ? (float)fmin(exp((double)old_logp[t] - (double)behav_logp[t]), cap) : 1.0f;
    if (!cfg->correction.mis) return 0;

    int newly_masked = 0;
    for (int i = 0; i < n_seqs; i++) {
        const int t0 = offsets[i], t1 = offsets[i + 1];
        if (cfg->correction.mis_level == TRILL_MIS_TOKEN) {
            for (int t = t0; t < t1; t++) {
                if (mask[t] && outside(exp((double)old_logp[t] - (double)behav_logp[t]), lo, hi)) {
                    mask[t] = 0;
                    newly_masked++;
                }
            }
            continue;
        }
        /* sequence / geometric: over the tokens still masked in */
        double log_ratio_sum = 0;
        int n = 0;
        for (int t = t0; t < t1; t++) {
            if (!mask[t]) continue;
            log_ratio_sum += (double)old_logp[t] - (double)behav_logp[t];
            n++;
        }
        if (n == 0) continue;
        const double log_ratio = cfg->correction.mis_level == TRILL_MIS_GEOMETRIC ? log_ratio_sum / n : log_ratio_sum;
        if (!outside(exp(log_ratio), lo, hi)) continue;
        for (int t = t0; t < t1; t++) mask[t] = 0;
        newly_masked += n;
    }
    return newly_masked;
}

void trill_rl_mismatch_measure(const float *old_logp, const float *behav_logp, size_t n, rl_mismatch *out) {
    memset(out, 0, sizeof *out);
    if (n == 0) return;
    double sum_abs = 0, k1 = 0, k3 = 0, chi2 = 0;
    for (size_t t = 0; t < n; t++) {
        const double d = (double)old_logp[t] - (double)behav_logp[t], rho = exp_clamped(d);
        sum_abs += fabs(d);
        out->max_abs = fmax(out->max_abs, fabs(d));
        k1 -= d;
        k3 += rho - 1.0 - d;
        chi2 += (rho - 1.0) * (rho - 1.0);
    }
    out->mean_abs = sum_abs / (double)n;
    out->k1 = k1 / (double)n;
    out->k3 = k3 / (double)n;
    out->chi2 = chi2 / (double)n;
    out->n_tokens = (long)n;
}

/* ---- per-token histograms ---- */

/* log_ratio: bins by the decade of |Δ| ([1e-6, 1e-5), ...), mirrored; the lower edges of the
 * values in each (bin 8 is exactly 0; bin 9, (0, 1e-6), starts at 0 too) */
static const double RATIO_EDGES[TRILL_RL_HIST_RATIO_BINS] = { -INFINITY, -1, -1e-1, -1e-2, -1e-3, -1e-4, -1e-5, -1e-6, 0,
                                                              0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1 };
static const double WEIGHT_EDGES[TRILL_RL_HIST_WEIGHT_BINS] = { 0, 1e-300, 0.5, 0.8, 0.9, 0.95, 0.99, 1.01, 1.05, 1.1, 1.25, 2, 5 };
static const double LEN_EDGES[TRILL_RL_HIST_LEN_BINS] = { 0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9 };

const double *trill_rl_hist_edges(const char *which, int *n) {
    if (!strcmp(which, "log_ratio")) return *n = TRILL_RL_HIST_RATIO_BINS, RATIO_EDGES;
    if (!strcmp(which, "weight")) return *n = TRILL_RL_HIST_WEIGHT_BINS, WEIGHT_EDGES;
    if (!strcmp(which, "response_len")) return *n = TRILL_RL_HIST_LEN_BINS, LEN_EDGES;
    return NULL;
}

/* Δ's bin: exactly 0 is bin 8; otherwise the decade of |Δ| (0: below 1e-6, 1: [1e-6, 1e-5), ...,
 * 7: 1 and above), counted down from bin 7 for a negative Δ and up from bin 9 for a positive one. */
static int ratio_bin(double d) {
    if (d == 0) return 8;
    static const double decades[7] = { 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1 };
    const double a = fabs(d);
    int decade = 0;
    while (decade < 7 && a >= decades[decade]) decade++;
    return d < 0 ? 7 - decade : 9 + decade;
}

static int weight_bin(double w) {
    int b = 0;
    while (b + 1 < TRILL_RL_HIST_WEIGHT_BINS && w >= WEIGHT_EDGES[b + 1]) b++;
    return b;
}

void trill_rl_hist_tokens(trill_rl_histograms *h, const float *old_logp, const float *behav_logp, const float *used_weight,
                          const uint8_t *mask, size_t n) {
    for (size_t t = 0; t < n; t++) {
        const double d = (double)old_logp[t] - (double)behav_logp[t];
        h->log_ratio[ratio_bin(d)]++;
        h->weight_raw[weight_bin(exp_clamped(d))]++;
        h->weight_used[mask && !mask[t] ? 0 : weight_bin(used_weight[t])]++;
    }
}

void trill_rl_hist_response(trill_rl_histograms *h, int len, int max_new_tokens) {
    int b = max_new_tokens > 0 ? (int)((int64_t)len * TRILL_RL_HIST_LEN_BINS / max_new_tokens) : 0;
    h->response_len[b < 0 ? 0 : b >= TRILL_RL_HIST_LEN_BINS ? TRILL_RL_HIST_LEN_BINS - 1 : b]++;
}

#define NO_EXPERT 0xFFFF

/* Whether two rows of k ids hold the same multiset (k is small: a top-k). */
static bool same_experts(const uint16_t *a, const uint16_t *b, int k) {
    for (int j = 0; j < k; j++) {
        int in_a = 0, in_b = 0;
        for (int m = 0; m < k; m++) {
            in_a += a[m] == a[j];
            in_b += b[m] == a[j];
        }
        if (in_a != in_b) return false;
    }
    return true;
}

/* A (token, layer) row is compared when both sides captured it. */
static bool row_valid(const uint16_t *gen, const uint16_t *train, size_t row) {
    return gen[row] != NO_EXPERT && train[row] != NO_EXPERT;
}

void trill_rl_routing_flips(const uint16_t *gen, const uint16_t *train, size_t n_tokens, int n_layers, int k,
                      double *token_flip_frac, double *layer_flip) {
    const size_t row_stride = (size_t)n_layers * (size_t)k;
    for (int l = 0; l < n_layers; l++) {
        long rows = 0, flips = 0;
        for (size_t t = 0; t < n_tokens; t++) {
            const size_t row = t * row_stride + (size_t)l * (size_t)k;
            if (!row_valid(gen, train, row)) continue;
            rows++;
            flips += !same_experts(gen + row, train + row, k);
        }
        layer_flip[l] = rows ? (double)flips / (double)rows : 0;
    }
    long tokens = 0, token_flips = 0;
    for (size_t t = 0; t < n_tokens; t++) {
        bool any_row = false, flipped = false;
        for (int l = 0; l < n_layers; l++) {
            const size_t row = t * row_stride + (size_t)l * (size_t)k;
            if (!row_valid(gen, train, row)) continue;
            any_row = true;
            flipped = flipped || !same_experts(gen + row, train + row, k);
        }
        tokens += any_row;
        token_flips += flipped;
    }
    *token_flip_frac = tokens ? (double)token_flips / (double)tokens : 0;
}
