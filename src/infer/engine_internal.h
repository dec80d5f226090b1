/* The generator engine's private side: struct trill_engine (never in include/; trill/infer.h is
 * the public API) and the interfaces between the files that implement it:
 *
 *   engine.c           create, free, step, run, accessors
 *   engine_weights.c   weights in the engine's format: conversion from a trill_model (q/k/v and
 *                      gate/up fused), freeing, what a decode step reads
 *   engine_adapter.c   adapters and live updates: built in the caller's thread, posted to the
 *                      mailbox, taken whole at a step boundary
 *   engine_eplb.c      expert placement: the load window, re-planning, imbalance
 *   engine_requests.c  submit, requests and sequences, scheduling a step's rows, preemption
 *   gen_decoder.c      the decoder layer (trill_eng_forward), every family's with the options
 *                      of its layer description: the layer forward over a step's rows
 *                      (attention over the paged cache, MoE grouping, LoRA side paths), the
 *                      logits, the buffers it needs and its KV layout; gen_mla.c MLA's part
 *   engine_sample.c    after the forward: sampling, forks, stops, finish, abort, collect
 *
 * One thread steps an engine; only the update mailbox is shared with other threads. */
#ifndef TRILL_INFER_ENGINE_INTERNAL_H
#define TRILL_INFER_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "infer/gemm.h"
#include "infer/kvcache.h"
#include "trill/dist.h"
#include "trill/eplb.h"
#include "trill/infer.h"
#include "trill/arch.h"
#include "model/lora_internal.h"
#include "trill/lora.h"
#include "trill/timing.h"

/* ---- weights and adapters (engine_weights.c, engine_adapter.c) ---- */

/* The engine's matrices are built from the family's tensor table (src/arch/): a tensor, or a
 * fusion group (q|k|v, gate|up) whose parts are stacked in fuse_index order, becomes one
 * gen_matrix filed under the role of its first part; vectors become fp32 copies under their
 * role. Layer tensors go to their layer's slots, the others (final norm, head) to `global`. */
enum { ENG_MAX_ROLES = 56, ENG_MAX_PARTS = 3, ENG_HEAD_SLOTS = 2 };

/* One layer's (or the model's global) weights in the engine's format. */
typedef struct eng_layer {
    gen_matrix m[ENG_MAX_ROLES];        /* e.g. m[TRILL_ROLE_Q] is [q | k | v] fused: [(nh + 2 nkv) hd, H] */
    gen_matrix *experts[ENG_MAX_ROLES]; /* [num_experts] per routed-expert role (TRILL_ROLE_EXPERT_GATE: gate | up) */
    float *vec[ENG_MAX_ROLES];          /* fp32 copies of the norm and bias vectors */
    /* [num_attention_heads] matrices per attention head that the family derives from the
     * table's (trill_eng_forward.derive_weights; MLA's absorbed kv_b_proj), or NULL */
    gen_matrix *heads[ENG_HEAD_SLOTS];
} eng_layer;

/* Every weight the forward reads, in the engine's format: swapped whole on a merged update. */
typedef struct eng_weights {
    eng_layer *layers;
    eng_layer global;     /* final norm, head (a tied head built from the embedding) */
    float *embed_f32;     /* [V, H] (f32 format) ... */
    uint16_t *embed_bf16; /* ... or bf16 (the others) */
    size_t bytes;         /* as served */
} eng_weights;

/* LoRA on one engine matrix, whose output columns may be several fused modules ("parts"):
 * y[:, part p] += scale * (x A_p^T) B_p^T. The adapted parts' A are stacked into one matrix so
 * x is read once. In the adapter format (eng_adapter.format): fp32 beside fp32 weights, bf16
 * beside bf16 and int8 ones, as serving engines keep LoRA in the model's dtype: at decode the
 * adapters are read from memory every step, beside the base weights. */
typedef struct eng_lora {
    int n_adapted;       /* 0: no adapter on this matrix */
    int layer, role, expert; /* in the engine's layout (trill_engine.layout) only: where it sits (layer -1: global; expert -1: none) */
    gen_matrix A;        /* [n_adapted * r, K] */
    gen_matrix B[ENG_MAX_PARTS]; /* per adapted part: [cols, r] */
    int col0[ENG_MAX_PARTS], cols[ENG_MAX_PARTS];
} eng_lora;

/* A rank-r side path of a per-head matrix (eng_layer.heads): y_h += scale * expand_h (shrink_h
 * x_h), each of the two either one matrix per head or one shared by every head (MLA's absorbed
 * kv_b_proj: B's rows are per head, A is shared). shrink NULL: none. */
typedef struct eng_head_lora {
    gen_matrix *shrink, *expand; /* [num_attention_heads] when *_per_head, else [1] */
    int shrink_per_head, expand_per_head;
    int layer, slot;             /* in the engine's layout only: where it sits */
} eng_head_lora;

/* One layer's adapters, slot by slot as eng_layer (n_adapted 0 where there is none). */
typedef struct eng_lora_layer {
    eng_lora m[ENG_MAX_ROLES];
    eng_lora *experts[ENG_MAX_ROLES]; /* [num_experts] */
    eng_head_lora heads[ENG_HEAD_SLOTS]; /* the family's per-head side paths (trill_eng_forward.derive_adapter) */
} eng_lora_layer;

/* A set of adapters, applied on the side of the base weights (adapter sync mode). */
typedef struct eng_adapter {
    int rank;
    float scale;
    eng_lora_layer *layers;
    eng_lora_layer global;
    trill_gen_format format; /* of every matrix: trill_eng_adapter_format(the weights') */
    size_t bytes;            /* the fp32 LoRA tensors it was made from (what an update ships) */
    size_t resident;         /* its matrices as the engine keeps them */
} eng_adapter;

/* The adapters' format beside weights in `weights`: fp32 with fp32, else bf16 (never int8). */
trill_gen_format trill_eng_adapter_format(trill_gen_format weights);

/* One engine matrix as the table describes it: the indices (into the model's tensors) of its
 * parts in fuse_index order; layer -1 for a global one. */
typedef struct eng_group {
    int layer, expert, role;
    trill_tensor_kind kind;
    int parts[ENG_MAX_PARTS];
    int n_parts;
} eng_group;

/* Calls fn for every matrix of the model's tensors t[n] (in checkpoint order of their first
 * part; vectors and the embedding are not matrices here), then for a tied head (the
 * embedding's tensor as its one part, kind TRILL_TENSOR_HEAD). Stops at fn's first error. */
trill_status trill_eng_for_each_matrix(const trill_config *c, const trill_param *t, size_t n,
                                 trill_status (*fn)(void *ctx, const eng_group *g), void *ctx);

/* ---- requests and sequences (engine_requests.c, engine_sample.c) ---- */

/* A submitted request, kept until its last sample finishes. */
typedef struct req {
    trill_request r; /* arrays below are the engine's copies */
    int *prompt, *stop_ids, *forced, *forced_at; /* forced_at [n + 1]: sample k's forced tokens */
    char **stop_strings;
    size_t max_stop_len;
} req;

/* One sample of a request: its tokens, its KV blocks and what it generated. */
typedef struct seq {
    req *rq;
    int sample;
    int *tokens;          /* [cap]: prompt then generated */
    int n_tokens, cap;
    int n_prompt;
    int n_computed;       /* tokens whose K/V are in the cache */
    kv_table kv;
    kv_table kv_win;      /* with trill_engine.kv_split: its blocks of the windowed layers' cache */
    float *logprobs;      /* [max_new_tokens] */
    uint32_t *versions;
    uint16_t *experts;    /* capture: [cap][n_moe][K] */
    float *gdn;           /* Gated DeltaNet layers: each one's conv and recurrent state, fp32 (src/infer/gen_gdn.c) */
    bool forks_pending;   /* a group's first sequence: its siblings fork off when the prompt is done */
    int max_new;          /* this turn's max_new_tokens (the request's, then trill_engine_continue's) */
    int key_base;         /* draw positions start here this turn: tokens after the request's prompt */
    uint64_t digest;      /* held: the tokens it finished with (their arrays went to its output) */
} seq;

/* ---- the engine's state, by owner ---- */

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
    seq **held;    /* finished samples of requests with hold, KV kept (trill_engine_continue) */
    int n_held, cap_held;
    bool recheck_stops;   /* the last step could not check its stop strings (trill_eng_finish_stopped) */
} eng_sched;

/* The step's rows, (sequence, position, token), for up to max_batch_tokens of them. */
typedef struct eng_rows {
    int max;
    seq **seq;
    int *pos, *token;
    uint8_t *slot;        /* the adapter slot of each row (its request's) */
    bool mixed;           /* some row uses a slot other than 0 */
    int *logit;           /* the rows that produce logits, in order */
} eng_rows;

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
    bool replan;          /* a plan is due (it failed for want of memory after the last step) */
} eng_eplb;

typedef struct trill_eng_forward trill_eng_forward;

/* trill_engine_profile's state. */
typedef struct eng_prof {
    trill_gen_profile p;
    trill_gen_phase cur;
    double last;
    bool enabled; /* trill_engine_profile(e, true) */
    bool running; /* inside a step, enabled */
} eng_prof;

struct trill_engine {
    trill_config c;
    const trill_eng_forward *fam; /* the decoder layer's forward (below) */
    trill_param *tensors; /* the model's tensors as its table describes them (no storage): the adapters' layout */
    size_t n_tensors;
    trill_engine_config cfg;
    eng_weights *w;       /* the weights steps run on */
    eng_adapter *ad;      /* and their adapters, or NULL: slot 0 */
    eng_adapter *slots[TRILL_ENGINE_ADAPTER_SLOTS]; /* slots [1, ..) (trill_engine_set_adapter); [0] unused */
    int n_slots;          /* slots set */
    /* Every adapter's shape with no matrices: each entry knows where it sits, so the families'
     * forwards name an adapter matrix by its layout entry and the side path finds each slot's. */
    eng_adapter *layout;
    uint32_t version;     /* of w + ad: recorded with every token sampled */
    eng_mailbox update;   /* engine_adapter.c */
    kv_cache kv;          /* blocks handed out by the scheduler, written and read by the forward */
    int kv_window;        /* every layer attends within this sliding window (0: not so): blocks before it are given back */
    /* Layers that attend within one window beside layers that attend to everything (gpt-oss):
     * the windowed layers keep their K/V in a cache of their own, kv_win (the other layers 0
     * wide there, and the windowed ones 0 wide in kv), whose blocks are given back once their
     * positions leave kv_win_window; kv then holds the full layers' only. */
    bool kv_split;
    int kv_win_window;
    kv_cache kv_win;
    eng_sched sched;      /* engine_requests.c; finished ones by engine_sample.c */
    eng_rows rows;        /* made by the scheduler, read by the forward and the sampler */
    void *fwd;            /* the family's forward buffers: its alloc makes them, its free frees them */
    float *logits;        /* [rows.max, V] the family's logits write the rows of rows.logit here (its
                           * alloc sets it) */
    eng_sampler smp;      /* engine_sample.c */
    eng_eplb eplb;        /* engine_eplb.c; routed counts added by the forward */
    /* expert parallelism across ranks (trill_engine_set_expert_comm): each rank's engine runs its
     * own sequences, and every MoE layer sends its rows to the ranks holding their experts
     * (physical slots [rank * per, (rank + 1) * per) of the EPLB plan, or logical experts without
     * EPLB); NULL: one process computes every expert */
    trill_comm *ep;
    int ep_rank, ep_size;
    uint64_t ep_moved;    /* bytes of expert weights this rank received on re-plans */
    eng_prof *prof;       /* trill_engine_profile on: the phase clock; else NULL */
};

/* The phase clock: charges the time since the last switch to the current phase, then runs `ph`
 * (called on the master thread only, outside parallel regions). No-op unless profiling. */
static inline void eng_phase(const trill_engine *e, trill_gen_phase ph) {
    eng_prof *p = e->prof;
    if (!p || !p->running) return;
    const double now = trill_now();
    p->p.seconds[p->cur] += now - p->last;
    p->cur = ph, p->last = now;
}
/* FLOPs f of attention itself (trill_gen_profile.attention_flops). */
static inline void eng_count_attention_flops(const trill_engine *e, double f) {
    if (e->prof && e->prof->running) e->prof->p.attention_flops += f;
}
/* Attention's FLOPs over the cache for a step's R rows: per_position FLOPs for each position a
 * row attends to (within `window`; 0: all). */
static inline void eng_count_attention(const trill_engine *e, int R, int window, double per_position) {
    if (!e->prof || !e->prof->running) return;
    double n = 0;
    for (int r = 0; r < R; r++) {
        const int p = e->rows.pos[r] + 1;
        n += window > 0 && p > window ? window : p;
    }
    e->prof->p.attention_flops += n * per_position;
}
/* FLOPs of n products (2 T N K each) and the weight bytes they stream to the current phase. */
static inline void eng_count_products(const trill_engine *e, const gen_product *list, int n) {
    eng_prof *p = e->prof;
    if (!p || !p->running) return;
    double f = 0, b = 0;
    for (int i = 0; i < n; i++) f += 2.0 * list[i].T * list[i].W->N * list[i].W->K, b += (double)list[i].W->bytes;
#pragma omp atomic /* EPLB's workers count concurrently */
    p->p.flops[p->cur] += f;
#pragma omp atomic
    p->p.weight_bytes[p->cur] += b;
}

/* p grown (realloc) to hold at least `need` elements, *cap updated; NULL when out of memory (p
 * is then still valid). */
static inline void *eng_grow(void *p, int *cap, int need, size_t elem) {
    if (need <= *cap) return p;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = trill_realloc(p, (size_t)c * elem);
    if (q) *cap = c;
    return q;
}

/* ---- interfaces between the parts ---- */

/* engine_weights.c */
/* m's weights in `format`: m must have this engine's architecture. */
trill_status trill_eng_build_weights(const trill_config *c, trill_gen_format format, const trill_model *m, eng_weights **out);
void trill_eng_free_weights(const trill_config *c, eng_weights *w);
/* Frees one layer's (or the global) slots. */
void trill_eng_free_slots(const trill_config *c, eng_layer *L);

/* engine_adapter.c */
void trill_eng_free_adapter(const trill_config *c, eng_adapter *ad);
/* The layout (trill_engine.layout) of e's adapters. */
trill_status trill_eng_build_layout(trill_engine *e);
/* The adapter of slot s (0: e->ad), or NULL. */
static inline const eng_adapter *trill_eng_slot_adapter(const trill_engine *e, int s) { return s == 0 ? e->ad : e->slots[s]; }
/* The largest rank of the adapters in use (0: none). */
int trill_eng_max_rank(const trill_engine *e);
/* Takes a waiting update at the start of a step: the step sees all of it. */
trill_status trill_eng_take_update(trill_engine *e);

/* engine_eplb.c */
/* EPLB on: physical slots and the first plan (before the family's alloc, which sizes by them). */
trill_status trill_eng_eplb_start(trill_engine *e);
/* The step's routed counts join the window; every eplb_interval steps a new plan. */
trill_status trill_eng_eplb_after_step(trill_engine *e);
/* Before a step: a plan left due by a failure. */
trill_status trill_eng_eplb_before_step(trill_engine *e);
/* A step that failed before it took effect: its routed counts are dropped (it runs again). */
void trill_eng_eplb_discard_step(trill_engine *e);
void trill_eng_eplb_free(trill_engine *e);

/* engine_ep.c: expert parallelism across ranks */
/* Releases the expert matrices this rank does not hold under the current placement. */
void trill_eng_ep_place(trill_engine *e);
/* A re-plan: the experts each rank newly holds under `now`, from their holders under `old`
 * (collective over the group); the caller then releases what the rank no longer holds. */
trill_status trill_eng_ep_move(trill_engine *e, const trill_eplb_plan *old, const trill_eplb_plan *now);

/* engine_requests.c */
/* Sample `sample` of q, with room for its whole length (no tokens yet). */
trill_status trill_eng_new_seq(trill_engine *e, req *q, int sample, seq **out);
/* Frees s and gives its KV blocks back. */
void trill_eng_free_seq(trill_engine *e, seq *s);
void trill_eng_free_req(req *q);
/* Removes list[i], keeping the order. */
void trill_eng_remove_at(seq **list, int *n, int i);
/* engine_turns.c: room for one more held sample, and a finished sample of a request with hold
 * into the held list (its arrays have gone to its output; digest: of its tokens); the request record freed once no sample of it is
 * waiting, running or held; a held sample's KV blocks given back (true when one had any). */
trill_status trill_eng_reserve_held(trill_engine *e);
void trill_eng_hold(trill_engine *e, seq *s, uint64_t digest); /* room reserved */
void trill_eng_drop_req_if_done(trill_engine *e, req *q);
bool trill_eng_release_held_blocks(trill_engine *e);
/* A sequence's KV tables in the engine's caches (engine_requests.c): reserve, as
 * trill_kv_table_reserve in each (a window-cache failure gives back what the call took in kv);
 * share (a fork); release; and the window's release before the next rows from n_computed. */
int trill_eng_kv_reserve(trill_engine *e, seq *s, int n_tokens, int write_from);
trill_status trill_eng_kv_share(trill_engine *e, seq *dst, const seq *src);
void trill_eng_kv_release(trill_engine *e, seq *s);
void trill_eng_kv_drop_window(trill_engine *e, seq *s);
uint64_t trill_eng_token_digest(const int *tokens, int n);
/* Picks the step's rows into e->rows (*rows of them), preempting when blocks run out. */
trill_status trill_eng_schedule(trill_engine *e, int *rows, trill_step_stats *stats);
void trill_eng_sched_free(trill_engine *e);

/* ---- the decoder layer's forward over a step's rows and the KV layout it asks for
 * (src/infer/gen_decoder.c) ---- */
struct trill_eng_forward {
    /* Refuses (with a message) a config the forward cannot run. */
    trill_status (*check)(const trill_config *c);
    /* The KV cache's layout: shape[num_hidden_layers], each layer's K and V widths per token (the
     * cache itself knows nothing of heads; a latent-attention family asks for one width). */
    void (*kv_shape)(const trill_config *c, kv_layer_shape *shape);
    trill_status (*alloc)(trill_engine *e); /* e->fwd and e->logits for e->rows.max rows */
    void (*free)(trill_engine *e);          /* frees e->fwd (also when alloc failed part-way) */
    /* Attention scores for rows [0, R)'s longest context, for this thread count. */
    trill_status (*ensure_scores)(trill_engine *e, int R);
    /* The adapter side path's buffers for rank r. */
    trill_status (*ensure_lora_buffers)(trill_engine *e, int r);
    /* Rows [0, R) of e->rows through every layer, up to their final hidden states.
     * TRILL_ERR_NOMEM when a matrix kernel's scratch cannot be had (nothing else is changed: the
     * KV cache rows written are the step's own, rewritten when it runs again). */
    trill_status (*rows)(trill_engine *e, int R);
    /* Logits (into e->logits) of the n rows listed in e->rows.logit; fails as rows does. */
    trill_status (*logits)(trill_engine *e, int n);
    /* Matrices derived from the table's after they are built (MLA's), into the
     * layers' heads slots (and dropping table matrices the forward does not read), for weights
     * in format f from m, and for a set of adapters from lora; freed with the slots. */
    trill_status (*derive_weights)(const trill_config *c, trill_gen_format f, const trill_model *m, eng_weights *w);
    trill_status (*derive_adapter)(const trill_engine *e, const trill_lora *lora, eng_adapter *ad);
};

/* The decoder's, every family's (gen_decoder.c). */
extern const trill_eng_forward trill_eng_decoder;

/* engine_sample.c */
trill_status trill_eng_sampler_alloc(trill_engine *e);
void trill_eng_sampler_free(trill_engine *e);
/* Sampler scratch for this thread count. */
trill_status trill_eng_ensure_sampler_scratch(trill_engine *e);
/* After the forward over R rows: logits, forks, samples, stops. Out of memory before the samples
 * are taken changes nothing (the step can run again); after them, only the stop check can fail,
 * and it is left pending (sched.recheck_stops). */
trill_status trill_eng_after_forward(trill_engine *e, int R);
/* Finishes the sequences whose newest token stops them. */
trill_status trill_eng_finish_stopped(trill_engine *e);

#endif
