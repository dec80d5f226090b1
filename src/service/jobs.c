/* The calls that answer a future (svc.h): their bodies parsed and checked at submission, the
 * training worker (per-trainer queues, least-served trainer first), the sampling worker (the
 * queued samples of one adapter batched in the engine), and the futures' long-poll. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "service/svc.h"
#include "trill/fileio.h"
#include "trill/log.h"
#include "trill/timing.h"

enum { MAX_DATA = 1024, MAX_CALL_TOKENS = 65536, MAX_PROMPT = 8192, MAX_NEW = 4096, MAX_SAMPLES = 64, MAX_STOPS = 16 };

static const char *const KIND_NAMES[JOB_N_KINDS] = { "forward", "forward_backward", "optim_step", "save_state",
                                                     "save_weights_for_sampler", "load_state", "sample", "compute_logprobs" };

void trill_svc_free_data(trill_svc_datum *data, int n) {
    for (int d = 0; data && d < n; d++) {
        trill_svc_datum *x = &data[d];
        free((void *)x->tokens), free((void *)x->targets), free((void *)x->weights), free((void *)x->logprobs);
        free((void *)x->advantages), free((void *)x->routed_experts);
    }
    free(data);
}

void trill_svc_job_free(svc_job *j) {
    if (!j) return;
    trill_svc_free_data(j->data, j->n_data);
    free(j->prompt);
    free(j->stop_ids);
    for (int i = 0; i < j->n_stop_strings; i++) free(j->stop_strings[i]);
    free(j->stop_strings);
    json_decref(j->result);
    free(j);
}

/* ---- parsing ---- */

/* An array of at most `max` integers in [lo, hi] (want >= 0: exactly that many). */
static trill_status int_array(const json_t *a, const char *what, long long lo, long long hi, int want, int max, int **out, int *n) {
    *out = NULL, *n = 0;
    if (!json_is_array(a)) return trill_error(TRILL_ERR_INVALID, "%s: expected an array of integers, got %s", what, a ? "another type" : "nothing");
    const size_t len = json_array_size(a);
    if (want >= 0 && len != (size_t)want) return trill_error(TRILL_ERR_INVALID, "%s: %zu values, expected %d", what, len, want);
    if (len > (size_t)max) return trill_error(TRILL_ERR_INVALID, "%s: %zu values, at most %d allowed", what, len, max);
    int *v = trill_malloc(sizeof(int) * (len ? len : 1));
    if (!v) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < len; i++) {
        const json_t *e = json_array_get(a, i);
        if (!json_is_integer(e) || json_integer_value(e) < lo || json_integer_value(e) > hi) {
            free(v);
            return trill_error(TRILL_ERR_INVALID, "%s[%zu]: expected an integer in [%lld, %lld]", what, i, lo, hi);
        }
        v[i] = (int)json_integer_value(e);
    }
    *out = v, *n = (int)len;
    return TRILL_OK;
}

/* An optional array of exactly n finite numbers (absent: *out NULL). */
static trill_status float_array(const json_t *a, const char *what, int n, float **out) {
    *out = NULL;
    if (!a || json_is_null(a)) return TRILL_OK;
    if (!json_is_array(a) || json_array_size(a) != (size_t)n)
        return trill_error(TRILL_ERR_INVALID, "%s: expected an array of %d numbers (one a model_input token)", what, n);
    float *v = trill_malloc(sizeof(float) * (size_t)n);
    if (!v) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const json_t *e = json_array_get(a, (size_t)i);
        if (!json_is_number(e) || !isfinite(json_number_value(e))) {
            free(v);
            return trill_error(TRILL_ERR_INVALID, "%s[%d]: expected a finite number", what, i);
        }
        v[i] = (float)json_number_value(e);
    }
    *out = v;
    return TRILL_OK;
}

static trill_status number_field(const json_t *o, const char *key, const char *what, double lo, double hi, double *out) {
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return TRILL_OK;
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return trill_error(TRILL_ERR_INVALID, "%s.%s: expected a number in [%g, %g]", what, key, lo, hi);
    *out = json_number_value(v);
    return TRILL_OK;
}

/* Rows [n][k] of a top-k input (target_tokens or weights) as one flat array (new; *k the row
 * length); anything else as it is (a reference more; *k 0). */
static json_t *flat_rows(const json_t *a, int n, const char *what, int *k, trill_status *st) {
    *k = 0;
    if (!json_is_array(a) || !json_is_array(json_array_get(a, 0))) return json_incref((json_t *)a);
    const size_t rows = json_array_size(a), len = json_array_size(json_array_get(a, 0));
    if (rows != (size_t)n || len < 1 || len > TRILL_MAX_TARGETS) {
        *st = trill_error(TRILL_ERR_INVALID, "%s: %zu rows of %zu; top-k targets are one row of 1 to %d a model_input token (%d)", what, rows, len,
                          TRILL_MAX_TARGETS, n);
        return NULL;
    }
    json_t *flat = json_array(), *row;
    size_t i;
    json_array_foreach(a, i, row) {
        if (!json_is_array(row) || json_array_size(row) != len) {
            *st = trill_error(TRILL_ERR_INVALID, "%s[%zu]: expected a row of %zu like the first", what, i, len);
            json_decref(flat);
            return NULL;
        }
        json_array_extend(flat, row);
    }
    *k = (int)len;
    return flat;
}

static trill_status parse_datum(const trill_config *c, const json_t *o, int d, trill_svc_datum *x) {
    char what[96];
    if (!json_is_object(o)) return trill_error(TRILL_ERR_INVALID, "data[%d]: expected an object {model_input, loss_fn_inputs}", d);
    const json_t *in = json_object_get(o, "loss_fn_inputs");
    if (in && !json_is_object(in)) return trill_error(TRILL_ERR_INVALID, "data[%d].loss_fn_inputs: expected an object", d);
    snprintf(what, sizeof what, "data[%d].model_input", d);
    int *tokens = NULL, *targets = NULL, n = 0, nt = 0;
    trill_status st = int_array(json_object_get(o, "model_input"), what, 0, c->vocab_size - 1, -1, MAX_CALL_TOKENS, &tokens, &n);
    x->tokens = tokens, x->n = n;
    snprintf(what, sizeof what, "data[%d].loss_fn_inputs.target_tokens", d);
    int k = 0, kw = 0;
    json_t *tt = st ? NULL : flat_rows(json_object_get(in, "target_tokens"), n, what, &k, &st);
    if (!st) st = int_array(tt, what, 0, c->vocab_size - 1, n * (k ? k : 1), MAX_CALL_TOKENS * (k ? k : 1), &targets, &nt);
    json_decref(tt);
    x->targets = targets, x->k = k;
    const char *names[] = { "weights", "logprobs", "advantages" };
    float **dst[] = { (float **)&x->weights, (float **)&x->logprobs, (float **)&x->advantages };
    for (int a = 0; !st && a < 3; a++) {
        snprintf(what, sizeof what, "data[%d].loss_fn_inputs.%s", d, names[a]);
        json_t *v = flat_rows(json_object_get(in, names[a]), n, what, &kw, &st);
        const int want = a == 0 ? k : 0; /* weights: target_tokens' shape; logprobs, advantages: one a position */
        if (!st && v && !json_is_null(v) && kw != want)
            st = trill_error(TRILL_ERR_INVALID, "%s: %s; expected %s", what, kw ? "rows of top-k values" : "one value a position",
                             want ? "target_tokens' rows of top-k values" : "one value a position");
        if (!st) st = float_array(v, what, n * (kw ? kw : 1), dst[a]);
        json_decref(v);
    }
    const json_t *re = json_object_get(in, "routed_experts");
    if (!st && re && !json_is_null(re)) {
        const int row = c->n_moe_layers * c->num_experts_per_tok, want = n * row;
        int *ids = NULL, got = 0;
        snprintf(what, sizeof what, "data[%d].loss_fn_inputs.routed_experts", d);
        st = int_array(re, what, 0, c->num_experts - 1, want, want, &ids, &got);
        uint16_t *r = st ? NULL : trill_malloc(sizeof(uint16_t) * (size_t)(want ? want : 1));
        if (!st && !r) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (int i = 0; !st && i < want; i++) r[i] = (uint16_t)ids[i];
        free(ids);
        x->routed_experts = r;
    }
    return st;
}

trill_status trill_svc_parse_data(trill_svc_base *b, trill_loss loss, const json_t *data, trill_svc_datum **out, int *n, long *tokens) {
    const trill_config *c = trill_model_config(trill_svc_base_model(b));
    *out = NULL, *n = 0, *tokens = 0;
    if (!json_is_array(data) || json_array_size(data) < 1 || json_array_size(data) > MAX_DATA)
        return trill_error(TRILL_ERR_INVALID, "data: expected an array of 1 to %d datums", MAX_DATA);
    const int count = (int)json_array_size(data);
    trill_svc_datum *x = trill_calloc((size_t)count, sizeof *x);
    if (!x) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    long total = 0;
    for (int d = 0; !st && d < count; d++) {
        st = parse_datum(c, json_array_get(data, (size_t)d), d, &x[d]);
        total += x[d].n + 1;
        if (!st && total > MAX_CALL_TOKENS) st = trill_error(TRILL_ERR_INVALID, "data: more than %d tokens in one call", MAX_CALL_TOKENS);
        if (!st) st = trill_svc_datum_check(b, loss, &x[d], d);
    }
    if (st) { trill_svc_free_data(x, count); return st; }
    *out = x, *n = count, *tokens = total;
    return TRILL_OK;
}

trill_status trill_svc_parse_loss(const json_t *body, trill_loss *loss, trill_svc_loss_config *config) {
    const char *name = json_string_value(json_object_get(body, "loss_fn"));
    char names[256];
    if (!name || trill_loss_parse(name, TRILL_LOSS_IN_SERVE) < 0)
        return trill_error(TRILL_ERR_INVALID, "loss_fn: expected one of %s", trill_loss_names(TRILL_LOSS_IN_SERVE, names, sizeof names));
    *loss = (trill_loss)trill_loss_parse(name, TRILL_LOSS_IN_SERVE);
    *config = trill_svc_loss_config_default();
    const json_t *lc = json_object_get(body, "loss_fn_config");
    if (lc && !json_is_null(lc) && !json_is_object(lc)) return trill_error(TRILL_ERR_INVALID, "loss_fn_config: expected an object");
    trill_status st = number_field(lc, "clip_low_threshold", "loss_fn_config", 0, 1e9, &config->clip_low);
    if (!st) st = number_field(lc, "clip_high_threshold", "loss_fn_config", 0, 1e9, &config->clip_high);
    if (!st) st = number_field(lc, "beta", "loss_fn_config", 0, 1e9, &config->beta);
    if (!st && config->clip_low > config->clip_high)
        st = trill_error(TRILL_ERR_INVALID, "loss_fn_config: clip_low_threshold %g is above clip_high_threshold %g", config->clip_low,
                         config->clip_high);
    if (!st && *loss == TRILL_LOSS_DRO && !isfinite(config->beta)) st = trill_error(TRILL_ERR_INVALID, "loss_fn_config.beta: dro needs beta");
    return st;
}

static trill_status parse_forward(svc *s, const json_t *body, svc_job *j) {
    trill_status st = trill_svc_parse_loss(body, &j->loss, &j->loss_config);
    return st ? st : trill_svc_parse_data(s->bases[j->base], j->loss, json_object_get(body, "data"), &j->data, &j->n_data, &j->cost);
}

trill_status trill_svc_parse_adam(const json_t *body, trill_svc_adam *p) {
    const json_t *a = json_object_get(body, "adam_params");
    if (!json_is_object(a)) return trill_error(TRILL_ERR_INVALID, "adam_params: expected an object {learning_rate, beta1, beta2, eps, ...}");
    *p = trill_svc_adam_default();
    trill_status st = number_field(a, "learning_rate", "adam_params", 0, 10, &p->learning_rate);
    if (!st) st = number_field(a, "beta1", "adam_params", 0, 0.999999, &p->beta1);
    if (!st) st = number_field(a, "beta2", "adam_params", 0, 0.999999999, &p->beta2);
    if (!st) st = number_field(a, "eps", "adam_params", 1e-30, 1, &p->eps);
    if (!st) st = number_field(a, "weight_decay", "adam_params", 0, 10, &p->weight_decay);
    if (!st) st = number_field(a, "grad_clip_norm", "adam_params", 0, 1e9, &p->grad_clip_norm);
    return st;
}

/* A state's name: 1 to 64 of [A-Za-z0-9._-], not starting with '.' (it becomes a folder name). */
static trill_status parse_name(const json_t *body, svc_job *j) {
    const char *name = json_string_value(json_object_get(body, "name"));
    bool ok = name && *name && *name != '.' && strlen(name) <= 64;
    for (const char *p = name; ok && *p; p++)
        ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-';
    if (!ok) return trill_error(TRILL_ERR_INVALID, "name: expected 1 to 64 letters, digits, '.', '_' or '-', not starting with '.'");
    snprintf(j->name, sizeof j->name, "%s", name);
    j->cost = 1;
    const json_t *ttl = json_object_get(body, "ttl_seconds");
    if (ttl && !json_is_null(ttl) && (!json_is_integer(ttl) || json_integer_value(ttl) < 1 || json_integer_value(ttl) > 10 * 366 * 86400LL))
        return trill_error(TRILL_ERR_INVALID, "ttl_seconds: expected an integer of seconds from 1 to ten years (or null: kept)");
    j->ttl = json_integer_value(ttl);
    return TRILL_OK;
}

static trill_status parse_stops(const json_t *stop, svc_job *j, const trill_config *c) {
    if (!stop || json_is_null(stop)) return TRILL_OK;
    if (json_is_string(stop)) {
        if (json_string_length(stop) < 1 || json_string_length(stop) > 256)
            return trill_error(TRILL_ERR_INVALID, "sampling_params.stop: expected a string of 1 to 256 bytes");
        if (!(j->stop_strings = trill_calloc(1, sizeof(char *))) || !(j->stop_strings[0] = trill_strdup(json_string_value(stop))))
            return trill_error(TRILL_ERR_NOMEM, "out of memory");
        j->n_stop_strings = 1;
        return TRILL_OK;
    }
    if (!json_is_array(stop) || json_array_size(stop) > MAX_STOPS)
        return trill_error(TRILL_ERR_INVALID, "sampling_params.stop: expected a string or an array of at most %d token ids or strings", MAX_STOPS);
    if (json_array_size(stop) > 0 && json_is_integer(json_array_get(stop, 0)))
        return int_array(stop, "sampling_params.stop", 0, c->vocab_size - 1, -1, MAX_STOPS, &j->stop_ids, &j->n_stop_ids);
    if (!(j->stop_strings = trill_calloc(json_array_size(stop) + 1, sizeof(char *)))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(stop); i++) {
        const char *t = json_string_value(json_array_get(stop, i));
        if (!t || !*t || strlen(t) > 256)
            return trill_error(TRILL_ERR_INVALID, "sampling_params.stop[%zu]: expected a string of 1 to 256 bytes (or every entry a token id)", i);
        if (!(j->stop_strings[j->n_stop_strings++] = trill_strdup(t))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    return TRILL_OK;
}

static trill_status parse_sample(svc *s, const json_t *body, svc_job *j) {
    const trill_config *c = trill_model_config(trill_svc_base_model(s->bases[j->base]));
    trill_status st = int_array(json_object_get(body, "prompt"), "prompt", 0, c->vocab_size - 1, -1, MAX_PROMPT, &j->prompt, &j->prompt_len);
    if (!st && j->prompt_len < 1) st = trill_error(TRILL_ERR_INVALID, "prompt: empty (at least one token)");
    j->cost = j->prompt_len;
    if (st || j->kind == JOB_LOGPROBS) return st;
    double num = 1, max_tokens = 16, seed = -1, top_k = 0;
    j->sampling = trill_sampling_default();
    double temperature = 1, top_p = 1;
    st = number_field(body, "num_samples", "body", 1, MAX_SAMPLES, &num);
    const json_t *sp = json_object_get(body, "sampling_params");
    if (!st && sp && !json_is_null(sp) && !json_is_object(sp)) st = trill_error(TRILL_ERR_INVALID, "sampling_params: expected an object");
    if (!st) st = number_field(sp, "max_tokens", "sampling_params", 1, MAX_NEW, &max_tokens);
    if (!st) st = number_field(sp, "seed", "sampling_params", 0, 9007199254740991.0, &seed);
    if (!st) st = number_field(sp, "temperature", "sampling_params", 0, 1e6, &temperature);
    if (!st) st = number_field(sp, "top_k", "sampling_params", -1, 1e9, &top_k);
    if (!st) st = number_field(sp, "top_p", "sampling_params", 1e-9, 1, &top_p);
    if (!st && (num != floor(num) || max_tokens != floor(max_tokens) || seed != floor(seed) || top_k != floor(top_k)))
        st = trill_error(TRILL_ERR_INVALID, "num_samples, max_tokens, seed and top_k: expected integers");
    if (!st) st = parse_stops(json_object_get(sp, "stop"), j, c);
    const json_t *plp = json_object_get(body, "prompt_logprobs");
    if (!st && plp && !json_is_null(plp) && !json_is_boolean(plp)) st = trill_error(TRILL_ERR_INVALID, "prompt_logprobs: expected true or false");
    j->prompt_logprobs = json_is_true(plp);
    if (st) return st;
    j->num_samples = (int)num, j->max_tokens = (int)max_tokens;
    j->sampling.temperature = (float)temperature, j->sampling.top_p = (float)top_p, j->sampling.top_k = top_k < 0 ? 0 : (int)top_k;
    j->sampling.seed = seed < 0 ? trill_svc_random_u64() >> 11 : (uint64_t)seed; /* no seed: a fresh one (53 bits, as JSON keeps) */
    j->cost = (long)j->prompt_len * (1 + j->prompt_logprobs) + (long)j->num_samples * j->max_tokens;
    return trill_sampling_check(&j->sampling);
}

trill_status trill_svc_job_parse(svc *s, job_kind kind, const json_t *body, svc_job *j) {
    j->kind = kind;
    trill_status st;
    switch (kind) {
    case JOB_FORWARD:
    case JOB_FORWARD_BACKWARD: st = parse_forward(s, body, j); break;
    case JOB_OPTIM_STEP: st = trill_svc_parse_adam(body, &j->adam), j->cost = 1; break;
    case JOB_SAVE_STATE:
    case JOB_SAVE_SAMPLER: st = parse_name(body, j); break;
    case JOB_LOAD_STATE: {
        const char *path = json_string_value(json_object_get(body, "path"));
        const json_t *w = json_object_get(body, "with_optimizer");
        int base = -1;
        st = path ? TRILL_OK : trill_error(TRILL_ERR_INVALID, "path: expected a trill:// path of a saved state");
        if (!st && w && !json_is_boolean(w)) st = trill_error(TRILL_ERR_INVALID, "with_optimizer: expected true or false");
        j->with_optimizer = json_is_true(w);
        if (!st) st = trill_svc_resolve_uri(s, path, j->key_id, "state", j->dir, sizeof j->dir, &base);
        if (!st && base != j->base)
            st = trill_error(TRILL_ERR_INVALID, "path: the state was trained on %s, this trainer's base is %s", trill_svc_base_name(s->bases[base]),
                             trill_svc_base_name(s->bases[j->base]));
        j->cost = 1;
        break;
    }
    case JOB_SAMPLE:
    case JOB_LOGPROBS: st = parse_sample(s, body, j); break;
    default: st = trill_error(TRILL_ERR_INVALID, "unknown call");
    }
    return st;
}

/* ---- queues ---- */

trill_status trill_svc_job_submit(svc *s, svc_job *j, const char *target, bool trainer) {
    svc_arg a[] = { SVC_S(j->id), SVC_S(j->key_id), SVC_S(target), SVC_S(KIND_NAMES[j->kind]), SVC_I(time(NULL)) };
    trill_status st = trill_svc_store_run(s->store, "logging a request",
                                    "INSERT INTO requests(id, key_id, target, kind, status, created) VALUES(?1, ?2, ?3, ?4, 'pending', ?5)",
                                    a, 5, NULL, NULL, NULL);
    if (st) { trill_svc_job_free(j); return st; }
    /* found again now (it may have been deleted since the call was parsed), and queued at once */
    pthread_mutex_lock(&s->mu);
    if (trainer) j->tenant = trill_svc_find_tenant(s, target, j->key_id);
    else j->sampler = trill_svc_find_sampler(s, target, j->key_id);
    if (!j->tenant && !j->sampler) st = trill_svc_fail("not_found", trainer ? "no such trainer" : "no such sampler");
    else if (s->n_inflight >= s->cfg.max_queued)
        st = trill_svc_fail("limit", "the server has %d requests waiting (--max-queued): retry later", s->cfg.max_queued);
    if (!st) {
        s->inflight[s->n_inflight++] = j;
        if (j->tenant) {
            svc_tenant *t = j->tenant;
            if (t->tail) t->tail->next = j;
            else t->head = j;
            t->tail = j;
        } else {
            j->sampler->jobs++;
            if (s->sample_tail) s->sample_tail->next = j;
            else s->sample_head = j;
            s->sample_tail = j;
        }
        pthread_cond_broadcast(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    if (st) { /* refused: the request never was */
        svc_arg id = SVC_S(j->id);
        trill_svc_store_run(s->store, "forgetting a refused request", "DELETE FROM requests WHERE id = ?1", &id, 1, NULL, NULL, NULL);
        trill_svc_job_free(j);
    }
    return st;
}

void trill_svc_job_finish(svc *s, svc_job *j, char *result, trill_status st) {
    const char *code = st ? trill_svc_take_code() : NULL;
    json_t *err = st ? json_pack("{s:s, s:s}", "code", code ? code : "failed", "message", trill_error_message()) : NULL;
    char *text = st ? json_dumps(err, JSON_COMPACT) : result;
    svc_arg a[] = { SVC_S(st ? "error" : "done"), SVC_S(text ? text : "{}"), SVC_I(time(NULL)), SVC_S(j->id) };
    if (!j->logged && trill_svc_store_run(s->store, "recording a result", "UPDATE requests SET status = ?1, result = ?2, finished = ?3 WHERE id = ?4", a, 4,
                                    NULL, NULL, NULL))
        trill_log(TRILL_LOG_WARN, "trill serve: %s", trill_error_message());
    if (text != result) free(text);
    free(result);
    json_decref(err);
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_inflight; i++)
        if (s->inflight[i] == j) { s->inflight[i] = s->inflight[--s->n_inflight]; break; }
    if (j->sampler) {
        j->sampler->jobs--;
        trill_svc_sampler_settle(s, j->sampler);
    }
    trill_svc_wake_waiters(s, j->id);
    pthread_cond_broadcast(&s->done);
    pthread_mutex_unlock(&s->mu);
    trill_svc_job_free(j);
}

char *trill_svc_json_dump(json_t *o) {
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return t;
}

json_t *trill_svc_json_floats(const float *v, int n) {
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

/* ---- the training worker ---- */

/* n*k log-probs of a datum as JSON: a list, or rows of k (top-k targets). */
static json_t *logprobs_json(const float *lp, int n, int k) {
    if (k <= 1) return trill_svc_json_floats(lp, n);
    json_t *rows = json_array();
    for (int i = 0; rows && i < n; i++) json_array_append_new(rows, trill_svc_json_floats(lp + (size_t)i * k, k));
    return rows;
}

static trill_status run_forward(svc *s, svc_job *j, char **result) {
    size_t total = 0;
    for (int d = 0; d < j->n_data; d++) total += (size_t)j->data[d].n * (j->data[d].k > 1 ? j->data[d].k : 1);
    float *lp = trill_malloc(sizeof(float) * (total ? total : 1));
    double loss = 0;
    trill_status st = lp ? trill_svc_forward(j->tenant->trainer, j->data, j->n_data, j->loss, &j->loss_config, j->kind == JOB_FORWARD_BACKWARD,
                                            lp, &loss)
                         : trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_t *outs = json_array();
    for (size_t d = 0, k = 0; !st && d < (size_t)j->n_data; k += (size_t)j->data[d].n * (j->data[d].k > 1 ? j->data[d].k : 1), d++)
        json_array_append_new(outs, json_pack("{s:o}", "logprobs", logprobs_json(lp + k, j->data[d].n, j->data[d].k)));
    if (!st)
        *result = trill_svc_json_dump(json_pack("{s:s, s:O, s:{s:f}}", "loss_fn_output_type", trill_loss_get(j->loss)->name, "loss_fn_outputs", outs, "metrics",
                                 "loss:sum", loss));
    json_decref(outs);
    free(lp);
    (void)s;
    return st;
}

/* Ephemeral samplers (of unnamed saves) a trainer keeps: a loop that saves every step retires
 * the oldest idle ones with their weights, so neither samplers nor folders pile up. */
enum { EPHEMERAL_KEEP = 8 };

/* Sampler p, just made of trainer t's unnamed save, joins t's session and t's ephemeral samplers;
 * beyond EPHEMERAL_KEEP of those, the oldest idle ones are retired (sampler and weights). */
static int by_age(const void *a, const void *b) {
    const uint64_t x = (*(svc_sampler *const *)a)->made, y = (*(svc_sampler *const *)b)->made;
    return (x > y) - (x < y);
}

static void retire_old_samplers(svc *s, const svc_tenant *t, svc_sampler *p) {
    typedef struct { char id[32], key_id[32], uri[256]; } retiree;
    pthread_mutex_lock(&s->mu);
    memcpy(p->session, t->session, sizeof p->session); /* it belongs to the session its model was made in */
    p->ephemeral = true, p->made = ++s->made;
    snprintf(p->owner, sizeof p->owner, "%s", t->id);
    svc_sampler **idle = trill_malloc(sizeof *idle * (size_t)(s->n_samplers + 1));
    int mine = 0, n_idle = 0, n_old = 0;
    for (int i = 0; idle && i < s->n_samplers; i++) { /* t's ephemeral samplers, and the idle ones but p */
        svc_sampler *x = s->samplers[i];
        if (x->gone || x->creating || !x->ephemeral || strcmp(x->owner, t->id) != 0) continue;
        mine++;
        if (x != p && x->jobs == 0 && x->pins == 0) idle[n_idle++] = x;
    }
    if (n_idle) qsort(idle, (size_t)n_idle, sizeof *idle, by_age);
    const int excess = mine > EPHEMERAL_KEEP ? mine - EPHEMERAL_KEEP : 0;
    retiree *old = excess && n_idle ? trill_malloc(sizeof *old * (size_t)excess) : NULL;
    for (int i = 0; old && i < excess && i < n_idle; i++, n_old++) { /* the oldest idle ones */
        snprintf(old[i].id, sizeof old[i].id, "%s", idle[i]->id), snprintf(old[i].key_id, sizeof old[i].key_id, "%s", idle[i]->key_id);
        snprintf(old[i].uri, sizeof old[i].uri, "%s", idle[i]->weights ? idle[i]->weights->uri : "");
    }
    pthread_mutex_unlock(&s->mu);
    free(idle);
    for (int i = 0; i < n_old; i++) trill_svc_retire_sampler(s, old[i].id, old[i].key_id, true, old[i].uri);
    free(old);
}

/* A Tinker save_weights_for_sampler without a name: a sampler of the saved weights is made for the
 * caller and its id is the result's sampling_session_id (the request log's result updated: the
 * save recorded it already). */
static trill_status make_sampler(svc *s, svc_job *j, char **result) {
    json_t *r = json_loads(*result, 0, NULL);
    json_t *body = json_pack("{s:O}", "model_path", json_object_get(r, "path"));
    svc_sampler *p = NULL;
    trill_status st = body ? trill_svc_sampler_create(s, j->key_id, body, &p) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) retire_old_samplers(s, j->tenant, p);
    if (!st && json_object_set_new(r, "sampling_session_id", json_string(p->id))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    char *text = st ? NULL : json_dumps(r, JSON_COMPACT);
    if (!st && !text) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    svc_arg a[] = { SVC_S(text), SVC_S(j->id) };
    if (!st) st = trill_svc_store_run(s->store, "recording a result", "UPDATE requests SET result = ?1 WHERE id = ?2", a, 2, NULL, NULL, NULL);
    if (!st) free(*result), *result = text, text = NULL;
    free(text);
    json_decref(body);
    json_decref(r);
    return st;
}

static trill_status run_training(svc *s, svc_job *j, char **result) {
    trill_status st;
    switch (j->kind) {
    case JOB_FORWARD:
    case JOB_FORWARD_BACKWARD: return run_forward(s, j, result);
    case JOB_OPTIM_STEP: return trill_svc_commit_step(s, j->tenant, j, result);
    case JOB_SAVE_SAMPLER:
        st = trill_svc_commit_save(s, j->tenant, j, result);
        if (!st && j->make_sampler && (st = make_sampler(s, j, result))) j->logged = false; /* the save stands; the call failed: say so */
        return st;
    case JOB_SAVE_STATE: return trill_svc_commit_save(s, j->tenant, j, result);
    case JOB_LOAD_STATE: return trill_svc_commit_load(s, j->tenant, j, result);
    default: return trill_error(TRILL_ERR_INVALID, "not a training call");
    }
}

/* The trainer with queued work that has been served the fewest tokens (ties: the first made). */
static svc_tenant *pick_tenant(svc *s) {
    svc_tenant *best = NULL;
    for (int i = 0; i < s->n_tenants; i++) {
        svc_tenant *t = s->tenants[i];
        if (t->head && !t->running && (!best || t->served < best->served)) best = t;
    }
    return best;
}

static void *train_main(void *arg) {
    svc *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        svc_tenant *t = NULL;
        while (!s->stopping && !(t = pick_tenant(s))) pthread_cond_wait(&s->work, &s->mu);
        if (s->stopping) break;
        svc_job *j = t->head;
        if (!(t->head = j->next)) t->tail = NULL;
        t->running = true;
        t->served += j->cost;
        pthread_mutex_unlock(&s->mu);
        char *result = NULL, garbage[sizeof j->garbage];
        trill_status st = run_training(s, j, &result);
        if (!st && !result) st = trill_error(TRILL_ERR_NOMEM, "out of memory (the result)");
        snprintf(garbage, sizeof garbage, "%s", j->garbage);
        trill_svc_job_finish(s, j, result, st);
        if (garbage[0]) trill_remove_tree(garbage); /* after the answer: the client does not wait for it */
        pthread_mutex_lock(&s->mu);
        t->running = false;
        trill_svc_tenant_settle(s, t); /* deleted (or its key revoked) while the call ran */
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

trill_status trill_svc_workers_start(svc *s) {
    if (pthread_create(&s->train_thread, NULL, train_main, s) != 0) return trill_error(TRILL_ERR_NOMEM, "trill serve: cannot start the training worker");
    if (pthread_create(&s->sample_thread, NULL, trill_svc_sample_main, s) != 0) {
        trill_svc_workers_stop(s);
        return trill_error(TRILL_ERR_NOMEM, "trill serve: cannot start the sampling worker");
    }
    return TRILL_OK;
}

/* Waits for the running jobs; the queued ones stay pending in the log (the next start reports
 * them as "server_restarted"). */
void trill_svc_workers_stop(svc *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
    if (s->train_thread) pthread_join(s->train_thread, NULL);
    if (s->sample_thread) pthread_join(s->sample_thread, NULL);
    s->train_thread = s->sample_thread = 0;
}

/* ---- futures ---- */

typedef struct { char key_id[32]; svc_request *out; } request_row;

static void read_request(void *ctx, sqlite3_stmt *row) {
    request_row *r = ctx;
    snprintf(r->key_id, sizeof r->key_id, "%s", (const char *)sqlite3_column_text(row, 0));
    snprintf(r->out->status, sizeof r->out->status, "%s", (const char *)sqlite3_column_text(row, 1));
    const unsigned char *t = sqlite3_column_text(row, 2);
    r->out->result = t ? trill_strdup((const char *)t) : NULL;
    snprintf(r->out->kind, sizeof r->out->kind, "%s", (const char *)sqlite3_column_text(row, 3));
}

bool trill_svc_request_read(svc *s, const char *id, const char *key_id, svc_request *out) {
    memset(out, 0, sizeof *out);
    request_row r = { .out = out };
    svc_arg a = SVC_S(id);
    if (trill_svc_store_run(s->store, "reading a request", "SELECT key_id, status, result, kind FROM requests WHERE id = ?1", &a, 1, read_request,
                            &r, NULL) || strcmp(r.key_id, key_id) != 0) {
        free(out->result);
        out->result = NULL;
        return false;
    }
    return true;
}

trill_status trill_svc_record_done(svc *s, const char *key_id, const char *target, const char *kind, const char *result, char id[32]) {
    trill_svc_new_id(id, 32, "r-");
    svc_arg a[] = { SVC_S(id), SVC_S(key_id), SVC_S(target), SVC_S(kind), SVC_I(time(NULL)), SVC_S(result) };
    return trill_svc_store_run(s->store, "logging a request",
                               "INSERT INTO requests(id, key_id, target, kind, status, created, finished, result) VALUES(?1, ?2, ?3, ?4, 'done', ?5, ?5, ?6)",
                               a, 6, NULL, NULL, NULL);
}

bool trill_svc_inflight(svc *s, const char *id) {
    for (int i = 0; i < s->n_inflight; i++)
        if (strcmp(s->inflight[i]->id, id) == 0) return true;
    return false;
}

char *trill_svc_future_answer(svc *s, const char *id, const char *key_id, int *status, bool *pending) {
    svc_request r;
    if (!trill_svc_request_read(s, id, key_id, &r)) {
        *status = 404;
        return NULL;
    }
    /* the stored result is JSON the server wrote: wrapped as it is, not parsed again (results run to megabytes) */
    *pending = strcmp(r.status, "pending") == 0;
    const bool done = strcmp(r.status, "done") == 0;
    const char *inner = r.result && *r.result ? r.result : "{}";
    const size_t cap = strlen(inner) + 48;
    char *text = trill_malloc(cap);
    if (text && *pending) snprintf(text, cap, "{\"status\":\"pending\"}");
    else if (text) snprintf(text, cap, "{\"status\":\"%s\",\"%s\":%s}", done ? "done" : "error", done ? "result" : "error", inner);
    free(r.result);
    *status = text ? 200 : 500;
    return text;
}
