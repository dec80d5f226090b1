/* A generator replica on a rank of its own (ranks.h): one loop for sync and asynchronous runs.
 *
 * The next command is always posted (a non-blocking broadcast from the controller). Idle, the
 * replica waits for it; generating, it tests it before every engine step, so commands are taken
 * while a batch runs: `generate` queues a batch (its prompts' replica table follows at once),
 * `weights` starts receiving a version into the staging buffers by a non-blocking broadcast that
 * is tested between decode steps too, and once complete is checked (XXH64) and handed to the
 * engine, which takes it at its next step (tokens keep the version they were sampled at);
 * `drain` (the end of an asynchronous run) drops the queued batches. Before a batch starts, the
 * weights announced before it are complete, so a batch issued after version v is generated with
 * v at least. Answers go out by non-blocking sends, tested the same way, so a replica never
 * blocks while the controller waits on it. A failure that is not the transport's is the next
 * answer's status; a transport failure ends the loop (and the rank, which ends the job). */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "rl/transport/ranks.h"
#include "trill/channel.h"
#include "trill/timing.h"

typedef struct work { int64_t index; int n; int *groups; } work;
typedef struct outgoing { trill_comm_request *head, *body; void *buf; rl_reply *rep; } outgoing;

typedef struct replica {
    rl_run *r;
    rl_remote *x;
    rl_cmd cmd;                   /* the next command, being received */
    trill_comm_request *cmd_req;
    /* a weight version in flight */
    rl_cmd w;
    trill_comm_request *w_req;
    bool w_pending;
    float *w_dst, *w_scratch;
    trill_status w_bad;
    char w_why[512];
    double w_t0;
    /* the newest weights applied */
    uint32_t version;
    double receive_ms, apply_ms;
    size_t applied;
    trill_status err;             /* a failure for the next answer */
    char err_msg[1024];
    work *queue;
    int q_head, q_n, q_cap;
    outgoing *out;
    int n_out, out_cap;
    bool drain, stop;
    trill_status fatal;           /* the transport failed between two engine steps */
    double busy_s;
} replica;

static void note_error(replica *rp, trill_status st) {
    if (!st || rp->err) return;
    rp->err = st;
    snprintf(rp->err_msg, sizeof rp->err_msg, "%s", trill_error_message());
}

/* ---- answers ---- */

static trill_status reap_sends(replica *rp, bool wait) {
    trill_status st = TRILL_OK;
    for (int i = 0; i < rp->n_out;) {
        outgoing *o = &rp->out[i];
        int done = 1;
        if (wait) {
            st = trill_comm_wait(o->head);
            trill_status b = trill_comm_wait(o->body);
            if (!st) st = b;
            o->head = o->body = NULL;
        } else {
            if (o->head) st = trill_comm_test(o->head, &done);
            if (!st && done) o->head = NULL;
            if (!st && done && o->body) st = trill_comm_test(o->body, &done);
            if (!st && done) o->body = NULL;
        }
        if (st) return st;
        if (!done) { i++; continue; }
        free(o->buf);
        free(o->rep);
        rp->out[i] = rp->out[--rp->n_out];
    }
    return st;
}

/* An answer to the controller (payload taken over; with a failure its message is sent instead). */
static trill_status answer(replica *rp, int kind, trill_status st, rl_reply rep, void *payload) {
    if (rp->n_out == rp->out_cap) {
        const int cap = rp->out_cap ? 2 * rp->out_cap : 8;
        outgoing *o = trill_realloc(rp->out, sizeof *o * (size_t)cap);
        if (!o) { free(payload); return trill_error(TRILL_ERR_NOMEM, "out of memory for an answer"); }
        rp->out = o;
        rp->out_cap = cap;
    }
    if (st) {
        free(payload);
        payload = trill_strdup(trill_error_message());
        rep.bytes = payload ? strlen(payload) + 1 : 0;
    }
    rep.status = st;
    rep.kind = kind;
    rep.version = rp->version;
    rep.receive_ms = rp->receive_ms;
    rep.apply_ms = rp->apply_ms;
    rep.applied = rp->applied;
    rep.busy_s = rp->busy_s;
    outgoing *o = &rp->out[rp->n_out];
    *o = (outgoing){ .buf = payload, .rep = trill_malloc(sizeof rep) };
    if (!o->rep) { free(payload); return trill_error(TRILL_ERR_NOMEM, "out of memory for an answer"); }
    *o->rep = rep;
    trill_status sent = trill_comm_isend(rp->x->replicas_comm, o->rep, sizeof rep, 0, TAG_REPLY, &o->head);
    if (!sent && rep.bytes) sent = trill_comm_isend(rp->x->replicas_comm, payload, rep.bytes, 0, TAG_REPLY, &o->body);
    rp->n_out++;
    return sent;
}

/* ---- weights ---- */

/* Where version `bytes` lands: the LoRA vector or the fp32 model, made on first use. */
static trill_status staging(replica *rp, bool merge, uint64_t bytes, float **out) {
    rl_remote *x = rp->x;
    *out = NULL;
    trill_status st = TRILL_OK;
    size_t n = 0;
    if (merge) {
        if (!x->staging_model) st = trill_model_create(trill_model_config(x->model), &x->staging_model);
        if (!st) *out = x->staging_model->params, n = x->staging_model->n_f32;
    } else {
        if (!x->staging_lora) st = trill_lora_create(x->model, rp->r->c->trainer.lora, 0, &x->staging_lora);
        if (!st) *out = trill_lora_params(x->staging_lora, &n);
    }
    if (!st && n * sizeof(float) != bytes)
        st = trill_error(TRILL_ERR_INVALID, "%s of %llu bytes, this replica's %s hold %zu", merge ? "merged weights" : "adapters",
                         (unsigned long long)bytes, merge ? "model's weights" : "adapters", n * sizeof(float));
    return st;
}

/* Test hook: TRILL_TEST_CORRUPT_TRANSFER=V flips a byte of version V's weights on arrival. */
static void corrupt_for_test(uint32_t version, float *data, uint64_t bytes) {
    const char *v = getenv("TRILL_TEST_CORRUPT_TRANSFER");
    if (v && bytes && strtoul(v, NULL, 10) == version) ((unsigned char *)data)[bytes / 2] ^= 0x40;
}

/* The version in flight, if it has arrived (wait: once it has): checked and handed to the engine. */
static trill_status weights_finish(replica *rp, bool wait) {
    if (!rp->w_pending) return TRILL_OK;
    int done = 1;
    trill_status st = wait ? trill_comm_wait(rp->w_req) : trill_comm_test(rp->w_req, &done);
    if (!st && !done) return TRILL_OK;
    rp->w_pending = false;
    rp->w_req = NULL;
    if (st) return st; /* the transport: fatal */
    const rl_cmd *w = &rp->w;
    rp->receive_ms = (trill_now() - rp->w_t0) * 1e3;
    trill_status bad = rp->w_bad ? trill_error(rp->w_bad, "%s", rp->w_why) : TRILL_OK;
    free(rp->w_scratch);
    rp->w_scratch = NULL;
    if (!bad) {
        corrupt_for_test(w->version, rp->w_dst, w->bytes);
        const uint64_t got = trill_channel_checksum(rp->w_dst, w->bytes / sizeof(float));
        if (got != w->checksum)
            bad = trill_error(TRILL_ERR_IO, "weights version %u: received %llu bytes with XXH64 %016llx, the sender's is %016llx: "
                              "the transfer is corrupted and was refused", w->version, (unsigned long long)w->bytes,
                              (unsigned long long)got, (unsigned long long)w->checksum);
    }
    const double t1 = trill_now();
    size_t applied = 0;
    if (!bad) bad = w->merge ? trill_rl_generator_load_weights(rp->r->gen, rp->x->staging_model, w->version, &applied)
                             : trill_rl_generator_load_adapter(rp->r->gen, rp->x->staging_lora, w->version, &applied);
    if (!bad) {
        rp->apply_ms = (trill_now() - t1) * 1e3;
        rp->applied = applied;
        rp->version = w->version;
    }
    if (w->ack) return answer(rp, REPLY_ACK, bad, (rl_reply){ 0 }, NULL);
    note_error(rp, bad);
    return TRILL_OK;
}

/* The experts this rank keeps ([n_moe_layers][num_experts] bytes, malloc'ed), NULL when the
 * replica is not expert-parallel; *n their size. */
static uint8_t *holdings(replica *rp, size_t *n) {
    const trill_config *c = trill_model_config(rp->x->model);
    *n = (size_t)c->n_moe_layers * c->num_experts;
    uint8_t *held = rp->x->experts ? trill_malloc(*n + 1) : NULL;
    if (held && !trill_rl_generator_expert_holdings(rp->r->gen, held)) {
        free(held);
        held = NULL;
    }
    return held;
}

/* `weights` of merged weights to an expert-parallel rank: its own tensors, point to point (sync
 * mode: received at once), scattered into the staging model, checked, applied. */
static trill_status weights_partial(replica *rp, const rl_cmd *cmd) {
    uint64_t head[2];
    trill_status st = trill_comm_recv(rp->x->replicas_comm, head, sizeof head, 0, TAG_WEIGHTS);
    if (st) return st;
    const double t0 = trill_now();
    float *buf = trill_malloc(head[0] + 1);
    if (!buf) return trill_error(TRILL_ERR_NOMEM, "out of memory for the merged weights");
    if ((st = trill_comm_recv(rp->x->replicas_comm, buf, head[0], 0, TAG_WEIGHTS))) {
        free(buf);
        return st;
    }
    rp->receive_ms = (trill_now() - t0) * 1e3;
    float *unused;
    trill_status bad = staging(rp, true, trill_model_n_params(rp->x->model) * sizeof(float), &unused);
    corrupt_for_test(cmd->version, buf, head[0]);
    if (!bad && trill_channel_checksum(buf, head[0] / sizeof(float)) != head[1])
        bad = trill_error(TRILL_ERR_IO, "weights version %u: %llu bytes of this rank's tensors arrived with another XXH64 than the sender's: "
                          "the transfer is corrupted and was refused", cmd->version, (unsigned long long)head[0]);
    size_t n = 0, at = 0, nt;
    uint8_t *held = bad ? NULL : holdings(rp, &n);
    const trill_config *c = trill_model_config(rp->x->model);
    const trill_param *t = bad ? NULL : trill_model_tensors(rp->x->staging_model, &nt);
    for (size_t k = 0; t && k < nt; k++)
        if (trill_rl_tensor_wanted(c, &t[k], held)) {
            if ((at + t[k].numel) * sizeof(float) > head[0]) {
                bad = trill_error(TRILL_ERR_IO, "weights version %u: %llu bytes do not hold this rank's tensors", cmd->version,
                                  (unsigned long long)head[0]);
                break;
            }
            memcpy(t[k].data, buf + at, sizeof(float) * t[k].numel);
            at += t[k].numel;
        }
    free(held);
    free(buf);
    const double t1 = trill_now();
    size_t applied = 0;
    if (!bad) bad = trill_rl_generator_load_weights(rp->r->gen, rp->x->staging_model, cmd->version, &applied);
    if (!bad) {
        rp->apply_ms = (trill_now() - t1) * 1e3;
        rp->applied = applied;
        rp->version = cmd->version;
    }
    return answer(rp, REPLY_ACK, bad, (rl_reply){ 0 }, NULL);
}

/* `weights`: receive the version (every replica takes part in the broadcast, whatever else fails). */
static trill_status weights_begin(replica *rp, const rl_cmd *cmd) {
    trill_status st = weights_finish(rp, true); /* one version in flight at a time */
    if (st) return st;
    if (cmd->partial) return weights_partial(rp, cmd);
    rp->w = *cmd;
    rp->w_bad = staging(rp, cmd->merge, cmd->bytes, &rp->w_dst);
    if (rp->w_bad) {
        snprintf(rp->w_why, sizeof rp->w_why, "%s", trill_error_message());
        if (!(rp->w_dst = rp->w_scratch = trill_malloc(cmd->bytes + 1))) return trill_error(TRILL_ERR_NOMEM, "out of memory for the weights");
    }
    rp->w_t0 = trill_now();
    st = trill_comm_ibcast(rp->x->replicas_comm, rp->w_dst, cmd->bytes, 0, &rp->w_req);
    rp->w_pending = !st;
    if (!st && cmd->ack) st = weights_finish(rp, true);
    return st;
}

/* ---- commands ---- */

static trill_status post_cmd(replica *rp) { return trill_comm_ibcast(rp->x->replicas_comm, &rp->cmd, sizeof rp->cmd, 0, &rp->cmd_req); }

static trill_status enqueue(replica *rp, const rl_cmd *cmd) {
    const int P = rp->r->c->generator.prompts_per_step;
    int32_t *owner = trill_malloc(sizeof(int32_t) * (size_t)P);
    trill_status st = owner ? trill_rl_bcast_replicas(rp->x, owner, sizeof(int32_t) * (size_t)P) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && rp->q_n == rp->q_cap) {
        const int cap = rp->q_cap ? 2 * rp->q_cap : 8;
        work *q = trill_malloc(sizeof *q * (size_t)cap);
        if (!q) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (int i = 0; !st && i < rp->q_n; i++) q[i] = rp->queue[(rp->q_head + i) % rp->q_cap];
        if (!st) {
            free(rp->queue);
            rp->queue = q;
            rp->q_head = 0;
            rp->q_cap = cap;
        }
    }
    work w = { .index = cmd->index };
    if (!st && !(w.groups = trill_malloc(sizeof(int) * (size_t)P))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int p = 0; !st && p < P; p++)
        if (owner[p] == rp->x->replica) w.groups[w.n++] = p;
    if (!st) rp->queue[(rp->q_head + rp->q_n++) % rp->q_cap] = w;
    free(owner);
    return st;
}

static void drop_queue(replica *rp) {
    for (; rp->q_n; rp->q_n--, rp->q_head = (rp->q_head + 1) % rp->q_cap) free(rp->queue[rp->q_head].groups);
}

/* The command just received. `busy`: a batch is being generated (evaluation cannot run now). */
static trill_status handle_cmd(replica *rp, bool busy) {
    const rl_cmd cmd = rp->cmd;
    rp->cmd_req = NULL;
    trill_status st = TRILL_OK;
    switch (cmd.op) {
    case CMD_GENERATE: st = enqueue(rp, &cmd); break;
    case CMD_WEIGHTS: st = weights_begin(rp, &cmd); break;
    case CMD_DRAIN: rp->drain = true; break;
    case CMD_STOP: rp->stop = true; return TRILL_OK;
    case CMD_EVAL:
        if (busy) return trill_error(TRILL_ERR_IO, "generator replica %d: an evaluation asked for while generating", rp->x->replica);
        if (rp->x->replica < rp->x->ep) { /* replica 0: every rank of it when expert-parallel (the exchange is collective) */
            trill_eval_result *res = trill_malloc(sizeof *res);
            trill_status ev = res ? trill_rl_generator_evaluate(rp->r->gen, rp->r->eval, res) : trill_error(TRILL_ERR_NOMEM, "out of memory");
            if (rp->x->replica == 0) st = answer(rp, REPLY_EVAL, ev, (rl_reply){ .bytes = sizeof *res }, res);
            else free(res);
        }
        break;
    default: return trill_error(TRILL_ERR_IO, "generator replica %d: unknown command %d from the controller", rp->x->replica, cmd.op);
    }
    return st ? st : post_cmd(rp);
}

/* Between two engine steps: the commands that arrived, the version in flight, the answers sent. */
static trill_status poll(void *ctx) {
    replica *rp = ctx;
    trill_status st = TRILL_OK;
    for (int done = 1; !st && !rp->stop && done;) {
        st = trill_comm_test(rp->cmd_req, &done);
        if (!st && done) st = handle_cmd(rp, true);
    }
    if (!st) st = weights_finish(rp, false);
    if (!st) st = reap_sends(rp, false);
    if (st) rp->fatal = st;
    return st;
}

/* The oldest queued batch: its prompts generated and sent. */
static trill_status run_batch(replica *rp) {
    work w = rp->queue[rp->q_head];
    rp->q_head = (rp->q_head + 1) % rp->q_cap;
    rp->q_n--;
    trill_status st = weights_finish(rp, true); /* the weights announced before the batch */
    const double t0 = trill_now();
    rl_batch b = { 0 };
    long tokens = 0;
    size_t len = 0;
    void *packed = NULL;
    trill_status gen = st ? st : trill_rl_generator_generate_part(rp->r->gen, w.index, w.groups, w.n, poll, rp, &b, &tokens);
    rp->busy_s += trill_now() - t0;
    free(w.groups);
    if (st || rp->fatal) return st ? st : rp->fatal;
    if (!gen) gen = trill_rl_batch_pack(&b, &packed, &len);
    trill_rl_batch_free(&b);
    if (!gen && rp->err) gen = trill_error(rp->err, "%s", rp->err_msg);
    size_t held_n = 0, held_bytes = 0;
    uint8_t *held = gen ? NULL : holdings(rp, &held_n);
    if (held) { /* what its next merged update must bring, after the batch */
        char *grown = trill_realloc(packed, len + held_n);
        if (grown) {
            memcpy(grown + len, held, held_n);
            packed = grown;
            len += held_n;
            held_bytes = held_n;
        } else {
            gen = trill_error(TRILL_ERR_NOMEM, "out of memory");
        }
        free(held);
    }
    return answer(rp, REPLY_BATCH, gen, (rl_reply){ .bytes = len, .index = w.index, .tokens = tokens, .held_bytes = held_bytes }, packed);
}

trill_status trill_rl_serve_replica(rl_run *r) {
    replica rp = { .r = r, .x = r->remote };
    trill_status st = post_cmd(&rp);
    while (!st && !rp.stop) {
        if (rp.drain) {
            drop_queue(&rp);
            rp.drain = false;
            st = weights_finish(&rp, true);
            if (!st) st = answer(&rp, REPLY_DRAINED, TRILL_OK, (rl_reply){ 0 }, NULL);
        } else if (rp.q_n) {
            st = run_batch(&rp);
        } else {
            st = weights_finish(&rp, true);
            if (!st) st = trill_comm_wait(rp.cmd_req);
            if (!st) st = handle_cmd(&rp, false);
        }
        if (!st) st = reap_sends(&rp, false);
    }
    if (!st) st = weights_finish(&rp, true);
    trill_status sent = reap_sends(&rp, true);
    drop_queue(&rp);
    free(rp.queue);
    free(rp.out);
    free(rp.w_scratch);
    return st ? st : sent;
}
