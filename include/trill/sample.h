/* The generator's token sampler: one token from one row of logits.
 *
 * The pipeline is Hugging Face transformers' warper order:
 *   temperature → top-k → top-p → min-p → draw.
 * Each filter sees the distribution left by the one before it, renormalised (that is what
 * masking logits to -inf and taking the softmax again does in HF). The order matters only for
 * top-p: it measures mass after top-k, and before min-p. vLLM V1 applies min-p before top-k and
 * top-p, so with both top-p and min-p set its kept set can be smaller than ours.
 *
 * Results are exactly reproducible: the random number is a pure function of
 * (seed, request, sample, position) (trill/rng.h), every reduction has a fixed order in double,
 * and nothing depends on the other rows of a batch, on threads or on earlier calls. */
#ifndef TRILL_SAMPLE_H
#define TRILL_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "trill/error.h"

typedef struct trill_sampling {
    float temperature; /* logits are divided by it; 0 = greedy (argmax, ties → lowest id). Default 1 */
    int top_k;         /* keep the top_k most likely tokens, and any tied with the top_k-th
                        * (as HF and vLLM: a threshold on the value); 0 or >= V = off. Default 0 */
    float top_p;       /* keep the smallest set of most likely tokens whose probability mass
                        * is >= top_p (a token is kept while the mass ranked above it is
                        * < top_p, so at least one); 1 = off. Default 1 */
    float min_p;       /* drop tokens with p < min_p * p_max; 0 = off. Default 0 */
    uint64_t seed;
} trill_sampling;

/* temperature 1, top_k 0, top_p 1, min_p 0, seed 0: plain sampling from softmax(logits). */
trill_sampling trill_sampling_default(void);

/* TRILL_OK, or TRILL_ERR_INVALID with a message naming the field and its allowed range:
 * temperature finite and >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1). */
trill_status trill_sampling_check(const trill_sampling *s);

/* Bytes of workspace trill_sample needs for a vocabulary of V (about 24 V + 8 KiB). */
size_t trill_sample_scratch_size(int V);

/* Samples one token from logits[V] and returns its id, or -1 when no logit is a number above
 * -inf (nothing can be sampled; *logprob is then -inf).
 *
 * s must pass trill_sampling_check (asserted). The uniform draw is
 *   u = trill_rng_uniform(trill_rng_key(trill_rng_key(seed, request), sample), position),
 * so a request's tokens do not depend on what else is in the batch, and the samples of one
 * request (sample = 0, 1, ... for n > 1 completions of a prompt) are independent streams.
 *
 * Logit values: -inf masks a token; NaN is treated as -inf (a corrupt logit is never
 * sampled); +inf means "certain": the +inf tokens share all the probability equally (the limit
 * of softmax, computed by reading +inf as FLT_MAX). A token more than 87 T below the maximum
 * has probability 0 (below e^-87 ~ 1.6e-38 of the maximum's weight, where the fp32 exp stops).
 *
 * *logprob (may be NULL) receives log p(token) under the distribution the token was drawn
 * from BEFORE truncation: log_softmax(logits / temperature)[token] computed in double
 * (greedy: temperature taken as 1, i.e. the model's own log-probability). This is the
 * behaviour log-probability RL importance ratios compare against the trainer's
 * log_softmax(logits / T), which knows nothing of top-k/top-p/min-p. It is neither of vLLM's
 * conventions: "raw_logprobs" (its default) is log_softmax(logits) without the temperature,
 * "processed_logprobs" is taken after top-k/top-p, renormalised over the kept tokens.
 *
 * The filters rank tokens by probability, ties → lower id. The draw is by inverse CDF over the
 * kept tokens in id order, with sums in double over fixed blocks of tokens.
 *
 * Cost: O(V), one vectorised exp per token; no sort of the vocabulary. Top-k is one pass with
 * a rising threshold and a quickselect; top-p without top-k finds the bucket holding its cut
 * in a histogram of the probabilities (16 buckets an octave) and sorts only that bucket.
 *
 * scratch: trill_sample_scratch_size(V) bytes, aligned as malloc's, reused across calls so
 * nothing is allocated per token; its contents on entry do not matter. Thread-safe: no global
 * state (each thread passes its own scratch). */
int trill_sample(const float *logits, int V, const trill_sampling *s, uint64_t request, uint32_t sample,
                 uint32_t position, void *scratch, float *logprob);

/* The log-probability trill_sample reports for `token` at this temperature (the same arithmetic,
 * bit for bit), without drawing: for scoring given tokens (teacher forcing). -inf when no logit
 * is a number above -inf. scratch as trill_sample's. */
float trill_sample_logprob(const float *logits, int V, float temperature, int token, void *scratch);

#endif
