/* The generator executor (generator.h). */
#include <stdlib.h>
#include <string.h>

#include "trill/timing.h"

#include "base/alloc.h"
#include "rl/apps/eval_internal.h"
#include "rl/data/episodes.h"
#include "rl/exec/generator.h"

struct rl_generator {
    const trill_run_config *c;
    const trill_tokenizer *tok;
    const trill_dataset *train;
    trill_engine *engine;
    trill_request proto;          /* sampling settings, stops */
    int stop_ids[TRILL_MAX_EOS];
    int L, K;                     /* MoE layers, experts per token: the captured experts' shape */
    rl_env *env;                  /* env.kind's environment, or NULL (single-turn rollouts) */
    const trill_chat_template *chat; /* the episodes' renderer, or NULL (plain) */
    int max_tokens;               /* an episode's tokens: env.max_tokens or the model's positions */
};

trill_engine_config trill_rl_engine_config(const trill_run_config *c, const trill_config *mc) {
    trill_engine_config ec = trill_engine_config_default();
    ec.format = c->generator.dtype;
    ec.kv_cache_mb = (size_t)c->generator.kv_cache_mb;
    ec.max_batch_tokens = c->generator.max_batch_tokens;
    ec.capture_experts = mc->n_moe_layers > 0; /* routing flips are measured every step, replay or not */
    ec.eplb = c->generator.eplb;
    ec.eplb_redundant = c->generator.eplb_redundant;
    ec.eplb_workers = c->parallel.generator.ep > 1 ? c->parallel.generator.ep : c->generator.eplb_workers; /* a replica's ranks */
    ec.eplb_window = c->generator.eplb_window;
    ec.eplb_interval = c->generator.eplb_interval;
    return ec;
}

trill_status trill_rl_generator_create(const trill_run_config *c, const trill_model *policy, const trill_tokenizer *tok,
                                       const trill_dataset *train, rl_generator **out) {
    rl_generator *g = trill_calloc(1, sizeof *g);
    if (!g) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const trill_config *mc = trill_model_config(policy);
    *g = (rl_generator){ .c = c, .tok = tok, .train = train, .L = mc->n_moe_layers, .K = mc->num_experts_per_tok };
    trill_engine_config ec = trill_rl_engine_config(c, mc);
    ec.tokenizer = tok;
    trill_status st = trill_engine_create(policy, &ec, &g->engine);
    if (st) {
        free(g);
        return st;
    }
    g->proto = (trill_request){ .max_new_tokens = c->generator.max_new_tokens };
    g->proto.sampling = trill_sampling_default();
    g->proto.sampling.temperature = (float)c->generator.temperature;
    g->proto.sampling.top_p = (float)c->generator.top_p;
    g->proto.sampling.top_k = c->generator.top_k;
    g->proto.sampling.min_p = (float)c->generator.min_p;
    g->proto.sampling.seed = c->seed;
    for (int i = 0; i < mc->n_eos; i++) g->stop_ids[i] = mc->eos_token_ids[i];
    g->proto.stop_ids = g->stop_ids;
    g->proto.n_stop_ids = mc->n_eos;
    g->proto.stop_strings = (const char *const *)c->generator.stop;
    g->proto.n_stop_strings = c->generator.n_stop;
    g->max_tokens = c->env.max_tokens ? c->env.max_tokens : mc->max_position_embeddings;
    if (c->env.kind[0] && (st = trill_rl_env_open(c, &g->env))) {
        trill_rl_generator_free(g);
        return st;
    }
    *out = g;
    return TRILL_OK;
}

void trill_rl_generator_set_chat(rl_generator *g, const trill_chat_template *chat) { g->chat = chat; }

void trill_rl_generator_free(rl_generator *g) {
    if (!g) return;
    trill_rl_env_free(g->env);
    trill_engine_free(g->engine);
    free(g);
}

trill_status trill_rl_generator_generate_part(rl_generator *g, int64_t index, const int *groups, int n_groups,
                                              trill_status (*between_steps)(void *), void *ctx, rl_batch *out, long *tokens) {
    const trill_run_config *c = g->c;
    const int P = c->generator.prompts_per_step;
    *tokens = 0;
    int *order = trill_malloc(sizeof(int) * (size_t)P), *examples = trill_malloc(sizeof(int) * (size_t)(n_groups + 1));
    uint64_t *ids = trill_malloc(sizeof(uint64_t) * (size_t)(n_groups + 1));
    trill_status st = order && examples && ids ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    const int64_t pos = index * P;
    if (!st) st = trill_dataset_order(g->train, c->seed, c->data.shuffle, pos, P, order);
    for (int i = 0; !st && i < n_groups; i++) {
        if (groups[i] < 0 || groups[i] >= P) st = trill_error(TRILL_ERR_INVALID, "generator: prompt %d of a batch of %d", groups[i], P);
        else examples[i] = order[groups[i]], ids[i] = (uint64_t)(pos + groups[i]);
    }
    if (!st && g->env) {
        const rl_episodes_job j = { .engine = g->engine, .tok = g->tok, .data = g->train, .examples = examples, .n_prompts = n_groups,
                                    .group_size = c->generator.n, .request_ids = ids, .proto = &g->proto, .n_moe_layers = g->L,
                                    .top_k = g->K, .env = g->env, .chat = g->chat, .enable_thinking = -1, .seed = c->seed,
                                    .max_turns = c->env.max_turns,
                                    .max_tokens = g->max_tokens, .between_steps = between_steps, .ctx = ctx };
        st = trill_rl_generate_episodes(&j, out);
    } else if (!st) {
        st = trill_rl_generate(g->engine, g->tok, g->train, examples, n_groups, c->generator.n, ids, &g->proto, g->L, g->K, between_steps,
                               ctx, out);
    }
    free(order);
    free(examples);
    free(ids);
    for (int s = 0; !st && s < out->n_seqs; s++) *tokens += rl_response_len(out, s);
    return st;
}

trill_status trill_rl_generator_generate(rl_generator *g, int64_t index, trill_status (*between_steps)(void *), void *ctx, rl_batch *out,
                                         long *tokens) {
    const int P = g->c->generator.prompts_per_step;
    int *all = trill_malloc(sizeof(int) * (size_t)P);
    if (!all) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < P; i++) all[i] = i;
    trill_status st = trill_rl_generator_generate_part(g, index, all, P, between_steps, ctx, out, tokens);
    free(all);
    return st;
}

trill_status trill_rl_generator_load_adapter(rl_generator *g, const trill_lora *lora, uint32_t version, size_t *bytes) {
    return trill_engine_update_adapter(g->engine, lora, version, bytes);
}

trill_status trill_rl_generator_load_weights(rl_generator *g, const trill_model *m, uint32_t version, size_t *bytes) {
    return trill_engine_update_weights(g->engine, m, version, bytes);
}

uint32_t trill_rl_generator_version(const rl_generator *g) { return trill_engine_version(g->engine); }

trill_status trill_rl_generator_set_expert_comm(rl_generator *g, trill_comm *c) { return trill_engine_set_expert_comm(g->engine, c); }

bool trill_rl_generator_expert_holdings(const rl_generator *g, uint8_t *held) { return trill_engine_ep_holdings(g->engine, held); }

/* Held-out episodes: o->k of each eval prompt, played to their end as in training. */
static trill_status evaluate_episodes(rl_generator *g, const trill_dataset *eval, const trill_eval_options *o, trill_eval_result *out) {
    const double t0 = trill_now();
    const int n = o->limit > 0 && o->limit < eval->n ? o->limit : eval->n;
    int *examples = trill_malloc(sizeof(int) * (size_t)n);
    uint64_t *ids = trill_malloc(sizeof(uint64_t) * (size_t)n);
    trill_status st = examples && ids ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; !st && i < n; i++) examples[i] = i, ids[i] = (uint64_t)i;
    trill_request proto = g->proto;
    proto.sampling = trill_sampling_default();
    proto.sampling.temperature = (float)o->temperature;
    proto.sampling.seed = o->seed;
    const rl_episodes_job j = { .engine = g->engine, .tok = g->tok, .data = eval, .examples = examples, .n_prompts = n, .group_size = o->k,
                                .request_ids = ids, .proto = &proto, .env = g->env, .chat = g->chat, .enable_thinking = -1, .seed = o->seed,
                                .max_turns = g->c->env.max_turns,
                                .max_tokens = g->max_tokens };
    rl_batch b;
    if (!st) st = trill_rl_generate_episodes(&j, &b);
    if (!st) trill_rl_eval_tally(&b, eval, o, n, trill_now() - t0, out);
    if (!st) trill_rl_batch_free(&b);
    free(examples);
    free(ids);
    return st;
}

trill_status trill_rl_generator_evaluate(rl_generator *g, const trill_dataset *eval, trill_eval_result *out) {
    const trill_run_config *c = g->c;
    trill_eval_options o = { .limit = c->data.eval_size, .k = c->eval.k, .temperature = c->eval.temperature,
                             .max_new_tokens = c->generator.max_new_tokens, .verifier = c->reward.verifier,
                             .seed = c->seed ^ 0x6576616cu /* "eval": the same draws before and after */,
                             .stop_ids = g->proto.stop_ids, .n_stop_ids = g->proto.n_stop_ids,
                             .stops = g->proto.stop_strings, .n_stops = g->proto.n_stop_strings };
    return g->env ? evaluate_episodes(g, eval, &o, out) : trill_rl_evaluate(g->engine, g->tok, eval, &o, out);
}
