#include "trill/fileio.h"
#include "base/alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
