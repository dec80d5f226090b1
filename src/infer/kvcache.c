#include "infer/kvcache.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

size_t trill_kv_cache_bytes_per_block(int block_size, int n_layers, const kv_layer_shape *shape, int elem) {
    size_t bytes = 0;
    for (int l = 0; l < n_layers; l++) bytes += (size_t)block_size * ((size_t)shape[l].k_width + (size_t)shape[l].v_width) * elem;
    return bytes;
}

trill_status trill_kv_cache_create(kv_cache *kv, int n_blocks, int block_size, int n_layers, const kv_layer_shape *shape, int elem) {
    *kv = (kv_cache){ .n_blocks = n_blocks, .block_size = block_size, .n_layers = n_layers, .elem = elem };
    if (n_blocks < 1 || block_size < 1 || n_layers < 1 || (elem != 2 && elem != 4))
        return trill_error(TRILL_ERR_INVALID, "KV cache: %d blocks of %d tokens, %d layers, %d-byte elements", n_blocks, block_size, n_layers, elem);
    for (int l = 0; l < n_layers; l++)
        if (shape[l].k_width < 0 || shape[l].v_width < 0)
            return trill_error(TRILL_ERR_INVALID, "KV cache: layer %d asks for widths %d and %d", l, shape[l].k_width, shape[l].v_width);
    kv->shape = trill_malloc(sizeof *kv->shape * (size_t)n_layers);
    kv->layer_offset = trill_malloc(sizeof *kv->layer_offset * (size_t)n_layers);
    if (kv->shape && kv->layer_offset) {
        memcpy(kv->shape, shape, sizeof *kv->shape * (size_t)n_layers);
        for (int l = 0; l < n_layers; l++) {
            kv->layer_offset[l] = kv->block_bytes;
            kv->block_bytes += (size_t)block_size * ((size_t)shape[l].k_width + (size_t)shape[l].v_width) * elem;
        }
    }
    const size_t per = kv->block_bytes;
    kv->data = trill_malloc(per * (size_t)n_blocks);
    kv->refcount = trill_calloc((size_t)n_blocks, sizeof(int));
    kv->free_list = trill_malloc(sizeof(int) * (size_t)n_blocks);
    if (!kv->shape || !kv->layer_offset || !kv->data || !kv->refcount || !kv->free_list) {
        trill_kv_cache_free(kv);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for a KV cache of %d blocks (%.2f GB)", n_blocks, per * (double)n_blocks * 1e-9);
    }
    for (int b = 0; b < n_blocks; b++) kv->free_list[b] = n_blocks - 1 - b; /* block 0 comes out first */
    kv->n_free = n_blocks;
    return TRILL_OK;
}

void trill_kv_cache_free(kv_cache *kv) {
    free(kv->shape);
    free(kv->layer_offset);
    free(kv->data);
    free(kv->refcount);
    free(kv->free_list);
    *kv = (kv_cache){ 0 };
}

int trill_kv_block_alloc(kv_cache *kv) {
    if (kv->n_free == 0) return -1;
    int b = kv->free_list[--kv->n_free];
    kv->refcount[b] = 1;
    return b;
}

void trill_kv_block_retain(kv_cache *kv, int block) { kv->refcount[block]++; }

void trill_kv_block_release(kv_cache *kv, int block) {
    if (--kv->refcount[block] == 0) kv->free_list[kv->n_free++] = block;
}

static int table_grow(kv_table *t, int n) {
    if (n <= t->cap) return 0;
    int cap = t->cap ? t->cap : 8;
    while (cap < n) cap *= 2;
    int *b = trill_realloc(t->blocks, sizeof(int) * (size_t)cap);
    if (!b) return -1;
    t->blocks = b;
    t->cap = cap;
    return 0;
}

int trill_kv_table_reserve(kv_cache *kv, kv_table *t, int n_tokens, int write_from) {
    const int need = kv_blocks_for(kv, n_tokens);
    if (table_grow(t, need)) {
        trill_error(TRILL_ERR_NOMEM, "out of memory for a block table of %d KV blocks", need);
        return KV_NOMEM;
    }
    /* copy-on-write: the block holding write_from, if shared, becomes this sequence's own */
    const int first = write_from / kv->block_size;
    if (first < t->n && t->blocks[first] >= 0 && kv->refcount[t->blocks[first]] > 1) {
        int b = trill_kv_block_alloc(kv);
        if (b < 0) return KV_FULL;
        memcpy(kv_block_data(kv, b), kv_block_data(kv, t->blocks[first]), kv->block_bytes);
        trill_kv_block_release(kv, t->blocks[first]);
        t->blocks[first] = b;
    }
    const int had = t->n;
    while (t->n < need) {
        int b = trill_kv_block_alloc(kv);
        if (b < 0) { /* give back what this call took */
            while (t->n > had) trill_kv_block_release(kv, t->blocks[--t->n]);
            return KV_FULL;
        }
        t->blocks[t->n++] = b;
    }
    return 0;
}

trill_status trill_kv_table_share(kv_cache *kv, kv_table *dst, const kv_table *src) {
    if (table_grow(dst, src->n)) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < src->n; i++) {
        dst->blocks[i] = src->blocks[i];
        if (src->blocks[i] >= 0) trill_kv_block_retain(kv, src->blocks[i]);
    }
    dst->n = src->n;
    return TRILL_OK;
}

void trill_kv_table_drop_before(kv_cache *kv, kv_table *t, int pos) {
    for (int i = 0; i < t->n && (i + 1) * kv->block_size <= pos; i++)
        if (t->blocks[i] >= 0) {
            trill_kv_block_release(kv, t->blocks[i]);
            t->blocks[i] = -1;
        }
}

void trill_kv_table_release(kv_cache *kv, kv_table *t) {
    for (int i = 0; i < t->n; i++)
        if (t->blocks[i] >= 0) trill_kv_block_release(kv, t->blocks[i]);
    free(t->blocks);
    *t = (kv_table){ 0 };
}
