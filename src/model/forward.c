/* The training forward pass (fp32): the reference the generator is checked against, and the
 * first half of training. One code path for both; training keeps every layer's activations for
 * src/train/backward.c. This file is the generic driver: the packed batch, the activation plan,
 * the embedding, the decoder layers of the model's family (src/arch/<family>/: one call per
 * layer), the final norm and lm_head + log-softmax in chunks of rows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arch/family.h"
#include "base/tls.h"
#include "base/alloc.h"
#include "forward_internal.h"
#include "model/decoder.h"
#include "model/moe_ep.h"
#include "trill/kernels.h"

/* ---- activation plan: one allocation, carved in two passes (measure, then assign) ---- */

static void assign(trill_forward_pass *fp, trill_plan *p) {
    const trill_config *c = &fp->m->config;
    const size_t T = (size_t)fp->T, H = c->hidden_size, F = sizeof(float);
    fp->f->plan(fp, p);
    fp->xf = trill_plan_take(p, T * H * F);
    fp->pos = trill_plan_take(p, T * sizeof(int));
    if (fp->lora) fp->xa_head = trill_plan_take(p, (size_t)LOGIT_CHUNK * fp->lora->config.rank * F);
}

/* A pass's activations live in its thread's lent buffer: the next pass reuses the same memory
 * rather than having the kernel fault gigabytes of fresh pages in every step. */
static trill_tls_slot pass_slot;

static trill_status pass_alloc(const trill_model *m, int T, bool training, bool recompute, trill_forward_pass **out) {
    trill_forward_pass *fp = trill_calloc(1, sizeof *fp);
    if (!fp) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    *fp = (trill_forward_pass){ .m = m, .f = &trill_decoder_layers, .T = T, .training = training,
                                .recompute = training && recompute, .lora = m->lora && m->lora->enabled ? m->lora : NULL,
                                .precision = m->precision };
    trill_plan p = { 0 };
    assign(fp, &p);
    fp->block = trill_tls_lend(&pass_slot, p.used);
    if (!(p.base = fp->block.p)) {
        free(fp);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for the activations of %d tokens (%.2f GB)", T, p.used * 1e-9);
    }
    p.used = 0;
    assign(fp, &p);
    trill_status st = trill_ep_pass_begin(fp);
    if (st) {
        trill_forward_pass_free(fp);
        return st;
    }
    *out = fp;
    return TRILL_OK;
}

void trill_forward_pass_free(trill_forward_pass *fp) {
    if (!fp) return;
    trill_ep_pass_end(fp);
    trill_tls_return(&fp->block);
    free(fp);
}

trill_status trill_linear(const trill_forward_pass *fp, float *out, const float *inp, trill_weight W, trill_lora_pair ad, float *xa,
                          int n, int K, int N) {
    trill_status st = trill_matmul_forward_wp(out, inp, W, n, K, N, fp->precision);
    if (st || !fp->lora || !ad.A) return st;
    const int r = fp->lora->config.rank;
    st = trill_matmul_forward_p(xa, inp, ad.A, n, K, r, fp->precision);
    return st ? st : trill_matmul_accumulate_p(out, xa, ad.B, n, r, N, fp->lora->scale, fp->precision);
}

static trill_status check_batch(const trill_config *c, const int *tokens, const int *offsets, int n_seqs) {
    if (n_seqs < 0 || (n_seqs > 0 && offsets[0] != 0))
        return trill_error(TRILL_ERR_INVALID, "batch: sequence offsets must start at 0");
    for (int s = 0; s < n_seqs; s++) {
        if (offsets[s + 1] < offsets[s])
            return trill_error(TRILL_ERR_INVALID, "batch: sequence %d has negative length", s);
        for (int t = offsets[s]; t < offsets[s + 1]; t++)
            if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
                return trill_error(TRILL_ERR_INVALID, "batch: sequence %d, position %d: token id %d is outside the vocabulary [0, %d)",
                                   s, t - offsets[s], tokens[t], c->vocab_size);
    }
    return TRILL_OK;
}

trill_status trill_check_replay(const trill_config *c, const uint16_t *replay, int T) {
    const int L = c->n_moe_layers, K = c->num_experts_per_tok, E = c->num_experts;
    for (int t = 0; t < T; t++)
        for (int m = 0; m < L; m++) {
            const uint16_t *ids = replay + ((size_t)t * L + m) * K;
            if (ids[0] == TRILL_REPLAY_NONE) continue;
            for (int j = 0; j < K; j++) {
                if (ids[j] >= E)
                    return trill_error(TRILL_ERR_INVALID, "router replay: token %d, MoE layer %d: expert id %u is outside [0, %d)", t, m, ids[j], E);
                for (int i = 0; i < j; i++)
                    if (ids[i] == ids[j])
                        return trill_error(TRILL_ERR_INVALID, "router replay: token %d, MoE layer %d: expert %u appears twice", t, m, ids[j]);
            }
        }
    return TRILL_OK;
}

trill_status trill_forward_layer(const trill_forward_pass *fp, int l) { return fp->f->layer(fp, l, fp->replay, NULL); }

/* Runs every decoder layer and the final norm (into fp->xf). */
static trill_status run_layers(trill_forward_pass *fp, const uint16_t *replay, uint16_t *experts) {
    const trill_model *m = fp->m;
    const trill_config *c = &m->config;
    const int T = fp->T, H = c->hidden_size;
    for (int s = 0; s < fp->n_seqs; s++)
        for (int t = fp->offsets[s]; t < fp->offsets[s + 1]; t++) fp->pos[t] = t - fp->offsets[s];
    fp->f->begin(fp);
    trill_embedding_forward_w(fp->x_first, m->embed, fp->tokens, T, H);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        trill_status st = fp->f->layer(fp, l, replay, experts);
        if (st) {
            trill_error_context("layer %d", l);
            return st;
        }
    }
    trill_rmsnorm_offset_forward(fp->xf, fp->x_final, m->final_norm, trill_norm_offset(c, TRILL_ROLE_FINAL_NORM), T, H, (float)c->rms_norm_eps);
    return TRILL_OK;
}

/* logits of n rows starting at row t0 (lm_head with its adapter, if any) */
trill_status trill_forward_logits(const trill_forward_pass *fp, float *logits, int t0, int n) {
    const trill_model *m = fp->m;
    const trill_lora_pair none = { 0 };
    return trill_linear(fp, logits, fp->xf + (size_t)t0 * m->config.hidden_size, m->lm_head, fp->lora ? fp->lora->lm_head : none, fp->xa_head,
           n, m->config.hidden_size, m->config.vocab_size);
}

static trill_tls_slot logits_slot; /* one chunk of logits, reused */

static trill_status token_logprobs(const trill_forward_pass *fp, float *logprobs) {
    const int T = fp->T, V = fp->m->config.vocab_size, K = fp->n_targets;
    trill_tls_lease lease = trill_tls_lend(&logits_slot, sizeof(float) * LOGIT_CHUNK * (size_t)V);
    float *logits = lease.p;
    if (!logits) return trill_error(TRILL_ERR_NOMEM, "out of memory for logits");
    for (int s = 0; s < fp->n_seqs; s++)
        for (int k = 0; k < K && fp->offsets[s + 1] > fp->offsets[s]; k++) logprobs[(size_t)fp->offsets[s] * K + k] = NAN;
    for (int t0 = 0; t0 < T; t0 += LOGIT_CHUNK) {
        int n = T - t0 < LOGIT_CHUNK ? T - t0 : LOGIT_CHUNK;
        trill_status st = trill_forward_logits(fp, logits, t0, n);
        if (st) {
            trill_tls_return(&lease);
            trill_error_context("lm_head");
            return st;
        }
#pragma omp parallel for schedule(static)
        for (int r = 0; r < n; r++) {
            int t = t0 + r;
            if (t + 1 >= T || fp->pos[t + 1] == 0) continue; /* t ends its sequence */
            const float *row = logits + (size_t)r * V;
            if (K == 1) {
                logprobs[t + 1] = (float)((double)row[trill_forward_target(fp, t)] - trill_logsumexp(row, V));
                continue;
            }
            const double lse = trill_logsumexp(row, V);
            for (int k = 0; k < K; k++) logprobs[(size_t)(t + 1) * K + k] = (float)((double)row[fp->targets[(size_t)t * K + k]] - lse);
        }
    }
    trill_tls_return(&lease);
    return TRILL_OK;
}

static trill_status forward(const trill_model *m, const int *tokens, const int *targets, int n_targets, const int *offsets, int n_seqs,
                            const uint16_t *replay, float *logprobs, uint16_t *experts, bool training, bool recompute, trill_forward_pass **out) {
    const trill_config *c = &m->config;
    if (c->num_labels > 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s has a score head (num_labels %d) and no lm_head: it scores sequences "
                           "(trill_model_forward_last_hidden, trill/reward_model.h), it has no token log-probs",
                           trill_config_architecture(c), c->num_labels);
    trill_status st = check_batch(c, tokens, offsets, n_seqs);
    const int T = n_seqs > 0 ? offsets[n_seqs] : 0;
    if (!st && replay && c->n_moe_layers) st = trill_check_replay(c, replay, T);
    trill_forward_pass *fp = NULL;
    if (!st) st = pass_alloc(m, T, training, recompute, &fp);
    if (st) return st;
    fp->replay = replay;
    fp->tokens = tokens;
    fp->targets = targets;
    fp->n_targets = targets ? n_targets : 1;
    fp->offsets = offsets;
    fp->n_seqs = n_seqs;
    if (T > 0 || m->ep) { /* an expert-parallel rank with no tokens still serves its experts */
        st = run_layers(fp, replay, experts);
        if (!st) st = token_logprobs(fp, logprobs);
    }
    if (st || !out) trill_forward_pass_free(fp);
    else *out = fp;
    return st;
}

trill_status trill_model_forward(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                 const uint16_t *replay, float *logprobs, uint16_t *experts) {
    return forward(m, tokens, NULL, 1, offsets, n_seqs, replay, logprobs, experts, false, false, NULL);
}

trill_status trill_model_forward_train(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                       const uint16_t *replay, float *logprobs, uint16_t *experts, bool recompute,
                                       trill_forward_pass **pass) {
    return forward(m, tokens, NULL, 1, offsets, n_seqs, replay, logprobs, experts, true, recompute, pass);
}

trill_status trill_model_forward_train_targets(const trill_model *m, const int *tokens, const int *targets, int n_targets, const int *offsets,
                                               int n_seqs, const uint16_t *replay, float *logprobs, uint16_t *experts, bool recompute,
                                               trill_forward_pass **pass) {
    if (targets && (n_targets < 1 || n_targets > TRILL_MAX_TARGETS))
        return trill_error(TRILL_ERR_INVALID, "forward: %d targets a row; 1 to %d are taken", n_targets, TRILL_MAX_TARGETS);
    const size_t T = n_seqs > 0 && offsets ? (size_t)offsets[n_seqs] : 0;
    for (size_t i = 0; targets && i < T * (size_t)n_targets; i++)
        if (targets[i] < 0 || targets[i] >= m->config.vocab_size)
            return trill_error(TRILL_ERR_INVALID, "forward: target %d of row %zu is outside the vocabulary [0, %d)", targets[i], i / (size_t)n_targets,
                               m->config.vocab_size);
    return forward(m, tokens, targets, n_targets, offsets, n_seqs, replay, logprobs, experts, true, recompute, pass);
}

trill_status trill_model_forward_last_hidden(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                             float *hidden) {
    const trill_config *c = &m->config;
    trill_status st = check_batch(c, tokens, offsets, n_seqs);
    if (st) return st;
    for (int s = 0; s < n_seqs; s++)
        if (offsets[s + 1] == offsets[s]) return trill_error(TRILL_ERR_INVALID, "batch: sequence %d is empty (it has no last token to read)", s);
    const int T = n_seqs > 0 ? offsets[n_seqs] : 0;
    if (T == 0) return TRILL_OK;
    trill_forward_pass *fp;
    if ((st = pass_alloc(m, T, false, false, &fp))) return st;
    fp->tokens = tokens;
    fp->offsets = offsets;
    fp->n_seqs = n_seqs;
    if ((st = run_layers(fp, NULL, NULL))) {
        trill_forward_pass_free(fp);
        return st;
    }
    const size_t H = (size_t)c->hidden_size;
    for (int s = 0; s < n_seqs; s++) memcpy(hidden + (size_t)s * H, fp->xf + (size_t)(offsets[s + 1] - 1) * H, H * sizeof(float));
    trill_forward_pass_free(fp);
    return TRILL_OK;
}
