/* Executors on MPI ranks of their own (ranks.h): the placement, the controller's requests and
 * the executor ranks' loops. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "rl/transport/ranks.h"
#include "trill/channel.h"
#include "trill/timing.h"

rl_role trill_rl_role(const trill_run_config *c, int rank, int *replica) {
    const int T = c->parallel.trainer.dp * c->parallel.trainer.ep * c->parallel.trainer.tp;
    *replica = -1;
    if (rank < T) return RL_ROLE_TRAINER;
    if (rank < T + c->parallel.generator.replicas * c->parallel.generator.ep) {
        *replica = rank - T;
        return RL_ROLE_GENERATOR;
    }
    return RL_ROLE_SCORER;
}

bool trill_rl_ranks_remote_generator(const rl_run *r) { return r->remote && r->remote->replicas > 0; }
bool trill_rl_ranks_executor(const rl_run *r) { return r->remote && r->remote->role != RL_ROLE_TRAINER; }

trill_status trill_rl_ranks_create(rl_run *r, trill_comm *job) {
    const trill_run_config *c = r->c;
    r->job = job;
    r->world = job;
    if (!job || trill_comm_size(job) == 1 || (!c->parallel.generator.replicas && !c->parallel.scorer)) return TRILL_OK;
    const int gen_ranks = c->parallel.generator.replicas * c->parallel.generator.ep;
    if (gen_ranks > MAX_REPLICAS)
        return trill_error(TRILL_ERR_UNSUPPORTED, "parallel.generator: replicas %d x ep %d = %d generator ranks, at most %d",
                           c->parallel.generator.replicas, c->parallel.generator.ep, gen_ranks, MAX_REPLICAS);
    rl_remote *x = trill_calloc(1, sizeof *x);
    if (!x) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    r->remote = x;
    const int rank = trill_comm_rank(job);
    x->role = trill_rl_role(c, rank, &x->replica);
    x->replicas = gen_ranks;
    x->ep = c->parallel.generator.ep;
    x->trainer_ranks = c->parallel.trainer.dp * c->parallel.trainer.ep * c->parallel.trainer.tp;
    x->scorer_rank = c->parallel.scorer ? trill_comm_size(job) - 1 : -1;
    trill_status st = trill_comm_split(job, x->role == RL_ROLE_TRAINER ? 0 : 1, rank, &x->group);
    if (!st) r->world = x->role == RL_ROLE_TRAINER ? x->group : NULL;
    r->rank = rank;
    const bool in_group = rank == 0 || x->role == RL_ROLE_GENERATOR;
    trill_comm *other = NULL;
    if (!st && x->replicas) st = trill_comm_split(job, in_group ? 0 : 1, rank, in_group ? &x->replicas_comm : &other);
    trill_comm_free(other);
    other = NULL;
    /* an expert-parallel replica's ranks: generator ranks j / ep alike */
    const bool gen = x->role == RL_ROLE_GENERATOR;
    if (!st && x->ep > 1) st = trill_comm_split(job, gen ? 1 + x->replica / x->ep : 0, rank, gen ? &x->experts : &other);
    trill_comm_free(other);
    return st;
}

void trill_rl_ranks_free(rl_run *r) {
    rl_remote *x = r->remote;
    if (!x) return;
    if (r->rank == 0) trill_rl_remote_stop(r);
    trill_lora_free(x->staging_lora);
    trill_model_free(x->staging_model);
    trill_model_free(x->model);
    free(x->held);
    trill_comm_free(x->replicas_comm);
    trill_comm_free(x->experts);
    trill_comm_free(x->group);
    free(x);
    r->remote = NULL;
    r->world = r->job;
}

/* ---- messages ---- */

/* The scorer's answer, blocking (a replica's leave by non-blocking sends: replica.c). */
static trill_status send_reply(trill_comm *c, int to, int tag, trill_status st, rl_reply rep, const void *payload) {
    const char *msg = st ? trill_error_message() : NULL;
    rep.status = st;
    rep.bytes = st ? strlen(msg) + 1 : rep.bytes;
    trill_status sent = trill_comm_send(c, &rep, sizeof rep, to, tag);
    if (!sent && rep.bytes) sent = trill_comm_send(c, st ? msg : payload, rep.bytes, to, tag);
    return sent;
}

trill_status trill_rl_recv_reply(trill_comm *c, int from, int tag, const char *who, rl_reply *rep, char **payload) {
    *payload = NULL;
    trill_status st = trill_comm_recv(c, rep, sizeof *rep, from, tag);
    if (st) return st;
    if (rep->bytes > ((uint64_t)1 << 40)) return trill_error(TRILL_ERR_IO, "%s: an answer of %llu bytes", who, (unsigned long long)rep->bytes);
    if (rep->bytes) {
        if (!(*payload = trill_malloc(rep->bytes + 1))) return trill_error(TRILL_ERR_NOMEM, "out of memory for %s's answer", who);
        st = trill_comm_recv(c, *payload, rep->bytes, from, tag);
        (*payload)[rep->bytes] = '\0';
    }
    if (!st && rep->status) {
        st = trill_error((trill_status)rep->status, "%s: %s", who, *payload ? *payload : "failed");
        free(*payload);
        *payload = NULL;
    }
    return st;
}

void trill_rl_replica_name(const rl_remote *x, int j, char *out, size_t size) {
    if (x->ep > 1) snprintf(out, size, "generator replica %d, its expert-parallel rank %d (rank %d)", j / x->ep, j % x->ep, x->trainer_ranks + j);
    else snprintf(out, size, "generator replica %d (rank %d)", j, x->trainer_ranks + j);
}

trill_status trill_rl_gather_replies(rl_remote *x, int first, int last, int kind, trill_status (*take)(void *, int, const rl_reply *, char *),
                                     void *ctx) {
    trill_status st = TRILL_OK;
    char err[2048] = "";
    for (int j = first; j < last; j++) {
        char who[96];
        trill_rl_replica_name(x, j, who, sizeof who);
        rl_reply rep;
        char *payload = NULL;
        trill_status got = trill_rl_recv_reply(x->replicas_comm, j + 1, TAG_REPLY, who, &rep, &payload);
        if (!got && rep.kind != kind) got = trill_error(TRILL_ERR_IO, "%s: answer of kind %d, expected %d", who, rep.kind, kind);
        if (!got && take) got = take(ctx, j, &rep, payload);
        else free(payload);
        if (got && !st) {
            st = got;
            snprintf(err, sizeof err, "%s", trill_error_message());
        }
    }
    return st ? trill_error(st, "%s", err) : TRILL_OK;
}

trill_status trill_rl_bcast_replicas(rl_remote *x, void *data, size_t bytes) {
    trill_comm_request *req = NULL;
    trill_status st = trill_comm_ibcast(x->replicas_comm, data, bytes, 0, &req);
    return st ? st : trill_comm_wait(req);
}

static trill_status send_cmd(rl_remote *x, rl_cmd *cmd) { return trill_rl_bcast_replicas(x, cmd, sizeof *cmd); }

/* ---- the controller ---- */

/* Each prompt of batch `index` to the replica with the fewest pending tokens (its prompt and
 * max_new_tokens, n samples), in prompt order, ties to the lower replica. */
static trill_status assign_prompts(const rl_run *r, int64_t index, int32_t *owner) {
    const trill_run_config *c = r->c;
    const int P = c->generator.prompts_per_step, R = r->remote->replicas;
    int *order = trill_malloc(sizeof(int) * (size_t)P);
    if (!order) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_dataset_order(r->train, c->seed, c->data.shuffle, index * P, P, order);
    double pending[MAX_REPLICAS] = { 0 };
    for (int p = 0; !st && p < P; p++) {
        int best = 0;
        for (int j = 1; j < R; j++)
            if (pending[j] < pending[best]) best = j;
        owner[p] = best;
        pending[best] += (double)(r->train->examples[order[p]].n_ids + c->generator.max_new_tokens) * c->generator.n;
    }
    free(order);
    return st;
}

trill_status trill_rl_issue_batch(rl_run *r, int64_t index, int32_t *owner) {
    rl_remote *x = r->remote;
    trill_status st = assign_prompts(r, index, owner);
    rl_cmd cmd = { .op = CMD_GENERATE, .index = index };
    if (!st) st = send_cmd(x, &cmd);
    if (!st) st = trill_rl_bcast_replicas(x, owner, sizeof(int32_t) * (size_t)r->c->generator.prompts_per_step);
    return st;
}

typedef struct parts_ctx { rl_remote *x; rl_batch *parts; long tokens; int64_t index; } parts_ctx;

/* An expert-parallel rank's holdings, after its batch: what its next merged update must bring. */
static trill_status note_holdings(rl_remote *x, int j, const char *held, size_t n) {
    if (!x->held && !(x->held = trill_malloc(n * (size_t)x->replicas))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    memcpy(x->held + n * (size_t)j, held, n);
    x->held_known[j] = true;
    return TRILL_OK;
}

static trill_status take_part(void *ctx, int j, const rl_reply *rep, char *payload) {
    parts_ctx *p = ctx;
    const size_t batch = rep->bytes - (rep->held_bytes <= rep->bytes ? rep->held_bytes : rep->bytes);
    trill_status st = rep->index == p->index ? trill_rl_batch_unpack(payload, batch, &p->parts[j])
                                             : trill_error(TRILL_ERR_IO, "batch %lld, expected %lld", (long long)rep->index, (long long)p->index);
    if (!st && rep->held_bytes) st = note_holdings(p->x, j, payload + batch, rep->held_bytes);
    if (st) trill_error_context("the rollouts of generator replica %d", j);
    p->tokens += rep->tokens;
    /* the newest weights this replica applied, as it says */
    p->x->recv_rank[j] = p->x->trainer_ranks + j;
    p->x->receive_ms[j] = rep->receive_ms;
    p->x->apply_ms[j] = rep->apply_ms;
    p->x->applied[j] = rep->applied;
    p->x->busy_s[j] = rep->busy_s;
    free(payload);
    return st;
}

trill_status trill_rl_collect_batch(rl_run *r, int64_t index, const int32_t *owner, rl_rollout *ro) {
    rl_remote *x = r->remote;
    const int P = r->c->generator.prompts_per_step;
    int *part_of = trill_malloc(sizeof(int) * (size_t)P);
    rl_batch *parts = trill_calloc((size_t)x->replicas, sizeof *parts);
    trill_status st = part_of && parts ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    parts_ctx pc = { .x = x, .parts = parts, .index = index };
    if (!st) st = trill_rl_gather_replies(x, 0, x->replicas, REPLY_BATCH, take_part, &pc);
    for (int p = 0; !st && p < P; p++) part_of[p] = owner[p];
    if (!st) st = trill_rl_batch_merge(parts, x->replicas, part_of, P, &ro->b);
    for (int j = 0; parts && j < x->replicas; j++) trill_rl_batch_free(&parts[j]);
    free(parts);
    free(part_of);
    ro->gen_tokens = pc.tokens;
    return st;
}

trill_status trill_rl_remote_generate(rl_run *r, int64_t index, rl_rollout *ro) {
    memset(ro, 0, sizeof *ro);
    ro->index = index;
    const double t0 = trill_now();
    int32_t *owner = trill_malloc(sizeof(int32_t) * (size_t)r->c->generator.prompts_per_step);
    trill_status st = owner ? trill_rl_issue_batch(r, index, owner) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_rl_collect_batch(r, index, owner, ro);
    free(owner);
    ro->gen_s = trill_now() - t0;
    return st;
}

typedef struct weights_ctx { rl_remote *x; size_t applied; } weights_ctx;

static trill_status take_ack(void *ctx, int j, const rl_reply *rep, char *payload) {
    weights_ctx *w = ctx;
    free(payload);
    w->x->recv_rank[j] = w->x->trainer_ranks + j;
    w->x->receive_ms[j] = rep->receive_ms;
    w->x->apply_ms[j] = rep->apply_ms;
    if (j == 0) w->applied = rep->applied;
    return TRILL_OK;
}

bool trill_rl_tensor_wanted(const trill_config *c, const trill_param *t, const uint8_t *held) {
    return !held || t->expert < 0 || held[(size_t)c->moe_ordinal[t->layer] * c->num_experts + t->expert];
}

/* Merged weights to expert-parallel replicas: each generator rank j its tensors (every non-expert
 * one and the experts it keeps), in tensor order, with their XXH64, point to point. */
static trill_status send_partial(rl_remote *x, const trill_model *m) {
    const trill_config *c = trill_model_config(m);
    size_t nt;
    const trill_param *t = trill_model_tensors(m, &nt);
    const size_t held_n = (size_t)c->n_moe_layers * c->num_experts;
    float *buf = trill_malloc(sizeof(float) * (trill_model_n_params(m) + 1));
    trill_status st = buf ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory for the merged weights");
    for (int j = 0; !st && j < x->replicas; j++) {
        size_t at = 0;
        for (size_t k = 0; k < nt; k++)
            if (trill_rl_tensor_wanted(c, &t[k], x->held + held_n * (size_t)j)) {
                memcpy(buf + at, t[k].data, sizeof(float) * t[k].numel);
                at += t[k].numel;
            }
        uint64_t head[2] = { at * sizeof(float), trill_channel_checksum(buf, at) };
        st = trill_comm_send(x->replicas_comm, head, sizeof head, j + 1, TAG_WEIGHTS);
        if (!st) st = trill_comm_send(x->replicas_comm, buf, head[0], j + 1, TAG_WEIGHTS);
        x->recv_bytes[j] = head[0];
    }
    free(buf);
    return st;
}

trill_status trill_rl_send_weights(rl_run *r, bool ack, size_t *applied) {
    rl_remote *x = r->remote;
    const float *data;
    size_t n;
    const trill_model *merged;
    trill_status st = trill_trainer_export(r->trainer, &data, &n, &merged);
    bool known = x->held != NULL;
    for (int j = 0; j < x->replicas; j++) known &= x->held_known[j];
    rl_cmd cmd = { .op = CMD_WEIGHTS, .merge = merged != NULL, .version = r->state.version, .ack = ack, .bytes = n * sizeof(float),
                   .checksum = st ? 0 : trill_channel_checksum(data, n), .partial = merged && x->ep > 1 && known };
    trill_comm_request *req = NULL;
    if (!st) st = send_cmd(x, &cmd);
    if (!st && cmd.partial) st = send_partial(x, merged);
    if (!st && !cmd.partial) st = trill_comm_ibcast(x->replicas_comm, (void *)data, cmd.bytes, 0, &req);
    if (!st) st = trill_comm_wait(req);
    for (int j = 0; !cmd.partial && j < x->replicas; j++) x->recv_bytes[j] = cmd.bytes;
    weights_ctx w = { .x = x };
    if (!st && ack) st = trill_rl_gather_replies(x, 0, x->replicas, REPLY_ACK, take_ack, &w);
    x->n_receivers = st ? 0 : x->replicas;
    x->transfer_bytes = cmd.bytes;
    x->checksum = cmd.checksum;
    *applied = w.applied;
    return st;
}

trill_status trill_rl_publish_remote(rl_run *r, void *ctx, double *ms, size_t *bytes) {
    (void)ctx;
    *ms = 0;
    *bytes = 0;
    if (r->rank != 0) return TRILL_OK; /* the controller ships the weights */
    const double t0 = trill_now();
    trill_status st = trill_rl_send_weights(r, true, bytes);
    *ms = (trill_now() - t0) * 1e3;
    return st;
}

void trill_rl_remote_transfer_metrics(const rl_run *r, trill_rl_metrics *m) {
    const rl_remote *x = r->remote;
    if (!x || r->rank != 0) return;
    m->n_receivers = x->n_receivers;
    m->transfer_bytes = x->transfer_bytes;
    m->transfer_checksum = x->checksum;
    for (int j = 0; j < x->n_receivers; j++) {
        m->receivers[j].rank = x->recv_rank[j];
        m->receivers[j].receive_ms = x->receive_ms[j];
        m->receivers[j].apply_ms = x->apply_ms[j];
        m->receivers[j].bytes = x->recv_bytes[j];
    }
}

typedef struct eval_ctx { trill_eval_result *out; } eval_ctx;

static trill_status take_eval(void *ctx, int j, const rl_reply *rep, char *payload) {
    (void)j;
    eval_ctx *e = ctx;
    trill_status st = rep->bytes == sizeof *e->out ? TRILL_OK
                                                   : trill_error(TRILL_ERR_IO, "an evaluation of %llu bytes", (unsigned long long)rep->bytes);
    if (!st) memcpy(e->out, payload, sizeof *e->out);
    free(payload);
    return st;
}

trill_status trill_rl_remote_evaluate(rl_run *r, trill_eval_result *out) {
    rl_remote *x = r->remote;
    rl_cmd cmd = { .op = CMD_EVAL };
    trill_status st = send_cmd(x, &cmd);
    eval_ctx e = { out };
    if (!st) st = trill_rl_gather_replies(x, 0, 1, REPLY_EVAL, take_eval, &e); /* replica 0 evaluates */
    return st;
}

trill_status trill_rl_remote_score(rl_run *r, rl_rollout *ro) {
    rl_remote *x = r->remote;
    const double t0 = trill_now();
    void *buf = NULL;
    size_t len = 0;
    trill_status st = trill_rl_batch_pack(&ro->b, &buf, &len);
    rl_cmd cmd = { .op = CMD_SCORE, .bytes = len };
    if (!st) st = trill_comm_send(r->job, &cmd, sizeof cmd, x->scorer_rank, TAG_SCORE);
    if (!st) st = trill_comm_send(r->job, buf, len, x->scorer_rank, TAG_SCORE);
    free(buf);
    char who[48];
    snprintf(who, sizeof who, "the scorer (rank %d)", x->scorer_rank);
    rl_reply rep;
    char *payload = NULL;
    if (!st) st = trill_rl_recv_reply(r->job, x->scorer_rank, TAG_SCORE_REPLY, who, &rep, &payload);
    const size_t n = (size_t)ro->b.n_seqs, scores = 2 * n * sizeof(double);
    if (!st && rep.bytes < scores) st = trill_error(TRILL_ERR_IO, "%s: %llu bytes of rewards for %zu sequences", who, (unsigned long long)rep.bytes, n);
    if (!st) {
        memcpy(ro->b.reward, payload, n * sizeof(double));
        memcpy(ro->b.correct, payload + n * sizeof(double), n * sizeof(double));
        json_error_t jerr;
        if (!(ro->ext_metrics = json_loadb(payload + scores, rep.bytes - scores, 0, &jerr)))
            st = trill_error(TRILL_ERR_IO, "%s: its external metrics: %s", who, jerr.text);
    }
    free(payload);
    ro->reward_s = trill_now() - t0;
    return st;
}

void trill_rl_remote_stop(rl_run *r) {
    rl_remote *x = r->remote;
    if (!x || r->rank != 0 || x->stopped) return;
    x->stopped = true;
    rl_cmd cmd = { .op = CMD_STOP };
    if (x->replicas) send_cmd(x, &cmd);
    if (x->scorer_rank >= 0) trill_comm_send(r->job, &cmd, sizeof cmd, x->scorer_rank, TAG_SCORE);
}

/* ---- the step's batch to every trainer rank ---- */

typedef struct share_header {
    int32_t status, pad;
    uint64_t batch_bytes, ext_bytes;
    double gen_s, reward_s;
    int64_t gen_tokens, index;
} share_header;

trill_status trill_rl_share_batch(rl_run *r, rl_rollout *ro, trill_status st) {
    if (!r->world || trill_comm_size(r->world) == 1) return st;
    share_header h = { 0 };
    void *batch = NULL;
    char *ext = NULL;
    size_t len = 0;
    if (r->rank == 0) {
        if (!st) st = trill_rl_batch_pack(&ro->b, &batch, &len);
        if (!st && !(ext = json_dumps(ro->ext_metrics, JSON_COMPACT))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (st) {
            free(batch);
            batch = trill_strdup(trill_error_message()); /* the others fail with rank 0's message */
            len = batch ? strlen(batch) + 1 : 0;
        }
        h = (share_header){ .status = st, .batch_bytes = len, .ext_bytes = ext ? strlen(ext) + 1 : 0, .gen_s = ro->gen_s,
                            .reward_s = ro->reward_s, .gen_tokens = ro->gen_tokens, .index = ro->index };
    }
    trill_status cst = trill_comm_bcast(r->world, &h, sizeof h, 0);
    if (!cst && r->rank != 0) {
        batch = trill_malloc(h.batch_bytes + 1);
        ext = trill_malloc(h.ext_bytes + 1);
        if (!batch || !ext) cst = trill_error(TRILL_ERR_NOMEM, "out of memory for the step's batch");
    }
    if (!cst && h.batch_bytes) cst = trill_comm_bcast(r->world, batch, h.batch_bytes, 0);
    if (!cst && h.ext_bytes) cst = trill_comm_bcast(r->world, ext, h.ext_bytes, 0);
    if (r->rank != 0 && !cst) {
        memset(ro, 0, sizeof *ro);
        ro->index = h.index;
        ro->gen_s = h.gen_s;
        ro->reward_s = h.reward_s;
        ro->gen_tokens = h.gen_tokens;
        if (h.status) cst = trill_error((trill_status)h.status, "the controller (rank 0): %.*s", (int)h.batch_bytes, (char *)batch);
        else cst = trill_rl_batch_unpack(batch, h.batch_bytes, &ro->b);
        if (!cst && !(ro->ext_metrics = h.ext_bytes ? json_loadb(ext, h.ext_bytes - 1, 0, NULL) : json_object()))
            cst = trill_error(TRILL_ERR_IO, "the step's external metrics from rank 0 do not parse");
    }
    free(batch);
    free(ext);
    return st ? st : cst;
}

/* ---- the scorer's rank ---- */

static trill_status score_batch(rl_run *r, uint64_t bytes, rl_reply *rep, char **out) {
    char *buf = trill_malloc(bytes + 1);
    trill_status st = buf ? trill_comm_recv(r->job, buf, bytes, 0, TAG_SCORE) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    rl_batch b = { 0 };
    json_t *ext = NULL;
    char *text = NULL;
    if (!st) st = trill_rl_batch_unpack(buf, bytes, &b);
    free(buf);
    if (!st && !(ext = json_object())) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_rl_scorer_score(r->scorer, &b, ext);
    if (!st && !(text = json_dumps(ext, JSON_COMPACT))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    const size_t n = (size_t)b.n_seqs, scores = 2 * n * sizeof(double);
    if (!st && !(*out = trill_malloc(scores + strlen(text) + 1))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        memcpy(*out, b.reward, n * sizeof(double));
        memcpy(*out + n * sizeof(double), b.correct, n * sizeof(double));
        memcpy(*out + scores, text, strlen(text));
        rep->bytes = scores + strlen(text);
    }
    free(text);
    json_decref(ext);
    trill_rl_batch_free(&b);
    return st;
}

static trill_status serve_scorer(rl_run *r) {
    for (;;) {
        rl_cmd cmd;
        trill_status st = trill_comm_recv(r->job, &cmd, sizeof cmd, 0, TAG_SCORE);
        if (st || cmd.op == CMD_STOP) return st;
        if (cmd.op != CMD_SCORE) return trill_error(TRILL_ERR_IO, "the scorer: unknown command %d from the controller", cmd.op);
        rl_reply rep = { 0 };
        char *payload = NULL;
        st = score_batch(r, cmd.bytes, &rep, &payload);
        rep.kind = REPLY_SCORES;
        trill_status sent = send_reply(r->job, 0, TAG_SCORE_REPLY, st, rep, payload);
        free(payload);
        if (sent) return sent;
    }
}

trill_status trill_rl_serve_executor(rl_run *r) {
    return r->remote->role == RL_ROLE_GENERATOR ? trill_rl_serve_replica(r) : serve_scorer(r);
}

trill_status trill_rl_make_executor(rl_run *r) {
    rl_remote *x = r->remote;
    if (x->role == RL_ROLE_SCORER) return trill_rl_scorer_create(r->c, r->train, &r->scorer);
    trill_status st = trill_model_load_as(r->model_dir, TRILL_STORE_CHECKPOINT, &x->model);
    if (!st) st = trill_rl_generator_create(r->c, x->model, r->tok, r->train, &r->gen);
    if (!st) trill_rl_generator_set_chat(r->gen, r->env_chat);
    if (!st && x->experts) st = trill_rl_generator_set_expert_comm(r->gen, x->experts);
    return st;
}
