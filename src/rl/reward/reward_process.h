/* The external reward process (rl's own: the controller drives it). */
#ifndef TRILL_RL_REWARD_PROCESS_H
#define TRILL_RL_REWARD_PROCESS_H

#include <jansson.h>

#include "trill/error.h"

/* ---- external reward process ----
 * A supervised child process (rl/proc/process.h: started, drained, timed out, killed and reaped
 * there). For each sample trill writes one line of compact JSON {"prompt": ..., "completion":
 * ..., "ground_truth": ...} (invalid UTF-8 replaced by U+FFFD) and reads one line back:
 * {"reward": finite number, "metrics": {"name": number, ...}?}, other keys ignored. A failed
 * exchange or a reply that is not such JSON kills the process; a fresh one is started and the
 * request retried; after max_failures consecutive failures of one request the call fails
 * (TRILL_ERR_INVALID) with a message naming the command, the last failure and the child's last
 * stderr line, and the next call starts afresh. One caller at a time per reward_process.
 * examples/rewards/README.md documents the protocol for script authors. */
typedef struct reward_process reward_process;

/* Starts the process. Refuses an empty command, a timeout that is not positive, or
 * max_failures < 1 (TRILL_ERR_INVALID); TRILL_ERR_IO when /bin/sh cannot be started. A command
 * that is not found shows up at the first request (the shell exits with status 127). */
trill_status trill_reward_process_start(const char *command, double timeout_s, int max_failures, reward_process **out);
/* reward and *metrics (a JSON object owned by the caller, or NULL when the reply had none;
 * metrics may be NULL). Strings may be any length; NULL is sent as "". On failure *reward is
 * untouched and *metrics NULL. */
trill_status trill_reward_process_score(reward_process *p, const char *prompt, const char *completion, const char *truth,
                                  double *reward, json_t **metrics);
/* Closes stdin, waits up to half a second for the process to exit, then kills its process
 * group; reaps it. NULL is a no-op. */
void trill_reward_process_free(reward_process *p);

#endif
