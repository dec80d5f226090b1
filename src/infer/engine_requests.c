/* Requests and sequences (engine_internal.h): submit, the request records (each owning its copy of
 * the prompt and stops) and their sequences, and the continuous-batching scheduler that picks a
 * step's rows and preempts when KV blocks run out. */
#include <stdlib.h>
#include <string.h>

#include "infer/engine_internal.h"
#include "infer/gen_decoder.h"
#include "base/alloc.h"

/* ---- requests ---- */

trill_status trill_eng_new_seq(trill_engine *e, req *q, int sample, seq **out) {
    const trill_request *r = &q->r;
    seq *s = trill_calloc(1, sizeof *s);
    if (!s) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    s->rq = q;
    s->sample = sample;
    s->cap = r->prompt_len + r->max_new_tokens;
    s->n_prompt = r->prompt_len;
    s->max_new = r->max_new_tokens;
    s->tokens = trill_malloc(sizeof(int) * (size_t)s->cap);
    s->logprobs = trill_malloc(sizeof(float) * (size_t)r->max_new_tokens);
    s->versions = trill_malloc(sizeof(uint32_t) * (size_t)r->max_new_tokens);
    const size_t per_token = (size_t)e->c.n_moe_layers * e->c.num_experts_per_tok;
    if (e->cfg.capture_experts && per_token) s->experts = trill_malloc(sizeof(uint16_t) * per_token * (size_t)s->cap);
    const size_t gdn = trill_gen_gdn_state_floats(&e->c);
    if (gdn) s->gdn = trill_calloc(gdn, sizeof(float));
    if (!s->tokens || !s->logprobs || !s->versions || (e->cfg.capture_experts && per_token && !s->experts) || (gdn && !s->gdn)) {
        trill_eng_free_seq(e, s);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for request %llu", (unsigned long long)r->id);
    }
    *out = s;
    return TRILL_OK;
}

/* ---- a sequence's KV tables ---- */

int trill_eng_kv_reserve(trill_engine *e, seq *s, int n_tokens, int write_from) {
    const int had = s->kv.n;
    int got = trill_kv_table_reserve(&e->kv, &s->kv, n_tokens, write_from);
    if (got || !e->kv_split) return got;
    if ((got = trill_kv_table_reserve(&e->kv_win, &s->kv_win, n_tokens, write_from)) != 0)
        while (s->kv.n > had) trill_kv_block_release(&e->kv, s->kv.blocks[--s->kv.n]); /* what this call took in kv */
    return got;
}

trill_status trill_eng_kv_share(trill_engine *e, seq *dst, const seq *src) {
    trill_status st = trill_kv_table_share(&e->kv, &dst->kv, &src->kv);
    if (!st && e->kv_split) st = trill_kv_table_share(&e->kv_win, &dst->kv_win, &src->kv_win);
    return st;
}

void trill_eng_kv_release(trill_engine *e, seq *s) {
    trill_kv_table_release(&e->kv, &s->kv);
    if (e->kv_split) trill_kv_table_release(&e->kv_win, &s->kv_win);
}

void trill_eng_kv_drop_window(trill_engine *e, seq *s) {
    /* the next rows, from position n_computed on, read from n_computed - window + 1 */
    if (e->kv_window) trill_kv_table_drop_before(&e->kv, &s->kv, s->n_computed - e->kv_window + 1);
    if (e->kv_split) trill_kv_table_drop_before(&e->kv_win, &s->kv_win, s->n_computed - e->kv_win_window + 1);
}

void trill_eng_free_seq(trill_engine *e, seq *s) {
    if (!s) return;
    trill_eng_kv_release(e, s);
    free(s->tokens);
    free(s->logprobs);
    free(s->versions);
    free(s->experts);
    free(s->gdn);
    free(s);
}

void trill_eng_free_req(req *q) {
    if (!q) return;
    for (int i = 0; i < q->r.n_stop_strings; i++) free(q->stop_strings[i]);
    free(q->stop_strings);
    free(q->prompt);
    free(q->stop_ids);
    free(q->forced);
    free(q->forced_at);
    free(q);
}

/* Every request and sequence, and the finished outputs nobody collected. */
void trill_eng_sched_free(trill_engine *e) {
    for (int i = 0; i < e->sched.n_active; i++) trill_eng_free_seq(e, e->sched.active[i]);
    for (int i = 0; i < e->sched.n_waiting; i++) trill_eng_free_seq(e, e->sched.waiting[i]);
    for (int i = 0; i < e->sched.n_reqs; i++) trill_eng_free_req(e->sched.reqs[i]);
    for (int i = 0; i < e->sched.n_held; i++) trill_eng_free_seq(e, e->sched.held[i]);
    for (int i = 0; i < e->sched.n_done; i++) trill_sequence_out_free(&e->sched.done[i]);
    free(e->sched.active);
    free(e->sched.waiting);
    free(e->sched.held);
    free(e->sched.reqs);
    free(e->sched.done);
}

/* A malformed request, or one that could never fit in the KV cache, is refused with a message. */
static trill_status check_request(const trill_engine *e, const trill_request *r) {
    const trill_config *c = &e->c;
    const unsigned long long id = (unsigned long long)r->id;
    if (r->prompt_len < 1 || !r->prompt) return trill_error(TRILL_ERR_INVALID, "request %llu: the prompt is empty", id);
    if (r->max_new_tokens < 1) return trill_error(TRILL_ERR_INVALID, "request %llu: max_new_tokens must be >= 1, got %d", id, r->max_new_tokens);
    if (r->n < 0) return trill_error(TRILL_ERR_INVALID, "request %llu: n (samples) must be >= 1, got %d", id, r->n);
    for (int i = 0; i < r->prompt_len; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= c->vocab_size)
            return trill_error(TRILL_ERR_INVALID, "request %llu: prompt token %d is %d, outside the vocabulary [0, %d)", id, i, r->prompt[i], c->vocab_size);
    if (r->adapter < 0 || r->adapter >= TRILL_ENGINE_ADAPTER_SLOTS || (r->adapter > 0 && !e->slots[r->adapter]))
        return trill_error(TRILL_ERR_INVALID, "request %llu: adapter slot %d is %s", id, r->adapter,
                           r->adapter < 0 || r->adapter >= TRILL_ENGINE_ADAPTER_SLOTS ? "out of range" : "empty (trill_engine_set_adapter)");
    if (r->n_forced < 0 || (r->n_forced > 0 && !r->forced))
        return trill_error(TRILL_ERR_INVALID, "request %llu: n_forced %d without forced tokens", id, r->n_forced);
    if (r->n_forced > 0 && !r->forced_at && (r->n > 1 || r->max_new_tokens != r->n_forced))
        return trill_error(TRILL_ERR_INVALID, "request %llu: forced tokens without forced_at need n 1 and max_new_tokens = n_forced (%d), got n %d, "
                           "max_new_tokens %d", id, r->n_forced, r->n, r->max_new_tokens);
    if (r->n_forced > 0 && r->forced_at) {
        const int n = r->n ? r->n : 1;
        int longest = 0;
        if (r->forced_at[0] != 0 || r->forced_at[n] != r->n_forced)
            return trill_error(TRILL_ERR_INVALID, "request %llu: forced_at must run from 0 to n_forced (%d), got %d to %d", id, r->n_forced,
                               r->forced_at[0], r->forced_at[n]);
        for (int k = 0; k < n; k++) {
            const int len = r->forced_at[k + 1] - r->forced_at[k];
            if (len < 1) return trill_error(TRILL_ERR_INVALID, "request %llu: forced sample %d has %d tokens (at least 1)", id, k, len);
            longest = len > longest ? len : longest;
        }
        if (r->max_new_tokens != longest)
            return trill_error(TRILL_ERR_INVALID, "request %llu: max_new_tokens %d, but the longest forced sample has %d tokens", id,
                               r->max_new_tokens, longest);
    }
    if (r->hold && r->n_forced > 0)
        return trill_error(TRILL_ERR_INVALID, "request %llu: hold (multi-turn) does not take forced tokens", id);
    for (int i = 0; i < r->n_forced; i++)
        if (r->forced[i] < 0 || r->forced[i] >= c->vocab_size)
            return trill_error(TRILL_ERR_INVALID, "request %llu: forced token %d is %d, outside the vocabulary [0, %d)", id, i, r->forced[i], c->vocab_size);
    trill_status st = trill_sampling_check(&r->sampling);
    if (st) {
        trill_error_context("request %llu", id);
        return st;
    }
    if (r->n_stop_strings > 0 && !e->cfg.tokenizer)
        return trill_error(TRILL_ERR_INVALID, "request %llu: stop strings need the engine to have a tokenizer", id);
    for (int i = 0; i < r->n_stop_strings; i++)
        if (!r->stop_strings[i] || !*r->stop_strings[i] || strlen(r->stop_strings[i]) > 256)
            return trill_error(TRILL_ERR_INVALID, "request %llu: stop string %d must be 1 to 256 bytes", id, i);
    const int need = kv_blocks_for(&e->kv, r->prompt_len + r->max_new_tokens);
    if (need > e->kv.n_blocks)
        return trill_error(TRILL_ERR_INVALID, "request %llu: %d prompt + %d new tokens need %d KV blocks of %d tokens, but the cache holds %d (raise kv_cache_mb)",
                           id, r->prompt_len, r->max_new_tokens, need, e->kv.block_size, e->kv.n_blocks);
    return TRILL_OK;
}

trill_status trill_engine_submit(trill_engine *e, const trill_request *r) {
    const unsigned long long id = (unsigned long long)r->id;
    trill_status st = check_request(e, r);
    if (st) return st;
    req *q = trill_calloc(1, sizeof *q);
    if (!q) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    q->r = *r;
    if (q->r.n == 0) q->r.n = 1;
    q->prompt = trill_malloc(sizeof(int) * (size_t)r->prompt_len);
    q->stop_ids = trill_malloc(sizeof(int) * (size_t)(r->n_stop_ids + 1));
    q->stop_strings = trill_calloc((size_t)r->n_stop_strings + 1, sizeof(char *));
    q->forced = r->n_forced ? trill_malloc(sizeof(int) * (size_t)r->n_forced) : NULL;
    q->forced_at = r->n_forced ? trill_malloc(sizeof(int) * (size_t)(q->r.n + 1)) : NULL;
    bool ok = q->prompt && q->stop_ids && q->stop_strings && (!r->n_forced || (q->forced && q->forced_at));
    for (int i = 0; ok && i < r->n_stop_strings; i++) {
        ok = (q->stop_strings[i] = trill_strdup(r->stop_strings[i])) != NULL;
        size_t len = ok ? strlen(r->stop_strings[i]) : 0;
        if (len > q->max_stop_len) q->max_stop_len = len;
    }
    seq *s = NULL;
    if (ok) {
        memcpy(q->prompt, r->prompt, sizeof(int) * (size_t)r->prompt_len);
        if (r->n_stop_ids) memcpy(q->stop_ids, r->stop_ids, sizeof(int) * (size_t)r->n_stop_ids);
        if (r->n_forced) {
            memcpy(q->forced, r->forced, sizeof(int) * (size_t)r->n_forced);
            if (r->forced_at) memcpy(q->forced_at, r->forced_at, sizeof(int) * (size_t)(q->r.n + 1));
            else q->forced_at[0] = 0, q->forced_at[1] = r->n_forced;
        }
        q->r.forced = q->forced;
        q->r.forced_at = q->forced_at;
        q->r.prompt = q->prompt;
        q->r.stop_ids = q->stop_ids;
        q->r.stop_strings = (const char *const *)q->stop_strings;
        ok = !trill_eng_new_seq(e, q, 0, &s);
    }
    req **reqs = ok ? eng_grow(e->sched.reqs, &e->sched.cap_reqs, e->sched.n_reqs + 1, sizeof *reqs) : NULL;
    seq **wait = reqs ? eng_grow(e->sched.waiting, &e->sched.cap_waiting, e->sched.n_waiting + 1, sizeof *wait) : NULL;
    if (reqs) e->sched.reqs = reqs;
    if (wait) e->sched.waiting = wait;
    if (!wait) {
        trill_eng_free_seq(e, s);
        trill_eng_free_req(q);
        return trill_error(TRILL_ERR_NOMEM, "out of memory queueing request %llu", id);
    }
    memcpy(s->tokens, q->prompt, sizeof(int) * (size_t)r->prompt_len);
    s->n_tokens = r->prompt_len;
    s->forks_pending = q->r.n > 1;
    e->sched.reqs[e->sched.n_reqs++] = q;
    e->sched.waiting[e->sched.n_waiting++] = s;
    return TRILL_OK;
}

/* ---- scheduling ---- */

void trill_eng_remove_at(seq **list, int *n, int i) {
    memmove(list + i, list + i + 1, sizeof *list * (size_t)(*n - i - 1));
    (*n)--;
}

/* Gives a sequence's blocks back; it waits at the front of the queue and recomputes its tokens
 * (identical results: rows do not depend on the batch). */
static trill_status preempt(trill_engine *e, int active_index) {
    seq *s = e->sched.active[active_index];
    seq **w = eng_grow(e->sched.waiting, &e->sched.cap_waiting, e->sched.n_waiting + 1, sizeof *w);
    if (!w) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->sched.waiting = w;
    trill_eng_kv_release(e, s);
    s->n_computed = 0;
    trill_eng_remove_at(e->sched.active, &e->sched.n_active, active_index);
    memmove(e->sched.waiting + 1, e->sched.waiting, sizeof *e->sched.waiting * (size_t)e->sched.n_waiting);
    e->sched.waiting[0] = s;
    e->sched.n_waiting++;
    return TRILL_OK;
}

static int add_rows_of(trill_engine *e, seq *s, int R, int n) {
    for (int i = 0; i < n; i++, R++) {
        e->rows.seq[R] = s;
        e->rows.pos[R] = s->n_computed + i;
        e->rows.token[R] = s->tokens[s->n_computed + i];
        e->rows.slot[R] = (uint8_t)s->rq->r.adapter;
        e->rows.mixed |= s->rq->r.adapter != 0;
    }
    return R;
}

/* Picks the step's rows: every active sequence's next tokens (a decode row, or the next chunk of
 * its prompt) in admission order, then new sequences from the queue, within the token budget. */
trill_status trill_eng_schedule(trill_engine *e, int *rows, trill_step_stats *stats) {
    int R = 0;
    e->rows.mixed = false;
    for (int i = 0; i < e->sched.n_active && R < e->rows.max; i++) {
        seq *s = e->sched.active[i];
        const int n = s->n_tokens - s->n_computed < e->rows.max - R ? s->n_tokens - s->n_computed : e->rows.max - R;
        trill_eng_kv_drop_window(e, s);
        int got;
        while ((got = trill_eng_kv_reserve(e, s, s->n_computed + n, s->n_computed)) != 0) {
            if (got == KV_NOMEM) return TRILL_ERR_NOMEM;
            if (trill_eng_release_held_blocks(e)) continue; /* a held sample's first: it is idle */
            /* out of blocks: the newest sequence makes room (this one, if it is the newest) */
            trill_status st = preempt(e, e->sched.n_active - 1);
            if (st) return st;
            stats->preempted++;
            if (e->sched.n_active == i) break; /* it was this one */
        }
        if (i >= e->sched.n_active) break;
        if (n == 1) stats->decode_rows++;
        else stats->prefill_rows += n;
        R = add_rows_of(e, s, R, n);
    }
    while (e->sched.n_waiting > 0 && R < e->rows.max && e->sched.n_active < e->cfg.max_running) {
        seq *s = e->sched.waiting[0];
        const int n = s->n_tokens - s->n_computed < e->rows.max - R ? s->n_tokens - s->n_computed : e->rows.max - R;
        int got;
        while ((got = trill_eng_kv_reserve(e, s, s->n_computed + n, s->n_computed)) == KV_FULL && trill_eng_release_held_blocks(e)) {
        }
        if (got == KV_NOMEM) return TRILL_ERR_NOMEM;
        if (got) break;
        seq **a = eng_grow(e->sched.active, &e->sched.cap_active, e->sched.n_active + 1, sizeof *a);
        if (!a) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        e->sched.active = a;
        trill_eng_remove_at(e->sched.waiting, &e->sched.n_waiting, 0);
        e->sched.active[e->sched.n_active++] = s;
        stats->prefill_rows += n;
        R = add_rows_of(e, s, R, n);
    }
    *rows = R;
    return TRILL_OK;
}
