/* The generator's KV cache: fixed-size blocks of token slots in one allocation, handed out to
 * sequences through block tables and reference counted, so the n samples of one prompt share
 * the prompt's blocks (prefilled once) and copy a shared block only when they write into it.
 *
 * Block b holds, for every layer, block_size token slots of K and then of V, each slot
 * [n_kv_heads * head_dim] elements of `elem` bytes: fp32 (4) or bf16 (2, as bf16 serving keeps
 * its cache). Not thread-safe: the engine's scheduler owns it. */
#ifndef TRILL_INFER_KVCACHE_H
#define TRILL_INFER_KVCACHE_H

#include <stddef.h>

#include "trill/error.h"

typedef struct kv_cache {
    int n_blocks, block_size, n_layers, kv_dim, elem;
    char *data;     /* [n_blocks][n_layers][2][block_size][kv_dim] elements */
    int *refcount;  /* [n_blocks]; 0 = free */
    int *free_list; /* stack of free block ids */
    int n_free;
} kv_cache;

trill_status kv_cache_create(kv_cache *kv, int n_blocks, int block_size, int n_layers, int kv_dim, int elem);
void kv_cache_free(kv_cache *kv);
size_t kv_cache_bytes_per_block(int block_size, int n_layers, int kv_dim, int elem);

/* A free block with refcount 1, or -1 when none is left. */
int kv_block_alloc(kv_cache *kv);
void kv_block_retain(kv_cache *kv, int block);
void kv_block_release(kv_cache *kv, int block);

/* K (or V) slot of token `slot` of `block` in `layer` (elements of kv->elem bytes). */
static inline void *kv_key(const kv_cache *kv, int block, int layer, int slot) {
    return kv->data + ((((size_t)block * kv->n_layers + layer) * 2 + 0) * kv->block_size + slot) * kv->kv_dim * kv->elem;
}
static inline void *kv_value(const kv_cache *kv, int block, int layer, int slot) {
    return kv->data + ((((size_t)block * kv->n_layers + layer) * 2 + 1) * kv->block_size + slot) * kv->kv_dim * kv->elem;
}

/* A sequence's block table. */
typedef struct kv_table {
    int *blocks;
    int n, cap;
} kv_table;

/* Makes the table hold at least n_tokens slots, with the slot for token `write_from` onwards
 * privately owned (a shared block there is copied first). Returns -1 (and changes nothing it
 * cannot undo) when the pool runs out. */
int kv_table_reserve(kv_cache *kv, kv_table *t, int n_tokens, int write_from);
/* Another reference to every block of src (a forked sample). */
trill_status kv_table_share(kv_cache *kv, kv_table *dst, const kv_table *src);
void kv_table_release(kv_cache *kv, kv_table *t);
/* Blocks needed for n tokens. */
static inline int kv_blocks_for(const kv_cache *kv, int n_tokens) { return (n_tokens + kv->block_size - 1) / kv->block_size; }

#endif
