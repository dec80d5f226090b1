/* Environments of multi-turn episodes: what the model talks to between its turns (a game, a tool
 * runner, a task checker). The semantics are the tinker-cookbook's Env: `reset` gives an
 * episode's first observation, `step` takes the model's turn and gives the next observation,
 * the turn's reward, whether the episode is done and metrics. An observation is a list of
 * messages ({"role", "content"} objects, as a chat API's), rendered into tokens by the rollout
 * loop (data/episodes.c), never by the environment.
 *
 * One rl_env serves every episode of a run: each call names its episode (an id unique in the
 * run), so a built-in environment keeps a state per episode and an external one can serve many
 * from one process. The samples of a group are episodes reset with the same task and seed; their
 * first observations must be the same (the group forks after it). */
#ifndef TRILL_RL_ENV_H
#define TRILL_RL_ENV_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "trill/error.h"
#include "trill/run_config.h"

/* What reset and step give back. Owned by the caller: trill_rl_env_reply_clear. */
typedef struct rl_env_reply {
    json_t *messages;   /* the observation: an array of {"role": string, "content": string} */
    double reward;      /* step: this turn's reward (finite); reset: 0 */
    bool done;          /* step: the episode is over (no observation needed) */
    json_t *metrics;    /* an object of numbers (summed over the turns, averaged over episodes), or NULL */
    json_t *tools;      /* reset: the tool definitions the first observation comes with (an array), or NULL */
    bool lost;          /* step: the environment failed and the episode is over (env.mark_failures); the rest is empty */
} rl_env_reply;

void trill_rl_env_reply_clear(rl_env_reply *r);

typedef struct rl_env rl_env;

/* The environment of c's env section (env.kind: a built-in one, or env.command's process);
 * TRILL_ERR_INVALID for env.kind none. c must outlive it. */
trill_status trill_rl_env_open(const trill_run_config *c, rl_env **out);
void trill_rl_env_free(rl_env *e);

/* Starts episode `episode` on task (a JSON object: the dataset line) with seed. */
trill_status trill_rl_env_reset(rl_env *e, uint64_t episode, const json_t *task, uint64_t seed, rl_env_reply *out);
/* The model's turn (its text, the end-of-turn token left out) in episode `episode`, and the tool
 * calls parsed from it (a JSON array, trill_chat_parse_tool_calls' entries; NULL: none). */
trill_status trill_rl_env_step(rl_env *e, uint64_t episode, const char *turn, const json_t *tool_calls, rl_env_reply *out);
/* The episode is over (done, or cut by a limit): its state is dropped (a process is told; its
 * failure to answer is an error as a step's). */
trill_status trill_rl_env_end(rl_env *e, uint64_t episode);
/* Episodes reset and not yet ended (every one ends, lost ones too: a batch leaves none). */
int trill_rl_env_live(const rl_env *e);

/* ---- built-in environments (env/builtin.c) ----
 * Each keeps one state per live episode in a table the dispatcher owns (state_size bytes, zeroed
 * at reset). */
typedef struct rl_env_builtin {
    const char *name;
    size_t state_size;
    trill_status (*reset)(void *state, const json_t *task, uint64_t seed, rl_env_reply *out);
    trill_status (*step)(void *state, const char *turn, rl_env_reply *out);
} rl_env_builtin;

/* The built-in environment named name, or NULL. */
const rl_env_builtin *trill_rl_env_builtin(const char *name);
/* An environment of b's kind (b must outlive it; tests bring their own). */
trill_status trill_rl_env_open_builtin(const rl_env_builtin *b, rl_env **out);

/* ---- the environment process (env/process.c) ----
 * env.command started as a supervised child (rl/proc/process.h) speaking JSON lines, one reply
 * line per request line: {"op": "reset", "episode", "task", "seed"} -> {"messages"};
 * (and "tools"?); {"op": "step", "episode", "turn", "tool_calls"} -> {"messages", "reward", "done", "metrics"?};
 * {"op": "end", "episode"} -> any JSON (examples/envs/README.md). */
typedef struct env_process env_process;
trill_status trill_rl_env_process_start(const trill_run_config *c, env_process **out);
void trill_rl_env_process_free(env_process *p);
/* The process's lifetime: it grows at each failure, and an episode reset in an earlier one is lost. */
uint64_t trill_rl_env_process_generation(const env_process *p);
/* One request (stolen) of episode `episode` and its reply object. A failed exchange kills the
 * process (the next call starts another); a reset is retried on the fresh one. After
 * env.max_failures failures in a row, or at the first with mark_failures off, an error naming the
 * command, the episode, the request and why (with the process's last stderr line); with
 * mark_failures on, TRILL_OK and *reply NULL (the episode is lost). */
trill_status trill_rl_env_process_call(env_process *p, uint64_t episode, json_t *request, json_t **reply);

/* A reply's observation of one message {"role": role, "content": content}; false when out of memory. */
bool trill_rl_env_say(rl_env_reply *r, const char *role, const char *content);

#endif
