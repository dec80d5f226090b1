/* Element types of checkpoint tensors and conversions to and from fp32.
 *
 * F8_E4M3 is OCP E4M3FN (torch.float8_e4m3fn): 1 sign, 4 exponent bits of bias 7, 3 mantissa
 * bits; no infinities, S.1111.111 is NaN, largest finite 448, subnormals m/8 * 2^-6. trill reads
 * it (block-scaled checkpoints, src/model/model.c) and never writes it. */
#ifndef TRILL_DTYPE_H
#define TRILL_DTYPE_H

#include <stddef.h>
#include <stdint.h>

/* U8: bytes (MXFP4's packed codes and E8M0 scales), read only. */
typedef enum trill_dtype { TRILL_F32, TRILL_BF16, TRILL_F16, TRILL_F8_E4M3, TRILL_U8 } trill_dtype;

/* The arithmetic of matrix products (the trainer's kernels, trill/kernels.h: the *_p ones and
 * attention; their fp64 instantiation ignores it). FP32: operands and sums in fp32 (OpenBLAS
 * sgemm). BF16: both operands rounded to bf16 (nearest even) and the exact products summed in
 * fp32, as a GPU's bf16 GEMM computes them: vdpbf16ps on CPUs with AVX-512 BF16, the same
 * steps in portable C elsewhere (the order of the sums is specified in
 * src/kernels/gemm_bf16.c; the two agree bit for bit but for vdpbf16ps's flushing of
 * denormals). */
typedef enum trill_precision {
    TRILL_PRECISION_FP32 = 0,
    TRILL_PRECISION_BF16 = 1,
    /* A setting, not an arithmetic (trainer.precision's default): whichever of the two runs faster
     * on this CPU (trill_kernels_precision_auto), chosen before a model computes with it. */
    TRILL_PRECISION_AUTO = 2
} trill_precision;

/* "fp32", "bf16" or "auto"; parsing returns 0, or -1 for another name. */
const char *trill_precision_name(trill_precision p);
int trill_precision_parse(const char *name, trill_precision *out);

size_t trill_dtype_size(trill_dtype dt);
/* The safetensors spelling: "F32", "BF16", "F16", "F8_E4M3", "U8". */
const char *trill_dtype_name(trill_dtype dt);
/* Parses one of those names; returns 0 on success, -1 if unknown. */
int trill_dtype_parse(const char *name, trill_dtype *out);

/* dst[i] = (float)src[i]; src may be unaligned (it usually points into an mmap). */
void trill_to_f32(float *dst, const void *src, trill_dtype src_dtype, size_t n);
/* Rounds to nearest even; NaN stays NaN. dst_dtype F32, BF16 or F16 (F8_E4M3 and U8 are read only). */
void trill_from_f32(void *dst, const float *src, trill_dtype dst_dtype, size_t n);

/* The value of an F8_E4M3 code, exactly. */
float trill_e4m3_to_f32(uint8_t code);
/* dst[i] = e4m3(src[i]) * scale, the product in fp32, stored as dst_dtype F32 or BF16 (rounded to
 * nearest even, as trill_f32_to_bf16) at an aligned dst: a row's run in one block of a
 * block-scaled matrix. */
void trill_e4m3_scaled(void *dst, trill_dtype dst_dtype, const void *src, size_t n, float scale);

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
