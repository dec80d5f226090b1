/* The trainer executor's RL step (trainer.h, trainer_internal.h): rewards shaped, minibatch
 * optimizer steps over micro-batches with the loss and its trill_rl_trn_corrections, and the step's mismatch
 * figures. */
#include "rl/exec/trainer_internal.h"

/* TIS weights and the MIS mask of a micro-batch's sequences from their old log-probs (in the
 * workspace's loss buffers, which micro_loss fills again after). */
trill_status trill_rl_trn_corrections(trill_trainer *r, const rl_batch *b, const micro *m, token_arrays *ta) {
    int *off = trill_rl_trn_ws_get(r, WS_OFF, sizeof(int) * (size_t)(m->n + 1));
    if (!off) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const int R = trill_rl_trn_response_offsets(b, m, off);
    const size_t fR = sizeof(float) * (size_t)(R + 1);
    float *old = trill_rl_trn_ws_get(r, WS_G_OLD, fR), *behav = trill_rl_trn_ws_get(r, WS_G_BEHAV, fR), *w = trill_rl_trn_ws_get(r, WS_G_W, fR);
    uint8_t *mask = trill_rl_trn_ws_get(r, WS_G_MASK, (size_t)R + 1);
    if (!old || !behav || !w || !mask) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_rl_trn_gather_f(b, m, ta->old_logp, old);
    trill_rl_trn_gather_f(b, m, b->behav_logp, behav);
    if (b->loss_mask) trill_rl_trn_gather_u8(b, m, b->loss_mask, mask); /* the trajectory's: injected tokens never in the loss */
    else memset(mask, 1, (size_t)R);
    trill_rl_corrections(r->c, m->n, off, old, behav, w, mask);
    trill_rl_trn_scatter_resp_f(b, m, w, ta->tis);
    trill_rl_trn_scatter_resp_u8(b, m, mask, ta->mask);
    return TRILL_OK;
}

/* ---- one optimizer step on a minibatch ---- */

/* Whether this rank speaks for the trainable tensor t (at its offset `at` in values) when the
 * model-parallel group adds its shards up: a value its shard holds alone (a held expert's, a
 * slice) is its own; one every shard holds is the group's first rank's. */
bool trill_rl_trn_speaks_for(const trill_trainer *r, const trill_param *t, size_t at) {
    return r->mp_rank == 0 || at >= r->routed || trill_param_sliced(t);
}

/* The gradient's global norm, the same bits on any layout: each trainable tensor's sum of squares
 * (trill_grad_sumsq) added in the whole adapter's tensor order (the model's in full
 * fine-tuning); under model parallelism each rank gives the sums of the tensors it speaks for. */
static trill_status gradient_norm(const trill_trainer *r, double *norm) {
    const trill_param *t = r->lora ? r->lora->tensors : r->policy->tensors;
    const size_t n = r->lora ? r->lora->n_tensors : r->policy->n_tensors, n_all = r->lora ? r->lora->n_global_tensors : n;
    size_t *offset = trill_malloc(sizeof(size_t) * (n ? n : 1)), *numel = trill_malloc(sizeof(size_t) * (n ? n : 1));
    double *mine = trill_malloc(sizeof(double) * (n ? n : 1)), *all = trill_calloc(n_all ? n_all : 1, sizeof(double));
    trill_status st = offset && numel && mine && all ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t k = 0; !st && k < n; k++) {
        offset[k] = (size_t)(t[k].data - r->values);
        numel[k] = t[k].numel;
    }
    if (!st) st = trill_grad_sumsq_parts(r->lora_grads, offset, numel, n, mine);
    for (size_t k = 0; !st && k < n; k++)
        if (trill_rl_trn_speaks_for(r, &t[k], offset[k])) all[r->lora ? (size_t)r->lora->global_index[k] : k] = mine[k];
    /* a tensor's sum over its slices is added in rank order, the same bits on every rank */
    if (!st && r->mp) st = trill_comm_allreduce_ordered_f64(r->mp, all, n_all);
    double ss = 0;
    for (size_t k = 0; k < n_all; k++) ss += all[k];
    *norm = sqrt(ss);
    free(offset);
    free(numel);
    free(mine);
    free(all);
    return st;
}

/* The end of every optimizer step, RL's or SFT's: the summed gradient divided by the step's
 * denominator and clipped; a loss or gradient norm that is not finite is never applied (with
 * trainer.skip_nonfinite *applied is false, else an error naming the step); then AdamW at the
 * schedule's rate for optimizer step opt->step of `total`. */
trill_status trill_rl_trn_apply_update(trill_trainer *r, double denom, double loss, int64_t total, double *grad_norm, double *lr, bool *applied) {
    const trill_run_config *c = r->c;
    *applied = false;
    for (size_t i = 0; i < r->n_values; i++) r->lora_grads[i] = (float)(r->lora_grads[i] / denom);
    trill_status st = gradient_norm(r, grad_norm);
    if (st) return st;
    trill_clip_grads_to(r->lora_grads, r->n_values, *grad_norm, c->trainer.grad_clip);
    if (!isfinite(loss) || !isfinite(*grad_norm)) { /* never applied: the weights stay as they were */
        if (c->trainer.skip_nonfinite) return TRILL_OK;
        return trill_error(TRILL_ERR_INVALID, "step %d: the %s is %g (loss %g, gradient norm %g): the update was not applied "
                           "(trainer.skip_nonfinite: true skips such batches)", r->step,
                           isfinite(loss) ? "gradient norm" : "loss", isfinite(loss) ? *grad_norm : loss, loss, *grad_norm);
    }
    *lr = trill_lr_at(c->trainer.schedule, c->trainer.lr, c->trainer.min_lr, c->trainer.warmup_steps, total, r->opt->step);
    trill_adamw_step(r->opt, r->values, r->lora_grads, *lr, r->no_decay);
    *applied = true;
    return TRILL_OK;
}


/* The loss of micro-batch m from its log-probs lp: d loss / d log-prob per token into dlp (sums:
 * token-mean with denominator 1, sequence means times their sequence count) and its figures
 * into *ms. */
static trill_status micro_loss(trill_trainer *r, const rl_batch *b, const micro *m, const token_arrays *ta, const float *lp, float *dlp,
                               micro_stats *ms) {
    const trill_run_config *c = r->c;
    const int k = m->n;
    int *off = trill_rl_trn_ws_get(r, WS_OFF, sizeof(int) * (size_t)(k + 1));
    trill_status st = off ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    const int R = off ? trill_rl_trn_response_offsets(b, m, off) : 0;
    const size_t fR = sizeof(float) * (size_t)(R + 1);
    float *g_lp = trill_rl_trn_ws_get(r, WS_G_LP, fR), *g_old = trill_rl_trn_ws_get(r, WS_G_OLD, fR), *g_behav = trill_rl_trn_ws_get(r, WS_G_BEHAV, fR),
          *g_ref = trill_rl_trn_ws_get(r, WS_G_REF, fR), *g_w = trill_rl_trn_ws_get(r, WS_G_W, fR), *g_d = trill_rl_trn_ws_get(r, WS_G_D, fR);
    uint8_t *g_mask = trill_rl_trn_ws_get(r, WS_G_MASK, (size_t)R + 1);
    double *adv = trill_rl_trn_ws_get(r, WS_ADV, sizeof(double) * (size_t)(k + 1));
    if (!g_lp || !g_old || !g_behav || !g_ref || !g_w || !g_d || !g_mask || !adv) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        /* the response tokens' log-probs sit at their own packed positions */
        int j = 0;
        for (int i = 0; i < k; i++) {
            const int s = m->seq[i], from = m->offsets[i] + b->prompt_len[s], len = rl_response_len(b, s);
            memcpy(g_lp + j, lp + from, sizeof(float) * (size_t)len);
            adv[i] = b->adv[s];
            j += len;
        }
        trill_rl_trn_gather_f(b, m, ta->old_logp, g_old);
        trill_rl_trn_gather_f(b, m, b->behav_logp, g_behav);
        trill_rl_trn_gather_f(b, m, ta->tis, g_w);
        trill_rl_trn_gather_u8(b, m, ta->mask, g_mask);
        const bool kl_loss = c->algo.kl_coef > 0 && c->algo.kl_mode == TRILL_KL_LOSS;
        if (kl_loss) trill_rl_trn_gather_f(b, m, ta->ref_logp, g_ref);
        rl_loss_batch lb = { .n_seqs = k, .offsets = off, .logp = g_lp, .old_logp = g_old, .behav_logp = g_behav,
                             .ref_logp = kl_loss ? g_ref : NULL, .adv = adv, .mask = g_mask, .is_weight = g_w, .agg_tokens = 1 };
        rl_loss_stats ls;
        trill_rl_policy_loss(c, &lb, g_d, &ls);
        const double scale = c->algo.aggregation == TRILL_AGG_TOKEN_MEAN ? 1.0 : (double)k; /* back to sums */
        long in = 0;
        for (int t = 0; t < R; t++) in += g_mask[t];
        *ms = (micro_stats){ .loss = ls.loss * scale, .pg_loss = ls.pg_loss * scale, .kl_loss = ls.kl_loss * scale, .mask_tokens = (double)in,
                             .clipped = ls.clip_frac * (double)in, .ratio_sum = ls.ratio_mean * (double)in, .ratio_n = (double)in,
                             .tokens = m->T };
        j = 0;
        for (int i = 0; i < k; i++) {
            const int s = m->seq[i], from = m->offsets[i] + b->prompt_len[s], len = rl_response_len(b, s);
            for (int t = 0; t < len; t++) dlp[from + t] = (float)(g_d[j + t] * scale);
            j += len;
        }
    }
    return st;
}

/* Losses are summed over micro-batches (token-mean with denominator 1, sequence means times their
 * sequence count), then the gradient is divided by the minibatch's denominator: the same
 * gradient as one pass over the whole minibatch. */
static trill_status train_minibatch(trill_trainer *r, const rl_batch *b, const int *seq, int n, bool have_old, token_arrays *ta,
                                    rl_train_stats *ts) {
    const trill_run_config *c = r->c;
    micro_plan p;
    grad_sum g = { 0 };
    trill_status st = trill_rl_trn_plan_micros(r, b, seq, n, &p);
    micro_stats *stat = st ? NULL : trill_calloc(p.M ? (size_t)p.M : 1, sizeof *stat);
    if (!st && !stat) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_rl_trn_grad_sum_create(r, &p, &g);
    if (!st && r->onp_engine) st = trill_rl_trn_score_on_policy(r, b, seq, n, ta);
    for (int i = 0; i < p.rounds && !st; i++) { /* round i: this rank's i-th micro-batch, or an empty pass */
        const int mi = p.lo + i;
        const bool mine = mi < p.hi;
        const int at = mine ? p.first[mi] : 0, k = mine ? p.first[mi + 1] - at : 0;
        micro m;
        if ((st = trill_rl_trn_micro_make(r, b, seq + at, k, trill_rl_trn_replay_source(r, b, ta->onp_experts), &m))) break;
        float *lp = trill_rl_trn_ws_get(r, WS_LP, sizeof(float) * (size_t)(m.T + 1)), *dlp = trill_rl_trn_ws_get(r, WS_DLP, sizeof(float) * (size_t)(m.T + 1));
        uint16_t *ex = r->L ? trill_rl_trn_ws_get(r, WS_EX, sizeof(uint16_t) * (size_t)(m.T + 1) * r->L * r->K) : NULL;
        trill_forward_pass *pass = NULL;
        if (!lp || !dlp || (r->L && !ex)) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (dlp) memset(dlp, 0, sizeof(float) * (size_t)(m.T + 1)); /* only the loss's tokens are written */
        if (!st) st = trill_model_forward_train(r->policy, m.tokens, m.offsets, m.n, m.replay, lp, ex, c->trainer.recompute, &pass);
        if (!st && mine && r->onp_engine) { /* on-policy: the loss sees the generator's numbers, the backward runs through the trainer's forward */
            trill_rl_trn_take_scored(b, &m, ta, lp);
            if (ex) trill_rl_trn_take_scored_experts(b, &m, ta, ex);
        }
        if (!st && mine && !have_old) { /* first minibatch, weights unchanged: these are the old log-probs */
            trill_rl_trn_scatter_logp(b, &m, lp, ta->old_logp);
            if (ex) trill_rl_trn_scatter_experts(b, &m, ex, ta->train_experts);
            st = trill_rl_trn_corrections(r, b, &m, ta);
        }
        if (!st && mine) st = micro_loss(r, b, &m, ta, lp, dlp, &stat[mi]);
        if (!st) st = trill_rl_trn_backward_round(r, &p, &g, i, pass, dlp);
        trill_forward_pass_free(pass);
    }
    /* the minibatch's gradient (a fixed tree over its micro-batches) and figures (one writer each,
     * summed in micro-batch order): the same bits on any number of ranks */
    if (!st) st = trill_rl_trn_grad_sum_finish(r, &g);
    if (!st && r->data) st = trill_comm_allreduce_f64(r->data, (double *)stat, (size_t)STATS * p.M);
    if (!st && !have_old) st = trill_rl_trn_assemble(r, b, seq, &p, ta, true, false);
    double denom_tokens = 0, sums[3] = { 0 };
    for (int mi = 0; !st && mi < p.M; mi++) {
        const micro_stats *ms = &stat[mi];
        sums[0] += ms->loss;
        sums[1] += ms->pg_loss;
        sums[2] += ms->kl_loss;
        denom_tokens += ms->mask_tokens;
        ts->clip_tokens += ms->clipped;
        ts->ratio_sum += ms->ratio_sum;
        ts->ratio_n += ms->ratio_n;
        ts->tokens += (long)ms->tokens;
    }
    trill_rl_trn_grad_sum_free(r, &g);
    free(stat);
    trill_rl_trn_plan_free(&p);
    if (st) return st;
    const double denom = c->algo.aggregation == TRILL_AGG_TOKEN_MEAN ? (denom_tokens > 0 ? denom_tokens : 1) : (double)n;
    const int64_t total = (int64_t)c->steps * c->algo.minibatches;
    double grad_norm, lr;
    bool applied;
    if ((st = trill_rl_trn_apply_update(r, denom, sums[0] / denom, total, &grad_norm, &lr, &applied))) return st;
    r->onp_stale |= applied;
    if (!applied) {
        ts->skipped++;
        return TRILL_OK;
    }
    ts->loss += sums[0] / denom;
    ts->pg_loss += sums[1] / denom;
    ts->kl_loss += sums[2] / denom;
    ts->grad_norm = grad_norm;
    ts->lr = lr;
    ts->optimizer_steps++;
    return TRILL_OK;
}

/* After the optimizer: a non-finite parameter is never synced or checkpointed. */
static trill_status check_adapter(const trill_trainer *r) {
    const trill_lora *l = r->lora;
    for (size_t i = 0; i < l->n_params; i++)
        if (!isfinite(l->params[i])) {
            const char *name = "?";
            for (size_t k = 0; k < l->n_tensors; k++)
                if (l->params + i >= l->tensors[k].data && l->params + i < l->tensors[k].data + l->tensors[k].numel) name = l->tensors[k].name;
            return trill_error(TRILL_ERR_INVALID, "step %d: adapter tensor %s holds %g after the optimizer step: not synced or saved",
                               r->step, name, l->params[i]);
        }
    return TRILL_OK;
}

/* The step's per-token arrays over the whole batch (packed layout); experts start as "not routed". */
static trill_status token_arrays_alloc(const trill_trainer *r, const rl_batch *b, token_arrays *ta) {
    const size_t T = (size_t)b->offsets[b->n_seqs], row = (size_t)r->L * r->K;
    const bool ref = r->c->algo.kl_coef > 0;
    ta->old_logp = trill_calloc(T, sizeof(float));
    ta->ref_logp = ref ? trill_calloc(T, sizeof(float)) : NULL;
    ta->tis = trill_calloc(T, sizeof(float));
    ta->mask = trill_calloc(T, 1);
    ta->train_experts = row ? trill_malloc(sizeof(uint16_t) * T * row) : NULL;
    if (r->onp_engine) {
        ta->onp_logp = trill_malloc(sizeof(float) * T);
        ta->onp_experts = row ? trill_malloc(sizeof(uint16_t) * T * row) : NULL;
    }
    if (!ta->old_logp || (ref && !ta->ref_logp) || !ta->tis || !ta->mask || (row && !ta->train_experts) ||
        (r->onp_engine && (!ta->onp_logp || (row && !ta->onp_experts))))
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < T * row; i++) ta->train_experts[i] = TRILL_REPLAY_NONE;
    for (size_t i = 0; ta->onp_experts && i < T * row; i++) ta->onp_experts[i] = TRILL_REPLAY_NONE;
    return TRILL_OK;
}

static void token_arrays_free(token_arrays *ta) {
    free(ta->old_logp); free(ta->ref_logp); free(ta->tis); free(ta->mask); free(ta->train_experts); free(ta->onp_logp); free(ta->onp_experts);
}

/* Which sequences train, and their advantages. Dynamic sampling looks at the rewards of the task,
 * before any KL penalty: identical completions score the same, but their penalties differ by
 * rounding (the trainer's fp32 log-probs of a sequence depend a little on where it sits in the
 * packed batch). With KL as a reward, each reward is first penalised by its sequence's KL (a
 * pre-pass over every sequence gives the old and reference log-probs). kept[0, *n_kept). */
static trill_status shape_rewards(trill_trainer *r, rl_batch *b, token_arrays *ta, int *kept, int *n_kept, int *flat_groups) {
    const trill_run_config *c = r->c;
    const int G = c->generator.n;
    trill_status st = TRILL_OK;
    *flat_groups = *n_kept = 0;
    for (int g = 0; g < b->n_seqs / G; g++) {
        const bool flat = trill_rl_group_is_flat(b->reward + (size_t)g * G, G);
        *flat_groups += flat;
        for (int j = 0; j < G; j++) /* an episode its environment lost (env.mark_failures) is not trained */
            b->keep[g * G + j] = !(flat && c->algo.dynamic_sampling) && !(b->episodes && b->episodes[g * G + j].stop == RL_STOP_ENV_ERROR);
    }
    if (c->algo.kl_coef > 0 && c->algo.kl_mode == TRILL_KL_REWARD) {
        for (int s = 0; s < b->n_seqs; s++) kept[s] = s;
        st = trill_rl_trn_pre_pass(r, b, kept, b->n_seqs, true, true, ta);
        for (int s = 0; s < b->n_seqs && !st; s++) {
            double kl = 0;
            for (int t = b->offsets[s] + b->prompt_len[s]; t < b->offsets[s + 1]; t++)
                if (rl_sampled(b, t)) kl += trill_rl_kl_value(c->algo.kl_estimator, ta->old_logp[t], ta->ref_logp[t]);
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
static trill_status run_minibatches(trill_trainer *r, const rl_batch *b, const int *kept, int n_kept, token_arrays *ta, rl_train_stats *ts) {
    const trill_run_config *c = r->c;
    const int M = c->algo.minibatches;
    const bool kl_reward = c->algo.kl_coef > 0 && c->algo.kl_mode == TRILL_KL_REWARD;
    const bool pre_old = !kl_reward && M > 1, pre_ref = !kl_reward && c->algo.kl_coef > 0;
    trill_status st = TRILL_OK;
    if (n_kept && (pre_old || pre_ref)) st = trill_rl_trn_pre_pass(r, b, kept, n_kept, pre_old, pre_ref, ta);
    for (int mb = 0; mb < M && !st && n_kept && !ts->skipped; mb++) {
        const int lo = (int)((int64_t)n_kept * mb / M), hi = (int)((int64_t)n_kept * (mb + 1) / M);
        if (hi > lo) st = train_minibatch(r, b, kept + lo, hi - lo, pre_old || kl_reward || mb > 0, ta, ts);
    }
    return st;
}

/* Mismatch, trill_rl_trn_corrections, KL to the reference and routing flips over the trained sequences'
 * response tokens. */
static trill_status measure_mismatch(const trill_trainer *r, const rl_batch *b, const int *kept, int n_kept, const token_arrays *ta,
                                     trill_rl_metrics *m) {
    const trill_run_config *c = r->c;
    const size_t row = (size_t)r->L * r->K;
    long R = 0; /* the sampled tokens of the trained sequences */
    for (int i = 0; i < n_kept; i++)
        for (int t = b->offsets[kept[i]] + b->prompt_len[kept[i]]; t < b->offsets[kept[i] + 1]; t++) R += rl_sampled(b, t);
    float *old = trill_malloc(sizeof(float) * (size_t)(R + 1)), *behav = trill_malloc(sizeof(float) * (size_t)(R + 1));
    uint16_t *ge = row ? trill_malloc(sizeof(uint16_t) * row * (size_t)(R + 1)) : NULL;
    uint16_t *te = row ? trill_malloc(sizeof(uint16_t) * row * (size_t)(R + 1)) : NULL;
    double tis_sum = 0, tis_capped = 0, kl_ref_sum = 0;
    long j = 0, masked = 0, kl_ref_n = 0, differing = 0;
    trill_status st = old && behav && (!row || (ge && te)) ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n_kept && !st; i++) {
        const int s = kept[i];
        for (int t = b->offsets[s] + b->prompt_len[s]; t < b->offsets[s + 1]; t++) {
            if (!rl_sampled(b, t)) continue; /* injected: no behaviour log-prob, never trained */
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
            differing += memcmp(&old[j], &behav[j], sizeof(float)) != 0 || (row && memcmp(ge + (size_t)j * row, te + (size_t)j * row, sizeof(uint16_t) * row) != 0);
            j++;
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
        m->on_policy = r->onp_engine != NULL;
        m->on_policy_differing = differing;
        m->time.score_s = r->score_s;
    }
    free(old); free(behav); free(ge); free(te);
    return st;
}

/* The step's per-token distributions over the trained response tokens (the mismatch's tokens)
 * and the lengths of every response of the batch. */
static void histograms(const trill_trainer *r, const rl_batch *b, const int *kept, int n_kept, const token_arrays *ta, trill_rl_metrics *m) {
    memset(&m->hist, 0, sizeof m->hist);
    m->has_hist = true;
    for (int i = 0; i < n_kept; i++) {
        const int s = kept[i], first = b->offsets[s] + b->prompt_len[s], n = b->offsets[s + 1] - first;
        if (!b->loss_mask) {
            trill_rl_hist_tokens(&m->hist, ta->old_logp + first, b->behav_logp + first, ta->tis + first, ta->mask + first, (size_t)n);
            continue;
        }
        for (int t = first; t < first + n; t++) /* sampled tokens only: injected ones have no behaviour log-prob */
            if (b->loss_mask[t]) trill_rl_hist_tokens(&m->hist, ta->old_logp + t, b->behav_logp + t, ta->tis + t, ta->mask + t, 1);
    }
    for (int s = 0; s < b->n_seqs; s++) trill_rl_hist_response(&m->hist, rl_response_len(b, s), r->c->generator.max_new_tokens);
}

trill_status trill_trainer_step(trill_trainer *r, rl_batch *b, int step, rl_train_stats *ts, trill_rl_metrics *m) {
    token_arrays ta = { 0 };
    int *kept = trill_malloc(sizeof(int) * (size_t)b->n_seqs);
    memset(ts, 0, sizeof *ts);
    r->step = step;
    r->score_s = 0;
    trill_status st = kept ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = token_arrays_alloc(r, b, &ta);
    if (!st) st = shape_rewards(r, b, &ta, kept, &ts->kept, &ts->flat_groups);
    if (!st) st = run_minibatches(r, b, kept, ts->kept, &ta, ts);
    if (!st && ts->optimizer_steps) st = check_adapter(r);
    if (!st && ts->optimizer_steps) st = trill_trainer_gather(r, false); /* what the sync ships */
    if (!st) st = measure_mismatch(r, b, kept, ts->kept, &ta, m);
    if (!st) histograms(r, b, kept, ts->kept, &ta, m);
    token_arrays_free(&ta);
    free(kept);
    return st;
}

trill_status trill_trainer_export(trill_trainer *t, const float **data, size_t *n, const trill_model **merged) {
    *merged = NULL;
    if (t->c->sync.mode == TRILL_WEIGHT_SYNC_ADAPTER) {
        *data = t->whole->params;
        *n = t->whole->n_params;
        return TRILL_OK;
    }
    memcpy(t->merge_model->params, t->merge_base, sizeof(float) * t->merge_model->n_f32);
    trill_status st = trill_lora_merge(t->whole, t->merge_model);
    *data = t->merge_model->params;
    *n = t->merge_model->n_f32;
    *merged = t->merge_model;
    return st;
}
