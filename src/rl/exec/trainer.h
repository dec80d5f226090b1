/* The trainer, RL's trainer executor and SFT's: the policy (the base model frozen in its checkpoint's dtype, LoRA
 * adapters attached), the optimizer, micro-batching under a token budget, the loss, and the
 * weights a sync ships. It reads a rollout batch and changes only its own state (and the batch's
 * advantages, kept flags and KL-penalised rewards). Used by one thread: the controller's. */
#ifndef TRILL_TRAINER_H
#define TRILL_TRAINER_H

#include "rl/data/rollout.h"
#include "trill/dist.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/optim.h"
#include "trill/run_config.h"
#include "trill/rl_metrics.h"

typedef struct trill_trainer trill_trainer;

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
 * adapters into.
 *
 * world (borrowed; NULL: one process) is the job's ranks, laid out by c->parallel.trainer: the
 * data ranks (dp x ep) share each step's micro-batches (each a contiguous share; each
 * micro-batch's gradient a leaf of one fixed tree, so every rank count computes the same bits),
 * and with ep > 1 each group of ep consecutive ranks holds a shard of the routed experts (their
 * adapters and optimizer state with them) and runs its micro-batches in lockstep rounds,
 * dispatching tokens to the experts' holders (trill_model_set_expert_comm). Collective over the
 * world, as every call below but the accessors is. */
trill_status trill_trainer_create(const trill_run_config *c, const char *model_dir, const char *ckpt, trill_comm *world, trill_trainer **out);
void trill_trainer_free(trill_trainer *t);

const trill_model *trill_trainer_policy(const trill_trainer *t);
/* "bf16 matmuls" or "fp32 matmuls", with why when trainer.precision auto chose: for the run's first log line. */
const char *trill_trainer_precision_note(const trill_trainer *t, char *buf, size_t size);
/* Whether the policy is an expert-parallel shard (it then holds some experts: the generator
 * needs the whole model, loaded on its own). */
bool trill_trainer_sharded(const trill_trainer *t);
/* The adapters of every expert (a sync's, a checkpoint's): the trainer's own, or under expert
 * parallelism the shards' gathered after the last optimizer step. */
trill_lora *trill_trainer_lora(trill_trainer *t);
/* The optimizer state laid out as those adapters: under expert parallelism as of the last
 * trill_trainer_gather(t, true). */
trill_adamw *trill_trainer_optimizer(trill_trainer *t);
/* The collectives this rank's trainer called since the last reset, per kind: the data ranks'
 * (the world's) and the expert-parallel groups' together (the step's comm figures). */
trill_comm_stats trill_trainer_comm_stats(const trill_trainer *t);
void trill_trainer_comm_reset(trill_trainer *t);
/* Under expert parallelism, gathers the shards' adapters (and with `optimizer` their optimizer
 * state) into the whole ones above: collective over each group; nothing otherwise. */
trill_status trill_trainer_gather(trill_trainer *t, bool optimizer);

/* Step `step` (1-based: messages, the learning-rate schedule) on batch b: dynamic sampling, KL
 * as a reward when configured, group advantages, then algo.minibatches optimizer steps in
 * micro-batches; an adapter value that is not finite afterwards is an error. Fills the
 * mismatch, correction, reference-KL and routing-flip figures of *m. */
trill_status trill_trainer_step(trill_trainer *t, rl_batch *b, int step, rl_train_stats *ts, trill_rl_metrics *m);

/* ---- supervised fine-tuning (the same trainer) ---- */

/* sft.mode lora: the base from model_dir in its checkpoint's dtype, adapters new from c->seed or
 * resume_dir's; full: every weight in fp32 from model_dir, or resume_dir's. The optimizer new, or
 * resume_dir/optimizer (its moments; the settings are c's). */
trill_status trill_trainer_create_sft(const trill_run_config *c, const char *model_dir, const char *resume_dir, trill_comm *world,
                                         trill_trainer **out);

typedef struct trill_nll_stats {
    double loss;              /* mean negative log-likelihood per loss token */
    double grad_norm, lr;
    long tokens;              /* tokens forwarded */
    bool applied;             /* false: the loss or gradient was not finite and trainer.skip_nonfinite skipped it */
} trill_nll_stats;

/* One optimizer step (`step`, 1-based, of `total`) on every sequence of b: the NLL of each
 * sequence's tokens after its prompt (b->prompt_len), in micro-batches of
 * trainer.micro_batch_tokens, its gradient averaged over those tokens, clipped, AdamW. */
trill_status trill_trainer_nll_step(trill_trainer *t, const rl_batch *b, int step, int64_t total, trill_nll_stats *out);
/* The same NLL without gradients: its sum over the loss tokens and their count. */
trill_status trill_trainer_nll(trill_trainer *t, const rl_batch *b, double *nll, long *n_loss);
/* The trained weights into dir (the PEFT adapter, or the whole fp32 model) and the optimizer
 * state (dir/optimizer*); under expert parallelism after trill_trainer_gather(t, true). */
trill_status trill_trainer_save(const trill_trainer *t, const char *dir);

/* The weights a sync ships after an update: the adapters' vector, or in merge mode the base
 * with the adapters folded in (fp32; *merged is that model). *n floats at *data. */
trill_status trill_trainer_export(trill_trainer *t, const float **data, size_t *n, const trill_model **merged);

#endif
