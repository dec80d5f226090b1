/* trill_client: the C client of trill serve (docs/service.md), with the calls of the Python SDK
 * (clients/python, Tinker's names) as functions prefixed trillc_.
 *
 * Conventions, for every function below that returns int:
 *   - 0 is success, -1 an error; after -1, trillc_last_error() says what failed. The error is
 *     per thread (threads sharing a client see their own) and is kept until the thread's next
 *     failure: successful calls leave it alone.
 *   - Out parameters are written only on success. Whatever the library allocates for the caller
 *     is released with trillc_free (plain arrays and strings) or the result's own _free function.
 *   - Ids (trainer, sampler, request) are NUL-terminated strings of fewer than TRILLC_ID_SIZE
 *     bytes, written into caller-provided buffers of that size; paths likewise with TRILLC_PATH_SIZE.
 *   - Calls that do work on a trainer or a sampler return a trillc_future at once; its result is
 *     fetched with trillc_future_wait or one of the typed trillc_wait_* helpers, as often as
 *     wanted (the server keeps results).
 *
 * A client is immutable after trillc_open and each call uses its own HTTP connection, so one
 * client may be used from many threads at once. Link with libcurl, jansson and pthreads. */
#ifndef TRILL_CLIENT_H
#define TRILL_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { TRILLC_ID_SIZE = 64, TRILLC_PATH_SIZE = 512 };

typedef struct trillc_client trillc_client;

/* code: the server's (bad_request, unauthorized, not_found, too_large, limit, server_restarted,
 * failed, internal), or the client's own: "unreachable" (no HTTP answer: refused, reset, timed
 * out) and "timeout" (trillc_future_wait's timeout ran out while the work was still pending).
 * http_status: the answer's HTTP status; 0 when there was none, or for the error of a future's
 * work (its poll itself answered 200). */
typedef struct {
    char code[32];
    char message[512];
    long http_status;
} trillc_error;

const trillc_error *trillc_last_error(void);

/* NULL base_url: $TRILL_BASE_URL, else http://127.0.0.1:8100. NULL api_key: $TRILL_API_KEY
 * (none: requests go without a key). NULL only if out of memory. */
trillc_client *trillc_open(const char *base_url, const char *api_key);
void trillc_close(trillc_client *c);
void trillc_free(void *p);

/* ---- models ---- */

typedef struct {
    char name[128], architecture[64];
    int vocab_size, n_moe_layers, experts_per_token, num_experts, max_lora_rank;
    bool has_tokenizer;
} trillc_model;

/* ServiceClient.get_server_capabilities: the served base models (*models: trillc_free). */
int trillc_list_models(trillc_client *c, trillc_model **models, int *n);
/* Tokenizer.encode / decode, run by the server (*tokens, *text: trillc_free). */
int trillc_tokenize(trillc_client *c, const char *model, const char *text, bool add_special_tokens, int **tokens, int *n);
int trillc_detokenize(trillc_client *c, const char *model, const int *tokens, int n, char **text);

/* ---- trainers ---- */

typedef struct {
    char request_id[TRILLC_ID_SIZE];
} trillc_future;

/* rank <= 0: the server's default (32); seed < 0: the server picks one. */
int trillc_create_lora_training_client(trillc_client *c, const char *base_model, int rank, long long seed, bool train_mlp,
                                       bool train_attn, bool train_unembed, char trainer_id[TRILLC_ID_SIZE]);
/* A new trainer with a saved state's weights, and with_optimizer its moments and step. */
int trillc_create_training_client_from_state(trillc_client *c, const char *path, bool with_optimizer, char trainer_id[TRILLC_ID_SIZE]);

typedef struct {
    char trainer_id[TRILLC_ID_SIZE], base_model[128];
    int rank;
    long step;
    long long seed;
    bool train_mlp, train_attn, train_unembed;
} trillc_trainer_info;

int trillc_get_info(trillc_client *c, const char *trainer_id, trillc_trainer_info *info);

/* One sequence. Every array but tokens is optional (NULL: not sent) and has n entries, except
 * routed_experts: n_routed_experts = n x n_moe_layers x experts_per_token logical expert ids.
 * target_tokens[i] must be tokens[i + 1] for i < n - 1. */
typedef struct {
    const int *tokens;
    int n;
    const int *target_tokens;
    const float *weights, *logprobs, *advantages;
    const int *routed_experts;
    int n_routed_experts;
} trillc_datum;

/* loss_fn: cross_entropy, importance_sampling, ppo, cispo or dro; loss_fn_config_json: a JSON
 * object such as {"beta": 0.1}, or NULL. forward leaves the gradient alone; forward_backward adds
 * the loss's gradient to the trainer's. Result: trillc_wait_forward. */
int trillc_forward(trillc_client *c, const char *trainer_id, const trillc_datum *data, int n, const char *loss_fn,
                   const char *loss_fn_config_json, trillc_future *f);
int trillc_forward_backward(trillc_client *c, const char *trainer_id, const trillc_datum *data, int n, const char *loss_fn,
                            const char *loss_fn_config_json, trillc_future *f);

typedef struct {
    double learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm;
} trillc_adam;

trillc_adam trillc_adam_default(void); /* Tinker's: 1e-4, 0.9, 0.95, 1e-12, 0, 0 (no clipping) */
/* One AdamW step on the accumulated gradient, which it clears. Result: trillc_wait_optim. */
int trillc_optim_step(trillc_client *c, const char *trainer_id, const trillc_adam *adam, trillc_future *f);
/* name: 1 to 64 of [A-Za-z0-9._-]. Result: trillc_wait_path (a trill:// path). */
int trillc_save_state(trillc_client *c, const char *trainer_id, const char *name, trillc_future *f);
int trillc_save_weights_for_sampler(trillc_client *c, const char *trainer_id, const char *name, trillc_future *f);
/* Result: trillc_wait_load (the trainer's step after loading). */
int trillc_load_state(trillc_client *c, const char *trainer_id, const char *path, bool with_optimizer, trillc_future *f);

/* ---- samplers ---- */

/* Exactly one of model_path (from save_weights_for_sampler) and base_model is non-NULL. */
int trillc_create_sampling_client(trillc_client *c, const char *model_path, const char *base_model, char sampler_id[TRILLC_ID_SIZE]);

/* DELETE a trainer (its adapter, optimizer and snapshots; the states it saved stay) or a sampler;
 * their queued calls then fail with "gone". */
int trillc_delete_trainer(trillc_client *c, const char *trainer_id);
int trillc_delete_sampler(trillc_client *c, const char *sampler_id);

/* Stops: token ids or strings, not both (none: the model's end-of-sequence tokens). */
typedef struct {
    int max_tokens;  /* <= 0: the server's default (16) */
    long long seed;  /* < 0: a fresh random seed */
    double temperature, top_p;
    int top_k;       /* -1 or 0: off */
    const int *stop_tokens;
    int n_stop_tokens;
    const char *const *stop_strings;
    int n_stop_strings;
} trillc_sampling;

trillc_sampling trillc_sampling_default(void); /* 16 tokens, random seed, temperature 1, no top-k/p, no stops */
/* num_samples sequences continuing prompt (sampling NULL: the defaults). Result: trillc_wait_sample. */
int trillc_sample(trillc_client *c, const char *sampler_id, const int *prompt, int n, int num_samples, const trillc_sampling *sampling,
                  trillc_future *f);
/* Each prompt token's log-probability at temperature 1. Result: trillc_wait_logprobs. */
int trillc_compute_logprobs(trillc_client *c, const char *sampler_id, const int *prompt, int n, trillc_future *f);

/* ---- futures ---- */

/* Long-polls until the future is done (timeout_s < 0: without limit; 0: asks once) and gives
 * its result as JSON text (*result_json: trillc_free). Work that failed is an error with the
 * server's code (failed, server_restarted, ...); a server that cannot be reached is asked again
 * a few times, with pauses, in case it is restarting. */
int trillc_future_wait(trillc_client *c, const trillc_future *f, double timeout_s, char **result_json);

/* forward / forward_backward: loss is the loss's sum; logprobs[d] has lengths[d] entries, the
 * trainer's log-probability of each of datum d's targets. */
typedef struct {
    double loss;
    int n_outputs;
    float **logprobs;
    int *lengths;
} trillc_forward_result;

typedef struct {
    long step;
    double grad_norm, learning_rate;
} trillc_optim_result;

/* One sampled sequence: the generated tokens (the stop token included), the log-probability of
 * each as drawn, and the routing of every token that went through a forward (the prompt's and
 * the generated ones but the last): (n_prompt + n_tokens - 1) x n_moe_layers x experts_per_token. */
typedef struct {
    int n_tokens;
    int *tokens;
    float *logprobs;
    char stop_reason[16]; /* "stop" or "length" */
    int n_routed_experts;
    int *routed_experts;
} trillc_sequence;

typedef struct {
    int n_sequences;
    trillc_sequence *sequences;
} trillc_sample_result;

int trillc_wait_forward(trillc_client *c, const trillc_future *f, double timeout_s, trillc_forward_result *out);
int trillc_wait_optim(trillc_client *c, const trillc_future *f, double timeout_s, trillc_optim_result *out);
/* save_state, save_weights_for_sampler: the saved state's trill:// path. */
int trillc_wait_path(trillc_client *c, const trillc_future *f, double timeout_s, char path[TRILLC_PATH_SIZE]);
int trillc_wait_load(trillc_client *c, const trillc_future *f, double timeout_s, long *step);
int trillc_wait_sample(trillc_client *c, const trillc_future *f, double timeout_s, trillc_sample_result *out);
/* compute_logprobs: n entries, one a prompt token; the first is NaN (the protocol's null). *logprobs: trillc_free. */
int trillc_wait_logprobs(trillc_client *c, const trillc_future *f, double timeout_s, float **logprobs, int *n);

void trillc_forward_result_free(trillc_forward_result *r);
void trillc_sample_result_free(trillc_sample_result *r);

#ifdef __cplusplus
}
#endif

#endif
