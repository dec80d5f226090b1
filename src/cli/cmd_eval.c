/* trill eval: pass@1 and pass@k of a model (optionally with a LoRA adapter) on a JSONL set. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trill/dataset.h"
#include "trill/infer.h"
#include "trill/eval.h"
#include "trill/rl_config.h"

static const char USAGE[] =
    "trill eval --model DIR --data FILE.jsonl [--adapter DIR] [--k K] [--temperature T] [--verifier numeric|exact|demo]\n"
    "           [--limit N] [--max-new-tokens N] [--prompt-field F] [--answer-field F] [--template TEXT|chat]\n"
    "           [--stop TEXT]... [--dtype bf16|int8|f32] [--seed S]\n"
    "  Samples K completions per prompt with the generator engine and scores them with the verifier against the\n"
    "  answer field: pass@1 is the mean fraction of correct samples, pass@K the fraction of prompts with one.\n"
    "  Defaults: K 4, temperature 1, verifier numeric, all lines, 256 new tokens, fields prompt/answer,\n"
    "  template {prompt}, dtype bf16, seed 0. Prints one JSON object.";

int cmd_eval(int argc, char **argv) {
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' },  { "data", required_argument, 0, 'd' },      { "adapter", required_argument, 0, 'a' },
        { "k", required_argument, 0, 'k' },      { "temperature", required_argument, 0, 't' }, { "verifier", required_argument, 0, 'v' },
        { "limit", required_argument, 0, 'l' },  { "max-new-tokens", required_argument, 0, 'n' },
        { "prompt-field", required_argument, 0, 'P' }, { "answer-field", required_argument, 0, 'A' },
        { "template", required_argument, 0, 'T' }, { "stop", required_argument, 0, 'S' }, { "dtype", required_argument, 0, 'D' },
        { "seed", required_argument, 0, 's' },   { "help", no_argument, 0, 'h' },            { 0, 0, 0, 0 },
    };
    enum { MAX_STOPS = 16 };
    const char *model_dir = NULL, *data = NULL, *adapter = NULL, *stops[MAX_STOPS];
    trill_dataset_options dopt = { .prompt_field = "prompt", .answer_field = "answer", .template_ = "{prompt}", .max_prompt_tokens = 1 << 20 };
    trill_eval_options eo = { .k = 4, .temperature = 1, .verifier = TRILL_VERIFIER_NUMERIC, .max_new_tokens = 256 };
    trill_engine_config ec = trill_engine_config_default();
    long long v;
    double d;
    int c, n_stops = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': model_dir = optarg; break;
        case 'd': data = optarg; break;
        case 'a': adapter = optarg; break;
        case 'k': if (!(bad = cli_parse_int("eval", USAGE, "--k", optarg, 1, 1 << 16, &v))) eo.k = (int)v; break;
        case 't': if (!(bad = cli_parse_double("eval", USAGE, "--temperature", optarg, 0, 100, &d))) eo.temperature = d; break;
        case 'l': if (!(bad = cli_parse_int("eval", USAGE, "--limit", optarg, 0, 1 << 30, &v))) eo.limit = (int)v; break;
        case 'n': if (!(bad = cli_parse_int("eval", USAGE, "--max-new-tokens", optarg, 1, 1 << 20, &v))) eo.max_new_tokens = (int)v; break;
        case 's': if (!(bad = cli_parse_int("eval", USAGE, "--seed", optarg, 0, (long long)1 << 62, &v))) eo.seed = (uint64_t)v; break;
        case 'P': dopt.prompt_field = optarg; break;
        case 'A': dopt.answer_field = optarg; break;
        case 'T': dopt.template_ = optarg; break;
        case 'v':
            if (!strcmp(optarg, "numeric")) eo.verifier = TRILL_VERIFIER_NUMERIC;
            else if (!strcmp(optarg, "exact")) eo.verifier = TRILL_VERIFIER_EXACT;
            else if (!strcmp(optarg, "demo")) eo.verifier = TRILL_VERIFIER_DEMO;
            else return cli_usage_error("eval", USAGE, "--verifier: expected numeric, exact or demo, got \"%s\"", optarg);
            break;
        case 'S':
            if (n_stops == MAX_STOPS) return cli_usage_error("eval", USAGE, "--stop: at most %d stop texts", MAX_STOPS);
            stops[n_stops++] = optarg;
            break;
        case 'D':
            if (trill_gen_format_parse(optarg, &ec.format))
                return cli_usage_error("eval", USAGE, "--dtype: expected bf16, int8 or f32, got \"%s\"", optarg);
            break;
        case 'h': printf("usage: %s\n", USAGE); return 0;
        default: return cli_usage_error("eval", USAGE, "invalid option %s", argv[optind - 1]);
        }
        if (bad) return EXIT_USAGE;
    }
    if (optind < argc) return cli_usage_error("eval", USAGE, "unexpected argument \"%s\"", argv[optind]);
    if (!model_dir || !data) return cli_usage_error("eval", USAGE, "--model and --data are required");

    eo.stops = stops;
    eo.n_stops = n_stops;
    trill_eval_result res;
    trill_status st = trill_rl_evaluate_model(model_dir, adapter, data, &dopt, &ec, &eo, &res);
    if (!st)
        printf("{\"prompts\": %d, \"k\": %d, \"pass@1\": %.6f, \"pass@%d\": %.6f, \"mean_generated_tokens\": %.2f, \"seconds\": %.3f}\n",
               res.prompts, res.k, res.pass1, res.k, res.passk, res.mean_len, res.seconds);
    return st ? cli_fail("eval") : 0;
}
