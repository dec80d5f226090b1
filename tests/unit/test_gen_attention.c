/* The generator attention's q.k (gen_blocks.h's gen_qk_keys and gen_qk_group) on the build's
 * target (AVX2 lanes, 4 keys' chains at once) against the generic lanes, bit for bit: both are
 * specified as 8 lanes of fused multiply-adds over a head's chunks in order and one reduction
 * tree, so a key's score may not depend on the instruction set, on how many keys go together or
 * on which of them is the remainder. attention_isa.c is compiled both ways. Exits 77 (skip)
 * where the build's own target has no AVX2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "trill/dtype.h"
#include "trill/rng.h"

extern const int att_generic_avx2, att_native_avx2;
void att_generic_qk_keys(const float *q, int G, int hd, const void *keys, size_t key_stride, int n, int half, float *out, size_t out_stride);
void att_native_qk_keys(const float *q, int G, int hd, const void *keys, size_t key_stride, int n, int half, float *out, size_t out_stride);

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

int main(void) {
    if (att_generic_avx2) {
        printf("attention_isa.c's generic build has AVX2 lanes: the flags did not take\n");
        return 1;
    }
    if (!att_native_avx2) {
        printf("SKIP: this build's target has no AVX2 (its q.k is the generic one)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_qk_keys_native_equals_generic) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
