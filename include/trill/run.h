/* An RL run (`trill train`): the loop in one call (trill_rl_run), or a handle an embedder creates,
 * steps, observes and cancels. */
#ifndef TRILL_RUN_H
#define TRILL_RUN_H

#include "trill/run_config.h"
#include "trill/rl_metrics.h"

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

trill_status trill_rl_run(const trill_run_config *c, trill_rl_result *result);

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
trill_status trill_run_create(const trill_run_config *c, const trill_run_options *o, trill_run **out);
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

#endif
