/* fp32 kernels: the instantiation everything in trill runs. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/tls.h"
#include "exp_nonpos.h"
#include "kernels_internal.h"
#include "trill/kernels.h"

#define REAL float
#define KN(name) name
#define GEMM cblas_sgemm
#define EXPR expf
#include "ops_impl.h"

void trill_kernels_sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *B, int ldb, float beta, float *C, int ldc) {
    gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
