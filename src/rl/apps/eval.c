#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rl/apps/eval_internal.h"
#include "rl/data/rollout.h"
#include "base/alloc.h"
#include "trill/chat.h"
#include "trill/dataset.h"
#include "model/lora_internal.h"
#include "trill/lora.h"
#include "trill/reward.h"
#include "trill/eval.h"
#include "trill/run_config.h"
#include "trill/timing.h"

double trill_verify(trill_verifier v, const char *completion, const char *truth) {
    switch (v) {
    case TRILL_VERIFIER_EXACT: return trill_reward_exact(completion, truth);
    case TRILL_VERIFIER_NUMERIC: return trill_reward_numeric(completion, truth);
    case TRILL_VERIFIER_DEMO: return trill_reward_demo(completion, truth);
    case TRILL_VERIFIER_NONE: break;
    }
    return NAN;
}

const char *trill_verifier_name(trill_verifier v) {
    static const char *const names[] = { "none", "exact", "numeric", "demo" };
    return names[v];
}

trill_status trill_rl_evaluate(trill_engine *e, const trill_tokenizer *tok, const trill_dataset *d, const trill_eval_options *o,
                               trill_eval_result *out) {
    if (o->verifier == TRILL_VERIFIER_NONE)
        return trill_error(TRILL_ERR_INVALID, "evaluation needs a verifier (reward.verifier: exact, numeric or demo)");
    const double t0 = trill_now();
    const int n = o->limit > 0 && o->limit < d->n ? o->limit : d->n;
    int *examples = trill_malloc(sizeof(int) * (size_t)n);
    uint64_t *ids = trill_malloc(sizeof(uint64_t) * (size_t)n);
    if (!examples || !ids) {
        free(examples);
        free(ids);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) examples[i] = i, ids[i] = (uint64_t)i;
    trill_request proto = {
        .max_new_tokens = o->max_new_tokens, .stop_ids = o->stop_ids, .n_stop_ids = o->n_stop_ids,
        .stop_strings = o->stops, .n_stop_strings = o->n_stops,
    };
    proto.sampling = trill_sampling_default();
    proto.sampling.temperature = (float)o->temperature;
    proto.sampling.seed = o->seed;
    rl_batch b;
    trill_status st = trill_rl_generate(e, tok, d, examples, n, o->k, ids, &proto, 0, 0, NULL, NULL, &b);
    free(examples);
    free(ids);
    if (st) return st;
    trill_rl_eval_tally(&b, d, o, n, trill_now() - t0, out);
    trill_rl_batch_free(&b);
    return TRILL_OK;
}

void trill_rl_eval_tally(const rl_batch *b, const trill_dataset *d, const trill_eval_options *o, int n, double seconds, trill_eval_result *out) {
    double pass1 = 0, passk = 0, len = 0;
    for (int p = 0; p < n; p++) {
        int correct = 0;
        for (int j = 0; j < o->k; j++) {
            const int s = p * o->k + j;
            if (o->verifier != TRILL_VERIFIER_NONE) correct += trill_verify(o->verifier, b->completion[s], d->examples[b->example[s]].answer) >= 0.5;
            else correct += b->episodes && b->episodes[s].env_return > 0;
            len += rl_response_len(b, s);
        }
        pass1 += (double)correct / o->k;
        passk += correct > 0;
    }
    *out = (trill_eval_result){ .prompts = n, .k = o->k, .pass1 = pass1 / n, .passk = passk / n, .mean_len = len / ((double)n * o->k),
                                .seconds = seconds };
}

trill_status trill_rl_evaluate_model(const char *model_dir, const char *adapter_dir, const char *data_path,
                                     const trill_dataset_options *data_opt, const trill_engine_config *engine,
                                     const trill_eval_options *o, trill_eval_result *out) {
    trill_model *m = NULL;
    trill_lora *lora = NULL;
    trill_tokenizer *tok = NULL;
    trill_chat_template *chat = NULL;
    trill_dataset *d = NULL;
    trill_engine *e = NULL;
    trill_dataset_options dopt = *data_opt;
    trill_engine_config ec = *engine;
    trill_status st = trill_model_load_as(model_dir, TRILL_STORE_CHECKPOINT, &m);
    if (!st) st = trill_tokenizer_load(model_dir, &tok);
    if (!st && strcmp(dopt.template_, "chat") == 0) st = trill_chat_template_load(model_dir, &chat);
    dopt.chat = chat;
    if (!dopt.limit) dopt.limit = o->limit;
    if (!st) st = trill_dataset_load(data_path, tok, &dopt, &d);
    ec.tokenizer = tok;
    if (!st) st = trill_engine_create(m, &ec, &e);
    if (!st && adapter_dir) st = trill_lora_load(m, adapter_dir, &lora);
    if (!st && lora) st = trill_engine_update_adapter(e, lora, 1, NULL);
    trill_eval_options eo = *o;
    if (!st && !eo.n_stop_ids) {
        eo.stop_ids = m->config.eos_token_ids;
        eo.n_stop_ids = m->config.n_eos;
    }
    if (!st) st = trill_rl_evaluate(e, tok, d, &eo, out);
    trill_engine_free(e);
    trill_lora_free(lora);
    trill_dataset_free(d);
    trill_chat_template_free(chat);
    trill_tokenizer_free(tok);
    trill_model_free(m);
    return st;
}
