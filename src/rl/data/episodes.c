/* Multi-turn rollouts (episodes.h). */
#include "rl/data/episodes.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/strbuf.h"
#include "text/chat_json.h"
#include "trill/rng.h"
#include "trill/timing.h"

/* One episode while it is played: the sequence so far (the last turn's output, whose tokens are
 * every token of the trajectory) and what the output does not keep: every token's behaviour
 * log-prob and version, and the segments. */
typedef struct episode {
    uint64_t id;                 /* the environment's: request id x group size + sample */
    trill_sequence_out out;
    bool has_out, over;
    float *logp;                 /* [len] NAN where injected */
    uint32_t *ver;               /* [len] 0 where injected */
    int len, cap;
    rl_segment *segs;
    int n_segs, cap_segs;
    rl_episode info;
    json_t *metrics;             /* the environment's, summed over the turns (NULL: none yet) */
} episode;

static void episode_free(episode *ep) {
    trill_sequence_out_free(&ep->out);
    free(ep->logp);
    free(ep->ver);
    free(ep->segs);
    json_decref(ep->metrics);
}

/* A reply's metrics added to the episode's (numbers, summed by name). */
static trill_status add_metrics(episode *ep, const json_t *m) {
    const char *key;
    json_t *v;
    if (!m) return TRILL_OK;
    if (!ep->metrics && !(ep->metrics = json_object())) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_object_foreach((json_t *)m, key, v) {
        const json_t *sum = json_object_get(ep->metrics, key);
        if (json_is_number(v) && json_object_set_new(ep->metrics, key, json_real((sum ? json_number_value(sum) : 0) + json_number_value(v))))
            return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    return TRILL_OK;
}

/* Appends n tokens' log-probs and versions (NULL: injected) and their segment. */
static trill_status append_segment(episode *ep, int kind, const float *logp, const uint32_t *ver, int n) {
    if (ep->len + n > ep->cap) {
        const int cap = ep->len + n > 2 * ep->cap ? ep->len + n : 2 * ep->cap;
        float *lp = trill_realloc(ep->logp, sizeof(float) * (size_t)cap);
        if (lp) ep->logp = lp;
        uint32_t *v = lp ? trill_realloc(ep->ver, sizeof(uint32_t) * (size_t)cap) : NULL;
        if (!v) return trill_error(TRILL_ERR_NOMEM, "out of memory for an episode of %d tokens", cap);
        ep->ver = v;
        ep->cap = cap;
    }
    if (ep->n_segs == ep->cap_segs) {
        const int cap = ep->cap_segs ? 2 * ep->cap_segs : 8;
        rl_segment *s = trill_realloc(ep->segs, sizeof(rl_segment) * (size_t)cap);
        if (!s) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        ep->segs = s;
        ep->cap_segs = cap;
    }
    for (int i = 0; i < n; i++) {
        ep->logp[ep->len + i] = logp ? logp[i] : NAN;
        ep->ver[ep->len + i] = ver ? ver[i] : 0;
    }
    ep->len += n;
    ep->segs[ep->n_segs++] = (rl_segment){ .len = n, .kind = kind };
    return TRILL_OK;
}

/* The text of an observation: plain, its messages' contents concatenated; with a chat template,
 * the first one rendered as a conversation with the tools and the generation prompt, a later one
 * as what the template writes after a turn (after_turn: the previous turn, which did not end with
 * the template's end-of-turn token when cut, gets it first). */
static trill_status observation_text(const rl_episodes_job *j, const json_t *messages, const json_t *tools, bool first, bool cut,
                                     char **out) {
    if (j->chat) {
        if (!first) {
            char *after = NULL;
            trill_status st = trill_chat_render_after_turn_json(j->chat, messages, true, j->enable_thinking, &after);
            if (st || !cut) {
                *out = after;
                return st;
            }
            const int n = asprintf(out, "%s%s", trill_chat_turn_end(j->chat), after);
            free(after);
            return n < 0 ? trill_error(TRILL_ERR_NOMEM, "out of memory") : TRILL_OK;
        }
        json_t *conv = json_pack("{s:O, s:b}", "messages", messages, "add_generation_prompt", 1);
        if (conv && tools) json_object_set(conv, "tools", (json_t *)tools);
        if (conv && j->enable_thinking >= 0) json_object_set_new(conv, "enable_thinking", json_boolean(j->enable_thinking));
        trill_status st = conv ? trill_chat_render_json(j->chat, conv, out) : trill_error(TRILL_ERR_NOMEM, "out of memory");
        json_decref(conv);
        return st;
    }
    trill_strbuf text = { 0 };
    size_t i;
    const json_t *m;
    trill_strbuf_puts(&text, "");
    json_array_foreach(messages, i, m) trill_strbuf_puts(&text, json_string_value(json_object_get(m, "content")));
    if (text.oom) {
        free(text.s);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    *out = text.s;
    return TRILL_OK;
}

/* *cut: the last turn did not end with the chat template's end-of-turn token (cut at
 * max_new_tokens, or ended by another stop): what follows it then closes the turn first. */
static trill_status cut_turn(const rl_episodes_job *j, const episode *ep, bool *cut) {
    *cut = false;
    if (!j->chat) return TRILL_OK;
    char *text = NULL;
    size_t len;
    trill_status st = trill_tokenizer_decode_lenient(j->tok, &ep->out.tokens[ep->len - 1], 1, &text, &len);
    if (!st) *cut = strcmp(text, trill_chat_turn_end(j->chat)) != 0;
    free(text);
    return st;
}

/* An observation's tokens (observation_text, tokenised once: special tokens in it matched). */
static trill_status render(const rl_episodes_job *j, const episode *ep, const json_t *messages, const json_t *tools, bool first, bool cut,
                           int **ids, int *n) {
    char *text = NULL;
    size_t count = 0;
    *ids = NULL;
    trill_status st = observation_text(j, messages, tools, first, cut, &text);
    if (st) trill_error_context("environment: episode %llu's observation", (unsigned long long)ep->id);
    if (!st) st = trill_tokenizer_encode(j->tok, text, strlen(text), false, ids, &count);
    free(text);
    if (!st && (count == 0 || count > INT_MAX))
        st = trill_error(TRILL_ERR_INVALID, "environment: episode %llu's observation renders to %zu tokens (expected 1 to %d)",
                         (unsigned long long)ep->id, count, INT_MAX);
    if (st) {
        free(*ids);
        *ids = NULL;
    }
    *n = (int)count;
    return st;
}

/* Resets the group of prompt p, checks that its episodes see one first observation and submits it
 * (n samples, held between turns). */
static trill_status start_group(const rl_episodes_job *j, int p, episode *eps) {
    const int G = j->group_size;
    const trill_example *ex = &j->data->examples[j->examples[p]];
    json_t *task = json_pack("{s:s, s:s}", "prompt", ex->prompt ? ex->prompt : "", "answer", ex->answer ? ex->answer : "");
    if (!task) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const uint64_t seed = trill_rng_key(j->seed ^ 0x656e76ull /* "env" */, j->request_ids[p]);
    int *first = NULL, n_first = 0;
    trill_status st = TRILL_OK;
    for (int i = 0; i < G && !st; i++) {
        episode *ep = &eps[p * G + i];
        ep->id = j->request_ids[p] * (uint64_t)G + (uint64_t)i;
        rl_env_reply r;
        const double t0 = trill_now();
        st = trill_rl_env_reset(j->env, ep->id, task, seed, &r);
        ep->info.env_s += trill_now() - t0;
        int *ids = NULL, n = 0;
        if (!st) st = render(j, ep, r.messages, r.tools, true, false, &ids, &n);
        trill_rl_env_reply_clear(&r);
        if (!st && i == 0) first = ids, n_first = n, ids = NULL;
        else if (!st && (n != n_first || memcmp(ids, first, sizeof(int) * (size_t)n)))
            st = trill_error(TRILL_ERR_INVALID, "environment: the samples of task %d (data line %d) see different first observations "
                             "(samples 0 and %d): reset must depend on the task and seed only", p, j->examples[p] + 1, i);
        free(ids);
        if (!st) st = append_segment(ep, RL_SEG_INJECTED, NULL, NULL, n_first);
    }
    json_decref(task);
    const int room = j->max_tokens - n_first;
    if (!st && room < 1)
        st = trill_error(TRILL_ERR_INVALID, "environment: the first observation of data line %d is %d tokens, which leaves no room for a "
                         "turn in env.max_tokens %d", j->examples[p] + 1, n_first, j->max_tokens);
    if (!st) {
        trill_request r = *j->proto;
        r.id = j->request_ids[p];
        r.prompt = first;
        r.prompt_len = n_first;
        r.n = G;
        r.hold = true;
        r.max_new_tokens = room < r.max_new_tokens ? room : r.max_new_tokens;
        st = trill_engine_submit(j->engine, &r);
    }
    free(first);
    return st;
}

static bool is_stop_id(const trill_request *r, int id) {
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == id) return true;
    return false;
}

/* The text of tokens [from, ep->len) of the sequence, a final stop token left out. */
static trill_status text_of(const rl_episodes_job *j, const episode *ep, int from, char **text) {
    int n = ep->len - from;
    if (n > 0 && ep->out.finish == TRILL_FINISH_STOP_ID && is_stop_id(j->proto, ep->out.tokens[ep->len - 1])) n--;
    size_t len;
    return trill_tokenizer_decode_lenient(j->tok, ep->out.tokens + from, n, text, &len);
}

static trill_status end_episode(const rl_episodes_job *j, episode *ep, int stop) {
    ep->info.stop = stop;
    ep->over = true;
    trill_engine_release(j->engine, ep->out.request, ep->out.sample);
    return trill_rl_env_end(j->env, ep->id); /* a lost episode's process is not asked: its state is dropped here only */
}

/* The environment's answer to a turn: the episode ends (done, a limit) or goes on with the
 * observation injected. */
static trill_status answer(const rl_episodes_job *j, episode *ep, const rl_env_reply *r) {
    if (r->lost) return end_episode(j, ep, RL_STOP_ENV_ERROR);
    ep->info.env_return += r->reward;
    trill_status mst = add_metrics(ep, r->metrics);
    if (mst) return mst;
    if (r->done) return end_episode(j, ep, RL_STOP_DONE);
    if (ep->info.turns >= j->max_turns) return end_episode(j, ep, RL_STOP_MAX_TURNS);
    int *ids = NULL, n = 0;
    bool cut;
    trill_status st = cut_turn(j, ep, &cut);
    if (!st) st = render(j, ep, r->messages, NULL, false, cut, &ids, &n);
    const int room = j->max_tokens - ep->len - n;
    if (!st && room < 1) st = end_episode(j, ep, RL_STOP_CONTEXT);
    if (!st && room >= 1) {
        st = trill_engine_continue(j->engine, &ep->out, ids, n, room < j->proto->max_new_tokens ? room : j->proto->max_new_tokens);
        if (!st) ep->has_out = false; /* the engine took the sequence back */
        if (!st) st = append_segment(ep, RL_SEG_INJECTED, NULL, NULL, n);
    }
    free(ids);
    return st;
}

/* A turn the engine finished: its sampled segment, then the environment's step. */
static trill_status take_turn(const rl_episodes_job *j, episode *ep, trill_sequence_out *o) {
    if (o->finish == TRILL_FINISH_ABORTED || o->n_prompt != ep->len || o->n_generated < 1) {
        trill_status st = trill_error(TRILL_ERR_INVALID, "episode %llu: the engine returned a turn of %d tokens after %d (expected %d, "
                                      "finished)", (unsigned long long)ep->id, o->n_generated, o->n_prompt, ep->len);
        trill_sequence_out_free(o);
        return st;
    }
    ep->out = *o;
    ep->has_out = true;
    const int from = ep->len;
    trill_status st = append_segment(ep, RL_SEG_SAMPLED, o->logprobs, o->versions, o->n_generated);
    ep->info.turns++;
    ep->info.cut_turns += o->finish == TRILL_FINISH_LENGTH;
    char *turn = NULL;
    if (!st) st = text_of(j, ep, from, &turn);
    json_t *calls = NULL; /* with a chat template: the turn's tool calls in its format */
    int errors = 0;
    if (!st && j->chat) st = trill_chat_parse_tool_calls_json(j->chat, turn, &calls, &errors);
    if (calls) {
        ep->info.tool_calls += (int32_t)json_array_size(calls) - errors;
        ep->info.parse_errors += errors;
    }
    rl_env_reply r = { 0 };
    const double t0 = trill_now();
    if (!st) st = trill_rl_env_step(j->env, ep->id, turn, calls, &r);
    json_decref(calls);
    ep->info.env_s += trill_now() - t0;
    free(turn);
    if (!st) st = answer(j, ep, &r);
    trill_rl_env_reply_clear(&r);
    return st;
}

/* Every finished turn the engine has, handed to its episode. */
static trill_status take_finished(const rl_episodes_job *j, episode *eps) {
    trill_sequence_out got[32];
    int k;
    trill_status st = TRILL_OK;
    while ((k = trill_engine_collect(j->engine, got, 32)) > 0)
        for (int i = 0; i < k; i++) {
            int p = 0;
            while (p < j->n_prompts && j->request_ids[p] != got[i].request) p++;
            episode *ep = p < j->n_prompts && got[i].sample >= 0 && got[i].sample < j->group_size ? &eps[p * j->group_size + got[i].sample] : NULL;
            if (!st && (!ep || ep->over || ep->has_out))
                st = trill_error(TRILL_ERR_INVALID, "episodes: the engine returned request %llu sample %d, which no episode waits for",
                                 (unsigned long long)got[i].request, got[i].sample);
            if (!st) st = take_turn(j, ep, &got[i]);
            else trill_sequence_out_free(&got[i]);
        }
    return st;
}

/* Episode s's trajectory into b at token `at` (b's arrays sized by the caller). */
static trill_status pack_episode(const rl_episodes_job *j, const episode *ep, int s, size_t at, rl_batch *b) {
    const size_t row = (size_t)b->n_moe_layers * b->top_k, len = (size_t)ep->len;
    b->offsets[s] = (int)at;
    b->prompt_len[s] = ep->segs[0].len;
    b->example[s] = j->examples[s / j->group_size];
    b->keep[s] = true;
    b->episodes[s] = ep->info;
    memcpy(b->tokens + at, ep->out.tokens, sizeof(int) * len);
    memcpy(b->behav_logp + at, ep->logp, sizeof(float) * len);
    memcpy(b->version + at, ep->ver, sizeof(uint32_t) * len);
    for (size_t i = 0; row && i < row * len; i++)
        b->experts[at * row + i] = ep->out.experts && i < row * (len - 1) ? ep->out.experts[i] : TRILL_REPLAY_NONE;
    memcpy(b->segs + b->seg_offsets[s], ep->segs, sizeof(rl_segment) * (size_t)ep->n_segs);
    b->seg_offsets[s + 1] = b->seg_offsets[s] + ep->n_segs;
    if (!(b->env_metrics[s] = ep->metrics ? json_dumps(ep->metrics, JSON_COMPACT) : trill_strdup("{}")))
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    int last = 0; /* where the last turn starts: the episode's completion is its text */
    for (int k = 0, t = 0; k < ep->n_segs; t += ep->segs[k++].len)
        if (ep->segs[k].kind == RL_SEG_SAMPLED) last = t;
    return text_of(j, ep, last, &b->completion[s]);
}

static trill_status pack_batch(const rl_episodes_job *j, const episode *eps, rl_batch *b) {
    const int n = j->n_prompts * j->group_size;
    size_t T = 0, S = 0;
    for (int s = 0; s < n; s++) T += (size_t)eps[s].len, S += (size_t)eps[s].n_segs;
    *b = (rl_batch){ .n_seqs = n, .group_size = j->group_size, .n_moe_layers = j->n_moe_layers, .top_k = j->top_k };
    trill_status st = trill_rl_batch_alloc(b, T);
    if (st) return st;
    b->seg_offsets = trill_malloc(sizeof(int) * (size_t)(n + 1));
    b->segs = trill_malloc(sizeof(rl_segment) * (S + 1));
    b->episodes = trill_calloc((size_t)n + 1, sizeof(rl_episode));
    b->env_metrics = trill_calloc((size_t)n + 1, sizeof(char *));
    if (!b->seg_offsets || !b->segs || !b->episodes || !b->env_metrics) return trill_error(TRILL_ERR_NOMEM, "out of memory for a batch of %d episodes", n);
    b->seg_offsets[0] = 0;
    size_t at = 0;
    for (int s = 0; s < n && !st; s++) {
        st = pack_episode(j, &eps[s], s, at, b);
        at += (size_t)eps[s].len;
    }
    b->offsets[n] = (int)at;
    return st ? st : trill_rl_batch_derive(b);
}

/* After an error: every request stopped (held samples freed), every episode ended. */
static void abandon(const rl_episodes_job *j, episode *eps) {
    for (int p = 0; p < j->n_prompts; p++) trill_engine_abort(j->engine, j->request_ids[p]);
    trill_sequence_out tmp[16];
    int k;
    while ((k = trill_engine_collect(j->engine, tmp, 16)) > 0)
        for (int i = 0; i < k; i++) trill_sequence_out_free(&tmp[i]);
    for (int s = 0; s < j->n_prompts * j->group_size; s++)
        if (!eps[s].over) (void)trill_rl_env_end(j->env, eps[s].id); /* best effort: the error is the first one */
}

trill_status trill_rl_generate_episodes(const rl_episodes_job *j, rl_batch *out) {
    memset(out, 0, sizeof *out);
    const int n = j->n_prompts * j->group_size;
    episode *eps = trill_calloc((size_t)n + 1, sizeof *eps);
    if (!eps) return trill_error(TRILL_ERR_NOMEM, "out of memory for %d episodes", n);
    trill_status st = TRILL_OK;
    for (int p = 0; p < j->n_prompts && !st; p++) st = start_group(j, p, eps);
    for (bool busy = true; !st;) { /* an expert-parallel group steps together until every rank is done */
        st = trill_engine_group_busy(j->engine, &busy);
        if (st || !busy) break;
        if (j->between_steps) st = j->between_steps(j->ctx);
        trill_step_stats stats = { 0 };
        if (!st) st = trill_engine_step(j->engine, &stats);
        if (!st && j->prefill_rows) *j->prefill_rows += stats.prefill_rows;
        if (!st) st = take_finished(j, eps);
    }
    for (int s = 0; s < n && !st; s++)
        if (!eps[s].over) st = trill_error(TRILL_ERR_INVALID, "episodes: episode %llu never ended", (unsigned long long)eps[s].id);
    if (!st) st = pack_batch(j, eps, out);
    if (st) {
        abandon(j, eps);
        trill_rl_batch_free(out);
    }
    for (int s = 0; s < n; s++) episode_free(&eps[s]);
    free(eps);
    return st;
}
