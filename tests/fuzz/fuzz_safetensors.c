/* libFuzzer harness: arbitrary bytes as a safetensors file. Whatever the parser accepts
 * must be self-consistent: every tensor's bytes readable, findable by name, inside the input. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/safetensors.h"

#define CHECK(cond)                                                                       \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "fuzz_safetensors: check failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    trill_st_file *f = NULL;
    if (trill_st_parse("fuzz.safetensors", data, size, &f) != TRILL_OK) {
        CHECK(trill_error_message()[0] != '\0');
        return 0;
    }
    CHECK(size >= 8);
    size_t total = 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < trill_st_count(f); i++) {
        const trill_tensor_view *t = trill_st_tensor(f, i);
        CHECK(t->ndim >= 0 && t->ndim <= TRILL_MAX_DIMS);
        CHECK(t->nbytes == t->numel * trill_dtype_size(t->dtype));
        CHECK(trill_st_find(f, t->name) == t);
        if (i > 0) CHECK(strcmp(trill_st_tensor(f, i - 1)->name, t->name) < 0);
        const uint8_t *p = t->data;
        CHECK(p >= data + 8 && p + t->nbytes <= data + size);
        if (t->nbytes) {
            sink ^= p[0];
            sink ^= p[t->nbytes - 1];
        }
        total += t->nbytes;
    }
    CHECK(total <= size - 8);
    (void)sink;
    trill_st_close(f);
    return 0;
}
