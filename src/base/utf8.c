#include "utf8.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

/* Length of the valid sequence at s (1..4), or 0 if the bytes at s start an invalid one;
 * *bad_len is then the length of the maximal subpart to replace. */
static int valid_len(const unsigned char *s, size_t avail, size_t *bad_len) {
    unsigned char c = s[0];
    int n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c >= 0xe0 && c <= 0xef) { n = 3; if (c == 0xe0) lo = 0xa0; if (c == 0xed) hi = 0x9f; }
    else if (c >= 0xf0 && c <= 0xf4) { n = 4; if (c == 0xf0) lo = 0x90; if (c == 0xf4) hi = 0x8f; }
    else { *bad_len = 1; return 0; }
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= avail || s[i] < lo || s[i] > hi) { *bad_len = (size_t)i; return 0; }
        lo = 0x80;
        hi = 0xbf;
    }
    return n;
}

char *trill_utf8_sanitize(const char *in, size_t len, size_t *out_len) {
    char *out = trill_malloc(len * 3 + 1); /* each invalid byte may become 3 bytes */
    if (!out) return NULL;
    const unsigned char *s = (const unsigned char *)in;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t bad = 0;
        int n = valid_len(s + i, len - i, &bad);
        if (n) {
            memcpy(out + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            i += bad;
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

int trill_utf8_decode(const char *str, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    if (s[0] < 0x80) { *cp = s[0]; return 1; }
    if (s[0] < 0xe0) { *cp = ((uint32_t)(s[0] & 0x1f) << 6) | (s[1] & 0x3f); return 2; }
    if (s[0] < 0xf0) { *cp = ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f); return 3; }
    *cp = ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) | ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
    return 4;
}

int trill_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xc0 | (cp >> 6)); o[1] = (unsigned char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12)); o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18)); o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)); o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}
