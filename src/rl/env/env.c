/* The environment dispatcher (env.h): a built-in environment's episode states, or an external
 * process. */
#include "rl/env/env.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

typedef struct live_episode {
    uint64_t id;
    void *state;          /* a built-in's */
    uint64_t generation;  /* the process's: the start that reset it */
} live_episode;

struct rl_env {
    const char *name;             /* in messages */
    const rl_env_builtin *builtin; /* one or the other */
    env_process *proc;
    bool mark_failures;           /* the process's: a lost episode is marked, not an error */
    live_episode *live;           /* the episodes between reset and end, unordered */
    int n_live, cap_live;
};

void trill_rl_env_reply_clear(rl_env_reply *r) {
    json_decref(r->messages);
    json_decref(r->metrics);
    json_decref(r->tools);
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
    e->name = b->name;
    *out = e;
    return TRILL_OK;
}

trill_status trill_rl_env_open(const trill_run_config *c, rl_env **out) {
    if (strcmp(c->env.kind, "process") != 0) {
        const rl_env_builtin *b = trill_rl_env_builtin(c->env.kind);
        if (!b) return trill_error(TRILL_ERR_INVALID, "env.kind: \"%s\" is not an environment (expected guess or process)", c->env.kind);
        return trill_rl_env_open_builtin(b, out);
    }
    rl_env *e = trill_calloc(1, sizeof *e);
    if (!e) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->name = "process";
    e->mark_failures = c->env.mark_failures;
    trill_status st = trill_rl_env_process_start(c, &e->proc);
    if (st) {
        free(e);
        return st;
    }
    *out = e;
    return TRILL_OK;
}

void trill_rl_env_free(rl_env *e) {
    if (!e) return;
    for (int i = 0; i < e->n_live; i++) free(e->live[i].state);
    free(e->live);
    trill_rl_env_process_free(e->proc);
    free(e);
}

int trill_rl_env_live(const rl_env *e) { return e->n_live; }

static int find_live(const rl_env *e, uint64_t episode) {
    for (int i = 0; i < e->n_live; i++)
        if (e->live[i].id == episode) return i;
    return -1;
}

/* Whether the process that reset live episode i still runs (else the episode is lost). */
static bool same_process(const rl_env *e, int i) { return e->live[i].generation == trill_rl_env_process_generation(e->proc); }

trill_status trill_rl_env_end(rl_env *e, uint64_t episode) {
    const int i = find_live(e, episode);
    if (i < 0) return TRILL_OK;
    const bool tell = e->proc && same_process(e, i);
    free(e->live[i].state);
    e->live[i] = e->live[--e->n_live];
    if (!tell) return TRILL_OK;
    json_t *reply;
    trill_status st = trill_rl_env_process_call(e->proc, episode, json_pack("{s:s, s:I}", "op", "end", "episode", (json_int_t)episode), &reply);
    json_decref(reply);
    return st;
}

/* A reply as the rollout loop needs it: a finite reward, and messages of role and content
 * strings (unless done). */
static trill_status check_reply(const rl_env *e, uint64_t episode, const char *call, const rl_env_reply *r) {
    const char *what = e->name;
    if (!isfinite(r->reward))
        return trill_error(TRILL_ERR_INVALID, "environment %s, episode %llu, %s: reward %g (expected a finite number)", what,
                           (unsigned long long)episode, call, r->reward);
    if (r->tools && !json_is_array(r->tools))
        return trill_error(TRILL_ERR_INVALID, "environment %s, episode %llu, %s: \"tools\": expected an array of tool definitions", what,
                           (unsigned long long)episode, call);
    if (r->done || r->lost) return TRILL_OK;
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

/* A process's reply as an rl_env_reply: "messages" (kept as they are; check_reply looks at them),
 * and for a step a numeric "reward", a boolean "done" and optional "metrics" of numbers. */
static trill_status from_process(const rl_env *e, uint64_t episode, const char *call, json_t *reply, rl_env_reply *out) {
    const json_t *messages = json_object_get(reply, "messages"), *metrics = json_object_get(reply, "metrics");
    const json_t *reward = json_object_get(reply, "reward"), *done = json_object_get(reply, "done");
    const bool step = strcmp(call, "step") == 0;
    const char *bad = NULL;
    if (step && !json_is_number(reward)) bad = "\"reward\": expected a number";
    else if (step && !json_is_boolean(done)) bad = "\"done\": expected true or false";
    else if (metrics && !json_is_null(metrics) && !json_is_object(metrics)) bad = "\"metrics\": expected an object of numbers";
    const char *key;
    const json_t *v;
    if (!bad && json_is_object(metrics)) json_object_foreach((json_t *)metrics, key, v)
        if (!bad && !json_is_number(v)) bad = "\"metrics\": expected an object of numbers";
    if (bad)
        return trill_error(TRILL_ERR_INVALID, "environment %s, episode %llu, %s: reply's %s", e->name, (unsigned long long)episode, call, bad);
    out->messages = messages && !json_is_null(messages) ? json_incref((json_t *)messages) : NULL;
    out->reward = step ? json_number_value(reward) : 0;
    out->done = step && json_is_true(done);
    out->metrics = json_is_object(metrics) ? json_incref((json_t *)metrics) : NULL;
    const json_t *tools = json_object_get(reply, "tools");
    out->tools = !step && tools && !json_is_null(tools) ? json_incref((json_t *)tools) : NULL;
    return TRILL_OK;
}

static trill_status process_reset(rl_env *e, uint64_t episode, const json_t *task, uint64_t seed, rl_env_reply *out) {
    json_t *reply, *req = json_pack("{s:s, s:I, s:O, s:I}", "op", "reset", "episode", (json_int_t)episode, "task", task, "seed",
                                    (json_int_t)(seed & INT64_MAX) /* 63 bits: a JSON integer any reader takes */);
    if (!req) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_rl_env_process_call(e->proc, episode, req, &reply);
    if (!st && !reply) st = trill_error(TRILL_ERR_INVALID, "environment process: episode %llu could not be reset", (unsigned long long)episode);
    if (!st) st = from_process(e, episode, "reset", reply, out);
    json_decref(reply);
    return st;
}

static trill_status process_step(rl_env *e, int i, const char *turn, const json_t *tool_calls, rl_env_reply *out) {
    const uint64_t episode = e->live[i].id;
    if (!same_process(e, i)) { /* its process failed since (another episode's request) */
        out->lost = true;
        return e->mark_failures ? TRILL_OK
                                : trill_error(TRILL_ERR_INVALID, "environment process: episode %llu was lost when the process failed "
                                              "on another request and was restarted (env.mark_failures: true marks such episodes)",
                                              (unsigned long long)episode);
    }
    json_t *reply, *req = tool_calls ? json_pack("{s:s, s:I, s:s, s:O}", "op", "step", "episode", (json_int_t)episode, "turn", turn, "tool_calls",
                                                 tool_calls)
                                     : json_pack("{s:s, s:I, s:s, s:[]}", "op", "step", "episode", (json_int_t)episode, "turn", turn, "tool_calls");
    if (!req) return trill_error(TRILL_ERR_NOMEM, "out of memory (or a turn that is not UTF-8)");
    trill_status st = trill_rl_env_process_call(e->proc, episode, req, &reply);
    if (!st && !reply) out->lost = true;
    if (!st && reply) st = from_process(e, episode, "step", reply, out);
    json_decref(reply);
    return st;
}

trill_status trill_rl_env_reset(rl_env *e, uint64_t episode, const json_t *task, uint64_t seed, rl_env_reply *out) {
    memset(out, 0, sizeof *out);
    if (find_live(e, episode) >= 0)
        return trill_error(TRILL_ERR_INVALID, "environment %s: episode %llu reset twice", e->name, (unsigned long long)episode);
    if (e->n_live == e->cap_live) {
        const int cap = e->cap_live ? 2 * e->cap_live : 64;
        live_episode *l = trill_realloc(e->live, sizeof *l * (size_t)cap);
        if (!l) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        e->live = l;
        e->cap_live = cap;
    }
    void *state = e->builtin ? trill_calloc(1, e->builtin->state_size ? e->builtin->state_size : 1) : NULL;
    if (e->builtin && !state) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = e->builtin ? e->builtin->reset(state, task, seed, out) : process_reset(e, episode, task, seed, out);
    if (!st) st = check_reply(e, episode, "reset", out);
    if (!st && out->done)
        st = trill_error(TRILL_ERR_INVALID, "environment %s, episode %llu: done at reset", e->name, (unsigned long long)episode);
    if (st) {
        free(state);
        trill_rl_env_reply_clear(out);
        return st;
    }
    e->live[e->n_live++] = (live_episode){ episode, state, e->proc ? trill_rl_env_process_generation(e->proc) : 0 };
    return TRILL_OK;
}

trill_status trill_rl_env_step(rl_env *e, uint64_t episode, const char *turn, const json_t *tool_calls, rl_env_reply *out) {
    memset(out, 0, sizeof *out);
    const int i = find_live(e, episode);
    if (i < 0) return trill_error(TRILL_ERR_INVALID, "environment %s: episode %llu was not reset", e->name, (unsigned long long)episode);
    trill_status st = e->builtin ? e->builtin->step(e->live[i].state, turn, out) : process_step(e, i, turn, tool_calls, out);
    if (!st) st = check_reply(e, episode, "step", out);
    if (st) trill_rl_env_reply_clear(out);
    return st;
}
