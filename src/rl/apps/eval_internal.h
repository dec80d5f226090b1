/* Held-out evaluation's tally, shared by single-turn evaluation (eval.c) and the evaluation of
 * episodes (exec/generator.c). */
#ifndef TRILL_RL_EVAL_INTERNAL_H
#define TRILL_RL_EVAL_INTERNAL_H

#include "rl/data/rollout.h"
#include "trill/dataset.h"
#include "trill/eval.h"

/* pass@1, pass@k and the mean length of b: n prompts of d (b's groups, o->k samples each). A
 * sample is correct when o->verifier scores its completion (an episode's: its last turn) >= 0.5;
 * without a verifier, an episode whose return is positive. */
void trill_rl_eval_tally(const rl_batch *b, const trill_dataset *d, const trill_eval_options *o, int n, double seconds, trill_eval_result *out);

#endif
