/* The C client (clients/c/trill_client.h) against a running trill serve whose models include
 * "tiny" (a 128-token vocabulary with a tokenizer): every call, and the errors' codes.
 *
 * Usage: c_client_check BASE_URL KEY   (prints one line per check; exits 1 at the first failure;
 * every wait is bounded) */
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "trill_client.h"

enum { MAX_TOKENS = 256 };
static const double DEADLINE_S = 120; /* any one future */
static const char *const TEXT = "12+34=46";

static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    if (!ok) exit(1);
}

/* A call that must succeed: its failure ends the check with the client's error. */
static void must(int rc, const char *what) {
    if (rc == 0) return;
    const trillc_error *e = trillc_last_error();
    check(0, "%s: %s (HTTP %ld): %s", what, e->code, e->http_status, e->message);
}

/* A call that must fail with code (and, when given, HTTP status and a part of the message). */
static void must_fail(int rc, const char *what, const char *code, long status, const char *in_message) {
    const trillc_error *e = trillc_last_error();
    if (rc == 0) check(0, "%s: succeeded, expected %s (HTTP %ld)", what, code, status);
    check(strcmp(e->code, code) == 0 && e->http_status == status && (!in_message || strstr(e->message, in_message)),
          "%s: %s (HTTP %ld): %s", what, e->code, e->http_status, e->message);
}

static double sum_floats(const float *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}

static double larger(double a, double b) { return a > b ? a : b; } /* fmax needs libm, which the build need not link */

static int close_to(double a, double b, double rel) { return fabs(a - b) <= rel * larger(1.0, larger(fabs(a), fabs(b))); }

static int same_sequences(const trillc_sample_result *a, const trillc_sample_result *b) {
    if (a->n_sequences != b->n_sequences) return 0;
    for (int i = 0; i < a->n_sequences; i++) {
        const trillc_sequence *x = &a->sequences[i], *y = &b->sequences[i];
        if (x->n_tokens != y->n_tokens || x->n_routed_experts != y->n_routed_experts || strcmp(x->stop_reason, y->stop_reason) != 0 ||
            memcmp(x->tokens, y->tokens, sizeof(int) * (size_t)x->n_tokens) != 0 ||
            memcmp(x->logprobs, y->logprobs, sizeof(float) * (size_t)x->n_tokens) != 0 ||
            memcmp(x->routed_experts, y->routed_experts, sizeof(int) * (size_t)x->n_routed_experts) != 0)
            return 0;
    }
    return 1;
}

/* A forward (or forward_backward) of data, waited for. */
static trillc_forward_result run_forward(trillc_client *c, const char *trainer, bool backward, const trillc_datum *data, int n,
                                         const char *loss_fn, const char *config, const char *what) {
    trillc_future f;
    trillc_forward_result r;
    must((backward ? trillc_forward_backward : trillc_forward)(c, trainer, data, n, loss_fn, config, &f), what);
    must(trillc_wait_forward(c, &f, DEADLINE_S, &r), what);
    check(r.n_outputs == n && r.lengths[0] == data[0].n && isfinite(r.loss), "%s: %d outputs of %d log-probs, loss %.6f", what, r.n_outputs,
          r.lengths[0], r.loss);
    return r;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: c_client_check BASE_URL KEY\n");
        return 2;
    }
    trillc_client *c = trillc_open(argv[1], argv[2]);
    must(c == NULL, "trillc_open");

    /* models, tokenizer */
    trillc_model *models;
    int n_models, tiny = -1;
    must(trillc_list_models(c, &models, &n_models), "list_models");
    for (int i = 0; i < n_models; i++)
        if (strcmp(models[i].name, "tiny") == 0) tiny = i;
    check(tiny >= 0 && models[tiny].vocab_size == 128 && models[tiny].has_tokenizer, "list_models: tiny, 128 tokens, with a tokenizer");
    const int experts_per_row = models[tiny].n_moe_layers * models[tiny].experts_per_token;
    trillc_free(models);

    int *toks, n;
    char *text;
    must(trillc_tokenize(c, "tiny", TEXT, false, &toks, &n), "tokenize");
    must(trillc_detokenize(c, "tiny", toks, n, &text), "detokenize");
    check(n >= 4 && n < MAX_TOKENS && strcmp(text, TEXT) == 0, "tokenize/detokenize: \"%s\" -> %d tokens -> \"%s\"", TEXT, n, text);
    trillc_free(text);

    /* a trainer: cross-entropy, one step, lower loss */
    char trainer[TRILLC_ID_SIZE];
    trillc_trainer_info info;
    must(trillc_create_lora_training_client(c, "tiny", 8, 0, true, true, false, trainer), "create_lora_training_client");
    must(trillc_get_info(c, trainer, &info), "get_info");
    check(strcmp(info.trainer_id, trainer) == 0 && strcmp(info.base_model, "tiny") == 0 && info.rank == 8 && info.step == 0 &&
              info.seed == 0 && info.train_mlp && info.train_attn && !info.train_unembed,
          "create_lora_training_client: %s, rank %d, step %ld", trainer, info.rank, info.step);

    float weights[MAX_TOKENS], advantages[MAX_TOKENS];
    for (int i = 0; i < n - 1; i++) weights[i] = 1, advantages[i] = i % 2 ? -0.5f : 1.25f;
    const trillc_datum sft = { .tokens = toks, .n = n - 1, .target_tokens = toks + 1, .weights = weights };
    trillc_forward_result before = run_forward(c, trainer, true, &sft, 1, "cross_entropy", NULL, "forward_backward cross_entropy");
    check(before.loss > 0 && close_to(before.loss, -sum_floats(before.logprobs[0], n - 1), 1e-5),
          "forward_backward: loss %.6f = -sum of its log-probs", before.loss);

    trillc_future f;
    trillc_optim_result step;
    trillc_adam adam = trillc_adam_default();
    adam.learning_rate = 0.02;
    must(trillc_optim_step(c, trainer, &adam, &f), "optim_step");
    must(trillc_wait_optim(c, &f, DEADLINE_S, &step), "optim_step's result");
    check(step.step == 1 && step.grad_norm > 0 && isfinite(step.grad_norm) && step.learning_rate == 0.02, "optim_step: step %ld, grad_norm %.6g",
          step.step, step.grad_norm);
    char *raw;
    must(trillc_future_wait(c, &f, DEADLINE_S, &raw), "future_wait again");
    check(strstr(raw, "\"step\":1") != NULL, "future_wait: a done future again, as JSON: %s", raw);
    trillc_free(raw);

    trillc_forward_result after = run_forward(c, trainer, false, &sft, 1, "cross_entropy", NULL, "forward cross_entropy");
    check(after.loss < before.loss, "forward after a step at lr 0.02: loss %.6f -> %.6f", before.loss, after.loss);

    /* RL losses with the current log-probs as the sampler's: the ratio is exactly 1 */
    const trillc_datum rl = { .tokens = toks, .n = n - 1, .target_tokens = toks + 1, .logprobs = after.logprobs[0], .advantages = advantages };
    trillc_forward_result is = run_forward(c, trainer, false, &rl, 1, "importance_sampling", NULL, "forward importance_sampling");
    check(close_to(is.loss, -sum_floats(advantages, n - 1), 1e-6), "importance_sampling: loss %.6f = -sum A (ratio 1)", is.loss);
    double lp_a = 0;
    for (int i = 0; i < n - 1; i++) lp_a += (double)after.logprobs[0][i] * advantages[i];
    trillc_forward_result dro = run_forward(c, trainer, false, &rl, 1, "dro", "{\"beta\": 0.5}", "forward dro {beta: 0.5}");
    check(close_to(dro.loss, -lp_a, 1e-5), "dro with loss_fn_config: loss %.6f = -sum lp A", dro.loss);
    trillc_forward_result_free(&is);
    trillc_forward_result_free(&dro);

    /* saves, a trainer from the state, load_state */
    char state[TRILLC_PATH_SIZE], weights_path[TRILLC_PATH_SIZE], trainer2[TRILLC_ID_SIZE];
    must(trillc_save_state(c, trainer, "c-check", &f), "save_state");
    must(trillc_wait_path(c, &f, DEADLINE_S, state), "save_state's result");
    check(strncmp(state, "trill://", 8) == 0 && strstr(state, "/c-check"), "save_state: %s", state);
    must(trillc_save_weights_for_sampler(c, trainer, "c-check", &f), "save_weights_for_sampler");
    must(trillc_wait_path(c, &f, DEADLINE_S, weights_path), "save_weights_for_sampler's result");
    check(strncmp(weights_path, "trill://", 8) == 0 && strstr(weights_path, "/sampler/c-check"), "save_weights_for_sampler: %s", weights_path);

    must(trillc_create_training_client_from_state(c, state, true, trainer2), "create_training_client_from_state");
    must(trillc_get_info(c, trainer2, &info), "get_info");
    check(info.step == 1 && strcmp(trainer2, trainer) != 0, "create_training_client_from_state with optimizer: %s at step %ld", trainer2, info.step);
    trillc_forward_result again = run_forward(c, trainer2, false, &sft, 1, "cross_entropy", NULL, "forward on the new trainer");
    check(close_to(again.loss, after.loss, 1e-6), "the new trainer's loss %.6f = the saved one's %.6f", again.loss, after.loss);
    trillc_forward_result_free(&again);
    long loaded = -1;
    must(trillc_load_state(c, trainer, state, true, &f), "load_state");
    must(trillc_wait_load(c, &f, DEADLINE_S, &loaded), "load_state's result");
    check(loaded == 1, "load_state with optimizer: step %ld", loaded);

    /* sampling: seeded samples repeat; compute_logprobs gives back the sampled log-probs */
    char sampler[TRILLC_ID_SIZE];
    must(trillc_create_sampling_client(c, weights_path, NULL, sampler), "create_sampling_client(model_path)");
    check(1, "create_sampling_client: %s", sampler);
    trillc_sampling sp = trillc_sampling_default();
    sp.max_tokens = 8, sp.seed = 5;
    const int n_prompt = 4;
    trillc_sample_result s1, s2;
    must(trillc_sample(c, sampler, toks, n_prompt, 2, &sp, &f), "sample");
    must(trillc_wait_sample(c, &f, DEADLINE_S, &s1), "sample's result");
    must(trillc_sample(c, sampler, toks, n_prompt, 2, &sp, &f), "sample again");
    must(trillc_wait_sample(c, &f, DEADLINE_S, &s2), "sample's result again");
    int shaped = s1.n_sequences == 2;
    for (int i = 0; shaped && i < 2; i++) {
        const trillc_sequence *q = &s1.sequences[i];
        shaped = q->n_tokens >= 1 && q->n_tokens <= 8 && q->n_routed_experts == (n_prompt + q->n_tokens - 1) * experts_per_row &&
                 (strcmp(q->stop_reason, "stop") == 0 || strcmp(q->stop_reason, "length") == 0);
    }
    check(shaped, "sample: 2 sequences of %d and %d tokens (%s), routed experts of every forward", s1.sequences[0].n_tokens,
          s1.n_sequences > 1 ? s1.sequences[1].n_tokens : 0, s1.sequences[0].stop_reason);
    check(same_sequences(&s1, &s2), "sample with seed 5 twice: the same tokens, log-probs, stop reasons and experts");

    const trillc_sequence *q = &s1.sequences[0];
    int full[MAX_TOKENS], n_full = n_prompt + q->n_tokens, n_lp;
    memcpy(full, toks, sizeof(int) * (size_t)n_prompt);
    memcpy(full + n_prompt, q->tokens, sizeof(int) * (size_t)q->n_tokens);
    float *lp;
    must(trillc_compute_logprobs(c, sampler, full, n_full, &f), "compute_logprobs");
    must(trillc_wait_logprobs(c, &f, DEADLINE_S, &lp, &n_lp), "compute_logprobs's result");
    check(n_lp == n_full && isnan(lp[0]) && memcmp(lp + n_prompt, q->logprobs, sizeof(float) * (size_t)q->n_tokens) == 0,
          "compute_logprobs: %d values, the first null, the sampled tokens' equal to the sample's bit for bit", n_lp);
    trillc_free(lp);

    /* router replay: a datum of the prompt and the sample with the sample's experts */
    const trillc_datum replay = { .tokens = full, .n = n_full - 1, .target_tokens = full + 1, .routed_experts = q->routed_experts,
                                  .n_routed_experts = q->n_routed_experts };
    trillc_forward_result rr = run_forward(c, trainer2, false, &replay, 1, "cross_entropy", NULL, "forward with routed_experts");
    double diff = 0;
    for (int i = 0; i < q->n_tokens; i++) diff = larger(diff, fabs(rr.logprobs[0][n_prompt - 1 + i] - q->logprobs[i]));
    /* close, not equal: the sampler computes in the model's bf16, the trainer in fp32 */
    check(diff < 0.05, "router replay: the trainer's log-probs of the sampled tokens are near the sampler's (max difference %.3g)", diff);
    trillc_forward_result_free(&rr);
    trillc_sample_result_free(&s1);
    trillc_sample_result_free(&s2);

    char base_sampler[TRILLC_ID_SIZE];
    must(trillc_create_sampling_client(c, NULL, "tiny", base_sampler), "create_sampling_client(base_model)");
    must(trillc_sample(c, base_sampler, toks, n_prompt, 1, NULL, &f), "sample of the base model");
    must(trillc_wait_sample(c, &f, DEADLINE_S, &s1), "sample of the base model's result");
    check(s1.n_sequences == 1 && s1.sequences[0].n_tokens >= 1, "a base model's sampler (%s): %d tokens", base_sampler, s1.sequences[0].n_tokens);
    trillc_sample_result_free(&s1);
    must(trillc_delete_sampler(c, base_sampler), "delete_sampler");
    must_fail(trillc_sample(c, base_sampler, toks, n_prompt, 1, NULL, &f), "a deleted sampler", "not_found", 404, NULL);
    must_fail(trillc_delete_sampler(c, base_sampler), "deleting a sampler twice", "not_found", 404, NULL);

    /* errors */
    must_fail(trillc_create_sampling_client(c, NULL, NULL, base_sampler), "create_sampling_client without a model", "bad_request", 0, NULL);
    trillc_client *bad_key = trillc_open(argv[1], "not-a-key");
    must(bad_key == NULL, "trillc_open");
    must_fail(trillc_list_models(bad_key, &models, &n_models), "a bad key", "unauthorized", 401, NULL);
    trillc_close(bad_key);
    must_fail(trillc_get_info(c, "t-0000000000000000", &info), "get_info of an unknown trainer", "not_found", 404, NULL);
    must_fail(trillc_forward_backward(c, "t-0000000000000000", &sft, 1, "cross_entropy", NULL, &f), "forward_backward of an unknown trainer",
              "not_found", 404, NULL);
    const trillc_future unknown = { "r-0000000000000000" };
    must_fail(trillc_wait_load(c, &unknown, DEADLINE_S, &loaded), "a future that does not exist", "not_found", 404, NULL);
    int wrong[MAX_TOKENS];
    memcpy(wrong, toks + 1, sizeof(int) * (size_t)(n - 1));
    wrong[0] = 1000; /* the test model's vocabulary is 128 */
    const trillc_datum bad = { .tokens = toks, .n = n - 1, .target_tokens = wrong };
    must_fail(trillc_forward_backward(c, trainer, &bad, 1, "cross_entropy", NULL, &f), "a target outside the vocabulary (naming target_tokens)", "bad_request",
              400, "target_tokens");

    /* a port bound but not listening refuses connections */
    int sock = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof addr;
    const int bound = sock >= 0 && bind(sock, (struct sockaddr *)&addr, sizeof addr) == 0 && getsockname(sock, (struct sockaddr *)&addr, &len) == 0;
    check(bound, "a port that does not listen: %d", ntohs(addr.sin_port));
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(addr.sin_port));
    trillc_client *gone = trillc_open(url, argv[2]);
    must(gone == NULL, "trillc_open");
    must_fail(trillc_list_models(gone, &models, &n_models), "a server that does not listen", "unreachable", 0, NULL);
    must_fail(trillc_wait_load(gone, &unknown, 1.0, &loaded), "a long-poll of a server that does not listen (retried for 1 s)", "unreachable", 0,
              NULL);
    trillc_close(gone);
    close(sock);

    trillc_forward_result_free(&before);
    trillc_forward_result_free(&after);
    trillc_free(toks);
    trillc_close(c);
    printf("c_client_check: all passed\n");
    return 0;
}
