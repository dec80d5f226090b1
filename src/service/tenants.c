/* Trainers and samplers of the tenants (svc.h): made, found only by their owner, recorded in the
 * state database, snapshotted after every optimizer step and brought back after a restart. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "service/svc.h"
#include "trill/log.h"

/* ---- error codes for the HTTP answer ---- */

static _Thread_local const char *last_code;

trill_status svc_fail(const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    last_code = code;
    return trill_error(TRILL_ERR_INVALID, "%s", msg);
}

const char *svc_take_code(void) {
    const char *c = last_code ? last_code : "bad_request";
    last_code = NULL;
    return c;
}

/* ---- lookups ---- */

svc_tenant *svc_find_tenant(svc *s, const char *id, const char *key_id) {
    for (int i = 0; i < s->n_tenants; i++)
        if (strcmp(s->tenants[i]->id, id) == 0) return strcmp(s->tenants[i]->key_id, key_id) == 0 ? s->tenants[i] : NULL;
    return NULL;
}

svc_sampler *svc_find_sampler(svc *s, const char *id, const char *key_id) {
    for (int i = 0; i < s->n_samplers; i++)
        if (strcmp(s->samplers[i]->id, id) == 0) return strcmp(s->samplers[i]->key_id, key_id) == 0 ? s->samplers[i] : NULL;
    return NULL;
}

int svc_find_base(const svc *s, const char *name) {
    for (int i = 0; name && i < s->n_bases; i++)
        if (strcmp(trill_svc_base_name(s->bases[i]), name) == 0) return i;
    return -1;
}

void svc_tenant_dir(const svc *s, const char *tenant_id, const char *part, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s/trainers/%s/%s/%s", s->cfg.state_dir, tenant_id, part, name);
}

typedef struct { char key_id[32], kind[16], dir[4096], base[256]; bool found; } uri_row;

static void read_uri(void *ctx, sqlite3_stmt *row) {
    uri_row *r = ctx;
    snprintf(r->key_id, sizeof r->key_id, "%s", (const char *)sqlite3_column_text(row, 0));
    snprintf(r->kind, sizeof r->kind, "%s", (const char *)sqlite3_column_text(row, 1));
    snprintf(r->dir, sizeof r->dir, "%s", (const char *)sqlite3_column_text(row, 2));
    snprintf(r->base, sizeof r->base, "%s", (const char *)sqlite3_column_text(row, 3));
    r->found = true;
}

trill_status svc_resolve_uri(svc *s, const char *uri, const char *key_id, const char *kind, char *dir, size_t cap, int *base) {
    if (strncmp(uri, "trill://", 8) != 0)
        return svc_fail("bad_request", "path: \"%.200s\" is not a trill:// path (paths are what save_state and save_weights_for_sampler "
                                       "return, never file-system paths)", uri);
    uri_row r = { 0 };
    svc_arg a = SVC_S(uri);
    trill_status st = svc_store_run(s->store, "finding a saved state",
                                    "SELECT s.key_id, s.kind, s.dir, t.base FROM states s JOIN trainers t ON t.id = s.trainer_id WHERE s.uri = ?1",
                                    &a, 1, read_uri, &r, NULL);
    if (st) return st;
    if (!r.found || strcmp(r.key_id, key_id) != 0) return svc_fail("not_found", "path: no saved state %.200s", uri);
    if (kind && strcmp(r.kind, kind) != 0)
        return svc_fail("bad_request", "path: %.200s holds sampler weights only (save_weights_for_sampler); a state from save_state is needed", uri);
    if ((*base = svc_find_base(s, r.base)) < 0) return svc_fail("not_found", "path: %.200s is of base model %s, which this server does not serve", uri, r.base);
    snprintf(dir, cap, "%s", r.dir);
    return TRILL_OK;
}

static void read_version(void *ctx, sqlite3_stmt *row) { *(int64_t *)ctx = sqlite3_column_int64(row, 0); }

int64_t svc_uri_version(svc *s, const char *uri) {
    int64_t v = -1;
    svc_arg a = SVC_S(uri);
    if (svc_store_run(s->store, "reading a path's version", "SELECT version FROM states WHERE uri = ?1", &a, 1, read_version, &v, NULL)) return -1;
    return v;
}

/* ---- trainers ---- */

/* Reserves `bytes` of adapter memory, or refuses with the limit (what is resident, what was asked). */
static trill_status reserve(svc *s, size_t bytes) {
    pthread_mutex_lock(&s->mu);
    const size_t now = s->adapter_bytes;
    const bool ok = now + bytes <= s->cfg.max_adapter_bytes;
    if (ok) s->adapter_bytes += bytes;
    pthread_mutex_unlock(&s->mu);
    return ok ? TRILL_OK
              : svc_fail("limit", "adapter memory: %.1f MB resident, %.1f MB more would pass the server's limit of %.0f MB (--max-adapter-mb)",
                         now / 1e6, bytes / 1e6, s->cfg.max_adapter_bytes / 1e6);
}

static void unreserve(svc *s, size_t bytes) {
    pthread_mutex_lock(&s->mu);
    s->adapter_bytes -= bytes;
    pthread_mutex_unlock(&s->mu);
}

/* A trainer's adapter, its gradient and its two AdamW moments. */
static size_t trainer_bytes(trill_svc_trainer *t) {
    size_t n;
    trill_lora_params(trill_svc_trainer_lora(t), &n);
    return 4 * n * sizeof(float);
}

static trill_status add_tenant(svc *s, svc_tenant *t) {
    pthread_mutex_lock(&s->mu);
    svc_tenant **p = trill_realloc(s->tenants, sizeof *p * (size_t)(s->n_tenants + 1));
    if (p) {
        long least = -1; /* a new trainer starts level with the least served one, not ahead of everyone */
        for (int i = 0; i < s->n_tenants; i++)
            if (least < 0 || p[i]->served < least) least = p[i]->served;
        t->served = least < 0 ? 0 : least;
        s->tenants = p;
        s->tenants[s->n_tenants++] = t;
    }
    pthread_mutex_unlock(&s->mu);
    return p ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

static int count_tenants(svc *s, const char *key_id) {
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_tenants; i++) n += strcmp(s->tenants[i]->key_id, key_id) == 0;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static trill_status bool_field(const json_t *o, const char *key, bool *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return TRILL_OK;
    if (!json_is_boolean(v)) return svc_fail("bad_request", "%s: expected true or false", key);
    *out = json_is_true(v);
    return TRILL_OK;
}

static trill_status parse_new_trainer(svc *s, const json_t *body, int *base, trill_svc_trainer_config *c) {
    const char *name = json_string_value(json_object_get(body, "base_model"));
    if ((*base = svc_find_base(s, name)) < 0) return svc_fail("not_found", "base_model: \"%.200s\" is not served here (GET /api/v1/models lists them)", name ? name : "");
    *c = (trill_svc_trainer_config){ .rank = 32, .seed = svc_random_u64() >> 11, .train_mlp = true, .train_attn = true, .train_unembed = true };
    const json_t *rank = json_object_get(body, "rank"), *seed = json_object_get(body, "seed");
    if (rank && !json_is_null(rank)) {
        if (!json_is_integer(rank) || json_integer_value(rank) < 1 || json_integer_value(rank) > 256)
            return svc_fail("bad_request", "rank: expected an integer in [1, 256]");
        c->rank = (int)json_integer_value(rank);
    }
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0) return svc_fail("bad_request", "seed: expected a non-negative integer");
        c->seed = (uint64_t)json_integer_value(seed);
    }
    trill_status st = bool_field(body, "train_mlp", &c->train_mlp);
    if (!st) st = bool_field(body, "train_attn", &c->train_attn);
    if (!st) st = bool_field(body, "train_unembed", &c->train_unembed);
    return st;
}

static trill_status record_tenant(svc *s, const svc_tenant *t, const char *from_state, bool from_optimizer) {
    const trill_svc_trainer_config *c = trill_svc_trainer_get_config(t->trainer);
    svc_arg a[] = { SVC_S(t->id), SVC_S(t->key_id), SVC_S(trill_svc_base_name(s->bases[t->base])), SVC_I(c->rank), SVC_I(c->seed),
                    SVC_I(c->train_mlp), SVC_I(c->train_attn), SVC_I(c->train_unembed), SVC_S(from_state), SVC_I(from_optimizer),
                    SVC_I(trill_svc_trainer_step(t->trainer)), SVC_I(time(NULL)) };
    if (!from_state) a[8] = (svc_arg){ .type = 'i', .i = 0 };
    return svc_store_run(s->store, "recording a trainer",
                         "INSERT INTO trainers(id, key_id, base, rank, seed, mlp, attn, unembed, from_state, from_optimizer, step, created)"
                         " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULLIF(?9, 0), ?10, ?11, ?12)",
                         a, 12, NULL, NULL, NULL);
}

trill_status svc_tenant_create(svc *s, const char *key_id, const json_t *body, bool from_state, svc_tenant **out) {
    *out = NULL;
    if (count_tenants(s, key_id) >= s->cfg.max_trainers_per_key)
        return svc_fail("limit", "this key has %d trainers, the most the server allows (--max-trainers)", s->cfg.max_trainers_per_key);
    svc_tenant *t = trill_calloc(1, sizeof *t);
    if (!t) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    svc_new_id(t->id, sizeof t->id, "t-");
    snprintf(t->key_id, sizeof t->key_id, "%s", key_id);
    trill_status st;
    char dir[4096] = "";
    bool with_optimizer = false;
    if (from_state) {
        const char *path = json_string_value(json_object_get(body, "path"));
        const json_t *w = json_object_get(body, "with_optimizer");
        with_optimizer = json_is_true(w);
        st = path ? TRILL_OK : svc_fail("bad_request", "path: expected the trill:// path of a saved state");
        if (!st && w && !json_is_boolean(w)) st = svc_fail("bad_request", "with_optimizer: expected true or false");
        if (!st) st = svc_resolve_uri(s, path, key_id, "state", dir, sizeof dir, &t->base);
        if (!st) st = trill_svc_trainer_load(s->bases[t->base], dir, with_optimizer, &t->trainer);
    } else {
        trill_svc_trainer_config c;
        st = parse_new_trainer(s, body, &t->base, &c);
        if (!st) st = trill_svc_trainer_create(s->bases[t->base], &c, &t->trainer);
    }
    const size_t bytes = t->trainer ? trainer_bytes(t->trainer) : 0;
    bool reserved = false;
    if (!st) st = reserve(s, bytes), reserved = !st;
    if (!st) st = record_tenant(s, t, from_state ? dir : NULL, with_optimizer);
    if (!st) st = add_tenant(s, t);
    if (st) {
        if (reserved) unreserve(s, bytes);
        trill_svc_trainer_free(t->trainer);
        free(t);
        return st;
    }
    *out = t;
    return TRILL_OK;
}

/* ---- samplers ---- */

static trill_status add_sampler(svc *s, svc_sampler *p) {
    pthread_mutex_lock(&s->mu);
    svc_sampler **a = trill_realloc(s->samplers, sizeof *a * (size_t)(s->n_samplers + 1));
    if (a) s->samplers = a, s->samplers[s->n_samplers++] = p;
    pthread_mutex_unlock(&s->mu);
    return a ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

trill_status svc_sampler_load(svc *s, svc_sampler *p) {
    const int64_t now = svc_uri_version(s, p->uri);
    if (now != p->version)
        return trill_error(TRILL_ERR_INVALID, "sampler %s: %s has been saved again since this sampler was made (its weights are gone): "
                           "make a sampling client from the path again", p->id, p->uri);
    trill_lora *lora = NULL;
    trill_status st = trill_lora_load(trill_svc_base_model(s->bases[p->base]), p->dir, &lora);
    if (st) return st;
    size_t n;
    trill_lora_params(lora, &n);
    pthread_mutex_lock(&s->mu);
    p->lora = lora, p->bytes = n * sizeof(float);
    s->sampler_bytes += p->bytes;
    pthread_mutex_unlock(&s->mu);
    return TRILL_OK;
}

trill_status svc_sampler_create(svc *s, const char *key_id, const json_t *body, svc_sampler **out) {
    *out = NULL;
    const char *path = json_string_value(json_object_get(body, "model_path"));
    const char *base = json_string_value(json_object_get(body, "base_model"));
    if (!path == !base) return svc_fail("bad_request", "expected one of model_path (a trill:// path) and base_model");
    svc_sampler *p = trill_calloc(1, sizeof *p);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    svc_new_id(p->id, sizeof p->id, "s-");
    snprintf(p->key_id, sizeof p->key_id, "%s", key_id);
    trill_status st = TRILL_OK;
    if (path && strlen(path) >= sizeof p->uri) st = svc_fail("bad_request", "model_path: longer than %zu bytes", sizeof p->uri - 1);
    else if (path) st = svc_resolve_uri(s, path, key_id, NULL, p->dir, sizeof p->dir, &p->base);
    else if ((p->base = svc_find_base(s, base)) < 0) st = svc_fail("not_found", "base_model: \"%.200s\" is not served here", base);
    if (!st && path) {
        snprintf(p->uri, sizeof p->uri, "%s", path);
        p->version = svc_uri_version(s, path);
        st = svc_sampler_load(s, p); /* now: a path that does not load is refused here, not at its first sample */
    }
    svc_arg a[] = { SVC_S(p->id), SVC_S(key_id), SVC_S(trill_svc_base_name(s->bases[p->base < 0 ? 0 : p->base])), SVC_S(p->uri),
                    SVC_S(p->dir), SVC_I(p->version), SVC_I(time(NULL)) };
    if (!st)
        st = svc_store_run(s->store, "recording a sampler",
                           "INSERT INTO samplers(id, key_id, base, model_path, dir, version, created) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)", a, 7,
                           NULL, NULL, NULL);
    if (!st) st = add_sampler(s, p);
    if (st) {
        if (p->lora) {
            pthread_mutex_lock(&s->mu);
            s->sampler_bytes -= p->bytes;
            pthread_mutex_unlock(&s->mu);
        }
        trill_lora_free(p->lora);
        free(p);
        return st;
    }
    *out = p;
    return TRILL_OK;
}

/* ---- snapshots and recovery ---- */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

typedef struct { char snapshot[4096]; } snap_row;

static void read_snapshot(void *ctx, sqlite3_stmt *row) {
    const unsigned char *t = sqlite3_column_text(row, 0);
    snprintf(((snap_row *)ctx)->snapshot, sizeof((snap_row *)ctx)->snapshot, "%s", t ? (const char *)t : "");
}

trill_status svc_snapshot(svc *s, svc_tenant *t) {
    char dir[4096], name[32];
    snprintf(name, sizeof name, "%lld", (long long)trill_svc_trainer_step(t->trainer));
    svc_tenant_dir(s, t->id, "snapshots", name, dir, sizeof dir);
    snap_row old = { "" };
    svc_arg id = SVC_S(t->id);
    trill_status st = svc_store_run(s->store, "reading a trainer's snapshot", "SELECT snapshot FROM trainers WHERE id = ?1", &id, 1,
                                    read_snapshot, &old, NULL);
    if (!st) st = trill_svc_trainer_save(t->trainer, dir, true);
    svc_arg a[] = { SVC_I(trill_svc_trainer_step(t->trainer)), SVC_S(dir), SVC_S(t->id) };
    /* The record is the commit: until it names the new snapshot, a restart takes the old one. */
    if (!st) st = svc_store_run(s->store, "recording a snapshot", "UPDATE trainers SET step = ?1, snapshot = ?2 WHERE id = ?3", a, 3, NULL, NULL, NULL);
    if (!st && old.snapshot[0] && strcmp(old.snapshot, dir) != 0) nftw(old.snapshot, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
    if (st) trill_error_context("trainer %s: the snapshot of step %s", t->id, name);
    return st;
}

typedef struct { svc *s; int n, failed; } recover_ctx;

static void recover_trainer(void *ctx, sqlite3_stmt *row) {
    recover_ctx *r = ctx;
    svc *s = r->s;
    const char *base = (const char *)sqlite3_column_text(row, 2), *from = (const char *)sqlite3_column_text(row, 8),
               *snap = (const char *)sqlite3_column_text(row, 10);
    svc_tenant *t = trill_calloc(1, sizeof *t);
    trill_status st = t ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        snprintf(t->id, sizeof t->id, "%s", (const char *)sqlite3_column_text(row, 0));
        snprintf(t->key_id, sizeof t->key_id, "%s", (const char *)sqlite3_column_text(row, 1));
        if ((t->base = svc_find_base(s, base)) < 0) st = trill_error(TRILL_ERR_INVALID, "its base model %s is not served now", base);
    }
    if (!st && snap) st = trill_svc_trainer_load(s->bases[t->base], snap, true, &t->trainer);
    else if (!st && from) st = trill_svc_trainer_load(s->bases[t->base], from, sqlite3_column_int(row, 9) != 0, &t->trainer);
    else if (!st) {
        trill_svc_trainer_config c = { .rank = sqlite3_column_int(row, 3), .seed = (uint64_t)sqlite3_column_int64(row, 4),
                                       .train_mlp = sqlite3_column_int(row, 5), .train_attn = sqlite3_column_int(row, 6),
                                       .train_unembed = sqlite3_column_int(row, 7) };
        st = trill_svc_trainer_create(s->bases[t->base], &c, &t->trainer);
    }
    if (!st) st = add_tenant(s, t);
    if (!st) s->adapter_bytes += trainer_bytes(t->trainer); /* before the workers start: no lock needed */
    if (st) {
        trill_log(TRILL_LOG_WARN, "trill serve: trainer %s not restored: %s", t ? t->id : "?", trill_error_message());
        if (t) trill_svc_trainer_free(t->trainer);
        free(t);
        r->failed++;
        return;
    }
    r->n++;
}

static void recover_sampler(void *ctx, sqlite3_stmt *row) {
    recover_ctx *r = ctx;
    svc *s = r->s;
    svc_sampler *p = trill_calloc(1, sizeof *p);
    const char *base = (const char *)sqlite3_column_text(row, 2), *path = (const char *)sqlite3_column_text(row, 3);
    trill_status st = p ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        snprintf(p->id, sizeof p->id, "%s", (const char *)sqlite3_column_text(row, 0));
        snprintf(p->key_id, sizeof p->key_id, "%s", (const char *)sqlite3_column_text(row, 1));
        if ((p->base = svc_find_base(s, base)) < 0) st = trill_error(TRILL_ERR_INVALID, "its base model %s is not served now", base);
    }
    if (!st && path && *path) { /* its weights as they were: loaded when it samples again */
        snprintf(p->uri, sizeof p->uri, "%s", path);
        snprintf(p->dir, sizeof p->dir, "%s", sqlite3_column_text(row, 4) ? (const char *)sqlite3_column_text(row, 4) : "");
        p->version = sqlite3_column_int64(row, 5);
    }
    if (!st) st = add_sampler(s, p);
    if (st) {
        trill_log(TRILL_LOG_WARN, "trill serve: sampler %s not restored: %s", p ? p->id : "?", trill_error_message());
        free(p);
        r->failed++;
        return;
    }
    r->n++;
}

trill_status svc_recover(svc *s) {
    const int failed = svc_store_fail_pending(s->store);
    recover_ctx t = { .s = s }, p = { .s = s };
    trill_status st = svc_store_run(s->store, "restoring trainers",
                                    "SELECT id, key_id, base, rank, seed, mlp, attn, unembed, from_state, from_optimizer, snapshot FROM trainers"
                                    " ORDER BY created, id",
                                    NULL, 0, recover_trainer, &t, NULL);
    if (!st)
        st = svc_store_run(s->store, "restoring samplers", "SELECT id, key_id, base, model_path, dir, version FROM samplers ORDER BY created, id",
                           NULL, 0, recover_sampler, &p, NULL);
    if (!st && (t.n || p.n || failed))
        trill_log(TRILL_LOG_INFO, "trill serve: restored %d trainers (each at its last optimizer step) and %d samplers; %d requests of the "
                                  "last run were in flight and now report server_restarted", t.n, p.n, failed);
    return st;
}
