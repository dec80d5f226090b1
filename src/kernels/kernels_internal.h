/* Shared by the kernel instantiations. */
#ifndef TRILL_KERNELS_INTERNAL_H
#define TRILL_KERNELS_INTERNAL_H

/* Makes OpenBLAS single-threaded once per process (OpenMP owns the cores). */
void kernels_blas_init(void);

#endif
