/* The official Tinker SDK's client sessions (svc.h): a client makes one when it starts
 * (create_session) and keeps it alive with a heartbeat every 10 s. A session not heard from for
 * --session-timeout seconds (cfg.session_timeout) is forgotten, and the models (trainers) and
 * sampling sessions (samplers) made in it are deleted. Sessions live in memory (a restarted
 * server's clients make new ones, and what was made in the old ones is kept); each key holds at
 * most SVC_MAX_SESSIONS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "trill/log.h"
#include "service/store.h"
#include "service/svc.h"
#include "trill/timing.h"

/* Forgets the sessions whose last heartbeat is older than the timeout. Under s->mu. */
static void forget_dead(svc *s, double now) {
    for (int i = 0; i < s->n_sessions;)
        if (now - s->sessions[i].last_seen > s->cfg.session_timeout) s->sessions[i] = s->sessions[--s->n_sessions];
        else i++;
}

/* Under s->mu, the dead forgotten: key_id's session id, or NULL. */
static svc_session *find_live(svc *s, const char *id, const char *key_id) {
    for (int i = 0; i < s->n_sessions; i++)
        if (strcmp(s->sessions[i].id, id) == 0 && strcmp(s->sessions[i].key_id, key_id) == 0) return &s->sessions[i];
    return NULL;
}

/* A create_session body: {"tags": [strings], "user_metadata": object or null, "sdk_version":
 * string, "project_id"?: string or null, "type"?: "create_session"}. */
static trill_status check_body(const json_t *b) {
    const json_t *tags = json_object_get(b, "tags"), *meta = json_object_get(b, "user_metadata"), *sdk = json_object_get(b, "sdk_version");
    const json_t *project = json_object_get(b, "project_id"), *type = json_object_get(b, "type");
    size_t i;
    const json_t *t;
    if (!json_is_array(tags)) return trill_svc_fail("bad_request", "tags: expected an array of strings");
    json_array_foreach(tags, i, t) if (!json_is_string(t)) return trill_svc_fail("bad_request", "tags: entry %zu is not a string", i);
    if (meta && !json_is_null(meta) && !json_is_object(meta)) return trill_svc_fail("bad_request", "user_metadata: expected an object or null");
    if (!json_is_string(sdk)) return trill_svc_fail("bad_request", "sdk_version: expected a string");
    if (project && !json_is_null(project) && !json_is_string(project)) return trill_svc_fail("bad_request", "project_id: expected a string or null");
    if (type && !(json_is_string(type) && strcmp(json_string_value(type), "create_session") == 0))
        return trill_svc_fail("bad_request", "type: expected \"create_session\"");
    return TRILL_OK;
}

trill_status trill_svc_session_create(svc *s, const char *key_id, const json_t *body, char id[32]) {
    trill_status st = check_body(body);
    if (st) return st;
    const double now = trill_now();
    pthread_mutex_lock(&s->mu);
    forget_dead(s, now);
    int mine = 0;
    for (int i = 0; i < s->n_sessions; i++) mine += strcmp(s->sessions[i].key_id, key_id) == 0;
    if (mine >= SVC_MAX_SESSIONS) {
        st = trill_svc_fail("limit", "this key holds %d live sessions, the most a key may (a session ends %g s after its last heartbeat)",
                            SVC_MAX_SESSIONS, s->cfg.session_timeout);
    } else if (s->n_sessions == s->cap_sessions) {
        const int cap = s->cap_sessions ? 2 * s->cap_sessions : 16;
        svc_session *grown = trill_realloc(s->sessions, sizeof *grown * (size_t)cap);
        if (grown) s->sessions = grown, s->cap_sessions = cap;
        else st = trill_error(TRILL_ERR_NOMEM, "out of memory for a session");
    }
    if (!st) {
        svc_session *x = &s->sessions[s->n_sessions++];
        trill_svc_new_id(x->id, sizeof x->id, "sess-");
        snprintf(x->key_id, sizeof x->key_id, "%s", key_id);
        x->last_seen = now;
        memcpy(id, x->id, sizeof x->id);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

trill_status trill_svc_session_heartbeat(svc *s, const char *key_id, const json_t *body) {
    const json_t *id = json_object_get(body, "session_id"), *type = json_object_get(body, "type");
    if (!json_is_string(id)) return trill_svc_fail("bad_request", "session_id: expected a string");
    if (type && !(json_is_string(type) && strcmp(json_string_value(type), "session_heartbeat") == 0))
        return trill_svc_fail("bad_request", "type: expected \"session_heartbeat\"");
    const double now = trill_now();
    pthread_mutex_lock(&s->mu);
    forget_dead(s, now);
    svc_session *x = find_live(s, json_string_value(id), key_id);
    const bool found = x != NULL;
    if (x) x->last_seen = now;
    pthread_mutex_unlock(&s->mu);
    return found ? TRILL_OK
                 : trill_svc_fail("not_found", "no live session %s (a session ends %g s after its last heartbeat)", json_string_value(id),
                                  s->cfg.session_timeout);
}

bool trill_svc_session_live(svc *s, const char *id, const char *key_id) {
    forget_dead(s, trill_now());
    return find_live(s, id, key_id) != NULL;
}

/* A trainer or sampler to delete, and the session it was made in (an ephemeral sampler: its weights' uri). */
typedef struct orphan { char id[32], key_id[32], session[32], uri[256]; bool trainer, ephemeral; } orphan;

static orphan *add_orphan(orphan *list, int *n, const char *id, const char *key_id, const char *session, bool trainer) {
    orphan *o = &list[(*n)++];
    memcpy(o->id, id, sizeof o->id), memcpy(o->key_id, key_id, sizeof o->key_id), memcpy(o->session, session, sizeof o->session);
    o->trainer = trainer, o->ephemeral = false, o->uri[0] = 0;
    return o;
}

void trill_svc_sessions_reap(svc *s) {
    pthread_mutex_lock(&s->mu);
    forget_dead(s, trill_now());
    orphan *list = trill_calloc((size_t)(s->n_tenants + s->n_samplers + 1), sizeof *list);
    int n = 0;
    for (int i = 0; list && i < s->n_tenants; i++) {
        const svc_tenant *t = s->tenants[i];
        if (!t->gone && !t->creating && t->session[0] && !find_live(s, t->session, t->key_id))
            add_orphan(list, &n, t->id, t->key_id, t->session, true);
    }
    for (int i = 0; list && i < s->n_samplers; i++) {
        const svc_sampler *p = s->samplers[i];
        if (!p->gone && !p->creating && p->session[0] && !find_live(s, p->session, p->key_id)) {
            orphan *o = add_orphan(list, &n, p->id, p->key_id, p->session, false);
            o->ephemeral = p->ephemeral;
            if (p->weights) snprintf(o->uri, sizeof o->uri, "%s", p->weights->uri);
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) { /* outside the lock: a delete commits to the store */
        const orphan *o = &list[i];
        trill_status st = TRILL_OK;
        if (o->trainer) st = trill_svc_tenant_delete(s, o->id, o->key_id);
        else trill_svc_retire_sampler(s, o->id, o->key_id, o->ephemeral, o->uri); /* an ephemeral one's weights go too */
        (void)trill_svc_take_code();
        if (st) trill_log(TRILL_LOG_WARN, "trill serve: session %s ended, but %s %s was not deleted: %s", o->session, o->trainer ? "model" : "sampler",
                          o->id, trill_error_message());
        else trill_log(TRILL_LOG_INFO, "trill serve: session %s ended (no heartbeat for %g s): %s %s deleted", o->session, s->cfg.session_timeout,
                       o->trainer ? "model" : "sampler", o->id);
    }
    free(list);
}

json_t *trill_svc_sessions_json(svc *s, const char *key_id, long limit, long offset) {
    json_t *a = json_array();
    pthread_mutex_lock(&s->mu);
    forget_dead(s, trill_now());
    long seen = 0;
    for (int i = 0; a && i < s->n_sessions; i++)
        if (strcmp(s->sessions[i].key_id, key_id) == 0 && seen++ >= offset && (long)json_array_size(a) < limit)
            json_array_append_new(a, json_string(s->sessions[i].id));
    pthread_mutex_unlock(&s->mu);
    return a;
}

json_t *trill_svc_session_json(svc *s, const char *id, const char *key_id) {
    json_t *runs = json_array(), *samplers = json_array(), *o = NULL;
    pthread_mutex_lock(&s->mu);
    if (trill_svc_session_live(s, id, key_id)) {
        for (int i = 0; i < s->n_tenants; i++)
            if (!s->tenants[i]->gone && strcmp(s->tenants[i]->session, id) == 0) json_array_append_new(runs, json_string(s->tenants[i]->id));
        for (int i = 0; i < s->n_samplers; i++)
            if (!s->samplers[i]->gone && strcmp(s->samplers[i]->session, id) == 0) json_array_append_new(samplers, json_string(s->samplers[i]->id));
        o = json_pack("{s:O, s:O}", "training_run_ids", runs, "sampler_ids", samplers);
    }
    pthread_mutex_unlock(&s->mu);
    json_decref(runs), json_decref(samplers);
    return o;
}
