/* Rewards: built-in verifiers, an external reward process speaking JSON lines, and a reward
 * model (trill/reward_model.h). The controller combines them with weights. */
#ifndef TRILL_REWARD_H
#define TRILL_REWARD_H

#include <jansson.h>
#include <stdbool.h>

#include "trill/error.h"

/* ---- verifiers: 1.0 when the completion's answer matches the ground truth, else 0.0 ---- */

/* Exact match after trimming surrounding whitespace of both. */
double reward_exact(const char *completion, const char *truth);

/* The final answer of a text as a number: the GSM8K "#### N" marker if present, else the last
 * \boxed{...}, else the last number in the text. Commas between digit groups are ignored
 * ("1,000" = 1000), a leading '$' or trailing '%' or '.' is dropped, fractions "a/b" are
 * numbers. Returns false when the text has no number. */
bool reward_extract_number(const char *text, double *value);

/* Numeric answer: the completion's and the truth's numbers (reward_extract_number on both; the
 * truth may be a bare number or a full GSM8K answer) are equal within 1e-6 relative
 * ("0.5" = "1/2"). */
double reward_numeric(const char *completion, const char *truth);

/* The embedded demo's task (trill/demo.h): the completion up to its first newline or end must
 * be exactly the truth's digits. */
double reward_demo(const char *completion, const char *truth);

/* ---- external reward process ----
 * A child process started from a shell command line. For each sample trill writes one JSON line
 * {"prompt": ..., "completion": ..., "ground_truth": ...} to its stdin and reads one line back:
 * {"reward": number, "metrics": {"name": number, ...}?}. A reply that does not arrive within
 * the timeout, a crash (EOF) or a reply that is not such JSON counts as a failure: the process
 * is killed and restarted and the request retried; after max_failures consecutive failures the
 * call fails with a message naming the command, what went wrong and the child's last stderr
 * line. */
typedef struct reward_process reward_process;

trill_status reward_process_start(const char *command, double timeout_s, int max_failures, reward_process **out);
/* reward and *metrics (a JSON object owned by the caller, or NULL when the reply had none). */
trill_status reward_process_score(reward_process *p, const char *prompt, const char *completion, const char *truth,
                                  double *reward, json_t **metrics);
/* Closes stdin, waits briefly, then kills. */
void reward_process_free(reward_process *p);

#endif
