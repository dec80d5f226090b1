/* The server's state, shared by the HTTP side (http.c: routing, authentication, the calls that
 * answer at once) and the work side (jobs.c: the calls that answer a future, their queues and
 * the worker threads). Everything below `mu` is guarded by it. */
#ifndef TRILL_SERVICE_SVC_H
#define TRILL_SERVICE_SVC_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>

#include "rl/run/checkpoint.h"
#include "service/store.h"
#include "trill/infer.h"
#include "trill/service.h"

typedef enum job_kind {
    JOB_FORWARD, JOB_FORWARD_BACKWARD, JOB_OPTIM_STEP, JOB_SAVE_STATE, JOB_SAVE_SAMPLER, JOB_LOAD_STATE,
    JOB_SAMPLE, JOB_LOGPROBS, JOB_N_KINDS
} job_kind;

struct svc_tenant;
struct svc_sampler;

/* A trainer or sampler that is gone: deleted (its record and snapshots too), or released (its
 * key revoked: its record and files stay, and a restart does not bring it back). */
enum { SVC_LIVE, SVC_RELEASED, SVC_DELETED };

/* One call that answers a future: everything it needs, parsed and checked when it was submitted. */
typedef struct svc_job {
    char id[32], key_id[32];
    job_kind kind;
    struct svc_tenant *tenant;   /* training calls */
    struct svc_sampler *sampler; /* sampling calls */
    int base;                    /* the base model of its trainer or sampler */
    long cost;                   /* tokens, for the fair scheduler */
    /* forward, forward_backward */
    trill_svc_datum *data;
    int n_data;
    trill_loss loss;
    trill_svc_loss_config loss_config;
    void *arrays;                /* one block holding the data's arrays */
    /* optim_step */
    trill_svc_adam adam;
    /* save_state, save_weights_for_sampler: the state's name; load_state: its directory */
    char name[72], dir[4096];
    int64_t ttl;                 /* save_*: seconds the saved state lives (0: always) */
    bool with_optimizer;
    /* sample, compute_logprobs */
    int *prompt, prompt_len, num_samples, max_tokens, *stop_ids, n_stop_ids;
    char **stop_strings;
    int n_stop_strings;
    trill_sampling sampling;
    json_t *result;              /* while sampling: the sequences so far */
    int remaining;               /* sequences still running */
    uint64_t engine_id;          /* its request's id in the engine */
    bool prompt_logprobs;        /* sample: the prompt's log-probs too, by a second request (logprobs_id) */
    uint64_t logprobs_id;
    bool logged;                 /* its outcome is in the request log already (committed with what it changed) */
    bool make_sampler;           /* save_weights_for_sampler: a sampler of the weights saved is made (Tinker, no name) */
    char garbage[4096];          /* a folder its commit replaced, removed once it has answered */
    struct svc_job *next;        /* in its queue */
} svc_job;

/* A trainer: its tenant's key, its base, the trainer itself and its queue. */
typedef struct svc_tenant {
    char id[32], key_id[32];
    int base;
    trill_svc_trainer *trainer;
    bool creating;               /* being made: counts against its key's limit; no lookup finds it */
    int64_t step;                /* its committed optimizer step, for GET /trainers (the worker owns the trainer) */
    svc_job *head, *tail;
    long served;                 /* tokens run so far (the scheduler runs the least served first) */
    bool running;
    int gone;                    /* SVC_LIVE, or gone: freed once no call runs on it and no thread pins it */
    int pins;                    /* threads between finding it and deciding its fate (a DELETE) */
    size_t bytes;                /* of adapter memory reserved for it */
    char snapshot[4096], prev[4096]; /* its committed snapshot folder and the one before ("": none) */
    char session[32];            /* the Tinker session it was made in ("": none): deleted when that ends */
} svc_tenant;

/* The weights a trill:// path held at one version, shared by every sampler made from it (one copy
 * in memory however many samplers use it). Loaded while samplers sample; dropped (least recently
 * used, idle ones) when the samplers' adapters pass --max-adapter-mb, loaded again from dir; a
 * later save under the same name is another version, which these weights never become. */
typedef struct svc_weights {
    char uri[256], dir[4096];
    int base;
    int64_t version;
    trill_lora *lora;            /* NULL: not loaded now (only the sampling worker loads it, outside s->mu) */
    size_t bytes;                /* of lora */
    uint64_t last_used;
    int refs;                    /* samplers holding it; at 0 the sampling worker frees it */
} svc_weights;

/* A sampler: the base model, or the weights of a trill:// path. */
typedef struct svc_sampler {
    char id[32], key_id[32];
    int base;
    svc_weights *weights;        /* NULL: the base model */
    int jobs;                    /* its calls queued or running */
    bool creating;               /* being made: counts against its key's limit; no lookup finds it */
    int gone;                    /* SVC_LIVE, or gone: freed once no call of it runs and no thread pins it */
    int pins;
    char session[32];            /* as a trainer's */
    bool ephemeral;              /* made by a Tinker save_weights_for_sampler without a name: its weights go with it */
    char owner[32];              /* ephemeral: the trainer whose weights it samples */
    uint64_t made;               /* ephemeral: s->made when it was made (the oldest go first) */
} svc_sampler;

/* A long-poll waiting for a future (http.c): its connection suspended, resumed when the request
 * finishes or the wait runs out. */
typedef struct svc_waiter {
    struct MHD_Connection *conn;
    char id[32];
    double deadline;
    struct svc_waiter *next;
} svc_waiter;

/* An official Tinker SDK client's session (sessions.c). */
enum { SVC_MAX_SESSIONS = 256 };
typedef struct svc_session {
    char id[32], key_id[32];
    double last_seen;            /* trill_now() of its creation or last heartbeat */
} svc_session;

typedef struct svc {
    trill_serve_config cfg;
    svc_store *store;
    int lock_fd;                 /* STATE/.lock */
    trill_svc_base **bases;
    rl_identity *identities;     /* each base's (every saved folder's manifest names its base's) */
    trill_engine **engines;      /* one a base, for sampling */
    int n_bases;
    pthread_mutex_t mu;
    pthread_cond_t work, done;   /* a job was queued (or samplers' weights are to be freed); a job finished */
    svc_tenant **tenants;
    int n_tenants;
    svc_sampler **samplers;
    int n_samplers;
    svc_weights **weights;
    int n_weights;
    size_t adapter_bytes;        /* trainers' adapters with gradient and moments (refused past --max-adapter-mb) */
    size_t sampler_bytes;        /* samplers' loaded weights (a cache kept under --max-adapter-mb) */
    svc_job **inflight;          /* every job queued or running, to answer its future */
    int n_inflight;
    svc_job *sample_head, *sample_tail;
    svc_waiter *waiters;         /* long-polls, under mu */
    svc_session *sessions;       /* the SDK clients' live sessions, under mu */
    uint64_t made;               /* ephemeral samplers made so far */
    int n_sessions, cap_sessions;
    bool reap;                   /* for the sampling worker: weights to free, or the cache past its size */
    bool stopping;
    pthread_t train_thread, sample_thread;
    trill_svc_mark *mark;        /* the training worker's copy of a trainer before its optimizer step */
} svc;

/* ---- jobs.c ---- */
/* Parses and checks a call's body into job j (its key, and the trainer or sampler the caller
 * owns, set); an error's message names the field. */
trill_status trill_svc_job_parse(svc *s, job_kind kind, const json_t *body, svc_job *j);
/* A call's "data" (the wire's datums) for base b, checked for the loss; *tokens counts the
 * tokens forwarded. Free with trill_svc_free_data. */
trill_status trill_svc_parse_data(trill_svc_base *b, trill_loss loss, const json_t *data, trill_svc_datum **out, int *n, long *tokens);
void trill_svc_free_data(trill_svc_datum *data, int n);
/* A call's "loss_fn" and "loss_fn_config". */
trill_status trill_svc_parse_loss(const json_t *body, trill_loss *loss, trill_svc_loss_config *config);
/* A call's "adam_params" (Tinker's defaults for what it leaves out). */
trill_status trill_svc_parse_adam(const json_t *body, trill_svc_adam *p);
/* Logs the job (taken; its id and base set) as pending and queues it on its target, the caller's
 * trainer (or sampler) `target`, found again now; refused when that is gone or the queue is full
 * (then the log forgets it). */
trill_status trill_svc_job_submit(svc *s, svc_job *job, const char *target, bool trainer);
void trill_svc_job_free(svc_job *job);
/* Records the job's outcome (result: JSON text, taken; or the error st with its message) in the
 * request log (unless j->logged), then forgets the job (freed) and wakes its long-polls. An error
 * takes its code from trill_svc_take_code when one was set ("failed" otherwise). */
void trill_svc_job_finish(svc *s, svc_job *j, char *result, trill_status st);
/* Under s->mu: tenant t's (or sampler p's) queued jobs, taken out of their queue (a list through
 * next). Then, outside it, trill_svc_fail_jobs finishes them with the error "gone" and `why`. */
svc_job *trill_svc_take_queued(svc *s, struct svc_tenant *t, struct svc_sampler *p);
void trill_svc_fail_jobs(svc *s, svc_job *jobs, const char *why);
/* o as compact JSON text (malloc'ed; o is released), NULL when out of memory. */
char *trill_svc_json_dump(json_t *o);
json_t *trill_svc_json_floats(const float *v, int n);
trill_status trill_svc_workers_start(svc *s);
void trill_svc_workers_stop(svc *s);
/* A request as the log has it: its kind (KIND_NAMES, or create_model, unload_model), status
 * (pending, done, error) and result (JSON text, malloc'ed; NULL while pending). False when the
 * caller (key_id) owns no such request. */
typedef struct svc_request { char kind[32], status[16]; char *result; } svc_request;
bool trill_svc_request_read(svc *s, const char *id, const char *key_id, svc_request *out);
/* A request that finished as it was made (create_model, unload_model): logged done with its
 * result; *id its new request id. */
trill_status trill_svc_record_done(svc *s, const char *key_id, const char *target, const char *kind, const char *result, char id[32]);
/* Under s->mu: request id is queued or running. */
bool trill_svc_inflight(svc *s, const char *id);
/* The future's answer now as JSON text (malloc'ed), *status 200 and *pending when it is not
 * finished; NULL with *status 404 when the caller owns no such request (500: out of memory). */
char *trill_svc_future_answer(svc *s, const char *id, const char *key_id, int *status, bool *pending);

/* ---- tinker.c ---- */
/* A Tinker ForwardBackwardRequest (protobuf bytes) as trill's forward(_backward) job body
 * {loss_fn, loss_fn_config, data} (*body, new), with its model_id and forward_only; a refusal
 * names the field (code bad_request). */
trill_status trill_tinker_forward_request(const void *bytes, size_t n, json_t **body, char model[32], bool *forward_only);

/* ---- http.c ---- */
/* Under s->mu: the long-polls waiting for request id answer now. */
void trill_svc_wake_waiters(svc *s, const char *id);

/* ---- sampler.c ---- */
/* The sampling worker's loop (a thread): continuous batching of every sampler's requests in its
 * base's engine, each sampler's adapter in an adapter slot of the engine. */
void *trill_svc_sample_main(void *arg);

/* ---- sessions.c ---- */
/* A new session of the caller's from a create_session body (checked: the field is named); *id. */
trill_status trill_svc_session_create(svc *s, const char *key_id, const json_t *body, char id[32]);
/* A heartbeat {"session_id"} of one of the caller's live sessions (else not_found). */
trill_status trill_svc_session_heartbeat(svc *s, const char *key_id, const json_t *body);
/* The caller's live sessions' ids, from offset, at most limit (a new JSON array). */
json_t *trill_svc_sessions_json(svc *s, const char *key_id, long limit, long offset);
/* {training_run_ids, sampler_ids} of one of the caller's live sessions; NULL when it has none. */
json_t *trill_svc_session_json(svc *s, const char *id, const char *key_id);
/* Under s->mu: whether session id is one of key_id's live ones. */
bool trill_svc_session_live(svc *s, const char *id, const char *key_id);
/* Deletes the trainers and samplers made in sessions that have ended (the watchdog's, every 2 s):
 * what a client that stopped sending heartbeats held is freed; its saved states stay. */
void trill_svc_sessions_reap(svc *s);

/* ---- tenants.c ---- */
/* An error with the code the HTTP answer gives it ("not_found", "limit", "bad_request", "gone"),
 * and that code, taken (NULL when none was set on this thread). */
trill_status trill_svc_fail(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *trill_svc_take_code(void);
/* Lookups that only find the caller's own objects, live ones (NULL otherwise). Under s->mu. */
svc_tenant *trill_svc_find_tenant(svc *s, const char *id, const char *key_id);
svc_sampler *trill_svc_find_sampler(svc *s, const char *id, const char *key_id);
int trill_svc_find_base(const svc *s, const char *name);
/* A trill:// URI the caller owns → the directory it names; kind "state" or "sampler". Refuses
 * anything else (another tenant's, a file-system path) with a message. */
trill_status trill_svc_resolve_uri(svc *s, const char *uri, const char *key_id, const char *kind, char *dir, size_t cap, int *base);
/* The version of the weights a path names now (a save under its name makes the next); -1 if none. */
int64_t trill_svc_uri_version(svc *s, const char *uri);
/* Loads weights w from their folder (the sampling worker, outside s->mu), refused when their path
 * has been saved again since they were taken. */
trill_status trill_svc_weights_load(svc *s, svc_weights *w);
/* Creates a trainer (new, or from a state: then its first snapshot is a copy of that state) and
 * records it; the key's limit and the adapter memory are checked and taken atomically. */
trill_status trill_svc_tenant_create(svc *s, const char *key_id, const json_t *body, bool from_state, svc_tenant **out);
trill_status trill_svc_sampler_create(svc *s, const char *key_id, const json_t *body, svc_sampler **out);
/* DELETE: the caller's trainer or sampler — its queued calls fail ("gone"), its record goes, its
 * memory and snapshots are freed (after its running call, if one runs). Its saved states stay. */
trill_status trill_svc_tenant_delete(svc *s, const char *id, const char *key_id);
trill_status trill_svc_sampler_delete(svc *s, const char *id, const char *key_id);
/* Under s->mu: frees tenant t (unlinked; not running) with its adapter memory; with `files` its
 * snapshots too. */
void trill_svc_tenant_release(svc *s, svc_tenant *t, bool files);
/* Under s->mu: frees sampler p (unlinked; no calls), dropping its hold on its weights. */
void trill_svc_sampler_release(svc *s, svc_sampler *p);
/* Under s->mu: a gone trainer or sampler that nothing runs or pins any more is unlinked and freed. */
void trill_svc_tenant_settle(svc *s, svc_tenant *t);
void trill_svc_sampler_settle(svc *s, svc_sampler *p);
/* Releases the trainers and samplers of keys revoked since (their records and files stay; a
 * restart does not bring them back). */
void trill_svc_release_revoked(svc *s);

/* ---- tinker_runs.c ---- */
/* Deletes the caller's saved state `uri` (trill://): refused while a sampler samples from it;
 * weights cached from it are never matched again; its row, then its folder. */
trill_status trill_svc_delete_state(svc *s, const char *uri, const char *key_id);
/* Deletes sampler id and, when it was ephemeral, the weights it sampled (uri). */
void trill_svc_retire_sampler(svc *s, const char *id, const char *key_id, bool ephemeral, const char *uri);
/* Deletes the saved states whose ttl_seconds have passed (the watchdog's, every 2 s); one a
 * sampler still samples from waits until it does not. */
void trill_svc_expire_states(svc *s);

/* ---- state.c: the state folder ---- */
/* STATE: made, locked for this process (one server a state folder), owner-only modes, and what
 * a crash left (temporary and orphaned folders) removed. */
trill_status trill_svc_state_open(svc *s);
/* The saved folder was written for base b: its manifest verifies (a folder of an earlier trill,
 * without one, is taken as it is). */
trill_status trill_svc_verify_folder(const svc *s, int b, const char *dir);
/* Brings back every trainer (at its newest complete snapshot, saying so when it falls back) and
 * sampler recorded, but those of revoked keys. */
trill_status trill_svc_recover(svc *s);
/* Writes trainer tr's state (with `optimizer` its AdamW state; `base` its base's index) as
 * STATE/trainers/<tenant_id>/<part>/<name>:
 * a temporary folder, every file synced, modes 0700/0600, then renamed into place — whole or
 * absent after a crash. */
trill_status trill_svc_write_folder(svc *s, const trill_svc_trainer *tr, int base, const char *tenant_id, const char *part, const char *name,
                              bool optimizer, char *dir, size_t cap);
/* The weights entry of (uri, version) of base b, made (not loaded) when there is none; NULL when
 * out of memory. Under s->mu, or before the workers start. */
svc_weights *trill_svc_weights_for(svc *s, const char *uri, int64_t version, const char *dir, int b);
/* The transactions of the training calls that change durable state, each recording job j's
 * result in the request log with what it changed (j->logged): an optimizer step (the trainer's
 * snapshot; a failed snapshot puts the trainer back as it was), a load (the loaded state becomes
 * the trainer's, with its snapshot), a save (the state folder at its next version). *result takes
 * the answer's JSON text. */
trill_status trill_svc_commit_step(svc *s, svc_tenant *t, svc_job *j, char **result);
trill_status trill_svc_commit_load(svc *s, svc_tenant *t, svc_job *j, char **result);
trill_status trill_svc_commit_save(svc *s, svc_tenant *t, svc_job *j, char **result);
/* STATE/trainers/<id>/<part>/<name> */
void trill_svc_tenant_dir(const svc *s, const char *tenant_id, const char *part, const char *name, char *out, size_t cap);

#endif
