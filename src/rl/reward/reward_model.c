/* Reward model scoring (trill/reward_model.h): the model's layers up to the final norm at the
 * pooled token (trill_model_forward_last_hidden), then the one-row score head. */
#include "model/lora_internal.h"
#include "trill/reward_model.h"
#include "base/alloc.h"

#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"
#include "trill/tokenizer.h"

/* Tokens per packed forward pass: bounds the activations (inference reuses one layer's
 * buffers, a few dozen floats per token and hidden unit). */
enum { RM_BATCH_TOKENS = 4096 };

struct trill_reward_model {
    trill_model *model;
    trill_tokenizer *tok;
    float *score_row; /* score.weight [1, H], widened to fp32 */
};

const trill_model *trill_reward_model_model(const trill_reward_model *rm) { return rm->model; }

void trill_reward_model_free(trill_reward_model *rm) {
    if (!rm) return;
    trill_model_free(rm->model);
    trill_tokenizer_free(rm->tok);
    free(rm->score_row);
    free(rm);
}

trill_status trill_reward_model_load(const char *dir, trill_reward_model **out) {
    char *config_path = trill_path_join(dir, "config.json");
    if (!config_path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_config c;
    trill_status st = trill_config_load(config_path, &c); /* refuse before reading any weights */
    if (!st && c.num_labels == 0)
        st = trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"architectures\": %s is a causal LM, not a reward model "
                         "(expected \"Qwen3ForSequenceClassification\" or \"Qwen3MoeForSequenceClassification\" with one label)",
                         config_path, trill_config_architecture(&c));
    else if (!st && c.num_labels != 1)
        st = trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"id2label\": a reward model has one label, this %s has %d",
                         config_path, trill_config_architecture(&c), c.num_labels);
    free(config_path);
    if (st) return st;

    trill_reward_model *rm = trill_calloc(1, sizeof *rm);
    if (!rm) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!(st = trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &rm->model)) && !(st = trill_tokenizer_load(dir, &rm->tok))) {
        const trill_model *m = rm->model;
        const int H = m->config.hidden_size;
        if (!(rm->score_row = trill_malloc(sizeof(float) * (size_t)H))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else if (m->score.f32) memcpy(rm->score_row, m->score.f32, sizeof(float) * (size_t)H);
        else trill_to_f32(rm->score_row, m->score.bf16, TRILL_BF16, (size_t)H);
    }
    if (st) {
        trill_error_context("reward model %s", dir);
        trill_reward_model_free(rm);
        return st;
    }
    *out = rm;
    return TRILL_OK;
}

/* HF's pooled position within a sequence: its rightmost token that is not pad_token_id
 * (argmax of index * not-pad: 0 when every token is pad), or the last token without one. */
static int pooled_length(const int *ids, int len, int pad) {
    if (pad < 0) return len;
    while (len > 1 && ids[len - 1] == pad) len--;
    return len;
}

trill_status trill_reward_model_score_tokens(const trill_reward_model *rm, const int *tokens, const int *offsets, int n_seqs,
                                             double *scores) {
    const trill_model *m = rm->model;
    const int H = m->config.hidden_size, pad = m->config.pad_token_id;
    if (n_seqs <= 0) return TRILL_OK;
    for (int s = 0; s < n_seqs; s++)
        if (offsets[s + 1] <= offsets[s]) return trill_error(TRILL_ERR_INVALID, "reward model: sequence %d has no token to score", s);
    /* drop trailing pad tokens (causal: the pooled hidden state does not see them) */
    int *cut = trill_malloc(sizeof(int) * (size_t)(n_seqs + 1));
    int *ids = trill_malloc(sizeof(int) * (size_t)offsets[n_seqs]);
    float *hidden = trill_malloc(sizeof(float) * (size_t)n_seqs * H);
    trill_status st = TRILL_OK;
    if (!cut || !ids || !hidden) st = trill_error(TRILL_ERR_NOMEM, "out of memory for %d sequences", n_seqs);
    if (!st) {
        cut[0] = 0;
        for (int s = 0; s < n_seqs; s++) {
            const int len = pooled_length(tokens + offsets[s], offsets[s + 1] - offsets[s], pad);
            memcpy(ids + cut[s], tokens + offsets[s], sizeof(int) * (size_t)len);
            cut[s + 1] = cut[s] + len;
        }
        st = trill_model_forward_last_hidden(m, ids, cut, n_seqs, hidden);
    }
    if (!st)
        for (int s = 0; s < n_seqs; s++) {
            const float *h = hidden + (size_t)s * H;
            double sum = 0;
            for (int i = 0; i < H; i++) sum += (double)h[i] * rm->score_row[i];
            scores[s] = sum;
        }
    free(cut);
    free(ids);
    free(hidden);
    return st;
}

/* Tokenizes texts[first ..] into one packed batch of at most RM_BATCH_TOKENS tokens (a
 * longer text alone) and scores it; *next is the first text not in it. */
static trill_status score_batch(const trill_reward_model *rm, const char *const *texts, int first, int n, double *scores,
                                int *next) {
    const int V = rm->model->config.vocab_size;
    int *tokens = NULL, offsets_cap = 16, n_seqs = 0;
    size_t cap = 0;
    int *offsets = trill_malloc(sizeof(int) * (size_t)offsets_cap);
    trill_status st = offsets ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (offsets) offsets[0] = 0;
    int i = first;
    for (; i < n && !st; i++) {
        int *ids = NULL;
        size_t len = 0;
        if ((st = trill_tokenizer_encode(rm->tok, texts[i], strlen(texts[i]), false, &ids, &len))) {
            trill_error_context("reward model: text %d", i);
            break;
        }
        if (len == 0) st = trill_error(TRILL_ERR_INVALID, "reward model: text %d is empty (no token to score)", i);
        else if (len > (size_t)1 << 30) st = trill_error(TRILL_ERR_INVALID, "reward model: text %d has %zu tokens (too long)", i, len);
        for (size_t k = 0; k < len && !st; k++)
            if (ids[k] >= V)
                st = trill_error(TRILL_ERR_INVALID, "reward model: text %d: token id %d from tokenizer.json is outside the model's vocab_size %d",
                                 i, ids[k], V);
        const size_t used = (size_t)offsets[n_seqs];
        if (!st && n_seqs > 0 && used + len > RM_BATCH_TOKENS) { /* full: this text starts the next batch */
            free(ids);
            break;
        }
        if (!st && used + len > cap) {
            size_t want = used + len > RM_BATCH_TOKENS ? used + len : RM_BATCH_TOKENS;
            int *grown = trill_realloc(tokens, sizeof(int) * want);
            if (grown) tokens = grown, cap = want;
            else st = trill_error(TRILL_ERR_NOMEM, "out of memory for %zu tokens", want);
        }
        if (!st && n_seqs + 2 > offsets_cap) {
            int *grown = trill_realloc(offsets, sizeof(int) * (size_t)(offsets_cap *= 2));
            if (grown) offsets = grown;
            else st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        }
        if (!st) {
            memcpy(tokens + used, ids, sizeof(int) * len);
            offsets[n_seqs + 1] = (int)(used + len);
            n_seqs++;
        }
        free(ids);
    }
    if (!st) st = trill_reward_model_score_tokens(rm, tokens, offsets, n_seqs, scores + first);
    *next = i;
    free(tokens);
    free(offsets);
    return st;
}

trill_status trill_reward_model_score(const trill_reward_model *rm, const char *const *texts, int n, double *scores) {
    for (int i = 0; i < n;) {
        trill_status st = score_batch(rm, texts, i, n, scores, &i);
        if (st) return st;
    }
    return TRILL_OK;
}
