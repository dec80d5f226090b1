#include "rollout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void rl_batch_free(rl_batch *b) {
    if (b->completion)
        for (int s = 0; s < b->n_seqs; s++) free(b->completion[s]);
    free(b->offsets); free(b->prompt_len); free(b->tokens); free(b->behav_logp); free(b->version); free(b->experts);
    free(b->example); free(b->completion); free(b->reward); free(b->adv); free(b->correct); free(b->keep);
    memset(b, 0, sizeof *b);
}

static bool is_stop(const trill_request *r, int id) {
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == id) return true;
    return false;
}

trill_status rl_generate(trill_engine *e, const trill_tokenizer *tok, const trill_dataset *d, const int *examples, int n_prompts,
                         int group_size, uint64_t first_request, const trill_request *proto, int n_moe_layers, int top_k,
                         trill_status (*between_steps)(void *), void *ctx, rl_batch *b) {
    memset(b, 0, sizeof *b);
    const int n = n_prompts * group_size;
    trill_status st = TRILL_OK;
    for (int p = 0; p < n_prompts && !st; p++) {
        trill_request r = *proto;
        r.id = first_request + (uint64_t)p;
        r.prompt = d->examples[examples[p]].ids;
        r.prompt_len = d->examples[examples[p]].n_ids;
        r.n = group_size;
        st = trill_engine_submit(e, &r);
    }
    while (!st && trill_engine_busy(e)) {
        if (between_steps) st = between_steps(ctx);
        if (!st) st = trill_engine_step(e, NULL);
    }
    trill_sequence_out *outs = calloc((size_t)n, sizeof *outs);
    if (!outs) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    int got = 0;
    if (!st) {
        trill_sequence_out tmp[64];
        int k;
        while ((k = trill_engine_collect(e, tmp, 64)) > 0)
            for (int i = 0; i < k; i++) {
                int slot = (int)(tmp[i].request - first_request) * group_size + tmp[i].sample;
                if (slot < 0 || slot >= n || outs[slot].tokens) { trill_sequence_out_free(&tmp[i]); continue; }
                outs[slot] = tmp[i];
                got++;
            }
        if (got != n) st = trill_error(TRILL_ERR_INVALID, "generator: %d of %d samples came back", got, n);
    }
    const int L = n_moe_layers, K = top_k;
    size_t T = 0;
    for (int s = 0; s < n && !st; s++) T += (size_t)(outs[s].n_prompt + outs[s].n_generated);
    b->n_seqs = n; b->group_size = group_size; b->n_moe_layers = L; b->top_k = K;
    if (!st) {
        b->offsets = malloc(sizeof(int) * (size_t)(n + 1));
        b->prompt_len = malloc(sizeof(int) * (size_t)n);
        b->tokens = malloc(sizeof(int) * T);
        b->behav_logp = malloc(sizeof(float) * T);
        b->version = calloc(T, sizeof(uint32_t));
        b->experts = L ? malloc(sizeof(uint16_t) * T * (size_t)L * K) : NULL;
        b->example = malloc(sizeof(int) * (size_t)n);
        b->completion = calloc((size_t)n, sizeof(char *));
        b->reward = calloc((size_t)n, sizeof(double));
        b->adv = calloc((size_t)n, sizeof(double));
        b->correct = calloc((size_t)n, sizeof(double));
        b->keep = calloc((size_t)n, sizeof(bool));
        if (!b->offsets || !b->prompt_len || !b->tokens || !b->behav_logp || !b->version || (L && !b->experts) || !b->example ||
            !b->completion || !b->reward || !b->adv || !b->correct || !b->keep)
            st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    size_t at = 0;
    for (int s = 0; s < n && !st; s++) {
        const trill_sequence_out *o = &outs[s];
        const int len = o->n_prompt + o->n_generated;
        b->offsets[s] = (int)at;
        b->prompt_len[s] = o->n_prompt;
        b->example[s] = examples[s / group_size];
        b->keep[s] = true;
        memcpy(b->tokens + at, o->tokens, sizeof(int) * (size_t)len);
        for (int t = 0; t < o->n_prompt; t++) b->behav_logp[at + t] = NAN;
        memcpy(b->behav_logp + at + o->n_prompt, o->logprobs, sizeof(float) * (size_t)o->n_generated);
        memcpy(b->version + at + o->n_prompt, o->versions, sizeof(uint32_t) * (size_t)o->n_generated);
        if (L) {
            const size_t row = (size_t)L * K;
            if (o->experts) memcpy(b->experts + at * row, o->experts, sizeof(uint16_t) * row * (size_t)(len - 1));
            else for (size_t i = 0; i < row * (size_t)(len - 1); i++) b->experts[at * row + i] = TRILL_REPLAY_NONE;
            for (size_t i = 0; i < row; i++) b->experts[(at + (size_t)len - 1) * row + i] = TRILL_REPLAY_NONE;
        }
        int n_text = o->n_generated;
        if (n_text > 0 && o->finish == TRILL_FINISH_STOP_ID && is_stop(proto, o->tokens[len - 1])) n_text--;
        size_t text_len;
        st = trill_tokenizer_decode_lenient(tok, o->tokens + o->n_prompt, n_text, &b->completion[s], &text_len);
        at += (size_t)len;
    }
    if (!st) b->offsets[n] = (int)at;
    for (int s = 0; s < n; s++) trill_sequence_out_free(&outs[s]);
    free(outs);
    if (st) {
        /* leave the engine empty for the next caller */
        trill_sequence_out tmp[16];
        int k;
        while (trill_engine_busy(e)) if (trill_engine_step(e, NULL)) break;
        while ((k = trill_engine_collect(e, tmp, 16)) > 0) for (int i = 0; i < k; i++) trill_sequence_out_free(&tmp[i]);
        rl_batch_free(b);
    }
    return st;
}
