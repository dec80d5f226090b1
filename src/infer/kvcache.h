/* The generator's KV cache: fixed-size blocks of token slots in one allocation, handed out to
 * sequences through block tables and reference counted, so the n samples of one prompt share
 * the prompt's blocks (prefilled once) and copy a shared block only when they write into it.
 *
 * What a token keeps is the model family's to say, layer by layer (kv_layer_shape): a K part of
 * k_width elements and a V part of v_width (e.g. keys and values of every kv head; or a single
 * latent vector, v_width 0). kv_key / kv_value give slot `slot`'s row when the family keeps its
 * part token-major; GQA keeps its parts head-major instead (gen_decoder.c's gqa_slot) and reads
 * them from slot 0's address. Block b holds, for every layer in turn, block_size K slots and then
 * block_size V slots, elements of `elem` bytes: fp32 (4) or bf16 (2, as bf16 serving keeps its
 * cache). Not thread-safe: the engine's scheduler owns it. */
#ifndef TRILL_INFER_KVCACHE_H
#define TRILL_INFER_KVCACHE_H

#include <stddef.h>

#include "trill/error.h"

/* One layer's part of a token's cache entry, in elements. */
typedef struct kv_layer_shape {
    int k_width, v_width;
} kv_layer_shape;

typedef struct kv_cache {
    int n_blocks, block_size, n_layers, elem;
    kv_layer_shape *shape;  /* [n_layers] */
    size_t *layer_offset;   /* [n_layers] bytes from a block's start to the layer's first K slot */
    size_t block_bytes;
    char *data;     /* [n_blocks][block_bytes] */
    int *refcount;  /* [n_blocks]; 0 = free */
    int *free_list; /* stack of free block ids */
    int n_free;
} kv_cache;

/* shape: [n_layers] widths >= 0 (copied). TRILL_ERR_INVALID on a bad argument, TRILL_ERR_NOMEM. */
trill_status trill_kv_cache_create(kv_cache *kv, int n_blocks, int block_size, int n_layers, const kv_layer_shape *shape, int elem);
void trill_kv_cache_free(kv_cache *kv);
size_t trill_kv_cache_bytes_per_block(int block_size, int n_layers, const kv_layer_shape *shape, int elem);

/* A free block with refcount 1, or -1 when none is left. */
int trill_kv_block_alloc(kv_cache *kv);
void trill_kv_block_retain(kv_cache *kv, int block);
void trill_kv_block_release(kv_cache *kv, int block);

static inline char *kv_block_data(const kv_cache *kv, int block) { return kv->data + (size_t)block * kv->block_bytes; }
/* The K (or V) part of token `slot` of `block` in `layer`: kv->shape[layer].k_width (v_width)
 * elements of kv->elem bytes; the next slot's follows. */
static inline void *kv_key(const kv_cache *kv, int block, int layer, int slot) {
    return kv_block_data(kv, block) + kv->layer_offset[layer] + (size_t)slot * kv->shape[layer].k_width * kv->elem;
}
static inline void *kv_value(const kv_cache *kv, int block, int layer, int slot) {
    const kv_layer_shape *L = &kv->shape[layer];
    return kv_block_data(kv, block) + kv->layer_offset[layer] + ((size_t)kv->block_size * L->k_width + (size_t)slot * L->v_width) * kv->elem;
}

/* A sequence's block table; a block given back early (trill_kv_table_drop_before) is -1. */
typedef struct kv_table {
    int *blocks;
    int n, cap;
} kv_table;

/* Makes the table hold at least n_tokens slots, with the slot for token `write_from` onwards
 * privately owned (a shared block there is copied first). Returns 0; KV_FULL (changing nothing
 * it cannot undo) when the pool runs out; KV_NOMEM, with the message set and nothing changed,
 * when the table itself cannot grow (out of memory: not a reason to preempt anyone). */
enum { KV_FULL = -1, KV_NOMEM = -2 };
int trill_kv_table_reserve(kv_cache *kv, kv_table *t, int n_tokens, int write_from);
/* Another reference to every block of src (a forked sample). */
trill_status trill_kv_table_share(kv_cache *kv, kv_table *dst, const kv_table *src);
void trill_kv_table_release(kv_cache *kv, kv_table *t);
/* Gives back every block that holds only positions before pos (a sliding window that every
 * layer attends within never reads them again); their entries become -1. */
void trill_kv_table_drop_before(kv_cache *kv, kv_table *t, int pos);
/* Blocks needed for n tokens. */
static inline int kv_blocks_for(const kv_cache *kv, int n_tokens) { return (n_tokens + kv->block_size - 1) / kv->block_size; }

#endif
