/* The trainer executor (trainer.h): micro-batches, the pre-passes (old and reference
 * log-probs), minibatch optimizer steps, and the step's mismatch figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "model/model_internal.h"
#include "trill/fileio.h"
#include "model/lora_internal.h"
#include "rl/exec/generator.h"
#include "rl/exec/trainer.h"
#include "trill/dist.h"
#include "trill/infer.h"
#include "trill/timing.h"
#include "trill/rl_algo.h"
#include "trill/train.h"

struct rl_trainer {
    const trill_rl_config *c;
    trill_model *policy;          /* LoRA: the base frozen in its checkpoint's dtype, adapters attached;
                                     full fine-tuning: fp32 master weights */
    trill_lora *lora;             /* NULL in full fine-tuning */
    float *values;                /* what the optimizer updates: the adapters' block, or every weight */
    size_t n_values;
    float *lora_grads;            /* [n_values] the gradient of values */
    uint8_t *no_decay;            /* full fine-tuning: 1 for weights without decay (norms, as HF Trainer) */
    trill_adamw *opt;
    trill_model *merge_model;     /* merge sync: fp32 model the adapters are folded into */
    float *merge_base;            /* ... and its base weights */
    int L, K;                     /* MoE layers, experts per token */
    int step;                     /* the step being trained (1-based) */
    /* generator.on_policy: an engine in the generator's format scoring the batch's tokens at the
     * trainer's weights (sent again whenever they changed) */
    trill_engine *scorer;
    bool scorer_stale;
    double score_s;               /* this step's seconds in it */
    /* distribution (parallel.trainer, trill_rl_trainer_create's world): the data ranks (dp x ep)
     * share each step's micro-batches; under expert parallelism the ranks of a group (P of them,
     * this one q-th) hold a shard of the routed experts each and run their micro-batches in
     * rounds, and edp links the ranks holding the same experts (one per group) */
    trill_comm *data;             /* NULL: one process */
    trill_comm *ep, *edp;         /* owned; NULL without expert parallelism */
    int P, q;
    /* tensor parallelism (parallel.trainer.tp): a group of tp consecutive ranks shares each
     * micro-batch, each holding its share of the heads and dense MLPs (the data ranks are then
     * the groups: `data` links the ranks of one share) */
    trill_comm *tp;               /* owned; NULL without tensor parallelism */
    int tp_size, tp_rank;
    /* the group holding one whole model between them (the expert- or the tensor-parallel one), and
     * this rank's place in it: a value its shard holds alone (an expert's, a slice) is its own,
     * any other the group's first rank speaks for */
    trill_comm *mp;
    int mp_rank;
    trill_comm *owned_data;       /* the data comm when split from the world (tensor parallelism) */
    size_t routed;                /* values[routed, n_values): the held experts' adapters (n_values without EP) */
    float *leaf;                  /* [n_values] one micro-batch's gradient (the held experts' part in src) */
    float **src;                  /* [P] the held experts' gradient from each group rank's micro-batch of a round */
    trill_lora *whole;            /* the adapters of every expert, gathered from the shards (lora itself without EP) */
    trill_adamw *whole_opt;       /* the optimizer state likewise, gathered for a checkpoint */
    /* the buffers of one micro-batch's pass, kept between micro-batches and steps and grown to the
     * largest asked: once they fit, a step allocates nothing per micro-batch */
    struct wsbuf { void *p; size_t bytes; } ws[16];
};

/* The workspace's buffers (rl_trainer.ws), by use. */
enum { WS_OFFSETS, WS_TOKENS, WS_REPLAY, WS_LP, WS_DLP, WS_EX, WS_OFF, WS_G_LP, WS_G_OLD, WS_G_BEHAV, WS_G_REF, WS_G_W, WS_G_D, WS_G_MASK,
       WS_ADV, WS_N };
_Static_assert(WS_N <= sizeof ((rl_trainer *)0)->ws / sizeof ((rl_trainer *)0)->ws[0], "rl_trainer.ws holds every buffer");

/* Buffer i of the workspace, at least `bytes` long (its contents are not kept); NULL when out of memory. */
static void *ws_get(rl_trainer *r, int i, size_t bytes) {
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

/* A packed sub-batch of the rollout batch's sequences, for one forward (and backward); its arrays
 * are the trainer's workspace's, valid until the next micro-batch. */
typedef struct micro {
    int n, T;
    const int *seq;         /* [n] indices into the rollout batch */
    int *offsets, *tokens;  /* packed */
    uint16_t *replay;       /* [T][L][K] or NULL */
} micro;

/* replay: the routing to replay, [T][L][K] at batch positions (NULL: the trainer's own router). */
static trill_status micro_make(rl_trainer *r, const rl_batch *b, const int *seq, int n, const uint16_t *replay, micro *m) {
    memset(m, 0, sizeof *m);
    m->n = n;
    m->seq = seq;
    for (int i = 0; i < n; i++) m->T += b->offsets[seq[i] + 1] - b->offsets[seq[i]];
    const size_t row = (size_t)b->n_moe_layers * b->top_k;
    m->offsets = ws_get(r, WS_OFFSETS, sizeof(int) * (size_t)(n + 1));
    m->tokens = ws_get(r, WS_TOKENS, sizeof(int) * (size_t)m->T); /* an expert-parallel round may have no sequence */
    if (replay && row) m->replay = ws_get(r, WS_REPLAY, sizeof(uint16_t) * row * (size_t)m->T);
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

/* The routing the trainer's forward replays: on-policy mode's scorer's once it scored (the loss
 * sees its log-probs: the backward must go through the same experts), else the generator's with
 * router replay (on-policy mode before scoring: the generator's, which it equals), else none. */
static const uint16_t *replay_source(const rl_trainer *r, const rl_batch *b, const uint16_t *scored) {
    if (r->scorer && scored) return scored;
    return r->c->router_replay || r->scorer ? b->experts : NULL;
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

/* Per-token arrays of the whole rollout batch (packed layout). */
typedef struct token_arrays {
    float *old_logp, *ref_logp, *tis;
    uint8_t *mask;
    uint16_t *train_experts;
    float *onp_logp;        /* generator.on_policy: the scorer's log-probs of the response tokens at the current weights */
    uint16_t *onp_experts;  /* ... and its routing (as rl_batch.experts) */
} token_arrays;

/* Copies a micro-batch's packed per-token values back into batch positions. */
static void scatter_logp(const rl_batch *b, const micro *m, const float *src, float *dst) {
    for (int i = 0; i < m->n; i++) {
        const int from = b->offsets[m->seq[i]];
        memcpy(dst + from, src + m->offsets[i], sizeof(float) * (size_t)(m->offsets[i + 1] - m->offsets[i]));
    }
}

static void scatter_experts(const rl_batch *b, const micro *m, const uint16_t *src, uint16_t *dst) {
    const size_t row = (size_t)b->n_moe_layers * b->top_k;
    for (int i = 0; i < m->n; i++)
        memcpy(dst + (size_t)b->offsets[m->seq[i]] * row, src + (size_t)m->offsets[i] * row,
               sizeof(uint16_t) * row * (size_t)(m->offsets[i + 1] - m->offsets[i]));
}

/* The response tokens of the micro-batch's sequences, gathered from batch positions:
 * resp_off[n + 1] and, for each non-NULL pair, dst[j] = src[position of response token j]. */
static int response_offsets(const rl_batch *b, const micro *m, int *resp_off) {
    resp_off[0] = 0;
    for (int i = 0; i < m->n; i++) resp_off[i + 1] = resp_off[i] + rl_response_len(b, m->seq[i]);
    return resp_off[m->n];
}

static void gather_f(const rl_batch *b, const micro *m, const float *src, float *dst) {
    int j = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], n = rl_response_len(b, s);
        memcpy(dst + j, src + from, sizeof(float) * (size_t)n);
        j += n;
    }
}

static void gather_u8(const rl_batch *b, const micro *m, const uint8_t *src, uint8_t *dst) {
    int j = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], n = rl_response_len(b, s);
        memcpy(dst + j, src + from, (size_t)n);
        j += n;
    }
}

static void scatter_resp_f(const rl_batch *b, const micro *m, const float *src, float *dst) {
    int j = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], n = rl_response_len(b, s);
        memcpy(dst + from, src + j, sizeof(float) * (size_t)n);
        j += n;
    }
}

static void scatter_resp_u8(const rl_batch *b, const micro *m, const uint8_t *src, uint8_t *dst) {
    int j = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], n = rl_response_len(b, s);
        memcpy(dst + from, src + j, (size_t)n);
        j += n;
    }
}

/* TIS weights and the MIS mask of a micro-batch's sequences from their old log-probs (in the
 * workspace's loss buffers, which micro_loss fills again after). */
static trill_status corrections(rl_trainer *r, const rl_batch *b, const micro *m, token_arrays *ta) {
    int *off = ws_get(r, WS_OFF, sizeof(int) * (size_t)(m->n + 1));
    if (!off) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const int R = response_offsets(b, m, off);
    const size_t fR = sizeof(float) * (size_t)(R + 1);
    float *old = ws_get(r, WS_G_OLD, fR), *behav = ws_get(r, WS_G_BEHAV, fR), *w = ws_get(r, WS_G_W, fR);
    uint8_t *mask = ws_get(r, WS_G_MASK, (size_t)R + 1);
    if (!old || !behav || !w || !mask) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    gather_f(b, m, ta->old_logp, old);
    gather_f(b, m, b->behav_logp, behav);
    if (b->loss_mask) gather_u8(b, m, b->loss_mask, mask); /* the trajectory's: injected tokens never in the loss */
    else memset(mask, 1, (size_t)R);
    trill_rl_corrections(r->c, m->n, off, old, behav, w, mask);
    scatter_resp_f(b, m, w, ta->tis);
    scatter_resp_u8(b, m, mask, ta->mask);
    return TRILL_OK;
}

/* ---- data and expert parallelism: a step's micro-batches over the ranks ---- */

/* seq[0, n) cut into micro-batches by the packer's rule (the same cut on every rank count):
 * micro-batch i is seq[first[i], first[i + 1]); *M of them; [*lo, *hi) are this rank's, a
 * contiguous share among the data ranks. Under expert parallelism the group's ranks run in
 * `rounds` lockstep passes (in round i each forwards its i-th micro-batch, or an empty batch, and
 * serves the others' rows): [src_lo[j], src_hi[j]) is group rank j's share. */
typedef struct micro_plan {
    int *first;
    int M, lo, hi, rounds;
    int *src_lo, *src_hi; /* [P] */
} micro_plan;

static void share(int M, int ranks, int d, int *lo, int *hi) {
    *lo = (int)((int64_t)M * d / ranks);
    *hi = (int)((int64_t)M * (d + 1) / ranks);
}

static void plan_free(micro_plan *p) {
    free(p->first);
    free(p->src_lo);
    free(p->src_hi);
}

static trill_status plan_micros(const rl_trainer *r, const rl_batch *b, const int *seq, int n, micro_plan *p) {
    const int D = r->data ? trill_comm_size(r->data) : 1, me = r->data ? trill_comm_rank(r->data) : 0;
    *p = (micro_plan){ .first = trill_malloc(sizeof(int) * (size_t)(n + 1)), .src_lo = trill_malloc(sizeof(int) * (size_t)r->P),
                       .src_hi = trill_malloc(sizeof(int) * (size_t)r->P) };
    if (!p->first || !p->src_lo || !p->src_hi) {
        plan_free(p);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    for (int at = 0; at < n; p->M++) {
        p->first[p->M] = at;
        at += next_micro(b, seq + at, n - at, r->c->trainer.micro_batch_tokens);
    }
    p->first[p->M] = n;
    share(p->M, D, me, &p->lo, &p->hi);
    for (int j = 0; j < r->P; j++) { /* the group is data ranks me - q .. me - q + P - 1 */
        share(p->M, D, me - r->q + j, &p->src_lo[j], &p->src_hi[j]);
        if (p->src_hi[j] - p->src_lo[j] > p->rounds) p->rounds = p->src_hi[j] - p->src_lo[j];
    }
    return TRILL_OK;
}

/* ---- a step's gradient: one fixed tree over its micro-batches ---- */

/* Each micro-batch's gradient is a leaf of trill_tree_sum: values[0, routed) from the rank that
 * forwarded it; under expert parallelism the held experts' part, values[routed, n_values), from
 * the rank holding them, which keeps one tree per group rank (its share of the leaves arrives
 * round by round) and finishes them with the ranks holding the same experts. */
typedef struct grad_sum {
    trill_tree_sum *own;
    trill_tree_sum **experts; /* [P] */
} grad_sum;

static void grad_sum_free(const rl_trainer *r, grad_sum *g) {
    trill_tree_sum_free(g->own);
    for (int j = 0; g->experts && j < r->P; j++) trill_tree_sum_free(g->experts[j]);
    free(g->experts);
}

static trill_status grad_sum_create(const rl_trainer *r, const micro_plan *p, grad_sum *g) {
    *g = (grad_sum){ 0 };
    trill_status st = trill_tree_sum_create(r->routed, p->M, p->lo, p->hi - p->lo, &g->own);
    if (!st && r->P > 1 && !(g->experts = trill_calloc((size_t)r->P, sizeof *g->experts))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int j = 0; !st && r->P > 1 && j < r->P; j++)
        st = trill_tree_sum_create(r->n_values - r->routed, p->M, p->src_lo[j], p->src_hi[j] - p->src_lo[j], &g->experts[j]);
    if (st) grad_sum_free(r, g);
    return st;
}

/* The backward of round i's pass: r->leaf (and the held experts' parts, r->src) zeroed, then
 * filled; the leaves that belong to micro-batches go to their trees. */
static trill_status backward_round(rl_trainer *r, const micro_plan *p, grad_sum *g, int i, const trill_forward_pass *pass, const float *dlp) {
    memset(r->leaf, 0, sizeof(float) * r->n_values);
    for (int j = 0; r->P > 1 && j < r->P; j++) memset(r->src[j], 0, sizeof(float) * (r->n_values - r->routed));
    trill_status st = r->P > 1 ? trill_model_backward_ep(pass, dlp, NULL, r->leaf, r->src)
                               : trill_model_backward(pass, dlp, r->lora ? NULL : r->leaf, r->lora ? r->leaf : NULL);
    if (!st && p->lo + i < p->hi) st = trill_tree_sum_add(g->own, r->leaf);
    for (int j = 0; !st && r->P > 1 && j < r->P; j++)
        if (p->src_lo[j] + i < p->src_hi[j]) st = trill_tree_sum_add(g->experts[j], r->src[j]);
    return st;
}

static trill_status grad_sum_finish(rl_trainer *r, grad_sum *g) {
    trill_status st = trill_tree_sum_finish(g->own, r->data, r->lora_grads);
    if (!st && r->P > 1) st = trill_tree_sum_finish_many(g->experts, r->P, r->edp, r->lora_grads + r->routed);
    return st;
}

/* After a pass that filled the per-token arrays of its own micro-batches' sequences (old and
 * reference log-probs, routing, TIS weights, mask): every rank gets every sequence's, by one
 * all-reduce where each value has one writer (the others add exact zeros). */
static trill_status assemble(rl_trainer *r, const rl_batch *b, const int *seq, const micro_plan *p, token_arrays *ta, bool old, bool ref) {
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

/* ---- generator.on_policy: the generator's numbers at the trainer's weights ---- */

/* The scorer gets the trainer's weights as a sync would ship them (the adapters, or the merged
 * model in merge sync): the same bits the generator computes with after the next sync. */
static trill_status scorer_sync(rl_trainer *r) {
    if (!r->scorer_stale) return TRILL_OK;
    const float *data;
    size_t n;
    const trill_model *merged;
    trill_status st = trill_rl_trainer_export(r, &data, &n, &merged);
    if (!st) st = merged ? trill_engine_update_weights(r->scorer, merged, 0, NULL) : trill_engine_update_adapter(r->scorer, r->lora, 0, NULL);
    if (!st) r->scorer_stale = false;
    return st;
}

/* Teacher forcing of seq[0..n)'s responses through the scorer: each response token's log-prob as
 * the generator's sampler reports it (at generator.temperature) into ta->onp_logp, and the
 * routing of every forwarded position into ta->onp_experts, at batch positions. */
/* The scoring engine's outputs (every one collected and freed, also after a failure st) into the
 * batch positions of the on-policy log-probs and routing. */
static trill_status take_scores(rl_trainer *r, const rl_batch *b, const int *seq, token_arrays *ta, trill_status st) {
    const size_t row = (size_t)r->L * r->K;
    trill_sequence_out out[32];
    int got;
    while ((got = trill_engine_collect(r->scorer, out, 32)) > 0)
        for (int k = 0; k < got; k++) {
            const int s = seq[out[k].request + (uint64_t)out[k].sample], at = b->offsets[s];
            if (!st && out[k].n_prompt + out[k].n_generated != b->offsets[s + 1] - at)
                st = trill_error(TRILL_ERR_INVALID, "generator.on_policy: sequence %d was scored over %d tokens, not %d", s,
                                 out[k].n_prompt + out[k].n_generated, b->offsets[s + 1] - at);
            if (!st) {
                memcpy(ta->onp_logp + at + out[k].n_prompt, out[k].logprobs, sizeof(float) * (size_t)out[k].n_generated);
                if (row && out[k].experts)
                    memcpy(ta->onp_experts + (size_t)at * row, out[k].experts, sizeof(uint16_t) * row * (size_t)(b->offsets[s + 1] - at - 1));
            }
            trill_sequence_out_free(&out[k]);
        }
    return st;
}

static trill_status score_on_policy(rl_trainer *r, const rl_batch *b, const int *seq, int n, token_arrays *ta) {
    const trill_rl_config *c = r->c;
    const double t0 = trill_now();
    trill_status st = scorer_sync(r);
    trill_request q = { .sampling = trill_sampling_default() };
    q.sampling.temperature = (float)c->generator.temperature;
    int *forced = NULL, *forced_at = NULL;
    /* a run of sequences with one prompt (a group's samples) is one request of that many forced
     * samples: the prompt is prefilled once and forked, as the generator did */
    for (int i = 0, j; i < n && !st; i = j) {
        const int s = seq[i], pl = b->prompt_len[s];
        const int *prompt = b->tokens + b->offsets[s];
        int total = 0;
        for (j = i; j < n && rl_response_len(b, seq[j]) >= 1 && b->prompt_len[seq[j]] == pl &&
                    !memcmp(b->tokens + b->offsets[seq[j]], prompt, sizeof(int) * (size_t)pl);
             j++)
            total += rl_response_len(b, seq[j]);
        if (j == i) { /* an empty response: nothing to score */
            j = i + 1;
            continue;
        }
        int *f = trill_realloc(forced, sizeof(int) * (size_t)total), *fa = f ? trill_realloc(forced_at, sizeof(int) * (size_t)(j - i + 1)) : NULL;
        if (f) forced = f;
        if (fa) forced_at = fa;
        if (!f || !fa) {
            st = trill_error(TRILL_ERR_NOMEM, "out of memory");
            break;
        }
        int longest = 0;
        forced_at[0] = 0;
        for (int k = i; k < j; k++) {
            const int len = rl_response_len(b, seq[k]);
            memcpy(forced + forced_at[k - i], b->tokens + b->offsets[seq[k]] + pl, sizeof(int) * (size_t)len);
            forced_at[k - i + 1] = forced_at[k - i] + len;
            longest = len > longest ? len : longest;
        }
        q.id = (uint64_t)i;
        q.n = j - i;
        q.prompt = prompt;
        q.prompt_len = pl;
        q.forced = forced;
        q.n_forced = total;
        q.forced_at = forced_at;
        q.max_new_tokens = longest;
        st = trill_engine_submit(r->scorer, &q);
    }
    free(forced);
    free(forced_at);
    if (!st) st = trill_engine_run(r->scorer);
    st = take_scores(r, b, seq, ta, st);
    r->score_s += trill_now() - t0;
    return st;
}

/* The micro-batch's packed log-probs of its response tokens replaced by the scorer's. */
static void take_scored(const rl_batch *b, const micro *m, const token_arrays *ta, float *lp) {
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], len = rl_response_len(b, s);
        memcpy(lp + m->offsets[i] + b->prompt_len[s], ta->onp_logp + from, sizeof(float) * (size_t)len);
    }
}

/* The micro-batch's packed routing from the scorer's, for the metrics' training routing. */
static void take_scored_experts(const rl_batch *b, const micro *m, const token_arrays *ta, uint16_t *ex) {
    const size_t row = (size_t)b->n_moe_layers * b->top_k;
    for (int i = 0; i < m->n; i++)
        memcpy(ex + (size_t)m->offsets[i] * row, ta->onp_experts + (size_t)b->offsets[m->seq[i]] * row,
               sizeof(uint16_t) * row * (size_t)(m->offsets[i + 1] - m->offsets[i]));
}

/* A forward without gradients over `seq`: old log-probs (adapters on) and/or reference
 * log-probs (adapters off), plus the trainer's routing. */
static trill_status pre_pass(rl_trainer *r, const rl_batch *b, const int *seq, int n, bool want_old, bool want_ref, token_arrays *ta) {
    micro_plan p;
    trill_status st = plan_micros(r, b, seq, n, &p);
    if (!st && r->scorer && want_old) st = score_on_policy(r, b, seq, n, ta);
    for (int i = 0; i < p.rounds && !st; i++) { /* round i: this rank's i-th micro-batch, or an empty pass */
        const int mi = p.lo + i;
        const bool mine = mi < p.hi;
        const int at = mine ? p.first[mi] : 0, k = mine ? p.first[mi + 1] - at : 0;
        micro m;
        if ((st = micro_make(r, b, seq + at, k, replay_source(r, b, r->scorer && want_old ? ta->onp_experts : NULL), &m))) break;
        float *lp = ws_get(r, WS_LP, sizeof(float) * (size_t)(m.T + 1));
        uint16_t *ex = r->L ? ws_get(r, WS_EX, sizeof(uint16_t) * (size_t)(m.T + 1) * r->L * r->K) : NULL;
        if (!lp || (r->L && !ex)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st && want_old) {
            if (r->scorer) { /* the scorer's numbers (scored before the loop) */
                take_scored(b, &m, ta, lp);
                if (ex) take_scored_experts(b, &m, ta, ex);
            } else {
                st = trill_model_forward(r->policy, m.tokens, m.offsets, m.n, m.replay, lp, ex);
            }
            if (!st && mine) {
                scatter_logp(b, &m, lp, ta->old_logp);
                if (ex) scatter_experts(b, &m, ex, ta->train_experts);
                st = corrections(r, b, &m, ta);
            }
        }
        if (!st && want_ref) {
            r->lora->enabled = false; /* the reference policy: the same weights without adapters */
            st = trill_model_forward(r->policy, m.tokens, m.offsets, m.n, m.replay, lp, NULL);
            r->lora->enabled = true;
            if (!st && mine) scatter_logp(b, &m, lp, ta->ref_logp);
        }
    }
    if (!st) st = assemble(r, b, seq, &p, ta, want_old, want_ref);
    plan_free(&p);
    return st;
}

/* ---- one optimizer step on a minibatch ---- */

/* Whether this rank speaks for the trainable tensor t (at its offset `at` in values) when the
 * model-parallel group adds its shards up: a value its shard holds alone (a held expert's, a
 * slice) is its own; one every shard holds is the group's first rank's. */
static bool speaks_for(const rl_trainer *r, const trill_param *t, size_t at) {
    return r->mp_rank == 0 || at >= r->routed || trill_param_sliced(t);
}

/* The gradient's global norm, the same bits on any layout: each trainable tensor's sum of squares
 * (trill_grad_sumsq) added in the whole adapter's tensor order (the model's in full
 * fine-tuning); under model parallelism each rank gives the sums of the tensors it speaks for. */
static trill_status gradient_norm(const rl_trainer *r, double *norm) {
    const trill_param *t = r->lora ? r->lora->tensors : r->policy->tensors;
    const size_t n = r->lora ? r->lora->n_tensors : r->policy->n_tensors, n_all = r->lora ? r->lora->n_global_tensors : n;
    size_t *offset = trill_malloc(sizeof(size_t) * (n ? n : 1)), *numel = trill_malloc(sizeof(size_t) * (n ? n : 1));
    double *mine = trill_malloc(sizeof(double) * (n ? n : 1)), *all = trill_calloc(n_all ? n_all : 1, sizeof(double));
    trill_status st = offset && numel && mine && all ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t k = 0; !st && k < n; k++) {
        offset[k] = (size_t)(t[k].data - r->values);
        numel[k] = t[k].numel;
    }
    if (!st) st = trill_grad_sumsq_parts(r->lora_grads, offset, numel, n, mine);
    for (size_t k = 0; !st && k < n; k++)
        if (speaks_for(r, &t[k], offset[k])) all[r->lora ? (size_t)r->lora->global_index[k] : k] = mine[k];
    /* a tensor's sum over its slices is added in rank order, the same bits on every rank */
    if (!st && r->mp) st = trill_comm_allreduce_ordered_f64(r->mp, all, n_all);
    double ss = 0;
    for (size_t k = 0; k < n_all; k++) ss += all[k];
    *norm = sqrt(ss);
    free(offset);
    free(numel);
    free(mine);
    free(all);
    return st;
}

/* The end of every optimizer step, RL's or SFT's: the summed gradient divided by the step's
 * denominator and clipped; a loss or gradient norm that is not finite is never applied (with
 * trainer.skip_nonfinite *applied is false, else an error naming the step); then AdamW at the
 * schedule's rate for optimizer step opt->step of `total`. */
static trill_status apply_update(rl_trainer *r, double denom, double loss, int64_t total, double *grad_norm, double *lr, bool *applied) {
    const trill_rl_config *c = r->c;
    *applied = false;
    for (size_t i = 0; i < r->n_values; i++) r->lora_grads[i] = (float)(r->lora_grads[i] / denom);
    trill_status st = gradient_norm(r, grad_norm);
    if (st) return st;
    trill_clip_grads_to(r->lora_grads, r->n_values, *grad_norm, c->trainer.grad_clip);
    if (!isfinite(loss) || !isfinite(*grad_norm)) { /* never applied: the weights stay as they were */
        if (c->trainer.skip_nonfinite) return TRILL_OK;
        return trill_error(TRILL_ERR_INVALID, "step %d: the %s is %g (loss %g, gradient norm %g): the update was not applied "
                           "(trainer.skip_nonfinite: true skips such batches)", r->step,
                           isfinite(loss) ? "gradient norm" : "loss", isfinite(loss) ? *grad_norm : loss, loss, *grad_norm);
    }
    *lr = trill_lr_at(c->trainer.schedule, c->trainer.lr, c->trainer.min_lr, c->trainer.warmup_steps, total, r->opt->step);
    trill_adamw_step(r->opt, r->values, r->lora_grads, *lr, r->no_decay);
    *applied = true;
    return TRILL_OK;
}

/* One micro-batch's figures (sums over its tokens; all doubles, so the data ranks add them up as
 * one array). */
typedef struct micro_stats {
    double loss, pg_loss, kl_loss; /* token-mean with denominator 1, sequence means times their sequence count */
    double mask_tokens;            /* tokens in the loss */
    double clipped, ratio_sum, ratio_n, tokens;
} micro_stats;
enum { STATS = sizeof(micro_stats) / sizeof(double) };
_Static_assert(sizeof(micro_stats) == STATS * sizeof(double), "micro_stats is an array of doubles");

/* The loss of micro-batch m from its log-probs lp: d loss / d log-prob per token into dlp (sums:
 * token-mean with denominator 1, sequence means times their sequence count) and its figures
 * into *ms. */
static trill_status micro_loss(rl_trainer *r, const rl_batch *b, const micro *m, const token_arrays *ta, const float *lp, float *dlp,
                               micro_stats *ms) {
    const trill_rl_config *c = r->c;
    const int k = m->n;
    int *off = ws_get(r, WS_OFF, sizeof(int) * (size_t)(k + 1));
    trill_status st = off ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    const int R = off ? response_offsets(b, m, off) : 0;
    const size_t fR = sizeof(float) * (size_t)(R + 1);
    float *g_lp = ws_get(r, WS_G_LP, fR), *g_old = ws_get(r, WS_G_OLD, fR), *g_behav = ws_get(r, WS_G_BEHAV, fR),
          *g_ref = ws_get(r, WS_G_REF, fR), *g_w = ws_get(r, WS_G_W, fR), *g_d = ws_get(r, WS_G_D, fR);
    uint8_t *g_mask = ws_get(r, WS_G_MASK, (size_t)R + 1);
    double *adv = ws_get(r, WS_ADV, sizeof(double) * (size_t)(k + 1));
    if (!g_lp || !g_old || !g_behav || !g_ref || !g_w || !g_d || !g_mask || !adv) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        /* the response tokens' log-probs sit at their own packed positions */
        int j = 0;
        for (int i = 0; i < k; i++) {
            const int s = m->seq[i], from = m->offsets[i] + b->prompt_len[s], len = rl_response_len(b, s);
            memcpy(g_lp + j, lp + from, sizeof(float) * (size_t)len);
            adv[i] = b->adv[s];
            j += len;
        }
        gather_f(b, m, ta->old_logp, g_old);
        gather_f(b, m, b->behav_logp, g_behav);
        gather_f(b, m, ta->tis, g_w);
        gather_u8(b, m, ta->mask, g_mask);
        const bool kl_loss = c->algo.kl_coef > 0 && c->algo.kl_mode == TRILL_KL_LOSS;
        if (kl_loss) gather_f(b, m, ta->ref_logp, g_ref);
        rl_loss_batch lb = { .n_seqs = k, .offsets = off, .logp = g_lp, .old_logp = g_old, .behav_logp = g_behav,
                             .ref_logp = kl_loss ? g_ref : NULL, .adv = adv, .mask = g_mask, .is_weight = g_w, .agg_tokens = 1 };
        rl_loss_stats ls;
        trill_rl_policy_loss(c, &lb, g_d, &ls);
        const double scale = c->algo.aggregation == TRILL_AGG_TOKEN_MEAN ? 1.0 : (double)k; /* back to sums */
        long in = 0;
        for (int t = 0; t < R; t++) in += g_mask[t];
        *ms = (micro_stats){ .loss = ls.loss * scale, .pg_loss = ls.pg_loss * scale, .kl_loss = ls.kl_loss * scale, .mask_tokens = (double)in,
                             .clipped = ls.clip_frac * (double)in, .ratio_sum = ls.ratio_mean * (double)in, .ratio_n = (double)in,
                             .tokens = m->T };
        j = 0;
        for (int i = 0; i < k; i++) {
            const int s = m->seq[i], from = m->offsets[i] + b->prompt_len[s], len = rl_response_len(b, s);
            for (int t = 0; t < len; t++) dlp[from + t] = (float)(g_d[j + t] * scale);
            j += len;
        }
    }
    return st;
}

/* Losses are summed over micro-batches (token-mean with denominator 1, sequence means times their
 * sequence count), then the gradient is divided by the minibatch's denominator: the same
 * gradient as one pass over the whole minibatch. */
static trill_status train_minibatch(rl_trainer *r, const rl_batch *b, const int *seq, int n, bool have_old, token_arrays *ta,
                                    rl_train_stats *ts) {
    const trill_rl_config *c = r->c;
    micro_plan p;
    grad_sum g = { 0 };
    trill_status st = plan_micros(r, b, seq, n, &p);
    micro_stats *stat = st ? NULL : trill_calloc(p.M ? (size_t)p.M : 1, sizeof *stat);
    if (!st && !stat) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = grad_sum_create(r, &p, &g);
    if (!st && r->scorer) st = score_on_policy(r, b, seq, n, ta);
    for (int i = 0; i < p.rounds && !st; i++) { /* round i: this rank's i-th micro-batch, or an empty pass */
        const int mi = p.lo + i;
        const bool mine = mi < p.hi;
        const int at = mine ? p.first[mi] : 0, k = mine ? p.first[mi + 1] - at : 0;
        micro m;
        if ((st = micro_make(r, b, seq + at, k, replay_source(r, b, ta->onp_experts), &m))) break;
        float *lp = ws_get(r, WS_LP, sizeof(float) * (size_t)(m.T + 1)), *dlp = ws_get(r, WS_DLP, sizeof(float) * (size_t)(m.T + 1));
        uint16_t *ex = r->L ? ws_get(r, WS_EX, sizeof(uint16_t) * (size_t)(m.T + 1) * r->L * r->K) : NULL;
        trill_forward_pass *pass = NULL;
        if (!lp || !dlp || (r->L && !ex)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (dlp) memset(dlp, 0, sizeof(float) * (size_t)(m.T + 1)); /* only the loss's tokens are written */
        if (!st) st = trill_model_forward_train(r->policy, m.tokens, m.offsets, m.n, m.replay, lp, ex, c->trainer.recompute, &pass);
        if (!st && mine && r->scorer) { /* on-policy: the loss sees the generator's numbers, the backward runs through the trainer's forward */
            take_scored(b, &m, ta, lp);
            if (ex) take_scored_experts(b, &m, ta, ex);
        }
        if (!st && mine && !have_old) { /* first minibatch, weights unchanged: these are the old log-probs */
            scatter_logp(b, &m, lp, ta->old_logp);
            if (ex) scatter_experts(b, &m, ex, ta->train_experts);
            st = corrections(r, b, &m, ta);
        }
        if (!st && mine) st = micro_loss(r, b, &m, ta, lp, dlp, &stat[mi]);
        if (!st) st = backward_round(r, &p, &g, i, pass, dlp);
        trill_forward_pass_free(pass);
    }
    /* the minibatch's gradient (a fixed tree over its micro-batches) and figures (one writer each,
     * summed in micro-batch order): the same bits on any number of ranks */
    if (!st) st = grad_sum_finish(r, &g);
    if (!st && r->data) st = trill_comm_allreduce_f64(r->data, (double *)stat, (size_t)STATS * p.M);
    if (!st && !have_old) st = assemble(r, b, seq, &p, ta, true, false);
    double denom_tokens = 0, sums[3] = { 0 };
    for (int mi = 0; !st && mi < p.M; mi++) {
        const micro_stats *ms = &stat[mi];
        sums[0] += ms->loss;
        sums[1] += ms->pg_loss;
        sums[2] += ms->kl_loss;
        denom_tokens += ms->mask_tokens;
        ts->clip_tokens += ms->clipped;
        ts->ratio_sum += ms->ratio_sum;
        ts->ratio_n += ms->ratio_n;
        ts->tokens += (long)ms->tokens;
    }
    grad_sum_free(r, &g);
    free(stat);
    plan_free(&p);
    if (st) return st;
    const double denom = c->algo.aggregation == TRILL_AGG_TOKEN_MEAN ? (denom_tokens > 0 ? denom_tokens : 1) : (double)n;
    const int64_t total = (int64_t)c->steps * c->algo.minibatches;
    double grad_norm, lr;
    bool applied;
    if ((st = apply_update(r, denom, sums[0] / denom, total, &grad_norm, &lr, &applied))) return st;
    r->scorer_stale |= applied;
    if (!applied) {
        ts->skipped++;
        return TRILL_OK;
    }
    ts->loss += sums[0] / denom;
    ts->pg_loss += sums[1] / denom;
    ts->kl_loss += sums[2] / denom;
    ts->grad_norm = grad_norm;
    ts->lr = lr;
    ts->optimizer_steps++;
    return TRILL_OK;
}

/* After the optimizer: a non-finite parameter is never synced or checkpointed. */
static trill_status check_adapter(const rl_trainer *r) {
    const trill_lora *l = r->lora;
    for (size_t i = 0; i < l->n_params; i++)
        if (!isfinite(l->params[i])) {
            const char *name = "?";
            for (size_t k = 0; k < l->n_tensors; k++)
                if (l->params + i >= l->tensors[k].data && l->params + i < l->tensors[k].data + l->tensors[k].numel) name = l->tensors[k].name;
            return trill_error(TRILL_ERR_INVALID, "step %d: adapter tensor %s holds %g after the optimizer step: not synced or saved",
                               r->step, name, l->params[i]);
        }
    return TRILL_OK;
}

/* The step's per-token arrays over the whole batch (packed layout); experts start as "not routed". */
static trill_status token_arrays_alloc(const rl_trainer *r, const rl_batch *b, token_arrays *ta) {
    const size_t T = (size_t)b->offsets[b->n_seqs], row = (size_t)r->L * r->K;
    const bool ref = r->c->algo.kl_coef > 0;
    ta->old_logp = trill_calloc(T, sizeof(float));
    ta->ref_logp = ref ? trill_calloc(T, sizeof(float)) : NULL;
    ta->tis = trill_calloc(T, sizeof(float));
    ta->mask = trill_calloc(T, 1);
    ta->train_experts = row ? trill_malloc(sizeof(uint16_t) * T * row) : NULL;
    if (r->scorer) {
        ta->onp_logp = trill_malloc(sizeof(float) * T);
        ta->onp_experts = row ? trill_malloc(sizeof(uint16_t) * T * row) : NULL;
    }
    if (!ta->old_logp || (ref && !ta->ref_logp) || !ta->tis || !ta->mask || (row && !ta->train_experts) ||
        (r->scorer && (!ta->onp_logp || (row && !ta->onp_experts))))
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < T * row; i++) ta->train_experts[i] = TRILL_REPLAY_NONE;
    for (size_t i = 0; ta->onp_experts && i < T * row; i++) ta->onp_experts[i] = TRILL_REPLAY_NONE;
    return TRILL_OK;
}

static void token_arrays_free(token_arrays *ta) {
    free(ta->old_logp); free(ta->ref_logp); free(ta->tis); free(ta->mask); free(ta->train_experts); free(ta->onp_logp); free(ta->onp_experts);
}

/* Which sequences train, and their advantages. Dynamic sampling looks at the rewards of the task,
 * before any KL penalty: identical completions score the same, but their penalties differ by
 * rounding (the trainer's fp32 log-probs of a sequence depend a little on where it sits in the
 * packed batch). With KL as a reward, each reward is first penalised by its sequence's KL (a
 * pre-pass over every sequence gives the old and reference log-probs). kept[0, *n_kept). */
static trill_status shape_rewards(rl_trainer *r, rl_batch *b, token_arrays *ta, int *kept, int *n_kept, int *flat_groups) {
    const trill_rl_config *c = r->c;
    const int G = c->generator.n;
    trill_status st = TRILL_OK;
    *flat_groups = *n_kept = 0;
    for (int g = 0; g < b->n_seqs / G; g++) {
        const bool flat = trill_rl_group_is_flat(b->reward + (size_t)g * G, G);
        *flat_groups += flat;
        for (int j = 0; j < G; j++) b->keep[g * G + j] = !(flat && c->algo.dynamic_sampling);
    }
    if (c->algo.kl_coef > 0 && c->algo.kl_mode == TRILL_KL_REWARD) {
        for (int s = 0; s < b->n_seqs; s++) kept[s] = s;
        st = pre_pass(r, b, kept, b->n_seqs, true, true, ta);
        for (int s = 0; s < b->n_seqs && !st; s++) {
            double kl = 0;
            for (int t = b->offsets[s] + b->prompt_len[s]; t < b->offsets[s + 1]; t++)
                if (rl_sampled(b, t)) kl += trill_rl_kl_value(c->algo.kl_estimator, ta->old_logp[t], ta->ref_logp[t]);
            b->reward[s] -= c->algo.kl_coef * kl;
        }
    }
    if (st) return st;
    trill_rl_group_advantages(b->reward, b->n_seqs / G, G, c->algo.std_norm, 1e-6, b->adv);
    for (int s = 0; s < b->n_seqs; s++)
        if (b->keep[s]) kept[(*n_kept)++] = s;
    return TRILL_OK;
}

/* algo.minibatches optimizer steps over the kept sequences (after the pre-pass they need). */
static trill_status run_minibatches(rl_trainer *r, const rl_batch *b, const int *kept, int n_kept, token_arrays *ta, rl_train_stats *ts) {
    const trill_rl_config *c = r->c;
    const int M = c->algo.minibatches;
    const bool kl_reward = c->algo.kl_coef > 0 && c->algo.kl_mode == TRILL_KL_REWARD;
    const bool pre_old = !kl_reward && M > 1, pre_ref = !kl_reward && c->algo.kl_coef > 0;
    trill_status st = TRILL_OK;
    if (n_kept && (pre_old || pre_ref)) st = pre_pass(r, b, kept, n_kept, pre_old, pre_ref, ta);
    for (int mb = 0; mb < M && !st && n_kept && !ts->skipped; mb++) {
        const int lo = (int)((int64_t)n_kept * mb / M), hi = (int)((int64_t)n_kept * (mb + 1) / M);
        if (hi > lo) st = train_minibatch(r, b, kept + lo, hi - lo, pre_old || kl_reward || mb > 0, ta, ts);
    }
    return st;
}

/* Mismatch, corrections, KL to the reference and routing flips over the trained sequences'
 * response tokens. */
static trill_status measure_mismatch(const rl_trainer *r, const rl_batch *b, const int *kept, int n_kept, const token_arrays *ta,
                                     trill_rl_metrics *m) {
    const trill_rl_config *c = r->c;
    const size_t row = (size_t)r->L * r->K;
    long R = 0; /* the sampled tokens of the trained sequences */
    for (int i = 0; i < n_kept; i++)
        for (int t = b->offsets[kept[i]] + b->prompt_len[kept[i]]; t < b->offsets[kept[i] + 1]; t++) R += rl_sampled(b, t);
    float *old = trill_malloc(sizeof(float) * (size_t)(R + 1)), *behav = trill_malloc(sizeof(float) * (size_t)(R + 1));
    uint16_t *ge = row ? trill_malloc(sizeof(uint16_t) * row * (size_t)(R + 1)) : NULL;
    uint16_t *te = row ? trill_malloc(sizeof(uint16_t) * row * (size_t)(R + 1)) : NULL;
    double tis_sum = 0, tis_capped = 0, kl_ref_sum = 0;
    long j = 0, masked = 0, kl_ref_n = 0, differing = 0;
    trill_status st = old && behav && (!row || (ge && te)) ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_kept && !st; i++) {
        const int s = kept[i];
        for (int t = b->offsets[s] + b->prompt_len[s]; t < b->offsets[s + 1]; t++) {
            if (!rl_sampled(b, t)) continue; /* injected: no behaviour log-prob, never trained */
            old[j] = ta->old_logp[t];
            behav[j] = b->behav_logp[t];
            tis_sum += ta->tis[t];
            tis_capped += c->correction.tis > 0 && ta->tis[t] >= (float)c->correction.tis;
            masked += !ta->mask[t];
            if (ta->ref_logp) { kl_ref_sum += trill_rl_kl_value(c->algo.kl_estimator, ta->old_logp[t], ta->ref_logp[t]); kl_ref_n++; }
            /* the routing that produced token t was computed at position t - 1 */
            if (row) {
                memcpy(ge + (size_t)j * row, b->experts + (size_t)(t - 1) * row, sizeof(uint16_t) * row);
                memcpy(te + (size_t)j * row, ta->train_experts + (size_t)(t - 1) * row, sizeof(uint16_t) * row);
            }
            differing += memcmp(&old[j], &behav[j], sizeof(float)) != 0 || (row && memcmp(ge + (size_t)j * row, te + (size_t)j * row, sizeof(uint16_t) * row) != 0);
            j++;
        }
    }
    if (!st) {
        rl_mismatch mm;
        trill_rl_mismatch_measure(old, behav, (size_t)R, &mm);
        m->mismatch_mean_abs = mm.mean_abs;
        m->mismatch_max_abs = mm.max_abs;
        m->mismatch_k1 = mm.k1;
        m->mismatch_k3 = mm.k3;
        m->mismatch_chi2 = mm.chi2;
        m->mismatch_tokens = (long)mm.n_tokens;
        m->tis_mean = R ? tis_sum / R : NAN;
        m->tis_capped_frac = R ? tis_capped / R : NAN;
        m->mis_masked_frac = R ? (double)masked / R : NAN;
        m->kl_ref = kl_ref_n ? kl_ref_sum / kl_ref_n : NAN;
        double token_flip = 0;
        m->n_moe_layers = r->L;
        for (int l = 0; l < r->L; l++) m->flip_layer[l] = 0;
        if (row && R) trill_rl_routing_flips(ge, te, (size_t)R, r->L, r->K, &token_flip, m->flip_layer);
        m->flip_token_frac = row ? token_flip : NAN;
        m->on_policy = r->scorer != NULL;
        m->on_policy_differing = differing;
        m->time.score_s = r->score_s;
    }
    free(old); free(behav); free(ge); free(te);
    return st;
}

/* The step's per-token distributions over the trained response tokens (the mismatch's tokens)
 * and the lengths of every response of the batch. */
static void histograms(const rl_trainer *r, const rl_batch *b, const int *kept, int n_kept, const token_arrays *ta, trill_rl_metrics *m) {
    memset(&m->hist, 0, sizeof m->hist);
    m->has_hist = true;
    for (int i = 0; i < n_kept; i++) {
        const int s = kept[i], first = b->offsets[s] + b->prompt_len[s], n = b->offsets[s + 1] - first;
        if (!b->loss_mask) {
            trill_rl_hist_tokens(&m->hist, ta->old_logp + first, b->behav_logp + first, ta->tis + first, ta->mask + first, (size_t)n);
            continue;
        }
        for (int t = first; t < first + n; t++) /* sampled tokens only: injected ones have no behaviour log-prob */
            if (b->loss_mask[t]) trill_rl_hist_tokens(&m->hist, ta->old_logp + t, b->behav_logp + t, ta->tis + t, ta->mask + t, 1);
    }
    for (int s = 0; s < b->n_seqs; s++) trill_rl_hist_response(&m->hist, rl_response_len(b, s), r->c->generator.max_new_tokens);
}

trill_status trill_rl_trainer_step(rl_trainer *r, rl_batch *b, int step, rl_train_stats *ts, trill_rl_metrics *m) {
    token_arrays ta = { 0 };
    int *kept = trill_malloc(sizeof(int) * (size_t)b->n_seqs);
    memset(ts, 0, sizeof *ts);
    r->step = step;
    r->score_s = 0;
    trill_status st = kept ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = token_arrays_alloc(r, b, &ta);
    if (!st) st = shape_rewards(r, b, &ta, kept, &ts->kept, &ts->flat_groups);
    if (!st) st = run_minibatches(r, b, kept, ts->kept, &ta, ts);
    if (!st && ts->optimizer_steps) st = check_adapter(r);
    if (!st && ts->optimizer_steps) st = trill_rl_trainer_gather(r, false); /* what the sync ships */
    if (!st) st = measure_mismatch(r, b, kept, ts->kept, &ta, m);
    if (!st) histograms(r, b, kept, ts->kept, &ta, m);
    token_arrays_free(&ta);
    free(kept);
    return st;
}

trill_status trill_rl_trainer_export(rl_trainer *t, const float **data, size_t *n, const trill_model **merged) {
    *merged = NULL;
    if (t->c->sync.mode == TRILL_SYNC_ADAPTER) {
        *data = t->whole->params;
        *n = t->whole->n_params;
        return TRILL_OK;
    }
    memcpy(t->merge_model->params, t->merge_base, sizeof(float) * t->merge_model->n_f32);
    trill_status st = trill_lora_merge(t->whole, t->merge_model);
    *data = t->merge_model->params;
    *n = t->merge_model->n_f32;
    *merged = t->merge_model;
    return st;
}

/* ---- supervised fine-tuning ---- */

/* d loss / d log p of the micro-batch's tokens: -1 on each sequence's tokens after its prompt
 * (the completion and its end-of-sequence token; never a sequence's first token), 0 elsewhere;
 * returns how many. */
static long nll_weights(const rl_batch *b, const micro *m, float *dlp) {
    long n = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], len = m->offsets[i + 1] - m->offsets[i];
        for (int t = 0; t < len; t++) {
            const bool loss = t >= b->prompt_len[s] && t > 0;
            dlp[m->offsets[i] + t] = loss ? -1.0f : 0.0f;
            n += loss;
        }
    }
    return n;
}

/* The NLL of b's sequences after their prompts (and with `train` its gradient into lora_grads):
 * the batch cut into micro-batches by the packer's rule whatever the rank count; under data
 * parallelism each rank forwards a contiguous share of them (in rounds under expert
 * parallelism). Each micro-batch's gradient is a leaf of the step's tree and its NLL, loss
 * tokens and tokens are summed in micro-batch order, so every rank count gives the same bits. */
static trill_status nll_pass(rl_trainer *r, const rl_batch *b, bool train, double *nll, long *n_loss, long *tokens) {
    *nll = 0;
    *n_loss = *tokens = 0;
    int *seq = trill_malloc(sizeof(int) * (size_t)(b->n_seqs ? b->n_seqs : 1));
    micro_plan p = { 0 };
    grad_sum g = { 0 };
    trill_status st = seq ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int s = 0; s < b->n_seqs && seq; s++) seq[s] = s;
    if (!st) st = plan_micros(r, b, seq, b->n_seqs, &p);
    double *stat = st ? NULL : trill_calloc((size_t)3 * (p.M ? p.M : 1), sizeof(double)); /* per micro-batch: NLL, loss tokens, tokens */
    if (!st && !stat) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && train) st = grad_sum_create(r, &p, &g);
    for (int i = 0; i < p.rounds && !st; i++) { /* round i: this rank's i-th micro-batch, or an empty pass */
        const int mi = p.lo + i;
        const bool mine = mi < p.hi;
        const int k = mine ? p.first[mi + 1] - p.first[mi] : 0;
        micro m;
        if ((st = micro_make(r, b, seq + (mine ? p.first[mi] : 0), k, NULL, &m))) break;
        float *lp = ws_get(r, WS_LP, sizeof(float) * (size_t)(m.T + 1)), *dlp = ws_get(r, WS_DLP, sizeof(float) * (size_t)(m.T + 1));
        trill_forward_pass *pass = NULL;
        if (!lp || !dlp) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st && mine) stat[3 * mi + 1] = (double)nll_weights(b, &m, dlp);
        if (!st && train) st = trill_model_forward_train(r->policy, m.tokens, m.offsets, m.n, NULL, lp, NULL, r->c->trainer.recompute, &pass);
        if (!st && !train) st = trill_model_forward(r->policy, m.tokens, m.offsets, m.n, NULL, lp, NULL);
        for (int t = 0; !st && t < m.T; t++)
            if (dlp[t] != 0) stat[3 * mi] -= lp[t];
        if (!st && mine) stat[3 * mi + 2] = m.T;
        if (!st && train) st = backward_round(r, &p, &g, i, pass, dlp);
        trill_forward_pass_free(pass);
    }
    if (!st && train) st = grad_sum_finish(r, &g);
    /* one rank wrote each entry: the sum over ranks is that entry, exactly */
    if (!st && r->data) st = trill_comm_allreduce_f64(r->data, stat, (size_t)3 * p.M);
    for (int i = 0; !st && i < p.M; i++) {
        *nll += stat[3 * i];
        *n_loss += (long)stat[3 * i + 1];
        *tokens += (long)stat[3 * i + 2];
    }
    if (train) grad_sum_free(r, &g);
    free(stat);
    plan_free(&p);
    free(seq);
    return st;
}

trill_status trill_rl_trainer_nll_step(rl_trainer *r, const rl_batch *b, int step, int64_t total, rl_nll_stats *out) {
    memset(out, 0, sizeof *out);
    r->step = step;
    memset(r->lora_grads, 0, sizeof(float) * r->n_values);
    double nll;
    long n_loss;
    trill_status st = nll_pass(r, b, true, &nll, &n_loss, &out->tokens);
    if (st) return st;
    const double denom = n_loss ? (double)n_loss : 1;
    out->loss = nll / denom;
    return apply_update(r, denom, out->loss, total, &out->grad_norm, &out->lr, &out->applied);
}

trill_status trill_rl_trainer_nll(rl_trainer *r, const rl_batch *b, double *nll, long *n_loss) {
    long tokens;
    return nll_pass(r, b, false, nll, n_loss, &tokens);
}

trill_status trill_rl_trainer_save(const rl_trainer *t, const char *dir) {
    trill_status st = t->lora ? trill_lora_save(t->whole, dir) : trill_model_save(t->policy, dir, TRILL_F32, 5000000000u);
    char *prefix = st ? NULL : trill_path_join(dir, "optimizer");
    if (!st && !prefix) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_adamw_save(t->whole_opt ? t->whole_opt : t->opt, prefix);
    free(prefix);
    return st;
}

/* ---- distribution ---- */

/* The world's ranks as parallel.trainer lays them out: rank = (dp_index * ep + ep_index) * tp +
 * tp_index, so a group of either kind is consecutive ranks and the data ranks' shares stay
 * contiguous per expert-parallel group. */
static trill_status set_up_ranks(rl_trainer *r, trill_comm *world) {
    const trill_rl_config *c = r->c;
    r->P = r->tp_size = 1;
    if (!world || trill_comm_size(world) == 1) return TRILL_OK;
    r->data = world;
    const int ep = c->parallel.trainer.ep, tp = c->parallel.trainer.tp, me = trill_comm_rank(world);
    if (ep > 1 && tp > 1)
        return trill_error(TRILL_ERR_UNSUPPORTED, "parallel.trainer: ep %d with tp %d: expert and tensor parallelism together are not built "
                           "(either, with data parallelism, is)", ep, tp);
    if (c->generator.on_policy && (ep > 1 || tp > 1))
        return trill_error(TRILL_ERR_UNSUPPORTED, "generator.on_policy: its scoring engine needs the whole model, and parallel.trainer.%s %d "
                           "shards it (on-policy mode runs with data parallelism only)", ep > 1 ? "ep" : "tp", ep > 1 ? ep : tp);
    trill_status st = TRILL_OK;
    if (ep > 1) {
        r->P = ep;
        r->q = me % ep;
        st = trill_comm_split(world, me / ep, r->q, &r->ep);
        if (!st) st = trill_comm_split(world, r->q, me / ep, &r->edp);
        r->mp = r->ep;
        r->mp_rank = r->q;
    } else if (tp > 1) {
        r->tp_size = tp;
        r->tp_rank = me % tp;
        st = trill_comm_split(world, me / tp, r->tp_rank, &r->tp);
        if (!st) st = trill_comm_split(world, r->tp_rank, me / tp, &r->owned_data); /* the ranks of one share, one per group */
        r->data = r->owned_data;
        r->mp = r->tp;
        r->mp_rank = r->tp_rank;
    }
    return st;
}

/* The policy's shard for this rank (the whole model without model parallelism). */
static trill_shard shard_of(const rl_trainer *r) {
    return (trill_shard){ .ep_rank = r->q, .ep_size = r->P, .tp_rank = r->tp_rank, .tp_size = r->tp_size };
}

/* Under model parallelism: the model's shard joins its group, and (expert parallelism) the
 * gradient buffers of the held experts (one per group rank) and the adapters of every expert are
 * made. */
static trill_status set_up_shards(rl_trainer *r) {
    r->routed = r->lora ? trill_lora_routed_first(r->lora) : r->n_values;
    r->whole = r->lora;
    if (!r->mp) return TRILL_OK;
    trill_status st = r->ep ? trill_model_set_expert_comm(r->policy, r->ep) : trill_model_set_tensor_comm(r->policy, r->tp);
    if (!st && r->ep && !(r->src = trill_calloc((size_t)r->P, sizeof *r->src))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int j = 0; !st && r->ep && j < r->P; j++)
        if (!(r->src[j] = trill_malloc(sizeof(float) * (r->n_values - r->routed + 1))))
            st = trill_error(TRILL_ERR_NOMEM, "out of memory for the experts' gradients");
    r->whole = NULL;
    if (!st) st = trill_lora_create_whole(r->policy, r->lora->config, &r->whole);
    if (!st) st = trill_rl_trainer_gather(r, false);
    return st;
}

/* Copies a tensor laid out as `t` (rows of t->shape[1] at src) to its place in the whole
 * adapter's vector (at base, rows of t->whole_shape[1]), or (to_whole false) back. */
static void copy_slice(const trill_param *t, float *local, float *whole, bool to_whole) {
    for (int64_t i = 0; i < t->shape[0]; i++) {
        float *w = whole + (t->slice_at[0] + i) * t->whole_shape[1] + t->slice_at[1], *l = local + i * t->shape[1];
        memcpy(to_whole ? w : l, to_whole ? l : w, sizeof(float) * (size_t)t->shape[1]);
    }
}

/* dst (laid out as the whole adapter) = each tensor of the shard's src this rank speaks for at its
 * place there, the rest 0: the group's sum is then the whole adapter's vector. */
static void scatter_whole(const rl_trainer *r, const float *src, float *dst) {
    const trill_lora *l = r->lora;
    memset(dst, 0, sizeof(float) * l->n_global);
    for (size_t k = 0; k < l->n_tensors; k++) {
        const trill_param *t = &l->tensors[k];
        const size_t at = (size_t)(t->data - l->params);
        if (speaks_for(r, t, at)) copy_slice(t, (float *)src + at, dst + l->global_offset[k], true);
    }
}

/* The shard's part of a vector laid out as the whole adapter. */
static void slice_whole(const trill_lora *l, const float *whole, float *dst) {
    for (size_t k = 0; k < l->n_tensors; k++)
        copy_slice(&l->tensors[k], dst + (l->tensors[k].data - l->params), (float *)whole + l->global_offset[k], false);
}

trill_status trill_rl_trainer_gather(rl_trainer *r, bool optimizer) {
    if (!r->mp) return TRILL_OK;
    scatter_whole(r, r->lora->params, r->whole->params);
    trill_status st = trill_comm_allreduce_f32(r->mp, r->whole->params, r->whole->n_params);
    if (st || !optimizer) return st;
    if (!r->whole_opt && (st = trill_adamw_create(r->lora->n_global, r->opt->config, &r->whole_opt))) return st;
    r->whole_opt->config = r->opt->config;
    r->whole_opt->step = r->opt->step;
    scatter_whole(r, r->opt->exp_avg, r->whole_opt->exp_avg);
    scatter_whole(r, r->opt->exp_avg_sq, r->whole_opt->exp_avg_sq);
    st = trill_comm_allreduce_f32(r->mp, r->whole_opt->exp_avg, r->lora->n_global);
    if (!st) st = trill_comm_allreduce_f32(r->mp, r->whole_opt->exp_avg_sq, r->lora->n_global);
    return st;
}

/* The optimizer state of the adapters from `prefix` (a checkpoint's: the whole adapter's, which a
 * shard takes its part of), with this config's weight decay. */
static trill_status load_optimizer(rl_trainer *r, const char *prefix) {
    const size_t n_file = r->lora ? r->lora->n_global : r->n_values;
    trill_adamw *whole = NULL;
    trill_status st = trill_adamw_load(prefix, n_file, &whole);
    if (!st && r->mp) {
        if (!(st = trill_adamw_create(r->n_values, whole->config, &r->opt))) {
            r->opt->step = whole->step;
            slice_whole(r->lora, whole->exp_avg, r->opt->exp_avg);
            slice_whole(r->lora, whole->exp_avg_sq, r->opt->exp_avg_sq);
        }
        trill_adamw_free(whole);
    } else if (!st) {
        r->opt = whole;
    }
    if (!st) r->opt->config.weight_decay = r->c->trainer.weight_decay; /* the moments are the checkpoint's, the settings this config's */
    return st;
}

static trill_status new_optimizer(rl_trainer *r) {
    trill_adamw_config ac = trill_adamw_defaults();
    ac.weight_decay = r->c->trainer.weight_decay;
    return trill_adamw_create(r->n_values, ac, &r->opt);
}

/* The adapters as the trainable values, and their gradient buffers. */
static trill_status use_adapters(rl_trainer *r) {
    r->lora->enabled = true;
    trill_model_attach_lora(r->policy, r->lora);
    r->values = r->lora->params;
    r->n_values = r->lora->n_params;
    r->lora_grads = trill_calloc(r->n_values ? r->n_values : 1, sizeof(float));
    r->leaf = trill_malloc(sizeof(float) * (r->n_values ? r->n_values : 1));
    return r->lora_grads && r->leaf ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

/* Full fine-tuning: every weight trains, fp32, without decay on the norm weights (1-D tensors). */
static trill_status make_full(rl_trainer *r) {
    r->values = r->policy->params;
    r->n_values = r->policy->n_params;
    r->no_decay = trill_calloc(r->n_values ? r->n_values : 1, 1);
    r->lora_grads = trill_calloc(r->n_values ? r->n_values : 1, sizeof(float));
    r->leaf = trill_malloc(sizeof(float) * (r->n_values ? r->n_values : 1));
    if (!r->no_decay || !r->lora_grads || !r->leaf) return trill_error(TRILL_ERR_NOMEM, "out of memory for the gradients of %zu weights", r->n_values);
    for (size_t t = 0; t < r->policy->n_tensors; t++)
        if (r->policy->tensors[t].ndim == 1) memset(r->no_decay + (r->policy->tensors[t].data - r->policy->params), 1, r->policy->tensors[t].numel);
    return TRILL_OK;
}

trill_status trill_rl_trainer_create_sft(const trill_rl_config *c, const char *model_dir, const char *resume_dir, trill_comm *world,
                                         rl_trainer **out) {
    rl_trainer *t = trill_calloc(1, sizeof *t);
    if (!t) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    t->c = c;
    const bool full = c->sft.mode == TRILL_SFT_FULL;
    trill_status st = set_up_ranks(t, world);
    if (!st && full && (t->P > 1 || t->tp_size > 1))
        st = trill_error(TRILL_ERR_UNSUPPORTED, "sft.mode full: full fine-tuning with parallel.trainer.%s %d is not built (adapters train "
                         "under model parallelism: sft.mode lora)", t->P > 1 ? "ep" : "tp", t->P > 1 ? t->P : t->tp_size);
    const trill_shard shard = shard_of(t);
    /* LoRA: a frozen base in the checkpoint's dtype (a shard of it under expert parallelism); full:
     * fp32 master weights (a resumed run's own) */
    if (!st)
        st = trill_model_load_shard(full && resume_dir ? resume_dir : model_dir, full ? TRILL_STORE_F32 : TRILL_STORE_CHECKPOINT, &shard,
                                    &t->policy);
    if (!st) trill_model_set_precision(t->policy, c->trainer.precision);
    if (!st && !full) st = resume_dir ? trill_lora_load(t->policy, resume_dir, &t->lora) : trill_lora_create(t->policy, c->trainer.lora, c->seed, &t->lora);
    if (!st) st = full ? make_full(t) : use_adapters(t);
    char *prefix = !st && resume_dir ? trill_path_join(resume_dir, "optimizer") : NULL;
    if (!st && resume_dir) st = prefix ? load_optimizer(t, prefix) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(prefix);
    if (!st && !resume_dir) st = new_optimizer(t);
    if (!st) st = set_up_shards(t);
    if (st) {
        trill_rl_trainer_free(t);
        return st;
    }
    *out = t;
    return TRILL_OK;
}

/* ---- set-up ---- */

static trill_status make_trainable(rl_trainer *r, const char *ckpt) {
    const trill_rl_config *c = r->c;
    trill_status st;
    char path[4200];
    if (ckpt) {
        snprintf(path, sizeof path, "%s/adapter", ckpt);
        st = trill_lora_load(r->policy, path, &r->lora);
    } else {
        st = trill_lora_create(r->policy, c->trainer.lora, c->seed, &r->lora);
    }
    if (!st) st = use_adapters(r);
    if (!st && ckpt) {
        snprintf(path, sizeof path, "%s/optimizer", ckpt);
        st = load_optimizer(r, path);
    }
    if (!st && !ckpt) st = new_optimizer(r);
    return st;
}

trill_status trill_rl_trainer_create(const trill_rl_config *c, const char *model_dir, const char *ckpt, trill_comm *world, rl_trainer **out) {
    rl_trainer *t = trill_calloc(1, sizeof *t);
    if (!t) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    t->c = c;
    trill_status st = set_up_ranks(t, world);
    const trill_shard shard = shard_of(t);
    if (!st) st = trill_model_load_shard(model_dir, TRILL_STORE_CHECKPOINT, &shard, &t->policy);
    if (!st) {
        trill_model_set_precision(t->policy, c->trainer.precision);
        const trill_config *mc = trill_model_config(t->policy);
        t->L = mc->n_moe_layers;
        t->K = mc->num_experts_per_tok;
    }
    if (!st && c->sync.mode == TRILL_SYNC_MERGE) {
        st = trill_model_load_as(model_dir, TRILL_STORE_F32, &t->merge_model);
        if (!st && !(t->merge_base = trill_malloc(sizeof(float) * t->merge_model->n_f32))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st) memcpy(t->merge_base, t->merge_model->params, sizeof(float) * t->merge_model->n_f32);
    }
    if (!st) st = make_trainable(t, ckpt);
    if (!st) st = set_up_shards(t);
    if (!st && c->generator.on_policy) {
        const trill_engine_config ec = trill_rl_engine_config(c, trill_model_config(t->policy));
        st = trill_engine_create(t->policy, &ec, &t->scorer);
        t->scorer_stale = true;
    }
    if (st) {
        trill_rl_trainer_free(t);
        return st;
    }
    *out = t;
    return TRILL_OK;
}

void trill_rl_trainer_free(rl_trainer *t) {
    if (!t) return;
    for (int i = 0; i < WS_N; i++) free(t->ws[i].p);
    trill_engine_free(t->scorer);
    if (t->policy) {
        trill_model_attach_lora(t->policy, NULL);
        trill_model_set_expert_comm(t->policy, NULL);
        trill_model_set_tensor_comm(t->policy, NULL);
    }
    if (t->whole != t->lora) trill_lora_free(t->whole);
    trill_lora_free(t->lora);
    free(t->lora_grads);
    free(t->leaf);
    for (int j = 0; t->src && j < t->P; j++) free(t->src[j]);
    free(t->src);
    free(t->no_decay);
    trill_adamw_free(t->opt);
    trill_adamw_free(t->whole_opt);
    trill_model_free(t->policy);
    trill_model_free(t->merge_model);
    free(t->merge_base);
    trill_comm_free(t->ep);
    trill_comm_free(t->edp);
    trill_comm_free(t->tp);
    trill_comm_free(t->owned_data);
    free(t);
}

bool trill_rl_trainer_sharded(const rl_trainer *t) { return t->mp != NULL; }

trill_comm_stats trill_rl_trainer_comm_stats(const rl_trainer *t) {
    trill_comm_stats sum = { 0 };
    const trill_comm *comms[4] = { t->data, t->ep, t->edp, t->tp };
    for (int i = 0; i < 4; i++) {
        if (!comms[i]) continue;
        const trill_comm_stats s = trill_comm_stats_get(comms[i]);
        for (int k = 0; k < TRILL_COMM_KINDS; k++) {
            sum.calls[k] += s.calls[k];
            sum.bytes[k] += s.bytes[k];
            sum.ms[k] += s.ms[k];
        }
    }
    return sum;
}

void trill_rl_trainer_comm_reset(rl_trainer *t) {
    trill_comm *comms[4] = { t->data, t->ep, t->edp, t->tp };
    for (int i = 0; i < 4; i++)
        if (comms[i]) trill_comm_stats_reset(comms[i]);
}

const trill_model *trill_rl_trainer_policy(const rl_trainer *t) { return t->policy; }
trill_lora *trill_rl_trainer_lora(rl_trainer *t) { return t->whole; }
trill_adamw *trill_rl_trainer_optimizer(rl_trainer *t) { return t->whole_opt ? t->whole_opt : t->opt; }
