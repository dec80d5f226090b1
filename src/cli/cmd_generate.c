/* trill generate: the generator engine (trill/infer.h) from the command line. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trill/infer.h"
#include "base/json.h"
#include "trill/model.h"
#include "trill/timing.h"
#include "trill/tokenizer.h"

static const char USAGE[] =
    "trill generate --model DIR [--adapter DIR] (--prompt TEXT | --prompts FILE.jsonl) [--n N] [--max-new-tokens N]\n"
    "               [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--stop TEXT]...\n"
    "               [--dtype bf16|int8|f32] [--capture-experts] [--json] [--kv-cache-mb MB] [--max-batch-tokens N]\n"
    "               [--eplb] [--eplb-redundant N] [--eplb-workers N] [--eplb-window STEPS] [--eplb-interval STEPS]\n"
    "  Generates N samples per prompt with the batched engine. --prompts reads one {\"prompt\": ...} per line.\n"
    "  --adapter applies a PEFT LoRA adapter (a trill checkpoint's, or trill serve's saved weights) beside the weights.\n"
    "  Plain output prints each completion; --json prints one object per sample: request, sample,\n"
    "  prompt_tokens, tokens (generated), text, logprobs, versions, finish, and with --capture-experts\n"
    "  experts ([token][moe_layer][k] logical ids of every forwarded token).\n"
    "  Defaults: N 1, 64 new tokens, temperature 1 (0 = greedy), top-k 0 (off), top-p 1, min-p 0, seed 0,\n"
    "  dtype bf16, KV cache 256 MB, 512 tokens per step. Stops at the model's eos_token_id and at --stop texts.\n"
    "  --eplb balances the experts over workers (DeepSeek EPLB; the output is the same): --eplb-redundant extra\n"
    "  slots per MoE layer (default one per worker), --eplb-workers (default the thread count), re-planned every\n"
    "  --eplb-interval steps (16) from the last --eplb-window steps of routed load (64).";

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
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' },        { "prompt", required_argument, 0, 'p' },
        { "prompts", required_argument, 0, 'f' },      { "n", required_argument, 0, 'N' },
        { "max-new-tokens", required_argument, 0, 'n' }, { "temperature", required_argument, 0, 't' },
        { "top-p", required_argument, 0, 'P' },        { "top-k", required_argument, 0, 'k' },
        { "min-p", required_argument, 0, 'M' },        { "seed", required_argument, 0, 's' },
        { "stop", required_argument, 0, 'S' },         { "dtype", required_argument, 0, 'd' },
        { "capture-experts", no_argument, 0, 'c' },    { "json", no_argument, 0, 'j' },
        { "kv-cache-mb", required_argument, 0, 'K' },  { "max-batch-tokens", required_argument, 0, 'B' },
        { "eplb", no_argument, 0, 'E' },               { "eplb-redundant", required_argument, 0, 'R' },
        { "eplb-workers", required_argument, 0, 'W' }, { "eplb-window", required_argument, 0, 'w' },
        { "eplb-interval", required_argument, 0, 'I' }, { "adapter", required_argument, 0, 'a' },
        { "help", no_argument, 0, 'h' },               { 0, 0, 0, 0 },
    };
    *g = (gen_args){ .max_new = 64, .n_samples = 1, .temperature = 1, .top_p = 1, .cfg = trill_engine_config_default() };
    long long kv_mb = 256, batch_tokens = 512, eplb_redundant = -1, eplb_workers = 0, eplb_window = 64, eplb_interval = 16;
    trill_engine_config *cfg = &g->cfg;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': g->dir = optarg; break;
        case 'a': g->adapter = optarg; break;
        case 'p': g->prompt = optarg; break;
        case 'f': g->prompts_path = optarg; break;
        case 'N': bad = cli_parse_int("generate", USAGE, "--n", optarg, 1, 1 << 16, &g->n_samples); break;
        case 'n': bad = cli_parse_int("generate", USAGE, "--max-new-tokens", optarg, 1, 1 << 20, &g->max_new); break;
        case 't': bad = cli_parse_double("generate", USAGE, "--temperature", optarg, 0, 100, &g->temperature); break;
        case 'P': bad = cli_parse_double("generate", USAGE, "--top-p", optarg, 1e-9, 1, &g->top_p); break;
        case 'k': bad = cli_parse_int("generate", USAGE, "--top-k", optarg, 0, 1 << 24, &g->top_k); break;
        case 'M': bad = cli_parse_double("generate", USAGE, "--min-p", optarg, 0, 0.999999, &g->min_p); break;
        case 's': bad = cli_parse_int("generate", USAGE, "--seed", optarg, 0, (long long)1 << 62, &g->seed); break;
        case 'S':
            if (g->n_stops == MAX_STOPS) return cli_usage_error("generate", USAGE, "--stop: at most %d stop texts", MAX_STOPS);
            if (!*optarg) return cli_usage_error("generate", USAGE, "--stop: expected a non-empty text");
            g->stops[g->n_stops++] = optarg;
            break;
        case 'd':
            if (trill_gen_format_parse(optarg, &cfg->format))
                return cli_usage_error("generate", USAGE, "--dtype: expected bf16, int8 or f32, got \"%s\"", optarg);
            break;
        case 'c': cfg->capture_experts = true; break;
        case 'j': g->as_json = true; break;
        case 'K': bad = cli_parse_int("generate", USAGE, "--kv-cache-mb", optarg, 1, 1 << 24, &kv_mb); break;
        case 'B': bad = cli_parse_int("generate", USAGE, "--max-batch-tokens", optarg, 1, 1 << 20, &batch_tokens); break;
        case 'E': cfg->eplb = true; break;
        case 'R': bad = cli_parse_int("generate", USAGE, "--eplb-redundant", optarg, -1, 65535, &eplb_redundant); break;
        case 'W': bad = cli_parse_int("generate", USAGE, "--eplb-workers", optarg, 0, 4096, &eplb_workers); break;
        case 'w': bad = cli_parse_int("generate", USAGE, "--eplb-window", optarg, 1, 1 << 20, &eplb_window); break;
        case 'I': bad = cli_parse_int("generate", USAGE, "--eplb-interval", optarg, 1, 1 << 20, &eplb_interval); break;
        case 'h': printf("usage: %s\n", USAGE); return 0;
        default: return cli_usage_error("generate", USAGE, "invalid option %s", argv[optind - 1]);
        }
        if (bad) return EXIT_USAGE;
    }
    if (optind < argc) return cli_usage_error("generate", USAGE, "unexpected argument \"%s\"", argv[optind]);
    if (!g->dir || !g->prompt == !g->prompts_path)
        return cli_usage_error("generate", USAGE, "--model DIR and one of --prompt TEXT or --prompts FILE are required");
    cfg->kv_cache_mb = (size_t)kv_mb;
    cfg->max_batch_tokens = (int)batch_tokens;
    cfg->eplb_redundant = (int)eplb_redundant;
    cfg->eplb_workers = (int)eplb_workers;
    cfg->eplb_window = (int)eplb_window;
    cfg->eplb_interval = (int)eplb_interval;
    return -1;
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
    for (int i = 0; !st && i < n_prompts; i++) {
        int *ids = NULL;
        size_t n = 0;
        if ((st = trill_tokenizer_encode(tok, texts[i], strlen(texts[i]), false, &ids, &n))) break;
        if (n == 0) st = trill_error(TRILL_ERR_INVALID, "prompt %d encodes to no tokens", i);
        trill_request r = { .id = (uint64_t)i, .prompt = ids, .prompt_len = (int)n, .n = (int)g.n_samples, .max_new_tokens = (int)g.max_new,
                            .stop_ids = mc->eos_token_ids, .n_stop_ids = mc->n_eos, .stop_strings = g.stops, .n_stop_strings = g.n_stops };
        r.sampling = trill_sampling_default();
        r.sampling.temperature = (float)g.temperature;
        r.sampling.top_k = (int)g.top_k;
        r.sampling.top_p = (float)g.top_p;
        r.sampling.min_p = (float)g.min_p;
        r.sampling.seed = (uint64_t)g.seed;
        if (!st) st = trill_engine_submit(e, &r);
        free(ids);
    }
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
