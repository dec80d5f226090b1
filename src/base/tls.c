#include "base/tls.h"
#include "base/alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct tls_buffers {
    void *p[TRILL_TLS_MAX_SLOTS];
    size_t cap[TRILL_TLS_MAX_SLOTS];
    _Atomic int lent[TRILL_TLS_MAX_SLOTS]; /* trill_tls_lend: in use until returned (maybe by another thread) */
} tls_buffers;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static _Thread_local tls_buffers *t_buffers; /* fast path; the key owns it */

static void free_buffers(void *arg) {
    tls_buffers *b = arg;
    for (int i = 0; i < TRILL_TLS_MAX_SLOTS; i++) free(b->p[i]);
    free(b);
}

static void make_key(void) { pthread_key_create(&g_key, free_buffers); }

static _Atomic int g_slots; /* slots numbered so far */

/* The slot's index, numbering it on first use (two threads racing agree on the first CAS). */
static int slot_index(trill_tls_slot *s) {
    int id = atomic_load(&s->id);
    if (id == 0) {
        int mine = atomic_fetch_add(&g_slots, 1) + 1, expected = 0;
        id = atomic_compare_exchange_strong(&s->id, &expected, mine) ? mine : expected;
    }
    return id - 1;
}

/* The calling thread's buffers, made on first use; NULL when out of memory. */
static tls_buffers *thread_buffers(void) {
    if (!t_buffers) {
        pthread_once(&g_once, make_key);
        tls_buffers *b = trill_calloc(1, sizeof *b);
        if (!b) return NULL;
        if (pthread_setspecific(g_key, b)) { free(b); return NULL; }
        t_buffers = b;
    }
    return t_buffers;
}

/* b's buffer for slot, grown to bytes. */
static void *grow(tls_buffers *b, int slot, size_t bytes) {
    if (bytes > b->cap[slot]) {
        free(b->p[slot]);
        b->p[slot] = trill_aligned_alloc(64, (bytes + 63) & ~(size_t)63);
        b->cap[slot] = b->p[slot] ? bytes : 0;
    }
    return b->p[slot];
}

void *trill_tls_buffer(trill_tls_slot *s, size_t bytes) {
    const int slot = slot_index(s);
    tls_buffers *b = slot < TRILL_TLS_MAX_SLOTS ? thread_buffers() : NULL;
    return b ? grow(b, slot, bytes) : NULL;
}

trill_tls_lease trill_tls_lend(trill_tls_slot *s, size_t bytes) {
    const int slot = slot_index(s);
    if (bytes == 0) bytes = 1;
    tls_buffers *b = slot < TRILL_TLS_MAX_SLOTS ? thread_buffers() : NULL;
    if (b && !atomic_load(&b->lent[slot])) {
        void *p = grow(b, slot, bytes);
        if (p) atomic_store(&b->lent[slot], 1);
        return (trill_tls_lease){ .p = p, .owner = p ? b : NULL, .slot = slot };
    }
    return (trill_tls_lease){ .p = trill_aligned_alloc(64, (bytes + 63) & ~(size_t)63), .owner = NULL, .slot = slot };
}

void trill_tls_return(trill_tls_lease *l) {
    if (l->owner) atomic_store(&((tls_buffers *)l->owner)->lent[l->slot], 0);
    else free(l->p);
    *l = (trill_tls_lease){ 0 };
}

void trill_tls_release(void) {
    tls_buffers *b = t_buffers;
    if (!b) return;
    pthread_setspecific(g_key, NULL);
    t_buffers = NULL;
    free_buffers(b);
}
