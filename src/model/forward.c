/* Reference forward (fp32): the ground truth the trainer and the generator are checked
 * against. Simple and exact first: whole-batch GEMMs through OpenBLAS, a plain causal
 * attention loop, MoE by gathering each expert's tokens. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trill/kernels.h"
#include "trill/model.h"

/* Activations for T tokens, carved from one allocation. */
typedef struct run_state {
    float *x;      /* [T, H]   residual stream */
    float *xn;     /* [T, H]   normed input of the current block */
    float *q;      /* [T, nh*hd] */
    float *k, *v;  /* [T, nkv*hd] */
    float *att;    /* [T, nh*hd] attention output before o_proj */
    float *out;    /* [T, H]   block output (o_proj, MLP or MoE) */
    float *ff1, *ff2; /* [T, max(I, Im)] MLP gate/up (for MoE: per expert, gathered rows) */
    float *probs;  /* [T, E]   router probabilities */
    float *topw;   /* [T, k]   routing weights */
    int *topi;     /* [T, k]   routed experts */
    int *order;    /* [T*k]    (token, slot) pairs grouped by expert */
    int *count;    /* [E+1]    expert group boundaries in order */
    float *xe;     /* [T, H]   gathered rows of one expert */
    float *ye;     /* [T, H]   that expert's output */
    int *pos;      /* [T]      position within its sequence */
    void *block;
} run_state;

static trill_status run_state_alloc(run_state *rs, const trill_config *c, int T) {
    const size_t H = c->hidden_size, qd = (size_t)c->num_attention_heads * c->head_dim,
                 kvd = (size_t)c->num_key_value_heads * c->head_dim;
    size_t ff = (size_t)(c->intermediate_size > c->moe_intermediate_size ? c->intermediate_size : c->moe_intermediate_size);
    const size_t E = c->num_experts > 0 ? c->num_experts : 1, K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
    size_t floats[] = { T * H, T * H, T * qd, T * kvd, T * kvd, T * qd, T * H, T * ff, T * ff, T * E, T * K, T * H, T * H };
    size_t ints[] = { T * K, T * K, E + 1, (size_t)T };
    size_t total = 0;
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) total += floats[i];
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) total += ints[i];
    float *b = malloc((total ? total : 1) * sizeof(float));
    if (!b) return trill_error(TRILL_ERR_NOMEM, "out of memory for activations of %d tokens (%.1f GB)", T, total * 4e-9);
    rs->block = b;
    float **fp[] = { &rs->x, &rs->xn, &rs->q, &rs->k, &rs->v, &rs->att, &rs->out, &rs->ff1, &rs->ff2,
                     &rs->probs, &rs->topw, &rs->xe, &rs->ye };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) { *fp[i] = b; b += floats[i]; }
    int **ip[] = { &rs->topi, &rs->order, &rs->count, &rs->pos };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) { *ip[i] = (int *)b; b += ints[i]; }
    return TRILL_OK;
}

/* Self-attention block: x += o_proj(attn(rope(qk_norm(q, k)), v)) on xn = input_norm(x). */
static void attention_block(const trill_config *c, const trill_layer_weights *w, run_state *rs,
                            const int *offsets, int n_seqs, int T, const float *inv_freq) {
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const float eps = (float)c->rms_norm_eps;
    rmsnorm_forward(rs->xn, rs->x, w->input_norm, T, H, eps);
    matmul_forward(rs->q, rs->xn, w->wq, T, H, nh * hd);
    matmul_forward(rs->k, rs->xn, w->wk, T, H, nkv * hd);
    matmul_forward(rs->v, rs->xn, w->wv, T, H, nkv * hd);
    rmsnorm_forward(rs->q, rs->q, w->q_norm, T * nh, hd, eps);  /* per head, over head_dim */
    rmsnorm_forward(rs->k, rs->k, w->k_norm, T * nkv, hd, eps);
    rope_forward(rs->q, rs->pos, inv_freq, T, nh, hd);
    rope_forward(rs->k, rs->pos, inv_freq, T, nkv, hd);
    attention_forward(rs->att, rs->q, rs->k, rs->v, offsets, n_seqs, nh, nkv, hd);
    matmul_forward(rs->out, rs->att, w->wo, T, nh * hd, H);
    residual_forward(rs->x, rs->out, (size_t)T * H);
}

/* SwiGLU MLP of `n` rows: out = down(silu(gate(inp)) * up(inp)). */
static void mlp(float *out, const float *inp, const float *gate, const float *up, const float *down,
                float *ff1, float *ff2, int n, int H, int I) {
    matmul_forward(ff1, inp, gate, n, H, I);
    matmul_forward(ff2, inp, up, n, H, I);
    swiglu_forward(ff1, ff1, ff2, (size_t)n * I);
    matmul_forward(out, ff1, down, n, I, H);
}

/* HF Qwen3MoeSparseMoeBlock: probs = softmax(router(x)); top-k; renormalise if norm_topk_prob;
 * out = sum_k w_k * expert_k(x). Tokens are grouped by expert so each expert runs as one GEMM. */
static void moe_block(const trill_config *c, const trill_layer_weights *w, run_state *rs, int T,
                      uint16_t *experts, int ordinal) {
    const int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    matmul_forward(rs->probs, rs->xn, w->router, T, H, E);
    softmax_forward(rs->probs, rs->probs, T, E);
    topk_forward(rs->topi, rs->topw, rs->probs, T, E, K);
    router_gates_forward(rs->topw, rs->probs, rs->topi, T, E, K, c->norm_topk_prob);
    if (experts)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++)
                experts[((size_t)t * c->n_moe_layers + ordinal) * K + j] = (uint16_t)rs->topi[(size_t)t * K + j];
    /* counting sort of the (token, slot) pairs by expert; afterwards count[e] is the end
     * of expert e's group, so the group is order[count[e-1] .. count[e]) */
    memset(rs->count, 0, sizeof(int) * (E + 1));
    for (int i = 0; i < T * K; i++) rs->count[rs->topi[i] + 1]++;
    for (int e = 0; e < E; e++) rs->count[e + 1] += rs->count[e];
    for (int i = 0; i < T * K; i++) rs->order[rs->count[rs->topi[i]]++] = i;
    memset(rs->out, 0, sizeof(float) * (size_t)T * H);
    for (int e = 0; e < E; e++) {
        const int first = e ? rs->count[e - 1] : 0, n = rs->count[e] - first;
        if (n == 0) continue;
        const int *rows = rs->order + first;
        for (int r = 0; r < n; r++) memcpy(rs->xe + (size_t)r * H, rs->xn + (size_t)(rows[r] / K) * H, sizeof(float) * H);
        mlp(rs->ye, rs->xe, w->expert_gate + (size_t)e * Im * H, w->expert_up + (size_t)e * Im * H,
            w->expert_down + (size_t)e * H * Im, rs->ff1, rs->ff2, n, H, Im);
        for (int r = 0; r < n; r++) {
            float g = rs->topw[rows[r]];
            float *o = rs->out + (size_t)(rows[r] / K) * H;
            const float *y = rs->ye + (size_t)r * H;
            for (int i = 0; i < H; i++) o[i] += g * y[i];
        }
    }
}

static trill_status check_batch(const trill_config *c, const int *tokens, const int *offsets, int n_seqs) {
    if (n_seqs < 0 || (n_seqs > 0 && offsets[0] != 0))
        return trill_error(TRILL_ERR_INVALID, "batch: sequence offsets must start at 0");
    for (int s = 0; s < n_seqs; s++) {
        if (offsets[s + 1] < offsets[s])
            return trill_error(TRILL_ERR_INVALID, "batch: sequence %d has negative length", s);
        for (int t = offsets[s]; t < offsets[s + 1]; t++)
            if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
                return trill_error(TRILL_ERR_INVALID, "batch: sequence %d, position %d: token id %d is outside the vocabulary [0, %d)",
                                   s, t - offsets[s], tokens[t], c->vocab_size);
    }
    return TRILL_OK;
}

/* Runs every decoder layer and the final norm; leaves the normed hidden states in rs->xn. */
static void forward_hidden(const trill_model *m, run_state *rs, const int *tokens, const int *offsets,
                           int n_seqs, int T, uint16_t *experts) {
    const trill_config *c = &m->config;
    const int H = c->hidden_size;
    float inv_freq[c->head_dim / 2];
    rope_inv_freq(inv_freq, c->head_dim, c->rope_theta);
    for (int s = 0; s < n_seqs; s++)
        for (int t = offsets[s]; t < offsets[s + 1]; t++) rs->pos[t] = t - offsets[s];
    embedding_forward(rs->x, m->embed, tokens, T, H);

    for (int l = 0; l < c->num_hidden_layers; l++) {
        const trill_layer_weights *w = &m->layers[l];
        attention_block(c, w, rs, offsets, n_seqs, T, inv_freq);
        rmsnorm_forward(rs->xn, rs->x, w->post_norm, T, H, (float)c->rms_norm_eps);
        if (trill_config_is_moe(c, l))
            moe_block(c, w, rs, T, experts, c->moe_ordinal[l]);
        else
            mlp(rs->out, rs->xn, w->mlp_gate, w->mlp_up, w->mlp_down, rs->ff1, rs->ff2, T, H, c->intermediate_size);
        residual_forward(rs->x, rs->out, (size_t)T * H);
    }
    rmsnorm_forward(rs->xn, rs->x, m->final_norm, T, H, (float)c->rms_norm_eps);
}

trill_status trill_model_forward(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                 float *logprobs, uint16_t *experts) {
    const trill_config *c = &m->config;
    trill_status st = check_batch(c, tokens, offsets, n_seqs);
    if (st || n_seqs == 0) return st;
    const int T = offsets[n_seqs], H = c->hidden_size, V = c->vocab_size;
    if (T == 0) return TRILL_OK;
    run_state rs;
    if ((st = run_state_alloc(&rs, c, T))) return st;
    forward_hidden(m, &rs, tokens, offsets, n_seqs, T, experts);

    /* lm_head and log-softmax in chunks of rows: the full [T, V] logits would dominate memory */
    enum { CHUNK = 256 };
    float *logits = malloc(sizeof(float) * CHUNK * (size_t)V);
    if (!logits) { free(rs.block); return trill_error(TRILL_ERR_NOMEM, "out of memory for logits"); }
    for (int s = 0; s < n_seqs; s++)
        if (offsets[s + 1] > offsets[s]) logprobs[offsets[s]] = NAN;
    for (int t0 = 0; t0 < T; t0 += CHUNK) {
        int n = T - t0 < CHUNK ? T - t0 : CHUNK;
        matmul_forward(logits, rs.xn + (size_t)t0 * H, m->lm_head, n, H, V);
#pragma omp parallel for schedule(static)
        for (int r = 0; r < n; r++) {
            int t = t0 + r;
            if (t + 1 >= T || rs.pos[t + 1] == 0) continue; /* t ends its sequence */
            const float *row = logits + (size_t)r * V;
            logprobs[t + 1] = (float)((double)row[tokens[t + 1]] - logsumexp(row, V));
        }
    }
    free(logits);
    free(rs.block);
    return TRILL_OK;
}

trill_status trill_model_next_logits(const trill_model *m, const int *tokens, int n, float *logits) {
    const trill_config *c = &m->config;
    int offsets[2] = { 0, n };
    if (n < 1) return trill_error(TRILL_ERR_INVALID, "next-token logits need at least one token");
    trill_status st = check_batch(c, tokens, offsets, 1);
    if (st) return st;
    run_state rs;
    if ((st = run_state_alloc(&rs, c, n))) return st;
    forward_hidden(m, &rs, tokens, offsets, 1, n, NULL);
    matmul_forward(logits, rs.xn + (size_t)(n - 1) * c->hidden_size, m->lm_head, 1, c->hidden_size, c->vocab_size);
    free(rs.block);
    return TRILL_OK;
}
