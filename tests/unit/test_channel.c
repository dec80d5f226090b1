/* The weight channel (trill/channel.h): the checksum against XXH64, publish/acquire/release
 * semantics on one thread, a held buffer never being written (the publisher waits), close
 * waking a blocked publisher and a blocked waiter, wait's timeout, corruption caught by the
 * checksum, and a stress test where one publisher and two readers race and every element of
 * every version a reader holds is checked against the value it must have, at acquire and again
 * after holding it for a while. No assertion depends on how fast the machine is: time bounds
 * are hang guards far beyond any scheduling delay, and the stress test counts events. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "trill/channel.h"
#include "trill/timing.h"

/* The value of element i in version v: exact in fp32 (24 bits), different in every version. */
static float value(uint32_t v, size_t i) {
    return (float)((v * 2654435761u + (uint32_t)i * 40503u) & 0xFFFFFFu);
}

static void fill(float *w, size_t n, uint32_t v) {
    for (size_t i = 0; i < n; i++) w[i] = value(v, i);
}

/* How many elements of data[n] differ from version v. */
static size_t mismatches(const float *data, size_t n, uint32_t v) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += data[i] != value(v, i);
    return bad;
}

static void sleep_ms(int ms) {
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static void test_checksum_is_xxh64(void **state) {
    (void)state;
    /* XXH64(bytes, seed 0) from libxxhash 0.8.1 over the little-endian floats i * 0.25 - 3 */
    static const struct {
        size_t n;
        uint64_t h;
    } want[] = {
        { 0, 0xef46db3751d8e999ULL },  { 1, 0x477a7e4f0e7690ddULL },   { 2, 0xfe0c34a260059766ULL },
        { 3, 0xac97787f535a753cULL },  { 7, 0xff82ee5bc714bb02ULL },   { 8, 0xa4fc9fe9636fee0aULL },
        { 9, 0xbbfffa787499416aULL }, { 100, 0x42477f1a97638797ULL }, { 1000, 0x3855d479cc0f8742ULL },
    };
    float v[1000];
    for (int i = 0; i < 1000; i++) v[i] = i * 0.25f - 3.f;
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        assert_true(trill_channel_checksum(v, want[k].n) == want[k].h);
}

/* The publisher copies and hashes in 64 KB chunks: its checksum must be the one-shot one on
 * either side of chunk boundaries. */
static void test_publish_checksum_across_chunks(void **state) {
    (void)state;
    static const size_t sizes[] = { 1, 7, 8, 16383, 16384, 16385, 2 * 16384, 3 * 16384 + 13 };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        float *w = malloc(n * sizeof *w);
        assert_non_null(w);
        fill(w, n, 7);
        trill_weight_channel *ch;
        assert_int_equal(trill_channel_create(n, &ch), TRILL_OK);
        trill_publish_info info;
        assert_int_equal(trill_channel_publish(ch, w, 7, &info), TRILL_OK);
        assert_int_equal(info.bytes, n * sizeof(float));
        assert_true(info.checksum == trill_channel_checksum(w, n));
        trill_weight_view view;
        assert_int_equal(trill_channel_acquire(ch, 0, &view), TRILL_OK);
        assert_non_null(view.data);
        assert_true(view.checksum == info.checksum);
        assert_int_equal(mismatches(view.data, n, 7), 0);
        trill_channel_release(ch, &view);
        trill_channel_free(ch);
        free(w);
    }
}

/* A buffer corrupted after the publisher hashed it no longer matches the checksum its views
 * carry, wherever the damage is (first element, either side of a 64 KB copy chunk, the last;
 * one flipped bit, low or sign; two elements swapped): the view's checksum is the publisher's,
 * never recomputed from what the buffer holds, so a reader comparing the two detects it (the
 * generator refuses such a version instead of loading it: take_weights in src/rl/async.c). */
static void flip_bits(float *x, uint32_t mask) {
    uint32_t b;
    memcpy(&b, x, sizeof b);
    b ^= mask;
    memcpy(x, &b, sizeof b);
}

static void test_corruption_is_detected(void **state) {
    (void)state;
    const size_t n = 3 * 16384 + 13;
    float *w = malloc(n * sizeof *w);
    assert_non_null(w);
    fill(w, n, 3);
    trill_weight_channel *ch;
    assert_int_equal(trill_channel_create(n, &ch), TRILL_OK);
    trill_publish_info info;
    assert_int_equal(trill_channel_publish(ch, w, 3, &info), TRILL_OK);
    trill_weight_view view;
    assert_int_equal(trill_channel_acquire(ch, 0, &view), TRILL_OK);
    assert_true(view.checksum == info.checksum);
    assert_true(trill_channel_checksum(view.data, view.n) == view.checksum);
    float *data = (float *)(uintptr_t)view.data; /* the test plays the faulty memory */
    const size_t at[] = { 0, 16383, 16384, 2 * 16384 + 1, n - 1 };
    const uint32_t flips[] = { 1u, 1u << 31 };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
        for (size_t f = 0; f < 2; f++) {
            flip_bits(&data[at[i]], flips[f]);
            if (trill_channel_checksum(view.data, view.n) == view.checksum) fail_msg("bit %#x of element %zu flipped: not detected", flips[f], at[i]);
            flip_bits(&data[at[i]], flips[f]);
        }
    assert_true(data[10] != data[11]);
    const float t = data[10];
    data[10] = data[11], data[11] = t;
    assert_true(trill_channel_checksum(view.data, view.n) != view.checksum);
    trill_channel_release(ch, &view);
    /* the next reader of the damaged version gets the publisher's checksum, not the damage's */
    assert_int_equal(trill_channel_acquire(ch, 0, &view), TRILL_OK);
    assert_int_equal(view.version, 3);
    assert_true(view.checksum == info.checksum);
    assert_true(trill_channel_checksum(view.data, view.n) != view.checksum);
    assert_int_equal(mismatches(view.data, n, 3), 2);
    trill_channel_release(ch, &view);
    /* a clean publish afterwards checks out again */
    assert_int_equal(trill_channel_publish(ch, w, 4, &info), TRILL_OK);
    assert_int_equal(trill_channel_acquire(ch, 3, &view), TRILL_OK);
    assert_true(trill_channel_checksum(view.data, view.n) == view.checksum);
    trill_channel_release(ch, &view);
    trill_channel_free(ch);
    free(w);
}

static void test_create_refuses_empty(void **state) {
    (void)state;
    trill_weight_channel *ch = (trill_weight_channel *)&ch;
    assert_int_equal(trill_channel_create(0, &ch), TRILL_ERR_INVALID);
    assert_null(ch);
    trill_channel_free(NULL);
}

static void test_single_thread(void **state) {
    (void)state;
    enum { N = 1000 };
    float w[N];
    trill_weight_channel *ch;
    assert_int_equal(trill_channel_create(N, &ch), TRILL_OK);
    assert_int_equal(trill_channel_size(ch), N);

    /* nothing before the first publish */
    trill_weight_view view = { .data = w };
    assert_int_equal(trill_channel_acquire(ch, 0, &view), TRILL_OK);
    assert_null(view.data);
    uint32_t version = 99;
    assert_int_equal(trill_channel_wait(ch, 1, 0, &version), TRILL_OK);
    assert_int_equal(version, 0);
    trill_channel_release(ch, &view); /* data NULL: no-op */

    fill(w, N, 1);
    assert_int_equal(trill_channel_publish(ch, w, 0, NULL), TRILL_ERR_INVALID); /* versions start at 1 */
    assert_int_equal(trill_channel_publish(ch, w, 1, NULL), TRILL_OK);
    assert_int_equal(trill_channel_acquire(ch, 0, &view), TRILL_OK);
    assert_non_null(view.data);
    assert_int_equal(view.version, 1);
    assert_int_equal(view.n, N);
    assert_int_equal(mismatches(view.data, N, 1), 0);
    assert_true(view.checksum == trill_channel_checksum(w, N));
    trill_channel_release(ch, &view);
    assert_null(view.data);

    /* nothing newer than what the reader has */
    assert_int_equal(trill_channel_acquire(ch, 1, &view), TRILL_OK);
    assert_null(view.data);

    /* versions must increase; a refused publish changes nothing */
    fill(w, N, 5);
    assert_int_equal(trill_channel_publish(ch, w, 1, NULL), TRILL_ERR_INVALID);
    assert_int_equal(trill_channel_wait(ch, 0, 0, &version), TRILL_OK);
    assert_int_equal(version, 1);

    /* the newest of several, skipping versions */
    assert_int_equal(trill_channel_publish(ch, w, 5, NULL), TRILL_OK);
    fill(w, N, 9);
    assert_int_equal(trill_channel_publish(ch, w, 9, NULL), TRILL_OK);
    assert_int_equal(trill_channel_publish(ch, w, 8, NULL), TRILL_ERR_INVALID);
    assert_int_equal(trill_channel_acquire(ch, 1, &view), TRILL_OK);
    assert_int_equal(view.version, 9);
    assert_int_equal(mismatches(view.data, N, 9), 0);

    /* two readers may hold the same version */
    trill_weight_view other;
    assert_int_equal(trill_channel_acquire(ch, 0, &other), TRILL_OK);
    assert_ptr_equal(other.data, view.data);
    trill_channel_release(ch, &other);
    trill_channel_release(ch, &view);

    /* after close: publish, acquire and wait refuse; close twice is harmless */
    trill_channel_close(ch);
    trill_channel_close(ch);
    assert_int_equal(trill_channel_publish(ch, w, 10, NULL), TRILL_ERR_IO);
    assert_int_equal(trill_channel_acquire(ch, 0, &view), TRILL_ERR_IO);
    assert_null(view.data);
    assert_int_equal(trill_channel_wait(ch, 0, 0, &version), TRILL_ERR_IO);
    assert_int_equal(version, 9);
    trill_channel_free(ch);
}

struct publisher_arg {
    trill_weight_channel *ch;
    const float *src;
    uint32_t version;
    atomic_int done;
    trill_status status;
};

static void *publish_thread(void *p) {
    struct publisher_arg *a = p;
    a->status = trill_channel_publish(a->ch, a->src, a->version, NULL);
    atomic_store(&a->done, 1);
    return NULL;
}

/* The reader holds v1; v2 goes into the other buffer at once; v3 would overwrite v1, so the
 * publisher waits until the reader lets go, and v1's data stays intact meanwhile. */
static void test_publisher_waits_for_held_buffer(void **state) {
    (void)state;
    enum { N = 4096 };
    static float w1[N], w2[N], w3[N];
    fill(w1, N, 1), fill(w2, N, 2), fill(w3, N, 3);
    trill_weight_channel *ch;
    assert_int_equal(trill_channel_create(N, &ch), TRILL_OK);
    assert_int_equal(trill_channel_publish(ch, w1, 1, NULL), TRILL_OK);
    trill_weight_view held;
    assert_int_equal(trill_channel_acquire(ch, 0, &held), TRILL_OK);
    assert_int_equal(held.version, 1);
    trill_publish_info info;
    assert_int_equal(trill_channel_publish(ch, w2, 2, &info), TRILL_OK); /* the free buffer */

    struct publisher_arg a = { .ch = ch, .src = w3, .version = 3 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, publish_thread, &a), 0);
    sleep_ms(100);
    assert_int_equal(atomic_load(&a.done), 0); /* still waiting for the reader */
    assert_int_equal(mismatches(held.data, N, 1), 0);
    uint32_t version;
    assert_int_equal(trill_channel_wait(ch, 0, 0, &version), TRILL_OK);
    assert_int_equal(version, 2); /* v2 stays the front while v3 waits */
    trill_weight_view newer;
    assert_int_equal(trill_channel_acquire(ch, 1, &newer), TRILL_OK);
    assert_int_equal(newer.version, 2);
    trill_channel_release(ch, &newer);

    trill_channel_release(ch, &held);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.status, TRILL_OK);
    assert_int_equal(trill_channel_acquire(ch, 2, &newer), TRILL_OK);
    assert_int_equal(newer.version, 3);
    assert_int_equal(mismatches(newer.data, N, 3), 0);
    trill_channel_release(ch, &newer);
    trill_channel_free(ch);
}

/* close() wakes a publisher blocked on a held buffer: it fails, publishes nothing, and the
 * reader's data is untouched and can still be released. */
static void test_close_unblocks_publisher(void **state) {
    (void)state;
    enum { N = 4096 };
    static float w1[N], w2[N], w3[N];
    fill(w1, N, 1), fill(w2, N, 2), fill(w3, N, 3);
    trill_weight_channel *ch;
    assert_int_equal(trill_channel_create(N, &ch), TRILL_OK);
    assert_int_equal(trill_channel_publish(ch, w1, 1, NULL), TRILL_OK);
    trill_weight_view held;
    assert_int_equal(trill_channel_acquire(ch, 0, &held), TRILL_OK);
    assert_int_equal(trill_channel_publish(ch, w2, 2, NULL), TRILL_OK);

    struct publisher_arg a = { .ch = ch, .src = w3, .version = 3 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, publish_thread, &a), 0);
    sleep_ms(50);
    assert_int_equal(atomic_load(&a.done), 0);
    trill_channel_close(ch);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.status, TRILL_ERR_IO);
    assert_int_equal(mismatches(held.data, N, 1), 0);
    trill_channel_release(ch, &held);
    trill_channel_free(ch);
}

struct waiter_arg {
    trill_weight_channel *ch;
    uint32_t at_least;
    double timeout_s;
    uint32_t version;
    trill_status status;
};

static void *wait_thread(void *p) {
    struct waiter_arg *a = p;
    a->status = trill_channel_wait(a->ch, a->at_least, a->timeout_s, &a->version);
    return NULL;
}

static void test_wait(void **state) {
    (void)state;
    enum { N = 64 };
    float w[N];
    fill(w, N, 1);
    trill_weight_channel *ch;
    assert_int_equal(trill_channel_create(N, &ch), TRILL_OK);

    /* times out with the newest version (none yet) */
    uint32_t version = 99;
    double t0 = trill_now();
    assert_int_equal(trill_channel_wait(ch, 1, 0.05, &version), TRILL_OK);
    double waited = trill_now() - t0;
    assert_int_equal(version, 0);
    assert_true(waited >= 0.045);
    assert_true(waited < 60.0); /* returned; only a hang exceeds this, however loaded the machine */

    /* wakes when a publish reaches the version, not before */
    struct waiter_arg a = { .ch = ch, .at_least = 2, .timeout_s = -1 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, wait_thread, &a), 0);
    assert_int_equal(trill_channel_publish(ch, w, 1, NULL), TRILL_OK);
    sleep_ms(20);
    assert_int_equal(trill_channel_publish(ch, w, 2, NULL), TRILL_OK);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(a.status, TRILL_OK);
    assert_int_equal(a.version, 2);

    /* already there: returns at once, not after the (hour-long) timeout */
    t0 = trill_now();
    assert_int_equal(trill_channel_wait(ch, 2, 3600, &version), TRILL_OK);
    assert_int_equal(version, 2);
    assert_true(trill_now() - t0 < 60.0);
    trill_channel_free(ch);
}

/* close() wakes waiters with no time limit and with a long one (an hour: the bound below only
 * fails if close did not wake it, whatever the load). */
static void test_close_unblocks_waiter(void **state) {
    (void)state;
    trill_weight_channel *ch;
    assert_int_equal(trill_channel_create(16, &ch), TRILL_OK);
    struct waiter_arg a = { .ch = ch, .at_least = 1, .timeout_s = -1 };
    struct waiter_arg b = { .ch = ch, .at_least = 1, .timeout_s = 3600 };
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, wait_thread, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, wait_thread, &b), 0);
    sleep_ms(50);
    double t0 = trill_now();
    trill_channel_close(ch);
    assert_int_equal(pthread_join(ta, NULL), 0);
    assert_int_equal(pthread_join(tb, NULL), 0);
    assert_true(trill_now() - t0 < 60.0);
    assert_int_equal(a.status, TRILL_ERR_IO);
    assert_int_equal(b.status, TRILL_ERR_IO);
    assert_int_equal(a.version, 0);
    trill_channel_free(ch);
}

/* ---- stress: one publisher, two readers ---- */

/* Rounds of STRESS_ROUND versions published as fast as the channel lets the publisher, racing
 * the readers. At the end of each round the publisher waits until both readers hold its last
 * version v, then goes on: v + 1 goes into the other buffer, and v + 2 must wait for both to
 * let go of v, which they hold until v + 2 appears (only a publisher that ignored the hold) or
 * 20 ms pass, then check again. So however the machine schedules the threads, every reader
 * checks at least one version per round, each while the publisher is trying to overwrite it:
 * the counts below are guaranteed by the handshake, not by time (the 20 ms only bound how long
 * a correct channel is given to go wrong). */
enum { STRESS_N = 8192, STRESS_VERSIONS = 2000, STRESS_ROUND = 100 };
/* A reader that makes no progress for this long is stuck (a lost wake-up, a deadlock): a hang
 * guard, far beyond any scheduling delay. */
#define STRESS_STUCK_SECONDS 120.0

struct stress {
    trill_weight_channel *ch;
    atomic_int done;
    atomic_long reads[2];      /* versions each reader has checked */
    atomic_uint last_read[2];  /* the newest version each reader holds or has checked */
    uint32_t published;        /* written by the publisher, read after join */
    int stuck;                 /* a handshake timed out */
    trill_status pub_status;
};

struct reader {
    struct stress *s;
    int id;
    long torn, bad_checksum, not_newer, overtaken;
    trill_status status;
};

static void *stress_publisher(void *p) {
    struct stress *s = p;
    float *w = malloc(STRESS_N * sizeof *w);
    s->pub_status = TRILL_OK;
    uint32_t v = 1;
    for (; w && v <= STRESS_VERSIONS && !s->stuck; v++) {
        fill(w, STRESS_N, v);
        s->pub_status = trill_channel_publish(s->ch, w, v, NULL);
        if (s->pub_status != TRILL_OK) break;
        if (v % STRESS_ROUND) continue;
        const double t0 = trill_now();
        while (atomic_load(&s->last_read[0]) < v || atomic_load(&s->last_read[1]) < v) {
            if (trill_now() - t0 > STRESS_STUCK_SECONDS) {
                s->stuck = 1;
                break;
            }
            sleep_ms(1);
        }
    }
    s->published = v - 1;
    free(w);
    atomic_store(&s->done, 1);
    return NULL;
}

/* Checks each version at acquire, then holds it while checking twice more (a publisher that
 * ignored the hold would be writing into it by then), and that versions only go up. */
static void *stress_reader(void *p) {
    struct reader *r = p;
    uint32_t have = 0;
    r->status = TRILL_OK;
    while (!atomic_load(&r->s->done)) {
        trill_weight_view view;
        r->status = trill_channel_acquire(r->s->ch, have, &view);
        if (r->status != TRILL_OK) break;
        if (!view.data) {
            sched_yield(); /* nothing new: let the publisher run */
            continue;
        }
        r->not_newer += view.version <= have;
        size_t bad = mismatches(view.data, view.n, view.version);
        r->bad_checksum += trill_channel_checksum(view.data, view.n) != view.checksum;
        bad += mismatches(view.data, view.n, view.version);
        if (view.version % STRESS_ROUND == 0) { /* the end of a round: hold it against v + 2 */
            atomic_store(&r->s->last_read[r->id], view.version);
            uint32_t newest;
            trill_channel_wait(r->s->ch, view.version + 2, 0.02, &newest);
        }
        uint32_t after;
        trill_channel_wait(r->s->ch, 0, 0, &after);
        /* while v is held, v + 1 can go into the other buffer but v + 2 would need this one */
        r->overtaken += after >= view.version + 2;
        bad += mismatches(view.data, view.n, view.version);
        r->torn += bad != 0;
        have = view.version;
        trill_channel_release(r->s->ch, &view);
        atomic_fetch_add(&r->s->reads[r->id], 1);
        atomic_store(&r->s->last_read[r->id], have);
    }
    return NULL;
}

static void test_stress(void **state) {
    (void)state;
    struct stress s = { 0 };
    assert_int_equal(trill_channel_create(STRESS_N, &s.ch), TRILL_OK);
    struct reader r[2] = { { .s = &s, .id = 0 }, { .s = &s, .id = 1 } };
    pthread_t tp, tr[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&tr[i], NULL, stress_reader, &r[i]), 0);
    assert_int_equal(pthread_create(&tp, NULL, stress_publisher, &s), 0);
    assert_int_equal(pthread_join(tp, NULL), 0);
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(tr[i], NULL), 0);
    assert_int_equal(s.stuck, 0);
    assert_int_equal(s.pub_status, TRILL_OK);
    assert_int_equal(s.published, STRESS_VERSIONS);
    for (int i = 0; i < 2; i++) {
        print_message("reader %d: %ld versions checked of %u published, %ld torn, %ld bad checksums, "
                      "%ld overtaken while held\n", i, atomic_load(&s.reads[i]), s.published, r[i].torn,
                      r[i].bad_checksum, r[i].overtaken);
        assert_int_equal(r[i].status, TRILL_OK);
        assert_int_equal(r[i].torn, 0);
        assert_int_equal(r[i].bad_checksum, 0);
        assert_int_equal(r[i].not_newer, 0);
        assert_int_equal(r[i].overtaken, 0);
        assert_true(atomic_load(&s.reads[i]) >= STRESS_VERSIONS / STRESS_ROUND);
        assert_int_equal(atomic_load(&s.last_read[i]), STRESS_VERSIONS);
    }
    trill_channel_free(s.ch);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checksum_is_xxh64),
        cmocka_unit_test(test_publish_checksum_across_chunks),
        cmocka_unit_test(test_corruption_is_detected),
        cmocka_unit_test(test_create_refuses_empty),
        cmocka_unit_test(test_single_thread),
        cmocka_unit_test(test_publisher_waits_for_held_buffer),
        cmocka_unit_test(test_close_unblocks_publisher),
        cmocka_unit_test(test_wait),
        cmocka_unit_test(test_close_unblocks_waiter),
        cmocka_unit_test(test_stress),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
