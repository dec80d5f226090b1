/* A growable string (strbuf.h). */
#include "base/strbuf.h"

#include "base/alloc.h"

void trill_strbuf_put(trill_strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *g = trill_realloc(b->s, cap);
        if (!g) { b->oom = true; return; }
        b->s = g;
        b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}
