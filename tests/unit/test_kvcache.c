/* The generator's KV cache (src/infer/kvcache.h): the per-token layout asked of it layer by
 * layer (K and V widths, including a latent-only layer with no V), the slots' addresses within a
 * block, copy-on-write of a shared block, sharing and reference counts, running out of blocks,
 * and refused layouts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "infer/kvcache.h"

/* Every slot of every layer lies inside its block, the K and V parts of different slots and
 * layers never overlap, and the whole block is covered exactly: per block, per layer, block_size
 * K slots then block_size V slots. */
static void test_layout(void **state) {
    (void)state;
    /* a grouped-query layer, a latent-only layer (MLA-like: one vector, no V), an odd one */
    const kv_layer_shape shape[3] = { { 16, 16 }, { 24, 0 }, { 8, 40 } };
    const int bs = 4, elem = 2;
    kv_cache kv;
    assert_int_equal(trill_kv_cache_create(&kv, 3, bs, 3, shape, elem), TRILL_OK);
    const size_t per = trill_kv_cache_bytes_per_block(bs, 3, shape, elem);
    assert_int_equal(per, (size_t)bs * (32 + 24 + 48) * elem);
    assert_int_equal(kv.block_bytes, per);
    unsigned char *seen = calloc(per, 1);
    for (int b = 0; b < 3; b++) {
        memset(seen, 0, per);
        size_t at = 0;
        for (int l = 0; l < 3; l++)
            for (int part = 0; part < 2; part++)
                for (int s = 0; s < bs; s++) {
                    const char *p = part ? kv_value(&kv, b, l, s) : kv_key(&kv, b, l, s);
                    const size_t width = (size_t)(part ? shape[l].v_width : shape[l].k_width) * elem;
                    const size_t off = (size_t)(p - kv_block_data(&kv, b));
                    assert_int_equal(off, at); /* in order, contiguous */
                    for (size_t i = 0; i < width; i++) assert_int_equal(seen[off + i]++, 0);
                    at += width;
                }
        assert_int_equal(at, per);
        for (size_t i = 0; i < per; i++) assert_int_equal(seen[i], 1);
    }
    free(seen);
    trill_kv_cache_free(&kv);
}

/* Uniform layers are the layout the engine had before it asked the model: block b, layer l,
 * K then V, [block_size][width]. */
static void test_uniform_matches_flat_layout(void **state) {
    (void)state;
    enum { L = 4, W = 12, BS = 16 };
    kv_layer_shape shape[L];
    for (int l = 0; l < L; l++) shape[l] = (kv_layer_shape){ W, W };
    kv_cache kv;
    assert_int_equal(trill_kv_cache_create(&kv, 5, BS, L, shape, 4), TRILL_OK);
    for (int b = 0; b < 5; b++)
        for (int l = 0; l < L; l++)
            for (int s = 0; s < BS; s++) {
                assert_ptr_equal(kv_key(&kv, b, l, s), kv.data + ((((size_t)b * L + l) * 2 + 0) * BS + s) * W * 4);
                assert_ptr_equal(kv_value(&kv, b, l, s), kv.data + ((((size_t)b * L + l) * 2 + 1) * BS + s) * W * 4);
            }
    trill_kv_cache_free(&kv);
}

/* A forked table shares its source's blocks; writing into a shared block copies all of it (every
 * layer's K and V) first, and the source keeps its own. */
static void test_share_and_copy_on_write(void **state) {
    (void)state;
    const kv_layer_shape shape[2] = { { 8, 8 }, { 6, 0 } };
    const int bs = 4;
    kv_cache kv;
    assert_int_equal(trill_kv_cache_create(&kv, 8, bs, 2, shape, 4), TRILL_OK);
    kv_table a = { 0 }, b = { 0 };
    assert_int_equal(trill_kv_table_reserve(&kv, &a, 6, 0), 0); /* 2 blocks */
    assert_int_equal(a.n, 2);
    assert_int_equal(kv.n_free, 6);
    for (int blk = 0; blk < 2; blk++) {
        float *p = (float *)(void *)kv_block_data(&kv, a.blocks[blk]);
        for (size_t i = 0; i < kv.block_bytes / 4; i++) p[i] = (float)(blk * 1000 + (int)i);
    }
    assert_int_equal(trill_kv_table_share(&kv, &b, &a), TRILL_OK);
    assert_int_equal(kv.refcount[a.blocks[0]], 2);
    assert_int_equal(kv.refcount[a.blocks[1]], 2);
    /* b writes from token 6 (in block 1) and needs 8 tokens: block 1 is copied, none added */
    const int old1 = a.blocks[1];
    assert_int_equal(trill_kv_table_reserve(&kv, &b, 8, 6), 0);
    assert_int_equal(b.n, 2);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_not_equal(b.blocks[1], old1);
    assert_int_equal(kv.refcount[old1], 1);
    assert_int_equal(kv.refcount[b.blocks[1]], 1);
    assert_memory_equal(kv_block_data(&kv, b.blocks[1]), kv_block_data(&kv, old1), kv.block_bytes);
    *(float *)kv_value(&kv, b.blocks[1], 0, 2) = -1.0f; /* b's write does not reach a */
    assert_true(*(float *)kv_value(&kv, old1, 0, 2) != -1.0f);
    trill_kv_table_release(&kv, &b);
    trill_kv_table_release(&kv, &a);
    assert_int_equal(kv.n_free, 8);
    trill_kv_cache_free(&kv);
}

/* Out of blocks: the reserve fails and gives back what it took. */
static void test_out_of_blocks(void **state) {
    (void)state;
    const kv_layer_shape shape[1] = { { 4, 4 } };
    kv_cache kv;
    assert_int_equal(trill_kv_cache_create(&kv, 3, 2, 1, shape, 2), TRILL_OK);
    kv_table a = { 0 }, b = { 0 };
    assert_int_equal(trill_kv_table_reserve(&kv, &a, 3, 0), 0); /* 2 blocks */
    assert_int_equal(trill_kv_table_reserve(&kv, &b, 4, 0), -1); /* needs 2, 1 left */
    assert_int_equal(b.n, 0);
    assert_int_equal(kv.n_free, 1);
    assert_int_equal(kv_blocks_for(&kv, 5), 3);
    trill_kv_table_release(&kv, &a);
    trill_kv_table_release(&kv, &b);
    assert_int_equal(kv.n_free, 3);
    trill_kv_cache_free(&kv);
}

static void test_refused(void **state) {
    (void)state;
    const kv_layer_shape bad[2] = { { 4, 4 }, { -1, 4 } }, good[1] = { { 4, 4 } };
    kv_cache kv;
    assert_int_equal(trill_kv_cache_create(&kv, 2, 2, 2, bad, 2), TRILL_ERR_INVALID);
    assert_int_equal(trill_kv_cache_create(&kv, 0, 2, 1, good, 2), TRILL_ERR_INVALID);
    assert_int_equal(trill_kv_cache_create(&kv, 2, 2, 1, good, 3), TRILL_ERR_INVALID);
    trill_kv_cache_free(&kv); /* safe after a refusal */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_uniform_matches_flat_layout),
        cmocka_unit_test(test_share_and_copy_on_write),
        cmocka_unit_test(test_out_of_blocks),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
