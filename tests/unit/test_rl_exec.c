/* The RL run's parts on their own: the metrics struct's one serializer and the progress line, the
 * scorer executor (verifier, external reward pool, failures) on a hand-made batch, the generator
 * executor on fixed batches, and the trainer executor's step against a hand computation. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "trill/train.h"
#include "base/alloc.h"
#include "rl/exec/generator.h"
#include "rl/exec/scorer.h"
#include "rl/exec/trainer.h"
#include "trill/model.h"
#include "trill/tokenizer.h"
#include "testutil.h"
#include "trill/run_config.h"
#include "trill/rl_metrics.h"
#include "trill/run.h"

/* ---- metrics ---- */

static void test_metrics_json_sync(void **state) {
    (void)state;
    trill_rl_metrics *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->step = 3;
    m->reward = 0.5;
    m->accuracy = NAN; /* no verifier: null */
    m->kl_ref = INFINITY;
    m->trained_seqs = 16;
    m->n_moe_layers = 2;
    m->flip_layer[0] = 0.25;
    m->flip_layer[1] = 0;
    m->sync_mode = TRILL_WEIGHT_SYNC_MERGE;
    m->sync_bytes = 1234;
    m->policy_version = 7;
    m->n_ext = 1;
    snprintf(m->ext_name[0], sizeof m->ext_name[0], "len");
    m->ext_value[0] = 2.5;
    m->time.generate_s = 1.5;
    m->has_eval = true;
    m->eval_pass1 = 0.75;
    m->eval_passk = 1;
    char *line = trill_rl_metrics_json(m);
    assert_non_null(line);
    json_error_t err;
    json_t *j = json_loads(line, 0, &err);
    assert_non_null(j);
    /* names, values, nulls for figures that do not apply */
    assert_int_equal(json_integer_value(json_object_get(j, "step")), 3);
    assert_true(json_real_value(json_object_get(j, "reward")) == 0.5);
    assert_true(json_is_null(json_object_get(j, "accuracy")));
    assert_true(json_is_null(json_object_get(j, "kl_ref")));
    assert_string_equal(json_string_value(json_object_get(j, "sync_mode")), "merge");
    assert_int_equal(json_integer_value(json_object_get(j, "sync_bytes")), 1234);
    assert_int_equal(json_array_size(json_object_get(j, "flip_layer")), 2);
    assert_true(json_real_value(json_array_get(json_object_get(j, "flip_layer"), 0)) == 0.25);
    assert_true(json_real_value(json_object_get(j, "reward_ext_len")) == 2.5);
    assert_true(json_real_value(json_object_get(json_object_get(j, "time"), "generate_s")) == 1.5);
    assert_true(json_real_value(json_object_get(j, "eval_pass1")) == 0.75);
    /* the async fields only in async mode */
    assert_null(json_object_get(j, "staleness_max"));
    assert_null(json_object_get(j, "generator_apply_bytes"));
    assert_null(json_object_get(json_object_get(j, "time"), "interval_s"));
    /* the historical key order: step first, then the batch, the trainer, ..., time, eval */
    const char *keys[] = { "step", "reward", "accuracy", "response_len", "flat_groups", "trained_seqs", "loss" };
    const char *at = line;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char quoted[64];
        snprintf(quoted, sizeof quoted, "\"%s\"", keys[i]);
        const char *p = strstr(at, quoted);
        assert_non_null(p);
        at = p;
    }
    assert_true(strstr(line, "\"time\"") < strstr(line, "\"eval_pass1\""));
    json_decref(j);
    free(line);
    free(m);
}

static void test_metrics_json_async(void **state) {
    (void)state;
    trill_rl_metrics *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->step = 1;
    m->async = true;
    m->batch = 4;
    m->staleness_max = 2;
    m->staleness_tokens[0] = 5;
    m->staleness_tokens[1] = 0;
    m->staleness_tokens[2] = 9;
    m->staleness_tokens[3] = 77; /* beyond staleness_max: not written */
    m->generator_apply_bytes = 42;
    m->time.interval_s = 0.5;
    char *line = trill_rl_metrics_json(m);
    assert_non_null(line);
    assert_non_null(strstr(line, "\"step\":1,\"batch\":4,"));
    assert_non_null(strstr(line, "\"staleness_tokens\":[5,0,9],"));
    assert_non_null(strstr(line, "\"interval_s\":0.5}"));
    assert_non_null(strstr(line, "},\"generator_apply_bytes\":42}"));
    assert_null(strstr(line, "eval_pass1"));
    free(line);
    free(m);
}

/* The progress line: a figure that is not a number (a NaN mean reward, no KL term) reads n/a,
 * never 0.000; the finite ones keep their format. */
static void test_progress_line(void **state) {
    (void)state;
    trill_run_status *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->step = 3;
    s->steps = 10;
    trill_rl_metrics *m = &s->last;
    m->reward = NAN;
    m->accuracy = 0.25;
    m->loss = INFINITY;
    m->kl_ref = NAN;
    m->mismatch_mean_abs = m->mismatch_k3 = m->flip_token_frac = NAN;
    m->time.gen_tokens_per_s = 1234;
    m->time.train_tokens_per_s = -INFINITY;
    m->time.generate_s = 0.5;
    m->time.train_s = NAN;
    m->sync_ms = NAN;
    char line[512];
    trill_run_progress_line(s, 2, false, line, sizeof line);
    assert_string_equal(line, "step 3/10 | reward n/a acc 25.0% | loss n/a kl n/a | mismatch |d| n/a k3 n/a flips n/a | gen 1234 tok/s "
                              "train n/a | time gen 25% train n/a sync n/a | ETA 14s");
    free(s);
}

/* ---- the scorer ---- */

typedef struct fixture {
    trill_dataset data;
    trill_example ex[2];
    rl_batch b;
    char *completion[4];
    int example[4];
    double reward[4], correct[4];
} fixture;

/* Two prompts (answers "4" and "9"), two completions each. */
static void fixture_init(fixture *f) {
    memset(f, 0, sizeof *f);
    f->ex[0] = (trill_example){ .prompt = "2+2=", .answer = "4" };
    f->ex[1] = (trill_example){ .prompt = "4+5=", .answer = "9" };
    f->data = (trill_dataset){ .path = "mem.jsonl", .n = 2, .examples = f->ex };
    static const char *const text[4] = { "4", "5", "9", "99" };
    for (int s = 0; s < 4; s++) {
        f->completion[s] = (char *)text[s];
        f->example[s] = s / 2;
    }
    f->b = (rl_batch){ .n_seqs = 4, .group_size = 2, .example = f->example, .completion = f->completion, .reward = f->reward,
                       .correct = f->correct };
}

static trill_run_config base_config(void) {
    trill_run_config c;
    assert_int_equal(trill_run_config_defaults(&c), TRILL_OK);
    c.reward.verifier = TRILL_VERIFIER_EXACT;
    c.reward.verifier_weight = 2;
    return c;
}

static void test_scorer_verifier_and_external(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    trill_run_config c = base_config();
    /* the completion's length as the reward, and as a metric */
    free(c.reward.external);
    c.reward.external = strdup("/usr/bin/python3 -c \"import json,sys\n"
                               "for l in sys.stdin:\n"
                               " c=json.loads(l)['completion']; print(json.dumps({'reward': len(c), 'metrics': {'n': 1}}), flush=True)\"");
    c.reward.external_weight = 0.5;
    c.reward.external_workers = 2;
    rl_scorer *s;
    assert_int_equal(trill_rl_scorer_create(&c, &f.data, &s), TRILL_OK);
    json_t *ext = json_object();
    assert_int_equal(trill_rl_scorer_score(s, &f.b, ext), TRILL_OK);
    const double want_correct[4] = { 1, 0, 1, 0 };
    for (int i = 0; i < 4; i++) {
        assert_true(f.correct[i] == want_correct[i]);
        assert_true(f.reward[i] == 2 * want_correct[i] + 0.5 * (double)strlen(f.completion[i]));
    }
    assert_true(json_number_value(json_object_get(ext, "n")) == 4); /* summed over the batch */
    json_decref(ext);
    trill_rl_scorer_free(s);
    trill_run_config_free(&c);
}

/* A reward process that crashes on every request: after external_max_failures in a row the
 * batch fails with a message naming the command. */
static void test_scorer_failing_process(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    trill_run_config c = base_config();
    free(c.reward.external);
    c.reward.external = strdup("read line; exit 3");
    c.reward.external_max_failures = 2;
    c.reward.external_workers = 1;
    rl_scorer *s;
    assert_int_equal(trill_rl_scorer_create(&c, &f.data, &s), TRILL_OK);
    json_t *ext = json_object();
    const trill_status st = trill_rl_scorer_score(s, &f.b, ext);
    assert_int_not_equal(st, TRILL_OK);
    if (!strstr(trill_error_message(), "read line; exit 3")) fail_msg("the message does not name the command: %s", trill_error_message());
    json_decref(ext);
    trill_rl_scorer_free(s);
    trill_run_config_free(&c);
}

/* A weight that overflows the reward stops the batch naming the source and the key. */
static void test_scorer_nonfinite_reward(void **state) {
    (void)state;
    fixture f;
    fixture_init(&f);
    trill_run_config c = base_config();
    c.reward.verifier_weight = INFINITY; /* inf x a score of 0 */
    rl_scorer *s;
    assert_int_equal(trill_rl_scorer_create(&c, &f.data, &s), TRILL_OK);
    json_t *ext = json_object();
    assert_int_equal(trill_rl_scorer_score(s, &f.b, ext), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "reward.verifier_weight"));
    json_decref(ext);
    trill_rl_scorer_free(s);
    trill_run_config_free(&c);
}

/* ---- generator and trainer on a small MoE written to disk ---- */

typedef struct world {
    char *dir;
    trill_tokenizer *tok;
    trill_dataset data;
    trill_example ex[4];
    trill_run_config c;
} world;

static void world_init(world *w) {
    memset(w, 0, sizeof *w);
    w->dir = test_tmpdir("rl_exec");
    trill_model *m = test_small_moe(5, false, true);
    assert_int_equal(trill_model_save(m, w->dir, TRILL_F32, 0), TRILL_OK);
    assert_int_equal(trill_model_write_charlevel_files(w->dir, trill_model_config(m)), TRILL_OK);
    trill_model_free(m);
    assert_int_equal(trill_tokenizer_load(w->dir, &w->tok), TRILL_OK);
    static const char *const prompts[4] = { "12+7=", "3+40=", "8+8=", "51+2=" };
    for (int i = 0; i < 4; i++) {
        w->ex[i].prompt = (char *)prompts[i];
        w->ex[i].answer = "0";
        size_t n;
        assert_int_equal(trill_tokenizer_encode(w->tok, prompts[i], strlen(prompts[i]), false, &w->ex[i].ids, &n), TRILL_OK);
        w->ex[i].n_ids = (int)n;
    }
    w->data = (trill_dataset){ .path = "mem.jsonl", .n = 4, .examples = w->ex };
    assert_int_equal(trill_run_config_defaults(&w->c), TRILL_OK);
    w->c.data.shuffle = false;
    w->c.generator.n = 2;
    w->c.generator.max_new_tokens = 5;
    w->c.generator.dtype = TRILL_GEN_F32;
    w->c.trainer.lr = 1e-2;
    w->c.trainer.schedule = TRILL_LR_CONSTANT;
    w->c.steps = 1;
}

static void world_free(world *w) {
    for (int i = 0; i < 4; i++) free(w->ex[i].ids);
    trill_tokenizer_free(w->tok);
    trill_run_config_free(&w->c);
    test_rmdir(w->dir);
    free(w->dir);
}

static bool same_sequence(const rl_batch *a, int sa, const rl_batch *b, int sb) {
    const int la = a->offsets[sa + 1] - a->offsets[sa], lb = b->offsets[sb + 1] - b->offsets[sb];
    if (la != lb || a->prompt_len[sa] != b->prompt_len[sb] || strcmp(a->completion[sa], b->completion[sb]) != 0) return false;
    return memcmp(a->tokens + a->offsets[sa], b->tokens + b->offsets[sb], sizeof(int) * (size_t)la) == 0 &&
           memcmp(a->behav_logp + a->offsets[sa] + a->prompt_len[sa], b->behav_logp + b->offsets[sb] + b->prompt_len[sb],
                  sizeof(float) * (size_t)(la - a->prompt_len[sa])) == 0;
}

/* A batch's samples depend on their position in the prompt stream, not on the batch they are in:
 * batch 1 of 2 prompts is the second half of batch 0 of 4 prompts. The adapters sent are the
 * version the generator then holds. */
static void test_generator_fixed_batches(void **state) {
    (void)state;
    world w;
    world_init(&w);
    trill_model *policy;
    assert_int_equal(trill_model_load(w.dir, &policy), TRILL_OK);
    rl_generator *g4, *g2;
    w.c.generator.prompts_per_step = 4;
    assert_int_equal(trill_rl_generator_create(&w.c, policy, w.tok, &w.data, &g4), TRILL_OK);
    rl_batch b4 = { 0 }, b2 = { 0 };
    long tokens4, tokens2;
    assert_int_equal(trill_rl_generator_generate(g4, 0, NULL, NULL, &b4, &tokens4), TRILL_OK);
    trill_run_config c2 = w.c;
    c2.generator.prompts_per_step = 2;
    assert_int_equal(trill_rl_generator_create(&c2, policy, w.tok, &w.data, &g2), TRILL_OK);
    assert_int_equal(trill_rl_generator_generate(g2, 1, NULL, NULL, &b2, &tokens2), TRILL_OK);
    assert_int_equal(b4.n_seqs, 8);
    assert_int_equal(b2.n_seqs, 4);
    for (int s = 0; s < 4; s++) {
        assert_int_equal(b2.example[s], b4.example[4 + s]);
        assert_true(same_sequence(&b2, s, &b4, 4 + s));
    }
    long sum = 0;
    for (int s = 0; s < 8; s++) sum += rl_response_len(&b4, s);
    assert_int_equal(tokens4, sum);
    /* an adapter update: the generator holds its version */
    trill_lora_config lc = { .rank = 2, .alpha = 4, .targets = TRILL_LORA_ALL_LINEAR };
    trill_lora *lora;
    assert_int_equal(trill_lora_create(policy, lc, 3, &lora), TRILL_OK);
    size_t bytes = 0;
    assert_int_equal(trill_rl_generator_load_adapter(g2, lora, 7, &bytes), TRILL_OK);
    assert_true(bytes > 0);
    rl_batch b2b = { 0 };
    assert_int_equal(trill_rl_generator_generate(g2, 1, NULL, NULL, &b2b, &tokens2), TRILL_OK);
    assert_int_equal(trill_rl_generator_version(g2), 7);
    for (int t = b2b.offsets[0] + b2b.prompt_len[0]; t < b2b.offsets[1]; t++) assert_int_equal(b2b.version[t], 7);
    trill_rl_batch_free(&b2b);
    trill_lora_free(lora);
    trill_rl_batch_free(&b4);
    trill_rl_batch_free(&b2);
    trill_rl_generator_free(g4);
    trill_rl_generator_free(g2);
    trill_model_free(policy);
    world_free(&w);
}

/* w's model as the policy, a generator on it, and the first batch it generates. */
static void first_batch(world *w, trill_model **policy, rl_generator **g, rl_batch *b) {
    assert_int_equal(trill_model_load(w->dir, policy), TRILL_OK);
    assert_int_equal(trill_rl_generator_create(&w->c, *policy, w->tok, &w->data, g), TRILL_OK);
    long tokens;
    assert_int_equal(trill_rl_generator_generate(*g, 0, NULL, NULL, b, &tokens), TRILL_OK);
}

/* The trainer's step on a fixed batch. On-policy PPO with token-mean aggregation has ratio 1, so
 * its loss is -sum_s A_s len_s / sum_s len_s with A the group advantages of the rewards
 * (unbiased std, as torch.std): computed here by hand. Micro-batching must not change the
 * update: one micro-batch per sequence gives the gradient (norm) and the adapter of one
 * micro-batch for all, to rounding. */
static void test_trainer_step_by_hand(void **state) {
    (void)state;
    world w;
    world_init(&w);
    w.c.generator.prompts_per_step = 2;
    w.c.router_replay = true;
    trill_model *policy;
    rl_generator *g;
    rl_batch b = { 0 };
    first_batch(&w, &policy, &g, &b);
    const double rewards[4] = { 1, 0, 0.25, 0.75 };
    for (int s = 0; s < 4; s++) b.reward[s] = rewards[s];
    double want_adv[4], num = 0, den = 0;
    for (int gi = 0; gi < 2; gi++) {
        const double *r = rewards + 2 * gi, mean = (r[0] + r[1]) / 2;
        const double sd = sqrt(((r[0] - mean) * (r[0] - mean) + (r[1] - mean) * (r[1] - mean)) / (2 - 1));
        for (int j = 0; j < 2; j++) want_adv[2 * gi + j] = (r[j] - mean) / (sd + 1e-6);
    }
    for (int s = 0; s < 4; s++) {
        num += want_adv[s] * rl_response_len(&b, s);
        den += rl_response_len(&b, s);
    }
    const size_t n_rewards = sizeof rewards / sizeof rewards[0];
    float *adapter[2] = { NULL, NULL };
    double grad_norm[2];
    size_t n_params = 0;
    const int budgets[2] = { 1 << 20, 1 }; /* all sequences in one micro-batch; one each */
    long step_allocs[2], pass_allocs = 0;
    for (int k = 0; k < 2; k++) {
        w.c.trainer.micro_batch_tokens = budgets[k];
        trill_trainer *t;
        assert_int_equal(trill_trainer_create(&w.c, w.dir, NULL, NULL, &t), TRILL_OK);
        for (size_t s = 0; s < n_rewards; s++) b.reward[s] = rewards[s];
        rl_train_stats ts;
        trill_rl_metrics *m = calloc(1, sizeof *m);
        assert_int_equal(trill_trainer_step(t, &b, 1, &ts, m), TRILL_OK);
        assert_int_equal(ts.optimizer_steps, 1);
        assert_int_equal(ts.kept, 4);
        for (int s = 0; s < 4; s++) assert_true(fabs(b.adv[s] - want_adv[s]) < 1e-12);
        if (fabs(ts.loss - (-num / den)) > 1e-6) fail_msg("loss %.9g, by hand %.9g", ts.loss, -num / den);
        assert_true(fabs(ts.ratio_sum / ts.ratio_n - 1) < 1e-6); /* on-policy */
        assert_true(m->flip_token_frac == 0);                       /* router replay */
        assert_true(ts.grad_norm > 0);
        grad_norm[k] = ts.grad_norm;
        /* a second step on the same batch: what it allocates does not depend on how many
         * micro-batches it cuts (their buffers are the trainer's, kept from the first step) */
        trill_alloc_fail_after(-1);
        trill_rl_metrics *m2 = calloc(1, sizeof *m2);
        rl_train_stats ts2;
        for (size_t s = 0; s < n_rewards; s++) b.reward[s] = rewards[s];
        assert_int_equal(trill_trainer_step(t, &b, 2, &ts2, m2), TRILL_OK);
        step_allocs[k] = trill_alloc_fail_after(-1);
        free(m2);
        if (k == 0) { /* what the model's own forward and backward of one micro-batch allocate */
            const int len = b.offsets[1] - b.offsets[0], offsets[2] = { 0, len };
            float *lp = calloc((size_t)len + 1, sizeof(float)), *dlp = calloc((size_t)len + 1, sizeof(float));
            size_t n_lora = 0;
            trill_lora_params(trill_trainer_lora(t), &n_lora);
            float *grads = calloc(n_lora, sizeof(float));
            uint16_t *ex = calloc((size_t)len * b.n_moe_layers * b.top_k + 1, sizeof(uint16_t));
            trill_forward_pass *pass = NULL; /* as the trainer's: replaying the generator's routing, keeping its own */
            assert_int_equal(trill_model_forward_train(trill_trainer_policy(t), b.tokens, offsets, 1, b.experts, lp, ex, false, &pass), TRILL_OK);
            assert_int_equal(trill_model_backward(pass, dlp, NULL, grads), TRILL_OK);
            trill_forward_pass_free(pass);
            pass_allocs = trill_alloc_fail_after(-1);
            free(lp), free(dlp), free(grads), free(ex);
        }
        const float *p = trill_lora_params(trill_trainer_lora(t), &n_params);
        adapter[k] = malloc(sizeof(float) * n_params);
        memcpy(adapter[k], p, sizeof(float) * n_params);
        free(m);
        trill_trainer_free(t);
    }
    /* the gradient's scale (AdamW's first step is nearly sign(g) x lr, blind to it), then the
     * update itself: rounding moves it by a small part of a step where g is near zero (measured
     * 0.5e-3 to 1.1e-3 of lr over builds and generator roundings: bound 3e-3) */
    /* 3 micro-batches more cost the model's 3 passes more and a few partial sums of the gradient's
     * tree (src/dist/tree_sum.c: one per level, spares reused), nothing of the trainer's own (it
     * made 20 allocations a micro-batch before its workspace: 59 against 153 here) */
    if (step_allocs[1] - step_allocs[0] > 3 * pass_allocs + 6)
        fail_msg("a step allocates %ld times with 1 micro-batch, %ld with 4: more than the model's own %ld a pass", step_allocs[0],
                 step_allocs[1], pass_allocs);
    if (fabs(grad_norm[0] - grad_norm[1]) > 1e-5 * grad_norm[0])
        fail_msg("micro-batching changed the gradient norm: %.9g vs %.9g", grad_norm[0], grad_norm[1]);
    double worst = 0;
    for (size_t i = 0; i < n_params; i++) worst = fmax(worst, fabs((double)adapter[0][i] - adapter[1][i]));
    printf("  1 against 4 micro-batches: gradient norms %.9g and %.9g, the update moved by %.3g at most (lr %g)\n", grad_norm[0], grad_norm[1], worst,
           w.c.trainer.lr);
    if (worst > 3e-3 * w.c.trainer.lr) fail_msg("micro-batching changed the update by %g (lr %g)", worst, w.c.trainer.lr);
    free(adapter[0]);
    free(adapter[1]);
    trill_rl_batch_free(&b);
    trill_rl_generator_free(g);
    trill_model_free(policy);
    world_free(&w);
}

/* A multi-turn trajectory trains only what the model sampled: a generated sequence's completion cut
 * into sampled, injected (a tool's answer: no behaviour log-prob, version 0) and sampled segments;
 * the step's token-mean loss (on-policy, ratio 1) is -sum_s adv_s n_s / sum_s n_s over the sampled
 * tokens n_s, and the mismatch counts those tokens only. */
static void test_trainer_trajectory(void **state) {
    (void)state;
    world w;
    world_init(&w);
    w.c.generator.prompts_per_step = 2;
    w.c.generator.max_new_tokens = 8;
    trill_model *policy;
    rl_generator *g;
    rl_batch b = { 0 };
    first_batch(&w, &policy, &g, &b);
    int s0 = -1; /* the first sequence with a completion long enough to cut in three */
    for (int s = 0; s < b.n_seqs && s0 < 0; s++)
        if (rl_response_len(&b, s) >= 4) s0 = s;
    if (s0 < 0) skip();
    /* its completion: 1 sampled, 2 injected, the rest sampled */
    const int n = b.n_seqs, first = b.offsets[s0] + b.prompt_len[s0];
    rl_segment *segs = malloc(sizeof(rl_segment) * (size_t)(2 * n + 2));
    int k = 0;
    for (int s = 0; s < n; s++) {
        b.seg_offsets[s] = k;
        segs[k++] = (rl_segment){ b.prompt_len[s], RL_SEG_INJECTED };
        if (s != s0) {
            segs[k++] = (rl_segment){ rl_response_len(&b, s), RL_SEG_SAMPLED };
            continue;
        }
        segs[k++] = (rl_segment){ 1, RL_SEG_SAMPLED };
        segs[k++] = (rl_segment){ 2, RL_SEG_INJECTED };
        segs[k++] = (rl_segment){ rl_response_len(&b, s) - 3, RL_SEG_SAMPLED };
    }
    b.seg_offsets[n] = k;
    free(b.segs);
    b.segs = segs;
    for (int t = first + 1; t < first + 3; t++) {
        b.behav_logp[t] = NAN;
        b.version[t] = 0;
    }
    assert_int_equal(trill_rl_batch_derive(&b), TRILL_OK);
    const double rewards[4] = { 1, 0, 0.25, 0.75 };
    for (int s = 0; s < 4; s++) b.reward[s] = rewards[s];
    trill_trainer *t;
    assert_int_equal(trill_trainer_create(&w.c, w.dir, NULL, NULL, &t), TRILL_OK);
    rl_train_stats ts;
    trill_rl_metrics *m = calloc(1, sizeof *m);
    assert_int_equal(trill_trainer_step(t, &b, 1, &ts, m), TRILL_OK);
    double num = 0, den = 0;
    for (int s = 0; s < n; s++) {
        const int sampled = rl_response_len(&b, s) - (s == s0 ? 2 : 0);
        num += b.adv[s] * sampled;
        den += sampled;
    }
    if (fabs(ts.loss - (-num / den)) > 1e-6) fail_msg("loss %.9g, by hand over the sampled tokens %.9g", ts.loss, -num / den);
    assert_int_equal(m->mismatch_tokens, (long)den);
    assert_true(isfinite(ts.grad_norm) && ts.grad_norm > 0 && isfinite(m->mismatch_k3) && isfinite(m->tis_mean));
    free(m);
    trill_trainer_free(t);
    trill_rl_batch_free(&b);
    trill_rl_generator_free(g);
    trill_model_free(policy);
    world_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_json_sync),
        cmocka_unit_test(test_metrics_json_async),
        cmocka_unit_test(test_progress_line),
        cmocka_unit_test(test_scorer_verifier_and_external),
        cmocka_unit_test(test_scorer_failing_process),
        cmocka_unit_test(test_scorer_nonfinite_reward),
        cmocka_unit_test(test_generator_fixed_batches),
        cmocka_unit_test(test_trainer_step_by_hand),
        cmocka_unit_test(test_trainer_trajectory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
