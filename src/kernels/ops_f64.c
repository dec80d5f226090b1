/* fp64 kernels: the same code as ops_f32.c in double precision, for gradient checks. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_f64.h"
#include "trill/kernels.h" /* trill_rope_yarn_mscale */
#include "base/alloc.h"
#include "base/tls.h"
#include "exp_nonpos.h"
#include "kernels_internal.h"

#define REAL double
#define KN(name) name##_f64
#define GEMM cblas_dgemm
#define TRSM cblas_dtrsm
#define EXPR exp
#include "ops_impl.h"
