/* The generator's matrix kernels (infer/gemm.h).
 *
 * One micro-kernel shape serves every format and instruction set: a tile of RT rows × NB blocks
 * of 16 output channels keeps RT × NB accumulators of 16 lanes in registers and walks the K
 * steps in order; per step it loads each block's 64 bytes of weights once and broadcasts each
 * row's 4 bytes of activations once. The weights are reused RT times from registers (compute
 * bound batches) and streamed once per call at T = 1 (decode, bandwidth bound), while the
 * accumulation order of each output is the same sequential walk over K whatever the tile: that
 * is the batch invariance the generator promises. */
#include "infer/gemm.h"
#include "base/alloc.h"

#include <assert.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/tls.h"
#include "trill/dtype.h"
#include "trill/timing.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define GEN_X86 1
#else
#define GEN_X86 0
#endif

enum { LANES = 16, STEP_BYTES = 64, MAX_RT = 8, MAX_NB = 4 }; /* MAX_*: the largest tile compiled */

/* K elements per 4-byte lane group: the unit the kernels broadcast and multiply. */
static int group_size(trill_gen_format f) { return f == TRILL_GEN_F32 ? 1 : f == TRILL_GEN_BF16 ? 2 : 4; }
static int steps_of(trill_gen_format f, int K) { return (K + group_size(f) - 1) / group_size(f); }
static int blocks_of(int N) { return (N + LANES - 1) / LANES; }

/* The formats' public names (trill/infer.h), kept with the kernels that define them. */
const char *trill_gen_format_name(trill_gen_format f) {
    switch (f) {
    case TRILL_GEN_F32: return "f32";
    case TRILL_GEN_BF16: return "bf16";
    case TRILL_GEN_INT8: return "int8";
    }
    return "?";
}

int trill_gen_format_parse(const char *name, trill_gen_format *out) {
    static const trill_gen_format all[] = { TRILL_GEN_F32, TRILL_GEN_BF16, TRILL_GEN_INT8 };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(name, trill_gen_format_name(all[i]))) {
            *out = all[i];
            return 0;
        }
    return -1;
}

const char *trill_gen_isa_name(gen_isa isa) {
    switch (isa) {
    case GEN_ISA_GENERIC: return "generic";
    case GEN_ISA_AVX2: return "avx2";
    case GEN_ISA_AVX512: return "avx512";
    }
    return "?";
}

int trill_gen_isa_supported(gen_isa isa) {
    switch (isa) {
    case GEN_ISA_GENERIC: return 1;
#if GEN_X86
    case GEN_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case GEN_ISA_AVX512:
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16") &&
               __builtin_cpu_supports("avx512vnni");
#else
    default: return 0;
#endif
    }
    return 0;
}

gen_isa trill_gen_isa_best(void) {
    if (trill_gen_isa_supported(GEN_ISA_AVX512)) return GEN_ISA_AVX512;
    if (trill_gen_isa_supported(GEN_ISA_AVX2)) return GEN_ISA_AVX2;
    return GEN_ISA_GENERIC;
}

/* TRILL_GEN_ISA, resolved once per process (the kernels must not change under a running engine). */
static pthread_once_t g_isa_once = PTHREAD_ONCE_INIT;
static gen_isa g_isa_active;
static char g_isa_refusal[256]; /* "" when the choice is valid */

static void resolve_isa(void) {
    const char *v = getenv("TRILL_GEN_ISA");
    g_isa_active = trill_gen_isa_best();
    if (!v || !*v) return;
    static const gen_isa all[] = { GEN_ISA_GENERIC, GEN_ISA_AVX2, GEN_ISA_AVX512 };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(v, trill_gen_isa_name(all[i]))) {
            if (trill_gen_isa_supported(all[i])) g_isa_active = all[i];
            else
                snprintf(g_isa_refusal, sizeof g_isa_refusal,
                         "TRILL_GEN_ISA=%s: this CPU lacks that instruction set (it has up to %s)", v, trill_gen_isa_name(trill_gen_isa_best()));
            return;
        }
    snprintf(g_isa_refusal, sizeof g_isa_refusal, "TRILL_GEN_ISA=%.64s: unknown instruction set (expected generic, avx2 or avx512)", v);
}

trill_status trill_gen_isa_active(gen_isa *out) {
    pthread_once(&g_isa_once, resolve_isa);
    *out = g_isa_active;
    return g_isa_refusal[0] ? trill_error(TRILL_ERR_INVALID, "%s", g_isa_refusal) : TRILL_OK;
}

trill_status trill_gen_isa(const char **name) {
    gen_isa isa;
    const trill_status st = trill_gen_isa_active(&isa);
    *name = trill_gen_isa_name(isa);
    return st;
}

double trill_gen_peak_gflops(trill_gen_format f, const char **instruction) {
    gen_isa isa;
    trill_gen_isa_active(&isa); /* an unusable TRILL_GEN_ISA leaves the best one here */
    if (instruction) *instruction = trill_gen_peak_instruction(f, isa);
    return trill_gen_peak_gflops_isa(f, isa);
}

/* ---- quantisation, shared by packing and by the activations of every instruction set ---- */

/* 127 / absmax, or 0 for an all-zero vector; NaN when a value is not finite (scale NaN then
 * poisons the row's outputs, as NaN does in the float formats). */
static float int8_inverse_scale(float absmax) {
    if (!isfinite(absmax)) return NAN;
    return absmax > 0 ? 127.0f / absmax : 0.0f;
}

static int8_t int8_quantize(float v, float inv) {
    float q = nearbyintf(v * inv);
    q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
    return q == q ? (int8_t)q : 0; /* NaN (inv NaN: a non-finite row) fails both clamps */
}

/* max |v[i]|, NaN if any is NaN. On the bit patterns: without the sign, the order of floats is
 * the order of their bits (NaN above infinity), and an integer max vectorizes. */
static float absmax_of(const float *v, int n) {
    uint32_t m = 0;
    for (int i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, v + i, 4);
        bits &= 0x7fffffffu;
        m = bits > m ? bits : m;
    }
    float r;
    memcpy(&r, &m, 4);
    return r;
}

/* One row of activations in the kernels' layout, zero-padded to whole groups. bf16: the
 * rounded values as bf16 pairs (vdpbf16ps) or widened back to fp32 (exact; the AVX2 kernel then
 * broadcasts them straight from memory instead of unpacking in registers). int8: q + offset as
 * bytes (offset 128 for vpdpbusd's unsigned operand, else 0); returns scale_x. */
static void bf16_row(uint16_t *dst, const float *src, int K, int padded) {
    for (int k = 0; k < K; k++) dst[k] = trill_f32_to_bf16(src[k]);
    for (int k = K; k < padded; k++) dst[k] = 0;
}

static void bf16_row_widened(float *dst, const float *src, int K, int padded) {
    for (int k = 0; k < K; k++) dst[k] = trill_bf16_to_f32(trill_f32_to_bf16(src[k]));
    for (int k = K; k < padded; k++) dst[k] = 0;
}

static float int8_row(uint8_t *dst, const float *src, int K, int padded, int offset) {
    const float absmax = absmax_of(src, K), inv = int8_inverse_scale(absmax);
    for (int k = 0; k < K; k++) dst[k] = (uint8_t)(int8_quantize(src[k], inv) + offset);
    for (int k = K; k < padded; k++) dst[k] = (uint8_t)offset;
    return inv == inv ? absmax / 127.0f : NAN;
}

/* ---- packing ---- */

static void *alloc64(size_t bytes) {
    void *p = trill_aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p) memset(p, 0, (bytes + 63) & ~(size_t)63);
    return p;
}

void trill_gen_matrix_free(gen_matrix *m) {
    free(m->data);
    free(m->scale);
    free(m->wsum);
    memset(m, 0, sizeof *m);
}

trill_status trill_gen_matrix_create(gen_matrix *m, trill_gen_format f, const float *src_f32, const uint16_t *src_bf16, int N, int K) {
    memset(m, 0, sizeof *m);
    if (f != TRILL_GEN_F32 && f != TRILL_GEN_BF16 && f != TRILL_GEN_INT8)
        return trill_error(TRILL_ERR_INVALID, "trill_gen_matrix_create: unknown format %d", (int)f);
    if (!src_f32 == !src_bf16) return trill_error(TRILL_ERR_INVALID, "trill_gen_matrix_create: exactly one of src_f32 and src_bf16 must be given");
    if (N < 1 || K < 1) return trill_error(TRILL_ERR_INVALID, "trill_gen_matrix_create: shape [%d, %d] must be positive", N, K);
    if (f == TRILL_GEN_INT8 && K > GEN_INT8_MAX_K)
        return trill_error(TRILL_ERR_UNSUPPORTED, "trill_gen_matrix_create: int8 needs K <= %d (int32 accumulation), got %d", GEN_INT8_MAX_K, K);
    const int nb = blocks_of(N), steps = steps_of(f, K), g = group_size(f);
    const size_t packed = (size_t)nb * steps * STEP_BYTES;
    m->format = f;
    m->N = N;
    m->K = K;
    m->data = alloc64(packed);
    if (f == TRILL_GEN_INT8) { /* per-channel arrays padded to whole blocks: the kernels load 16 at a time */
        m->scale = alloc64((size_t)nb * LANES * sizeof(float));
        m->wsum = alloc64((size_t)nb * LANES * sizeof(int32_t));
    }
    float *row = trill_malloc(sizeof(float) * (size_t)K);
    if (!m->data || !row || (f == TRILL_GEN_INT8 && (!m->scale || !m->wsum))) {
        free(row);
        trill_gen_matrix_free(m);
        return trill_error(TRILL_ERR_NOMEM, "trill_gen_matrix_create: out of memory for a %s [%d, %d] matrix", trill_gen_format_name(f), N, K);
    }
    m->bytes = packed + (f == TRILL_GEN_INT8 ? (size_t)N * (sizeof(float) + sizeof(int32_t)) : 0);

    for (int n = 0; n < N; n++) {
        if (src_f32) memcpy(row, src_f32 + (size_t)n * K, sizeof(float) * (size_t)K);
        else
            for (int k = 0; k < K; k++) row[k] = trill_bf16_to_f32(src_bf16[(size_t)n * K + k]);
        const int b = n / LANES, lane = n % LANES;
        /* element k of channel n lives at byte ((b*steps + k/g)*16 + lane)*4 + (k%g)*(4/g) */
        uint8_t *base = (uint8_t *)m->data + (size_t)b * steps * STEP_BYTES + (size_t)lane * 4;
        if (f == TRILL_GEN_F32) {
            for (int k = 0; k < K; k++) memcpy(base + (size_t)k * STEP_BYTES, &row[k], 4);
        } else if (f == TRILL_GEN_BF16) {
            for (int k = 0; k < K; k++) {
                const uint16_t h = src_bf16 ? src_bf16[(size_t)n * K + k] : trill_f32_to_bf16(row[k]);
                memcpy(base + (size_t)(k / g) * STEP_BYTES + (k % g) * 2, &h, 2);
            }
        } else {
            const float absmax = absmax_of(row, K), inv = int8_inverse_scale(absmax);
            int32_t sum = 0;
            for (int k = 0; k < K; k++) {
                const int8_t q = int8_quantize(row[k], inv);
                sum += q;
                base[(size_t)(k / g) * STEP_BYTES + k % g] = (uint8_t)q;
            }
            m->scale[n] = inv == inv ? absmax / 127.0f : NAN;
            m->wsum[n] = sum;
        }
    }
    free(row);
    return TRILL_OK;
}

/* The storage: packed data, then (int8) the per-channel arrays as padded. */
static size_t packed_bytes(const gen_matrix *m) { return (size_t)blocks_of(m->N) * steps_of(m->format, m->K) * STEP_BYTES; }
static size_t channel_bytes(const gen_matrix *m) { return m->format == TRILL_GEN_INT8 ? (size_t)blocks_of(m->N) * LANES * 4 : 0; }

size_t trill_gen_matrix_wire_bytes(const gen_matrix *m) { return packed_bytes(m) + 2 * channel_bytes(m); }

void trill_gen_matrix_save(const gen_matrix *m, void *out) {
    char *o = out;
    memcpy(o, m->data, packed_bytes(m));
    if (channel_bytes(m)) {
        memcpy(o + packed_bytes(m), m->scale, channel_bytes(m));
        memcpy(o + packed_bytes(m) + channel_bytes(m), m->wsum, channel_bytes(m));
    }
}

void trill_gen_matrix_release(gen_matrix *m) {
    const gen_matrix shape = { .format = m->format, .N = m->N, .K = m->K };
    trill_gen_matrix_free(m);
    *m = shape;
}

trill_status trill_gen_matrix_load(gen_matrix *m, const void *in) {
    const char *i = in;
    const size_t packed = packed_bytes(m), channels = channel_bytes(m);
    m->data = alloc64(packed);
    if (channels) {
        m->scale = alloc64(channels);
        m->wsum = alloc64(channels);
    }
    if (!m->data || (channels && (!m->scale || !m->wsum))) {
        trill_gen_matrix_release(m);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for a %s [%d, %d] matrix", trill_gen_format_name(m->format), m->N, m->K);
    }
    memcpy(m->data, i, packed);
    if (channels) {
        memcpy(m->scale, i + packed, channels);
        memcpy(m->wsum, i + packed + channels, channels);
    }
    m->bytes = packed + (channels ? (size_t)m->N * (sizeof(float) + sizeof(int32_t)) : 0);
    return TRILL_OK;
}

/* ---- kernels ---- */

/* One tile: rows [t0, t0 + rt) × blocks [b0, b0 + nb). */
typedef struct tile {
    trill_gen_format format;
    const uint8_t *w;     /* block b0's packed weights */
    size_t wblock;        /* bytes from one block to the next (steps * 64) */
    const uint8_t *x;     /* row t0's activation groups */
    size_t xrow;          /* bytes from one row to the next */
    size_t xstep;         /* bytes per group: 4, or 8 for bf16 widened to fp32 */
    int steps;
    float *out;           /* &out[t0, b0 * 16] */
    size_t ldo;           /* out's row stride */
    int nvalid;           /* channels of the tile that exist (< nb * 16 at the end of N) */
    const float *sx;      /* int8: scale_x from row t0 */
    const float *sw;      /* int8: scale_w from channel b0 * 16 */
    const int32_t *wsum;  /* int8: weight sums from channel b0 * 16 */
    int accumulate;       /* 0: out = result; 1: out = fmaf(scale, result, out) */
    float scale;
} tile;

/* Stores 16 lanes of channel results, only those that exist, or adds them scaled (one rounding:
 * the fused multiply-add the side path's `y += s * d` compiles to). */
static inline void store_lanes(const tile *a, float *dst, const float v[LANES], int nvalid) {
    const int n = nvalid < LANES ? nvalid : LANES;
    if (!a->accumulate) memcpy(dst, v, sizeof(float) * (size_t)n);
    else
        for (int l = 0; l < n; l++) dst[l] = fmaf(a->scale, v[l], dst[l]);
}

static inline uint32_t load_group(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* The arithmetic specification, lane by lane (and the path of CPUs without AVX2). */
static void tile_generic(const tile *a, int rt, int nb) {
    for (int r = 0; r < rt; r++)
        for (int b = 0; b < nb; b++) {
            float res[LANES];
            for (int l = 0; l < LANES; l++) {
                const uint8_t *w = a->w + (size_t)b * a->wblock + (size_t)l * 4, *x = a->x + (size_t)r * a->xrow;
                if (a->format == TRILL_GEN_F32) {
                    float acc = 0;
                    for (int s = 0; s < a->steps; s++) {
                        float wv, xv;
                        memcpy(&wv, w + (size_t)s * STEP_BYTES, 4);
                        memcpy(&xv, x + (size_t)s * 4, 4);
                        acc = fmaf(wv, xv, acc);
                    }
                    res[l] = acc;
                } else if (a->format == TRILL_GEN_BF16) { /* activations widened: [even, odd] fp32 */
                    float acc = 0;
                    for (int s = 0; s < a->steps; s++) {
                        const uint32_t wv = load_group(w + (size_t)s * STEP_BYTES);
                        float xv[2];
                        memcpy(xv, x + (size_t)s * 8, 8);
                        acc = fmaf(trill_bf16_to_f32((uint16_t)(wv >> 16)), xv[1], acc);
                        acc = fmaf(trill_bf16_to_f32((uint16_t)wv), xv[0], acc);
                    }
                    res[l] = acc;
                } else {
                    int32_t acc = 0;
                    for (int s = 0; s < a->steps; s++)
                        for (int j = 0; j < 4; j++)
                            acc += (int8_t)w[(size_t)s * STEP_BYTES + j] * (int8_t)x[(size_t)s * 4 + j];
                    res[l] = (float)acc * a->sx[r] * a->sw[b * LANES + l];
                }
            }
            store_lanes(a, a->out + (size_t)r * a->ldo + (size_t)b * LANES, res, a->nvalid - b * LANES);
        }
}

#if GEN_X86
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni")))
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8") /* constant-index accumulators stay in registers */

/* AVX2: a block is two 256-bit halves of 8 lanes. bf16 weight pairs are widened in registers
 * (the low half of a lane is k even: shift it up; the high half is k odd: mask it) and multiplied
 * by the already widened activations with two FMAs of exact products; int8 uses |w| × (x with
 * w's sign) so that vpmaddubsw's 16-bit pair sums (at most 2 * 127 * 127) cannot saturate, then
 * vpmaddwd to 32 bits. */
typedef struct avx2_w { __m256 f, fx; __m256i i, ix; } avx2_w; /* f32: f; bf16: f odd, fx even; int8: i, ix = |i| */
typedef struct avx2_x { __m256 f, fx; __m256i i; } avx2_x;     /* f32: f; bf16: f odd, fx even; int8: i */

AVX2 static ALWAYS_INLINE avx2_w avx2_load_w(const uint8_t *p, const trill_gen_format F) {
    avx2_w w;
    if (F == TRILL_GEN_F32) {
        w.f = _mm256_load_ps((const float *)(const void *)p);
    } else if (F == TRILL_GEN_BF16) {
        const __m256i v = _mm256_load_si256((const __m256i *)(const void *)p);
        w.f = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
        w.fx = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    } else {
        w.i = _mm256_load_si256((const __m256i *)(const void *)p);
        w.ix = _mm256_abs_epi8(w.i);
    }
    return w;
}

AVX2 static ALWAYS_INLINE avx2_x avx2_load_x(const uint8_t *p, const trill_gen_format F) {
    avx2_x x;
    if (F == TRILL_GEN_F32) {
        x.f = _mm256_broadcast_ss((const float *)(const void *)p);
    } else if (F == TRILL_GEN_BF16) {
        x.f = _mm256_broadcast_ss((const float *)(const void *)(p + 4));
        x.fx = _mm256_broadcast_ss((const float *)(const void *)p);
    } else {
        x.i = _mm256_set1_epi32((int)load_group(p));
    }
    return x;
}

AVX2 static ALWAYS_INLINE __m256 avx2_step_float(__m256 acc, avx2_w w, avx2_x x, const trill_gen_format F) {
    if (F == TRILL_GEN_F32) return _mm256_fmadd_ps(w.f, x.f, acc);
    return _mm256_fmadd_ps(w.fx, x.fx, _mm256_fmadd_ps(w.f, x.f, acc));
}

AVX2 static ALWAYS_INLINE __m256i avx2_step_int8(__m256i acc, avx2_w w, avx2_x x) {
    const __m256i pairs = _mm256_maddubs_epi16(w.ix, _mm256_sign_epi8(x.i, w.i));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

AVX2 static ALWAYS_INLINE void tile_avx2_body(const tile *a, const trill_gen_format F, const int RT, const int NB) {
    /* fixed sizes, float and integer kept apart (one of them unused): after inlining with
     * constant RT and NB they become registers */
    __m256 accf[MAX_RT][MAX_NB][2];
    __m256i acci[MAX_RT][MAX_NB][2];
#define AVX2_STEP(r, b, h, w, x)                                                   \
    do {                                                                           \
        if (F == TRILL_GEN_INT8) acci[r][b][h] = avx2_step_int8(acci[r][b][h], w, x);    \
        else accf[r][b][h] = avx2_step_float(accf[r][b][h], w, x, F);              \
    } while (0)
    UNROLL for (int r = 0; r < RT; r++)
        UNROLL for (int b = 0; b < NB; b++)
            UNROLL for (int h = 0; h < 2; h++) {
                accf[r][b][h] = _mm256_setzero_ps();
                acci[r][b][h] = _mm256_setzero_si256();
            }
    for (int s = 0; s < a->steps; s++) {
        const uint8_t *ws = a->w + (size_t)s * STEP_BYTES, *xs = a->x + (size_t)s * a->xstep;
        if (RT == 1) { /* one row: load each weight vector just before its use (fewer live registers) */
            const avx2_x x = avx2_load_x(xs, F);
            UNROLL for (int b = 0; b < NB; b++)
                UNROLL for (int h = 0; h < 2; h++) AVX2_STEP(0, b, h, avx2_load_w(ws + (size_t)b * a->wblock + h * 32, F), x);
        } else { /* rows share each weight vector from a register */
            avx2_w w[MAX_NB][2];
            UNROLL for (int b = 0; b < NB; b++)
                UNROLL for (int h = 0; h < 2; h++) w[b][h] = avx2_load_w(ws + (size_t)b * a->wblock + h * 32, F);
            UNROLL for (int r = 0; r < RT; r++) {
                const avx2_x x = avx2_load_x(xs + (size_t)r * a->xrow, F);
                UNROLL for (int b = 0; b < NB; b++)
                    UNROLL for (int h = 0; h < 2; h++) AVX2_STEP(r, b, h, w[b][h], x);
            }
        }
    }
#undef AVX2_STEP
    UNROLL for (int r = 0; r < RT; r++)
        UNROLL for (int b = 0; b < NB; b++) {
            float res[LANES];
            UNROLL for (int h = 0; h < 2; h++) {
                __m256 v = accf[r][b][h];
                if (F == TRILL_GEN_INT8) {
                    v = _mm256_mul_ps(_mm256_cvtepi32_ps(acci[r][b][h]), _mm256_set1_ps(a->sx[r]));
                    v = _mm256_mul_ps(v, _mm256_load_ps(a->sw + b * LANES + h * 8));
                }
                _mm256_storeu_ps(res + h * 8, v);
            }
            store_lanes(a, a->out + (size_t)r * a->ldo + (size_t)b * LANES, res, a->nvalid - b * LANES);
        }
}

/* AVX-512: one zmm per block; vdpbf16ps and vpdpbusd do a whole group per lane. vpdpbusd
 * multiplies unsigned by signed bytes, so activations arrive as q + 128 and the accumulator
 * drops 128 * sum(w) at the end (exact: int32 arithmetic wraps and the true sum fits). */
AVX512 static ALWAYS_INLINE void tile_avx512_body(const tile *a, const trill_gen_format F, const int RT, const int NB) {
    __m512 accf[MAX_RT][MAX_NB]; /* as on AVX2: typed, fixed-size, one of the two unused */
    __m512i acci[MAX_RT][MAX_NB];
    UNROLL for (int r = 0; r < RT; r++)
        UNROLL for (int b = 0; b < NB; b++) {
            accf[r][b] = _mm512_setzero_ps();
            acci[r][b] = _mm512_setzero_si512();
        }
    for (int s = 0; s < a->steps; s++) {
        __m512i w[MAX_NB];
        UNROLL for (int b = 0; b < NB; b++) w[b] = _mm512_load_si512(a->w + (size_t)b * a->wblock + (size_t)s * STEP_BYTES);
        UNROLL for (int r = 0; r < RT; r++) {
            const __m512i xv = _mm512_set1_epi32((int)load_group(a->x + (size_t)r * a->xrow + (size_t)s * a->xstep));
            UNROLL for (int b = 0; b < NB; b++) {
                if (F == TRILL_GEN_F32) accf[r][b] = _mm512_fmadd_ps(_mm512_castsi512_ps(w[b]), _mm512_castsi512_ps(xv), accf[r][b]);
                else if (F == TRILL_GEN_BF16) accf[r][b] = _mm512_dpbf16_ps(accf[r][b], (__m512bh)w[b], (__m512bh)xv);
                else acci[r][b] = _mm512_dpbusd_epi32(acci[r][b], xv, w[b]); /* unsigned x, signed w */
            }
        }
    }
    UNROLL for (int r = 0; r < RT; r++)
        UNROLL for (int b = 0; b < NB; b++) {
            float res[LANES];
            __m512 v = accf[r][b];
            if (F == TRILL_GEN_INT8) {
                const __m512i dot = _mm512_sub_epi32(acci[r][b], _mm512_slli_epi32(_mm512_load_si512(a->wsum + b * LANES), 7));
                v = _mm512_mul_ps(_mm512_cvtepi32_ps(dot), _mm512_set1_ps(a->sx[r]));
                v = _mm512_mul_ps(v, _mm512_load_ps(a->sw + b * LANES));
            }
            _mm512_storeu_ps(res, v);
            store_lanes(a, a->out + (size_t)r * a->ldo + (size_t)b * LANES, res, a->nvalid - b * LANES);
        }
}

/* Tile shapes (rows × blocks) per instruction set and format, chosen by measurement on Zen 3
 * for AVX2 (the accumulators, weights and broadcasts fit the 16 ymm registers; more rows spill)
 * and by register count for AVX-512 (32 zmm). A single row (decode) takes GEMV_NB blocks at once:
 * independent accumulators hide the FMA latency while the weights stream. Every smaller shape is
 * compiled too, for the remainders. */
enum { GEMV_NB = 4 };
static const struct { int rt, nb; } TILE_SHAPE[3][3] = {
    [GEN_ISA_GENERIC] = { [TRILL_GEN_F32] = { 4, 1 }, [TRILL_GEN_BF16] = { 4, 1 }, [TRILL_GEN_INT8] = { 4, 1 } },
    [GEN_ISA_AVX2] = { [TRILL_GEN_F32] = { 6, 1 }, [TRILL_GEN_BF16] = { 5, 1 }, [TRILL_GEN_INT8] = { 3, 1 } },
    [GEN_ISA_AVX512] = { [TRILL_GEN_F32] = { 8, 2 }, [TRILL_GEN_BF16] = { 8, 2 }, [TRILL_GEN_INT8] = { 8, 2 } },
};

#define CASE(body, F, RT, NB) \
    case RT * 8 + NB: body(a, F, RT, NB); return;
#define CASES_ONE_BLOCK(body, F) \
    CASE(body, F, 1, 1) CASE(body, F, 2, 1) CASE(body, F, 3, 1) CASE(body, F, 4, 1) CASE(body, F, 5, 1) CASE(body, F, 6, 1)
#define CASES_GEMV(body, F) CASE(body, F, 1, 2) CASE(body, F, 1, 3) CASE(body, F, 1, 4)
#define CASES_ZMM_ONLY(body, F) /* shapes that need 32 registers */ \
    CASE(body, F, 7, 1) CASE(body, F, 8, 1) CASE(body, F, 2, 2) CASE(body, F, 3, 2) CASE(body, F, 4, 2) CASE(body, F, 5, 2) \
    CASE(body, F, 6, 2) CASE(body, F, 7, 2) CASE(body, F, 8, 2)

#define TILES_AVX2(F)                                                                        \
    switch (rt * 8 + nb) { CASES_ONE_BLOCK(tile_avx2_body, F) CASES_GEMV(tile_avx2_body, F) } \
    assert(!"tile shape not compiled");
#define TILES_AVX512(F)                                                                                                             \
    switch (rt * 8 + nb) { CASES_ONE_BLOCK(tile_avx512_body, F) CASES_GEMV(tile_avx512_body, F) CASES_ZMM_ONLY(tile_avx512_body, F) } \
    assert(!"tile shape not compiled");

AVX2 static void tile_avx2_f32(const tile *a, int rt, int nb) { TILES_AVX2(TRILL_GEN_F32) }
AVX2 static void tile_avx2_bf16(const tile *a, int rt, int nb) { TILES_AVX2(TRILL_GEN_BF16) }
AVX2 static void tile_avx2_int8(const tile *a, int rt, int nb) { TILES_AVX2(TRILL_GEN_INT8) }
AVX512 static void tile_avx512_f32(const tile *a, int rt, int nb) { TILES_AVX512(TRILL_GEN_F32) }
AVX512 static void tile_avx512_bf16(const tile *a, int rt, int nb) { TILES_AVX512(TRILL_GEN_BF16) }
AVX512 static void tile_avx512_int8(const tile *a, int rt, int nb) { TILES_AVX512(TRILL_GEN_INT8) }
/* ---- compute peaks: register-only loops of the instruction each format's kernel is built on ---- */

static volatile uint64_t g_sink; /* keeps the loops' results alive */
enum { PEAK_ITERS = 1 << 24 };

/* Register-only loops: 12 independent accumulators cover the latency of each instruction. */
AVX2 static void peak_fma_avx2(void *arg) {
    (void)arg;
#pragma omp parallel
    {
        __m256 acc[12], a = _mm256_set1_ps(1.0000001f), b = _mm256_set1_ps(0.9999999f);
        for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps((float)i);
        for (int it = 0; it < PEAK_ITERS; it++)
            for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(a, acc[i], b);
        float s[8];
        for (int i = 1; i < 12; i++) acc[0] = _mm256_add_ps(acc[0], acc[i]);
        _mm256_storeu_ps(s, acc[0]);
        g_sink += (uint64_t)s[0];
    }
}

AVX2 static void peak_int8_avx2(void *arg) {
    (void)arg;
#pragma omp parallel
    {
        __m256i acc[12], w = _mm256_set1_epi8(3), aw = _mm256_abs_epi8(w), x = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
        for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_epi32(i);
        for (int it = 0; it < PEAK_ITERS; it++) {
            x = _mm256_xor_si256(x, acc[0]); /* one dependent operand so the loop is not hoisted */
            for (int i = 0; i < 12; i++)
                acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones));
        }
        for (int i = 1; i < 12; i++) acc[0] = _mm256_add_epi32(acc[0], acc[i]);
        g_sink += (uint64_t)_mm256_extract_epi32(acc[0], 0);
    }
}

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni")))
AVX512 static void peak_fma_avx512(void *arg) {
    (void)arg;
#pragma omp parallel
    {
        __m512 acc[12], a = _mm512_set1_ps(1.0000001f), b = _mm512_set1_ps(0.9999999f);
        for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps((float)i);
        for (int it = 0; it < PEAK_ITERS; it++)
            for (int i = 0; i < 12; i++) acc[i] = _mm512_fmadd_ps(a, acc[i], b);
        for (int i = 1; i < 12; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
        g_sink += (uint64_t)_mm512_reduce_add_ps(acc[0]);
    }
}

AVX512 static void peak_bf16_avx512(void *arg) {
    (void)arg;
#pragma omp parallel
    {
        __m512 acc[12];
        const __m512i a = _mm512_set1_epi32(0x3f803f80), b = _mm512_set1_epi32(0x3f7f3f7f);
        for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps((float)i);
        for (int it = 0; it < PEAK_ITERS; it++)
            for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)a, (__m512bh)b);
        for (int i = 1; i < 12; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
        g_sink += (uint64_t)_mm512_reduce_add_ps(acc[0]);
    }
}

AVX512 static void peak_int8_avx512(void *arg) {
    (void)arg;
#pragma omp parallel
    {
        __m512i acc[12];
        const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
        for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i);
        for (int it = 0; it < PEAK_ITERS; it++)
            for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
        for (int i = 1; i < 12; i++) acc[0] = _mm512_add_epi32(acc[0], acc[i]);
        g_sink += (uint32_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(acc[0])); /* one lane: the sums wrap, a C reduction would overflow */
    }
}

#endif

typedef void (*tile_fn)(const tile *a, int rt, int nb);

static tile_fn tile_kernel(gen_isa isa, trill_gen_format f) {
#if GEN_X86
    if (isa == GEN_ISA_AVX2) return f == TRILL_GEN_F32 ? tile_avx2_f32 : f == TRILL_GEN_BF16 ? tile_avx2_bf16 : tile_avx2_int8;
    if (isa == GEN_ISA_AVX512) return f == TRILL_GEN_F32 ? tile_avx512_f32 : f == TRILL_GEN_BF16 ? tile_avx512_bf16 : tile_avx512_int8;
#endif
    return tile_generic;
}

static trill_tls_slot gen_scratch_slot; /* the generator's activation scratch */

/* Activation scratch of the calling thread (the team works in slices of it): converted rows,
 * then the int8 row scales; NULL when out of memory. Only the caller allocates, so no buffer is
 * tied to OpenMP's workers, whose threads come and go with the team size. */
static uint8_t *scratch(size_t bytes) { return trill_tls_buffer(&gen_scratch_slot, bytes); }

/* How the activations of one product are laid out for the kernels. */
typedef struct act_layout {
    trill_gen_format format;
    int K, steps, T;
    size_t ldi;       /* the fp32 input's row stride, in floats */
    int widened;      /* bf16 as rounded fp32 values (AVX2, generic) rather than bf16 pairs */
    int offset;       /* int8: 128 for vpdpbusd's unsigned operand, else 0 */
    size_t xstep, xrow;
} act_layout;

static size_t act_bytes(const act_layout *l) { return ((l->xrow * l->T + sizeof(float) * (size_t)l->T) + 63) & ~(size_t)63; }

/* Rows [t0, t1) of inp into buf (rows of xrow bytes, then T int8 row scales). */
static void convert_rows(uint8_t *buf, const float *inp, int t0, int t1, const act_layout *l) {
    float *sx = (float *)(void *)(buf + l->xrow * l->T); /* xrow is a multiple of 4 */
    for (int t = t0; t < t1; t++) {
        uint8_t *dst = buf + l->xrow * t;
        const float *src = inp + (size_t)t * l->ldi;
        if (l->format == TRILL_GEN_INT8) sx[t] = int8_row(dst, src, l->K, l->steps * 4, l->offset);
        else if (l->widened) bf16_row_widened((float *)(void *)dst, src, l->K, l->steps * 2);
        else bf16_row((uint16_t *)(void *)dst, src, l->K, l->steps * 2);
    }
}

/* GFLOP/s (2 per MAC) of a peak loop on all threads: the fastest of a few runs (noise only slows it). */
static double peak_gflops(void (*loop)(void *), double macs_per_instr) {
    double best = 1e30;
    for (int r = 0; r < 4; r++) { /* the first warms up */
        const double t0 = trill_now();
        loop(NULL);
        const double t = trill_now() - t0;
        if (r > 0 && t < best) best = t;
    }
    return 2.0 * macs_per_instr * 12.0 * PEAK_ITERS * omp_get_max_threads() / best * 1e-9;
}

double trill_gen_peak_gflops_isa(trill_gen_format f, gen_isa isa) {
#if GEN_X86
    if (isa == GEN_ISA_AVX512 && trill_gen_isa_supported(isa))
        return peak_gflops(f == TRILL_GEN_F32 ? peak_fma_avx512 : f == TRILL_GEN_BF16 ? peak_bf16_avx512 : peak_int8_avx512,
                           f == TRILL_GEN_F32 ? 16 : f == TRILL_GEN_BF16 ? 32 : 64);
    if (isa == GEN_ISA_AVX2 && trill_gen_isa_supported(isa))
        return peak_gflops(f == TRILL_GEN_INT8 ? peak_int8_avx2 : peak_fma_avx2, f == TRILL_GEN_INT8 ? 32 : 8);
#endif
    (void)f;
    (void)isa;
    return 0;
}

const char *trill_gen_peak_instruction(trill_gen_format f, gen_isa isa) {
    if (isa == GEN_ISA_AVX512) return f == TRILL_GEN_F32 ? "vfmadd231ps zmm" : f == TRILL_GEN_BF16 ? "vdpbf16ps zmm" : "vpdpbusd zmm";
    if (isa == GEN_ISA_AVX2)
        return f == TRILL_GEN_F32 ? "vfmadd231ps ymm" : f == TRILL_GEN_BF16 ? "vfmadd231ps ymm (no AVX-512 BF16: bf16 MACs are fp32 FMAs)"
                                                 : "vpsignb+vpmaddubsw+vpmaddwd+vpaddd ymm";
    return "none (generic C)";
}

trill_status trill_gen_matmul(float *out, const float *inp, const gen_matrix *W, int T) {
    gen_isa isa;
    trill_status st = trill_gen_isa_active(&isa); /* trill_engine_create refuses first: never fails here in practice */
    return st ? st : trill_gen_matmul_isa(out, inp, W, T, isa);
}

trill_status trill_gen_matmul_isa(float *out, const float *inp, const gen_matrix *W, int T, gen_isa isa) {
    const gen_product p = { .out = out, .inp = inp, .W = W, .T = T };
    return trill_gen_matmul_many_isa(&p, 1, isa);
}

trill_status trill_gen_matmul_many(const gen_product *p, int n) {
    gen_isa isa;
    trill_status st = trill_gen_isa_active(&isa);
    return st ? st : trill_gen_matmul_many_isa(p, n, isa);
}

/* What one product of a batch needs in the parallel region. */
typedef struct product_plan {
    act_layout l;
    int nblocks, convert;
    int source;        /* the product whose converted rows this one reads (itself, or an earlier one with the same input) */
    size_t buf_off;    /* source: where its converted rows start in a slice of scratch */
    size_t rows0;      /* source: its first row among all converted rows */
    int64_t cost0, bcost; /* the batch's work before this product, and per block of 16 channels (T × steps) */
} product_plan;

static trill_tls_slot gen_plan_slot; /* the plans of the calling thread's batch */

/* Blocks [*b0, *b1) of product p for the thread whose share of the batch's work is [c0, c1): the
 * blocks whose work starts in it, so the shares cover each product's blocks once, in contiguous
 * runs (each core streams its own weight rows). */
static void share_of(const product_plan *pp, int64_t c0, int64_t c1, int *b0, int *b1) {
    const int64_t bc = pp->bcost > 0 ? pp->bcost : 1;
    int64_t lo = c0 - pp->cost0, hi = c1 - pp->cost0;
    lo = lo <= 0 ? 0 : (lo + bc - 1) / bc;
    hi = hi <= 0 ? 0 : (hi + bc - 1) / bc;
    *b0 = (int)(lo < pp->nblocks ? lo : pp->nblocks);
    *b1 = (int)(hi < pp->nblocks ? hi : pp->nblocks);
}

static void run_blocks(const gen_product *p, const product_plan *pp, const uint8_t *x, const float *sx, int b_begin, int b_end,
                       gen_isa isa) {
    const gen_matrix *W = p->W;
    const trill_gen_format f = W->format;
    const tile_fn kernel = tile_kernel(isa, f);
    const int rt_max = TILE_SHAPE[isa][f].rt, nb_max = p->T == 1 ? GEMV_NB : TILE_SHAPE[isa][f].nb, steps = pp->l.steps;
    const size_t ldo = p->ldo ? p->ldo : (size_t)W->N;
    for (int b0 = b_begin; b0 < b_end; b0 += nb_max) {
        const int nb = b_end - b0 < nb_max ? b_end - b0 : nb_max;
        for (int t0 = 0; t0 < p->T; t0 += rt_max) {
            const int rt = p->T - t0 < rt_max ? p->T - t0 : rt_max;
            const tile a = {
                .format = f,
                .w = (const uint8_t *)W->data + (size_t)b0 * steps * STEP_BYTES,
                .wblock = (size_t)steps * STEP_BYTES,
                .x = x + pp->l.xrow * t0,
                .xrow = pp->l.xrow,
                .xstep = pp->l.xstep,
                .steps = steps,
                .out = p->out + (size_t)t0 * ldo + (size_t)b0 * LANES,
                .ldo = ldo,
                .nvalid = W->N - b0 * LANES,
                .sx = sx ? sx + t0 : NULL,
                .sw = W->scale ? W->scale + (size_t)b0 * LANES : NULL,
                .wsum = W->wsum ? W->wsum + (size_t)b0 * LANES : NULL,
                .accumulate = p->accumulate,
                .scale = p->scale,
            };
            kernel(&a, rt, nb);
        }
    }
}

/* The batch's totals: its work, MACs, the bytes of one slice of converted rows, those rows and
 * their elements. */
typedef struct batch_plan {
    int64_t cost;
    double macs;
    size_t slice, rows, convert_elems;
} batch_plan;

/* Each product's layout, share of the work and converted rows (a product reading the same rows
 * as an earlier one, converted the same way, reads that one's). */
static batch_plan plan_batch(const gen_product *p, int n, gen_isa isa, product_plan *plan) {
    batch_plan bp = { 0 };
    int64_t cost = 0;
    size_t slice = 0, rows = 0;
    for (int i = 0; i < n; i++) {
        const gen_matrix *W = p[i].W;
        const trill_gen_format f = W->format;
        product_plan *pp = &plan[i];
        const int T = p[i].T > 0 ? p[i].T : 0;
        pp->l = (act_layout){ .format = f, .K = W->K, .steps = steps_of(f, W->K), .T = T, .ldi = p[i].ldi ? p[i].ldi : (size_t)W->K,
                              .widened = f == TRILL_GEN_BF16 && isa != GEN_ISA_AVX512,
                              .offset = f == TRILL_GEN_INT8 && isa == GEN_ISA_AVX512 ? 128 : 0 };
        pp->l.xstep = pp->l.widened ? 8 : 4;
        pp->l.xrow = f == TRILL_GEN_F32 ? pp->l.ldi * 4 : (size_t)pp->l.steps * pp->l.xstep;
        pp->nblocks = T ? blocks_of(W->N) : 0;
        pp->convert = f != TRILL_GEN_F32 && T > 0;
        pp->cost0 = cost;
        pp->bcost = (int64_t)T * pp->l.steps;
        cost += pp->bcost * pp->nblocks;
        bp.macs += (double)T * W->N * W->K;
        pp->source = i;
        if (!pp->convert) continue;
        for (int j = 0; j < i; j++) /* the same rows converted the same way: once */
            if (plan[j].convert && p[j].inp == p[i].inp && plan[j].l.ldi == pp->l.ldi && plan[j].l.K == pp->l.K && plan[j].l.T == T &&
                plan[j].l.format == f && plan[j].source == j) {
                pp->source = j;
                break;
            }
        if (pp->source != i) continue;
        pp->buf_off = slice;
        pp->rows0 = rows;
        slice += act_bytes(&pp->l);
        rows += (size_t)T;
        bp.convert_elems += (size_t)T * pp->l.K;
    }
    bp.cost = cost;
    bp.slice = slice;
    bp.rows = rows;
    return bp;
}

trill_status trill_gen_matmul_many_isa(const gen_product *p, int n, gen_isa isa) {
    assert(trill_gen_isa_supported(isa));
    if (n <= 0) return TRILL_OK;
    product_plan *plan = trill_tls_buffer(&gen_plan_slot, sizeof(product_plan) * (size_t)n);
    if (!plan) return trill_error(TRILL_ERR_NOMEM, "out of memory for the plan of %d matrix products", n);
    const batch_plan bp = plan_batch(p, n, isa, plan);
    const int64_t cost = bp.cost;
    const size_t slice = bp.slice, rows = bp.rows;
    if (cost == 0) return TRILL_OK;
    const int parallel = !omp_in_parallel() && bp.macs >= 65536;
    const int threads = parallel ? omp_get_max_threads() : 1;
    /* Small batches (decode): every thread converts all rows into its own slice, which costs less
     * than the barrier after a shared conversion. */
    const int private_rows = bp.convert_elems <= 16384;
    uint8_t *buf_all = slice ? scratch(slice * (private_rows ? threads : 1)) : NULL;
    if (slice && !buf_all)
        return trill_error(TRILL_ERR_NOMEM, "out of memory for %.1f MB of converted activations (%d matrix products, %zu rows)",
                           (double)(slice * (private_rows ? threads : 1)) * 1e-6, n, rows);

#pragma omp parallel num_threads(threads) if (parallel)
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        uint8_t *buf = buf_all;
        if (slice) {
            if (private_rows) buf += slice * id;
            /* private: all rows; shared: this thread's run of the batch's rows, then a barrier */
            const size_t r0 = private_rows ? 0 : rows * id / nt, r1 = private_rows ? rows : rows * (id + 1) / nt;
            for (int i = 0; i < n; i++) {
                const product_plan *pp = &plan[i];
                if (!pp->convert || pp->source != i || pp->rows0 >= r1 || pp->rows0 + pp->l.T <= r0) continue;
                const int t0 = r0 > pp->rows0 ? (int)(r0 - pp->rows0) : 0, t1 = r1 < pp->rows0 + pp->l.T ? (int)(r1 - pp->rows0) : pp->l.T;
                convert_rows(buf + pp->buf_off, p[i].inp, t0, t1, &pp->l);
            }
            if (!private_rows) {
#pragma omp barrier
            }
        }
        const int64_t c0 = cost * id / nt, c1 = cost * (id + 1) / nt;
        for (int i = 0; i < n; i++) {
            const product_plan *pp = &plan[i];
            if (pp->cost0 >= c1 || pp->cost0 + pp->bcost * pp->nblocks <= c0) continue;
            int b0, b1;
            share_of(pp, c0, c1, &b0, &b1);
            if (b0 >= b1) continue;
            const uint8_t *x = (const uint8_t *)p[i].inp;
            const float *sx = NULL;
            if (pp->convert) {
                const product_plan *src = &plan[pp->source];
                x = buf + src->buf_off;
                sx = (const float *)(const void *)(x + src->l.xrow * src->l.T);
            }
            run_blocks(&p[i], pp, x, sx, b0, b1, isa);
        }
    }
    return TRILL_OK;
}
