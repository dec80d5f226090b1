/* The forward pass (fp32): the reference the generator is checked against, and the first half
 * of training. One code path for both; training keeps every layer's activations for
 * src/train/backward.c. Simple and exact first: whole-batch GEMMs through OpenBLAS, a plain
 * causal attention loop, MoE by grouping each expert's tokens into one GEMM. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward_internal.h"
#include "trill/kernels.h"

/* ---- activation plan: one allocation, carved in two passes (measure, then assign) ---- */

typedef struct plan { char *base; size_t used; } plan;

static void *take(plan *p, size_t bytes) {
    void *at = p->base ? p->base + p->used : NULL;
    p->used += (bytes + 63) & ~(size_t)63; /* 64-byte aligned slices */
    return at;
}

static void assign(trill_forward_pass *fp, plan *p) {
    const trill_config *c = &fp->m->config;
    const size_t T = (size_t)fp->T, H = c->hidden_size, L = c->num_hidden_layers;
    const size_t qd = (size_t)c->num_attention_heads * c->head_dim, kvd = (size_t)c->num_key_value_heads * c->head_dim;
    const size_t E = c->num_experts > 0 ? c->num_experts : 1, K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
    const size_t I = c->intermediate_size, Im = c->moe_intermediate_size, ff = I > Im * K ? I : Im * K;
    const size_t F = sizeof(float);
    fp->layers = take(p, L * sizeof(layer_acts));
    for (size_t l = 0; l < L; l++) {
        if ((!fp->training || fp->recompute) && l > 0) { /* every layer reuses layer 0's buffers ... */
            float *x_in = fp->recompute ? take(p, T * H * F) : NULL; /* ... but recomputation keeps each input */
            if (fp->layers) {
                fp->layers[l] = fp->layers[0];
                if (fp->recompute) fp->layers[l].x_in = x_in;
            }
            continue;
        }
        layer_acts a = {
            .x_in = take(p, T * H * F), .xn1 = take(p, T * H * F), .q_raw = take(p, T * qd * F), .k_raw = take(p, T * kvd * F),
            .q = take(p, T * qd * F), .k = take(p, T * kvd * F), .v = take(p, T * kvd * F), .att = take(p, T * qd * F),
            .x_mid = take(p, T * H * F), .xn2 = take(p, T * H * F),
        };
        const bool moe = trill_config_is_moe(c, (int)l), shared = !fp->training || fp->recompute;
        if (shared || !moe) { a.gate = take(p, T * ff * F); a.up = take(p, T * ff * F); }
        else { a.gate = take(p, T * K * Im * F); a.up = take(p, T * K * Im * F); }
        if (shared || moe) {
            a.ye = take(p, T * K * H * F);
            a.probs = take(p, T * E * F);
            a.topw = take(p, T * K * F);
            a.topi = take(p, T * K * sizeof(int));
            a.order = take(p, T * K * sizeof(int));
            a.count = take(p, (E + 1) * sizeof(int));
        }
        if (fp->lora)
            for (int x = 0; x < XA_N; x++) a.xa[x] = take(p, T * K * (size_t)fp->lora->config.rank * F);
        if (fp->layers) fp->layers[l] = a;
    }
    /* inference: the residual stream is updated in place, so every x_in/x_mid is one buffer */
    if (!fp->training && fp->layers)
        for (size_t l = 0; l < L; l++) fp->layers[l].x_mid = fp->layers[l].x_in = fp->layers[0].x_in;
    fp->x_final = fp->training ? take(p, T * H * F) : (fp->layers ? fp->layers[0].x_in : NULL);
    fp->xf = take(p, T * H * F);
    fp->out = take(p, T * H * F);
    fp->act = take(p, T * ff * F);
    fp->xe = take(p, T * H * F);
    fp->pos = take(p, T * sizeof(int));
    fp->inv_freq = take(p, (size_t)c->head_dim / 2 * F);
    if (fp->lora) fp->xa_head = take(p, (size_t)LOGIT_CHUNK * fp->lora->config.rank * F);
}

static trill_status pass_alloc(const trill_model *m, int T, bool training, bool recompute, trill_forward_pass **out) {
    trill_forward_pass *fp = calloc(1, sizeof *fp);
    if (!fp) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    *fp = (trill_forward_pass){ .m = m, .T = T, .training = training, .recompute = training && recompute,
                                .lora = m->lora && m->lora->enabled ? m->lora : NULL };
    plan p = { 0 };
    assign(fp, &p);
    if (!(p.base = fp->block = malloc(p.used))) {
        free(fp);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for the activations of %d tokens (%.2f GB)", T, p.used * 1e-9);
    }
    p.used = 0;
    assign(fp, &p);
    *out = fp;
    return TRILL_OK;
}

void trill_forward_pass_free(trill_forward_pass *fp) {
    if (!fp) return;
    free(fp->block);
    free(fp);
}

/* ---- layers ---- */

/* out[n, N] = inp W^T, plus scale (inp A^T) B^T when the module has an adapter in use; the
 * LoRA input inp A^T is kept in xa for the backward pass. */
static void linear(const trill_forward_pass *fp, float *out, const float *inp, trill_weight W, trill_lora_pair ad, float *xa,
                   int n, int K, int N) {
    matmul_forward_w(out, inp, W, n, K, N);
    if (!fp->lora || !ad.A) return;
    const int r = fp->lora->config.rank;
    matmul_forward(xa, inp, ad.A, n, K, r);
    matmul_accumulate(out, xa, ad.B, n, r, N, fp->lora->scale);
}

static const trill_lora_layer NO_ADAPTERS;

static const trill_lora_layer *adapters(const trill_forward_pass *fp, int l) {
    return fp->lora ? &fp->lora->layers[l] : &NO_ADAPTERS;
}

/* x_mid = x_in + o_proj(attn(rope(qk_norm(q, k)), v)), on xn1 = input_norm(x_in). Fails only
 * when the attention kernel's scratch cannot be allocated. */
static trill_status attention_block(const trill_forward_pass *fp, const trill_layer_weights *w, const trill_lora_layer *ad, layer_acts *a) {
    const trill_config *c = &fp->m->config;
    const int T = fp->T, H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const float eps = (float)c->rms_norm_eps;
    rmsnorm_forward(a->xn1, a->x_in, w->input_norm, T, H, eps);
    linear(fp, a->q_raw, a->xn1, w->wq, ad->q, a->xa[XA_Q], T, H, nh * hd);
    linear(fp, a->k_raw, a->xn1, w->wk, ad->k, a->xa[XA_K], T, H, nkv * hd);
    linear(fp, a->v, a->xn1, w->wv, ad->v, a->xa[XA_V], T, H, nkv * hd);
    rmsnorm_forward(a->q, a->q_raw, w->q_norm, T * nh, hd, eps); /* per head, over head_dim */
    rmsnorm_forward(a->k, a->k_raw, w->k_norm, T * nkv, hd, eps);
    rope_forward(a->q, fp->pos, fp->inv_freq, T, nh, hd);
    rope_forward(a->k, fp->pos, fp->inv_freq, T, nkv, hd);
    trill_status st = attention_forward(a->att, a->q, a->k, a->v, fp->offsets, fp->n_seqs, nh, nkv, hd, hd, 1 / sqrtf((float)hd));
    if (st) return st;
    linear(fp, fp->out, a->att, w->wo, ad->o, a->xa[XA_O], T, nh * hd, H);
    if (a->x_mid != a->x_in) memcpy(a->x_mid, a->x_in, sizeof(float) * (size_t)T * H);
    residual_forward(a->x_mid, fp->out, (size_t)T * H);
    return TRILL_OK;
}

/* SwiGLU MLP of n rows: out = down(silu(gate(inp)) * up(inp)); keeps gate/up pre-activations
 * (and the adapters' inputs in xa[XA_GATE..XA_DOWN], from row `row0`). */
static void mlp(const trill_forward_pass *fp, float *out, const float *inp, trill_weight wg, trill_weight wu, trill_weight wd,
                trill_lora_pair ag, trill_lora_pair au, trill_lora_pair adn, float *const *xa, size_t row0, float *gate, float *up,
                int n, int H, int I) {
    const size_t at = fp->lora ? row0 * (size_t)fp->lora->config.rank : 0;
    linear(fp, gate, inp, wg, ag, fp->lora ? xa[XA_GATE] + at : NULL, n, H, I);
    linear(fp, up, inp, wu, au, fp->lora ? xa[XA_UP] + at : NULL, n, H, I);
    swiglu_forward(fp->act, gate, up, (size_t)n * I);
    linear(fp, out, fp->act, wd, adn, fp->lora ? xa[XA_DOWN] + at : NULL, n, I, H);
}

/* HF Qwen3MoeSparseMoeBlock: probs = softmax(router(x)); the top-k experts (or the replayed
 * ids); gate weights = probs at those ids, renormalised if norm_topk_prob;
 * out = sum_k w_k * expert_k(x). Each expert's tokens are grouped into one GEMM. */
static void moe_block(const trill_forward_pass *fp, const trill_layer_weights *w, const trill_lora_layer *ad, layer_acts *a,
                      int ordinal, const uint16_t *replay, uint16_t *experts) {
    const trill_config *c = &fp->m->config;
    const int T = fp->T, H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    const int L = c->n_moe_layers;
    matmul_forward_w(a->probs, a->xn2, w->router, T, H, E);
    softmax_forward(a->probs, a->probs, T, E);
    topk_forward(a->topi, a->topw, a->probs, T, E, K);
    if (replay)
        for (int t = 0; t < T; t++) {
            const uint16_t *ids = replay + ((size_t)t * L + ordinal) * K;
            if (ids[0] == TRILL_REPLAY_NONE) continue; /* this token routes itself */
            for (int j = 0; j < K; j++) a->topi[t * K + j] = ids[j];
        }
    router_gates_forward(a->topw, a->probs, a->topi, T, E, K, c->norm_topk_prob, 0.0f, 1.0f);
    if (experts)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < K; j++) experts[((size_t)t * L + ordinal) * K + j] = (uint16_t)a->topi[t * K + j];
    /* counting sort of the (token, slot) pairs by expert; afterwards count[e] is the end
     * of expert e's group, so the group is order[count[e-1] .. count[e]) */
    memset(a->count, 0, sizeof(int) * (E + 1));
    for (int i = 0; i < T * K; i++) a->count[a->topi[i] + 1]++;
    for (int e = 0; e < E; e++) a->count[e + 1] += a->count[e];
    for (int i = 0; i < T * K; i++) a->order[a->count[a->topi[i]]++] = i;
    memset(fp->out, 0, sizeof(float) * (size_t)T * H);
    for (int e = 0; e < E; e++) {
        const int first = e ? a->count[e - 1] : 0, n = a->count[e] - first;
        if (n == 0) continue;
        const int *rows = a->order + first;
        for (int r = 0; r < n; r++) memcpy(fp->xe + (size_t)r * H, a->xn2 + (size_t)(rows[r] / K) * H, sizeof(float) * H);
        float *ye = a->ye + (size_t)first * H;
        const trill_lora_pair none = { 0 };
        mlp(fp, ye, fp->xe, trill_weight_at(w->expert_gate, (size_t)e * Im * H), trill_weight_at(w->expert_up, (size_t)e * Im * H),
            trill_weight_at(w->expert_down, (size_t)e * H * Im), ad->expert_gate ? ad->expert_gate[e] : none,
            ad->expert_up ? ad->expert_up[e] : none, ad->expert_down ? ad->expert_down[e] : none, a->xa, (size_t)first,
            a->gate + (size_t)first * Im, a->up + (size_t)first * Im, n, H, Im);
        for (int r = 0; r < n; r++) {
            float g = a->topw[rows[r]];
            float *o = fp->out + (size_t)(rows[r] / K) * H;
            const float *y = ye + (size_t)r * H;
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

trill_status trill_check_replay(const trill_config *c, const uint16_t *replay, int T) {
    const int L = c->n_moe_layers, K = c->num_experts_per_tok, E = c->num_experts;
    for (int t = 0; t < T; t++)
        for (int m = 0; m < L; m++) {
            const uint16_t *ids = replay + ((size_t)t * L + m) * K;
            if (ids[0] == TRILL_REPLAY_NONE) continue;
            for (int j = 0; j < K; j++) {
                if (ids[j] >= E)
                    return trill_error(TRILL_ERR_INVALID, "router replay: token %d, MoE layer %d: expert id %u is outside [0, %d)", t, m, ids[j], E);
                for (int i = 0; i < j; i++)
                    if (ids[i] == ids[j])
                        return trill_error(TRILL_ERR_INVALID, "router replay: token %d, MoE layer %d: expert %u appears twice", t, m, ids[j]);
            }
        }
    return TRILL_OK;
}

/* One decoder layer: layers[l].x_in -> the next layer's input (or x_final). */
static trill_status run_layer(const trill_forward_pass *fp, int l, const uint16_t *replay, uint16_t *experts) {
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const int T = fp->T, H = c->hidden_size;
    const trill_layer_weights *w = &m->layers[l];
    layer_acts *a = &fp->layers[l];
    float *x_next = l + 1 < c->num_hidden_layers ? fp->layers[l + 1].x_in : fp->x_final;
    const trill_lora_layer *ad = adapters(fp, l);
    trill_status st = attention_block(fp, w, ad, a);
    if (st) {
        trill_error_context("layer %d", l);
        return st;
    }
    rmsnorm_forward(a->xn2, a->x_mid, w->post_norm, T, H, (float)c->rms_norm_eps);
    if (trill_config_is_moe(c, l))
        moe_block(fp, w, ad, a, c->moe_ordinal[l], replay, experts);
    else
        mlp(fp, fp->out, a->xn2, w->mlp_gate, w->mlp_up, w->mlp_down, ad->gate, ad->up, ad->down, a->xa, 0, a->gate, a->up, T, H,
            c->intermediate_size);
    if (x_next != a->x_mid) memcpy(x_next, a->x_mid, sizeof(float) * (size_t)T * H);
    residual_forward(x_next, fp->out, (size_t)T * H);
    return TRILL_OK;
}

trill_status trill_forward_layer(const trill_forward_pass *fp, int l) { return run_layer(fp, l, fp->replay, NULL); }

/* Runs every decoder layer and the final norm (into fp->xf). */
static trill_status run_layers(trill_forward_pass *fp, const uint16_t *replay, uint16_t *experts) {
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const int T = fp->T, H = c->hidden_size;
    rope_inv_freq(fp->inv_freq, c->head_dim, c->rope_theta);
    for (int s = 0; s < fp->n_seqs; s++)
        for (int t = fp->offsets[s]; t < fp->offsets[s + 1]; t++) fp->pos[t] = t - fp->offsets[s];
    embedding_forward_w(fp->layers[0].x_in, m->embed, fp->tokens, T, H);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        trill_status st = run_layer(fp, l, replay, experts);
        if (st) return st;
    }
    rmsnorm_forward(fp->xf, fp->x_final, m->final_norm, T, H, (float)c->rms_norm_eps);
    return TRILL_OK;
}

/* logits of n rows starting at row t0 (lm_head with its adapter, if any) */
void trill_forward_logits(const trill_forward_pass *fp, float *logits, int t0, int n) {
    const trill_model *m = fp->m;
    const trill_lora_pair none = { 0 };
    linear(fp, logits, fp->xf + (size_t)t0 * m->config.hidden_size, m->lm_head, fp->lora ? fp->lora->lm_head : none, fp->xa_head,
           n, m->config.hidden_size, m->config.vocab_size);
}

static trill_status token_logprobs(const trill_forward_pass *fp, float *logprobs) {
    const int T = fp->T, V = fp->m->config.vocab_size;
    float *logits = malloc(sizeof(float) * LOGIT_CHUNK * (size_t)V);
    if (!logits) return trill_error(TRILL_ERR_NOMEM, "out of memory for logits");
    for (int s = 0; s < fp->n_seqs; s++)
        if (fp->offsets[s + 1] > fp->offsets[s]) logprobs[fp->offsets[s]] = NAN;
    for (int t0 = 0; t0 < T; t0 += LOGIT_CHUNK) {
        int n = T - t0 < LOGIT_CHUNK ? T - t0 : LOGIT_CHUNK;
        trill_forward_logits(fp, logits, t0, n);
#pragma omp parallel for schedule(static)
        for (int r = 0; r < n; r++) {
            int t = t0 + r;
            if (t + 1 >= T || fp->pos[t + 1] == 0) continue; /* t ends its sequence */
            const float *row = logits + (size_t)r * V;
            logprobs[t + 1] = (float)((double)row[fp->tokens[t + 1]] - logsumexp(row, V));
        }
    }
    free(logits);
    return TRILL_OK;
}

static trill_status forward(const trill_model *m, const int *tokens, const int *offsets, int n_seqs, const uint16_t *replay,
                            float *logprobs, uint16_t *experts, bool training, bool recompute, trill_forward_pass **out) {
    const trill_config *c = &m->config;
    if (c->num_labels > 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s has a score head (num_labels %d) and no lm_head: it scores sequences "
                           "(trill_model_forward_last_hidden, trill/reward_model.h), it has no token log-probs",
                           trill_config_architecture(c), c->num_labels);
    trill_status st = check_batch(c, tokens, offsets, n_seqs);
    const int T = n_seqs > 0 ? offsets[n_seqs] : 0;
    if (!st && replay && c->n_moe_layers) st = trill_check_replay(c, replay, T);
    trill_forward_pass *fp = NULL;
    if (!st) st = pass_alloc(m, T, training, recompute, &fp);
    if (st) return st;
    fp->replay = replay;
    fp->tokens = tokens;
    fp->offsets = offsets;
    fp->n_seqs = n_seqs;
    if (T > 0) {
        st = run_layers(fp, replay, experts);
        if (!st) st = token_logprobs(fp, logprobs);
    }
    if (st || !out) trill_forward_pass_free(fp);
    else *out = fp;
    return st;
}

trill_status trill_model_forward(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                 const uint16_t *replay, float *logprobs, uint16_t *experts) {
    return forward(m, tokens, offsets, n_seqs, replay, logprobs, experts, false, false, NULL);
}

trill_status trill_model_forward_train(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                       const uint16_t *replay, float *logprobs, uint16_t *experts, bool recompute,
                                       trill_forward_pass **pass) {
    return forward(m, tokens, offsets, n_seqs, replay, logprobs, experts, true, recompute, pass);
}

trill_status trill_model_forward_last_hidden(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                             float *hidden) {
    const trill_config *c = &m->config;
    trill_status st = check_batch(c, tokens, offsets, n_seqs);
    if (st) return st;
    for (int s = 0; s < n_seqs; s++)
        if (offsets[s + 1] == offsets[s]) return trill_error(TRILL_ERR_INVALID, "batch: sequence %d is empty (it has no last token to read)", s);
    const int T = n_seqs > 0 ? offsets[n_seqs] : 0;
    if (T == 0) return TRILL_OK;
    trill_forward_pass *fp;
    if ((st = pass_alloc(m, T, false, false, &fp))) return st;
    fp->tokens = tokens;
    fp->offsets = offsets;
    fp->n_seqs = n_seqs;
    if ((st = run_layers(fp, NULL, NULL))) {
        trill_forward_pass_free(fp);
        return st;
    }
    const size_t H = (size_t)c->hidden_size;
    for (int s = 0; s < n_seqs; s++) memcpy(hidden + (size_t)s * H, fp->xf + (size_t)(offsets[s + 1] - 1) * H, H * sizeof(float));
    trill_forward_pass_free(fp);
    return TRILL_OK;
}
