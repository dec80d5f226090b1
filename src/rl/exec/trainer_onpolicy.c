/* generator.on_policy's scoring engine and the pre-passes of old and reference log-probs
 * (trainer_internal.h). */
#include "rl/exec/trainer_internal.h"

/* ---- generator.on_policy: the generator's numbers at the trainer's weights ---- */

/* The on-policy engine gets the trainer's weights as a sync would ship them (the adapters, or the merged
 * model in merge sync): the same bits the generator computes with after the next sync. */
static trill_status onp_load_weights(trill_trainer *r) {
    if (!r->onp_stale) return TRILL_OK;
    const float *data;
    size_t n;
    const trill_model *merged;
    trill_status st = trill_trainer_export(r, &data, &n, &merged);
    if (!st) st = merged ? trill_engine_update_weights(r->onp_engine, merged, 0, NULL) : trill_engine_update_adapter(r->onp_engine, r->lora, 0, NULL);
    if (!st) r->onp_stale = false;
    return st;
}

/* Teacher forcing of seq[0..n)'s responses through the on-policy engine: each response token's log-prob as
 * the generator's sampler reports it (at generator.temperature) into ta->onp_logp, and the
 * routing of every forwarded position into ta->onp_experts, at batch positions. */
/* The scoring engine's outputs (every one collected and freed, also after a failure st) into the
 * batch positions of the on-policy log-probs and routing. */
static trill_status take_scores(trill_trainer *r, const rl_batch *b, const int *seq, token_arrays *ta, trill_status st) {
    const size_t row = (size_t)r->L * r->K;
    trill_sequence_out out[32];
    int got;
    while ((got = trill_engine_collect(r->onp_engine, out, 32)) > 0)
        for (int k = 0; k < got; k++) {
            const int s = seq[out[k].request + (uint64_t)out[k].sample], at = b->offsets[s];
            if (!st && out[k].n_prompt + out[k].n_generated != b->offsets[s + 1] - at)
                st = trill_error(TRILL_ERR_INVALID, "generator.on_policy: sequence %d was scored over %d tokens, not %d", s,
                                 out[k].n_prompt + out[k].n_generated, b->offsets[s + 1] - at);
            if (!st) {
                memcpy(ta->onp_logp + at + out[k].n_prompt, out[k].logprobs, sizeof(float) * (size_t)out[k].n_generated);
                if (row && out[k].experts)
                    memcpy(ta->onp_experts + (size_t)at * row, out[k].experts, sizeof(uint16_t) * row * (size_t)(b->offsets[s + 1] - at - 1));
            }
            trill_sequence_out_free(&out[k]);
        }
    return st;
}

trill_status trill_rl_trn_score_on_policy(trill_trainer *r, const rl_batch *b, const int *seq, int n, token_arrays *ta) {
    const trill_run_config *c = r->c;
    const double t0 = trill_now();
    trill_status st = onp_load_weights(r);
    trill_request q = { .sampling = trill_sampling_default() };
    q.sampling.temperature = (float)c->generator.temperature;
    int *forced = NULL, *forced_at = NULL;
    /* a run of sequences with one prompt (a group's samples) is one request of that many forced
     * samples: the prompt is prefilled once and forked, as the generator did */
    for (int i = 0, j; i < n && !st; i = j) {
        const int s = seq[i], pl = b->prompt_len[s];
        const int *prompt = b->tokens + b->offsets[s];
        int total = 0;
        for (j = i; j < n && rl_response_len(b, seq[j]) >= 1 && b->prompt_len[seq[j]] == pl &&
                    !memcmp(b->tokens + b->offsets[seq[j]], prompt, sizeof(int) * (size_t)pl);
             j++)
            total += rl_response_len(b, seq[j]);
        if (j == i) { /* an empty response: nothing to score */
            j = i + 1;
            continue;
        }
        int *f = trill_realloc(forced, sizeof(int) * (size_t)total), *fa = f ? trill_realloc(forced_at, sizeof(int) * (size_t)(j - i + 1)) : NULL;
        if (f) forced = f;
        if (fa) forced_at = fa;
        if (!f || !fa) {
            st = trill_error(TRILL_ERR_NOMEM, "out of memory");
            break;
        }
        int longest = 0;
        forced_at[0] = 0;
        for (int k = i; k < j; k++) {
            const int len = rl_response_len(b, seq[k]);
            memcpy(forced + forced_at[k - i], b->tokens + b->offsets[seq[k]] + pl, sizeof(int) * (size_t)len);
            forced_at[k - i + 1] = forced_at[k - i] + len;
            longest = len > longest ? len : longest;
        }
        q.id = (uint64_t)i;
        q.n = j - i;
        q.prompt = prompt;
        q.prompt_len = pl;
        q.forced = forced;
        q.n_forced = total;
        q.forced_at = forced_at;
        q.max_new_tokens = longest;
        st = trill_engine_submit(r->onp_engine, &q);
    }
    free(forced);
    free(forced_at);
    if (!st) st = trill_engine_run(r->onp_engine);
    st = take_scores(r, b, seq, ta, st);
    r->score_s += trill_now() - t0;
    return st;
}

/* The micro-batch's packed log-probs of its response tokens replaced by the on-policy engine's. */
void trill_rl_trn_take_scored(const rl_batch *b, const micro *m, const token_arrays *ta, float *lp) {
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], from = b->offsets[s] + b->prompt_len[s], len = rl_response_len(b, s);
        memcpy(lp + m->offsets[i] + b->prompt_len[s], ta->onp_logp + from, sizeof(float) * (size_t)len);
    }
}

/* The micro-batch's packed routing from the on-policy engine's, for the metrics' training routing. */
void trill_rl_trn_take_scored_experts(const rl_batch *b, const micro *m, const token_arrays *ta, uint16_t *ex) {
    const size_t row = (size_t)b->n_moe_layers * b->top_k;
    for (int i = 0; i < m->n; i++)
        memcpy(ex + (size_t)m->offsets[i] * row, ta->onp_experts + (size_t)b->offsets[m->seq[i]] * row,
               sizeof(uint16_t) * row * (size_t)(m->offsets[i + 1] - m->offsets[i]));
}

/* A forward without gradients over `seq`: old log-probs (adapters on) and/or reference
 * log-probs (adapters off), plus the trainer's routing. */
trill_status trill_rl_trn_pre_pass(trill_trainer *r, const rl_batch *b, const int *seq, int n, bool want_old, bool want_ref, token_arrays *ta) {
    micro_plan p;
    trill_status st = trill_rl_trn_plan_micros(r, b, seq, n, &p);
    if (!st && r->onp_engine && want_old) st = trill_rl_trn_score_on_policy(r, b, seq, n, ta);
    for (int i = 0; i < p.rounds && !st; i++) { /* round i: this rank's i-th micro-batch, or an empty pass */
        const int mi = p.lo + i;
        const bool mine = mi < p.hi;
        const int at = mine ? p.first[mi] : 0, k = mine ? p.first[mi + 1] - at : 0;
        micro m;
        if ((st = trill_rl_trn_micro_make(r, b, seq + at, k, trill_rl_trn_replay_source(r, b, r->onp_engine && want_old ? ta->onp_experts : NULL), &m))) break;
        float *lp = trill_rl_trn_ws_get(r, WS_LP, sizeof(float) * (size_t)(m.T + 1));
        uint16_t *ex = r->L ? trill_rl_trn_ws_get(r, WS_EX, sizeof(uint16_t) * (size_t)(m.T + 1) * r->L * r->K) : NULL;
        if (!lp || (r->L && !ex)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st && want_old) {
            if (r->onp_engine) { /* the on-policy engine's numbers (scored before the loop) */
                trill_rl_trn_take_scored(b, &m, ta, lp);
                if (ex) trill_rl_trn_take_scored_experts(b, &m, ta, ex);
            } else {
                st = trill_model_forward(r->policy, m.tokens, m.offsets, m.n, m.replay, lp, ex);
            }
            if (!st && mine) {
                trill_rl_trn_scatter_logp(b, &m, lp, ta->old_logp);
                if (ex) trill_rl_trn_scatter_experts(b, &m, ex, ta->train_experts);
                st = trill_rl_trn_corrections(r, b, &m, ta);
            }
        }
        if (!st && want_ref) {
            r->lora->enabled = false; /* the reference policy: the same weights without adapters */
            st = trill_model_forward(r->policy, m.tokens, m.offsets, m.n, m.replay, lp, NULL);
            r->lora->enabled = true;
            if (!st && mine) trill_rl_trn_scatter_logp(b, &m, lp, ta->ref_logp);
        }
    }
    if (!st) st = trill_rl_trn_assemble(r, b, seq, &p, ta, want_old, want_ref);
    trill_rl_trn_plan_free(&p);
    return st;
}
