/* The state of one RL run and the stages of a step, shared by the synchronous loop
 * (controller.c) and the asynchronous executors (async.c). */
#ifndef TRILL_RL_RUN_H
#define TRILL_RL_RUN_H

#include <jansson.h>
#include <stdio.h>

#include "checkpoint.h"
#include "rollout.h"
#include "trill/chat.h"
#include "trill/dataset.h"
#include "rl/reward_process.h"
#include "trill/reward.h"
#include "trill/reward_model.h"
#include "trill/rl.h"

typedef struct rl_run rl_run;

struct rl_run {
    const trill_rl_config *c;
    char *model_dir, *train_path, *eval_path;
    trill_verifier verifier;
    trill_model *policy;          /* the trainer's model, base frozen in its checkpoint's dtype */
    trill_lora *lora;
    float *lora_grads;
    trill_adamw *opt;
    trill_model *merge_model;     /* merge mode: fp32 model the adapters are folded into */
    float *merge_base;            /* ... and its base weights */
    trill_engine *engine;
    trill_tokenizer *tok;
    trill_chat_template *chat;
    trill_dataset *train, *eval;
    struct rl_scorer *scorer;     /* the reward sources (scorer.h); NULL when replaying rollouts */
    trill_request proto;          /* sampling settings, stops */
    int stop_ids[TRILL_MAX_EOS];
    rl_state state;
    rl_identity base;             /* the base model's identity, recorded in every checkpoint */
    int lock_fd;                  /* run_dir/.lock, held (flock) for the run */
    int saved_step;               /* the step of the newest checkpoint written by this run */
    FILE *metrics;
    int L, K;
    /* How new weights reach the generator after a step: trill_rl_sync_direct (sync mode) or the
     * weight channel (async). *ms and *bytes describe the transfer. */
    trill_status (*publish)(rl_run *r, double *ms, size_t *bytes);
    void *async;                  /* the executors' shared state in async mode */
};

/* One rollout batch on its way through the stages. */
typedef struct rl_rollout {
    int64_t index;                /* batch index: prompts [index * prompts_per_step, ...) of the stream */
    rl_batch b;
    json_t *ext_metrics;          /* the external reward's metrics, summed over the batch */
    double gen_s, reward_s;
    long gen_tokens;
    bool redo;                    /* generated again after the trainer found it too stale */
} rl_rollout;

trill_status trill_rl_stage_generate(rl_run *r, int64_t index, rl_rollout *ro, trill_status (*between_steps)(void *), void *ctx);
trill_status trill_rl_stage_reward(rl_run *r, rl_rollout *ro);
/* Advantages, trainer passes, optimizer steps, version + 1 and r->publish; fills the batch's,
 * the trainer's, the mismatch and the sync figures of *m (and time). */
trill_status trill_rl_stage_train(rl_run *r, rl_rollout *ro, trill_rl_metrics *m, double *train_s, long *train_tokens);
void trill_rl_rollout_free(rl_rollout *ro);

/* Sync mode's weight transfer: the engine's update calls in the trainer's thread. */
trill_status trill_rl_sync_direct(rl_run *r, double *ms, size_t *bytes);

/* After a trained step: metrics line, progress line, checkpoint. */
trill_status trill_rl_finish_step(rl_run *r, const trill_rl_metrics *m, double step_wall_s);


/* trill_rl_request_stop was called (a signal handler, an embedder): end after the current step. */
bool trill_rl_stop_requested(void);

/* Async mode: runs the executors until c->steps steps are trained (async.c). */
trill_status trill_rl_async_loop(rl_run *r, double *gen_s, double *train_s, long *gen_tokens, long *train_tokens);

#endif
