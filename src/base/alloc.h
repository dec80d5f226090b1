/* Every allocation of the library goes through these, as sqlite's go through sqlite3_malloc: they
 * behave as the libc functions they wrap (memory from them is released with free), and an
 * allocation failure can be injected for tests (trill_alloc_fail_after). jansson's allocations
 * join them while injection is armed. Callers check every result and return TRILL_ERR_NOMEM
 * with a message; nothing in the library aborts when memory runs out. */
#ifndef TRILL_BASE_ALLOC_H
#define TRILL_BASE_ALLOC_H

#include <stddef.h>

void *trill_malloc(size_t n);
void *trill_calloc(size_t n, size_t size);
void *trill_realloc(void *p, size_t n); /* on failure p stays valid */
void *trill_aligned_alloc(size_t align, size_t n);
char *trill_strdup(const char *s);

/* Testing only: from now on the first `n` allocations succeed and every later one fails, until
 * the next call; n < 0 disarms (the default). Returns how many allocations were made since the
 * previous call, so a test can learn how many a piece of work makes and then fail each one. */
long trill_alloc_fail_after(long n);

/* Testing only: how many allocations of at least `min_bytes` were made since the previous call
 * (counting only those at least as large as that call's min_bytes; 0 on the first call), so a
 * test can see that the large buffers of a step are made on the first step and then reused. */
long trill_alloc_large(size_t min_bytes);

#endif
