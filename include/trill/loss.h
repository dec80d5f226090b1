/* The losses trill trains with: one table for `trill train` (algo.loss), `trill serve` (loss_fn)
 * and the trainer. A loss is one entry: its name, where it may be chosen, its level, what its ratio
 * is taken against, the inputs it needs, its per-token function and its documentation. A new
 * loss is a value of trill_loss and its entry (src/rl/algo/loss.c); the config's checks, error
 * messages, docs/config.md and the service's loss_fn read the table.
 *
 * The per-token function gives the loss of one token and its derivative with respect to the
 * token's log-probability lp under the policy being trained (before the batch's aggregation
 * and importance weights): q is the log-probability the ratio r = exp(lp - q) is taken against
 * (clamped to [-20, 20] before exp), a the token's advantage, w its weight (cross-entropy's);
 * *ratio the ratio it used, and the result whether a clip or truncation changed the token. */
#ifndef TRILL_LOSS_H
#define TRILL_LOSS_H

#include <stdbool.h>
#include <stddef.h>

typedef enum trill_loss {
    TRILL_LOSS_PPO,
    TRILL_LOSS_GSPO,
    TRILL_LOSS_CISPO,
    TRILL_LOSS_REINFORCE,
    TRILL_LOSS_AIPO,
    TRILL_LOSS_IMPORTANCE_SAMPLING,
    TRILL_LOSS_CROSS_ENTROPY,
    TRILL_LOSS_DRO,
    TRILL_N_LOSSES
} trill_loss;

/* Where a loss may be chosen. */
enum { TRILL_LOSS_IN_TRAIN = 1, TRILL_LOSS_IN_SERVE = 2 };
/* What the ratio is taken against. */
typedef enum trill_loss_ratio {
    TRILL_RATIO_NONE,     /* no ratio (cross-entropy, DRO's penalty uses q directly) */
    TRILL_RATIO_OLD,      /* the trained policy before this update (trill train's old_logp) */
    TRILL_RATIO_SAMPLER,  /* the generator that sampled the tokens (mu; the service's logprobs) */
} trill_loss_ratio;
/* The service's per-datum inputs a loss needs beside target_tokens. */
enum { TRILL_LOSS_NEEDS_LOGPROBS = 1, TRILL_LOSS_NEEDS_ADVANTAGES = 2 };

typedef struct trill_loss_params {
    double lo, hi;  /* the ratio band [lo, hi] of the clipped losses */
    double rho;     /* AIPO's truncation */
    double beta;    /* DRO's penalty */
} trill_loss_params;

typedef bool (*trill_token_loss_fn)(const trill_loss_params *p, double lp, double q, double a, double w, double *loss, double *grad,
                                    double *ratio);

typedef struct trill_loss_info {
    const char *name;
    unsigned where;             /* TRILL_LOSS_IN_TRAIN | TRILL_LOSS_IN_SERVE */
    bool sequence;              /* one ratio per sequence (GSPO; the RL step computes it) */
    trill_loss_ratio ratio_to;
    unsigned needs;             /* TRILL_LOSS_NEEDS_* */
    trill_token_loss_fn token;  /* NULL for a sequence-level loss */
    const char *doc;            /* one phrase, for the references */
} trill_loss_info;

/* The entry of l; NULL when l is not a loss. */
const trill_loss_info *trill_loss_get(trill_loss l);
/* The loss named `name` that may be chosen in `where`; -1 when there is none. */
int trill_loss_parse(const char *name, unsigned where);
/* "a, b or c": the names that may be chosen in `where`, into buf. */
const char *trill_loss_names(unsigned where, char *buf, size_t size);

#endif
