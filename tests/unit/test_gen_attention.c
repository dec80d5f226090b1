/* The generator attention's q.k (gen_blocks.h's gen_qk_keys and gen_qk_group) on the build's
 * target (AVX2 lanes, 4 keys' chains at once) against the generic lanes, bit for bit: both are
 * specified as 8 lanes of fused multiply-adds over a head's chunks in order and one reduction
 * tree, so a key's score may not depend on the instruction set, on how many keys go together or
 * on which of them is the remainder. attention_isa.c is compiled both ways. Exits 77 (skip)
 * where the build's own target has no AVX2, after the tile check below, which runs on both builds
 * whatever the target: p.V for a prefill tile's heads (gen_weighted_heads with ends) against each
 * head alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "infer/kvcache.h"
#include "trill/dtype.h"
#include "trill/rng.h"

extern const int att_generic_avx2, att_native_avx2;
void att_generic_qk_keys(const float *q, int G, int hd, const void *keys, size_t key_stride, int n, int half, float *out, size_t out_stride);
void att_native_qk_keys(const float *q, int G, int hd, const void *keys, size_t key_stride, int n, int half, float *out, size_t out_stride);
typedef void weighted_fn(const kv_cache *kc, const kv_table *t, int width, const float *p, size_t p_stride, int first, int n_pos, const int *ends,
                         float *o, int G);
weighted_fn att_generic_weighted_heads, att_native_weighted_heads;

static void test_qk_keys_native_equals_generic(void **state) {
    (void)state;
    enum { CTX = 64, MAXW = 160 };
    static const int shapes[][2] = { { 1, 64 }, { 2, 64 }, { 4, 144 }, { 3, 8 }, { 8, 128 } }; /* G, hd: GQA groups, MLA's latent + rope */
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int G = shapes[s][0], hd = shapes[s][1];
        const size_t stride_el = (size_t)hd + 8; /* keys with a gap between them */
        float *q = malloc(sizeof(float) * G * hd), *kf = malloc(sizeof(float) * CTX * stride_el);
        uint16_t *kh = malloc(sizeof(uint16_t) * CTX * stride_el);
        float *a = malloc(sizeof(float) * G * CTX), *b = malloc(sizeof(float) * G * CTX);
        for (int i = 0; i < G * hd; i++) q[i] = (float)trill_rng_normal(7 + s, (uint64_t)i);
        for (size_t i = 0; i < CTX * stride_el; i++) kf[i] = (float)trill_rng_normal(9 + s, i);
        trill_from_f32(kh, kf, TRILL_BF16, CTX * stride_el);
        for (int half = 0; half < 2; half++)
            for (int n = 1; n <= 23; n += 1 + (n > 9) * 4) { /* remainders of every size, and runs of several groups of 4 */
                memset(a, 0, sizeof(float) * G * CTX);
                memset(b, 0, sizeof(float) * G * CTX);
                const void *keys = half ? (const void *)kh : (const void *)kf;
                const size_t stride = stride_el * (half ? 2 : 4);
                att_generic_qk_keys(q, G, hd, keys, stride, n, half, a, CTX);
                att_native_qk_keys(q, G, hd, keys, stride, n, half, b, CTX);
                for (int i = 0; i < G * CTX; i++)
                    if (memcmp(&a[i], &b[i], sizeof(float)))
                        fail_msg("G %d hd %d n %d %s: score %d is %.9g on the build's target, %.9g on the generic lanes", G, hd, n,
                                 half ? "bf16" : "fp32", i, b[i], a[i]);
            }
        free(q);
        free(kf);
        free(kh);
        free(a);
        free(b);
    }
}

/* p.V for a prefill tile's heads at once, each summing to its own row's last position (ends), is
 * bit for bit each head's p.V alone over its own positions, on both builds, and the builds agree:
 * the 64-column passes of 4 (AVX2: 2) heads that span rows, a pass's heads all ending early, the
 * 8-column path, fp32 and bf16 values, sequences over several blocks and starting mid-block. */
static void test_weighted_heads_ends_equal_each_head_alone(void **state) {
    (void)state;
    enum { BS = 16, BLOCKS = 5, G = 7, CTX = BS * BLOCKS };
    static const int widths[] = { 64, 128, 40 };
    weighted_fn *fns[] = { att_generic_weighted_heads, att_native_weighted_heads };
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++)
        for (int elem = 2; elem <= 4; elem += 2) {
            const int width = widths[w];
            kv_cache kc;
            const kv_layer_shape shape = { .k_width = width, .v_width = width };
            assert_int_equal(trill_kv_cache_create(&kc, BLOCKS, BS, 1, &shape, elem), 0);
            int blocks[BLOCKS] = { 3, 0, 4, 1, 2 }; /* the sequence's blocks out of order */
            const kv_table t = { .blocks = blocks, .n = BLOCKS, .cap = BLOCKS };
            for (int j = 0; j < CTX; j++) {
                float row[128];
                for (int i = 0; i < width; i++) row[i] = (float)trill_rng_normal(31 + w, (uint64_t)j * width + i);
                trill_from_f32(kv_value(&kc, blocks[j / BS], 0, j % BS), row, elem == 2 ? TRILL_BF16 : TRILL_F32, (size_t)width);
            }
            float p[G * CTX], tiled[G * 128], alone[G * 128], other[G * 128];
            for (int i = 0; i < G * CTX; i++) p[i] = (float)trill_rng_uniform(37 + w, (uint64_t)i);
            for (int first = 0; first <= 9; first += 9)
                for (int last = 18; last <= CTX; last += 31) { /* the tile's last row's end: its heads' ends lie below */
                    /* rows of 2 heads (a GQA group) ending 1 apart, the last head alone: passes span rows */
                    const int ends[G] = { last - 3, last - 3, last - 2, last - 2, last - 1, last - 1, last };
                    for (size_t f = 0; f < 2; f++) {
                        fns[f](&kc, &t, width, p, CTX, first, last, ends, f ? other : tiled, G);
                        for (int g = 0; g < G; g++) {
                            fns[f](&kc, &t, width, p + (size_t)g * CTX, CTX, first, ends[g], NULL, alone + (size_t)g * width, 1);
                            for (int i = 0; i < width; i++) {
                                const float a = alone[g * width + i], b = (f ? other : tiled)[g * width + i];
                                if (memcmp(&a, &b, sizeof a))
                                    fail_msg("%s build, width %d, %s, positions %d..: head %d column %d is %.9g in the tile, %.9g alone",
                                             f ? "target" : "generic", width, elem == 2 ? "bf16" : "fp32", first, g, i, b, a);
                            }
                        }
                    }
                    if (att_native_avx2 && memcmp(tiled, other, sizeof(float) * G * width))
                        fail_msg("width %d, %s: the tile's p.V differs between the generic and the target build", width, elem == 2 ? "bf16" : "fp32");
                }
            trill_kv_cache_free(&kc);
        }
}

int main(void) {
    if (att_generic_avx2) {
        printf("attention_isa.c's generic build has AVX2 lanes: the flags did not take\n");
        return 1;
    }
    const struct CMUnitTest tiles[] = { cmocka_unit_test(test_weighted_heads_ends_equal_each_head_alone) };
    const int failed = cmocka_run_group_tests(tiles, NULL, NULL);
    if (!att_native_avx2) {
        printf("SKIP: this build's target has no AVX2 (its q.k is the generic one)\n");
        return failed ? failed : 77;
    }
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_qk_keys_native_equals_generic) };
    return failed + cmocka_run_group_tests(tests, NULL, NULL);
}
