/* trill serve's HTTP side (docs/service.md): libmicrohttpd with a few polling threads (epoll)
 * serving every connection, so idle or slow clients cost a file descriptor each, not a thread; a
 * long-poll suspends its connection until its request finishes or its wait runs out; a request's
 * headers, then its body, must arrive within --request-timeout (a watchdog shuts the socket of
 * one that does not); connections are capped in all and per client address. Bodies bounded and
 * parsed with jansson, every request but the health check authenticated, every answer JSON. */
#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "service/http_routes.h"
#include "service/svc.h"
#include "trill/fileio.h"
#include "trill/log.h"
#include "trill/timing.h"
#include "text/chat_json.h"
#include "trill/chat.h"
#include "trill/tokenizer.h"

enum { MAX_PATH_PARTS = 6, HTTP_THREADS = 4, FDS_BESIDES_CONNECTIONS = 64 };

trill_serve_config trill_serve_config_default(void) {
    return (trill_serve_config){ .host = "127.0.0.1", .port = 8100, .max_body_bytes = 8u << 20, .max_trainers_per_key = 16,
                                 .max_samplers_per_key = 64, .max_queued = 256, .max_adapter_bytes = (size_t)4096 << 20,
                                 .max_connections = 1024, .max_client_connections = 256, .request_timeout = 30,
                                 .session_timeout = 120 };
}

/* A connection, for the request deadlines: what it waits for, since when. */
enum { WAIT_HEADERS, WAIT_BODY, ANSWERING, SHUT };
typedef struct conn_state {
    int fd, phase;
    double since;
    struct conn_state *prev, *next;
} conn_state;

/* The HTTP side: the svc, the connections (under mu) and the watchdog. */
typedef struct http_side {
    svc *s;
    pthread_mutex_t mu;
    conn_state *conns;
    pthread_t watchdog;
    bool stop;                   /* under mu: the watchdog ends */
    long shut;                   /* connections shut for missing their deadline */
} http_side;

enum MHD_Result trill_svc_answer_bytes(struct MHD_Connection *c, unsigned status, const char *type, void *bytes, size_t n) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, bytes, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(bytes); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

enum MHD_Result trill_svc_answer(struct MHD_Connection *c, unsigned status, char *text) {
    if (!text) text = trill_strdup("{\"error\": {\"code\": \"internal\", \"message\": \"out of memory\"}}"), status = 500;
    if (!text) return MHD_NO;
    return trill_svc_answer_bytes(c, status, "application/json", text, strlen(text));
}

enum MHD_Result trill_svc_answer_json(struct MHD_Connection *c, unsigned status, json_t *o) {
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return trill_svc_answer(c, status, t);
}

static unsigned code_status(const char *code) {
    if (strcmp(code, "not_found") == 0 || strcmp(code, "gone") == 0) return 404;
    if (strcmp(code, "unauthorized") == 0) return 401;
    if (strcmp(code, "too_large") == 0) return 413;
    if (strcmp(code, "limit") == 0) return 429;
    if (strcmp(code, "internal") == 0) return 500;
    return 400;
}

enum MHD_Result trill_svc_answer_error(struct MHD_Connection *c, const char *code, const char *message) {
    return trill_svc_answer_json(c, code_status(code), json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", message));
}

/* The last error: its code (trill_svc_fail's, else bad_request; running out of memory is internal). */
enum MHD_Result trill_svc_answer_status(struct MHD_Connection *c, trill_status st) {
    const char *code = trill_svc_take_code();
    if (!code) code = "bad_request";
    if (st == TRILL_ERR_NOMEM || st == TRILL_ERR_IO) code = "internal";
    return trill_svc_answer_error(c, code, trill_error_message());
}

/* ---- the calls that answer at once ---- */

static json_t *model_json(svc *s, int i) {
    const trill_config *c = trill_model_config(trill_svc_base_model(s->bases[i]));
    json_t *eos = json_array();
    for (int k = 0; k < c->n_eos; k++) json_array_append_new(eos, json_integer(c->eos_token_ids[k]));
    return json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:b, s:o}", "name", trill_svc_base_name(s->bases[i]), "architecture",
                     trill_config_model_type(c), "vocab_size", c->vocab_size, "n_moe_layers", c->n_moe_layers, "experts_per_token",
                     c->num_experts_per_tok, "num_experts", c->num_experts, "max_lora_rank", 256, "tokenizer",
                     trill_svc_base_tokenizer(s->bases[i]) != NULL, "eos_token_ids", eos);
}

/* One list of token ids as text (lenient: an id without a string is written "<id>"). */
static trill_status decode_list(const trill_tokenizer *tok, const json_t *a, json_t **text) {
    const size_t n = json_array_size(a);
    if (!json_is_array(a) || n > 1u << 20) return trill_svc_fail("bad_request", "tokens: expected an array of token ids (or of such arrays)");
    int *ids = trill_malloc(sizeof(int) * (n ? n : 1));
    if (!ids) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(a, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 1 << 30) {
            free(ids);
            return trill_svc_fail("bad_request", "tokens[%zu]: expected a non-negative token id", i);
        }
        ids[i] = (int)json_integer_value(e);
    }
    char *t = NULL;
    size_t len = 0;
    trill_status st = trill_tokenizer_decode_lenient(tok, ids, (int)n, &t, &len);
    free(ids);
    if (!st && !(*text = json_stringn(t, len))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(t);
    return st;
}

static json_t *tenant_json(svc *s, svc_tenant *t) {
    const trill_svc_trainer_config *c = trill_svc_trainer_get_config(t->trainer);
    return json_pack("{s:s, s:s, s:i, s:I, s:{s:i, s:b, s:b, s:b, s:I}}", "trainer_id", t->id, "base_model", trill_svc_base_name(s->bases[t->base]),
                     "rank", c->rank, "step", (json_int_t)t->step, "lora_config", "rank", c->rank, "train_mlp",
                     c->train_mlp, "train_attn", c->train_attn, "train_unembed", c->train_unembed, "seed", (json_int_t)c->seed);
}

static enum MHD_Result tokenize(struct MHD_Connection *c, svc *s, int base, const json_t *body, bool decode) {
    const trill_tokenizer *tok = trill_svc_base_tokenizer(s->bases[base]);
    if (!tok) return trill_svc_answer_error(c, "bad_request", "this model has no tokenizer.json");
    if (decode) { /* {"tokens": [ids]} -> {"text"}, or {"tokens": [[ids], ...]} -> {"texts": [...]} (batch_decode) */
        const json_t *a = json_object_get(body, "tokens");
        const bool batch = json_array_size(a) > 0 && json_is_array(json_array_get(a, 0));
        json_t *out = batch ? json_array() : NULL, *one = NULL;
        trill_status st = out || !batch ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (size_t i = 0; !st && batch && i < json_array_size(a); i++)
            if (!(st = decode_list(tok, json_array_get(a, i), &one))) json_array_append_new(out, one);
        if (!st && !batch) st = decode_list(tok, a, &out);
        if (st) { json_decref(out); return trill_svc_answer_status(c, st); }
        return trill_svc_answer_json(c, 200, json_pack("{s:o}", batch ? "texts" : "text", out));
    }
    const char *text = json_string_value(json_object_get(body, "text"));
    const json_t *special = json_object_get(body, "add_special_tokens");
    if (!text) return trill_svc_answer_error(c, "bad_request", "text: expected a string");
    int *ids = NULL;
    size_t n = 0;
    trill_status st = trill_tokenizer_encode(tok, text, json_string_length(json_object_get(body, "text")), json_is_true(special), &ids, &n);
    if (st) return trill_svc_answer_status(c, st);
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    free(ids);
    return trill_svc_answer_json(c, 200, json_pack("{s:o}", "tokens", a));
}

/* POST /models/{model}/apply_chat_template {messages, tools?, add_generation_prompt?,
 * enable_thinking?}: the text the model's chat template renders, and its tokens. */
static enum MHD_Result chat_template(struct MHD_Connection *c, svc *s, int base, const json_t *body) {
    const trill_tokenizer *tok = trill_svc_base_tokenizer(s->bases[base]);
    const char *why;
    const trill_chat_template *t = trill_svc_base_chat(s->bases[base], &why);
    char *text = NULL;
    trill_status st = t ? trill_chat_render_json(t, body, &text) : trill_svc_fail("bad_request", "%s", why);
    int *ids = NULL;
    size_t n = 0;
    if (!st) st = trill_tokenizer_encode(tok, text, strlen(text), false, &ids, &n);
    json_t *a = st ? NULL : json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    free(ids);
    enum MHD_Result r = st ? trill_svc_answer_status(c, st) : trill_svc_answer_json(c, 200, json_pack("{s:s, s:o}", "text", text, "tokens", a));
    free(text);
    return r;
}

static double wait_seconds(struct MHD_Connection *c) {
    const char *w = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "wait");
    char *end = NULL;
    double v = w ? strtod(w, &end) : 30;
    if (w && (end == w || *end)) v = 30;
    return v < 0 ? 0 : v > 60 ? 60 : v;
}

bool trill_svc_hold(svc *s, struct MHD_Connection *c, conn_ctx *cc, const char *id, double wait) {
    pthread_mutex_lock(&s->mu);
    const bool hold = !s->stopping && trill_svc_inflight(s, id);
    if (hold) {
        cc->waiting = true;
        cc->waiter = (svc_waiter){ .conn = c, .deadline = trill_now() + wait, .next = s->waiters };
        snprintf(cc->waiter.id, sizeof cc->waiter.id, "%s", id);
        s->waiters = &cc->waiter;
        MHD_suspend_connection(c); /* under s->mu: no wake-up can come before it */
    }
    pthread_mutex_unlock(&s->mu);
    return hold;
}

/* GET /futures/{id}?wait=S: the answer now, or once the request finishes or S seconds pass (its
 * connection suspended meanwhile: no thread waits). */
static enum MHD_Result future(struct MHD_Connection *c, svc *s, const char *key_id, const char *id, conn_ctx *cc) {
    int status = 0;
    bool pending = false;
    char *text = trill_svc_future_answer(s, id, key_id, &status, &pending);
    if (!text) return status == 404 ? trill_svc_answer_error(c, "not_found", "no such request") : trill_svc_answer_error(c, "internal", "out of memory");
    const double wait = wait_seconds(c);
    if (wait <= 0 || !pending) return trill_svc_answer(c, 200, text);
    free(text);
    if (trill_svc_hold(s, c, cc, id, wait)) return MHD_YES;
    text = trill_svc_future_answer(s, id, key_id, &status, &pending); /* it finished meanwhile */
    return text ? trill_svc_answer(c, 200, text) : trill_svc_answer_error(c, "internal", "out of memory");
}

/* ---- routing: the route table (http_routes.h) ---- */

static enum MHD_Result r_healthz(const route_call *q) { return trill_svc_answer_json(q->c, 200, json_pack("{s:s}", "status", "ok")); }

static enum MHD_Result r_models(const route_call *q) {
    json_t *a = json_array();
    for (int i = 0; i < q->s->n_bases; i++) json_array_append_new(a, model_json(q->s, i));
    return trill_svc_answer_json(q->c, 200, json_pack("{s:o}", "models", a));
}

/* ---- the official Tinker SDK's start-up (its client's first calls) ---- */

/* Each base model's name and context length. */
static enum MHD_Result r_capabilities(const route_call *q) {
    json_t *a = json_array();
    for (int i = 0; a && i < q->s->n_bases; i++) {
        const trill_config *c = trill_model_config(trill_svc_base_model(q->s->bases[i]));
        json_array_append_new(a, json_pack("{s:s, s:i}", "model_name", trill_svc_base_name(q->s->bases[i]), "max_context_length",
                                           c->max_position_embeddings));
    }
    return trill_svc_answer_json(q->c, 200, json_pack("{s:o}", "supported_models", a));
}

/* The client's feature flags: its default transport (httpx: trill needs no pyqwest), request
 * bodies not compressed, forward_backward chunks within a call's limits (1024 datums, 65536
 * tokens counting one more a datum: the SDK's size estimate is at least 12 bytes a token, its
 * id and int64 target), samples in flight within the server's queue and half the connections a
 * client may hold. Flags not named keep the SDK's defaults. */
static enum MHD_Result r_client_config(const route_call *q) {
    if (!json_is_string(json_object_get(q->body, "sdk_version"))) return trill_svc_answer_error(q->c, "bad_request", "sdk_version: expected a string");
    const int half = q->s->cfg.max_client_connections / 2; /* each sample in flight long-polls on a connection of its own */
    const int in_flight = q->s->cfg.max_queued < half ? q->s->cfg.max_queued : half > 1 ? half : 1;
    return trill_svc_answer_json(q->c, 200, json_pack("{s:b, s:s, s:b, s:b, s:i, s:i, s:i}", "pjwt_auth_enabled", 0, "credential_default_source",
                                                      "api_key", "use_pyqwest_transport", 0, "proto_compress_fwdbwd", 0, "fwdbwd_max_chunk_len", 1024,
                                                      "fwdbwd_max_chunk_bytes_count", (65536 - 1024) * 12, "sample_max_concurrent_requests",
                                                      in_flight));
}

static enum MHD_Result r_dynamic_config(const route_call *q) {
    if (!json_is_string(json_object_get(q->body, "sdk_version"))) return trill_svc_answer_error(q->c, "bad_request", "sdk_version: expected a string");
    return trill_svc_answer_json(q->c, 200, json_pack("{s:i}", "refresh_interval_sec", 300));
}

static enum MHD_Result r_create_session(const route_call *q) {
    char id[32];
    trill_status st = trill_svc_session_create(q->s, q->key_id, q->body, id);
    return st ? trill_svc_answer_status(q->c, st) : trill_svc_answer_json(q->c, 200, json_pack("{s:s, s:s}", "type", "create_session", "session_id", id));
}

static enum MHD_Result r_heartbeat(const route_call *q) {
    trill_status st = trill_svc_session_heartbeat(q->s, q->key_id, q->body);
    return st ? trill_svc_answer_status(q->c, st) : trill_svc_answer_json(q->c, 200, json_pack("{s:s}", "type", "session_heartbeat"));
}

/* The SDK's telemetry: accepted and not kept (trill logs its own figures). */
static enum MHD_Result r_telemetry(const route_call *q) {
    if (!json_is_array(json_object_get(q->body, "events"))) return trill_svc_answer_error(q->c, "bad_request", "events: expected an array");
    return trill_svc_answer_json(q->c, 200, json_pack("{s:s}", "status", "accepted"));
}

static enum MHD_Result r_tokenize(const route_call *q, bool decode) {
    const int base = trill_svc_find_base(q->s, q->p[1]);
    return base < 0 ? trill_svc_answer_error(q->c, "not_found", "no such model") : tokenize(q->c, q->s, base, q->body, decode);
}
static enum MHD_Result r_encode(const route_call *q) { return r_tokenize(q, false); }
static enum MHD_Result r_chat_template(const route_call *q) {
    const int base = trill_svc_find_base(q->s, q->p[1]);
    return base < 0 ? trill_svc_answer_error(q->c, "not_found", "no such model") : chat_template(q->c, q->s, base, q->body);
}
static enum MHD_Result r_decode(const route_call *q) { return r_tokenize(q, true); }

static enum MHD_Result r_future(const route_call *q) { return future(q->c, q->s, q->key_id, q->p[1], q->cc); }

static enum MHD_Result r_create_trainer(const route_call *q, bool from_state) {
    svc_tenant *t = NULL;
    trill_status st = trill_svc_tenant_create(q->s, q->key_id, q->body, from_state, &t);
    return st ? trill_svc_answer_status(q->c, st) : trill_svc_answer_json(q->c, 200, tenant_json(q->s, t));
}
static enum MHD_Result r_new_trainer(const route_call *q) { return r_create_trainer(q, false); }
static enum MHD_Result r_trainer_from_state(const route_call *q) { return r_create_trainer(q, true); }

static enum MHD_Result r_get_trainer(const route_call *q) {
    pthread_mutex_lock(&q->s->mu);
    svc_tenant *t = trill_svc_find_tenant(q->s, q->p[1], q->key_id);
    json_t *o = t ? tenant_json(q->s, t) : NULL;
    pthread_mutex_unlock(&q->s->mu);
    return t ? trill_svc_answer_json(q->c, 200, o) : trill_svc_answer_error(q->c, "not_found", "no such trainer");
}

static enum MHD_Result r_new_sampler(const route_call *q) {
    svc_sampler *sp = NULL;
    trill_status st = trill_svc_sampler_create(q->s, q->key_id, q->body, &sp);
    return st ? trill_svc_answer_status(q->c, st)
              : trill_svc_answer_json(q->c, 200, json_pack("{s:s, s:s}", "sampler_id", sp->id, "base_model", trill_svc_base_name(q->s->bases[sp->base])));
}

/* GET /samplers/{id}: {sampler_id, base_model, model_path?} (Tinker's GetSamplerResponse; the
 * path as tinker://). */
static enum MHD_Result r_get_sampler(const route_call *q) {
    char path[256] = "";
    pthread_mutex_lock(&q->s->mu);
    svc_sampler *sp = trill_svc_find_sampler(q->s, q->p[1], q->key_id);
    json_t *o = sp ? json_pack("{s:s, s:s}", "sampler_id", sp->id, "base_model", trill_svc_base_name(q->s->bases[sp->base])) : NULL;
    if (sp && sp->weights) snprintf(path, sizeof path, "%s", sp->weights->uri);
    pthread_mutex_unlock(&q->s->mu);
    if (!sp) return trill_svc_answer_error(q->c, "not_found", "no such sampler");
    if (path[0]) json_object_set_new(o, "model_path", trill_tinker_path(path));
    return trill_svc_answer_json(q->c, 200, o);
}

static enum MHD_Result r_delete(const route_call *q) {
    const bool trainer = strcmp(q->p[0], "trainers") == 0;
    trill_status st = trainer ? trill_svc_tenant_delete(q->s, q->p[1], q->key_id) : trill_svc_sampler_delete(q->s, q->p[1], q->key_id);
    return st ? trill_svc_answer_status(q->c, st) : trill_svc_answer_json(q->c, 200, json_pack("{s:s}", "deleted", q->p[1]));
}

trill_status trill_svc_submit(svc *s, const char *key_id, job_kind kind, bool trainer, const char *target, const json_t *body, char id[32],
                              bool make_sampler) {
    svc_job *j = trill_calloc(1, sizeof *j);
    if (!j) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    snprintf(j->key_id, sizeof j->key_id, "%s", key_id);
    j->make_sampler = make_sampler;
    pthread_mutex_lock(&s->mu);
    const svc_tenant *t = trainer ? trill_svc_find_tenant(s, target, key_id) : NULL;
    const svc_sampler *sp = trainer ? NULL : trill_svc_find_sampler(s, target, key_id);
    j->base = t ? t->base : sp ? sp->base : -1;
    pthread_mutex_unlock(&s->mu);
    if (j->base < 0) {
        free(j);
        return trill_svc_fail("not_found", trainer ? "no such trainer" : "no such sampler");
    }
    trill_status st = trill_svc_job_parse(s, kind, body, j); /* outside the lock; the target is found again to queue it */
    if (st) { trill_svc_job_free(j); return st; }
    trill_svc_new_id(j->id, sizeof j->id, "r-");
    memcpy(id, j->id, sizeof j->id); /* the job is the workers' once submitted */
    return trill_svc_job_submit(s, j, target, trainer);
}

/* ---- idempotency: a retried call (the same X-Idempotency-Key from the same key) is answered
 * with the first call's future, not run twice ---- */

static const char *idempotency_token(struct MHD_Connection *c) {
    const char *t = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Idempotency-Key");
    return t && *t && strlen(t) <= 200 ? t : NULL;
}

static void read_answer(void *ctx, sqlite3_stmt *row) {
    char **out = ctx;
    free(*out);
    *out = trill_strdup((const char *)sqlite3_column_text(row, 0));
}

/* The answer a call with this token had, or NULL. */
static char *idempotent_answer(svc *s, struct MHD_Connection *c, const char *key_id) {
    const char *token = idempotency_token(c);
    char *answer = NULL;
    svc_arg a[] = { SVC_S(key_id), SVC_S(token) };
    if (token && trill_svc_store_run(s->store, "reading an idempotency key", "SELECT answer FROM idempotency WHERE key_id = ?1 AND token = ?2",
                                     a, 2, read_answer, &answer, NULL)) {
        free(answer);
        return NULL;
    }
    return answer;
}

enum MHD_Result trill_svc_answer_future(const route_call *q, json_t *answer) {
    char *text = answer ? json_dumps(answer, JSON_COMPACT) : NULL;
    json_decref(answer);
    const char *token = q->r->future ? idempotency_token(q->c) : NULL;
    svc_arg a[] = { SVC_S(q->key_id), SVC_S(token), SVC_S(text), SVC_I(time(NULL)) };
    if (text && token && trill_svc_store_run(q->s->store, "recording an idempotency key", "INSERT OR IGNORE INTO idempotency(key_id, token, answer, created)"
                                             " VALUES(?1, ?2, ?3, ?4)", a, 4, NULL, NULL, NULL))
        trill_log(TRILL_LOG_WARN, "trill serve: %s", trill_error_message()); /* the call stands; only a retry of it would run again */
    return trill_svc_answer(q->c, 200, text);
}

/* A call that does work on a trainer or a sampler: parsed, queued, answered with its future. */
static enum MHD_Result r_submit(const route_call *q) {
    char id[32];
    trill_status st = trill_svc_submit(q->s, q->key_id, q->r->job, q->r->trainer, q->p[1], q->body, id, false);
    return st ? trill_svc_answer_status(q->c, st) : trill_svc_answer_future(q, json_pack("{s:s}", "request_id", id));
}

/* First match wins: a literal segment before a {name} one where both could match. */
static const route ROUTES[] = {
    { .method = "GET", .pattern = "/healthz", .fn = r_healthz, .public = true },
    { .method = "GET", .pattern = "/models", .fn = r_models },
    { .method = "POST", .pattern = "/models/{model...}/tokenize", .fn = r_encode },
    { .method = "POST", .pattern = "/models/{model...}/detokenize", .fn = r_decode },
    { .method = "POST", .pattern = "/models/{model...}/apply_chat_template", .fn = r_chat_template },
    { .method = "GET", .pattern = "/futures/{request_id}", .fn = r_future },
    { .method = "POST", .pattern = "/trainers", .fn = r_new_trainer },
    { .method = "POST", .pattern = "/trainers/from_state", .fn = r_trainer_from_state },
    { .method = "GET", .pattern = "/trainers/{trainer_id}", .fn = r_get_trainer },
    { .method = "DELETE", .pattern = "/trainers/{trainer_id}", .fn = r_delete },
    { .method = "POST", .pattern = "/trainers/{trainer_id}/forward", .fn = r_submit, .job = JOB_FORWARD, .trainer = true, .future = true },
    { .method = "POST", .pattern = "/trainers/{trainer_id}/forward_backward", .fn = r_submit, .job = JOB_FORWARD_BACKWARD, .trainer = true, .future = true },
    { .method = "POST", .pattern = "/trainers/{trainer_id}/optim_step", .fn = r_submit, .job = JOB_OPTIM_STEP, .trainer = true, .future = true },
    { .method = "POST", .pattern = "/trainers/{trainer_id}/save_state", .fn = r_submit, .job = JOB_SAVE_STATE, .trainer = true, .future = true },
    { .method = "POST", .pattern = "/trainers/{trainer_id}/save_weights_for_sampler", .fn = r_submit, .job = JOB_SAVE_SAMPLER, .trainer = true, .future = true },
    { .method = "POST", .pattern = "/trainers/{trainer_id}/load_state", .fn = r_submit, .job = JOB_LOAD_STATE, .trainer = true, .future = true },
    { .method = "POST", .pattern = "/samplers", .fn = r_new_sampler },
    { .method = "GET", .pattern = "/samplers/{sampler_id}", .fn = r_get_sampler },
    { .method = "DELETE", .pattern = "/samplers/{sampler_id}", .fn = r_delete },
    { .method = "POST", .pattern = "/samplers/{sampler_id}/sample", .fn = r_submit, .job = JOB_SAMPLE, .trainer = false, .future = true },
    { .method = "POST", .pattern = "/samplers/{sampler_id}/compute_logprobs", .fn = r_submit, .job = JOB_LOGPROBS, .trainer = false, .future = true },
    /* the official Tinker SDK's client start-up */
    { .method = "GET", .pattern = "/get_server_capabilities", .fn = r_capabilities },
    { .method = "POST", .pattern = "/client/config", .fn = r_client_config },
    { .method = "POST", .pattern = "/client/dynamic_config", .fn = r_dynamic_config },
    { .method = "POST", .pattern = "/create_session", .fn = r_create_session },
    { .method = "POST", .pattern = "/session_heartbeat", .fn = r_heartbeat },
    { .method = "POST", .pattern = "/telemetry", .fn = r_telemetry },
    /* the official Tinker protocol's models, training, weights, sampling and futures (tinker.c) */
    { .method = "POST", .pattern = "/create_model", .fn = trill_tinker_create_model, .future = true },
    { .method = "POST", .pattern = "/get_info", .fn = trill_tinker_get_info },
    { .method = "POST", .pattern = "/unload_model", .fn = trill_tinker_unload_model, .future = true },
    { .method = "POST", .pattern = "/forward_backward", .fn = trill_tinker_forward_backward, .raw = true, .future = true },
    { .method = "POST", .pattern = "/optim_step", .fn = trill_tinker_optim_step, .future = true },
    { .method = "POST", .pattern = "/save_weights", .fn = trill_tinker_save_weights, .future = true },
    { .method = "POST", .pattern = "/save_weights_for_sampler", .fn = trill_tinker_save_weights_for_sampler, .future = true },
    { .method = "POST", .pattern = "/load_weights", .fn = trill_tinker_load_weights, .future = true },
    { .method = "POST", .pattern = "/create_sampling_session", .fn = trill_tinker_create_sampling_session },
    { .method = "POST", .pattern = "/asample", .fn = trill_tinker_asample, .future = true },
    { .method = "POST", .pattern = "/retrieve_future", .fn = trill_tinker_retrieve_future },
    { .method = "POST", .pattern = "/weights_info", .fn = trill_tinker_weights_info },
    { .method = "GET", .pattern = "/training_runs", .fn = trill_tinker_training_runs },
    { .method = "GET", .pattern = "/training_runs/{run}", .fn = trill_tinker_training_run },
    { .method = "GET", .pattern = "/training_runs/{run}/checkpoints", .fn = trill_tinker_run_checkpoints },
    { .method = "DELETE", .pattern = "/training_runs/{run}/checkpoints/{kind}/{name}", .fn = trill_tinker_delete_checkpoint },
    { .method = "GET", .pattern = "/checkpoints", .fn = trill_tinker_user_checkpoints },
    { .method = "GET", .pattern = "/sessions", .fn = trill_tinker_sessions },
    { .method = "GET", .pattern = "/sessions/{session}", .fn = trill_tinker_session },
};
enum { N_ROUTES = sizeof ROUTES / sizeof ROUTES[0] };

bool trill_serve_route(int i, const char **method, const char **path, bool *authenticated) {
    if (i < 0 || i >= N_ROUTES) return false;
    *method = ROUTES[i].method, *path = ROUTES[i].pattern, *authenticated = !ROUTES[i].public;
    return true;
}

/* Whether route pattern `pat` matches the path's n parts; a "{name...}" segment takes as many
 * parts as the others leave it (a Hugging Face id's slash), *span of them from part *at. */
static bool matches(const char *pat, char **p, int n, int *at, int *span) {
    int segs = 0, k = 0;
    for (const char *c = pat; *c; c++) segs += *c == '/';
    *at = -1, *span = 1;
    while (*pat == '/') {
        const char *seg = pat + 1, *end = strchr(seg, '/');
        const size_t len = end ? (size_t)(end - seg) : strlen(seg);
        const bool greedy = len > 5 && strncmp(seg + len - 4, "...}", 4) == 0;
        const int take = greedy ? (n - k) - (segs - 1) : 1; /* the parts the segments after it do not need */
        if (take < 1 || k + take > n || (seg[0] != '{' && (strlen(p[k]) != len || strncmp(seg, p[k], len) != 0))) return false;
        if (greedy) *at = k, *span = take;
        k += take, pat = seg + len, segs--;
    }
    return k == n;
}

/* The route of METHOD and the path's n parts, or NULL; a "{name...}" segment's parts are joined
 * back into one (the slashes put back), so each of the route's segments is one of p. */
static const route *match(const char *method, char **p, int n) {
    for (int i = 0; i < N_ROUTES; i++) {
        int at, span;
        if (strcmp(ROUTES[i].method, method) != 0 || !matches(ROUTES[i].pattern, p, n, &at, &span)) continue;
        for (int k = at; at >= 0 && k < at + span - 1; k++) p[k][strlen(p[k])] = '/'; /* the parts are one buffer split at its '/'s */
        for (int k = at + 1; at >= 0 && k + span - 1 < n; k++) p[k] = p[k + span - 1];
        return &ROUTES[i];
    }
    return NULL;
}

/* The caller's key id from "X-API-Key: KEY" (the official Tinker SDK's header) or "Authorization:
 * Bearer KEY"; false when neither names a valid key. */
static bool authenticate(struct MHD_Connection *c, svc *s, char key_id[32]) {
    const char *x = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-API-Key");
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *key = x ? x : h && strncmp(h, "Bearer ", 7) == 0 ? h + 7 : NULL;
    return key && strlen(key) <= 128 && trill_svc_store_authenticate(s->store, key, key_id);
}

static enum MHD_Result dispatch(struct MHD_Connection *c, svc *s, const char *url, const char *method, conn_ctx *cc) {
    char path[520], *parts[MAX_PATH_PARTS];
    int n = 0;
    bool known = strncmp(url, "/api/v1/", 8) == 0 && strlen(url) <= 512;
    snprintf(path, sizeof path, "%s", known ? url + 8 : "");
    for (char *save = NULL, *tok = strtok_r(path, "/", &save); known && tok; tok = strtok_r(NULL, "/", &save)) {
        if (n == MAX_PATH_PARTS) known = false;
        else parts[n++] = tok;
    }
    const route *r = known ? match(method, parts, n) : NULL;
    if (r && r->public) return r->fn(&(route_call){ .c = c, .s = s, .key_id = "", .p = parts, .cc = cc, .r = r });
    char key_id[32]; /* every other request, a route or not, needs a valid key first: paths reveal nothing */
    if (!authenticate(c, s, key_id))
        return trill_svc_answer_error(c, "unauthorized", "a valid API key is needed: X-API-Key: KEY or Authorization: Bearer KEY (trill serve keys add)");
    if (cc->too_large) {
        char msg[160];
        snprintf(msg, sizeof msg, "the body is larger than the server's limit of %zu bytes (--max-body-mb)", s->cfg.max_body_bytes);
        return trill_svc_answer_error(c, "too_large", msg);
    }
    if (!r) return trill_svc_answer_error(c, "not_found", "no such endpoint (docs/service.md lists them; trill serve --print-routes)");
    char *again = r->future ? idempotent_answer(s, c, key_id) : NULL;
    if (again) return trill_svc_answer(c, 200, again);
    json_t *body = NULL;
    if (strcmp(method, "POST") == 0 && !r->raw) {
        json_error_t err;
        body = json_loadb(cc->body ? cc->body : "", cc->len, JSON_REJECT_DUPLICATES, &err);
        if (!json_is_object(body)) {
            char msg[300];
            snprintf(msg, sizeof msg, "the body is not a JSON object%s%s (line %d, column %d)", body ? "" : ": ", body ? "" : err.text, err.line, err.column);
            json_decref(body);
            return trill_svc_answer_error(c, "bad_request", msg);
        }
    }
    enum MHD_Result res = r->fn(&(route_call){ .c = c, .s = s, .key_id = key_id, .p = parts, .body = body, .cc = cc, .r = r });
    json_decref(body);
    return res;
}

/* The connection's deadline record: what it waits for now, since now. */
static void set_phase(http_side *h, struct MHD_Connection *c, int phase) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_state *cs = ci ? ci->socket_context : NULL;
    if (!cs) return;
    pthread_mutex_lock(&h->mu);
    if (cs->phase != SHUT) cs->phase = phase, cs->since = trill_now();
    pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    http_side *h = cls;
    svc *s = h->s;
    (void)version;
    conn_ctx *cc = *con_cls;
    if (!cc) { /* the headers: nothing to answer yet; the body has its own deadline from now */
        if (!(cc = trill_calloc(1, sizeof *cc))) return MHD_NO;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) cc->too_large = true;
        *con_cls = cc;
        set_phase(h, c, WAIT_BODY);
        return MHD_YES;
    }
    if (*upload_size) { /* a piece of the body */
        if (!cc->too_large && cc->len + *upload_size > s->cfg.max_body_bytes) cc->too_large = true;
        if (!cc->too_large) {
            if (cc->len + *upload_size + 1 > cc->cap) {
                size_t cap = (cc->len + *upload_size + 1) * 2;
                char *b = trill_realloc(cc->body, cap);
                if (!b) return MHD_NO;
                cc->body = b, cc->cap = cap;
            }
            memcpy(cc->body + cc->len, upload, *upload_size);
            cc->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    set_phase(h, c, ANSWERING);
    if (cc->waiting) { /* a long-poll resumed: its request finished, its wait ran out, or the server stops */
        cc->waiting = false;
        char key_id[32];
        int status = 0;
        bool pending = false;
        if (!authenticate(c, s, key_id)) return trill_svc_answer_error(c, "unauthorized", "the API key is no longer valid");
        if (cc->tinker) return trill_tinker_future_answer(c, s, key_id, cc->waiter.id, cc->proto);
        const char *id = strrchr(url, '/');
        char *text = id ? trill_svc_future_answer(s, id + 1, key_id, &status, &pending) : NULL;
        return text ? trill_svc_answer(c, 200, text) : trill_svc_answer_error(c, status == 404 ? "not_found" : "internal", "no such request");
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "POST") != 0 && strcmp(method, "DELETE") != 0)
        return trill_svc_answer_error(c, "bad_request", "only GET, POST and DELETE are served");
    return dispatch(c, s, url, method, cc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode code) {
    (void)code;
    conn_ctx *cc = *con_cls;
    if (cc) free(cc->body);
    free(cc);
    *con_cls = NULL;
    set_phase(cls, c, WAIT_HEADERS); /* a kept-alive connection: the next request's headers are due */
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    http_side *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_state *cs = ci ? trill_calloc(1, sizeof *cs) : NULL;
        if (!cs) return; /* no deadline for it: its inactivity timeout still ends it */
        cs->fd = ci->connect_fd, cs->phase = WAIT_HEADERS, cs->since = trill_now();
        pthread_mutex_lock(&h->mu);
        cs->next = h->conns;
        if (h->conns) h->conns->prev = cs;
        h->conns = cs;
        pthread_mutex_unlock(&h->mu);
        *socket_context = cs;
        return;
    }
    conn_state *cs = *socket_context; /* closed: libmicrohttpd closes the socket after this, so no later shutdown reaches another's */
    if (!cs) return;
    pthread_mutex_lock(&h->mu);
    if (cs->prev) cs->prev->next = cs->next;
    else h->conns = cs->next;
    if (cs->next) cs->next->prev = cs->prev;
    pthread_mutex_unlock(&h->mu);
    free(cs);
    *socket_context = NULL;
}

/* Under s->mu: waiter *at leaves the list and its connection is resumed — in that order, since a
 * resumed connection may be answered and its waiter freed at once by a polling thread. */
static void resume(svc_waiter **at) {
    svc_waiter *w = *at;
    *at = w->next;
    MHD_resume_connection(w->conn);
}

void trill_svc_wake_waiters(svc *s, const char *id) {
    for (svc_waiter **w = &s->waiters; *w;) {
        if (id && strcmp((*w)->id, id) != 0) w = &(*w)->next;
        else resume(w);
    }
}

/* Every 100 ms: sockets past their request's deadline shut (libmicrohttpd then closes them),
 * long-polls whose wait ran out answered; every 2 s, revoked keys' objects released, ended
 * sessions' objects and expired checkpoints deleted. */
static void *watchdog_main(void *arg) {
    http_side *h = arg;
    svc *s = h->s;
    double revoked_at = trill_now();
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        pthread_mutex_unlock(&h->mu);
        struct timespec nap = { 0, 100 * 1000 * 1000 };
        nanosleep(&nap, NULL);
        const double now = trill_now();
        pthread_mutex_lock(&s->mu);
        for (svc_waiter **w = &s->waiters; *w;) {
            if ((*w)->deadline > now) w = &(*w)->next;
            else resume(w);
        }
        pthread_mutex_unlock(&s->mu);
        if (now - revoked_at >= 2) trill_svc_release_revoked(s), trill_svc_sessions_reap(s), trill_svc_expire_states(s), revoked_at = now;
        pthread_mutex_lock(&h->mu);
        for (conn_state *cs = h->conns; cs; cs = cs->next)
            if ((cs->phase == WAIT_HEADERS || cs->phase == WAIT_BODY) && now - cs->since > s->cfg.request_timeout) {
                shutdown(cs->fd, SHUT_RDWR);
                cs->phase = SHUT;
                h->shut++;
            }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* ---- the server's life ---- */

static void svc_free(svc *s) {
    for (int i = 0; i < s->n_tenants; i++) {
        for (svc_job *j = s->tenants[i]->head, *next; j; j = next) next = j->next, trill_svc_job_free(j);
        trill_svc_trainer_free(s->tenants[i]->trainer);
        free(s->tenants[i]);
    }
    for (svc_job *j = s->sample_head, *next; j; j = next) next = j->next, trill_svc_job_free(j);
    for (int i = 0; i < s->n_samplers; i++) free(s->samplers[i]);
    for (int i = 0; i < s->n_weights; i++) trill_lora_free(s->weights[i]->lora), free(s->weights[i]);
    for (int i = 0; i < s->n_bases; i++) trill_engine_free(s->engines ? s->engines[i] : NULL), trill_svc_base_free(s->bases[i]);
    free(s->sessions);
    free(s->tenants), free(s->samplers), free(s->weights), free(s->bases), free(s->identities), free(s->engines), free(s->inflight);
    trill_svc_mark_free(s->mark);
    trill_svc_store_close(s->store);
    if (s->lock_fd >= 0) close(s->lock_fd); /* the state folder is free for another server */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
}

static trill_status load_bases(svc *s) {
    s->bases = trill_calloc((size_t)s->cfg.n_models, sizeof *s->bases);
    s->identities = trill_calloc((size_t)s->cfg.n_models, sizeof *s->identities);
    s->engines = trill_calloc((size_t)s->cfg.n_models, sizeof *s->engines);
    if (!s->bases || !s->identities || !s->engines) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->cfg.n_models; i++) {
        trill_status st = trill_svc_base_load(s->cfg.model_dirs[i], s->cfg.model_names ? s->cfg.model_names[i] : NULL, &s->bases[i]);
        s->n_bases += !st;
        for (int k = 0; !st && k < i; k++)
            if (strcmp(trill_svc_base_name(s->bases[k]), trill_svc_base_name(s->bases[i])) == 0)
                st = trill_error(TRILL_ERR_INVALID, "--models: %s and %s have the same name %s (name them: NAME=DIR)",
                                 s->cfg.model_dirs[k], s->cfg.model_dirs[i], trill_svc_base_name(s->bases[i]));
        if (!st) st = trill_rl_model_identity(trill_svc_base_dir(s->bases[i]), &s->identities[i]);
        trill_engine_config ec = trill_engine_config_default();
        ec.capture_experts = true;
        ec.tokenizer = st ? NULL : trill_svc_base_tokenizer(s->bases[i]);
        if (!st) st = trill_engine_create(trill_svc_base_model(s->bases[i]), &ec, &s->engines[i]);
        if (st) return st;
    }
    return TRILL_OK;
}

/* The connection limit the process's file descriptors allow (each connection holds one). */
static unsigned connection_limit(const svc *s) {
    struct rlimit rl;
    const rlim_t want = (rlim_t)s->cfg.max_connections + FDS_BESIDES_CONNECTIONS;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) return (unsigned)s->cfg.max_connections;
    const unsigned fit = rl.rlim_cur > 2 * FDS_BESIDES_CONNECTIONS ? (unsigned)(rl.rlim_cur - FDS_BESIDES_CONNECTIONS) : FDS_BESIDES_CONNECTIONS;
    trill_log(TRILL_LOG_WARN, "trill serve: --max-connections %d needs %llu file descriptors, the process may open %llu (ulimit -n): "
              "serving %u connections at most", s->cfg.max_connections, (unsigned long long)want, (unsigned long long)rl.rlim_cur, fit);
    return fit;
}

static struct MHD_Daemon *start_http(http_side *h, int *port) {
    svc *s = h->s;
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)s->cfg.port) };
    if (inet_pton(AF_INET, s->cfg.host, &addr.sin_addr) != 1) {
        trill_error(TRILL_ERR_INVALID, "--listen: \"%s\" is not an IPv4 address", s->cfg.host);
        return NULL;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME, (uint16_t)s->cfg.port, NULL, NULL, on_request, h,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HTTP_THREADS, MHD_OPTION_CONNECTION_LIMIT,
        connection_limit(s), MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg.max_client_connections, MHD_OPTION_CONNECTION_TIMEOUT, 120u,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
    if (!d) {
        trill_error(TRILL_ERR_IO, "--listen: cannot listen on %s:%d (in use, or not an address of this machine)", s->cfg.host, s->cfg.port);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? info->port : s->cfg.port;
    return d;
}

trill_status trill_serve(const trill_serve_config *c, volatile int *stop, double max_seconds) {
    svc s = { .cfg = *c, .lock_fd = -1 };
    http_side h = { .s = &s };
    pthread_mutex_init(&s.mu, NULL);
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&s.work, NULL);
    pthread_cond_init(&s.done, NULL);
    if (c->n_models < 1) return trill_error(TRILL_ERR_INVALID, "--models: at least one model folder is needed");
    if (!c->state_dir) return trill_error(TRILL_ERR_INVALID, "--state: a folder is needed");
    s.inflight = trill_calloc((size_t)c->max_queued + 1, sizeof *s.inflight);
    trill_status st = s.inflight ? trill_svc_state_open(&s) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_svc_store_open(c->state_dir, &s.store);
    if (!st) st = trill_svc_store_default_key(s.store, c->state_dir);
    if (!st) st = load_bases(&s);
    if (!st) st = trill_svc_recover(&s);
    if (!st) st = trill_svc_workers_start(&s);
    int port = 0;
    struct MHD_Daemon *d = st ? NULL : start_http(&h, &port);
    if (!st && !d) st = TRILL_ERR_IO;
    bool watching = false;
    if (!st) {
        if (pthread_create(&h.watchdog, NULL, watchdog_main, &h) != 0) st = trill_error(TRILL_ERR_NOMEM, "trill serve: cannot start the watchdog");
        else watching = true;
    }
    if (!st) {
        trill_log(TRILL_LOG_INFO, "trill serve: listening on http://%s:%d/api/v1 (%d models, state in %s)", c->host, port, s.n_bases, c->state_dir);
        char text[32];
        snprintf(text, sizeof text, "%d\n", port);
        if (c->port_file) st = trill_write_file_atomic(c->port_file, text, strlen(text));
    }
    const double t0 = trill_now();
    while (!st && !*stop && (max_seconds <= 0 || trill_now() - t0 < max_seconds)) usleep(50 * 1000);
    pthread_mutex_lock(&s.mu); /* long-polls answer at once, the workers stop after their job */
    s.stopping = true;
    trill_svc_wake_waiters(&s, NULL);
    pthread_cond_broadcast(&s.work);
    pthread_cond_broadcast(&s.done);
    pthread_mutex_unlock(&s.mu);
    if (watching) {
        pthread_mutex_lock(&h.mu);
        h.stop = true;
        pthread_mutex_unlock(&h.mu);
        pthread_join(h.watchdog, NULL);
    }
    if (d) MHD_stop_daemon(d);
    trill_svc_workers_stop(&s);
    svc_free(&s);
    pthread_mutex_destroy(&h.mu);
    if (!st && *stop) trill_log(TRILL_LOG_INFO, "trill serve: stopped");
    return st;
}
