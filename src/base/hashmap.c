#include "hashmap.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t capacity_for(size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2; /* load factor <= 1/2 */
    return cap;
}

int trill_strmap_init(trill_strmap *m, size_t expected) {
    m->cap = capacity_for(expected);
    m->n = 0;
    m->slots = trill_calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

static struct strmap_slot *strmap_find(const trill_strmap *m, const char *key, size_t len) {
    size_t i = hash_bytes(key, len) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1)) {
        struct strmap_slot *s = &m->slots[i];
        if (!s->key || (s->len == len && memcmp(s->key, key, len) == 0)) return s;
    }
}

int trill_strmap_put(trill_strmap *m, const char *key, size_t len, int32_t value) {
    if ((m->n + 1) * 2 > m->cap) {
        trill_strmap grown = { .cap = m->cap * 2 };
        grown.slots = trill_calloc(grown.cap, sizeof *grown.slots);
        if (!grown.slots) return -1;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i].key) *strmap_find(&grown, m->slots[i].key, m->slots[i].len) = m->slots[i];
        grown.n = m->n;
        free(m->slots);
        *m = grown;
    }
    struct strmap_slot *s = strmap_find(m, key, len);
    if (!s->key) m->n++;
    *s = (struct strmap_slot){ .key = key ? key : "", .len = (uint32_t)len, .value = value };
    return 0;
}

int32_t trill_strmap_get(const trill_strmap *m, const char *key, size_t len) {
    const struct strmap_slot *s = strmap_find(m, key, len);
    return s->key ? s->value : -1;
}

void trill_strmap_free(trill_strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

int trill_u64map_init(trill_u64map *m, size_t expected) {
    m->cap = capacity_for(expected);
    m->n = 0;
    m->slots = trill_calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : -1;
}

static struct u64map_slot *u64map_find(const trill_u64map *m, uint64_t key) {
    size_t i = hash_u64(key) & (m->cap - 1);
    for (;; i = (i + 1) & (m->cap - 1))
        if (!m->slots[i].used || m->slots[i].key == key) return &m->slots[i];
}

int trill_u64map_put(trill_u64map *m, uint64_t key, uint64_t value) {
    if ((m->n + 1) * 2 > m->cap) {
        trill_u64map grown = { .cap = m->cap * 2 };
        grown.slots = trill_calloc(grown.cap, sizeof *grown.slots);
        if (!grown.slots) return -1;
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i].used) *u64map_find(&grown, m->slots[i].key) = m->slots[i];
        grown.n = m->n;
        free(m->slots);
        *m = grown;
    }
    struct u64map_slot *s = u64map_find(m, key);
    if (!s->used) m->n++;
    *s = (struct u64map_slot){ .key = key, .value = value, .used = 1 };
    return 0;
}

int trill_u64map_get(const trill_u64map *m, uint64_t key, uint64_t *value) {
    const struct u64map_slot *s = u64map_find(m, key);
    if (!s->used) return 0;
    *value = s->value;
    return 1;
}

void trill_u64map_free(trill_u64map *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}
