/* The trainer's supervised step (trainer_internal.h): the NLL of a batch's completions, and its
 * optimizer step. */
#include "rl/exec/trainer_internal.h"

/* ---- supervised fine-tuning ---- */

/* d loss / d log p of the micro-batch's tokens: -1 on each sequence's tokens after its prompt
 * (the completion and its end-of-sequence token; never a sequence's first token), 0 elsewhere;
 * returns how many. */
static long nll_weights(const rl_batch *b, const micro *m, float *dlp) {
    long n = 0;
    for (int i = 0; i < m->n; i++) {
        const int s = m->seq[i], len = m->offsets[i + 1] - m->offsets[i];
        for (int t = 0; t < len; t++) {
            const bool loss = t >= b->prompt_len[s] && t > 0;
            dlp[m->offsets[i] + t] = loss ? -1.0f : 0.0f;
            n += loss;
        }
    }
    return n;
}

/* The NLL of b's sequences after their prompts (and with `train` its gradient into lora_grads):
 * the batch cut into micro-batches by the packer's rule whatever the rank count; under data
 * parallelism each rank forwards a contiguous trill_rl_trn_share of them (in rounds under expert
 * parallelism). Each micro-batch's gradient is a leaf of the step's tree and its NLL, loss
 * tokens and tokens are summed in micro-batch order, so every rank count gives the same bits. */
static trill_status nll_pass(trill_trainer *r, const rl_batch *b, bool train, double *nll, long *n_loss, long *tokens) {
    *nll = 0;
    *n_loss = *tokens = 0;
    int *seq = trill_malloc(sizeof(int) * (size_t)(b->n_seqs ? b->n_seqs : 1));
    micro_plan p = { 0 };
    grad_sum g = { 0 };
    trill_status st = seq ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int s = 0; s < b->n_seqs && seq; s++) seq[s] = s;
    if (!st) st = trill_rl_trn_plan_micros(r, b, seq, b->n_seqs, &p);
    double *stat = st ? NULL : trill_calloc((size_t)3 * (p.M ? p.M : 1), sizeof(double)); /* per micro-batch: NLL, loss tokens, tokens */
    if (!st && !stat) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && train) st = trill_rl_trn_grad_sum_create(r, &p, &g);
    for (int i = 0; i < p.rounds && !st; i++) { /* round i: this rank's i-th micro-batch, or an empty pass */
        const int mi = p.lo + i;
        const bool mine = mi < p.hi;
        const int k = mine ? p.first[mi + 1] - p.first[mi] : 0;
        micro m;
        if ((st = trill_rl_trn_micro_make(r, b, seq + (mine ? p.first[mi] : 0), k, NULL, &m))) break;
        float *lp = trill_rl_trn_ws_get(r, WS_LP, sizeof(float) * (size_t)(m.T + 1)), *dlp = trill_rl_trn_ws_get(r, WS_DLP, sizeof(float) * (size_t)(m.T + 1));
        trill_forward_pass *pass = NULL;
        if (!lp || !dlp) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st && mine) stat[3 * mi + 1] = (double)nll_weights(b, &m, dlp);
        if (!st && train) st = trill_model_forward_train(r->policy, m.tokens, m.offsets, m.n, NULL, lp, NULL, r->c->trainer.recompute, &pass);
        if (!st && !train) st = trill_model_forward(r->policy, m.tokens, m.offsets, m.n, NULL, lp, NULL);
        for (int t = 0; !st && t < m.T; t++)
            if (dlp[t] != 0) stat[3 * mi] -= lp[t];
        if (!st && mine) stat[3 * mi + 2] = m.T;
        if (!st && train) st = trill_rl_trn_backward_round(r, &p, &g, i, pass, dlp);
        trill_forward_pass_free(pass);
    }
    if (!st && train) st = trill_rl_trn_grad_sum_finish(r, &g);
    /* one rank wrote each entry: the sum over ranks is that entry, exactly */
    if (!st && r->data) st = trill_comm_allreduce_f64(r->data, stat, (size_t)3 * p.M);
    for (int i = 0; !st && i < p.M; i++) {
        *nll += stat[3 * i];
        *n_loss += (long)stat[3 * i + 1];
        *tokens += (long)stat[3 * i + 2];
    }
    if (train) trill_rl_trn_grad_sum_free(r, &g);
    free(stat);
    trill_rl_trn_plan_free(&p);
    free(seq);
    return st;
}

trill_status trill_trainer_nll_step(trill_trainer *r, const rl_batch *b, int step, int64_t total, trill_nll_stats *out) {
    memset(out, 0, sizeof *out);
    r->step = step;
    memset(r->lora_grads, 0, sizeof(float) * r->n_values);
    double nll;
    long n_loss;
    trill_status st = nll_pass(r, b, true, &nll, &n_loss, &out->tokens);
    if (st) return st;
    const double denom = n_loss ? (double)n_loss : 1;
    out->loss = nll / denom;
    return trill_rl_trn_apply_update(r, denom, out->loss, total, &out->grad_norm, &out->lr, &out->applied);
}

trill_status trill_trainer_nll(trill_trainer *r, const rl_batch *b, double *nll, long *n_loss) {
    long tokens;
    return nll_pass(r, b, false, nll, n_loss, &tokens);
}

trill_status trill_trainer_save(const trill_trainer *t, const char *dir) {
    trill_status st = t->lora ? trill_lora_save(t->whole, dir) : trill_model_save(t->policy, dir, TRILL_F32, 5000000000u);
    char *prefix = st ? NULL : trill_path_join(dir, "optimizer");
    if (!st && !prefix) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_adamw_save(t->whole_opt ? t->whole_opt : t->opt, prefix);
    free(prefix);
    return st;
}
