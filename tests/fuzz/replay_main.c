/* Runs a libFuzzer harness (LLVMFuzzerTestOneInput) once on every file named on the
 * command line or found in a directory named there, so the seed corpus is replayed by
 * ctest in ordinary and sanitizer builds. Each input is copied into a buffer of exactly
 * its size, so an over-read is caught by AddressSanitizer. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "%s: read error\n", path);
        fclose(f);
        free(buf);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    long ran = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) { perror(argv[i]); return 1; }
        if (!S_ISDIR(sb.st_mode)) {
            if (run_file(argv[i]) != 0) return 1;
            ran++;
            continue;
        }
        struct dirent **ents;
        int n = scandir(argv[i], &ents, NULL, alphasort);
        if (n < 0) { perror(argv[i]); return 1; }
        int failed = 0;
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], ents[k]->d_name);
            if (!failed && ents[k]->d_name[0] != '.' && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
                if (run_file(path) != 0) failed = 1;
                else ran++;
            }
            free(ents[k]);
        }
        free(ents);
        if (failed) return 1;
    }
    printf("replayed %ld inputs\n", ran);
    if (ran == 0) {
        fprintf(stderr, "no inputs found\n");
        return 1;
    }
    return 0;
}
