/* The trainer executor: the policy (the base model frozen in its checkpoint's dtype, LoRA
 * adapters attached), the optimizer, micro-batching under a token budget, the loss, and the
 * weights a sync ships. It reads a rollout batch and changes only its own state (and the batch's
 * advantages, kept flags and KL-penalised rewards). Used by one thread: the controller's. */
#ifndef TRILL_RL_TRAINER_H
#define TRILL_RL_TRAINER_H

#include "rollout.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/optim.h"
#include "trill/rl.h"

typedef struct rl_trainer rl_trainer;

/* What one step did, summed over its minibatches (the metrics take means). */
typedef struct rl_train_stats {
    double loss, pg_loss, kl_loss, clip_tokens, ratio_sum, ratio_n, grad_norm, lr;
    long tokens;           /* tokens forwarded (prompt + response) */
    int optimizer_steps;
    int skipped;           /* minibatches whose loss or gradient was not finite (trainer.skip_nonfinite) */
    int kept;              /* sequences trained (dynamic sampling drops flat groups) */
    int flat_groups;       /* groups whose task rewards were all equal */
} rl_train_stats;

/* The policy from model_dir; the adapters and optimizer state from checkpoint folder `ckpt`, or
 * (NULL) new adapters from c->seed. Merge sync also keeps an fp32 copy of the base to fold the
 * adapters into. */
trill_status trill_rl_trainer_create(const trill_rl_config *c, const char *model_dir, const char *ckpt, rl_trainer **out);
void trill_rl_trainer_free(rl_trainer *t);

const trill_model *trill_rl_trainer_policy(const rl_trainer *t);
trill_lora *trill_rl_trainer_lora(rl_trainer *t);
trill_adamw *trill_rl_trainer_optimizer(rl_trainer *t);

/* Step `step` (1-based: messages, the learning-rate schedule) on batch b: dynamic sampling, KL
 * as a reward when configured, group advantages, then algo.minibatches optimizer steps in
 * micro-batches; an adapter value that is not finite afterwards is an error. Fills the
 * mismatch, correction, reference-KL and routing-flip figures of *m. */
trill_status trill_rl_trainer_step(rl_trainer *t, rl_batch *b, int step, rl_train_stats *ts, trill_rl_metrics *m);

/* The weights a sync ships after an update: the adapters' vector, or in merge mode the base
 * with the adapters folded in (fp32; *merged is that model). *n floats at *data. */
trill_status trill_rl_trainer_export(rl_trainer *t, const float **data, size_t *n, const trill_model **merged);

#endif
