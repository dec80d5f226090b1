/* The state folder (svc.h): one server a folder, owner-only modes, folders written whole or not at
 * all, the database row as the commit of each change (with the request's result in the same
 * transaction), recovery at the newest complete snapshot, and what a crash left removed.
 *
 * STATE/trainers/<id>/snapshots/<step>-<random>   a trainer's committed snapshot and the one before
 *                    /states/<name>@<version>      save_state (a save under the same name: the next version)
 *                    /sampler/<name>@<version>     save_weights_for_sampler
 *                    /.tmp-<random>                a folder being written (renamed into place when whole)
 * Each folder holds the PEFT adapter, trill_service.json, the AdamW state (states and snapshots)
 * and manifest.json (every file's size and XXH64, and the base model's identity), and is only
 * referenced by the database once it is whole. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/hashmap.h"
#include "rl/run/checkpoint.h"
#include "service/svc.h"
#include "trill/fileio.h"
#include "trill/log.h"

#include <xxhash.h>

void trill_svc_tenant_dir(const svc *s, const char *tenant_id, const char *part, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/trainers/%s/%s/%s", s->cfg.state_dir, tenant_id, part, name);
}

/* mkdir -p of path (under the state folder) with every folder it makes owner-only. */
static trill_status private_dir(const svc *s, const char *path) {
    trill_status st = trill_mkdir_p(path);
    char *p = st ? NULL : trill_strdup(path);
    if (!st && !p) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    const size_t root = strlen(s->cfg.state_dir);
    for (char *slash = p ? p + strlen(p) : NULL; !st && slash && slash > p + root; slash = strrchr(p, '/')) {
        *slash = '\0';
        if (chmod(p == slash ? "/" : p, 0700) != 0 && strlen(p) > root) st = trill_error(TRILL_ERR_IO, "%s: cannot chmod: %s", p, strerror(errno));
    }
    if (!st && chmod(path, 0700) != 0) st = trill_error(TRILL_ERR_IO, "%s: cannot chmod: %s", path, strerror(errno));
    free(p);
    return st;
}

trill_status trill_svc_state_open(svc *s) {
    const char *dir = s->cfg.state_dir;
    trill_status st = trill_mkdir_p(dir);
    if (!st && chmod(dir, 0700) != 0) st = trill_error(TRILL_ERR_IO, "%s: cannot chmod: %s", dir, strerror(errno));
    if (!st) st = trill_lock_dir(dir, "state folder", "trill serve", &s->lock_fd);
    /* a folder of an earlier trill: its database, keys and adapters become the owner's alone */
    if (!st) st = trill_chmod_tree(dir, 0700, 0600);
    if (st) trill_error_context("--state");
    return st;
}

trill_status trill_svc_verify_folder(const svc *s, int b, const char *dir) {
    char *manifest = trill_path_join(dir, "manifest.json");
    if (!manifest) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const bool has = trill_file_exists(manifest);
    free(manifest);
    if (!has) return trill_file_exists(dir) ? TRILL_OK : trill_error(TRILL_ERR_INVALID, "%s: missing", dir);
    trill_status st = trill_rl_checkpoint_verify(dir);
    if (!st) st = trill_rl_checkpoint_check_base(dir, &s->identities[b], trill_svc_base_dir(s->bases[b]));
    return st;
}

trill_status trill_svc_write_folder(svc *s, const trill_svc_trainer *tr, int b, const char *tenant_id, const char *part, const char *name,
                              bool optimizer, char *dir, size_t cap) {
    char tmp[4096], parent[4096];
    snprintf(tmp, sizeof tmp, "%s/trainers/%s/.tmp-%016llx", s->cfg.state_dir, tenant_id, (unsigned long long)trill_svc_random_u64());
    trill_svc_tenant_dir(s, tenant_id, part, name, dir, cap);
    snprintf(parent, sizeof parent, "%s/trainers/%s/%s", s->cfg.state_dir, tenant_id, part);
    trill_status st = private_dir(s, tmp);
    if (!st) st = trill_svc_trainer_save(tr, tmp, optimizer);
    if (!st) st = trill_rl_manifest_write(tmp, &s->identities[b]); /* last: a folder with it is whole */
    if (!st) st = trill_chmod_tree(tmp, 0700, 0600);
    if (!st) st = trill_fsync_dir(tmp);
    if (!st) st = private_dir(s, parent);
    if (!st) st = trill_remove_tree(dir); /* a name never committed: what a crash left under it */
    if (!st) st = trill_rename_dir(tmp, dir);
    if (st) {
        char why[2048];
        snprintf(why, sizeof why, "%s", trill_error_message());
        trill_remove_tree(tmp); /* best effort: the next start removes it too */
        return trill_error(st, "%s", why);
    }
    return TRILL_OK;
}

/* ---- the transactions of the training calls ---- */

static trill_status log_done(svc_job *j, const char *result, svc_arg *a) {
    a[0] = SVC_S(result), a[1] = SVC_I(time(NULL)), a[2] = SVC_S(j->id);
    return TRILL_OK;
}

static const char LOG_DONE[] = "UPDATE requests SET status = 'done', result = ?1, finished = ?2 WHERE id = ?3";

/* After a committed snapshot `dir`: it is the trainer's, the one before it is kept, and the one
 * before that is job j's to remove once it has answered (a crash before that leaves an orphan,
 * removed at the next start). */
static void rotate(svc_tenant *t, svc_job *j, const char *dir) {
    if (t->prev[0] && strcmp(t->prev, dir) != 0 && strcmp(t->prev, t->snapshot) != 0) snprintf(j->garbage, sizeof j->garbage, "%s", t->prev);
    snprintf(t->prev, sizeof t->prev, "%s", t->snapshot);
    snprintf(t->snapshot, sizeof t->snapshot, "%s", dir);
}

/* The step GET /trainers reports, from the trainer the worker owns. */
static void set_step(svc *s, svc_tenant *t) {
    pthread_mutex_lock(&s->mu);
    t->step = trill_svc_trainer_step(t->trainer);
    pthread_mutex_unlock(&s->mu);
}

/* Writes tr (what trainer t is to become) as a snapshot and commits it with job j's result. */
static trill_status commit_snapshot(svc *s, svc_tenant *t, const trill_svc_trainer *tr, svc_job *j, const char *result, char *dir, size_t cap) {
    char name[64];
    const long long step = (long long)trill_svc_trainer_step(tr);
    snprintf(name, sizeof name, "%lld-%08x", step, (unsigned)(trill_svc_random_u64() & 0xffffffffu));
    trill_status st = trill_svc_write_folder(s, tr, t->base, t->id, "snapshots", name, true, dir, cap);
    if (st) return st;
    svc_arg row[] = { SVC_I(step), SVC_S(dir), SVC_S(t->snapshot), SVC_S(t->id) }, logged[3];
    log_done(j, result, logged);
    const svc_stmt stmts[] = {
        { "recording a snapshot", "UPDATE trainers SET step = ?1, snapshot = ?2, prev_snapshot = NULLIF(?3, '') WHERE id = ?4", row, 4 },
        { "recording a result", LOG_DONE, logged, 3 },
    };
    st = trill_svc_store_transaction(s->store, stmts, 2);
    if (st) trill_remove_tree(dir); /* never referenced */
    return st;
}

trill_status trill_svc_commit_step(svc *s, svc_tenant *t, svc_job *j, char **result) {
    /* before stepping: a step that cannot be undone is not taken (the training worker's one mark, reused) */
    trill_status st = trill_svc_trainer_mark(t->trainer, &s->mark);
    double norm = 0;
    if (!st) st = trill_svc_optim_step(t->trainer, &j->adam, &norm);
    if (st) return st;
    char dir[4096];
    *result = trill_svc_json_dump(json_pack("{s:{s:I, s:f, s:f}}", "metrics", "step", (json_int_t)trill_svc_trainer_step(t->trainer), "grad_norm", norm,
                                      "learning_rate", j->adam.learning_rate));
    st = *result ? commit_snapshot(s, t, t->trainer, j, *result, dir, sizeof dir) : trill_error(TRILL_ERR_NOMEM, "out of memory (the result)");
    if (st) {
        trill_svc_trainer_rewind(t->trainer, s->mark);
        trill_error_context("optim_step: the step could not be saved, so it was undone: trainer %s is at step %lld as before, with its "
                            "gradient (submit optim_step again)", t->id, (long long)trill_svc_trainer_step(t->trainer));
        free(*result), *result = NULL;
    } else {
        rotate(t, j, dir);
        set_step(s, t);
        j->logged = true;
    }
    return st;
}

trill_status trill_svc_commit_load(svc *s, svc_tenant *t, svc_job *j, char **result) {
    trill_svc_trainer *loaded = NULL;
    trill_status st = trill_svc_verify_folder(s, t->base, j->dir);
    if (!st) st = trill_svc_trainer_load_like(t->trainer, j->dir, j->with_optimizer, &loaded);
    char dir[4096];
    if (!st && !(*result = trill_svc_json_dump(json_pack("{s:I}", "step", (json_int_t)trill_svc_trainer_step(loaded)))))
        st = trill_error(TRILL_ERR_NOMEM, "out of memory (the result)");
    if (!st) st = commit_snapshot(s, t, loaded, j, *result, dir, sizeof dir);
    if (st) {
        trill_svc_trainer_free(loaded);
        free(*result), *result = NULL;
        return st;
    }
    trill_svc_trainer_adopt(t->trainer, loaded);
    rotate(t, j, dir);
    set_step(s, t);
    j->logged = true;
    return TRILL_OK;
}

typedef struct { int64_t version; char dir[4096]; } saved_row;

static void read_saved(void *ctx, sqlite3_stmt *row) {
    saved_row *r = ctx;
    r->version = sqlite3_column_int64(row, 0);
    snprintf(r->dir, sizeof r->dir, "%s", (const char *)sqlite3_column_text(row, 1));
}

trill_status trill_svc_commit_save(svc *s, svc_tenant *t, svc_job *j, char **result) {
    const bool state = j->kind == JOB_SAVE_STATE;
    char uri[256], name[96], dir[4096];
    snprintf(uri, sizeof uri, "trill://%s/%s%s", t->id, state ? "" : "sampler/", j->name);
    saved_row old = { 0, "" };
    svc_arg u = SVC_S(uri);
    trill_status st = trill_svc_store_run(s->store, "reading a saved state", "SELECT version, dir FROM states WHERE uri = ?1", &u, 1, read_saved, &old, NULL);
    snprintf(name, sizeof name, "%s@%lld", j->name, (long long)old.version + 1);
    if (!st) st = trill_svc_write_folder(s, t->trainer, t->base, t->id, state ? "states" : "sampler", name, state, dir, sizeof dir);
    if (st) return st;
    if (!(*result = trill_svc_json_dump(json_pack("{s:s}", "path", uri)))) st = trill_error(TRILL_ERR_NOMEM, "out of memory (the result)");
    const int64_t now = time(NULL);
    svc_arg row[] = { SVC_S(uri), SVC_S(t->key_id), SVC_S(t->id), SVC_S(state ? "state" : "sampler"), SVC_S(dir),
                      SVC_I(trill_svc_trainer_step(t->trainer)), SVC_I(now), SVC_I(old.version + 1), SVC_S(trill_svc_base_name(s->bases[t->base])),
                      j->ttl ? SVC_I(now + j->ttl) : SVC_S(NULL) },
            logged[3];
    log_done(j, *result, logged);
    /* saved again under its name: the next version (samplers of the last one keep it while loaded, or refuse) */
    const svc_stmt stmts[] = {
        { "recording a saved state",
          "INSERT INTO states(uri, key_id, trainer_id, kind, dir, step, created, version, base, expires) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
          " ON CONFLICT(uri) DO UPDATE SET dir = excluded.dir, step = excluded.step, created = excluded.created, version = excluded.version,"
          " expires = excluded.expires",
          row, 10 },
        { "recording a result", LOG_DONE, logged, 3 },
    };
    if (!st) st = trill_svc_store_transaction(s->store, stmts, 2);
    if (st) {
        trill_remove_tree(dir);
        free(*result), *result = NULL;
        return st;
    }
    if (old.dir[0] && strcmp(old.dir, dir) != 0) snprintf(j->garbage, sizeof j->garbage, "%s", old.dir);
    j->logged = true;
    return TRILL_OK;
}

/* ---- recovery ---- */

typedef struct { svc *s; int n, failed, fell_back; } recover_ctx;

/* A column's text ("" for NULL). */
static const char *text(sqlite3_stmt *row, int i) {
    const unsigned char *t = sqlite3_column_text(row, i);
    return t ? (const char *)t : "";
}

/* A restored trainer into the server's list, its adapter bytes counted (before the workers start:
 * no lock needed). */
static trill_status add_restored(svc *s, svc_tenant *t) {
    size_t n;
    trill_lora_params(trill_svc_trainer_lora(t->trainer), &n);
    t->step = trill_svc_trainer_step(t->trainer);
    t->bytes = 4 * n * sizeof(float);
    svc_tenant **p = trill_realloc(s->tenants, sizeof *p * (size_t)(s->n_tenants + 1));
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    s->tenants = p;
    s->tenants[s->n_tenants++] = t;
    s->adapter_bytes += t->bytes;
    return TRILL_OK;
}

static void recover_trainer(void *ctx, sqlite3_stmt *row) {
    recover_ctx *r = ctx;
    svc *s = r->s;
    const char *id = text(row, 0), *base = text(row, 2), *from = text(row, 8), *snap = text(row, 10), *prev = text(row, 11);
    const long long recorded = sqlite3_column_int64(row, 12);
    svc_tenant *t = trill_calloc(1, sizeof *t);
    trill_status st = t ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        snprintf(t->id, sizeof t->id, "%s", id);
        snprintf(t->key_id, sizeof t->key_id, "%s", text(row, 1));
        if ((t->base = trill_svc_find_base(s, base)) < 0) st = trill_error(TRILL_ERR_INVALID, "its base model %s is not served now", base);
    }
    /* the newest complete state: its snapshot, the one before, the state it was made from, its seed */
    const char *tried[3] = { snap, prev, from };
    const char *used = NULL;
    for (int k = 0; !st && !used && k < 3; k++) {
        if (!tried[k][0]) continue;
        trill_status ls = trill_svc_verify_folder(s, t->base, tried[k]);
        if (!ls) ls = trill_svc_trainer_load(s->bases[t->base], tried[k], k < 2 || sqlite3_column_int(row, 9) != 0, &t->trainer);
        if (!ls) used = tried[k];
        else trill_log(TRILL_LOG_WARN, "trill serve: trainer %s: %s %s cannot be restored: %s", id,
                       k == 0 ? "its snapshot" : k == 1 ? "the snapshot before it" : "the state it was made from", tried[k], trill_error_message());
    }
    if (!st && !used && from[0]) st = trill_error(TRILL_ERR_INVALID, "no snapshot of it, nor the state it was made from, is complete (see above)");
    if (!st && !used) {
        trill_svc_trainer_config c = { .rank = sqlite3_column_int(row, 3), .seed = (uint64_t)sqlite3_column_int64(row, 4),
                                       .train_mlp = sqlite3_column_int(row, 5), .train_attn = sqlite3_column_int(row, 6),
                                       .train_unembed = sqlite3_column_int(row, 7) };
        st = trill_svc_trainer_create(s->bases[t->base], &c, &t->trainer);
    }
    if (!st) {
        const long long step = (long long)trill_svc_trainer_step(t->trainer);
        if (used == snap) {
            snprintf(t->snapshot, sizeof t->snapshot, "%s", snap);
            snprintf(t->prev, sizeof t->prev, "%s", prev);
        } else if (used == prev) snprintf(t->snapshot, sizeof t->snapshot, "%s", prev);
        if (used != snap && (snap[0] || prev[0])) { /* it fell back: its record says so from now on */
            r->fell_back++;
            trill_log(TRILL_LOG_WARN, "trill serve: trainer %s is back at step %lld (from %s), not at its recorded step %lld: its newer "
                      "snapshot is damaged", id, step, used ? used : "its seed", recorded);
            svc_arg a[] = { SVC_I(step), SVC_S(t->snapshot), SVC_S(id) };
            st = trill_svc_store_run(s->store, "recording a fallback", "UPDATE trainers SET step = ?1, snapshot = NULLIF(?2, ''), prev_snapshot = NULL "
                               "WHERE id = ?3", a, 3, NULL, NULL, NULL);
        }
    }
    if (!st) st = add_restored(s, t);
    if (st) {
        trill_log(TRILL_LOG_WARN, "trill serve: trainer %s not restored: %s", id, trill_error_message());
        if (t) trill_svc_trainer_free(t->trainer);
        free(t);
        r->failed++;
        return;
    }
    r->n++;
}

svc_weights *trill_svc_weights_for(svc *s, const char *uri, int64_t version, const char *dir, int b) {
    for (int i = 0; i < s->n_weights; i++) {
        svc_weights *w = s->weights[i];
        if (w->version == version && strcmp(w->uri, uri) == 0) return w;
    }
    svc_weights *w = trill_calloc(1, sizeof *w);
    svc_weights **grown = w ? trill_realloc(s->weights, sizeof *grown * (size_t)(s->n_weights + 1)) : NULL;
    if (!grown) { free(w); return NULL; }
    s->weights = grown;
    snprintf(w->uri, sizeof w->uri, "%s", uri);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->version = version, w->base = b;
    s->weights[s->n_weights++] = w;
    return w;
}

static void recover_sampler(void *ctx, sqlite3_stmt *row) {
    recover_ctx *r = ctx;
    svc *s = r->s;
    svc_sampler *p = trill_calloc(1, sizeof *p);
    const char *base = text(row, 2), *path = text(row, 3);
    trill_status st = p ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        snprintf(p->id, sizeof p->id, "%s", text(row, 0));
        snprintf(p->key_id, sizeof p->key_id, "%s", text(row, 1));
        if ((p->base = trill_svc_find_base(s, base)) < 0) st = trill_error(TRILL_ERR_INVALID, "its base model %s is not served now", base);
    }
    if (!st && path[0]) { /* its weights as they were: loaded when it samples again */
        if (!(p->weights = trill_svc_weights_for(s, path, sqlite3_column_int64(row, 5), text(row, 4), p->base))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else p->weights->refs++;
    }
    svc_sampler **grown = st ? NULL : trill_realloc(s->samplers, sizeof *grown * (size_t)(s->n_samplers + 1));
    if (!st && !grown) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (st) {
        trill_log(TRILL_LOG_WARN, "trill serve: sampler %s not restored: %s", text(row, 0), trill_error_message());
        if (p && p->weights) p->weights->refs--;
        free(p);
        r->failed++;
        return;
    }
    s->samplers = grown;
    s->samplers[s->n_samplers++] = p;
    r->n++;
}

/* ---- what a crash left ---- */

/* The folders the records name, by XXH64 of their paths (a collision could only keep an orphan). */
typedef struct { trill_u64map referenced; int removed; double bytes; bool nomem; } sweep_ctx;

static uint64_t path_key(const char *path) { return XXH64(path, strlen(path), 0); }

static void add_referenced(void *ctx, sqlite3_stmt *row) {
    sweep_ctx *w = ctx;
    for (int i = 0; i < sqlite3_column_count(row); i++)
        if (*text(row, i) && trill_u64map_put(&w->referenced, path_key(text(row, i)), 1)) w->nomem = true;
}

static _Thread_local double g_tree_bytes;

static int add_size(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)path, (void)ftw;
    if (type == FTW_F) g_tree_bytes += (double)sb->st_size;
    return 0;
}

static void remove_counted(sweep_ctx *w, const char *path) {
    g_tree_bytes = 0;
    nftw(path, add_size, 16, FTW_PHYS);
    if (trill_remove_tree(path) == TRILL_OK) w->removed++, w->bytes += g_tree_bytes;
}

/* In trainer folder `dir`: temporaries, and snapshot and saved-state folders no record names. */
static void sweep_trainer(sweep_ctx *w, const char *dir) {
    static const char *const parts[] = { "snapshots", "states", "sampler" };
    char path[8704];
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strncmp(e->d_name, ".tmp-", 5) == 0) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            remove_counted(w, path);
        }
    if (d) closedir(d);
    for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
        char part[8448];
        snprintf(part, sizeof part, "%s/%s", dir, parts[k]);
        if (!(d = opendir(part))) continue;
        for (struct dirent *e; (e = readdir(d));) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            snprintf(path, sizeof path, "%s/%s", part, e->d_name);
            uint64_t v;
            if (!trill_u64map_get(&w->referenced, path_key(path), &v)) remove_counted(w, path);
        }
        closedir(d);
    }
}

/* Temporaries and orphans (snapshots and saved states no record names) under STATE/trainers. */
static trill_status sweep(svc *s) {
    sweep_ctx w = { 0 };
    if (trill_u64map_init(&w.referenced, 64)) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_svc_store_run(s->store, "listing the snapshots", "SELECT snapshot, prev_snapshot, from_state FROM trainers", NULL, 0,
                                    add_referenced, &w, NULL);
    if (!st) st = trill_svc_store_run(s->store, "listing the saved states", "SELECT dir FROM states", NULL, 0, add_referenced, &w, NULL);
    if (!st && w.nomem) st = trill_error(TRILL_ERR_NOMEM, "out of memory"); /* nothing is removed on an incomplete list */
    char root[4200], path[8192];
    snprintf(root, sizeof root, "%s/trainers", s->cfg.state_dir);
    DIR *d = st ? NULL : opendir(root);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        sweep_trainer(&w, path);
    }
    if (d) closedir(d);
    if (!st && w.removed)
        trill_log(TRILL_LOG_INFO, "trill serve: removed %d folders a crash left (temporary, or no longer referenced): %.1f MB", w.removed,
                  w.bytes / 1e6);
    trill_u64map_free(&w.referenced);
    return st;
}

trill_status trill_svc_recover(svc *s) {
    const int failed = trill_svc_store_fail_pending(s->store);
    recover_ctx t = { .s = s }, p = { .s = s };
    trill_status st = trill_svc_store_run(s->store, "restoring trainers",
                                    "SELECT t.id, t.key_id, t.base, t.rank, t.seed, t.mlp, t.attn, t.unembed, t.from_state, t.from_optimizer, "
                                    "t.snapshot, t.prev_snapshot, t.step FROM trainers t JOIN keys k ON k.id = t.key_id WHERE k.revoked = 0 "
                                    "ORDER BY t.created, t.id",
                                    NULL, 0, recover_trainer, &t, NULL);
    if (!st)
        st = trill_svc_store_run(s->store, "restoring samplers",
                           "SELECT p.id, p.key_id, p.base, p.model_path, p.dir, p.version FROM samplers p JOIN keys k ON k.id = p.key_id "
                           "WHERE k.revoked = 0 ORDER BY p.created, p.id",
                           NULL, 0, recover_sampler, &p, NULL);
    if (!st && (t.n || p.n || failed))
        trill_log(TRILL_LOG_INFO, "trill serve: restored %d trainers (each at its last committed optimizer step%s) and %d samplers; %d requests "
                  "of the last run were in flight and now report server_restarted", t.n, t.fell_back ? ", but those named above" : "", p.n, failed);
    if (!st) st = sweep(s);
    return st;
}
