/* Kernel declarations, written once for every precision: included by trill/kernels.h (fp32)
 * and by the fp64 instantiation used in gradient checks, with REAL_T and KERNEL(name) defined.
 * Row-major throughout; `T` is a number of token rows, shapes in brackets. Backward functions
 * accumulate (+=) into gradients unless noted; a NULL gradient pointer skips that gradient.
 * Kernels parallelise internally (OpenMP); call them outside parallel regions. Kernels that
 * can fail (out of memory for their scratch, or shapes they refuse) return a trill_status with
 * the message set; the others cannot fail. */

/* Types shared by both precisions (this file is included once per precision). */
#ifndef TRILL_KERNELS_DECL_TYPES
#define TRILL_KERNELS_DECL_TYPES
/* Which dimensions of the rotary part RoPE rotates together, for rotary dim d:
 * ROPE_ROTATE_HALF  pairs (i, i + d/2): HF rotate_half / apply_rotary_pos_emb (Llama, Qwen3);
 * ROPE_ADJACENT     pairs (2i, 2i+1): GPT-J style, what DeepSeek-V3's rope_interleave
 *                   computes. HF's apply_rotary_pos_emb_interleave first permutes the dims to
 *                   (0, 2, 4, ..., 1, 3, 5, ...) and rotates halves, so its output is this one
 *                   in that permuted order; q and k are permuted alike, so q.k is the same. */
enum rope_pairing { ROPE_ROTATE_HALF = 0, ROPE_ADJACENT = 1 };
/* The most expert groups trill_router_topk_forward takes (DeepSeek-V3 has 8, Kimi-K2 1). */
enum { ROUTER_MAX_GROUPS = 64 };
#endif

/* out[T,N] = inp[T,K] @ weight[N,K]^T  (weight is an nn.Linear weight: [out, in]) */
void KERNEL(trill_matmul_forward)(REAL_T *out, const REAL_T *inp, const REAL_T *weight, int T, int K, int N);
/* out[T,N] += alpha * inp[T,K] @ weight[N,K]^T */
void KERNEL(trill_matmul_accumulate)(REAL_T *out, const REAL_T *inp, const REAL_T *weight, int T, int K, int N, REAL_T alpha);
/* dinp[T,K] += dout @ weight;  dweight[N,K] += dout^T @ inp */
void KERNEL(trill_matmul_backward)(REAL_T *dinp, REAL_T *dweight, const REAL_T *dout, const REAL_T *inp, const REAL_T *weight,
                             int T, int K, int N);
/* The same three in a chosen precision: bf16 keeps per-thread packing buffers (2 MB) and is
 * TRILL_ERR_NOMEM (the output incomplete) when they cannot be had; fp32 never fails. */
trill_status KERNEL(trill_matmul_forward_p)(REAL_T *out, const REAL_T *inp, const REAL_T *weight, int T, int K, int N,
                                            trill_precision prec);
trill_status KERNEL(trill_matmul_accumulate_p)(REAL_T *out, const REAL_T *inp, const REAL_T *weight, int T, int K, int N, REAL_T alpha,
                                               trill_precision prec);
trill_status KERNEL(trill_matmul_backward_p)(REAL_T *dinp, REAL_T *dweight, const REAL_T *dout, const REAL_T *inp,
                                             const REAL_T *weight, int T, int K, int N, trill_precision prec);

/* out[T,C] = weight[C] * inp / sqrt(mean(inp^2) + eps), per row (HF RMSNorm). out may alias inp. */
void KERNEL(trill_rmsnorm_forward)(REAL_T *out, const REAL_T *inp, const REAL_T *weight, int T, int C, REAL_T eps);
/* dweight's per-thread partial sums are allocated: TRILL_ERR_NOMEM (nothing added) without them. */
trill_status KERNEL(trill_rmsnorm_backward)(REAL_T *dinp, REAL_T *dweight, const REAL_T *dout, const REAL_T *inp, const REAL_T *weight,
                                      int T, int C, REAL_T eps);
/* The same with the weight applied as offset + weight (a zero-centred RMSNorm: offset 1, HF
 * Qwen3NextRMSNorm's (1 + w) computed in the working precision); dweight is the gradient of w. */
void KERNEL(trill_rmsnorm_offset_forward)(REAL_T *out, const REAL_T *inp, const REAL_T *weight, REAL_T offset, int T, int C, REAL_T eps);
trill_status KERNEL(trill_rmsnorm_offset_backward)(REAL_T *dinp, REAL_T *dweight, const REAL_T *dout, const REAL_T *inp,
                                                   const REAL_T *weight, REAL_T offset, int T, int C, REAL_T eps);

/* inv_freq[hd/2] = 1 / theta^(2i/hd), in the working precision as Hugging Face computes it. */
void KERNEL(trill_rope_inv_freq)(REAL_T *inv_freq, int head_dim, double theta);
/* YaRN (HF modeling_rope_utils._compute_yarn_parameters): inv_freq[dim/2] for rotary dim `dim`,
 * blending 1/theta^(2i/dim) (extrapolation) and the same divided by `factor` (interpolation)
 * with a linear ramp between the correction dims of beta_fast and beta_slow rotations over
 * original_max_position_embeddings (floor/ceil of them when `truncate`, HF's default). Computed
 * as HF does in fp32 (the fp64 instantiation in double); theta^x is the correctly rounded
 * value, which torch's own pow can miss by an ulp. Returns HF's attention_factor, the cos/sin
 * multiplier of trill_rope_partial_forward: mscale(factor, mscale) / mscale(factor, mscale_all_dim)
 * when both are nonzero, else mscale(factor, 1) (trill_rope_yarn_mscale, trill/kernels.h); a config
 * that gives attention_factor explicitly overrides it. HF's defaults, which the caller
 * passes (HF also takes them for a 0): beta_fast 32, beta_slow 1; an absent mscale or
 * mscale_all_dim is 0. HF before v5 takes
 * factor = max_position_embeddings / original_max_position_embeddings when the config has the
 * latter: the caller passes the factor it means. */
double KERNEL(trill_rope_inv_freq_yarn)(REAL_T *inv_freq, int dim, double theta, double factor, int original_max_position_embeddings,
                                  double beta_fast, double beta_slow, double mscale, double mscale_all_dim, int truncate);
/* Rotates x[T, n_heads, head_dim] in place at positions pos[T], HF rotate-half convention:
 * x1 = x[:hd/2], x2 = x[hd/2:]; out = (x1 cos - x2 sin, x2 cos + x1 sin). */
void KERNEL(trill_rope_forward)(REAL_T *x, const int *pos, const REAL_T *inv_freq, int T, int n_heads, int head_dim);
/* In place: the gradient wrt the unrotated input (the inverse rotation). */
void KERNEL(trill_rope_backward)(REAL_T *dx, const int *pos, const REAL_T *inv_freq, int T, int n_heads, int head_dim);
/* RoPE on part of each head: x holds T rows of n_heads heads of head_stride elements each
 * (row stride n_heads * head_stride); in every head the rot_dim (even) dims from rot_offset on
 * are rotated, the others untouched (DeepSeek MLA: q heads of 192 with the rotary 64 at offset
 * 128). `pairing` is a rope_pairing; inv_freq[rot_dim/2], pair i turning by pos[t] inv_freq[i]
 * (fp32 angle, as HF). cos and sin are multiplied by cs_scale (YaRN's attention_factor) when it
 * is not 1. trill_rope_forward(x, ...) is trill_rope_partial_forward(x, ..., hd, 0, hd, ROPE_ROTATE_HALF, 1). */
void KERNEL(trill_rope_partial_forward)(REAL_T *x, const int *pos, const REAL_T *inv_freq, int T, int n_heads, int head_stride,
                                  int rot_offset, int rot_dim, int pairing, REAL_T cs_scale);
/* In place: the gradient wrt the input of trill_rope_partial_forward (cs_scale times the inverse
 * rotation: the transpose of the forward's linear map). */
void KERNEL(trill_rope_partial_backward)(REAL_T *dx, const int *pos, const REAL_T *inv_freq, int T, int n_heads, int head_stride,
                                   int rot_offset, int rot_dim, int pairing, REAL_T cs_scale);

/* Causal grouped-query attention within each sequence of a packed batch, with a query/key
 * head size hd_qk and a value head size hd_v (equal for Qwen3; 192 and 128 in DeepSeek MLA):
 * q[T, nh*hd_qk], k[T, nkv*hd_qk], v[T, nkv*hd_v], out[T, nh*hd_v]; sequence s spans rows
 * [offsets[s], offsets[s+1]). Query head h reads key/value head h / (nh/nkv).
 * out = softmax(scale q k^T, causal) v: Qwen3 passes scale 1 / sqrtf(hd) (fp32), DeepSeek
 * qk_head_dim^-0.5 times YaRN's mscale^2. Per-thread scratch: a [128-ish, longest sequence]
 * block of scores (two in the backward); TRILL_ERR_NOMEM when it cannot be had (the output
 * is then incomplete). prec: the products' precision (S = q k^T and P v, and the backward's;
 * the softmax is fp32 either way, and bf16 rounds P before P v, as flash attention does).
 * opts (NULL: plain causal attention): window > 0, a query at position t attends only to the
 * window latest positions t - window + 1 .. t (HF's sliding_window); sinks[nh], per query head a
 * logit (unscaled) that joins the softmax's denominator and nothing else (gpt-oss's attention
 * sinks: a row's probabilities then sum to less than one); the backward adds their gradients to
 * dsinks[nh] (NULL: none), summed over the sequences in order. */
typedef struct KERNEL(trill_attention_opts) {
    int window;
    const REAL_T *sinks;
    REAL_T *dsinks;
} KERNEL(trill_attention_opts);
trill_status KERNEL(trill_attention_forward)(REAL_T *out, const REAL_T *q, const REAL_T *k, const REAL_T *v, const int *offsets,
                                       int n_seqs, int nh, int nkv, int hd_qk, int hd_v, REAL_T scale, trill_precision prec,
                                       const KERNEL(trill_attention_opts) *opts);
/* dq[T, nh*hd_qk], dk[T, nkv*hd_qk], dv[T, nkv*hd_v] += the gradients given dout[T, nh*hd_v]. */
trill_status KERNEL(trill_attention_backward)(REAL_T *dq, REAL_T *dk, REAL_T *dv, const REAL_T *dout, const REAL_T *q,
                                        const REAL_T *k, const REAL_T *v, const int *offsets, int n_seqs, int nh, int nkv,
                                        int hd_qk, int hd_v, REAL_T scale, trill_precision prec,
                                        const KERNEL(trill_attention_opts) *opts);

/* out[n] = silu(gate) * up */
void KERNEL(trill_swiglu_forward)(REAL_T *out, const REAL_T *gate, const REAL_T *up, size_t n);
void KERNEL(trill_swiglu_backward)(REAL_T *dgate, REAL_T *dup, const REAL_T *dout, const REAL_T *gate, const REAL_T *up, size_t n);
/* gpt-oss's clamped SwiGLU (HF GptOssExperts): g = min(gate, limit), u = clamp(up, -limit,
 * limit), out[n] = g sigmoid(alpha g) (u + 1). The backward passes no gradient through a clamp
 * where it cut (torch.clamp's: the bounds themselves pass). */
void KERNEL(trill_swiglu_clamped_forward)(REAL_T *out, const REAL_T *gate, const REAL_T *up, size_t n, REAL_T limit, REAL_T alpha);
void KERNEL(trill_swiglu_clamped_backward)(REAL_T *dgate, REAL_T *dup, const REAL_T *dout, const REAL_T *gate, const REAL_T *up, size_t n,
                                           REAL_T limit, REAL_T alpha);

/* The gated delta rule (Gated DeltaNet, Qwen3-Next's linear attention; HF's
 * torch_recurrent_gated_delta_rule), recurrent form, per sequence s of a packed batch (rows
 * offsets[s] .. offsets[s+1]) and head h of nh: q, k [T, nh, dk] (the caller's L2-normalised
 * and scaled ones), v, out [T, nh, dv], g (log decay), beta [T, nh]; the state S [dk, dv] starts
 * at state0[s, h] (NULL: zeros) and, per step,
 *   S = exp(g_t) S;  u = beta_t (v_t - S^T k_t);  S += k_t u^T;  out_t = S^T q_t;
 * the final states go to state_out [n_seqs, nh, dk, dv] (NULL: not kept). The backward adds the
 * gradients of q, k, v, g, beta and state0 (dstate0 NULL: not wanted) given dout and
 * dstate_out (NULL: none); it keeps the state every 64 steps and recomputes the steps between
 * (TRILL_ERR_NOMEM when those cannot be had: the gradients are then incomplete). */
void KERNEL(trill_gdn_recurrent_forward)(REAL_T *out, REAL_T *state_out, const REAL_T *q, const REAL_T *k, const REAL_T *v, const REAL_T *g,
                                         const REAL_T *beta, const REAL_T *state0, const int *offsets, int n_seqs, int nh, int dk, int dv);
trill_status KERNEL(trill_gdn_recurrent_backward)(REAL_T *dq, REAL_T *dk, REAL_T *dv, REAL_T *dg, REAL_T *dbeta, REAL_T *dstate0,
                                                  const REAL_T *dout, const REAL_T *dstate_out, const REAL_T *q, const REAL_T *k,
                                                  const REAL_T *v, const REAL_T *g, const REAL_T *beta, const REAL_T *state0,
                                                  const int *offsets, int n_seqs, int nh, int dk_, int dv_);

/* The same, the state of each sequence in place: states[s] [nh, dk, dv] holds its state before and
 * after (a generator's per-sequence state). */
void KERNEL(trill_gdn_recurrent_forward_states)(REAL_T *out, const REAL_T *q, const REAL_T *k, const REAL_T *v, const REAL_T *g,
                                                const REAL_T *beta, REAL_T *const *states, const int *offsets, int n_seqs, int nh, int dk, int dv);

/* The same rule and its backward computed chunk by chunk (64 positions; the WY form of HF's
 * torch_chunk_gated_delta_rule: within a chunk GEMMs and a triangular solve, the state crossing
 * chunks once): equal to the recurrent form up to rounding, with the same arguments. The
 * backward keeps the state before each chunk. TRILL_ERR_NOMEM (results incomplete) without
 * their per-thread scratch. */
trill_status KERNEL(trill_gdn_chunked_forward)(REAL_T *out, REAL_T *state_out, const REAL_T *q, const REAL_T *k, const REAL_T *v,
                                               const REAL_T *g, const REAL_T *beta, const REAL_T *state0, const int *offsets, int n_seqs,
                                               int nh, int dk, int dv);
trill_status KERNEL(trill_gdn_chunked_backward)(REAL_T *dq, REAL_T *dk, REAL_T *dv, REAL_T *dg, REAL_T *dbeta, REAL_T *dstate0,
                                                const REAL_T *dout, const REAL_T *dstate_out, const REAL_T *q, const REAL_T *k,
                                                const REAL_T *v, const REAL_T *g, const REAL_T *beta, const REAL_T *state0,
                                                const int *offsets, int n_seqs, int nh, int dk_, int dv_);

/* The Gated DeltaNet layer's other operations (HF modeling_qwen3_next.py):
 * - the depthwise causal conv1d with SiLU over each sequence of a packed batch: x, out [T, C],
 *   w [C, K] (conv1d.weight [C, 1, K]), out[t, c] = silu(sum_j w[c, j] x[t + j - (K - 1), c]),
 *   positions before the sequence from state0 [n_seqs, C, K - 1] (the inputs before it, oldest
 *   first; NULL: zeros); state_out (NULL: not kept) gets the last K - 1 inputs. The backward
 *   adds dx, dw (NULL: not wanted) and dstate0 (NULL: not wanted) given dout (the final state's
 *   gradient, when a loss reads it, is the caller's: it copies inputs);
 * - l2norm (q and k): out = x / sqrt(|x|^2 + eps) per row of C;
 * - the gated RMSNorm (Qwen3NextRMSNormGated): out = w x / sqrt(mean(x^2) + eps) * silu(z) per
 *   row of C; its backward's dw partial sums are per thread (TRILL_ERR_NOMEM, nothing added,
 *   without them). */
void KERNEL(trill_conv1d_causal_forward)(REAL_T *out, REAL_T *state_out, const REAL_T *x, const REAL_T *w, const REAL_T *state0,
                                         const int *offsets, int n_seqs, int C, int K);
/* trill_conv1d_causal_forward with each sequence's state in place: states[s] [C, K - 1] holds the
 * inputs before the sequence (oldest first) and afterwards its last K - 1 (every sequence at least
 * one position long). */
void KERNEL(trill_conv1d_causal_forward_states)(REAL_T *out, const REAL_T *x, const REAL_T *w, REAL_T *const *states, const int *offsets,
                                                int n_seqs, int C, int K);
void KERNEL(trill_conv1d_causal_backward)(REAL_T *dx, REAL_T *dw, REAL_T *dstate0, const REAL_T *dout, const REAL_T *x, const REAL_T *w,
                                          const REAL_T *state0, const int *offsets, int n_seqs, int C, int K);
void KERNEL(trill_l2norm_forward)(REAL_T *out, const REAL_T *x, int T, int C, REAL_T eps);
void KERNEL(trill_l2norm_backward)(REAL_T *dx, const REAL_T *dout, const REAL_T *x, int T, int C, REAL_T eps);
void KERNEL(trill_rmsnorm_gated_forward)(REAL_T *out, const REAL_T *x, const REAL_T *z, const REAL_T *w, int T, int C, REAL_T eps);
trill_status KERNEL(trill_rmsnorm_gated_backward)(REAL_T *dx, REAL_T *dz, REAL_T *dw, const REAL_T *dout, const REAL_T *x, const REAL_T *z,
                                                  const REAL_T *w, int T, int C, REAL_T eps);

/* out[n] = 1 / (1 + exp(-inp)) (DeepSeek-V3's router scores). out may alias inp. */
void KERNEL(trill_sigmoid_forward)(REAL_T *out, const REAL_T *inp, size_t n);

/* x[n] += y */
void KERNEL(trill_residual_forward)(REAL_T *x, const REAL_T *y, size_t n);

/* probs[T,C] = softmax(logits) per row. probs may alias logits. */
void KERNEL(trill_softmax_forward)(REAL_T *probs, const REAL_T *logits, int T, int C);
/* Per row of probs[T,C]: the k largest entries, descending (ties: lower index first). */
void KERNEL(trill_topk_forward)(int *idx, REAL_T *val, const REAL_T *probs, int T, int C, int k);

/* MoE router, in pieces. Scores are trill_softmax_forward (Qwen3) or trill_sigmoid_forward (DeepSeek-V3)
 * of the router logits [T,E]; trill_router_topk_forward chooses the experts; trill_router_gates_forward
 * makes the gate weights from the scores at the chosen ids. Backward: trill_router_gates_backward
 * (gates -> the scores at the ids), then trill_router_softmax_backward or trill_router_sigmoid_backward
 * (-> logits). The choice itself (and a selection bias) is not differentiated. */

/* Expert choice per row of scores[T,E] (DeepSeek-V3 get_topk_indices): the selection score of
 * expert e is scores[e] + bias[e] (bias[E] may be NULL: DeepSeek's e_score_correction_bias
 * affects the choice only). n_group <= 1: no groups. With n_group > 1 the E experts form n_group groups of E/n_group
 * (at least 2) consecutive ids; a group's score is the sum of its two best selection scores;
 * only the topk_group best groups are eligible, the others masked out entirely (-inf, as
 * DeepSeek's reference code and vLLM; HF fills masked scores with 0.0 instead, which chooses
 * the same experts whenever the K-th best eligible selection score is positive, e.g. sigmoid
 * scores and a non-negative bias). Then idx[T,K] = the K best eligible experts,
 * val[T,K] their selection scores, descending. Ties, among groups and experts: lower index
 * first (as trill_topk_forward, which this equals for bias NULL and n_group <= 1).
 * TRILL_ERR_INVALID for shapes it cannot choose from: 1 <= K <= E; when n_group > 1, E
 * divisible by n_group <= ROUTER_MAX_GROUPS, 1 <= topk_group <= n_group and
 * K <= topk_group * E / n_group. */
trill_status KERNEL(trill_router_topk_forward)(int *idx, REAL_T *val, const REAL_T *scores, const REAL_T *bias, int T, int E, int K,
                                         int n_group, int topk_group);
/* Gate weights of the routed experts idx[T,K] from scores[T,E]: gates = the scores at idx,
 * divided by (their sum + norm_eps) when norm_topk_prob, then multiplied by `scaling` (when
 * not 1). Qwen3: norm_eps 0, scaling 1; DeepSeek-V3: norm_eps 1e-20, scaling
 * routed_scaling_factor. The ids may be the router's own top-k or replayed ones; either way
 * the gates come from these scores. */
void KERNEL(trill_router_gates_forward)(REAL_T *gates, const REAL_T *scores, const int *idx, int T, int E, int K, int norm_topk_prob,
                                  REAL_T norm_eps, REAL_T scaling);
/* dsel[T,K] = (writes) the gradient wrt scores[t, idx[t,j]] through trill_router_gates_forward,
 * given dgates[T,K] (the other scores get none). dsel may alias dgates. */
void KERNEL(trill_router_gates_backward)(REAL_T *dsel, const REAL_T *dgates, const REAL_T *scores, const int *idx, int T, int E,
                                   int K, int norm_topk_prob, REAL_T norm_eps, REAL_T scaling);
/* dlogits[T,E] += the gradient through probs = softmax(logits) of a gradient dsel[T,K] that
 * sits at the ids idx[T,K] only (zero elsewhere). */
void KERNEL(trill_router_softmax_backward)(REAL_T *dlogits, const REAL_T *dsel, const REAL_T *probs, const int *idx, int T, int E,
                                     int K);
/* dlogits[T,E] += the gradient through scores = sigmoid(logits), at the ids idx[T,K]. */
void KERNEL(trill_router_sigmoid_backward)(REAL_T *dlogits, const REAL_T *dsel, const REAL_T *scores, const int *idx, int T, int E,
                                     int K);

/* log(sum(exp(x[C]))): max-shifted terms summed in double. */
double KERNEL(trill_logsumexp)(const REAL_T *x, int C);
/* logprob[t] = log softmax(logits[t])[targets[t]] */
void KERNEL(trill_token_logprob_forward)(REAL_T *logprob, const REAL_T *logits, const int *targets, int T, int V);
/* dlogits[T,V] = (writes) the gradient of sum_t dlogprob[t] * logprob[t]; cross-entropy is
 * -logprob, so pass dlogprob = -dloss. */
void KERNEL(trill_token_logprob_backward)(REAL_T *dlogits, const REAL_T *dlogprob, const REAL_T *logits, const int *targets, int T,
                                    int V);

/* out[T,C] = table[tokens[t]] */
void KERNEL(trill_embedding_forward)(REAL_T *out, const REAL_T *table, const int *tokens, int T, int C);
void KERNEL(trill_embedding_backward)(REAL_T *dtable, const REAL_T *dout, const int *tokens, int T, int C);
