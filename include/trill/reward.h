/* Rewards: built-in verifiers, an external reward process speaking JSON lines, and a reward
 * model (trill/reward_model.h). The controller combines them with weights. */
#ifndef TRILL_REWARD_H
#define TRILL_REWARD_H

#include <stdbool.h>

#include "trill/error.h"

/* ---- verifiers: 1.0 when the completion's answer matches the ground truth, else 0.0 ----
 * Pure functions of their strings (thread-safe); a NULL string scores 0. */

/* Exact match after trimming surrounding whitespace of both. */
double trill_reward_exact(const char *completion, const char *truth);

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
bool trill_reward_extract_number(const char *text, double *value);

/* Numeric answer: the completion's and the truth's numbers (trill_reward_extract_number on both; the
 * truth may be a bare number or a full GSM8K answer) are equal within 1e-6 relative or 1e-9
 * absolute ("0.5" = "1/2", "1,000" = "1000"). 0 when either has no number. */
double trill_reward_numeric(const char *completion, const char *truth);

/* The embedded demo's task (trill/demo.h): the completion up to its first newline or end must
 * be exactly the truth (trimmed of surrounding whitespace; an empty truth matches nothing). */
double trill_reward_demo(const char *completion, const char *truth);

#endif
