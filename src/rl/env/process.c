/* The environment process (env.h): env.command as a supervised JSON-lines child. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "rl/env/env.h"
#include "rl/proc/process.h"

struct env_process {
    const trill_run_config *c;
    rl_process *proc;
    uint64_t generation;   /* the process's lifetimes so far: one ends at each failure (its episodes are lost) */
    int failures;          /* failed requests in a row */
};

trill_status trill_rl_env_process_start(const trill_run_config *c, env_process **out) {
    env_process *p = trill_calloc(1, sizeof *p);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    p->c = c;
    p->generation = 1;
    trill_status st = trill_rl_process_start("environment process", c->env.command, c->env.timeout_s, &p->proc);
    if (st) {
        free(p);
        return st;
    }
    *out = p;
    return TRILL_OK;
}

void trill_rl_env_process_free(env_process *p) {
    if (!p) return;
    trill_rl_process_free(p->proc);
    free(p);
}

uint64_t trill_rl_env_process_generation(const env_process *p) { return p->generation; }

/* One exchange: the reply object, or false with why (the child then stopped). */
static bool exchange(env_process *p, const char *line, size_t len, json_t **reply, char *why, size_t cap) {
    if (!trill_rl_process_running(p->proc)) {
        trill_status st = trill_rl_process_spawn(p->proc);
        if (st) {
            snprintf(why, cap, "%s", trill_error_message());
            return false;
        }
    }
    const char *got;
    size_t n;
    if (!trill_rl_process_exchange(p->proc, line, len, &got, &n, why, cap)) {
        p->generation++; /* the episodes it held are lost */
        return false;
    }
    json_error_t jerr;
    *reply = json_loadb(got, n, JSON_REJECT_DUPLICATES, &jerr);
    char shown[96];
    trill_rl_process_excerpt(got, n, shown);
    trill_rl_process_consume(p->proc, n);
    if (!json_is_object(*reply)) {
        if (*reply) snprintf(why, cap, "reply is not a JSON object: \"%s\"", shown);
        else snprintf(why, cap, "reply is not JSON (%s): \"%s\"", jerr.text, shown);
        json_decref(*reply);
        *reply = NULL;
        trill_rl_process_kill(p->proc); /* it may be answering another request: never read on */
        p->generation++;
        return false;
    }
    return true;
}

trill_status trill_rl_env_process_call(env_process *p, uint64_t episode, json_t *request, json_t **reply) {
    *reply = NULL;
    char op[16];
    snprintf(op, sizeof op, "%s", json_is_string(json_object_get(request, "op")) ? json_string_value(json_object_get(request, "op")) : "?");
    const bool retry = strcmp(op, "reset") == 0; /* nothing to lose yet: a fresh process may answer */
    char *text = json_dumps(request, JSON_COMPACT);
    json_decref(request);
    const size_t len = text ? strlen(text) : 0;
    char *line = text ? trill_realloc(text, len + 2) : NULL;
    if (!line) {
        free(text);
        return trill_error(TRILL_ERR_NOMEM, "environment process: out of memory for a request");
    }
    memcpy(line + len, "\n", 2);
    char why[640] = "";
    bool ok = false;
    do ok = exchange(p, line, len + 1, reply, why, sizeof why);
    while (!ok && ++p->failures < p->c->env.max_failures && retry);
    free(line);
    if (ok) {
        p->failures = 0;
        return TRILL_OK;
    }
    if (p->failures < p->c->env.max_failures && p->c->env.mark_failures) return TRILL_OK; /* the episode is lost */
    const char *err = trill_rl_process_stderr(p->proc);
    const int failures = p->failures;
    p->failures = 0;
    return trill_error(TRILL_ERR_INVALID, "environment process \"%s\": episode %llu, request %s: %s (%d failure%s in a row)%s%s%s",
                       trill_rl_process_command(p->proc), (unsigned long long)episode, op, why, failures,
                       failures == 1 ? "" : "s", err[0] ? "; last stderr line: \"" : "", err, err[0] ? "\"" : "");
}
