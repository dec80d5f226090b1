/* A growable NUL-terminated string. Its first failed allocation sticks (oom): later appends do
 * nothing, so a run of appends is checked once, at the end. */
#ifndef TRILL_STRBUF_H
#define TRILL_STRBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef struct trill_strbuf { char *s; size_t n, cap; bool oom; } trill_strbuf;

/* Appends s[0..n); b->s stays NUL-terminated (an append of nothing makes "" of an empty buffer). */
void trill_strbuf_put(trill_strbuf *b, const char *s, size_t n);

static inline void trill_strbuf_puts(trill_strbuf *b, const char *s) { trill_strbuf_put(b, s, strlen(s)); }

#endif
