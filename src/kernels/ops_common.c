#include <pthread.h>

#include "kernels_internal.h"

/* OpenBLAS here is the pthreads build: its threads and OpenMP's would fight over the same
 * cores. trill keeps one thread pool, OpenMP's, and runs single-threaded BLAS inside it. */
void openblas_set_num_threads(int n);
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void) { openblas_set_num_threads(1); }

void kernels_blas_init(void) { pthread_once(&g_blas_once, blas_single_threaded); }
