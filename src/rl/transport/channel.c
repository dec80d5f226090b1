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
#include "base/alloc.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_STATIC_LINKING_ONLY /* XXH64_state_t on the stack */
#include <xxhash.h>

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

/* ---- XXH64 (libxxhash), seed 0 ---- */

uint64_t trill_channel_checksum(const float *data, size_t n) { return XXH64(data, n * sizeof(float), 0); }

/* dst = src and the checksum of it, in chunks that stay in L2 between the copy and the hash:
 * one pass over memory instead of two. */
static uint64_t copy_and_checksum(float *dst, const float *src, size_t n) {
    enum { CHUNK = 64 * 1024 }; /* bytes */
    unsigned char *d = (unsigned char *)dst;
    const size_t bytes = n * sizeof(float);
    XXH64_state_t s;
    XXH64_reset(&s, 0);
    for (size_t done = 0; done < bytes; done += CHUNK) {
        const size_t len = bytes - done < CHUNK ? bytes - done : CHUNK;
        memcpy(d + done, (const unsigned char *)src + done, len);
        XXH64_update(&s, d + done, len);
    }
    return XXH64_digest(&s);
}

/* ---- the channel ---- */

static trill_status closed_error(void) { return trill_error(TRILL_ERR_IO, "weight channel closed"); }

trill_status trill_channel_create(size_t n_floats, trill_weight_channel **out) {
    *out = NULL;
    if (n_floats == 0 || n_floats > (SIZE_MAX - 63) / sizeof(float))
        return trill_error(TRILL_ERR_INVALID, "weight channel: size %zu floats, expected 1..%zu",
                           n_floats, (SIZE_MAX - 63) / sizeof(float));
    trill_weight_channel *ch = trill_calloc(1, sizeof *ch);
    if (!ch) return trill_error(TRILL_ERR_NOMEM, "weight channel: out of memory");
    size_t bytes = (n_floats * sizeof(float) + 63) & ~(size_t)63;
    for (int i = 0; i < 2; i++) {
        ch->buf[i] = trill_aligned_alloc(64, bytes);
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
