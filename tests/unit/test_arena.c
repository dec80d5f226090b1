/* Memory is made once per run, not per step: training steps (forward + backward with adapters)
 * and engine steps allocate their large buffers (the activations, the backward's scratch, the
 * logits chunk, the kernels' and the generator's scratch) on the first step only, and reuse
 * them after; a larger batch grows them once. Counts allocations (base/alloc.h), not time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/alloc.h"
#include "testutil.h"
#include "trill/infer.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/train.h"

enum { LARGE = 64 << 10 }; /* bytes: what counts as a large buffer here */

/* One training step on n_seqs sequences of len tokens; returns the large allocations it made. */
static long train_step(trill_model *m, float *lora_grads, int n_seqs, int len) {
    const int T = n_seqs * len;
    int *tokens = malloc(sizeof(int) * T), *offsets = malloc(sizeof(int) * (n_seqs + 1));
    float *lp = malloc(sizeof(float) * T), *dlp = malloc(sizeof(float) * T);
    for (int t = 0; t < T; t++) {
        tokens[t] = (t * 37 + 11) % 128;
        dlp[t] = -1.0f / (float)T;
    }
    for (int s = 0; s <= n_seqs; s++) offsets[s] = s * len;
    trill_alloc_large(LARGE);
    trill_forward_pass *pass;
    assert_int_equal(trill_model_forward_train(m, tokens, offsets, n_seqs, NULL, lp, NULL, false, &pass), TRILL_OK);
    assert_int_equal(trill_model_backward(pass, dlp, NULL, lora_grads), TRILL_OK);
    trill_forward_pass_free(pass);
    const long large = trill_alloc_large(LARGE);
    free(tokens); free(offsets); free(lp); free(dlp);
    return large;
}

static void test_training_steps(void **state) {
    (void)state;
    trill_model *m = test_small_moe(5, false, true);
    trill_lora_config lc = { .rank = 8, .alpha = 16 };
    assert_int_equal(trill_lora_parse_targets("q,k,v,o,gate,up,down,lm_head", &lc.targets), 0);
    trill_lora *lora;
    assert_int_equal(trill_lora_create(m, lc, 3, &lora), TRILL_OK);
    trill_model_attach_lora(m, lora);
    size_t n;
    trill_lora_params(lora, &n);
    float *grads = calloc(n, sizeof(float));
    long per_step[7];
    for (int s = 0; s < 5; s++) per_step[s] = train_step(m, grads, 4, 128);
    per_step[5] = train_step(m, grads, 8, 128); /* a larger batch grows the buffers once ... */
    per_step[6] = train_step(m, grads, 4, 128); /* ... which then serve smaller ones */
    print_message("large allocations per training step: %ld %ld %ld %ld %ld, larger batch %ld, then %ld\n", per_step[0], per_step[1],
                  per_step[2], per_step[3], per_step[4], per_step[5], per_step[6]);
    assert_true(per_step[0] > 0);
    for (int s = 1; s < 5; s++) assert_int_equal(per_step[s], 0);
    assert_true(per_step[5] > 0);
    assert_int_equal(per_step[6], 0);
    free(grads);
    trill_model_attach_lora(m, NULL);
    trill_lora_free(lora);
    trill_model_free(m);
}

static void test_engine_steps(void **state) {
    (void)state;
    trill_model *m = test_small_moe(6, false, true);
    trill_engine_config cfg = trill_engine_config_default();
    cfg.format = TRILL_GEN_BF16;
    cfg.kv_cache_mb = 8;
    trill_engine *e;
    assert_int_equal(trill_engine_create(m, &cfg, &e), TRILL_OK);
    int prompt[64];
    for (int i = 0; i < 64; i++) prompt[i] = (i * 13 + 5) % 128;
    for (int r = 0; r < 4; r++) {
        trill_request q = { .id = (uint64_t)r, .prompt = prompt, .prompt_len = 64, .n = 2, .max_new_tokens = 16 };
        q.sampling = trill_sampling_default();
        assert_int_equal(trill_engine_submit(e, &q), TRILL_OK);
    }
    long per_step[5];
    trill_alloc_large(LARGE);
    for (int s = 0; s < 5; s++) {
        assert_int_equal(trill_engine_step(e, NULL), TRILL_OK);
        per_step[s] = trill_alloc_large(LARGE);
    }
    print_message("large allocations per engine step: %ld %ld %ld %ld %ld\n", per_step[0], per_step[1], per_step[2], per_step[3],
                  per_step[4]);
    for (int s = 1; s < 5; s++) assert_int_equal(per_step[s], 0);
    trill_engine_free(e);
    trill_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_training_steps),
        cmocka_unit_test(test_engine_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
