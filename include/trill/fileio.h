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

/* rm -rf (nothing to do when path does not exist). */
trill_status trill_remove_tree(const char *path);

/* fsync of a directory: what a rename into it or out of it did is on disk. */
trill_status trill_fsync_dir(const char *path);

/* Renames folder `from` to `to` (which must not exist) and fsyncs both parents: after a crash
 * the folder is under one name or the other, whole. */
trill_status trill_rename_dir(const char *from, const char *to);

/* chmod of every folder (dir_mode) and file (file_mode) under and including path. */
trill_status trill_chmod_tree(const char *path, unsigned dir_mode, unsigned file_mode);

/* DIR/.lock, taken with flock (exclusive, never waiting) and held until *fd is closed or the
 * process ends however it ends (the kernel drops it, so a stale lock never blocks). The file
 * names its holder: "PID WHO". Held by another process: TRILL_ERR_INVALID, "LABEL DIR is in use
 * by another <its WHO> (process PID holds DIR/.lock); ...". *fd is -1 on failure. */
trill_status trill_lock_dir(const char *dir, const char *label, const char *who, int *fd);

/* PATH (created if absent) flocked exclusively, waiting for another holder to end (LABEL says so
 * in the log once); held until *fd is closed or the process ends. *fd is -1 on failure. */
trill_status trill_lock_file_wait(const char *path, const char *label, int *fd);

#endif
