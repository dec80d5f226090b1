/* The weight channel: direct weight transfer from the trainer to the generator.
 *
 * In asynchronous RL the trainer and the generator run at the same time; after each optimizer
 * step the trainer publishes its new weights (a flat fp32 vector: the LoRA parameter block
 * `trill_lora.params`, or in merge mode the merged model's full fp32 parameter block) and the
 * generator picks up the newest version when it is ready for it. Publishing is one copy into
 * the back buffer of a double buffer and a flip of the front under a mutex: no serialisation,
 * no files.
 *
 * One publisher (the trainer) and any number of readers (generator threads). A buffer a reader
 * holds is never written: when the trainer wants to publish into the buffer a reader still
 * holds (the previous front), it waits on a condition variable until the reader releases it or
 * the channel is closed. Readers never wait; they get the newest version or nothing.
 *
 * The interface is small (publish / acquire / release, plus wait and close) so that the same
 * calls can later be carried between MPI ranks.
 *
 *   trainer                                  generator
 *   trill_channel_publish(ch, w, v, NULL)    trill_channel_acquire(ch, have, &view)
 *                                            if (view.data) { load view.data; have = view.version;
 *                                                             trill_channel_release(ch, &view); }
 *
 * Errors: a closed channel makes publish, acquire and wait return TRILL_ERR_IO ("weight channel
 * closed"), so an executor blocked on a failed peer wakes up instead of deadlocking. */
#ifndef TRILL_CHANNEL_H
#define TRILL_CHANNEL_H

#include <stddef.h>
#include <stdint.h>

#include "trill/error.h"

typedef struct trill_weight_channel trill_weight_channel;

/* A version a reader holds: data[n] stays unchanged until trill_channel_release. */
typedef struct trill_weight_view {
    const float *data; /* NULL: nothing held */
    size_t n;
    uint32_t version;
    uint64_t checksum; /* trill_channel_checksum(data, n), computed by the publisher */
} trill_weight_view;

/* What one publish cost the publisher (for metrics). */
typedef struct trill_publish_info {
    double wait_us;    /* blocked until a reader released the back buffer */
    double copy_us;    /* copy into the back buffer, checksum included */
    size_t bytes;      /* bytes copied: n * sizeof(float) */
    uint64_t checksum; /* of the published data */
} trill_publish_info;

/* A channel for vectors of n_floats (> 0) floats: two buffers, no version yet. */
trill_status trill_channel_create(size_t n_floats, trill_weight_channel **out);
/* Frees the channel; NULL is a no-op. No thread may be inside a call, no view may be held. */
void trill_channel_free(trill_weight_channel *ch);

size_t trill_channel_size(const trill_weight_channel *ch);

/* Trainer side: copies src[n] into the back buffer and makes it the front as `version`, which
 * must be greater than every version published before (so at least 1). Waits while a reader
 * holds the back buffer. One publisher: concurrent publishes are serialised. `info` may be NULL.
 * TRILL_ERR_INVALID for a version that does not increase, TRILL_ERR_IO when closed (before or
 * while waiting; nothing is published then). */
trill_status trill_channel_publish(trill_weight_channel *ch, const float *src, uint32_t version,
                                   trill_publish_info *info);

/* Generator side, never blocks: if the newest version is greater than `have`, holds it and
 * fills *view; otherwise sets view->data to NULL. Release every view taken. TRILL_ERR_IO when
 * the channel is closed (view->data NULL). */
trill_status trill_channel_acquire(trill_weight_channel *ch, uint32_t have, trill_weight_view *view);

/* Gives back a view from trill_channel_acquire (also after close) and sets view->data to NULL;
 * a view with data NULL is a no-op. */
void trill_channel_release(trill_weight_channel *ch, trill_weight_view *view);

/* Blocks until the newest version is >= at_least or timeout_s seconds have passed (< 0: no
 * limit, 0: just look) and sets *version to the newest (0 before the first publish); on a
 * timeout that is still below at_least — check it. TRILL_ERR_IO when closed. */
trill_status trill_channel_wait(trill_weight_channel *ch, uint32_t at_least, double timeout_s,
                                uint32_t *version);

/* Closes the channel: wakes every waiting publisher and waiter; from now on publish, acquire
 * and wait return TRILL_ERR_IO. Release still works. Idempotent. */
void trill_channel_close(trill_weight_channel *ch);

/* XXH64 (seed 0) of the n floats' bytes: a fast checksum to compare what was received with
 * what was sent (~10+ GB/s; not cryptographic). */
uint64_t trill_channel_checksum(const float *data, size_t n);

#endif
