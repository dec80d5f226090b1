/* The loss table (trill/loss.h). Each function computes exactly what trill train's RL step and
 * trill serve's forward_backward computed before they shared it: the same operations in the same
 * order, in double. */
#include "trill/loss.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static double ratio_of(double lp, double q) { return exp(fmin(fmax(lp - q, -20.0), 20.0)); }
static double clamp(double x, double lo, double hi) { return fmin(fmax(x, lo), hi); }

/* min(r a, clip(r) a): no gradient where the clipped branch is the smaller */
static bool ppo(const trill_loss_params *p, double lp, double q, double a, double w, double *loss, double *grad, double *ratio) {
    (void)w;
    const double r = ratio_of(lp, q), unclipped = r * a, clipped = clamp(r, p->lo, p->hi) * a;
    *ratio = r;
    if (unclipped > clipped) {
        *loss = -clipped;
        *grad = 0;
        return true;
    }
    *loss = -unclipped;
    *grad = -unclipped;
    return false;
}

/* the clipped ratio as a detached weight on every token's log-probability */
static bool cispo(const trill_loss_params *p, double lp, double q, double a, double w, double *loss, double *grad, double *ratio) {
    (void)w;
    const double r = ratio_of(lp, q), c = clamp(r, p->lo, p->hi);
    *ratio = r;
    *loss = -c * a * lp;
    *grad = -c * a;
    return c != r;
}

/* the ratio times the advantage, unclipped */
static bool ratio_times_advantage(const trill_loss_params *p, double lp, double q, double a, double w, double *loss, double *grad,
                                  double *ratio) {
    (void)p, (void)w;
    const double r = ratio_of(lp, q);
    *ratio = r;
    *loss = -r * a;
    *grad = -r * a;
    return false;
}

/* min(pi / mu, rho) as a detached weight */
static bool aipo(const trill_loss_params *p, double lp, double q, double a, double w, double *loss, double *grad, double *ratio) {
    (void)w;
    const double r = ratio_of(lp, q), c = fmin(r, p->rho);
    *ratio = r;
    *loss = -c * a * lp;
    *grad = -c * a;
    return r > p->rho;
}

static bool cross_entropy(const trill_loss_params *p, double lp, double q, double a, double w, double *loss, double *grad,
                          double *ratio) {
    (void)p, (void)q, (void)a;
    *ratio = 1;
    *grad = -w;
    *loss = -w * lp;
    return false;
}

/* lp a - beta/2 (lp - q)^2 */
static bool dro(const trill_loss_params *p, double lp, double q, double a, double w, double *loss, double *grad, double *ratio) {
    (void)w;
    *ratio = 1;
    *grad = -(a - p->beta * (lp - q));
    *loss = -(lp * a - 0.5 * p->beta * (lp - q) * (lp - q));
    return false;
}

enum { TRAIN = TRILL_LOSS_IN_TRAIN, SERVE = TRILL_LOSS_IN_SERVE, LOGPROBS = TRILL_LOSS_NEEDS_LOGPROBS, ADV = TRILL_LOSS_NEEDS_ADVANTAGES };

static const trill_loss_info LOSSES[TRILL_N_LOSSES] = {
    [TRILL_LOSS_PPO] = { "ppo", TRAIN | SERVE, false, TRILL_RATIO_OLD, LOGPROBS | ADV, ppo, "clipped token ratio" },
    [TRILL_LOSS_GSPO] = { "gspo", TRAIN, true, TRILL_RATIO_OLD, LOGPROBS | ADV, NULL, "clipped sequence ratio (the geometric mean of its tokens')" },
    [TRILL_LOSS_CISPO] = { "cispo", TRAIN | SERVE, false, TRILL_RATIO_OLD, LOGPROBS | ADV, cispo,
                           "clipped importance weight with a gradient on every token" },
    [TRILL_LOSS_REINFORCE] = { "reinforce", TRAIN, false, TRILL_RATIO_OLD, LOGPROBS | ADV, ratio_times_advantage, "no clip" },
    [TRILL_LOSS_AIPO] = { "aipo", TRAIN, false, TRILL_RATIO_SAMPLER, LOGPROBS | ADV, aipo,
                          "the weight min(pi_theta / mu, rho) against the generator's probabilities, for async runs" },
    [TRILL_LOSS_IMPORTANCE_SAMPLING] = { "importance_sampling", SERVE, false, TRILL_RATIO_SAMPLER, LOGPROBS | ADV, ratio_times_advantage,
                                         "the ratio to the sampler times the advantage, unclipped" },
    [TRILL_LOSS_CROSS_ENTROPY] = { "cross_entropy", SERVE, false, TRILL_RATIO_NONE, 0, cross_entropy, "weighted negative log-likelihood" },
    [TRILL_LOSS_DRO] = { "dro", SERVE, false, TRILL_RATIO_NONE, LOGPROBS | ADV, dro,
                         "log-likelihood times the advantage, less beta/2 times the squared log-ratio to the sampler" },
};

const trill_loss_info *trill_loss_get(trill_loss l) { return (unsigned)l < TRILL_N_LOSSES ? &LOSSES[l] : NULL; }

int trill_loss_parse(const char *name, unsigned where) {
    for (int i = 0; i < TRILL_N_LOSSES; i++)
        if ((LOSSES[i].where & where) && !strcmp(name, LOSSES[i].name)) return i;
    return -1;
}

const char *trill_loss_names(unsigned where, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < TRILL_N_LOSSES; i++)
        if (LOSSES[i].where & where)
            len += (size_t)snprintf(buf + len, len < size ? size - len : 0, "%s%s", len ? ", " : "", LOSSES[i].name);
    return buf;
}
