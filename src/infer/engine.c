/* The generator engine (trill/infer.h): weights in the engine's format, the paged KV cache,
 * the continuous-batching scheduler, one batched forward per step, sampling and capture.
 *
 * A step's rows are (sequence, position) pairs: one for each decoding sequence and chunks of
 * prompts being prefilled. Every kernel computes a row on its own with a fixed order of
 * operations (infer/gemm.h is batch-invariant; attention reads the row's own sequence from the
 * cache), so a sequence's results do not depend on its neighbours in the batch. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "infer/gemm.h"
#include "infer/kvcache.h"
#include "kernels/exp_nonpos.h"
#include "trill/infer.h"
#include "trill/eplb.h"
#include "trill/kernels.h"
#include "trill/lora.h"

/* ---- configuration ---- */

trill_engine_config trill_engine_config_default(void) {
    return (trill_engine_config){ .format = TRILL_GEN_BF16, .block_size = 16, .kv_cache_mb = 256, .max_batch_tokens = 512,
                                  .max_running = 256, .eplb_redundant = -1, .eplb_window = 64, .eplb_interval = 16 };
}

/* Loops fork threads only for this many elements or more (as the kernels do): a decode step's
 * few rows cost less than the fork. */
enum { PARALLEL_MIN = 16384 };

/* ---- state ---- */

typedef struct eng_layer {
    float *input_norm, *q_norm, *k_norm, *post_norm; /* fp32 copies */
    gen_matrix qkv;      /* [q | k | v] projections fused: [(nh + 2 nkv) hd, H] */
    gen_matrix o;        /* [H, nh hd] */
    gen_matrix gate_up;  /* dense: [gate | up] fused [2 I, H] */
    gen_matrix down;     /* dense: [H, I] */
    gen_matrix router;   /* MoE: [E, H] */
    gen_matrix *experts_gate_up; /* MoE: [E] of [2 Im, H] */
    gen_matrix *experts_down;    /* MoE: [E] of [H, Im] */
} eng_layer;

/* Every weight the forward reads, in the engine's format: swapped whole on a merged update. */
typedef struct eng_weights {
    eng_layer *layers;
    float *final_norm;
    gen_matrix lm_head;
    float *embed_f32;     /* [V, H] (f32 format) ... */
    uint16_t *embed_bf16; /* ... or bf16 (the others) */
    size_t bytes;         /* as served */
} eng_weights;

/* LoRA on one engine matrix, whose output columns may be several fused modules ("parts"):
 * y[:, part p] += scale * (x A_p^T) B_p^T. The adapted parts' A are stacked into one matrix so
 * x is read once; everything in TRILL_GEN_F32 (the adapters are small, and stay exact). */
typedef struct eng_lora {
    int n_adapted;       /* 0: no adapter on this matrix */
    gen_matrix A;        /* [n_adapted * r, K] */
    gen_matrix B[3];     /* per adapted part: [cols, r] */
    int col0[3], cols[3];
} eng_lora;

typedef struct eng_lora_layer {
    eng_lora qkv, o, gate_up, down;
    eng_lora *experts_gate_up, *experts_down; /* [E] */
} eng_lora_layer;

/* A set of adapters, applied on the side of the base weights (adapter sync mode). */
typedef struct eng_adapter {
    int rank;
    float scale;
    eng_lora_layer *layers;
    eng_lora lm_head;
    size_t bytes;
} eng_adapter;

typedef struct req {
    trill_request r; /* arrays below are the engine's copies */
    int *prompt, *stop_ids;
    char **stop_strings;
    size_t max_stop_len;
} req;

typedef struct seq {
    req *rq;
    int sample;
    int *tokens;          /* [cap]: prompt then generated */
    int n_tokens, cap;
    int n_prompt;
    int n_computed;       /* tokens whose K/V are in the cache */
    kv_table kv;
    float *logprobs;      /* [max_new_tokens] */
    uint32_t *versions;
    uint16_t *experts;    /* capture: [cap][n_moe][K] */
    bool forks_pending;   /* a group's first sequence: its siblings fork off when the prompt is done */
} seq;

/* A live update waiting for the next step: set by any thread, taken by the stepping one. */
typedef struct eng_mailbox {
    pthread_mutex_t lock;
    bool pending, has_w, has_ad;
    eng_weights *w;
    eng_adapter *ad;
    uint32_t version;
} eng_mailbox;

/* Every request and sequence the engine holds, and the finished ones not yet collected. */
typedef struct eng_sched {
    seq **active;  /* holding KV blocks, in admission order */
    int n_active, cap_active;
    seq **waiting; /* FIFO; preempted sequences go back to the front */
    int n_waiting, cap_waiting;
    req **reqs;    /* every request with unfinished samples */
    int n_reqs, cap_reqs;
    trill_sequence_out *done;
    int n_done, cap_done;
} eng_sched;

/* The step's rows, (sequence, position, token), for up to max_batch_tokens of them. */
typedef struct eng_rows {
    int max;
    seq **seq;
    int *pos, *token;
    int *logit;           /* the rows that produce logits, in order */
} eng_rows;

/* The forward's buffers, for rows.max rows. */
typedef struct eng_scratch {
    float *x, *xn, *qkv, *q, *k, *v, *att, *out, *ff, *act, *probs, *topw, *xe, *ye, *logits;
    int *topi, *order, *count;
    int *where;           /* [R*K] position of each (row, slot) pair in order */
    int *phys;            /* EPLB: [R*K] physical slot of each (row, slot) pair */
    float *inv_freq;
    float *scores;        /* per thread: [group][max_context] attention scores */
    int max_context;
    int score_threads;    /* threads the scores are sized for */
    float *lora_xa, *lora_in, *lora_out; /* adapters: x A^T of the stacked parts, one part's, its B product */
    int lora_rank;        /* the rank these are sized for */
    int lora_cols;        /* lora_out's row stride for expert rows */
} eng_scratch;

/* Sampling's buffers: per-thread scratch, and this step's samples (sequence, logits row, result). */
typedef struct eng_sampler {
    void *scratch;        /* one trill_sample scratch per thread */
    int threads;          /* threads the scratch is sized for */
    seq **seq;
    int *row, *token, cap;
    float *lp;
} eng_sampler;

/* EPLB (off when window is NULL). */
typedef struct eng_eplb {
    trill_eplb_window *window;
    trill_eplb_plan plan;
    uint32_t *counts;     /* [n_moe][E] this step's routed tokens */
    int workers, steps;
} eng_eplb;

struct trill_engine {
    trill_config c;
    trill_engine_config cfg;
    eng_weights *w;       /* the weights steps run on */
    eng_adapter *ad;      /* and their adapters, or NULL */
    uint32_t version;     /* of w + ad: recorded with every token sampled */
    eng_mailbox update;
    kv_cache kv;
    eng_sched sched;
    eng_rows rows;
    eng_scratch fwd;
    eng_sampler smp;
    eng_eplb eplb;
};

static void *grow(void *p, int *cap, int need, size_t elem) {
    if (need <= *cap) return p;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(p, (size_t)c * elem);
    if (q) *cap = c;
    return q;
}

/* ---- weights ---- */

/* One generator matrix from the row-wise concatenation of parts (all [rows_i, K], same storage). */
static trill_status make_matrix(gen_matrix *g, trill_gen_format f, const trill_weight *parts, const int *rows, int n_parts, int K) {
    int N = 0;
    for (int i = 0; i < n_parts; i++) N += rows[i];
    if (n_parts == 1) return gen_matrix_create(g, f, parts[0].f32, parts[0].bf16, N, K);
    const bool half = parts[0].bf16 != NULL;
    const size_t elem = half ? sizeof(uint16_t) : sizeof(float);
    char *buf = malloc((size_t)N * K * elem), *at = buf;
    if (!buf) return trill_error(TRILL_ERR_NOMEM, "out of memory converting weights");
    for (int i = 0; i < n_parts; i++) {
        memcpy(at, half ? (const void *)parts[i].bf16 : (const void *)parts[i].f32, (size_t)rows[i] * K * elem);
        at += (size_t)rows[i] * K * elem;
    }
    trill_status st = gen_matrix_create(g, f, half ? NULL : (const float *)buf, half ? (const uint16_t *)buf : NULL, N, K);
    free(buf);
    return st;
}

static float *copy_floats(const float *src, size_t n) {
    float *p = malloc(n * sizeof(float));
    if (p) memcpy(p, src, n * sizeof(float));
    return p;
}

static void free_weights(const trill_config *c, eng_weights *w) {
    if (!w) return;
    for (int l = 0; w->layers && l < c->num_hidden_layers; l++) {
        eng_layer *L = &w->layers[l];
        free(L->input_norm); free(L->q_norm); free(L->k_norm); free(L->post_norm);
        gen_matrix_free(&L->qkv); gen_matrix_free(&L->o); gen_matrix_free(&L->gate_up); gen_matrix_free(&L->down);
        gen_matrix_free(&L->router);
        for (int x = 0; L->experts_gate_up && x < c->num_experts; x++) {
            gen_matrix_free(&L->experts_gate_up[x]);
            gen_matrix_free(&L->experts_down[x]);
        }
        free(L->experts_gate_up);
        free(L->experts_down);
    }
    free(w->layers);
    gen_matrix_free(&w->lm_head);
    free(w->final_norm); free(w->embed_f32); free(w->embed_bf16);
    free(w);
}

static trill_status fill_weights(eng_weights *w, const trill_config *c, trill_gen_format f, const trill_model *m) {
    const int H = c->hidden_size, hd = c->head_dim, qd = c->num_attention_heads * hd, kvd = c->num_key_value_heads * hd;
    /* int8 leaves the router and lm_head in bf16, as W8A8 serving does: routing and the output
     * distribution are the most sensitive to quantisation */
    const trill_gen_format fine = f == TRILL_GEN_INT8 ? TRILL_GEN_BF16 : f;
    trill_status st = TRILL_OK;
    if (!(w->layers = calloc((size_t)c->num_hidden_layers, sizeof *w->layers))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->num_hidden_layers && !st; l++) {
        const trill_layer_weights *mw = &m->layers[l];
        eng_layer *L = &w->layers[l];
        L->input_norm = copy_floats(mw->input_norm, (size_t)H);
        L->post_norm = copy_floats(mw->post_norm, (size_t)H);
        L->q_norm = copy_floats(mw->q_norm, (size_t)hd);
        L->k_norm = copy_floats(mw->k_norm, (size_t)hd);
        if (!L->input_norm || !L->post_norm || !L->q_norm || !L->k_norm) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        const trill_weight qkv[3] = { mw->wq, mw->wk, mw->wv };
        const int qkv_rows[3] = { qd, kvd, kvd };
        if ((st = make_matrix(&L->qkv, f, qkv, qkv_rows, 3, H))) break;
        if ((st = make_matrix(&L->o, f, &mw->wo, &H, 1, qd))) break;
        if (trill_config_is_moe(c, l)) {
            const int E = c->num_experts, Im = c->moe_intermediate_size;
            if ((st = make_matrix(&L->router, fine, &mw->router, &E, 1, H))) break;
            L->experts_gate_up = calloc((size_t)E, sizeof(gen_matrix));
            L->experts_down = calloc((size_t)E, sizeof(gen_matrix));
            if (!L->experts_gate_up || !L->experts_down) return trill_error(TRILL_ERR_NOMEM, "out of memory");
            for (int x = 0; x < E && !st; x++) {
                const trill_weight gu[2] = { trill_weight_at(mw->expert_gate, (size_t)x * Im * H), trill_weight_at(mw->expert_up, (size_t)x * Im * H) };
                const int gu_rows[2] = { Im, Im };
                const trill_weight dn = trill_weight_at(mw->expert_down, (size_t)x * H * Im);
                if (!(st = make_matrix(&L->experts_gate_up[x], f, gu, gu_rows, 2, H))) st = make_matrix(&L->experts_down[x], f, &dn, &H, 1, Im);
            }
        } else {
            const int I = c->intermediate_size;
            const trill_weight gu[2] = { mw->mlp_gate, mw->mlp_up };
            const int gu_rows[2] = { I, I };
            if (!(st = make_matrix(&L->gate_up, f, gu, gu_rows, 2, H))) st = make_matrix(&L->down, f, &mw->mlp_down, &H, 1, I);
        }
    }
    if (st) return st;
    if ((st = make_matrix(&w->lm_head, fine, &m->lm_head, &c->vocab_size, 1, H))) return st;
    w->final_norm = copy_floats(m->final_norm, (size_t)H);
    const size_t table = (size_t)c->vocab_size * H;
    if (f == TRILL_GEN_F32) {
        if ((w->embed_f32 = malloc(table * sizeof(float))) && m->embed.f32) memcpy(w->embed_f32, m->embed.f32, table * sizeof(float));
        else if (w->embed_f32) bf16_widen(w->embed_f32, m->embed.bf16, table);
    } else if ((w->embed_bf16 = malloc(table * sizeof(uint16_t)))) {
        if (m->embed.bf16) memcpy(w->embed_bf16, m->embed.bf16, table * sizeof(uint16_t));
        else trill_from_f32(w->embed_bf16, m->embed.f32, TRILL_BF16, table);
    }
    if (!w->final_norm || (!w->embed_f32 && !w->embed_bf16)) return trill_error(TRILL_ERR_NOMEM, "out of memory");

    size_t bytes = w->lm_head.bytes + table * (f == TRILL_GEN_F32 ? 4 : 2) + (size_t)H * 4;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const eng_layer *L = &w->layers[l];
        bytes += L->qkv.bytes + L->o.bytes + L->gate_up.bytes + L->down.bytes + L->router.bytes + (size_t)(2 * H + 2 * hd) * 4;
        for (int x = 0; L->experts_gate_up && x < c->num_experts; x++) bytes += L->experts_gate_up[x].bytes + L->experts_down[x].bytes;
    }
    w->bytes = bytes;
    return TRILL_OK;
}

/* m's weights in `format`: m must have this engine's architecture. */
static trill_status build_weights(const trill_config *c, trill_gen_format format, const trill_model *m, eng_weights **out) {
    eng_weights *w = calloc(1, sizeof *w);
    if (!w) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = fill_weights(w, c, format, m);
    if (st) {
        free_weights(c, w);
        return st;
    }
    *out = w;
    return TRILL_OK;
}

/* ---- adapters ---- */

static void free_lora(eng_lora *el) {
    gen_matrix_free(&el->A);
    for (int a = 0; a < 3; a++) gen_matrix_free(&el->B[a]);
    *el = (eng_lora){ 0 };
}

static void free_adapter(const trill_config *c, eng_adapter *ad) {
    if (!ad) return;
    for (int l = 0; ad->layers && l < c->num_hidden_layers; l++) {
        eng_lora_layer *L = &ad->layers[l];
        free_lora(&L->qkv); free_lora(&L->o); free_lora(&L->gate_up); free_lora(&L->down);
        for (int x = 0; L->experts_gate_up && x < c->num_experts; x++) {
            free_lora(&L->experts_gate_up[x]);
            free_lora(&L->experts_down[x]);
        }
        free(L->experts_gate_up);
        free(L->experts_down);
    }
    free(ad->layers);
    free_lora(&ad->lm_head);
    free(ad);
}

/* The adapter of a matrix made of n_parts modules of cols[p] outputs each (pairs[p].A NULL:
 * that module has no adapter). */
static trill_status make_lora(eng_lora *el, const trill_lora_pair *pairs, const int *cols, int n_parts, int K, int r, size_t *bytes) {
    int na = 0;
    for (int p = 0; p < n_parts; p++) na += pairs[p].A != NULL;
    if (na == 0) return TRILL_OK;
    float *A = malloc(sizeof(float) * (size_t)na * r * K);
    if (!A) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    for (int p = 0, a = 0, col = 0; p < n_parts; col += cols[p], p++) {
        if (!pairs[p].A) continue;
        memcpy(A + (size_t)a * r * K, pairs[p].A, sizeof(float) * (size_t)r * K);
        if (!st) st = gen_matrix_create(&el->B[a], TRILL_GEN_F32, pairs[p].B, NULL, cols[p], r);
        el->col0[a] = col;
        el->cols[a] = cols[p];
        *bytes += sizeof(float) * ((size_t)r * K + (size_t)cols[p] * r);
        a++;
    }
    if (!st) st = gen_matrix_create(&el->A, TRILL_GEN_F32, A, NULL, na * r, K);
    free(A);
    el->n_adapted = na;
    return st;
}

static trill_status fill_adapter(eng_adapter *ad, const trill_config *c, const trill_lora *lora) {
    const int H = c->hidden_size, hd = c->head_dim, qd = c->num_attention_heads * hd, kvd = c->num_key_value_heads * hd;
    const int r = lora->config.rank;
    ad->rank = r;
    ad->scale = lora->scale;
    if (!(ad->layers = calloc((size_t)c->num_hidden_layers, sizeof *ad->layers))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    for (int l = 0; l < c->num_hidden_layers && !st; l++) {
        const trill_lora_layer *src = &lora->layers[l];
        eng_lora_layer *L = &ad->layers[l];
        const trill_lora_pair qkv[3] = { src->q, src->k, src->v };
        const int qkv_cols[3] = { qd, kvd, kvd };
        if (!(st = make_lora(&L->qkv, qkv, qkv_cols, 3, H, r, &ad->bytes))) st = make_lora(&L->o, &src->o, &H, 1, qd, r, &ad->bytes);
        if (st) break;
        if (trill_config_is_moe(c, l)) {
            const int E = c->num_experts, Im = c->moe_intermediate_size;
            L->experts_gate_up = calloc((size_t)E, sizeof(eng_lora));
            L->experts_down = calloc((size_t)E, sizeof(eng_lora));
            if (!L->experts_gate_up || !L->experts_down) return trill_error(TRILL_ERR_NOMEM, "out of memory");
            const trill_lora_pair none = { 0 };
            for (int x = 0; x < E && !st; x++) {
                const trill_lora_pair gu[2] = { src->expert_gate ? src->expert_gate[x] : none, src->expert_up ? src->expert_up[x] : none };
                const int gu_cols[2] = { Im, Im };
                const trill_lora_pair dn = src->expert_down ? src->expert_down[x] : none;
                if (!(st = make_lora(&L->experts_gate_up[x], gu, gu_cols, 2, H, r, &ad->bytes)))
                    st = make_lora(&L->experts_down[x], &dn, &H, 1, Im, r, &ad->bytes);
            }
        } else {
            const int I = c->intermediate_size;
            const trill_lora_pair gu[2] = { src->gate, src->up };
            const int gu_cols[2] = { I, I };
            if (!(st = make_lora(&L->gate_up, gu, gu_cols, 2, H, r, &ad->bytes))) st = make_lora(&L->down, &src->down, &H, 1, I, r, &ad->bytes);
        }
    }
    if (!st) st = make_lora(&ad->lm_head, &lora->lm_head, &c->vocab_size, 1, H, r, &ad->bytes);
    return st;
}

static trill_status build_adapter(const trill_config *c, const trill_lora *lora, eng_adapter **out) {
    eng_adapter *ad = calloc(1, sizeof *ad);
    if (!ad) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = fill_adapter(ad, c, lora);
    if (st) {
        free_adapter(c, ad);
        return st;
    }
    *out = ad;
    return TRILL_OK;
}

/* ---- creation ---- */

static trill_status alloc_step_buffers(trill_engine *e) {
    const trill_config *c = &e->c;
    const size_t R = (size_t)e->rows.max, H = c->hidden_size, hd = c->head_dim;
    const size_t qd = (size_t)c->num_attention_heads * hd, kvd = (size_t)c->num_key_value_heads * hd;
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, E = c->num_experts > 0 ? c->num_experts : 1;
    const size_t I = c->intermediate_size, Im = c->moe_intermediate_size, ffw = I > Im ? I : Im;
    const size_t rows_ff = R * K > R ? R * K : R;
    eng_scratch *f = &e->fwd;
    float **fl[] = { &f->x, &f->xn, &f->qkv, &f->q, &f->k, &f->v, &f->att, &f->out, &f->ff, &f->act, &f->probs, &f->topw, &f->xe,
                     &f->ye, &f->logits };
    const size_t fn[] = { R * H, R * H, R * (qd + 2 * kvd), R * qd, R * kvd, R * kvd, R * qd, R * H, rows_ff * 2 * ffw, rows_ff * ffw,
                          R * E, R * K, rows_ff * H, rows_ff * H, R * (size_t)c->vocab_size };
    bool ok = true;
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) ok &= (*fl[i] = malloc(fn[i] * sizeof(float))) != NULL;
    f->topi = malloc(R * K * sizeof(int));
    f->order = malloc(R * K * sizeof(int));
    const size_t slots = e->eplb.window ? (size_t)e->eplb.plan.n_physical : E;
    f->count = malloc((slots + 1) * sizeof(int));
    f->where = malloc(R * K * sizeof(int));
    f->phys = malloc(R * K * sizeof(int));
    e->rows.logit = malloc(R * sizeof(int));
    e->rows.seq = malloc(R * sizeof(seq *));
    e->rows.pos = malloc(R * sizeof(int));
    e->rows.token = malloc(R * sizeof(int));
    f->inv_freq = malloc(hd / 2 * sizeof(float));
    f->score_threads = e->smp.threads = omp_get_max_threads();
    e->smp.scratch = malloc(trill_sample_scratch_size(c->vocab_size) * (size_t)e->smp.threads);
    ok &= f->topi && f->order && f->count && f->where && f->phys && e->rows.logit && e->rows.seq && e->rows.pos && e->rows.token &&
          f->inv_freq && e->smp.scratch;
    if (!ok) return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers (%d rows)", e->rows.max);
    rope_inv_freq(e->fwd.inv_freq, c->head_dim, c->rope_theta);
    return TRILL_OK;
}

/* Physical slots: the logical experts plus the redundant ones, a whole number per worker; the
 * first plan balances a uniform load (every expert replicated in turn). */
static trill_status eplb_start(trill_engine *e) {
    const trill_config *c = &e->c;
    const int E = c->num_experts, L = c->n_moe_layers;
    e->eplb.workers = e->cfg.eplb_workers > 0 ? e->cfg.eplb_workers : omp_get_max_threads();
    const int W = e->eplb.workers;
    int P = E + (e->cfg.eplb_redundant >= 0 ? e->cfg.eplb_redundant : W);
    P = (P + W - 1) / W * W;
    if (e->cfg.eplb_window < 1 || e->cfg.eplb_interval < 1)
        return trill_error(TRILL_ERR_INVALID, "engine: eplb_window and eplb_interval must be >= 1 (got %d and %d)", e->cfg.eplb_window,
                           e->cfg.eplb_interval);
    double *load = malloc(sizeof(double) * (size_t)L * E);
    e->eplb.counts = calloc((size_t)L * E, sizeof(uint32_t));
    if (!load || !e->eplb.counts) {
        free(load);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < L * E; i++) load[i] = 1.0;
    trill_status st = trill_eplb_window_create(L, E, e->cfg.eplb_window, &e->eplb.window);
    if (!st) st = trill_eplb_rebalance(load, L, E, P, 1, 1, W, &e->eplb.plan);
    free(load);
    if (st) trill_error_context("engine: EPLB with %d experts, %d physical slots, %d workers", E, P, W);
    return st;
}

/* After a step: its routed-token counts join the window; every eplb_interval steps the placement
 * is planned again from the window. */
static trill_status eplb_after_step(trill_engine *e) {
    const trill_config *c = &e->c;
    const int E = c->num_experts, L = c->n_moe_layers;
    trill_eplb_window_add(e->eplb.window, e->eplb.counts);
    memset(e->eplb.counts, 0, sizeof(uint32_t) * (size_t)L * E);
    if (++e->eplb.steps % e->cfg.eplb_interval) return TRILL_OK;
    double *load = malloc(sizeof(double) * (size_t)L * E);
    if (!load) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_eplb_window_load(e->eplb.window, load);
    trill_eplb_plan plan;
    trill_status st = trill_eplb_rebalance(load, L, E, e->eplb.plan.n_physical, 1, 1, e->eplb.workers, &plan);
    free(load);
    if (st) return st;
    trill_eplb_plan_free(&e->eplb.plan);
    e->eplb.plan = plan;
    return TRILL_OK;
}

const trill_eplb_plan *trill_engine_eplb_plan(const trill_engine *e) { return e->eplb.window ? &e->eplb.plan : NULL; }

/* max over mean of the workers' expected loads, averaged over MoE layers */
static trill_status imbalance_of(const trill_eplb_plan *plan, const double *load, int W, double *out) {
    const int L = plan->n_layers;
    double *per = malloc(sizeof(double) * (size_t)L * W);
    if (!per) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_eplb_worker_load(plan, load, W, per);
    double sum = 0;
    for (int l = 0; !st && l < L; l++) {
        double mx = 0, total = 0;
        for (int w = 0; w < W; w++) {
            mx = per[(size_t)l * W + w] > mx ? per[(size_t)l * W + w] : mx;
            total += per[(size_t)l * W + w];
        }
        sum += total > 0 ? mx / (total / W) : 1.0;
    }
    free(per);
    *out = sum / L;
    return st;
}

trill_status trill_engine_eplb_imbalance(const trill_engine *e, double *identity, double *planned) {
    if (!e->eplb.window) return trill_error(TRILL_ERR_INVALID, "EPLB is off in this engine");
    const int L = e->c.n_moe_layers, E = e->c.num_experts, W = e->eplb.workers;
    if (E % W) return trill_error(TRILL_ERR_UNSUPPORTED, "EPLB imbalance: %d experts do not split evenly over %d workers", E, W);
    double *load = malloc(sizeof(double) * (size_t)L * E);
    trill_eplb_plan id = { 0 };
    trill_status st = load ? trill_eplb_identity(L, E, &id) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        trill_eplb_window_load(e->eplb.window, load);
        st = imbalance_of(&id, load, W, identity);
    }
    if (!st) st = imbalance_of(&e->eplb.plan, load, W, planned);
    trill_eplb_plan_free(&id);
    free(load);
    return st;
}

/* Weights that are not finite numbers are refused at the door: they would only make logits
 * nobody can sample from. bf16 NaN and infinity have every exponent bit set. */
static trill_status check_finite_model(const trill_model *m) {
    for (size_t k = 0; k < m->n_tensors; k++) {
        const trill_param *p = &m->tensors[k];
        for (size_t i = 0; i < p->numel; i++)
            if (p->data ? !isfinite(p->data[i]) : (p->bf16[i] & 0x7f80u) == 0x7f80u)
                return trill_error(TRILL_ERR_INVALID, "engine: weight %s[%zu] is not a finite number: refused", p->name, i);
    }
    return TRILL_OK;
}

static trill_status check_finite_lora(const trill_lora *l) {
    for (size_t k = 0; k < l->n_tensors; k++) {
        const trill_param *p = &l->tensors[k];
        for (size_t i = 0; i < p->numel; i++)
            if (!isfinite(p->data[i]))
                return trill_error(TRILL_ERR_INVALID, "engine: adapter tensor %s[%zu] is %g: refused", p->name, i, p->data[i]);
    }
    return TRILL_OK;
}

trill_status trill_engine_create(const trill_model *m, const trill_engine_config *cfg_in, trill_engine **out) {
    trill_engine_config cfg = cfg_in ? *cfg_in : trill_engine_config_default();
    if (m->config.num_labels > 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: this model is a sequence classifier (%s, a reward model): it scores text, it does not generate",
                           trill_config_architecture(&m->config));
    if (cfg.block_size < 1 || cfg.block_size > 4096)
        return trill_error(TRILL_ERR_INVALID, "engine: block_size must be in [1, 4096], got %d", cfg.block_size);
    if (cfg.max_batch_tokens < 1) return trill_error(TRILL_ERR_INVALID, "engine: max_batch_tokens must be >= 1, got %d", cfg.max_batch_tokens);
    if (cfg.max_running < 1) return trill_error(TRILL_ERR_INVALID, "engine: max_running must be >= 1, got %d", cfg.max_running);
    if (cfg.format > TRILL_GEN_INT8) return trill_error(TRILL_ERR_INVALID, "engine: unknown weight format %d", (int)cfg.format);
    if (m->config.head_dim % 8)
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: head_dim %d is not a multiple of 8 (the attention kernel's lanes)", m->config.head_dim);
    trill_engine *e = calloc(1, sizeof *e);
    if (!e) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->c = m->config;
    e->cfg = cfg;
    e->rows.max = cfg.max_batch_tokens;
    const trill_config *c = &e->c;
    const int kv_dim = c->num_key_value_heads * c->head_dim;
    /* the cache in the weights' precision: fp32 for f32, bf16 otherwise (as bf16 serving does) */
    const int kv_elem = cfg.format == TRILL_GEN_F32 ? (int)sizeof(float) : (int)sizeof(uint16_t);
    const size_t per_block = kv_cache_bytes_per_block(cfg.block_size, c->num_hidden_layers, kv_dim, kv_elem);
    const size_t n_blocks = cfg.kv_blocks > 0 ? (size_t)cfg.kv_blocks : cfg.kv_cache_mb * 1000000 / per_block;
    trill_status st = TRILL_OK;
    if (n_blocks < 1 || n_blocks > INT32_MAX)
        st = trill_error(TRILL_ERR_INVALID, "engine: kv_cache_mb %zu holds %zu blocks of %d tokens (%.2f MB each); need at least one",
                         cfg.kv_cache_mb, n_blocks, cfg.block_size, per_block / 1e6);
    pthread_mutex_init(&e->update.lock, NULL);
    if (!st) st = check_finite_model(m);
    if (!st) st = build_weights(c, cfg.format, m, &e->w);
    if (!st) st = kv_cache_create(&e->kv, (int)n_blocks, cfg.block_size, c->num_hidden_layers, kv_dim, kv_elem);
    if (!st && cfg.eplb && c->n_moe_layers > 0) st = eplb_start(e);
    if (!st) st = alloc_step_buffers(e);
    if (st) {
        trill_engine_free(e);
        return st;
    }
    *out = e;
    return TRILL_OK;
}

static void free_seq(trill_engine *e, seq *s) {
    if (!s) return;
    kv_table_release(&e->kv, &s->kv);
    free(s->tokens);
    free(s->logprobs);
    free(s->versions);
    free(s->experts);
    free(s);
}

static void free_req(req *q) {
    if (!q) return;
    for (int i = 0; i < q->r.n_stop_strings; i++) free(q->stop_strings[i]);
    free(q->stop_strings);
    free(q->prompt);
    free(q->stop_ids);
    free(q);
}

void trill_sequence_out_free(trill_sequence_out *s) {
    free(s->tokens);
    free(s->logprobs);
    free(s->versions);
    free(s->experts);
    *s = (trill_sequence_out){ 0 };
}

void trill_engine_free(trill_engine *e) {
    if (!e) return;
    for (int i = 0; i < e->sched.n_active; i++) free_seq(e, e->sched.active[i]);
    for (int i = 0; i < e->sched.n_waiting; i++) free_seq(e, e->sched.waiting[i]);
    for (int i = 0; i < e->sched.n_reqs; i++) free_req(e->sched.reqs[i]);
    for (int i = 0; i < e->sched.n_done; i++) trill_sequence_out_free(&e->sched.done[i]);
    free(e->sched.active);
    free(e->sched.waiting);
    free(e->sched.reqs);
    free(e->sched.done);
    free_weights(&e->c, e->w);
    free_adapter(&e->c, e->ad);
    if (e->update.w) free_weights(&e->c, e->update.w);
    if (e->update.ad) free_adapter(&e->c, e->update.ad);
    pthread_mutex_destroy(&e->update.lock);
    kv_cache_free(&e->kv);
    const eng_scratch *f = &e->fwd;
    float *fl[] = { f->x, f->xn, f->qkv, f->q, f->k, f->v, f->att, f->out, f->ff, f->act, f->probs, f->topw, f->xe, f->ye, f->logits, f->scores,
                    f->lora_xa, f->lora_in, f->lora_out };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) free(fl[i]);
    free(f->topi); free(f->order); free(f->count); free(f->where); free(f->phys); free(f->inv_freq);
    trill_eplb_window_free(e->eplb.window);
    trill_eplb_plan_free(&e->eplb.plan);
    free(e->eplb.counts); free(e->rows.logit); free(e->rows.seq); free(e->rows.pos); free(e->rows.token);
    free(e->smp.scratch);
    free(e->smp.seq);
    free(e->smp.row);
    free(e->smp.token);
    free(e->smp.lp);
    free(e);
}

size_t trill_engine_weight_bytes(const trill_engine *e) { return e->w->bytes; }
size_t trill_engine_kv_bytes(const trill_engine *e) {
    return kv_cache_bytes_per_block(e->kv.block_size, e->kv.n_layers, e->kv.kv_dim, e->kv.elem) * (size_t)e->kv.n_blocks;
}
uint32_t trill_engine_version(const trill_engine *e) { return e->version; }

/* Per decode token at batch 1, what the matrices cost: each used matrix's bytes (the bytes
 * one step streams) or 2 N K FLOPs. A MoE layer counts its top-k experts at the average size. */
static double per_token_cost(const trill_engine *e, bool flops) {
    const trill_config *c = &e->c;
    const eng_weights *w = e->w;
#define COST(mat) (flops ? 2.0 * (mat).N * (mat).K : (double)(mat).bytes)
    double total = COST(w->lm_head) + (double)c->hidden_size * (flops ? 0 : w->embed_f32 ? 4 : 2);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const eng_layer *L = &w->layers[l];
        total += COST(L->qkv) + COST(L->o);
        if (!trill_config_is_moe(c, l)) {
            total += COST(L->gate_up) + COST(L->down);
            continue;
        }
        double experts = 0;
        for (int x = 0; x < c->num_experts; x++) experts += COST(L->experts_gate_up[x]) + COST(L->experts_down[x]);
        total += COST(L->router) + experts / c->num_experts * c->num_experts_per_tok;
    }
#undef COST
    return total;
}

size_t trill_engine_decode_bytes(const trill_engine *e) { return (size_t)per_token_cost(e, false); }
double trill_engine_decode_flops(const trill_engine *e) { return per_token_cost(e, true); }
bool trill_engine_busy(const trill_engine *e) { return e->sched.n_active > 0 || e->sched.n_waiting > 0; }

/* ---- requests ---- */

static trill_status new_seq(trill_engine *e, req *q, int sample, seq **out) {
    const trill_request *r = &q->r;
    seq *s = calloc(1, sizeof *s);
    if (!s) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    s->rq = q;
    s->sample = sample;
    s->cap = r->prompt_len + r->max_new_tokens;
    s->n_prompt = r->prompt_len;
    s->tokens = malloc(sizeof(int) * (size_t)s->cap);
    s->logprobs = malloc(sizeof(float) * (size_t)r->max_new_tokens);
    s->versions = malloc(sizeof(uint32_t) * (size_t)r->max_new_tokens);
    const size_t per_token = (size_t)e->c.n_moe_layers * e->c.num_experts_per_tok;
    if (e->cfg.capture_experts && per_token) s->experts = malloc(sizeof(uint16_t) * per_token * (size_t)s->cap);
    if (!s->tokens || !s->logprobs || !s->versions || (e->cfg.capture_experts && per_token && !s->experts)) {
        free_seq(e, s);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for request %llu", (unsigned long long)r->id);
    }
    *out = s;
    return TRILL_OK;
}

trill_status trill_engine_submit(trill_engine *e, const trill_request *r) {
    const trill_config *c = &e->c;
    const unsigned long long id = (unsigned long long)r->id;
    if (r->prompt_len < 1 || !r->prompt) return trill_error(TRILL_ERR_INVALID, "request %llu: the prompt is empty", id);
    if (r->max_new_tokens < 1) return trill_error(TRILL_ERR_INVALID, "request %llu: max_new_tokens must be >= 1, got %d", id, r->max_new_tokens);
    if (r->n < 0) return trill_error(TRILL_ERR_INVALID, "request %llu: n (samples) must be >= 1, got %d", id, r->n);
    for (int i = 0; i < r->prompt_len; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= c->vocab_size)
            return trill_error(TRILL_ERR_INVALID, "request %llu: prompt token %d is %d, outside the vocabulary [0, %d)", id, i, r->prompt[i], c->vocab_size);
    trill_status st = trill_sampling_check(&r->sampling);
    if (st) {
        trill_error_context("request %llu", id);
        return st;
    }
    if (r->n_stop_strings > 0 && !e->cfg.tokenizer)
        return trill_error(TRILL_ERR_INVALID, "request %llu: stop strings need the engine to have a tokenizer", id);
    for (int i = 0; i < r->n_stop_strings; i++)
        if (!r->stop_strings[i] || !*r->stop_strings[i] || strlen(r->stop_strings[i]) > 256)
            return trill_error(TRILL_ERR_INVALID, "request %llu: stop string %d must be 1 to 256 bytes", id, i);
    const int need = kv_blocks_for(&e->kv, r->prompt_len + r->max_new_tokens);
    if (need > e->kv.n_blocks)
        return trill_error(TRILL_ERR_INVALID, "request %llu: %d prompt + %d new tokens need %d KV blocks of %d tokens, but the cache holds %d (raise kv_cache_mb)",
                           id, r->prompt_len, r->max_new_tokens, need, e->kv.block_size, e->kv.n_blocks);
    req *q = calloc(1, sizeof *q);
    if (!q) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    q->r = *r;
    if (q->r.n == 0) q->r.n = 1;
    q->prompt = malloc(sizeof(int) * (size_t)r->prompt_len);
    q->stop_ids = malloc(sizeof(int) * (size_t)(r->n_stop_ids + 1));
    q->stop_strings = calloc((size_t)r->n_stop_strings + 1, sizeof(char *));
    bool ok = q->prompt && q->stop_ids && q->stop_strings;
    for (int i = 0; ok && i < r->n_stop_strings; i++) {
        ok = (q->stop_strings[i] = strdup(r->stop_strings[i])) != NULL;
        size_t len = ok ? strlen(r->stop_strings[i]) : 0;
        if (len > q->max_stop_len) q->max_stop_len = len;
    }
    seq *s = NULL;
    if (ok) {
        memcpy(q->prompt, r->prompt, sizeof(int) * (size_t)r->prompt_len);
        if (r->n_stop_ids) memcpy(q->stop_ids, r->stop_ids, sizeof(int) * (size_t)r->n_stop_ids);
        q->r.prompt = q->prompt;
        q->r.stop_ids = q->stop_ids;
        q->r.stop_strings = (const char *const *)q->stop_strings;
        ok = !new_seq(e, q, 0, &s);
    }
    req **reqs = ok ? grow(e->sched.reqs, &e->sched.cap_reqs, e->sched.n_reqs + 1, sizeof *reqs) : NULL;
    seq **wait = reqs ? grow(e->sched.waiting, &e->sched.cap_waiting, e->sched.n_waiting + 1, sizeof *wait) : NULL;
    if (reqs) e->sched.reqs = reqs;
    if (wait) e->sched.waiting = wait;
    if (!wait) {
        free_seq(e, s);
        free_req(q);
        return trill_error(TRILL_ERR_NOMEM, "out of memory queueing request %llu", id);
    }
    memcpy(s->tokens, q->prompt, sizeof(int) * (size_t)r->prompt_len);
    s->n_tokens = r->prompt_len;
    s->forks_pending = q->r.n > 1;
    e->sched.reqs[e->sched.n_reqs++] = q;
    e->sched.waiting[e->sched.n_waiting++] = s;
    return TRILL_OK;
}

/* ---- the forward over a step's rows ---- */

static void gather_rows(float *dst, const float *src, int rows, int width, int stride, int offset) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * width, src + (size_t)r * stride + offset, sizeof(float) * width);
}

/* y[T, width] += the adapter's side path on input x[T, K] (nothing if the matrix has none). */
/* row0: where these rows sit among the step's expert rows, so concurrent callers (EPLB workers)
 * use disjoint parts of the buffers. */
static void apply_lora(trill_engine *e, const eng_lora *el, float *y, int width, const float *x, int T, int row0) {
    if (el->n_adapted == 0 || T == 0) return;
    const int r = e->ad->rank, na = el->n_adapted;
    const float s = e->ad->scale;
    float *lxa = e->fwd.lora_xa + (size_t)row0 * 3 * r, *lin = e->fwd.lora_in + (size_t)row0 * r;
    float *lout = e->fwd.lora_out + (size_t)row0 * e->fwd.lora_cols;
    gen_matmul(lxa, x, &el->A, T);
    for (int a = 0; a < na; a++) {
        const float *xa = lxa;
        if (na > 1) { /* this part's columns of x A^T, contiguous */
            gather_rows(lin, lxa, T, r, na * r, a * r);
            xa = lin;
        }
        gen_matmul(lout, xa, &el->B[a], T);
        const int cols = el->cols[a], col0 = el->col0[a];
#pragma omp parallel for if(parallel: (size_t)T * cols >= PARALLEL_MIN) schedule(static)
        for (int t = 0; t < T; t++) {
            float *yt = y + (size_t)t * width + col0;
            const float *d = lout + (size_t)t * cols;
            for (int j = 0; j < cols; j++) yt[j] += s * d[j];
        }
    }
}


/* Causal attention of each row over its own sequence's cached keys and values. */
/* q . k in 8 lanes (lane l sums elements i = l mod 8, in order) reduced by a fixed tree: the same
 * arithmetic for a position whether it is computed alone or among 8 (batch invariance). */
enum { LANE = 8 };

static inline float reduce_lanes(const float *p) {
    return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

/* Element i of a cache row: fp32, or bf16 widened (exact). `half` is a constant at every call
 * site once inlined, so each loop is compiled for one element type. */
static inline __attribute__((always_inline)) float kv_at(const void *row, size_t i, const bool half) {
    return half ? trill_bf16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}

static inline __attribute__((always_inline)) float dot_lanes(const float *q, const void *k, int hd, const bool half) {
    float part[LANE] = { 0 };
    for (int i = 0; i < hd; i += LANE)
        for (int l = 0; l < LANE; l++) part[l] += q[i + l] * kv_at(k, (size_t)i + l, half);
    return reduce_lanes(part);
}

/* out[j] = q . k_j for LANE keys k_j = k + j * stride elements: the lanes of all LANE keys stay
 * in registers. */
static inline __attribute__((always_inline)) void dot_lanes8(const float *q, const void *k, size_t stride, int hd, float *out,
                                                             const bool half) {
    float part[LANE][LANE] = { { 0 } };
    for (int i = 0; i < hd; i += LANE)
        for (int j = 0; j < LANE; j++)
            for (int l = 0; l < LANE; l++) part[j][l] += q[i + l] * kv_at(k, j * stride + i + l, half);
    for (int j = 0; j < LANE; j++) out[j] = reduce_lanes(part[j]);
}

/* o[0..W) = sum_j p_j v_j[col .. col+W) over the sequence's cached values, the sum over j in
 * order for every element; W is a compile-time constant at each call, so acc stays in registers
 * while the cache is read once per position. */
static inline __attribute__((always_inline)) void attend_values(const trill_engine *e, const seq *s, int layer, int col, const float *p,
                                                                int n_pos, float *o, const int W, const bool half) {
    const int bs = e->kv.block_size, kv_dim = e->kv.kv_dim;
    float acc[128] = { 0 };
    for (int j0 = 0; j0 < n_pos; j0 += bs) {
        const char *vb = kv_value(&e->kv, s->kv.blocks[j0 / bs], layer, 0);
        const int n = n_pos - j0 < bs ? n_pos - j0 : bs;
        for (int j = 0; j < n; j++) {
            const float w = p[j0 + j];
            const size_t at = (size_t)j * kv_dim + (size_t)col;
            for (int l = 0; l < W; l++) acc[l] += w * kv_at(vb, at + (size_t)l, half);
        }
    }
    memcpy(o, acc, sizeof(float) * W);
}

/* One task of the attention: row r and kv head kvh with its group of query heads, so each cached
 * key and value is read once for the group; the cache is walked block by block. sc: the
 * thread's [group][max_context] scores. */
static inline __attribute__((always_inline)) void attend_row_head(const trill_engine *e, int layer, int r, int kvh, float *sc,
                                                                  const bool half) {
    const trill_config *c = &e->c;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads, hd = c->head_dim, group = nh / nkv;
    const int bs = e->kv.block_size, kv_dim = e->kv.kv_dim, elem = half ? 2 : 4;
    const float scale = 1.0f / sqrtf((float)hd);
    const seq *s = e->rows.seq[r];
    const int n_pos = e->rows.pos[r] + 1, ctx = e->fwd.max_context;
    const float *q = e->fwd.q + ((size_t)r * nh + (size_t)kvh * group) * hd;
    for (int j0 = 0; j0 < n_pos; j0 += bs) {
        const char *kb = (const char *)kv_key(&e->kv, s->kv.blocks[j0 / bs], layer, 0) + (size_t)kvh * hd * elem;
        const int n = n_pos - j0 < bs ? n_pos - j0 : bs;
        for (int g = 0; g < group; g++) {
            const float *qg = q + (size_t)g * hd;
            float *sg = sc + (size_t)g * ctx + j0;
            int j = 0;
            for (; j + LANE <= n; j += LANE) dot_lanes8(qg, kb + (size_t)j * kv_dim * elem, (size_t)kv_dim, hd, sg + j, half);
            for (; j < n; j++) sg[j] = dot_lanes(qg, kb + (size_t)j * kv_dim * elem, hd, half);
        }
    }
    for (int g = 0; g < group; g++) { /* softmax over the positions, normalised in place */
        float *sg = sc + (size_t)g * ctx, mx = -INFINITY;
        for (int j = 0; j < n_pos; j++) {
            sg[j] *= scale;
            mx = sg[j] > mx ? sg[j] : mx;
        }
        double sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < n_pos; j++) {
            sg[j] = exp_nonpos_f32(sg[j] - mx);
            sum += sg[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < n_pos; j++) sg[j] *= inv;
    }
    for (int g = 0; g < group; g++) {
        const float *pg = sc + (size_t)g * ctx;
        float *o = e->fwd.att + ((size_t)r * nh + (size_t)kvh * group + g) * hd;
        /* the common head sizes get a constant width, so the accumulators stay in registers */
        if (hd == 64) attend_values(e, s, layer, kvh * hd, pg, n_pos, o, 64, half);
        else if (hd == 128)
            for (int i0 = 0; i0 < 128; i0 += 64) attend_values(e, s, layer, kvh * hd + i0, pg, n_pos, o + i0, 64, half);
        else
            for (int i0 = 0; i0 < hd; i0 += LANE) attend_values(e, s, layer, kvh * hd + i0, pg, n_pos, o + i0, LANE, half);
    }
}

/* Causal attention of each row over its own sequence's cached keys and values (fp32 or bf16
 * cache: each task is compiled for both and picks by the cache's element size). head_dim must
 * be a multiple of 8 (checked when the engine is made). */
static void paged_attention(trill_engine *e, int layer, int R) {
    const int nkv = e->c.num_key_value_heads, group = e->c.num_attention_heads / nkv;
    const bool half = e->kv.elem == 2;
#pragma omp parallel
    {
        float *sc = e->fwd.scores + (size_t)omp_get_thread_num() * e->fwd.max_context * group;
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int r = 0; r < R; r++)
            for (int kvh = 0; kvh < nkv; kvh++) {
                if (half) attend_row_head(e, layer, r, kvh, sc, true);
                else attend_row_head(e, layer, r, kvh, sc, false);
            }
    }
}

static void swiglu_fused(float *act, const float *gate_up, int rows, int I) {
#pragma omp parallel for if(parallel: (size_t)rows * I >= PARALLEL_MIN) schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *g = gate_up + (size_t)r * 2 * I, *u = g + I;
        float *a = act + (size_t)r * I;
        for (int i = 0; i < I; i++) {
            const float x = g[i], ex = exp_nonpos_f32(-fabsf(x)); /* silu(x) = x sigmoid(x), from exp(-|x|) <= 1 */
            a[i] = x * ((x < 0 ? ex : 1.0f) / (1.0f + ex)) * u[i];
        }
    }
}

static void add_rows(float *x, const float *y, size_t n) {
#pragma omp parallel for if(parallel: n >= PARALLEL_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* Router, top-k, capture, and each expert's rows as one batch; out = sum_k gate_k expert_k(xn). */
/* Rows order[first .. first+n) of the step, all routed to logical expert x: gathered, through
 * the expert (and its adapter), into ye at the same positions. Every buffer is indexed by those
 * positions, so workers computing different experts never touch the same memory. */
static void expert_rows(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int x, int first, int n) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    float *xe = e->fwd.xe + (size_t)first * H, *ff = e->fwd.ff + (size_t)first * 2 * Im, *act = e->fwd.act + (size_t)first * Im;
    float *ye = e->fwd.ye + (size_t)first * H;
    for (int i = 0; i < n; i++) memcpy(xe + (size_t)i * H, e->fwd.xn + (size_t)(e->fwd.order[first + i] / K) * H, sizeof(float) * H);
    gen_matmul(ff, xe, &L->experts_gate_up[x], n);
    if (A) apply_lora(e, &A->experts_gate_up[x], ff, 2 * Im, xe, n, first);
    swiglu_fused(act, ff, n, Im);
    gen_matmul(ye, act, &L->experts_down[x], n);
    if (A) apply_lora(e, &A->experts_down[x], ye, H, act, n, first);
}

/* Counting sort of the step's (row, slot) pairs by key[i] in [0, n_keys): order[] lists them
 * grouped by key, count[k] ends group k. */
static void group_by(trill_engine *e, const int *key, int n, int n_keys) {
    memset(e->fwd.count, 0, sizeof(int) * (size_t)(n_keys + 1));
    for (int i = 0; i < n; i++) e->fwd.count[key[i] + 1]++;
    for (int k = 0; k < n_keys; k++) e->fwd.count[k + 1] += e->fwd.count[k];
    for (int i = 0; i < n; i++) e->fwd.order[e->fwd.count[key[i]]++] = i;
}

/* Router, top-k, capture, the experts, and out = sum_k gate_k expert_k(xn). Without EPLB each
 * expert's rows are one threaded GEMM; with it, rows go to physical replicas and each worker
 * (thread) computes the replicas it holds. */
static void moe(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int ordinal, int R) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    gen_matmul(e->fwd.probs, e->fwd.xn, &L->router, R);
    softmax_forward(e->fwd.probs, e->fwd.probs, R, E);
    topk_forward(e->fwd.topi, e->fwd.topw, e->fwd.probs, R, E, K);
    router_gates_forward(e->fwd.topw, e->fwd.probs, e->fwd.topi, R, E, K, c->norm_topk_prob);
    /* capture and load count the logical ids, before any mapping to physical replicas */
    if (e->cfg.capture_experts)
        for (int r = 0; r < R; r++) {
            seq *s = e->rows.seq[r];
            uint16_t *dst = s->experts + ((size_t)e->rows.pos[r] * c->n_moe_layers + ordinal) * K;
            for (int j = 0; j < K; j++) dst[j] = (uint16_t)e->fwd.topi[r * K + j];
        }
    if (e->eplb.window) {
        uint32_t *load = e->eplb.counts + (size_t)ordinal * E;
        for (int i = 0; i < R * K; i++) load[e->fwd.topi[i]]++;
        const trill_eplb_plan *plan = &e->eplb.plan;
        for (int i = 0; i < R * K; i++) e->fwd.phys[i] = trill_eplb_physical(plan, ordinal, e->fwd.topi[i], (uint64_t)i);
        group_by(e, e->fwd.phys, R * K, plan->n_physical);
        const int per = plan->n_physical / e->eplb.workers;
#pragma omp parallel num_threads(e->eplb.workers)
        {
            const int w = omp_get_thread_num();
            for (int p = w * per; p < (w + 1) * per; p++) {
                const int first = p ? e->fwd.count[p - 1] : 0, n = e->fwd.count[p] - first;
                if (n > 0) expert_rows(e, L, A, plan->phy2log[(size_t)ordinal * plan->n_physical + p], first, n);
            }
        }
    } else {
        group_by(e, e->fwd.topi, R * K, E);
        for (int x = 0; x < E; x++) {
            const int first = x ? e->fwd.count[x - 1] : 0, n = e->fwd.count[x] - first;
            if (n > 0) expert_rows(e, L, A, x, first, n);
        }
    }
    /* combine each row's experts in ascending logical id (as the reference), so the sum is the
     * same whatever the batch, the placement or the worker */
    for (int i = 0; i < R * K; i++) e->fwd.where[e->fwd.order[i]] = i;
#pragma omp parallel for if(parallel: (size_t)R * K * H >= PARALLEL_MIN) schedule(static)
    for (int r = 0; r < R; r++) {
        int slots[64];
        const int k_used = K < 64 ? K : 64;
        for (int j = 0; j < k_used; j++) { /* insertion sort of the row's slots by expert id */
            int v = r * K + j, at = j;
            while (at > 0 && e->fwd.topi[slots[at - 1]] > e->fwd.topi[v]) { slots[at] = slots[at - 1]; at--; }
            slots[at] = v;
        }
        float *o = e->fwd.out + (size_t)r * H;
        memset(o, 0, sizeof(float) * H);
        for (int j = 0; j < k_used; j++) {
            const float g = e->fwd.topw[slots[j]];
            const float *y = e->fwd.ye + (size_t)e->fwd.where[slots[j]] * H;
            for (int h = 0; h < H; h++) o[h] += g * y[h];
        }
    }
}

static void forward_rows(trill_engine *e, int R) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, hd = c->head_dim, nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kvd = nkv * hd, width = qd + 2 * kvd;
    const float eps = (float)c->rms_norm_eps;
    const eng_weights *w = e->w;
    if (w->embed_f32) embedding_forward(e->fwd.x, w->embed_f32, e->rows.token, R, H);
    else embedding_forward_w(e->fwd.x, (trill_weight){ NULL, w->embed_bf16 }, e->rows.token, R, H);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const eng_layer *L = &w->layers[l];
        const eng_lora_layer *A = e->ad ? &e->ad->layers[l] : NULL;
        rmsnorm_forward(e->fwd.xn, e->fwd.x, L->input_norm, R, H, eps);
        gen_matmul(e->fwd.qkv, e->fwd.xn, &L->qkv, R);
        if (A) apply_lora(e, &A->qkv, e->fwd.qkv, width, e->fwd.xn, R, 0);
        gather_rows(e->fwd.q, e->fwd.qkv, R, qd, width, 0);
        gather_rows(e->fwd.k, e->fwd.qkv, R, kvd, width, qd);
        gather_rows(e->fwd.v, e->fwd.qkv, R, kvd, width, qd + kvd);
        rmsnorm_forward(e->fwd.q, e->fwd.q, L->q_norm, R * nh, hd, eps);
        rmsnorm_forward(e->fwd.k, e->fwd.k, L->k_norm, R * nkv, hd, eps);
        rope_forward(e->fwd.q, e->rows.pos, e->fwd.inv_freq, R, nh, hd);
        rope_forward(e->fwd.k, e->rows.pos, e->fwd.inv_freq, R, nkv, hd);
        for (int r = 0; r < R; r++) { /* this step's keys and values join the cache before anyone reads */
            const seq *s = e->rows.seq[r];
            const int p = e->rows.pos[r], b = s->kv.blocks[p / e->kv.block_size], slot = p % e->kv.block_size;
            trill_from_f32(kv_key(&e->kv, b, l, slot), e->fwd.k + (size_t)r * kvd, e->kv.elem == 4 ? TRILL_F32 : TRILL_BF16, (size_t)kvd);
            trill_from_f32(kv_value(&e->kv, b, l, slot), e->fwd.v + (size_t)r * kvd, e->kv.elem == 4 ? TRILL_F32 : TRILL_BF16, (size_t)kvd);
        }
        paged_attention(e, l, R);
        gen_matmul(e->fwd.out, e->fwd.att, &L->o, R);
        if (A) apply_lora(e, &A->o, e->fwd.out, H, e->fwd.att, R, 0);
        add_rows(e->fwd.x, e->fwd.out, (size_t)R * H);
        rmsnorm_forward(e->fwd.xn, e->fwd.x, L->post_norm, R, H, eps);
        if (trill_config_is_moe(c, l)) {
            moe(e, L, A, c->moe_ordinal[l], R);
        } else {
            const int I = c->intermediate_size;
            gen_matmul(e->fwd.ff, e->fwd.xn, &L->gate_up, R);
            if (A) apply_lora(e, &A->gate_up, e->fwd.ff, 2 * I, e->fwd.xn, R, 0);
            swiglu_fused(e->fwd.act, e->fwd.ff, R, I);
            gen_matmul(e->fwd.out, e->fwd.act, &L->down, R);
            if (A) apply_lora(e, &A->down, e->fwd.out, H, e->fwd.act, R, 0);
        }
        add_rows(e->fwd.x, e->fwd.out, (size_t)R * H);
    }
}

/* ---- scheduling ---- */

static void remove_at(seq **list, int *n, int i) {
    memmove(list + i, list + i + 1, sizeof *list * (size_t)(*n - i - 1));
    (*n)--;
}

/* Gives a sequence's blocks back; it waits at the front of the queue and recomputes its tokens
 * (identical results: rows do not depend on the batch). */
static trill_status preempt(trill_engine *e, int active_index) {
    seq *s = e->sched.active[active_index];
    seq **w = grow(e->sched.waiting, &e->sched.cap_waiting, e->sched.n_waiting + 1, sizeof *w);
    if (!w) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->sched.waiting = w;
    kv_table_release(&e->kv, &s->kv);
    s->n_computed = 0;
    remove_at(e->sched.active, &e->sched.n_active, active_index);
    memmove(e->sched.waiting + 1, e->sched.waiting, sizeof *e->sched.waiting * (size_t)e->sched.n_waiting);
    e->sched.waiting[0] = s;
    e->sched.n_waiting++;
    return TRILL_OK;
}

static int add_rows_of(trill_engine *e, seq *s, int R, int n) {
    for (int i = 0; i < n; i++, R++) {
        e->rows.seq[R] = s;
        e->rows.pos[R] = s->n_computed + i;
        e->rows.token[R] = s->tokens[s->n_computed + i];
    }
    return R;
}

/* Picks the step's rows: every active sequence's next tokens (a decode row, or the next chunk of
 * its prompt) in admission order, then new sequences from the queue, within the token budget. */
static trill_status schedule(trill_engine *e, int *rows, trill_step_stats *stats) {
    int R = 0;
    for (int i = 0; i < e->sched.n_active && R < e->rows.max; i++) {
        seq *s = e->sched.active[i];
        const int n = s->n_tokens - s->n_computed < e->rows.max - R ? s->n_tokens - s->n_computed : e->rows.max - R;
        while (kv_table_reserve(&e->kv, &s->kv, s->n_computed + n, s->n_computed) != 0) {
            /* out of blocks: the newest sequence makes room (this one, if it is the newest) */
            trill_status st = preempt(e, e->sched.n_active - 1);
            if (st) return st;
            stats->preempted++;
            if (e->sched.n_active == i) break; /* it was this one */
        }
        if (i >= e->sched.n_active) break;
        if (n == 1) stats->decode_rows++;
        else stats->prefill_rows += n;
        R = add_rows_of(e, s, R, n);
    }
    while (e->sched.n_waiting > 0 && R < e->rows.max && e->sched.n_active < e->cfg.max_running) {
        seq *s = e->sched.waiting[0];
        const int n = s->n_tokens - s->n_computed < e->rows.max - R ? s->n_tokens - s->n_computed : e->rows.max - R;
        if (kv_table_reserve(&e->kv, &s->kv, s->n_computed + n, s->n_computed) != 0) break;
        seq **a = grow(e->sched.active, &e->sched.cap_active, e->sched.n_active + 1, sizeof *a);
        if (!a) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        e->sched.active = a;
        remove_at(e->sched.waiting, &e->sched.n_waiting, 0);
        e->sched.active[e->sched.n_active++] = s;
        stats->prefill_rows += n;
        R = add_rows_of(e, s, R, n);
    }
    *rows = R;
    return TRILL_OK;
}

/* ---- after the forward: sampling, forks, stops ---- */

static bool hits_stop_string(const trill_engine *e, const seq *s) {
    const req *q = s->rq;
    if (q->r.n_stop_strings == 0) return false;
    /* a stop string of L <= 256 bytes completed by the newest token lies within its last L + 1 tokens */
    const int gen = s->n_tokens - s->n_prompt;
    int from = gen - (int)q->max_stop_len - 1;
    if (from < 0) from = 0;
    /* ids the tokenizer has no string for (a model's vocabulary may be larger) add no text */
    int ids[512], n = 0;
    const int known = trill_tokenizer_size(e->cfg.tokenizer);
    for (int i = from; i < gen && n < 512; i++)
        if (s->tokens[s->n_prompt + i] < known) ids[n++] = s->tokens[s->n_prompt + i];
    char *text = NULL;
    size_t len = 0;
    if (trill_tokenizer_decode(e->cfg.tokenizer, ids, (size_t)n, false, &text, &len)) return false;
    bool hit = false;
    for (int i = 0; i < q->r.n_stop_strings && !hit; i++) hit = strstr(text, q->stop_strings[i]) != NULL;
    free(text);
    return hit;
}

static trill_status finish(trill_engine *e, int active_index, trill_finish why) {
    seq *s = e->sched.active[active_index];
    trill_sequence_out *d = grow(e->sched.done, &e->sched.cap_done, e->sched.n_done + 1, sizeof *d);
    if (!d) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->sched.done = d;
    const int gen = s->n_tokens - s->n_prompt;
    e->sched.done[e->sched.n_done++] = (trill_sequence_out){ .request = s->rq->r.id, .sample = s->sample, .n_prompt = s->n_prompt,
                                                 .n_generated = gen, .tokens = s->tokens, .logprobs = s->logprobs,
                                                 .versions = s->versions, .experts = s->experts, .finish = why };
    s->tokens = NULL;
    s->logprobs = NULL;
    s->versions = NULL;
    s->experts = NULL;
    remove_at(e->sched.active, &e->sched.n_active, active_index);
    /* the request record goes when its last sample does */
    req *q = s->rq;
    free_seq(e, s);
    bool live = false;
    for (int i = 0; i < e->sched.n_active && !live; i++) live = e->sched.active[i]->rq == q;
    for (int i = 0; i < e->sched.n_waiting && !live; i++) live = e->sched.waiting[i]->rq == q;
    if (!live)
        for (int i = 0; i < e->sched.n_reqs; i++)
            if (e->sched.reqs[i] == q) {
                free_req(q);
                e->sched.reqs[i] = e->sched.reqs[--e->sched.n_reqs];
                break;
            }
    return TRILL_OK;
}

int trill_engine_abort(trill_engine *e, uint64_t request) {
    int n = 0;
    for (int i = 0; i < e->sched.n_waiting;) { /* waiting ones join the active list to be finished alike */
        seq *s = e->sched.waiting[i];
        if (s->rq->r.id != request) { i++; continue; }
        seq **a = grow(e->sched.active, &e->sched.cap_active, e->sched.n_active + 1, sizeof *a);
        if (!a) return -1;
        e->sched.active = a;
        remove_at(e->sched.waiting, &e->sched.n_waiting, i);
        e->sched.active[e->sched.n_active++] = s;
    }
    for (int i = 0; i < e->sched.n_active;) {
        if (e->sched.active[i]->rq->r.id != request) { i++; continue; }
        if (finish(e, i, TRILL_FINISH_ABORTED)) return -1;
        n++;
    }
    return n;
}

/* The group's other samples start from the same prompt, sharing its blocks. */
static trill_status fork_samples(trill_engine *e, seq *parent) {
    const req *q = parent->rq;
    parent->forks_pending = false;
    seq **a = grow(e->sched.active, &e->sched.cap_active, e->sched.n_active + q->r.n - 1, sizeof *a);
    if (!a) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->sched.active = a;
    const size_t per_token = (size_t)e->c.n_moe_layers * e->c.num_experts_per_tok;
    for (int k = 1; k < q->r.n; k++) {
        seq *s;
        trill_status st = new_seq(e, (req *)q, k, &s);
        if (!st && (st = kv_table_share(&e->kv, &s->kv, &parent->kv))) free_seq(e, s);
        if (st) return st;
        memcpy(s->tokens, parent->tokens, sizeof(int) * (size_t)parent->n_tokens);
        s->n_tokens = parent->n_tokens;
        s->n_computed = parent->n_computed;
        if (s->experts) memcpy(s->experts, parent->experts, sizeof(uint16_t) * per_token * (size_t)parent->n_computed);
        e->sched.active[e->sched.n_active++] = s;
    }
    return TRILL_OK;
}

/* Samples the next token of every (sequence, logits row) pair, the pairs spread over the
 * threads (each with its own scratch); the draws are keyed, so the split changes nothing. */
static trill_status sample_all(trill_engine *e, int n) {
    const int V = e->c.vocab_size;
    const size_t scratch = trill_sample_scratch_size(V);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        seq *s = e->smp.seq[i];
        const req *q = s->rq;
        const int gen = s->n_tokens - s->n_prompt;
        float lp = 0;
        e->smp.token[i] = trill_sample(e->fwd.logits + (size_t)e->smp.row[i] * V, V, &q->r.sampling, q->r.id, (uint32_t)s->sample,
                                          (uint32_t)gen, (char *)e->smp.scratch + scratch * (size_t)omp_get_thread_num(), &lp);
        e->smp.lp[i] = lp;
    }
    for (int i = 0; i < n; i++) {
        seq *s = e->smp.seq[i];
        const int gen = s->n_tokens - s->n_prompt;
        if (e->smp.token[i] < 0)
            return trill_error(TRILL_ERR_INVALID, "request %llu, sample %d, token %d: every logit is NaN or -inf (the weights are broken)",
                               (unsigned long long)s->rq->r.id, s->sample, gen);
        s->tokens[s->n_tokens++] = e->smp.token[i];
        s->logprobs[gen] = e->smp.lp[i];
        s->versions[gen] = e->version;
    }
    return TRILL_OK;
}

/* One more (sequence, logits row) pair to sample; the arrays grow with forks. */
static trill_status want_sample(trill_engine *e, int *n, seq *s, int row) {
    if (*n == e->smp.cap) {
        const int cap = e->smp.cap ? 2 * e->smp.cap : 64;
        seq **a = realloc(e->smp.seq, sizeof *a * (size_t)cap);
        if (a) e->smp.seq = a;
        int *b = a ? realloc(e->smp.row, sizeof *b * (size_t)cap) : NULL;
        if (b) e->smp.row = b;
        int *t = b ? realloc(e->smp.token, sizeof *t * (size_t)cap) : NULL;
        if (t) e->smp.token = t;
        float *l = t ? realloc(e->smp.lp, sizeof *l * (size_t)cap) : NULL;
        if (!l) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        e->smp.lp = l;
        e->smp.cap = cap;
    }
    e->smp.seq[*n] = s;
    e->smp.row[*n] = row;
    (*n)++;
    return TRILL_OK;
}

static trill_status after_forward(trill_engine *e, int R) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, V = c->vocab_size;
    /* rows that end their sequence's known tokens produce logits */
    int n_logit = 0;
    for (int r = 0; r < R; r++) {
        seq *s = e->rows.seq[r];
        s->n_computed = e->rows.pos[r] + 1 > s->n_computed ? e->rows.pos[r] + 1 : s->n_computed;
        if (e->rows.pos[r] == s->n_tokens - 1) e->rows.logit[n_logit++] = r;
    }
    for (int i = 0; i < n_logit; i++) memcpy(e->fwd.xn + (size_t)i * H, e->fwd.x + (size_t)e->rows.logit[i] * H, sizeof(float) * H);
    rmsnorm_forward(e->fwd.xn, e->fwd.xn, e->w->final_norm, n_logit, H, (float)c->rms_norm_eps);
    gen_matmul(e->fwd.logits, e->fwd.xn, &e->w->lm_head, n_logit);
    if (e->ad) apply_lora(e, &e->ad->lm_head, e->fwd.logits, V, e->fwd.xn, n_logit, 0);
    int n_sample = 0;
    for (int i = 0; i < n_logit; i++) {
        seq *s = e->rows.seq[e->rows.logit[i]];
        const int before = e->sched.n_active;
        trill_status st = s->forks_pending ? fork_samples(e, s) : TRILL_OK;
        if (!st) st = want_sample(e, &n_sample, s, i);
        for (int k = before; k < e->sched.n_active && !st; k++) st = want_sample(e, &n_sample, e->sched.active[k], i); /* the forks */
        if (st) return st;
    }
    trill_status st = sample_all(e, n_sample);
    if (st) return st;
    /* stops */
    for (int i = 0; i < e->sched.n_active;) {
        seq *s = e->sched.active[i];
        const int gen = s->n_tokens - s->n_prompt;
        if (gen == 0 || s->n_computed != s->n_tokens - 1) { i++; continue; } /* nothing new sampled */
        const int last = s->tokens[s->n_tokens - 1];
        bool stop_id = false;
        for (int k = 0; k < s->rq->r.n_stop_ids && !stop_id; k++) stop_id = last == s->rq->r.stop_ids[k];
        trill_finish why = TRILL_FINISH_LENGTH;
        bool done = true;
        if (stop_id) why = TRILL_FINISH_STOP_ID;
        else if (hits_stop_string(e, s)) why = TRILL_FINISH_STOP_STRING;
        else if (gen >= s->rq->r.max_new_tokens) why = TRILL_FINISH_LENGTH;
        else done = false;
        if (!done) { i++; continue; }
        if ((st = finish(e, i, why))) return st;
    }
    return TRILL_OK;
}

/* ---- the step ---- */

/* The per-thread buffers are sized for as many threads as the calling thread's parallel regions
 * get: an engine may be stepped from threads with different OpenMP thread counts, as the async
 * generator is. */

/* Sampler scratch for this step's threads. */
static trill_status ensure_sampler_scratch(trill_engine *e) {
    const int threads = omp_get_max_threads();
    if (threads <= e->smp.threads) return TRILL_OK;
    void *p = realloc(e->smp.scratch, trill_sample_scratch_size(e->c.vocab_size) * (size_t)threads);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory for sampler scratch");
    e->smp.scratch = p;
    e->smp.threads = threads;
    return TRILL_OK;
}

/* Attention scores for the step's longest context, per thread. */
static trill_status ensure_scores(trill_engine *e, int R) {
    int need = 1;
    for (int r = 0; r < R; r++) if (e->rows.pos[r] + 1 > need) need = e->rows.pos[r] + 1;
    const int threads = omp_get_max_threads();
    if (threads > e->fwd.score_threads) {
        e->fwd.score_threads = threads;
        e->fwd.max_context = 0; /* sized again below */
    }
    if (need <= e->fwd.max_context) return TRILL_OK;
    const int group = e->c.num_attention_heads / e->c.num_key_value_heads;
    float *p = realloc(e->fwd.scores, sizeof(float) * (size_t)need * group * e->fwd.score_threads);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory for attention over %d positions", need);
    e->fwd.scores = p;
    e->fwd.max_context = need;
    return TRILL_OK;
}

/* Buffers of the adapter path for rank r: sized for the largest matrix it can meet. */
static trill_status ensure_lora_buffers(trill_engine *e, int r) {
    if (r <= e->fwd.lora_rank) return TRILL_OK;
    const trill_config *c = &e->c;
    const size_t K = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1, R = (size_t)e->rows.max, rows = R * K;
    const size_t qkv = (size_t)(c->num_attention_heads + 2 * c->num_key_value_heads) * c->head_dim;
    size_t cols = qkv;
    const size_t others[] = { (size_t)c->hidden_size, 2 * (size_t)c->intermediate_size, 2 * (size_t)c->moe_intermediate_size };
    for (int i = 0; i < 3; i++) if (others[i] > cols) cols = others[i];
    /* lora_out rows have a fixed stride so row offsets work; lm_head's rows (at most R) are wider */
    e->fwd.lora_cols = (int)cols;
    size_t out = rows * cols;
    if (R * (size_t)c->vocab_size > out) out = R * (size_t)c->vocab_size;
    free(e->fwd.lora_xa);
    free(e->fwd.lora_in);
    free(e->fwd.lora_out);
    e->fwd.lora_xa = malloc(sizeof(float) * rows * 3 * (size_t)r);
    e->fwd.lora_in = malloc(sizeof(float) * rows * (size_t)r);
    e->fwd.lora_out = malloc(sizeof(float) * out);
    e->fwd.lora_rank = e->fwd.lora_xa && e->fwd.lora_in && e->fwd.lora_out ? r : 0;
    return e->fwd.lora_rank ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory for the adapter path (rank %d)", r);
}

/* Takes a waiting weight update: the step about to run sees all of it, and nothing before did. */
static trill_status take_update(trill_engine *e) {
    pthread_mutex_lock(&e->update.lock);
    eng_weights *w = NULL;
    eng_adapter *ad = NULL;
    bool has_w = false, has_ad = false, pending = e->update.pending;
    uint32_t version = e->update.version;
    if (pending) {
        has_w = e->update.has_w;
        has_ad = e->update.has_ad;
        w = e->update.w;
        ad = e->update.ad;
        e->update.pending = e->update.has_w = e->update.has_ad = false;
        e->update.w = NULL;
        e->update.ad = NULL;
    }
    pthread_mutex_unlock(&e->update.lock);
    if (!pending) return TRILL_OK;
    trill_status st = ad ? ensure_lora_buffers(e, ad->rank) : TRILL_OK;
    if (st) { /* keep running on the old weights; the update is dropped with the error */
        free_weights(&e->c, w);
        free_adapter(&e->c, ad);
        return st;
    }
    if (has_w) {
        free_weights(&e->c, e->w);
        e->w = w;
    }
    if (has_ad) {
        free_adapter(&e->c, e->ad);
        e->ad = ad;
    }
    e->version = version;
    return TRILL_OK;
}

/* Queues an update for the next step; a newer one replaces one not yet taken. */
static void post_update(trill_engine *e, bool has_w, eng_weights *w, bool has_ad, eng_adapter *ad, uint32_t version) {
    pthread_mutex_lock(&e->update.lock);
    if (has_w) {
        if (e->update.w) free_weights(&e->c, e->update.w);
        e->update.w = w;
        e->update.has_w = true;
    }
    if (has_ad) {
        if (e->update.ad) free_adapter(&e->c, e->update.ad);
        e->update.ad = ad;
        e->update.has_ad = true;
    }
    e->update.version = version;
    e->update.pending = true;
    pthread_mutex_unlock(&e->update.lock);
}

static trill_status same_architecture(const trill_config *a, const trill_config *b) {
    if (a->hidden_size != b->hidden_size || a->num_hidden_layers != b->num_hidden_layers || a->vocab_size != b->vocab_size ||
        a->num_attention_heads != b->num_attention_heads || a->num_key_value_heads != b->num_key_value_heads ||
        a->head_dim != b->head_dim || a->intermediate_size != b->intermediate_size || a->num_experts != b->num_experts ||
        a->moe_intermediate_size != b->moe_intermediate_size || a->n_moe_layers != b->n_moe_layers)
        return trill_error(TRILL_ERR_INVALID, "weight update: the model's architecture differs from the engine's");
    for (int l = 0; l < a->num_hidden_layers; l++)
        if (a->moe_ordinal[l] != b->moe_ordinal[l])
            return trill_error(TRILL_ERR_INVALID, "weight update: layer %d is %s in the update but %s in the engine", l,
                               b->moe_ordinal[l] >= 0 ? "MoE" : "dense", a->moe_ordinal[l] >= 0 ? "MoE" : "dense");
    return TRILL_OK;
}

trill_status trill_engine_update_weights(trill_engine *e, const trill_model *m, uint32_t version, size_t *bytes) {
    trill_status st = same_architecture(&e->c, &m->config);
    if (!st) st = check_finite_model(m);
    eng_weights *w = NULL;
    if (!st) st = build_weights(&e->c, e->cfg.format, m, &w);
    if (st) return st;
    if (bytes) *bytes = w->bytes;
    post_update(e, true, w, false, NULL, version);
    return TRILL_OK;
}

trill_status trill_engine_update_adapter(trill_engine *e, const trill_lora *lora, uint32_t version, size_t *bytes) {
    eng_adapter *ad = NULL;
    if (lora) {
        if (lora->config.rank < 1) return trill_error(TRILL_ERR_INVALID, "adapter update: rank %d", lora->config.rank);
        trill_status st = check_finite_lora(lora);
        if (!st) st = build_adapter(&e->c, lora, &ad);
        if (st) return st;
    }
    if (bytes) *bytes = ad ? ad->bytes : 0;
    post_update(e, false, NULL, true, ad, version);
    return TRILL_OK;
}

trill_status trill_engine_step(trill_engine *e, trill_step_stats *stats) {
    trill_step_stats local = { 0 };
    int R = 0;
    trill_status st = take_update(e);
    if (!st) st = schedule(e, &R, &local);
    if (!st && R == 0 && trill_engine_busy(e)) /* never a step that makes no progress */
        st = trill_error(TRILL_ERR_INVALID, "engine: no work can be scheduled: %d sequences waiting, %d running, %d of %d KV blocks free",
                         e->sched.n_waiting, e->sched.n_active, e->kv.n_free, e->kv.n_blocks);
    if (!st && R > 0) st = ensure_sampler_scratch(e);
    if (!st && R > 0) st = ensure_scores(e, R);
    if (!st && R > 0) {
        forward_rows(e, R);
        st = after_forward(e, R);
        if (!st && e->eplb.window) st = eplb_after_step(e);
    }
    local.rows = R;
    local.running = e->sched.n_active;
    local.waiting = e->sched.n_waiting;
    if (stats) *stats = local;
    return st;
}

trill_status trill_engine_run(trill_engine *e) {
    while (trill_engine_busy(e)) {
        trill_status st = trill_engine_step(e, NULL);
        if (st) return st;
    }
    return TRILL_OK;
}

int trill_engine_collect(trill_engine *e, trill_sequence_out *out, int max) {
    const int n = e->sched.n_done < max ? e->sched.n_done : max;
    if (n <= 0) return 0; /* e->sched.done may not exist yet */
    memcpy(out, e->sched.done, sizeof *out * (size_t)n);
    memmove(e->sched.done, e->sched.done + n, sizeof *e->sched.done * (size_t)(e->sched.n_done - n));
    e->sched.n_done -= n;
    return n;
}
