/* UTF-8 helpers for text that comes from users. */
#ifndef TRILL_UTF8_H
#define TRILL_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Copies `in` replacing every invalid sequence with U+FFFD, one per maximal subpart
 * (the WHATWG decoder, as Node's Buffer.toString and Python's errors="replace" do).
 * Returns a malloc'ed NUL-terminated buffer (NULL when out of memory). */
char *trill_utf8_sanitize(const char *in, size_t len, size_t *out_len);

/* Decodes the character at s (valid UTF-8, at least one byte); returns its length. */
int trill_utf8_decode(const char *s, uint32_t *cp);

/* Writes cp as UTF-8 into out (4 bytes room); returns the length. */
int trill_utf8_encode(uint32_t cp, char *out);

#endif
