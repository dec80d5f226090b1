/* Multi-turn generation (trill/infer.h, trill_request.hold): a finished sample of a held request
 * stays in the held list with its KV blocks and its counts (its arrays went to its output, which
 * trill_engine_continue takes back), so its next turn prefills only the tokens it is given. */
#include <stdlib.h>
#include <string.h>

#include "infer/engine_internal.h"
#include "base/alloc.h"

/* FNV-1a over the token ids: what a continued sample must come back with. */
uint64_t trill_eng_token_digest(const int *tokens, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        const uint32_t t = (uint32_t)tokens[i];
        for (int b = 0; b < 4; b++) {
            h ^= (t >> (8 * b)) & 0xffu;
            h *= 1099511628211ull;
        }
    }
    return h;
}

trill_status trill_eng_reserve_held(trill_engine *e) {
    seq **h = eng_grow(e->sched.held, &e->sched.cap_held, e->sched.n_held + 1, sizeof *h);
    if (!h) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->sched.held = h;
    return TRILL_OK;
}

void trill_eng_hold(trill_engine *e, seq *s, uint64_t digest) {
    s->digest = digest;
    e->sched.held[e->sched.n_held++] = s;
}

void trill_eng_drop_req_if_done(trill_engine *e, req *q) {
    bool live = false;
    for (int i = 0; i < e->sched.n_active && !live; i++) live = e->sched.active[i]->rq == q;
    for (int i = 0; i < e->sched.n_waiting && !live; i++) live = e->sched.waiting[i]->rq == q;
    for (int i = 0; i < e->sched.n_held && !live; i++) live = e->sched.held[i]->rq == q;
    if (live) return;
    for (int i = 0; i < e->sched.n_reqs; i++)
        if (e->sched.reqs[i] == q) {
            trill_eng_free_req(q);
            e->sched.reqs[i] = e->sched.reqs[--e->sched.n_reqs];
            return;
        }
}

bool trill_eng_release_held_blocks(trill_engine *e) {
    for (int i = 0; i < e->sched.n_held; i++) { /* the oldest first */
        seq *s = e->sched.held[i];
        if (!s->kv.n) continue;
        trill_eng_kv_release(e, s);
        s->n_computed = 0; /* recomputed when continued */
        return true;
    }
    return false;
}

static int find_held(const trill_engine *e, uint64_t request, int sample) {
    for (int i = 0; i < e->sched.n_held; i++)
        if (e->sched.held[i]->rq->r.id == request && e->sched.held[i]->sample == sample) return i;
    return -1;
}

bool trill_engine_release(trill_engine *e, uint64_t request, int sample) {
    const int i = find_held(e, request, sample);
    if (i < 0) return false;
    seq *s = e->sched.held[i];
    req *q = s->rq;
    trill_eng_remove_at(e->sched.held, &e->sched.n_held, i);
    trill_eng_free_seq(e, s);
    trill_eng_drop_req_if_done(e, q);
    return true;
}

int trill_engine_held(const trill_engine *e) { return e->sched.n_held; }

/* prev is held sample s's output as it finished, and tokens[n] / max_new fit the vocabulary and the cache. */
static trill_status check_continue(const trill_engine *e, const seq *s, const trill_sequence_out *prev, const int *tokens, int n, int max_new) {
    const unsigned long long id = (unsigned long long)prev->request;
    const int total = prev->n_prompt + prev->n_generated;
    if (!prev->tokens || total != s->n_tokens || trill_eng_token_digest(prev->tokens, total) != s->digest)
        return trill_error(TRILL_ERR_INVALID, "request %llu, sample %d: the output given back is not the one it finished with", id, prev->sample);
    if (n < 1 || !tokens) return trill_error(TRILL_ERR_INVALID, "request %llu, sample %d: no tokens to continue with", id, prev->sample);
    if (max_new < 1) return trill_error(TRILL_ERR_INVALID, "request %llu, sample %d: max_new_tokens must be >= 1, got %d", id, prev->sample, max_new);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= e->c.vocab_size)
            return trill_error(TRILL_ERR_INVALID, "request %llu, sample %d: token %d is %d, outside the vocabulary [0, %d)", id, prev->sample, i,
                               tokens[i], e->c.vocab_size);
    const int need = kv_blocks_for(&e->kv, total + n + max_new);
    if (need > e->kv.n_blocks)
        return trill_error(TRILL_ERR_INVALID, "request %llu, sample %d: %d tokens, %d more and %d new need %d KV blocks of %d tokens, but the cache "
                           "holds %d (raise kv_cache_mb)", id, prev->sample, total, n, max_new, need, e->kv.block_size, e->kv.n_blocks);
    return TRILL_OK;
}

trill_status trill_engine_continue(trill_engine *e, trill_sequence_out *prev, const int *tokens, int n, int max_new_tokens) {
    const int at = find_held(e, prev->request, prev->sample);
    if (at < 0)
        return trill_error(TRILL_ERR_INVALID, "request %llu, sample %d is not held (a request with hold, finished, not released)",
                           (unsigned long long)prev->request, prev->sample);
    seq *s = e->sched.held[at];
    trill_status st = check_continue(e, s, prev, tokens, n, max_new_tokens);
    if (st) return st;
    const int old = s->n_tokens, cap = old + n + max_new_tokens;
    const size_t per_token = (size_t)e->c.n_moe_layers * e->c.num_experts_per_tok;
    int *tok = trill_malloc(sizeof(int) * (size_t)cap);
    float *lp = trill_malloc(sizeof(float) * (size_t)max_new_tokens);
    uint32_t *ver = trill_malloc(sizeof(uint32_t) * (size_t)max_new_tokens);
    uint16_t *ex = prev->experts ? trill_malloc(sizeof(uint16_t) * per_token * (size_t)cap) : NULL;
    seq **w = tok && lp && ver && (ex || !prev->experts) ? eng_grow(e->sched.waiting, &e->sched.cap_waiting, e->sched.n_waiting + 1, sizeof *w) : NULL;
    if (!w) {
        free(tok);
        free(lp);
        free(ver);
        free(ex);
        return trill_error(TRILL_ERR_NOMEM, "out of memory continuing request %llu, sample %d", (unsigned long long)prev->request, prev->sample);
    }
    e->sched.waiting = w;
    memcpy(tok, prev->tokens, sizeof(int) * (size_t)old);
    memcpy(tok + old, tokens, sizeof(int) * (size_t)n);
    if (ex) memcpy(ex, prev->experts, sizeof(uint16_t) * per_token * (size_t)(old - 1)); /* every token forwarded so far */
    s->tokens = tok, s->logprobs = lp, s->versions = ver, s->experts = ex;
    s->cap = cap;
    s->n_tokens = old + n;
    s->n_prompt = s->n_tokens;
    s->max_new = max_new_tokens;
    s->key_base = s->n_tokens - s->rq->r.prompt_len;
    trill_eng_remove_at(e->sched.held, &e->sched.n_held, at);
    e->sched.waiting[e->sched.n_waiting++] = s;
    trill_sequence_out_free(prev);
    return TRILL_OK;
}
