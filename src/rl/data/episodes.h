/* Multi-turn rollouts: each sample an episode with an environment (rl/env/env.h), its turns kept
 * in the engine between them (trill_request.hold, trill_engine_continue: no earlier token is
 * prefilled again), its trajectory recorded token in, token out: the tokens the model sampled as
 * sampled segments (log-probs, versions, routed experts), each observation rendered once and
 * appended as an injected segment, nothing re-tokenised. The n samples of a task are episodes
 * reset alike; their first observation is prefilled once and the samples fork after it.
 *
 * Rendering (env.render): plain, an observation's messages' contents, concatenated (the
 * environment writes the separators it wants); chat, the first observation as a conversation with
 * the environment's tools and the generation prompt, each later one as what the model's chat
 * template writes after an assistant turn (trill_chat_render_after_turn: rendered after a stand-in
 * turn, never re-rendering the real ones); then tokenised once. With chat, the tool calls in each
 * turn are parsed (trill_chat_parse_tool_calls) and handed to the environment, malformed ones
 * counted. */
#ifndef TRILL_RL_EPISODES_H
#define TRILL_RL_EPISODES_H

#include "rl/data/rollout.h"
#include "rl/env/env.h"
#include "trill/chat.h"

typedef struct rl_episodes_job {
    trill_engine *engine;
    const trill_tokenizer *tok;
    const trill_dataset *data;
    const int *examples;             /* [n_prompts] dataset indices: the tasks */
    int n_prompts, group_size;
    const uint64_t *request_ids;     /* [n_prompts] positions in the prompt stream: sampling keys, episode ids */
    const trill_request *proto;      /* sampling, stops; max_new_tokens per turn */
    int n_moe_layers, top_k;
    rl_env *env;
    const trill_chat_template *chat; /* NULL: observations are their messages' contents, tokenised; else rendered by it */
    int enable_thinking;             /* the template's (Qwen3): -1 its default, 0 false, 1 true */
    uint64_t seed;                   /* the run's: episode seeds are keyed by it and the request id */
    int max_turns, max_tokens;       /* max_tokens > 0: a trajectory's tokens, prompt included */
    trill_status (*between_steps)(void *); /* optional, before every engine step (async weight updates) */
    void *ctx;
    long *prefill_rows;              /* optional: += the token rows the engine prefilled (prompts, observations) */
} rl_episodes_job;

/* Plays every episode to its end and packs the trajectories into *out (segments, the loss mask,
 * rl_batch.episodes; reward 0: the scorer adds the returns). An episode's completion is its last
 * turn's text (what a verifier or a reward process judges: the final answer). On an error every
 * request is aborted and the engine left empty. */
trill_status trill_rl_generate_episodes(const rl_episodes_job *j, rl_batch *out);

#endif
