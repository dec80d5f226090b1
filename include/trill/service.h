/* The post-training service (docs/service.md): `trill serve`'s server, and the tenant trainer it
 * runs, usable in-process on its own.
 *
 * A tenant trainer is one user's LoRA adapter and AdamW state on a shared base model: the base is
 * loaded once (trill_svc_base) and every trainer attaches its adapter to it for the length of a
 * call, so N trainers cost one base plus N adapters. Its calls are Tinker's: forward,
 * forward_backward (gradients accumulate until the next optimizer step), optim_step, save and
 * load. The losses are Tinker's, summed over tokens (docs/service.md). Not thread-safe: the
 * service runs every trainer of a base on one worker thread. */
#ifndef TRILL_SERVICE_H
#define TRILL_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trill/error.h"
#include "trill/lora.h"
#include "trill/loss.h"
#include "trill/model.h"

/* A resident base model: its weights (in the checkpoint's dtype) and tokenizer, served under
 * `name` (NULL: the folder's last component). */
typedef struct trill_svc_base trill_svc_base;
trill_status trill_svc_base_load(const char *dir, const char *name, trill_svc_base **out);
void trill_svc_base_free(trill_svc_base *b);
const char *trill_svc_base_name(const trill_svc_base *b);
const char *trill_svc_base_dir(const trill_svc_base *b);
trill_model *trill_svc_base_model(trill_svc_base *b);
const struct trill_tokenizer *trill_svc_base_tokenizer(const trill_svc_base *b); /* NULL without tokenizer.json */
/* Its chat template (tokenizer_config.json's, read once at load), or NULL with *why: none, or one
 * trill does not render (named). */
const struct trill_chat_template *trill_svc_base_chat(const trill_svc_base *b, const char **why);

/* The losses (loss_fn) are the table's marked TRILL_LOSS_IN_SERVE (trill/loss.h). */

typedef struct trill_svc_loss_config {
    double clip_low, clip_high; /* ppo, cispo: ratio bounds (0.8, 1.2) */
    double beta;                /* dro (no default: NAN until set) */
} trill_svc_loss_config;
trill_svc_loss_config trill_svc_loss_config_default(void);

/* One sequence of a call: n input tokens; position i is scored on targets[i], any token (the
 * next input token for ordinary training, another for distillation or a made-up target; a target
 * with weight 0 costs nothing), or on k targets (top-k distillation). The per-token arrays [n]
 * are NULL when absent: weights (default
 * 1), logprobs (the sampler's, needed by every loss but cross_entropy), advantages (likewise);
 * routed_experts [n][n_moe_layers][top_k] logical ids replays the sampler's routing. */
typedef struct trill_svc_datum {
    int n;
    int k;                       /* targets a position (0 or 1: one); k > 1: top-k targets, targets and weights
                                    [n][k], log-probs reported [n][k] (cross_entropy only; one k a call) */
    const int *tokens, *targets;
    const float *weights, *logprobs, *advantages;
    const uint16_t *routed_experts;
} trill_svc_datum;

/* Checks a datum against the base and the loss (names the datum, the array and the position). */
trill_status trill_svc_datum_check(const trill_svc_base *b, trill_loss loss, const trill_svc_datum *d, int index);

typedef struct trill_svc_trainer trill_svc_trainer;

typedef struct trill_svc_trainer_config {
    int rank;          /* LoRA rank (alpha = 32 as Tinker's) */
    uint64_t seed;     /* the adapters' A */
    bool train_mlp, train_attn, train_unembed;
} trill_svc_trainer_config;

trill_status trill_svc_trainer_create(trill_svc_base *b, const trill_svc_trainer_config *c, trill_svc_trainer **out);
/* A trainer from a state written by trill_svc_trainer_save (DIR: the adapter and, with
 * `optimizer`, the AdamW moments and step; without, a fresh optimizer at step 0). */
trill_status trill_svc_trainer_load(trill_svc_base *b, const char *dir, bool optimizer, trill_svc_trainer **out);
void trill_svc_trainer_free(trill_svc_trainer *t);
const trill_svc_trainer_config *trill_svc_trainer_get_config(const trill_svc_trainer *t);
int64_t trill_svc_trainer_step(const trill_svc_trainer *t); /* optimizer steps taken */
trill_lora *trill_svc_trainer_lora(trill_svc_trainer *t);
/* The gradient accumulated since the last optimizer step (*n floats, laid out as the adapter). */
const float *trill_svc_trainer_grads(const trill_svc_trainer *t, size_t *n);

/* The loss over n data and, with `backward`, its gradient added to the trainer's. logprobs
 * (sum of the data's n) takes each target's log-probability, data after data; *loss the sum. */
trill_status trill_svc_forward(trill_svc_trainer *t, const trill_svc_datum *data, int n, trill_loss loss,
                               const trill_svc_loss_config *config, bool backward, float *logprobs, double *loss_sum);

typedef struct trill_svc_adam {
    double learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm; /* Tinker's AdamParams */
} trill_svc_adam;
trill_svc_adam trill_svc_adam_default(void); /* 1e-4, 0.9, 0.95, 1e-12, 0, 0 (no clipping) */

/* Clips the accumulated gradient (grad_clip_norm > 0), one AdamW step, gradient cleared.
 * *grad_norm: its norm before clipping. */
trill_status trill_svc_optim_step(trill_svc_trainer *t, const trill_svc_adam *p, double *grad_norm);

/* Writes DIR (made if missing): the PEFT adapter, trill_service.json (rank, seed, targets, step)
 * and with `optimizer` the AdamW state. Every file atomically. */
trill_status trill_svc_trainer_save(const trill_svc_trainer *t, const char *dir, bool optimizer);
/* Replaces the trainer's adapter (and with `optimizer` its optimizer) by DIR's; the gradient is cleared. */
trill_status trill_svc_trainer_restore(trill_svc_trainer *t, const char *dir, bool optimizer);
/* restore in two halves: a new trainer holding DIR's state in t's shape (refused when its rank or
 * modules differ; without `optimizer` a fresh optimizer), t unchanged; then t takes src's adapter
 * and optimizer (src is freed) and its gradient is cleared. */
trill_status trill_svc_trainer_load_like(const trill_svc_trainer *t, const char *dir, bool optimizer, trill_svc_trainer **out);
void trill_svc_trainer_adopt(trill_svc_trainer *t, trill_svc_trainer *src);

/* A copy of what an optimizer step changes — the adapter's values, the AdamW moments, step and
 * settings, and the gradient — which rewind puts back exactly (it cannot fail): a step whose
 * result could not be saved is undone. *mark is made when NULL, else reused (grown when t is
 * larger), so one kept mark costs its memory once, not a fresh allocation every step. */
typedef struct trill_svc_mark trill_svc_mark;
trill_status trill_svc_trainer_mark(trill_svc_trainer *t, trill_svc_mark **mark);
void trill_svc_trainer_rewind(trill_svc_trainer *t, const trill_svc_mark *m);
void trill_svc_mark_free(trill_svc_mark *m);

/* ---- the server ---- */

typedef struct trill_serve_config {
    const char *const *model_dirs; /* base models, one resident copy each */
    const char *const *model_names; /* the name each is served under (NULL, or a NULL entry: its folder's last component) */
    int n_models;
    const char *state_dir;         /* SQLite database, saved states, snapshots */
    const char *host;              /* "127.0.0.1" */
    int port;                      /* 0: any free port (reported through *bound_port) */
    size_t max_body_bytes;
    int max_trainers_per_key, max_samplers_per_key, max_queued;
    size_t max_adapter_bytes;      /* adapters resident for trainers (with gradient and optimizer) and samplers */
    int max_connections;           /* open at once (each a file descriptor; long-polls hold no thread) */
    int max_client_connections;    /* open at once from one address */
    double request_timeout;        /* seconds a request's headers, and then its body, may take to arrive */
    double session_timeout;        /* seconds an official-SDK client's session lives after its last heartbeat */
    const char *port_file;         /* when set, the bound port is written there once listening */
} trill_serve_config;
trill_serve_config trill_serve_config_default(void);

/* Serves until *stop becomes true (a signal handler's flag) or, with max_seconds > 0, that many
 * seconds have passed. */
trill_status trill_serve(const trill_serve_config *c, volatile int *stop, double max_seconds);

/* The server's route table, entry i (0, 1, ... until it returns false): its METHOD, its path under
 * /api/v1 ("{name}" a path segment, e.g. /trainers/{trainer_id}/forward) and whether it needs a
 * key (every route but the health check). `trill serve --print-routes` prints it. */
bool trill_serve_route(int i, const char **method, const char **path, bool *authenticated);

/* When the database holds no key yet, trill_serve makes one named "default" and writes it to
 * STATE/default.key (readable by its owner only), so a first server is usable at once. */
/* API keys, kept hashed (SHA-256) in STATE/trill.db. add: a new key for `name`, its text in
 * *key (malloc'ed, shown once). list: one line per key (id, name, created, revoked) to `out`. */
trill_status trill_serve_key_add(const char *state_dir, const char *name, char **key);
trill_status trill_serve_key_list(const char *state_dir, char **out);
trill_status trill_serve_key_revoke(const char *state_dir, const char *name_or_id);

#endif
