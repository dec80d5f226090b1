/* Shared by the kernel instantiations. */
#ifndef TRILL_KERNELS_INTERNAL_H
#define TRILL_KERNELS_INTERNAL_H

#include <cblas.h>

/* Makes OpenBLAS single-threaded once per process (OpenMP owns the cores). */
void trill_kernels_blas_init(void);

#include <stdint.h>

#include "trill/kernels.h"

/* C = alpha op(A) op(B) + beta C in precision prec with the work split across OpenMP threads
 * (ops_impl.h); B16, if not NULL, is B stored as bf16 (then B is NULL; fp32 requires B).
 * TRILL_ERR_NOMEM only from bf16's packing buffers. */
trill_status trill_kernels_gemm(trill_precision prec, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                                const float *A, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C, int ldc);

/* The bf16 GEMM on one thread (gemm_bf16.c), natively (vdpbf16ps; requires
 * trill_kernels_bf16_native()) or on the generic path: 0, or -1 when the calling thread's
 * packing buffers cannot be had. B or B16 as above. */
int trill_kernels_gemm_bf16(int native, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C, int ldc);

#endif
