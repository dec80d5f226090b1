/* Files: whole-file reads, crash-safe writes, paths.
 *
 * Writes go to "<path>.tmp.<pid>" and are fsync'ed and renamed over the final
 * name, then the directory is fsync'ed: a crash leaves either the old file or
 * the new one, never half of one. */
#ifndef TRILL_FILEIO_H
#define TRILL_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "trill/error.h"

/* Reads a whole file; *data is NUL-terminated (not counted in *len). Free with free(). */
trill_status trill_read_file(const char *path, char **data, size_t *len);

typedef struct trill_atomic_file {
    FILE *f;
    char *tmp_path;
    char *path;
} trill_atomic_file;

trill_status trill_atomic_open(trill_atomic_file *af, const char *path);
trill_status trill_atomic_write(trill_atomic_file *af, const void *data, size_t len);
/* Flushes, fsyncs and renames into place. On failure the temporary file is removed. */
trill_status trill_atomic_commit(trill_atomic_file *af);
/* Drops the temporary file; safe after a failed write or commit. */
void trill_atomic_abort(trill_atomic_file *af);

/* One-shot crash-safe write of a buffer. */
trill_status trill_write_file_atomic(const char *path, const void *data, size_t len);

/* mkdir -p */
trill_status trill_mkdir_p(const char *path);

/* "dir/name", malloc'ed. */
char *trill_path_join(const char *dir, const char *name);

int trill_file_exists(const char *path);

/* XXH64 (seed 0, libxxhash) of a whole file, and its size. */
trill_status trill_file_xxh64(const char *path, uint64_t *hash, size_t *bytes);

#endif
