/* The numbers of RL: advantages, policy losses and their gradients, KL estimators,
 * importance-sampling corrections and training–inference mismatch metrics. Plain functions
 * on flat arrays (one entry per response token, sequences back to back); the formulas are in
 * docs/algorithms.md and the unit tests check them against hand-computed values.
 *
 * Notation per response token t of sequence i:
 *   logp[t]      log pi_theta   (the policy being trained, with gradient)
 *   old_logp[t]  log pi_old     (the trainer's recomputation before this batch's updates)
 *   behav_logp[t] log mu        (what the generator sampled from)
 *   ref_logp[t]  log pi_ref     (the same model with LoRA disabled) */
#ifndef TRILL_RL_ALGO_H
#define TRILL_RL_ALGO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trill/rl.h"

/* GRPO advantages: rewards of n_groups groups of group_size samples back to back;
 * adv = (r - mean_group) / (std_group + eps) with the unbiased std (as torch.std), or
 * r - mean_group without std_norm (Dr. GRPO). A group of one gets 0. */
void trill_rl_group_advantages(const double *rewards, int n_groups, int group_size, bool std_norm, double eps, double *adv);

/* Whether every reward of group g is equal (dynamic sampling drops such groups). */
bool trill_rl_group_is_flat(const double *rewards, int group_size);

/* KL estimators of KL(pi_theta || pi_ref) from one sample, with x = logp - ref_logp:
 *   k1 = x, k2 = x^2 / 2, k3 = exp(-x) - 1 + x.   trill_rl_kl_grad is d k / d logp.
 * As a reward penalty (kl_mode reward, applied by the controller) each sequence's reward loses
 * kl_coef * sum over its response tokens of trill_rl_kl_value(e, old_logp, ref_logp). */
double trill_rl_kl_value(trill_kl_estimator e, double logp, double ref_logp);
double trill_rl_kl_grad(trill_kl_estimator e, double logp, double ref_logp);

/* One minibatch of sequences for the policy loss. Arrays are per response token, sequences
 * back to back: sequence i owns tokens [offsets[i], offsets[i+1]). */
typedef struct rl_loss_batch {
    int n_seqs;
    const int *offsets;        /* [n_seqs + 1] */
    const float *logp;         /* [T] current policy */
    const float *old_logp;     /* [T] */
    const float *behav_logp;   /* [T] */
    const float *ref_logp;     /* [T], or NULL when the KL loss term is off */
    const double *adv;         /* [n_seqs] advantage of each sequence */
    const uint8_t *mask;       /* [T] 1 = token counts in the loss (after MIS masking), or NULL: all */
    const float *is_weight;    /* [T] TIS weight (detached), or NULL: 1 */
    double agg_tokens;         /* token-mean's denominator: when one optimizer step is computed in several
                                  calls (micro-batches), the masked-in tokens of the whole step, the same for
                                  every call; 0: count this call's mask. (The seq-mean modes divide by this
                                  call's n_seqs: such a caller scales each call by n_seqs / the step's.) */
} rl_loss_batch;

typedef struct rl_loss_stats {
    double loss;               /* the aggregated loss value */
    double pg_loss, kl_loss;   /* its policy-gradient and KL parts */
    double clip_frac;          /* fraction of masked-in tokens whose gradient the clip removed
                                  (CISPO: whose weight it truncated; GSPO: tokens of clipped sequences) */
    double ratio_mean;         /* mean pi_theta / pi_old (GSPO: of the sequence ratios) */
} rl_loss_stats;

/* The loss of cfg->algo (loss, clip band, aggregation, KL loss term when kl_mode is loss,
 * kl_coef > 0 and ref_logp is given) and its gradient d loss / d logp[t] into dlogp[T]
 * (overwritten; 0 for masked tokens). Log-ratios are clamped to [-20, 20] before exp.
 * PPO:       L_t = -min(r_t A, clip(r_t, 1-lo, 1+hi) A),  r_t = exp(logp - old_logp);
 *            gradient -r_t A where the unclipped term is the min (ties included), else 0
 * GSPO:      s_i = exp(mean over masked-in t of (logp - old_logp)); L_t = -min(s_i A, clip(s_i) A)
 *            for every token of i; d s_i / d logp[t] = s_i / n_i, so each token of an unclipped
 *            sequence gets -A s_i / n_i * sum_u c_u w_u (aggregation weight c, TIS weight w: the
 *            sequence's weight, the same for all its tokens, so it is the loss value's gradient)
 * CISPO:     L_t = -sg(clip(r_t, 1-lo, 1+hi)) A logp[t]; gradient -clip(r_t) A
 * REINFORCE: L_t = -r_t A (importance-sampled, unclipped)
 * AIPO:      L_t = -sg(min(exp(logp - behav_logp), aipo_rho)) A logp[t] (its weight is its own
 *            off-policy correction: is_weight is not applied)
 * each L_t times is_weight[t] and mask[t]; plus kl_coef * k(logp, ref_logp) per masked-in token
 * (not TIS-weighted); then aggregated: token-mean sum_t L_t / agg_tokens (or / the masked-in
 * count); seq-mean-token-sum (1/N) sum_i sum_t L_t; seq-mean-token-mean (1/N) sum_i mean_t L_t
 * (a sequence with no masked-in token adds 0 but counts in N). */
void trill_rl_policy_loss(const trill_run_config *cfg, const rl_loss_batch *b, float *dlogp, rl_loss_stats *stats);

/* Importance-sampling corrections from the trainer's and the generator's log-probs (pi_train =
 * old_logp, mu = behav_logp), per response token:
 *   tis_weight[t] = min(exp(old - behav), cfg->correction.tis) (1 everywhere when tis is 0);
 *   mask[t] = 0 where MIS (cfg->correction.mis) rejects: the token's ratio (token level), the
 *   sequence's product of ratios (sequence) or its geometric mean (geometric) outside
 *   [mis_low, mis_high]; untouched (left as given) elsewhere. The sequence statistics run over
 *   the tokens whose mask is 1 on entry. mask is required (1s, or the trajectory's loss mask). Returns the number of
 *   tokens newly masked. */
int trill_rl_corrections(const trill_run_config *cfg, int n_seqs, const int *offsets, const float *old_logp,
                   const float *behav_logp, float *tis_weight, uint8_t *mask);

/* Training–inference mismatch over all response tokens (Δ = old_logp - behav_logp,
 * rho = exp(Δ), Δ clamped to [-20, 20] in the exp): mean and max |Δ|, k1 = mean(-Δ), k3 = mean(rho - 1 - Δ) (estimates of
 * KL(mu || pi_train) from mu's samples), chi2 = mean((rho - 1)^2). */
typedef struct rl_mismatch {
    double mean_abs, max_abs, k1, k3, chi2;
    long n_tokens;
} rl_mismatch;
void trill_rl_mismatch_measure(const float *old_logp, const float *behav_logp, size_t n, rl_mismatch *out);

/* The per-token histograms of a step (trill_rl_histograms, trill/rl.h). */
/* Adds n tokens (used_weight: the loss's weight of each; mask: 0 where MIS masked, NULL: none). */
void trill_rl_hist_tokens(trill_rl_histograms *h, const float *old_logp, const float *behav_logp, const float *used_weight,
                          const uint8_t *mask, size_t n);
/* Adds one response of len tokens out of at most max_new_tokens. */
void trill_rl_hist_response(trill_rl_histograms *h, int len, int max_new_tokens);
/* The lower edges of a histogram's bins ("log_ratio", "weight" or "response_len", the last as a
 * fraction of max_new_tokens), bin 0's -inf where unbounded; *n bins; NULL for another name. */
const double *trill_rl_hist_edges(const char *which, int *n);

/* Routing agreement between the generator's captured experts and the trainer's, both
 * [n_tokens][n_layers][k] logical ids (order within a row ignored): the fraction of tokens
 * whose expert set differs in at least one layer, and per layer the fraction of tokens whose
 * set differs there (layer_flip[n_layers]). A (token, layer) row whose first id is 0xFFFF on
 * either side is skipped; a token with every row skipped is left out of the token fraction. */
void trill_rl_routing_flips(const uint16_t *gen, const uint16_t *train, size_t n_tokens, int n_layers, int k,
                      double *token_flip_frac, double *layer_flip);

#endif
