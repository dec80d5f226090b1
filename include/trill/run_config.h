/* A run's configuration, of `trill train` (RL) and of `trill sft`: one struct of every key (SFT
 * reads model, run_dir, seed, resume, data.*, trainer.* and sft.*).
 *
 * A run is described by a YAML file (trill_run_config_load) plus dotted overrides
 * ("algo.loss=gspo"); every key, its type, default and allowed values are in one table
 * (src/rl/config/config.c), which also writes the config reference (docs/config.md) and the resolved
 * config saved in the run folder. */
#ifndef TRILL_RUN_CONFIG_H
#define TRILL_RUN_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "trill/dtype.h"
#include "trill/dist.h"
#include "trill/error.h"
#include "trill/infer.h"
#include "trill/lora.h"
#include "trill/loss.h"
#include "trill/optim.h"

typedef trill_loss trill_rl_loss; /* algo.loss: a loss of the table (trill/loss.h) marked TRILL_LOSS_IN_TRAIN */
typedef enum trill_rl_agg { TRILL_AGG_TOKEN_MEAN, TRILL_AGG_SEQ_MEAN_TOKEN_SUM, TRILL_AGG_SEQ_MEAN_TOKEN_MEAN } trill_rl_agg;
typedef enum trill_kl_estimator { TRILL_KL_K1, TRILL_KL_K2, TRILL_KL_K3 } trill_kl_estimator;
typedef enum trill_kl_mode { TRILL_KL_LOSS, TRILL_KL_REWARD } trill_kl_mode;
typedef enum trill_mis_level { TRILL_MIS_TOKEN, TRILL_MIS_SEQUENCE, TRILL_MIS_GEOMETRIC } trill_mis_level;
/* "sync" names two things, kept apart: the weight sync after an update (the keys sync.*, the
 * metrics sync_bytes and sync_ms, the names *weight_sync*) and the schedule (the key `mode`: sync
 * or async, TRILL_MODE_*). */
typedef enum trill_weight_sync_mode { TRILL_WEIGHT_SYNC_ADAPTER, TRILL_WEIGHT_SYNC_MERGE } trill_weight_sync_mode;
typedef enum trill_rl_mode { TRILL_MODE_SYNC, TRILL_MODE_ASYNC } trill_rl_mode;
typedef enum trill_stale_policy { TRILL_STALE_WAIT, TRILL_STALE_DROP, TRILL_STALE_REGENERATE } trill_stale_policy;
/* Where async mode scores: a thread of its own, or the trainer's thread as it takes each batch. */
typedef enum trill_reward_place { TRILL_REWARD_THREAD, TRILL_REWARD_TRAINER } trill_reward_place;
typedef enum trill_env_render { TRILL_ENV_RENDER_AUTO, TRILL_ENV_RENDER_PLAIN, TRILL_ENV_RENDER_CHAT } trill_env_render;
typedef enum trill_sft_mode { TRILL_SFT_LORA, TRILL_SFT_FULL } trill_sft_mode;
typedef enum trill_verifier { TRILL_VERIFIER_NONE, TRILL_VERIFIER_EXACT, TRILL_VERIFIER_NUMERIC, TRILL_VERIFIER_DEMO } trill_verifier;

#define TRILL_RL_MAX_STOPS 8

/* Strings are owned by the config (trill_run_config_free). */
typedef struct trill_run_config {
    char *model;          /* model folder ("" : the embedded demo's model) */
    char *run_dir;        /* run folder: resolved config, metrics.jsonl, checkpoints */
    uint64_t seed;
    int steps;            /* RL steps (one rollout batch each) */
    char *resume;         /* "" (start fresh; refused when run_dir has checkpoints), "auto" (latest checkpoint
                             of run_dir if any) or a checkpoint folder */
    trill_rl_mode mode;   /* sync: generate, score, train in turn; async: concurrent executors */

    struct {
        int max_staleness;         /* policy versions between a token's weights and the weights trained on it */
        int queue;                 /* rollout batches waiting for the trainer (the generator pauses when full) */
        trill_stale_policy on_stale; /* wait: the generator never starts a batch that would be too stale;
                                        drop / regenerate: it runs ahead and the trainer drops or regenerates it */
        trill_reward_place reward; /* the reward executor: its own thread, or the trainer's */
    } async;

    struct {
        int generator_threads, trainer_threads; /* async: cores per executor, disjoint */
        int reward_threads;        /* 0: the reward executor is not pinned (it waits on verifiers' I/O) */
        bool pin;                  /* pin each executor's threads to its own cores */
    } resources;

    struct {
        char *train, *eval;        /* JSONL files ("" for eval: no held-out set) */
        char *prompt_field, *answer_field; /* default "prompt", "answer" */
        char *completion_field;    /* SFT: the target completion (default "completion") */
        char *template_;           /* "{prompt}" style with {field} placeholders, or "chat" (the model's chat template) */
        bool shuffle;              /* reshuffle every epoch, keyed by seed and epoch */
        int eval_size;             /* held-out prompts evaluated (0: all) */
        int max_prompt_tokens;     /* longer prompts are refused with the line number */
        bool allow_missing_answer; /* lines without the answer field (scored by a reward process or model only) */
    } data;

    struct {
        trill_gen_format dtype;    /* generator weight format */
        int prompts_per_step;      /* prompts per rollout batch */
        int n;                     /* samples per prompt (the GRPO group) */
        int max_new_tokens;
        double temperature, top_p, min_p;
        int top_k;
        int n_stop;
        char *stop[TRILL_RL_MAX_STOPS]; /* stop strings (eos always stops) */
        int kv_cache_mb, max_batch_tokens;
        /* expert-parallel load balancing of the engine (trill_engine_config's eplb_*) */
        bool eplb;
        int eplb_redundant, eplb_workers, eplb_window, eplb_interval;
        /* the trainer's log-probs and routing come from an engine in dtype (teacher forcing at the
         * trainer's weights), so they equal the generator's bit for bit; gradients from the
         * trainer's backward with that routing */
        bool on_policy;
    } generator;

    struct {
        trill_verifier verifier;   /* built-in verifier on the answer field */
        double verifier_weight;
        char *external;            /* command line of an external reward process ("" : none) */
        double external_weight;
        double external_timeout_s; /* per request */
        int external_max_failures; /* consecutive crashes/timeouts/bad replies before the run stops */
        int external_workers;      /* processes scoring a batch in parallel */
        char *model;               /* reward model folder (Qwen3ForSequenceClassification layout; "" : none) */
        double model_weight;
    } reward;

    struct {                       /* multi-turn episodes (src/rl/env): each sample talks to an environment */
        char *kind;                /* "" : none (single-turn rollouts); a built-in environment ("guess"); "process" */
        char *command;             /* kind process: the command line of the environment process */
        double timeout_s;          /* kind process: seconds per request */
        int max_failures;          /* kind process: consecutive failed requests before the run stops */
        bool mark_failures;        /* kind process: a failed step ends its episode (stop reason env_error) instead of the run */
        int max_turns;             /* model turns of an episode */
        int max_tokens;            /* tokens of a trajectory, prompt included (0: the model's max_position_embeddings) */
        double reward_weight;      /* of the episode's return (the sum of its turns' rewards) in the reward */
        trill_env_render render;   /* observations: plain (their contents) or chat (the model's chat template); auto: chat when it has one */
    } env;

    struct {
        trill_rl_loss loss;
        bool std_norm;             /* divide advantages by the group's std (false: Dr. GRPO) */
        double clip_low, clip_high; /* PPO/GSPO/CISPO ratio band [1 - low, 1 + high] */
        trill_rl_agg aggregation;
        double kl_coef;            /* 0: no KL to the reference */
        trill_kl_estimator kl_estimator;
        trill_kl_mode kl_mode;
        bool dynamic_sampling;     /* drop groups whose rewards are all equal */
        int minibatches;           /* optimizer steps per rollout batch */
        double aipo_rho;           /* AIPO: the importance weight min(pi_theta / mu, rho) */
    } algo;

    struct {
        double tis;                /* truncate the token ratio pi_train/mu at this (0: off) */
        bool mis;                  /* mask tokens (or sequences) whose ratio is outside [mis_low, mis_high] */
        double mis_low, mis_high;
        trill_mis_level mis_level;
    } correction;

    bool router_replay;            /* R3: the trainer replays the generator's logical experts */

    struct {
        double lr, min_lr, weight_decay, grad_clip;
        trill_lr_schedule schedule;
        int warmup_steps;
        int micro_batch_tokens;    /* token budget of one forward/backward */
        bool recompute;
        trill_precision precision; /* of the matrix products (trill_model_set_precision) */
        bool skip_nonfinite;       /* a minibatch with a non-finite loss or gradient is skipped (else: an error) */
        trill_lora_config lora;
    } trainer;

    struct { trill_weight_sync_mode mode; } sync; /* the weight sync: what the generator is sent after an update */

    struct {                       /* placement on MPI ranks: dp * ep * tp + replicas + scorer = the world's ranks */
        struct { int dp, ep, tp; } trainer; /* ranks [0, dp ep tp); rank 0 is the controller too */
        struct { int replicas, ep; } generator; /* the next replicas x ep ranks (0 replicas: each trainer rank generates) */
        int scorer;                         /* 1: the last rank scores */
    } parallel;

    struct {
        int every;                 /* steps between checkpoints (0: only at the end) */
        int keep;                  /* newest checkpoints kept (0: all) */
    } checkpoint;

    struct {
        int every;                 /* steps between held-out evaluations (0: before and after only) */
        int k;                     /* samples per held-out prompt for pass@k (pass@1 is their mean) */
        double temperature;
    } eval;

    struct {                       /* supervised fine-tuning (`trill sft`) */
        trill_sft_mode mode;       /* adapters (LoRA) or every weight */
        int epochs, max_steps;     /* max_steps 0: as many as the epochs give */
        int grad_accum;            /* micro-batches per optimizer step */
        int eval_every;            /* steps between held-out losses (0: only at the end) */
        int max_seq_len;           /* the longest example (with max_position_embeddings) */
        bool truncate;             /* a longer example loses the end of its completion (false: it is refused) */
        int save_every;            /* steps between checkpoints in run_dir (0: only at the end) */
        int stop_after;            /* end this run after that many steps (0: run to the end); the schedule spans all */
    } sft;
    struct {
        bool save;                 /* write each step's rollout batch, as the trainer receives it, to
                                      RUN/rollouts/step-NNNNNNNN.bin (trill_rl_batch_pack bytes) */
        char *replay;              /* "" or a folder of such files: each step trains on its file instead of
                                      generating and scoring (sync mode) */
    } rollouts;
} trill_run_config;

/* The defaults (the embedded demo's settings where a default makes sense). Overwrites *c without
 * freeing it. TRILL_ERR_NOMEM when its strings cannot be allocated (*c is then empty: freeing it
 * is safe). */
trill_status trill_run_config_defaults(trill_run_config *c);
/* Frees the strings; safe to call twice. */
void trill_run_config_free(trill_run_config *c);
/* *dst = a copy of src owning its own strings (free both). */
trill_status trill_run_config_copy(trill_run_config *dst, const trill_run_config *src);

/* Reads a YAML file over c (normally the defaults). Unknown keys, duplicates and bad values are
 * refused with the file, line, the key's dotted path and the expected type or allowed values;
 * c then holds the keys read before the refused one (still valid to free). */
trill_status trill_run_config_load(trill_run_config *c, const char *path);
/* One dotted override "section.key=value": the value in YAML scalar/flow syntax ("[0.5, 5]",
 * "[\"\\n\", \"###\"]"), except that a string key takes the text as written unless it starts with
 * a quote (paths and command lines need no quoting). A refused value leaves c unchanged. */
trill_status trill_run_config_set(trill_run_config *c, const char *assignment);
/* Every key's range again (for configs changed in code) and the cross-field checks (generator.n
 * >= 2, mis_low < mis_high, min_lr <= lr, minibatches <= prompts_per_step, some reward). */
trill_status trill_run_config_validate(const trill_run_config *c);
/* The parallel section against the world: the trainer's dp * ep * tp ranks, the generator
 * replicas and the scorer must add up to its rank count (the message shows the arithmetic). */
trill_status trill_rl_parallel_check(const trill_run_config *c, int world_size);
/* The resolved config as YAML (every key, nested sections), which trill_run_config_load reads back
 * to the same config (with correction.mis off, its unused bounds are not written). */
trill_status trill_run_config_write(const trill_run_config *c, FILE *f);
/* A resumed run's config against the one saved in its checkpoint (`where` names it): the keys
 * that cannot change (seed, the LoRA shape) must be equal; the error names the key and both
 * values. */
trill_status trill_run_config_check_resume(const trill_run_config *saved, const trill_run_config *now, const char *where);
/* The config reference in Markdown (docs/config.md is exactly this): every key with type,
 * default, allowed values and meaning. Fails only when out of memory. */
trill_status trill_run_config_reference(FILE *f);

#endif
