/* The official Tinker protocol (the thinking-machines-lab/tinker SDK's calls under /api/v1) on
 * trill serve's own machinery: a Tinker model is a trill trainer, a sampling session a sampler,
 * a future a request of the request log. Each call is translated to the trainer's or sampler's
 * job as trill's own routes make it, so both protocols share their checks, queues and durability.
 * forward_backward's body and the results of forward_backward and sample are protobuf
 * (tinker.proto) as the SDK sends and reads them; everything else is JSON. Paths are Tinker's:
 * tinker://RUN/weights/NAME for a saved state, tinker://RUN/sampler_weights/NAME for sampler
 * weights (trill's own routes name the same folders trill://RUN/NAME and trill://RUN/sampler/NAME). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "service/http_routes.h"
#include "tinker.pb-c.h"
#include "trill/log.h"

enum { HOLD_SECONDS = 10 }; /* a retrieve_future of a pending request waits this long, then says try_again (the SDK waits 45 s) */

static const char *str_field(const json_t *o, const char *key) { return json_string_value(json_object_get(o, key)); }

/* ---- paths ---- */

json_t *trill_tinker_path(const char *uri) {
    const char *run = uri && strncmp(uri, "trill://", 8) == 0 ? uri + 8 : NULL, *slash = run ? strchr(run, '/') : NULL;
    if (!slash) return json_string(uri ? uri : "");
    const bool sampler = strncmp(slash, "/sampler/", 9) == 0;
    return json_sprintf("tinker://%.*s/%s/%s", (int)(slash - run), run, sampler ? "sampler_weights" : "weights", slash + (sampler ? 9 : 1));
}

trill_status trill_tinker_trill_path(const char *path, char *out, size_t cap) {
    if (!path) return trill_svc_fail("bad_request", "path: expected a tinker:// path");
    if (strncmp(path, "trill://", 8) == 0) {
        snprintf(out, cap, "%s", path);
        return TRILL_OK;
    }
    const char *run = strncmp(path, "tinker://", 9) == 0 ? path + 9 : NULL, *slash = run ? strchr(run, '/') : NULL;
    const char *kind = slash ? slash + 1 : NULL, *name = kind ? strchr(kind, '/') : NULL;
    const bool sampler = name && (size_t)(name - kind) == 15 && strncmp(kind, "sampler_weights", 15) == 0;
    if (!name || !name[1] || !(sampler || ((size_t)(name - kind) == 7 && strncmp(kind, "weights", 7) == 0)))
        return trill_svc_fail("bad_request", "path: \"%.200s\" is not tinker://RUN/weights/NAME or tinker://RUN/sampler_weights/NAME", path);
    snprintf(out, cap, "trill://%.*s/%s%s", (int)(slash - run), run, sampler ? "sampler/" : "", name + 1);
    return TRILL_OK;
}

/* ---- answers ---- */

static enum MHD_Result answer_future(const route_call *q, trill_status st, const char *id, const char *model_id) {
    if (st) return trill_svc_answer_status(q->c, st);
    return trill_svc_answer_future(q, model_id ? json_pack("{s:s, s:s}", "request_id", id, "model_id", model_id) : json_pack("{s:s}", "request_id", id));
}

/* The model_id of a call's body (a trainer of the caller's). */
static trill_status model_id(const json_t *body, const char **id) {
    *id = str_field(body, "model_id");
    return *id ? TRILL_OK : trill_svc_fail("bad_request", "model_id: expected a string (create_model's)");
}

/* ---- models ---- */

/* {session_id, model_seq_id, base_model, user_metadata?, lora_config?: {rank, seed, train_unembed,
 * train_mlp, train_attn}}: the trainer is made now; its future is already done. */
/* The body's session_id: one of the caller's live sessions. */
static trill_status live_session(const route_call *q, const char **session) {
    *session = str_field(q->body, "session_id");
    if (!*session) return trill_svc_fail("bad_request", "session_id: expected a string (create_session's)");
    pthread_mutex_lock(&q->s->mu);
    const bool live = trill_svc_session_live(q->s, *session, q->key_id);
    pthread_mutex_unlock(&q->s->mu);
    return live ? TRILL_OK : trill_svc_fail("not_found", "session_id: no live session %.40s (a session ends %g s after its last heartbeat)", *session,
                                            q->s->cfg.session_timeout);
}

/* Under s->mu: object made in a session belongs to it (deleted when it ends). */
static void own(char dst[32], const char *session) { snprintf(dst, 32, "%s", session); }

enum MHD_Result trill_tinker_create_model(const route_call *q) {
    const json_t *lora = json_object_get(q->body, "lora_config");
    const char *session;
    trill_status st0 = live_session(q, &session);
    if (st0) return trill_svc_answer_status(q->c, st0);
    if (lora && !json_is_null(lora) && !json_is_object(lora)) return trill_svc_answer_error(q->c, "bad_request", "lora_config: expected an object");
    json_t *b = json_object();
    json_object_set(b, "base_model", json_object_get(q->body, "base_model"));
    const char *keys[] = { "rank", "seed", "train_unembed", "train_mlp", "train_attn" };
    for (size_t i = 0; lora && i < sizeof keys / sizeof keys[0]; i++)
        if (json_object_get(lora, keys[i])) json_object_set(b, keys[i], json_object_get(lora, keys[i]));
    svc_tenant *t = NULL;
    trill_status st = trill_svc_tenant_create(q->s, q->key_id, b, false, &t);
    json_decref(b);
    if (!st) { /* should the session end meanwhile, the next reaping deletes the model */
        pthread_mutex_lock(&q->s->mu);
        own(t->session, session);
        pthread_mutex_unlock(&q->s->mu);
    }
    char id[32], *result = NULL;
    if (!st && !(result = trill_svc_json_dump(json_pack("{s:s, s:s}", "model_id", t->id, "type", "create_model"))))
        st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_svc_record_done(q->s, q->key_id, t->id, "create_model", result, id);
    free(result);
    return answer_future(q, st, id, st ? NULL : t->id);
}

/* The tokenizer a client loads: a Hugging Face id is the served name when it has an owner
 * ("Qwen/Qwen3-30B-A3B"); otherwise the model's folder, for a client on this machine. */
static const char *tokenizer_id(const svc *s, int base) {
    const char *name = trill_svc_base_name(s->bases[base]);
    return strchr(name, '/') ? name : trill_svc_base_dir(s->bases[base]);
}

enum MHD_Result trill_tinker_get_info(const route_call *q) {
    const char *id;
    trill_status st = model_id(q->body, &id);
    if (st) return trill_svc_answer_status(q->c, st);
    pthread_mutex_lock(&q->s->mu);
    svc_tenant *t = trill_svc_find_tenant(q->s, id, q->key_id);
    json_t *o = NULL;
    if (t) {
        const trill_config *c = trill_model_config(trill_svc_base_model(q->s->bases[t->base]));
        const char *name = trill_svc_base_name(q->s->bases[t->base]);
        o = json_pack("{s:s, s:s, s:{s:s, s:s, s:s}, s:b, s:i, s:s}", "type", "get_info", "model_id", t->id, "model_data", "arch",
                      trill_config_model_type(c), "model_name", name, "tokenizer_id", tokenizer_id(q->s, t->base), "is_lora", 1, "lora_rank",
                      trill_svc_trainer_get_config(t->trainer)->rank, "model_name", name);
    }
    pthread_mutex_unlock(&q->s->mu);
    return t ? trill_svc_answer_json(q->c, 200, o) : trill_svc_answer_error(q->c, "not_found", "no such model");
}

enum MHD_Result trill_tinker_unload_model(const route_call *q) {
    const char *id;
    trill_status st = model_id(q->body, &id);
    if (!st) st = trill_svc_tenant_delete(q->s, id, q->key_id);
    char rid[32], *result = NULL;
    if (!st && !(result = trill_svc_json_dump(json_pack("{s:s, s:s}", "model_id", id, "type", "unload_model"))))
        st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_svc_record_done(q->s, q->key_id, id, "unload_model", result, rid);
    free(result);
    return answer_future(q, st, rid, st ? NULL : id);
}

/* ---- forward_backward: the protobuf request as trill's job body ---- */

/* A dense tensor's values as a JSON array of integers (as_int) or numbers, rows of K for a
 * tensor of shape [N, K] (top-k targets); *n their count. */
static trill_status tensor_json(const TrillTinker__Tensor *t, const char *what, bool as_int, json_t **out, size_t *n) {
    *out = NULL;
    if (t->encoding_case != TRILL_TINKER__TENSOR__ENCODING_DENSE)
        return trill_svc_fail("bad_request", "%s: a sparse tensor; trill takes dense ones", what);
    const size_t size = t->dtype == TRILL_TINKER__DTYPE__DTYPE_INT64 ? 8 : t->dtype == TRILL_TINKER__DTYPE__DTYPE_FLOAT32 || t->dtype == TRILL_TINKER__DTYPE__DTYPE_INT32 ? 4 : 0;
    if (!size) return trill_svc_fail("bad_request", "%s: dtype %d; expected float32, int64 or int32", what, (int)t->dtype);
    if (t->dense.len % size) return trill_svc_fail("bad_request", "%s: %zu bytes, not a whole number of values", what, t->dense.len);
    *n = t->dense.len / size;
    int64_t want = 1;
    for (size_t i = 0; i < t->n_shape; i++) want *= t->shape[i] >= 0 ? t->shape[i] : -1;
    if (t->n_shape > 2 || (t->n_shape >= 1 && (size_t)want != *n))
        return trill_svc_fail("bad_request", "%s: shape of %zu dimensions for %zu values; trill takes [N] or [N, K]", what, t->n_shape, *n);
    const size_t K = t->n_shape == 2 ? (size_t)t->shape[1] : 0;
    if (t->n_shape == 2 && K < 1) return trill_svc_fail("bad_request", "%s: shape [N, 0]", what);
    json_t *a = json_array(), *row = NULL;
    for (size_t i = 0; a && i < *n; i++) {
        if (K && i % K == 0) json_array_append_new(a, row = json_array());
        const uint8_t *p = t->dense.data + i * size;
        double v;
        if (t->dtype == TRILL_TINKER__DTYPE__DTYPE_INT64) { int64_t x; memcpy(&x, p, 8); v = (double)x; }
        else if (t->dtype == TRILL_TINKER__DTYPE__DTYPE_INT32) { int32_t x; memcpy(&x, p, 4); v = x; }
        else { float x; memcpy(&x, p, 4); v = x; }
        json_array_append_new(K ? row : a, as_int ? json_integer((json_int_t)v) : isfinite(v) ? json_real(v) : json_null());
    }
    *out = a;
    return a ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

/* Datum d: {model_input: [ids], loss_fn_inputs: {target_tokens, weights, logprobs, advantages}}. */
static trill_status datum_json(const TrillTinker__Datum *d, int index, json_t **out) {
    char what[96];
    json_t *ids = json_array(), *in = json_object();
    *out = json_pack("{s:o, s:o}", "model_input", ids, "loss_fn_inputs", in);
    if (!*out) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t k = 0; k < d->n_model_input; k++) {
        const TrillTinker__Chunk *c = d->model_input[k];
        if (c->chunk_case != TRILL_TINKER__CHUNK__CHUNK_ENCODED_TEXT)
            return trill_svc_fail("bad_request", "data[%d].model_input.chunks[%zu]: an %s chunk; trill takes encoded_text", index, k,
                                  c->chunk_case == TRILL_TINKER__CHUNK__CHUNK_IMAGE ? "image" : "audio");
        const ProtobufCBinaryData *t = &c->encoded_text->tokens;
        if (t->len % 4) return trill_svc_fail("bad_request", "data[%d].model_input.chunks[%zu].tokens: not int32 values", index, k);
        for (size_t i = 0; i < t->len / 4; i++) {
            int32_t x;
            memcpy(&x, t->data + 4 * i, 4);
            json_array_append_new(ids, json_integer(x));
        }
    }
    for (size_t k = 0; k < d->n_loss_fn_inputs; k++) {
        const char *name = d->loss_fn_inputs[k]->key;
        snprintf(what, sizeof what, "data[%d].loss_fn_inputs.%.40s", index, name);
        if (!d->loss_fn_inputs[k]->value) return trill_svc_fail("bad_request", "%s: no tensor", what);
        json_t *a = NULL;
        size_t n = 0;
        trill_status st = tensor_json(d->loss_fn_inputs[k]->value, what, strcmp(name, "target_tokens") == 0, &a, &n);
        if (st) return st;
        json_object_set_new(in, name, a);
    }
    return TRILL_OK;
}

/* The request as trill's forward(_backward) body {loss_fn, loss_fn_config, data}. */
static trill_status forward_body(const TrillTinker__ForwardBackwardRequest *r, json_t **out) {
    json_t *config = json_object(), *data = json_array();
    *out = json_pack("{s:s, s:o, s:o}", "loss_fn", r->loss_fn ? r->loss_fn : "", "loss_fn_config", config, "data", data);
    if (!*out) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t k = 0; k < r->n_loss_fn_config; k++) json_object_set_new(config, r->loss_fn_config[k]->key, json_real(r->loss_fn_config[k]->value));
    trill_status st = TRILL_OK;
    for (size_t d = 0; !st && d < r->n_data; d++) {
        json_t *x = NULL;
        st = datum_json(r->data[d], (int)d, &x);
        json_array_append_new(data, x);
    }
    return st;
}

trill_status trill_tinker_forward_request(const void *bytes, size_t n, json_t **body, char model[32], bool *forward_only) {
    *body = NULL, model[0] = 0, *forward_only = false;
    TrillTinker__ForwardBackwardRequest *r = trill_tinker__forward_backward_request__unpack(NULL, n, (const uint8_t *)(n ? bytes : ""));
    if (!r) return trill_svc_fail("bad_request", "forward_backward: the body is not a ForwardBackwardRequest message");
    trill_status st = TRILL_OK;
    if (!r->model_id || !*r->model_id || strlen(r->model_id) >= 32) st = trill_svc_fail("bad_request", "model_id: expected create_model's");
    else snprintf(model, 32, "%s", r->model_id);
    if (!st) st = forward_body(r, body);
    if (st) json_decref(*body), *body = NULL;
    *forward_only = r->forward_only;
    trill_tinker__forward_backward_request__free_unpacked(r, NULL);
    return st;
}

/* POST /forward_backward: a ForwardBackwardRequest (protobuf; forward_only: a forward). */
enum MHD_Result trill_tinker_forward_backward(const route_call *q) {
    const char *type = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    const char *encoding = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_ENCODING);
    if (!type || !strstr(type, "application/x-protobuf"))
        return trill_svc_answer_error(q->c, "bad_request", "forward_backward: expected a protobuf body (Content-Type: application/x-protobuf)");
    if (encoding && strcmp(encoding, "identity") != 0)
        return trill_svc_answer_error(q->c, "bad_request", "forward_backward: Content-Encoding is not served (the client config asks for none)");
    json_t *body = NULL;
    char id[32], model[32];
    bool forward_only = false;
    trill_status st = trill_tinker_forward_request(q->cc->body, q->cc->len, &body, model, &forward_only);
    if (!st) st = trill_svc_submit(q->s, q->key_id, forward_only ? JOB_FORWARD : JOB_FORWARD_BACKWARD, true, model, body, id, false);
    json_decref(body);
    return answer_future(q, st, id, model);
}

/* ---- training and weights calls in JSON ---- */

enum MHD_Result trill_tinker_optim_step(const route_call *q) {
    const char *model;
    char id[32];
    trill_status st = model_id(q->body, &model);
    if (!st) st = trill_svc_submit(q->s, q->key_id, JOB_OPTIM_STEP, true, model, q->body, id, false);
    return answer_future(q, st, id, model);
}

/* save_weights and save_weights_for_sampler: {model_id, path?: a name, ttl_seconds?}. Without a
 * name, one is made; for the sampler a sampling session of the weights is made too. The saved
 * state is deleted ttl_seconds after the save. */
static enum MHD_Result save(const route_call *q, job_kind kind) {
    const char *model, *name = str_field(q->body, "path");
    char id[32], made[32];
    trill_status st = model_id(q->body, &model);
    if (!name) trill_svc_new_id(made, sizeof made, kind == JOB_SAVE_SAMPLER ? "sampler-" : "weights-");
    json_t *b = json_pack("{s:s, s:O?}", "name", name ? name : made, "ttl_seconds", json_object_get(q->body, "ttl_seconds"));
    if (!st) st = b ? trill_svc_submit(q->s, q->key_id, kind, true, model, b, id, kind == JOB_SAVE_SAMPLER && !name) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_decref(b);
    return answer_future(q, st, id, model);
}
enum MHD_Result trill_tinker_save_weights(const route_call *q) { return save(q, JOB_SAVE_STATE); }
enum MHD_Result trill_tinker_save_weights_for_sampler(const route_call *q) { return save(q, JOB_SAVE_SAMPLER); }

/* {model_id, path: tinker://RUN/weights/NAME, optimizer}: the state into the model. */
enum MHD_Result trill_tinker_load_weights(const route_call *q) {
    const char *model;
    char id[32], path[256];
    trill_status st = model_id(q->body, &model);
    const json_t *opt = json_object_get(q->body, "optimizer");
    if (!st && !json_is_boolean(opt)) st = trill_svc_fail("bad_request", "optimizer: expected true or false");
    if (!st) st = trill_tinker_trill_path(str_field(q->body, "path"), path, sizeof path);
    json_t *b = st ? NULL : json_pack("{s:s, s:O}", "path", path, "with_optimizer", opt);
    if (!st) st = b ? trill_svc_submit(q->s, q->key_id, JOB_LOAD_STATE, true, model, b, id, false) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_decref(b);
    return answer_future(q, st, id, model);
}

/* ---- sampling ---- */

/* {session_id, sampling_session_seq_id, base_model?, model_path?}: a sampler, answered now. */
enum MHD_Result trill_tinker_create_sampling_session(const route_call *q) {
    const char *path = str_field(q->body, "model_path"), *base = str_field(q->body, "base_model"), *session;
    char trill[256];
    trill_status st = live_session(q, &session);
    if (!st && path) st = trill_tinker_trill_path(path, trill, sizeof trill);
    json_t *b = path ? json_pack("{s:s}", "model_path", trill) : json_pack("{s:s?}", "base_model", base);
    svc_sampler *p = NULL;
    if (!st) st = b ? trill_svc_sampler_create(q->s, q->key_id, b, &p) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_decref(b);
    if (!st) {
        pthread_mutex_lock(&q->s->mu);
        own(p->session, session);
        pthread_mutex_unlock(&q->s->mu);
    }
    return st ? trill_svc_answer_status(q->c, st)
              : trill_svc_answer_json(q->c, 200, json_pack("{s:s, s:s}", "type", "create_sampling_session", "sampling_session_id", p->id));
}

/* A ModelInput {chunks: [{tokens, type: "encoded_text"}]} as one array of token ids. */
static trill_status prompt_ids(const json_t *prompt, json_t **out) {
    const json_t *chunks = json_object_get(prompt, "chunks"), *c;
    size_t i;
    if (!json_is_array(chunks)) return trill_svc_fail("bad_request", "prompt.chunks: expected an array");
    *out = json_array();
    json_array_foreach(chunks, i, c) {
        const char *type = str_field(c, "type");
        const json_t *tokens = json_object_get(c, "tokens"), *t;
        size_t k;
        if ((type && strcmp(type, "encoded_text") != 0) || !json_is_array(tokens))
            return trill_svc_fail("bad_request", "prompt.chunks[%zu]: expected an encoded_text chunk {tokens}", i);
        json_array_foreach(tokens, k, t) json_array_append(*out, (json_t *)t);
    }
    return TRILL_OK;
}

/* {sampling_session_id, num_samples, prompt, sampling_params, prompt_logprobs?}: prompt_logprobs
 * runs the prompt's scoring beside the samples (trill's compute_logprobs). */
enum MHD_Result trill_tinker_asample(const route_call *q) {
    const char *sampler = str_field(q->body, "sampling_session_id");
    const json_t *plp = json_object_get(q->body, "prompt_logprobs"), *topk = json_object_get(q->body, "topk_prompt_logprobs");
    trill_status st = sampler ? TRILL_OK : trill_svc_fail("bad_request", "sampling_session_id: expected a string (create_sampling_session's; "
                                                                           "sampling by base_model or model_path alone is not served)");
    if (!st && json_integer_value(topk) > 0)
        st = trill_svc_fail("bad_request", "topk_prompt_logprobs: not served by trill yet (prompt_logprobs is)");
    json_t *ids = NULL;
    if (!st) st = prompt_ids(json_object_get(q->body, "prompt"), &ids);
    json_t *b = st ? NULL : json_pack("{s:o, s:O?, s:O?, s:O?}", "prompt", ids, "num_samples", json_object_get(q->body, "num_samples"),
                                      "sampling_params", json_object_get(q->body, "sampling_params"), "prompt_logprobs", plp);
    if (st) json_decref(ids);
    char id[32];
    if (!st) st = b ? trill_svc_submit(q->s, q->key_id, JOB_SAMPLE, false, sampler, b, id, false) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_decref(b);
    return answer_future(q, st, id, NULL);
}

/* ---- futures ---- */

static trill_status fb_output_proto(const json_t *r, uint8_t **bytes, size_t *n);
static trill_status sample_proto(const json_t *r, uint8_t **bytes, size_t *n);

/* A finished request's result in the Tinker shape of its kind (JSON), from trill's. */
static json_t *result_json(const char *kind, json_t *r) {
    if (strcmp(kind, "save_state") == 0 || strcmp(kind, "save_weights_for_sampler") == 0) {
        const bool sampler = strcmp(kind, "save_weights_for_sampler") == 0;
        json_t *o = json_pack("{s:o, s:s}", "path", trill_tinker_path(str_field(r, "path")), "type", sampler ? "save_weights_for_sampler" : "save_weights");
        if (o && json_object_get(r, "sampling_session_id")) json_object_set(o, "sampling_session_id", json_object_get(r, "sampling_session_id"));
        return o;
    }
    if (strcmp(kind, "optim_step") == 0) return json_pack("{s:s, s:O?}", "type", "optim_step", "metrics", json_object_get(r, "metrics"));
    if (strcmp(kind, "load_state") == 0) return json_pack("{s:s}", "type", "load_weights");
    return json_incref(r); /* create_model, unload_model: stored as Tinker has them */
}

/* The result of forward(_backward) or sample as the SDK reads it: protobuf; or JSON for a client
 * that does not take it (TensorData objects, stop reasons as strings). */
static enum MHD_Result answer_result(struct MHD_Connection *c, const char *kind, json_t *r, bool proto) {
    const bool fb = strcmp(kind, "forward") == 0 || strcmp(kind, "forward_backward") == 0, sample = strcmp(kind, "sample") == 0;
    if (proto && (fb || sample)) {
        uint8_t *bytes = NULL;
        size_t n = 0;
        trill_status st = fb ? fb_output_proto(r, &bytes, &n) : sample_proto(r, &bytes, &n);
        return st ? trill_svc_answer_status(c, st) : trill_svc_answer_bytes(c, 200, "application/x-protobuf", bytes, n);
    }
    if (fb) {
        json_t *outs = json_object_get(r, "loss_fn_outputs"), *o;
        size_t i;
        json_array_foreach(outs, i, o) {
            json_t *lp = json_object_get(o, "logprobs"), *flat = json_array(), *row;
            const size_t n = json_array_size(lp), K = json_is_array(json_array_get(lp, 0)) ? json_array_size(json_array_get(lp, 0)) : 0;
            size_t at;
            json_array_foreach(lp, at, row) K ? json_array_extend(flat, row) : json_array_append(flat, row);
            json_object_set_new(o, "logprobs", K ? json_pack("{s:o, s:s, s:[I, I]}", "data", flat, "dtype", "float32", "shape", (json_int_t)n, (json_int_t)K)
                                                 : json_pack("{s:o, s:s, s:[I]}", "data", flat, "dtype", "float32", "shape", (json_int_t)n));
        }
        return trill_svc_answer_json(c, 200, json_incref(r));
    }
    if (sample) json_object_set_new(r, "type", json_string("sample"));
    return trill_svc_answer_json(c, 200, sample ? json_incref(r) : result_json(kind, r));
}

/* Whether request id is still queued or running: its row may say done already (a save commits its
 * result before an unnamed save's sampler is made) but its answer is not final until it leaves. */
static bool running(svc *s, const char *id) {
    pthread_mutex_lock(&s->mu);
    const bool r = trill_svc_inflight(s, id);
    pthread_mutex_unlock(&s->mu);
    return r;
}

enum MHD_Result trill_tinker_future_answer(struct MHD_Connection *c, svc *s, const char *key_id, const char *id, bool proto) {
    svc_request r;
    if (!trill_svc_request_read(s, id, key_id, &r)) return trill_svc_answer_error(c, "not_found", "no such request");
    if (strcmp(r.status, "pending") == 0 || running(s, id)) { /* held long enough */
        free(r.result);
        return trill_svc_answer_json(c, 200, json_pack("{s:s, s:s, s:s}", "type", "try_again", "request_id", id, "queue_state", "active"));
    }
    json_t *res = r.result ? json_loads(r.result, 0, NULL) : NULL;
    free(r.result);
    if (!res) return trill_svc_answer_error(c, "internal", "the request's result does not read back");
    enum MHD_Result out;
    if (strcmp(r.status, "error") == 0) { /* the client's mistakes are its own; the rest is the server's */
        const char *code = str_field(res, "code");
        const bool user = code && (strcmp(code, "bad_request") == 0 || strcmp(code, "not_found") == 0 || strcmp(code, "limit") == 0 ||
                                   strcmp(code, "gone") == 0 || strcmp(code, "failed") == 0);
        out = trill_svc_answer_json(c, 200, json_pack("{s:s, s:s}", "error", str_field(res, "message") ? str_field(res, "message") : "failed",
                                                      "category", user ? "user" : "server"));
    } else {
        out = answer_result(c, r.kind, res, proto);
    }
    json_decref(res);
    return out;
}

/* {request_id, allow_metadata_only?}: the result, or a wait of up to HOLD_SECONDS for it (the
 * connection suspended, no thread held), then try_again. */
enum MHD_Result trill_tinker_retrieve_future(const route_call *q) {
    const char *id = str_field(q->body, "request_id");
    if (!id || strlen(id) >= sizeof q->cc->waiter.id) return trill_svc_answer_error(q->c, "bad_request", "request_id: expected a request's id");
    const char *accept = MHD_lookup_connection_value(q->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
    q->cc->proto = accept && strstr(accept, "application/x-protobuf");
    svc_request r;
    if (!trill_svc_request_read(q->s, id, q->key_id, &r)) return trill_svc_answer_error(q->c, "not_found", "no such request");
    free(r.result);
    q->cc->tinker = true;
    if (trill_svc_hold(q->s, q->c, q->cc, id, HOLD_SECONDS)) return MHD_YES; /* queued or running (its row may say done already) */
    return trill_tinker_future_answer(q->c, q->s, q->key_id, id, q->cc->proto);
}

/* ---- protobuf results ---- */

static trill_status packed(const ProtobufCMessage *m, uint8_t **bytes, size_t *n) {
    *n = protobuf_c_message_get_packed_size(m);
    if (!(*bytes = trill_malloc(*n ? *n : 1))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    protobuf_c_message_pack(m, *bytes);
    return TRILL_OK;
}

/* A JSON array of numbers (null: NaN) as float32 bytes (malloc'ed). */
static uint8_t *floats_of(const json_t *a, size_t *len) {
    const size_t n = json_array_size(a);
    float *v = trill_malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; v && i < n; i++) {
        const json_t *e = json_array_get(a, i);
        v[i] = json_is_number(e) ? (float)json_number_value(e) : NAN;
    }
    *len = sizeof(float) * n;
    return (uint8_t *)v;
}

/* {loss_fn_output_type, loss_fn_outputs: [{logprobs}], metrics} as a ForwardBackwardOutput of one
 * ArrayRecord: the datums' log-probs one after another, with their byte offsets. */
static trill_status fb_output_proto(const json_t *r, uint8_t **bytes, size_t *n) {
    const json_t *outs = json_object_get(r, "loss_fn_outputs"), *metrics = json_object_get(r, "metrics"), *v;
    const size_t nd = json_array_size(outs);
    size_t total = 0;
    int64_t K = 0; /* top-k targets: each datum's log-probs rows of K */
    for (size_t d = 0; d < nd; d++) {
        const json_t *lp = json_object_get(json_array_get(outs, d), "logprobs");
        if (json_is_array(json_array_get(lp, 0))) K = (int64_t)json_array_size(json_array_get(lp, 0));
        total += json_array_size(lp) * (size_t)(K ? K : 1);
    }
    float *data = trill_malloc(sizeof(float) * (total ? total : 1));
    int64_t *offsets = trill_malloc(sizeof(int64_t) * (nd + 1));
    TrillTinker__ForwardBackwardOutput__MetricsEntry *me = trill_calloc(json_object_size(metrics) + 1, sizeof *me);
    TrillTinker__ForwardBackwardOutput__MetricsEntry **mp = trill_calloc(json_object_size(metrics) + 1, sizeof *mp);
    trill_status st = data && offsets && me && mp ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t at = 0, nm = 0;
    for (size_t d = 0; !st && d < nd; d++) {
        const json_t *lp = json_object_get(json_array_get(outs, d), "logprobs");
        offsets[d] = (int64_t)(sizeof(float) * at);
        for (size_t i = 0; i < json_array_size(lp) * (size_t)(K ? K : 1); i++) {
            const json_t *e = K ? json_array_get(json_array_get(lp, i / (size_t)K), i % (size_t)K) : json_array_get(lp, i);
            data[at++] = json_is_number(e) ? (float)json_number_value(e) : NAN;
        }
    }
    if (!st) offsets[nd] = (int64_t)(sizeof(float) * at);
    const char *key;
    json_object_foreach((json_t *)metrics, key, v) {
        if (st || !json_is_number(v)) continue;
        trill_tinker__forward_backward_output__metrics_entry__init(&me[nm]);
        me[nm].key = (char *)key, me[nm].value = json_number_value(v);
        mp[nm] = &me[nm];
        nm++;
    }
    TrillTinker__BatchedTensor bt;
    trill_tinker__batched_tensor__init(&bt);
    bt.data = (ProtobufCBinaryData){ sizeof(float) * at, (uint8_t *)data };
    bt.offsets = (ProtobufCBinaryData){ sizeof(int64_t) * (nd + 1), (uint8_t *)offsets };
    bt.dtype = TRILL_TINKER__DTYPE__DTYPE_FLOAT32;
    if (K) bt.n_trailing_shape = 1, bt.trailing_shape = &K;
    TrillTinker__ArrayRecord__FieldsEntry field, *fields[1] = { &field };
    trill_tinker__array_record__fields_entry__init(&field);
    field.key = "logprobs", field.value = &bt;
    TrillTinker__ArrayRecord rec, *recs[1] = { &rec };
    trill_tinker__array_record__init(&rec);
    rec.type_tag = "ArrayRecord", rec.n_fields = 1, rec.fields = fields, rec.num_datums = (int64_t)nd;
    TrillTinker__ForwardBackwardOutput out;
    trill_tinker__forward_backward_output__init(&out);
    out.loss_fn_output_type = (char *)(str_field(r, "loss_fn_output_type") ? str_field(r, "loss_fn_output_type") : "ArrayRecord");
    out.n_loss_fn_outputs = 1, out.loss_fn_outputs = recs, out.n_metrics = nm, out.metrics = mp;
    if (!st) st = packed(&out.base, bytes, n);
    free(data), free(offsets), free(me), free(mp);
    return st;
}

/* {sequences: [{tokens, logprobs, stop_reason}], prompt_logprobs?: [null, numbers]} as a
 * SampleResponse (the prompt's as float32, NaN where none). */
static trill_status sample_proto(const json_t *r, uint8_t **bytes, size_t *n) {
    const json_t *seqs = json_object_get(r, "sequences");
    const size_t ns = json_array_size(seqs);
    TrillTinker__SampledSequence *sq = trill_calloc(ns + 1, sizeof *sq);
    TrillTinker__SampledSequence **sp = trill_calloc(ns + 1, sizeof *sp);
    trill_status st = sq && sp ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !st && i < ns; i++) {
        const json_t *o = json_array_get(seqs, i), *toks = json_object_get(o, "tokens");
        trill_tinker__sampled_sequence__init(&sq[i]);
        sp[i] = &sq[i];
        const char *why = str_field(o, "stop_reason");
        sq[i].stop_reason = why && strcmp(why, "length") == 0 ? TRILL_TINKER__STOP_REASON__STOP_REASON_LENGTH : TRILL_TINKER__STOP_REASON__STOP_REASON_STOP;
        int32_t *t = trill_malloc(sizeof(int32_t) * (json_array_size(toks) + 1));
        size_t len = 0;
        uint8_t *lp = floats_of(json_object_get(o, "logprobs"), &len);
        if (!t || !lp) { free(t), free(lp); st = trill_error(TRILL_ERR_NOMEM, "out of memory"); break; }
        for (size_t k = 0; k < json_array_size(toks); k++) t[k] = (int32_t)json_integer_value(json_array_get(toks, k));
        sq[i].tokens = (ProtobufCBinaryData){ sizeof(int32_t) * json_array_size(toks), (uint8_t *)t };
        sq[i]._logprobs_case = TRILL_TINKER__SAMPLED_SEQUENCE___LOGPROBS_LOGPROBS;
        sq[i].logprobs = (ProtobufCBinaryData){ len, lp };
    }
    TrillTinker__SampleResponse out;
    trill_tinker__sample_response__init(&out);
    out.n_sequences = ns, out.sequences = sp;
    const json_t *plp = json_object_get(r, "prompt_logprobs");
    size_t len = 0;
    uint8_t *prompt = plp ? floats_of(plp, &len) : NULL;
    if (plp && !prompt) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (prompt) out._prompt_logprobs_case = TRILL_TINKER__SAMPLE_RESPONSE___PROMPT_LOGPROBS_PROMPT_LOGPROBS, out.prompt_logprobs = (ProtobufCBinaryData){ len, prompt };
    if (!st) st = packed(&out.base, bytes, n);
    for (size_t i = 0; sq && i < ns; i++) free(sq[i].tokens.data), free(sq[i].logprobs.data);
    free(sq), free(sp), free(prompt);
    return st;
}
