/* The generator: a batched inference engine with its own weight formats and kernels, separate
 * from the trainer's fp32 reference forward (trill/model.h).
 *
 * Requests (a prompt, n samples, sampling settings, stops) are submitted; each
 * trill_engine_step runs one forward over a batch made by the continuous-batching scheduler:
 * one decode row for every running sequence plus chunks of waiting prompts under a token budget
 * (chunked prefill). A prompt is prefilled once for its n samples, which then share its KV blocks
 * (reference counted, copied on write). Finished sequences are collected with everything RL
 * needs per token: the sampled id, its log-prob under the distribution it was sampled from, the
 * policy version of the weights that produced it, and optionally the routed logical experts.
 *
 * Batch invariance: a sequence's tokens, log-probs and experts do not depend on what else is in
 * the batch or how its prompt was chunked — every kernel computes a row with a fixed order of
 * operations, and sampling randomness is keyed by (seed, request, sample, position). */
#ifndef TRILL_INFER_H
#define TRILL_INFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trill/dist.h"
#include "trill/error.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/sample.h"
#include "trill/tokenizer.h"

/* Weight formats (converted from the checkpoint when the engine is made):
 *   f32  — fp32 weights and arithmetic (debugging; matches the reference forward closely)
 *   bf16 — bf16 weights, activations rounded to bf16, fp32 accumulation (AVX-512 BF16 where the
 *          CPU has it, else AVX2 FMAs on the widened values)
 *   int8 — W8A8: int8 weights with per-output-channel scales, activations quantised per token,
 *          int32 accumulation (AVX-512 VNNI, else an AVX2 sequence); router and lm_head stay bf16 */
typedef enum trill_gen_format { TRILL_GEN_F32, TRILL_GEN_BF16, TRILL_GEN_INT8 } trill_gen_format;

const char *trill_gen_format_name(trill_gen_format f);

/* The instruction set the generator's matrix kernels run on: "avx512" (with BF16 and VNNI),
 * "avx2" (with FMA) or "generic" — the best this CPU has, unless the environment variable
 * TRILL_GEN_ISA names one of those (read once per process; unset or empty: the best). AVX2 and
 * generic give bit-identical results, AVX-512 differs in bf16, so pinning it makes outputs
 * comparable across machines (tests/golden). An unknown name or an instruction set this CPU
 * lacks is TRILL_ERR_INVALID with a message (*name is then the best one), and
 * trill_engine_create refuses with the same message. */
trill_status trill_gen_isa(const char **name);
/* For benchmarks: the peak GFLOP/s of the format's matrix kernel on the instruction set in use
 * (one core's instruction throughput x the clock, as gemm.c computes it) and that instruction. */
double trill_gen_peak_gflops(trill_gen_format f, const char **instruction);
/* "f32", "bf16", "int8"; 0 on success, -1 if unknown. */
int trill_gen_format_parse(const char *name, trill_gen_format *out);

typedef struct trill_engine_config {
    trill_gen_format format;   /* default bf16 */
    int block_size;            /* KV cache tokens per block (default 16) */
    size_t kv_cache_mb;        /* KV cache size (default 256 MB; fp32 entries for f32, bf16 otherwise) ... */
    int kv_blocks;             /* ... or exactly this many blocks when > 0 */
    int max_batch_tokens;      /* rows per step: decode rows + prefill chunks (default 512) */
    int max_running;           /* sequences decoding at once (default 256) */
    bool capture_experts;      /* record routed logical experts per token (default off) */
    const trill_tokenizer *tokenizer; /* needed only for stop strings; borrowed */
    /* Expert-parallel load balancing (DeepSeek EPLB, trill/eplb.h): each MoE layer's experts get
     * physical slots (replicas of the busiest), spread over workers — the engine's threads here,
     * ranks later — re-planned from a sliding window of observed load. Results are identical
     * with it on or off; capture always records logical ids. */
    bool eplb;                 /* default off */
    int eplb_redundant;        /* extra physical slots per MoE layer (default -1: one per worker) */
    int eplb_workers;          /* default 0: the OpenMP thread count */
    int eplb_window;           /* steps of load the planner sees (default 64) */
    int eplb_interval;         /* steps between plans (default 16) */
} trill_engine_config;

trill_engine_config trill_engine_config_default(void);

typedef struct trill_request {
    uint64_t id;                /* the caller's; part of the sampling key */
    const int *prompt;          /* copied at submit */
    int prompt_len;             /* >= 1 */
    int n;                      /* samples (default 1 when 0) */
    int max_new_tokens;         /* >= 1 */
    trill_sampling sampling;
    const int *stop_ids;        /* generation ends after emitting one of these (e.g. eos) */
    int n_stop_ids;
    const char *const *stop_strings; /* ... or once the generated text contains one of these (1-256 bytes each) */
    int n_stop_strings;
    /* Teacher forcing (scoring given tokens): instead of drawing, the engine takes the given
     * tokens in order and reports for each the log-probability trill_sample would have reported
     * (trill_sample_logprob at sampling.temperature), with its routed experts when capture is on:
     * the same forward, batch-invariant, as when it was sampled. Sample k takes
     * forced[forced_at[k], forced_at[k + 1]) (forced_at [n + 1], from 0 to n_forced, every sample
     * at least one token; the samples share the prompt's prefill as sampled ones do), and
     * max_new_tokens must be the longest; forced_at NULL: n 1 and forced[0, n_forced). A sample
     * ends after its last token (stops apply as when sampling: leave them out to score all). */
    const int *forced;
    int n_forced;
    const int *forced_at;
    /* The draws are keyed by (sampling.seed, id, sample, position); with `keyed`, by `key` in
     * place of id: requests with their own ids then draw what one with id `key` would (the
     * service keys every sample by its seed alone, as `trill generate` keys its first prompt). */
    bool keyed;
    uint64_t key;
    /* The adapter its rows apply: 0 the engine's own (trill_engine_update_adapter; none until
     * one is set), k in [1, TRILL_ENGINE_ADAPTER_SLOTS) the one set in slot k
     * (trill_engine_set_adapter). */
    int adapter;
    /* Multi-turn: each sample, once finished (not aborted), stays in the engine with its KV cache
     * until trill_engine_continue gives it more tokens or trill_engine_release frees it. Not with
     * forced tokens. */
    bool hold;
} trill_request;

typedef enum trill_finish { TRILL_FINISH_LENGTH, TRILL_FINISH_STOP_ID, TRILL_FINISH_STOP_STRING, TRILL_FINISH_ABORTED } trill_finish;

/* One finished sample. The generated tokens include the stop token or the token that
 * completed a stop string (the trainer must see what was sampled). Arrays are owned. */
typedef struct trill_sequence_out {
    uint64_t request;
    int sample;
    int n_prompt, n_generated;
    int *tokens;         /* [n_prompt + n_generated] */
    float *logprobs;     /* [n_generated] log-prob of each generated token when sampled */
    uint32_t *versions;  /* [n_generated] policy version that produced it */
    uint16_t *experts;   /* capture on: [n_prompt + n_generated - 1][n_moe_layers][top_k] logical ids
                            of every token that went through a forward (the last sampled one did
                            not), MoE-layer ordinal (dense layers not counted); else NULL */
    trill_finish finish;
} trill_sequence_out;

void trill_sequence_out_free(trill_sequence_out *s);

typedef struct trill_engine trill_engine;

/* Converts m's weights into cfg->format (m may be freed afterwards). */
trill_status trill_engine_create(const trill_model *m, const trill_engine_config *cfg, trill_engine **out);
void trill_engine_free(trill_engine *e);

/* Bytes of KV cache one token takes in format f (the model family's layout: K and V per kv head
 * for Qwen3), to size kv_cache_mb; 0 when out of memory. */
size_t trill_engine_kv_bytes_per_token(const trill_config *c, trill_gen_format f);
/* Bytes of state one sequence holds whatever its length, in every format: Qwen3-Next's linear
 * layers' conv and recurrent states (fp32); 0 for a model with none. */
size_t trill_engine_state_bytes_per_sequence(const trill_config *c);

/* For benchmarks: writes every page of the KV cache once (its blocks' contents do not matter:
 * a slot is always written before it is read), so no timed step pays the pages' first touch;
 * the cache's memory is committed from then on. */
void trill_engine_touch_cache(trill_engine *e);

/* Bytes of weights in the engine's format, and of its KV cache. */
size_t trill_engine_weight_bytes(const trill_engine *e);
size_t trill_engine_kv_bytes(const trill_engine *e);

/* For benchmarks: the weight bytes one decode step reads at batch 1 (attention, dense MLPs,
 * routers, the top-k experts of each MoE layer at their average size, lm_head), and the matrix
 * FLOPs of one decoded token (2 N K per matrix used; attention over the context not counted). */
size_t trill_engine_decode_bytes(const trill_engine *e);
double trill_engine_decode_flops(const trill_engine *e);

/* The engine's per-phase profile, for benchmarks: the wall time of its steps split by what
 * ran (the master thread's clock, switched at each phase's start: phases never overlap and their
 * sum is the steps' time), and the matrix FLOPs each phase computed (2 N K a row of every
 * product, adapters included). */
typedef enum trill_gen_phase {
    TRILL_PHASE_SCHEDULE,  /* the step outside the forward: stops, updates, scheduling, EPLB */
    TRILL_PHASE_PROJECT,   /* attention's projections (q/k/v/o, QK-norm, RoPE; MLA's; Gated DeltaNet's in and out) */
    TRILL_PHASE_ATTENTION, /* attention itself: over the KV cache, MLA's absorbed, the delta rule and conv */
    TRILL_PHASE_ROUTE,     /* the router: its product, softmax or sigmoid, top-k, gates */
    TRILL_PHASE_DISPATCH,  /* (row, expert) pairs grouped per expert and gathered */
    TRILL_PHASE_EXPERTS,   /* the routed experts' products and activation (and their exchange under EP) */
    TRILL_PHASE_COMBINE,   /* each row's experts summed */
    TRILL_PHASE_MLP,       /* dense and shared MLPs */
    TRILL_PHASE_OTHER,     /* embedding, norms, residual adds, RoPE and the like */
    TRILL_PHASE_LOGITS,    /* the final norm and lm_head */
    TRILL_PHASE_SAMPLE,    /* sampling and the sequences' bookkeeping after the forward */
    TRILL_N_PHASES
} trill_gen_phase;

typedef struct trill_gen_profile {
    double seconds[TRILL_N_PHASES];
    double flops[TRILL_N_PHASES];
    double weight_bytes[TRILL_N_PHASES]; /* the matrices' bytes those products streamed (each product reads its matrix once) */
    /* attention itself, in the attention phase's time beside its products: q.k and p.v over the
     * cache (GQA, MLA's latent) for every position a row attends to, a Gated DeltaNet's recurrence
     * steps (6 dk dv a value head and row) */
    double attention_flops;
    long steps; /* steps profiled */
    long rows;  /* token rows they forwarded */
} trill_gen_profile;

/* on: zeroes the profile and times every step from now on; off: stops (the profile stays). */
trill_status trill_engine_profile(trill_engine *e, bool on);
/* The profile so far (zeros when never on). */
trill_gen_profile trill_engine_profile_get(const trill_engine *e);
/* "schedule", "project", "attention", ... */
const char *trill_gen_phase_name(trill_gen_phase p);

/* Queues a request (copied). Refused with a message when it is malformed or could never fit in
 * the KV cache (prompt + max_new_tokens for one sample). */
trill_status trill_engine_submit(trill_engine *e, const trill_request *r);

typedef struct trill_step_stats {
    int rows;          /* token rows forwarded */
    int prefill_rows;  /* of which prompt (or recomputed) tokens */
    int decode_rows;
    int preempted;     /* sequences that gave their blocks back (they recompute later) */
    int running;       /* sequences holding KV blocks after the step */
    int kv_blocks_used; /* KV cache blocks held after the step (trill_engine_config.block_size tokens each) */
    /* a model whose windowed layers attend beside full ones (gpt-oss): the blocks of the windowed
     * layers' own cache held (their positions' K/V within the window; kv_blocks_used then counts
     * the full layers' blocks) */
    int kv_window_blocks_used;
    int waiting;
} trill_step_stats;

/* One scheduler step and forward. stats may be NULL. A step that fails for want of memory
 * (TRILL_ERR_NOMEM) leaves the engine consistent: stepping it again, once memory is back,
 * produces exactly what an unfailed run would have (a weight update it was taking waits for
 * that step); freeing, aborting and collecting work as ever. */
trill_status trill_engine_step(trill_engine *e, trill_step_stats *stats);
/* True while any request is waiting or running. */
bool trill_engine_busy(const trill_engine *e);
/* Steps until every submitted request has finished. */
trill_status trill_engine_run(trill_engine *e);
/* Stops every sample of a request now: each is finished (TRILL_FINISH_ABORTED) with what it has
 * generated and its blocks are freed (held ones are freed, not reported again). A prompt still being prefilled (or waiting) has only its
 * sample 0, the others being forked from it after the prefill: that one is finished with no
 * tokens and the others are never reported. Returns the number finished, -1 when out of memory. */
int trill_engine_abort(trill_engine *e, uint64_t request);
/* Moves up to max finished sequences into out (in finishing order); returns how many. */
int trill_engine_collect(trill_engine *e, trill_sequence_out *out, int max);

/* ---- multi-turn: held samples (trill_request.hold) ----
 * Continues a held sample after it finished. prev is its output, whose arrays the engine takes
 * back (prev zeroed; on an error prev is untouched); tokens[n] (n >= 1, e.g. an environment's
 * observation, rendered) are appended to it and prefilled, the earlier tokens keeping their KV
 * (and their routed experts), then up to max_new_tokens are sampled as before. Its next output
 * has n_prompt = every token before them, logprobs and versions for the new ones only, experts
 * for every token forwarded. The draws go on from the sample's position (no key repeats across
 * turns); the request's sampling, stops and adapter stay. A held sample's blocks may be taken back
 * when the cache runs out: it then recomputes its tokens when continued (the same results).
 * Refused when prev is not a held sample of this engine, its tokens are not the ones it finished
 * with, or the longer sequence could never fit in the KV cache. */
trill_status trill_engine_continue(trill_engine *e, trill_sequence_out *prev, const int *tokens, int n, int max_new_tokens);
/* Frees held sample `sample` of `request`; false when no such sample is held. */
bool trill_engine_release(trill_engine *e, uint64_t request, int sample);
/* Held samples (a held one does not make the engine busy). */
int trill_engine_held(const trill_engine *e);

/* ---- live weight updates ----
 * An update is converted by the caller's thread, then taken whole at the start of the next step:
 * that step and the later ones run entirely on it, no step sees part of it, and every token
 * sampled records the update's `version`. Sequences in flight carry on with the new weights.
 * Safe to call from another thread while one thread steps; a newer update replaces one not yet
 * taken. *bytes (optional) receives what the update moved in the engine's format. */

/* Adapter mode: LoRA tensors for every targeted layer (attention, dense MLP, each expert,
 * lm_head), applied on the side of the base weights, y = W x + s B (A x), kept in fp32 beside
 * f32 weights and in bf16 beside bf16 and int8 ones (the model's dtype, as serving engines keep
 * LoRA; never int8); NULL removes the adapters. lora must have been made for this model's
 * architecture. *bytes: the LoRA tensors handed over (fp32). */
trill_status trill_engine_update_adapter(trill_engine *e, const trill_lora *lora, uint32_t version, size_t *bytes);
/* ---- multi-LoRA: several adapters in one step ----
 * Besides its own adapter (slot 0, the live updates above), the engine holds up to
 * TRILL_ENGINE_ADAPTER_SLOTS - 1 more, each request naming the slot its rows apply
 * (trill_request.adapter). A step's rows may use different slots: each base matrix runs once
 * over every row, and each adapter's side path over its own rows (the rows of one slot taken as
 * runs, a MoE layer's rows of an expert grouped by slot: the segmented GEMMs of Punica and
 * S-LoRA), so a sequence's tokens, log-probs and experts are those it gets alone with that
 * adapter. Sets slot k's adapter (NULL empties it), converted now: call it from the thread that
 * steps, with no unfinished request on that slot (refused otherwise). Not with expert parallelism
 * across ranks. *bytes: the adapter's resident bytes. */
enum { TRILL_ENGINE_ADAPTER_SLOTS = 64 };
trill_status trill_engine_set_adapter(trill_engine *e, int slot, const trill_lora *lora, size_t *bytes);

/* Bytes of the adapters the engine applies now, as it keeps them (0: none). */
size_t trill_engine_adapter_bytes(const trill_engine *e);
/* Merge mode: full weights (the sender folded the LoRA delta in) replace the engine's, converted
 * to its format. */
trill_status trill_engine_update_weights(trill_engine *e, const trill_model *m, uint32_t version, size_t *bytes);

/* Expert parallelism across ranks: the engines of a group (one a rank of c, each made from the
 * whole model, each with its own requests) compute every MoE layer's experts where the placement
 * puts them — with EPLB (eplb_workers must be c's size) rank q holds physical slots
 * [q P / size, (q + 1) P / size), replicas of hot experts on several ranks; without it, logical
 * experts [q E / size, (q + 1) E / size) — sending each row to its slot's rank by all-to-all-v
 * and its output back. Captured ids stay logical (recorded before any mapping), the routed
 * counts are summed over the group so every rank plans alike, and a row's result is the same
 * bits wherever it was computed. Each rank then keeps only its slots' experts' weights (the rest
 * are released; a merged update keeps the same ones), and a re-plan moves the experts a rank
 * newly holds from their previous holders. Every step is collective: step the engines together while
 * trill_engine_group_busy says so (an engine with nothing scheduled takes part with no rows).
 * c (borrowed) must outlive the engine; NULL leaves the group. */
trill_status trill_engine_set_expert_comm(trill_engine *e, trill_comm *c);
/* Bytes of expert weights this rank received when EPLB re-planned (each rank keeps only the
 * experts of its slots; trill_engine_weight_bytes counts what it keeps). */
uint64_t trill_engine_ep_moved_bytes(const trill_engine *e);
/* held[n_moe_layers][num_experts]: 1 where this rank keeps the logical expert now (what a merged
 * update must bring it); false (held untouched) outside a group. */
bool trill_engine_ep_holdings(const trill_engine *e, uint8_t *held);
/* Whether any engine of the group has work (collective over it); without a group, trill_engine_busy. */
trill_status trill_engine_group_busy(trill_engine *e, bool *busy);

/* The current expert placement when EPLB is on, else NULL. */
const struct trill_eplb_plan *trill_engine_eplb_plan(const trill_engine *e);
/* EPLB on: how unbalanced the workers are over the load window — the busiest worker's expected
 * tokens over the mean, averaged over MoE layers — for the identity placement (each worker a
 * contiguous range of logical experts, as without EPLB) and for the current plan. */
trill_status trill_engine_eplb_imbalance(const trill_engine *e, double *identity, double *planned);

/* The policy version tokens are currently generated with (0 until weights are updated). */
uint32_t trill_engine_version(const trill_engine *e);

#endif
