#include <math.h>
#include <pthread.h>

#include "kernels_internal.h"
#include "trill/kernels.h"

/* OpenBLAS here is the pthreads build: its threads and OpenMP's would fight over the same
 * cores. trill keeps one thread pool, OpenMP's, and runs single-threaded BLAS inside it. */
void openblas_set_num_threads(int n);
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void) { openblas_set_num_threads(1); }

void trill_kernels_blas_init(void) { pthread_once(&g_blas_once, blas_single_threaded); }

/* 0.1 * mscale * log(factor) + 1.0 rounded step by step as Python does: the product is kept
 * from being fused into the sum (-ffp-contract=fast would make it one fma). */
double trill_rope_yarn_mscale(double factor, double mscale) {
    if (factor <= 1) return 1.0;
    volatile double product = 0.1 * mscale * log(factor);
    return product + 1.0;
}
