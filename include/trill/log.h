/* The library's diagnostics (progress lines, warnings) go through one sink: the trill command
 * installs one writing to stderr (trill_log_stderr); an embedder installs its own, or none
 * (the default: the library prints nothing). Errors are not logged: they are returned, with
 * the message in trill_error_message (trill/error.h). */
#ifndef TRILL_LOG_H
#define TRILL_LOG_H

typedef enum trill_log_level { TRILL_LOG_INFO, TRILL_LOG_WARN } trill_log_level;

/* Receives one line (no trailing newline). May be called from any of the library's threads
 * (async executors), one call per line: a sink that is not thread-safe must lock. */
typedef void (*trill_log_fn)(void *ctx, trill_log_level level, const char *line);

/* Installs the sink (NULL: discard everything). Set it before starting work. */
void trill_log_set_sink(trill_log_fn fn, void *ctx);

/* Formats one line and hands it to the sink. */
void trill_log(trill_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A sink writing each line to stderr in one call. */
void trill_log_stderr(void *ctx, trill_log_level level, const char *line);

#endif
