/* The family registry and the walk that expands a family's tensor table for a config. */
#include "arch/family.h"

#include <stdio.h>
#include <string.h>

const trill_family *trill_family_of(const trill_config *c) {
    switch (c->arch) {
    case TRILL_ARCH_QWEN3:
    case TRILL_ARCH_QWEN3_MOE: return &trill_family_qwen3;
    }
    return &trill_family_qwen3;
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
