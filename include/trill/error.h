/* Status codes and the per-thread error message.
 *
 * Every function that can fail on the user's input returns a trill_status and
 * leaves a message naming the file, the field and what was expected. Callers
 * add context with trill_error_context() as the error travels up. */
#ifndef TRILL_ERROR_H
#define TRILL_ERROR_H

typedef enum trill_status {
    TRILL_OK = 0,
    TRILL_ERR_INVALID,     /* malformed or inconsistent input */
    TRILL_ERR_UNSUPPORTED, /* well-formed but not something trill computes */
    TRILL_ERR_IO,          /* the operating system refused (open, read, write, mmap) */
    TRILL_ERR_NOMEM,
    TRILL_ERR_INTERRUPTED, /* stopped on request (a signal): what was done is saved */
} trill_status;

/* Sets the message (printf-style) and returns `code`, so `return trill_error(...)` reads well. */
trill_status trill_error(trill_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepends "context: " to the current message. */
void trill_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The last message set on this thread ("" if none). */
const char *trill_error_message(void);

const char *trill_status_name(trill_status code);

#endif
