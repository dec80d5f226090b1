#include "model/lora_internal.h"
#include "trill/sft.h"
#include "base/alloc.h"

#include "trill/log.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"
#include "base/json.h"
#include "model/model_internal.h"
#include "trill/model.h"
#include "trill/rng.h"
#include "trill/timing.h"
#include "trill/tokenizer.h"
#include "trill/train.h"

trill_sft_config trill_sft_defaults(void) {
    trill_sft_config c = {
        .prompt_field = "prompt", .completion_field = "completion", .lora = true,
        .lora_config = { .rank = 8, .alpha = 16 },
        .lr = 1e-4, .min_lr = 0, .weight_decay = 0.0, .clip = 1.0, .schedule = TRILL_LR_COSINE, .warmup_steps = 0,
        .epochs = 1, .batch_tokens = 4096, .grad_accum = 1, .eval_every = 0, .max_seq_len = 4096, .seed = 0,
    };
    trill_lora_parse_targets("all-linear", &c.lora_config.targets);
    return c;
}

static trill_status parse_num(const char *key, const char *value, double min, double max, double *out) {
    char *end;
    double v = strtod(value, &end);
    if (!*value || *end || !(v >= min && v <= max))
        return trill_error(TRILL_ERR_INVALID, "%s: expected a number in [%g, %g], got \"%s\"", key, min, max, value);
    *out = v;
    return TRILL_OK;
}

trill_status trill_sft_set(trill_sft_config *c, const char *key, const char *value) {
    double v = 0;
    trill_status st = TRILL_OK;
#define NUM(name, min, max, field, type) \
    if (strcmp(key, name) == 0) { if (!(st = parse_num(key, value, min, max, &v))) c->field = (type)v; return st; }
    NUM("lr", 0, 10, lr, double)
    NUM("min_lr", 0, 10, min_lr, double)
    NUM("weight_decay", 0, 10, weight_decay, double)
    NUM("clip", 0, 1e9, clip, double)
    NUM("warmup_steps", 0, 1e9, warmup_steps, int)
    NUM("epochs", 1, 1e6, epochs, int)
    NUM("max_steps", 0, 1e9, max_steps, int)
    NUM("batch_tokens", 1, 1e8, batch_tokens, int)
    NUM("grad_accum", 1, 1e6, grad_accum, int)
    NUM("eval_every", 0, 1e9, eval_every, int)
    NUM("max_seq_len", 2, 1e7, max_seq_len, int)
    NUM("save_every", 0, 1e9, save_every, int)
    NUM("stop_after", 0, 1e9, stop_after, int)
    NUM("seed", 0, 9e15, seed, uint64_t)
    NUM("lora.rank", 1, 4096, lora_config.rank, int)
    NUM("lora.alpha", 1e-6, 1e9, lora_config.alpha, double)
#undef NUM
    bool *flag = strcmp(key, "lora.use_rslora") == 0 ? &c->lora_config.use_rslora : strcmp(key, "resume") == 0 ? &c->resume
                 : strcmp(key, "recompute") == 0 ? &c->recompute : NULL;
    if (flag) {
        if (strcmp(value, "true") && strcmp(value, "false"))
            return trill_error(TRILL_ERR_INVALID, "%s: expected true or false, got \"%s\"", key, value);
        *flag = strcmp(value, "true") == 0;
        return TRILL_OK;
    }
    if (strcmp(key, "lora.target_modules") == 0)
        return trill_lora_parse_targets(value, &c->lora_config.targets) ? TRILL_ERR_INVALID : TRILL_OK;
    if (strcmp(key, "schedule") == 0) {
        if (trill_lr_schedule_parse(value, &c->schedule))
            return trill_error(TRILL_ERR_INVALID, "schedule: expected constant, linear or cosine, got \"%s\"", value);
        return TRILL_OK;
    }
    if (strcmp(key, "prompt_field") == 0) { c->prompt_field = value; return TRILL_OK; }
    if (strcmp(key, "completion_field") == 0) { c->completion_field = value; return TRILL_OK; }
    return trill_error(TRILL_ERR_INVALID,
                       "unknown setting \"%s\" (expected lr, min_lr, weight_decay, clip, schedule, warmup_steps, epochs, max_steps, "
                       "batch_tokens, grad_accum, eval_every, max_seq_len, save_every, stop_after, resume, recompute, seed, prompt_field, completion_field, lora.rank, "
                       "lora.alpha, lora.use_rslora, lora.target_modules)", key);
}

/* ---- data ---- */

typedef struct example { int *ids; int n, n_prompt; } example;
typedef struct dataset { example *ex; int n; } dataset;

static void dataset_free(dataset *d) {
    for (int i = 0; i < d->n; i++) free(d->ex[i].ids);
    free(d->ex);
    memset(d, 0, sizeof *d);
}

/* prompt tokens, then completion tokens and the end-of-sequence token; the loss covers the latter. */
static trill_status load_data(const trill_sft_config *c, const char *path, const trill_tokenizer *tok, const trill_config *mc, dataset *out) {
    char *text;
    size_t len;
    trill_status st = trill_read_file(path, &text, &len);
    if (st) return st;
    size_t lineno = 0, cap = 0;
    for (char *line = text; !st && line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        size_t n = nl ? (size_t)(nl - line) : (size_t)(text + len - line);
        lineno++;
        char what[4200];
        snprintf(what, sizeof what, "%s:%zu", path, lineno);
        json_t *j = NULL;
        const char *prompt = NULL, *completion = NULL;
        if (strspn(line, " \t\r") < n && !(st = trill_json_parse(what, line, n, &j)) &&
            !(st = trill_json_get_string(j, c->prompt_field, what, &prompt)) &&
            !(st = trill_json_get_string(j, c->completion_field, what, &completion)) && (!prompt || !completion))
            st = trill_error(TRILL_ERR_INVALID, "%s: expected string fields \"%s\" and \"%s\"", what, c->prompt_field, c->completion_field);
        int *p_ids = NULL, *c_ids = NULL;
        size_t np = 0, nc = 0;
        if (!st && j) {
            if (!(st = trill_tokenizer_encode(tok, prompt, strlen(prompt), false, &p_ids, &np)))
                st = trill_tokenizer_encode(tok, completion, strlen(completion), false, &c_ids, &nc);
            if (st) trill_error_context("%s", what);
        }
        if (!st && j) {
            if ((int)np >= c->max_seq_len - 1) np = (size_t)c->max_seq_len - 2; /* keep at least one completion token */
            size_t total = np + nc + 1;
            if ((int)total > c->max_seq_len) total = (size_t)c->max_seq_len;
            if (out->n == (int)cap) {
                cap = cap ? cap * 2 : 256;
                example *g = trill_realloc(out->ex, cap * sizeof *g);
                if (!g) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
                else out->ex = g;
            }
            int *ids = st ? NULL : trill_malloc(total * sizeof *ids);
            if (!st && !ids) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
            if (!st) {
                memcpy(ids, p_ids, np * sizeof *ids);
                size_t keep_c = total - np - 1 < nc ? total - np - 1 : nc;
                memcpy(ids + np, c_ids, keep_c * sizeof *ids);
                ids[np + keep_c] = mc->n_eos ? mc->eos_token_ids[0] : 0;
                for (size_t k = 0; k < np + keep_c + 1 && !st; k++)
                    if (ids[k] >= mc->vocab_size)
                        st = trill_error(TRILL_ERR_INVALID, "%s: token id %d exceeds the model's vocab_size %d", what, ids[k], mc->vocab_size);
                out->ex[out->n++] = (example){ ids, (int)(np + keep_c + 1), (int)np };
            }
        }
        free(p_ids);
        free(c_ids);
        json_decref(j);
        line = nl ? nl + 1 : text + len;
    }
    free(text);
    if (!st && out->n == 0) st = trill_error(TRILL_ERR_INVALID, "%s: no examples", path);
    return st;
}

/* ---- micro-batches ---- */

typedef struct batch { int *tokens; int offsets[1025]; int n_seqs; float *dlogp; int n_loss; } batch;

/* Packs examples order[*next ...] until the token budget (at least one example). */
static trill_status pack(const dataset *d, const int *order, int *next, int budget, batch *b) {
    b->n_seqs = 0;
    b->offsets[0] = 0;
    b->n_loss = 0;
    while (*next < d->n && b->n_seqs < 1024) {
        const example *e = &d->ex[order[*next]];
        int used = b->offsets[b->n_seqs];
        if (b->n_seqs > 0 && used + e->n > budget) break;
        int *g = trill_realloc(b->tokens, sizeof(int) * (size_t)(used + e->n));
        float *gd = trill_realloc(b->dlogp, sizeof(float) * (size_t)(used + e->n));
        if (g) b->tokens = g;
        if (gd) b->dlogp = gd;
        if (!g || !gd) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        memcpy(b->tokens + used, e->ids, sizeof(int) * (size_t)e->n);
        for (int t = 0; t < e->n; t++) {
            bool loss = t >= e->n_prompt && t > 0; /* completion (and end-of-sequence) tokens */
            b->dlogp[used + t] = loss ? 1.0f : 0.0f; /* scaled by -1/N once the step's N is known */
            b->n_loss += loss;
        }
        b->offsets[++b->n_seqs] = used + e->n;
        (*next)++;
    }
    return TRILL_OK;
}

static void shuffle(int *order, int n, uint64_t seed, int epoch) {
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(trill_rng_bits(trill_rng_key(seed, (uint64_t)epoch), (uint64_t)i) % (uint64_t)(i + 1));
        int t = order[i]; order[i] = order[j]; order[j] = t;
    }
}

/* Mean negative log-likelihood of the completion tokens of a dataset. */
static trill_status eval_loss(const trill_model *m, const dataset *d, int budget, double *out) {
    int *order = trill_malloc(sizeof(int) * (size_t)d->n), next = 0;
    batch b = { 0 };
    double nll = 0;
    long n = 0;
    trill_status st = order ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < d->n && order; i++) order[i] = i;
    while (!st && next < d->n) {
        if ((st = pack(d, order, &next, budget, &b))) break;
        float *lp = trill_malloc(sizeof(float) * (size_t)b.offsets[b.n_seqs]);
        if (!lp) { st = trill_error(TRILL_ERR_NOMEM, "out of memory"); break; }
        st = trill_model_forward(m, b.tokens, b.offsets, b.n_seqs, NULL, lp, NULL);
        for (int t = 0; !st && t < b.offsets[b.n_seqs]; t++)
            if (b.dlogp[t] != 0) { nll -= lp[t]; n++; }
        free(lp);
    }
    free(order);
    free(b.tokens);
    free(b.dlogp);
    *out = n ? nll / n : NAN;
    return st;
}

static trill_status save(const trill_sft_config *c, const trill_model *m, const trill_lora *lora, const trill_adamw *opt, int step,
                         double eval) {
    trill_status st = lora ? trill_lora_save(lora, c->out_dir) : trill_model_save(m, c->out_dir, TRILL_F32, 5000000000u);
    char *prefix = trill_path_join(c->out_dir, "optimizer"), *state = trill_path_join(c->out_dir, "trainer_state.json");
    if (!st && (!prefix || !state)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_adamw_save(opt, prefix);
    if (!st) {
        json_t *j = json_pack("{s:i, s:s, s:f}", "step", step, "mode", lora ? "lora" : "full", "eval_loss", isnan(eval) ? -1.0 : eval);
        st = trill_json_write_file(state, j);
        json_decref(j);
    }
    if (!st && !lora) st = trill_model_copy_side_files(c->model_dir, c->out_dir); /* a full model folder is usable on its own */
    free(prefix);
    free(state);
    return st;
}

/* A progress line to the caller's file, or to the library's log sink (trill/log.h). */
static void sft_log(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sft_log(FILE *f, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (f) fprintf(f, "%s\n", line);
    else trill_log(TRILL_LOG_INFO, "%s", line);
}

trill_status trill_sft_run(const trill_sft_config *c, double *final_eval) {
    FILE *log = c->log;
    trill_model *m = NULL;
    trill_tokenizer *tok = NULL;
    trill_lora *lora = NULL;
    trill_adamw *opt = NULL;
    dataset train = { 0 }, heldout = { 0 };
    batch b = { 0 };
    int *order = NULL;
    float *grads = NULL;
    uint8_t *no_decay = NULL;
    *final_eval = NAN;
    /* resuming: the checkpoint's weights (the full model, or the base plus the adapter), its
     * optimizer state and step; the data order is a function of (seed, epoch), so the steps
     * already taken are skipped exactly */
    int start_step = 0;
    trill_status st = TRILL_OK;
    if (c->resume) {
        char *state_path = trill_path_join(c->out_dir, "trainer_state.json");
        json_t *state = NULL;
        if (!state_path) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else if (!(st = trill_json_load_file(state_path, &state)))
            st = trill_json_get_int(state, "step", state_path, 0, INT32_MAX, &start_step);
        json_decref(state);
        free(state_path);
    }
    /* LoRA: a frozen base, kept in the checkpoint's dtype; full: fp32 master weights */
    if (!st) st = trill_model_load_as(c->resume && !c->lora ? c->out_dir : c->model_dir, c->lora ? TRILL_STORE_CHECKPOINT : TRILL_STORE_F32, &m);
    if (!st) st = trill_tokenizer_load(c->model_dir, &tok);
    if (!st) st = load_data(c, c->data_path, tok, &m->config, &train);
    if (!st && c->eval_path) st = load_data(c, c->eval_path, tok, &m->config, &heldout);
    if (!st && c->lora && !(st = c->resume ? trill_lora_load(m, c->out_dir, &lora) : trill_lora_create(m, c->lora_config, c->seed, &lora)))
        trill_model_attach_lora(m, lora);
    float *values = lora ? lora->params : m ? m->params : NULL;
    const size_t n_values = lora ? lora->n_params : m ? m->n_params : 0;
    if (!st && c->resume) {
        char *prefix = trill_path_join(c->out_dir, "optimizer");
        st = prefix ? trill_adamw_load(prefix, n_values, &opt) : trill_error(TRILL_ERR_NOMEM, "out of memory");
        free(prefix);
    } else if (!st) {
        trill_adamw_config oc = trill_adamw_defaults();
        oc.weight_decay = c->weight_decay;
        st = trill_adamw_create(n_values, oc, &opt);
    }
    if (!st && !(grads = trill_calloc(n_values, sizeof(float)))) st = trill_error(TRILL_ERR_NOMEM, "out of memory for gradients");
    if (!st && !lora) { /* full fine-tuning: no decay on norm weights (the 1-D tensors), as HF Trainer */
        if (!(no_decay = trill_calloc(n_values, 1))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (size_t t = 0; !st && t < m->n_tensors; t++)
            if (m->tensors[t].ndim == 1) memset(no_decay + (m->tensors[t].data - m->params), 1, m->tensors[t].numel);
    }
    if (!st && !(order = trill_malloc(sizeof(int) * (size_t)train.n))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");

    /* steps: micro-batches per epoch (a dry packing pass) / grad_accum, times the epochs */
    int micro_per_epoch = 0;
    for (int next = 0; !st && next < train.n; micro_per_epoch++) {
        for (int i = 0; i < train.n; i++) order[i] = i;
        st = pack(&train, order, &next, c->batch_tokens, &b);
    }
    int steps_per_epoch = (micro_per_epoch + c->grad_accum - 1) / c->grad_accum;
    int total = steps_per_epoch * c->epochs;
    if (c->max_steps > 0 && c->max_steps < total) total = c->max_steps;
    if (!st)
        sft_log(log, "trill sft: %d examples, %d micro-batches/epoch, %d steps (%s, %zu trainable values)%s", train.n,
                micro_per_epoch, total, lora ? "LoRA" : "full", n_values, start_step ? ", resuming" : "");

    double t_start = trill_now(), eval_nll = NAN;
    long tokens_seen = 0;
    int step = 0;
    const int last = c->stop_after > 0 && c->stop_after < total ? c->stop_after : total;
    for (int epoch = 0; !st && step < last; epoch++) {
        shuffle(order, train.n, c->seed, epoch);
        int next = 0;
        while (!st && step < last && next < train.n) {
            /* one optimizer step: pack its micro-batches, then scale the loss by its completion tokens */
            memset(grads, 0, n_values * sizeof(float));
            int first = next, n_loss = 0;
            for (int k = 0; k < c->grad_accum && next < train.n && !st; k++) {
                st = pack(&train, order, &next, c->batch_tokens, &b);
                n_loss += b.n_loss;
            }
            if (st) break;
            if (step < start_step) { /* taken before the resumed checkpoint: its data is skipped, nothing computed */
                step++;
                continue;
            }
            next = first;
            double nll = 0;
            for (int k = 0; k < c->grad_accum && next < train.n && !st; k++) {
                st = pack(&train, order, &next, c->batch_tokens, &b);
                const int T = b.offsets[b.n_seqs];
                for (int t = 0; t < T; t++) b.dlogp[t] *= -1.0f / (float)(n_loss ? n_loss : 1);
                float *lp = st ? NULL : trill_malloc(sizeof(float) * (size_t)T);
                trill_forward_pass *pass = NULL;
                if (!st && !lp) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
                if (!st) st = trill_model_forward_train(m, b.tokens, b.offsets, b.n_seqs, NULL, lp, NULL, c->recompute, &pass);
                if (!st) st = trill_model_backward(pass, b.dlogp, lora ? NULL : grads, lora ? grads : NULL);
                for (int t = 0; !st && t < T; t++)
                    if (b.dlogp[t] != 0) nll -= lp[t];
                trill_forward_pass_free(pass);
                free(lp);
                tokens_seen += T;
            }
            if (st) break;
            double norm = trill_clip_grad_norm(grads, n_values, c->clip);
            double lr = trill_lr_at(c->schedule, c->lr, c->min_lr, c->warmup_steps, total, step);
            trill_adamw_step(opt, values, grads, lr, no_decay);
            step++;
            double elapsed = trill_now() - t_start;
            sft_log(log, "step %d/%d  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tokens/s  eta %.0fs", step, total,
                    nll / (n_loss ? n_loss : 1), lr, norm, tokens_seen / elapsed, elapsed / step * (total - step));
            if (c->save_every > 0 && step % c->save_every == 0 && step < last && !(st = save(c, m, lora, opt, step, eval_nll)))
                sft_log(log, "step %d  checkpoint saved to %s", step, c->out_dir);
            if (!st && heldout.n && c->eval_every > 0 && step % c->eval_every == 0 && step < total &&
                !(st = eval_loss(m, &heldout, c->batch_tokens, &eval_nll)))
                sft_log(log, "step %d  eval loss %.4f", step, eval_nll);
        }
    }
    if (!st && heldout.n && !(st = eval_loss(m, &heldout, c->batch_tokens, &eval_nll))) {
        sft_log(log, "eval loss %.4f (%d held-out examples)", eval_nll, heldout.n);
        *final_eval = eval_nll;
    }
    if (!st) st = save(c, m, lora, opt, step, eval_nll);
    if (!st) sft_log(log, "trill sft: wrote %s", c->out_dir);
    dataset_free(&train);
    dataset_free(&heldout);
    free(b.tokens);
    free(b.dlogp);
    free(order);
    free(grads);
    free(no_decay);
    trill_adamw_free(opt);
    if (m) trill_model_attach_lora(m, NULL);
    trill_lora_free(lora);
    trill_tokenizer_free(tok);
    trill_model_free(m);
    return st;
}
