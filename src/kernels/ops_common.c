#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels_internal.h"
#include "trill/kernels.h"
#include "trill/log.h"

/* OpenBLAS here is the pthreads build: its threads and OpenMP's would fight over the same
 * cores. trill keeps one thread pool, OpenMP's, and runs single-threaded BLAS inside it. */
void openblas_set_num_threads(int n);
char *openblas_get_corename(void);

/* OpenBLAS's kernels for CPUs older than AVX: what its runtime detection falls back to on an
 * Intel model it does not know (0.3.21, Debian 12's, on Emerald Rapids: "Prescott"; fixed in
 * 0.3.25, OpenBLAS pull request 4268), with an sgemm about 6x slower than this CPU's. */
static int pre_avx_core(const char *name) {
    static const char *const OLD[] = { "Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai", "Coppermine",
                                       "Northwood", "Banias", "Athlon", "Opteron", "Opteron(SSE3)", "Barcelona", "Nano", NULL };
    for (int i = 0; name && OLD[i]; i++)
        if (!strcmp(name, OLD[i])) return 1;
    return 0;
}

const char *trill_blas_core_fix(void) {
    const char *set = getenv("OPENBLAS_CORETYPE");
    if ((set && *set) || !pre_avx_core(openblas_get_corename())) return NULL;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512bf16")) return "Cooperlake";
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
    if (__builtin_cpu_supports("avx")) return "Sandybridge";
#endif
    return NULL;
}

void trill_blas_restart(char **argv) {
    const char *core = trill_blas_core_fix();
    if (core && !setenv("OPENBLAS_CORETYPE", core, 1)) execv("/proc/self/exe", argv);
}

static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static void blas_single_threaded(void) {
    openblas_set_num_threads(1);
    const char *fix = trill_blas_core_fix();
    if (fix)
        trill_log(TRILL_LOG_WARN,
                  "OpenBLAS did not recognise this CPU and runs its %s kernels (fp32 matmuls several times slower); start the "
                  "process with OPENBLAS_CORETYPE=%s (the trill command does that itself)",
                  openblas_get_corename(), fix);
}

void trill_kernels_blas_init(void) { pthread_once(&g_blas_once, blas_single_threaded); }

/* 0.1 * mscale * log(factor) + 1.0 rounded step by step as Python does: the product is kept
 * from being fused into the sum (-ffp-contract=fast would make it one fma). */
double trill_rope_yarn_mscale(double factor, double mscale) {
    if (factor <= 1) return 1.0;
    volatile double product = 0.1 * mscale * log(factor);
    return product + 1.0;
}
