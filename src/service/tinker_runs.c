/* The official Tinker protocol's training runs and checkpoints (its RestClient): a training run
 * is a trainer (a model) of the caller's, a checkpoint a saved state (`weights/NAME`) or sampler
 * weights (`sampler_weights/NAME`) of it. Read from the state database; a deleted checkpoint's
 * row and folder go, and weights cached from it are never matched again; so do those of a
 * checkpoint whose ttl_seconds have passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "service/http_routes.h"
#include "trill/fileio.h"
#include "trill/log.h"

enum { PAGE_MAX = 1000 };

/* Seconds since the epoch as the ISO 8601 time the SDK's datetime fields take. */
static json_t *iso_time(int64_t t) {
    const time_t tt = (time_t)t;
    struct tm tm;
    char text[32];
    gmtime_r(&tt, &tm);
    strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return json_string(text);
}

/* A query parameter as an integer in [lo, hi] (absent: dflt). */
static long query_int(struct MHD_Connection *c, const char *name, long dflt, long lo, long hi) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    char *end = NULL;
    const long x = v ? strtol(v, &end, 10) : dflt;
    return v && (end == v || *end) ? dflt : x < lo ? lo : x > hi ? hi : x;
}

static trill_status delete_state(svc *s, const char *uri, const char *key_id, const char *dir);

/* ---- checkpoints ---- */

/* A states row as a Checkpoint: trill://RUN/NAME is tinker://RUN/weights/NAME ("training"),
 * trill://RUN/sampler/NAME tinker://RUN/sampler_weights/NAME ("sampler"). */
static void add_checkpoint(void *ctx, sqlite3_stmt *row) {
    json_t *list = ctx;
    const char *uri = (const char *)sqlite3_column_text(row, 0), *kind = (const char *)sqlite3_column_text(row, 1);
    const char *run = uri + 8, *slash = strchr(run, '/');
    if (!slash) return;
    const bool sampler = strcmp(kind, "sampler") == 0;
    const char *name = slash + 1 + (sampler ? 8 : 0), *part = sampler ? "sampler_weights" : "weights"; /* name: after "sampler/" */
    json_t *o = json_pack("{s:o, s:s, s:o, s:o, s:n, s:b, s:o}", "checkpoint_id", json_sprintf("%s/%s", part, name), "checkpoint_type",
                          sampler ? "sampler" : "training", "time", iso_time(sqlite3_column_int64(row, 2)), "tinker_path",
                          json_sprintf("tinker://%.*s/%s/%s", (int)(slash - run), run, part, name), "size_bytes", "public", 0, "expires_at",
                          sqlite3_column_type(row, 3) == SQLITE_NULL ? json_null() : iso_time(sqlite3_column_int64(row, 3)));
    if (o) json_array_append_new(list, o);
}

static void read_count(void *ctx, sqlite3_stmt *row) { *(long *)ctx = (long)sqlite3_column_int64(row, 0); }

/* The caller's checkpoints (of one run, or all), newest first, from offset, at most limit;
 * *total all of them. */
static trill_status checkpoints(svc *s, const char *key_id, const char *run, long limit, long offset, json_t *list, long *total) {
    svc_arg a[] = { SVC_S(key_id), SVC_S(run ? run : ""), SVC_I(limit), SVC_I(offset) };
    const char *where = run ? "key_id = ?1 AND trainer_id = ?2" : "key_id = ?1 AND ?2 = ''";
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT uri, kind, created, expires FROM states WHERE %s ORDER BY created DESC, uri LIMIT ?3 OFFSET ?4", where);
    trill_status st = trill_svc_store_run(s->store, "listing checkpoints", sql, a, 4, add_checkpoint, list, NULL);
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM states WHERE %s", where);
    if (!st) st = trill_svc_store_run(s->store, "counting checkpoints", sql, a, 2, read_count, total, NULL);
    return st;
}

/* Whether RUN names a run of the caller's: a live trainer of its own, or one it saved from. */
static bool owns_run(svc *s, const char *key_id, const char *run) {
    pthread_mutex_lock(&s->mu);
    const bool live = trill_svc_find_tenant(s, run, key_id) != NULL;
    pthread_mutex_unlock(&s->mu);
    long n = 0;
    svc_arg a[] = { SVC_S(key_id), SVC_S(run) };
    return live || (!trill_svc_store_run(s->store, "finding a run", "SELECT COUNT(*) FROM states WHERE key_id = ?1 AND trainer_id = ?2", a, 2,
                                         read_count, &n, NULL) && n > 0);
}

/* A page of a listing (checkpoints or runs, of one run or all) as {NAME: [...], cursor}, its
 * limit and offset from the query (limit dflt when absent). */
typedef trill_status (*lister)(svc *s, const char *key_id, const char *run, long limit, long offset, json_t *list, long *total);
static enum MHD_Result answer_page(const route_call *q, const char *name, const char *run, long dflt, lister fn) {
    const long limit = query_int(q->c, "limit", dflt, 1, PAGE_MAX), offset = query_int(q->c, "offset", 0, 0, 1L << 40);
    json_t *list = json_array();
    long total = 0;
    trill_status st = fn(q->s, q->key_id, run, limit, offset, list, &total);
    if (st) { json_decref(list); return trill_svc_answer_status(q->c, st); }
    return trill_svc_answer_json(q->c, 200, json_pack("{s:o, s:{s:I, s:I, s:I}}", name, list, "cursor", "offset", (json_int_t)offset, "limit",
                                                      (json_int_t)limit, "total_count", (json_int_t)total));
}

/* GET /training_runs/{run}/checkpoints */
enum MHD_Result trill_tinker_run_checkpoints(const route_call *q) {
    if (!owns_run(q->s, q->key_id, q->p[1])) return trill_svc_answer_error(q->c, "not_found", "no such training run");
    return answer_page(q, "checkpoints", q->p[1], PAGE_MAX, checkpoints);
}

/* GET /checkpoints?limit&offset: every run's */
enum MHD_Result trill_tinker_user_checkpoints(const route_call *q) { return answer_page(q, "checkpoints", NULL, 100, checkpoints); }

/* A saved state (uri, resolved to dir) deleted: refused while a sampler samples from it; the
 * weights cached from it are never matched again (a later save under the name is new weights:
 * the sampling worker frees them); the row, then the folder. */
trill_status trill_svc_delete_state(svc *s, const char *uri, const char *key_id) {
    char dir[4096];
    int base = -1;
    trill_status st = trill_svc_resolve_uri(s, uri, key_id, NULL, dir, sizeof dir, &base);
    return st ? st : delete_state(s, uri, key_id, dir);
}

void trill_svc_retire_sampler(svc *s, const char *id, const char *key_id, bool ephemeral, const char *uri) {
    trill_status st = trill_svc_sampler_delete(s, id, key_id);
    if (!st && ephemeral && uri[0]) st = trill_svc_delete_state(s, uri, key_id);
    (void)trill_svc_take_code();
    if (st) trill_log(TRILL_LOG_WARN, "trill serve: sampler %s%s%s not retired whole: %s", id, ephemeral ? " and " : "", ephemeral ? uri : "",
                      trill_error_message());
}

static trill_status delete_state(svc *s, const char *uri, const char *key_id, const char *dir) {
    trill_status st = TRILL_OK;
    pthread_mutex_lock(&s->mu);
    for (int i = 0; !st && i < s->n_weights; i++) {
        svc_weights *w = s->weights[i];
        if (strcmp(w->uri, uri) != 0) continue;
        if (w->refs > 0) st = trill_svc_fail("bad_request", "the checkpoint is sampled from by a sampling session: end that first");
        else w->uri[0] = 0;
    }
    s->reap = true;
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
    svc_arg a[] = { SVC_S(uri), SVC_S(key_id) };
    if (!st) st = trill_svc_store_run(s->store, "deleting a checkpoint", "DELETE FROM states WHERE uri = ?1 AND key_id = ?2", a, 2, NULL, NULL, NULL);
    if (!st) (void)trill_remove_tree(dir); /* after the commit: a crash leaves an orphan folder, which the next start removes */
    return st;
}

/* DELETE /training_runs/{run}/checkpoints/{weights|sampler_weights}/{name} */
enum MHD_Result trill_tinker_delete_checkpoint(const route_call *q) {
    const bool sampler = strcmp(q->p[3], "sampler_weights") == 0;
    if (!sampler && strcmp(q->p[3], "weights") != 0)
        return trill_svc_answer_error(q->c, "not_found", "no such checkpoint (weights/NAME or sampler_weights/NAME)");
    char uri[256], dir[4096];
    snprintf(uri, sizeof uri, "trill://%s/%s%s", q->p[1], sampler ? "sampler/" : "", q->p[4]);
    int base = -1;
    trill_status st = trill_svc_resolve_uri(q->s, uri, q->key_id, sampler ? "sampler" : "state", dir, sizeof dir, &base);
    if (!st) st = delete_state(q->s, uri, q->key_id, dir);
    return st ? trill_svc_answer_status(q->c, st) : trill_svc_answer_json(q->c, 200, json_object());
}

typedef struct expired { char uri[256], key_id[32], dir[4096]; } expired;
typedef struct expired_list { expired *v; int n, cap; } expired_list;

static void add_expired(void *ctx, sqlite3_stmt *row) {
    expired_list *l = ctx;
    if (l->n == l->cap) {
        expired *grown = trill_realloc(l->v, sizeof *grown * (size_t)(l->cap ? 2 * l->cap : 8));
        if (!grown) return;
        l->v = grown, l->cap = l->cap ? 2 * l->cap : 8;
    }
    expired *e = &l->v[l->n++];
    snprintf(e->uri, sizeof e->uri, "%s", (const char *)sqlite3_column_text(row, 0));
    snprintf(e->key_id, sizeof e->key_id, "%s", (const char *)sqlite3_column_text(row, 1));
    snprintf(e->dir, sizeof e->dir, "%s", (const char *)sqlite3_column_text(row, 2));
}

void trill_svc_expire_states(svc *s) {
    expired_list l = { 0 };
    svc_arg now = SVC_I(time(NULL));
    if (!trill_svc_store_run(s->store, "listing expired checkpoints", "SELECT uri, key_id, dir FROM states WHERE expires IS NOT NULL AND expires <= ?1",
                             &now, 1, add_expired, &l, NULL))
        for (int i = 0; i < l.n; i++) {
            trill_status st = delete_state(s, l.v[i].uri, l.v[i].key_id, l.v[i].dir);
            (void)trill_svc_take_code();
            if (!st) trill_log(TRILL_LOG_INFO, "trill serve: checkpoint %s expired (ttl_seconds): deleted", l.v[i].uri);
        }
    free(l.v);
}

/* ---- training runs ---- */

static void add_run(void *ctx, sqlite3_stmt *row) {
    json_t *list = ctx;
    json_t *o = json_pack("{s:s, s:s, s:s, s:b, s:b, s:i, s:o, s:n}", "training_run_id", (const char *)sqlite3_column_text(row, 0), "base_model",
                          (const char *)sqlite3_column_text(row, 1), "model_owner", (const char *)sqlite3_column_text(row, 4), "is_lora", 1,
                          "corrupted", 0, "lora_rank", sqlite3_column_int(row, 2), "last_request_time", iso_time(sqlite3_column_int64(row, 3)),
                          "user_metadata");
    if (o) json_array_append_new(list, o);
}

/* The caller's trainers as TrainingRuns (one, or a page), each with its newest checkpoints. */
static trill_status runs(svc *s, const char *key_id, const char *run, long limit, long offset, json_t *list, long *total) {
    svc_arg a[] = { SVC_S(key_id), SVC_S(run ? run : ""), SVC_I(limit), SVC_I(offset) };
    const char *where = run ? "t.key_id = ?1 AND t.id = ?2" : "t.key_id = ?1 AND ?2 = ''";
    char sql[512];
    snprintf(sql, sizeof sql, "SELECT t.id, t.base, t.rank, MAX(t.created, COALESCE((SELECT MAX(created) FROM requests r WHERE r.target = t.id), 0)),"
             " k.name FROM trainers t JOIN keys k ON k.id = t.key_id WHERE %s ORDER BY t.created DESC, t.id LIMIT ?3 OFFSET ?4", where);
    trill_status st = trill_svc_store_run(s->store, "listing training runs", sql, a, 4, add_run, list, NULL);
    snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM trainers t WHERE %s", where);
    if (!st) st = trill_svc_store_run(s->store, "counting training runs", sql, a, 2, read_count, total, NULL);
    size_t i;
    json_t *r;
    json_array_foreach(list, i, r) { /* the newest checkpoint of each kind */
        json_t *cps = json_array();
        long m = 0;
        if (!st) st = checkpoints(s, key_id, json_string_value(json_object_get(r, "training_run_id")), PAGE_MAX, 0, cps, &m);
        json_t *last[2] = { NULL, NULL }, *c;
        size_t k;
        json_array_foreach(cps, k, c) {
            const int sampler = strcmp(json_string_value(json_object_get(c, "checkpoint_type")), "sampler") == 0;
            if (!last[sampler]) last[sampler] = c;
        }
        json_object_set(r, "last_checkpoint", last[0] ? last[0] : json_null());
        json_object_set(r, "last_sampler_checkpoint", last[1] ? last[1] : json_null());
        json_decref(cps);
    }
    return st;
}

/* GET /training_runs?limit&offset */
enum MHD_Result trill_tinker_training_runs(const route_call *q) { return answer_page(q, "training_runs", NULL, 20, runs); }

/* GET /training_runs/{run} */
enum MHD_Result trill_tinker_training_run(const route_call *q) {
    json_t *list = json_array();
    long total = 0;
    trill_status st = runs(q->s, q->key_id, q->p[1], 1, 0, list, &total);
    json_t *one = json_incref(json_array_get(list, 0));
    json_decref(list);
    if (st) { json_decref(one); return trill_svc_answer_status(q->c, st); }
    return one ? trill_svc_answer_json(q->c, 200, one) : trill_svc_answer_error(q->c, "not_found", "no such training run");
}

/* POST /weights_info {tinker_path}: what the checkpoint's trill_service.json says of its adapter. */
enum MHD_Result trill_tinker_weights_info(const route_call *q) {
    const char *path = json_string_value(json_object_get(q->body, "tinker_path"));
    char uri[256], dir[4096], file[4200];
    int base = -1;
    trill_status st = trill_tinker_trill_path(path, uri, sizeof uri);
    if (!st) st = trill_svc_resolve_uri(q->s, uri, q->key_id, NULL, dir, sizeof dir, &base);
    if (st) return trill_svc_answer_status(q->c, st);
    snprintf(file, sizeof file, "%s/trill_service.json", dir);
    json_error_t err;
    json_t *cfg = json_load_file(file, 0, &err), *rank = json_object_get(cfg, "rank");
    if (!json_is_integer(rank)) {
        json_decref(cfg);
        return trill_svc_answer_error(q->c, "internal", "the checkpoint's trill_service.json does not read back");
    }
    json_t *o = json_pack("{s:s, s:b, s:O, s:O?, s:O?, s:O?}", "base_model", trill_svc_base_name(q->s->bases[base]), "is_lora", 1, "lora_rank", rank,
                          "train_unembed", json_object_get(cfg, "train_unembed"), "train_mlp", json_object_get(cfg, "train_mlp"), "train_attn",
                          json_object_get(cfg, "train_attn"));
    json_decref(cfg);
    return trill_svc_answer_json(q->c, 200, o);
}

/* ---- sessions (the RestClient's) ---- */

/* GET /sessions?limit&offset: {sessions: [ids]} of the caller's live sessions */
enum MHD_Result trill_tinker_sessions(const route_call *q) {
    const long limit = query_int(q->c, "limit", 20, 1, PAGE_MAX), offset = query_int(q->c, "offset", 0, 0, 1L << 40);
    return trill_svc_answer_json(q->c, 200, json_pack("{s:o}", "sessions", trill_svc_sessions_json(q->s, q->key_id, limit, offset)));
}

/* GET /sessions/{session}: its models and sampling sessions */
enum MHD_Result trill_tinker_session(const route_call *q) {
    json_t *o = trill_svc_session_json(q->s, q->p[1], q->key_id);
    return o ? trill_svc_answer_json(q->c, 200, o) : trill_svc_answer_error(q->c, "not_found", "no live session of that id");
}
