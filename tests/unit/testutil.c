#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *test_tmpdir(const char *tag) {
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char *path = malloc(strlen(base) + strlen(tag) + 32);
    sprintf(path, "%s/trill-%s-XXXXXX", base, tag);
    if (!mkdtemp(path)) { perror("mkdtemp"); abort(); }
    return path;
}

void test_rmdir(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

void test_write(const char *dir, const char *name, const void *data, size_t len) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len) { perror(path); abort(); }
    fclose(f);
}
