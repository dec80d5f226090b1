/* RL checkpoints: RUN/checkpoints/step-NNNNNNNN/ holding the adapter (PEFT layout), the optimizer
 * state, state.json (step, data position, policy version, seed) and the resolved config.
 * Written into a temporary folder, every file fsync'ed, then renamed into place and the parent
 * fsync'ed: a checkpoint folder either exists whole or not at all. */
#ifndef TRILL_RL_CHECKPOINT_H
#define TRILL_RL_CHECKPOINT_H

#include <stdint.h>

#include "trill/lora.h"
#include "trill/optim.h"
#include "trill/rl.h"

typedef struct rl_state {
    int step;            /* RL steps completed */
    int64_t data_pos;    /* prompts consumed from the training stream */
    uint32_t version;    /* policy version the generator serves */
    uint64_t seed;
} rl_state;

/* Writes the checkpoint of st->step and keeps only the newest `keep` (0: all). */
trill_status rl_checkpoint_save(const char *run_dir, const trill_rl_config *c, const rl_state *st, const trill_lora *lora,
                                const trill_adamw *opt, int keep);
/* The newest complete checkpoint folder of run_dir (malloc'ed), or *path = NULL when none. */
trill_status rl_checkpoint_latest(const char *run_dir, char **path);
trill_status rl_checkpoint_read_state(const char *ckpt, rl_state *st);

/* rm -rf */
trill_status rl_remove_tree(const char *path);

#endif
