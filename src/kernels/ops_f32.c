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
#define TRSM cblas_strsm
#define EXPR expf
/* the bf16 GEMM: on vdpbf16ps where the CPU has it */
#define GEMM_BF16(...) trill_kernels_gemm_bf16(trill_kernels_bf16_native(), __VA_ARGS__)
#include "ops_impl.h"

trill_status trill_kernels_gemm(trill_precision prec, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
                                const float *A, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C, int ldc) {
    return gemm(prec, ta, tb, M, N, K, alpha, A, lda, B, B16, ldb, beta, C, ldc);
}
