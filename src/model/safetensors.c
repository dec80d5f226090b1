#include "trill/safetensors.h"
#include "base/alloc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trill/fileio.h"
#include "base/json.h"

struct trill_st_file {
    char *path;
    void *map; /* owned mapping, or NULL when parsed from caller memory */
    size_t map_len;
    json_t *header; /* owns the name strings the views point to */
    size_t n;
    trill_tensor_view *tensors; /* sorted by name */
};

static int cmp_view_name(const void *a, const void *b) {
    return strcmp(((const trill_tensor_view *)a)->name, ((const trill_tensor_view *)b)->name);
}

/* By (begin, end), as the reference implementation: empty tensors sort before a tensor at their offset. */
static int cmp_view_ptr_offset(const void *a, const void *b) {
    const trill_tensor_view *x = *(const trill_tensor_view *const *)a, *y = *(const trill_tensor_view *const *)b;
    if (x->data != y->data) return x->data < y->data ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static trill_status parse_shape(const json_t *shape, const char *path, const char *name, trill_tensor_view *t) {
    if (!json_is_array(shape) || json_array_size(shape) > TRILL_MAX_DIMS)
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": \"shape\" must be a list of at most %d sizes", path, name, TRILL_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        const json_t *v = json_array_get(shape, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": shape entry %d must be a non-negative integer", path, name, d);
        t->shape[d] = json_integer_value(v);
        if (__builtin_mul_overflow(numel, (size_t)t->shape[d], &numel))
            return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": shape overflows", path, name);
    }
    t->numel = numel;
    return TRILL_OK;
}

static trill_status parse_entry(const char *path, const char *name, const json_t *entry,
                                const unsigned char *data, size_t data_len, trill_tensor_view *t) {
    if (!json_is_object(entry))
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": expected an object, got %s", path, name, trill_json_type_name(entry));
    t->name = name;
    t->path = path;
    const json_t *dtype = json_object_get(entry, "dtype");
    if (!json_is_string(dtype))
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": \"dtype\" must be a string", path, name);
    if (trill_dtype_parse(json_string_value(dtype), &t->dtype) != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: tensor \"%s\": dtype \"%s\" is not supported (expected F32, BF16, F16, F8_E4M3 or U8)",
                           path, name, json_string_value(dtype));
    trill_status st = parse_shape(json_object_get(entry, "shape"), path, name, t);
    if (st) return st;
    const json_t *offs = json_object_get(entry, "data_offsets");
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)))
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": \"data_offsets\" must be [begin, end]", path, name);
    json_int_t begin = json_integer_value(json_array_get(offs, 0));
    json_int_t end = json_integer_value(json_array_get(offs, 1));
    if (begin < 0 || end < begin || (size_t)end > data_len)
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": data_offsets [%lld, %lld] outside the data section of %zu bytes",
                           path, name, (long long)begin, (long long)end, data_len);
    size_t expect;
    if (__builtin_mul_overflow(t->numel, trill_dtype_size(t->dtype), &expect))
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": shape overflows", path, name);
    if ((size_t)(end - begin) != expect)
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": data_offsets span %lld bytes but shape and dtype need %zu",
                           path, name, (long long)(end - begin), expect);
    t->data = data + begin;
    t->nbytes = expect;
    return TRILL_OK;
}

/* Tensors must tile the data section exactly: sorted by offset, each starts where the last ended. */
static trill_status check_tiling(trill_st_file *f, const unsigned char *data, size_t data_len) {
    const trill_tensor_view **order = trill_malloc((f->n ? f->n : 1) * sizeof *order);
    if (!order) return trill_error(TRILL_ERR_NOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < f->n; i++) order[i] = &f->tensors[i];
    qsort(order, f->n, sizeof *order, cmp_view_ptr_offset);
    const unsigned char *cursor = data;
    trill_status st = TRILL_OK;
    for (size_t i = 0; i < f->n && !st; i++) {
        const trill_tensor_view *t = order[i];
        if ((const unsigned char *)t->data < cursor)
            st = trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": data_offsets overlap the previous tensor \"%s\"",
                             f->path, t->name, order[i - 1]->name);
        else if ((const unsigned char *)t->data > cursor)
            st = trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": %zu unused bytes before its data_offsets",
                             f->path, t->name, (size_t)((const unsigned char *)t->data - cursor));
        else cursor += t->nbytes;
    }
    if (!st && cursor != data + data_len)
        st = trill_error(TRILL_ERR_INVALID, "%s: %zu bytes after the last tensor are not described by the header",
                         f->path, (size_t)(data + data_len - cursor));
    free(order);
    return st;
}

static trill_status parse_header(trill_st_file *f, const unsigned char *bytes, size_t len) {
    if (len < 8)
        return trill_error(TRILL_ERR_INVALID, "%s: file is %zu bytes, too short for a safetensors header length", f->path, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | bytes[i];
    if (hlen > TRILL_ST_MAX_HEADER)
        return trill_error(TRILL_ERR_INVALID, "%s: header length %llu exceeds the %u-byte limit", f->path,
                           (unsigned long long)hlen, TRILL_ST_MAX_HEADER);
    if (hlen > len - 8)
        return trill_error(TRILL_ERR_INVALID, "%s: header length %llu runs past the end of the %zu-byte file (truncated?)",
                           f->path, (unsigned long long)hlen, len);
    if (hlen == 0 || bytes[8] != '{')
        return trill_error(TRILL_ERR_INVALID, "%s: header must be a JSON object starting with '{'", f->path);
    char what[4200];
    snprintf(what, sizeof what, "%s: header", f->path);
    trill_status st = trill_json_parse(what, (const char *)bytes + 8, hlen, &f->header);
    if (st) return st;

    const unsigned char *data = bytes + 8 + hlen;
    size_t data_len = len - 8 - hlen;
    size_t n_entries = json_object_size(f->header);
    f->tensors = trill_calloc(n_entries ? n_entries : 1, sizeof *f->tensors);
    if (!f->tensors) return trill_error(TRILL_ERR_NOMEM, "%s: out of memory", f->path);
    const char *name;
    json_t *entry;
    json_object_foreach(f->header, name, entry) {
        if (strcmp(name, "__metadata__") == 0) {
            if (!json_is_object(entry) && !json_is_null(entry))
                return trill_error(TRILL_ERR_INVALID, "%s: \"__metadata__\" must be an object of strings", f->path);
            continue;
        }
        if ((st = parse_entry(f->path, name, entry, data, data_len, &f->tensors[f->n]))) return st;
        f->n++;
    }
    if ((st = check_tiling(f, data, data_len))) return st;
    qsort(f->tensors, f->n, sizeof *f->tensors, cmp_view_name);
    return TRILL_OK;
}

trill_status trill_st_parse(const char *path, const void *bytes, size_t len, trill_st_file **out) {
    trill_st_file *f = trill_calloc(1, sizeof *f);
    if (!f || !(f->path = trill_strdup(path))) {
        free(f);
        return trill_error(TRILL_ERR_NOMEM, "%s: out of memory", path);
    }
    trill_status st = parse_header(f, bytes, len);
    if (st) { trill_st_close(f); return st; }
    *out = f;
    return TRILL_OK;
}

trill_status trill_st_open(const char *path, trill_st_file **out) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return trill_error(TRILL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return trill_error(TRILL_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    size_t len = (size_t)sb.st_size;
    if (len < 8) {
        close(fd);
        return trill_error(TRILL_ERR_INVALID, "%s: file is %zu bytes, too short for a safetensors header length", path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return trill_error(TRILL_ERR_IO, "%s: cannot mmap: %s", path, strerror(errno));
    trill_status st = trill_st_parse(path, map, len, out);
    if (st) { munmap(map, len); return st; }
    (*out)->map = map;
    (*out)->map_len = len;
    return TRILL_OK;
}

void trill_st_close(trill_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    json_decref(f->header);
    free(f->tensors);
    free(f->path);
    free(f);
}

size_t trill_st_count(const trill_st_file *f) { return f->n; }
const trill_tensor_view *trill_st_tensor(const trill_st_file *f, size_t i) { return &f->tensors[i]; }

const trill_tensor_view *trill_st_find(const trill_st_file *f, const char *name) {
    trill_tensor_view key = { .name = name };
    return bsearch(&key, f->tensors, f->n, sizeof key, cmp_view_name);
}

/* ---- checkpoint folders ---------------------------------------------------------------- */

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

struct trill_checkpoint {
    size_t n_files;
    trill_st_file **files;
    size_t n;
    const trill_tensor_view **index; /* all tensors, sorted by name */
};

static int cmp_view_ptr_name(const void *a, const void *b) {
    return strcmp((*(const trill_tensor_view *const *)a)->name, (*(const trill_tensor_view *const *)b)->name);
}

void trill_checkpoint_close(trill_checkpoint *ck) {
    if (!ck) return;
    for (size_t i = 0; i < ck->n_files; i++) trill_st_close(ck->files[i]);
    free(ck->files);
    free(ck->index);
    free(ck);
}

static trill_status add_file(trill_checkpoint *ck, const char *path) {
    trill_st_file **grown = trill_realloc(ck->files, (ck->n_files + 1) * sizeof *grown);
    if (!grown) return trill_error(TRILL_ERR_NOMEM, "%s: out of memory", path);
    ck->files = grown;
    trill_status st = trill_st_open(path, &ck->files[ck->n_files]);
    if (!st) ck->n_files++;
    return st;
}

static bool safe_shard_name(const char *name) {
    return name[0] && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static trill_status open_sharded(trill_checkpoint *ck, const char *dir, const char *index_path) {
    json_t *root;
    trill_status st = trill_json_load_file(index_path, &root);
    if (st) return st;
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) {
        json_decref(root);
        return trill_error(TRILL_ERR_INVALID, "%s: field \"weight_map\": expected an object {tensor name: shard file}", index_path);
    }
    /* Open each shard named in the weight map once. */
    const char *name;
    json_t *file;
    json_t *opened = json_object(); /* shard file name -> index into ck->files */
    if (!opened) st = trill_error(TRILL_ERR_NOMEM, "%s: out of memory", index_path);
    if (!st) json_object_foreach(map, name, file) {
        if (!json_is_string(file) || !safe_shard_name(json_string_value(file))) {
            st = trill_error(TRILL_ERR_INVALID, "%s: weight_map[\"%s\"]: %s%s%s is not a file name in the same folder",
                             index_path, name, json_is_string(file) ? "\"" : "", json_is_string(file) ? json_string_value(file) : "a non-string",
                             json_is_string(file) ? "\"" : "");
            break;
        }
        if (json_object_get(opened, json_string_value(file))) continue;
        char *path = trill_path_join(dir, json_string_value(file));
        st = path ? add_file(ck, path) : trill_error(TRILL_ERR_NOMEM, "out of memory");
        free(path);
        if (st) {
            trill_error_context("%s: shard of tensor \"%s\"", index_path, name);
            break;
        }
        if (json_object_set_new(opened, json_string_value(file), json_integer((json_int_t)ck->n_files - 1))) {
            st = trill_error(TRILL_ERR_NOMEM, "%s: out of memory", index_path);
            break;
        }
    }
    /* Every listed tensor must be in its shard, and every shard tensor must be listed there. */
    if (!st) json_object_foreach(map, name, file) {
        trill_st_file *f = ck->files[json_integer_value(json_object_get(opened, json_string_value(file)))];
        if (!trill_st_find(f, name)) {
            st = trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\" is listed in %s but missing from that shard",
                             f->path, name, index_path);
            break;
        }
    }
    for (size_t i = 0; !st && i < ck->n_files; i++) {
        trill_st_file *f = ck->files[i];
        for (size_t t = 0; t < f->n; t++) {
            const json_t *where = json_object_get(map, f->tensors[t].name);
            if (!where || ck->files[json_integer_value(json_object_get(opened, json_string_value(where)))] != f) {
                st = trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\" is not listed for this shard in %s",
                                 f->path, f->tensors[t].name, index_path);
                break;
            }
        }
    }
    json_decref(opened);
    json_decref(root);
    return st;
}

trill_status trill_checkpoint_open(const char *dir, trill_checkpoint **out) {
    trill_checkpoint *ck = trill_calloc(1, sizeof *ck);
    char *index_path = trill_path_join(dir, INDEX_NAME);
    char *single_path = trill_path_join(dir, SINGLE_NAME);
    trill_status st = TRILL_OK;
    if (!ck || !index_path || !single_path) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    else if (trill_file_exists(index_path)) st = open_sharded(ck, dir, index_path);
    else if (trill_file_exists(single_path)) st = add_file(ck, single_path);
    else st = trill_error(TRILL_ERR_IO, "%s: no %s or %s found", dir, SINGLE_NAME, INDEX_NAME);
    free(index_path);
    free(single_path);

    if (!st) {
        for (size_t i = 0; i < ck->n_files; i++) ck->n += ck->files[i]->n;
        ck->index = trill_malloc((ck->n ? ck->n : 1) * sizeof *ck->index);
        if (!ck->index) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    if (!st) {
        size_t k = 0;
        for (size_t i = 0; i < ck->n_files; i++)
            for (size_t t = 0; t < ck->files[i]->n; t++) ck->index[k++] = &ck->files[i]->tensors[t];
        qsort(ck->index, ck->n, sizeof *ck->index, cmp_view_ptr_name);
    }
    if (st) { trill_checkpoint_close(ck); return st; }
    *out = ck;
    return TRILL_OK;
}

size_t trill_checkpoint_count(const trill_checkpoint *ck) { return ck->n; }
size_t trill_checkpoint_file_count(const trill_checkpoint *ck) { return ck->n_files; }
const trill_tensor_view *trill_checkpoint_tensor(const trill_checkpoint *ck, size_t i) { return ck->index[i]; }

const trill_tensor_view *trill_checkpoint_find(const trill_checkpoint *ck, const char *name) {
    trill_tensor_view key = { .name = name };
    const trill_tensor_view *kp = &key;
    const trill_tensor_view **hit = bsearch(&kp, ck->index, ck->n, sizeof *ck->index, cmp_view_ptr_name);
    return hit ? *hit : NULL;
}

/* ---- writing ---------------------------------------------------------------------------- */

size_t trill_tensor_out_numel(const trill_tensor_out *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

static trill_status write_tensor_data(trill_atomic_file *af, const trill_tensor_out *t, trill_dtype dtype) {
    size_t numel = trill_tensor_out_numel(t);
    if (t->src_dtype == dtype) return trill_atomic_write(af, t->data, numel * trill_dtype_size(dtype));
    enum { CHUNK = 1 << 16 };
    float *wide = trill_malloc(CHUNK * sizeof(float));
    unsigned char *narrow = trill_malloc(CHUNK * 4);
    trill_status st = (wide && narrow) ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    const unsigned char *src = t->data;
    for (size_t i = 0; i < numel && !st; i += CHUNK) {
        size_t m = numel - i < CHUNK ? numel - i : CHUNK;
        trill_to_f32(wide, src + i * trill_dtype_size(t->src_dtype), t->src_dtype, m);
        trill_from_f32(narrow, wide, dtype, m);
        st = trill_atomic_write(af, narrow, m * trill_dtype_size(dtype));
    }
    free(wide);
    free(narrow);
    return st;
}

/* What a reader would refuse is refused before anything is written. */
static trill_status check_tensor_out(const char *path, const trill_tensor_out *t, const json_t *header) {
    if (!t->name || !t->name[0] || strcmp(t->name, "__metadata__") == 0)
        return trill_error(TRILL_ERR_INVALID, "%s: tensor name \"%s\" is not allowed", path, t->name ? t->name : "(null)");
    if (json_object_get(header, t->name))
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\" given twice", path, t->name);
    if (t->ndim < 0 || t->ndim > TRILL_MAX_DIMS)
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": %d dimensions (at most %d)", path, t->name, t->ndim, TRILL_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] < 0)
            return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": negative size in dimension %d", path, t->name, d);
    return TRILL_OK;
}

trill_status trill_st_write(const char *path, const trill_tensor_out *tensors, size_t n, trill_dtype dtype) {
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory for a file name");
    if (dtype == TRILL_F8_E4M3 || dtype == TRILL_U8) /* FP8 means nothing without its block scales, U8 is MXFP4's codes */
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: writing %s is not supported (expected F32, BF16 or F16)", path, trill_dtype_name(dtype));
    json_t *header = json_object();
    if (!header || json_object_set_new(header, "__metadata__", json_pack("{s:s}", "format", "pt"))) {
        json_decref(header);
        return trill_error(TRILL_ERR_NOMEM, "%s: out of memory for the header", path);
    }
    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        trill_status st = check_tensor_out(path, &tensors[i], header);
        if (st) { json_decref(header); return st; }
        json_t *shape = json_array();
        bool ok = shape != NULL;
        for (int d = 0; d < tensors[i].ndim; d++) ok &= json_array_append_new(shape, json_integer(tensors[i].shape[d])) == 0;
        size_t nbytes = trill_tensor_out_numel(&tensors[i]) * trill_dtype_size(dtype);
        json_t *entry = ok ? json_pack("{s:s, s:O, s:[I,I]}", "dtype", trill_dtype_name(dtype), "shape", shape, "data_offsets",
                                       (json_int_t)offset, (json_int_t)(offset + nbytes))
                           : NULL;
        json_decref(shape);
        errno = 0; /* jansson refuses a key that is not UTF-8, or fails to allocate (errno ENOMEM) */
        if (!entry || json_object_set_new(header, tensors[i].name, entry) != 0) {
            const bool oom = !entry || errno == ENOMEM;
            json_decref(header);
            if (oom) return trill_error(TRILL_ERR_NOMEM, "%s: out of memory for the header", path);
            return trill_error(TRILL_ERR_INVALID, "%s: tensor name \"%s\" is not valid UTF-8", path, tensors[i].name);
        }
        offset += nbytes;
    }
    char *text = json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(header);
    if (!text) return trill_error(TRILL_ERR_NOMEM, "%s: out of memory serialising the header", path);
    size_t hlen = strlen(text);
    size_t padded = (hlen + 7) & ~(size_t)7; /* keeps the data section 8-byte aligned */
    unsigned char prefix[8];
    for (int i = 0; i < 8; i++) prefix[i] = (unsigned char)((uint64_t)padded >> (8 * i));

    trill_atomic_file af;
    trill_status st = trill_atomic_open(&af, path);
    if (!st) st = trill_atomic_write(&af, prefix, 8);
    if (!st) st = trill_atomic_write(&af, text, hlen);
    if (!st) st = trill_atomic_write(&af, "        ", padded - hlen);
    for (size_t i = 0; i < n && !st; i++) st = write_tensor_data(&af, &tensors[i], dtype);
    free(text);
    if (st) { trill_atomic_abort(&af); return st; }
    return trill_atomic_commit(&af);
}

/* Removes model-XXXXX-of-YYYYY.safetensors files of any other shard count (all of them when
 * n_shards is 0): left over from an earlier checkpoint written into the same folder. */
static void remove_stale_shards(const char *dir, size_t n_shards) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned i, of;
        char tail[32];
        if (sscanf(e->d_name, "model-%5u-of-%5u%31s", &i, &of, tail) != 3 || strcmp(tail, ".safetensors") != 0) continue;
        if (of == n_shards) continue;
        char *path = trill_path_join(dir, e->d_name);
        if (path) unlink(path);
        free(path);
    }
    closedir(d);
}

trill_status trill_checkpoint_write(const char *dir, const trill_tensor_out *tensors, size_t n,
                                    trill_dtype dtype, size_t max_shard_bytes) {
    char *index_path = trill_path_join(dir, INDEX_NAME);
    char *single_path = trill_path_join(dir, SINGLE_NAME);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += trill_tensor_out_numel(&tensors[i]) * trill_dtype_size(dtype);
    trill_status st = TRILL_OK;
    if (!index_path || !single_path) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    else if (max_shard_bytes == 0 || total <= max_shard_bytes) {
        st = trill_st_write(single_path, tensors, n, dtype);
        if (!st) {
            unlink(index_path); /* a stale index would shadow the new file */
            remove_stale_shards(dir, 0);
        }
    } else {
        /* Greedy split in order: a shard closes when the next tensor would overflow it. */
        size_t *first = trill_malloc((n + 1) * sizeof *first), n_shards = 0, bytes = 0;
        if (!first) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (size_t i = 0; !st && i < n; i++) {
            size_t b = trill_tensor_out_numel(&tensors[i]) * trill_dtype_size(dtype);
            if (i == 0 || (bytes + b > max_shard_bytes && bytes > 0)) { first[n_shards++] = i; bytes = 0; }
            bytes += b;
        }
        if (!st) first[n_shards] = n;
        json_t *map = json_object();
        if (!st && !map) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (size_t s = 0; !st && s < n_shards; s++) {
            char name[64];
            snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, n_shards);
            char *path = trill_path_join(dir, name);
            st = path ? trill_st_write(path, tensors + first[s], first[s + 1] - first[s], dtype)
                      : trill_error(TRILL_ERR_NOMEM, "out of memory");
            free(path);
            for (size_t i = first[s]; !st && i < first[s + 1]; i++)
                if (json_object_set_new(map, tensors[i].name, json_string(name)))
                    st = trill_error(TRILL_ERR_NOMEM, "%s: out of memory for the index", index_path);
        }
        if (!st) {
            json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map", map);
            st = index ? trill_json_write_file(index_path, index) : trill_error(TRILL_ERR_NOMEM, "%s: out of memory for the index", index_path);
            json_decref(index);
            if (!st) {
                unlink(single_path);
                remove_stale_shards(dir, n_shards);
            }
        }
        json_decref(map);
        free(first);
    }
    free(index_path);
    free(single_path);
    return st;
}
