/* The fp64 instantiation of every kernel (name_f64), for gradient checks. */
#ifndef TRILL_KERNELS_F64_H
#define TRILL_KERNELS_F64_H

#include <stddef.h>

#include "trill/dtype.h"
#include "trill/error.h"

#define REAL_T double
#define KERNEL(name) name##_f64
#include "trill/kernels_decl.h"
#undef REAL_T
#undef KERNEL

#endif
