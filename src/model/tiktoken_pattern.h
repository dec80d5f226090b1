/* The split pattern of a tiktoken vocabulary (tokenizer.c's tiktoken loader): read from the
 * model folder's Python tokenizer (Kimi-K2's tokenization_kimi.py assigns `pat_str`), and its
 * character-class intersections, which PCRE2 does not write as tiktoken's regex engine does,
 * translated exactly. */
#ifndef TRILL_MODEL_TIKTOKEN_PATTERN_H
#define TRILL_MODEL_TIKTOKEN_PATTERN_H

#include "trill/error.h"

/* The pattern a Python source assigns to pat_str (or PAT_STR): a string literal (r"...",
 * r"""...""", "..." with \\ and \" escapes), or "|".join([...]) of such literals; *out
 * malloc'ed. `what` names the file in messages. */
trill_status trill_tiktoken_pattern_from_python(const char *src, const char *what, char **out);

/* pattern with every class that intersects others, [A&&[B]] or [A&&[^B]] (any number of
 * operands, each a bracketed class), rewritten for PCRE2 as one character of [A] that the
 * operands' lookaheads admit: (?:(?=[B])[A]) and (?:(?![B])[A]). Everything else is copied.
 * *out malloc'ed. */
trill_status trill_tiktoken_translate_classes(const char *pattern, char **out);

#endif
