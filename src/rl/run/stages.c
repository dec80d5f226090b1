/* The stages of an RL step (run.h), the executors' work (exec/exec.c): generate, score (or replay a
 * recorded batch), train and publish, evaluate; then the step's metrics line, progress line and
 * checkpoint. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "rl/transport/ranks.h"
#include "rl/run/run.h"
#include "trill/eval.h"
#include "trill/fileio.h"
#include "trill/log.h"
#include "trill/timing.h"

static double mean_of(const double *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return n ? s / n : NAN;
}

void trill_rl_rollout_free(rl_rollout *ro) {
    trill_rl_batch_free(&ro->b);
    json_decref(ro->ext_metrics);
    memset(ro, 0, sizeof *ro);
}

trill_status trill_rl_stage_generate(rl_run *r, int64_t index, rl_rollout *ro, trill_status (*between_steps)(void *), void *ctx) {
    memset(ro, 0, sizeof *ro);
    ro->index = index;
    const double t0 = trill_now();
    trill_status st = trill_rl_generator_generate(r->gen, index, between_steps, ctx, &ro->b, &ro->gen_tokens);
    ro->gen_s = trill_now() - t0;
    return st;
}

trill_status trill_rl_stage_reward(rl_run *r, rl_rollout *ro) {
    const double t0 = trill_now();
    if (!(ro->ext_metrics = json_object())) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_rl_scorer_score(r->scorer, &ro->b, ro->ext_metrics);
    ro->reward_s = trill_now() - t0;
    return st;
}

/* ---- recorded rollouts ---- */

static char *rollout_file(const char *dir, int step) {
    char name[32];
    snprintf(name, sizeof name, "step-%08d.bin", step);
    return trill_path_join(dir, name);
}

/* RUN/rollouts/step-N.bin: the batch as the trainer receives it (rewards in, advantages not yet). */
static trill_status save_rollout(rl_run *r, const rl_batch *b, int step) {
    char *dir = trill_path_join(r->c->run_dir, "rollouts"), *path = dir ? rollout_file(dir, step) : NULL;
    void *buf = NULL;
    size_t len = 0;
    trill_status st = path ? trill_mkdir_p(dir) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_rl_batch_pack(b, &buf, &len);
    if (!st) st = trill_write_file_atomic(path, buf, len);
    if (st) trill_error_context("rollouts.save: step %d", step);
    free(buf);
    free(path);
    free(dir);
    return st;
}

/* Checks a recorded batch against this run: its shape, and every id and number the trainer reads. */
static trill_status check_replayed(const rl_run *r, const rl_batch *b, const char *path) {
    const trill_run_config *c = r->c;
    const trill_config *mc = trill_model_config(trill_trainer_policy(r->trainer));
    const int L = mc->n_moe_layers, K = mc->num_experts_per_tok;
    const int want = c->generator.prompts_per_step * c->generator.n;
    if (b->n_seqs != want || b->group_size != c->generator.n)
        return trill_error(TRILL_ERR_INVALID, "%s: %d sequences in groups of %d, the config asks for %d prompts x generator.n %d", path,
                           b->n_seqs, b->group_size, c->generator.prompts_per_step, c->generator.n);
    if (b->n_moe_layers != L || b->top_k != K)
        return trill_error(TRILL_ERR_INVALID, "%s: routed experts for %d MoE layers x top-%d, the model has %d x top-%d", path,
                           b->n_moe_layers, b->top_k, L, K);
    for (int s = 0; s < b->n_seqs; s++) {
        if (!isfinite(b->reward[s])) return trill_error(TRILL_ERR_INVALID, "%s: sequence %d: reward is not a finite number", path, s);
        if (b->example[s] < 0 || b->example[s] >= r->train->n)
            return trill_error(TRILL_ERR_INVALID, "%s: sequence %d: example %d is not a line of data.train (%d prompts)", path, s,
                               b->example[s], r->train->n);
        for (int t = b->offsets[s]; t < b->offsets[s + 1]; t++) {
            if (b->tokens[t] < 0 || b->tokens[t] >= mc->vocab_size)
                return trill_error(TRILL_ERR_INVALID, "%s: sequence %d: token %d is outside the vocabulary (%d)", path, s, b->tokens[t],
                                   mc->vocab_size);
            if (t >= b->offsets[s] + b->prompt_len[s] && rl_sampled(b, t) && !(b->behav_logp[t] <= 0))
                return trill_error(TRILL_ERR_INVALID, "%s: sequence %d, token %d: behaviour log-prob %g is not a log-probability", path, s,
                                   t - b->offsets[s], b->behav_logp[t]);
        }
    }
    return TRILL_OK; /* routed expert ids are checked by the forward pass (in range, distinct per token) */
}

/* In place of generating and scoring: step N's batch from rollouts.replay/step-N.bin. */
trill_status trill_rl_stage_replay(rl_run *r, int64_t index, rl_rollout *ro) {
    memset(ro, 0, sizeof *ro);
    ro->index = index;
    const int step = r->state.step + 1;
    char *path = rollout_file(r->c->rollouts.replay, step), *data = NULL;
    size_t len = 0;
    trill_status st = path ? trill_read_file(path, &data, &len) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        st = trill_rl_batch_unpack(data, len, &ro->b);
        if (st) trill_error_context("%s", path);
    }
    if (!st) st = check_replayed(r, &ro->b, path);
    if (!st && !(ro->ext_metrics = json_object())) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int s = 0; !st && s < ro->b.n_seqs; s++) ro->gen_tokens += rl_response_len(&ro->b, s);
    if (st) trill_error_context("rollouts.replay: step %d", step);
    free(data);
    free(path);
    return st;
}

/* The episodes' figures (trill_rl_metrics.env). Prefill with the turns kept in the engine: each
 * group's prompt once, then every observation with the turn's last token; rendering each turn
 * afresh: every turn's whole prefix (the group's first turn shares the prompt's prefill). */
_Static_assert(RL_STOP_KINDS == sizeof ((trill_rl_metrics *)0)->env.stops / sizeof(long), "a count per stop reason");
/* The environment's own metrics of every episode, as means over the episodes. */
static trill_status env_own_metrics(const rl_batch *b, trill_rl_metrics *m) {
    for (int s = 0; s < b->n_seqs; s++) {
        json_t *j = json_loads(b->env_metrics[s], 0, NULL);
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) {
            int i = 0;
            while (i < m->env.n_metrics && strcmp(m->env.metric_name[i], key) != 0) i++;
            if (i == m->env.n_metrics && (i == TRILL_RL_MAX_EXT_METRICS || strlen(key) >= sizeof m->env.metric_name[0])) {
                json_decref(j);
                return trill_error(TRILL_ERR_INVALID, "environment: it reported %s (at most %d metrics, names under %zu bytes)",
                                   i == TRILL_RL_MAX_EXT_METRICS ? "too many metrics" : "a metric name too long", TRILL_RL_MAX_EXT_METRICS,
                                   sizeof m->env.metric_name[0]);
            }
            if (i == m->env.n_metrics) snprintf(m->env.metric_name[m->env.n_metrics++], sizeof m->env.metric_name[0], "%s", key);
            m->env.metric_value[i] += json_number_value(v) / b->n_seqs;
        }
        json_decref(j);
    }
    return TRILL_OK;
}

static trill_status env_metrics(const rl_batch *b, trill_rl_metrics *m) {
    m->has_env = true;
    memset(&m->env, 0, sizeof m->env);
    const double n = b->n_seqs ? b->n_seqs : 1;
    for (int s = 0; s < b->n_seqs; s++) {
        const rl_episode *e = &b->episodes[s];
        const bool first_of_group = s % b->group_size == 0;
        m->env.turns += e->turns / n;
        m->env.cut_turns += e->cut_turns / n;
        m->env.return_mean += e->env_return / n;
        m->env.tool_calls += e->tool_calls / n;
        m->env.parse_errors += e->parse_errors / n;
        m->env.env_s += e->env_s;
        m->env.stops[e->stop]++; /* checked when packed and unpacked */
        long at = 0;
        for (int k = b->seg_offsets[s]; k < b->seg_offsets[s + 1]; k++) {
            const rl_segment *g = &b->segs[k];
            if (g->kind == RL_SEG_SAMPLED) m->env.sampled_tokens += g->len / n;
            else m->env.injected_tokens += g->len / n;
            if (g->kind == RL_SEG_INJECTED && k == b->seg_offsets[s]) {
                m->env.prefill_tokens += first_of_group ? g->len : 0;
                m->env.rerender_prefill_tokens += first_of_group ? g->len : 0;
            } else if (g->kind == RL_SEG_INJECTED) {
                m->env.prefill_tokens += g->len + 1;
                m->env.rerender_prefill_tokens += at + g->len;
            }
            at += g->len;
        }
    }
    return env_own_metrics(b, m);
}

/* The batch's and the trainer's figures; the external reward's metrics as means over the batch. */
static trill_status batch_metrics(const rl_run *r, const rl_rollout *ro, const rl_train_stats *ts, trill_rl_metrics *m) {
    const rl_batch *b = &ro->b;
    const bool verified = r->c->reward.verifier != TRILL_VERIFIER_NONE;
    double accuracy = verified ? 0 : NAN, len = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        if (verified) accuracy += (b->correct[s] >= 0.5) / (double)b->n_seqs;
        len += rl_response_len(b, s) / (double)b->n_seqs;
    }
    const int steps = ts->optimizer_steps ? ts->optimizer_steps : 1;
    m->reward = mean_of(b->reward, b->n_seqs);
    m->accuracy = accuracy;
    m->response_len = len;
    m->flat_groups = ts->flat_groups;
    m->trained_seqs = ts->kept;
    m->loss = ts->loss / steps;
    m->pg_loss = ts->pg_loss / steps;
    m->kl_loss = ts->kl_loss / steps;
    m->clip_frac = ts->ratio_n ? ts->clip_tokens / ts->ratio_n : NAN;
    m->ratio_mean = ts->ratio_n ? ts->ratio_sum / ts->ratio_n : NAN;
    m->grad_norm = ts->grad_norm;
    m->skipped_nonfinite = ts->skipped;
    m->lr = ts->lr;
    if (b->episodes) {
        trill_status st = env_metrics(b, m);
        if (st) return st;
    }
    m->n_ext = 0;
    const char *key;
    json_t *val;
    json_object_foreach(ro->ext_metrics, key, val) {
        if (m->n_ext == TRILL_RL_MAX_EXT_METRICS || strlen(key) >= sizeof m->ext_name[0])
            return trill_error(TRILL_ERR_INVALID, "reward.external: the process reported %s (at most %d metrics, names under %zu bytes)",
                               m->n_ext == TRILL_RL_MAX_EXT_METRICS ? "too many metrics" : "a metric name too long", TRILL_RL_MAX_EXT_METRICS,
                               sizeof m->ext_name[0]);
        snprintf(m->ext_name[m->n_ext], sizeof m->ext_name[0], "%s", key);
        m->ext_value[m->n_ext++] = json_number_value(val) / b->n_seqs;
    }
    return TRILL_OK;
}

trill_status trill_rl_stage_train(rl_run *r, rl_rollout *ro, rl_publish_fn publish, void *ctx, trill_rl_metrics *m, double *train_s_out,
                                  long *train_tokens_out) {
    const trill_run_config *c = r->c;
    rl_train_stats ts = { 0 };
    trill_status st = c->rollouts.save && r->rank == 0 ? save_rollout(r, &ro->b, r->state.step + 1) : TRILL_OK;
    const double t_reward = trill_now();
    const bool many = r->world && trill_comm_size(r->world) > 1;
    if (many) trill_trainer_comm_reset(r->trainer);
    if (!st) st = trill_trainer_step(r->trainer, &ro->b, r->state.step + 1, &ts, m);
    if (!st && many) {
        const trill_comm_stats cs = trill_trainer_comm_stats(r->trainer);
        m->has_comm = true;
        for (int k = 0; k < TRILL_COMM_KINDS; k++) m->comm_bytes[k] = cs.bytes[k], m->comm_ms[k] = cs.ms[k];
    }
    const double t_train = trill_now();
    double sync_ms = 0;
    size_t sync_bytes = 0;
    if (!st && ts.optimizer_steps) {
        r->state.version++;
        st = publish(r, ctx, &sync_ms, &sync_bytes);
        if (!st) trill_rl_remote_transfer_metrics(r, m);
    }
    const double t_end = trill_now();
    if (!st) st = batch_metrics(r, ro, &ts, m);
    if (!st) {
        m->sync_mode = c->sync.mode;
        m->sync_bytes = sync_bytes;
        m->sync_ms = sync_ms;
        m->policy_version = r->state.version;
        m->time.generate_s = ro->gen_s;
        m->time.reward_s = ro->reward_s;
        m->time.train_s = t_train - t_reward;
        m->time.sync_s = t_end - t_train;
        m->time.step_s = ro->gen_s + ro->reward_s + (t_end - t_reward);
        m->time.gen_tokens_per_s = ro->gen_tokens / ro->gen_s;
        m->time.train_tokens_per_s = ts.tokens / (t_train - t_reward);
    }
    *train_s_out = t_train - t_reward;
    *train_tokens_out = ts.tokens;
    if (!st) r->state.data_pos = (ro->index + 1) * c->generator.prompts_per_step;
    return st;
}

/* ---- weight sync ---- */

/* Sync mode: the trainer's weights go to the generator's engine in this thread. */
trill_status trill_rl_publish_direct(rl_run *r, void *ctx, double *ms, size_t *bytes) {
    (void)ctx;
    const double t0 = trill_now();
    const float *data;
    size_t n;
    const trill_model *merged;
    trill_status st = trill_trainer_export(r->trainer, &data, &n, &merged);
    if (!st)
        st = merged ? trill_rl_generator_load_weights(r->gen, merged, r->state.version, bytes)
                    : trill_rl_generator_load_adapter(r->gen, trill_trainer_lora(r->trainer), r->state.version, bytes);
    *ms = (trill_now() - t0) * 1e3;
    return st;
}

/* ---- evaluation ---- */

/* A line of RUN/eval.jsonl: the evaluation after `step` (0: before training). */
static trill_status log_eval(rl_run *r, int step, const char *when, const trill_eval_result *res, uint32_t version) {
    if (!r->evals) return TRILL_OK; /* a rank other than 0 */
    const int n = fprintf(r->evals, "{\"step\": %d, \"when\": \"%s\", \"pass1\": %.17g, \"passk\": %.17g, \"k\": %d, \"prompts\": %d, "
                          "\"mean_len\": %.17g, \"seconds\": %.6g, \"policy_version\": %u}\n", step, when, res->pass1, res->passk, res->k,
                          res->prompts, res->mean_len, res->seconds, version);
    return n < 0 || fflush(r->evals) ? trill_error(TRILL_ERR_IO, "eval.jsonl: write failed (%s)", strerror(errno)) : TRILL_OK;
}

trill_status trill_rl_stage_evaluate(rl_run *r, int step, const char *when, double *pass1, double *passk) {
    const trill_run_config *c = r->c;
    trill_eval_result res;
    *pass1 = *passk = NAN;
    const bool remote = trill_rl_ranks_remote_generator(r);
    if (remote ? r->rank != 0 : !r->gen) return TRILL_OK;
    trill_status st = remote ? trill_rl_remote_evaluate(r, &res) : trill_rl_generator_evaluate(r->gen, r->eval, &res);
    if (st) return st;
    const uint32_t version = remote ? r->state.version : trill_rl_generator_version(r->gen);
    trill_log(TRILL_LOG_INFO, "trill train: held-out %s: pass@1 %.1f%%  pass@%d %.1f%%  (%d prompts x %d samples, T=%g, policy version %u, %.1f s)",
            when, 100 * res.pass1, res.k, 100 * res.passk, res.prompts, res.k, c->eval.temperature, version, res.seconds);
    *pass1 = res.pass1;
    *passk = res.passk;
    return log_eval(r, step, when, &res, version);
}

/* ---- after a step ---- */

trill_status trill_rl_save_checkpoint(rl_run *r) {
    const trill_run_config *c = r->c;
    trill_status st = trill_trainer_gather(r->trainer, true); /* the experts' shards, under expert parallelism */
    st = st || r->rank != 0 ? st
                                   : trill_rl_checkpoint_save(c->run_dir, c, &r->state, trill_trainer_lora(r->trainer),
                                                              trill_trainer_optimizer(r->trainer), &r->base, c->checkpoint.keep);
    if (!st) r->saved_step = r->state.step;
    return st;
}

static trill_status append_metrics(rl_run *r, const trill_rl_metrics *m) {
    if (!r->metrics) return TRILL_OK; /* a rank other than 0 */
    char *line = trill_rl_metrics_json(m);
    if (!line) return trill_error(TRILL_ERR_NOMEM, "out of memory for the metrics of step %d", m->step);
    int bad = fprintf(r->metrics, "%s\n", line) < 0 || fflush(r->metrics) != 0;
    free(line);
    return bad ? trill_error(TRILL_ERR_IO, "metrics.jsonl: write failed (%s)", strerror(errno)) : TRILL_OK;
}

static double tv_s(struct timeval t) { return (double)t.tv_sec + 1e-6 * (double)t.tv_usec; }

trill_status trill_rl_finish_step(rl_run *r, const trill_rl_metrics *step_metrics) {
    const trill_run_config *c = r->c;
    r->state.step++;
    /* what the process spent since the previous step ended: every executor's threads */
    trill_rl_metrics m = *step_metrics;
    struct rusage now;
    getrusage(RUSAGE_SELF, &now);
    m.time.minor_faults = now.ru_minflt - r->usage.ru_minflt;
    m.time.system_s = tv_s(now.ru_stime) - tv_s(r->usage.ru_stime);
    m.time.user_s = tv_s(now.ru_utime) - tv_s(r->usage.ru_utime);
    r->usage = now;
    /* the peak memory of the process so far, and with several ranks the largest rank's */
    m.time.rss_peak_mb = now.ru_maxrss / 1024.0;
    trill_status st = TRILL_OK;
    if (r->world && trill_comm_size(r->world) > 1) {
        uint64_t most = 0;
        st = trill_comm_allreduce_max_u64(r->world, (uint64_t)now.ru_maxrss, &most);
        m.time.rss_peak_max_mb = most / 1024.0;
    }
    if (!st) st = append_metrics(r, &m);
    if (st) return st;
    if ((c->checkpoint.every > 0 && r->state.step % c->checkpoint.every == 0) || r->state.step == c->steps) st = trill_rl_save_checkpoint(r);
    return st;
}

