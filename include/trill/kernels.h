/* Numeric kernels on plain fp32 arrays (llm.c style): a `*_forward` and its `*_backward`
 * side by side, no model knowledge. The list and its documentation: trill/kernels_decl.h. */
#ifndef TRILL_KERNELS_H
#define TRILL_KERNELS_H

#include <stddef.h>

#include "trill/dtype.h"
#include "trill/error.h"
#include "trill/weight.h"

#define REAL_T float
#define KERNEL(name) name
#include "trill/kernels_decl.h"
#undef REAL_T
#undef KERNEL

/* YaRN's magnitude correction (HF get_mscale / DeepSeek yarn_get_mscale): 1 for factor <= 1,
 * else 0.1 mscale ln(factor) + 1, in double as Python computes it. DeepSeek-V3 multiplies its
 * softmax scale by trill_rope_yarn_mscale(factor, mscale_all_dim)^2. */
double trill_rope_yarn_mscale(double factor, double mscale);

/* ---- the same on a stored weight (trill/weight.h): fp32 as above, bf16 widened a panel of
 * rows at a time into a per-thread fp32 buffer (at most WEIGHT_PANEL floats). fp32 never fails;
 * bf16 is TRILL_ERR_NOMEM (with the message set, the output incomplete) when the calling
 * thread's panel buffer cannot be had ---- */

/* out[T,N] = inp[T,K] @ W[N,K]^T */
trill_status trill_matmul_forward_w(float *out, const float *inp, trill_weight W, int T, int K, int N);
/* dinp[T,K] += dout @ W (either storage); dweight[N,K] += dout^T @ inp, fp32 storage only
 * (a bf16 weight is frozen: pass dweight NULL, or the process aborts, a programmer's error). */
trill_status trill_matmul_backward_w(float *dinp, float *dweight, const float *dout, const float *inp, trill_weight W, int T, int K,
                               int N);
/* The same two in a chosen precision (trill_precision): bf16 multiplies a bf16 weight as it is
 * stored, without widening it. */
trill_status trill_matmul_forward_wp(float *out, const float *inp, trill_weight W, int T, int K, int N, trill_precision prec);
trill_status trill_matmul_backward_wp(float *dinp, float *dweight, const float *dout, const float *inp, trill_weight W, int T, int K,
                                      int N, trill_precision prec);
/* The OPENBLAS_CORETYPE this process should have been started with: when the variable is unset
 * and OpenBLAS fell back to kernels older than AVX on a CPU with AVX or better (its detection
 * does not know every model: Debian 12's 0.3.21 takes Emerald Rapids for a Prescott), the core
 * whose kernels this CPU runs (Cooperlake, SkylakeX, Haswell, Sandybridge); else NULL. OpenBLAS
 * reads the variable once, when it loads, so the trill command restarts itself with it
 * (trill_blas_restart); a program embedding trill gets a warning on its first matmul instead. */
const char *trill_blas_core_fix(void);
/* When trill_blas_core_fix() names a core: sets OPENBLAS_CORETYPE to it and executes this
 * program again with argv (Linux: /proc/self/exe), so it never returns then; else, or when the
 * exec fails, it returns and the process goes on as it is. Call it first thing in main. */
void trill_blas_restart(char **argv);
/* 1 when this CPU has AVX-512 BF16, so bf16 precision runs on vdpbf16ps (else on the generic path). */
int trill_kernels_bf16_native(void);
/* What TRILL_PRECISION_AUTO means on this CPU: bf16 where it has AVX-512 BF16 (there trill's bf16
 * GEMM outruns OpenBLAS's sgemm: `trill bench train` prints both), fp32 elsewhere (the generic bf16
 * path is slower than sgemm). */
trill_precision trill_kernels_precision_auto(void);
/* out[T,C] = table[tokens[t]] */
void trill_embedding_forward_w(float *out, trill_weight table, const int *tokens, int T, int C);
/* dst[n] = src widened (exact) */
void trill_bf16_widen(float *dst, const uint16_t *src, size_t n);

#endif
