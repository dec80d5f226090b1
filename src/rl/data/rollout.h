/* The rollout record: what the generator hands the trainer for one batch, in flat arrays
 * (no pointers between records), one packed token stream for every sequence. A sequence is a
 * trajectory: consecutive segments of tokens the model sampled (their log-probs, versions and
 * routed experts recorded) and tokens injected from outside (the prompt; in a multi-turn episode,
 * what a tool or environment answered), never re-tokenised once in the sequence. The loss mask is
 * derived from the segments: sampled tokens are trained, injected ones are context only. A
 * single-turn rollout is two segments, the prompt and the completion. */
#ifndef TRILL_RL_ROLLOUT_H
#define TRILL_RL_ROLLOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "trill/dataset.h"
#include "trill/error.h"
#include "trill/infer.h"

enum { RL_SEG_INJECTED = 0, RL_SEG_SAMPLED = 1 };
typedef struct rl_segment {
    int32_t len;               /* tokens, > 0 */
    int32_t kind;              /* RL_SEG_INJECTED or RL_SEG_SAMPLED */
} rl_segment;

/* What became of an episode (env.kind set; rl_batch.episodes). */
enum { RL_STOP_DONE, RL_STOP_MAX_TURNS, RL_STOP_CONTEXT, RL_STOP_ENV_ERROR, RL_STOP_KINDS };
typedef struct rl_episode {
    double env_return;         /* the environment's rewards, summed over the turns */
    double env_s;              /* seconds in the environment's reset and steps */
    int32_t turns;             /* the model's turns */
    int32_t stop;              /* RL_STOP_DONE: the environment said done; MAX_TURNS: env.max_turns reached;
                                  CONTEXT: the next observation left no room for a turn (env.max_tokens);
                                  ENV_ERROR: the environment failed (env.mark_failures): not trained */
    int32_t cut_turns;         /* turns that ended at generator.max_new_tokens, not at a stop */
    int32_t tool_calls;        /* the calls parsed from its turns (env.render chat) */
    int32_t parse_errors;      /* malformed calls among them */
    int32_t reserved;
} rl_episode;

typedef struct rl_batch {
    int n_seqs, group_size;    /* n_seqs = groups * group_size, group g = sequences [g*size, (g+1)*size) */
    int n_moe_layers, top_k;
    int *offsets;              /* [n_seqs + 1] into the packed tokens */
    int *prompt_len;           /* [n_seqs] the first segment's length (the prompt) */
    int *tokens;               /* [T] prompt then response of each sequence */
    float *behav_logp;         /* [T] log mu of each response token (NAN on prompt tokens) */
    uint32_t *version;         /* [T] policy version of each response token (0 on prompt tokens) */
    uint16_t *experts;         /* [T][n_moe_layers][top_k] routed logical experts; the last token of a
                                  sequence (never forwarded by the generator) is TRILL_REPLAY_NONE */
    int *example;              /* [n_seqs] dataset index of the prompt */
    char **completion;         /* [n_seqs] response text (a final stop token not included) */
    double *reward, *adv;      /* [n_seqs] */
    double *correct;           /* [n_seqs] the verifier's score alone (NAN without one) */
    bool *keep;                /* [n_seqs] trained (dynamic sampling drops flat groups) */
    int *seg_offsets;          /* [n_seqs + 1] sequence s's segments: segs[seg_offsets[s] .. seg_offsets[s + 1]) */
    rl_segment *segs;          /* consecutive from each sequence's first token; the first is the prompt (injected) */
    uint8_t *loss_mask;        /* [T] 1 on sampled tokens: derived from segs (trill_rl_batch_derive), never packed */
    rl_episode *episodes;      /* [n_seqs] multi-turn episodes' outcomes, or NULL (no environment) */
    char **env_metrics;        /* [n_seqs] with episodes: the environment's metrics of each, summed over its turns
                                  (the JSON text of an object of numbers, "{}" without any) */
} rl_batch;

/* Generates group_size samples for each of n_prompts dataset examples, prompt i as request
 * request_ids[i] (its position in the run's prompt stream: sampling is keyed by it, not by the
 * batch or the replica that generates it).
 * between_steps (optional) runs before every engine step: where an async generator takes new
 * weights, which the engine applies at the start of its next step. */
trill_status trill_rl_generate(trill_engine *e, const trill_tokenizer *tok, const trill_dataset *d, const int *examples, int n_prompts,
                         int group_size, const uint64_t *request_ids, const trill_request *proto, int n_moe_layers, int top_k,
                         trill_status (*between_steps)(void *), void *ctx, rl_batch *out);
void trill_rl_batch_free(rl_batch *b);
/* Every array of a batch of b->n_seqs sequences (its shape set) and T tokens, zeroed; the
 * segments, loss mask and episodes are the caller's. */
trill_status trill_rl_batch_alloc(rl_batch *b, size_t T);

/* The batch of n_groups prompts generated in parts (a replica each): group g is the next group of
 * parts[part_of[g]] (each part holds its groups in ascending g), copied to place g of *out. */
trill_status trill_rl_batch_merge(const rl_batch *parts, int n_parts, const int *part_of, int n_groups, rl_batch *out);

/* The batch as one self-contained byte string (a header, then every array back to back, then
 * the completions NUL-terminated), so the same bytes can cross a thread, a pipe or an MPI
 * message; unpacking checks every size and offset and names what is wrong. */
trill_status trill_rl_batch_pack(const rl_batch *b, void **buf, size_t *len);
trill_status trill_rl_batch_unpack(const void *buf, size_t len, rl_batch *out);

/* Every sequence as two segments: its prompt (injected) and its completion (sampled, when not
 * empty); then the loss mask. */
trill_status trill_rl_batch_single_turn(rl_batch *b);
/* Checks b's segments (each sequence's cover its tokens exactly, the first is injected and as long
 * as its prompt_len, none is empty) and derives the loss mask; names the sequence that is wrong. */
trill_status trill_rl_batch_derive(rl_batch *b);
/* Whether every sequence is one prompt and one completion (the packed format 1). */
bool trill_rl_batch_is_single_turn(const rl_batch *b);

/* Whether token t (a position in the packed stream) is trained: sampled (without segments, every
 * token after its sequence's prompt). */
static inline bool rl_sampled(const rl_batch *b, int t) { return b->loss_mask ? b->loss_mask[t] != 0 : true; }

/* Response tokens of sequence s: tokens[offsets[s] + prompt_len[s] .. offsets[s + 1]) (the
 * sampled ones and, in a multi-turn trajectory, what was injected between them). */
static inline int rl_response_len(const rl_batch *b, int s) { return b->offsets[s + 1] - b->offsets[s] - b->prompt_len[s]; }

#endif
