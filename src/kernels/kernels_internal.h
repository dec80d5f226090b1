/* Shared by the kernel instantiations. */
#ifndef TRILL_KERNELS_INTERNAL_H
#define TRILL_KERNELS_INTERNAL_H

#include <cblas.h>

/* Makes OpenBLAS single-threaded once per process (OpenMP owns the cores). */
void trill_kernels_blas_init(void);

/* fp32 C = alpha op(A) op(B) + beta C with the work split across OpenMP threads (ops_impl.h). */
void trill_kernels_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc);

#endif
