/* RL checkpoints: RUN/checkpoints/step-NNNNNNNN/ holding the adapter (PEFT layout), the optimizer
 * state, state.json (step, data position, policy version, seed), the resolved config and
 * manifest.json (written last: each file's size and checksum, the base model's identity).
 * Written into a temporary folder, every file fsync'ed, then renamed into place and the parent
 * fsync'ed: a checkpoint folder either exists whole or not at all. */
#ifndef TRILL_RL_CHECKPOINT_H
#define TRILL_RL_CHECKPOINT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "model/lora_internal.h"
#include "trill/lora.h"
#include "trill/optim.h"
#include "trill/run_config.h"

typedef struct rl_state {
    int step;            /* RL steps completed */
    int64_t data_pos;    /* prompts consumed from the training stream */
    uint32_t version;    /* policy version the generator serves */
    uint64_t seed;
} rl_state;

/* The base model a run trains: XXH64 of its config.json, and of every *.safetensors file
 * (name, size and content, in name order: every byte is read once, ~30 ms for 170 MB). */
typedef struct rl_identity {
    uint64_t config_hash, weights_hash;
    size_t weights_bytes;
} rl_identity;
trill_status trill_rl_model_identity(const char *model_dir, rl_identity *id);

/* Writes RUN/checkpoints/step-NNNNNNNN for `step`: write_parts(ctx, dir) puts the weights and the
 * optimizer into a temporary folder, to which config.yaml (c), state.json (state) and
 * manifest.json are added; then it is renamed into place, and only the newest `keep` (0: all)
 * are kept. */
trill_status trill_rl_checkpoint_write(const char *run_dir, int step, const trill_run_config *c, const json_t *state,
                                       trill_status (*write_parts)(void *ctx, const char *dir), void *ctx, const rl_identity *base, int keep);
/* An RL step's checkpoint (adapter/, optimizer.*): writes the checkpoint of st->step, with manifest.json last (every file's size and XXH64, and
 * the base model's identity), and keeps only the newest `keep` (0: all). */
trill_status trill_rl_checkpoint_save(const char *run_dir, const trill_run_config *c, const rl_state *st, const trill_lora *lora,
                                const trill_adamw *opt, const rl_identity *base, int keep);
/* DIR/manifest.json: the size and XXH64 of every file under DIR (written last: a folder with it is
 * complete) and the base model's identity. */
trill_status trill_rl_manifest_write(const char *dir, const rl_identity *base);
/* Every file of the manifest present with its size and checksum; else an error naming the file. */
trill_status trill_rl_checkpoint_verify(const char *ckpt);
/* The checkpoint was made for this base model; else an error with both identities. */
trill_status trill_rl_checkpoint_check_base(const char *ckpt, const rl_identity *now, const char *model_dir);
/* The newest checkpoint of run_dir that verifies (malloc'ed), or *path = NULL when none; each
 * newer one that does not is reported to skipped (the reason is the thread's error message). */
trill_status trill_rl_checkpoint_latest(const char *run_dir, char **path, void (*skipped)(const char *ckpt, void *ctx), void *ctx);
/* The checkpoint a run continues from (*ckpt NULL: a fresh run; malloc'ed), by `resume`: "" a
 * fresh run, refused when run_dir already has checkpoints; "auto" the newest complete one (each
 * newer one that is not is skipped with a warning naming `who`; refused when none is complete);
 * else that folder, verified. With `clean`, first removes what a killed save left. */
trill_status trill_rl_checkpoint_choose(const char *run_dir, const char *resume, const char *who, bool clean, char **ckpt);
/* Removes the temporary folders (.tmp-step-*) a killed run left behind. */
trill_status trill_rl_checkpoint_clean(const char *run_dir);
trill_status trill_rl_checkpoint_read_state(const char *ckpt, rl_state *st);

#endif
