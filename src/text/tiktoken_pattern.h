/* Split patterns written for other regex engines: a tiktoken vocabulary's, read from the model
 * folder's Python tokenizer (Kimi-K2's tokenization_kimi.py assigns `pat_str`), and any
 * pattern's escapes and character-class intersections, which PCRE2 does not read as Oniguruma
 * (Hugging Face tokenizers) or Rust's regex crate (tiktoken) do, translated exactly. */
#ifndef TRILL_MODEL_TIKTOKEN_PATTERN_H
#define TRILL_MODEL_TIKTOKEN_PATTERN_H

#include "trill/error.h"

/* The pattern a Python source assigns to pat_str (or PAT_STR): a string literal (r"...",
 * r"""...""", "..." with \\ and \" escapes), or "|".join([...]) of such literals; *out
 * malloc'ed. `what` names the file in messages. */
trill_status trill_tiktoken_pattern_from_python(const char *src, const char *what, char **out);

/* The regex engine a pattern was written for: Oniguruma (Hugging Face tokenizers' Split and
 * Replace regexes, and ByteLevel's) or Rust's regex crate (tiktoken's fancy-regex). */
typedef enum { TRILL_REGEX_ONIG, TRILL_REGEX_RUST } trill_regex_dialect;

/* Their \w as a class body: Oniguruma's Letter, Mark, Decimal_Number and Connector_Punctuation;
 * the regex crate's UTS #18 word (Alphabetic, marks, Nd, Pc and Join_Control). */
#define TRILL_ONIG_WORD "\\p{L}\\p{M}\\p{Nd}\\p{Pc}"
#define TRILL_RUST_WORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}"

/* pattern as PCRE2 must be given it to match what the dialect's engine matches:
 * - \s and \S become White_Space and its complement (both engines' \s; PCRE2's also has U+180E);
 * - \w and \W become the dialect's word class (PCRE2 10.42's is \p{L}\p{N} and _); \W inside
 *   a class is refused; \d is \p{Nd} in all three; \b and \B keep PCRE2's \w;
 * - a bare script name, \p{Han}, becomes \p{sc=Han}: both engines take it as the Script
 *   property, PCRE2 (>= 10.40) as Script_Extensions, which adds e.g. the CJK punctuation 、。;
 * - every class that intersects others, [A&&[B]] or [A&&[^B]] (any number of operands, each a
 *   bracketed class), becomes one character of [A] that the operands' lookaheads admit:
 *   (?:(?=[B])[A]) and (?:(?![B])[A]).
 * Everything else, \Q...\E included, is copied. *out malloc'ed. */
trill_status trill_regex_translate(const char *pattern, trill_regex_dialect dialect, char **out);

#endif
