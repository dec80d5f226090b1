/* Supervised fine-tuning: prompt/completion JSONL, loss on completion tokens only, packing into
 * token-budget micro-batches, gradient accumulation, AdamW with a schedule, LoRA or full
 * fine-tuning, periodic held-out loss. Used by `trill sft`. */
#ifndef TRILL_SFT_H
#define TRILL_SFT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "trill/error.h"
#include "trill/lora.h"
#include "trill/optim.h"

typedef struct trill_sft_config {
    const char *model_dir, *data_path, *eval_path, *out_dir;
    const char *prompt_field, *completion_field; /* default "prompt", "completion" */
    bool lora;                  /* else full fine-tuning */
    trill_lora_config lora_config;
    double lr, min_lr, weight_decay, clip;
    trill_lr_schedule schedule;
    int warmup_steps;
    int epochs;
    int max_steps;              /* 0: as many as the epochs give */
    int batch_tokens;           /* token budget of one micro-batch */
    int grad_accum;             /* micro-batches per optimizer step */
    int eval_every;             /* steps between held-out evaluations (0: only at the end) */
    int max_seq_len;            /* longer examples are truncated (completion side) */
    int save_every;             /* steps between checkpoints in out_dir (0: only at the end) */
    int stop_after;             /* end this run after that many steps (0: run to the end); the schedule still spans all steps */
    bool resume;                /* continue from out_dir's last checkpoint (weights, optimizer, step) */
    bool recompute;             /* activation checkpointing: keep only layer inputs, re-run layers in the backward */
    uint64_t seed;
    FILE *log;                  /* progress lines (NULL: the log sink, trill/log.h) */
} trill_sft_config;

trill_sft_config trill_sft_defaults(void);

/* Reads "key=value" for one of the fields above (lr, epochs, lora.rank, ...); `what` names
 * the source in errors. */
trill_status trill_sft_set(trill_sft_config *c, const char *key, const char *value);

/* Runs training; prints a progress line per step to stderr; writes the adapter (PEFT) or the
 * model, plus optimizer state, to out_dir. The final held-out loss (nats per completion token,
 * NAN without eval data) goes to *final_eval_loss. */
trill_status trill_sft_run(const trill_sft_config *c, double *final_eval_loss);

#endif
