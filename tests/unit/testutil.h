/* Helpers shared by the unit tests. */
#ifndef TRILL_TESTUTIL_H
#define TRILL_TESTUTIL_H

#include <stddef.h>

/* A fresh empty directory under $TMPDIR (or /tmp); malloc'ed path. */
char *test_tmpdir(const char *tag);
/* rm -rf of a directory made by test_tmpdir. */
void test_rmdir(const char *dir);
/* Writes bytes to dir/name (plain write, for crafting malformed inputs). */
void test_write(const char *dir, const char *name, const void *data, size_t len);

#endif
