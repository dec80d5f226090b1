/* Built-in environments (env.h), for the tests and the demo.
 *
 * guess: higher or lower. The secret is the task's "answer" when it is an integer, else the seed's
 * draw in [0, 100). The first observation is the task's "prompt" (else "guess 0-99\n"); each turn
 * is read for its first integer: the secret ends the episode with reward 1, any other number is
 * answered "higher\n" or "lower\n", a turn without a number "number?\n" (reward 0). Metric
 * "solved": 1 on the turn that finds it. */
#include "rl/env/env.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct guess_state {
    long secret;
} guess_state;

static trill_status say(rl_env_reply *r, const char *content) {
    return trill_rl_env_say(r, "user", content) ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

/* The task's "answer" as an integer (a string of digits or a JSON integer). */
static bool task_integer(const json_t *task, long *out) {
    const json_t *a = json_object_get(task, "answer");
    if (json_is_integer(a)) {
        *out = (long)json_integer_value(a);
        return true;
    }
    if (!json_is_string(a)) return false;
    const char *s = json_string_value(a);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno) return false;
    *out = v;
    return true;
}

static trill_status guess_reset(void *state, const json_t *task, uint64_t seed, rl_env_reply *out) {
    guess_state *g = state;
    if (!task_integer(task, &g->secret)) g->secret = (long)(seed % 100);
    const json_t *prompt = json_object_get(task, "prompt");
    return say(out, json_is_string(prompt) ? json_string_value(prompt) : "guess 0-99\n");
}

/* The first integer of text (an optional '-' and digits). */
static bool first_integer(const char *text, long *out) {
    for (const char *p = text; *p; p++) {
        const bool minus = *p == '-' && isdigit((unsigned char)p[1]);
        if (!minus && !isdigit((unsigned char)*p)) continue;
        errno = 0;
        *out = strtol(p, NULL, 10);
        return errno == 0;
    }
    return false;
}

static trill_status guess_step(void *state, const char *turn, rl_env_reply *out) {
    const guess_state *g = state;
    long v;
    if (!first_integer(turn, &v)) return say(out, "number?\n");
    if (v != g->secret) return say(out, v < g->secret ? "higher\n" : "lower\n");
    out->reward = 1;
    out->done = true;
    out->metrics = json_pack("{s:f}", "solved", 1.0);
    return out->metrics ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

static const rl_env_builtin BUILTINS[] = {
    { "guess", sizeof(guess_state), guess_reset, guess_step },
};

const rl_env_builtin *trill_rl_env_builtin(const char *name) {
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (strcmp(BUILTINS[i].name, name) == 0) return &BUILTINS[i];
    return NULL;
}
