/* The scorer executor (scorer.h): the verifier, the external reward pool and the reward model. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "rl/reward/reward_process.h"
#include "rl/exec/scorer.h"
#include "trill/eval.h"
#include "trill/reward.h"
#include "trill/reward_model.h"

struct rl_scorer {
    const trill_run_config *c;
    const trill_dataset *data;
    trill_verifier verifier;
    reward_process **ext;         /* the external reward pool: n_ext processes */
    int n_ext;
    trill_reward_model *rm;
};

trill_status trill_rl_scorer_create(const trill_run_config *c, const trill_dataset *data, rl_scorer **out) {
    rl_scorer *s = trill_calloc(1, sizeof *s);
    if (!s) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    *s = (rl_scorer){ .c = c, .data = data, .verifier = c->reward.verifier };
    trill_status st = TRILL_OK;
    if (c->reward.external[0]) {
        if (!(s->ext = trill_calloc((size_t)c->reward.external_workers, sizeof(reward_process *))))
            st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (; !st && s->n_ext < c->reward.external_workers; s->n_ext++)
            if ((st = trill_reward_process_start(c->reward.external, c->reward.external_timeout_s, c->reward.external_max_failures,
                                                 &s->ext[s->n_ext])))
                break;
    }
    if (!st && c->reward.model[0]) st = trill_reward_model_load(c->reward.model, &s->rm);
    if (st) {
        trill_rl_scorer_free(s);
        return st;
    }
    *out = s;
    return TRILL_OK;
}

void trill_rl_scorer_free(rl_scorer *s) {
    if (!s) return;
    for (int w = 0; w < s->n_ext; w++) trill_reward_process_free(s->ext[w]);
    free(s->ext);
    trill_reward_model_free(s->rm);
    free(s);
}

/* A reward that overflowed while its weighted scores were added up stops the step here, before
 * it can reach the advantages. */
static trill_status check_rewards(const rl_batch *b, const char *after, const char *key, double weight, const double *scores) {
    for (int s = 0; s < b->n_seqs; s++)
        if (!isfinite(b->reward[s]))
            return trill_error(TRILL_ERR_INVALID, "sequence %d of the batch: its reward is %g after adding %s's score (%s %g x score %g); "
                               "rewards must stay finite numbers", s, b->reward[s], after, key, weight, scores ? scores[s] : NAN);
    return TRILL_OK;
}

/* The external reward pool: worker w scores sequences w, w + n, w + 2n, ... with its own
 * process, all at once; rewards and metrics are then added up in sequence order, so the result
 * does not depend on which process answered first. */
typedef struct ext_job {
    rl_scorer *s;
    rl_batch *b;
    int worker;
    double *values;
    json_t **metrics;
    trill_status st;
    char err[1024];
} ext_job;

static void *ext_worker(void *arg) {
    ext_job *j = arg;
    for (int s = j->worker; s < j->b->n_seqs && !j->st; s += j->s->n_ext) {
        const trill_example *ex = &j->s->data->examples[j->b->example[s]];
        j->st = trill_reward_process_score(j->s->ext[j->worker], ex->prompt, j->b->completion[s], ex->answer, &j->values[s], &j->metrics[s]);
    }
    if (j->st) snprintf(j->err, sizeof j->err, "%s", trill_error_message()); /* the message is per thread */
    return NULL;
}

static trill_status score_external(rl_scorer *r, rl_batch *b, json_t *ext_metrics) {
    const int n = b->n_seqs, W = r->n_ext;
    double *values = trill_calloc((size_t)n, sizeof(double));
    json_t **metrics = trill_calloc((size_t)n, sizeof(json_t *));
    ext_job *jobs = trill_calloc((size_t)W, sizeof(ext_job));
    pthread_t *threads = trill_calloc((size_t)W, sizeof(pthread_t));
    bool *started = trill_calloc((size_t)W, sizeof(bool));
    trill_status st = values && metrics && jobs && threads && started ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int w = 0; w < W && !st; w++) {
        jobs[w] = (ext_job){ .s = r, .b = b, .worker = w, .values = values, .metrics = metrics };
        if (W == 1) ext_worker(&jobs[w]);
        else started[w] = pthread_create(&threads[w], NULL, ext_worker, &jobs[w]) == 0;
        if (W > 1 && !started[w]) { jobs[w].st = TRILL_ERR_IO; snprintf(jobs[w].err, sizeof jobs[w].err, "cannot start a reward worker thread"); }
    }
    for (int w = 0; w < W && started; w++)
        if (started[w]) pthread_join(threads[w], NULL);
    for (int w = 0; w < W && !st && jobs; w++)
        if (jobs[w].st) st = trill_error(jobs[w].st, "%s", jobs[w].err);
    for (int s = 0; s < n && !st; s++) {
        b->reward[s] += r->c->reward.external_weight * values[s];
        if (!isfinite(b->reward[s])) st = check_rewards(b, "the external process", "reward.external_weight", r->c->reward.external_weight, values);
        const char *key;
        json_t *val;
        json_object_foreach(metrics[s], key, val) { /* summed here, averaged when logged */
            json_t *sum = json_object_get(ext_metrics, key);
            if (!st && json_object_set_new(ext_metrics, key, json_real((sum ? json_number_value(sum) : 0) + json_number_value(val))))
                st = trill_error(TRILL_ERR_NOMEM, "out of memory for the external reward's metrics");
        }
    }
    for (int s = 0; s < n && metrics; s++) json_decref(metrics[s]);
    free(values); free(metrics); free(jobs); free(threads); free(started);
    return st;
}

trill_status trill_rl_scorer_score(rl_scorer *r, rl_batch *b, json_t *ext_metrics) {
    const trill_run_config *c = r->c;
    trill_status st = TRILL_OK;
    for (int s = 0; s < b->n_seqs; s++) {
        const trill_example *ex = &r->data->examples[b->example[s]];
        b->correct[s] = trill_verify(r->verifier, b->completion[s], ex->answer);
        b->reward[s] = r->verifier != TRILL_VERIFIER_NONE ? c->reward.verifier_weight * b->correct[s] : 0;
    }
    if (r->verifier != TRILL_VERIFIER_NONE) st = check_rewards(b, "the verifier", "reward.verifier_weight", c->reward.verifier_weight, b->correct);
    for (int s = 0; s < b->n_seqs && !st && b->episodes; s++) b->reward[s] += c->env.reward_weight * b->episodes[s].env_return;
    if (!st && b->episodes) st = check_rewards(b, "the environment", "env.reward_weight", c->env.reward_weight, NULL);
    if (!st && r->n_ext) st = score_external(r, b, ext_metrics);
    if (!st && r->rm) {
        char **texts = trill_calloc((size_t)b->n_seqs, sizeof(char *));
        double *scores = trill_malloc(sizeof(double) * (size_t)b->n_seqs);
        if (!texts || !scores) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (int s = 0; s < b->n_seqs && !st; s++) {
            const trill_example *ex = &r->data->examples[b->example[s]];
            if (asprintf(&texts[s], "%s%s", ex->prompt, b->completion[s]) < 0) { texts[s] = NULL; st = trill_error(TRILL_ERR_NOMEM, "out of memory"); }
        }
        if (!st) st = trill_reward_model_score(r->rm, (const char *const *)texts, b->n_seqs, scores);
        for (int s = 0; s < b->n_seqs && !st; s++) b->reward[s] += c->reward.model_weight * scores[s];
        if (!st) st = check_rewards(b, "the reward model", "reward.model_weight", c->reward.model_weight, scores);
        for (int s = 0; s < b->n_seqs && texts; s++) free(texts[s]);
        free(texts);
        free(scores);
    }
    return st;
}
