/* The RL run configuration. One table (KEYS) names every key with its dotted path, type, range
 * or allowed values, struct field, default and meaning; the defaults, YAML loading, dotted
 * overrides, range checks, the resolved config.yaml and the Markdown reference (docs/config.md)
 * are all derived from it, so they cannot disagree.
 *
 * YAML goes through libyaml's document loader, whose nodes carry their line numbers; the schema
 * walk reads the tree directly, so every error names the file, the line and the dotted key. */
#include "trill/log.h"
#include "base/alloc.h"
#include "trill/run_config.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "base/utf8.h"
#include "rl/env/env.h"
#include "trill/fileio.h"

typedef enum kind {
    K_STRING,
    K_INT,     /* int in [lo, hi] */
    K_SEED,    /* uint64_t */
    K_REAL,    /* double between lo and hi */
    K_BOOL,
    K_ENUM,    /* int-sized enum: value i is names[i] */
    K_STOPS,   /* generator.stop: a list of strings */
    K_MIS,     /* correction.mis: [low, high] or false, into mis / mis_low / mis_high */
    K_TARGETS, /* trainer.lora.targets: module names, into a bit set */
    K_LOSS,    /* algo.loss: a loss of the table (trill/loss.h) that trill train runs */
} kind;

typedef struct key {
    const char *path;
    kind kind;
    size_t offset;
    double lo, hi;             /* K_INT, K_REAL; +-INFINITY: unbounded */
    bool lo_open, hi_open;     /* K_REAL: the bound itself excluded */
    const char *const *names;  /* K_ENUM, NULL-terminated */
    const char *def;           /* the default, in YAML */
    const char *doc;
} key;

_Static_assert(sizeof(trill_rl_loss) == sizeof(int) && sizeof(trill_gen_format) == sizeof(int) &&
               sizeof(trill_lr_schedule) == sizeof(int) && sizeof(trill_precision) == sizeof(int) &&
               sizeof(trill_env_render) == sizeof(int), "K_ENUM fields are stored as int");

static const char *const GEN_FORMATS[] = { "f32", "bf16", "int8", NULL }; /* trill_gen_format_name order */
static const char *const VERIFIERS[] = { "none", "exact", "numeric", "demo", NULL };
static const char *const MODES[] = { "sync", "async", NULL };
static const char *const STALE_POLICIES[] = { "wait", "drop", "regenerate", NULL };
static const char *const REWARD_PLACES[] = { "thread", "trainer", NULL };
static const char *const AGGREGATIONS[] = { "token-mean", "seq-mean-token-sum", "seq-mean-token-mean", NULL };
static const char *const KL_ESTIMATORS[] = { "k1", "k2", "k3", NULL };
static const char *const KL_MODES[] = { "loss", "reward", NULL };
static const char *const MIS_LEVELS[] = { "token", "sequence", "geometric", NULL };
static const char *const SCHEDULES[] = { "constant", "linear", "cosine", NULL }; /* trill_lr_schedule_parse order */
static const char *const SYNC_MODES[] = { "adapter", "merge", NULL };
static const char *const SFT_MODES[] = { "lora", "full", NULL };
static const char *const ENV_RENDERS[] = { "auto", "plain", "chat", NULL }; /* trill_env_render order */
static const char *const PRECISIONS[] = { "fp32", "bf16", "auto", NULL }; /* trill_precision order */

#define F(field) offsetof(trill_run_config, field)
#define STRING(p, f, d, doc) { p, K_STRING, F(f), 0, 0, false, false, NULL, d, doc }
#define INT(p, f, lo, hi, d, doc) { p, K_INT, F(f), lo, hi, false, false, NULL, d, doc }
#define REAL(p, f, lo, hi, d, doc) { p, K_REAL, F(f), lo, hi, false, false, NULL, d, doc }
#define POSITIVE(p, f, hi, d, doc) { p, K_REAL, F(f), 0, hi, true, false, NULL, d, doc }  /* (0, hi] */
#define FRACTION(p, f, d, doc) { p, K_REAL, F(f), 0, 1, false, true, NULL, d, doc }      /* [0, 1) */
#define BOOL(p, f, d, doc) { p, K_BOOL, F(f), 0, 0, false, false, NULL, d, doc }
#define ENUM(p, f, names, d, doc) { p, K_ENUM, F(f), 0, 0, false, false, names, d, doc }
#define OTHER(p, k, f, d, doc) { p, k, F(f), 0, 0, false, false, NULL, d, doc }
#define INF INFINITY

/* Sections stay contiguous (the writer opens each once); trainer.lora comes last in trainer. */
static const key KEYS[] = {
    STRING("model", model, "\"\"", "Model folder (Hugging Face layout); `\"\"` runs the embedded demo's model."),
    STRING("run_dir", run_dir, "\"\"", "Run folder: the resolved `config.yaml`, `metrics.jsonl` and checkpoints; `\"\"` makes a new `runs/YYYYMMDD-HHMMSS`."),
    OTHER("seed", K_SEED, seed, "0", "Seed of every random choice (data order, sampling, adapter initialisation)."),
    INT("steps", steps, 1, 1e9, "300", "RL steps; each generates one rollout batch and trains on it."),
    STRING("resume", resume, "\"\"",
           "`\"\"` starts fresh (refused when run_dir has checkpoints), `auto` continues from run_dir's latest "
           "checkpoint if there is one, anything else is a checkpoint folder."),
    ENUM("mode", mode, MODES, "sync",
         "sync: generate, score and train in turn on all cores; async: generator, reward and trainer run at the same "
         "time on their own cores, bounded by async.max_staleness."),

    INT("async.max_staleness", async.max_staleness, 0, 1024, "1",
        "Most policy versions between the weights that generated a token and the weights trained on it (0: on-policy)."),
    INT("async.queue", async.queue, 1, 1024, "2", "Rollout batches waiting for the trainer; the generator pauses when it is full."),
    ENUM("async.on_stale", async.on_stale, STALE_POLICIES, "wait",
         "wait: the generator does not start a batch that would exceed the bound; drop / regenerate: it runs ahead as far "
         "as the queue allows and the trainer drops a batch beyond the bound or has it generated again."),
    ENUM("async.reward", async.reward, REWARD_PLACES, "thread",
         "Where the reward executor runs: thread, a thread of its own (resources.reward_threads); trainer, on the trainer's "
         "thread, scoring each batch as the trainer takes it (no third thread: on 2 cores the generator and the trainer keep one each)."),

    INT("resources.generator_threads", resources.generator_threads, 1, 4096, "1", "Async: cores of the generator executor."),
    INT("resources.trainer_threads", resources.trainer_threads, 1, 4096, "1", "Async: cores of the trainer executor."),
    INT("resources.reward_threads", resources.reward_threads, 0, 4096, "0",
        "Async: cores of the reward executor (0: not pinned; it mostly waits on verifiers and reward processes)."),
    BOOL("resources.pin", resources.pin, "true", "Async: pin each executor to its own cores (cores 0.. generator, then trainer, then reward)."),

    STRING("data.train", data.train, "\"\"", "Training prompts: a JSONL file, one object per line."),
    STRING("data.eval", data.eval, "\"\"", "Held-out prompts, JSONL; `\"\"`: no held-out evaluation."),
    STRING("data.prompt_field", data.prompt_field, "prompt", "Field of each line that holds the prompt."),
    STRING("data.answer_field", data.answer_field, "answer", "Field of each line that holds the reference answer."),
    STRING("data.completion_field", data.completion_field, "completion",
           "SFT: field of each line that holds the target completion (the loss covers it and the end-of-sequence token)."),
    STRING("data.template", data.template_, "\"\"",
           "Model input: text with `{field}` placeholders filled from the line, `chat` (the model's chat template on "
           "data.prompt_field), or `\"\"`: data.prompt_field as it is."),
    BOOL("data.shuffle", data.shuffle, "true", "Reshuffle the training prompts every epoch (keyed by seed and epoch)."),
    INT("data.eval_size", data.eval_size, 0, INF, "200", "Held-out prompts evaluated (0: all)."),
    INT("data.max_prompt_tokens", data.max_prompt_tokens, 1, INF, "1024",
        "Longest prompt in tokens; a longer one is refused with its line number."),
    BOOL("data.allow_missing_answer", data.allow_missing_answer, "false",
         "Accept lines without the answer field (as \"\"), for data scored only by a reward process or model; "
         "false: such a line is an error naming it."),

    ENUM("generator.dtype", generator.dtype, GEN_FORMATS, "bf16", "Generator weight format (int8: W8A8)."),
    INT("generator.prompts_per_step", generator.prompts_per_step, 1, INF, "32", "Prompts per rollout batch."),
    INT("generator.n", generator.n, 1, 1024, "8",
        "Samples per prompt: the group whose rewards give the advantages (at least 2)."),
    INT("generator.max_new_tokens", generator.max_new_tokens, 1, INF, "8", "Longest completion in tokens."),
    REAL("generator.temperature", generator.temperature, 0, 100, "1.0", "Sampling temperature (0: greedy)."),
    POSITIVE("generator.top_p", generator.top_p, 1, "1.0",
             "Nucleus sampling: keep the most likely tokens up to this much probability (1: off)."),
    INT("generator.top_k", generator.top_k, 0, INF, "0", "Keep only the k most likely tokens (0: off)."),
    FRACTION("generator.min_p", generator.min_p, "0",
         "Drop tokens less likely than min_p times the most likely one (0: off)."),
    OTHER("generator.stop", K_STOPS, generator.stop, "[]",
          "Stop strings, e.g. `[\"\\n\\n\", \"###\"]`; the end-of-sequence token always stops."),
    INT("generator.kv_cache_mb", generator.kv_cache_mb, 1, INF, "256", "KV cache size in MiB."),
    INT("generator.max_batch_tokens", generator.max_batch_tokens, 1, INF, "2048",
        "Tokens per generator step (prompt chunks and decode rows together)."),
    BOOL("generator.eplb", generator.eplb, "false",
         "Expert-parallel load balancing (DeepSeek EPLB): each MoE layer's experts get physical slots, replicas of the "
         "busiest, spread over workers and re-planned from the observed load. Results are identical on or off."),
    INT("generator.eplb_redundant", generator.eplb_redundant, -1, 65535, "-1",
        "EPLB: extra physical slots per MoE layer (-1: one per worker)."),
    INT("generator.eplb_workers", generator.eplb_workers, 0, 4096, "0", "EPLB: workers the slots are spread over (0: the generator's threads)."),
    INT("generator.eplb_window", generator.eplb_window, 1, 1 << 20, "64", "EPLB: generator steps of routed load the planner sees."),
    INT("generator.eplb_interval", generator.eplb_interval, 1, 1 << 20, "16", "EPLB: generator steps between plans."),
    BOOL("generator.on_policy", generator.on_policy, "false",
         "On-policy mode: the trainer's log-probs and expert routing come from an engine in generator.dtype scoring the sampled "
         "tokens at the trainer's current weights, bit-identical to the generator's (mismatch 0, TIS weights 1); the backward is "
         "the trainer's, through that routing. It costs a second engine (weights in generator.dtype and a KV cache of "
         "generator.kv_cache_mb) and a teacher-forced pass per minibatch. Needs mode sync."),

    ENUM("reward.verifier", reward.verifier, VERIFIERS, "demo",
         "Built-in verifier of each completion against the answer field (`demo`: the embedded demo's task)."),
    REAL("reward.verifier_weight", reward.verifier_weight, -INF, INF, "1.0", "Weight of the verifier's score in the reward."),
    STRING("reward.external", reward.external, "\"\"", "Command line of an external reward process (`\"\"`: none)."),
    REAL("reward.external_weight", reward.external_weight, -INF, INF, "1.0", "Weight of the external score in the reward."),
    POSITIVE("reward.external_timeout_s", reward.external_timeout_s, INF, "30", "Seconds the external process may take per request."),
    INT("reward.external_max_failures", reward.external_max_failures, 1, INF, "3",
        "Consecutive crashes, timeouts or bad replies of the external process before the run stops."),
    INT("reward.external_workers", reward.external_workers, 1, 256, "1",
        "External reward processes started; a batch's requests are spread over them and scored in parallel."),
    STRING("reward.model", reward.model, "\"\"",
           "Reward model folder (Qwen3ForSequenceClassification layout; `\"\"`: none)."),
    REAL("reward.model_weight", reward.model_weight, -INF, INF, "1.0", "Weight of the reward model's score in the reward."),

    STRING("env.kind", env.kind, "\"\"",
           "Multi-turn episodes: the environment each sample talks to between its turns: `guess` (the built-in higher/lower "
           "game), `process` (env.command, speaking JSON lines: examples/envs/README.md); `\"\"`: none, one completion per "
           "prompt. The task is each data line's prompt and answer; the observations are appended as injected tokens (their "
           "messages' contents, tokenised), never trained."),
    STRING("env.command", env.command, "\"\"", "env.kind process: the command line of the environment process."),
    POSITIVE("env.timeout_s", env.timeout_s, INF, "30", "env.kind process: seconds the process may take per request."),
    INT("env.max_failures", env.max_failures, 1, INF, "3",
        "env.kind process: consecutive failed requests (a crash, a timeout, a bad reply) before the run stops; a failed reset "
        "is retried on a fresh process."),
    BOOL("env.mark_failures", env.mark_failures, "false",
         "env.kind process: a failed step ends its episode with stop reason env_error (with every episode the restarted process "
         "lost), not trained, instead of stopping the run (still after env.max_failures in a row)."),
    INT("env.max_turns", env.max_turns, 1, 1e6, "8", "Model turns of an episode; one that reaches it ends with stop reason max_turns."),
    INT("env.max_tokens", env.max_tokens, 0, INF, "0",
        "Tokens of a trajectory, prompt included (0: the model's max_position_embeddings); an observation that would not leave "
        "room for a turn ends the episode with stop reason context."),
    REAL("env.reward_weight", env.reward_weight, -INF, INF, "1.0", "Weight of an episode's return (its turns' rewards summed) in the reward."),
    ENUM("env.render", env.render, ENV_RENDERS, "auto",
         "How observations become tokens: plain, their messages' contents concatenated; chat, the model's chat template (Qwen3, "
         "DeepSeek-V3: the first observation as a conversation with the environment's tools, each later one as what the template "
         "writes after a turn; the tool calls in each turn parsed and sent to the environment); auto: chat when the model has "
         "such a template, else plain."),

    OTHER("algo.loss", K_LOSS, algo.loss, "ppo", "Policy loss (the loss table, trill/loss.h):"),
    BOOL("algo.std_norm", algo.std_norm, "true", "Divide advantages by the group's reward std (false: Dr. GRPO)."),
    REAL("algo.clip_low", algo.clip_low, 0, 1e6, "0.2", "Ratio band's lower side: the band is [1 - clip_low, 1 + clip_high]."),
    REAL("algo.clip_high", algo.clip_high, 0, 1e6, "0.28", "Ratio band's upper side."),
    ENUM("algo.aggregation", algo.aggregation, AGGREGATIONS, "token-mean",
         "Batch loss: mean over all tokens, or mean over sequences of each sequence's token sum or token mean."),
    REAL("algo.kl_coef", algo.kl_coef, 0, INF, "0", "Weight of the KL divergence to the reference model (0: off)."),
    ENUM("algo.kl_estimator", algo.kl_estimator, KL_ESTIMATORS, "k3", "KL estimator (Schulman's k1, k2, k3)."),
    ENUM("algo.kl_mode", algo.kl_mode, KL_MODES, "loss", "The KL enters as a loss term or as a penalty on the reward."),
    BOOL("algo.dynamic_sampling", algo.dynamic_sampling, "false", "Drop groups whose rewards are all equal."),
    INT("algo.minibatches", algo.minibatches, 1, 1024, "1", "Optimizer steps per rollout batch."),
    POSITIVE("algo.aipo_rho", algo.aipo_rho, INF, "4", "AIPO: the truncation rho of the importance weight min(pi_theta / mu, rho)."),

    REAL("correction.tis", correction.tis, 0, INF, "2.0",
         "Truncated importance sampling: weight tokens by min(pi_train / mu, tis), mu the generator's probability (0: off)."),
    OTHER("correction.mis", K_MIS, correction.mis, "[0.5, 5]",
          "Masked importance sampling: drop tokens (or sequences) whose ratio pi_train / mu is outside "
          "`[low, high]`; `false`: off."),
    ENUM("correction.mis_level", correction.mis_level, MIS_LEVELS, "token",
         "Ratio the mask looks at: per token, the sequence's product, or its geometric mean."),

    BOOL("router_replay", router_replay, "true", "Router replay (R3): the trainer routes each token to the experts the generator chose."),

    POSITIVE("trainer.lr", trainer.lr, 10, "1e-3", "Peak learning rate (AdamW)."),
    REAL("trainer.min_lr", trainer.min_lr, 0, INF, "0", "Learning rate at the end of a linear or cosine schedule."),
    REAL("trainer.weight_decay", trainer.weight_decay, 0, INF, "0", "AdamW's decoupled weight decay."),
    REAL("trainer.grad_clip", trainer.grad_clip, 0, INF, "1.0", "Clip the gradients' global norm to this (0: off)."),
    ENUM("trainer.schedule", trainer.schedule, SCHEDULES, "constant", "Learning-rate schedule after the warm-up."),
    INT("trainer.warmup_steps", trainer.warmup_steps, 0, INF, "0", "Optimizer steps of linear warm-up: step i (from 0) takes lr * (i + 1) / warmup_steps."),
    INT("trainer.micro_batch_tokens", trainer.micro_batch_tokens, 16, INF, "8192",
        "Tokens per forward/backward pass; gradients accumulate over as many as a step needs."),
    BOOL("trainer.recompute", trainer.recompute, "false",
         "Activation checkpointing: keep only each layer's input and recompute the rest in the backward pass."),
    ENUM("trainer.precision", trainer.precision, PRECISIONS, "auto",
         "Matrix products of the trainer's forward and backward: fp32, or bf16 operands with fp32 sums as a GPU's bf16 "
         "GEMMs (master weights, gradients, optimizer, norms, softmax, router logits and loss stay fp32). bf16 runs on "
         "vdpbf16ps where the CPU has AVX-512 BF16, else on a portable path with the same results but slower than fp32. "
         "auto: bf16 where every trainer rank's CPU has AVX-512 BF16 (there it outruns fp32: `trill bench train "
         "--precision bf16` shows both) and generator.dtype is not f32, else fp32; the run's first log line says which."),
    BOOL("trainer.skip_nonfinite", trainer.skip_nonfinite, "false",
         "A minibatch whose loss or gradient is not finite is skipped (counted as `skipped_nonfinite` in the metrics); "
         "false: the run stops with an error naming the step. Never applied, synced or saved either way."),
    INT("trainer.lora.rank", trainer.lora.rank, 1, 4096, "8", "LoRA rank."),
    POSITIVE("trainer.lora.alpha", trainer.lora.alpha, INF, "16", "LoRA alpha: the update is scaled by alpha / rank."),
    BOOL("trainer.lora.use_rslora", trainer.lora.use_rslora, "false", "rsLoRA: scale by alpha / sqrt(rank) instead."),
    OTHER("trainer.lora.targets", K_TARGETS, trainer.lora.targets, "all-linear",
          "Adapted layers, comma-separated: q, k, v, o, gate, up, down (dense MLPs, every expert, shared experts), lm_head, w1, w2, w3 (Mixtral's experts), "
          "MLA's q_a, q_b, kv_a, kv_b (DeepSeek-V3), Qwen3-Next's in_proj_qkvz, in_proj_ba, out_proj (its Gated DeltaNet layers) and "
          "shared_expert_gate, and Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; `all-linear` is every linear layer of the "
          "model's family but lm_head."),

    ENUM("sync.mode", sync.mode, SYNC_MODES, "adapter",
         "How new weights reach the generator: the adapter on a side path, or merged into its weights."),

    INT("parallel.trainer.dp", parallel.trainer.dp, 1, 65536, "1",
        "Data-parallel trainer ranks: each takes a contiguous share of a step's micro-batches; the gradients are summed by one fixed "
        "tree over micro-batch indices, so the result is the same bits on any number of ranks."),
    INT("parallel.trainer.ep", parallel.trainer.ep, 1, 65536, "1",
        "Expert-parallel trainer ranks: each group of ep consecutive ranks splits every MoE layer's routed experts (their adapters "
        "and optimizer state) into ep equal shards (num_experts must be a multiple of ep); attention and dense layers stay "
        "data-parallel, tokens go to their experts' ranks with all-to-all-v and back, and the results equal one rank's bit for bit. "
        "LoRA only."),
    INT("parallel.trainer.tp", parallel.trainer.tp, 1, 65536, "1",
        "Tensor-parallel trainer ranks: each group of tp consecutive ranks trains the same micro-batches, each rank holding its share "
        "of the attention heads and of the dense MLPs' width (Megatron's column- and row-parallel projections; LoRA A whole and B "
        "split on column-parallel ones, A split and B whole on row-parallel ones); experts stay whole. Results equal one rank's "
        "within 1e-5 relative (the partial sums are added in another order). LoRA only; not with ep > 1."),
    INT("parallel.generator.replicas", parallel.generator.replicas, 0, 65536, "0",
        "Generator replicas on ranks of their own, after the trainer's (0: every trainer rank generates in its own process). "
        "Each step's prompts go to the replica with the fewest pending tokens; their sequences come back as packed rollout "
        "batches and new weights reach them by a non-blocking broadcast (a version, a checksum, bytes and ms per receiver). "
        "Sampling is keyed by request id, so the tokens do not depend on the replica count. With mode async the replicas generate "
        "ahead within async.max_staleness and take new weights between decode steps."),
    INT("parallel.generator.ep", parallel.generator.ep, 1, 65536, "1",
        "Expert-parallel ranks per generator replica: each of them generates its own share of the prompts and every MoE layer "
        "sends its rows to the rank holding their expert (with generator.eplb, the planner's physical slots, replicas of hot "
        "experts on several ranks, re-planned from the group's load) and back; captured ids stay logical. mode sync."),
    INT("parallel.scorer", parallel.scorer, 0, 1, "0",
        "Ranks of the scorer (the verifier, external reward processes, the reward model): 0, the controller scores; 1, a rank of "
        "its own, the last one, which receives each batch and sends back its rewards."),
    INT("checkpoint.every", checkpoint.every, 0, INF, "100", "Steps between checkpoints (0: only at the end)."),
    INT("checkpoint.keep", checkpoint.keep, 0, INF, "2", "Newest checkpoints kept (0: all); `trill sft`'s too."),

    INT("eval.every", eval.every, 0, INF, "0", "Steps between held-out evaluations (0: before and after training only)."),
    INT("eval.k", eval.k, 1, 1024, "8", "Samples per held-out prompt for pass@k (pass@1 is their mean)."),
    REAL("eval.temperature", eval.temperature, 0, 100, "1.0", "Sampling temperature of the evaluation."),

    ENUM("sft.mode", sft.mode, SFT_MODES, "lora", "What `trill sft` trains: LoRA adapters (trainer.lora) on a frozen base, or every weight."),
    INT("sft.epochs", sft.epochs, 1, 1e6, "1", "Passes over data.train."),
    INT("sft.max_steps", sft.max_steps, 0, 1e9, "0", "Optimizer steps at most (0: as many as the epochs give)."),
    INT("sft.grad_accum", sft.grad_accum, 1, 1e6, "1", "Micro-batches (trainer.micro_batch_tokens each) per optimizer step."),
    INT("sft.eval_every", sft.eval_every, 0, 1e9, "0", "Steps between held-out losses on data.eval (0: only at the end)."),
    INT("sft.max_seq_len", sft.max_seq_len, 2, 1e7, "4096",
        "Longest example in tokens (prompt, completion and the end-of-sequence token; the model's max_position_embeddings "
        "also bounds it): a longer one is refused with its line number, unless sft.truncate."),
    BOOL("sft.truncate", sft.truncate, "false",
         "An example longer than sft.max_seq_len (or max_position_embeddings) loses the end of its completion instead of "
         "being refused (its prompt is never cut: one whose prompt leaves no room for a completion token is still refused)."),
    INT("sft.save_every", sft.save_every, 0, 1e9, "0",
        "Steps between checkpoints in run_dir/checkpoints/step-N (0: only at the end; a stop on request checkpoints too)."),
    INT("sft.stop_after", sft.stop_after, 0, 1e9, "0",
        "End this run after that many steps (0: run to the end); the schedule still spans all of them, and `resume` continues."),

    BOOL("rollouts.save", rollouts.save, "false",
         "Write each step's rollout batch as the trainer receives it (tokens, behaviour log-probs, versions, routed "
         "experts, completions, rewards) to `run_dir/rollouts/step-NNNNNNNN.bin`."),
    STRING("rollouts.replay", rollouts.replay, "\"\"",
           "A folder of such files: each step trains on its own file instead of generating and scoring (sync mode; "
           "`\"\"`: off). Replaying a saved run reproduces its training exactly."),
};
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

typedef struct section { const char *name, *doc; } section;
static const section SECTIONS[] = {
    { "", "The model, the run folder, the length of the run and the scheduler." },
    { "async", "Asynchronous mode: how far the generator may run ahead of the trainer." },
    { "resources", "Asynchronous mode: the cores of each executor (threads never share a core with another executor's)." },
    { "data", "Prompts: where they come from and how they become model input." },
    { "generator", "Rollouts: the inference engine's weight format, sampling and batching." },
    { "reward", "The reward of a completion: the weighted sum of a built-in verifier, an external process and a reward model." },
    { "env", "Multi-turn episodes: the environment a sample talks to, turn after turn, and the limits of an episode." },
    { "algo", "The policy-gradient objective. Advantages are group-relative (GRPO): each sample's reward minus its group's mean." },
    { "correction", "Training-inference mismatch: importance weights between the trainer's probabilities (pi_train) and the "
                    "generator's (mu)." },
    { "trainer", "Optimisation of the LoRA adapters." },
    { "sync", "Weight updates from the trainer to the generator." },
    { "parallel", "Placement on MPI ranks (`mpirun -np N trill train ...`, `trill sft`, `trill bench train`): the trainer's dp x ep x tp ranks first (rank 0 is also the controller), then parallel.generator.replicas ranks, then parallel.scorer; they must add up to N." },
    { "checkpoint", "Checkpoints in the run folder (what `resume` continues from)." },
    { "eval", "Held-out evaluation on data.eval." },
    { "sft", "Supervised fine-tuning (`trill sft`): prompt/completion lines of data.train, the loss on the completion; "
             "it shares `model`, `run_dir`, `seed`, `resume`, `data.*` and `trainer.*` with RL." },
    { "rollouts", "Recorded rollout batches: keep what the trainer saw, or train on a recording again." },
};

/* ---- paths ---- */

static const key *find_key(const char *path) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(KEYS[i].path, path)) return &KEYS[i];
    return NULL;
}

/* "" is the top level. */
static bool is_section(const char *path) {
    size_t n = strlen(path);
    if (n == 0) return true;
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strncmp(KEYS[i].path, path, n) && KEYS[i].path[n] == '.') return true;
    return false;
}

/* The names directly inside a section, comma-separated, in table order. */
static const char *children(const char *prefix, char *buf, size_t size) {
    size_t n = strlen(prefix), len = 0, n_seen = 0;
    const char *seen[N_KEYS];
    size_t seen_len[N_KEYS];
    buf[0] = '\0';
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *p = KEYS[i].path;
        if (n) {
            if (strncmp(p, prefix, n) || p[n] != '.') continue;
            p += n + 1;
        }
        size_t seg = strcspn(p, "."), j = 0;
        while (j < n_seen && !(seen_len[j] == seg && !strncmp(seen[j], p, seg))) j++;
        if (j < n_seen) continue;
        seen[n_seen] = p;
        seen_len[n_seen++] = seg;
        if (len + seg + 3 < size) len += (size_t)snprintf(buf + len, size - len, "%s%.*s", len ? ", " : "", (int)seg, p);
    }
    return buf;
}

/* "the top level" or the section's dotted name, for messages. */
static const char *section_title(const char *prefix) { return prefix[0] ? prefix : "the top level"; }

/* ---- messages ---- */

/* Where the YAML came from: a file, an override, or the built-in defaults. */
typedef struct source {
    const char *file;
    const char *override;
} source;

static trill_status fail(const source *src, const yaml_node_t *node, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static trill_status fail(const source *src, const yaml_node_t *node, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (src->override) return trill_error(TRILL_ERR_INVALID, "override \"%s\": %s", src->override, msg);
    return trill_error(TRILL_ERR_INVALID, "%s:%zu: %s", src->file, node ? node->start_mark.line + 1 : 1, msg);
}

static bool yaml_printable(uint32_t cp) {
    return cp == 0x85 || (cp >= 0x20 && cp <= 0x7e) || (cp >= 0xa0 && cp <= 0xd7ff) ||
           (cp >= 0xe000 && cp <= 0xfffd && cp != 0xfeff) || (cp >= 0x10000 && cp <= 0x10ffff);
}

/* s[0..n) (valid UTF-8) as a YAML double-quoted scalar into out (cap bytes); when it does not
 * fit it ends in ...". 4 n + 8 bytes always suffice. */
static const char *quote(char *out, size_t cap, const char *s, size_t n) {
    size_t len = 0;
    out[len++] = '"';
    for (size_t i = 0; i < n;) {
        char piece[12];
        uint32_t cp;
        int w = (unsigned char)s[i] < 0x80 ? (cp = (unsigned char)s[i], 1) : trill_utf8_decode(s + i, &cp);
        if (cp == '"' || cp == '\\') snprintf(piece, sizeof piece, "\\%c", (char)cp);
        else if (cp == '\n') strcpy(piece, "\\n");
        else if (cp == '\t') strcpy(piece, "\\t");
        else if (cp == '\r') strcpy(piece, "\\r");
        else if (cp < 0x80 && !yaml_printable(cp)) snprintf(piece, sizeof piece, "\\x%02x", (unsigned)cp);
        else if (!yaml_printable(cp) || cp == 0x85 || cp == 0x2028 || cp == 0x2029) /* not printable, or a line break YAML would fold */
            snprintf(piece, sizeof piece, cp < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)cp);
        else snprintf(piece, sizeof piece, "%.*s", w, s + i);
        size_t m = strlen(piece);
        if (len + m + 6 > cap) {
            memcpy(out + len, "...", 3);
            len += 3;
            break;
        }
        memcpy(out + len, piece, m);
        len += m;
        i += (size_t)w;
    }
    out[len++] = '"';
    out[len] = '\0';
    return out;
}

static const char *scalar(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }
static bool is_plain(const yaml_node_t *n) { return n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE; }

static bool is_null(const yaml_node_t *n) {
    if (!is_plain(n)) return false;
    const char *s = scalar(n);
    return !s[0] || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static bool parse_real(const yaml_node_t *n, double *out) {
    if (!is_plain(n) || is_null(n)) return false;
    const char *s = scalar(n);
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end || !isfinite(x)) return false;
    *out = x;
    return true;
}

static bool parse_bool(const yaml_node_t *n, bool *out) {
    static const char *const T[] = { "true", "yes", "on" }, *const FALSE_[] = { "false", "no", "off" };
    if (!is_plain(n)) return false;
    for (int i = 0; i < 3; i++) {
        if (!strcasecmp(scalar(n), T[i])) { *out = true; return true; }
        if (!strcasecmp(scalar(n), FALSE_[i])) { *out = false; return true; }
    }
    return false;
}

/* What a node is, for "got ...": numbers and booleans as written, other scalars quoted. */
static const char *describe(const yaml_node_t *n, char *buf, size_t size) {
    if (n->type == YAML_MAPPING_NODE) return "a mapping";
    if (n->type == YAML_SEQUENCE_NODE) return "a list";
    if (is_null(n)) return "an empty value";
    double x;
    bool b;
    if ((parse_real(n, &x) || parse_bool(n, &b)) && n->data.scalar.length < size) return strcpy(buf, scalar(n));
    return quote(buf, size, scalar(n), n->data.scalar.length);
}

/* A flow mapping where a string was meant: {prompt} unquoted. */
static const char *quote_hint(const yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE && n->data.mapping.style == YAML_FLOW_MAPPING_STYLE
               ? " (a value that starts with { or [ must be quoted)" : "";
}

/* "an integer in [1, 1024]", "a number > 0", ...; without the article for the reference. */
static const char *range_text(const key *k, char *buf, size_t size, bool article) {
    bool integer = k->kind == K_INT;
    const char *what = integer ? (article ? "an integer" : "integer") : (article ? "a number" : "number");
    char lo[32], hi[32];
    snprintf(lo, sizeof lo, "%.15g", k->lo);
    snprintf(hi, sizeof hi, "%.15g", k->hi);
    if (isinf(k->lo) && isinf(k->hi)) snprintf(buf, size, "%s", what);
    else if (isinf(k->hi)) snprintf(buf, size, "%s %s %s", what, k->lo_open ? ">" : ">=", lo);
    else snprintf(buf, size, "%s in %c%s, %s%c", what, k->lo_open ? '(' : '[', lo, hi, k->hi_open ? ')' : ']');
    return buf;
}

static bool in_range(const key *k, double x) {
    return x >= k->lo && x <= k->hi && !(k->lo_open && x == k->lo) && !(k->hi_open && x == k->hi);
}

static const char *names_text(const char *const *names, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; names[i]; i++) len += (size_t)snprintf(buf + len, len < size ? size - len : 0, "%s%s", i ? ", " : "", names[i]);
    return buf;
}

/* ---- setting one key from a YAML node ---- */

static bool valid_utf8(const char *s) {
    size_t len = strlen(s), clean_len;
    char *clean = trill_utf8_sanitize(s, len, &clean_len);
    bool ok = clean && clean_len == len && !memcmp(clean, s, len);
    free(clean);
    return ok;
}

static trill_status set_string(char **field, const char *s, size_t n) {
    char *copy = trill_malloc(n + 1);
    if (!copy) return trill_error(TRILL_ERR_NOMEM, "out of memory for a config string");
    memcpy(copy, s, n);
    copy[n] = '\0';
    free(*field);
    *field = copy;
    return TRILL_OK;
}

/* The text of a string scalar ("" for an empty value); false for lists, mappings and NUL bytes. */
static bool string_value(const yaml_node_t *n, const char **s, size_t *len) {
    if (n->type != YAML_SCALAR_NODE) return false;
    *s = is_null(n) ? "" : scalar(n);
    *len = is_null(n) ? 0 : n->data.scalar.length;
    return memchr(*s, '\0', *len) == NULL;
}

static trill_status set_stops(trill_run_config *c, const key *k, yaml_document_t *doc, const yaml_node_t *v, const source *src) {
    char got[128];
    if (v->type != YAML_SEQUENCE_NODE)
        return fail(src, v, "%s: expected a list of at most %d strings, got %s%s", k->path, TRILL_RL_MAX_STOPS, describe(v, got, sizeof got),
                    quote_hint(v));
    long count = v->data.sequence.items.top - v->data.sequence.items.start;
    if (count > TRILL_RL_MAX_STOPS)
        return fail(src, v, "%s: expected at most %d stop strings, got %ld", k->path, TRILL_RL_MAX_STOPS, count);
    char *stops[TRILL_RL_MAX_STOPS] = { 0 };
    trill_status st = TRILL_OK;
    for (long i = 0; i < count && !st; i++) {
        const yaml_node_t *item = yaml_document_get_node(doc, v->data.sequence.items.start[i]);
        const char *s;
        size_t len;
        if (!string_value(item, &s, &len)) st = fail(src, item, "%s: entry %ld: expected a string, got %s", k->path, i + 1, describe(item, got, sizeof got));
        else if (len == 0) st = fail(src, item, "%s: entry %ld is empty (it would stop every sample at once)", k->path, i + 1);
        else st = set_string(&stops[i], s, len);
    }
    if (st) {
        for (long i = 0; i < count; i++) free(stops[i]);
        return st;
    }
    for (int i = 0; i < c->generator.n_stop; i++) free(c->generator.stop[i]);
    memcpy(c->generator.stop, stops, sizeof stops);
    c->generator.n_stop = (int)count;
    return TRILL_OK;
}

static trill_status set_mis(trill_run_config *c, const key *k, yaml_document_t *doc, const yaml_node_t *v, const source *src) {
    char got[128];
    bool on;
    if (parse_bool(v, &on) && !on) {
        c->correction.mis = false;
        return TRILL_OK;
    }
    double b[2];
    bool ok = v->type == YAML_SEQUENCE_NODE && v->data.sequence.items.top - v->data.sequence.items.start == 2;
    for (int i = 0; ok && i < 2; i++) ok = parse_real(yaml_document_get_node(doc, v->data.sequence.items.start[i]), &b[i]);
    if (!ok) return fail(src, v, "%s: expected [low, high] or false, got %s", k->path, describe(v, got, sizeof got));
    if (!(b[0] > 0 && b[0] < b[1]))
        return fail(src, v, "%s: expected [low, high] with 0 < low < high, got [%.17g, %.17g]", k->path, b[0], b[1]);
    c->correction.mis = true;
    c->correction.mis_low = b[0];
    c->correction.mis_high = b[1];
    return TRILL_OK;
}

/* A scalar "q, v, lm_head" or a list of names. */
static trill_status set_targets(trill_run_config *c, const key *k, yaml_document_t *doc, const yaml_node_t *v, const source *src) {
    char got[128];
    bool list = v->type == YAML_SEQUENCE_NODE;
    long count = list ? v->data.sequence.items.top - v->data.sequence.items.start : 1;
    unsigned targets = 0;
    for (long i = 0; i < count; i++) {
        const yaml_node_t *item = list ? yaml_document_get_node(doc, v->data.sequence.items.start[i]) : v;
        const char *s;
        size_t len;
        if (!string_value(item, &s, &len))
            return fail(src, item, "%s: expected module names (q, k, v, o, gate, up, down, lm_head, q_a, q_b, kv_a, kv_b, all-linear), got %s", k->path,
                        describe(item, got, sizeof got));
        for (size_t at = 0; at < len;) {
            size_t skip = strspn(s + at, ", "), n = strcspn(s + at + skip, ", ");
            at += skip;
            if (!n) break;
            char name[64];
            unsigned bits;
            snprintf(name, sizeof name, "%.*s", (int)n, s + at);
            if (n >= sizeof name || trill_lora_parse_targets(name, &bits))
                return fail(src, item, "%s: unknown module \"%.*s\" (expected q, k, v, o, gate, up, down, lm_head, q_a, q_b, kv_a, kv_b or all-linear)",
                            k->path, (int)(n < 64 ? n : 64), s + at);
            targets |= bits;
            at += n;
        }
    }
    if (!targets) return fail(src, v, "%s: expected at least one module (e.g. all-linear)", k->path);
    c->trainer.lora.targets = targets;
    return TRILL_OK;
}

/* algo.loss: a name of the loss table that trill train runs. */
static trill_status set_loss(trill_run_config *c, const key *k, const yaml_node_t *v, const source *src) {
    char got[128], want[256];
    const int l = v->type == YAML_SCALAR_NODE && strlen(scalar(v)) == v->data.scalar.length ? trill_loss_parse(scalar(v), TRILL_LOSS_IN_TRAIN) : -1;
    if (l < 0)
        return fail(src, v, "%s: expected one of %s, got %s", k->path, trill_loss_names(TRILL_LOSS_IN_TRAIN, want, sizeof want),
                    describe(v, got, sizeof got));
    *(int *)((char *)c + k->offset) = l;
    return TRILL_OK;
}

static trill_status assign(trill_run_config *c, const key *k, yaml_document_t *doc, const yaml_node_t *v, const source *src) {
    void *field = (char *)c + k->offset;
    char got[128], want[256];
    switch (k->kind) {
    case K_STRING: {
        const char *s;
        size_t len;
        if (!string_value(v, &s, &len))
            return fail(src, v, "%s: expected a string, got %s%s", k->path,
                        v->type == YAML_SCALAR_NODE ? "a string with a NUL byte" : describe(v, got, sizeof got), quote_hint(v));
        return set_string((char **)field, s, len);
    }
    case K_INT: {
        const char *s = scalar(v);
        char *end;
        errno = 0;
        long long x = is_plain(v) && !is_null(v) ? strtoll(s, &end, 10) : 0;
        if (!is_plain(v) || is_null(v) || end == s || *end || errno || x < k->lo || x > k->hi)
            return fail(src, v, "%s: expected %s, got %s", k->path, range_text(k, want, sizeof want, true), describe(v, got, sizeof got));
        if (x > INT_MAX || x < INT_MIN) /* an unbounded key still holds an int: never a silent wrap */
            return fail(src, v, "%s: %lld is past the largest value the key holds (%d)", k->path, x, INT_MAX);
        *(int *)field = (int)x;
        return TRILL_OK;
    }
    case K_SEED: {
        const char *s = scalar(v);
        char *end;
        errno = 0;
        unsigned long long x = is_plain(v) && !is_null(v) && s[0] != '-' ? strtoull(s, &end, 10) : 0;
        if (!is_plain(v) || is_null(v) || s[0] == '-' || end == s || *end || errno)
            return fail(src, v, "%s: expected an integer in [0, %" PRIu64 "], got %s", k->path, UINT64_MAX, describe(v, got, sizeof got));
        *(uint64_t *)field = x;
        return TRILL_OK;
    }
    case K_REAL: {
        double x;
        if (!parse_real(v, &x) || !in_range(k, x))
            return fail(src, v, "%s: expected %s, got %s", k->path, range_text(k, want, sizeof want, true), describe(v, got, sizeof got));
        *(double *)field = x;
        return TRILL_OK;
    }
    case K_BOOL:
        if (!parse_bool(v, (bool *)field))
            return fail(src, v, "%s: expected true or false, got %s", k->path, describe(v, got, sizeof got));
        return TRILL_OK;
    case K_ENUM:
        for (int i = 0; v->type == YAML_SCALAR_NODE && k->names[i]; i++)
            if (!strcmp(scalar(v), k->names[i]) && strlen(k->names[i]) == v->data.scalar.length) {
                *(int *)field = i;
                return TRILL_OK;
            }
        return fail(src, v, "%s: expected one of %s, got %s", k->path, names_text(k->names, want, sizeof want), describe(v, got, sizeof got));
    case K_STOPS: return set_stops(c, k, doc, v, src);
    case K_MIS: return set_mis(c, k, doc, v, src);
    case K_TARGETS: return set_targets(c, k, doc, v, src);
    case K_LOSS: return set_loss(c, k, v, src);
    }
    return trill_error(TRILL_ERR_INVALID, "%s: unhandled key kind", k->path);
}

/* ---- YAML documents ---- */

static trill_status syntax_error(const yaml_parser_t *parser, const source *src) {
    if (parser->error == YAML_MEMORY_ERROR)
        return src->override ? trill_error(TRILL_ERR_NOMEM, "override \"%s\": out of memory parsing YAML", src->override)
                             : trill_error(TRILL_ERR_NOMEM, "%s: out of memory parsing YAML", src->file);
    const char *problem = parser->problem ? parser->problem : "malformed YAML";
    char context[160] = "";
    if (parser->context && !src->override) snprintf(context, sizeof context, " (%s at line %zu)", parser->context, parser->context_mark.line + 1);
    if (parser->error == YAML_READER_ERROR) {
        if (src->override) return trill_error(TRILL_ERR_INVALID, "override \"%s\": %s at byte %zu of the value", src->override, problem,
                                              parser->problem_offset + 1);
        return trill_error(TRILL_ERR_INVALID, "%s: %s at byte %zu", src->file, problem, parser->problem_offset + 1);
    }
    if (src->override)
        return trill_error(TRILL_ERR_INVALID, "override \"%s\": YAML syntax error at column %zu of the value: %s%s", src->override,
                           parser->problem_mark.column + 1, problem, context);
    return trill_error(TRILL_ERR_INVALID, "%s:%zu:%zu: YAML syntax error: %s%s", src->file, parser->problem_mark.line + 1,
                       parser->problem_mark.column + 1, problem, context);
}

/* Parses a YAML stream of at most one document (an empty one gives a document without a root node). */
static trill_status parse_yaml(const char *text, size_t len, yaml_document_t *doc, const source *src) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return trill_error(TRILL_ERR_NOMEM, "out of memory for the YAML parser");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    trill_status st = TRILL_OK;
    if (!yaml_parser_load(&parser, doc)) {
        st = syntax_error(&parser, src);
        yaml_parser_delete(&parser);
        return st;
    }
    if (yaml_document_get_root_node(doc)) {
        yaml_document_t next;
        if (!yaml_parser_load(&parser, &next)) st = syntax_error(&parser, src);
        else {
            const yaml_node_t *extra = yaml_document_get_root_node(&next);
            if (extra) st = fail(src, extra, "expected one YAML document, found a second one");
            yaml_document_delete(&next);
        }
    }
    yaml_parser_delete(&parser);
    if (st) yaml_document_delete(doc);
    return st;
}

static trill_status load_mapping(trill_run_config *c, yaml_document_t *doc, const yaml_node_t *map, const char *prefix, const source *src) {
    char names[512], got[128];
    for (const yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        const yaml_node_t *kn = yaml_document_get_node(doc, p->key), *v = yaml_document_get_node(doc, p->value);
        if (kn->type != YAML_SCALAR_NODE)
            return fail(src, kn, "%s: expected key names, got %s as a key", section_title(prefix), describe(kn, got, sizeof got));
        const char *name = scalar(kn);
        char path[160];
        int n = snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", name);
        for (const yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            const yaml_node_t *prev = yaml_document_get_node(doc, q->key);
            if (prev->type == YAML_SCALAR_NODE && prev->data.scalar.length == kn->data.scalar.length &&
                !memcmp(scalar(prev), name, kn->data.scalar.length))
                return fail(src, kn, "duplicate key \"%s\" (first at line %zu)", path, prev->start_mark.line + 1);
        }
        bool clean = (size_t)n < sizeof path && strlen(name) == kn->data.scalar.length && !strchr(name, '.') && name[0];
        const key *k = clean ? find_key(path) : NULL;
        trill_status st;
        if (k) st = assign(c, k, doc, v, src);
        else if (clean && is_section(path)) {
            if (v->type == YAML_MAPPING_NODE) st = load_mapping(c, doc, v, path, src);
            else if (is_null(v)) st = TRILL_OK; /* a section whose keys are all commented out */
            else st = fail(src, v, "%s: expected a section (a mapping of %s), got %s", path, children(path, names, sizeof names),
                           describe(v, got, sizeof got));
        } else {
            char shown[96];
            quote(shown, sizeof shown, path, strlen(path));
            st = fail(src, kn, "unknown key %s (%s has: %s)", shown, section_title(prefix), children(prefix, names, sizeof names));
        }
        if (st) return st;
    }
    return TRILL_OK;
}

/* ---- public ---- */

trill_status trill_run_config_defaults(trill_run_config *c) {
    memset(c, 0, sizeof *c);
    const source src = { "built-in default", NULL };
    for (size_t i = 0; i < N_KEYS; i++) {
        yaml_document_t doc;
        trill_status st = parse_yaml(KEYS[i].def, strlen(KEYS[i].def), &doc, &src);
        if (!st) {
            st = assign(c, &KEYS[i], &doc, yaml_document_get_root_node(&doc), &src);
            yaml_document_delete(&doc);
        }
        if (st == TRILL_ERR_NOMEM) {
            trill_error_context("the default of %s", KEYS[i].path);
            trill_run_config_free(c);
            memset(c, 0, sizeof *c);
            return st;
        }
        /* Anything else is a mistake in KEYS, the built-in table (test_rl_config parses every
         * default): not reachable with any input, so a programmer's error. */
        if (st) {
            trill_log(TRILL_LOG_WARN, "trill: the default of %s: %s", KEYS[i].path, trill_error_message());
            abort();
        }
    }
    return TRILL_OK;
}

void trill_run_config_free(trill_run_config *c) {
    for (size_t i = 0; i < N_KEYS; i++)
        if (KEYS[i].kind == K_STRING) {
            char **s = (char **)((char *)c + KEYS[i].offset);
            free(*s);
            *s = NULL;
        }
    for (int i = 0; i < c->generator.n_stop; i++) {
        free(c->generator.stop[i]);
        c->generator.stop[i] = NULL;
    }
    c->generator.n_stop = 0;
}

trill_status trill_run_config_copy(trill_run_config *dst, const trill_run_config *src) {
    *dst = *src;
    bool ok = true;
    for (size_t i = 0; i < N_KEYS; i++)
        if (KEYS[i].kind == K_STRING) {
            char **s = (char **)((char *)dst + KEYS[i].offset);
            if (*s && !(*s = trill_strdup(*s))) ok = false;
        }
    for (int i = 0; i < src->generator.n_stop; i++)
        if (!(dst->generator.stop[i] = trill_strdup(src->generator.stop[i]))) ok = false;
    if (ok) return TRILL_OK;
    trill_run_config_free(dst); /* frees the copies made; the NULLs left by failed ones are fine */
    return trill_error(TRILL_ERR_NOMEM, "out of memory copying the run's config");
}

trill_status trill_run_config_load(trill_run_config *c, const char *path) {
    char *text;
    size_t len;
    trill_status st = trill_read_file(path, &text, &len);
    if (st) return st;
    const source src = { path, NULL };
    yaml_document_t doc;
    st = parse_yaml(text, len, &doc, &src);
    free(text);
    if (st) return st;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    char names[512], got[128];
    if (root && root->type == YAML_MAPPING_NODE) st = load_mapping(c, &doc, root, "", &src);
    else if (root && !is_null(root))
        st = fail(&src, root, "expected a mapping of keys and sections (%s), got %s", children("", names, sizeof names),
                  describe(root, got, sizeof got));
    yaml_document_delete(&doc);
    return st;
}

trill_status trill_run_config_set(trill_run_config *c, const char *assignment) {
    const source src = { NULL, assignment };
    const char *eq = strchr(assignment, '=');
    char path[160], names[512];
    if (!eq || eq == assignment) return fail(&src, NULL, "expected section.key=value");
    if ((size_t)(eq - assignment) >= sizeof path) return fail(&src, NULL, "unknown key");
    snprintf(path, sizeof path, "%.*s", (int)(eq - assignment), assignment);
    const key *k = find_key(path);
    if (!k && is_section(path))
        return fail(&src, NULL, "%s is a section; set its keys one by one (%s has: %s)", path, path, children(path, names, sizeof names));
    if (!k) {
        char prefix[160];
        snprintf(prefix, sizeof prefix, "%s", path);
        do { /* the innermost section the key would be in */
            char *dot = strrchr(prefix, '.');
            if (dot) *dot = '\0';
            else prefix[0] = '\0';
        } while (!is_section(prefix));
        return fail(&src, NULL, "unknown key \"%s\" (%s has: %s)", path, section_title(prefix), children(prefix, names, sizeof names));
    }
    const char *value = eq + 1;
    size_t len = strlen(value);
    /* A string is taken as written (shell-friendly: paths, command lines) unless it is quoted. */
    if (k->kind == K_STRING && value[0] != '"' && value[0] != '\'') {
        if (!valid_utf8(value)) return fail(&src, NULL, "%s: the value is not valid UTF-8", k->path);
        return set_string((char **)((char *)c + k->offset), value, len);
    }
    yaml_document_t doc;
    trill_status st = parse_yaml(value, len, &doc, &src);
    if (st) return st;
    yaml_node_t empty = { .type = YAML_SCALAR_NODE };
    empty.data.scalar.value = (yaml_char_t *)"";
    empty.data.scalar.style = YAML_PLAIN_SCALAR_STYLE;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    st = assign(c, k, &doc, root ? root : &empty, &src);
    yaml_document_delete(&doc);
    return st;
}

/* The shortest %g form that reads back as the same double. */
static const char *real_text(double x, char *buf, size_t size) {
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    return buf;
}

static trill_status write_string(FILE *f, const key *k, const char *s) {
    if (!s) return trill_error(TRILL_ERR_INVALID, "%s: no value (the config was not initialised with trill_run_config_defaults)", k->path);
    if (!valid_utf8(s)) return trill_error(TRILL_ERR_INVALID, "%s: the value is not valid UTF-8", k->path);
    size_t n = strlen(s);
    char *q = trill_malloc(4 * n + 8);
    if (!q) return trill_error(TRILL_ERR_NOMEM, "out of memory writing the config");
    fputs(quote(q, 4 * n + 8, s, n), f);
    free(q);
    return TRILL_OK;
}

/* The value of k in YAML flow syntax. */
static trill_status write_value(FILE *f, const trill_run_config *c, const key *k) {
    const void *field = (const char *)c + k->offset;
    char buf[64];
    switch (k->kind) {
    case K_STRING: return write_string(f, k, *(char *const *)field);
    case K_INT: fprintf(f, "%d", *(const int *)field); break;
    case K_SEED: fprintf(f, "%" PRIu64, *(const uint64_t *)field); break;
    case K_REAL: fputs(real_text(*(const double *)field, buf, sizeof buf), f); break;
    case K_BOOL: fputs(*(const bool *)field ? "true" : "false", f); break;
    case K_ENUM: {
        int v = *(const int *)field, n = 0;
        while (k->names[n]) n++;
        if (v < 0 || v >= n) return trill_error(TRILL_ERR_INVALID, "%s: value %d is not one of the %d allowed", k->path, v, n);
        fputs(k->names[v], f);
        break;
    }
    case K_STOPS:
        if (c->generator.n_stop < 0 || c->generator.n_stop > TRILL_RL_MAX_STOPS)
            return trill_error(TRILL_ERR_INVALID, "%s: %d stop strings (at most %d)", k->path, c->generator.n_stop, TRILL_RL_MAX_STOPS);
        fputc('[', f);
        for (int i = 0; i < c->generator.n_stop; i++) {
            if (i) fputs(", ", f);
            trill_status st = write_string(f, k, c->generator.stop[i]);
            if (st) return st;
        }
        fputc(']', f);
        break;
    case K_MIS:
        if (!c->correction.mis) fputs("false", f);
        else {
            fprintf(f, "[%s, ", real_text(c->correction.mis_low, buf, sizeof buf));
            fprintf(f, "%s]", real_text(c->correction.mis_high, buf, sizeof buf));
        }
        break;
    case K_TARGETS: {
        unsigned t = c->trainer.lora.targets;
        const char *sep = "";
        if (t & TRILL_LORA_ALL_LINEAR) {
            fputs("all-linear", f);
            t &= ~TRILL_LORA_ALL_LINEAR;
            sep = ",";
        }
        for (int i = 0; i < TRILL_LORA_N_TARGETS; i++)
            if (t & (1u << i)) {
                fprintf(f, "%s%s", sep, trill_lora_target_alias(i));
                sep = ",";
            }
        break;
    }
    case K_LOSS: {
        const trill_loss_info *l = trill_loss_get(*(const trill_loss *)field);
        if (!l || !(l->where & TRILL_LOSS_IN_TRAIN))
            return trill_error(TRILL_ERR_INVALID, "%s: value %d is not a loss trill train runs", k->path, *(const int *)field);
        fputs(l->name, f);
        break;
    }
    }
    return TRILL_OK;
}

/* Length of the section part of a path ("trainer.lora" of "trainer.lora.rank"; 0 at the top). */
static size_t section_len(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? (size_t)(dot - path) : 0;
}

trill_status trill_run_config_write(const trill_run_config *c, FILE *f) {
    fputs("# trill train: the resolved run configuration (defaults, then the file, then the overrides).\n"
          "# docs/config.md describes every key.\n", f);
    const char *prev = "";
    size_t prev_len = 0;
    for (size_t i = 0; i < N_KEYS; i++) {
        const char *path = KEYS[i].path;
        size_t len = section_len(path), common = 0;
        /* the sections both paths are in */
        for (size_t j = 0; j <= len && j <= prev_len; j++)
            if ((j == len || path[j] == '.') && (j == prev_len || prev[j] == '.') && !strncmp(path, prev, j)) common = j;
        int depth = 0;
        for (size_t j = 0; j < common; j++) depth += path[j] == '.';
        if (common) depth++;
        /* open the sections entered here */
        for (size_t j = common ? common + 1 : 0; j < len;) {
            size_t seg = strcspn(path + j, ".");
            if (depth == 0) fputc('\n', f);
            fprintf(f, "%*s%.*s:\n", 2 * depth, "", (int)seg, path + j);
            depth++;
            j += seg + 1;
        }
        if (!len && prev_len) fputc('\n', f); /* a top-level key after a section */
        fprintf(f, "%*s%s: ", 2 * depth, "", path + (len ? len + 1 : 0));
        trill_status st = write_value(f, c, &KEYS[i]);
        if (st) return st;
        fputc('\n', f);
        prev = path;
        prev_len = len;
    }
    if (fflush(f) || ferror(f)) return trill_error(TRILL_ERR_IO, "writing the config: %s", strerror(errno));
    return TRILL_OK;
}

trill_status trill_rl_parallel_check(const trill_run_config *c, int world_size) {
    const int64_t trainer = (int64_t)c->parallel.trainer.dp * c->parallel.trainer.ep * c->parallel.trainer.tp;
    const int gen = c->parallel.generator.replicas * c->parallel.generator.ep, scorer = c->parallel.scorer;
    const int64_t ranks = trainer + gen + scorer;
    if (ranks == world_size) return TRILL_OK;
    const char *hint = world_size == 1 ? "start it with mpirun -np N, or set them to 1 (and the executors' ranks to 0)" : "make the sum the -np count";
    if (!gen && !scorer)
        return trill_error(TRILL_ERR_INVALID, "parallel.trainer: dp %d x ep %d x tp %d = %lld trainer ranks, but the job has %d rank%s (%s)",
                           c->parallel.trainer.dp, c->parallel.trainer.ep, c->parallel.trainer.tp, (long long)trainer, world_size,
                           world_size == 1 ? "" : "s", hint);
    return trill_error(TRILL_ERR_INVALID, "parallel: trainer dp %d x ep %d x tp %d = %lld ranks + parallel.generator.replicas %d x ep %d + "
                       "parallel.scorer %d = %lld ranks, but the job has %d rank%s (%s)", c->parallel.trainer.dp, c->parallel.trainer.ep,
                       c->parallel.trainer.tp, (long long)trainer, c->parallel.generator.replicas, c->parallel.generator.ep, scorer,
                       (long long)ranks, world_size, world_size == 1 ? "" : "s", hint);
}

trill_status trill_run_config_validate(const trill_run_config *c) {
    /* every key's own range, for configs built in code */
    for (size_t i = 0; i < N_KEYS; i++) {
        const key *k = &KEYS[i];
        const void *field = (const char *)c + k->offset;
        char want[256];
        if (k->kind == K_STRING && !*(char *const *)field)
            return trill_error(TRILL_ERR_INVALID, "%s: no value (the config was not initialised with trill_run_config_defaults)", k->path);
        if (k->kind == K_INT && (*(const int *)field < k->lo || *(const int *)field > k->hi))
            return trill_error(TRILL_ERR_INVALID, "%s: expected %s, got %d", k->path, range_text(k, want, sizeof want, true), *(const int *)field);
        const trill_loss_info *loss = k->kind == K_LOSS ? trill_loss_get(*(const trill_loss *)field) : NULL;
        if (k->kind == K_LOSS && (!loss || !(loss->where & TRILL_LOSS_IN_TRAIN)))
            return trill_error(TRILL_ERR_INVALID, "%s: expected one of %s, got the value %d", k->path,
                               trill_loss_names(TRILL_LOSS_IN_TRAIN, want, sizeof want), *(const int *)field);
        int n_names = 0;
        while (k->kind == K_ENUM && k->names[n_names]) n_names++;
        if (k->kind == K_ENUM && (*(const int *)field < 0 || *(const int *)field >= n_names))
            return trill_error(TRILL_ERR_INVALID, "%s: expected one of %s, got the value %d", k->path, names_text(k->names, want, sizeof want),
                               *(const int *)field);
        double x = k->kind == K_REAL ? *(const double *)field : 0;
        if (k->kind == K_REAL && !in_range(k, x))
            return trill_error(TRILL_ERR_INVALID, "%s: expected %s, got %.17g", k->path, range_text(k, want, sizeof want, true), x);
    }
    char want[64];
    if (c->generator.n < 2)
        return trill_error(TRILL_ERR_INVALID, "generator.n: group-relative advantages need at least 2 samples per prompt, got %d",
                           c->generator.n);
    if (c->generator.n_stop < 0 || c->generator.n_stop > TRILL_RL_MAX_STOPS)
        return trill_error(TRILL_ERR_INVALID, "generator.stop: %d stop strings (at most %d)", c->generator.n_stop, TRILL_RL_MAX_STOPS);
    if (c->correction.mis && !(c->correction.mis_low > 0 && c->correction.mis_low < c->correction.mis_high))
        return trill_error(TRILL_ERR_INVALID, "correction.mis: expected [low, high] with 0 < low < high, got [%s, %.17g]",
                           real_text(c->correction.mis_low, want, sizeof want), c->correction.mis_high);
    if (c->trainer.min_lr > c->trainer.lr)
        return trill_error(TRILL_ERR_INVALID, "trainer.min_lr (%g) is above trainer.lr (%g)", c->trainer.min_lr, c->trainer.lr);
    if (c->algo.minibatches > c->generator.prompts_per_step)
        return trill_error(TRILL_ERR_INVALID, "algo.minibatches (%d) is more than generator.prompts_per_step (%d): a minibatch holds whole groups",
                           c->algo.minibatches, c->generator.prompts_per_step);
    if ((int64_t)c->generator.prompts_per_step * c->generator.n > INT_MAX) /* a batch counts its sequences in int */
        return trill_error(TRILL_ERR_INVALID, "generator.prompts_per_step (%d) x generator.n (%d): more samples per step than a batch can "
                           "hold (%d)", c->generator.prompts_per_step, c->generator.n, INT_MAX);
    if (c->env.kind[0] && strcmp(c->env.kind, "process") != 0 && !trill_rl_env_builtin(c->env.kind))
        return trill_error(TRILL_ERR_INVALID, "env.kind: \"%s\" is not an environment (expected \"\", guess or process)", c->env.kind);
    if (strcmp(c->env.kind, "process") == 0 && !c->env.command[0])
        return trill_error(TRILL_ERR_INVALID, "env.command: env.kind process needs the command line of the environment process");
    if (c->reward.verifier == TRILL_VERIFIER_NONE && !c->reward.external[0] && !c->reward.model[0] && !c->rollouts.replay[0] && !c->env.kind[0])
        return trill_error(TRILL_ERR_INVALID, "no reward: set reward.verifier, reward.external, reward.model or env.kind");
    if (c->mode == TRILL_MODE_ASYNC && c->eval.every > 0)
        return trill_error(TRILL_ERR_INVALID, "eval.every: periodic evaluation needs mode sync (async runs evaluate before and after)");
    if (c->mode == TRILL_MODE_ASYNC && c->generator.on_policy)
        return trill_error(TRILL_ERR_INVALID, "generator.on_policy: true needs mode: sync (async generation runs ahead of the trainer's weights, "
                           "so its tokens are off-policy by design: use algo.loss: aipo there)");
    if (c->mode == TRILL_MODE_ASYNC && c->rollouts.replay[0])
        return trill_error(TRILL_ERR_INVALID, "rollouts.replay: replaying recorded rollouts needs mode sync (there is no generator to overlap)");
    if (!c->trainer.lora.targets || (c->trainer.lora.targets & ~TRILL_LORA_ALL_LINEAR) >> TRILL_LORA_N_TARGETS)
        return trill_error(TRILL_ERR_INVALID, "trainer.lora.targets: expected at least one of q, k, v, o, gate, up, down, lm_head, q_a, q_b, kv_a, kv_b");
    return TRILL_OK;
}

/* ---- the reference ---- */

static const char *type_text(const key *k, char *buf, size_t size) {
    switch (k->kind) {
    case K_STRING: return "string";
    case K_SEED: return "integer >= 0";
    case K_INT:
    case K_REAL: return range_text(k, buf, size, false);
    case K_BOOL: return "bool";
    case K_ENUM: {
        size_t len = 0;
        for (int i = 0; k->names[i]; i++) len += (size_t)snprintf(buf + len, size - len, "%s`%s`", i ? ", " : "one of ", k->names[i]);
        return buf;
    }
    case K_STOPS: snprintf(buf, size, "list of at most %d strings", TRILL_RL_MAX_STOPS); return buf;
    case K_MIS: return "`[low, high]` or `false`";
    case K_TARGETS: return "module names";
    case K_LOSS: {
        size_t len = 0;
        for (int i = 0; i < TRILL_N_LOSSES; i++)
            if (trill_loss_get((trill_loss)i)->where & TRILL_LOSS_IN_TRAIN)
                len += (size_t)snprintf(buf + len, len < size ? size - len : 0, "%s`%s`", len ? ", " : "one of ", trill_loss_get((trill_loss)i)->name);
        return buf;
    }
    }
    return "";
}

/* ---- resuming ---- */

/* What a resumed run must keep: the seed every random choice is keyed by, what `trill sft` trains,
 * and the adapter's shape and scale (its moments in the optimizer are laid out by it; not
 * compared for full fine-tuning). The base model itself is checked
 * by content (the checkpoint's manifest), whatever its path. Every other key may change. */
static const char *const FIXED_ON_RESUME[] = { "seed", "sft.mode", "trainer.lora.rank", "trainer.lora.alpha", "trainer.lora.use_rslora",
                                               "trainer.lora.targets" };
#define N_FIXED (sizeof FIXED_ON_RESUME / sizeof FIXED_ON_RESUME[0])

static char *value_text(const trill_run_config *c, const key *k) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    write_value(f, c, k);
    fclose(f);
    return buf;
}

trill_status trill_run_config_check_resume(const trill_run_config *saved, const trill_run_config *now, const char *where) {
    trill_status st = TRILL_OK;
    for (size_t i = 0; i < N_FIXED && !st; i++) {
        const key *k = find_key(FIXED_ON_RESUME[i]);
        if (saved->sft.mode == TRILL_SFT_FULL && strncmp(k->path, "trainer.lora.", 13) == 0) continue; /* no adapters to match */
        char *a = value_text(saved, k), *b = value_text(now, k);
        if (!a || !b) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else if (strcmp(a, b) != 0)
            st = trill_error(TRILL_ERR_INVALID, "%s: %s is %s in the checkpoint, %s in this config; it cannot change when a run is "
                             "resumed (start a new run_dir instead)", where, k->path, a, b);
        free(a);
        free(b);
    }
    return st;
}

/* A key's row of the reference table: path, type, default, meaning (algo.loss: each loss's phrase,
 * from the loss table). */
static void write_reference_row(FILE *f, const trill_run_config *d, const key *k) {
    char type[256];
    fprintf(f, "| `%s` | %s | `", k->path, type_text(k, type, sizeof type));
    write_value(f, d, k);
    fprintf(f, "` | %s", k->doc);
    const char *sep = " ";
    for (int l = 0; k->kind == K_LOSS && l < TRILL_N_LOSSES; l++)
        if (trill_loss_get((trill_loss)l)->where & TRILL_LOSS_IN_TRAIN) {
            fprintf(f, "%s`%s`, %s", sep, trill_loss_get((trill_loss)l)->name, trill_loss_get((trill_loss)l)->doc);
            sep = "; ";
        }
    fputs(k->kind == K_LOSS ? ". |\n" : " |\n", f);
}

trill_status trill_run_config_reference(FILE *f) {
    trill_run_config d;
    trill_status st = trill_run_config_defaults(&d);
    if (st) return st;
    fputs("# `trill train` configuration reference\n"
          "\n"
          "<!-- Generated from the key table in src/rl/config/config.c by trill_run_config_reference; do not edit.\n"
          "     Regenerate: build/tests/test_rl_config --write-reference docs/config.md -->\n"
          "\n"
          "A run is described by a YAML file of sections, plus overrides on the command line:\n"
          "\n"
          "    trill train run.yaml algo.loss=gspo trainer.lr=1e-4\n"
          "\n"
          "An override is `section.key=value` with the key's dotted path; the value is YAML (`correction.mis=[0.5, 5]`,\n"
          "`generator.stop=[\"\\n\\n\", \"###\"]`), except that a string key takes the text after `=` as written unless it\n"
          "starts with a quote. Keys left out keep their defaults; unknown keys and bad values are refused with the\n"
          "file, line and key. The resolved configuration (defaults, then the file, then the overrides) is saved as\n"
          "`config.yaml` in the run folder, in this same format.\n"
          "\n"
          "A resumed run (`resume`) must keep the base model (checked by content) and these keys:",
          f);
    for (size_t i = 0; i < N_FIXED; i++) fprintf(f, "%s `%s`", i ? "," : "", FIXED_ON_RESUME[i]);
    fputs(".\nEvery other key may change when a run is resumed: `steps`, the learning rate and its schedule, the\n"
          "algorithm, the generator, evaluation, checkpointing and logging settings (a changed setting applies from\n"
          "the next step on; the result then differs from an uninterrupted run).\n"
          "\n"
          "```yaml\n"
          "model: models/Qwen3-30B-A3B\n"
          "run_dir: runs/math\n"
          "steps: 200\n"
          "data:\n"
          "  train: data/math.jsonl\n"
          "  template: chat\n"
          "generator:\n"
          "  n: 16\n"
          "  stop: [\"</answer>\"]\n"
          "algo:\n"
          "  loss: gspo\n"
          "trainer:\n"
          "  lr: 1e-4\n"
          "  lora:\n"
          "    rank: 16\n"
          "```\n",
          f);
    for (size_t s = 0; s < sizeof SECTIONS / sizeof SECTIONS[0]; s++) {
        const char *name = SECTIONS[s].name;
        size_t n = strlen(name);
        fprintf(f, "\n## %s\n\n%s\n\n| Key | Type | Default | Meaning |\n|---|---|---|---|\n", n ? name : "Top level", SECTIONS[s].doc);
        for (size_t i = 0; i < N_KEYS; i++) {
            const char *path = KEYS[i].path;
            bool in = n ? !strncmp(path, name, n) && path[n] == '.' : !strchr(path, '.');
            if (in) write_reference_row(f, &d, &KEYS[i]);
        }
    }
    trill_run_config_free(&d);
    return TRILL_OK;
}
