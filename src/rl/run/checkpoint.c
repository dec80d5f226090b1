#include "rl/run/checkpoint.h"
#include "base/alloc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trill/fileio.h"
#include "trill/log.h"
#include "base/json.h"

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

/* Checkpoint folder names, sorted oldest first. */
static trill_status list_checkpoints(const char *dir, char ***names, int *n) {
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? TRILL_OK : trill_error(TRILL_ERR_IO, "%s: cannot list (%s)", dir, strerror(errno));
    struct dirent *e;
    int cap = 0;
    trill_status st = TRILL_OK;
    while (!st && (e = readdir(d))) {
        int step;
        char tail;
        if (sscanf(e->d_name, "step-%d%c", &step, &tail) != 1 || strlen(e->d_name) != 13) continue;
        if (*n == cap) {
            char **grown = trill_realloc(*names, sizeof(char *) * (size_t)(cap = cap ? 2 * cap : 8));
            if (!grown) { st = trill_error(TRILL_ERR_NOMEM, "out of memory"); break; }
            *names = grown;
        }
        if (!((*names)[*n] = trill_strdup(e->d_name))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else (*n)++;
    }
    closedir(d);
    for (int i = 1; i < *n; i++) /* insertion sort: fixed-width names sort by step */
        for (int j = i; j > 0 && strcmp((*names)[j - 1], (*names)[j]) > 0; j--) {
            char *t = (*names)[j]; (*names)[j] = (*names)[j - 1]; (*names)[j - 1] = t;
        }
    return st;
}

/* Takes checkpoint dir/name out of the step-* names at once (renamed to .del-NAME), then removes it:
 * killed at any point, the folder is whole under its name or not a checkpoint any more. */
static trill_status retire(const char *dir, const char *name) {
    char from[4200], to[4200];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    snprintf(to, sizeof to, "%s/.del-%s", dir, name);
    if (!trill_file_exists(from)) return TRILL_OK;
    trill_status st = trill_remove_tree(to);
    if (!st) st = trill_rename_dir(from, to);
    return st ? st : trill_remove_tree(to);
}

/* Removes what a killed retire left (.del-* folders). */
static trill_status sweep_retired(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? TRILL_OK : trill_error(TRILL_ERR_IO, "%s: cannot list (%s)", dir, strerror(errno));
    trill_status st = TRILL_OK;
    struct dirent *e;
    char path[4096 + 256 + 8]; /* dir's buffer and a file name */
    while (!st && (e = readdir(d)))
        if (strncmp(e->d_name, ".del-", 5) == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            st = trill_remove_tree(path);
        }
    closedir(d);
    return st;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static trill_status write_config(const char *path, const trill_run_config *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_run_config_write(c, f);
    fclose(f);
    if (!st) st = trill_write_file_atomic(path, buf, len);
    free(buf);
    return st;
}

/* ---- the manifest: every file's size and XXH64, and the base model's identity ---- */

#define MANIFEST "manifest.json"

typedef struct file_list {
    const char *root;
    json_t *files;   /* relative path -> {bytes, xxh64} */
    trill_status st;
} file_list;

static _Thread_local file_list *g_walk; /* nftw has no context argument (the service writes manifests from several threads) */

static int add_file(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb; (void)ftw;
    if (type != FTW_F) return 0;
    const char *rel = path + strlen(g_walk->root) + 1;
    if (strcmp(rel, MANIFEST) == 0) return 0;
    uint64_t h;
    size_t bytes;
    if ((g_walk->st = trill_file_xxh64(path, &h, &bytes))) return 1;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
    if (json_object_set_new(g_walk->files, rel, json_pack("{s:I, s:s}", "bytes", (json_int_t)bytes, "xxh64", hex))) {
        g_walk->st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        return 1;
    }
    return 0;
}

static trill_status list_files(const char *root, json_t **files) {
    file_list w = { .root = root, .files = json_object() };
    if (!w.files) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    g_walk = &w;
    if (nftw(root, add_file, 16, FTW_PHYS) != 0 && !w.st) w.st = trill_error(TRILL_ERR_IO, "%s: cannot list (%s)", root, strerror(errno));
    g_walk = NULL;
    if (w.st) { json_decref(w.files); return w.st; }
    *files = w.files;
    return TRILL_OK;
}

static void hex64(uint64_t v, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

/* Sorted *.safetensors names of a model folder. */
static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

trill_status trill_rl_model_identity(const char *model_dir, rl_identity *id) {
    memset(id, 0, sizeof *id);
    char *path = trill_path_join(model_dir, "config.json");
    size_t bytes;
    trill_status st = path ? trill_file_xxh64(path, &id->config_hash, &bytes) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(path);
    DIR *d = st ? NULL : opendir(model_dir);
    if (!st && !d) st = trill_error(TRILL_ERR_IO, "%s: cannot list (%s)", model_dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    for (struct dirent *e; !st && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors") != 0) continue;
        if (n == cap) {
            char **grown = trill_realloc(names, sizeof *names * (size_t)(cap = cap ? 2 * cap : 8));
            if (!grown) { st = trill_error(TRILL_ERR_NOMEM, "out of memory"); break; }
            names = grown;
        }
        if (!(names[n] = trill_strdup(e->d_name))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else n++;
    }
    if (d) closedir(d);
    if (names) qsort(names, (size_t)n, sizeof *names, by_name);
    XXH64_state_t *acc = XXH64_createState();
    if (!st && !acc) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) XXH64_reset(acc, 0);
    for (int i = 0; i < n && !st; i++) { /* (name, size, hash) of every weight file, in name order */
        uint64_t h;
        char *file = trill_path_join(model_dir, names[i]);
        st = file ? trill_file_xxh64(file, &h, &bytes) : trill_error(TRILL_ERR_NOMEM, "out of memory");
        free(file);
        if (st) break;
        uint64_t size = bytes;
        XXH64_update(acc, names[i], strlen(names[i]) + 1);
        XXH64_update(acc, &size, sizeof size);
        XXH64_update(acc, &h, sizeof h);
        id->weights_bytes += bytes;
    }
    if (!st) id->weights_hash = XXH64_digest(acc);
    XXH64_freeState(acc);
    free_names(names, n);
    if (st) trill_error_context("the identity of base model %s", model_dir);
    return st;
}

trill_status trill_rl_manifest_write(const char *dir, const rl_identity *id) {
    json_t *files = NULL;
    trill_status st = list_files(dir, &files);
    if (st) return st;
    char ch[17], wh[17];
    hex64(id->config_hash, ch);
    hex64(id->weights_hash, wh);
    json_t *m = json_pack("{s:i, s:{s:s, s:s, s:I}, s:O}", "format", 1, "base_model", "config_xxh64", ch, "weights_xxh64", wh,
                          "weights_bytes", (json_int_t)id->weights_bytes, "files", files);
    json_decref(files);
    char *path = trill_path_join(dir, MANIFEST);
    st = m && path ? trill_json_write_file(path, m) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_decref(m);
    free(path);
    return st;
}

trill_status trill_rl_checkpoint_write(const char *run_dir, int step, const trill_run_config *c, const json_t *state,
                                       trill_status (*write_parts)(void *ctx, const char *dir), void *ctx, const rl_identity *base, int keep) {
    char dir[4096], tmp[4160], final[4160], path[4200];
    snprintf(dir, sizeof dir, "%s/checkpoints", run_dir);
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-%08d", dir, step);
    snprintf(final, sizeof final, "%s/step-%08d", dir, step);
    trill_status st = trill_mkdir_p(dir);
    if (!st) st = sweep_retired(dir);
    if (!st) st = trill_remove_tree(tmp); /* left by a crash */
    if (!st) st = trill_mkdir_p(tmp);
    if (!st) st = write_parts(ctx, tmp);
    if (!st) { snprintf(path, sizeof path, "%s/config.yaml", tmp); st = write_config(path, c); }
    if (!st) { snprintf(path, sizeof path, "%s/state.json", tmp); st = trill_json_write_file(path, state); }
    if (!st) st = trill_rl_manifest_write(tmp, base); /* last: a checkpoint with a manifest is complete */
    if (!st) st = trill_fsync_dir(tmp);
    if (!st) st = retire(dir, final + strlen(dir) + 1); /* the same step saved again after a resume */
    if (!st) st = trill_rename_dir(tmp, final);
    if (st) {
        trill_error_context("checkpoint %s", final);
        char why[2048];
        snprintf(why, sizeof why, "%s", trill_error_message());
        trill_remove_tree(tmp); /* best effort: the next start removes it too */
        return trill_error(st, "%s", why);
    }
    char **names;
    int n;
    if (keep > 0 && !(st = list_checkpoints(dir, &names, &n))) {
        for (int i = 0; i + keep < n && !st; i++) st = retire(dir, names[i]);
        free_names(names, n);
    }
    return st;
}

typedef struct rl_parts { const trill_lora *lora; const trill_adamw *opt; } rl_parts;

/* An RL checkpoint's weights: adapter/ (PEFT layout) and optimizer.*. */
static trill_status write_rl_parts(void *ctx, const char *dir) {
    const rl_parts *p = ctx;
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter", dir);
    trill_status st = trill_lora_save(p->lora, path);
    if (!st) st = trill_fsync_dir(path);
    if (!st) { snprintf(path, sizeof path, "%s/optimizer", dir); st = trill_adamw_save(p->opt, path); }
    return st;
}

trill_status trill_rl_checkpoint_save(const char *run_dir, const trill_run_config *c, const rl_state *s, const trill_lora *lora,
                                const trill_adamw *opt, const rl_identity *base, int keep) {
    json_t *j = json_pack("{s:i, s:I, s:I, s:I}", "step", s->step, "data_position", (json_int_t)s->data_pos, "policy_version",
                          (json_int_t)s->version, "seed", (json_int_t)s->seed);
    if (!j) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    rl_parts parts = { lora, opt };
    trill_status st = trill_rl_checkpoint_write(run_dir, s->step, c, j, write_rl_parts, &parts, base, keep);
    json_decref(j);
    return st;
}

trill_status trill_rl_checkpoint_verify(const char *ckpt) {
    char *path = trill_path_join(ckpt, MANIFEST);
    json_t *m = NULL;
    trill_status st = path ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && !trill_file_exists(path))
        st = trill_error(TRILL_ERR_INVALID, "%s: no %s (it is written last: the checkpoint is incomplete)", ckpt, MANIFEST);
    if (!st) st = trill_json_load_file(path, &m);
    json_t *files = m ? json_object_get(m, "files") : NULL;
    if (!st && !json_is_object(files)) st = trill_error(TRILL_ERR_INVALID, "%s: no \"files\" object", path);
    const char *rel;
    json_t *want;
    if (!st) json_object_foreach(files, rel, want) {
        char *file = trill_path_join(ckpt, rel);
        uint64_t h;
        size_t bytes;
        const json_t *jb = json_object_get(want, "bytes"), *jh = json_object_get(want, "xxh64");
        char hex[17];
        if (!file) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else if (!json_is_integer(jb) || !json_is_string(jh)) st = trill_error(TRILL_ERR_INVALID, "%s: entry \"%s\" lacks bytes or xxh64", path, rel);
        else if (!trill_file_exists(file)) st = trill_error(TRILL_ERR_INVALID, "%s is missing", file);
        else if (!(st = trill_file_xxh64(file, &h, &bytes))) {
            hex64(h, hex);
            if ((json_int_t)bytes != json_integer_value(jb))
                st = trill_error(TRILL_ERR_INVALID, "%s is %zu bytes, the manifest says %lld", file, bytes, (long long)json_integer_value(jb));
            else if (strcmp(hex, json_string_value(jh)) != 0)
                st = trill_error(TRILL_ERR_INVALID, "%s has checksum %s, the manifest says %s", file, hex, json_string_value(jh));
        }
        free(file);
        if (st) break;
    }
    json_decref(m);
    free(path);
    return st;
}

trill_status trill_rl_checkpoint_check_base(const char *ckpt, const rl_identity *now, const char *model_dir) {
    char *path = trill_path_join(ckpt, MANIFEST);
    json_t *m = NULL;
    trill_status st = path ? trill_json_load_file(path, &m) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_t *b = m ? json_object_get(m, "base_model") : NULL;
    const char *ch = json_string_value(json_object_get(b, "config_xxh64")), *wh = json_string_value(json_object_get(b, "weights_xxh64"));
    char nc[17], nw[17];
    hex64(now->config_hash, nc);
    hex64(now->weights_hash, nw);
    if (!st && (!ch || !wh)) st = trill_error(TRILL_ERR_INVALID, "%s: no base_model identity", path);
    else if (!st && (strcmp(ch, nc) != 0 || strcmp(wh, nw) != 0))
        st = trill_error(TRILL_ERR_INVALID, "%s: made for another base model (config.json %s, weights %s); model %s has config.json %s, "
                         "weights %s", ckpt, ch, wh, model_dir, nc, nw);
    json_decref(m);
    free(path);
    return st;
}

trill_status trill_rl_checkpoint_latest(const char *run_dir, char **path, void (*skipped)(const char *ckpt, void *ctx), void *ctx) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/checkpoints", run_dir);
    char **names;
    int n;
    *path = NULL;
    trill_status st = list_checkpoints(dir, &names, &n);
    if (st) return st;
    for (int i = n - 1; i >= 0 && !st && !*path; i--) {
        char *ckpt = trill_path_join(dir, names[i]);
        if (!ckpt) { st = trill_error(TRILL_ERR_NOMEM, "out of memory"); break; }
        if (trill_rl_checkpoint_verify(ckpt) == TRILL_OK) *path = ckpt;
        else {
            if (skipped) skipped(ckpt, ctx); /* the verification's message is the thread's error */
            free(ckpt);
        }
    }
    free_names(names, n);
    return st;
}

trill_status trill_rl_checkpoint_clean(const char *run_dir) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/checkpoints", run_dir);
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? TRILL_OK : trill_error(TRILL_ERR_IO, "%s: cannot list (%s)", dir, strerror(errno));
    trill_status st = TRILL_OK;
    for (struct dirent *e; !st && (e = readdir(d));)
        if (strncmp(e->d_name, ".tmp-step-", 10) == 0) {
            char *tmp = trill_path_join(dir, e->d_name);
            st = tmp ? trill_remove_tree(tmp) : trill_error(TRILL_ERR_NOMEM, "out of memory");
            free(tmp);
        }
    closedir(d);
    return st;
}

trill_status trill_rl_checkpoint_read_state(const char *ckpt, rl_state *s) {
    char *path = trill_path_join(ckpt, "state.json");
    json_t *j = NULL;
    trill_status st = path ? trill_json_load_file(path, &j) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    double pos = 0, version = 0, seed = 0;
    if (!st) st = trill_json_get_int(j, "step", path, 0, 1 << 30, &s->step);
    if (!st) st = trill_json_get_double(j, "data_position", path, 0, 9e15, &pos);
    if (!st) st = trill_json_get_double(j, "policy_version", path, 0, 4294967295.0, &version);
    if (!st) st = trill_json_get_double(j, "seed", path, 0, 9.3e18, &seed);
    if (!st && !json_object_get(j, "step")) st = trill_error(TRILL_ERR_INVALID, "%s: missing \"step\"", path);
    json_t *jseed = j ? json_object_get(j, "seed") : NULL;
    s->data_pos = (int64_t)pos;
    s->version = (uint32_t)version;
    s->seed = json_is_integer(jseed) ? (uint64_t)json_integer_value(jseed) : (uint64_t)seed;
    json_decref(j);
    free(path);
    return st;
}

typedef struct skip_report { const char *who; int n; } skip_report;

static void report_skipped(const char *ckpt, void *ctx) {
    skip_report *r = ctx;
    r->n++;
    if (r->who) trill_log(TRILL_LOG_WARN, "%s: skipping checkpoint %s: %s", r->who, ckpt, trill_error_message());
}

trill_status trill_rl_checkpoint_choose(const char *run_dir, const char *resume, const char *who, bool clean, char **ckpt) {
    *ckpt = NULL;
    trill_status st = clean ? trill_rl_checkpoint_clean(run_dir) : TRILL_OK;
    if (st) return st;
    if (strcmp(resume, "auto") == 0) {
        skip_report skipped = { who, 0 };
        st = trill_rl_checkpoint_latest(run_dir, ckpt, report_skipped, &skipped);
        if (!st && !*ckpt && skipped.n)
            return trill_error(TRILL_ERR_INVALID, "run_dir %s: none of its %d checkpoints is complete (see above)", run_dir, skipped.n);
    } else if (resume[0]) {
        if (!(*ckpt = trill_strdup(resume))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        st = trill_rl_checkpoint_verify(*ckpt);
    } else {
        char *latest = NULL;
        skip_report skipped = { NULL, 0 };
        st = trill_rl_checkpoint_latest(run_dir, &latest, report_skipped, &skipped);
        if (!st && (latest || skipped.n))
            st = trill_error(TRILL_ERR_INVALID, "run_dir %s already has checkpoints (%s): continue it with resume=auto "
                             "(or --resume), or choose another run_dir", run_dir, latest ? latest : "none complete");
        free(latest);
    }
    if (st) { free(*ckpt); *ckpt = NULL; }
    return st;
}
