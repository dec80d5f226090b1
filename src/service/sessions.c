/* The official Tinker SDK's client sessions (svc.h): a client makes one when it starts
 * (create_session) and keeps it alive with a heartbeat every 10 s. A session not heard from for
 * --session-timeout seconds (cfg.session_timeout) is forgotten. Sessions live in memory (a restarted server's clients make
 * new ones); each key holds at most SVC_MAX_SESSIONS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "service/store.h"
#include "service/svc.h"
#include "trill/timing.h"

/* Forgets the sessions whose last heartbeat is older than the timeout. Under s->mu. */
static void forget_dead(svc *s, double now) {
    for (int i = 0; i < s->n_sessions;)
        if (now - s->sessions[i].last_seen > s->cfg.session_timeout) s->sessions[i] = s->sessions[--s->n_sessions];
        else i++;
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
    bool found = false;
    pthread_mutex_lock(&s->mu);
    forget_dead(s, now);
    for (int i = 0; i < s->n_sessions && !found; i++)
        if (strcmp(s->sessions[i].id, json_string_value(id)) == 0 && strcmp(s->sessions[i].key_id, key_id) == 0) {
            s->sessions[i].last_seen = now;
            found = true;
        }
    pthread_mutex_unlock(&s->mu);
    return found ? TRILL_OK
                 : trill_svc_fail("not_found", "no live session %s (a session ends %g s after its last heartbeat)", json_string_value(id),
                                  s->cfg.session_timeout);
}
