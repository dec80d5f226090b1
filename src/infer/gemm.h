/* The generator's weight formats and matrix kernels.
 *
 * The generator keeps its weights in its own formats (fp32 for debugging, bf16 as bf16 serving
 * engines run, int8 W8A8), packed at load into the layout its kernels stream, and multiplies
 * with kernels of its own rather than the trainer's sgemm. That difference in arithmetic is the
 * training-inference mismatch the RL loop measures and corrects, so each format's numerics are
 * specified exactly below.
 *
 * Batch invariance: out[t, n] is bit-identical whatever T is, whatever the other rows of inp
 * are, and whatever the thread count or schedule. Every output channel is one vector lane that
 * accumulates over K in one fixed sequential order; rows and channels are only ever tiled, never
 * split along K, so a request produces the same tokens alone or inside a busy batch.
 *
 * Packed layout (all formats): output channels in blocks of 16 (one 512-bit vector, or two
 * 256-bit halves); within a block, one "step" of 64 bytes per K group: 16 lanes × 4 bytes, lane
 * l holding channel n0+l's weights for that group. A group is 1 fp32, 2 bf16 (k even, k odd:
 * the pair vdpbf16ps multiplies) or 4 int8 (the quad vpdpbusd multiplies). K is padded with
 * zeros to whole groups and N to whole blocks. The activation side of a step is 4 bytes per row,
 * broadcast to all lanes. */
#ifndef TRILL_INFER_GEMM_H
#define TRILL_INFER_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "trill/error.h"
#include "trill/infer.h" /* trill_gen_format: the formats are the engine's public configuration */

/* The arithmetic of each format (trill_gen_format, trill/infer.h):
 *   TRILL_GEN_F32  — fp32 weights, fp32 FMA over k in order
 *   TRILL_GEN_BF16 — bf16 weights and activations (activations rounded to nearest even per call),
 *                    products summed in fp32 per lane: acc += w[k+1]x[k+1], then acc += w[k]x[k]
 *                    (vdpbf16ps on AVX-512 BF16, two exact-product FMAs elsewhere)
 *   TRILL_GEN_INT8 — W8A8: weights symmetric int8 per output channel, scale_w = absmax/127;
 *                    activations symmetric int8 per row (token), scale_x = absmax/127; q =
 *                    nearbyint(v * (127 / absmax)) clamped to ±127; exact int32 dot product;
 *                    out = (float)dot * scale_x[t] * scale_w[n], multiplied in that order */

/* The instruction set a kernel runs on. Each computes every format to the specification above;
 * GENERIC and AVX2 give bit-identical results, and so does AVX512 for fp32 and int8 (its bf16
 * is vdpbf16ps, whose intermediate rounding and denormal flushing are the hardware's). */
typedef enum gen_isa { GEN_ISA_GENERIC, GEN_ISA_AVX2, GEN_ISA_AVX512 } gen_isa;

/* W[N, K] (nn.Linear layout: N outputs, K inputs) in a generator format. */
typedef struct gen_matrix {
    trill_gen_format format;
    int N, K;
    void *data;     /* packed blocks (layout above), 64-byte aligned */
    float *scale;   /* TRILL_GEN_INT8: scale_w per output channel [N]; else NULL */
    int32_t *wsum;  /* TRILL_GEN_INT8: sum of the int8 weights per channel [N] (VNNI's +128 offset); else NULL */
    size_t bytes;   /* what one call streams from the matrix: packed data + per-channel arrays */
} gen_matrix;

/* Packs fp32 or bf16 source rows ([N][K], row stride K; exactly one of src_f32 and src_bf16 is
 * non-NULL). TRILL_ERR_INVALID on bad arguments, TRILL_ERR_UNSUPPORTED for int8 with K >
 * GEN_INT8_MAX_K (the int32 dot product could overflow), TRILL_ERR_NOMEM. *m is zeroed on
 * failure, so trill_gen_matrix_free is always safe. */
enum { GEN_INT8_MAX_K = 131072 }; /* 127 * 127 * K < 2^31 */
trill_status trill_gen_matrix_create(gen_matrix *m, trill_gen_format f, const float *src_f32, const uint16_t *src_bf16, int N, int K);
void trill_gen_matrix_free(gen_matrix *m);
/* Moving a matrix between ranks (expert parallelism): its storage's size in bytes, the storage
 * written to out, released (the storage freed, format and shape kept, data NULL) and loaded
 * back from such bytes into a released matrix of the same format and shape. */
size_t trill_gen_matrix_wire_bytes(const gen_matrix *m);
void trill_gen_matrix_save(const gen_matrix *m, void *out);
void trill_gen_matrix_release(gen_matrix *m);
trill_status trill_gen_matrix_load(gen_matrix *m, const void *in);

/* out[T, N] = inp[T, K] @ W^T, fp32 in and out (not overlapping), on trill_gen_isa_active()'s
 * instruction set (the best this CPU has unless TRILL_GEN_ISA says otherwise). Threads: OpenMP over runs of output-channel blocks, so each core streams its own
 * weight rows; inside a parallel region a call runs on its calling thread alone. Concurrent calls
 * are safe: the converted activations live in per-thread scratch (grown on demand).
 * TRILL_ERR_NOMEM (out incomplete, the message set on the calling thread) when that scratch
 * cannot be had; fp32 needs none and never fails. */
trill_status trill_gen_matmul(float *out, const float *inp, const gen_matrix *W, int T);
/* The same on a chosen instruction set (tests and benchmarks); it must be supported. */
trill_status trill_gen_matmul_isa(float *out, const float *inp, const gen_matrix *W, int T, gen_isa isa);

/* One product of a batch: out[t, n] for t < T, n < W->N (row stride ldo; 0: W->N) from inp[t, k]
 * for k < W->K (row stride ldi; 0: W->K), as trill_gen_matmul computes it, and either stored or,
 * with `accumulate`, added as out = fmaf(scale, product, out): an adapter's expand (y += s (x A^T)
 * B^T) straight into the columns of y it adapts, rounded once. */
typedef struct gen_product {
    float *out;
    const float *inp;
    const gen_matrix *W;
    int T;
    size_t ldo, ldi;
    int accumulate;
    float scale;
} gen_product;

/* Products p[0..n) in one parallel region (one fork rather than one per matrix: a layer's skinny
 * adapter matrices, or a MoE layer's experts): the batch's work (rows × K groups per 16-channel
 * block) is split in contiguous runs over the threads, and products reading the same input (the
 * same pointer, stride, K, T and format) convert it once. Each output is bit-identical to
 * trill_gen_matmul's for that product alone (batch invariance holds across products too). The
 * products run concurrently: their outputs must not overlap each other or any product's input.
 * Inside a parallel region the batch runs on the calling thread alone. Fails as trill_gen_matmul. */
trill_status trill_gen_matmul_many(const gen_product *p, int n);
trill_status trill_gen_matmul_many_isa(const gen_product *p, int n, gen_isa isa);

/* The compute peak of the instruction a format's kernel is built on, measured now with
 * register-only loops on all OpenMP threads (GFLOP/s, 2 per multiply-add; 0 if isa is not
 * supported), and that instruction's name: the yardstick for the kernels' GFLOP/s. */
double trill_gen_peak_gflops_isa(trill_gen_format f, gen_isa isa);
const char *trill_gen_peak_instruction(trill_gen_format f, gen_isa isa);

gen_isa trill_gen_isa_best(void);
/* The instruction set trill_gen_matmul runs on: trill_gen_isa_best(), unless the environment variable
 * TRILL_GEN_ISA names one ("generic", "avx2", "avx512"; unset or empty: the best), so results
 * can be reproduced across machines (AVX2 and generic agree bit for bit, AVX-512's bf16 does
 * not). Read once per process. An unknown name, or an instruction set this CPU lacks, is
 * TRILL_ERR_INVALID with a message (*out is then trill_gen_isa_best()); trill_engine_create refuses
 * with it, and trill_gen_matmul returns it should it be reached anyway. */
trill_status trill_gen_isa_active(gen_isa *out);
int trill_gen_isa_supported(gen_isa isa);
const char *trill_gen_isa_name(gen_isa isa);

#endif
