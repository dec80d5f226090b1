/* The weight channel (include/trill/channel.h): a double buffer guarded by one mutex.
 *
 * State (all under `lock`): which buffer is the front (the newest version), each buffer's
 * version, checksum and number of readers holding it, whether a publish owns the back buffer,
 * whether the channel is closed. The invariant that prevents torn reads: a buffer is written
 * only by a publish that, under the lock, found it was not the front and no reader held it, and
 * marked itself `writing`; readers only ever take the front, and the front changes only when
 * that publish has finished writing. So while the copy runs outside the lock the back buffer
 * is the publisher's alone, and the mutex hand-offs before and after it order the copy against
 * every reader (pthread mutexes are full acquire/release barriers). */
#include "trill/channel.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trill/timing.h"

struct trill_weight_channel {
    size_t n;
    float *buf[2];
    uint32_t version[2]; /* 0: never written */
    uint64_t checksum[2];
    int holders[2]; /* readers holding each buffer */
    int front;      /* the newest buffer (version[front] == 0 before the first publish) */
    bool writing;   /* a publish owns buf[1 - front] */
    bool closed;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* broadcast on release to 0 holders, on publish and on close */
};

/* ---- XXH64, seed 0, streamed over 32-byte stripes so copy and hash can go chunk by chunk ---- */

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t read64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only, as everywhere in trill */
    return v;
}
static inline uint64_t xxh_round(uint64_t acc, uint64_t input) {
    acc += input * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}
static inline uint64_t xxh_merge(uint64_t acc, uint64_t v) {
    acc ^= xxh_round(0, v);
    return acc * P1 + P4;
}

typedef struct {
    uint64_t v[4];
} xxh_state;

static void xxh_init(xxh_state *s) {
    s->v[0] = P1 + P2;
    s->v[1] = P2;
    s->v[2] = 0;
    s->v[3] = 0 - P1;
}

/* Whole 32-byte stripes of p[len]; returns how many bytes it consumed. */
static size_t xxh_stripes(xxh_state *s, const unsigned char *p, size_t len) {
    uint64_t v0 = s->v[0], v1 = s->v[1], v2 = s->v[2], v3 = s->v[3];
    size_t done = len & ~(size_t)31;
    for (size_t i = 0; i < done; i += 32) {
        v0 = xxh_round(v0, read64(p + i));
        v1 = xxh_round(v1, read64(p + i + 8));
        v2 = xxh_round(v2, read64(p + i + 16));
        v3 = xxh_round(v3, read64(p + i + 24));
    }
    s->v[0] = v0, s->v[1] = v1, s->v[2] = v2, s->v[3] = v3;
    return done;
}

/* The hash of `total` bytes (a multiple of 4) whose stripes went through xxh_stripes and whose
 * last total % 32 bytes are tail[]. */
static uint64_t xxh_finish(const xxh_state *s, const unsigned char *tail, size_t total) {
    assert(total % 4 == 0);
    uint64_t h;
    if (total >= 32) {
        h = rotl64(s->v[0], 1) + rotl64(s->v[1], 7) + rotl64(s->v[2], 12) + rotl64(s->v[3], 18);
        for (int i = 0; i < 4; i++) h = xxh_merge(h, s->v[i]);
    } else {
        h = P5;
    }
    h += total;
    size_t rest = total & 31, i = 0;
    for (; i + 8 <= rest; i += 8) {
        h ^= xxh_round(0, read64(tail + i));
        h = rotl64(h, 27) * P1 + P4;
    }
    if (i + 4 <= rest) {
        uint32_t k;
        memcpy(&k, tail + i, 4);
        h ^= (uint64_t)k * P1;
        h = rotl64(h, 23) * P2 + P3;
    } /* XXH64 goes on byte by byte here; float data never has bytes left over */
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t trill_channel_checksum(const float *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t bytes = n * sizeof(float);
    xxh_state s;
    xxh_init(&s);
    size_t done = xxh_stripes(&s, p, bytes);
    return xxh_finish(&s, p + done, bytes);
}

/* dst = src and the checksum of it, in chunks that stay in L2 between the copy and the hash:
 * one pass over memory instead of two. Chunks are whole stripes except the last. */
static uint64_t copy_and_checksum(float *dst, const float *src, size_t n) {
    enum { CHUNK = 64 * 1024 }; /* bytes, a multiple of 32 */
    unsigned char *d = (unsigned char *)dst;
    size_t bytes = n * sizeof(float), done = 0;
    xxh_state s;
    xxh_init(&s);
    while (done < bytes) {
        size_t len = bytes - done < CHUNK ? bytes - done : CHUNK;
        memcpy(d + done, (const unsigned char *)src + done, len);
        done += xxh_stripes(&s, d + done, len);
        if (len < CHUNK) break; /* the last chunk: its tail goes to xxh_finish */
    }
    return xxh_finish(&s, d + done, bytes);
}

/* ---- the channel ---- */

static trill_status closed_error(void) { return trill_error(TRILL_ERR_IO, "weight channel closed"); }

trill_status trill_channel_create(size_t n_floats, trill_weight_channel **out) {
    *out = NULL;
    if (n_floats == 0 || n_floats > (SIZE_MAX - 63) / sizeof(float))
        return trill_error(TRILL_ERR_INVALID, "weight channel: size %zu floats, expected 1..%zu",
                           n_floats, (SIZE_MAX - 63) / sizeof(float));
    trill_weight_channel *ch = calloc(1, sizeof *ch);
    if (!ch) return trill_error(TRILL_ERR_NOMEM, "weight channel: out of memory");
    size_t bytes = (n_floats * sizeof(float) + 63) & ~(size_t)63;
    for (int i = 0; i < 2; i++) {
        ch->buf[i] = aligned_alloc(64, bytes);
        if (!ch->buf[i]) {
            free(ch->buf[0]);
            free(ch);
            return trill_error(TRILL_ERR_NOMEM, "weight channel: cannot allocate 2 x %zu bytes", bytes);
        }
    }
    ch->n = n_floats;
    pthread_mutex_init(&ch->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* timed waits immune to clock changes */
    pthread_cond_init(&ch->changed, &attr);
    pthread_condattr_destroy(&attr);
    *out = ch;
    return TRILL_OK;
}

void trill_channel_free(trill_weight_channel *ch) {
    if (!ch) return;
    assert(ch->holders[0] == 0 && ch->holders[1] == 0 && !ch->writing);
    pthread_cond_destroy(&ch->changed);
    pthread_mutex_destroy(&ch->lock);
    free(ch->buf[0]);
    free(ch->buf[1]);
    free(ch);
}

size_t trill_channel_size(const trill_weight_channel *ch) { return ch->n; }

trill_status trill_channel_publish(trill_weight_channel *ch, const float *src, uint32_t version,
                                   trill_publish_info *info) {
    double t0 = trill_now();
    pthread_mutex_lock(&ch->lock);
    /* the back buffer is free once no other publish owns it and no reader holds it */
    while (!ch->closed && (ch->writing || ch->holders[1 - ch->front] > 0))
        pthread_cond_wait(&ch->changed, &ch->lock);
    if (ch->closed) {
        pthread_mutex_unlock(&ch->lock);
        return closed_error();
    }
    uint32_t latest = ch->version[ch->front];
    if (version <= latest) {
        pthread_mutex_unlock(&ch->lock);
        return trill_error(TRILL_ERR_INVALID, "weight channel: version %u published after %u, expected > %u",
                           version, latest, latest);
    }
    int back = 1 - ch->front;
    ch->writing = true;
    pthread_mutex_unlock(&ch->lock);

    double t1 = trill_now();
    uint64_t sum = copy_and_checksum(ch->buf[back], src, ch->n);
    double t2 = trill_now();

    pthread_mutex_lock(&ch->lock);
    ch->version[back] = version;
    ch->checksum[back] = sum;
    ch->front = back;
    ch->writing = false;
    pthread_cond_broadcast(&ch->changed);
    pthread_mutex_unlock(&ch->lock);

    if (info) {
        info->wait_us = (t1 - t0) * 1e6;
        info->copy_us = (t2 - t1) * 1e6;
        info->bytes = ch->n * sizeof(float);
        info->checksum = sum;
    }
    return TRILL_OK;
}

trill_status trill_channel_acquire(trill_weight_channel *ch, uint32_t have, trill_weight_view *view) {
    view->data = NULL;
    pthread_mutex_lock(&ch->lock);
    if (ch->closed) {
        pthread_mutex_unlock(&ch->lock);
        return closed_error();
    }
    int f = ch->front;
    if (ch->version[f] > have) {
        ch->holders[f]++;
        view->data = ch->buf[f];
        view->n = ch->n;
        view->version = ch->version[f];
        view->checksum = ch->checksum[f];
    }
    pthread_mutex_unlock(&ch->lock);
    return TRILL_OK;
}

void trill_channel_release(trill_weight_channel *ch, trill_weight_view *view) {
    if (!view->data) return;
    int i = view->data == ch->buf[1];
    assert(view->data == ch->buf[i]);
    pthread_mutex_lock(&ch->lock);
    assert(ch->holders[i] > 0);
    if (--ch->holders[i] == 0) pthread_cond_broadcast(&ch->changed);
    pthread_mutex_unlock(&ch->lock);
    view->data = NULL;
}

trill_status trill_channel_wait(trill_weight_channel *ch, uint32_t at_least, double timeout_s,
                                uint32_t *version) {
    if (isnan(timeout_s)) timeout_s = 0;
    if (timeout_s > 1e9) timeout_s = -1; /* beyond any run: no limit (and no time_t overflow) */
    struct timespec deadline;
    if (timeout_s > 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        double whole = floor(timeout_s);
        deadline.tv_sec += (time_t)whole;
        deadline.tv_nsec += (long)((timeout_s - whole) * 1e9);
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&ch->lock);
    while (!ch->closed && ch->version[ch->front] < at_least && timeout_s != 0) {
        if (timeout_s < 0) {
            pthread_cond_wait(&ch->changed, &ch->lock);
        } else if (pthread_cond_timedwait(&ch->changed, &ch->lock, &deadline) == ETIMEDOUT) {
            break;
        }
    }
    bool closed = ch->closed;
    *version = ch->version[ch->front];
    pthread_mutex_unlock(&ch->lock);
    return closed ? closed_error() : TRILL_OK;
}

void trill_channel_close(trill_weight_channel *ch) {
    pthread_mutex_lock(&ch->lock);
    ch->closed = true;
    pthread_cond_broadcast(&ch->changed);
    pthread_mutex_unlock(&ch->lock);
}
