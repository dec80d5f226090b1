/* After the forward (engine_internal.h): which rows produce logits, the forks of a prompt's n
 * samples, sampling (spread over threads, each draw keyed by request, sample and position),
 * stops, finishing a sequence into the done list, aborts, and collecting what finished. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "infer/engine_internal.h"
#include "infer/gen_decoder.h"
#include "base/alloc.h"

trill_status trill_eng_sampler_alloc(trill_engine *e) {
    e->smp.threads = omp_get_max_threads();
    e->smp.scratch = trill_malloc(trill_sample_scratch_size(e->c.vocab_size) * (size_t)e->smp.threads);
    return e->smp.scratch ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory for sampler scratch");
}

void trill_eng_sampler_free(trill_engine *e) {
    free(e->smp.scratch);
    free(e->smp.seq);
    free(e->smp.row);
    free(e->smp.token);
    free(e->smp.lp);
}

/* Sampler scratch for this step's threads (an engine may be stepped from threads with different
 * OpenMP thread counts, as the async generator is). */
trill_status trill_eng_ensure_sampler_scratch(trill_engine *e) {
    const int threads = omp_get_max_threads();
    if (threads <= e->smp.threads) return TRILL_OK;
    void *p = trill_realloc(e->smp.scratch, trill_sample_scratch_size(e->c.vocab_size) * (size_t)threads);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory for sampler scratch");
    e->smp.scratch = p;
    e->smp.threads = threads;
    return TRILL_OK;
}

/* *hit: the sequence's text ends in a stop string; fails only when out of memory decoding it. */
static trill_status hits_stop_string(const trill_engine *e, const seq *s, bool *hit) {
    const req *q = s->rq;
    *hit = false;
    if (q->r.n_stop_strings == 0) return TRILL_OK;
    /* a stop string of L <= 256 bytes completed by the newest token lies within its last L + 1 tokens */
    const int gen = s->n_tokens - s->n_prompt;
    int from = gen - (int)q->max_stop_len - 1;
    if (from < 0) from = 0;
    /* ids the tokenizer has no string for (a model's vocabulary may be larger) add no text */
    int ids[512], n = 0;
    const int known = trill_tokenizer_size(e->cfg.tokenizer);
    for (int i = from; i < gen && n < 512; i++)
        if (s->tokens[s->n_prompt + i] < known) ids[n++] = s->tokens[s->n_prompt + i];
    char *text = NULL;
    size_t len = 0;
    trill_status st = trill_tokenizer_decode(e->cfg.tokenizer, ids, (size_t)n, false, &text, &len);
    if (st == TRILL_ERR_NOMEM) return st;
    if (st) return TRILL_OK; /* an id the tokenizer has no string for: no text to match */
    for (int i = 0; i < q->r.n_stop_strings && !*hit; i++) *hit = strstr(text, q->stop_strings[i]) != NULL;
    free(text);
    return TRILL_OK;
}

static trill_status finish(trill_engine *e, int active_index, trill_finish why) {
    seq *s = e->sched.active[active_index];
    const bool hold = s->rq->r.hold && why != TRILL_FINISH_ABORTED; /* kept for trill_engine_continue */
    trill_sequence_out *d = eng_grow(e->sched.done, &e->sched.cap_done, e->sched.n_done + 1, sizeof *d);
    if (!d) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->sched.done = d;
    if (hold) {
        trill_status st = trill_eng_reserve_held(e);
        if (st) return st;
    }
    const int gen = s->n_tokens - s->n_prompt;
    const uint64_t digest = hold ? trill_eng_token_digest(s->tokens, s->n_tokens) : 0;
    e->sched.done[e->sched.n_done++] = (trill_sequence_out){ .request = s->rq->r.id, .sample = s->sample, .n_prompt = s->n_prompt,
                                                 .n_generated = gen, .tokens = s->tokens, .logprobs = s->logprobs,
                                                 .versions = s->versions, .experts = s->experts, .finish = why };
    s->tokens = NULL;
    s->logprobs = NULL;
    s->versions = NULL;
    s->experts = NULL;
    trill_eng_remove_at(e->sched.active, &e->sched.n_active, active_index);
    req *q = s->rq;
    if (hold) trill_eng_hold(e, s, digest);
    else trill_eng_free_seq(e, s);
    trill_eng_drop_req_if_done(e, q); /* the request record goes when its last sample does */
    return TRILL_OK;
}

int trill_engine_abort(trill_engine *e, uint64_t request) {
    int n = 0;
    for (int i = 0; i < e->sched.n_waiting;) { /* waiting ones join the active list to be finished alike */
        seq *s = e->sched.waiting[i];
        if (s->rq->r.id != request) { i++; continue; }
        seq **a = eng_grow(e->sched.active, &e->sched.cap_active, e->sched.n_active + 1, sizeof *a);
        if (!a) return -1;
        e->sched.active = a;
        trill_eng_remove_at(e->sched.waiting, &e->sched.n_waiting, i);
        e->sched.active[e->sched.n_active++] = s;
    }
    for (int i = 0; i < e->sched.n_active;) {
        if (e->sched.active[i]->rq->r.id != request) { i++; continue; }
        if (finish(e, i, TRILL_FINISH_ABORTED)) return -1;
        n++;
    }
    for (int i = e->sched.n_held - 1; i >= 0; i--) /* held ones were reported when they finished */
        if (e->sched.held[i]->rq->r.id == request) trill_engine_release(e, request, e->sched.held[i]->sample);
    return n;
}

/* The group's other samples start from the same prompt, sharing its blocks: made into the
 * active list's reserved room past n_active (counted in only when the whole step succeeds),
 * *made of them. Their tokens are copied once the parent's prompt counts as computed. */
static trill_status make_forks(trill_engine *e, const seq *parent, int *made) {
    const req *q = parent->rq;
    for (int k = 1; k < q->r.n; k++) {
        seq *s;
        trill_status st = trill_eng_new_seq(e, (req *)q, k, &s);
        if (!st && (st = trill_eng_kv_share(e, s, parent))) trill_eng_free_seq(e, s);
        if (st) return st;
        e->sched.active[e->sched.n_active + (*made)++] = s;
    }
    return TRILL_OK;
}

static void start_fork(const trill_engine *e, seq *s, const seq *parent) {
    const size_t per_token = (size_t)e->c.n_moe_layers * e->c.num_experts_per_tok;
    memcpy(s->tokens, parent->tokens, sizeof(int) * (size_t)parent->n_tokens);
    s->n_tokens = parent->n_tokens;
    s->n_computed = parent->n_computed;
    if (s->experts) memcpy(s->experts, parent->experts, sizeof(uint16_t) * per_token * (size_t)parent->n_computed);
    if (s->gdn) memcpy(s->gdn, parent->gdn, sizeof(float) * trill_gen_gdn_state_floats(&e->c)); /* the state after the prompt */
}

/* Samples the next token of every (sequence, logits row) pair, the pairs spread over the
 * threads (each with its own scratch); the draws are keyed, so the split changes nothing. */
static trill_status sample_all(trill_engine *e, int n) {
    const int V = e->c.vocab_size;
    const size_t scratch = trill_sample_scratch_size(V);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        seq *s = e->smp.seq[i];
        const req *q = s->rq;
        const int gen = s->n_tokens - s->n_prompt;
        float lp = 0;
        const float *logits = e->logits + (size_t)e->smp.row[i] * V;
        void *work = (char *)e->smp.scratch + scratch * (size_t)omp_get_thread_num();
        if (q->r.n_forced) { /* teacher forcing: the given token, scored as a draw would have been */
            const int token = q->r.forced[q->r.forced_at[s->sample] + gen];
            lp = trill_sample_logprob(logits, V, q->r.sampling.temperature, token, work);
            e->smp.token[i] = token; /* (-inf: the model gives it no probability, which the scorer reports) */
        } else {
            e->smp.token[i] = trill_sample(logits, V, &q->r.sampling, q->r.keyed ? q->r.key : q->r.id, (uint32_t)s->sample,
                                           (uint32_t)(s->key_base + gen), work, &lp);
        }
        e->smp.lp[i] = lp;
    }
    for (int i = 0; i < n; i++) /* refused before any sequence takes its token */
        if (e->smp.token[i] < 0) {
            const seq *s = e->smp.seq[i];
            return trill_error(TRILL_ERR_INVALID, "request %llu, sample %d, token %d: every logit is NaN or -inf (the weights are broken)",
                               (unsigned long long)s->rq->r.id, s->sample, s->n_tokens - s->n_prompt);
        }
    for (int i = 0; i < n; i++) {
        seq *s = e->smp.seq[i];
        const int gen = s->n_tokens - s->n_prompt;
        s->tokens[s->n_tokens++] = e->smp.token[i];
        s->logprobs[gen] = e->smp.lp[i];
        s->versions[gen] = e->version;
    }
    return TRILL_OK;
}

/* Room for n (sequence, logits row) pairs to sample. */
static trill_status reserve_samples(trill_engine *e, int n) {
    if (n <= e->smp.cap) return TRILL_OK;
    int cap = e->smp.cap ? e->smp.cap : 64;
    while (cap < n) cap *= 2;
    seq **a = trill_realloc(e->smp.seq, sizeof *a * (size_t)cap);
    if (a) e->smp.seq = a;
    int *b = a ? trill_realloc(e->smp.row, sizeof *b * (size_t)cap) : NULL;
    if (b) e->smp.row = b;
    int *t = b ? trill_realloc(e->smp.token, sizeof *t * (size_t)cap) : NULL;
    if (t) e->smp.token = t;
    float *l = t ? trill_realloc(e->smp.lp, sizeof *l * (size_t)cap) : NULL;
    if (!l) return trill_error(TRILL_ERR_NOMEM, "out of memory for %d samples", n);
    e->smp.lp = l;
    e->smp.cap = cap;
    return TRILL_OK;
}

/* One more (sequence, logits row) pair to sample (room reserved). */
static void want_sample(trill_engine *e, int *n, seq *s, int row) {
    e->smp.seq[*n] = s;
    e->smp.row[*n] = row;
    (*n)++;
}

/* Finishes every sequence whose newest sampled token stops it: a stop id, a stop string, or
 * max_new_tokens reached. When a stop string cannot be checked (out of memory decoding), the
 * check is left pending: the next step makes it before anything else. */
trill_status trill_eng_finish_stopped(trill_engine *e) {
    e->sched.recheck_stops = true;
    for (int i = 0; i < e->sched.n_active;) {
        seq *s = e->sched.active[i];
        const int gen = s->n_tokens - s->n_prompt;
        if (gen == 0 || s->n_computed != s->n_tokens - 1) { i++; continue; } /* nothing new sampled */
        const int last = s->tokens[s->n_tokens - 1];
        bool stop_id = false;
        for (int k = 0; k < s->rq->r.n_stop_ids && !stop_id; k++) stop_id = last == s->rq->r.stop_ids[k];
        trill_finish why = TRILL_FINISH_LENGTH;
        bool done = true, stop_string = false;
        if (!stop_id) {
            trill_status st = hits_stop_string(e, s, &stop_string);
            if (st) return st;
        }
        if (stop_id) why = TRILL_FINISH_STOP_ID;
        else if (stop_string) why = TRILL_FINISH_STOP_STRING;
        else if (gen >= s->max_new) why = TRILL_FINISH_LENGTH;
        else if (s->rq->r.n_forced && gen >= s->rq->r.forced_at[s->sample + 1] - s->rq->r.forced_at[s->sample]) why = TRILL_FINISH_LENGTH;
        else done = false;
        if (!done) { i++; continue; }
        trill_status st = finish(e, i, why);
        if (st) return st;
    }
    e->sched.recheck_stops = false;
    return TRILL_OK;
}

/* After the forward, in two phases. First everything that can fail for want of memory, changing
 * nothing the engine counts on: the logits, room for the step's forks, samples and finished
 * sequences, the forks themselves; a failure there leaves the step to be run again. Then the
 * step takes effect: computed positions, forks, samples, finished sequences. */
trill_status trill_eng_after_forward(trill_engine *e, int R) {
    /* rows that end their sequence's known tokens produce logits */
    int n_logit = 0, n_forks = 0;
    for (int r = 0; r < R; r++)
        if (e->rows.pos[r] == e->rows.seq[r]->n_tokens - 1) e->rows.logit[n_logit++] = r;
    eng_phase(e, TRILL_PHASE_LOGITS);
    trill_status st = e->fam->logits(e, n_logit);
    eng_phase(e, TRILL_PHASE_SAMPLE);
    for (int i = 0; i < n_logit; i++) {
        const seq *s = e->rows.seq[e->rows.logit[i]];
        if (s->forks_pending) n_forks += s->rq->r.n - 1;
    }
    const int active = e->sched.n_active + n_forks;
    seq **a = st ? NULL : eng_grow(e->sched.active, &e->sched.cap_active, active, sizeof *a);
    if (a) e->sched.active = a;
    trill_sequence_out *d = a ? eng_grow(e->sched.done, &e->sched.cap_done, e->sched.n_done + active, sizeof *d) : NULL;
    if (d) e->sched.done = d;
    if (!st && !d) st = trill_error(TRILL_ERR_NOMEM, "out of memory for %d sequences", active);
    if (!st) st = reserve_samples(e, n_logit + n_forks);
    int made = 0;
    for (int i = 0; i < n_logit && !st; i++) {
        const seq *s = e->rows.seq[e->rows.logit[i]];
        if (s->forks_pending) st = make_forks(e, s, &made);
    }
    if (st) {
        while (made > 0) trill_eng_free_seq(e, e->sched.active[e->sched.n_active + --made]);
        return st;
    }
    for (int r = 0; r < R; r++) {
        seq *s = e->rows.seq[r];
        s->n_computed = e->rows.pos[r] + 1 > s->n_computed ? e->rows.pos[r] + 1 : s->n_computed;
    }
    int n_sample = 0;
    for (int i = 0; i < n_logit; i++) {
        seq *s = e->rows.seq[e->rows.logit[i]];
        want_sample(e, &n_sample, s, i);
        if (!s->forks_pending) continue;
        s->forks_pending = false;
        for (int k = 1; k < s->rq->r.n; k++) {
            seq *f = e->sched.active[e->sched.n_active++];
            start_fork(e, f, s);
            want_sample(e, &n_sample, f, i);
        }
    }
    st = sample_all(e, n_sample);
    return st ? st : trill_eng_finish_stopped(e);
}

int trill_engine_collect(trill_engine *e, trill_sequence_out *out, int max) {
    const int n = e->sched.n_done < max ? e->sched.n_done : max;
    if (n <= 0) return 0; /* e->sched.done may not exist yet */
    memcpy(out, e->sched.done, sizeof *out * (size_t)n);
    memmove(e->sched.done, e->sched.done + n, sizeof *e->sched.done * (size_t)(e->sched.n_done - n));
    e->sched.n_done -= n;
    return n;
}

void trill_sequence_out_free(trill_sequence_out *s) {
    free(s->tokens);
    free(s->logprobs);
    free(s->versions);
    free(s->experts);
    *s = (trill_sequence_out){ 0 };
}
