/* Supervised fine-tuning on one sequence with the C client: a LoRA trainer learns "12+34=46"
 * with cross-entropy, one AdamW step, and its state is saved.
 *
 * Usage: example_sft [BASE_MODEL]   (server and key from $TRILL_BASE_URL and $TRILL_API_KEY) */
#include <stdio.h>
#include <stdlib.h>

#include "trill_client.h"

static int report(const char *what) {
    const trillc_error *e = trillc_last_error();
    fprintf(stderr, "example_sft: %s: %s: %s\n", what, e->code, e->message);
    return 1;
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : "tiny";
    trillc_client *c = trillc_open(NULL, NULL);
    if (!c) return report("open");

    char trainer[TRILLC_ID_SIZE], path[TRILLC_PATH_SIZE];
    int *tokens = NULL, n = 0, rc = 1;
    float *weights = NULL;
    trillc_forward_result before = { 0 }, after = { 0 };
    trillc_optim_result optim;
    trillc_future fb, step, check, save;
    if (trillc_create_lora_training_client(c, model, 8, 0, true, true, false, trainer)) { report("create_lora_training_client"); goto done; }
    if (trillc_tokenize(c, model, "12+34=46", false, &tokens, &n)) { report("tokenize"); goto done; }
    if (n < 2 || !(weights = malloc(sizeof(float) * (size_t)(n - 1)))) goto done;

    /* Each position predicts the next token: the inputs are all tokens but the last, the targets all but the first. */
    for (int i = 0; i < n - 1; i++) weights[i] = 1;
    const trillc_datum datum = { .tokens = tokens, .n = n - 1, .target_tokens = tokens + 1, .weights = weights };
    trillc_adam adam = trillc_adam_default();
    adam.learning_rate = 0.02;

    /* All four calls are queued at once: the server runs one trainer's calls in the order submitted. */
    if (trillc_forward_backward(c, trainer, &datum, 1, "cross_entropy", NULL, &fb) || trillc_optim_step(c, trainer, &adam, &step) ||
        trillc_forward(c, trainer, &datum, 1, "cross_entropy", NULL, &check) || trillc_save_state(c, trainer, "sft-1", &save)) {
        report("submitting");
        goto done;
    }
    if (trillc_wait_forward(c, &fb, 120, &before) || trillc_wait_optim(c, &step, 120, &optim) || trillc_wait_forward(c, &check, 120, &after) ||
        trillc_wait_path(c, &save, 120, path)) {
        report("waiting");
        goto done;
    }
    printf("trainer %s: loss %.4f -> %.4f after step %ld (grad norm %.4g)\n", trainer, before.loss, after.loss, optim.step, optim.grad_norm);
    printf("state saved: %s\n", path);
    rc = 0;
done:
    trillc_forward_result_free(&before);
    trillc_forward_result_free(&after);
    free(weights);
    trillc_free(tokens);
    trillc_close(c);
    return rc;
}
