/* trill_client (trill_client.h): JSON over HTTP to trill serve with libcurl and jansson.
 *
 * Every call makes its own CURL easy handle, so a client (a base URL and a key, both fixed at
 * open) needs no lock. Floats travel as JSON reals, which jansson prints with 17 significant
 * digits: a float sent or received this way comes back bit for bit. */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep under plain -std=c11 */
#endif
#include "trill_client.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    REQUEST_TIMEOUT_S = 60, /* any one call, beyond a long-poll's own wait (as the Python SDK) */
    CONNECT_TIMEOUT_S = 10,
    MAX_POLL_WAIT_S = 30,   /* per long-poll; the server allows up to 60 */
};

#define DEFAULT_BASE_URL "http://127.0.0.1:8100"

/* Pauses between tries of a long-poll while the server cannot be reached (it may be restarting). */
static const double RETRY_DELAYS_S[] = { 0.5, 1.0, 2.0, 4.0 };

struct trillc_client {
    char *base_url; /* without a trailing '/' */
    char *auth;     /* "Authorization: Bearer KEY", or NULL */
};

/* ---- errors ---- */

static _Thread_local trillc_error last_error;

const trillc_error *trillc_last_error(void) { return &last_error; }

static int fail(const char *code, long http_status, const char *fmt, ...) {
    snprintf(last_error.code, sizeof last_error.code, "%s", code);
    last_error.http_status = http_status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error.message, sizeof last_error.message, fmt, ap);
    va_end(ap);
    return -1;
}

static int out_of_memory(void) { return fail("internal", 0, "out of memory"); }

/* An answer of the server that is not what the protocol says. */
static int bad_answer(const char *what) { return fail("internal", 0, "unexpected answer from the server: %s", what); }

/* ---- the client ---- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_status;

static void init_curl(void) { curl_init_status = curl_global_init(CURL_GLOBAL_DEFAULT); }

static char *dup_string(const char *s) {
    char *d = malloc(strlen(s) + 1);
    return d ? strcpy(d, s) : NULL;
}

trillc_client *trillc_open(const char *base_url, const char *api_key) {
    pthread_once(&curl_once, init_curl);
    if (curl_init_status != CURLE_OK) {
        fail("internal", 0, "libcurl cannot start: %s", curl_easy_strerror(curl_init_status));
        return NULL;
    }
    if (!base_url || !*base_url) base_url = getenv("TRILL_BASE_URL");
    if (!base_url || !*base_url) base_url = DEFAULT_BASE_URL;
    if (!api_key) api_key = getenv("TRILL_API_KEY");
    trillc_client *c = calloc(1, sizeof *c);
    if (c) c->base_url = dup_string(base_url);
    if (c && c->base_url) {
        size_t len = strlen(c->base_url);
        while (len > 0 && c->base_url[len - 1] == '/') c->base_url[--len] = '\0';
    }
    if (c && c->base_url && api_key && *api_key) {
        const char *prefix = "Authorization: Bearer ";
        if ((c->auth = malloc(strlen(prefix) + strlen(api_key) + 1))) strcat(strcpy(c->auth, prefix), api_key);
    }
    if (!c || !c->base_url || (api_key && *api_key && !c->auth)) {
        trillc_close(c);
        out_of_memory();
        return NULL;
    }
    return c;
}

void trillc_close(trillc_client *c) {
    if (!c) return;
    free(c->base_url);
    free(c->auth);
    free(c);
}

void trillc_free(void *p) { free(p); }

/* ---- HTTP ---- */

typedef struct {
    char *data;
    size_t len, cap;
} buffer;

static size_t on_data(char *p, size_t size, size_t n, void *ctx) {
    buffer *b = ctx;
    const size_t got = size * n;
    if (b->len + got + 1 > b->cap) {
        size_t cap = (b->len + got + 1) * 2;
        char *d = realloc(b->data, cap);
        if (!d) return 0; /* curl fails the transfer with CURLE_WRITE_ERROR */
        b->data = d, b->cap = cap;
    }
    memcpy(b->data + b->len, p, got);
    b->len += got;
    return got;
}

/* The error code of an HTTP status whose body carries no {"error": ...}. */
static const char *status_code(long status) {
    switch (status) {
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 404: return "not_found";
    case 413: return "too_large";
    case 429: return "limit";
    default: return "internal";
    }
}

/* path with one id or name percent-encoded in it: prefix, segment, suffix. */
static int make_path(char *out, size_t cap, const char *prefix, const char *segment, const char *suffix) {
    if (!segment || !*segment) return fail("bad_request", 0, "%s: an id or name is needed", prefix);
    size_t n = (size_t)snprintf(out, cap, "%s", prefix);
    const unsigned char *p = (const unsigned char *)segment;
    for (; *p && n + 4 < cap; p++) {
        const bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || strchr("-._~", *p);
        n += (size_t)snprintf(out + n, cap - n, plain ? "%c" : "%%%02X", *p);
    }
    if (*p || n + strlen(suffix) + 1 > cap) return fail("bad_request", 0, "%s: the id or name is too long", prefix);
    strcat(out, suffix);
    return 0;
}

/* `GET /api/v1{path}` (body NULL), `POST` with body (stolen), or with `delete` DELETE; *answer:
 * the JSON object answered. A transfer that fails is "unreachable"; an error status is the
 * server's error. */
static int request_as(const trillc_client *c, const char *path, json_t *body, bool delete, long timeout_s, json_t **answer) {
    const char *method = delete ? "DELETE" : body ? "POST" : "GET";
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    const size_t url_len = strlen(c->base_url) + strlen("/api/v1") + strlen(path) + 1;
    char *url = malloc(url_len);
    CURL *h = curl_easy_init();
    /* "Expect:" keeps curl from waiting for a "100 Continue" before sending a large body. */
    const char *lines[] = { "Accept: application/json", "Expect:", text ? "Content-Type: application/json" : NULL, c->auth };
    struct curl_slist *headers = NULL, *more;
    bool ok = !body || text;
    for (size_t i = 0; ok && i < sizeof lines / sizeof lines[0]; i++) {
        if (!lines[i]) continue;
        if ((more = curl_slist_append(headers, lines[i]))) headers = more;
        else ok = false;
    }
    if (!ok || !url || !h) {
        free(text), free(url), curl_easy_cleanup(h), curl_slist_free_all(headers);
        return out_of_memory();
    }
    snprintf(url, url_len, "%s/api/v1%s", c->base_url, path);
    buffer got = { 0 };
    char curl_error[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* no SIGALRM for timeouts: threads may share the process */
    curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout_s);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, (long)CONNECT_TIMEOUT_S);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &got);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_error);
    if (text) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, text);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(text));
    }
    if (delete) curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
    const CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(h);
    curl_slist_free_all(headers);
    free(text);
    int result = 0;
    json_t *o = NULL;
    if (rc != CURLE_OK) {
        result = fail("unreachable", 0, "%s %s: %s", method, url, *curl_error ? curl_error : curl_easy_strerror(rc));
    } else {
        o = json_loadb(got.data ? got.data : "", got.len, 0, NULL);
        const json_t *e = json_object_get(o, "error");
        const char *code = json_string_value(json_object_get(e, "code"));
        if (status >= 400) {
            const char *message = json_string_value(json_object_get(e, "message"));
            if (code) result = fail(code, status, "%s", message ? message : "");
            else result = fail(status_code(status), status, "%s %s: HTTP %ld", method, url, status);
        } else if (!json_is_object(o)) {
            result = fail("internal", status, "%s %s: the answer is not a JSON object", method, url);
        }
    }
    free(url);
    free(got.data);
    if (result) json_decref(o);
    else *answer = o;
    return result;
}

static int request(const trillc_client *c, const char *path, json_t *body, long timeout_s, json_t **answer) {
    return request_as(c, path, body, false, timeout_s, answer);
}

/* POST with a body built by the caller, NULL if that failed. */
static int post(const trillc_client *c, const char *path, json_t *body, json_t **answer) {
    if (!body) return fail("bad_request", 0, "%s: the body cannot be built (a string that is not UTF-8, or out of memory)", path);
    return request(c, path, body, REQUEST_TIMEOUT_S, answer);
}

/* ---- JSON in and out ---- */

static json_t *int_list(const int *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i]))) { json_decref(a); return NULL; }
    return a;
}

/* NULL if out of memory or a value is not finite (JSON has no NaN nor infinity). */
static json_t *float_list(const float *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_real((double)v[i]))) { json_decref(a); return NULL; }
    return a;
}

/* Copies a string field of an answer into a fixed-size buffer. */
static int copy_field(const json_t *o, const char *key, char *out, size_t cap) {
    const char *s = json_string_value(json_object_get(o, key));
    if (!s || strlen(s) >= cap) return bad_answer(key);
    strcpy(out, s);
    return 0;
}

static int read_ints(const json_t *a, const char *what, int **out, int *n) {
    if (!json_is_array(a)) return bad_answer(what);
    const size_t len = json_array_size(a);
    int *v = malloc(sizeof(int) * (len ? len : 1));
    if (!v) return out_of_memory();
    for (size_t i = 0; i < len; i++) {
        const json_t *e = json_array_get(a, i);
        if (!json_is_integer(e)) { free(v); return bad_answer(what); }
        v[i] = (int)json_integer_value(e);
    }
    *out = v, *n = (int)len;
    return 0;
}

/* Numbers (null: NaN). The server writes floats as 17-digit reals, so each converts exactly. */
static int read_floats(const json_t *a, const char *what, float **out, int *n) {
    if (!json_is_array(a)) return bad_answer(what);
    const size_t len = json_array_size(a);
    float *v = malloc(sizeof(float) * (len ? len : 1));
    if (!v) return out_of_memory();
    for (size_t i = 0; i < len; i++) {
        const json_t *e = json_array_get(a, i);
        if (!json_is_number(e) && !json_is_null(e)) { free(v); return bad_answer(what); }
        v[i] = json_is_null(e) ? NAN : (float)json_number_value(e);
    }
    *out = v, *n = (int)len;
    return 0;
}

/* ---- models ---- */

int trillc_list_models(trillc_client *c, trillc_model **models, int *n) {
    json_t *o;
    if (request(c, "/models", NULL, REQUEST_TIMEOUT_S, &o)) return -1;
    const json_t *a = json_object_get(o, "models");
    const size_t len = json_array_size(a);
    trillc_model *m = calloc(len ? len : 1, sizeof *m);
    int st = !json_is_array(a) ? bad_answer("models") : !m ? out_of_memory() : 0;
    for (size_t i = 0; !st && i < len; i++) {
        const json_t *e = json_array_get(a, i);
        st = copy_field(e, "name", m[i].name, sizeof m[i].name);
        if (!st && json_string_value(json_object_get(e, "architecture")))
            snprintf(m[i].architecture, sizeof m[i].architecture, "%s", json_string_value(json_object_get(e, "architecture")));
        m[i].vocab_size = (int)json_integer_value(json_object_get(e, "vocab_size"));
        m[i].n_moe_layers = (int)json_integer_value(json_object_get(e, "n_moe_layers"));
        m[i].experts_per_token = (int)json_integer_value(json_object_get(e, "experts_per_token"));
        m[i].num_experts = (int)json_integer_value(json_object_get(e, "num_experts"));
        m[i].max_lora_rank = (int)json_integer_value(json_object_get(e, "max_lora_rank"));
        m[i].has_tokenizer = json_is_true(json_object_get(e, "tokenizer"));
    }
    json_decref(o);
    if (st) { free(m); return -1; }
    *models = m, *n = (int)len;
    return 0;
}

int trillc_tokenize(trillc_client *c, const char *model, const char *text, bool add_special_tokens, int **tokens, int *n) {
    char path[512];
    if (make_path(path, sizeof path, "/models/", model, "/tokenize")) return -1;
    json_t *o;
    if (post(c, path, json_pack("{s:s, s:b}", "text", text ? text : "", "add_special_tokens", add_special_tokens), &o)) return -1;
    const int st = read_ints(json_object_get(o, "tokens"), "tokens", tokens, n);
    json_decref(o);
    return st;
}

int trillc_detokenize(trillc_client *c, const char *model, const int *tokens, int n, char **text) {
    char path[512];
    if (make_path(path, sizeof path, "/models/", model, "/detokenize")) return -1;
    json_t *o;
    if (post(c, path, json_pack("{s:o}", "tokens", int_list(tokens, n)), &o)) return -1;
    const json_t *t = json_object_get(o, "text");
    char *s = json_is_string(t) ? malloc(json_string_length(t) + 1) : NULL;
    const int st = !json_is_string(t) ? bad_answer("text") : !s ? out_of_memory() : 0;
    if (!st) memcpy(s, json_string_value(t), json_string_length(t) + 1), *text = s;
    json_decref(o);
    return st;
}

/* ---- trainers ---- */

/* POST path body, answering a trainer: its id. */
static int new_trainer(trillc_client *c, const char *path, json_t *body, char trainer_id[TRILLC_ID_SIZE]) {
    json_t *o;
    if (post(c, path, body, &o)) return -1;
    const int st = copy_field(o, "trainer_id", trainer_id, TRILLC_ID_SIZE);
    json_decref(o);
    return st;
}

int trillc_create_lora_training_client(trillc_client *c, const char *base_model, int rank, long long seed, bool train_mlp,
                                       bool train_attn, bool train_unembed, char trainer_id[TRILLC_ID_SIZE]) {
    if (!base_model) return fail("bad_request", 0, "base_model: a model name is needed");
    json_t *body = json_pack("{s:s, s:b, s:b, s:b}", "base_model", base_model, "train_mlp", train_mlp, "train_attn", train_attn,
                             "train_unembed", train_unembed);
    if (body && rank > 0) json_object_set_new(body, "rank", json_integer(rank));
    if (body && seed >= 0) json_object_set_new(body, "seed", json_integer(seed));
    return new_trainer(c, "/trainers", body, trainer_id);
}

int trillc_create_training_client_from_state(trillc_client *c, const char *path, bool with_optimizer, char trainer_id[TRILLC_ID_SIZE]) {
    if (!path) return fail("bad_request", 0, "path: a trill:// path is needed");
    return new_trainer(c, "/trainers/from_state", json_pack("{s:s, s:b}", "path", path, "with_optimizer", with_optimizer), trainer_id);
}

int trillc_get_info(trillc_client *c, const char *trainer_id, trillc_trainer_info *info) {
    char path[512];
    json_t *o;
    if (make_path(path, sizeof path, "/trainers/", trainer_id, "") || request(c, path, NULL, REQUEST_TIMEOUT_S, &o)) return -1;
    trillc_trainer_info r = { 0 };
    const json_t *lora = json_object_get(o, "lora_config");
    int st = copy_field(o, "trainer_id", r.trainer_id, sizeof r.trainer_id);
    if (!st) st = copy_field(o, "base_model", r.base_model, sizeof r.base_model);
    if (!st && (!json_is_integer(json_object_get(o, "step")) || !json_is_integer(json_object_get(o, "rank")))) st = bad_answer("step, rank");
    r.rank = (int)json_integer_value(json_object_get(o, "rank"));
    r.step = (long)json_integer_value(json_object_get(o, "step"));
    r.seed = json_integer_value(json_object_get(lora, "seed"));
    r.train_mlp = json_is_true(json_object_get(lora, "train_mlp"));
    r.train_attn = json_is_true(json_object_get(lora, "train_attn"));
    r.train_unembed = json_is_true(json_object_get(lora, "train_unembed"));
    json_decref(o);
    if (!st) *info = r;
    return st;
}

/* POST /{kind}/{id}/{call} body (stolen), answering a future. */
static int submit(trillc_client *c, const char *kind, const char *id, const char *call, json_t *body, trillc_future *f) {
    char prefix[32], suffix[64], path[512];
    snprintf(prefix, sizeof prefix, "/%s/", kind);
    snprintf(suffix, sizeof suffix, "/%s", call);
    if (make_path(path, sizeof path, prefix, id, suffix)) { json_decref(body); return -1; }
    json_t *o;
    if (post(c, path, body, &o)) return -1;
    const int st = copy_field(o, "request_id", f->request_id, sizeof f->request_id);
    json_decref(o);
    return st;
}

/* A datum's JSON; NULL after fail() if a value is not finite (JSON has none) or memory runs out. */
static json_t *datum_json(const trillc_datum *d, int index) {
    if (!d->tokens || d->n < 1) {
        fail("bad_request", 0, "data[%d].tokens: at least one token is needed", index);
        return NULL;
    }
    json_t *in = json_object(), *o = json_pack("{s:o, s:o}", "model_input", int_list(d->tokens, d->n), "loss_fn_inputs", in);
    const char *const names[] = { "weights", "logprobs", "advantages" };
    const float *const values[] = { d->weights, d->logprobs, d->advantages };
    bool ok = o && (!d->target_tokens || !json_object_set_new(in, "target_tokens", int_list(d->target_tokens, d->n))) &&
              (!d->routed_experts || !json_object_set_new(in, "routed_experts", int_list(d->routed_experts, d->n_routed_experts)));
    if (!ok) out_of_memory();
    for (int a = 0; ok && a < 3; a++)
        if (values[a] && json_object_set_new(in, names[a], float_list(values[a], d->n))) {
            fail("bad_request", 0, "data[%d].%s: a value is not a finite number (or out of memory)", index, names[a]);
            ok = false;
        }
    if (!ok) json_decref(o);
    return ok ? o : NULL;
}

static int loss_call(trillc_client *c, const char *call, const char *trainer_id, const trillc_datum *data, int n, const char *loss_fn,
                     const char *loss_fn_config_json, trillc_future *f) {
    if (!loss_fn) return fail("bad_request", 0, "loss_fn: a loss's name is needed");
    json_t *list = json_array(), *config = NULL;
    if (!list) return out_of_memory();
    for (int d = 0; d < n; d++) {
        json_t *x = datum_json(&data[d], d);
        if (!x || json_array_append_new(list, x)) { json_decref(list); return x ? out_of_memory() : -1; }
    }
    if (loss_fn_config_json) {
        json_error_t err;
        config = json_loads(loss_fn_config_json, 0, &err);
        if (!json_is_object(config)) {
            json_decref(config), json_decref(list);
            return fail("bad_request", 0, "loss_fn_config: not a JSON object (%s)", config ? "another value" : err.text);
        }
    }
    json_t *body = json_pack("{s:o, s:s}", "data", list, "loss_fn", loss_fn);
    if (body && config) json_object_set_new(body, "loss_fn_config", config);
    else json_decref(config);
    return submit(c, "trainers", trainer_id, call, body, f);
}

int trillc_forward(trillc_client *c, const char *trainer_id, const trillc_datum *data, int n, const char *loss_fn,
                   const char *loss_fn_config_json, trillc_future *f) {
    return loss_call(c, "forward", trainer_id, data, n, loss_fn, loss_fn_config_json, f);
}

int trillc_forward_backward(trillc_client *c, const char *trainer_id, const trillc_datum *data, int n, const char *loss_fn,
                            const char *loss_fn_config_json, trillc_future *f) {
    return loss_call(c, "forward_backward", trainer_id, data, n, loss_fn, loss_fn_config_json, f);
}

trillc_adam trillc_adam_default(void) {
    return (trillc_adam){ .learning_rate = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-12, .weight_decay = 0, .grad_clip_norm = 0 };
}

int trillc_optim_step(trillc_client *c, const char *trainer_id, const trillc_adam *adam, trillc_future *f) {
    const trillc_adam a = adam ? *adam : trillc_adam_default();
    json_t *body = json_pack("{s:{s:f, s:f, s:f, s:f, s:f, s:f}}", "adam_params", "learning_rate", a.learning_rate, "beta1", a.beta1,
                             "beta2", a.beta2, "eps", a.eps, "weight_decay", a.weight_decay, "grad_clip_norm", a.grad_clip_norm);
    if (!body) return fail("bad_request", 0, "adam_params: a value is not a finite number");
    return submit(c, "trainers", trainer_id, "optim_step", body, f);
}

int trillc_save_state(trillc_client *c, const char *trainer_id, const char *name, trillc_future *f) {
    if (!name) return fail("bad_request", 0, "name: a name is needed");
    return submit(c, "trainers", trainer_id, "save_state", json_pack("{s:s}", "name", name), f);
}

int trillc_save_weights_for_sampler(trillc_client *c, const char *trainer_id, const char *name, trillc_future *f) {
    if (!name) return fail("bad_request", 0, "name: a name is needed");
    return submit(c, "trainers", trainer_id, "save_weights_for_sampler", json_pack("{s:s}", "name", name), f);
}

int trillc_load_state(trillc_client *c, const char *trainer_id, const char *path, bool with_optimizer, trillc_future *f) {
    if (!path) return fail("bad_request", 0, "path: a trill:// path is needed");
    return submit(c, "trainers", trainer_id, "load_state", json_pack("{s:s, s:b}", "path", path, "with_optimizer", with_optimizer), f);
}

/* ---- samplers ---- */

int trillc_create_sampling_client(trillc_client *c, const char *model_path, const char *base_model, char sampler_id[TRILLC_ID_SIZE]) {
    if (!model_path == !base_model) return fail("bad_request", 0, "create_sampling_client: give exactly one of model_path and base_model");
    json_t *o, *body = model_path ? json_pack("{s:s}", "model_path", model_path) : json_pack("{s:s}", "base_model", base_model);
    if (post(c, "/samplers", body, &o)) return -1;
    const int st = copy_field(o, "sampler_id", sampler_id, TRILLC_ID_SIZE);
    json_decref(o);
    return st;
}

trillc_sampling trillc_sampling_default(void) {
    return (trillc_sampling){ .max_tokens = 16, .seed = -1, .temperature = 1, .top_p = 1, .top_k = -1 };
}

static json_t *sampling_json(const trillc_sampling *s) {
    if (s->n_stop_tokens > 0 && s->n_stop_strings > 0) {
        fail("bad_request", 0, "sampling_params.stop: token ids or strings, not both");
        return NULL;
    }
    json_t *o = json_pack("{s:f, s:I, s:f}", "temperature", s->temperature, "top_k", (json_int_t)s->top_k, "top_p", s->top_p);
    if (!o) {
        fail("bad_request", 0, "sampling_params: temperature and top_p must be finite numbers");
        return NULL;
    }
    if (s->max_tokens > 0) json_object_set_new(o, "max_tokens", json_integer(s->max_tokens));
    if (s->seed >= 0) json_object_set_new(o, "seed", json_integer(s->seed));
    json_t *stop = s->n_stop_tokens > 0 ? int_list(s->stop_tokens, s->n_stop_tokens) : s->n_stop_strings > 0 ? json_array() : NULL;
    for (int i = 0; stop && i < s->n_stop_strings; i++)
        if (json_array_append_new(stop, json_string(s->stop_strings[i]))) {
            json_decref(stop), json_decref(o);
            fail("bad_request", 0, "sampling_params.stop[%d]: not a UTF-8 string", i);
            return NULL;
        }
    if (stop) json_object_set_new(o, "stop", stop);
    return o;
}

int trillc_sample(trillc_client *c, const char *sampler_id, const int *prompt, int n, int num_samples, const trillc_sampling *sampling,
                  trillc_future *f) {
    const trillc_sampling defaults = trillc_sampling_default();
    json_t *params = sampling_json(sampling ? sampling : &defaults);
    if (!params) return -1;
    return submit(c, "samplers", sampler_id, "sample",
                  json_pack("{s:o, s:i, s:o}", "prompt", int_list(prompt, n), "num_samples", num_samples, "sampling_params", params), f);
}

int trillc_compute_logprobs(trillc_client *c, const char *sampler_id, const int *prompt, int n, trillc_future *f) {
    return submit(c, "samplers", sampler_id, "compute_logprobs", json_pack("{s:o}", "prompt", int_list(prompt, n)), f);
}

/* ---- futures ---- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec t = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&t, &t) && errno == EINTR) {}
}

/* One long-poll of `wait` seconds, asked again while the server cannot be reached and the
 * deadline allows: *answer is {"status": ...}. */
static int poll_once(trillc_client *c, const trillc_future *f, int wait, double deadline, json_t **answer) {
    char suffix[32], path[512];
    snprintf(suffix, sizeof suffix, "?wait=%d", wait);
    if (make_path(path, sizeof path, "/futures/", f->request_id, suffix)) return -1;
    for (size_t attempt = 0;; attempt++) {
        if (!request(c, path, NULL, wait + REQUEST_TIMEOUT_S, answer)) return 0;
        if (strcmp(last_error.code, "unreachable") != 0 || attempt == sizeof RETRY_DELAYS_S / sizeof RETRY_DELAYS_S[0] ||
            now_s() + RETRY_DELAYS_S[attempt] > deadline)
            return -1;
        sleep_s(RETRY_DELAYS_S[attempt]);
    }
}

/* The future's result object (the caller's reference), once done. */
static int wait_json(trillc_client *c, const trillc_future *f, double timeout_s, json_t **result) {
    const double deadline = timeout_s < 0 ? INFINITY : now_s() + timeout_s;
    for (;;) {
        const double left = deadline - now_s();
        const int wait = left >= MAX_POLL_WAIT_S ? MAX_POLL_WAIT_S : left > 0 ? (int)left + ((double)(int)left < left) : 0; /* ceil */
        json_t *answer;
        if (poll_once(c, f, wait, deadline, &answer)) return -1;
        const char *status = json_string_value(json_object_get(answer, "status"));
        const json_t *error = json_object_get(answer, "error");
        int st = 0;
        if (status && strcmp(status, "done") == 0) {
            json_t *r = json_object_get(answer, "result");
            if (json_is_object(r)) *result = json_incref(r);
            else st = bad_answer("a done future without a result");
        } else if (status && strcmp(status, "error") == 0) {
            const char *code = json_string_value(json_object_get(error, "code")), *message = json_string_value(json_object_get(error, "message"));
            st = fail(code ? code : "internal", 0, "%s", message ? message : "");
        } else if (!status || strcmp(status, "pending") != 0) {
            st = bad_answer("a future's status");
        } else if (now_s() >= deadline) {
            st = fail("timeout", 0, "future %s: not done after %g s", f->request_id, timeout_s);
        } else {
            json_decref(answer);
            continue;
        }
        json_decref(answer);
        return st;
    }
}

int trillc_future_wait(trillc_client *c, const trillc_future *f, double timeout_s, char **result_json) {
    json_t *r;
    if (wait_json(c, f, timeout_s, &r)) return -1;
    char *text = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    if (!text) return out_of_memory();
    *result_json = text;
    return 0;
}

void trillc_forward_result_free(trillc_forward_result *r) {
    for (int i = 0; r->logprobs && i < r->n_outputs; i++) free(r->logprobs[i]);
    free(r->logprobs);
    free(r->lengths);
    *r = (trillc_forward_result){ 0 };
}

int trillc_wait_forward(trillc_client *c, const trillc_future *f, double timeout_s, trillc_forward_result *out) {
    json_t *r;
    if (wait_json(c, f, timeout_s, &r)) return -1;
    const json_t *outputs = json_object_get(r, "loss_fn_outputs"), *loss = json_object_get(json_object_get(r, "metrics"), "loss:sum");
    const size_t n = json_array_size(outputs);
    trillc_forward_result res = { .loss = json_number_value(loss), .n_outputs = (int)n };
    res.logprobs = calloc(n ? n : 1, sizeof *res.logprobs);
    res.lengths = calloc(n ? n : 1, sizeof *res.lengths);
    int st = !json_is_array(outputs) || !json_is_number(loss) ? bad_answer("loss_fn_outputs, metrics.loss:sum")
             : !res.logprobs || !res.lengths                  ? out_of_memory()
                                                              : 0;
    for (size_t i = 0; !st && i < n; i++)
        st = read_floats(json_object_get(json_array_get(outputs, i), "logprobs"), "loss_fn_outputs.logprobs", &res.logprobs[i], &res.lengths[i]);
    json_decref(r);
    if (st) trillc_forward_result_free(&res);
    else *out = res;
    return st;
}

int trillc_wait_optim(trillc_client *c, const trillc_future *f, double timeout_s, trillc_optim_result *out) {
    json_t *r;
    if (wait_json(c, f, timeout_s, &r)) return -1;
    const json_t *m = json_object_get(r, "metrics");
    const json_t *step = json_object_get(m, "step"), *norm = json_object_get(m, "grad_norm"), *lr = json_object_get(m, "learning_rate");
    const int st = json_is_integer(step) && json_is_number(norm) ? 0 : bad_answer("metrics.step, metrics.grad_norm");
    if (!st) *out = (trillc_optim_result){ .step = (long)json_integer_value(step), .grad_norm = json_number_value(norm), .learning_rate = json_number_value(lr) };
    json_decref(r);
    return st;
}

int trillc_wait_path(trillc_client *c, const trillc_future *f, double timeout_s, char path[TRILLC_PATH_SIZE]) {
    json_t *r;
    if (wait_json(c, f, timeout_s, &r)) return -1;
    const int st = copy_field(r, "path", path, TRILLC_PATH_SIZE);
    json_decref(r);
    return st;
}

int trillc_wait_load(trillc_client *c, const trillc_future *f, double timeout_s, long *step) {
    json_t *r;
    if (wait_json(c, f, timeout_s, &r)) return -1;
    const json_t *s = json_object_get(r, "step");
    const int st = json_is_integer(s) ? 0 : bad_answer("step");
    if (!st) *step = (long)json_integer_value(s);
    json_decref(r);
    return st;
}

void trillc_sample_result_free(trillc_sample_result *r) {
    for (int i = 0; r->sequences && i < r->n_sequences; i++) {
        free(r->sequences[i].tokens);
        free(r->sequences[i].logprobs);
        free(r->sequences[i].routed_experts);
    }
    free(r->sequences);
    *r = (trillc_sample_result){ 0 };
}

int trillc_wait_sample(trillc_client *c, const trillc_future *f, double timeout_s, trillc_sample_result *out) {
    json_t *r;
    if (wait_json(c, f, timeout_s, &r)) return -1;
    const json_t *seqs = json_object_get(r, "sequences");
    const size_t n = json_array_size(seqs);
    trillc_sample_result res = { .n_sequences = (int)n, .sequences = calloc(n ? n : 1, sizeof(trillc_sequence)) };
    int st = !json_is_array(seqs) ? bad_answer("sequences") : !res.sequences ? out_of_memory() : 0;
    for (size_t i = 0; !st && i < n; i++) {
        const json_t *e = json_array_get(seqs, i), *experts = json_object_get(e, "routed_experts");
        trillc_sequence *s = &res.sequences[i];
        int n_logprobs = 0;
        st = read_ints(json_object_get(e, "tokens"), "sequences.tokens", &s->tokens, &s->n_tokens);
        if (!st) st = read_floats(json_object_get(e, "logprobs"), "sequences.logprobs", &s->logprobs, &n_logprobs);
        if (!st && n_logprobs != s->n_tokens) st = bad_answer("sequences: as many logprobs as tokens");
        if (!st) st = copy_field(e, "stop_reason", s->stop_reason, sizeof s->stop_reason);
        if (!st && experts) st = read_ints(experts, "sequences.routed_experts", &s->routed_experts, &s->n_routed_experts);
    }
    json_decref(r);
    if (st) trillc_sample_result_free(&res);
    else *out = res;
    return st;
}

int trillc_wait_logprobs(trillc_client *c, const trillc_future *f, double timeout_s, float **logprobs, int *n) {
    json_t *r;
    if (wait_json(c, f, timeout_s, &r)) return -1;
    const int st = read_floats(json_object_get(r, "logprobs"), "logprobs", logprobs, n);
    json_decref(r);
    return st;
}

/* ---- deleting ---- */

static int delete_object(trillc_client *c, const char *kind, const char *id) {
    char path[TRILLC_PATH_SIZE + 64];
    json_t *o = NULL;
    if (make_path(path, sizeof path, kind, id, "") || request_as(c, path, NULL, true, REQUEST_TIMEOUT_S, &o)) return -1;
    json_decref(o);
    return 0;
}

int trillc_delete_trainer(trillc_client *c, const char *trainer_id) { return delete_object(c, "/trainers/", trainer_id); }
int trillc_delete_sampler(trillc_client *c, const char *sampler_id) { return delete_object(c, "/samplers/", sampler_id); }
