/* trill plan: parameters, memory per device and weight-sync bytes of an RL run before it starts
 * (trill/plan.h; the equations: docs/plan.md). */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/demo.h"
#include "trill/fileio.h"
#include "trill/plan.h"
#include "trill/run_config.h"

/* A model folder's config.json, or a preset's (trill init --preset). */
static trill_status load_model_config(const char *model, trill_config *c) {
    char *path = trill_path_join(model, "config.json");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st;
    if (trill_file_exists(path)) {
        st = trill_config_load(path, c);
    } else {
        char *text = trill_config_preset_text(model);
        st = text ? trill_config_parse(text, strlen(text), model, c)
                  : trill_error(TRILL_ERR_INVALID, "--model %s: no config.json there, and no preset of that name (%s)", model, trill_config_preset_names());
        free(text);
    }
    free(path);
    return st;
}

static double gb(double bytes) { return bytes * 1e-9; }

static void print_counts(const trill_plan_counts *n, int rank) {
    printf("parameters        %14s %14s %14s\n", "total", "active", "LoRA trainable");
    for (int m = 0; m < TRILL_PLAN_N_MODULES; m++)
        if (n->total[m])
            printf("  %-15s %14" PRId64 " %14" PRId64 " %14" PRId64 "\n", trill_plan_module_name((trill_plan_module)m), n->total[m], n->active[m],
                   n->lora[m]);
    printf("  %-15s %14" PRId64 " %14" PRId64 " %14" PRId64 "  (rank %d on %" PRId64 " weights: %.3f%% of the model)\n", "all", n->sum_total,
           n->sum_active, n->sum_lora, rank, n->adapted, 100.0 * (double)n->sum_lora / (double)n->sum_total);
}

static void print_plan(const trill_config *c, const trill_run_config *rc, const trill_cluster *k, const trill_plan *p) {
    printf("model:     %s (%s), %d layers\n", rc->model, trill_config_model_type(c), c->num_hidden_layers);
    printf("cluster:   %s: %d nodes x %d devices, %.0f GB, %.0f bf16 TFLOP/s, %.0f GB/s memory, links %.0f / %.0f GB/s (%s)\n", k->name, k->nodes,
           k->devices_per_node, k->memory_gb, k->bf16_tflops, k->memory_bw_gbs, k->intra_bw_gbs, k->inter_bw_gbs, k->source);
    printf("layout:    trainer dp %d x ep %d x tp %d = %d devices; generator ", rc->parallel.trainer.dp, rc->parallel.trainer.ep,
           rc->parallel.trainer.tp, p->trainer_devices);
    if (p->generator_devices && p->workload.gen_tp > 1)
        printf("%d replicas x ep %d x tp %d = %d devices (tensor parallelism: --gen-tp)\n\n", rc->parallel.generator.replicas,
               rc->parallel.generator.ep, p->workload.gen_tp, p->generator_devices);
    else if (p->generator_devices)
        printf("%d replicas x ep %d = %d devices\n\n", rc->parallel.generator.replicas, rc->parallel.generator.ep, p->generator_devices);
    else printf("on the trainer's devices\n\n");
    print_counts(&p->counts, rc->trainer.lora.rank);
    const trill_plan_memory *m = &p->memory;
    printf("\ntrainer, per device (GB):    frozen base %.2f, %s %.3f, gradients %.3f, AdamW %.3f, activations %.2f, logits %.2f: %.2f of %.0f%s\n",
           gb(m->base), p->workload.full ? "fp32 weights" : "adapters", gb(m->adapters), gb(m->grads), gb(m->optimizer), gb(m->activations), gb(m->logits), gb(m->trainer_total), k->memory_gb,
           m->trainer_fits ? "" : "  DOES NOT FIT");
    printf("generator, per device (GB):  weights %.2f (%s), reserve %.2f, KV cache %.2f: %.2f of %.0f%s\n", gb(m->gen_weights),
           trill_gen_format_name(rc->generator.dtype), gb(m->gen_reserve), gb(m->kv_cache), gb(m->gen_total), k->memory_gb,
           m->generator_fits ? "" : "  DOES NOT FIT");
    printf("KV cache:  %.0f bytes a token; %" PRId64 " tokens fit (%.1f sequences of %.0f + %d tokens)\n", m->kv_bytes_per_token, m->kv_tokens,
           (double)m->kv_tokens / (p->workload.prompt_len + rc->generator.max_new_tokens), p->workload.prompt_len, rc->generator.max_new_tokens);
    const trill_plan_sync *s = &p->sync;
    if (p->workload.full)
        printf("weight sync per version (%s): merge %.4g GB in %.3g s (full fine-tuning: no adapters to ship)\n", s->link, gb(s->merge_bytes),
               s->merge_s);
    else
        printf("weight sync per version (%s): adapter %.4g GB in %.3g s; merge %.4g GB in %.3g s (merge / adapter: %.0fx the bytes)\n", s->link,
               gb(s->adapter_bytes), s->adapter_s, gb(s->merge_bytes), s->merge_s, s->merge_bytes / s->adapter_bytes);
    if (s->merge_p2p_s > 0)
        printf("           trill broadcasts each version; sent point to point from every trainer device at once, merge would take %.3g s\n",
               s->merge_p2p_s);
    const trill_plan_time *t = &p->time;
    const trill_plan_workload *w = &p->workload;
    printf("\nstep time (roofline, docs/plan.md): %d prompts x %d samples, prompts of %.0f tokens, responses of %.0f (%s, at most %d)\n",
           rc->generator.prompts_per_step, rc->generator.n, w->prompt_len, w->response_len, trill_plan_spread_name(w->spread),
           rc->generator.max_new_tokens);
    printf("  generation %.3g s (prefill %.3g s, %d decode steps %.3g s, %.0f%% of them bandwidth-bound)", t->gen_s, t->prefill_s,
           t->decode_steps, t->decode_s, 100 * t->decode_bound_bw);
    if (t->gen_concurrent < t->gen_rollouts)
        printf("; a generator's KV cache holds %.0f of its %.0f rollouts at once (continuous batching keeps it full)", t->gen_concurrent,
               t->gen_rollouts);
    printf("\n");
    printf("  training   %.3g s (%.3g TFLOP over %.0f tokens; communication %.3g s)\n", t->train_s, t->train_flops * 1e-12, t->train_tokens,
           t->train_comm_s);
    printf("  weight sync %.3g s (%s)\n", t->sync_s, p->sync.merge_mode ? "merge" : "adapter");
    printf("  a step: sync %.3g s, async (max_staleness %d) %.3g s (%.2fx); every device generating then training (colocated) %.3g s "
           "(generation %.3g s, training %.3g s)\n", t->sync_step_s, rc->async.max_staleness, t->async_step_s, t->async_speedup, t->colocated_step_s,
           t->colocated_gen_s, t->colocated_train_s);
}

static json_t *plan_json(const trill_config *c, const trill_run_config *rc, const trill_cluster *k, const trill_plan *p) {
    json_t *mods = json_object();
    for (int m = 0; m < TRILL_PLAN_N_MODULES; m++)
        json_object_set_new(mods, trill_plan_module_name((trill_plan_module)m),
                            json_pack("{s:I, s:I, s:I}", "total", (json_int_t)p->counts.total[m], "active", (json_int_t)p->counts.active[m], "lora",
                                      (json_int_t)p->counts.lora[m]));
    const trill_plan_memory *m = &p->memory;
    const trill_plan_sync *s = &p->sync;
    json_t *j = json_pack("{s:s, s:s, s:{s:s, s:i, s:i, s:f}, s:{s:I, s:I, s:I, s:I, s:I, s:o}, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:b}, "
                     "s:{s:f, s:f, s:f, s:f, s:f, s:I, s:b}, s:{s:s, s:f, s:f, s:f, s:f}}",
                     "model", rc->model, "model_type", trill_config_model_type(c),
                     "cluster", "name", k->name, "nodes", k->nodes, "devices_per_node", k->devices_per_node, "memory_gb", k->memory_gb,
                     "parameters", "total", (json_int_t)p->counts.sum_total, "active", (json_int_t)p->counts.sum_active, "lora",
                     (json_int_t)p->counts.sum_lora, "trainable", (json_int_t)p->counts.trainable, "adapted_weights", (json_int_t)p->counts.adapted,
                     "by_module", mods,
                     "trainer_bytes", "base", m->base, "adapters", m->adapters, "grads", m->grads, "optimizer", m->optimizer, "activations",
                     m->activations, "logits", m->logits, "total", m->trainer_total, "fits", m->trainer_fits,
                     "generator_bytes", "weights", m->gen_weights, "reserve", m->gen_reserve, "kv_cache", m->kv_cache, "total", m->gen_total,
                     "kv_bytes_per_token", m->kv_bytes_per_token, "kv_tokens", (json_int_t)m->kv_tokens, "fits", m->generator_fits,
                     "sync", "link", s->link, "adapter_bytes", s->adapter_bytes, "adapter_s", s->adapter_s, "merge_bytes", s->merge_bytes, "merge_s",
                     s->merge_s);
    if (j) json_object_set_new(json_object_get(j, "sync"), "merge_p2p_s", json_real(s->merge_p2p_s));
    const trill_plan_workload *w = &p->workload;
    if (j)
        json_object_set_new(j, "workload", json_pack("{s:f, s:f, s:s, s:b, s:i, s:i, s:i}", "prompt_len", w->prompt_len, "response_len", w->response_len,
                                                     "spread", trill_plan_spread_name(w->spread), "full", w->full, "gen_tp", w->gen_tp > 1 ? w->gen_tp : 1,
                                                     "trainer_devices", p->trainer_devices, "generator_devices", p->generator_devices));
    const trill_plan_time *t = &p->time;
    json_t *tj = json_pack("{s:f, s:f, s:f, s:i, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "prefill_s", t->prefill_s, "decode_s",
                           t->decode_s, "gen_s", t->gen_s, "decode_steps", t->decode_steps, "gen_concurrent", t->gen_concurrent, "decode_bound_bw", t->decode_bound_bw, "train_s", t->train_s,
                           "train_comm_s", t->train_comm_s, "train_flops", t->train_flops, "train_tokens", t->train_tokens, "sync_s", t->sync_s,
                           "sync_step_s", t->sync_step_s, "async_step_s", t->async_step_s, "colocated_step_s", t->colocated_step_s, "async_speedup",
                           t->async_speedup);
    if (tj) json_object_set_new(tj, "colocated_gen_s", json_real(t->colocated_gen_s));
    if (tj) json_object_set_new(tj, "colocated_train_s", json_real(t->colocated_train_s));
    if (j && tj) json_object_set_new(j, "time", tj);
    return j;
}

/* --search: the fastest layouts as a table (or JSON into *found); the best one's parallel keys
 * are set in cfg so that the plan printed after is its. */
static int run_search(const trill_config *c, trill_run_config *cfg, const trill_cluster *k, const trill_plan_workload *w, bool json, json_t **found) {
    enum { SHOW = 8 };
    trill_plan_layout *best = calloc(SHOW, sizeof *best);
    int n = 0, tried = 0;
    if (!best) return cli_fail("plan");
    if (trill_plan_search(c, cfg, k, w, best, SHOW, &n, &tried)) {
        free(best);
        return cli_fail("plan");
    }
    if (!n) {
        free(best);
        fprintf(stderr, "trill plan: --search: none of the %d layouts fits %d nodes x %d devices of %.0f GB\n", tried, k->nodes, k->devices_per_node,
                k->memory_gb);
        return 1;
    }
    const char *mode = cfg->mode == TRILL_MODE_ASYNC ? "async" : "sync";
    if (json) {
        *found = json_array();
        for (int i = 0; i < n; i++) {
            const trill_plan_layout *l = &best[i];
            json_array_append_new(*found, json_pack("{s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f}", "dp", l->dp, "ep", l->ep, "tp", l->tp,
                                                    "replicas", l->replicas, "gen_ep", l->gen_ep, "step_s", l->step_s, "gen_s",
                                                    l->plan.time.gen_s, "train_s", l->plan.time.train_s, "trainer_bytes",
                                                    l->plan.memory.trainer_total, "generator_bytes", l->plan.memory.gen_total - l->plan.memory.kv_cache));
        }
    } else {
        printf("search: %d layouts tried, the %d fastest for mode %s:\n", tried, n, mode);
        printf("  %-24s %-22s %10s %10s %10s %14s %14s\n", "trainer dp x ep x tp", "generator", "step s", "gen s", "train s", "trainer GB/dev",
               "gen weights GB");
        for (int i = 0; i < n; i++) {
            const trill_plan_layout *l = &best[i];
            char t[32], g[32];
            snprintf(t, sizeof t, "%d x %d x %d", l->dp, l->ep, l->tp);
            if (l->replicas && w->gen_tp > 1) snprintf(g, sizeof g, "%d x ep %d x tp %d", l->replicas, l->gen_ep, w->gen_tp);
            else if (l->replicas) snprintf(g, sizeof g, "%d x ep %d", l->replicas, l->gen_ep);
            else snprintf(g, sizeof g, "on the trainer's");
            printf("  %-24s %-22s %10.4g %10.4g %10.4g %14.2f %14.2f\n", t, g, l->step_s, l->plan.time.gen_s, l->plan.time.train_s,
                   l->plan.memory.trainer_total * 1e-9, l->plan.memory.gen_weights * 1e-9);
        }
        printf("\nthe plan of the fastest:\n");
    }
    cfg->parallel.trainer.dp = best[0].dp, cfg->parallel.trainer.ep = best[0].ep, cfg->parallel.trainer.tp = best[0].tp;
    cfg->parallel.generator.replicas = best[0].replicas, cfg->parallel.generator.ep = best[0].gen_ep;
    free(best);
    return 0;
}

/* The plan (of the fastest layout with search, after its table), as text or JSON. */
static int plan_and_print(const trill_config *c, trill_run_config *cfg, const trill_cluster *k, const trill_plan_workload *w, bool search,
                          bool json) {
    json_t *found = NULL; /* --search --json: the layouts */
    trill_plan p;
    int rc = search ? run_search(c, cfg, k, w, json, &found) : 0;
    if (!rc && trill_plan_make(c, cfg, k, w, &p)) rc = cli_fail("plan");
    if (!rc && json) {
        json_t *j = plan_json(c, cfg, k, &p);
        if (j && found) json_object_set(j, "search", found);
        char *text = j ? json_dumps(j, JSON_INDENT(1) | JSON_REAL_PRECISION(10)) : NULL;
        if (text) printf("%s\n", text);
        else rc = cli_fail("plan");
        free(text);
        json_decref(j);
    } else if (!rc) {
        print_plan(c, cfg, k, &p);
    }
    json_decref(found);
    return rc;
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL, *cluster = "h100-sxm";
    bool json = false, search = false, full = false;
    double prompt_len = 0, response_len = 0;
    long long gen_tp = 1;
    int spread = TRILL_SPREAD_UNIFORM;
    static const char *const spreads[] = { "fixed", "uniform", "exponential", NULL };
    const cli_opt opts[] = {
        { "model", CLI_STR, "DIR|PRESET", "a model folder (config.json is enough) or a preset (trill init --preset): the key model "
          "(none: the embedded demo's)", .str = &model },
        { "cluster", CLI_STR, "FILE|PROFILE[:NODES]", "a cluster file (docs/plan.md) or a shipped profile: h100-sxm, h800, h200, h20", .str = &cluster },
        { "prompt-len", CLI_DOUBLE, "N", "a prompt's mean tokens (default: data.max_prompt_tokens / 4; the demo: 6)", .d = &prompt_len, .dmin = 1, .dmax = 1e7,
          .no_default = true },
        { "response-len", CLI_DOUBLE, "N", "a response's mean tokens (default: generator.max_new_tokens / 2)", .d = &response_len, .dmin = 1,
          .dmax = 1e7, .no_default = true },
        { "spread", CLI_CHOICE, NULL, "how responses spread up to generator.max_new_tokens: all the mean, uniform on [1, 2 mean - 1], "
          "or exponential", .choice = &spread, .choices = spreads },
        { "search", CLI_FLAG, NULL, "try every layout of powers of two that fits the cluster; print the fastest for the key mode, "
          "then the plan of the best", .flag = &search },
        { "full", CLI_FLAG, NULL, "plan full fine-tuning (every weight trained, as other RL frameworks do) instead of trill train's "
          "adapters", .flag = &full },
        { "gen-tp", CLI_INT, "N", "plan generators of N tensor-parallel devices each (parallel.generator.ep x N a replica), as vLLM "
          "and SGLang split them, to compare with other frameworks: trill's generator has no tensor parallelism", .i = &gen_tp, .min = 1,
          .max = 1 << 16 },
        { "json", CLI_FLAG, NULL, "print the plan as one JSON object", .flag = &json },
    };
    const cli_spec spec = { "plan", "[CONFIG.yaml] [section.key=value ...]",
                            "What an RL run needs before it starts, from trill train's config keys (trainer.lora.*, trainer.micro_batch_tokens,\n"
                            "trainer.recompute, generator.dtype, data.max_prompt_tokens, generator.max_new_tokens, parallel.*): parameters\n"
                            "total, active and LoRA-trainable by module, counted from the model's tensor table; each trainer device's\n"
                            "bytes (frozen base, adapters, gradients, AdamW, activations, logits) and each generator device's (weights, a\n"
                            "10% reserve, the KV cache the rest holds, in tokens); the bytes and seconds of a weight sync, adapter\n"
                            "against merge; a step's seconds of generation, training and sync by a roofline with the cluster's\n"
                            "efficiencies, sync against async. This machine's cluster file: bench/cluster_profile.sh. The\n"
                            "equations and their assumptions: docs/plan.md.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    trill_run_config cfg;
    rc = cli_run_config(&spec, argc, argv, first, NULL, &cfg);
    if (rc) return rc;
    if (model) {
        free(cfg.model);
        cfg.model = strdup(model);
    }
    /* no model: the embedded demo's, as trill train runs it (prompts of at most 6 tokens) */
    const bool demo = !cfg.model || !cfg.model[0];
    if (demo) {
        free(cfg.model);
        cfg.model = strdup("the embedded demo");
    }
    const trill_plan_workload w = { .prompt_len = prompt_len > 0 ? prompt_len : demo ? 6 : cfg.data.max_prompt_tokens / 4.0,
                                    .response_len = response_len > 0 ? response_len : cfg.generator.max_new_tokens / 2.0,
                                    .spread = (trill_plan_spread)spread, .full = full, .gen_tp = (int)gen_tp };
    trill_config c;
    trill_cluster k;
    if ((demo ? trill_demo_config(&c) : load_model_config(cfg.model, &c)) || trill_cluster_load(cluster, &k)) rc = cli_fail("plan");
    else rc = plan_and_print(&c, &cfg, &k, &w, search, json);
    trill_run_config_free(&cfg);
    return rc;
}
