/* Per-thread scratch buffers that are freed when their thread exits (threads of an async run's
 * executors come and go; plain _Thread_local pointers would leak there). */
#ifndef TRILL_BASE_TLS_H
#define TRILL_BASE_TLS_H

#include <stddef.h>

typedef enum trill_tls_slot {
    TRILL_TLS_GEN_SCRATCH,   /* the generator's activation scratch (infer/gemm.c) */
    TRILL_TLS_WEIGHT_PANEL,  /* widened bf16 weight panels (kernels/weight.c) */
    TRILL_TLS_N_SLOTS
} trill_tls_slot;

/* The calling thread's buffer for `slot`, 64-byte aligned, at least `bytes` long (grown as
 * needed, contents not kept when it grows); NULL when out of memory. */
void *trill_tls_buffer(trill_tls_slot slot, size_t bytes);

#endif
