#include "trill/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_message[2048];

trill_status trill_error(trill_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_message, sizeof g_message, fmt, ap);
    va_end(ap);
    return code;
}

void trill_error_context(const char *fmt, ...) {
    char prefix[1024], old[sizeof g_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_message, sizeof old);
    /* "prefix: old", truncated at the end when too long */
    size_t n = strlen(prefix);
    memcpy(g_message, prefix, n);
    memcpy(g_message + n, ": ", 2);
    size_t room = sizeof g_message - n - 3, m = strnlen(old, room);
    memcpy(g_message + n + 2, old, m);
    g_message[n + 2 + m] = '\0';
}

const char *trill_error_message(void) { return g_message; }

const char *trill_status_name(trill_status code) {
    switch (code) {
    case TRILL_OK: return "ok";
    case TRILL_ERR_INVALID: return "invalid input";
    case TRILL_ERR_UNSUPPORTED: return "unsupported";
    case TRILL_ERR_IO: return "i/o error";
    case TRILL_ERR_NOMEM: return "out of memory";
    case TRILL_ERR_INTERRUPTED: return "interrupted";
    }
    return "unknown error";
}
