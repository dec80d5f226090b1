/* The generator attention's dot products (src/infer/gen_blocks.h), compiled here once for the
 * generic lanes and once for the build's own target (tests/unit/CMakeLists.txt), so
 * test_gen_attention can hold the two to the same bits: gen_blocks.h picks its code by the
 * compiler's target, not at run time. ATT_NAME names this build's entry points. */
#include "infer/gen_blocks.h"

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* 1 when this build's q.k runs on AVX2 lanes (else on the generic ones). */
const int CAT(ATT_NAME, _avx2) =
#if defined(__AVX2__) && defined(__FMA__)
    1;
#else
    0;
#endif

/* gen_qk_keys: n keys (bf16 when half, else fp32) key_stride bytes apart, G heads of hd. */
void CAT(ATT_NAME, _qk_keys)(const float *q, int G, int hd, const void *keys, size_t key_stride, int n, int half, float *out, size_t out_stride) {
    if (half) gen_qk_keys(q, G, hd, keys, key_stride, n, true, out, out_stride);
    else gen_qk_keys(q, G, hd, keys, key_stride, n, false, out, out_stride);
}

/* gen_weighted_heads over the values of layer 0 of kc (row_stride = width, token-major) for the
 * sequence whose blocks t lists: G heads' p rows (p_stride apart), positions first .. n_pos - 1
 * or, with ends (not NULL), first .. ends[g] - 1 for head g; outputs width apart. */
void CAT(ATT_NAME, _weighted_heads)(const kv_cache *kc, const kv_table *t, int width, const float *p, size_t p_stride, int first, int n_pos,
                                    const int *ends, float *o, int G) {
    if (kc->elem == 2) gen_weighted_heads(kc, t, 0, true, width, 0, width, p, p_stride, first, n_pos, ends, o, (size_t)width, G, true);
    else gen_weighted_heads(kc, t, 0, true, width, 0, width, p, p_stride, first, n_pos, ends, o, (size_t)width, G, false);
}
