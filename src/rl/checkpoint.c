#include "checkpoint.h"

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
#include "trill/json.h"

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb; (void)type; (void)ftw;
    return remove(path);
}

trill_status rl_remove_tree(const char *path) {
    if (!trill_file_exists(path)) return TRILL_OK;
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS))
        return trill_error(TRILL_ERR_IO, "%s: cannot remove (%s)", path, strerror(errno));
    return TRILL_OK;
}

static trill_status fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return trill_error(TRILL_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    int r = fsync(fd);
    close(fd);
    return r ? trill_error(TRILL_ERR_IO, "%s: fsync failed (%s)", path, strerror(errno)) : TRILL_OK;
}

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
            char **grown = realloc(*names, sizeof(char *) * (size_t)(cap = cap ? 2 * cap : 8));
            if (!grown) { st = trill_error(TRILL_ERR_NOMEM, "out of memory"); break; }
            *names = grown;
        }
        if (!((*names)[*n] = strdup(e->d_name))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else (*n)++;
    }
    closedir(d);
    for (int i = 1; i < *n; i++) /* insertion sort: fixed-width names sort by step */
        for (int j = i; j > 0 && strcmp((*names)[j - 1], (*names)[j]) > 0; j--) {
            char *t = (*names)[j]; (*names)[j] = (*names)[j - 1]; (*names)[j - 1] = t;
        }
    return st;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

static trill_status write_config(const char *path, const trill_rl_config *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_rl_config_write(c, f);
    fclose(f);
    if (!st) st = trill_write_file_atomic(path, buf, len);
    free(buf);
    return st;
}

trill_status rl_checkpoint_save(const char *run_dir, const trill_rl_config *c, const rl_state *s, const trill_lora *lora,
                                const trill_adamw *opt, int keep) {
    char dir[4096], tmp[4160], final[4160], path[4200];
    snprintf(dir, sizeof dir, "%s/checkpoints", run_dir);
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-%08d", dir, s->step);
    snprintf(final, sizeof final, "%s/step-%08d", dir, s->step);
    trill_status st = trill_mkdir_p(dir);
    if (!st) st = rl_remove_tree(tmp); /* left by a crash */
    if (!st) st = trill_mkdir_p(tmp);
    if (!st) { snprintf(path, sizeof path, "%s/adapter", tmp); st = trill_lora_save(lora, path); }
    if (!st) st = fsync_dir(path);
    if (!st) { snprintf(path, sizeof path, "%s/optimizer", tmp); st = trill_adamw_save(opt, path); }
    if (!st) { snprintf(path, sizeof path, "%s/config.yaml", tmp); st = write_config(path, c); }
    if (!st) {
        json_t *j = json_pack("{s:i, s:I, s:I, s:I}", "step", s->step, "data_position", (json_int_t)s->data_pos,
                              "policy_version", (json_int_t)s->version, "seed", (json_int_t)s->seed);
        snprintf(path, sizeof path, "%s/state.json", tmp);
        st = j ? trill_json_write_file(path, j) : trill_error(TRILL_ERR_NOMEM, "out of memory");
        json_decref(j);
    }
    if (!st) st = fsync_dir(tmp);
    if (!st) st = rl_remove_tree(final); /* the same step saved again after a resume */
    if (!st && rename(tmp, final)) st = trill_error(TRILL_ERR_IO, "%s: cannot rename to %s (%s)", tmp, final, strerror(errno));
    if (!st) st = fsync_dir(dir);
    if (st) { trill_error_context("checkpoint %s", final); return st; }
    char **names;
    int n;
    if (keep > 0 && !(st = list_checkpoints(dir, &names, &n))) {
        for (int i = 0; i + keep < n && !st; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            st = rl_remove_tree(path);
        }
        free_names(names, n);
    }
    return st;
}

trill_status rl_checkpoint_latest(const char *run_dir, char **path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/checkpoints", run_dir);
    char **names;
    int n;
    *path = NULL;
    trill_status st = list_checkpoints(dir, &names, &n);
    if (st) return st;
    if (n > 0) {
        *path = trill_path_join(dir, names[n - 1]);
        if (!*path) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    free_names(names, n);
    return st;
}

trill_status rl_checkpoint_read_state(const char *ckpt, rl_state *s) {
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
