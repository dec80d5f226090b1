/* The family registry and the walk that expands a family's tensor table for a config. */
#include "arch/family.h"

#include <stdio.h>
#include <string.h>

const trill_family *const trill_families[] = { &trill_family_qwen3, &trill_family_deepseek_v3 };
const int trill_n_families = (int)(sizeof trill_families / sizeof trill_families[0]);

static const trill_family *family_of_arch(trill_arch arch, const trill_arch_names **names) {
    for (int f = 0; f < trill_n_families; f++)
        for (int a = 0; a < trill_families[f]->n_archs; a++)
            if (trill_families[f]->archs[a].arch == arch) {
                if (names) *names = &trill_families[f]->archs[a];
                return trill_families[f];
            }
    return NULL;
}

const trill_family *trill_family_of(const trill_config *c) {
    const trill_family *f = family_of_arch(c->arch, NULL);
    return f ? f : trill_families[0]; /* every trill_arch has a family: not reached */
}

const trill_arch_names *trill_arch_names_of(trill_arch arch) {
    const trill_arch_names *names = NULL;
    return family_of_arch(arch, &names) ? names : &trill_families[0]->archs[0];
}

const trill_arch_names *trill_arch_by_model_type(const char *model_type) {
    for (int f = 0; f < trill_n_families; f++)
        for (int a = 0; a < trill_families[f]->n_archs; a++)
            if (strcmp(trill_families[f]->archs[a].model_type, model_type) == 0) return &trill_families[f]->archs[a];
    return NULL;
}

static void emit(const trill_family *f, const trill_config *c, int r, int layer, int expert, int *index, trill_tensor_fn fn, void *ctx) {
    const trill_tensor_row *row = &f->rows[r];
    trill_param t = { .ndim = row->dims[1] == TRILL_NO_DIM ? 1 : 2, .kind = row->kind, .layer = layer, .expert = expert,
                      .role = row->role, .lora_target = row->lora_target, .fuse = row->fuse, .fuse_index = row->fuse_index,
                      .split = row->split, .index = (*index)++, .row = r };
    snprintf(t.name, sizeof t.name, row->name, layer, expert);
    t.shape[0] = f->dim(c, row->dims[0]);
    t.shape[1] = t.ndim == 2 ? f->dim(c, row->dims[1]) : 0;
    t.numel = (size_t)t.shape[0] * (size_t)(t.ndim == 2 ? t.shape[1] : 1);
    fn(ctx, row, &t);
}

void trill_arch_walk(const trill_config *c, trill_tensor_fn fn, void *ctx) {
    const trill_family *f = trill_family_of(c);
    int index = 0;
    for (int r = 0; r < f->n_rows;) {
        if (f->rows[r].scope == TRILL_ROW_GLOBAL) {
            if (!f->rows[r].when || f->rows[r].when(c, -1)) emit(f, c, r, -1, -1, &index, fn, ctx);
            r++;
            continue;
        }
        int end = r; /* a run of per-layer rows: the layer block, repeated for every layer */
        while (end < f->n_rows && f->rows[end].scope != TRILL_ROW_GLOBAL) end++;
        for (int l = 0; l < c->num_hidden_layers; l++)
            for (int k = r; k < end; k++) {
                const trill_tensor_row *row = &f->rows[k];
                if (row->when && !row->when(c, l)) continue;
                if (row->scope == TRILL_ROW_LAYER) emit(f, c, k, l, -1, &index, fn, ctx);
                else
                    for (int e = 0; e < c->num_experts; e++) emit(f, c, k, l, e, &index, fn, ctx);
            }
        r = end;
    }
}

const trill_tensor_row *trill_arch_row(const trill_config *c, const trill_param *t) { return &trill_family_of(c)->rows[t->row]; }

/* ---- counts derived from the walk ---- */

typedef struct counts { int64_t total, active; const trill_config *c; } counts;

static void count_params(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    counts *n = ctx;
    n->total += (int64_t)t->numel;
    if (trill_arch_active(n->c, t)) n->active += (int64_t)t->numel;
}

void trill_config_param_counts(const trill_config *c, int64_t *total, int64_t *active) {
    counts n = { .c = c };
    trill_arch_walk(c, count_params, &n);
    *total = n.total;
    *active = n.active;
}

typedef struct kinds { int64_t *by_kind, *routed; } kinds;

static void count_kind(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    (void)row;
    kinds *k = ctx;
    if (t->expert >= 0) *k->routed += (int64_t)t->numel;
    else if ((unsigned)t->kind <= TRILL_TENSOR_HEAD) k->by_kind[t->kind] += (int64_t)t->numel;
}

void trill_config_param_breakdown(const trill_config *c, int64_t *by_kind, int64_t *routed_experts) {
    for (int i = 0; i <= TRILL_TENSOR_HEAD; i++) by_kind[i] = 0;
    *routed_experts = 0;
    kinds k = { by_kind, routed_experts };
    trill_arch_walk(c, count_kind, &k);
}
