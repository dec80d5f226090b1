#include "trill/dtype.h"

#include <assert.h>
#include <string.h>

/* IEEE binary16 <-> binary32 on bits: portable (no compiler _Float16 support needed). */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (man << 13);          /* inf, NaN */
    else if (exp != 0) bits = sign | ((exp + 112) << 23) | (man << 13); /* normal: rebias 15 -> 127 */
    else if (man == 0) bits = sign;                                     /* zero */
    else {                                                              /* subnormal: normalise */
        int shift = 0;
        while (!(man & 0x400)) { man <<= 1; shift++; }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3ff) << 13);
    }
    union { uint32_t u; float f; } v = { .u = bits };
    return v.f;
}

static uint16_t f32_to_f16(float f) {
    union { float f; uint32_t u; } v = { .f = f };
    uint32_t sign = (v.u >> 16) & 0x8000, abs = v.u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00);  /* NaN */
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds past 65504: inf */
    if (abs < 0x38800000u) {                                   /* below 2^-14: subnormal or zero */
        if (abs < 0x33000000u) return (uint16_t)sign;          /* below half the smallest subnormal */
        uint32_t man = (abs & 0x7fffff) | 0x800000, shift = 126 - (abs >> 23);
        uint32_t half = man >> shift, rest = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t rounded = abs - 0x38000000u; /* rebias 127 -> 15, still with 23 mantissa bits */
    rounded += 0xfff + ((rounded >> 13) & 1); /* round to nearest even on the 13 dropped bits */
    return (uint16_t)(sign | (rounded >> 13));
}

/* OCP E4M3FN on bits: rebias 7 -> 127, mantissa 3 -> 23 bits; subnormals m/8 * 2^-6 normalised. */
static inline float e4m3_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80) << 24, exp = (c >> 3) & 0xf, man = c & 7, bits;
    if (exp == 0xf && man == 7) bits = sign | 0x7fc00000u;           /* NaN: no infinities */
    else if (exp != 0) bits = sign | ((exp + 120) << 23) | (man << 20); /* normal */
    else if (man == 0) bits = sign;                                     /* zero */
    else {                                                              /* subnormal: normalise */
        int shift = 0;
        while (!(man & 8)) { man <<= 1; shift++; }
        bits = sign | ((uint32_t)(121 - shift) << 23) | ((man & 7) << 20);
    }
    union { uint32_t u; float f; } v = { .u = bits };
    return v.f;
}

float trill_e4m3_to_f32(uint8_t code) { return e4m3_to_f32(code); }

void trill_e4m3_scaled(void *dst, trill_dtype dst_dtype, const void *src, size_t n, float scale) {
    assert(dst_dtype == TRILL_F32 || dst_dtype == TRILL_BF16);
    const uint8_t *s = src;
    if (dst_dtype == TRILL_F32) {
        float *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = e4m3_to_f32(s[i]) * scale;
    } else {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = trill_f32_to_bf16(e4m3_to_f32(s[i]) * scale);
    }
}

size_t trill_dtype_size(trill_dtype dt) {
    switch (dt) {
    case TRILL_F32: return 4;
    case TRILL_BF16: case TRILL_F16: return 2;
    case TRILL_F8_E4M3: case TRILL_U8: return 1;
    }
    return 0;
}

const char *trill_dtype_name(trill_dtype dt) {
    switch (dt) {
    case TRILL_F32: return "F32";
    case TRILL_BF16: return "BF16";
    case TRILL_F16: return "F16";
    case TRILL_F8_E4M3: return "F8_E4M3";
    case TRILL_U8: return "U8";
    }
    return "?";
}

int trill_dtype_parse(const char *name, trill_dtype *out) {
    static const trill_dtype all[] = { TRILL_F32, TRILL_BF16, TRILL_F16, TRILL_F8_E4M3, TRILL_U8 };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, trill_dtype_name(all[i])) == 0) { *out = all[i]; return 0; }
    return -1;
}

const char *trill_precision_name(trill_precision p) { return p == TRILL_PRECISION_BF16 ? "bf16" : p == TRILL_PRECISION_AUTO ? "auto" : "fp32"; }

int trill_precision_parse(const char *name, trill_precision *out) {
    if (!strcmp(name, "fp32")) *out = TRILL_PRECISION_FP32;
    else if (!strcmp(name, "bf16")) *out = TRILL_PRECISION_BF16;
    else if (!strcmp(name, "auto")) *out = TRILL_PRECISION_AUTO;
    else return -1;
    return 0;
}

void trill_to_f32(float *dst, const void *src, trill_dtype src_dtype, size_t n) {
    const unsigned char *s = src;
    switch (src_dtype) {
    case TRILL_F32:
        memcpy(dst, src, n * sizeof(float));
        return;
    case TRILL_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = trill_bf16_to_f32(h);
        }
        return;
    case TRILL_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        return;
    case TRILL_F8_E4M3:
        for (size_t i = 0; i < n; i++) dst[i] = e4m3_to_f32(s[i]);
        return;
    case TRILL_U8:
        for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
        return;
    }
}

void trill_from_f32(void *dst, const float *src, trill_dtype dst_dtype, size_t n) {
    unsigned char *d = dst;
    switch (dst_dtype) {
    case TRILL_F32:
        memcpy(dst, src, n * sizeof(float));
        return;
    case TRILL_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = trill_f32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return;
    case TRILL_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = f32_to_f16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        return;
    case TRILL_F8_E4M3: /* read only: an FP8 checkpoint needs its block scales (the writers refuse it) */
    case TRILL_U8:
        assert(!"trill_from_f32: F8_E4M3 and U8 are not written");
        return;
    }
}
