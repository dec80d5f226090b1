/* Kernel declarations, written once for every precision: included by trill/kernels.h (fp32)
 * and by the fp64 instantiation used in gradient checks, with REAL_T and KERNEL(name) defined.
 * Row-major throughout; `T` is a number of token rows, shapes in brackets. Backward functions
 * accumulate (+=) into gradients unless noted; a NULL gradient pointer skips that gradient.
 * Kernels parallelise internally (OpenMP); call them outside parallel regions. */

/* out[T,N] = inp[T,K] @ weight[N,K]^T  (weight is an nn.Linear weight: [out, in]) */
void KERNEL(matmul_forward)(REAL_T *out, const REAL_T *inp, const REAL_T *weight, int T, int K, int N);
/* out[T,N] += alpha * inp[T,K] @ weight[N,K]^T */
void KERNEL(matmul_accumulate)(REAL_T *out, const REAL_T *inp, const REAL_T *weight, int T, int K, int N, REAL_T alpha);
/* dinp[T,K] += dout @ weight;  dweight[N,K] += dout^T @ inp */
void KERNEL(matmul_backward)(REAL_T *dinp, REAL_T *dweight, const REAL_T *dout, const REAL_T *inp, const REAL_T *weight,
                             int T, int K, int N);

/* out[T,C] = weight[C] * inp / sqrt(mean(inp^2) + eps), per row (HF RMSNorm). out may alias inp. */
void KERNEL(rmsnorm_forward)(REAL_T *out, const REAL_T *inp, const REAL_T *weight, int T, int C, REAL_T eps);
void KERNEL(rmsnorm_backward)(REAL_T *dinp, REAL_T *dweight, const REAL_T *dout, const REAL_T *inp, const REAL_T *weight,
                              int T, int C, REAL_T eps);

/* inv_freq[hd/2] = 1 / theta^(2i/hd), in the working precision as Hugging Face computes it. */
void KERNEL(rope_inv_freq)(REAL_T *inv_freq, int head_dim, double theta);
/* Rotates x[T, n_heads, head_dim] in place at positions pos[T], HF rotate-half convention:
 * x1 = x[:hd/2], x2 = x[hd/2:]; out = (x1 cos - x2 sin, x2 cos + x1 sin). */
void KERNEL(rope_forward)(REAL_T *x, const int *pos, const REAL_T *inv_freq, int T, int n_heads, int head_dim);
/* In place: the gradient wrt the unrotated input (the inverse rotation). */
void KERNEL(rope_backward)(REAL_T *dx, const int *pos, const REAL_T *inv_freq, int T, int n_heads, int head_dim);

/* Causal grouped-query attention within each sequence of a packed batch.
 * q[T, nh*hd], k/v[T, nkv*hd], out[T, nh*hd]; sequence s spans rows [offsets[s], offsets[s+1]).
 * Query head h reads key/value head h / (nh/nkv). Scale 1/sqrt(hd). */
void KERNEL(attention_forward)(REAL_T *out, const REAL_T *q, const REAL_T *k, const REAL_T *v, const int *offsets,
                               int n_seqs, int nh, int nkv, int hd);
void KERNEL(attention_backward)(REAL_T *dq, REAL_T *dk, REAL_T *dv, const REAL_T *dout, const REAL_T *q, const REAL_T *k,
                                const REAL_T *v, const int *offsets, int n_seqs, int nh, int nkv, int hd);

/* out[n] = silu(gate) * up */
void KERNEL(swiglu_forward)(REAL_T *out, const REAL_T *gate, const REAL_T *up, size_t n);
void KERNEL(swiglu_backward)(REAL_T *dgate, REAL_T *dup, const REAL_T *dout, const REAL_T *gate, const REAL_T *up, size_t n);

/* x[n] += y */
void KERNEL(residual_forward)(REAL_T *x, const REAL_T *y, size_t n);

/* probs[T,C] = softmax(logits) per row. probs may alias logits. */
void KERNEL(softmax_forward)(REAL_T *probs, const REAL_T *logits, int T, int C);
/* Per row of probs[T,C]: the k largest entries, descending (ties: lower index first). */
void KERNEL(topk_forward)(int *idx, REAL_T *val, const REAL_T *probs, int T, int C, int k);

/* MoE gate weights of the routed experts idx[T,K] from router probabilities probs[T,E]:
 * gates = probs at idx, renormalised to sum 1 when norm_topk_prob. The ids may be the router's
 * own top-k or replayed ones; either way the gates come from these probabilities. */
void KERNEL(router_gates_forward)(REAL_T *gates, const REAL_T *probs, const int *idx, int T, int E, int K, int norm_topk_prob);
/* dlogits[T,E] += the gradient through gates and the router softmax (router logits -> probs). */
void KERNEL(router_gates_backward)(REAL_T *dlogits, const REAL_T *dgates, const REAL_T *probs, const int *idx, int T, int E,
                                   int K, int norm_topk_prob);

/* log(sum(exp(x[C]))): max-shifted terms summed in double. */
double KERNEL(logsumexp)(const REAL_T *x, int C);
/* logprob[t] = log softmax(logits[t])[targets[t]] */
void KERNEL(token_logprob_forward)(REAL_T *logprob, const REAL_T *logits, const int *targets, int T, int V);
/* dlogits[T,V] = (writes) the gradient of sum_t dlogprob[t] * logprob[t]; cross-entropy is
 * -logprob, so pass dlogprob = -dloss. */
void KERNEL(token_logprob_backward)(REAL_T *dlogits, const REAL_T *dlogprob, const REAL_T *logits, const int *targets, int T,
                                    int V);

/* out[T,C] = table[tokens[t]] */
void KERNEL(embedding_forward)(REAL_T *out, const REAL_T *table, const int *tokens, int T, int C);
void KERNEL(embedding_backward)(REAL_T *dtable, const REAL_T *dout, const int *tokens, int T, int C);
