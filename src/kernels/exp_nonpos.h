/* A fast fp32 exp for x <= 0 (softmaxes after the max shift, sigmoids as exp(-|x|)), shared by
 * the trainer's kernels (ops_impl.h) and the generator (src/infer). Cody-Waite reduction and the
 * Cephes polynomial: within 1.01 ulp of exp on [-87, 0] (checked against double exp for every
 * float there), 0 below -87 (instead of a value under 1.7e-38), NaN passed on. Branch-free
 * (selects on integer bits) so `omp simd` loops vectorise it; libm's expf is a scalar call. */
#ifndef TRILL_KERNELS_EXP_H
#define TRILL_KERNELS_EXP_H

#include <string.h>

static inline float exp_nonpos_f32(float xf) {
    _Static_assert(sizeof(unsigned) == sizeof(float), "32-bit unsigned");
    const float shift = 12582912.0f; /* 1.5 * 2^23: t's low mantissa bits hold round(x / ln2) */
    const float t = xf * 1.44269504088896341f + shift, nf = t - shift;
    const float r = (xf - nf * 0.693359375f) - nf * -2.12194440e-4f; /* x - n ln2, ln2 in two parts */
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * (r * r) + r + 1.0f;
    unsigned tbits, ybits;
    memcpy(&tbits, &t, sizeof tbits);
    const unsigned pbits = (tbits - 0x4B400000u + 127u) << 23; /* 2^n */
    float p2, e;
    memcpy(&p2, &pbits, sizeof p2);
    e = y * p2;
    memcpy(&ybits, &e, sizeof ybits);
    ybits &= -(unsigned)!(xf < -87.0f); /* below -87 (garbage above): 0 */
    memcpy(&e, &ybits, sizeof e);
    return e;
}

#endif
