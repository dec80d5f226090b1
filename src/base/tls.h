/* Per-thread scratch buffers that are freed when their thread exits (threads of an async run's
 * executors come and go; plain _Thread_local pointers would leak there). Each user owns a slot:
 * a zero-initialised static trill_tls_slot of its own module, numbered on first use, so this
 * layer knows nothing of its users. */
#ifndef TRILL_BASE_TLS_H
#define TRILL_BASE_TLS_H

#include <stddef.h>
#include <stdint.h>

enum { TRILL_TLS_MAX_SLOTS = 16 };

typedef struct trill_tls_slot {
    _Atomic int id; /* 0: not numbered yet */
} trill_tls_slot;

/* The calling thread's buffer for `slot`, 64-byte aligned, at least `bytes` long (grown as
 * needed, contents not kept when it grows); NULL when out of memory (or out of slots). */
void *trill_tls_buffer(trill_tls_slot *slot, size_t bytes);

/* A buffer lent for exclusive use, e.g. a pass's activations kept alive from the forward to
 * the backward, while the thread goes on calling the kernels that use other slots. */
typedef struct trill_tls_lease {
    void *p;     /* at least the bytes asked for, 64-byte aligned; NULL: out of memory */
    void *owner; /* the lending thread's buffers, or NULL for an allocation of its own */
    int slot;
} trill_tls_lease;

/* Lends the calling thread's buffer for `slot` (grown to `bytes`; contents not kept), so the
 * memory of one step serves the next without being handed back to the kernel and faulted in
 * again. While it is lent (two passes alive at once in one thread), the lease is a fresh
 * allocation of its own instead. Return it with trill_tls_return before the thread exits. */
trill_tls_lease trill_tls_lend(trill_tls_slot *slot, size_t bytes);
/* Gives a lease back (the buffer stays with its thread for the next lend); frees one of its own. */
void trill_tls_return(trill_tls_lease *lease);

/* Frees the calling thread's buffers now (they are made again on next use): for a thread that
 * is done with big work but lives on, and for tests that must see the first allocations again.
 * Not while one of them is lent. */
void trill_tls_release(void);

#endif
