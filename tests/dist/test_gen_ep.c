/* The expert-parallel generator (trill_engine_set_expert_comm) on however many ranks the launch
 * gives: each rank's engine generates its share of the requests (request i on rank i % P) with
 * EPLB placing 2 redundant replicas a rank (so physical slots are not logical ids, and some
 * experts live on two ranks) and re-planning every 2 steps from the group's summed counts; every
 * MoE layer's rows go to their slot's rank and back. Against one engine without EPLB or expert
 * parallelism generating every request: the same tokens, log-probs (bits) and captured expert ids
 * (which must be logical: a physical slot recorded would differ), with adapters on every expert,
 * for Qwen3-MoE and DeepSeek-V3; and rows really crossed ranks (the all-to-all-v's bytes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_test.h"
#include "trill/config.h"
#include "trill/eplb.h"
#include "trill/infer.h"
#include "trill/lora.h"
#include "trill/model.h"


enum { REQUESTS = 12, SAMPLES = 2, NEW = 10 };

static void submit(trill_engine *e, uint64_t id, const trill_config *c) {
    int prompt[16];
    const int len = 3 + (int)(id * 5 % 11);
    for (int t = 0; t < len; t++) prompt[t] = 1 + (int)((id * 17 + (uint64_t)t * 7) % (uint64_t)(c->vocab_size - 1));
    trill_request r = { .id = id, .prompt = prompt, .prompt_len = len, .n = SAMPLES, .max_new_tokens = NEW + (int)(id % 4) };
    r.sampling = trill_sampling_default();
    r.sampling.seed = 99;
    OK(trill_engine_submit(e, &r));
}

/* Every output of the engine, at [request][sample]. */
static void collect(trill_engine *e, trill_sequence_out out[REQUESTS][SAMPLES]) {
    trill_sequence_out tmp[8];
    int k;
    while ((k = trill_engine_collect(e, tmp, 8)) > 0)
        for (int i = 0; i < k; i++) out[tmp[i].request][tmp[i].sample] = tmp[i];
}

static trill_engine *make_engine(const trill_model *m, const trill_lora *l, bool eplb, int workers) {
    trill_engine_config cfg = trill_engine_config_default();
    cfg.capture_experts = true;
    cfg.eplb = eplb;
    cfg.eplb_workers = workers;
    cfg.eplb_redundant = 2 * workers;
    cfg.eplb_window = 2;
    cfg.eplb_interval = 2;
    trill_engine *e;
    OK(trill_engine_create(m, &cfg, &e));
    OK(trill_engine_update_adapter(e, l, 1, NULL));
    return e;
}

static void run_family(trill_comm *w, const char *json, const char *name) {
    const int P = trill_comm_size(w), me = trill_comm_rank(w);
    trill_config c;
    OK(trill_config_parse(json, strlen(json), name, &c));
    trill_model *m;
    OK(trill_model_create(&c, &m));
    trill_model_init_random(m, 11);
    trill_lora *l;
    OK(trill_lora_create(m, (trill_lora_config){ .rank = 4, .alpha = 8, .targets = TRILL_LORA_ALL_LINEAR }, 3, &l));
    test_set_lora_b(l);
    static trill_sequence_out want[REQUESTS][SAMPLES], got[REQUESTS][SAMPLES];
    memset(want, 0, sizeof want);
    memset(got, 0, sizeof got);
    /* the reference: one engine, every request, no EPLB */
    trill_engine *ref = make_engine(m, l, false, 0);
    const size_t whole_bytes = trill_engine_weight_bytes(ref);
    for (uint64_t id = 0; id < REQUESTS; id++) submit(ref, id, &c);
    OK(trill_engine_run(ref));
    collect(ref, want);
    trill_engine_free(ref);
    /* the group: this rank's share, experts placed by EPLB over the ranks */
    trill_engine *e = make_engine(m, l, true, P);
    OK(trill_engine_set_expert_comm(e, w));
    const size_t kept_bytes = trill_engine_weight_bytes(e);
    if (P > 1) CHECK(kept_bytes < whole_bytes); /* each rank keeps its slots' experts only */
    for (uint64_t id = (uint64_t)me; id < REQUESTS; id += (uint64_t)P) submit(e, id, &c);
    trill_comm_stats_reset(w);
    int steps = 0;
    for (bool busy = true;;) {
        OK(trill_engine_group_busy(e, &busy));
        if (!busy) break;
        OK(trill_engine_step(e, NULL));
        steps++;
    }
    collect(e, got);
    const trill_eplb_plan *plan = trill_engine_eplb_plan(e);
    CHECK(plan && plan->n_physical > c.num_experts); /* replicas: slot ids are not logical ids */
    const trill_comm_stats s = trill_comm_stats_get(w);
    if (P > 1) CHECK(s.bytes[TRILL_COMM_ALLTOALLV] > 0);
    /* re-plans moved experts between ranks (summed over the group) */
    double moved = (double)trill_engine_ep_moved_bytes(e);
    OK(trill_comm_allreduce_f64(w, &moved, 1));
    if (P > 1) CHECK(moved > 0);
    const size_t row = (size_t)c.n_moe_layers * c.num_experts_per_tok;
    int compared = 0;
    for (int id = 0; id < REQUESTS; id++)
        for (int k = 0; k < SAMPLES; k++) {
            const trill_sequence_out *a = &want[id][k], *b = &got[id][k];
            if (id % P != me) {
                CHECK(b->tokens == NULL);
                continue;
            }
            CHECK(b->tokens && a->n_generated == b->n_generated && a->n_prompt == b->n_prompt);
            if (!b->tokens || a->n_generated != b->n_generated) continue;
            const int n = a->n_prompt + a->n_generated;
            CHECK(!memcmp(a->tokens, b->tokens, sizeof(int) * (size_t)n));
            CHECK(!memcmp(a->logprobs, b->logprobs, sizeof(float) * (size_t)a->n_generated));
            CHECK(a->experts && b->experts && !memcmp(a->experts, b->experts, sizeof(uint16_t) * row * (size_t)(n - 1)));
            compared++;
        }
    CHECK(compared == SAMPLES * ((REQUESTS - me + P - 1) / P));
    if (me == 0)
        printf("%s: %d ranks, %d lockstep steps, %d physical slots for %d experts, rank 0 keeps %zu of %zu weight bytes, re-plans "
               "moved %.0f bytes of experts, %llu bytes crossed from rank 0: tokens, log-probs and logical experts as one engine\n",
               name, P, steps, plan ? plan->n_physical : 0, c.num_experts, kept_bytes, whole_bytes, moved,
               (unsigned long long)s.bytes[TRILL_COMM_ALLTOALLV]);
    for (int id = 0; id < REQUESTS; id++)
        for (int k = 0; k < SAMPLES; k++) {
            trill_sequence_out_free(&want[id][k]);
            trill_sequence_out_free(&got[id][k]);
        }
    trill_engine_free(e);
    trill_lora_free(l);
    trill_model_free(m);
}

int main(int argc, char **argv) {
    trill_comm *w = dist_test_begin("test_gen_ep", argc, argv, NULL);
    run_family(w, DIST_QWEN3_MOE, "qwen3_moe");
    run_family(w, DIST_DEEPSEEK_V3, "deepseek_v3");
    run_family(w, DIST_MIXTRAL, "mixtral");
    run_family(w, DIST_GLM, "glm4_moe");
    run_family(w, DIST_GPT_OSS, "gpt_oss");
    run_family(w, DIST_QWEN3NEXT, "qwen3_next");
    return dist_test_end(w);
}
