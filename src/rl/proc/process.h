/* A supervised child process that answers request lines with reply lines (JSON lines): the
 * external reward process and the environment process are each one, with their own protocol
 * and retry policy on top.
 *
 * The child is started as `/bin/sh -c COMMAND`, in its own process group, with only stdin,
 * stdout and stderr open (trill's descriptors are close-on-exec). stderr is drained while
 * waiting (so the child never blocks on it) and its last non-blank line kept. An exchange fails
 * when no reply line comes within the timeout (the whole exchange, writing included), at the end
 * of stdout (a crash or exit: its status or signal is described), on a reply line longer than 16
 * MiB, or on output that came before the request (more replies than requests); the process group
 * is then killed (SIGKILL) and the child reaped, and the caller may start it again. Writing to a
 * dead child never raises SIGPIPE in trill (it is blocked in the writing thread for the write,
 * not ignored process-wide). No zombies are left. One caller at a time per process. */
#ifndef TRILL_RL_PROCESS_H
#define TRILL_RL_PROCESS_H

#include <stdbool.h>
#include <stddef.h>

#include "trill/error.h"

typedef struct rl_process rl_process;

/* Starts it. `what` names it in messages ("reward process"). Refuses an empty command or a
 * timeout that is not positive (TRILL_ERR_INVALID); TRILL_ERR_IO when /bin/sh cannot be started.
 * A command that is not found shows up at the first exchange (the shell exits with status 127). */
trill_status trill_rl_process_start(const char *what, const char *command, double timeout_s, rl_process **out);
/* Closes stdin, waits up to half a second for the process to exit, then kills its process group;
 * reaps it. NULL is a no-op. */
void trill_rl_process_free(rl_process *p);

/* Whether the child runs (a failed exchange stopped it); trill_rl_process_spawn starts a fresh one. */
bool trill_rl_process_running(const rl_process *p);
trill_status trill_rl_process_spawn(rl_process *p);
/* Kills the child now (a reply the caller refuses). */
void trill_rl_process_kill(rl_process *p);

/* Writes request[0, len) (one line, '\n' included) and reads the reply line (blank lines
 * skipped): true with the line at *line (NUL-terminated, valid until trill_rl_process_consume),
 * false with `why` set and the child stopped. */
bool trill_rl_process_exchange(rl_process *p, const char *request, size_t len, const char **line, size_t *line_len, char *why,
                               size_t cap);
/* The reply line of the last exchange is used up. */
void trill_rl_process_consume(rl_process *p, size_t line_len);

const char *trill_rl_process_command(const rl_process *p);
/* The child's last non-blank stderr line ("" when none). */
const char *trill_rl_process_stderr(rl_process *p);
/* The start of a reply for messages: at most 80 bytes, control characters as '?'. */
void trill_rl_process_excerpt(const char *s, size_t n, char out[96]);

#endif
