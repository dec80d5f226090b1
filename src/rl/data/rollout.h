/* The rollout record: what the generator hands the trainer for one batch, in flat arrays
 * (no pointers between records), one packed token stream for every sequence. */
#ifndef TRILL_RL_ROLLOUT_H
#define TRILL_RL_ROLLOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "trill/dataset.h"
#include "trill/error.h"
#include "trill/infer.h"

typedef struct rl_batch {
    int n_seqs, group_size;    /* n_seqs = groups * group_size, group g = sequences [g*size, (g+1)*size) */
    int n_moe_layers, top_k;
    int *offsets;              /* [n_seqs + 1] into the packed tokens */
    int *prompt_len;           /* [n_seqs] */
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

/* The batch of n_groups prompts generated in parts (a replica each): group g is the next group of
 * parts[part_of[g]] (each part holds its groups in ascending g), copied to place g of *out. */
trill_status trill_rl_batch_merge(const rl_batch *parts, int n_parts, const int *part_of, int n_groups, rl_batch *out);

/* The batch as one self-contained byte string (a header, then every array back to back, then
 * the completions NUL-terminated), so the same bytes can cross a thread, a pipe or an MPI
 * message; unpacking checks every size and offset and names what is wrong. */
trill_status trill_rl_batch_pack(const rl_batch *b, void **buf, size_t *len);
trill_status trill_rl_batch_unpack(const void *buf, size_t len, rl_batch *out);

/* Response tokens of sequence s: tokens[offsets[s] + prompt_len[s] .. offsets[s + 1]). */
static inline int rl_response_len(const rl_batch *b, int s) { return b->offsets[s + 1] - b->offsets[s] - b->prompt_len[s]; }

#endif
