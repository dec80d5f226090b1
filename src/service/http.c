/* trill serve's HTTP side (docs/service.md): libmicrohttpd (a thread per connection, so a
 * long-poll holds only its own), bodies bounded and parsed with jansson, every request but the
 * health check authenticated, every answer JSON. */
#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "service/svc.h"
#include "trill/fileio.h"
#include "trill/log.h"
#include "trill/timing.h"
#include "trill/tokenizer.h"

enum { MAX_CONNECTIONS = 64, MAX_PATH_PARTS = 6 };

trill_serve_config trill_serve_config_default(void) {
    return (trill_serve_config){ .host = "127.0.0.1", .port = 8100, .max_body_bytes = 8u << 20, .max_trainers_per_key = 16, .max_queued = 256,
                                 .max_adapter_bytes = (size_t)4096 << 20 };
}

/* A connection's request: its body as it arrives. */
typedef struct conn_ctx {
    char *body;
    size_t len, cap;
    bool too_large;
} conn_ctx;

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, char *text) {
    if (!text) text = trill_strdup("{\"error\": {\"code\": \"internal\", \"message\": \"out of memory\"}}"), status = 500;
    struct MHD_Response *r = MHD_create_response_from_buffer(text ? strlen(text) : 0, text, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(text); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result answer_json(struct MHD_Connection *c, unsigned status, json_t *o) {
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return answer(c, status, t);
}

static unsigned code_status(const char *code) {
    if (strcmp(code, "not_found") == 0) return 404;
    if (strcmp(code, "unauthorized") == 0) return 401;
    if (strcmp(code, "too_large") == 0) return 413;
    if (strcmp(code, "limit") == 0) return 429;
    if (strcmp(code, "internal") == 0) return 500;
    return 400;
}

static enum MHD_Result answer_error(struct MHD_Connection *c, const char *code, const char *message) {
    return answer_json(c, code_status(code), json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", message));
}

/* The last error: its code (svc_fail's, else bad_request; running out of memory is internal). */
static enum MHD_Result answer_status(struct MHD_Connection *c, trill_status st) {
    const char *code = svc_take_code();
    if (st == TRILL_ERR_NOMEM || st == TRILL_ERR_IO) code = "internal";
    return answer_error(c, code, trill_error_message());
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
    if (!json_is_array(a) || n > 1u << 20) return svc_fail("bad_request", "tokens: expected an array of token ids (or of such arrays)");
    int *ids = trill_malloc(sizeof(int) * (n ? n : 1));
    if (!ids) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(a, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 1 << 30) {
            free(ids);
            return svc_fail("bad_request", "tokens[%zu]: expected a non-negative token id", i);
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
                     "rank", c->rank, "step", (json_int_t)trill_svc_trainer_step(t->trainer), "lora_config", "rank", c->rank, "train_mlp",
                     c->train_mlp, "train_attn", c->train_attn, "train_unembed", c->train_unembed, "seed", (json_int_t)c->seed);
}

static enum MHD_Result tokenize(struct MHD_Connection *c, svc *s, int base, const json_t *body, bool decode) {
    const trill_tokenizer *tok = trill_svc_base_tokenizer(s->bases[base]);
    if (!tok) return answer_error(c, "bad_request", "this model has no tokenizer.json");
    if (decode) { /* {"tokens": [ids]} -> {"text"}, or {"tokens": [[ids], ...]} -> {"texts": [...]} (batch_decode) */
        const json_t *a = json_object_get(body, "tokens");
        const bool batch = json_array_size(a) > 0 && json_is_array(json_array_get(a, 0));
        json_t *out = batch ? json_array() : NULL, *one = NULL;
        trill_status st = out || !batch ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (size_t i = 0; !st && batch && i < json_array_size(a); i++)
            if (!(st = decode_list(tok, json_array_get(a, i), &one))) json_array_append_new(out, one);
        if (!st && !batch) st = decode_list(tok, a, &out);
        if (st) { json_decref(out); return answer_status(c, st); }
        return answer_json(c, 200, json_pack("{s:o}", batch ? "texts" : "text", out));
    }
    const char *text = json_string_value(json_object_get(body, "text"));
    const json_t *special = json_object_get(body, "add_special_tokens");
    if (!text) return answer_error(c, "bad_request", "text: expected a string");
    int *ids = NULL;
    size_t n = 0;
    trill_status st = trill_tokenizer_encode(tok, text, json_string_length(json_object_get(body, "text")), json_is_true(special), &ids, &n);
    if (st) return answer_status(c, st);
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    free(ids);
    return answer_json(c, 200, json_pack("{s:o}", "tokens", a));
}

/* ---- routing ---- */

static const struct { const char *name; job_kind kind; bool trainer; } JOB_ROUTES[] = {
    { "forward", JOB_FORWARD, true },         { "forward_backward", JOB_FORWARD_BACKWARD, true },
    { "optim_step", JOB_OPTIM_STEP, true },   { "save_state", JOB_SAVE_STATE, true },
    { "save_weights_for_sampler", JOB_SAVE_SAMPLER, true }, { "load_state", JOB_LOAD_STATE, true },
    { "sample", JOB_SAMPLE, false },          { "compute_logprobs", JOB_LOGPROBS, false },
};

static enum MHD_Result submit(struct MHD_Connection *c, svc *s, const char *key_id, const char *target, const char *call, const json_t *body) {
    for (size_t r = 0; r < sizeof JOB_ROUTES / sizeof JOB_ROUTES[0]; r++) {
        if (strcmp(JOB_ROUTES[r].name, call) != 0) continue;
        svc_job *j = trill_calloc(1, sizeof *j);
        if (!j) return answer_error(c, "internal", "out of memory");
        snprintf(j->key_id, sizeof j->key_id, "%s", key_id);
        pthread_mutex_lock(&s->mu);
        if (JOB_ROUTES[r].trainer) j->tenant = svc_find_tenant(s, target, key_id);
        else j->sampler = svc_find_sampler(s, target, key_id);
        pthread_mutex_unlock(&s->mu);
        if (!j->tenant && !j->sampler) {
            free(j);
            return answer_error(c, "not_found", JOB_ROUTES[r].trainer ? "no such trainer" : "no such sampler");
        }
        trill_status st = svc_job_parse(s, JOB_ROUTES[r].kind, body, j);
        if (st) { svc_job_free(j); return answer_status(c, st); }
        char id[32];
        svc_new_id(j->id, sizeof j->id, "r-");
        memcpy(id, j->id, sizeof id); /* the job is the workers' once submitted */
        st = svc_job_submit(s, j);
        return st ? answer_status(c, st) : answer_json(c, 200, json_pack("{s:s}", "request_id", id));
    }
    return answer_error(c, "not_found", "no such call");
}

static double wait_seconds(struct MHD_Connection *c) {
    const char *w = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "wait");
    char *end = NULL;
    double v = w ? strtod(w, &end) : 30;
    if (w && (end == w || *end)) v = 30;
    return v < 0 ? 0 : v > 60 ? 60 : v;
}

static enum MHD_Result route(struct MHD_Connection *c, svc *s, const char *key_id, const char *method, char **p, int n, const json_t *body) {
    const bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (get && n == 1 && strcmp(p[0], "models") == 0) {
        json_t *a = json_array();
        for (int i = 0; i < s->n_bases; i++) json_array_append_new(a, model_json(s, i));
        return answer_json(c, 200, json_pack("{s:o}", "models", a));
    }
    if (post && n == 3 && strcmp(p[0], "models") == 0 && (strcmp(p[2], "tokenize") == 0 || strcmp(p[2], "detokenize") == 0)) {
        const int base = svc_find_base(s, p[1]);
        return base < 0 ? answer_error(c, "not_found", "no such model") : tokenize(c, s, base, body, strcmp(p[2], "detokenize") == 0);
    }
    if (get && n == 2 && strcmp(p[0], "futures") == 0) {
        int status = 0;
        char *text = svc_future_wait(s, p[1], key_id, wait_seconds(c), &status);
        return text ? answer(c, 200, text) : answer_error(c, "not_found", "no such request");
    }
    if (post && n == 1 && strcmp(p[0], "trainers") == 0) {
        svc_tenant *t = NULL;
        trill_status st = svc_tenant_create(s, key_id, body, false, &t);
        return st ? answer_status(c, st) : answer_json(c, 200, tenant_json(s, t));
    }
    if (post && n == 2 && strcmp(p[0], "trainers") == 0 && strcmp(p[1], "from_state") == 0) {
        svc_tenant *t = NULL;
        trill_status st = svc_tenant_create(s, key_id, body, true, &t);
        return st ? answer_status(c, st) : answer_json(c, 200, tenant_json(s, t));
    }
    if (get && n == 2 && strcmp(p[0], "trainers") == 0) {
        pthread_mutex_lock(&s->mu);
        svc_tenant *t = svc_find_tenant(s, p[1], key_id);
        json_t *o = t ? tenant_json(s, t) : NULL;
        pthread_mutex_unlock(&s->mu);
        return t ? answer_json(c, 200, o) : answer_error(c, "not_found", "no such trainer");
    }
    if (post && n == 1 && strcmp(p[0], "samplers") == 0) {
        svc_sampler *sp = NULL;
        trill_status st = svc_sampler_create(s, key_id, body, &sp);
        return st ? answer_status(c, st) : answer_json(c, 200, json_pack("{s:s, s:s}", "sampler_id", sp->id, "base_model", trill_svc_base_name(s->bases[sp->base])));
    }
    if (post && n == 3 && (strcmp(p[0], "trainers") == 0 || strcmp(p[0], "samplers") == 0)) return submit(c, s, key_id, p[1], p[2], body);
    return answer_error(c, "not_found", "no such endpoint (docs/service.md lists them)");
}

/* The caller's key id from "Authorization: Bearer KEY", or NULL. */
static bool authenticate(struct MHD_Connection *c, svc *s, char key_id[32]) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0 || strlen(h + 7) > 128) return false;
    return svc_store_authenticate(s->store, h + 7, key_id);
}

static enum MHD_Result dispatch(struct MHD_Connection *c, svc *s, const char *url, const char *method, conn_ctx *cc) {
    if (strcmp(url, "/api/v1/healthz") == 0) return answer_json(c, 200, json_pack("{s:s}", "status", "ok"));
    char key_id[32];
    if (!authenticate(c, s, key_id)) return answer_error(c, "unauthorized", "a valid API key is needed: Authorization: Bearer KEY (trill serve keys add)");
    if (cc->too_large) {
        char msg[160];
        snprintf(msg, sizeof msg, "the body is larger than the server's limit of %zu bytes (--max-body-mb)", s->cfg.max_body_bytes);
        return answer_error(c, "too_large", msg);
    }
    if (strncmp(url, "/api/v1/", 8) != 0 || strlen(url) > 512) return answer_error(c, "not_found", "no such endpoint");
    char path[520], *parts[MAX_PATH_PARTS];
    int n = 0;
    snprintf(path, sizeof path, "%s", url + 8);
    for (char *save = NULL, *tok = strtok_r(path, "/", &save); tok; tok = strtok_r(NULL, "/", &save)) {
        if (n == MAX_PATH_PARTS) return answer_error(c, "not_found", "no such endpoint");
        parts[n++] = tok;
    }
    json_t *body = NULL;
    if (strcmp(method, "POST") == 0) {
        json_error_t err;
        body = json_loadb(cc->body ? cc->body : "", cc->len, JSON_REJECT_DUPLICATES, &err);
        if (!json_is_object(body)) {
            char msg[300];
            snprintf(msg, sizeof msg, "the body is not a JSON object%s%s (line %d, column %d)", body ? "" : ": ", body ? "" : err.text, err.line, err.column);
            json_decref(body);
            return answer_error(c, "bad_request", msg);
        }
    }
    enum MHD_Result r = route(c, s, key_id, method, parts, n, body);
    json_decref(body);
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    svc *s = cls;
    (void)version;
    conn_ctx *cc = *con_cls;
    if (!cc) { /* the headers: nothing to answer yet */
        if (!(cc = trill_calloc(1, sizeof *cc))) return MHD_NO;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body_bytes) cc->too_large = true;
        *con_cls = cc;
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
    if (strcmp(method, "GET") != 0 && strcmp(method, "POST") != 0) return answer_error(c, "bad_request", "only GET and POST are served");
    return dispatch(c, s, url, method, cc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode code) {
    (void)cls, (void)c, (void)code;
    conn_ctx *cc = *con_cls;
    if (cc) free(cc->body);
    free(cc);
    *con_cls = NULL;
}

/* ---- the server's life ---- */

static void svc_free(svc *s) {
    for (int i = 0; i < s->n_tenants; i++) {
        for (svc_job *j = s->tenants[i]->head, *next; j; j = next) next = j->next, svc_job_free(j);
        trill_svc_trainer_free(s->tenants[i]->trainer);
        free(s->tenants[i]);
    }
    for (svc_job *j = s->sample_head, *next; j; j = next) next = j->next, svc_job_free(j);
    for (int i = 0; i < s->n_samplers; i++) trill_lora_free(s->samplers[i]->lora), free(s->samplers[i]);
    for (int i = 0; i < s->n_bases; i++) trill_engine_free(s->engines ? s->engines[i] : NULL), trill_svc_base_free(s->bases[i]);
    free(s->tenants), free(s->samplers), free(s->bases), free(s->engines), free(s->inflight);
    svc_store_close(s->store);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
}

static trill_status load_bases(svc *s) {
    s->bases = trill_calloc((size_t)s->cfg.n_models, sizeof *s->bases);
    s->engines = trill_calloc((size_t)s->cfg.n_models, sizeof *s->engines);
    if (!s->bases || !s->engines) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < s->cfg.n_models; i++) {
        trill_status st = trill_svc_base_load(s->cfg.model_dirs[i], s->cfg.model_names ? s->cfg.model_names[i] : NULL, &s->bases[i]);
        s->n_bases += !st;
        for (int k = 0; !st && k < i; k++)
            if (strcmp(trill_svc_base_name(s->bases[k]), trill_svc_base_name(s->bases[i])) == 0)
                st = trill_error(TRILL_ERR_INVALID, "--models: %s and %s have the same name %s (name them: NAME=DIR)",
                                 s->cfg.model_dirs[k], s->cfg.model_dirs[i], trill_svc_base_name(s->bases[i]));
        trill_engine_config ec = trill_engine_config_default();
        ec.capture_experts = true;
        ec.tokenizer = st ? NULL : trill_svc_base_tokenizer(s->bases[i]);
        if (!st) st = trill_engine_create(trill_svc_base_model(s->bases[i]), &ec, &s->engines[i]);
        if (st) return st;
    }
    return TRILL_OK;
}

static struct MHD_Daemon *start_http(svc *s, int *port) {
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)s->cfg.port) };
    if (inet_pton(AF_INET, s->cfg.host, &addr.sin_addr) != 1) {
        trill_error(TRILL_ERR_INVALID, "--listen: \"%s\" is not an IPv4 address", s->cfg.host);
        return NULL;
    }
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, (uint16_t)s->cfg.port, NULL, NULL,
                                            on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_CONNECTION_LIMIT,
                                            (unsigned)MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_NOTIFY_COMPLETED,
                                            on_completed, s, MHD_OPTION_END);
    if (!d) {
        trill_error(TRILL_ERR_IO, "--listen: cannot listen on %s:%d (in use, or not an address of this machine)", s->cfg.host, s->cfg.port);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    *port = info ? info->port : s->cfg.port;
    return d;
}

trill_status trill_serve(const trill_serve_config *c, volatile int *stop, double max_seconds) {
    svc s = { .cfg = *c };
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.work, NULL);
    pthread_cond_init(&s.done, NULL);
    if (c->n_models < 1) return trill_error(TRILL_ERR_INVALID, "--models: at least one model folder is needed");
    s.inflight = trill_calloc((size_t)c->max_queued + 1, sizeof *s.inflight);
    trill_status st = s.inflight ? svc_store_open(c->state_dir, &s.store) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = svc_store_default_key(s.store, c->state_dir);
    if (!st) st = load_bases(&s);
    if (!st) st = svc_recover(&s);
    if (!st) st = svc_workers_start(&s);
    int port = 0;
    struct MHD_Daemon *d = st ? NULL : start_http(&s, &port);
    if (!st && !d) st = TRILL_ERR_IO;
    if (!st) {
        trill_log(TRILL_LOG_INFO, "trill serve: listening on http://%s:%d/api/v1 (%d models, state in %s)", c->host, port, s.n_bases, c->state_dir);
        char text[32];
        snprintf(text, sizeof text, "%d\n", port);
        if (c->port_file) st = trill_write_file_atomic(c->port_file, text, strlen(text));
    }
    const double t0 = trill_now();
    while (!st && !*stop && (max_seconds <= 0 || trill_now() - t0 < max_seconds)) usleep(50 * 1000);
    pthread_mutex_lock(&s.mu); /* long-polls return at once, the workers after their job */
    s.stopping = true;
    pthread_cond_broadcast(&s.work);
    pthread_cond_broadcast(&s.done);
    pthread_mutex_unlock(&s.mu);
    if (d) MHD_stop_daemon(d);
    svc_workers_stop(&s);
    svc_free(&s);
    if (!st && *stop) trill_log(TRILL_LOG_INFO, "trill serve: stopped");
    return st;
}
