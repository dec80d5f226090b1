/* RL post-training (`trill train`): the configuration and the controller.
 *
 * A run is described by a YAML file (trill_rl_config_load) plus dotted overrides
 * ("algo.loss=gspo"); every key, its type, default and allowed values are in one table
 * (src/rl/config/config.c), which also writes the config reference (docs/config.md) and the resolved
 * config saved in the run folder. */
#ifndef TRILL_RL_H
#define TRILL_RL_H

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
typedef enum trill_sync_mode { TRILL_SYNC_ADAPTER, TRILL_SYNC_MERGE } trill_sync_mode;
typedef enum trill_rl_mode { TRILL_MODE_SYNC, TRILL_MODE_ASYNC } trill_rl_mode;
typedef enum trill_stale_policy { TRILL_STALE_WAIT, TRILL_STALE_DROP, TRILL_STALE_REGENERATE } trill_stale_policy;
/* Where async mode scores: a thread of its own, or the trainer's thread as it takes each batch. */
typedef enum trill_reward_place { TRILL_REWARD_THREAD, TRILL_REWARD_TRAINER } trill_reward_place;
typedef enum trill_sft_mode { TRILL_SFT_LORA, TRILL_SFT_FULL } trill_sft_mode;
typedef enum trill_verifier { TRILL_VERIFIER_NONE, TRILL_VERIFIER_EXACT, TRILL_VERIFIER_NUMERIC, TRILL_VERIFIER_DEMO } trill_verifier;

#define TRILL_RL_MAX_STOPS 8

/* Strings are owned by the config (trill_rl_config_free). */
typedef struct trill_rl_config {
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

    struct { trill_sync_mode mode; } sync;

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
} trill_rl_config;

/* The defaults (the embedded demo's settings where a default makes sense). Overwrites *c without
 * freeing it. TRILL_ERR_NOMEM when its strings cannot be allocated (*c is then empty: freeing it
 * is safe). */
trill_status trill_rl_config_defaults(trill_rl_config *c);
/* Frees the strings; safe to call twice. */
void trill_rl_config_free(trill_rl_config *c);
/* *dst = a copy of src owning its own strings (free both). */
trill_status trill_rl_config_copy(trill_rl_config *dst, const trill_rl_config *src);

/* Reads a YAML file over c (normally the defaults). Unknown keys, duplicates and bad values are
 * refused with the file, line, the key's dotted path and the expected type or allowed values;
 * c then holds the keys read before the refused one (still valid to free). */
trill_status trill_rl_config_load(trill_rl_config *c, const char *path);
/* One dotted override "section.key=value": the value in YAML scalar/flow syntax ("[0.5, 5]",
 * "[\"\\n\", \"###\"]"), except that a string key takes the text as written unless it starts with
 * a quote (paths and command lines need no quoting). A refused value leaves c unchanged. */
trill_status trill_rl_config_set(trill_rl_config *c, const char *assignment);
/* Every key's range again (for configs changed in code) and the cross-field checks (generator.n
 * >= 2, mis_low < mis_high, min_lr <= lr, minibatches <= prompts_per_step, some reward). */
trill_status trill_rl_config_validate(const trill_rl_config *c);
/* The parallel section against the world: the trainer's dp * ep * tp ranks, the generator
 * replicas and the scorer must add up to its rank count (the message shows the arithmetic). */
trill_status trill_rl_parallel_check(const trill_rl_config *c, int world_size);
/* The resolved config as YAML (every key, nested sections), which trill_rl_config_load reads back
 * to the same config (with correction.mis off, its unused bounds are not written). */
trill_status trill_rl_config_write(const trill_rl_config *c, FILE *f);
/* A resumed run's config against the one saved in its checkpoint (`where` names it): the keys
 * that cannot change (seed, the LoRA shape) must be equal; the error names the key and both
 * values. */
trill_status trill_rl_config_check_resume(const trill_rl_config *saved, const trill_rl_config *now, const char *where);
/* The config reference in Markdown (docs/config.md is exactly this): every key with type,
 * default, allowed values and meaning. Fails only when out of memory. */
trill_status trill_rl_config_reference(FILE *f);

/* ---- the controller ----
 * Runs `steps` RL steps (or continues a run from a checkpoint, see `resume`): each step
 * generates prompts_per_step x n rollouts with the generator engine, scores them, computes
 * group advantages, recomputes the log-probs with the trainer (router replay when on), measures
 * the training–inference mismatch, takes algo.minibatches optimizer steps on the LoRA adapters
 * and syncs the generator (adapter or merge). Writes RUN/config.yaml, RUN/metrics.jsonl (one
 * JSON object per step) and checkpoints; prints a progress line per step to stderr. Held-out
 * accuracy is measured before the first and after the last step when data.eval is set.
 * With mode async the same stages run as concurrent executors (generator, reward, trainer) on
 * their own cores, within async.max_staleness; RUN/async_summary.json holds their busy times. */
typedef struct trill_rl_result {
    double eval_before, eval_after;   /* held-out pass@1 (NAN when not measured) */
    double passk_before, passk_after; /* held-out pass@k */
    int steps_done;
    double seconds;
} trill_rl_result;

trill_status trill_rl_run(const trill_rl_config *c, trill_rl_result *result);

/* ---- one step's metrics: computed once, read by name; metrics.jsonl and the progress line are
 * written from this struct (trill_rl_metrics_json). NAN where a figure does not apply. ---- */
#define TRILL_RL_MAX_EXT_METRICS 32  /* distinct metric names an external reward process may report */
#define TRILL_RL_MAX_LAG 1025        /* staleness histogram entries: lags 0 .. async.max_staleness */

/* A step's per-token distributions in fixed bins (the same every step and run, so steps and runs
 * compare bin by bin; trill_rl_hist_edges gives each histogram's edges):
 *   log_ratio   Δ = log pi_train - log mu by the decade of |Δ|: bins 0-7 negative (|Δ| >= 1,
 *               [0.1, 1), ..., [1e-6, 1e-5), below 1e-6), bin 8 exactly 0 (the two engines agree to
 *               the bit), bins 9-16 positive mirrored (below 1e-6, ..., >= 1);
 *   weight_raw  the importance weight exp(Δ) before any correction, and
 *   weight_used the weight the loss uses (TIS's cap applied) with MIS-masked tokens in bin 0:
 *               bins 0 (masked or 0), (0, 0.5), [0.5, 0.8), [0.8, 0.9), [0.9, 0.95), [0.95, 0.99),
 *               [0.99, 1.01), [1.01, 1.05), [1.05, 1.1), [1.1, 1.25), [1.25, 2), [2, 5), >= 5;
 *   response_len each sequence's response length in 10 equal bins of [0, max_new_tokens] (the
 *               last holds max_new_tokens itself: the truncated responses). */
#define TRILL_RL_HIST_RATIO_BINS 17
#define TRILL_RL_HIST_WEIGHT_BINS 13
#define TRILL_RL_HIST_LEN_BINS 10
typedef struct trill_rl_histograms {
    long log_ratio[TRILL_RL_HIST_RATIO_BINS];
    long weight_raw[TRILL_RL_HIST_WEIGHT_BINS], weight_used[TRILL_RL_HIST_WEIGHT_BINS];
    long response_len[TRILL_RL_HIST_LEN_BINS];
} trill_rl_histograms;
typedef struct trill_rl_metrics {
    int step;                  /* 1-based, the step these describe */
    /* async mode only (async true) */
    bool async;
    int64_t batch;             /* the rollout batch's index in the prompt stream */
    double staleness_mean;     /* policy versions between the response tokens' weights and the trained ones */
    int staleness_max;
    long staleness_tokens[TRILL_RL_MAX_LAG]; /* response tokens at lag 0 .. staleness_max */
    long dropped_batches, regenerated_batches; /* so far in this run */
    /* the batch */
    double reward, accuracy, response_len;
    int flat_groups, trained_seqs;
    /* the trainer (means over the step's optimizer steps) */
    double loss, pg_loss, kl_loss, kl_ref, clip_frac, ratio_mean, grad_norm;
    int skipped_nonfinite;
    double lr;
    /* training-inference mismatch over the trained response tokens */
    double mismatch_mean_abs, mismatch_max_abs, mismatch_k1, mismatch_k3, mismatch_chi2;
    long mismatch_tokens;
    double tis_mean, tis_capped_frac, mis_masked_frac;
    double flip_token_frac;    /* routed experts the trainer chose differently (NAN without MoE layers) */
    int n_moe_layers;
    double flip_layer[1024];   /* [n_moe_layers] the same per MoE layer */
    bool has_hist;             /* the per-token distributions of the trained tokens (not when replayed without a trainer step) */
    trill_rl_histograms hist;
    /* generator.on_policy: the trained response tokens whose scored log-prob (bits) or expert set
     * differs from the generator's; 0 proves the two equal (TIS weights 1, nothing masked) */
    bool on_policy;
    long on_policy_differing;
    /* data parallelism (more than one rank): the step's collectives from this rank, per kind
     * (trill_comm_kind): bytes sent and milliseconds */
    bool has_comm;
    uint64_t comm_bytes[TRILL_COMM_KINDS];
    double comm_ms[TRILL_COMM_KINDS];
    /* weight sync */
    trill_sync_mode sync_mode;
    size_t sync_bytes;
    double sync_ms;
    uint32_t policy_version;
    /* parallel.generator.replicas: the version's transfer over MPI (a non-blocking broadcast of
     * the adapters' or the merged weights' bytes, its XXH64 checked by each receiver), and per
     * receiver its rank, the ms from the broadcast's start to the bytes in its memory and the ms
     * its engine took to apply them */
    int n_receivers;
    size_t transfer_bytes;
    uint64_t transfer_checksum;
    struct { int rank; double receive_ms, apply_ms; size_t bytes; } receivers[64];
    /* the external reward process's own metrics, means over the batch, as "reward_ext_<name>" */
    int n_ext;
    char ext_name[TRILL_RL_MAX_EXT_METRICS][64];
    double ext_value[TRILL_RL_MAX_EXT_METRICS];
    struct {
        double generate_s, reward_s, train_s, sync_s, step_s, gen_tokens_per_s, train_tokens_per_s;
        double trainer_wait_s, generator_apply_ms, interval_s; /* async */
        /* the process's CPU time in the kernel and in user space, and its minor page faults, since
         * the previous step ended (the first step: since the run's metrics were opened) */
        double system_s, user_s;
        long minor_faults;
        /* the process's peak resident memory so far (MB), and with several ranks the largest
         * rank's (0 on one process) */
        double rss_peak_mb, rss_peak_max_mb;
        double score_s;        /* generator.on_policy: teacher forcing through the scorer (within train_s) */
    } time;
    size_t generator_apply_bytes; /* async: the generator's last weight update */
    bool has_eval;             /* eval.every: a held-out evaluation after this step */
    double eval_pass1, eval_passk;
} trill_rl_metrics;

/* The metrics as a metrics.jsonl line (no newline; malloc'ed; NULL when out of memory). */
char *trill_rl_metrics_json(const trill_rl_metrics *m);

/* ---- a run as a handle an embedder drives (trill_rl_run is a loop over it) ----
 * trill_run_create sets the run up (its folder and lock, the checkpoint to resume, the
 * executors, the held-out evaluation before the first step); each trill_run_step trains one RL
 * step — in sync mode it generates, scores and trains; in async mode the generator and reward
 * executors run from create to finish on their own threads and a step trains the next batch —
 * and writes its metrics line and any checkpoint due. trill_run_finish evaluates after the last
 * step and returns the summary. Library code prints nothing: diagnostics go to the log sink
 * (trill/log.h), the per-step progress to the callback (by default to the log sink too). */
typedef struct trill_run trill_run;

typedef enum trill_run_phase {
    TRILL_RUN_IDLE,           /* between steps */
    TRILL_RUN_GENERATING, TRILL_RUN_SCORING, TRILL_RUN_TRAINING, /* async mode: TRAINING (the rest overlap) */
    TRILL_RUN_EVALUATING, TRILL_RUN_CHECKPOINTING,
    TRILL_RUN_DONE,           /* every step trained, or cancelled, or failed: steps return at once */
} trill_run_phase;

typedef struct trill_run_status {
    int step, steps;          /* steps trained (resumed ones included), of the config's */
    uint32_t policy_version;
    trill_run_phase phase;
    bool cancelled;
    bool has_metrics;         /* last holds the newest step's metrics */
    trill_rl_metrics last;
} trill_run_status;

typedef struct trill_run_options {
    /* After every step, on the stepping thread: the status (its metrics included) and the
     * progress line. NULL: the line goes to the log sink at TRILL_LOG_INFO. */
    void (*progress)(void *ctx, const trill_run_status *status, const char *line);
    void *progress_ctx;
    /* the job's ranks (NULL: one process): parallel.trainer.dp must be their number; every rank
     * runs the loop (generation and scoring too) and trains its share of each minibatch's
     * micro-batches, reaching the same weights bit for bit as one process; rank 0 alone writes
     * the run folder. Sync mode. Borrowed. */
    trill_comm *world;
} trill_run_options;

/* o may be NULL (the defaults). The config is copied. */
trill_status trill_run_create(const trill_rl_config *c, const trill_run_options *o, trill_run **out);
/* One RL step. TRILL_ERR_INTERRUPTED once the run is cancelled (the step in progress when
 * trill_run_cancel came finished and was checkpointed); TRILL_OK without training after the last
 * step (status.phase DONE). An error ends the run: later steps return it again. */
trill_status trill_run_step(trill_run *r);
/* A snapshot, from any thread. */
void trill_run_get_status(trill_run *r, trill_run_status *out);
/* From any thread or a signal handler (it sets a flag): the step in progress finishes and is
 * checkpointed; nothing partial is left, and resume=auto continues from there. */
void trill_run_cancel(trill_run *r);
/* A checkpoint of the steps trained so far, between steps (none if the newest step has one). */
trill_status trill_run_checkpoint(trill_run *r);
/* After the last step: the held-out evaluation after training, the summary; stops the async
 * executors. Call it once; the result is also valid after a cancel (no evaluation then). */
trill_status trill_run_finish(trill_run *r, trill_rl_result *result);
void trill_run_free(trill_run *r);
/* "step 3/10 | reward ... | ETA 1m02s", as `trill train` prints it. */
void trill_run_progress_line(const trill_run_status *s, double step_wall_s, bool async, char *out, size_t size);

/* Asks the run in progress to stop after its current step: it writes a checkpoint of that step
 * and returns TRILL_ERR_INTERRUPTED. Async-signal-safe (it sets a flag), so a SIGINT/SIGTERM
 * handler may call it. One run at a time per process: the flag is cleared when a run starts. */
void trill_rl_request_stop(void);

/* ---- held-out evaluation (also `trill eval`) ---- */
struct trill_dataset;
typedef struct trill_eval_options {
    int limit;                 /* prompts (0: all) */
    int k;                     /* samples per prompt */
    double temperature;
    int max_new_tokens;
    trill_verifier verifier;   /* a sample is correct when the verifier scores it >= 0.5 */
    uint64_t seed;
    const int *stop_ids;
    int n_stop_ids;
    const char *const *stops;
    int n_stops;
} trill_eval_options;

typedef struct trill_eval_result {
    int prompts, k;
    double pass1;              /* mean over prompts of the fraction of correct samples */
    double passk;              /* fraction of prompts with at least one correct sample */
    double mean_len;           /* generated tokens per sample */
    double seconds;
} trill_eval_result;

trill_status trill_rl_evaluate(trill_engine *e, const trill_tokenizer *tok, const struct trill_dataset *d,
                               const trill_eval_options *o, trill_eval_result *out);

/* trill_rl_evaluate on a model folder (matrices kept in the checkpoint's dtype), optionally with
 * a PEFT adapter (NULL: none), on a JSONL file read with data_opt (its chat template is loaded
 * when data_opt->template_ is "chat"); the model's eos ids stop generation besides o->stops. */
struct trill_dataset_options;
trill_status trill_rl_evaluate_model(const char *model_dir, const char *adapter_dir, const char *data_path,
                                     const struct trill_dataset_options *data_opt, const trill_engine_config *engine,
                                     const trill_eval_options *o, trill_eval_result *out);

/* The built-in verifier's score of a completion (trill/reward.h); NAN for TRILL_VERIFIER_NONE. */
double trill_verify(trill_verifier v, const char *completion, const char *truth);
const char *trill_verifier_name(trill_verifier v);

#endif
