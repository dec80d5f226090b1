/* Multi-turn episodes (src/rl/data/episodes.c, src/rl/env): a scripted environment over a small
 * MoE. The trajectory is token in, token out (the injected segments are the observations'
 * tokens, the sampled ones what the env read, their log-probs the model's), the loss mask is
 * exactly the sampled tokens, the turns after the first prefill only what is new, the trainer's
 * gradient is that of the one sequence with the injected tokens masked, an episode may span a
 * weight update (async mode's partial rollouts) with per-token versions, and the limits and the
 * environment's failures end or refuse episodes cleanly. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "base/alloc.h"
#include "rl/data/episodes.h"
#include "rl/exec/trainer.h"
#include "text/chat_json.h"
#include "testutil.h"
#include "trill/chat.h"
#include "trill/infer.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/rl_metrics.h"
#include "trill/run_config.h"
#include "trill/tokenizer.h"
#include "trill/train.h"

/* ---- the scripted environment ----
 * reset: "Q:" + the task's prompt. Turn k (1-based) is recorded; the observation after it is
 * "<k>|\n" (the mode "long": 40 characters more); turn `script_turns` ends the episode with
 * reward 1 for even episode ids, 0 for odd ones. Modes make it fail. */
enum { MAX_EPISODES = 64, MAX_TURNS = 8 };
static int script_turns = 3;
static const char *script_mode = "";
static char seen[MAX_TURNS][MAX_EPISODES][64]; /* [turn - 1][i]: the texts the turns read, in the order of the calls */
static int n_seen[MAX_TURNS];

typedef struct script_state {
    uint64_t id;
    int turn;
} script_state;

static const char SCRIPT_TOOLS[] = "[{\"type\": \"function\", \"function\": {\"name\": \"calc\", \"parameters\": {}}}]";

static trill_status script_reset(void *state, const json_t *task, uint64_t seed, rl_env_reply *out) {
    (void)seed;
    if (strcmp(script_mode, "tools") == 0) out->tools = json_loads(SCRIPT_TOOLS, 0, NULL);
    script_state *s = state;
    s->turn = 0;
    char text[128];
    snprintf(text, sizeof text, "Q:%s", json_string_value(json_object_get(task, "prompt")));
    if (strcmp(script_mode, "differ") == 0) snprintf(text, sizeof text, "Q%p:", (void *)s); /* depends on the episode */
    return trill_rl_env_say(out, "user", text) ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "script environment: out of memory");
}

static trill_status script_step(void *state, const char *turn, rl_env_reply *out) {
    script_state *s = state;
    s->turn++;
    if (s->turn <= MAX_TURNS && n_seen[s->turn - 1] < MAX_EPISODES) snprintf(seen[s->turn - 1][n_seen[s->turn - 1]++], 64, "%s", turn);
    if (strcmp(script_mode, "nan") == 0) out->reward = NAN;
    if (strcmp(script_mode, "silent") == 0) return TRILL_OK; /* neither done nor an observation */
    if (!(out->metrics = json_pack("{s:i}", "steps", 1))) return trill_error(TRILL_ERR_NOMEM, "script environment: out of memory");
    if (s->turn >= script_turns) {
        out->done = true;
        out->reward = 1;
        return TRILL_OK;
    }
    char text[128];
    snprintf(text, sizeof text, "<%d|%s\n", s->turn, strcmp(script_mode, "long") == 0 ? "........................................" : "");
    return trill_rl_env_say(out, "tool", text) ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "script environment: out of memory");
}

static const rl_env_builtin SCRIPT = { "script", sizeof(script_state), script_reset, script_step };

/* ---- the world: a small MoE on disk, a char-level tokenizer, four tasks ---- */

typedef struct world {
    char *dir;
    trill_model *model;
    trill_tokenizer *tok;
    trill_dataset data;
    trill_example ex[2];
    trill_engine *engine;
    rl_env *env;
    trill_request proto;
    int stop_id;
} world;

static void world_init(world *w) {
    memset(w, 0, sizeof *w);
    w->dir = test_tmpdir("episodes");
    trill_model *m = test_small_moe(5, false, true);
    assert_int_equal(trill_model_save(m, w->dir, TRILL_F32, 0), TRILL_OK);
    assert_int_equal(trill_model_write_charlevel_files(w->dir, trill_model_config(m)), TRILL_OK);
    trill_model_free(m);
    assert_int_equal(trill_model_load(w->dir, &w->model), TRILL_OK);
    assert_int_equal(trill_tokenizer_load(w->dir, &w->tok), TRILL_OK);
    static char *const prompts[2] = { "12+7=", "3+40=" };
    for (int i = 0; i < 2; i++) {
        w->ex[i].prompt = prompts[i];
        w->ex[i].answer = "19";
        size_t n;
        assert_int_equal(trill_tokenizer_encode(w->tok, prompts[i], strlen(prompts[i]), false, &w->ex[i].ids, &n), TRILL_OK);
        w->ex[i].n_ids = (int)n;
    }
    w->data = (trill_dataset){ .path = "mem.jsonl", .n = 2, .examples = w->ex };
    trill_engine_config ec = trill_engine_config_default();
    ec.format = TRILL_GEN_F32;
    ec.kv_cache_mb = 16;
    ec.capture_experts = true;
    assert_int_equal(trill_engine_create(w->model, &ec, &w->engine), TRILL_OK);
    assert_int_equal(trill_rl_env_open_builtin(&SCRIPT, &w->env), TRILL_OK);
    w->stop_id = 0; /* <|endoftext|> */
    w->proto = (trill_request){ .max_new_tokens = 4, .sampling = trill_sampling_default(), .stop_ids = &w->stop_id, .n_stop_ids = 1 };
    w->proto.sampling.seed = 11;
    script_turns = 3;
    script_mode = "";
    memset(n_seen, 0, sizeof n_seen);
}

static void world_free(world *w) {
    for (int i = 0; i < 2; i++) free(w->ex[i].ids);
    trill_rl_env_free(w->env);
    trill_engine_free(w->engine);
    trill_tokenizer_free(w->tok);
    trill_model_free(w->model);
    test_rmdir(w->dir);
    free(w->dir);
}

static const int EXAMPLES[2] = { 0, 1 };
static const uint64_t IDS[2] = { 5, 9 };

static rl_episodes_job job_of(world *w, long *prefill_rows) {
    const trill_config *c = trill_model_config(w->model);
    return (rl_episodes_job){ .engine = w->engine, .tok = w->tok, .data = &w->data, .examples = EXAMPLES, .n_prompts = 2,
                              .group_size = 2, .request_ids = IDS, .proto = &w->proto, .n_moe_layers = c->n_moe_layers,
                              .top_k = c->num_experts_per_tok, .env = w->env, .seed = 1, .max_turns = MAX_TURNS,
                              .max_tokens = c->max_position_embeddings, .prefill_rows = prefill_rows };
}

/* The tokens of text (at most 4096), as the episode loop renders an observation. */
static int encode(const world *w, const char *text, int *ids) {
    int *got;
    size_t n;
    assert_int_equal(trill_tokenizer_encode(w->tok, text, strlen(text), false, &got, &n), TRILL_OK);
    assert_true(n <= 4096); /* the callers' buffers */
    memcpy(ids, got, sizeof(int) * n);
    free(got);
    return (int)n;
}

/* A 3-turn episode's trajectory: prompt, turn, "<1|\n", turn, "<2|\n", turn, each injected segment
 * the observation's tokens, the loss mask the sampled segments and nothing else, the behaviour
 * log-probs those of a fresh f32 forward over the whole sequence (the sampled ids are the ids
 * trained, at their places), the routing captured for every token but the last, and the rows
 * prefilled exactly the prompts (once per group) and each observation plus the turn's last token. */
static void test_three_turns(void **state) {
    (void)state;
    world w;
    world_init(&w);
    long prefill = 0;
    rl_episodes_job j = job_of(&w, &prefill);
    rl_batch b;
    assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_OK);
    assert_int_equal(b.n_seqs, 4);
    assert_non_null(b.episodes);
    assert_false(trill_engine_busy(w.engine));
    assert_int_equal(trill_engine_held(w.engine), 0);
    long want_prefill = 0;
    const trill_config *c = trill_model_config(w.model);
    const size_t row = (size_t)c->n_moe_layers * c->num_experts_per_tok;
    for (int s = 0; s < b.n_seqs; s++) {
        const int first = b.seg_offsets[s], n_segs = b.seg_offsets[s + 1] - first, at = b.offsets[s];
        assert_int_equal(n_segs, 6);
        assert_int_equal(b.episodes[s].turns, 3);
        assert_int_equal(b.episodes[s].stop, RL_STOP_DONE);
        assert_true(b.episodes[s].env_return == 1);
        char prompt[64];
        snprintf(prompt, sizeof prompt, "Q:%s", w.ex[s / 2].prompt);
        const char *obs[3] = { prompt, "<1|\n", "<2|\n" };
        int t = at;
        for (int k = 0; k < n_segs; k++) {
            const rl_segment *g = &b.segs[first + k];
            assert_int_equal(g->kind, k % 2 ? RL_SEG_SAMPLED : RL_SEG_INJECTED);
            if (g->kind == RL_SEG_SAMPLED) { /* the text the environment read is these ids' */
                const bool stop = b.tokens[t + g->len - 1] == w.stop_id;
                char *text;
                size_t tl;
                assert_int_equal(trill_tokenizer_decode_lenient(w.tok, b.tokens + t, g->len - stop, &text, &tl), TRILL_OK);
                bool found = false;
                for (int i = 0; i < n_seen[k / 2]; i++) found |= strcmp(seen[k / 2][i], text) == 0;
                if (!found) fail_msg("sequence %d turn %d: \"%s\" is not a text the environment read", s, k / 2 + 1, text);
                free(text);
            }
            if (g->kind == RL_SEG_INJECTED) {
                static int ids[4096];
                const int n = encode(&w, obs[k / 2], ids);
                assert_int_equal(g->len, n);
                assert_memory_equal(b.tokens + t, ids, sizeof(int) * (size_t)n);
                want_prefill += k == 0 ? (s % 2 == 0 ? n : 0) : n + 1;
            }
            for (int i = t; i < t + g->len; i++) {
                assert_int_equal(b.loss_mask[i], g->kind == RL_SEG_SAMPLED);
                assert_int_equal(isfinite(b.behav_logp[i]), g->kind == RL_SEG_SAMPLED);
            }
            t += g->len;
        }
        assert_int_equal(t, b.offsets[s + 1]);
        /* the log-probs the trainer's forward gives the same ids at the same places */
        const int len = b.offsets[s + 1] - at, offsets[2] = { 0, len };
        float *lp = calloc((size_t)len + 1, sizeof(float));
        assert_int_equal(trill_model_forward(w.model, b.tokens + at, offsets, 1, NULL, lp, NULL), TRILL_OK);
        for (int i = at; i < at + len; i++)
            if (b.loss_mask[i] && fabsf(lp[i - at] - b.behav_logp[i]) > 1e-4f)
                fail_msg("sequence %d token %d: sampled with log-prob %.7g, a fresh forward gives %.7g", s, i - at, b.behav_logp[i], lp[i - at]);
        free(lp);
        for (int i = at; i < at + len; i++)
            assert_int_equal(b.experts[(size_t)i * row] == TRILL_REPLAY_NONE, i == at + len - 1);
    }
    if (prefill != want_prefill) fail_msg("the engine prefilled %ld rows, the prompts and observations are %ld", prefill, want_prefill);
    /* the batch crosses threads and ranks as bytes: format 3 keeps the segments and episodes */
    void *buf;
    size_t n;
    assert_int_equal(trill_rl_batch_pack(&b, &buf, &n), TRILL_OK);
    rl_batch u;
    assert_int_equal(trill_rl_batch_unpack(buf, n, &u), TRILL_OK);
    assert_memory_equal(u.episodes, b.episodes, sizeof(rl_episode) * (size_t)b.n_seqs);
    assert_memory_equal(u.segs, b.segs, sizeof(rl_segment) * (size_t)b.seg_offsets[b.n_seqs]);
    assert_memory_equal(u.loss_mask, b.loss_mask, (size_t)b.offsets[b.n_seqs]);
    for (int s = 0; s < b.n_seqs; s++) { /* the environment's metrics, summed over the turns */
        assert_string_equal(b.env_metrics[s], "{\"steps\":3.0}");
        assert_string_equal(u.env_metrics[s], b.env_metrics[s]);
    }
    trill_rl_batch_free(&u);
    free(buf);
    b.episodes[1].stop = RL_STOP_KINDS; /* a stop reason unpacking refuses */
    assert_int_equal(trill_rl_batch_pack(&b, &buf, &n), TRILL_OK);
    assert_int_equal(trill_rl_batch_unpack(buf, n, &u), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "episode 1"));
    free(buf);
    trill_rl_batch_free(&b);
    world_free(&w);
}

/* The trainer's step on the episodes (on-policy PPO, token-mean: dL/dlogp = -A_s / N on each
 * sampled token of sequence s, N the sampled tokens of the batch) has the gradient of the packed
 * sequences' own forward and backward with that gradient on the sampled tokens and 0 on the
 * injected ones: the loss mask and nothing else decides what trains. */
static void test_trainer_gradient(void **state) {
    (void)state;
    world w;
    world_init(&w);
    rl_episodes_job j = job_of(&w, NULL);
    rl_batch b;
    assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_OK);
    for (int s = 0; s < b.n_seqs; s++) b.reward[s] = s % 2 ? 0.0 : 1.0; /* each group: one of each */
    trill_run_config c;
    assert_int_equal(trill_run_config_defaults(&c), TRILL_OK);
    c.generator.n = 2;
    c.generator.prompts_per_step = 2;
    c.generator.dtype = TRILL_GEN_F32;
    c.trainer.schedule = TRILL_LR_CONSTANT;
    c.router_replay = true;
    trill_trainer *t;
    assert_int_equal(trill_trainer_create(&c, w.dir, NULL, NULL, &t), TRILL_OK);
    /* by hand, before the step changes the adapters */
    const int T = b.offsets[b.n_seqs];
    float *lp = calloc((size_t)T + 1, sizeof(float)), *dlp = calloc((size_t)T + 1, sizeof(float));
    size_t n_lora = 0;
    trill_lora_params(trill_trainer_lora(t), &n_lora);
    float *grads = calloc(n_lora, sizeof(float));
    long N = 0;
    for (int i = 0; i < T; i++) N += b.loss_mask[i];
    const double sd = sqrt(0.5); /* each group's rewards 1 and 0: (r - mean) / (unbiased std + 1e-6) */
    const double adv[2] = { 0.5 / (sd + 1e-6), -0.5 / (sd + 1e-6) };
    for (int s = 0; s < b.n_seqs; s++)
        for (int i = b.offsets[s]; i < b.offsets[s + 1]; i++) dlp[i] = b.loss_mask[i] ? (float)(-adv[s % 2] / (double)N) : 0.0f;
    trill_forward_pass *pass = NULL;
    assert_int_equal(trill_model_forward_train(trill_trainer_policy(t), b.tokens, b.offsets, b.n_seqs, b.experts, lp, NULL, false, &pass), TRILL_OK);
    assert_int_equal(trill_model_backward(pass, dlp, NULL, grads), TRILL_OK);
    trill_forward_pass_free(pass);
    double norm = 0;
    for (size_t i = 0; i < n_lora; i++) norm += (double)grads[i] * grads[i];
    norm = sqrt(norm);
    rl_train_stats ts;
    trill_rl_metrics *m = calloc(1, sizeof *m);
    assert_int_equal(trill_trainer_step(t, &b, 1, &ts, m), TRILL_OK);
    assert_true(norm > 0);
    if (fabs(ts.grad_norm - norm) > 1e-4 * norm) fail_msg("the trainer's gradient norm %.9g, the masked sequence's by hand %.9g", ts.grad_norm, norm);
    assert_int_equal(m->mismatch_tokens, N);
    assert_true(m->flip_token_frac == 0); /* router replay over every model token of every turn */
    free(m);
    free(lp), free(dlp), free(grads);
    trill_trainer_free(t);
    trill_run_config_free(&c);
    trill_rl_batch_free(&b);
    world_free(&w);
}

/* The limits end episodes with their reason and never cut a trajectory silently: max_turns; an
 * observation that leaves no room for a turn (context), the trajectory within max_tokens. */
static void test_limits(void **state) {
    (void)state;
    world w;
    world_init(&w);
    script_turns = 100; /* never done */
    rl_episodes_job j = job_of(&w, NULL);
    j.max_turns = 2;
    rl_batch b;
    assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_OK);
    for (int s = 0; s < b.n_seqs; s++) {
        assert_int_equal(b.episodes[s].stop, RL_STOP_MAX_TURNS);
        assert_int_equal(b.episodes[s].turns, 2);
        assert_int_equal(b.seg_offsets[s + 1] - b.seg_offsets[s], 4); /* no observation after the last turn */
    }
    trill_rl_batch_free(&b);
    script_mode = "long";
    j.max_turns = 100;
    j.max_tokens = 60;
    assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_OK);
    for (int s = 0; s < b.n_seqs; s++) {
        assert_int_equal(b.episodes[s].stop, RL_STOP_CONTEXT);
        assert_true(b.offsets[s + 1] - b.offsets[s] <= 60);
        assert_int_equal(b.segs[b.seg_offsets[s + 1] - 1].kind, RL_SEG_SAMPLED);
    }
    assert_int_equal(trill_engine_held(w.engine), 0);
    trill_rl_batch_free(&b);
    world_free(&w);
}

/* A bad environment is an error naming it and the episode, and leaves the engine empty: a
 * non-finite reward, a step that is neither done nor gives an observation, first observations
 * that differ within a group. */
static void test_bad_environment(void **state) {
    (void)state;
    static const struct { const char *mode, *says; } CASES[] = {
        { "nan", "reward nan" },
        { "silent", "no observation" },
        { "differ", "different first observations" },
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        world w;
        world_init(&w);
        script_mode = CASES[i].mode;
        rl_episodes_job j = job_of(&w, NULL);
        rl_batch b;
        assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_ERR_INVALID);
        if (!strstr(trill_error_message(), CASES[i].says)) fail_msg("%s: \"%s\"", CASES[i].mode, trill_error_message());
        assert_false(trill_engine_busy(w.engine));
        assert_int_equal(trill_engine_held(w.engine), 0);
        assert_null(b.tokens);
        world_free(&w);
    }
}

/* With a chat template (Qwen3's and DeepSeek-V3's, over the char-level vocabulary: their markers
 * are characters or <unk> here) the first observation is the conversation rendered with the
 * environment's tools and the generation prompt, and each later one what the template writes
 * after a turn, after the end-of-turn token the turn did not sample (this model ends turns with
 * <|endoftext|>): token for token the rendering of the injected text; the turns' tool calls (none
 * from a random model) are parsed and counted. */
static void test_chat_rendering(void **state) {
    (void)state;
    static const char *const families[2] = { "qwen3", "deepseek_v3" };
    for (int f = 0; f < 2; f++) {
        world w;
        world_init(&w);
        script_turns = 2;
        script_mode = "tools";
        trill_chat_template *chat = NULL;
        assert_int_equal(trill_chat_template_builtin(families[f], "", "", &chat), TRILL_OK);
        rl_episodes_job j = job_of(&w, NULL);
        j.chat = chat;
        j.enable_thinking = 0;
        rl_batch b;
        assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_OK);
        const trill_chat_message first[] = { { .role = "user", .content = "Q:12+7=" } };
        const trill_chat_message next[] = { { .role = "tool", .content = "<1|\n" } };
        char *first_text = NULL, *after = NULL, *next_text = NULL;
        assert_int_equal(trill_chat_render_tools(chat, first, 1, SCRIPT_TOOLS, true, 0, &first_text), TRILL_OK);
        assert_int_equal(trill_chat_render_after_turn(chat, next, 1, true, 0, &after), TRILL_OK);
        assert_true(asprintf(&next_text, "%s%s", trill_chat_turn_end(chat), after) > 0);
        if (f == 0) assert_non_null(strstr(first_text, "\"name\": \"calc\"")); /* Qwen3 writes the tools into the prompt */
        static int want[2][4096];
        const int n_first = encode(&w, first_text, want[0]), n_next = encode(&w, next_text, want[1]);
        const int s = 0, at = b.offsets[s], k0 = b.seg_offsets[s];
        assert_int_equal(b.seg_offsets[s + 1] - k0, 4); /* prompt, turn, observation, turn */
        assert_int_equal(b.segs[k0].len, n_first);
        assert_memory_equal(b.tokens + at, want[0], sizeof(int) * (size_t)n_first);
        assert_int_equal(b.segs[k0 + 2].len, n_next);
        assert_memory_equal(b.tokens + at + n_first + b.segs[k0 + 1].len, want[1], sizeof(int) * (size_t)n_next);
        assert_int_equal(b.episodes[s].tool_calls + b.episodes[s].parse_errors, 0);
        free(first_text), free(after), free(next_text);
        trill_rl_batch_free(&b);
        trill_chat_template_free(chat);
        world_free(&w);
    }
}

/* Out of memory anywhere in an episode's life (its reset, a render, the engine's steps, a
 * continued turn, the environment's replies, the batch) ends the run with an out-of-memory error
 * and leaves the engine empty (nothing running, nothing held), ready for the next run, which
 * gives the batch of a run without failures; the ASan build checks that nothing leaks. Every Nth
 * allocation fails in turn (every one with TRILL_TEST_FULL). */
static uint64_t batch_digest(const rl_batch *b) {
    uint64_t h = 14695981039346656037ull;
    const unsigned char *parts[3] = { (const unsigned char *)b->tokens, (const unsigned char *)b->behav_logp, (const unsigned char *)b->segs };
    const size_t sizes[3] = { sizeof(int) * (size_t)b->offsets[b->n_seqs], sizeof(float) * (size_t)b->offsets[b->n_seqs],
                              sizeof(rl_segment) * (size_t)b->seg_offsets[b->n_seqs] };
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < sizes[k]; i++) h = (h ^ parts[k][i]) * 1099511628211ull;
    for (int e = 0; e < b->n_seqs; e++) { /* the outcomes, their seconds aside, and the environment's metrics */
        rl_episode x = b->episodes[e];
        x.env_s = 0;
        for (size_t i = 0; i < sizeof x; i++) h = (h ^ ((const unsigned char *)&x)[i]) * 1099511628211ull;
        for (const char *c = b->env_metrics[e]; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    }
    return h;
}

static void test_out_of_memory(void **state) {
    (void)state;
    world w;
    world_init(&w);
    rl_episodes_job j = job_of(&w, NULL);
    rl_batch b;
    trill_alloc_fail_after(LONG_MAX);
    assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_OK);
    const long count = trill_alloc_fail_after(-1);
    const uint64_t want = batch_digest(&b);
    trill_rl_batch_free(&b);
    const char *full = getenv("TRILL_TEST_FULL");
    const long stride = full && strcmp(full, "1") == 0 ? 1 : 7;
    long failed = 0;
    for (long n = 0; n < count; n += stride) {
        trill_alloc_fail_after(n);
        trill_status st = trill_rl_generate_episodes(&j, &b);
        trill_alloc_fail_after(-1);
        if (st == TRILL_OK) {
            if (batch_digest(&b) != want) fail_msg("failing allocation %ld: the run succeeded with another batch", n);
            trill_rl_batch_free(&b);
            continue;
        }
        failed++;
        if (!strstr(trill_error_message(), "memory")) fail_msg("failing allocation %ld: status %d \"%s\"", n, (int)st, trill_error_message());
        if (trill_engine_busy(w.engine) || trill_engine_held(w.engine))
            fail_msg("failing allocation %ld: the engine is left with work (%d held)", n, trill_engine_held(w.engine));
        assert_null(b.tokens);
    }
    assert_true(failed > 0);
    assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_OK); /* the engine and the environment as good as new */
    assert_true(batch_digest(&b) == want);
    trill_rl_batch_free(&b);
    world_free(&w);
}

/* The environment process with env.mark_failures: it crashes at its 3rd step, so the episode
 * stepped then and those the restarted process lost end env_error; every episode of the batch is
 * ended, none left in the environment's table (a long run's failures would otherwise pile up). */
static void test_process_failures_marked(void **state) {
    (void)state;
    world w;
    world_init(&w);
    char *script = test_tmpdir("episodes_env");
    char cmd[1200], path[1024];
    snprintf(path, sizeof path, "%s/env.py", script);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("import json, sys\nn = 0\nfor line in sys.stdin:\n    r = json.loads(line)\n    if r['op'] == 'step':\n        n += 1\n"
          "        if n == 3: sys.exit(3)\n    out = {'messages': [{'role': 'user', 'content': 'ok\\n'}]} if r['op'] == 'reset' else "
          "{'messages': [{'role': 'user', 'content': 'go\\n'}], 'reward': 0, 'done': False} if r['op'] == 'step' else {}\n"
          "    print(json.dumps(out), flush=True)\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s", path);
    trill_run_config c;
    assert_int_equal(trill_run_config_defaults(&c), TRILL_OK);
    free(c.env.kind);
    free(c.env.command);
    c.env.kind = strdup("process");
    c.env.command = strdup(cmd);
    c.env.mark_failures = true;
    rl_env *env;
    assert_int_equal(trill_rl_env_open(&c, &env), TRILL_OK);
    rl_episodes_job j = job_of(&w, NULL);
    j.env = env;
    j.max_turns = 4;
    rl_batch b;
    assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_OK);
    int lost = 0;
    for (int s = 0; s < b.n_seqs; s++) lost += b.episodes[s].stop == RL_STOP_ENV_ERROR;
    assert_int_equal(lost, b.n_seqs); /* the crash lost them all: two turns each at most */
    assert_int_equal(trill_rl_env_live(env), 0);
    trill_rl_batch_free(&b);
    trill_rl_env_free(env);
    trill_run_config_free(&c);
    test_rmdir(script);
    free(script);
    world_free(&w);
}

/* Partial rollouts (async mode): new weights taken between two decode steps, mid-episode. Each
 * sampled token carries the version that sampled it; along an episode the versions never go
 * back; an episode spans both versions and still ends as the environment says; the tokens
 * sampled before the update have the old weights' log-probs (a fresh forward of the old model)
 * and some after it do not (the new weights were used). */
typedef struct weight_swap {
    trill_engine *engine;
    const trill_model *next;
    int calls, at;
} weight_swap;

static trill_status swap_weights(void *ctx) {
    weight_swap *w = ctx;
    return ++w->calls == w->at ? trill_engine_update_weights(w->engine, w->next, 1, NULL) : TRILL_OK;
}

static void test_partial_rollout(void **state) {
    (void)state;
    world w;
    world_init(&w);
    trill_model *next = test_small_moe(6, false, true);
    weight_swap swap = { .engine = w.engine, .next = next, .at = 7 }; /* in the second turn */
    rl_episodes_job j = job_of(&w, NULL);
    j.between_steps = swap_weights;
    j.ctx = &swap;
    rl_batch b;
    assert_int_equal(trill_rl_generate_episodes(&j, &b), TRILL_OK);
    assert_true(swap.calls > swap.at);
    int spanning = 0, new_differs = 0;
    for (int s = 0; s < b.n_seqs; s++) {
        assert_int_equal(b.episodes[s].turns, 3);
        assert_int_equal(b.episodes[s].stop, RL_STOP_DONE);
        const int at = b.offsets[s], len = b.offsets[s + 1] - at, offsets[2] = { 0, len };
        float *lp = calloc((size_t)len + 1, sizeof(float));
        assert_int_equal(trill_model_forward(w.model, b.tokens + at, offsets, 1, NULL, lp, NULL), TRILL_OK);
        uint32_t last = 0;
        bool had[2] = { false, false };
        for (int i = at; i < at + len; i++) {
            if (!b.loss_mask[i]) {
                assert_int_equal(b.version[i], 0); /* injected: no version */
                continue;
            }
            assert_true(b.version[i] <= 1 && b.version[i] >= last);
            last = b.version[i];
            had[last] = true;
            const float d = fabsf(lp[i - at] - b.behav_logp[i]);
            if (last == 0 && d > 1e-4f)
                fail_msg("sequence %d token %d, sampled before the update: log-prob %.7g, the old weights give %.7g", s, i - at,
                         b.behav_logp[i], lp[i - at]);
            new_differs += last == 1 && d > 1e-3f;
        }
        spanning += had[0] && had[1];
        free(lp);
    }
    if (!spanning) fail_msg("no episode spans the weight update");
    assert_true(new_differs > 0);
    trill_rl_batch_free(&b);
    trill_model_free(next);
    world_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three_turns),
        cmocka_unit_test(test_trainer_gradient),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_bad_environment),
        cmocka_unit_test(test_chat_rendering),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_process_failures_marked),
        cmocka_unit_test(test_partial_rollout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
