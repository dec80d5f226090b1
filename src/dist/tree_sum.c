/* The rank-count-independent sum (trill/dist.h): a fixed binary tree over leaf indices. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "trill/dist.h"

/* A subtree: leaves [start, start + size), size a power of two, start a multiple of it. */
typedef struct node {
    int64_t start, size;
    float *v;
} node;

enum { MAX_STACK = 130 }; /* a binary counter over int64 leaves: at most 64 + 1 nodes, with room */

struct trill_tree_sum {
    size_t n;
    int64_t total, first, count, added;
    node stack[MAX_STACK];
    int depth;
    float *spare[MAX_STACK]; /* buffers of merged-away nodes, reused */
    int n_spare;
};

static void add_into(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dst[i] + src[i];
}

trill_status trill_tree_sum_create(size_t n, int64_t total, int64_t first, int64_t count, trill_tree_sum **out) {
    if (total < 0 || first < 0 || count < 0 || first + count > total)
        return trill_error(TRILL_ERR_INVALID, "tree sum: leaves [%lld, %lld) are not within [0, %lld)", (long long)first,
                           (long long)(first + count), (long long)total);
    trill_tree_sum *t = trill_calloc(1, sizeof *t);
    if (!t) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    *t = (trill_tree_sum){ .n = n, .total = total, .first = first, .count = count };
    *out = t;
    return TRILL_OK;
}

void trill_tree_sum_free(trill_tree_sum *t) {
    if (!t) return;
    for (int i = 0; i < t->depth; i++) free(t->stack[i].v);
    for (int i = 0; i < t->n_spare; i++) free(t->spare[i]);
    free(t);
}

trill_status trill_tree_sum_add(trill_tree_sum *t, const float *leaf) {
    if (t->added >= t->count)
        return trill_error(TRILL_ERR_INVALID, "tree sum: leaf %lld is past this rank's %lld", (long long)(t->first + t->added), (long long)t->count);
    float *v = t->n_spare ? t->spare[--t->n_spare] : trill_malloc(sizeof(float) * (t->n ? t->n : 1));
    if (!v) return trill_error(TRILL_ERR_NOMEM, "out of memory for a partial sum of %zu floats", t->n);
    memcpy(v, leaf, sizeof(float) * t->n);
    t->stack[t->depth++] = (node){ t->first + t->added, 1, v };
    t->added++;
    /* two complete siblings become their parent: left + right */
    while (t->depth >= 2) {
        node *l = &t->stack[t->depth - 2], *r = &t->stack[t->depth - 1];
        if (l->size != r->size || l->start % (2 * l->size) != 0 || l->start + l->size != r->start) break;
        add_into(l->v, r->v, t->n);
        l->size *= 2;
        t->spare[t->n_spare++] = r->v;
        t->depth--;
    }
    return TRILL_OK;
}

/* A gathered partial: its node and where its values are. */
typedef struct part {
    int64_t start, size;
    const float *v;
} part;

static int by_start(const void *a, const void *b) {
    const part *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* dst = the sum of node [start, start + size): a gathered partial, or its two halves. tmp holds
 * a scratch vector per level below this one. */
static trill_status node_sum(const part *p, int np, int64_t start, int64_t size, size_t n, float *dst, float **tmp) {
    int lo = 0, hi = np; /* the partial starting at `start`, if any */
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (p[mid].start < start) lo = mid + 1;
        else hi = mid;
    }
    if (lo < np && p[lo].start == start && p[lo].size == size) {
        memcpy(dst, p[lo].v, sizeof(float) * n);
        return TRILL_OK;
    }
    if (size == 1 || (lo < np && p[lo].start == start && p[lo].size > size))
        return trill_error(TRILL_ERR_INVALID, "tree sum: leaves [%lld, %lld) were not added as the tree cuts them", (long long)start,
                           (long long)(start + size));
    trill_status st = node_sum(p, np, start, size / 2, n, dst, tmp + 1);
    if (!st) st = node_sum(p, np, start + size / 2, size / 2, n, tmp[0], tmp + 1);
    if (!st) add_into(dst, tmp[0], n);
    return st;
}

trill_status trill_tree_sum_finish(trill_tree_sum *t, trill_comm *c, float *out) { return trill_tree_sum_finish_many(&t, 1, c, out); }

trill_status trill_tree_sum_finish_many(trill_tree_sum *const *trees, int n_trees, trill_comm *c, float *out) {
    if (n_trees < 1) return trill_error(TRILL_ERR_INVALID, "tree sum: no tree to finish");
    const trill_tree_sum *t = trees[0]; /* n and total: every tree's */
    int depth = 0;
    for (int k = 0; k < n_trees; k++) {
        const trill_tree_sum *u = trees[k];
        if (u->added != u->count)
            return trill_error(TRILL_ERR_INVALID, "tree sum: %lld of this rank's %lld leaves were added", (long long)u->added, (long long)u->count);
        if (u->n != t->n || u->total != t->total)
            return trill_error(TRILL_ERR_INVALID, "tree sum: trees of %zu and %zu floats over %lld and %lld leaves are not one sum", t->n, u->n,
                               (long long)t->total, (long long)u->total);
        depth += u->depth;
    }
    const int size = c ? trill_comm_size(c) : 1;
    /* this rank's partials as records: start, size (int64 each), then n floats */
    const size_t rec = 2 * sizeof(int64_t) + sizeof(float) * t->n;
    size_t *counts = trill_malloc(sizeof(size_t) * (size_t)size);
    uint64_t *depths = trill_malloc(sizeof(uint64_t) * (size_t)size);
    char *mine = trill_malloc(rec * (size_t)(depth ? depth : 1));
    trill_status st = counts && depths && mine ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int k = 0, at = 0; !st && k < n_trees; k++)
        for (int i = 0; i < trees[k]->depth; i++, at++) {
            const node *nd = &trees[k]->stack[i];
            char *r = mine + rec * (size_t)at;
            memcpy(r, &nd->start, sizeof(int64_t));
            memcpy(r + sizeof(int64_t), &nd->size, sizeof(int64_t));
            memcpy(r + 2 * sizeof(int64_t), nd->v, sizeof(float) * t->n);
        }
    const uint64_t my_depth = (uint64_t)depth;
    if (!st) st = c ? trill_comm_allgather(c, &my_depth, sizeof my_depth, depths) : TRILL_OK;
    if (!st && !c) depths[0] = my_depth;
    size_t all = 0;
    for (int r = 0; !st && r < size; r++) {
        counts[r] = rec * (size_t)depths[r];
        all += (size_t)depths[r];
    }
    char *recs = st ? NULL : trill_malloc(rec * (all ? all : 1));
    part *parts = st ? NULL : trill_malloc(sizeof(part) * (all ? all : 1));
    if (!st && (!recs || !parts)) st = trill_error(TRILL_ERR_NOMEM, "out of memory for %zu partial sums of %zu floats", all, t->n);
    if (!st) st = c ? trill_comm_allgatherv(c, mine, counts, recs) : (memcpy(recs, mine, rec * all), TRILL_OK);
    for (size_t i = 0; !st && i < all; i++) {
        const char *r = recs + rec * i;
        memcpy(&parts[i].start, r, sizeof(int64_t));
        memcpy(&parts[i].size, r + sizeof(int64_t), sizeof(int64_t));
        parts[i].v = (const float *)(const void *)(r + 2 * sizeof(int64_t)); /* rec keeps floats 4-byte aligned */
    }
    if (!st) qsort(parts, all, sizeof *parts, by_start);
    for (size_t i = 0, at = 0; !st && i < all; at += (size_t)parts[i].size, i++) /* every leaf once */
        if (parts[i].start != (int64_t)at)
            st = trill_error(TRILL_ERR_INVALID, "tree sum: the ranks' leaves do not cover [0, %lld) once (a gap or overlap at %lld)",
                             (long long)t->total, (long long)at);
    /* the blocks of [0, total), largest first, added left to right */
    float *tmp[66] = { 0 }, *block = NULL;
    int levels = 0;
    for (int64_t s = 1; s <= t->total && levels < 64; s *= 2) levels++;
    for (int i = 0; !st && i <= levels; i++)
        if (!(tmp[i] = trill_malloc(sizeof(float) * (t->n ? t->n : 1)))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && !(block = trill_malloc(sizeof(float) * (t->n ? t->n : 1)))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) memset(out, 0, sizeof(float) * t->n);
    int64_t at = 0;
    for (int bit = 62; !st && bit >= 0; bit--) {
        const int64_t s = (int64_t)1 << bit;
        if (!(t->total & s)) continue;
        st = node_sum(parts, (int)all, at, s, t->n, at == 0 ? out : block, tmp);
        if (!st && at > 0) add_into(out, block, t->n);
        at += s;
    }
    for (int i = 0; i <= levels; i++) free(tmp[i]);
    free(block);
    free(parts);
    free(recs);
    free(mine);
    free(depths);
    free(counts);
    return st;
}
