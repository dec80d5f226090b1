/* The scorer executor: a rollout batch's rewards. It owns the reward sources a run configures —
 * the built-in verifier, the pool of external reward processes (scored in parallel, one thread per
 * process while a batch is scored) and the reward model — and reads only the batch and the
 * dataset's prompts and answers. Used by one thread at a time: the controller's in sync mode, the
 * reward executor's in async mode. */
#ifndef TRILL_RL_SCORER_H
#define TRILL_RL_SCORER_H

#include <jansson.h>

#include "rl/data/rollout.h"
#include "trill/dataset.h"
#include "trill/run_config.h"

typedef struct rl_scorer rl_scorer;

/* The reward section of c: starts reward.external_workers processes of reward.external and loads
 * reward.model, as configured. `data` (the prompts the batches come from) must outlive it. */
trill_status trill_rl_scorer_create(const trill_run_config *c, const trill_dataset *data, rl_scorer **out);
void trill_rl_scorer_free(rl_scorer *s);

/* b->correct and b->reward of every sequence: the weighted verifier, external process and reward
 * model scores, in that order. The external process's own metrics are summed over the batch into
 * ext_metrics (name -> sum), in the order they first appear. A reward that is not finite stops
 * the step with the source and weight that made it so. */
trill_status trill_rl_scorer_score(rl_scorer *s, rl_batch *b, json_t *ext_metrics);

#endif
