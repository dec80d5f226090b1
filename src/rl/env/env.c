/* The environment dispatcher (env.h): a built-in environment's episode states, or an external
 * process. */
#include "rl/env/env.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

typedef struct live_episode {
    uint64_t id;
    void *state;
} live_episode;

struct rl_env {
    const rl_env_builtin *builtin;
    live_episode *live;   /* the built-in's episodes between reset and end, unordered */
    int n_live, cap_live;
};

void trill_rl_env_reply_clear(rl_env_reply *r) {
    json_decref(r->messages);
    json_decref(r->metrics);
    memset(r, 0, sizeof *r);
}

bool trill_rl_env_say(rl_env_reply *r, const char *role, const char *content) {
    if (!r->messages && !(r->messages = json_array())) return false;
    return json_array_append_new(r->messages, json_pack("{s:s, s:s}", "role", role, "content", content)) == 0;
}

trill_status trill_rl_env_open_builtin(const rl_env_builtin *b, rl_env **out) {
    rl_env *e = trill_calloc(1, sizeof *e);
    if (!e) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->builtin = b;
    *out = e;
    return TRILL_OK;
}

trill_status trill_rl_env_open(const trill_run_config *c, rl_env **out) {
    const rl_env_builtin *b = trill_rl_env_builtin(c->env.kind);
    if (!b) return trill_error(TRILL_ERR_INVALID, "env.kind: \"%s\" is not an environment (expected guess)", c->env.kind);
    return trill_rl_env_open_builtin(b, out);
}

void trill_rl_env_free(rl_env *e) {
    if (!e) return;
    for (int i = 0; i < e->n_live; i++) free(e->live[i].state);
    free(e->live);
    free(e);
}

static int find_live(const rl_env *e, uint64_t episode) {
    for (int i = 0; i < e->n_live; i++)
        if (e->live[i].id == episode) return i;
    return -1;
}

void trill_rl_env_end(rl_env *e, uint64_t episode) {
    const int i = find_live(e, episode);
    if (i < 0) return;
    free(e->live[i].state);
    e->live[i] = e->live[--e->n_live];
}

/* A reply as the rollout loop needs it: a finite reward, and messages of role and content
 * strings (unless done). */
static trill_status check_reply(const rl_env *e, uint64_t episode, const char *call, const rl_env_reply *r) {
    const char *what = e->builtin->name;
    if (!isfinite(r->reward))
        return trill_error(TRILL_ERR_INVALID, "environment %s, episode %llu, %s: reward %g (expected a finite number)", what,
                           (unsigned long long)episode, call, r->reward);
    if (r->done) return TRILL_OK;
    if (!json_is_array(r->messages) || json_array_size(r->messages) == 0)
        return trill_error(TRILL_ERR_INVALID, "environment %s, episode %llu, %s: no observation (expected \"messages\": a non-empty "
                           "array) and not done", what, (unsigned long long)episode, call);
    size_t i;
    json_t *m;
    json_array_foreach(r->messages, i, m) {
        if (!json_is_string(json_object_get(m, "role")) || !json_is_string(json_object_get(m, "content")))
            return trill_error(TRILL_ERR_INVALID, "environment %s, episode %llu, %s: message %zu is not {\"role\": string, \"content\": "
                               "string}", what, (unsigned long long)episode, call, i);
    }
    return TRILL_OK;
}

trill_status trill_rl_env_reset(rl_env *e, uint64_t episode, const json_t *task, uint64_t seed, rl_env_reply *out) {
    memset(out, 0, sizeof *out);
    if (find_live(e, episode) >= 0)
        return trill_error(TRILL_ERR_INVALID, "environment %s: episode %llu reset twice", e->builtin->name, (unsigned long long)episode);
    if (e->n_live == e->cap_live) {
        const int cap = e->cap_live ? 2 * e->cap_live : 64;
        live_episode *l = trill_realloc(e->live, sizeof *l * (size_t)cap);
        if (!l) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        e->live = l;
        e->cap_live = cap;
    }
    void *state = trill_calloc(1, e->builtin->state_size ? e->builtin->state_size : 1);
    if (!state) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = e->builtin->reset(state, task, seed, out);
    if (!st) st = check_reply(e, episode, "reset", out);
    if (!st && out->done)
        st = trill_error(TRILL_ERR_INVALID, "environment %s, episode %llu: done at reset", e->builtin->name, (unsigned long long)episode);
    if (st) {
        free(state);
        trill_rl_env_reply_clear(out);
        return st;
    }
    e->live[e->n_live++] = (live_episode){ episode, state };
    return TRILL_OK;
}

trill_status trill_rl_env_step(rl_env *e, uint64_t episode, const char *turn, rl_env_reply *out) {
    memset(out, 0, sizeof *out);
    const int i = find_live(e, episode);
    if (i < 0)
        return trill_error(TRILL_ERR_INVALID, "environment %s: episode %llu was not reset", e->builtin->name, (unsigned long long)episode);
    trill_status st = e->builtin->step(e->live[i].state, turn, out);
    if (!st) st = check_reply(e, episode, "step", out);
    if (st) trill_rl_env_reply_clear(out);
    return st;
}
