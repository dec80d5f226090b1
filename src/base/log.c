#include "trill/log.h"
#include "base/alloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static trill_log_fn sink;
static void *sink_ctx;

void trill_log_set_sink(trill_log_fn fn, void *ctx) {
    sink = fn;
    sink_ctx = ctx;
}

void trill_log(trill_log_level level, const char *fmt, ...) {
    if (!sink) return;
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        sink(sink_ctx, level, small);
        return;
    }
    char *big = trill_malloc((size_t)n + 1); /* a long line: formatted again at its length */
    if (!big) {
        sink(sink_ctx, level, small); /* out of memory: the line truncated rather than lost */
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sink(sink_ctx, level, big);
    free(big);
}

void trill_log_stderr(void *ctx, trill_log_level level, const char *line) {
    (void)ctx;
    (void)level;
    fprintf(stderr, "%s\n", line);
}
