/* The trainer's micro-batches (trainer_internal.h): the workspace, packing and gathering, the
 * plan of a step's micro-batches over the ranks, and the gradient's fixed tree. */
#include "rl/exec/trainer_internal.h"

/* Buffer i of the workspace, at least `bytes` long (its contents are not kept); NULL when out of memory. */
void *trill_rl_trn_ws_get(trill_trainer *r, int i, size_t bytes) {
    struct wsbuf *b = &r->ws[i];
    if (bytes == 0) bytes = 1;
    if (bytes > b->bytes) {
        free(b->p);
        b->p = trill_malloc(bytes);
        b->bytes = b->p ? bytes : 0;
    }
    return b->p;
}

/* ---- micro-batches ---- */


/* replay: the routing to replay, [T][L][K] at batch positions (NULL: the trainer's own router). */
trill_status trill_rl_trn_micro_make(trill_trainer *r, const rl_batch *b, const int *seq, int n, const uint16_t *replay, micro *m) {
    memset(m, 0, sizeof *m);
    m->n = n;
    m->seq = seq;
    for (int i = 0; i < n; i++) m->T += b->offsets[seq[i] + 1] - b->offsets[seq[i]];
    const size_t row = (size_t)b->n_moe_layers * b->top_k;
    m->offsets = trill_rl_trn_ws_get(r, WS_OFFSETS, sizeof(int) * (size_t)(n + 1));
    m->tokens = trill_rl_trn_ws_get(r, WS_TOKENS, sizeof(int) * (size_t)m->T); /* an expert-parallel round may have no sequence */
    if (replay && row) m->replay = trill_rl_trn_ws_get(r, WS_REPLAY, sizeof(uint16_t) * row * (size_t)m->T);
    if (!m->offsets || !m->tokens || (replay && row && !m->replay)) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    int at = 0;
    for (int i = 0; i < n; i++) {
        const int from = b->offsets[seq[i]], len = b->offsets[seq[i] + 1] - from;
        m->offsets[i] = at;
        memcpy(m->tokens + at, b->tokens + from, sizeof(int) * (size_t)len);
        if (m->replay) memcpy(m->replay + (size_t)at * row, replay + (size_t)from * row, sizeof(uint16_t) * row * (size_t)len);
        at += len;
    }
    m->offsets[n] = at;
    return TRILL_OK;
}

/* The routing the trainer's forward replays: on-policy mode's engine's once it scored (the loss
 * sees its log-probs: the backward must go through the same experts), else the generator's with
 * router replay (on-policy mode before scoring: the generator's, which it equals), else none. */
const uint16_t *trill_rl_trn_replay_source(const trill_trainer *r, const rl_batch *b, const uint16_t *scored) {
    if (r->onp_engine && scored) return scored;
    return r->c->router_replay || r->onp_engine ? b->experts : NULL;
}

typedef struct seq_list { const rl_batch *b; const int *seq; } seq_list;

static int seq_len(const void *ctx, int i) {
    const seq_list *l = ctx;
    return l->b->offsets[l->seq[i] + 1] - l->b->offsets[l->seq[i]];
}

/* Consecutive runs of `seq` under the token budget (trill_micro_batch_take's rule). */
static int next_micro(const rl_batch *b, const int *seq, int n, int budget) {
    const seq_list l = { b, seq };
    return trill_micro_batch_take(n, budget, seq_len, &l);
}


/* Copies a micro-batch's packed per-token values back into batch positions. */
void trill_rl_trn_scatter_logp(const rl_batch *b, const micro *m, const float *src, float *dst) {
    for (int i = 0; i < m->n; i++) {
        const int from = b->offsets[m->seq[i]];
        memcpy(dst + from, src + m->offsets[i], sizeof(float) * (size_t)(m->offsets[i + 1] - m->offsets[i]));
    }
}

void trill_rl_trn_scatter_experts(const rl_batch *b, const micro *m, const uint16_t *src, uint16_t *dst) {
    const size_t row = (size_t)b->n_moe_layers * b->top_k;
    for (int i = 0; i < m->n; i++)
        memcpy(dst + (size_t)b->offsets[m->seq[i]] * row, src + (size_t)m->offsets[i] * row,
               sizeof(uint16_t) * row * (size_t)(m->offsets[i + 1] - m->offsets[i]));
}

/* The response tokens of the micro-batch's sequences, gathered from batch positions:
 * resp_off[n + 1] and, for each non-NULL pair, dst[j] = src[position of response token j]. */
int trill_rl_trn_response_offsets(const rl_batch *b, const micro *m, int *resp_off) {
    resp_off[0] = 0;
    for (int i = 0; i < m->n; i++) resp_off[i + 1] = resp_off[i] + rl_response_len(b, m->seq[i]);
    return resp_off[m->n];
}

/* The micro-batch's response tokens between the stream's places and a packed array of elem-byte
 * values: gathered (stream -> packed) or scattered back (packed -> stream). */
static void copy_responses(const rl_batch *b, const micro *m, const void *src, void *dst, size_t elem, bool gather) {
    size_t j = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i];
        const size_t from = (size_t)(b->offsets[s] + b->prompt_len[s]) * elem, n = (size_t)rl_response_len(b, s) * elem;
        if (gather) memcpy((char *)dst + j, (const char *)src + from, n);
        else memcpy((char *)dst + from, (const char *)src + j, n);
        j += n;
    }
}

void trill_rl_trn_gather_f(const rl_batch *b, const micro *m, const float *src, float *dst) { copy_responses(b, m, src, dst, sizeof *src, true); }
void trill_rl_trn_gather_u8(const rl_batch *b, const micro *m, const uint8_t *src, uint8_t *dst) { copy_responses(b, m, src, dst, 1, true); }
void trill_rl_trn_scatter_resp_f(const rl_batch *b, const micro *m, const float *src, float *dst) { copy_responses(b, m, src, dst, sizeof *src, false); }
void trill_rl_trn_scatter_resp_u8(const rl_batch *b, const micro *m, const uint8_t *src, uint8_t *dst) { copy_responses(b, m, src, dst, 1, false); }

/* ---- data and expert parallelism: a step's micro-batches over the ranks ---- */


void trill_rl_trn_share(int M, int ranks, int d, int *lo, int *hi) {
    *lo = (int)((int64_t)M * d / ranks);
    *hi = (int)((int64_t)M * (d + 1) / ranks);
}

void trill_rl_trn_plan_free(micro_plan *p) {
    free(p->first);
    free(p->src_lo);
    free(p->src_hi);
}

trill_status trill_rl_trn_plan_micros(const trill_trainer *r, const rl_batch *b, const int *seq, int n, micro_plan *p) {
    const int D = r->data ? trill_comm_size(r->data) : 1, me = r->data ? trill_comm_rank(r->data) : 0;
    *p = (micro_plan){ .first = trill_malloc(sizeof(int) * (size_t)(n + 1)), .src_lo = trill_malloc(sizeof(int) * (size_t)r->P),
                       .src_hi = trill_malloc(sizeof(int) * (size_t)r->P) };
    if (!p->first || !p->src_lo || !p->src_hi) {
        trill_rl_trn_plan_free(p);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    for (int at = 0; at < n; p->M++) {
        p->first[p->M] = at;
        at += next_micro(b, seq + at, n - at, r->c->trainer.micro_batch_tokens);
    }
    p->first[p->M] = n;
    trill_rl_trn_share(p->M, D, me, &p->lo, &p->hi);
    for (int j = 0; j < r->P; j++) { /* the group is data ranks me - q .. me - q + P - 1 */
        trill_rl_trn_share(p->M, D, me - r->q + j, &p->src_lo[j], &p->src_hi[j]);
        if (p->src_hi[j] - p->src_lo[j] > p->rounds) p->rounds = p->src_hi[j] - p->src_lo[j];
    }
    return TRILL_OK;
}

/* ---- a step's gradient: one fixed tree over its micro-batches ---- */


void trill_rl_trn_grad_sum_free(const trill_trainer *r, grad_sum *g) {
    trill_tree_sum_free(g->own);
    for (int j = 0; g->experts && j < r->P; j++) trill_tree_sum_free(g->experts[j]);
    free(g->experts);
}

trill_status trill_rl_trn_grad_sum_create(const trill_trainer *r, const micro_plan *p, grad_sum *g) {
    *g = (grad_sum){ 0 };
    trill_status st = trill_tree_sum_create(r->routed, p->M, p->lo, p->hi - p->lo, &g->own);
    if (!st && r->P > 1 && !(g->experts = trill_calloc((size_t)r->P, sizeof *g->experts))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int j = 0; !st && r->P > 1 && j < r->P; j++)
        st = trill_tree_sum_create(r->n_values - r->routed, p->M, p->src_lo[j], p->src_hi[j] - p->src_lo[j], &g->experts[j]);
    if (st) trill_rl_trn_grad_sum_free(r, g);
    return st;
}

/* The backward of round i's pass: r->leaf (and the held experts' parts, r->src) zeroed, then
 * filled; the leaves that belong to micro-batches go to their trees. */
trill_status trill_rl_trn_backward_round(trill_trainer *r, const micro_plan *p, grad_sum *g, int i, const trill_forward_pass *pass, const float *dlp) {
    memset(r->leaf, 0, sizeof(float) * r->n_values);
    for (int j = 0; r->P > 1 && j < r->P; j++) memset(r->src[j], 0, sizeof(float) * (r->n_values - r->routed));
    trill_status st = r->P > 1 ? trill_model_backward_ep(pass, dlp, NULL, r->leaf, r->src)
                               : trill_model_backward(pass, dlp, r->lora ? NULL : r->leaf, r->lora ? r->leaf : NULL);
    if (!st && p->lo + i < p->hi) st = trill_tree_sum_add(g->own, r->leaf);
    for (int j = 0; !st && r->P > 1 && j < r->P; j++)
        if (p->src_lo[j] + i < p->src_hi[j]) st = trill_tree_sum_add(g->experts[j], r->src[j]);
    return st;
}

trill_status trill_rl_trn_grad_sum_finish(trill_trainer *r, grad_sum *g) {
    trill_status st = trill_tree_sum_finish(g->own, r->data, r->lora_grads);
    if (!st && r->P > 1) st = trill_tree_sum_finish_many(g->experts, r->P, r->edp, r->lora_grads + r->routed);
    return st;
}

/* After a pass that filled the per-token arrays of its own micro-batches' sequences (old and
 * reference log-probs, routing, TIS weights, mask): every rank gets every sequence's, by one
 * all-reduce where each value has one writer (the others add exact zeros). */
trill_status trill_rl_trn_assemble(trill_trainer *r, const rl_batch *b, const int *seq, const micro_plan *p, token_arrays *ta, bool old, bool ref) {
    if (!r->data) return TRILL_OK;
    const size_t row = (size_t)r->L * r->K;
    size_t total = 0;
    for (int i = 0; i < p->first[p->M]; i++) {
        const int s = seq[i], T = b->offsets[s + 1] - b->offsets[s];
        total += (size_t)T * ((old ? 3 + row : 0) + (ref ? 1 : 0));
    }
    float *v = trill_malloc(sizeof(float) * (total ? total : 1));
    if (!v) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int pass = 0; pass < 2; pass++) { /* 0: pack (own values, zeros elsewhere); 1: unpack */
        size_t at = 0;
        for (int mi = 0; mi < p->M; mi++)
            for (int i = p->first[mi]; i < p->first[mi + 1]; i++) {
                const int s = seq[i], t0 = b->offsets[s], T = b->offsets[s + 1] - t0;
                const bool mine = mi >= p->lo && mi < p->hi;
                for (int t = t0; t < t0 + T; t++) {
                    float *x = v + at;
                    const size_t w = (old ? 3 + row : 0) + (ref ? 1 : 0);
                    if (pass == 0) {
                        size_t k = 0;
                        if (old) {
                            x[k++] = mine ? ta->old_logp[t] : 0;
                            x[k++] = mine ? ta->tis[t] : 0;
                            x[k++] = mine ? (float)ta->mask[t] : 0;
                            for (size_t e = 0; e < row; e++) x[k++] = mine ? (float)ta->train_experts[(size_t)t * row + e] : 0;
                        }
                        if (ref) x[k++] = mine ? ta->ref_logp[t] : 0;
                    } else {
                        size_t k = 0;
                        if (old) {
                            ta->old_logp[t] = x[k++];
                            ta->tis[t] = x[k++];
                            ta->mask[t] = (uint8_t)x[k++];
                            for (size_t e = 0; e < row; e++) ta->train_experts[(size_t)t * row + e] = (uint16_t)x[k++];
                        }
                        if (ref) ta->ref_logp[t] = x[k++];
                    }
                    at += w;
                }
            }
        if (pass == 0) {
            trill_status st = trill_comm_allreduce_f32(r->data, v, total);
            if (st) {
                free(v);
                return st;
            }
        }
    }
    free(v);
    return TRILL_OK;
}
