/* The engine's weights (engine_internal.h): conversion from a trill_model into the engine's format,
 * derived from the family's tensor table (each fusion group, e.g. q/k/v and gate/up, one matrix;
 * int8 keeps routers and heads in bf16), freeing, and what a decode step reads (benchmarks). */
#include <stdlib.h>
#include <string.h>

#include "arch/family.h"
#include "base/alloc.h"
#include "infer/engine_internal.h"
#include "trill/kernels.h"

/* One generator matrix from the row-wise concatenation of parts (all [rows_i, K], same storage). */
static trill_status make_matrix(gen_matrix *g, trill_gen_format f, const trill_weight *parts, const int *rows, int n_parts, int K) {
    int N = 0;
    for (int i = 0; i < n_parts; i++) N += rows[i];
    if (n_parts == 1) return trill_gen_matrix_create(g, f, parts[0].f32, parts[0].bf16, N, K);
    const bool half = parts[0].bf16 != NULL;
    const size_t elem = half ? sizeof(uint16_t) : sizeof(float);
    char *buf = trill_malloc((size_t)N * K * elem), *at = buf;
    if (!buf) return trill_error(TRILL_ERR_NOMEM, "out of memory converting weights");
    for (int i = 0; i < n_parts; i++) {
        memcpy(at, half ? (const void *)parts[i].bf16 : (const void *)parts[i].f32, (size_t)rows[i] * K * elem);
        at += (size_t)rows[i] * K * elem;
    }
    trill_status st = trill_gen_matrix_create(g, f, half ? NULL : (const float *)buf, half ? (const uint16_t *)buf : NULL, N, K);
    free(buf);
    return st;
}

static float *copy_floats(const float *src, size_t n) {
    float *p = trill_malloc(n * sizeof(float));
    if (p) memcpy(p, src, n * sizeof(float));
    return p;
}

/* ---- the table's matrices: single tensors and fusion groups ---- */

trill_status trill_eng_for_each_matrix(const trill_config *c, const trill_param *t, size_t n,
                                 trill_status (*fn)(void *ctx, const eng_group *g), void *ctx) {
    const int E = c->num_experts > 0 ? c->num_experts : 0;
    const size_t n_keys = (size_t)(E + 1) * 3 * ENG_MAX_PARTS; /* (expert + 1, fusion, part) */
    int *part_at = trill_malloc(n_keys * sizeof(int));
    if (!part_at) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    bool has_head = false;
    for (size_t a = 0; a < n && !st;) {
        size_t b = a + 1; /* a layer's tensors are contiguous; a global tensor is a range of its own */
        if (t[a].layer >= 0)
            while (b < n && t[b].layer == t[a].layer) b++;
        for (size_t k = 0; k < n_keys; k++) part_at[k] = -1;
#define KEY(p) (((size_t)((p)->expert + 1) * 3 + (size_t)(p)->fuse) * ENG_MAX_PARTS + (size_t)(p)->fuse_index)
        for (size_t i = a; i < b; i++)
            if (t[i].fuse != TRILL_FUSE_NONE && t[i].fuse_index < ENG_MAX_PARTS && t[i].expert < E) part_at[KEY(&t[i])] = (int)i;
        for (size_t i = a; i < b && !st; i++) {
            const trill_param *p = &t[i];
            has_head |= p->kind == TRILL_TENSOR_HEAD;
            if (p->ndim != 2 || p->kind == TRILL_TENSOR_EMBEDDING || (p->fuse != TRILL_FUSE_NONE && p->fuse_index > 0)) continue;
            eng_group g = { .layer = p->layer, .expert = p->expert, .role = p->role, .kind = p->kind, .parts = { (int)i }, .n_parts = 1 };
            if (p->fuse != TRILL_FUSE_NONE)
                for (int j = 1; j < ENG_MAX_PARTS; j++) {
                    const int at = part_at[KEY(p) + (size_t)j];
                    if (at < 0) break;
                    g.parts[g.n_parts++] = at;
                }
#undef KEY
            if (g.role < 0 || g.role >= ENG_MAX_ROLES)
                st = trill_error(TRILL_ERR_UNSUPPORTED, "engine: tensor %s has role %d, beyond the engine's %d", p->name, g.role, ENG_MAX_ROLES);
            else st = fn(ctx, &g);
        }
        a = b;
    }
    free(part_at);
    if (st || has_head || !c->tie_word_embeddings) return st;
    for (size_t i = 0; i < n; i++) /* tied: the embedding serves as the head */
        if (t[i].kind == TRILL_TENSOR_EMBEDDING) {
            const eng_group g = { .layer = -1, .expert = -1, .role = trill_family_of(c)->tied_head_role, .kind = TRILL_TENSOR_HEAD,
                                  .parts = { (int)i }, .n_parts = 1 };
            return fn(ctx, &g);
        }
    return TRILL_OK;
}

void trill_eng_free_slots(const trill_config *c, eng_layer *L) {
    for (int r = 0; r < ENG_MAX_ROLES; r++) {
        trill_gen_matrix_free(&L->m[r]);
        for (int x = 0; L->experts[r] && x < c->num_experts; x++) trill_gen_matrix_free(&L->experts[r][x]);
        free(L->experts[r]);
        free(L->vec[r]);
    }
    for (int h = 0; h < ENG_HEAD_SLOTS; h++) {
        for (int x = 0; L->heads[h] && x < c->num_attention_heads; x++) trill_gen_matrix_free(&L->heads[h][x]);
        free(L->heads[h]);
    }
}

void trill_eng_free_weights(const trill_config *c, eng_weights *w) {
    if (!w) return;
    for (int l = 0; w->layers && l < c->num_hidden_layers; l++) trill_eng_free_slots(c, &w->layers[l]);
    free(w->layers);
    trill_eng_free_slots(c, &w->global);
    free(w->embed_f32);
    free(w->embed_bf16);
    free(w);
}

typedef struct build { eng_weights *w; const trill_model *m; trill_gen_format f; } build;

/* One group's matrix in the engine's format, filed under its role. */
static trill_status build_matrix(void *ctx, const eng_group *g) {
    build *b = ctx;
    const trill_config *c = &b->m->config;
    eng_layer *L = g->layer >= 0 ? &b->w->layers[g->layer] : &b->w->global;
    gen_matrix *dst = &L->m[g->role];
    if (g->expert >= 0) {
        if (!L->experts[g->role] && !(L->experts[g->role] = trill_calloc((size_t)c->num_experts, sizeof(gen_matrix))))
            return trill_error(TRILL_ERR_NOMEM, "out of memory");
        dst = &L->experts[g->role][g->expert];
    }
    trill_weight parts[ENG_MAX_PARTS];
    int rows[ENG_MAX_PARTS];
    for (int p = 0; p < g->n_parts; p++) {
        const trill_param *t = &b->m->tensors[g->parts[p]];
        parts[p] = (trill_weight){ t->data, t->bf16 };
        rows[p] = (int)t->shape[0];
    }
    /* int8 leaves the router and the head in bf16, as W8A8 serving does: routing and the output
     * distribution are the most sensitive to quantisation */
    const bool fine = g->kind == TRILL_TENSOR_ROUTER || g->kind == TRILL_TENSOR_HEAD;
    const trill_gen_format f = fine && b->f == TRILL_GEN_INT8 ? TRILL_GEN_BF16 : b->f;
    trill_status st = make_matrix(dst, f, parts, rows, g->n_parts, (int)b->m->tensors[g->parts[0]].shape[1]);
    if (!st) b->w->bytes += dst->bytes;
    return st;
}

static trill_status fill_weights(eng_weights *w, const trill_config *c, trill_gen_format f, const trill_model *m) {
    if (!(w->layers = trill_calloc((size_t)c->num_hidden_layers, sizeof *w->layers))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < m->n_tensors; i++) { /* vectors: fp32 copies; the embedding: a table in the format's dtype */
        const trill_param *p = &m->tensors[i];
        if (p->kind == TRILL_TENSOR_EMBEDDING) {
            if (f == TRILL_GEN_F32) {
                if ((w->embed_f32 = trill_malloc(p->numel * sizeof(float))) && p->data) memcpy(w->embed_f32, p->data, p->numel * sizeof(float));
                else if (w->embed_f32) trill_bf16_widen(w->embed_f32, p->bf16, p->numel);
            } else if ((w->embed_bf16 = trill_malloc(p->numel * sizeof(uint16_t)))) {
                if (p->bf16) memcpy(w->embed_bf16, p->bf16, p->numel * sizeof(uint16_t));
                else trill_from_f32(w->embed_bf16, p->data, TRILL_BF16, p->numel);
            }
            if (!w->embed_f32 && !w->embed_bf16) return trill_error(TRILL_ERR_NOMEM, "out of memory");
            w->bytes += p->numel * (f == TRILL_GEN_F32 ? 4 : 2);
        } else if (p->ndim == 1) {
            if (p->role < 0 || p->role >= ENG_MAX_ROLES) return trill_error(TRILL_ERR_UNSUPPORTED, "engine: tensor %s has role %d", p->name, p->role);
            float **dst = &(p->layer >= 0 ? &w->layers[p->layer] : &w->global)->vec[p->role];
            if (p->expert >= 0) { /* a routed expert's (biases): one [E, numel] array per role, by logical id */
                if (!*dst && !(*dst = trill_calloc((size_t)c->num_experts * p->numel, sizeof(float))))
                    return trill_error(TRILL_ERR_NOMEM, "out of memory");
                if (p->data) memcpy(*dst + (size_t)p->expert * p->numel, p->data, p->numel * sizeof(float));
                else trill_bf16_widen(*dst + (size_t)p->expert * p->numel, p->bf16, p->numel);
            } else if (!(*dst = copy_floats(p->data, p->numel))) {
                return trill_error(TRILL_ERR_NOMEM, "out of memory");
            } else if (trill_norm_centered(c, p->role)) { /* a zero-centred RMSNorm's weight, held as the 1 + w it applies */
                for (size_t j = 0; j < p->numel; j++) (*dst)[j] += 1.0f;
            }
            w->bytes += p->numel * 4;
        }
    }
    build b = { .w = w, .m = m, .f = f };
    return trill_eng_for_each_matrix(c, m->tensors, m->n_tensors, build_matrix, &b);
}

/* m's weights in `format`: m must have this engine's architecture. */
trill_status trill_eng_build_weights(const trill_config *c, trill_gen_format format, const trill_model *m, eng_weights **out) {
    eng_weights *w = trill_calloc(1, sizeof *w);
    if (!w) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = fill_weights(w, c, format, m);
    if (!st) st = trill_eng_decoder.derive_weights(c, format, m, w);
    if (st) {
        trill_eng_free_weights(c, w);
        return st;
    }
    *out = w;
    return TRILL_OK;
}

/* Per decode token at batch 1, what the matrices cost: each used matrix's bytes (the bytes
 * one step streams) or 2 N K FLOPs, plus the embedding row's bytes. Routed experts count their
 * top-k at the average size. */
static double slots_cost(const trill_config *c, const eng_layer *L, bool flops) {
#define COST(mat) (flops ? 2.0 * (mat).N * (mat).K : (double)(mat).bytes)
    double total = 0, experts = 0;
    for (int r = 0; r < ENG_MAX_ROLES; r++) {
        total += COST(L->m[r]);
        for (int x = 0; L->experts[r] && x < c->num_experts; x++) experts += COST(L->experts[r][x]);
    }
    for (int h = 0; h < ENG_HEAD_SLOTS; h++)
        for (int x = 0; L->heads[h] && x < c->num_attention_heads; x++) total += COST(L->heads[h][x]);
#undef COST
    return experts > 0 ? total + experts / c->num_experts * c->num_experts_per_tok : total;
}

static double per_token_cost(const trill_engine *e, bool flops) {
    const trill_config *c = &e->c;
    const eng_weights *w = e->w;
    double total = slots_cost(c, &w->global, flops) + (double)c->hidden_size * (flops ? 0 : w->embed_f32 ? 4 : 2);
    for (int l = 0; l < c->num_hidden_layers; l++) total += slots_cost(c, &w->layers[l], flops);
    return total;
}

size_t trill_engine_decode_bytes(const trill_engine *e) { return (size_t)per_token_cost(e, false); }

double trill_engine_decode_flops(const trill_engine *e) { return per_token_cost(e, true); }
