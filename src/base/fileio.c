#include "trill/fileio.h"
#include "base/alloc.h"
#include "trill/log.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

trill_status trill_read_file(const char *path, char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return trill_error(TRILL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return trill_error(TRILL_ERR_IO, "%s: is a directory, expected a file", path);
    }
    size_t cap = 4096, n = 0;
    char *buf = trill_malloc(cap);
    for (;;) {
        if (!buf) { fclose(f); return trill_error(TRILL_ERR_NOMEM, "%s: out of memory reading file", path); }
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        cap *= 2;
        char *grown = trill_realloc(buf, cap);
        if (!grown) free(buf);
        buf = grown;
    }
    int failed = ferror(f) ? errno : 0;
    fclose(f);
    if (failed) { free(buf); return trill_error(TRILL_ERR_IO, "%s: read error: %s", path, strerror(failed)); }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return TRILL_OK;
}

trill_status trill_atomic_open(trill_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    size_t n = strlen(path) + 32;
    af->path = trill_strdup(path);
    af->tmp_path = trill_malloc(n);
    if (!af->path || !af->tmp_path) {
        trill_atomic_abort(af);
        return trill_error(TRILL_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(af->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    af->f = fopen(af->tmp_path, "wb");
    if (!af->f) {
        trill_status st = trill_error(TRILL_ERR_IO, "%s: cannot create: %s", af->tmp_path, strerror(errno));
        trill_atomic_abort(af);
        return st;
    }
    return TRILL_OK;
}

trill_status trill_atomic_write(trill_atomic_file *af, const void *data, size_t len) {
    if (len && fwrite(data, 1, len, af->f) != len)
        return trill_error(TRILL_ERR_IO, "%s: write failed: %s", af->tmp_path, strerror(errno));
    return TRILL_OK;
}

/* fsyncs the folder holding `path`, its name built in buf (room for path): nothing to allocate
 * once the file has been renamed into place. */
static void fsync_parent_dir(const char *path, char *buf) {
    strcpy(buf, path);
    int fd = open(dirname(buf), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

trill_status trill_atomic_commit(trill_atomic_file *af) {
    trill_status st = TRILL_OK;
    if (fflush(af->f) != 0 || fsync(fileno(af->f)) != 0)
        st = trill_error(TRILL_ERR_IO, "%s: flush failed: %s", af->tmp_path, strerror(errno));
    if (fclose(af->f) != 0 && st == TRILL_OK)
        st = trill_error(TRILL_ERR_IO, "%s: close failed: %s", af->tmp_path, strerror(errno));
    af->f = NULL;
    if (st == TRILL_OK && rename(af->tmp_path, af->path) != 0)
        st = trill_error(TRILL_ERR_IO, "%s: cannot rename into place: %s", af->path, strerror(errno));
    if (st == TRILL_OK) {
        fsync_parent_dir(af->path, af->tmp_path); /* tmp_path (longer than path) is free now */
        free(af->tmp_path);
        af->tmp_path = NULL;
    }
    trill_atomic_abort(af); /* frees names; unlinks the temporary only if it still exists */
    return st;
}

void trill_atomic_abort(trill_atomic_file *af) {
    if (af->f) fclose(af->f);
    if (af->tmp_path) unlink(af->tmp_path);
    free(af->tmp_path);
    free(af->path);
    memset(af, 0, sizeof *af);
}

trill_status trill_write_file_atomic(const char *path, const void *data, size_t len) {
    trill_atomic_file af;
    trill_status st = trill_atomic_open(&af, path);
    if (st) return st;
    if ((st = trill_atomic_write(&af, data, len))) { trill_atomic_abort(&af); return st; }
    return trill_atomic_commit(&af);
}

trill_status trill_mkdir_p(const char *path) {
    char *p = trill_strdup(path);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char saved = *s;
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                trill_status st = trill_error(TRILL_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
                free(p);
                return st;
            }
            *s = saved;
            if (!saved) break;
        }
    }
    free(p);
    return TRILL_OK;
}

char *trill_path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *out = trill_malloc(n);
    if (out) snprintf(out, n, "%s/%s", dir, name);
    return out;
}

int trill_file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

trill_status trill_file_xxh64(const char *path, uint64_t *hash, size_t *bytes) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return trill_error(TRILL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    trill_status st = fstat(fd, &sb) ? trill_error(TRILL_ERR_IO, "%s: cannot stat: %s", path, strerror(errno)) : TRILL_OK;
    if (!st && !S_ISREG(sb.st_mode)) st = trill_error(TRILL_ERR_IO, "%s: not a regular file", path);
    void *map = NULL;
    if (!st && sb.st_size > 0 && (map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
        map = NULL;
        st = trill_error(TRILL_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    }
    if (!st) {
        *hash = XXH64(map, (size_t)sb.st_size, 0);
        *bytes = (size_t)sb.st_size;
    }
    if (map) munmap(map, (size_t)sb.st_size);
    close(fd);
    return st;
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb, (void)type, (void)ftw;
    return remove(path);
}

trill_status trill_remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0 && errno == ENOENT) return TRILL_OK;
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return trill_error(TRILL_ERR_IO, "%s: cannot remove (%s)", path, strerror(errno));
    return TRILL_OK;
}

trill_status trill_fsync_dir(const char *path) {
    const int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return trill_error(TRILL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    const int r = fsync(fd);
    const int err = errno;
    close(fd);
    return r ? trill_error(TRILL_ERR_IO, "%s: fsync failed: %s", path, strerror(err)) : TRILL_OK;
}

/* The folder holding path ("." for a bare name), malloc'ed. */
static char *parent_of(const char *path) {
    char *copy = trill_strdup(path), *parent = copy ? trill_strdup(dirname(copy)) : NULL;
    free(copy);
    return parent;
}

trill_status trill_rename_dir(const char *from, const char *to) {
    char *a = parent_of(from), *b = parent_of(to);
    trill_status st = a && b ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && rename(from, to) != 0) st = trill_error(TRILL_ERR_IO, "%s: cannot rename to %s: %s", from, to, strerror(errno));
    if (!st) st = trill_fsync_dir(b);
    if (!st && strcmp(a, b) != 0) st = trill_fsync_dir(a);
    free(a);
    free(b);
    return st;
}

static _Thread_local unsigned g_dir_mode, g_file_mode; /* nftw has no context argument */

static int chmod_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb, (void)ftw;
    if (type == FTW_SL) return 0;
    return chmod(path, type == FTW_D || type == FTW_DP ? g_dir_mode : g_file_mode);
}

trill_status trill_chmod_tree(const char *path, unsigned dir_mode, unsigned file_mode) {
    g_dir_mode = dir_mode, g_file_mode = file_mode;
    if (nftw(path, chmod_entry, 16, FTW_PHYS) != 0) return trill_error(TRILL_ERR_IO, "%s: cannot change modes: %s", path, strerror(errno));
    return TRILL_OK;
}

/* PATH opened (created if absent) to be flocked; not inherited by child processes. */
static trill_status open_lock(const char *path, int *f) {
    *f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    return *f < 0 ? trill_error(TRILL_ERR_IO, "%s: cannot open: %s", path, strerror(errno)) : TRILL_OK;
}

trill_status trill_lock_file_wait(const char *path, const char *label, int *fd) {
    int f;
    trill_status st = open_lock(path, &f);
    *fd = -1;
    if (st) return st;
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        int rc = -1;
        if (errno == EWOULDBLOCK) {
            trill_log(TRILL_LOG_INFO, "%s: another process holds %s; waiting for it", label, path);
            while ((rc = flock(f, LOCK_EX)) != 0 && errno == EINTR) {}
        }
        if (rc != 0) {
            st = trill_error(TRILL_ERR_IO, "%s: cannot lock: %s", path, strerror(errno));
            close(f);
            return st;
        }
    }
    *fd = f;
    return TRILL_OK;
}

trill_status trill_lock_dir(const char *dir, const char *label, const char *who, int *fd) {
    *fd = -1;
    char *path = trill_path_join(dir, ".lock");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    int f = -1;
    trill_status st = open_lock(path, &f);
    if (!st && flock(f, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        char holder[160] = "";
        const ssize_t n = err == EWOULDBLOCK ? pread(f, holder, sizeof holder - 1, 0) : -1;
        if (n > 0) holder[strcspn(holder, "\n")] = '\0';
        char *space = strchr(holder, ' ');
        if (space) *space++ = '\0';
        st = err == EWOULDBLOCK ? trill_error(TRILL_ERR_INVALID, "%s %s is in use by another %s (process %s holds %s); wait for it to end "
                                              "or choose another %s", label, dir, space && *space ? space : who, n > 0 ? holder : "?", path, label)
                                : trill_error(TRILL_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
        close(f);
    } else if (!st) {
        char text[160];
        const int n = snprintf(text, sizeof text, "%ld %s\n", (long)getpid(), who);
        if (ftruncate(f, 0) != 0 || pwrite(f, text, (size_t)n, 0) != n) {
            st = trill_error(TRILL_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
            close(f);
        } else *fd = f;
    }
    free(path);
    return st;
}
