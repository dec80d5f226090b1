/* Held-out evaluation (`trill eval`, and a run's evaluations) and the built-in verifiers. */
#ifndef TRILL_EVAL_H
#define TRILL_EVAL_H

#include "trill/run_config.h"
#include "trill/tokenizer.h"

/* ---- held-out evaluation (also `trill eval`) ---- */
struct trill_dataset;
typedef struct trill_eval_options {
    int limit;                 /* prompts (0: all) */
    int k;                     /* samples per prompt */
    double temperature;
    int max_new_tokens;
    trill_verifier verifier;   /* a sample is correct when the verifier scores it >= 0.5 */
    uint64_t seed;
    const int *stop_ids;
    int n_stop_ids;
    const char *const *stops;
    int n_stops;
} trill_eval_options;

typedef struct trill_eval_result {
    int prompts, k;
    double pass1;              /* mean over prompts of the fraction of correct samples */
    double passk;              /* fraction of prompts with at least one correct sample */
    double mean_len;           /* generated tokens per sample */
    double seconds;
} trill_eval_result;

trill_status trill_rl_evaluate(trill_engine *e, const trill_tokenizer *tok, const struct trill_dataset *d,
                               const trill_eval_options *o, trill_eval_result *out);

/* trill_rl_evaluate on a model folder (matrices kept in the checkpoint's dtype), optionally with
 * a PEFT adapter (NULL: none), on a JSONL file read with data_opt (its chat template is loaded
 * when data_opt->template_ is "chat"); the model's eos ids stop generation besides o->stops. */
struct trill_dataset_options;
trill_status trill_rl_evaluate_model(const char *model_dir, const char *adapter_dir, const char *data_path,
                                     const struct trill_dataset_options *data_opt, const trill_engine_config *engine,
                                     const trill_eval_options *o, trill_eval_result *out);

/* The built-in verifier's score of a completion (trill/reward.h); NAN for TRILL_VERIFIER_NONE. */
double trill_verify(trill_verifier v, const char *completion, const char *truth);
const char *trill_verifier_name(trill_verifier v);

#endif
