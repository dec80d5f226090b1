/* Element types of checkpoint tensors and conversions to and from fp32. */
#ifndef TRILL_DTYPE_H
#define TRILL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum trill_dtype { TRILL_F32, TRILL_BF16, TRILL_F16 } trill_dtype;

size_t trill_dtype_size(trill_dtype dt);
/* The safetensors spelling: "F32", "BF16", "F16". */
const char *trill_dtype_name(trill_dtype dt);
/* Parses "F32"/"BF16"/"F16"; returns 0 on success, -1 if unknown. */
int trill_dtype_parse(const char *name, trill_dtype *out);

/* dst[i] = (float)src[i]; src may be unaligned (it usually points into an mmap). */
void trill_to_f32(float *dst, const void *src, trill_dtype src_dtype, size_t n);
/* Rounds to nearest even; NaN stays NaN. */
void trill_from_f32(void *dst, const float *src, trill_dtype dst_dtype, size_t n);

static inline float trill_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}

static inline uint16_t trill_f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = { .f = f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* quiet NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

#endif
