/* Trainers and samplers of the tenants (svc.h): made within their key's limits, found only by
 * their owner, recorded in the state database, deleted, and released when their key is revoked.
 * (Their snapshots, saves and recovery: state.c.) */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "service/svc.h"
#include "trill/fileio.h"
#include "trill/log.h"

/* ---- error codes for the HTTP answer ---- */

static _Thread_local const char *last_code;

trill_status trill_svc_fail(const char *code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    last_code = code;
    return trill_error(TRILL_ERR_INVALID, "%s", msg);
}

const char *trill_svc_take_code(void) {
    const char *c = last_code;
    last_code = NULL;
    return c;
}

/* ---- lookups ---- */

svc_tenant *trill_svc_find_tenant(svc *s, const char *id, const char *key_id) {
    for (int i = 0; i < s->n_tenants; i++) {
        svc_tenant *t = s->tenants[i];
        if (strcmp(t->id, id) == 0) return strcmp(t->key_id, key_id) == 0 && !t->creating && !t->gone ? t : NULL;
    }
    return NULL;
}

svc_sampler *trill_svc_find_sampler(svc *s, const char *id, const char *key_id) {
    for (int i = 0; i < s->n_samplers; i++) {
        svc_sampler *p = s->samplers[i];
        if (strcmp(p->id, id) == 0) return strcmp(p->key_id, key_id) == 0 && !p->creating && !p->gone ? p : NULL;
    }
    return NULL;
}

int trill_svc_find_base(const svc *s, const char *name) {
    for (int i = 0; name && i < s->n_bases; i++)
        if (strcmp(trill_svc_base_name(s->bases[i]), name) == 0) return i;
    return -1;
}

typedef struct { char key_id[32], kind[16], dir[4096], base[256]; bool found; } uri_row;

static void read_uri(void *ctx, sqlite3_stmt *row) {
    uri_row *r = ctx;
    snprintf(r->key_id, sizeof r->key_id, "%s", (const char *)sqlite3_column_text(row, 0));
    snprintf(r->kind, sizeof r->kind, "%s", (const char *)sqlite3_column_text(row, 1));
    snprintf(r->dir, sizeof r->dir, "%s", (const char *)sqlite3_column_text(row, 2));
    snprintf(r->base, sizeof r->base, "%s", sqlite3_column_text(row, 3) ? (const char *)sqlite3_column_text(row, 3) : "");
    r->found = true;
}

trill_status trill_svc_resolve_uri(svc *s, const char *uri, const char *key_id, const char *kind, char *dir, size_t cap, int *base) {
    if (strncmp(uri, "trill://", 8) != 0)
        return trill_svc_fail("bad_request", "path: \"%.200s\" is not a trill:// path (paths are what save_state and save_weights_for_sampler "
                                       "return, never file-system paths)", uri);
    uri_row r = { 0 };
    svc_arg a = SVC_S(uri);
    trill_status st = trill_svc_store_run(s->store, "finding a saved state", "SELECT key_id, kind, dir, base FROM states WHERE uri = ?1", &a, 1,
                                    read_uri, &r, NULL);
    if (st) return st;
    if (!r.found || strcmp(r.key_id, key_id) != 0) return trill_svc_fail("not_found", "path: no saved state %.200s", uri);
    if (kind && strcmp(r.kind, kind) != 0)
        return trill_svc_fail("bad_request", "path: %.200s holds sampler weights only (save_weights_for_sampler); a state from save_state is needed", uri);
    if ((*base = trill_svc_find_base(s, r.base)) < 0) return trill_svc_fail("not_found", "path: %.200s is of base model %s, which this server does not serve", uri, r.base);
    snprintf(dir, cap, "%s", r.dir);
    return TRILL_OK;
}

static void read_version(void *ctx, sqlite3_stmt *row) { *(int64_t *)ctx = sqlite3_column_int64(row, 0); }

int64_t trill_svc_uri_version(svc *s, const char *uri) {
    int64_t v = -1;
    svc_arg a = SVC_S(uri);
    if (trill_svc_store_run(s->store, "reading a path's version", "SELECT version FROM states WHERE uri = ?1", &a, 1, read_version, &v, NULL)) return -1;
    return v;
}


/* ---- memory ---- */

/* Reserves `bytes` of trainers' adapter memory, or refuses with the limit. Under s->mu. */
static trill_status reserve_locked(svc *s, size_t bytes) {
    const size_t now = s->adapter_bytes;
    if (now + bytes <= s->cfg.max_adapter_bytes) {
        s->adapter_bytes += bytes;
        return TRILL_OK;
    }
    return trill_svc_fail("limit", "adapter memory: %.1f MB resident, %.1f MB more would pass the server's limit of %.0f MB (--max-adapter-mb)",
                    now / 1e6, bytes / 1e6, s->cfg.max_adapter_bytes / 1e6);
}

/* A trainer's adapter, its gradient and its two AdamW moments. */
static size_t trainer_bytes(trill_svc_trainer *t) {
    size_t n;
    trill_lora_params(trill_svc_trainer_lora(t), &n);
    return 4 * n * sizeof(float);
}

/* ---- trainers ---- */

static trill_status bool_field(const json_t *o, const char *key, bool *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return TRILL_OK;
    if (!json_is_boolean(v)) return trill_svc_fail("bad_request", "%s: expected true or false", key);
    *out = json_is_true(v);
    return TRILL_OK;
}

static trill_status parse_new_trainer(svc *s, const json_t *body, int *base, trill_svc_trainer_config *c) {
    const char *name = json_string_value(json_object_get(body, "base_model"));
    if ((*base = trill_svc_find_base(s, name)) < 0) return trill_svc_fail("not_found", "base_model: \"%.200s\" is not served here (GET /api/v1/models lists them)", name ? name : "");
    *c = (trill_svc_trainer_config){ .rank = 32, .seed = trill_svc_random_u64() >> 11, .train_mlp = true, .train_attn = true, .train_unembed = true };
    const json_t *rank = json_object_get(body, "rank"), *seed = json_object_get(body, "seed");
    if (rank && !json_is_null(rank)) {
        if (!json_is_integer(rank) || json_integer_value(rank) < 1 || json_integer_value(rank) > 256)
            return trill_svc_fail("bad_request", "rank: expected an integer in [1, 256]");
        c->rank = (int)json_integer_value(rank);
    }
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0) return trill_svc_fail("bad_request", "seed: expected a non-negative integer");
        c->seed = (uint64_t)json_integer_value(seed);
    }
    trill_status st = bool_field(body, "train_mlp", &c->train_mlp);
    if (!st) st = bool_field(body, "train_attn", &c->train_attn);
    if (!st) st = bool_field(body, "train_unembed", &c->train_unembed);
    return st;
}

/* Live trainers (or samplers) of key_id, those being made included. Under s->mu. */
static int count_of_key(svc *s, const char *key_id, bool samplers) {
    int n = 0;
    for (int i = 0; samplers && i < s->n_samplers; i++) n += !s->samplers[i]->gone && strcmp(s->samplers[i]->key_id, key_id) == 0;
    for (int i = 0; !samplers && i < s->n_tenants; i++) n += !s->tenants[i]->gone && strcmp(s->tenants[i]->key_id, key_id) == 0;
    return n;
}

/* A place for a new trainer of key_id: counted against the key's limit from now on (checked and
 * taken in one step, so concurrent creators cannot pass it), found by no lookup until it is made. */
static trill_status place_tenant(svc *s, const char *key_id, svc_tenant **out) {
    *out = NULL;
    svc_tenant *t = trill_calloc(1, sizeof *t);
    if (!t) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_svc_new_id(t->id, sizeof t->id, "t-");
    snprintf(t->key_id, sizeof t->key_id, "%s", key_id);
    t->creating = true;
    pthread_mutex_lock(&s->mu);
    trill_status st = count_of_key(s, key_id, false) >= s->cfg.max_trainers_per_key
                          ? trill_svc_fail("limit", "this key has %d trainers, the most the server allows (--max-trainers)", s->cfg.max_trainers_per_key)
                          : TRILL_OK;
    svc_tenant **p = st ? NULL : trill_realloc(s->tenants, sizeof *p * (size_t)(s->n_tenants + 1));
    if (!st && !p) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        long least = -1; /* a new trainer starts level with the least served one, not ahead of everyone */
        for (int i = 0; i < s->n_tenants; i++)
            if (least < 0 || p[i]->served < least) least = p[i]->served;
        t->served = least < 0 ? 0 : least;
        s->tenants = p;
        s->tenants[s->n_tenants++] = t;
    }
    pthread_mutex_unlock(&s->mu);
    if (st) { free(t); return st; }
    *out = t;
    return TRILL_OK;
}

/* Under s->mu: t out of the list (its place in it moves). */
static void unlink_tenant(svc *s, svc_tenant *t) {
    for (int i = 0; i < s->n_tenants; i++)
        if (s->tenants[i] == t) { memmove(s->tenants + i, s->tenants + i + 1, sizeof *s->tenants * (size_t)(s->n_tenants - i - 1)); s->n_tenants--; break; }
}

void trill_svc_tenant_release(svc *s, svc_tenant *t, bool files) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/trainers/%s/snapshots", s->cfg.state_dir, t->id);
    s->adapter_bytes -= t->bytes;
    trill_svc_trainer_free(t->trainer);
    free(t);
    if (files) trill_remove_tree(dir); /* its saved states stay: their paths outlive it */
}

static trill_status record_tenant(svc *s, const svc_tenant *t, const char *from_state, bool from_optimizer) {
    const trill_svc_trainer_config *c = trill_svc_trainer_get_config(t->trainer);
    svc_arg a[] = { SVC_S(t->id), SVC_S(t->key_id), SVC_S(trill_svc_base_name(s->bases[t->base])), SVC_I(c->rank), SVC_I(c->seed),
                    SVC_I(c->train_mlp), SVC_I(c->train_attn), SVC_I(c->train_unembed), SVC_S(from_state ? from_state : ""), SVC_I(from_optimizer),
                    SVC_I(trill_svc_trainer_step(t->trainer)), SVC_I(time(NULL)), SVC_S(t->snapshot) };
    return trill_svc_store_run(s->store, "recording a trainer",
                         "INSERT INTO trainers(id, key_id, base, rank, seed, mlp, attn, unembed, from_state, from_optimizer, step, created, snapshot)"
                         " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULLIF(?9, ''), ?10, ?11, ?12, NULLIF(?13, ''))",
                         a, 13, NULL, NULL, NULL);
}

/* A trainer made from the saved state at `path`, and its first snapshot: a copy of that state, so
 * that what the path holds later (a save under its name) never changes this trainer. */
static trill_status trainer_from_state(svc *s, svc_tenant *t, const json_t *body, char *from, size_t cap, bool *with_optimizer,
                                       trill_svc_trainer **tr) {
    const char *path = json_string_value(json_object_get(body, "path"));
    const json_t *w = json_object_get(body, "with_optimizer");
    *with_optimizer = json_is_true(w);
    trill_status st = path ? TRILL_OK : trill_svc_fail("bad_request", "path: expected the trill:// path of a saved state");
    if (!st && w && !json_is_boolean(w)) st = trill_svc_fail("bad_request", "with_optimizer: expected true or false");
    if (!st) st = trill_svc_resolve_uri(s, path, t->key_id, "state", from, cap, &t->base);
    if (!st) st = trill_svc_verify_folder(s, t->base, from);
    if (!st) st = trill_svc_trainer_load(s->bases[t->base], from, *with_optimizer, tr);
    char name[64];
    snprintf(name, sizeof name, "%lld-%08x", st ? 0LL : (long long)trill_svc_trainer_step(*tr), (unsigned)(trill_svc_random_u64() & 0xffffffffu));
    if (!st) st = trill_svc_write_folder(s, *tr, t->base, t->id, "snapshots", name, true, t->snapshot, sizeof t->snapshot);
    if (st) t->snapshot[0] = '\0';
    return st;
}

trill_status trill_svc_tenant_create(svc *s, const char *key_id, const json_t *body, bool from_state, svc_tenant **out) {
    *out = NULL;
    svc_tenant *t = NULL;
    trill_status st = place_tenant(s, key_id, &t);
    if (st) return st;
    char from[4096] = "";
    bool with_optimizer = false;
    trill_svc_trainer *tr = NULL;
    if (from_state) st = trainer_from_state(s, t, body, from, sizeof from, &with_optimizer, &tr);
    else {
        trill_svc_trainer_config c;
        st = parse_new_trainer(s, body, &t->base, &c);
        if (!st) st = trill_svc_trainer_create(s->bases[t->base], &c, &tr);
    }
    const size_t bytes = tr ? trainer_bytes(tr) : 0;
    pthread_mutex_lock(&s->mu);
    if (!st && !(st = reserve_locked(s, bytes))) t->bytes = bytes;
    if (tr) t->step = trill_svc_trainer_step(tr);
    pthread_mutex_unlock(&s->mu);
    t->trainer = tr; /* no lookup reads a trainer being made */
    if (!st) st = record_tenant(s, t, from_state ? from : NULL, with_optimizer); /* the commit */
    pthread_mutex_lock(&s->mu);
    if (st) {
        unlink_tenant(s, t);
        if (t->snapshot[0]) trill_remove_tree(t->snapshot);
        trill_svc_tenant_release(s, t, false);
    } else {
        t->creating = false; /* found from now on */
        *out = t;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* Under s->mu: tenant t's or sampler p's calls waiting in a queue. */
static bool waits(const svc_job *j, const svc_tenant *t, const svc_sampler *p) { return (t && j->tenant == t) || (p && j->sampler == p); }

svc_job *trill_svc_take_queued(svc *s, svc_tenant *t, svc_sampler *p) {
    svc_job *taken = NULL, **q = t ? &t->head : &s->sample_head;
    for (svc_job *j; (j = *q);) {
        if (!waits(j, t, p)) { q = &j->next; continue; }
        *q = j->next;
        j->next = taken, taken = j;
    }
    svc_job **tail = t ? &t->tail : &s->sample_tail;
    *tail = NULL;
    for (svc_job *j = t ? t->head : s->sample_head; j; j = j->next) *tail = j;
    return taken;
}

void trill_svc_fail_jobs(svc *s, svc_job *jobs, const char *why) {
    for (svc_job *j = jobs, *next; j; j = next) {
        next = j->next;
        trill_svc_job_finish(s, j, NULL, trill_svc_fail("gone", "%s", why));
    }
}

void trill_svc_tenant_settle(svc *s, svc_tenant *t) {
    if (!t->gone || t->pins || t->running) return;
    unlink_tenant(s, t);
    trill_svc_tenant_release(s, t, t->gone == SVC_DELETED);
}

trill_status trill_svc_tenant_delete(svc *s, const char *id, const char *key_id) {
    pthread_mutex_lock(&s->mu);
    svc_tenant *t = trill_svc_find_tenant(s, id, key_id);
    if (t) t->pins++; /* kept while its record is deleted */
    pthread_mutex_unlock(&s->mu);
    if (!t) return trill_svc_fail("not_found", "no such trainer");
    svc_arg a = SVC_S(id);
    trill_status st = trill_svc_store_run(s->store, "deleting a trainer", "DELETE FROM trainers WHERE id = ?1", &a, 1, NULL, NULL, NULL); /* the commit */
    svc_job *queued = NULL;
    pthread_mutex_lock(&s->mu);
    t->pins--;
    if (!st) {
        t->gone = SVC_DELETED; /* no call reaches it from now on */
        queued = trill_svc_take_queued(s, t, NULL);
    }
    trill_svc_tenant_settle(s, t); /* now, or after its running call (the training worker) */
    pthread_mutex_unlock(&s->mu);
    char why[96];
    snprintf(why, sizeof why, "trainer %s was deleted", id);
    trill_svc_fail_jobs(s, queued, why);
    return st;
}

/* ---- samplers ---- */

/* Under s->mu: p out of the list. */
static void unlink_sampler(svc *s, svc_sampler *p) {
    for (int i = 0; i < s->n_samplers; i++)
        if (s->samplers[i] == p) { memmove(s->samplers + i, s->samplers + i + 1, sizeof *s->samplers * (size_t)(s->n_samplers - i - 1)); s->n_samplers--; break; }
}

void trill_svc_sampler_release(svc *s, svc_sampler *p) {
    if (p->weights && --p->weights->refs == 0) { /* the sampling worker frees it (it may hold an engine slot) */
        s->reap = true;
        pthread_cond_broadcast(&s->work);
    }
    free(p);
}

trill_status trill_svc_weights_load(svc *s, svc_weights *w) {
    const int64_t now = trill_svc_uri_version(s, w->uri);
    if (now != w->version)
        return trill_error(TRILL_ERR_INVALID, "%s has been saved again since this sampler was made (its weights are gone): make a sampling "
                           "client from the path again", w->uri);
    trill_lora *lora = NULL;
    trill_status st = trill_svc_verify_folder(s, w->base, w->dir);
    if (!st) st = trill_lora_load(trill_svc_base_model(s->bases[w->base]), w->dir, &lora);
    if (st && trill_svc_uri_version(s, w->uri) != w->version) /* saved again while it was read */
        return trill_error(TRILL_ERR_INVALID, "%s has been saved again since this sampler was made (its weights are gone): make a sampling "
                           "client from the path again", w->uri);
    if (st) return st;
    size_t n;
    trill_lora_params(lora, &n);
    pthread_mutex_lock(&s->mu);
    if (w->lora) trill_lora_free(lora); /* loaded meanwhile by another thread */
    else {
        w->lora = lora, w->bytes = n * sizeof(float);
        s->sampler_bytes += w->bytes;
        if (s->sampler_bytes > s->cfg.max_adapter_bytes) s->reap = true, pthread_cond_broadcast(&s->work); /* the worker trims the cache */
    }
    pthread_mutex_unlock(&s->mu);
    return TRILL_OK;
}

trill_status trill_svc_sampler_create(svc *s, const char *key_id, const json_t *body, svc_sampler **out) {
    *out = NULL;
    const char *path = json_string_value(json_object_get(body, "model_path"));
    const char *base = json_string_value(json_object_get(body, "base_model"));
    if (!path == !base) return trill_svc_fail("bad_request", "expected one of model_path (a trill:// path) and base_model");
    if (path && strlen(path) >= sizeof ((svc_weights *)0)->uri) return trill_svc_fail("bad_request", "model_path: longer than %zu bytes", sizeof ((svc_weights *)0)->uri - 1);
    svc_sampler *p = trill_calloc(1, sizeof *p);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_svc_new_id(p->id, sizeof p->id, "s-");
    snprintf(p->key_id, sizeof p->key_id, "%s", key_id);
    p->creating = true;
    pthread_mutex_lock(&s->mu); /* the key's limit checked and its place taken in one step */
    trill_status st = count_of_key(s, key_id, true) >= s->cfg.max_samplers_per_key
                          ? trill_svc_fail("limit", "this key has %d samplers, the most the server allows (--max-samplers)", s->cfg.max_samplers_per_key)
                          : TRILL_OK;
    svc_sampler **grown = st ? NULL : trill_realloc(s->samplers, sizeof *grown * (size_t)(s->n_samplers + 1));
    if (!st && !grown) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) s->samplers = grown, s->samplers[s->n_samplers++] = p;
    pthread_mutex_unlock(&s->mu);
    if (st) { free(p); return st; }
    char dir[4096];
    if (path) st = trill_svc_resolve_uri(s, path, key_id, NULL, dir, sizeof dir, &p->base);
    else if ((p->base = trill_svc_find_base(s, base)) < 0) st = trill_svc_fail("not_found", "base_model: \"%.200s\" is not served here", base);
    if (!st && path) { /* one copy of a path's weights for all its samplers */
        const int64_t version = trill_svc_uri_version(s, path);
        pthread_mutex_lock(&s->mu);
        if ((p->weights = trill_svc_weights_for(s, path, version, dir, p->base))) p->weights->refs++;
        const bool loaded = p->weights && p->weights->lora;
        pthread_mutex_unlock(&s->mu);
        if (!p->weights) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else if (!loaded) st = trill_svc_weights_load(s, p->weights); /* now: a path that does not load is refused here, not at its first sample */
    }
    svc_arg a[] = { SVC_S(p->id), SVC_S(key_id), SVC_S(trill_svc_base_name(s->bases[p->base < 0 ? 0 : p->base])),
                    SVC_S(p->weights ? p->weights->uri : ""), SVC_S(p->weights ? p->weights->dir : ""), SVC_I(p->weights ? p->weights->version : 0),
                    SVC_I(time(NULL)) };
    if (!st)
        st = trill_svc_store_run(s->store, "recording a sampler",
                           "INSERT INTO samplers(id, key_id, base, model_path, dir, version, created) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)", a, 7,
                           NULL, NULL, NULL);
    pthread_mutex_lock(&s->mu);
    if (st) {
        unlink_sampler(s, p);
        trill_svc_sampler_release(s, p);
    } else {
        p->creating = false; /* found from now on */
        *out = p;
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

void trill_svc_sampler_settle(svc *s, svc_sampler *p) {
    if (!p->gone || p->pins || p->jobs) return;
    unlink_sampler(s, p);
    trill_svc_sampler_release(s, p);
}

trill_status trill_svc_sampler_delete(svc *s, const char *id, const char *key_id) {
    pthread_mutex_lock(&s->mu);
    svc_sampler *p = trill_svc_find_sampler(s, id, key_id);
    if (p) p->pins++;
    pthread_mutex_unlock(&s->mu);
    if (!p) return trill_svc_fail("not_found", "no such sampler");
    svc_arg a = SVC_S(id);
    trill_status st = trill_svc_store_run(s->store, "deleting a sampler", "DELETE FROM samplers WHERE id = ?1", &a, 1, NULL, NULL, NULL);
    svc_job *queued = NULL;
    pthread_mutex_lock(&s->mu);
    p->pins--;
    if (!st) {
        p->gone = SVC_DELETED;
        queued = trill_svc_take_queued(s, NULL, p);
    }
    trill_svc_sampler_settle(s, p); /* now, or when its last running call ends (trill_svc_job_finish) */
    pthread_mutex_unlock(&s->mu);
    char why[96];
    snprintf(why, sizeof why, "sampler %s was deleted", id);
    trill_svc_fail_jobs(s, queued, why);
    return st;
}

/* ---- revoked keys ---- */

typedef struct { char (*ids)[32]; int n, cap; bool nomem; } key_list;

static void add_key_id(void *ctx, sqlite3_stmt *row) {
    key_list *k = ctx;
    if (k->n == k->cap) {
        const int cap = k->cap ? 2 * k->cap : 8;
        char (*grown)[32] = trill_realloc(k->ids, sizeof *grown * (size_t)cap);
        if (!grown) { k->nomem = true; return; }
        k->ids = grown, k->cap = cap;
    }
    snprintf(k->ids[k->n++], 32, "%s", (const char *)sqlite3_column_text(row, 0));
}

static bool listed(const key_list *k, const char *id) {
    for (int i = 0; i < k->n; i++)
        if (strcmp(k->ids[i], id) == 0) return true;
    return false;
}

void trill_svc_release_revoked(svc *s) {
    key_list k = { 0 };
    if (trill_svc_store_run(s->store, "listing revoked keys", "SELECT id FROM keys WHERE revoked = 1", NULL, 0, add_key_id, &k, NULL) || k.nomem || !k.n) {
        free(k.ids);
        return;
    }
    svc_job *queued = NULL;
    pthread_mutex_lock(&s->mu);
    for (int i = s->n_tenants - 1; i >= 0; i--) {
        svc_tenant *t = s->tenants[i];
        if (t->gone || t->creating || !listed(&k, t->key_id)) continue;
        trill_log(TRILL_LOG_INFO, "trill serve: trainer %s released: its key was revoked", t->id);
        t->gone = SVC_RELEASED;
        svc_job *taken = trill_svc_take_queued(s, t, NULL), *last = taken;
        for (; last && last->next; last = last->next) {}
        if (last) last->next = queued, queued = taken;
        trill_svc_tenant_settle(s, t);
    }
    for (int i = s->n_samplers - 1; i >= 0; i--) {
        svc_sampler *p = s->samplers[i];
        if (p->gone || p->creating || !listed(&k, p->key_id)) continue;
        p->gone = SVC_RELEASED;
        svc_job *taken = trill_svc_take_queued(s, NULL, p), *last = taken;
        for (; last && last->next; last = last->next) {}
        if (last) last->next = queued, queued = taken;
        trill_svc_sampler_settle(s, p);
    }
    pthread_mutex_unlock(&s->mu);
    trill_svc_fail_jobs(s, queued, "its API key was revoked");
    free(k.ids);
}
