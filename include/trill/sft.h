/* Supervised fine-tuning (`trill sft`), on the run configuration RL uses (trill/run_config.h): the keys
 * model, run_dir, seed, resume, data.* (data.completion_field: the target), trainer.* and sft.*.
 * Prompt/completion lines, the loss on the completion and its end-of-sequence token; sequences
 * packed into micro-batches of trainer.micro_batch_tokens, sft.grad_accum of them per optimizer
 * step; AdamW on trainer.schedule; LoRA adapters (trainer.lora) on a frozen base or every weight
 * (sft.mode). It runs on the trainer RL uses (src/rl/exec/trainer*.c) with the dataset reader and its
 * seeded order (data.shuffle: reshuffled every epoch, keyed by seed and epoch).
 * Its run folder works as trill train's: one process holds run_dir/.lock; checkpoints go to
 * run_dir/checkpoints/step-N (weights, optimizer state, state.json, config.yaml, manifest.json;
 * whole or absent after a crash) every sft.save_every steps, when a stop is requested
 * (trill_rl_request_stop: the run then ends with TRILL_ERR_INTERRUPTED) and at the end; the
 * result — the PEFT adapter (or the full model), the optimizer state and trainer_state.json — is
 * then in run_dir itself. resume: "" starts afresh (refused where checkpoints exist), "auto"
 * continues from the newest complete checkpoint, a folder from that checkpoint; a resume keeps
 * the base model, seed, sft.mode and the adapter's shape. */
#ifndef TRILL_SFT_H
#define TRILL_SFT_H

#include <stdio.h>

#include "trill/error.h"
#include "trill/dist.h"
#include "trill/run_config.h"

typedef struct trill_sft_options {
    FILE *log;          /* progress lines (NULL: the log sink, trill/log.h) */
    /* the ranks of the job (NULL: one process). parallel.trainer.dp x ep x tp must equal its
     * size; the data-parallel ranks share each step's micro-batches and reach the same weights
     * bit for bit as one process; rank 0 alone logs and writes run_dir. Borrowed. */
    trill_comm *world;
} trill_sft_options;

typedef struct trill_sft_result {
    int steps;          /* optimizer steps taken in all (those of a resumed run included) */
    double eval_loss;   /* held-out nats per completion token at the end (NAN without data.eval) */
} trill_sft_result;

/* What `trill sft` needs of the config: a model, data.train, a run folder. */
trill_status trill_sft_validate(const trill_run_config *c);

/* o may be NULL. */
trill_status trill_sft_run(const trill_run_config *c, const trill_sft_options *o, trill_sft_result *out);

#endif
