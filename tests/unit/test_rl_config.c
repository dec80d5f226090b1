/* The RL run configuration (src/rl/config/config.c): defaults, a full YAML file, every class of
 * refusal with its message, dotted overrides, cross-field validation, write -> load round trips,
 * and docs/config.md being exactly the generated reference.
 *
 * `test_rl_config --write-reference PATH` writes the reference (to regenerate docs/config.md). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "trill/error.h"
#include "trill/fileio.h"
#include "trill/run_config.h"

#ifndef TRILL_SOURCE_DIR
#error "tests/CMakeLists.txt defines TRILL_SOURCE_DIR"
#endif

/* Writes `text` as dir/name and loads it over the defaults into c. */
static trill_status load_text(const char *dir, const char *name, const char *text, trill_run_config *c) {
    test_write(dir, name, text, strlen(text));
    char *path = trill_path_join(dir, name);
    trill_status st = trill_run_config_load(c, path);
    free(path);
    return st;
}

static void assert_message_has(const char *needle) {
    const char *m = trill_error_message();
    if (!strstr(m, needle)) fail_msg("message lacks '%s': %s", needle, m);
}

static void assert_configs_equal(const trill_run_config *a, const trill_run_config *b) {
    assert_string_equal(a->model, b->model);
    assert_string_equal(a->run_dir, b->run_dir);
    assert_true(a->seed == b->seed);
    assert_int_equal(a->steps, b->steps);
    assert_string_equal(a->resume, b->resume);
    assert_string_equal(a->data.train, b->data.train);
    assert_string_equal(a->data.eval, b->data.eval);
    assert_string_equal(a->data.prompt_field, b->data.prompt_field);
    assert_string_equal(a->data.answer_field, b->data.answer_field);
    assert_string_equal(a->data.template_, b->data.template_);
    assert_int_equal(a->data.shuffle, b->data.shuffle);
    assert_int_equal(a->data.eval_size, b->data.eval_size);
    assert_int_equal(a->data.max_prompt_tokens, b->data.max_prompt_tokens);
    assert_int_equal(a->generator.dtype, b->generator.dtype);
    assert_int_equal(a->generator.prompts_per_step, b->generator.prompts_per_step);
    assert_int_equal(a->generator.n, b->generator.n);
    assert_int_equal(a->generator.max_new_tokens, b->generator.max_new_tokens);
    assert_true(a->generator.temperature == b->generator.temperature);
    assert_true(a->generator.top_p == b->generator.top_p);
    assert_true(a->generator.min_p == b->generator.min_p);
    assert_int_equal(a->generator.top_k, b->generator.top_k);
    assert_int_equal(a->generator.n_stop, b->generator.n_stop);
    for (int i = 0; i < a->generator.n_stop; i++) assert_string_equal(a->generator.stop[i], b->generator.stop[i]);
    assert_int_equal(a->generator.kv_cache_mb, b->generator.kv_cache_mb);
    assert_int_equal(a->generator.max_batch_tokens, b->generator.max_batch_tokens);
    assert_int_equal(a->reward.verifier, b->reward.verifier);
    assert_true(a->reward.verifier_weight == b->reward.verifier_weight);
    assert_string_equal(a->reward.external, b->reward.external);
    assert_true(a->reward.external_weight == b->reward.external_weight);
    assert_true(a->reward.external_timeout_s == b->reward.external_timeout_s);
    assert_int_equal(a->reward.external_max_failures, b->reward.external_max_failures);
    assert_int_equal(a->reward.external_workers, b->reward.external_workers);
    assert_string_equal(a->reward.model, b->reward.model);
    assert_true(a->reward.model_weight == b->reward.model_weight);
    assert_int_equal(a->algo.loss, b->algo.loss);
    assert_int_equal(a->algo.std_norm, b->algo.std_norm);
    assert_true(a->algo.clip_low == b->algo.clip_low);
    assert_true(a->algo.clip_high == b->algo.clip_high);
    assert_int_equal(a->algo.aggregation, b->algo.aggregation);
    assert_true(a->algo.kl_coef == b->algo.kl_coef);
    assert_int_equal(a->algo.kl_estimator, b->algo.kl_estimator);
    assert_int_equal(a->algo.kl_mode, b->algo.kl_mode);
    assert_int_equal(a->algo.dynamic_sampling, b->algo.dynamic_sampling);
    assert_int_equal(a->algo.minibatches, b->algo.minibatches);
    assert_true(a->algo.aipo_rho == b->algo.aipo_rho);
    assert_int_equal(a->mode, b->mode);
    assert_int_equal(a->generator.on_policy, b->generator.on_policy);
    assert_int_equal(a->async.max_staleness, b->async.max_staleness);
    assert_int_equal(a->async.queue, b->async.queue);
    assert_int_equal(a->async.on_stale, b->async.on_stale);
    assert_int_equal(a->resources.generator_threads, b->resources.generator_threads);
    assert_int_equal(a->resources.trainer_threads, b->resources.trainer_threads);
    assert_int_equal(a->resources.reward_threads, b->resources.reward_threads);
    assert_int_equal(a->resources.pin, b->resources.pin);
    assert_true(a->correction.tis == b->correction.tis);
    assert_int_equal(a->correction.mis, b->correction.mis);
    if (a->correction.mis) { /* the bounds mean nothing when off ("mis: false" does not carry them) */
        assert_true(a->correction.mis_low == b->correction.mis_low);
        assert_true(a->correction.mis_high == b->correction.mis_high);
    }
    assert_int_equal(a->correction.mis_level, b->correction.mis_level);
    assert_int_equal(a->router_replay, b->router_replay);
    assert_true(a->trainer.lr == b->trainer.lr);
    assert_true(a->trainer.min_lr == b->trainer.min_lr);
    assert_true(a->trainer.weight_decay == b->trainer.weight_decay);
    assert_true(a->trainer.grad_clip == b->trainer.grad_clip);
    assert_int_equal(a->trainer.schedule, b->trainer.schedule);
    assert_int_equal(a->trainer.warmup_steps, b->trainer.warmup_steps);
    assert_int_equal(a->trainer.micro_batch_tokens, b->trainer.micro_batch_tokens);
    assert_int_equal(a->trainer.recompute, b->trainer.recompute);
    assert_int_equal(a->trainer.lora.rank, b->trainer.lora.rank);
    assert_true(a->trainer.lora.alpha == b->trainer.lora.alpha);
    assert_int_equal(a->trainer.lora.use_rslora, b->trainer.lora.use_rslora);
    assert_int_equal(a->trainer.lora.targets, b->trainer.lora.targets);
    assert_int_equal(a->sync.mode, b->sync.mode);
    assert_int_equal(a->checkpoint.every, b->checkpoint.every);
    assert_int_equal(a->checkpoint.keep, b->checkpoint.keep);
    assert_int_equal(a->eval.every, b->eval.every);
    assert_int_equal(a->eval.k, b->eval.k);
    assert_true(a->eval.temperature == b->eval.temperature);
}

#define ALL_LINEAR TRILL_LORA_ALL_LINEAR

static void test_defaults(void **state) {
    (void)state;
    trill_run_config c;
    trill_run_config_defaults(&c);
    assert_string_equal(c.model, "");
    assert_string_equal(c.run_dir, "");
    assert_true(c.seed == 0);
    assert_int_equal(c.steps, 300);
    assert_string_equal(c.resume, "");
    assert_string_equal(c.data.train, "");
    assert_string_equal(c.data.eval, "");
    assert_string_equal(c.data.prompt_field, "prompt");
    assert_string_equal(c.data.answer_field, "answer");
    assert_string_equal(c.data.template_, ""); /* the prompt field as it is */
    assert_true(c.data.shuffle);
    assert_int_equal(c.data.eval_size, 200);
    assert_int_equal(c.data.max_prompt_tokens, 1024);
    assert_int_equal(c.generator.dtype, TRILL_GEN_BF16);
    assert_int_equal(c.generator.prompts_per_step, 32);
    assert_int_equal(c.generator.n, 8);
    assert_int_equal(c.generator.max_new_tokens, 8);
    assert_true(c.generator.temperature == 1.0 && c.generator.top_p == 1.0 && c.generator.min_p == 0.0);
    assert_int_equal(c.generator.top_k, 0);
    assert_int_equal(c.generator.n_stop, 0);
    assert_int_equal(c.generator.kv_cache_mb, 256);
    assert_int_equal(c.generator.max_batch_tokens, 2048);
    assert_int_equal(c.reward.verifier, TRILL_VERIFIER_DEMO);
    assert_true(c.reward.verifier_weight == 1.0 && c.reward.external_weight == 1.0 && c.reward.model_weight == 1.0);
    assert_string_equal(c.reward.external, "");
    assert_true(c.reward.external_timeout_s == 30.0);
    assert_int_equal(c.reward.external_max_failures, 3);
    assert_string_equal(c.reward.model, "");
    assert_int_equal(c.algo.loss, TRILL_LOSS_PPO);
    assert_true(c.algo.std_norm);
    assert_true(c.algo.clip_low == 0.2 && c.algo.clip_high == 0.28);
    assert_int_equal(c.algo.aggregation, TRILL_AGG_TOKEN_MEAN);
    assert_true(c.algo.kl_coef == 0.0);
    assert_int_equal(c.algo.kl_estimator, TRILL_KL_K3);
    assert_int_equal(c.algo.kl_mode, TRILL_KL_LOSS);
    assert_false(c.algo.dynamic_sampling);
    assert_int_equal(c.algo.minibatches, 1);
    assert_true(c.correction.tis == 2.0);
    assert_true(c.correction.mis);
    assert_true(c.correction.mis_low == 0.5 && c.correction.mis_high == 5.0);
    assert_int_equal(c.correction.mis_level, TRILL_MIS_TOKEN);
    assert_true(c.router_replay);
    assert_true(c.trainer.lr == 1e-3 && c.trainer.min_lr == 0 && c.trainer.weight_decay == 0 && c.trainer.grad_clip == 1.0);
    assert_int_equal(c.trainer.schedule, TRILL_LR_CONSTANT);
    assert_int_equal(c.trainer.warmup_steps, 0);
    assert_int_equal(c.trainer.micro_batch_tokens, 8192);
    assert_false(c.trainer.recompute);
    assert_int_equal(c.trainer.lora.rank, 8);
    assert_true(c.trainer.lora.alpha == 16.0);
    assert_false(c.trainer.lora.use_rslora);
    assert_int_equal(c.trainer.lora.targets, ALL_LINEAR);
    assert_int_equal(c.sync.mode, TRILL_WEIGHT_SYNC_ADAPTER);
    assert_int_equal(c.checkpoint.every, 100);
    assert_int_equal(c.checkpoint.keep, 2);
    assert_int_equal(c.eval.every, 0);
    assert_int_equal(c.eval.k, 8);
    assert_true(c.eval.temperature == 1.0);
    assert_int_equal(trill_run_config_validate(&c), TRILL_OK);
    trill_run_config_free(&c);
    trill_run_config_free(&c); /* freeing twice is harmless */
}

/* Every key away from its default. */
static const char FULL[] =
    "# a comment\n"
    "model: models/qwen3-moe\n"
    "run_dir: 'runs/a: b'\n"
    "seed: 18446744073709551615\n"
    "steps: 1000000000\n"
    "resume: auto\n"
    "data:\n"
    "  train: train.jsonl\n"
    "  eval: eval.jsonl\n"
    "  prompt_field: question\n"
    "  answer_field: solution\n"
    "  template: chat\n"
    "  shuffle: no\n"
    "  eval_size: 0\n"
    "  max_prompt_tokens: 77\n"
    "generator:\n"
    "  dtype: int8\n"
    "  prompts_per_step: 5\n"
    "  n: 1024\n"
    "  max_new_tokens: 300\n"
    "  temperature: 0.7\n"
    "  top_p: 0.95\n"
    "  top_k: 20\n"
    "  min_p: 0.05\n"
    "  stop:\n"
    "    - \"\\n\\n\"\n"
    "    - '###'\n"
    "    - \"a: b\"\n"
    "  kv_cache_mb: 1\n"
    "  max_batch_tokens: 99\n"
    "reward:\n"
    "  verifier: numeric\n"
    "  verifier_weight: -0.5\n"
    "  external: python3 score.py --strict\n"
    "  external_weight: 0.25\n"
    "  external_timeout_s: 2.5\n"
    "  external_max_failures: 9\n"
    "  model: rm\n"
    "  model_weight: 3\n"
    "algo:\n"
    "  loss: cispo\n"
    "  std_norm: false\n"
    "  clip_low: 1e6\n"
    "  clip_high: 5.0\n"
    "  aggregation: seq-mean-token-sum\n"
    "  kl_coef: 0.001\n"
    "  kl_estimator: k2\n"
    "  kl_mode: reward\n"
    "  dynamic_sampling: true\n"
    "  minibatches: 4\n"
    "correction:\n"
    "  tis: 0\n"
    "  mis: [0.25, 8]\n"
    "  mis_level: geometric\n"
    "router_replay: off\n"
    "trainer:\n"
    "  lr: 1e-5\n"
    "  min_lr: 1e-6\n"
    "  weight_decay: 0.1\n"
    "  grad_clip: 0\n"
    "  schedule: cosine\n"
    "  warmup_steps: 10\n"
    "  micro_batch_tokens: 16\n"
    "  recompute: True\n"
    "  lora:\n"
    "    rank: 4096\n"
    "    alpha: 0.5\n"
    "    use_rslora: yes\n"
    "    targets: [q_proj, v, lm_head]\n"
    "sync: {mode: merge}\n"
    "checkpoint:\n"
    "  every: 0\n"
    "  keep: 0\n"
    "eval:\n"
    "  every: 7\n"
    "  k: 1024\n"
    "  temperature: 0\n";

static void test_full_file(void **state) {
    (void)state;
    char *dir = test_tmpdir("rlcfg_full");
    trill_run_config c;
    trill_run_config_defaults(&c);
    if (load_text(dir, "run.yaml", FULL, &c)) fail_msg("%s", trill_error_message());
    assert_string_equal(c.model, "models/qwen3-moe");
    assert_string_equal(c.run_dir, "runs/a: b");
    assert_true(c.seed == UINT64_MAX);
    assert_int_equal(c.steps, 1000000000);
    assert_string_equal(c.resume, "auto");
    assert_string_equal(c.data.train, "train.jsonl");
    assert_string_equal(c.data.eval, "eval.jsonl");
    assert_string_equal(c.data.prompt_field, "question");
    assert_string_equal(c.data.answer_field, "solution");
    assert_string_equal(c.data.template_, "chat");
    assert_false(c.data.shuffle);
    assert_int_equal(c.data.eval_size, 0);
    assert_int_equal(c.data.max_prompt_tokens, 77);
    assert_int_equal(c.generator.dtype, TRILL_GEN_INT8);
    assert_int_equal(c.generator.prompts_per_step, 5);
    assert_int_equal(c.generator.n, 1024);
    assert_int_equal(c.generator.max_new_tokens, 300);
    assert_true(c.generator.temperature == 0.7 && c.generator.top_p == 0.95 && c.generator.min_p == 0.05);
    assert_int_equal(c.generator.top_k, 20);
    assert_int_equal(c.generator.n_stop, 3);
    assert_string_equal(c.generator.stop[0], "\n\n");
    assert_string_equal(c.generator.stop[1], "###");
    assert_string_equal(c.generator.stop[2], "a: b");
    assert_int_equal(c.generator.kv_cache_mb, 1);
    assert_int_equal(c.generator.max_batch_tokens, 99);
    assert_int_equal(c.reward.verifier, TRILL_VERIFIER_NUMERIC);
    assert_true(c.reward.verifier_weight == -0.5);
    assert_string_equal(c.reward.external, "python3 score.py --strict");
    assert_true(c.reward.external_weight == 0.25 && c.reward.external_timeout_s == 2.5);
    assert_int_equal(c.reward.external_max_failures, 9);
    assert_string_equal(c.reward.model, "rm");
    assert_true(c.reward.model_weight == 3.0);
    assert_int_equal(c.algo.loss, TRILL_LOSS_CISPO);
    assert_false(c.algo.std_norm);
    assert_true(c.algo.clip_low == 1e6 && c.algo.clip_high == 5.0);
    assert_int_equal(c.algo.aggregation, TRILL_AGG_SEQ_MEAN_TOKEN_SUM);
    assert_true(c.algo.kl_coef == 0.001);
    assert_int_equal(c.algo.kl_estimator, TRILL_KL_K2);
    assert_int_equal(c.algo.kl_mode, TRILL_KL_REWARD);
    assert_true(c.algo.dynamic_sampling);
    assert_int_equal(c.algo.minibatches, 4);
    assert_true(c.correction.tis == 0.0);
    assert_true(c.correction.mis && c.correction.mis_low == 0.25 && c.correction.mis_high == 8.0);
    assert_int_equal(c.correction.mis_level, TRILL_MIS_GEOMETRIC);
    assert_false(c.router_replay);
    assert_true(c.trainer.lr == 1e-5 && c.trainer.min_lr == 1e-6 && c.trainer.weight_decay == 0.1 && c.trainer.grad_clip == 0.0);
    assert_int_equal(c.trainer.schedule, TRILL_LR_COSINE);
    assert_int_equal(c.trainer.warmup_steps, 10);
    assert_int_equal(c.trainer.micro_batch_tokens, 16);
    assert_true(c.trainer.recompute);
    assert_int_equal(c.trainer.lora.rank, 4096);
    assert_true(c.trainer.lora.alpha == 0.5);
    assert_true(c.trainer.lora.use_rslora);
    assert_int_equal(c.trainer.lora.targets, (1u << TRILL_LORA_Q) | (1u << TRILL_LORA_V) | (1u << TRILL_LORA_LM_HEAD));
    assert_int_equal(c.sync.mode, TRILL_WEIGHT_SYNC_MERGE);
    assert_int_equal(c.checkpoint.every, 0);
    assert_int_equal(c.checkpoint.keep, 0);
    assert_int_equal(c.eval.every, 7);
    assert_int_equal(c.eval.k, 1024);
    assert_true(c.eval.temperature == 0.0);
    assert_int_equal(trill_run_config_validate(&c), TRILL_OK);
    trill_run_config_free(&c);

    /* empty files, comments only and empty sections: all defaults */
    static const char *const empty[] = { "", "# nothing\n", "---\n", "algo:\n  # loss: gspo\n" };
    trill_run_config d;
    trill_run_config_defaults(&d);
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        trill_run_config_defaults(&c);
        if (load_text(dir, "empty.yaml", empty[i], &c)) fail_msg("%s: %s", empty[i], trill_error_message());
        assert_configs_equal(&c, &d);
        trill_run_config_free(&c);
    }
    trill_run_config_free(&d);
    test_rmdir(dir);
    free(dir);
}

typedef struct refusal {
    const char *yaml;
    const char *needle;
} refusal;

static void test_file_refusals(void **state) {
    (void)state;
    static const refusal cases[] = {
        /* bad values, with the line of the value */
        { "steps: 3\nalgo:\n  std_norm: true\n  loss: gpso\n",
          "run.yaml:4: algo.loss: expected one of ppo, gspo, cispo, reinforce, aipo, got \"gpso\"" },
        { "generator:\n  n: 2.5\n", "run.yaml:2: generator.n: expected an integer in [1, 1024], got 2.5" },
        { "generator:\n  n: 0\n", "run.yaml:2: generator.n: expected an integer in [1, 1024], got 0" },
        { "steps: \"60\"\n", "run.yaml:1: steps: expected an integer in [1, 1000000000], got \"60\"" },
        { "steps: 99999999999999999999\n", "run.yaml:1: steps: expected an integer in [1, 1000000000], got 99999999999999999999" },
        { "steps:\n", "run.yaml:1: steps: expected an integer in [1, 1000000000], got an empty value" },
        { "data:\n  eval_size: -1\n", "run.yaml:2: data.eval_size: expected an integer >= 0, got -1" },
        { "seed: -3\n", "run.yaml:1: seed: expected an integer in [0, 18446744073709551615], got -3" },
        { "generator:\n  top_p: 0\n", "run.yaml:2: generator.top_p: expected a number in (0, 1], got 0" },
        { "generator:\n  temperature: hot\n", "run.yaml:2: generator.temperature: expected a number in [0, 100], got \"hot\"" },
        { "generator:\n  temperature: .nan\n", "generator.temperature: expected a number in [0, 100], got \".nan\"" },
        { "generator:\n  min_p: 1\n", "run.yaml:2: generator.min_p: expected a number in [0, 1), got 1" },
        { "reward:\n  external_timeout_s: 0\n", "run.yaml:2: reward.external_timeout_s: expected a number > 0, got 0" },
        { "data:\n  shuffle: maybe\n", "run.yaml:2: data.shuffle: expected true or false, got \"maybe\"" },
        { "data:\n  shuffle: 'true'\n", "run.yaml:2: data.shuffle: expected true or false, got \"true\"" },
        { "generator:\n  dtype: fp8\n", "run.yaml:2: generator.dtype: expected one of f32, bf16, int8, got \"fp8\"" },
        { "trainer:\n  schedule: step\n", "run.yaml:2: trainer.schedule: expected one of constant, linear, cosine, got \"step\"" },
        { "model: [a, b]\n", "run.yaml:1: model: expected a string, got a list" },
        { "data:\n  template: {prompt}\n", "run.yaml:2: data.template: expected a string, got a mapping (a value that starts with { or [ must be quoted)" },
        { "model: \"a\\0b\"\n", "run.yaml:1: model: expected a string, got a string with a NUL byte" },
        { "generator:\n  stop: \"###\"\n", "run.yaml:2: generator.stop: expected a list of at most 8 strings, got \"###\"" },
        { "generator:\n  stop: [a, b, c, d, e, f, g, h, i]\n", "run.yaml:2: generator.stop: expected at most 8 stop strings, got 9" },
        { "generator:\n  stop:\n    - a\n    - ''\n", "run.yaml:4: generator.stop: entry 2 is empty" },
        { "generator:\n  stop: [a, [b]]\n", "run.yaml:2: generator.stop: entry 2: expected a string, got a list" },
        { "correction:\n  mis: [5, 0.5]\n", "run.yaml:2: correction.mis: expected [low, high] with 0 < low < high, got [5, 0.5]" },
        { "correction:\n  mis: [0, 5]\n", "correction.mis: expected [low, high] with 0 < low < high, got [0, 5]" },
        { "correction:\n  mis: [1, 2, 3]\n", "run.yaml:2: correction.mis: expected [low, high] or false, got a list" },
        { "correction:\n  mis: true\n", "run.yaml:2: correction.mis: expected [low, high] or false, got true" },
        { "trainer:\n  lora:\n    targets: q, mlp\n", "run.yaml:3: trainer.lora.targets: unknown module \"mlp\" (expected q, k, v, o, gate, up, down, lm_head, q_a, q_b, kv_a, kv_b or all-linear)" },
        { "trainer:\n  lora:\n    targets: ''\n", "run.yaml:3: trainer.lora.targets: expected at least one module" },
        { "trainer:\n  lora:\n    rank: 0\n", "run.yaml:3: trainer.lora.rank: expected an integer in [1, 4096], got 0" },
        /* structure */
        { "steps: 3\nalgo:\n  los: ppo\n", "run.yaml:3: unknown key \"algo.los\" (algo has: loss, std_norm, clip_low, clip_high, aggregation," },
        { "stepz: 3\n", "run.yaml:1: unknown key \"stepz\" (the top level has: model, run_dir, seed, steps, resume, mode, async, resources, data, generator," },
        { "trainer:\n  lora:\n    rnk: 3\n", "run.yaml:3: unknown key \"trainer.lora.rnk\" (trainer.lora has: rank, alpha, use_rslora, targets)" },
        { "algo.loss: gspo\n", "run.yaml:1: unknown key \"algo.loss\"" },
        { "algo: gspo\n", "run.yaml:1: algo: expected a section (a mapping of loss, std_norm," },
        { "trainer:\n  lora: 8\n", "run.yaml:2: trainer.lora: expected a section (a mapping of rank, alpha, use_rslora, targets), got 8" },
        { "algo:\n  loss:\n    name: ppo\n", "run.yaml:3: algo.loss: expected one of ppo, gspo, cispo, reinforce, aipo, got a mapping" },
        { "algo:\n  loss: ppo\n  kl_coef: 0\n  loss: gspo\n", "run.yaml:4: duplicate key \"algo.loss\" (first at line 2)" },
        { "algo:\n  loss: ppo\nalgo:\n  kl_coef: 0\n", "run.yaml:3: duplicate key \"algo\" (first at line 1)" },
        { "[1, 2]: x\n", "run.yaml:1: the top level: expected key names, got a list as a key" },
        { "- steps: 3\n", "run.yaml:1: expected a mapping of keys and sections (model, run_dir," },
        { "just text\n", "run.yaml:1: expected a mapping of keys and sections" },
        { "a: 1\n---\nb: 2\n", "run.yaml:3: expected one YAML document, found a second one" },
        /* YAML syntax */
        { "algo:\n  loss: [ppo\n", "run.yaml:3:1: YAML syntax error: did not find expected ',' or ']'" },
        { "steps: 3\n  bad: indent\n", "run.yaml:2:6: YAML syntax error: mapping values are not allowed in this context" },
        { "model: \"unterminated\n", "run.yaml:2:1: YAML syntax error: found unexpected end of stream" },
        { "model: \x01\n", "run.yaml: control characters are not allowed at byte 8" },
    };
    char *dir = test_tmpdir("rlcfg_refuse");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trill_run_config c;
        trill_run_config_defaults(&c);
        trill_status st = load_text(dir, "run.yaml", cases[i].yaml, &c);
        if (st != TRILL_ERR_INVALID) fail_msg("case %zu (%s): status %d, expected a refusal", i, cases[i].yaml, st);
        if (!strstr(trill_error_message(), cases[i].needle))
            fail_msg("case %zu (%s): message lacks\n  '%s'\n got\n  '%s'", i, cases[i].yaml, cases[i].needle, trill_error_message());
        trill_run_config_free(&c);
    }
    /* a missing file is an I/O error that names it */
    trill_run_config c;
    trill_run_config_defaults(&c);
    char *missing = trill_path_join(dir, "missing.yaml");
    assert_int_equal(trill_run_config_load(&c, missing), TRILL_ERR_IO);
    assert_message_has(missing);
    free(missing);
    trill_run_config_free(&c);
    test_rmdir(dir);
    free(dir);
}

static void set_ok(trill_run_config *c, const char *assignment) {
    if (trill_run_config_set(c, assignment)) fail_msg("%s: %s", assignment, trill_error_message());
}

static void test_overrides(void **state) {
    (void)state;
    trill_run_config c;
    trill_run_config_defaults(&c);
    set_ok(&c, "algo.loss=gspo");
    assert_int_equal(c.algo.loss, TRILL_LOSS_GSPO);
    set_ok(&c, "trainer.lr=1e-4");
    assert_true(c.trainer.lr == 1e-4);
    set_ok(&c, "trainer.lora.rank=16");
    assert_int_equal(c.trainer.lora.rank, 16);
    set_ok(&c, "correction.mis=[0.25, 4]");
    assert_true(c.correction.mis && c.correction.mis_low == 0.25 && c.correction.mis_high == 4.0);
    set_ok(&c, "correction.mis=off");
    assert_false(c.correction.mis);
    set_ok(&c, "correction.mis=[0.5, 5]");
    assert_true(c.correction.mis);
    set_ok(&c, "generator.stop=[\"\\n\", \"###\"]");
    assert_int_equal(c.generator.n_stop, 2);
    assert_string_equal(c.generator.stop[0], "\n");
    assert_string_equal(c.generator.stop[1], "###");
    set_ok(&c, "generator.stop=[]");
    assert_int_equal(c.generator.n_stop, 0);
    set_ok(&c, "router_replay=false");
    assert_false(c.router_replay);
    set_ok(&c, "trainer.lora.targets=q,v");
    assert_int_equal(c.trainer.lora.targets, (1u << TRILL_LORA_Q) | (1u << TRILL_LORA_V));
    set_ok(&c, "seed=12345678901234");
    assert_true(c.seed == 12345678901234ull);

    /* strings: taken as written unless quoted; the old value is freed (ASan would see a leak) */
    set_ok(&c, "model=/models/a b");
    assert_string_equal(c.model, "/models/a b");
    set_ok(&c, "reward.external=python3 -c \"print('a: b')\" # not a comment");
    assert_string_equal(c.reward.external, "python3 -c \"print('a: b')\" # not a comment");
    set_ok(&c, "data.template={prompt} =");
    assert_string_equal(c.data.template_, "{prompt} =");
    set_ok(&c, "data.template=\"line\\n{prompt}\"");
    assert_string_equal(c.data.template_, "line\n{prompt}");
    set_ok(&c, "data.eval=");
    assert_string_equal(c.data.eval, "");
    set_ok(&c, "resume='auto'");
    assert_string_equal(c.resume, "auto");

    /* the enum names are the engine's and the optimizer's */
    for (int f = TRILL_GEN_F32; f <= TRILL_GEN_INT8; f++) {
        char a[64];
        snprintf(a, sizeof a, "generator.dtype=%s", trill_gen_format_name((trill_gen_format)f));
        set_ok(&c, a);
        assert_int_equal(c.generator.dtype, f);
    }
    static const char *const schedules[] = { "constant", "linear", "cosine" };
    for (int i = 0; i < 3; i++) {
        char a[64];
        trill_lr_schedule s;
        snprintf(a, sizeof a, "trainer.schedule=%s", schedules[i]);
        set_ok(&c, a);
        assert_int_equal(trill_lr_schedule_parse(schedules[i], &s), 0);
        assert_int_equal(c.trainer.schedule, s);
    }
    static const char *const targets[] = { /* every target's short name, as the registry lists them */
#define TRILL_LORA_TARGET(name, peft, alias) alias,
#include "trill/families.def"
#undef TRILL_LORA_TARGET
    };
    _Static_assert(sizeof targets / sizeof targets[0] == TRILL_LORA_N_TARGETS, "one name per target");
    for (int i = 0; i < TRILL_LORA_N_TARGETS; i++) {
        char a[64];
        snprintf(a, sizeof a, "trainer.lora.targets=%s", targets[i]);
        set_ok(&c, a);
        assert_int_equal(c.trainer.lora.targets, 1u << i);
    }

    static const refusal cases[] = {
        { "algo.loss=gpso", "override \"algo.loss=gpso\": algo.loss: expected one of ppo, gspo, cispo, reinforce, aipo, got \"gpso\"" },
        { "algo.los=ppo", "override \"algo.los=ppo\": unknown key \"algo.los\" (algo has: loss, std_norm," },
        { "nope.x=1", "override \"nope.x=1\": unknown key \"nope.x\" (the top level has: model, run_dir," },
        { "trainer.lora.x=1", "override \"trainer.lora.x=1\": unknown key \"trainer.lora.x\" (trainer.lora has: rank, alpha, use_rslora, targets)" },
        { "algo=gspo", "override \"algo=gspo\": algo is a section; set its keys one by one (algo has: loss," },
        { "algo.loss", "override \"algo.loss\": expected section.key=value" },
        { "=3", "override \"=3\": expected section.key=value" },
        { "generator.n=2.5", "override \"generator.n=2.5\": generator.n: expected an integer in [1, 1024], got 2.5" },
        { "generator.n=", "override \"generator.n=\": generator.n: expected an integer in [1, 1024], got an empty value" },
        { "correction.mis=[5, 1]", "override \"correction.mis=[5, 1]\": correction.mis: expected [low, high] with 0 < low < high, got [5, 1]" },
        { "generator.stop=[\"a\"", "override \"generator.stop=[\"a\"\": YAML syntax error at column" },
        { "generator.stop=a", "override \"generator.stop=a\": generator.stop: expected a list of at most 8 strings, got \"a\"" },
        { "model=\"unterminated", "override \"model=\"unterminated\": YAML syntax error" },
        { "model=\xff", "override \"model=\xff\": model: the value is not valid UTF-8" },
        { "steps=[1]", "override \"steps=[1]\": steps: expected an integer in [1, 1000000000], got a list" },
        { "generator.prompts_per_step=4294967300",
          "generator.prompts_per_step: 4294967300 is past the largest value the key holds (2147483647)" }, /* not a wrap to 4 */
    };
    set_ok(&c, "generator.stop=[x]");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(trill_run_config_set(&c, cases[i].yaml), TRILL_ERR_INVALID);
        if (!strstr(trill_error_message(), cases[i].needle))
            fail_msg("override %s: message lacks\n  '%s'\n got\n  '%s'", cases[i].yaml, cases[i].needle, trill_error_message());
    }
    /* a refused list leaves the old one */
    assert_int_equal(trill_run_config_set(&c, "generator.stop=[a, '']"), TRILL_ERR_INVALID);
    assert_int_equal(c.generator.n_stop, 1);
    assert_string_equal(c.generator.stop[0], "x");
    trill_run_config_free(&c);
}

static void test_validate(void **state) {
    (void)state;
    static const refusal cases[] = {
        { "generator.n=1", "generator.n: group-relative advantages need at least 2 samples per prompt, got 1" },
        { "trainer.min_lr=0.5", "trainer.min_lr (0.5) is above trainer.lr (0.001)" },
        { "algo.minibatches=64", "algo.minibatches (64) is more than generator.prompts_per_step (32)" },
        { "reward.verifier=none", "no reward: set reward.verifier, reward.external, reward.model or env.kind" },
        { "env.kind=chess", "env.kind: \"chess\" is not an environment (expected \"\", guess or process)" },
        { "env.kind=process", "env.command: env.kind process needs the command line of the environment process" },
        { "generator.prompts_per_step=300000000",
          "generator.prompts_per_step (300000000) x generator.n (8): more samples per step than a batch can hold (2147483647)" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        trill_run_config c;
        trill_run_config_defaults(&c);
        set_ok(&c, cases[i].yaml);
        assert_int_equal(trill_run_config_validate(&c), TRILL_ERR_INVALID);
        assert_message_has(cases[i].needle);
        trill_run_config_free(&c);
    }
    trill_run_config c;
    trill_run_config_defaults(&c);
    set_ok(&c, "reward.verifier=none");
    set_ok(&c, "reward.external=./score");
    assert_int_equal(trill_run_config_validate(&c), TRILL_OK);
    /* a config changed in code gets the table's range checks too */
    c.correction.mis_low = 6;
    assert_int_equal(trill_run_config_validate(&c), TRILL_ERR_INVALID);
    assert_message_has("correction.mis: expected [low, high] with 0 < low < high, got [6, 5]");
    c.correction.mis = false;
    assert_int_equal(trill_run_config_validate(&c), TRILL_OK);
    c.eval.k = 0;
    assert_int_equal(trill_run_config_validate(&c), TRILL_ERR_INVALID);
    assert_message_has("eval.k: expected an integer in [1, 1024], got 0");
    c.eval.k = 4;
    c.generator.top_p = 0;
    assert_int_equal(trill_run_config_validate(&c), TRILL_ERR_INVALID);
    assert_message_has("generator.top_p: expected a number in (0, 1], got 0");
    c.generator.top_p = 1;
    c.algo.loss = (trill_rl_loss)7;
    assert_int_equal(trill_run_config_validate(&c), TRILL_ERR_INVALID);
    assert_message_has("algo.loss: expected one of ppo, gspo, cispo, reinforce, aipo, got the value 7");
    c.algo.loss = TRILL_LOSS_PPO;
    c.trainer.lora.targets = 0;
    assert_int_equal(trill_run_config_validate(&c), TRILL_ERR_INVALID);
    assert_message_has("trainer.lora.targets");
    trill_run_config_free(&c);
    /* on-policy scoring is for sync runs: async generation runs ahead of the weights */
    trill_run_config_defaults(&c);
    set_ok(&c, "generator.on_policy=true");
    assert_int_equal(trill_run_config_validate(&c), TRILL_OK);
    set_ok(&c, "mode=async");
    assert_int_equal(trill_run_config_validate(&c), TRILL_ERR_INVALID);
    assert_message_has("generator.on_policy: true needs mode: sync");
    trill_run_config_free(&c);
}

/* write -> load gives the same config */
static void round_trip(const char *dir, const trill_run_config *c) {
    char *path = trill_path_join(dir, "config.yaml");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(trill_run_config_write(c, f), TRILL_OK);
    fclose(f);
    trill_run_config back;
    trill_run_config_defaults(&back);
    if (trill_run_config_load(&back, path)) fail_msg("%s", trill_error_message());
    assert_configs_equal(c, &back);
    trill_run_config_free(&back);
    free(path);
}

static void test_round_trip(void **state) {
    (void)state;
    char *dir = test_tmpdir("rlcfg_rt");
    trill_run_config c;
    trill_run_config_defaults(&c);
    round_trip(dir, &c);
    if (load_text(dir, "run.yaml", FULL, &c)) fail_msg("%s", trill_error_message());
    /* strings that need quoting or escapes, doubles that need 17 digits */
    set_ok(&c, "model=a: b # c");
    set_ok(&c, "run_dir=\"tab\\there \\\"quoted\\\" back\\\\slash\"");
    set_ok(&c, "data.train=");
    set_ok(&c, "data.eval=- [x] {y} & *z ! | > ' \" % @ `");
    set_ok(&c, "data.prompt_field=true");
    set_ok(&c, "data.answer_field=123");
    set_ok(&c, "data.template=\"{prompt}\\r\\n\\u00e9\\u0085\\u0081\\x01\\u2028 \"");
    set_ok(&c, "reward.model=null");
    set_ok(&c, "reward.external=~");
    set_ok(&c, "resume=  leading and trailing spaces  ");
    set_ok(&c, "generator.stop=[\"\\n\", \"a: b\", \"\\t\", \" \", \"#\", \"\\u00ff\", \"'\", \"\\\"\"]");
    set_ok(&c, "generator.temperature=0.1");
    set_ok(&c, "generator.top_p=0.30000000000000004");
    set_ok(&c, "trainer.lr=3.0000000000000001e-05");
    set_ok(&c, "reward.verifier_weight=-1e-300");
    set_ok(&c, "correction.mis=[0.1, 1.7976931348623157e308]");
    set_ok(&c, "trainer.lora.targets=all-linear,lm_head");
    round_trip(dir, &c);
    set_ok(&c, "correction.mis=false");
    set_ok(&c, "trainer.lora.targets=down,gate");
    set_ok(&c, "generator.stop=[]");
    round_trip(dir, &c);
    trill_run_config_free(&c);
    test_rmdir(dir);
    free(dir);
}

static char *reference_text(void) {
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(trill_run_config_reference(f), TRILL_OK);
    long len = ftell(f);
    assert_true(len > 0);
    rewind(f);
    char *text = malloc((size_t)len + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)len, f), (size_t)len);
    text[len] = '\0';
    fclose(f);
    return text;
}

static void test_reference(void **state) {
    (void)state;
    char *text = reference_text();
    /* a row per key, with its type and default */
    assert_non_null(strstr(text, "| `algo.loss` | one of `ppo`, `gspo`, `cispo`, `reinforce`, `aipo` | `ppo` |"));
    assert_non_null(strstr(text, "| `generator.n` | integer in [1, 1024] | `8` |"));
    assert_non_null(strstr(text, "| `correction.mis` | `[low, high]` or `false` | `[0.5, 5]` |"));
    assert_non_null(strstr(text, "| `trainer.lora.targets` | module names | `all-linear` |"));
    assert_non_null(strstr(text, "trill train run.yaml algo.loss=gspo trainer.lr=1e-4"));
    assert_non_null(strstr(text, "`config.yaml`"));

    /* the example in the reference loads */
    const char *start = strstr(text, "```yaml\n"), *end = start ? strstr(start + 8, "```") : NULL;
    assert_non_null(end);
    char *dir = test_tmpdir("rlcfg_ref");
    char *example = strndup(start + 8, (size_t)(end - start - 8));
    trill_run_config c;
    trill_run_config_defaults(&c);
    if (load_text(dir, "example.yaml", example, &c)) fail_msg("the reference's example: %s", trill_error_message());
    assert_int_equal(c.algo.loss, TRILL_LOSS_GSPO);
    assert_int_equal(trill_run_config_validate(&c), TRILL_OK);
    trill_run_config_free(&c);
    free(example);
    test_rmdir(dir);
    free(dir);

    /* docs/config.md is exactly the generated text */
    char *doc = NULL;
    size_t doc_len = 0;
    const char *doc_path = TRILL_SOURCE_DIR "/docs/config.md";
    if (trill_read_file(doc_path, &doc, &doc_len)) fail_msg("%s", trill_error_message());
    if (doc_len != strlen(text) || memcmp(doc, text, doc_len))
        fail_msg("%s is out of date with the key table in src/rl/config/config.c; regenerate it with\n"
                 "  <build>/tests/test_rl_config --write-reference %s",
                 doc_path, doc_path);
    free(doc);
    free(text);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-reference")) {
        FILE *f = fopen(argv[2], "w");
        if (!f) {
            perror(argv[2]);
            return 1;
        }
        const trill_status st = trill_run_config_reference(f);
        return fclose(f) || st ? 1 : 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_file),
        cmocka_unit_test(test_file_refusals),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
