/* The embedded demo (`trill train` with no arguments): two-digit addition on a tiny MoE model.
 *
 * Task: a prompt "47+38=" asks for the sum, answered as its decimal digits ("85") followed by the
 * end-of-sequence token (id 0, "<|endoftext|>" in the character-level tokenizer). Both operands
 * are uniform in 0..99, so prompts are 4 to 6 characters and answers 1 to 3 digits. A completion
 * is the generated text with the EOS token decoded as nothing; it is correct when its text up to
 * the first newline (or its end) is exactly the answer: "85" is, "85 ", "085" and "8" are not
 * (trill_reward_demo, trill/reward.h).
 *
 * Data (JSONL, one {"prompt": "47+38=", "answer": "85"} per line), all a pure function of the
 * seed: eval.jsonl (held-out, distinct prompts), dev.jsonl (distinct prompts that decide when
 * the warm start stops; disjoint from eval) and train.jsonl (a stream of examples, repeats
 * allowed, never a prompt of eval or dev). The same train.jsonl serves the SFT warm start
 * (answer as the completion) and the RL prompts.
 *
 * Model: the `tiny` preset (Qwen3-MoE, layer 0 dense, layers 1-3 MoE with 8 experts, top-2,
 * char-level vocabulary of 128) narrowed to hidden 128 (4 heads / 2 KV heads x head_dim 32,
 * dense intermediate 384, expert intermediate 64): 971k parameters, 529k active per token.
 *
 * Warm start: full fine-tuning from the random initialisation (AdamW, lr 2e-3 constant after 20
 * warm-up steps, 1024-token micro-batches, one per step), in chunks: after `first_check` steps
 * and every `check_every` steps after that, the model samples dev_k completions of every dev
 * prompt at temperature 1 with the generator (bf16), and the SFT stops as soon as the mean
 * accuracy (pass@1) reaches target_pass1. Stopping on a measured accuracy rather than at a step
 * count gives the same weak-but-reachable prior whatever the seed or machine: the step where
 * addition "clicks" moves from ~300 to ~650 with the seed, and at lr 2e-3 accuracy jumps by
 * 10 points between neighbouring checks. Resumed chunks are bit-identical to one run.
 *
 * Measured with the defaults (2-core machine, OMP_NUM_THREADS=2; timings are noisy, other jobs
 * shared the machine): seeds 0-3 stop after 325 / 375 / 350 / 675 steps, 17.5 / 20.5 / 19.4 /
 * 38.8 s of warm start; held-out (200 prompts x 8 samples at T=1): pass@1 30.8 / 33.8 / 28.2 /
 * 34.5 %, pass@8 79.5 / 82.0 / 79.5 / 80.0 % — the headroom GRPO lifts pass@1 into. One RL step
 * at the recommended shape (32 prompts x 8 samples = 256 sequences, ~2000 tokens) costs ~0.1 s
 * of trainer forward+backward+AdamW (full or LoRA rank 8/16 alike, ~19k tokens/s) and ~0.02 s
 * of generation (bf16 engine, ~750 tokens). */
#ifndef TRILL_DEMO_H
#define TRILL_DEMO_H

#include <stdbool.h>
#include <stdint.h>

#include "trill/error.h"

/* Part of the cache key: bump whenever the task, the data, the model or the warm start change. */
#define TRILL_DEMO_TASK_VERSION 2

/* Recommended RL settings for the demo (what the timings above were measured at). */
#define TRILL_DEMO_RL_PROMPTS_PER_STEP 32
#define TRILL_DEMO_RL_SAMPLES 8        /* generator.n */
#define TRILL_DEMO_RL_MAX_NEW_TOKENS 8 /* answers are <= 3 digits + EOS */
#define TRILL_DEMO_RL_TEMPERATURE 1.0
#define TRILL_DEMO_EVAL_K 8            /* held-out samples per prompt for pass@1 / pass@k */

typedef struct trill_demo_options {
    uint64_t seed;        /* data, model initialisation and SFT order (default 0) */
    int n_train;          /* train.jsonl lines (default 60000) */
    int n_eval;           /* eval.jsonl prompts (default 200) */
    int n_dev;            /* dev.jsonl prompts (default 200) */
    double target_pass1;  /* the warm start stops once dev pass@1 reaches this (default 0.30) */
    int first_check;      /* SFT steps before the first dev check (default 200) */
    int check_every;      /* SFT steps between dev checks (default 25) */
    int max_sft_steps;    /* the warm start stops here whatever the accuracy (default 1000) */
    int dev_k;            /* samples per dev prompt (default 8) */
} trill_demo_options;

trill_demo_options trill_demo_defaults(void);

/* ---- the task ---- */

/* Problem `index` of stream `stream` (a pure function of seed, stream and index). */
void trill_demo_problem(uint64_t seed, uint64_t stream, uint64_t index, int *a, int *b);
/* "a+b=" and the decimal sum. */
void trill_demo_format(int a, int b, char prompt[16], char answer[8]);

/* Writes dir/train.jsonl, dir/eval.jsonl and dir/dev.jsonl (atomically) as described above. */
trill_status trill_demo_write_data(const char *dir, const trill_demo_options *o);

/* ---- preparing the demo's base model ---- */

typedef struct trill_demo_info {
    char *dir;                      /* cache_dir/<key>: everything below lives here */
    char *model_dir;                /* the warm-started model (HF layout, fp32) */
    char *train_path, *eval_path;   /* RL prompts and held-out prompts */
    int sft_steps;
    double sft_seconds;             /* of the warm start when it was built (also on a cache hit) */
    double dev_pass1, dev_passk;    /* the base's dev accuracy at the last check (k = dev_k) */
    bool cached;                    /* found complete in the cache: nothing was computed */
} trill_demo_info;

/* Where the demo's warm-started model is kept between runs (trill train, trill serve --models
 * demo): $TRILL_CACHE_DIR, else $XDG_CACHE_HOME/trill, else ~/.cache/trill, else .trill-cache.
 * Malloc'ed; NULL when out of memory. */
char *trill_demo_cache_dir(void);
/* The demo model's config (the tiny preset narrowed to hidden 128), without its weights. */
struct trill_config;
trill_status trill_demo_config(struct trill_config *c);

/* Makes (or finds) the demo's data and warm-started model under cache_dir/<key>/, where the key
 * names the task version and every option. A complete folder is marked by demo.json, written
 * last and atomically; a folder without it (a crash mid-way) is deleted and rebuilt. Progress
 * goes to stderr as a few lines; the SFT's per-step lines go to <dir>/sft.log.
 * Not safe against two processes preparing the same cache_dir at once. */
trill_status trill_demo_prepare(const char *cache_dir, const trill_demo_options *o, trill_demo_info *out);
void trill_demo_info_free(trill_demo_info *info);

/* ---- the multi-turn demo (`trill train env.kind=guess`) ----
 * The higher/lower game (env.kind guess) on the same sums: the model answers "47+38=", the
 * environment says "higher\n" or "lower\n" until it is right or the turns run out (the reward: 1
 * when solved). The single-turn warm start never saw a second turn, so it gets TRILL_DEMO_TURNS_SFT_STEPS
 * more steps of full SFT on transcripts of the game over train.jsonl's sums (zero, one or two wrong
 * guesses, each off by 1 to 10 and answered as the environment would, then the sum): the format,
 * not a strategy (the wrong guesses go either way). RL then learns to use the feedback.
 * The model is <dir>/turns/model (out->model_dir), marked complete by <dir>/turns/demo.json. */
#define TRILL_DEMO_TURNS_SFT_STEPS 150
#define TRILL_DEMO_TURNS_MAX_TURNS 3   /* env.max_turns the figures below were measured at */
trill_status trill_demo_prepare_turns(const char *cache_dir, const trill_demo_options *o, trill_demo_info *out);

#endif
