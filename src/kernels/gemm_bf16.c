/* The bf16 GEMM of the trainer's bf16 precision (kernels_internal.h).
 *
 * C = alpha op(A) op(B) + beta C with both operands rounded to bf16 (nearest even) and the
 * products summed in fp32, as a GPU's bf16 tensor-core GEMM computes it. Blocked as usual
 * (Goto): a panel of op(B) of KC × NC is packed once into blocks of 32 columns, a block of
 * op(A) of MC × KC into slivers of MR rows, and an MR × 32 micro-kernel walks the panel's K
 * pairs keeping its MR × 32 sums in registers. The packing rounds to bf16, so the operands
 * stay fp32 (or bf16, for a stored weight) in memory and the caller changes nothing.
 *
 * Arithmetic of one output, the same on every path: for each K chunk of KC (in order), a sum
 * s = 0 over the chunk's pairs (k, k+1) in order: s += a[k+1] b[k+1], then s += a[k] b[k], each
 * product exact (two bf16 significands fit an fp32 one) and each addition rounded to fp32 (what
 * vdpbf16ps specifies); then C = beta C + alpha s for the first chunk, C += alpha s after it.
 * AVX-512 BF16 computes it with vdpbf16ps, any other CPU with the same steps as fmaf (the
 * generic path): the two agree bit for bit except where vdpbf16ps flushes denormals to zero.
 * Single-threaded: the caller (ops_impl.h's gemm) splits C across threads. */
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/tls.h"
#include "kernels_internal.h"
#include "trill/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define BF16_X86 1
#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define BF16_X86 0
#endif

/* MR × NR register tile (24 accumulators of 16 lanes, two B vectors, the A pairs broadcast from
 * memory: 26 of the 32 zmm); a KC × NC packed B panel (2 MB: op(A) is packed once for most N),
 * its KC × NR slivers (16 KB) staying in L1 while the MC × KC packed A block (48 KB) streams. */
enum { MR = 12, NR = 32, KC = 256, NC = 4096, MC = 96 };

int trill_kernels_bf16_native(void) {
#if BF16_X86
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

trill_precision trill_kernels_precision_auto(void) { return trill_kernels_bf16_native() ? TRILL_PRECISION_BF16 : TRILL_PRECISION_FP32; }

/* op(X) of a row-major X with leading dimension ld: element (i, k) at x[i ld + k], or at
 * x[k ld + i] when trans is set; fp32 or, when x16 is set, bf16 storage (rounding a bf16 value
 * to bf16 is exact). */
typedef struct operand {
    const float *x;
    const uint16_t *x16;
    int ld, trans;
} operand;

/* trill_f32_to_bf16 on the bits, written without a branch so the packing loops vectorise. */
static inline uint32_t round_bits(uint32_t u) {
    const uint32_t nearest = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x40u;
    return (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : nearest;
}

/* n elements of o's storage from index `at` as bf16 (inlined: a constant n copies without a call). */
static inline __attribute__((always_inline)) void round_run(uint16_t *dst, const operand *o, size_t at, int n) {
    if (o->x16) {
        memcpy(dst, o->x16 + at, sizeof(uint16_t) * (size_t)n);
        return;
    }
    for (int l = 0; l < n; l++) {
        uint32_t u;
        memcpy(&u, o->x + at + l, sizeof u);
        dst[l] = (uint16_t)round_bits(u);
    }
}

/* Packs rows r0..r0+rows of an operand (op(B)'s output columns, or op(A)'s rows) × K k0..k0+kc as
 * slivers of `width` rows (NR for B, MR for A): per sliver and K pair, `width` words of (x[r, k]
 * low, x[r, k+1] high); zeros past the rows and K. Inlined with a constant width at both calls.
 * Where op(X)'s rows are contiguous (trans), a pair's two K rows are rounded `width` at a time and
 * interleaved; else each row's K run is rounded at once, then its pairs scattered down the sliver. */
static inline __attribute__((always_inline)) void pack_slivers(uint32_t *dst, const operand *o, int r0, int rows, int k0, int kc,
                                                               const int width) {
    const int pairs = (kc + 1) / 2;
    uint16_t lo[NR], hi[NR], run[KC + 1];
    for (int i0 = 0; i0 < rows; i0 += width, dst += (size_t)pairs * width) {
        const int n = rows - i0 < width ? rows - i0 : width;
        if (o->trans) {
            memset(lo, 0, sizeof lo); /* the lanes past n stay zero */
            memset(hi, 0, sizeof hi);
            for (int p = 0; p < pairs; p++) {
                const size_t at = (size_t)(k0 + 2 * p) * o->ld + r0 + i0;
                const int full = n == width, odd_end = 2 * p + 1 == kc;
                if (full) round_run(lo, o, at, width);
                else round_run(lo, o, at, n);
                if (odd_end) memset(hi, 0, sizeof hi);
                else if (full) round_run(hi, o, at + (size_t)o->ld, width);
                else round_run(hi, o, at + (size_t)o->ld, n);
                uint32_t *d = dst + (size_t)p * width;
                for (int l = 0; l < width; l++) d[l] = (uint32_t)lo[l] | (uint32_t)hi[l] << 16;
            }
        } else {
            for (int l = 0; l < width; l++) {
                uint32_t *d = dst + l;
                if (l >= n) {
                    for (int p = 0; p < pairs; p++) d[(size_t)p * width] = 0;
                    continue;
                }
                round_run(run, o, (size_t)(r0 + i0 + l) * o->ld + k0, kc);
                run[kc] = 0; /* an odd K's last pair */
                for (int p = 0; p < pairs; p++) d[(size_t)p * width] = (uint32_t)run[2 * p] | (uint32_t)run[2 * p + 1] << 16;
            }
        }
    }
}

static void pack_b(uint32_t *dst, const operand *o, int n0, int nc, int k0, int kc) { pack_slivers(dst, o, n0, nc, k0, kc, NR); }
static void pack_a(uint32_t *dst, const operand *o, int m0, int mc, int k0, int kc) { pack_slivers(dst, o, m0, mc, k0, kc, MR); }

/* How one tile's sums s[mr][nr] meet C: first chunk C = beta C + alpha s (C not read when beta
 * is 0, as BLAS), later chunks C += alpha s. */
typedef struct tile_out {
    float *c;
    int ldc, mr, nr, first;
    float alpha, beta;
} tile_out;

static inline float combine(const tile_out *t, float c, float s) {
    if (!t->first) return c + t->alpha * s;
    return t->beta == 0 ? t->alpha * s : t->beta * c + t->alpha * s;
}

static inline float bf16_lo(uint32_t v) { return trill_bf16_to_f32((uint16_t)(v & 0xffff)); }
static inline float bf16_hi(uint32_t v) { return trill_bf16_to_f32((uint16_t)(v >> 16)); }

/* The specification, lane by lane: the path of CPUs without AVX-512 BF16. */
static void tile_generic(const uint32_t *a, const uint32_t *b, int pairs, const tile_out *t) {
    float s[MR][NR];
    memset(s, 0, sizeof s);
    for (int p = 0; p < pairs; p++, a += MR, b += NR)
        for (int r = 0; r < MR; r++) {
            const float alo = bf16_lo(a[r]), ahi = bf16_hi(a[r]);
            for (int l = 0; l < NR; l++) {
                s[r][l] = fmaf(ahi, bf16_hi(b[l]), s[r][l]);
                s[r][l] = fmaf(alo, bf16_lo(b[l]), s[r][l]);
            }
        }
    for (int r = 0; r < t->mr; r++)
        for (int l = 0; l < t->nr; l++) {
            float *c = t->c + (size_t)r * t->ldc + l;
            *c = combine(t, *c, s[r][l]);
        }
}

#if BF16_X86
AVX512BF16 static void tile_avx512(const uint32_t *a, const uint32_t *b, int pairs, const tile_out *t) {
    __m512 s[MR][2];
    _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) s[r][0] = s[r][1] = _mm512_setzero_ps();
    for (int p = 0; p < pairs; p++, a += MR, b += NR) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
        _Pragma("GCC unroll 12") for (int r = 0; r < MR; r++) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r]);
            s[r][0] = _mm512_dpbf16_ps(s[r][0], av, b0);
            s[r][1] = _mm512_dpbf16_ps(s[r][1], av, b1);
        }
    }
    const __m512 alpha = _mm512_set1_ps(t->alpha), beta = _mm512_set1_ps(t->beta);
    for (int r = 0; r < t->mr; r++)
        for (int h = 0; h < 2; h++) {
            const int valid = t->nr - 16 * h;
            if (valid <= 0) break;
            const __mmask16 m = valid >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << valid) - 1);
            float *c = t->c + (size_t)r * t->ldc + 16 * h;
            __m512 v = _mm512_mul_ps(alpha, s[r][h]);
            if (!t->first) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, c), v);
            else if (t->beta != 0) v = _mm512_add_ps(_mm512_mul_ps(beta, _mm512_maskz_loadu_ps(m, c)), v);
            _mm512_mask_storeu_ps(c, m, v);
        }
}
#endif

/* Per-thread packing buffers (a B panel and an A block), kept from call to call. */
static trill_tls_slot pack_slot;
enum { PACK_B_WORDS = NC * KC / 2, PACK_A_WORDS = MC * KC / 2 }; /* NC, MC: whole NR, MR multiples */

int trill_kernels_gemm_bf16(int native, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) { /* C = beta C, as BLAS */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0 ? 0 : beta * C[(size_t)i * ldc + j];
        return 0;
    }
    uint32_t *bp = trill_tls_buffer(&pack_slot, sizeof(uint32_t) * (PACK_B_WORDS + PACK_A_WORDS));
    if (!bp) return -1;
    uint32_t *ap = bp + PACK_B_WORDS;
    /* op(B)[k, n] is B^T's (n, k): read B transposed relative to tb */
    const operand oa = { A, NULL, lda, ta != CblasNoTrans }, ob = { B, B16, ldb, tb == CblasNoTrans };
    void (*tile)(const uint32_t *, const uint32_t *, int, const tile_out *) = tile_generic;
#if BF16_X86
    if (native) tile = tile_avx512;
#else
    (void)native;
#endif
    for (int n0 = 0; n0 < N; n0 += NC) {
        const int nc = N - n0 < NC ? N - n0 : NC;
        for (int k0 = 0; k0 < K; k0 += KC) {
            const int kc = K - k0 < KC ? K - k0 : KC, pairs = (kc + 1) / 2;
            pack_b(bp, &ob, n0, nc, k0, kc);
            for (int m0 = 0; m0 < M; m0 += MC) {
                const int mc = M - m0 < MC ? M - m0 : MC;
                pack_a(ap, &oa, m0, mc, k0, kc);
                for (int j = 0; j < nc; j += NR)
                    for (int i = 0; i < mc; i += MR) {
                        const tile_out t = { .c = C + (size_t)(m0 + i) * ldc + n0 + j,
                                             .ldc = ldc,
                                             .mr = mc - i < MR ? mc - i : MR,
                                             .nr = nc - j < NR ? nc - j : NR,
                                             .first = k0 == 0,
                                             .alpha = alpha,
                                             .beta = beta };
                        tile(ap + (size_t)i * pairs, bp + (size_t)j * pairs, pairs, &t);
                    }
            }
        }
    }
    return 0;
}
