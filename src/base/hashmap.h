/* Open-addressing hash maps for the tokenizer's hot paths: byte strings -> int32
 * (keys are borrowed, never copied) and uint64 -> uint64. */
#ifndef TRILL_HASHMAP_H
#define TRILL_HASHMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct trill_strmap {
    size_t cap, n; /* cap is a power of two */
    struct strmap_slot { const char *key; uint32_t len; int32_t value; } *slots;
} trill_strmap;

/* 0 ok, -1 out of memory. */
int trill_strmap_init(trill_strmap *m, size_t expected);
/* Inserts or overwrites; the key bytes must outlive the map. 0 ok, -1 out of memory. */
int trill_strmap_put(trill_strmap *m, const char *key, size_t len, int32_t value);
/* The value, or -1 when absent. */
int32_t trill_strmap_get(const trill_strmap *m, const char *key, size_t len);
void trill_strmap_free(trill_strmap *m);

typedef struct trill_u64map {
    size_t cap, n;
    struct u64map_slot { uint64_t key, value; int used; } *slots;
} trill_u64map;

int trill_u64map_init(trill_u64map *m, size_t expected);
int trill_u64map_put(trill_u64map *m, uint64_t key, uint64_t value);
/* 1 and *value when present, 0 when absent. */
int trill_u64map_get(const trill_u64map *m, uint64_t key, uint64_t *value);
void trill_u64map_free(trill_u64map *m);

#endif
