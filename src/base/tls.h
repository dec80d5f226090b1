/* Per-thread scratch buffers that are freed when their thread exits (threads of an async run's
 * executors come and go; plain _Thread_local pointers would leak there). Each user owns a slot:
 * a zero-initialised static trill_tls_slot of its own module, numbered on first use, so this
 * layer knows nothing of its users. */
#ifndef TRILL_BASE_TLS_H
#define TRILL_BASE_TLS_H

#include <stddef.h>

enum { TRILL_TLS_MAX_SLOTS = 8 };

typedef struct trill_tls_slot {
    _Atomic int id; /* 0: not numbered yet */
} trill_tls_slot;

/* The calling thread's buffer for `slot`, 64-byte aligned, at least `bytes` long (grown as
 * needed, contents not kept when it grows); NULL when out of memory (or out of slots). */
void *trill_tls_buffer(trill_tls_slot *slot, size_t bytes);

/* Frees the calling thread's buffers now (they are made again on next use): for a thread that
 * is done with big work but lives on, and for tests that must see the first allocations again. */
void trill_tls_release(void);

#endif
