/* The RL controller (`trill train`): one place that owns the loop, the step counter,
 * checkpoints and metrics. Synchronous: generate, score, train, sync, in turn. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "base/alloc.h"
#include "rollout.h"
#include "run.h"
#include "scorer.h"
#include "trill/log.h"
#include "trill/chat.h"
#include "trill/config.h"
#include "trill/dataset.h"
#include "trill/demo.h"
#include "trill/fileio.h"
#include "base/json.h"
#include "model/lora_internal.h"
#include "trill/lora.h"
#include "rl/reward_process.h"
#include "trill/reward.h"
#include "trill/reward_model.h"
#include "trill/rl.h"
#include "trill/rl_algo.h"
#include "trill/timing.h"
#include "trill/train.h"

/* ---- setup ---- */

static char *xstrdup(const char *s) { return s ? trill_strdup(s) : NULL; }

/* Where the demo's warm-started model is kept between runs: $TRILL_CACHE_DIR, else
 * $XDG_CACHE_HOME/trill, else ~/.cache/trill, else .trill-cache. */
static char *demo_cache_dir(void) {
    const char *dir = getenv("TRILL_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (dir && *dir) return trill_strdup(dir);
    if (xdg && *xdg) return trill_path_join(xdg, "trill");
    if (home && *home) return trill_path_join(home, ".cache/trill");
    return trill_strdup(".trill-cache");
}

static trill_status resolve_inputs(rl_run *r) {
    const trill_rl_config *c = r->c;
    r->verifier = c->reward.verifier;
    if (c->model[0]) {
        r->model_dir = xstrdup(c->model);
        r->train_path = xstrdup(c->data.train);
        r->eval_path = xstrdup(c->data.eval);
        if (!c->data.train[0]) return trill_error(TRILL_ERR_INVALID, "data.train: a training JSONL file is required with model \"%s\"", c->model);
        return r->model_dir && r->train_path && r->eval_path ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    /* the embedded demo: its model (SFT warm-started, cached) and data, unless the config names data */
    char *cache = demo_cache_dir();
    trill_demo_info info = { 0 };
    trill_status st = cache ? trill_demo_prepare(cache, NULL, &info) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(cache);
    if (st) { trill_error_context("preparing the embedded demo"); return st; }
    if (info.cached) trill_log(TRILL_LOG_INFO, "trill train: demo base model from the cache (%s)", info.dir);
    r->model_dir = xstrdup(info.model_dir);
    r->train_path = xstrdup(c->data.train[0] ? c->data.train : info.train_path);
    r->eval_path = xstrdup(c->data.eval[0] ? c->data.eval : info.eval_path);
    trill_demo_info_free(&info);
    return r->model_dir && r->train_path && r->eval_path ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

static trill_status load_data(rl_run *r) {
    const trill_rl_config *c = r->c;
    trill_config mc = { 0 };
    char *config_path = trill_path_join(r->model_dir, "config.json");
    trill_status st = config_path ? trill_config_load(config_path, &mc) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(config_path);
    if (!st) st = trill_tokenizer_load(r->model_dir, &r->tok);
    if (!st && strcmp(c->data.template_, "chat") == 0) st = trill_chat_template_load(r->model_dir, &r->chat);
    trill_dataset_options o = { .prompt_field = c->data.prompt_field, .answer_field = c->data.answer_field,
                                .template_ = c->data.template_, .chat = r->chat, .max_prompt_tokens = c->data.max_prompt_tokens,
                                .allow_missing_answer = c->data.allow_missing_answer,
                                .max_position_embeddings = mc.max_position_embeddings,
                                .max_new_tokens = c->generator.max_new_tokens };
    if (!st) st = trill_dataset_load(r->train_path, r->tok, &o, &r->train);
    o.limit = c->data.eval_size;
    if (!st && r->eval_path[0]) st = trill_dataset_load(r->eval_path, r->tok, &o, &r->eval);
    return st;
}

static trill_status load_models(rl_run *r) {
    const trill_rl_config *c = r->c;
    trill_status st = trill_model_load_as(r->model_dir, TRILL_STORE_CHECKPOINT, &r->policy);
    if (st) return st;
    const trill_config *mc = &r->policy->config;
    r->L = mc->n_moe_layers;
    r->K = mc->num_experts_per_tok;
    if (c->sync.mode == TRILL_SYNC_MERGE) {
        if ((st = trill_model_load_as(r->model_dir, TRILL_STORE_F32, &r->merge_model))) return st;
        r->merge_base = trill_malloc(sizeof(float) * r->merge_model->n_f32);
        if (!r->merge_base) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        memcpy(r->merge_base, r->merge_model->params, sizeof(float) * r->merge_model->n_f32);
    }
    trill_engine_config ec = trill_engine_config_default();
    ec.format = c->generator.dtype;
    ec.kv_cache_mb = (size_t)c->generator.kv_cache_mb;
    ec.max_batch_tokens = c->generator.max_batch_tokens;
    ec.capture_experts = r->L > 0; /* routing flips are measured every step, replay or not */
    ec.tokenizer = r->tok;
    if ((st = trill_engine_create(r->policy, &ec, &r->engine))) return st;
    r->proto = (trill_request){ .max_new_tokens = c->generator.max_new_tokens };
    r->proto.sampling = trill_sampling_default();
    r->proto.sampling.temperature = (float)c->generator.temperature;
    r->proto.sampling.top_p = (float)c->generator.top_p;
    r->proto.sampling.top_k = c->generator.top_k;
    r->proto.sampling.min_p = (float)c->generator.min_p;
    r->proto.sampling.seed = c->seed;
    for (int i = 0; i < mc->n_eos; i++) r->stop_ids[i] = mc->eos_token_ids[i];
    r->proto.stop_ids = r->stop_ids;
    r->proto.n_stop_ids = mc->n_eos;
    r->proto.stop_strings = (const char *const *)c->generator.stop;
    r->proto.n_stop_strings = c->generator.n_stop;
    if (c->rollouts.replay[0]) return TRILL_OK; /* rewards come with the recorded batches */
    return trill_rl_scorer_create(c, r->train, &r->scorer);
}

static void run_free(rl_run *r) {
    if (r->metrics) fclose(r->metrics);
    if (r->lock_fd >= 0) close(r->lock_fd); /* releases the lock */
    trill_rl_scorer_free(r->scorer);
    trill_engine_free(r->engine);
    if (r->policy) trill_model_attach_lora(r->policy, NULL);
    trill_lora_free(r->lora);
    free(r->lora_grads);
    trill_adamw_free(r->opt);
    trill_model_free(r->policy);
    trill_model_free(r->merge_model);
    free(r->merge_base);
    trill_dataset_free(r->train);
    trill_dataset_free(r->eval);
    trill_chat_template_free(r->chat);
    trill_tokenizer_free(r->tok);
    free(r->model_dir);
    free(r->train_path);
    free(r->eval_path);
}

/* ---- weight sync ---- */

trill_status trill_rl_sync_direct(rl_run *r, double *ms, size_t *bytes) {
    const double t0 = trill_now();
    trill_status st;
    if (r->c->sync.mode == TRILL_SYNC_ADAPTER) {
        st = trill_engine_update_adapter(r->engine, r->lora, r->state.version, bytes);
    } else {
        memcpy(r->merge_model->params, r->merge_base, sizeof(float) * r->merge_model->n_f32);
        st = trill_lora_merge(r->lora, r->merge_model);
        if (!st) st = trill_engine_update_weights(r->engine, r->merge_model, r->state.version, bytes);
    }
    *ms = (trill_now() - t0) * 1e3;
    return st;
}

/* ---- trainer passes ---- */

/* A packed sub-batch of the rollout batch's sequences, for one forward (and backward). */
typedef struct micro {
    int n, T;
    const int *seq;         /* [n] indices into the rollout batch */
    int *offsets, *tokens;  /* packed */
    uint16_t *replay;       /* [T][L][K] or NULL */
} micro;

static void micro_free(micro *m) { free(m->offsets); free(m->tokens); free(m->replay); }

static trill_status micro_make(const rl_batch *b, const int *seq, int n, bool replay, micro *m) {
    memset(m, 0, sizeof *m);
    m->n = n;
    m->seq = seq;
    for (int i = 0; i < n; i++) m->T += b->offsets[seq[i] + 1] - b->offsets[seq[i]];
    const size_t row = (size_t)b->n_moe_layers * b->top_k;
    m->offsets = trill_malloc(sizeof(int) * (size_t)(n + 1));
    m->tokens = trill_malloc(sizeof(int) * (size_t)m->T);
    if (replay && row) m->replay = trill_malloc(sizeof(uint16_t) * row * (size_t)m->T);
    if (!m->offsets || !m->tokens || (replay && row && !m->replay)) { micro_free(m); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    int at = 0;
    for (int i = 0; i < n; i++) {
        const int from = b->offsets[seq[i]], len = b->offsets[seq[i] + 1] - from;
        m->offsets[i] = at;
        memcpy(m->tokens + at, b->tokens + from, sizeof(int) * (size_t)len);
        if (m->replay) memcpy(m->replay + (size_t)at * row, b->experts + (size_t)from * row, sizeof(uint16_t) * row * (size_t)len);
        at += len;
    }
    m->offsets[n] = at;
    return TRILL_OK;
}

/* Consecutive runs of `seq` under the token budget (at least one sequence each). */
static int next_micro(const rl_batch *b, const int *seq, int n, int budget) {
    int k = 0, tokens = 0;
    while (k < n) {
        int len = b->offsets[seq[k] + 1] - b->offsets[seq[k]];
        if (k > 0 && tokens + len > budget) break;
        tokens += len;
        k++;
    }
    return k;
}

/* Per-token arrays of the whole rollout batch (packed layout). */
typedef struct token_arrays {
    float *old_logp, *ref_logp, *tis;
    uint8_t *mask;
    uint16_t *train_experts;
} token_arrays;

/* Copies a micro-batch's packed per-token values back into batch positions. */
static void scatter_logp(const rl_batch *b, const micro *m, const float *src, float *dst) {
    for (int i = 0; i < m->n; i++) {
        const int from = b->offsets[m->seq[i]];
        memcpy(dst + from, src + m->offsets[i], sizeof(float) * (size_t)(m->offsets[i + 1] - m->offsets[i]));
    }
}

static void scatter_experts(const rl_batch *b, const micro *m, const uint16_t *src, uint16_t *dst) {
    const size_t row = (size_t)b->n_moe_layers * b->top_k;
    for (int i = 0; i < m->n; i++)
        memcpy(dst + (size_t)b->offsets[m->seq[i]] * row, src + (size_t)m->offsets[i] * row,
               sizeof(uint16_t) * row * (size_t)(m->offsets[i + 1] - m->offsets[i]));
}

/* The response tokens of the micro-batch's sequences, gathered from batch positions:
 * resp_off[n + 1] and, for each non-NULL pair, dst[j] = src[position of response token j]. */
static int response_offsets(const rl_batch *b, const micro *m, int *resp_off) {
    resp_off[0] = 0;
    for (int i = 0; i < m->n; i++) resp_off[i + 1] = resp_off[i] + rl_response_len(b, m->seq[i]);
    return resp_off[m->n];
}

static void gather_f(const rl_batch *b, const micro *m, const float *src, float *dst) {
    int j = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], n = rl_response_len(b, s);
        memcpy(dst + j, src + from, sizeof(float) * (size_t)n);
        j += n;
    }
}

static void gather_u8(const rl_batch *b, const micro *m, const uint8_t *src, uint8_t *dst) {
    int j = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], n = rl_response_len(b, s);
        memcpy(dst + j, src + from, (size_t)n);
        j += n;
    }
}

static void scatter_resp_f(const rl_batch *b, const micro *m, const float *src, float *dst) {
    int j = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], n = rl_response_len(b, s);
        memcpy(dst + from, src + j, sizeof(float) * (size_t)n);
        j += n;
    }
}

static void scatter_resp_u8(const rl_batch *b, const micro *m, const uint8_t *src, uint8_t *dst) {
    int j = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], n = rl_response_len(b, s);
        memcpy(dst + from, src + j, (size_t)n);
        j += n;
    }
}

/* TIS weights and the MIS mask of a micro-batch's sequences from their old log-probs. */
static trill_status corrections(const trill_rl_config *c, const rl_batch *b, const micro *m, token_arrays *ta) {
    int *off = trill_malloc(sizeof(int) * (size_t)(m->n + 1));
    if (!off) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const int R = response_offsets(b, m, off);
    float *old = trill_malloc(sizeof(float) * (size_t)(R + 1)), *behav = trill_malloc(sizeof(float) * (size_t)(R + 1)),
          *w = trill_malloc(sizeof(float) * (size_t)(R + 1));
    uint8_t *mask = trill_malloc((size_t)R + 1);
    trill_status st = old && behav && w && mask ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        gather_f(b, m, ta->old_logp, old);
        gather_f(b, m, b->behav_logp, behav);
        memset(mask, 1, (size_t)R);
        trill_rl_corrections(c, m->n, off, old, behav, w, mask);
        scatter_resp_f(b, m, w, ta->tis);
        scatter_resp_u8(b, m, mask, ta->mask);
    }
    free(off); free(old); free(behav); free(w); free(mask);
    return st;
}

/* A forward without gradients over `seq`: old log-probs (adapters on) and/or reference
 * log-probs (adapters off), plus the trainer's routing. */
static trill_status pre_pass(rl_run *r, const rl_batch *b, const int *seq, int n, bool want_old, bool want_ref, token_arrays *ta) {
    const trill_rl_config *c = r->c;
    trill_status st = TRILL_OK;
    for (int at = 0; at < n && !st;) {
        const int k = next_micro(b, seq + at, n - at, c->trainer.micro_batch_tokens);
        micro m;
        if ((st = micro_make(b, seq + at, k, c->router_replay, &m))) break;
        float *lp = trill_malloc(sizeof(float) * (size_t)m.T);
        uint16_t *ex = r->L ? trill_malloc(sizeof(uint16_t) * (size_t)m.T * r->L * r->K) : NULL;
        if (!lp || (r->L && !ex)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st && want_old) {
            st = trill_model_forward(r->policy, m.tokens, m.offsets, m.n, m.replay, lp, ex);
            if (!st) {
                scatter_logp(b, &m, lp, ta->old_logp);
                if (ex) scatter_experts(b, &m, ex, ta->train_experts);
                st = corrections(c, b, &m, ta);
            }
        }
        if (!st && want_ref) {
            r->lora->enabled = false; /* the reference policy: the same weights without adapters */
            st = trill_model_forward(r->policy, m.tokens, m.offsets, m.n, m.replay, lp, NULL);
            r->lora->enabled = true;
            if (!st) scatter_logp(b, &m, lp, ta->ref_logp);
        }
        free(lp);
        free(ex);
        micro_free(&m);
        at += k;
    }
    return st;
}

/* ---- one optimizer step on a minibatch ---- */

typedef struct train_stats {
    double loss, pg_loss, kl_loss, clip_tokens, ratio_sum, ratio_n, grad_norm, lr;
    long tokens;           /* tokens forwarded (prompt + response) */
    int optimizer_steps;
    int skipped;           /* minibatches whose loss or gradient was not finite (trainer.skip_nonfinite) */
} train_stats;

/* Losses are summed over micro-batches (token-mean with denominator 1, sequence means times their
 * sequence count), then the gradient is divided by the minibatch's denominator: the same
 * gradient as one pass over the whole minibatch. */
static trill_status train_minibatch(rl_run *r, const rl_batch *b, const int *seq, int n, bool have_old, token_arrays *ta,
                                    train_stats *ts) {
    const trill_rl_config *c = r->c;
    const size_t np = r->lora->n_params;
    memset(r->lora_grads, 0, sizeof(float) * np);
    double denom_tokens = 0, sums[4] = { 0 };
    trill_status st = TRILL_OK;
    for (int at = 0; at < n && !st;) {
        const int k = next_micro(b, seq + at, n - at, c->trainer.micro_batch_tokens);
        micro m;
        if ((st = micro_make(b, seq + at, k, c->router_replay, &m))) break;
        float *lp = trill_malloc(sizeof(float) * (size_t)m.T), *dlp = trill_calloc((size_t)m.T, sizeof(float));
        uint16_t *ex = r->L ? trill_malloc(sizeof(uint16_t) * (size_t)m.T * r->L * r->K) : NULL;
        int *off = trill_malloc(sizeof(int) * (size_t)(k + 1));
        trill_forward_pass *pass = NULL;
        if (!lp || !dlp || !off || (r->L && !ex)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st) st = trill_model_forward_train(r->policy, m.tokens, m.offsets, m.n, m.replay, lp, ex, c->trainer.recompute, &pass);
        if (!st && !have_old) { /* first minibatch, weights unchanged: these are the old log-probs */
            scatter_logp(b, &m, lp, ta->old_logp);
            if (ex) scatter_experts(b, &m, ex, ta->train_experts);
            st = corrections(c, b, &m, ta);
        }
        const int R = response_offsets(b, &m, off);
        float *g_lp = trill_malloc(sizeof(float) * (size_t)(R + 1)), *g_old = trill_malloc(sizeof(float) * (size_t)(R + 1)),
              *g_behav = trill_malloc(sizeof(float) * (size_t)(R + 1)), *g_ref = trill_malloc(sizeof(float) * (size_t)(R + 1)),
              *g_w = trill_malloc(sizeof(float) * (size_t)(R + 1)), *g_d = trill_malloc(sizeof(float) * (size_t)(R + 1));
        uint8_t *g_mask = trill_malloc((size_t)R + 1);
        double *adv = trill_malloc(sizeof(double) * (size_t)k);
        if (!g_lp || !g_old || !g_behav || !g_ref || !g_w || !g_d || !g_mask || !adv) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st) {
            /* the response tokens' log-probs sit at their own packed positions */
            int j = 0;
            for (int i = 0; i < k; i++) {
                const int s = m.seq[i], from = m.offsets[i] + b->prompt_len[s], len = rl_response_len(b, s);
                memcpy(g_lp + j, lp + from, sizeof(float) * (size_t)len);
                adv[i] = b->adv[s];
                j += len;
            }
            gather_f(b, &m, ta->old_logp, g_old);
            gather_f(b, &m, b->behav_logp, g_behav);
            gather_f(b, &m, ta->tis, g_w);
            gather_u8(b, &m, ta->mask, g_mask);
            const bool kl_loss = c->algo.kl_coef > 0 && c->algo.kl_mode == TRILL_KL_LOSS;
            if (kl_loss) gather_f(b, &m, ta->ref_logp, g_ref);
            rl_loss_batch lb = { .n_seqs = k, .offsets = off, .logp = g_lp, .old_logp = g_old, .behav_logp = g_behav,
                                 .ref_logp = kl_loss ? g_ref : NULL, .adv = adv, .mask = g_mask, .is_weight = g_w, .agg_tokens = 1 };
            rl_loss_stats ls;
            trill_rl_policy_loss(c, &lb, g_d, &ls);
            const double scale = c->algo.aggregation == TRILL_AGG_TOKEN_MEAN ? 1.0 : (double)k; /* back to sums */
            long in = 0;
            for (int t = 0; t < R; t++) in += g_mask[t];
            denom_tokens += (double)in;
            sums[0] += ls.loss * scale;
            sums[1] += ls.pg_loss * scale;
            sums[2] += ls.kl_loss * scale;
            ts->clip_tokens += ls.clip_frac * (double)in;
            ts->ratio_sum += ls.ratio_mean * (double)in;
            ts->ratio_n += (double)in;
            j = 0;
            for (int i = 0; i < k; i++) {
                const int s = m.seq[i], from = m.offsets[i] + b->prompt_len[s], len = rl_response_len(b, s);
                for (int t = 0; t < len; t++) dlp[from + t] = (float)(g_d[j + t] * scale);
                j += len;
            }
            st = trill_model_backward(pass, dlp, NULL, r->lora_grads);
        }
        ts->tokens += m.T;
        trill_forward_pass_free(pass);
        free(lp); free(dlp); free(ex); free(off); free(g_lp); free(g_old); free(g_behav); free(g_ref); free(g_w); free(g_d);
        free(g_mask); free(adv);
        micro_free(&m);
        at += k;
    }
    if (st) return st;
    const double denom = c->algo.aggregation == TRILL_AGG_TOKEN_MEAN ? (denom_tokens > 0 ? denom_tokens : 1) : (double)n;
    for (size_t i = 0; i < np; i++) r->lora_grads[i] = (float)(r->lora_grads[i] / denom);
    const double loss = sums[0] / denom;
    const double grad_norm = trill_clip_grad_norm(r->lora_grads, np, c->trainer.grad_clip);
    if (!isfinite(loss) || !isfinite(grad_norm)) { /* never applied: the adapter stays as it was */
        if (c->trainer.skip_nonfinite) {
            ts->skipped++;
            return TRILL_OK;
        }
        return trill_error(TRILL_ERR_INVALID, "step %d: the %s is %g (loss %g, gradient norm %g): the update was not applied "
                           "(trainer.skip_nonfinite: true skips such batches)", r->state.step + 1,
                           isfinite(loss) ? "gradient norm" : "loss", isfinite(loss) ? grad_norm : loss, loss, grad_norm);
    }
    ts->loss += loss;
    ts->pg_loss += sums[1] / denom;
    ts->kl_loss += sums[2] / denom;
    ts->grad_norm = grad_norm;
    const int64_t total = (int64_t)c->steps * c->algo.minibatches;
    ts->lr = trill_lr_at(c->trainer.schedule, c->trainer.lr, c->trainer.min_lr, c->trainer.warmup_steps, total, r->opt->step);
    trill_adamw_step(r->opt, r->lora->params, r->lora_grads, ts->lr, NULL);
    ts->optimizer_steps++;
    return TRILL_OK;
}

/* After the optimizer: a non-finite parameter is never synced or checkpointed. */
static trill_status check_adapter(const rl_run *r) {
    const trill_lora *l = r->lora;
    for (size_t i = 0; i < l->n_params; i++)
        if (!isfinite(l->params[i])) {
            const char *name = "?";
            for (size_t k = 0; k < l->n_tensors; k++)
                if (l->params + i >= l->tensors[k].data && l->params + i < l->tensors[k].data + l->tensors[k].numel) name = l->tensors[k].name;
            return trill_error(TRILL_ERR_INVALID, "step %d: adapter tensor %s holds %g after the optimizer step: not synced or saved",
                               r->state.step + 1, name, l->params[i]);
        }
    return TRILL_OK;
}

/* ---- one RL step ---- */

static double mean_of(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : NAN;
}


void trill_rl_rollout_free(rl_rollout *ro) {
    trill_rl_batch_free(&ro->b);
    json_decref(ro->ext_metrics);
    memset(ro, 0, sizeof *ro);
}

trill_status trill_rl_stage_generate(rl_run *r, int64_t index, rl_rollout *ro, trill_status (*between_steps)(void *), void *ctx) {
    const trill_rl_config *c = r->c;
    const int P = c->generator.prompts_per_step;
    memset(ro, 0, sizeof *ro);
    ro->index = index;
    int *examples = trill_malloc(sizeof(int) * (size_t)P);
    if (!examples) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const int64_t pos = index * P;
    const double t0 = trill_now();
    trill_status st = trill_dataset_order(r->train, c->seed, c->data.shuffle, pos, P, examples);
    if (!st)
        st = trill_rl_generate(r->engine, r->tok, r->train, examples, P, c->generator.n, (uint64_t)pos, &r->proto, r->L, r->K,
                         between_steps, ctx, &ro->b);
    free(examples);
    ro->gen_s = trill_now() - t0;
    for (int s = 0; !st && s < ro->b.n_seqs; s++) ro->gen_tokens += rl_response_len(&ro->b, s);
    return st;
}

trill_status trill_rl_stage_reward(rl_run *r, rl_rollout *ro) {
    const double t0 = trill_now();
    if (!(ro->ext_metrics = json_object())) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_rl_scorer_score(r->scorer, &ro->b, ro->ext_metrics);
    ro->reward_s = trill_now() - t0;
    return st;
}

/* ---- recorded rollouts ---- */

static char *rollout_file(const char *dir, int step) {
    char name[32];
    snprintf(name, sizeof name, "step-%08d.bin", step);
    return trill_path_join(dir, name);
}

/* RUN/rollouts/step-N.bin: the batch as the trainer receives it (rewards in, advantages not yet). */
static trill_status save_rollout(rl_run *r, const rl_batch *b, int step) {
    char *dir = trill_path_join(r->c->run_dir, "rollouts"), *path = dir ? rollout_file(dir, step) : NULL;
    void *buf = NULL;
    size_t len = 0;
    trill_status st = path ? trill_mkdir_p(dir) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_rl_batch_pack(b, &buf, &len);
    if (!st) st = trill_write_file_atomic(path, buf, len);
    if (st) trill_error_context("rollouts.save: step %d", step);
    free(buf);
    free(path);
    free(dir);
    return st;
}

/* Checks a recorded batch against this run: its shape, and every id and number the trainer reads. */
static trill_status check_replayed(const rl_run *r, const rl_batch *b, const char *path) {
    const trill_rl_config *c = r->c;
    const trill_config *mc = &r->policy->config;
    const int want = c->generator.prompts_per_step * c->generator.n;
    if (b->n_seqs != want || b->group_size != c->generator.n)
        return trill_error(TRILL_ERR_INVALID, "%s: %d sequences in groups of %d, the config asks for %d prompts x generator.n %d", path,
                           b->n_seqs, b->group_size, c->generator.prompts_per_step, c->generator.n);
    if (b->n_moe_layers != r->L || b->top_k != r->K)
        return trill_error(TRILL_ERR_INVALID, "%s: routed experts for %d MoE layers x top-%d, the model has %d x top-%d", path,
                           b->n_moe_layers, b->top_k, r->L, r->K);
    for (int s = 0; s < b->n_seqs; s++) {
        if (!isfinite(b->reward[s])) return trill_error(TRILL_ERR_INVALID, "%s: sequence %d: reward is not a finite number", path, s);
        if (b->example[s] < 0 || b->example[s] >= r->train->n)
            return trill_error(TRILL_ERR_INVALID, "%s: sequence %d: example %d is not a line of data.train (%d prompts)", path, s,
                               b->example[s], r->train->n);
        for (int t = b->offsets[s]; t < b->offsets[s + 1]; t++) {
            if (b->tokens[t] < 0 || b->tokens[t] >= mc->vocab_size)
                return trill_error(TRILL_ERR_INVALID, "%s: sequence %d: token %d is outside the vocabulary (%d)", path, s, b->tokens[t],
                                   mc->vocab_size);
            if (t >= b->offsets[s] + b->prompt_len[s] && !(b->behav_logp[t] <= 0))
                return trill_error(TRILL_ERR_INVALID, "%s: sequence %d, token %d: behaviour log-prob %g is not a log-probability", path, s,
                                   t - b->offsets[s], b->behav_logp[t]);
        }
    }
    return TRILL_OK; /* routed expert ids are checked by the forward pass (in range, distinct per token) */
}

/* In place of generating and scoring: step N's batch from rollouts.replay/step-N.bin. */
static trill_status replay_rollout(rl_run *r, int64_t index, rl_rollout *ro) {
    memset(ro, 0, sizeof *ro);
    ro->index = index;
    const int step = r->state.step + 1;
    char *path = rollout_file(r->c->rollouts.replay, step), *data = NULL;
    size_t len = 0;
    trill_status st = path ? trill_read_file(path, &data, &len) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        st = trill_rl_batch_unpack(data, len, &ro->b);
        if (st) trill_error_context("%s", path);
    }
    if (!st) st = check_replayed(r, &ro->b, path);
    if (!st && !(ro->ext_metrics = json_object())) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int s = 0; !st && s < ro->b.n_seqs; s++) ro->gen_tokens += rl_response_len(&ro->b, s);
    if (st) trill_error_context("rollouts.replay: step %d", step);
    free(data);
    free(path);
    return st;
}

/* The step's per-token arrays over the whole batch (packed layout); experts start as "not routed". */
static trill_status token_arrays_alloc(const rl_run *r, const rl_batch *b, token_arrays *ta) {
    const size_t T = (size_t)b->offsets[b->n_seqs], row = (size_t)r->L * r->K;
    const bool ref = r->c->algo.kl_coef > 0;
    ta->old_logp = trill_malloc(sizeof(float) * T);
    ta->ref_logp = ref ? trill_malloc(sizeof(float) * T) : NULL;
    ta->tis = trill_malloc(sizeof(float) * T);
    ta->mask = trill_calloc(T, 1);
    ta->train_experts = row ? trill_malloc(sizeof(uint16_t) * T * row) : NULL;
    if (!ta->old_logp || (ref && !ta->ref_logp) || !ta->tis || !ta->mask || (row && !ta->train_experts))
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < T * row; i++) ta->train_experts[i] = TRILL_REPLAY_NONE;
    return TRILL_OK;
}

static void token_arrays_free(token_arrays *ta) {
    free(ta->old_logp); free(ta->ref_logp); free(ta->tis); free(ta->mask); free(ta->train_experts);
}

/* Which sequences train, and their advantages. Dynamic sampling looks at the rewards of the task,
 * before any KL penalty: identical completions score the same, but their penalties differ by
 * rounding (the trainer's fp32 log-probs of a sequence depend a little on where it sits in the
 * packed batch). With KL as a reward, each reward is first penalised by its sequence's KL (a
 * pre-pass over every sequence gives the old and reference log-probs). kept[0, *n_kept). */
static trill_status shape_rewards(rl_run *r, rl_batch *b, token_arrays *ta, int *kept, int *n_kept, int *flat_groups) {
    const trill_rl_config *c = r->c;
    const int G = c->generator.n;
    trill_status st = TRILL_OK;
    *flat_groups = *n_kept = 0;
    for (int g = 0; g < b->n_seqs / G; g++) {
        const bool flat = trill_rl_group_is_flat(b->reward + (size_t)g * G, G);
        *flat_groups += flat;
        for (int j = 0; j < G; j++) b->keep[g * G + j] = !(flat && c->algo.dynamic_sampling);
    }
    if (c->algo.kl_coef > 0 && c->algo.kl_mode == TRILL_KL_REWARD) {
        for (int s = 0; s < b->n_seqs; s++) kept[s] = s;
        st = pre_pass(r, b, kept, b->n_seqs, true, true, ta);
        for (int s = 0; s < b->n_seqs && !st; s++) {
            double kl = 0;
            for (int t = b->offsets[s] + b->prompt_len[s]; t < b->offsets[s + 1]; t++)
                kl += trill_rl_kl_value(c->algo.kl_estimator, ta->old_logp[t], ta->ref_logp[t]);
            b->reward[s] -= c->algo.kl_coef * kl;
        }
    }
    if (st) return st;
    trill_rl_group_advantages(b->reward, b->n_seqs / G, G, c->algo.std_norm, 1e-6, b->adv);
    for (int s = 0; s < b->n_seqs; s++)
        if (b->keep[s]) kept[(*n_kept)++] = s;
    return TRILL_OK;
}

/* algo.minibatches optimizer steps over the kept sequences (after the pre-pass they need). */
static trill_status run_minibatches(rl_run *r, const rl_batch *b, const int *kept, int n_kept, token_arrays *ta, train_stats *ts) {
    const trill_rl_config *c = r->c;
    const int M = c->algo.minibatches;
    const bool kl_reward = c->algo.kl_coef > 0 && c->algo.kl_mode == TRILL_KL_REWARD;
    const bool pre_old = !kl_reward && M > 1, pre_ref = !kl_reward && c->algo.kl_coef > 0;
    trill_status st = TRILL_OK;
    if (n_kept && (pre_old || pre_ref)) st = pre_pass(r, b, kept, n_kept, pre_old, pre_ref, ta);
    for (int mb = 0; mb < M && !st && n_kept && !ts->skipped; mb++) {
        const int lo = (int)((int64_t)n_kept * mb / M), hi = (int)((int64_t)n_kept * (mb + 1) / M);
        if (hi > lo) st = train_minibatch(r, b, kept + lo, hi - lo, pre_old || kl_reward || mb > 0, ta, ts);
    }
    return st;
}

/* Mismatch, corrections, KL to the reference and routing flips over the trained sequences'
 * response tokens. */
static trill_status measure_mismatch(const rl_run *r, const rl_batch *b, const int *kept, int n_kept, const token_arrays *ta,
                                     trill_rl_metrics *m) {
    const trill_rl_config *c = r->c;
    const size_t row = (size_t)r->L * r->K;
    long R = 0;
    for (int i = 0; i < n_kept; i++) R += rl_response_len(b, kept[i]);
    float *old = trill_malloc(sizeof(float) * (size_t)(R + 1)), *behav = trill_malloc(sizeof(float) * (size_t)(R + 1));
    uint16_t *ge = row ? trill_malloc(sizeof(uint16_t) * row * (size_t)(R + 1)) : NULL;
    uint16_t *te = row ? trill_malloc(sizeof(uint16_t) * row * (size_t)(R + 1)) : NULL;
    double tis_sum = 0, tis_capped = 0, kl_ref_sum = 0;
    long j = 0, masked = 0, kl_ref_n = 0;
    trill_status st = old && behav && (!row || (ge && te)) ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_kept && !st; i++) {
        const int s = kept[i];
        for (int t = b->offsets[s] + b->prompt_len[s]; t < b->offsets[s + 1]; t++, j++) {
            old[j] = ta->old_logp[t];
            behav[j] = b->behav_logp[t];
            tis_sum += ta->tis[t];
            tis_capped += c->correction.tis > 0 && ta->tis[t] >= (float)c->correction.tis;
            masked += !ta->mask[t];
            if (ta->ref_logp) { kl_ref_sum += trill_rl_kl_value(c->algo.kl_estimator, ta->old_logp[t], ta->ref_logp[t]); kl_ref_n++; }
            /* the routing that produced token t was computed at position t - 1 */
            if (row) {
                memcpy(ge + (size_t)j * row, b->experts + (size_t)(t - 1) * row, sizeof(uint16_t) * row);
                memcpy(te + (size_t)j * row, ta->train_experts + (size_t)(t - 1) * row, sizeof(uint16_t) * row);
            }
        }
    }
    if (!st) {
        rl_mismatch mm;
        trill_rl_mismatch_measure(old, behav, (size_t)R, &mm);
        m->mismatch_mean_abs = mm.mean_abs;
        m->mismatch_max_abs = mm.max_abs;
        m->mismatch_k1 = mm.k1;
        m->mismatch_k3 = mm.k3;
        m->mismatch_chi2 = mm.chi2;
        m->mismatch_tokens = (long)mm.n_tokens;
        m->tis_mean = R ? tis_sum / R : NAN;
        m->tis_capped_frac = R ? tis_capped / R : NAN;
        m->mis_masked_frac = R ? (double)masked / R : NAN;
        m->kl_ref = kl_ref_n ? kl_ref_sum / kl_ref_n : NAN;
        double token_flip = 0;
        m->n_moe_layers = r->L;
        for (int l = 0; l < r->L; l++) m->flip_layer[l] = 0;
        if (row && R) trill_rl_routing_flips(ge, te, (size_t)R, r->L, r->K, &token_flip, m->flip_layer);
        m->flip_token_frac = row ? token_flip : NAN;
    }
    free(old); free(behav); free(ge); free(te);
    return st;
}

/* The batch's and the trainer's figures; the external reward's metrics as means over the batch. */
static trill_status batch_metrics(const rl_run *r, const rl_rollout *ro, const train_stats *ts, int flat_groups, int n_kept,
                                  trill_rl_metrics *m) {
    const rl_batch *b = &ro->b;
    const bool verified = r->verifier != TRILL_VERIFIER_NONE;
    double accuracy = verified ? 0 : NAN, len = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        if (verified) accuracy += (b->correct[s] >= 0.5) / (double)b->n_seqs;
        len += rl_response_len(b, s) / (double)b->n_seqs;
    }
    const int steps = ts->optimizer_steps ? ts->optimizer_steps : 1;
    m->reward = mean_of(b->reward, b->n_seqs);
    m->accuracy = accuracy;
    m->response_len = len;
    m->flat_groups = flat_groups;
    m->trained_seqs = n_kept;
    m->loss = ts->loss / steps;
    m->pg_loss = ts->pg_loss / steps;
    m->kl_loss = ts->kl_loss / steps;
    m->clip_frac = ts->ratio_n ? ts->clip_tokens / ts->ratio_n : NAN;
    m->ratio_mean = ts->ratio_n ? ts->ratio_sum / ts->ratio_n : NAN;
    m->grad_norm = ts->grad_norm;
    m->skipped_nonfinite = ts->skipped;
    m->lr = ts->lr;
    m->n_ext = 0;
    const char *key;
    json_t *val;
    json_object_foreach(ro->ext_metrics, key, val) {
        if (m->n_ext == TRILL_RL_MAX_EXT_METRICS || strlen(key) >= sizeof m->ext_name[0])
            return trill_error(TRILL_ERR_INVALID, "reward.external: the process reported %s (at most %d metrics, names under %zu bytes)",
                               m->n_ext == TRILL_RL_MAX_EXT_METRICS ? "too many metrics" : "a metric name too long", TRILL_RL_MAX_EXT_METRICS,
                               sizeof m->ext_name[0]);
        snprintf(m->ext_name[m->n_ext], sizeof m->ext_name[0], "%s", key);
        m->ext_value[m->n_ext++] = json_number_value(val) / b->n_seqs;
    }
    return TRILL_OK;
}

trill_status trill_rl_stage_train(rl_run *r, rl_rollout *ro, trill_rl_metrics *m, double *train_s_out, long *train_tokens_out) {
    const trill_rl_config *c = r->c;
    rl_batch b = ro->b; /* borrowed */
    token_arrays ta = { 0 };
    train_stats ts = { 0 };
    int n_kept = 0, flat_groups = 0;
    int *kept = trill_malloc(sizeof(int) * (size_t)b.n_seqs);
    trill_status st = c->rollouts.save ? save_rollout(r, &b, r->state.step + 1) : TRILL_OK;
    const double t_reward = trill_now();
    if (!st && !kept) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = token_arrays_alloc(r, &b, &ta);
    if (!st) st = shape_rewards(r, &b, &ta, kept, &n_kept, &flat_groups);
    if (!st) st = run_minibatches(r, &b, kept, n_kept, &ta, &ts);
    if (!st && ts.optimizer_steps) st = check_adapter(r);
    const double t_train = trill_now();
    double sync_ms = 0;
    size_t sync_bytes = 0;
    if (!st && ts.optimizer_steps) {
        r->state.version++;
        st = r->publish(r, &sync_ms, &sync_bytes);
    }
    const double t_end = trill_now();
    if (!st) st = batch_metrics(r, ro, &ts, flat_groups, n_kept, m);
    if (!st) st = measure_mismatch(r, &b, kept, n_kept, &ta, m);
    if (!st) {
        m->sync_mode = c->sync.mode;
        m->sync_bytes = sync_bytes;
        m->sync_ms = sync_ms;
        m->policy_version = r->state.version;
        m->time.generate_s = ro->gen_s;
        m->time.reward_s = ro->reward_s;
        m->time.train_s = t_train - t_reward;
        m->time.sync_s = t_end - t_train;
        m->time.step_s = ro->gen_s + ro->reward_s + (t_end - t_reward);
        m->time.gen_tokens_per_s = ro->gen_tokens / ro->gen_s;
        m->time.train_tokens_per_s = ts.tokens / (t_train - t_reward);
    }
    *train_s_out = t_train - t_reward;
    *train_tokens_out = ts.tokens;
    token_arrays_free(&ta);
    free(kept);
    if (!st) r->state.data_pos = (ro->index + 1) * c->generator.prompts_per_step;
    return st;
}

/* ---- the run ---- */

/* metrics.jsonl keeps only the steps up to `step` (a resumed run rewrites what came after). */
static trill_status open_metrics(rl_run *r, const char *run_dir, int step) {
    char *path = trill_path_join(run_dir, "metrics.jsonl");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    char *data = NULL;
    size_t len = 0, keep = 0;
    if (step > 0 && trill_file_exists(path) && trill_read_file(path, &data, &len) == TRILL_OK) {
        for (size_t at = 0; at < len;) {
            char *nl = memchr(data + at, '\n', len - at);
            if (!nl) break; /* a torn last line */
            json_t *j = json_loadb(data + at, (size_t)(nl - data - at), 0, NULL);
            json_t *s = j ? json_object_get(j, "step") : NULL;
            bool ok = json_is_integer(s) && json_integer_value(s) <= step;
            json_decref(j);
            if (!ok) break;
            at = (size_t)(nl - data) + 1;
            keep = at;
        }
    }
    trill_status st = trill_write_file_atomic(path, data ? data : "", keep);
    free(data);
    if (!st && !(r->metrics = fopen(path, "a"))) st = trill_error(TRILL_ERR_IO, "%s: cannot open for appending (%s)", path, strerror(errno));
    free(path);
    return st;
}

static trill_status append_metrics(rl_run *r, const trill_rl_metrics *m) {
    char *line = trill_rl_metrics_json(m);
    if (!line) return trill_error(TRILL_ERR_NOMEM, "out of memory for the metrics of step %d", m->step);
    int bad = fprintf(r->metrics, "%s\n", line) < 0 || fflush(r->metrics) != 0;
    free(line);
    return bad ? trill_error(TRILL_ERR_IO, "metrics.jsonl: write failed (%s)", strerror(errno)) : TRILL_OK;
}

static trill_status evaluate(rl_run *r, const char *when, double *pass1, double *passk) {
    const trill_rl_config *c = r->c;
    trill_eval_options o = { .limit = c->data.eval_size, .k = c->eval.k, .temperature = c->eval.temperature,
                             .max_new_tokens = c->generator.max_new_tokens, .verifier = r->verifier,
                             .seed = c->seed ^ 0x6576616cu /* "eval": the same draws before and after */,
                             .stop_ids = r->proto.stop_ids, .n_stop_ids = r->proto.n_stop_ids,
                             .stops = r->proto.stop_strings, .n_stops = r->proto.n_stop_strings };
    trill_eval_result res;
    trill_status st = trill_rl_evaluate(r->engine, r->tok, r->eval, &o, &res);
    if (st) return st;
    trill_log(TRILL_LOG_INFO, "trill train: held-out %s: pass@1 %.1f%%  pass@%d %.1f%%  (%d prompts x %d samples, T=%g, policy version %u, %.1f s)",
            when, 100 * res.pass1, res.k, 100 * res.passk, res.prompts, res.k, c->eval.temperature, trill_engine_version(r->engine),
            res.seconds);
    *pass1 = res.pass1;
    *passk = res.passk;
    return TRILL_OK;
}

static void format_duration(double s, char *out, size_t n) {
    if (!isfinite(s) || s < 0) snprintf(out, n, "?");
    else if (s < 60) snprintf(out, n, "%.0fs", s);
    else if (s < 3600) snprintf(out, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(out, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

/* A figure for the progress line: 0 where it does not apply. */
static double shown(double v) { return isfinite(v) ? v : 0; }

trill_status trill_rl_finish_step(rl_run *r, const trill_rl_metrics *m, double step_wall_s) {
    const trill_rl_config *c = r->c;
    r->state.step++;
    trill_status st = append_metrics(r, m);
    if (st) return st;
    char eta[32];
    format_duration(step_wall_s * (c->steps - r->state.step), eta, sizeof eta);
    const double per = step_wall_s > 0 ? step_wall_s : 1;
    trill_log(TRILL_LOG_INFO, "step %d/%d | reward %.3f acc %.1f%% | loss %+.4f kl %.2e | mismatch |d| %.2e k3 %.2e flips %.1f%% | "
            "gen %.0f tok/s train %.0f tok/s | time gen %.0f%% train %.0f%% sync %.1f ms%s | ETA %s",
            r->state.step, c->steps, shown(m->reward), 100 * shown(m->accuracy), shown(m->loss), shown(m->kl_ref),
            shown(m->mismatch_mean_abs), shown(m->mismatch_k3), 100 * shown(m->flip_token_frac), shown(m->time.gen_tokens_per_s),
            shown(m->time.train_tokens_per_s), 100 * shown(m->time.generate_s) / per, 100 * shown(m->time.train_s) / per,
            shown(m->sync_ms), c->mode == TRILL_MODE_ASYNC ? " (async: overlapped)" : "", eta);
    if ((c->checkpoint.every > 0 && r->state.step % c->checkpoint.every == 0) || r->state.step == c->steps) {
        st = trill_rl_checkpoint_save(c->run_dir, c, &r->state, r->lora, r->opt, &r->base, c->checkpoint.keep);
        if (!st) r->saved_step = r->state.step;
    }
    return st;
}

static void report_skipped(const char *ckpt, void *ctx) {
    int *n = ctx;
    (*n)++;
    trill_log(TRILL_LOG_WARN, "trill train: skipping checkpoint %s: %s", ckpt, trill_error_message());
}

static void count_skipped(const char *ckpt, void *ctx) { (void)ckpt; (*(int *)ctx)++; }

/* The checkpoint to continue from (none: a fresh run), its state, and the keys that must not change. */
static trill_status start_state(rl_run *r, char **ckpt) {
    const trill_rl_config *c = r->c;
    *ckpt = NULL;
    trill_status st = trill_rl_checkpoint_clean(c->run_dir);
    int skipped = 0;
    if (st) return st;
    if (strcmp(c->resume, "auto") == 0) {
        st = trill_rl_checkpoint_latest(c->run_dir, ckpt, report_skipped, &skipped);
        if (!st && !*ckpt && skipped)
            return trill_error(TRILL_ERR_INVALID, "run_dir %s: none of its %d checkpoints is complete (see above)", c->run_dir, skipped);
    } else if (c->resume[0]) {
        if (!(*ckpt = trill_strdup(c->resume))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        st = trill_rl_checkpoint_verify(*ckpt);
    } else {
        char *latest = NULL;
        st = trill_rl_checkpoint_latest(c->run_dir, &latest, count_skipped, &skipped);
        if (!st && (latest || skipped))
            st = trill_error(TRILL_ERR_INVALID, "run_dir %s already has checkpoints (%s): continue it with resume=auto "
                             "(or --resume), or choose another run_dir", c->run_dir, latest ? latest : "none complete");
        free(latest);
    }
    if (st) return st;
    r->state = (rl_state){ .seed = c->seed };
    if (!*ckpt) return TRILL_OK;
    trill_rl_config saved;
    char *path = NULL;
    st = trill_rl_config_defaults(&saved);
    if (!st) st = (path = trill_path_join(*ckpt, "config.yaml")) ? trill_rl_config_load(&saved, path) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_rl_config_check_resume(&saved, c, *ckpt);
    if (!st) st = trill_rl_checkpoint_read_state(*ckpt, &r->state);
    trill_rl_config_free(&saved);
    free(path);
    return st;
}

static trill_status make_trainable(rl_run *r, const char *ckpt) {
    const trill_rl_config *c = r->c;
    trill_status st;
    char path[4200];
    if (ckpt) {
        snprintf(path, sizeof path, "%s/adapter", ckpt);
        st = trill_lora_load(r->policy, path, &r->lora);
        if (!st) { snprintf(path, sizeof path, "%s/optimizer", ckpt); st = trill_adamw_load(path, r->lora->n_params, &r->opt); }
        if (!st) r->opt->config.weight_decay = c->trainer.weight_decay; /* the moments are the checkpoint's, the settings this config's */
    } else {
        st = trill_lora_create(r->policy, c->trainer.lora, c->seed, &r->lora);
        trill_adamw_config ac = trill_adamw_defaults();
        ac.weight_decay = c->trainer.weight_decay;
        if (!st) st = trill_adamw_create(r->lora->n_params, ac, &r->opt);
    }
    if (st) return st;
    r->lora->enabled = true;
    trill_model_attach_lora(r->policy, r->lora);
    if (!(r->lora_grads = trill_malloc(sizeof(float) * r->lora->n_params))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    double ms;
    size_t bytes;
    return trill_rl_sync_direct(r, &ms, &bytes); /* the generator serves the policy being trained */
}

/* ---- one process per run folder; stopping on request ---- */

/* run_dir/.lock, held with flock for the whole run: the kernel releases it when the process
 * ends however it ends, so a stale lock never blocks a new run. The holder's pid is in it. */
static trill_status lock_run_dir(rl_run *r) {
    char *path = trill_path_join(r->c->run_dir, ".lock");
    if (!path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    r->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644); /* not inherited by reward processes */
    if (r->lock_fd < 0) st = trill_error(TRILL_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    else if (flock(r->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t n = errno == EWOULDBLOCK ? pread(r->lock_fd, pid, sizeof pid - 1, 0) : -1;
        if (n > 0) pid[strcspn(pid, "\n")] = '\0';
        st = errno == EWOULDBLOCK || n >= 0
                 ? trill_error(TRILL_ERR_INVALID, "run_dir %s is in use by another trill train (process %s holds %s); wait for it to end "
                               "or choose another run_dir", r->c->run_dir, n > 0 ? pid : "?", path)
                 : trill_error(TRILL_ERR_IO, "%s: cannot lock: %s", path, strerror(errno));
        close(r->lock_fd);
        r->lock_fd = -1;
    } else {
        char pid[32];
        const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(r->lock_fd, 0) != 0 || pwrite(r->lock_fd, pid, (size_t)n, 0) != n)
            st = trill_error(TRILL_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    free(path);
    return st;
}

static volatile sig_atomic_t g_stop_requested;

void trill_rl_request_stop(void) { g_stop_requested = 1; }
bool trill_rl_stop_requested(void) { return g_stop_requested != 0; }

trill_status trill_rl_run(const trill_rl_config *c, trill_rl_result *result) {
    const double t_start = trill_now();
    trill_rl_config named;
    char auto_dir[64];
    if (!c->run_dir[0]) { /* a fresh folder per run */
        time_t now = time(NULL);
        strftime(auto_dir, sizeof auto_dir, "runs/%Y%m%d-%H%M%S", localtime(&now));
        named = *c;
        named.run_dir = auto_dir;
        c = &named;
    }
    *result = (trill_rl_result){ .eval_before = NAN, .eval_after = NAN, .passk_before = NAN, .passk_after = NAN };
    trill_status st = trill_rl_config_validate(c);
    if (st) return st;
    if (c->generator.temperature != 1.0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "generator.temperature: the trainer computes log-probs at temperature 1, so "
                           "training needs generator.temperature 1 (got %g)", c->generator.temperature);
    g_stop_requested = 0;
    rl_run r = { .c = c, .lock_fd = -1 };
    char *ckpt = NULL;
    if (!(st = trill_mkdir_p(c->run_dir))) st = lock_run_dir(&r);
    if (!st) st = start_state(&r, &ckpt);
    if (!st) st = resolve_inputs(&r);
    if (!st) st = trill_rl_model_identity(r.model_dir, &r.base);
    if (!st && ckpt) st = trill_rl_checkpoint_check_base(ckpt, &r.base, r.model_dir);
    if (!st) st = load_data(&r);
    if (!st) st = load_models(&r);
    if (!st) st = make_trainable(&r, ckpt);
    if (!st) {
        char *path = trill_path_join(c->run_dir, "config.yaml");
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!path || !f) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st) st = trill_rl_config_write(c, f);
        if (f) fclose(f);
        if (!st) st = trill_write_file_atomic(path, buf, len);
        free(buf);
        free(path);
    }
    if (!st) st = open_metrics(&r, c->run_dir, r.state.step);
    if (!st) {
        const trill_config *mc = &r.policy->config;
        trill_log(TRILL_LOG_INFO, "trill train: %s (%d layers, %d MoE, %d experts top-%d), %d train / %d held-out prompts, LoRA r%d (%zu "
                "parameters), generator %s, loss %s, router replay %s, TIS %g, sync %s%s",
                r.model_dir, mc->num_hidden_layers, mc->n_moe_layers, mc->num_experts, mc->num_experts_per_tok, r.train->n,
                r.eval ? r.eval->n : 0, c->trainer.lora.rank, r.lora->n_params, trill_gen_format_name(c->generator.dtype),
                (const char *[]){ "ppo", "gspo", "cispo", "reinforce", "aipo" }[c->algo.loss], c->router_replay ? "on" : "off",
                c->correction.tis, c->sync.mode == TRILL_SYNC_ADAPTER ? "adapter" : "merge",
                ckpt ? " (resumed)" : "");
        if (ckpt) trill_log(TRILL_LOG_INFO, "trill train: resuming from %s at step %d", ckpt, r.state.step);
    }
    if (!st && r.eval && r.state.step == 0) st = evaluate(&r, "before", &result->eval_before, &result->passk_before);
    const int first = r.state.step;
    double gen_s = 0, train_s = 0;
    long gen_tok = 0, train_tok = 0;
    r.publish = trill_rl_sync_direct;
    if (!st && c->mode == TRILL_MODE_ASYNC) st = trill_rl_async_loop(&r, &gen_s, &train_s, &gen_tok, &train_tok);
    while (!st && c->mode == TRILL_MODE_SYNC && r.state.step < c->steps && !trill_rl_stop_requested()) {
        trill_rl_metrics *m = trill_calloc(1, sizeof *m);
        if (!m) { st = trill_error(TRILL_ERR_NOMEM, "out of memory"); break; }
        m->step = r.state.step + 1;
        double trs = 0;
        long tt = 0;
        const double t0 = trill_now();
        rl_rollout ro;
        const int64_t index = r.state.data_pos / c->generator.prompts_per_step;
        if (c->rollouts.replay[0]) {
            st = replay_rollout(&r, index, &ro);
        } else {
            st = trill_rl_stage_generate(&r, index, &ro, NULL, NULL);
            if (!st) st = trill_rl_stage_reward(&r, &ro);
        }
        if (!st) st = trill_rl_stage_train(&r, &ro, m, &trs, &tt);
        gen_s += ro.gen_s; train_s += trs; gen_tok += ro.gen_tokens; train_tok += tt;
        trill_rl_rollout_free(&ro);
        if (!st && r.eval && c->eval.every > 0 && r.state.step + 1 < c->steps && (r.state.step + 1) % c->eval.every == 0) {
            m->has_eval = true;
            st = evaluate(&r, "now", &m->eval_pass1, &m->eval_passk);
        }
        if (!st) st = trill_rl_finish_step(&r, m, trill_now() - t0);
        free(m);
    }
    if (!st && r.state.step < c->steps && trill_rl_stop_requested()) { /* the step in progress finished: keep it */
        if (r.state.step > first && r.saved_step != r.state.step)
            st = trill_rl_checkpoint_save(c->run_dir, c, &r.state, r.lora, r.opt, &r.base, c->checkpoint.keep);
        if (!st)
            st = trill_error(TRILL_ERR_INTERRUPTED, "stopped on request after step %d of %d%s; continue with resume=auto", r.state.step,
                             c->steps, r.state.step > first ? " (checkpoint written)" : "");
    }
    if (!st && r.eval && r.state.step == c->steps) st = evaluate(&r, "after", &result->eval_after, &result->passk_after);
    if (!st) {
        result->steps_done = r.state.step - first;
        result->seconds = trill_now() - t_start;
        trill_log(TRILL_LOG_INFO, "trill train: %d steps in %.1f s (generation %.1f s at %.0f tok/s, training %.1f s at %.0f tok/s); run folder %s",
                result->steps_done, result->seconds, gen_s, gen_s > 0 ? gen_tok / gen_s : 0, train_s, train_s > 0 ? train_tok / train_s : 0,
                c->run_dir);
    }
    free(ckpt);
    run_free(&r);
    return st;
}
