/* The server's state, shared by the HTTP side (http.c: routing, authentication, the calls that
 * answer at once) and the work side (jobs.c: the calls that answer a future, their queues and
 * the worker threads). Everything below `mu` is guarded by it. */
#ifndef TRILL_SERVICE_SVC_H
#define TRILL_SERVICE_SVC_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>

#include "service/store.h"
#include "trill/infer.h"
#include "trill/service.h"

typedef enum job_kind {
    JOB_FORWARD, JOB_FORWARD_BACKWARD, JOB_OPTIM_STEP, JOB_SAVE_STATE, JOB_SAVE_SAMPLER, JOB_LOAD_STATE,
    JOB_SAMPLE, JOB_LOGPROBS, JOB_N_KINDS
} job_kind;

struct svc_tenant;
struct svc_sampler;

/* One call that answers a future: everything it needs, parsed and checked when it was submitted. */
typedef struct svc_job {
    char id[32], key_id[32];
    job_kind kind;
    struct svc_tenant *tenant;   /* training calls */
    struct svc_sampler *sampler; /* sampling calls */
    long cost;                   /* tokens, for the fair scheduler */
    /* forward, forward_backward */
    trill_svc_datum *data;
    int n_data;
    trill_svc_loss loss;
    trill_svc_loss_config loss_config;
    void *arrays;                /* one block holding the data's arrays */
    /* optim_step */
    trill_svc_adam adam;
    /* save_state, save_weights_for_sampler: the state's name; load_state: its directory */
    char name[72], dir[4096];
    bool with_optimizer;
    /* sample, compute_logprobs */
    int *prompt, prompt_len, num_samples, max_tokens, *stop_ids, n_stop_ids;
    char **stop_strings;
    int n_stop_strings;
    trill_sampling sampling;
    json_t *result;              /* while sampling: the sequences so far */
    int remaining;               /* sequences still running */
    uint64_t engine_id;          /* its request's id in the engine */
    struct svc_job *next;        /* in its queue */
} svc_job;

/* A trainer: its tenant's key, its base, the trainer itself and its queue. */
typedef struct svc_tenant {
    char id[32], key_id[32];
    int base;
    trill_svc_trainer *trainer;
    svc_job *head, *tail;
    long served;                 /* tokens run so far (the scheduler runs the least served first) */
    bool running;
} svc_tenant;

/* A sampler: the base model, or the weights a trill:// path named when it was made (the path's
 * version then: a later save under the same name is another version, which this sampler never
 * takes). Its adapter is a cache entry: loaded when needed, dropped when the samplers' adapters
 * pass --max-adapter-mb (least recently used, idle ones), loaded again from dir. */
typedef struct svc_sampler {
    char id[32], key_id[32];
    int base;
    char uri[256];               /* "": the base model */
    char dir[4096];
    int64_t version;
    trill_lora *lora;            /* NULL: the base model, or not loaded now (then only the sampling worker loads it) */
    size_t bytes;                /* of lora */
    uint64_t last_used;
} svc_sampler;

typedef struct svc {
    trill_serve_config cfg;
    svc_store *store;
    trill_svc_base **bases;
    trill_engine **engines;      /* one a base, for sampling */
    int n_bases;
    pthread_mutex_t mu;
    pthread_cond_t work, done;   /* a job was queued; a job finished */
    svc_tenant **tenants;
    int n_tenants;
    svc_sampler **samplers;
    int n_samplers;
    size_t adapter_bytes;        /* trainers' adapters with gradient and moments (refused past --max-adapter-mb) */
    size_t sampler_bytes;        /* samplers' loaded adapters (a cache kept under --max-adapter-mb) */
    svc_job **inflight;          /* every job queued or running, to answer its future */
    int n_inflight;
    svc_job *sample_head, *sample_tail;
    bool stopping;
    pthread_t train_thread, sample_thread;
} svc;

/* ---- jobs.c ---- */
/* Parses and checks a call's body into job j (its key, and the trainer or sampler the caller
 * owns, set); an error's message names the field. */
trill_status svc_job_parse(svc *s, job_kind kind, const json_t *body, svc_job *j);
/* A call's "data" (the wire's datums) for base b, checked for the loss; *tokens counts the
 * tokens forwarded. Free with svc_free_data. */
trill_status svc_parse_data(trill_svc_base *b, trill_svc_loss loss, const json_t *data, trill_svc_datum **out, int *n, long *tokens);
void svc_free_data(trill_svc_datum *data, int n);
/* A call's "loss_fn" and "loss_fn_config". */
trill_status svc_parse_loss(const json_t *body, trill_svc_loss *loss, trill_svc_loss_config *config);
/* A call's "adam_params" (Tinker's defaults for what it leaves out). */
trill_status svc_parse_adam(const json_t *body, trill_svc_adam *p);
/* Queues the job (taken; its id set), logs it as pending; refused when the queue is full. */
trill_status svc_job_submit(svc *s, svc_job *job);
void svc_job_free(svc_job *job);
/* Records the job's outcome (result: JSON text, taken; or the error st with its message) in the
 * request log, then forgets the job (freed) and wakes the long-polls. */
void svc_job_finish(svc *s, svc_job *j, char *result, trill_status st);
/* o as compact JSON text (malloc'ed; o is released), NULL when out of memory. */
char *svc_json_dump(json_t *o);
json_t *svc_json_floats(const float *v, int n);
trill_status svc_workers_start(svc *s);
void svc_workers_stop(svc *s);
/* The future's answer as JSON text (malloc'ed) after waiting up to `wait` seconds; NULL with
 * *status 404 when the caller owns no such request. */
char *svc_future_wait(svc *s, const char *id, const char *key_id, double wait, int *status);

/* ---- sampler.c ---- */
/* The sampling worker's loop (a thread): continuous batching of every sampler's requests in its
 * base's engine, each sampler's adapter in an adapter slot of the engine. */
void *svc_sample_main(void *arg);

/* ---- tenants.c ---- */
/* An error with the code the HTTP answer gives it ("not_found", "limit", "bad_request"), and
 * that code, taken (bad_request when none was set on this thread). */
trill_status svc_fail(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *svc_take_code(void);
/* Lookups that only find the caller's own objects (NULL otherwise). Under s->mu. */
svc_tenant *svc_find_tenant(svc *s, const char *id, const char *key_id);
svc_sampler *svc_find_sampler(svc *s, const char *id, const char *key_id);
int svc_find_base(const svc *s, const char *name);
/* A trill:// URI the caller owns → the directory it names; kind "state" or "sampler". Refuses
 * anything else (another tenant's, a file-system path) with a message. */
trill_status svc_resolve_uri(svc *s, const char *uri, const char *key_id, const char *kind, char *dir, size_t cap, int *base);
/* The version of the weights a path names now (a save under its name makes the next); -1 if none. */
int64_t svc_uri_version(svc *s, const char *uri);
/* Loads sampler p's adapter from its folder (the sampling worker, outside s->mu), refused when
 * its path has been saved again since the sampler was made. */
trill_status svc_sampler_load(svc *s, svc_sampler *p);
/* Creates a trainer (new, or from a state) and records it. */
trill_status svc_tenant_create(svc *s, const char *key_id, const json_t *body, bool from_state, svc_tenant **out);
trill_status svc_sampler_create(svc *s, const char *key_id, const json_t *body, svc_sampler **out);
/* Brings back every trainer and sampler recorded, each trainer at its last snapshot. */
trill_status svc_recover(svc *s);
/* After an optimizer step: the trainer's snapshot (adapter + optimizer), then its record. */
trill_status svc_snapshot(svc *s, svc_tenant *t);
/* STATE/trainers/<id>/<part>/<name> */
void svc_tenant_dir(const svc *s, const char *tenant_id, const char *part, const char *name, char *out, size_t cap);

#endif
