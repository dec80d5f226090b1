/* trill serve's routes (http.c's table): what a handler gets and how it answers. The handlers of
 * trill's own protocol live in http.c, those of the official Tinker protocol in tinker.c. */
#ifndef TRILL_SERVICE_HTTP_ROUTES_H
#define TRILL_SERVICE_HTTP_ROUTES_H

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>

#include "service/svc.h"

/* A connection's request: its body as it arrives, and, while it long-polls, its waiter (answered
 * in the protocol it asked in: tinker set for the Tinker protocol's retrieve_future). */
typedef struct conn_ctx {
    char *body;
    size_t len, cap;
    bool too_large;
    bool waiting;                /* suspended in s->waiters; answered when resumed */
    bool tinker, proto;          /* a Tinker retrieve_future; its client takes protobuf */
    svc_waiter waiter;
} conn_ctx;

/* A request matched to its route: the path's parts ({...} segments are p[i]), the caller's key id
 * ("" for a public route), the body (POST: JSON, or the raw bytes for a route that reads them). */
typedef struct route_call {
    struct MHD_Connection *c;
    svc *s;
    const char *key_id;
    char **p;
    const json_t *body;
    conn_ctx *cc;
    const struct route *r;
} route_call;

typedef enum MHD_Result (*route_fn)(const route_call *q);

/* Every endpoint of the server: METHOD, the path under /api/v1 ("{name}" a segment the handler
 * reads; "{name...}" one that may span several, slashes and all: a Hugging Face id), the handler, a job route's kind and target, whether it is public (no key: the health
 * check alone) and whether it reads its body as bytes (no JSON). `trill serve --print-routes`
 * prints it, and the service tests call every route with no key, a bad key and another tenant's
 * key from that list. */
typedef struct route {
    const char *method, *pattern;
    route_fn fn;
    job_kind job;
    bool trainer; /* a job route: on a trainer (else a sampler) */
    bool public, raw;
    bool future;  /* answers a future: kept under the request's X-Idempotency-Key, a retry answered with it */
} route;

/* Answers: bytes of a content type (taken), JSON text (taken; NULL: out of memory), a JSON value
 * (released), trill's error shape {"error": {code, message}} with the code's HTTP status, and the
 * last error (its code from trill_svc_fail). */
enum MHD_Result trill_svc_answer_bytes(struct MHD_Connection *c, unsigned status, const char *type, void *bytes, size_t n);
enum MHD_Result trill_svc_answer(struct MHD_Connection *c, unsigned status, char *text);
enum MHD_Result trill_svc_answer_json(struct MHD_Connection *c, unsigned status, json_t *o);
enum MHD_Result trill_svc_answer_error(struct MHD_Connection *c, const char *code, const char *message);
enum MHD_Result trill_svc_answer_status(struct MHD_Connection *c, trill_status st);
/* Answers a call's future (answer released), kept under the request's X-Idempotency-Key so that
 * a retry of the call is answered the same and runs nothing. */
enum MHD_Result trill_svc_answer_future(const route_call *q, json_t *answer);
/* A job on the caller's trainer (or sampler) `target`, parsed from a trill-shaped body, queued;
 * *id its request id; make_sampler: see svc_job. Errors carry their code (trill_svc_fail). */
trill_status trill_svc_submit(svc *s, const char *key_id, job_kind kind, bool trainer, const char *target, const json_t *body, char id[32],
                              bool make_sampler);
/* Suspends connection c as a long-poll on request id until it finishes or `wait` seconds pass;
 * false when it is not queued or running any more (answer now). */
bool trill_svc_hold(svc *s, struct MHD_Connection *c, conn_ctx *cc, const char *id, double wait);

/* ---- tinker.c: the official Tinker protocol ---- */
enum MHD_Result trill_tinker_create_model(const route_call *q);
enum MHD_Result trill_tinker_get_info(const route_call *q);
enum MHD_Result trill_tinker_unload_model(const route_call *q);
enum MHD_Result trill_tinker_forward_backward(const route_call *q);
enum MHD_Result trill_tinker_optim_step(const route_call *q);
enum MHD_Result trill_tinker_save_weights(const route_call *q);
enum MHD_Result trill_tinker_save_weights_for_sampler(const route_call *q);
enum MHD_Result trill_tinker_load_weights(const route_call *q);
enum MHD_Result trill_tinker_create_sampling_session(const route_call *q);
enum MHD_Result trill_tinker_asample(const route_call *q);
enum MHD_Result trill_tinker_retrieve_future(const route_call *q);
/* tinker_runs.c: training runs and checkpoints */
enum MHD_Result trill_tinker_training_runs(const route_call *q);
enum MHD_Result trill_tinker_training_run(const route_call *q);
enum MHD_Result trill_tinker_run_checkpoints(const route_call *q);
enum MHD_Result trill_tinker_user_checkpoints(const route_call *q);
enum MHD_Result trill_tinker_delete_checkpoint(const route_call *q);
enum MHD_Result trill_tinker_weights_info(const route_call *q);
enum MHD_Result trill_tinker_sessions(const route_call *q);
enum MHD_Result trill_tinker_session(const route_call *q);
/* trill://RUN/NAME as tinker://RUN/weights/NAME, trill://RUN/sampler/NAME as
 * tinker://RUN/sampler_weights/NAME (a new JSON string). */
json_t *trill_tinker_path(const char *uri);
/* A tinker:// path as the trill:// path of the same folder; a trill:// path as it is. */
trill_status trill_tinker_trill_path(const char *path, char *out, size_t cap);
/* A retrieve_future's answer now (also a held one resumed): the result, or try_again while the request is queued or running. */
enum MHD_Result trill_tinker_future_answer(struct MHD_Connection *c, svc *s, const char *key_id, const char *id, bool proto);

#endif
