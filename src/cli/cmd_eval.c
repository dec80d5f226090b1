/* trill eval: pass@1 and pass@k of a model (optionally with a LoRA adapter) on a JSONL set. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/dataset.h"
#include "trill/infer.h"
#include "trill/eval.h"
#include "trill/run_config.h"

int cmd_eval(int argc, char **argv) {
    enum { MAX_STOPS = 16 };
    static const char *const VERIFIERS[] = { "numeric", "exact", "demo", NULL };
    static const trill_verifier VERIFIER_OF[] = { TRILL_VERIFIER_NUMERIC, TRILL_VERIFIER_EXACT, TRILL_VERIFIER_DEMO };
    static const char *const DTYPES[] = { "bf16", "int8", "f32", NULL };
    const char *model_dir = NULL, *data = NULL, *adapter = NULL, *stops[MAX_STOPS];
    const char *prompt_field = "prompt", *answer_field = "answer", *template_ = "{prompt}";
    long long k = 4, limit = 0, max_new = 256, seed = 0;
    double temperature = 1;
    int verifier = 0, dtype = 0, n_stops = 0;
    const cli_opt opts[] = {
        { "model", CLI_STR, "DIR", "the model folder", .str = &model_dir, .required = true },
        { "data", CLI_STR, "FILE.jsonl", "the held-out set: one JSON object a line", .str = &data, .required = true },
        { "adapter", CLI_STR, "DIR", "a PEFT LoRA adapter to evaluate with", .str = &adapter },
        { "k", CLI_INT, "K", "samples per prompt", .i = &k, .min = 1, .max = 1 << 16 },
        { "temperature", CLI_DOUBLE, "T", "sampling temperature", .d = &temperature, .dmin = 0, .dmax = 100 },
        { "verifier", CLI_CHOICE, NULL, "how a sample is scored against the answer field", .choice = &verifier, .choices = VERIFIERS },
        { "limit", CLI_INT, "N", "prompts evaluated (0: every line)", .i = &limit, .min = 0, .max = 1 << 30 },
        { "max-new-tokens", CLI_INT, "N", "tokens generated at most per sample", .i = &max_new, .min = 1, .max = 1 << 20 },
        { "prompt-field", CLI_STR, "F", "the prompt's field", .str = &prompt_field },
        { "answer-field", CLI_STR, "F", "the answer's field", .str = &answer_field },
        { "template", CLI_STR, "TEXT|chat", "the prompt's template ({field} substituted), or the model's chat template", .str = &template_ },
        { "stop", CLI_LIST, "TEXT", "a stop text (repeatable)", .str = stops, .count = &n_stops, .max = MAX_STOPS },
        { "dtype", CLI_CHOICE, NULL, "the generator's weight format", .choice = &dtype, .choices = DTYPES },
        { "seed", CLI_INT, "S", "sampling seed", .i = &seed, .min = 0, .max = (long long)1 << 62 },
    };
    const cli_spec spec = { "eval", NULL,
                            "Samples K completions per prompt with the generator engine and scores them with the verifier against the\n"
                            "answer field: pass@1 is the mean fraction of correct samples, pass@K the fraction of prompts with one.\n"
                            "Prints one JSON object.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    trill_dataset_options dopt = { .prompt_field = prompt_field, .answer_field = answer_field, .template_ = template_, .max_prompt_tokens = 1 << 20 };
    trill_eval_options eo = { .k = (int)k, .temperature = temperature, .verifier = VERIFIER_OF[verifier], .max_new_tokens = (int)max_new,
                              .limit = (int)limit, .seed = (uint64_t)seed };
    trill_engine_config ec = trill_engine_config_default();
    if (trill_gen_format_parse(DTYPES[dtype], &ec.format)) return cli_fail("eval");

    eo.stops = stops;
    eo.n_stops = n_stops;
    trill_eval_result res;
    trill_status st = trill_rl_evaluate_model(model_dir, adapter, data, &dopt, &ec, &eo, &res);
    if (!st)
        printf("{\"prompts\": %d, \"k\": %d, \"pass@1\": %.6f, \"pass@%d\": %.6f, \"mean_generated_tokens\": %.2f, \"seconds\": %.3f}\n",
               res.prompts, res.k, res.pass1, res.k, res.passk, res.mean_len, res.seconds);
    return st ? cli_fail("eval") : 0;
}
