/* bench_channel: the weight channel (trill/channel.h), trainer → generator direct weight
 * transfer, on one thread with no reader in the way.
 *
 * A benchmark, not a test: it prints figures and fails only if it cannot run.
 *
 *   bench_channel [--runs N] [--floats N]...
 *
 * Sizes (floats): the demo's LoRA adapter (151552), 4 MB, 64 MB, or those given with --floats.
 * For each: a publish (copy into the back buffer + XXH64 checksum + flip), and for comparison a
 * plain memcpy of the same bytes and the checksum alone, all from a source and into buffers
 * already touched; an acquire + release pair (an uncontended lock round trip each). GB/s are
 * bytes published per second (each byte is read once and written once). Medians of --runs. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/channel.h"
#include "trill/error.h"
#include "trill/timing.h"

static long parse_long(const char *opt, const char *s, long min, long max) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min || v > max) {
        fprintf(stderr, "bench_channel: %s expects an integer in %ld..%ld, got '%s'\n", opt, min, max, s);
        exit(2);
    }
    return v;
}

static int bench_size(size_t n, int runs) {
    float *src = malloc(n * sizeof *src), *dst = malloc(n * sizeof *dst);
    double *t = malloc((size_t)runs * sizeof *t);
    trill_weight_channel *ch = NULL;
    if (!src || !dst || !t || trill_channel_create(n, &ch) != TRILL_OK) {
        fprintf(stderr, "bench_channel: %zu floats: %s\n", n, ch ? "out of memory" : trill_error_message());
        free(src), free(dst), free(t), trill_channel_free(ch);
        return 1;
    }
    for (size_t i = 0; i < n; i++) src[i] = (float)(i % 1000) * 1e-3f;
    memset(dst, 0, n * sizeof *dst);
    double bytes = (double)n * sizeof(float);

    uint32_t version = 0;
    double wait = 0;
    for (int r = -2; r < runs; r++) { /* two untimed: both buffers touched */
        trill_publish_info info;
        double t0 = trill_now();
        if (trill_channel_publish(ch, src, ++version, &info) != TRILL_OK) {
            fprintf(stderr, "bench_channel: %s\n", trill_error_message());
            return 1;
        }
        if (r < 0) continue;
        t[r] = trill_now() - t0;
        wait += info.wait_us;
    }
    double publish = trill_median(t, runs);

    for (int r = 0; r < runs; r++) {
        double t0 = trill_now();
        memcpy(dst, src, n * sizeof *src);
        t[r] = trill_now() - t0;
    }
    double copy = trill_median(t, runs);

    volatile uint64_t sink = 0;
    for (int r = 0; r < runs; r++) {
        double t0 = trill_now();
        sink ^= trill_channel_checksum(src, n);
        t[r] = trill_now() - t0;
    }
    double checksum = trill_median(t, runs);

    enum { PAIRS = 1000 };
    for (int r = 0; r < runs; r++) {
        double t0 = trill_now();
        for (int k = 0; k < PAIRS; k++) {
            trill_weight_view view;
            trill_channel_acquire(ch, 0, &view);
            trill_channel_release(ch, &view);
        }
        t[r] = (trill_now() - t0) / PAIRS;
    }
    double acquire = trill_median(t, runs);

    printf("%10zu %9.2f %11.1f %8.2f %11.1f %8.2f %11.1f %8.2f %8.3f %8.2f\n", n, bytes / (1 << 20),
           publish * 1e6, bytes / publish * 1e-9, copy * 1e6, bytes / copy * 1e-9, checksum * 1e6,
           bytes / checksum * 1e-9, acquire * 1e6, wait / runs);
    trill_channel_free(ch);
    free(src), free(dst), free(t);
    return 0;
}

int main(int argc, char **argv) {
    int runs = 9;
    size_t sizes[16] = { 151552, (size_t)1 << 20, (size_t)1 << 24 };
    int n_sizes = 3, given = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc) {
            runs = (int)parse_long("--runs", argv[++i], 1, 1000);
        } else if (!strcmp(argv[i], "--floats") && i + 1 < argc) {
            if (given == 16) {
                fprintf(stderr, "bench_channel: at most 16 --floats\n");
                return 2;
            }
            sizes[given++] = (size_t)parse_long("--floats", argv[++i], 1, 1L << 32);
            n_sizes = given;
        } else {
            fprintf(stderr, "usage: bench_channel [--runs N] [--floats N]...\n"
                            "  --runs N    timed runs per figure, median reported (default 9)\n"
                            "  --floats N  a size to measure (repeatable; default 151552, 1048576, 16777216)\n");
            return !strcmp(argv[i], "--help") ? 0 : 2;
        }
    }
    printf("weight channel: publish = copy into the back buffer + XXH64 checksum + flip; "
           "median of %d runs, no reader\n", runs);
    printf("%10s %9s %11s %8s %11s %8s %11s %8s %8s %8s\n", "floats", "MiB", "publish_us", "GB/s",
           "memcpy_us", "GB/s", "xxh64_us", "GB/s", "acq+rel", "wait_us");
    for (int s = 0; s < n_sizes; s++)
        if (bench_size(sizes[s], runs)) return 1;
    return 0;
}
