/* Numeric kernels on plain fp32 arrays (llm.c style): a `*_forward` and its `*_backward`
 * side by side, no model knowledge. The list and its documentation: trill/kernels_decl.h. */
#ifndef TRILL_KERNELS_H
#define TRILL_KERNELS_H

#include <stddef.h>

#define REAL_T float
#define KERNEL(name) name
#include "trill/kernels_decl.h"
#undef REAL_T
#undef KERNEL

#endif
