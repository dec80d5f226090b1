/* Numeric kernels on plain fp32 arrays (llm.c style): no model knowledge.
 * Row-major throughout; `T` is a number of token rows, shapes are in brackets.
 * Kernels parallelise with OpenMP or OpenBLAS internally; call them outside
 * parallel regions. */
#ifndef TRILL_KERNELS_H
#define TRILL_KERNELS_H

#include <stddef.h>

/* out[T,N] = inp[T,K] @ weight[N,K]^T  (weight is an nn.Linear weight: [out, in]) */
void matmul_forward(float *out, const float *inp, const float *weight, int T, int K, int N);

/* out[T,C] = weight[C] * inp / sqrt(mean(inp^2) + eps), per row (HF RMSNorm). out may alias inp. */
void rmsnorm_forward(float *out, const float *inp, const float *weight, int T, int C, float eps);

/* inv_freq[hd/2] = 1 / theta^(2i/hd), in fp32 as Hugging Face computes it. */
void rope_inv_freq(float *inv_freq, int head_dim, double theta);

/* Rotates x[T, n_heads, head_dim] in place at positions pos[T], HF rotate-half convention:
 * x1 = x[:hd/2], x2 = x[hd/2:]; out = (x1 cos - x2 sin, x2 cos + x1 sin). */
void rope_forward(float *x, const int *pos, const float *inv_freq, int T, int n_heads, int head_dim);

/* Causal grouped-query attention within each sequence of a packed batch.
 * q[T, nh*hd], k/v[T, nkv*hd], out[T, nh*hd]; sequence s spans rows [offsets[s], offsets[s+1]).
 * Query head h reads key/value head h / (nh/nkv). Scale 1/sqrt(hd). */
void attention_forward(float *out, const float *q, const float *k, const float *v,
                       const int *offsets, int n_seqs, int nh, int nkv, int hd);

/* out[n] = silu(gate) * up */
void swiglu_forward(float *out, const float *gate, const float *up, size_t n);

/* x[n] += y */
void residual_forward(float *x, const float *y, size_t n);

/* probs[T,C] = softmax(logits) per row. probs may alias logits. */
void softmax_forward(float *probs, const float *logits, int T, int C);

/* Per row of probs[T,C]: the k largest entries, descending (ties: lower index first). */
void topk_forward(int *idx, float *val, const float *probs, int T, int C, int k);

/* log(sum(exp(x[C]))): max-shifted fp32 terms summed in double. */
double logsumexp(const float *x, int C);

#endif
