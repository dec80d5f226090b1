/* trill generate: the generator engine (trill/infer.h) from the command line. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/infer.h"
#include "base/json.h"
#include "trill/model.h"
#include "trill/timing.h"
#include "trill/tokenizer.h"

enum { MAX_STOPS = 16 };

/* The prompts: one from --prompt, or the "prompt" field of each line of a JSONL file. */
static trill_status read_prompts(const char *text, const char *path, char ***out, int *n) {
    *n = 0;
    if (text) {
        *out = malloc(sizeof(char *));
        if (!*out || !((*out)[0] = strdup(text))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        *n = 1;
        return TRILL_OK;
    }
    FILE *f = fopen(path, "r");
    if (!f) return trill_error(TRILL_ERR_IO, "%s: cannot open", path);
    char *line = NULL;
    size_t cap = 0;
    int line_no = 0, have = 0;
    trill_status st = TRILL_OK;
    *out = NULL;
    while (!st && getline(&line, &cap, f) > 0) {
        line_no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        json_error_t jerr;
        json_t *j = json_loads(line, 0, &jerr);
        const char *p = j ? json_string_value(json_object_get(j, "prompt")) : NULL;
        if (!j) st = trill_error(TRILL_ERR_INVALID, "%s:%d: not JSON (%s)", path, line_no, jerr.text);
        else if (!p) st = trill_error(TRILL_ERR_INVALID, "%s:%d: expected a string field \"prompt\"", path, line_no);
        else {
            char **grown = *n + 1 > have ? realloc(*out, sizeof(char *) * (size_t)(have = have ? 2 * have : 16)) : *out;
            if (!grown || !(grown[*n] = strdup(p))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
            if (grown) *out = grown;
            if (!st) (*n)++;
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    if (!st && *n == 0) st = trill_error(TRILL_ERR_INVALID, "%s: no prompts", path);
    return st;
}

static json_t *json_ints(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static const char *finish_name(trill_finish f) {
    return f == TRILL_FINISH_STOP_ID ? "stop_id" : f == TRILL_FINISH_STOP_STRING ? "stop_string" : f == TRILL_FINISH_ABORTED ? "aborted" : "length";
}

static trill_status print_sequence(const trill_sequence_out *s, const trill_tokenizer *tok, const trill_config *c, bool as_json,
                                   int n_samples) {
    char *text = NULL;
    size_t len = 0;
    trill_status st = trill_tokenizer_decode_lenient(tok, s->tokens + s->n_prompt, s->n_generated, &text, &len);
    if (st) return st;
    if (!as_json) {
        if (n_samples > 1) printf("--- prompt %llu, sample %d ---\n", (unsigned long long)s->request, s->sample);
        fwrite(text, 1, len, stdout);
        putchar('\n');
        free(text);
        return TRILL_OK;
    }
    json_t *o = json_object(), *lp = json_array(), *ver = json_array();
    for (int i = 0; i < s->n_generated; i++) {
        json_array_append_new(lp, json_real(s->logprobs[i]));
        json_array_append_new(ver, json_integer(s->versions[i]));
    }
    json_object_set_new(o, "request", json_integer((json_int_t)s->request));
    json_object_set_new(o, "sample", json_integer(s->sample));
    json_object_set_new(o, "prompt_tokens", json_ints(s->tokens, s->n_prompt));
    json_object_set_new(o, "tokens", json_ints(s->tokens + s->n_prompt, s->n_generated));
    json_object_set_new(o, "text", json_stringn(text, len));
    json_object_set_new(o, "logprobs", lp);
    json_object_set_new(o, "versions", ver);
    json_object_set_new(o, "finish", json_string(finish_name(s->finish)));
    if (s->experts) {
        const int L = c->n_moe_layers, K = c->num_experts_per_tok, rows = s->n_prompt + s->n_generated - 1;
        json_t *ex = json_array();
        for (int t = 0; t < rows; t++) {
            json_t *tok_rows = json_array();
            for (int l = 0; l < L; l++) {
                json_t *ids = json_array();
                for (int k = 0; k < K; k++) json_array_append_new(ids, json_integer(s->experts[((size_t)t * L + l) * K + k]));
                json_array_append_new(tok_rows, ids);
            }
            json_array_append_new(ex, tok_rows);
        }
        json_object_set_new(o, "experts", ex);
    }
    char *line = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    free(text);
    if (!line) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    puts(line);
    free(line);
    return TRILL_OK;
}

/* The command line. */
typedef struct gen_args {
    const char *dir, *adapter, *prompt, *prompts_path, *stops[MAX_STOPS];
    long long max_new, top_k, seed, n_samples;
    double temperature, top_p, min_p;
    int n_stops;
    bool as_json;
    trill_engine_config cfg;
} gen_args;

/* -1 when the arguments are good, else the exit status (0 after --help). */
static int parse_args(int argc, char **argv, gen_args *g) {
    static const char *const DTYPES[] = { "bf16", "int8", "f32", NULL };
    *g = (gen_args){ .max_new = 64, .n_samples = 1, .temperature = 1, .top_p = 1, .cfg = trill_engine_config_default() };
    long long kv_mb = 256, batch_tokens = 512, eplb_redundant = -1, eplb_workers = 0, eplb_window = 64, eplb_interval = 16;
    int dtype = 0;
    trill_engine_config *cfg = &g->cfg;
    const cli_opt opts[] = {
        { "model", CLI_STR, "DIR", "the model folder", .str = &g->dir, .required = true },
        { "adapter", CLI_STR, "DIR", "a PEFT LoRA adapter (a trill checkpoint's, or trill serve's saved weights)", .str = &g->adapter },
        { "prompt", CLI_STR, "TEXT", "one prompt (or --prompts)", .str = &g->prompt },
        { "prompts", CLI_STR, "FILE.jsonl", "one {\"prompt\": ...} a line (or --prompt)", .str = &g->prompts_path },
        { "n", CLI_INT, "N", "samples per prompt", .i = &g->n_samples, .min = 1, .max = 1 << 16 },
        { "max-new-tokens", CLI_INT, "N", "tokens generated at most per sample", .i = &g->max_new, .min = 1, .max = 1 << 20 },
        { "temperature", CLI_DOUBLE, "T", "sampling temperature (0: greedy)", .d = &g->temperature, .dmin = 0, .dmax = 100 },
        { "top-k", CLI_INT, "K", "keep the K most likely tokens (0: off)", .i = &g->top_k, .min = 0, .max = 1 << 24 },
        { "top-p", CLI_DOUBLE, "P", "nucleus sampling", .d = &g->top_p, .dmin = 1e-9, .dmax = 1 },
        { "min-p", CLI_DOUBLE, "P", "drop tokens below P times the most likely one's probability", .d = &g->min_p, .dmin = 0, .dmax = 0.999999 },
        { "seed", CLI_INT, "S", "sampling seed", .i = &g->seed, .min = 0, .max = (long long)1 << 62 },
        { "stop", CLI_LIST, "TEXT", "a stop text (repeatable; the model's eos_token_id always stops)", .str = g->stops, .count = &g->n_stops,
          .max = MAX_STOPS },
        { "dtype", CLI_CHOICE, NULL, "the weight format", .choice = &dtype, .choices = DTYPES },
        { "capture-experts", CLI_FLAG, NULL, "record every forwarded token's routed experts (--json prints them)", .flag = &cfg->capture_experts },
        { "json", CLI_FLAG, NULL, "one JSON object per sample instead of the completions", .flag = &g->as_json },
        { "kv-cache-mb", CLI_INT, "MB", "the KV cache's size", .i = &kv_mb, .min = 1, .max = 1 << 24 },
        { "max-batch-tokens", CLI_INT, "N", "tokens forwarded per engine step at most", .i = &batch_tokens, .min = 1, .max = 1 << 20 },
        { "eplb", CLI_FLAG, NULL, "balance the experts over workers (DeepSeek EPLB; the output is the same)", .flag = &cfg->eplb },
        { "eplb-redundant", CLI_INT, "N", "extra expert slots per MoE layer (-1: one per worker)", .i = &eplb_redundant, .min = -1, .max = 65535 },
        { "eplb-workers", CLI_INT, "N", "EPLB's workers (0: the thread count)", .i = &eplb_workers, .min = 0, .max = 4096 },
        { "eplb-window", CLI_INT, "STEPS", "the steps of routed load a plan is made from", .i = &eplb_window, .min = 1, .max = 1 << 20 },
        { "eplb-interval", CLI_INT, "STEPS", "steps between plans", .i = &eplb_interval, .min = 1, .max = 1 << 20 },
    };
    const cli_spec spec = { "generate", NULL,
                            "Generates N samples per prompt with the batched engine. Plain output prints each completion;\n"
                            "--json prints one object per sample: request, sample, prompt_tokens, tokens (generated), text,\n"
                            "logprobs, versions, finish, and with --capture-experts experts ([token][moe_layer][k] logical\n"
                            "ids of every forwarded token).",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if (!g->prompt == !g->prompts_path) return cli_spec_error(&spec, "one of --prompt TEXT or --prompts FILE is required");
    for (int i = 0; i < g->n_stops; i++)
        if (!*g->stops[i]) return cli_spec_error(&spec, "--stop: expected a non-empty text");
    if (trill_gen_format_parse(DTYPES[dtype], &cfg->format)) return cli_fail("generate");
    cfg->kv_cache_mb = (size_t)kv_mb;
    cfg->max_batch_tokens = (int)batch_tokens;
    cfg->eplb_redundant = (int)eplb_redundant;
    cfg->eplb_workers = (int)eplb_workers;
    cfg->eplb_window = (int)eplb_window;
    cfg->eplb_interval = (int)eplb_interval;
    return -1;
}

/* Every prompt to the engine, with the samples and sampling the options ask for. */
static trill_status submit_prompts(trill_engine *e, const trill_tokenizer *tok, const trill_config *mc, const char *const *texts, int n_prompts,
                                   const gen_args *g) {
    trill_status st = TRILL_OK;
    for (int i = 0; !st && i < n_prompts; i++) {
        int *ids = NULL;
        size_t n = 0;
        if ((st = trill_tokenizer_encode(tok, texts[i], strlen(texts[i]), false, &ids, &n))) break;
        if (n == 0) st = trill_error(TRILL_ERR_INVALID, "prompt %d encodes to no tokens", i);
        trill_request r = { .id = (uint64_t)i, .prompt = ids, .prompt_len = (int)n, .n = (int)g->n_samples, .max_new_tokens = (int)g->max_new,
                            .stop_ids = mc->eos_token_ids, .n_stop_ids = mc->n_eos, .stop_strings = g->stops, .n_stop_strings = g->n_stops };
        r.sampling = trill_sampling_default();
        r.sampling.temperature = (float)g->temperature;
        r.sampling.top_k = (int)g->top_k;
        r.sampling.top_p = (float)g->top_p;
        r.sampling.min_p = (float)g->min_p;
        r.sampling.seed = (uint64_t)g->seed;
        if (!st) st = trill_engine_submit(e, &r);
        free(ids);
    }
    return st;
}

int cmd_generate(int argc, char **argv) {
    gen_args g;
    const int rc = parse_args(argc, argv, &g);
    if (rc >= 0) return rc;

    trill_model *m = NULL;
    trill_tokenizer *tok = NULL;
    trill_engine *e = NULL;
    char **texts = NULL;
    int n_prompts = 0;
    trill_status st = read_prompts(g.prompt, g.prompts_path, &texts, &n_prompts);
    if (!st) st = trill_model_load_as(g.dir, TRILL_STORE_CHECKPOINT, &m);
    if (!st) st = trill_tokenizer_load(g.dir, &tok);
    g.cfg.tokenizer = tok;
    const double t_load = trill_now();
    if (!st) st = trill_engine_create(m, &g.cfg, &e);
    if (!st && g.adapter) {
        trill_lora *lora = NULL;
        st = trill_lora_load(m, g.adapter, &lora);
        if (!st) st = trill_engine_update_adapter(e, lora, 0, NULL);
        trill_lora_free(lora);
    }
    if (!st)
        fprintf(stderr, "trill generate: %s weights %.1f MB (converted in %.2f s), KV cache %.1f MB\n", trill_gen_format_name(g.cfg.format),
                trill_engine_weight_bytes(e) / 1e6, trill_now() - t_load, trill_engine_kv_bytes(e) / 1e6);
    const trill_config *mc = m ? trill_model_config(m) : NULL;
    int total_tokens = 0;
    if (!st) st = submit_prompts(e, tok, mc, (const char *const *)texts, n_prompts, &g);
    const double t0 = trill_now();
    int steps = 0, generated = 0;
    while (!st && trill_engine_busy(e)) {
        trill_step_stats ss;
        if ((st = trill_engine_step(e, &ss))) break;
        steps++;
        total_tokens += ss.rows;
        trill_sequence_out out[64];
        int got;
        while (!st && (got = trill_engine_collect(e, out, 64)) > 0)
            for (int i = 0; i < got; i++) {
                generated += out[i].n_generated;
                if (!st) st = print_sequence(&out[i], tok, mc, g.as_json, (int)g.n_samples);
                trill_sequence_out_free(&out[i]);
            }
        fflush(stdout);
    }
    const double dt = trill_now() - t0;
    if (!st)
        fprintf(stderr, "trill generate: %d prompts x %lld samples: %d tokens generated, %d forwarded in %d steps, %.2f s (%.1f generated tokens/s)\n",
                n_prompts, g.n_samples, generated, total_tokens, steps, dt, dt > 0 ? generated / dt : 0.0);
    for (int i = 0; i < n_prompts; i++) free(texts[i]);
    free(texts);
    trill_engine_free(e);
    trill_tokenizer_free(tok);
    trill_model_free(m);
    return st ? cli_fail("generate") : 0;
}
