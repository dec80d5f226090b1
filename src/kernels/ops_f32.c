/* fp32 kernels: the instantiation everything in trill runs. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_internal.h"
#include "trill/kernels.h"

#define REAL float
#define KN(name) name
#define GEMM cblas_sgemm
#define EXPR expf
#define SQRTR sqrtf
#include "ops_impl.h"
