/* Rewards: built-in verifiers, an external reward process speaking JSON lines, and a reward
 * model (trill/reward_model.h). The controller combines them with weights. */
#ifndef TRILL_REWARD_H
#define TRILL_REWARD_H

#include <jansson.h>
#include <stdbool.h>

#include "trill/error.h"

/* ---- verifiers: 1.0 when the completion's answer matches the ground truth, else 0.0 ----
 * Pure functions of their strings (thread-safe); a NULL string scores 0. */

/* Exact match after trimming surrounding whitespace of both. */
double reward_exact(const char *completion, const char *truth);

/* The final answer of a text as a number, found by the first rule that applies:
 *   1. the number right after the last "####" that is followed by one (spaces, "$" or "\$" may
 *      come between), so a markdown heading "#### Step 2" is no marker;
 *   2. the content of the last complete \boxed{...} (balanced braces): its last number, or no
 *      number at all when it holds none (\boxed{x});
 *   3. the last number in the text.
 * A number is an optional sign ('-', '+' or U+2212, only where not preceded by a letter or
 * digit: "3-4" is 3 and 4; "$" or "\$" may follow the sign) and then:
 *   - digits, where ",", "{,}" or "\," separate thousands only between groups of exactly three
 *     digits after a first group of one to three ("12,345,678" = 12345678; the list "1,2,3" is
 *     three numbers), then an optional ".digits"; or ".digits" (".5");
 *   - an exponent "e5", "E-3" (not when a letter follows: "3eggs" is 3);
 *   - "a/b" with b != 0 is the number a/b ("3/4" = 0.75; "12/25/2023" ends with 2023);
 *   - \frac{a}{b}, \dfrac{a}{b}, \tfrac{a}{b} with decimal a and b.
 * Everything else is skipped: a leading "$", a trailing "%" (50% is 50) or sentence-ending '.',
 * "\text{...}" beside the number. Words ("seven") and numbers too large for a double are no
 * numbers; a mixed number "1 1/2" reads as 1 and then 1/2. Returns false when the text has
 * none (*value untouched). Linear in the text's length; any bytes are safe. */
bool reward_extract_number(const char *text, double *value);

/* Numeric answer: the completion's and the truth's numbers (reward_extract_number on both; the
 * truth may be a bare number or a full GSM8K answer) are equal within 1e-6 relative or 1e-9
 * absolute ("0.5" = "1/2", "1,000" = "1000"). 0 when either has no number. */
double reward_numeric(const char *completion, const char *truth);

/* The embedded demo's task (trill/demo.h): the completion up to its first newline or end must
 * be exactly the truth (trimmed of surrounding whitespace; an empty truth matches nothing). */
double reward_demo(const char *completion, const char *truth);

/* ---- external reward process ----
 * A child process started as `/bin/sh -c COMMAND`, in its own process group, with only stdin,
 * stdout and stderr open (trill's descriptors are close-on-exec). For each sample trill writes
 * one line of compact JSON {"prompt": ..., "completion": ..., "ground_truth": ...} (invalid
 * UTF-8 replaced by U+FFFD) to its stdin and reads one line back (blank lines skipped):
 * {"reward": finite number, "metrics": {"name": number, ...}?}, other keys ignored. stderr is
 * drained while waiting (so the child never blocks on it) and its last non-blank line kept.
 * A failure is: no reply line within the timeout (the whole exchange, writing included), end
 * of stdout (a crash or exit: its status or signal is reported), or a reply that is not such
 * JSON. On a failure the process group is killed (SIGKILL), the child reaped, a fresh process
 * started and the request retried; after max_failures consecutive failures of one request the
 * call fails (TRILL_ERR_INVALID) with a message naming the command, the last failure and the
 * child's last stderr line, and the next call starts afresh. Writing to a dead child never
 * raises SIGPIPE in trill (it is blocked in the writing thread for the write, not ignored
 * process-wide). No zombies are left. One caller at a time per reward_process.
 * examples/rewards/README.md documents the protocol for script authors. */
typedef struct reward_process reward_process;

/* Starts the process. Refuses an empty command, a timeout that is not positive, or
 * max_failures < 1 (TRILL_ERR_INVALID); TRILL_ERR_IO when /bin/sh cannot be started. A command
 * that is not found shows up at the first request (the shell exits with status 127). */
trill_status reward_process_start(const char *command, double timeout_s, int max_failures, reward_process **out);
/* reward and *metrics (a JSON object owned by the caller, or NULL when the reply had none;
 * metrics may be NULL). Strings may be any length; NULL is sent as "". On failure *reward is
 * untouched and *metrics NULL. */
trill_status reward_process_score(reward_process *p, const char *prompt, const char *completion, const char *truth,
                                  double *reward, json_t **metrics);
/* Closes stdin, waits up to half a second for the process to exit, then kills its process
 * group; reaps it. NULL is a no-op. */
void reward_process_free(reward_process *p);

#endif
