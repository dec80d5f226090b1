#include "base/alloc.h"

#include <errno.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static _Atomic long g_count; /* allocations since the last trill_alloc_fail_after */
static _Atomic long g_limit = -1;
static _Atomic size_t g_large_min = SIZE_MAX; /* trill_alloc_large's threshold: none until called */
static _Atomic long g_large;

static inline void count_large(size_t n) {
    if (n >= atomic_load_explicit(&g_large_min, memory_order_relaxed)) atomic_fetch_add_explicit(&g_large, 1, memory_order_relaxed);
}

/* true when this allocation is to fail (injection armed and past its limit); errno is then
 * ENOMEM, as libc's allocators leave it, so code that reads errno after a failure (jansson's
 * callers, base/json.c) sees an injected failure as a real one */
static inline int injected(void) {
    const long n = atomic_fetch_add_explicit(&g_count, 1, memory_order_relaxed);
    const long limit = atomic_load_explicit(&g_limit, memory_order_relaxed);
    if (limit < 0 || n < limit) return 0;
    errno = ENOMEM;
    return 1;
}

void *trill_malloc(size_t n) { count_large(n); return injected() ? NULL : malloc(n); }
void *trill_calloc(size_t n, size_t size) { count_large(n * size); return injected() ? NULL : calloc(n, size); }
void *trill_realloc(void *p, size_t n) { count_large(n); return injected() ? NULL : realloc(p, n); }
void *trill_aligned_alloc(size_t align, size_t n) { count_large(n); return injected() ? NULL : aligned_alloc(align, n); }

char *trill_strdup(const char *s) {
    const size_t n = strlen(s) + 1;
    char *p = trill_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

long trill_alloc_large(size_t min_bytes) {
    atomic_store(&g_large_min, min_bytes);
    return atomic_exchange(&g_large, 0);
}

static void *json_malloc(size_t n) { return trill_malloc(n); }

long trill_alloc_fail_after(long n) {
    const long made = atomic_exchange(&g_count, 0);
    atomic_store(&g_limit, n);
    /* jansson's allocations fail alike while armed; back to libc's when disarmed */
    if (n >= 0) json_set_alloc_funcs(json_malloc, free);
    else json_set_alloc_funcs(malloc, free);
    return made;
}
