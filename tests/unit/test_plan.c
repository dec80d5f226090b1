/* trill plan's counts (trill/plan.h) against the tensor table's and against counts written here
 * from the published configurations by hand; its cluster files' refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "trill/config.h"
#include "trill/plan.h"
#include "trill/run_config.h"
#include "testutil.h"

static trill_config preset(const char *name) {
    char *text = trill_config_preset_text(name);
    assert_non_null(text);
    trill_config c;
    assert_int_equal(trill_config_parse(text, strlen(text), name, &c), TRILL_OK);
    free(text);
    return c;
}

/* Every preset of every family: the modules add up to the tensor table's total and active counts
 * (trill_plan_count refuses otherwise), the routed experts' active share is k of E, and all-linear
 * LoRA adapts no embedding, router, norm or head. */
static void test_every_preset_adds_up(void **state) {
    (void)state;
    char *names = strdup(trill_config_preset_names()); /* "tiny, small (qwen3), k2-tiny, ..." */
    int n = 0;
    for (char *save = NULL, *tok = strtok_r(names, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        char *paren = strchr(tok, ' ');
        if (paren) *paren = 0; /* "small (qwen3)": the family's name after the last preset */
        if (!*tok) continue;
        trill_config c = preset(tok);
        trill_plan_counts k;
        const trill_lora_config lora = { .rank = 8, .alpha = 16, .targets = TRILL_LORA_ALL_LINEAR };
        assert_int_equal(trill_plan_count(&c, &lora, &k), TRILL_OK);
        int64_t total, active;
        trill_config_param_counts(&c, &total, &active);
        assert_true(k.sum_total == total && k.sum_active == active);
        assert_true(k.lora[TRILL_PLAN_EMBEDDING] == 0 && k.lora[TRILL_PLAN_ROUTER] == 0 && k.lora[TRILL_PLAN_NORMS] == 0 &&
                    k.lora[TRILL_PLAN_LM_HEAD] == 0);
        assert_true(k.sum_lora > 0 && k.trainable == k.sum_lora && k.adapted > 0);
        if (c.n_moe_layers) /* a token's routed experts: top-k of E in every MoE layer */
            assert_true(llabs(k.active[TRILL_PLAN_ROUTED_EXPERTS] * c.num_experts - k.total[TRILL_PLAN_ROUTED_EXPERTS] * c.num_experts_per_tok) <
                        c.num_experts);
        /* full fine-tuning trains everything but DeepSeek's selection biases */
        assert_int_equal(trill_plan_count(&c, NULL, &k), TRILL_OK);
        assert_true(k.trainable <= k.sum_total && k.trainable >= k.sum_total - (int64_t)c.num_hidden_layers * (c.num_experts + 1));
        n++;
    }
    free(names);
    assert_true(n >= 20);
}

/* DeepSeek-V3: 671B parameters, 37B active (its paper; the multi-token-prediction module apart);
 * Kimi K2: 1.03T and 32.9B counted with the embeddings (its model card: 1T, 32B activated). */
static void test_published_totals(void **state) {
    (void)state;
    trill_plan_counts k;
    trill_config c = preset("deepseek-v3");
    assert_int_equal(trill_plan_count(&c, NULL, &k), TRILL_OK);
    assert_true(k.sum_total > 670.5e9 && k.sum_total < 671.5e9);
    assert_true(k.sum_active > 37.0e9 && k.sum_active < 38.0e9);
    c = preset("kimi-k2");
    assert_int_equal(trill_plan_count(&c, NULL, &k), TRILL_OK);
    assert_true(k.sum_total > 1.025e12 && k.sum_total < 1.035e12);
    assert_true(k.sum_active > 32.8e9 && k.sum_active < 33.0e9);
    c = preset("qwen3-235b-a22b");
    assert_int_equal(trill_plan_count(&c, NULL, &k), TRILL_OK);
    assert_true(k.sum_total > 234.5e9 && k.sum_total < 235.5e9 && k.sum_active > 21.5e9 && k.sum_active < 22.5e9);
    c = preset("qwen3-30b-a3b");
    assert_int_equal(trill_plan_count(&c, NULL, &k), TRILL_OK);
    assert_true(k.sum_total > 30.0e9 && k.sum_total < 31.0e9 && k.sum_active > 3.0e9 && k.sum_active < 3.5e9);
}

/* LoRA r = 32 on every linear layer of Kimi K2, each of its 384 experts in 60 MoE layers
 * included, counted here from the published dimensions: r (in + out) per adapted weight. */
static void test_k2_lora_by_hand(void **state) {
    (void)state;
    const int64_t r = 32, H = 7168, ql = 1536, nh = 64, nope = 128, rope = 64, v = 128, kl = 512, I = 18432, Im = 2048, E = 384;
    const int64_t layers = 61, dense = 1, moe = 60;
    const int64_t attention = r * ((H + ql) + (ql + nh * (nope + rope)) + (H + kl + rope) + (kl + nh * (nope + v)) + (nh * v + H));
    const int64_t mlp = 3 * r * (H + I), expert = 3 * r * (H + Im), shared = 3 * r * (H + Im); /* one shared expert of Im */
    const int64_t want = layers * attention + dense * mlp + moe * (E * expert + shared);
    trill_config c = preset("kimi-k2");
    trill_plan_counts k;
    const trill_lora_config lora = { .rank = 32, .alpha = 64, .targets = TRILL_LORA_ALL_LINEAR };
    assert_int_equal(trill_plan_count(&c, &lora, &k), TRILL_OK);
    assert_true(k.sum_lora == want);
    assert_true(k.lora[TRILL_PLAN_ATTENTION] == layers * attention && k.lora[TRILL_PLAN_ROUTED_EXPERTS] == moe * E * expert);
    assert_true(k.adapted == layers * 5 + dense * 3 + moe * (E * 3 + 3));
    printf("Kimi K2, LoRA r=32 on every linear layer and expert: %lld trainable parameters (%.2f B)\n", (long long)want, want * 1e-9);
    /* a subset of modules: attention's q_a and q_b only */
    const trill_lora_config qa = { .rank = 16, .alpha = 32, .targets = 1u << TRILL_LORA_Q_A | 1u << TRILL_LORA_Q_B };
    assert_int_equal(trill_plan_count(&c, &qa, &k), TRILL_OK);
    assert_true(k.sum_lora == layers * 16 * ((H + ql) + (ql + nh * (nope + rope))));
    /* a module the family lacks */
    const trill_lora_config bad = { .rank = 8, .alpha = 16, .targets = 1u << TRILL_LORA_W1 };
    assert_int_equal(trill_plan_count(&c, &bad, &k), TRILL_ERR_UNSUPPORTED);
}

/* Qwen3-MoE's small preset: q, k, v, o, and every expert's gate, up and down. */
static void test_small_lora_by_hand(void **state) {
    (void)state;
    const int64_t r = 8, H = 512, nh = 8, nkv = 4, hd = 64, I = 1536, Im = 256, E = 16, layers = 8;
    const int64_t attention = r * ((H + nh * hd) + 2 * (H + nkv * hd) + (nh * hd + H));
    const int64_t want = layers * attention + 3 * r * (H + I) + (layers - 1) * E * 3 * r * (H + Im);
    trill_config c = preset("small");
    trill_plan_counts k;
    const trill_lora_config lora = { .rank = 8, .alpha = 16, .targets = TRILL_LORA_ALL_LINEAR };
    assert_int_equal(trill_plan_count(&c, &lora, &k), TRILL_OK);
    assert_true(k.sum_lora == want);
}

/* A cluster file: read whole; each refusal names the file, the field and what it expects. */
static void test_cluster_files(void **state) {
    (void)state;
    trill_cluster k;
    assert_int_equal(trill_cluster_load("h800:8", &k), TRILL_OK);
    assert_true(k.nodes == 8 && k.devices_per_node == 8 && k.memory_gb == 80 && k.intra_bw_gbs == 200);
    assert_int_not_equal(trill_cluster_load("h800:0", &k), TRILL_OK);
    assert_int_not_equal(trill_cluster_load("a100", &k), TRILL_OK);
    assert_non_null(strstr(trill_error_message(), "h100-sxm"));
    char *dir = test_tmpdir("plan"), path[4200];
    assert_non_null(dir);
    snprintf(path, sizeof path, "%s/cluster.yaml", dir);
    const char *good = "name: two CPUs\nnodes: 2\ndevices_per_node: 1\nmemory_gb: 24\nbf16_tflops: 0.47\nmemory_bw_gbs: 46\n"
                       "intra_bw_gbs: 20\ninter_bw_gbs: 1.25\nintra_latency_us: 1\ninter_latency_us: 50\n";
    test_write(dir, "cluster.yaml", good, strlen(good));
    assert_int_equal(trill_cluster_load(path, &k), TRILL_OK);
    assert_true(k.nodes == 2 && k.memory_gb == 24 && k.inter_bw_gbs == 1.25 && !strcmp(k.name, "two CPUs") && k.fp8_tflops == 0);
    static const struct { const char *text, *want; } bad[] = {
        { "nodes: 2\n", "devices_per_node is missing" },
        { "nodes: two\n", "nodes: 'two' is not an integer" },
        { "nodes: 1.5\n", "not an integer" },
        { "nodes: 1\nmemory_gib: 3\n", "memory_gib: unknown field" },
        { "- 1\n- 2\n", "expected a mapping" },
        { "nodes: [1\n", ":" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        test_write(dir, "cluster.yaml", bad[i].text, strlen(bad[i].text));
        assert_int_not_equal(trill_cluster_load(path, &k), TRILL_OK);
        const char *msg = trill_error_message();
        if (!strstr(msg, path) || !strstr(msg, bad[i].want)) fail_msg("'%s': the message '%s' lacks the file or '%s'", bad[i].text, msg, bad[i].want);
    }
    test_rmdir(dir);
    free(dir);
}

/* The plan of the default run configuration on the tiny preset: LoRA's bytes on the trainer are
 * 16 a trainable value (fp32 value, gradient, two moments); a layout larger than the cluster is
 * refused with its arithmetic. */
static void test_plan_bytes(void **state) {
    (void)state;
    trill_run_config rc;
    assert_int_equal(trill_run_config_defaults(&rc), TRILL_OK);
    trill_config c = preset("tiny");
    trill_cluster k;
    assert_int_equal(trill_cluster_load("h100-sxm", &k), TRILL_OK);
    trill_plan p;
    assert_int_equal(trill_plan_make(&c, &rc, &k, NULL, &p), TRILL_OK);
    assert_true(p.memory.adapters == 4.0 * p.counts.sum_lora && p.memory.optimizer == 8.0 * p.counts.sum_lora);
    assert_true(p.sync.adapter_bytes == 4.0 * p.counts.sum_lora && p.sync.merge_bytes > p.sync.adapter_bytes);
    assert_true(p.memory.trainer_fits && p.memory.generator_fits && p.memory.kv_tokens > 1000000);
    /* expert parallelism divides the routed experts' base over the ranks */
    const double base1 = p.memory.base;
    rc.parallel.trainer.ep = 2;
    assert_int_equal(trill_plan_make(&c, &rc, &k, NULL, &p), TRILL_OK);
    assert_true(p.memory.base < base1 && p.trainer_devices == 2);
    rc.parallel.trainer.dp = 8;
    assert_int_not_equal(trill_plan_make(&c, &rc, &k, NULL, &p), TRILL_OK);
    assert_non_null(strstr(trill_error_message(), "16 in all; the cluster has 8"));
    trill_run_config_free(&rc);
}

/* The step-time model's structure: decode steps as the spread says, a batch-1 decode step bound by
 * bandwidth (twice the bandwidth, half the time), training by compute (twice the peak, half the
 * time, on one device without communication), and async the larger of generation and training
 * plus the sync when the generator has its own devices. */
static void test_step_time(void **state) {
    (void)state;
    trill_run_config rc;
    assert_int_equal(trill_run_config_defaults(&rc), TRILL_OK);
    trill_config c = preset("small");
    trill_cluster k;
    assert_int_equal(trill_cluster_load("h100-sxm", &k), TRILL_OK);
    rc.generator.prompts_per_step = 1, rc.generator.n = 1, rc.generator.max_new_tokens = 64;
    trill_plan p, q;
    trill_plan_workload w = { .prompt_len = 16, .response_len = 20, .spread = TRILL_SPREAD_FIXED };
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &p), TRILL_OK);
    assert_int_equal(p.time.decode_steps, 20);
    assert_true(p.time.decode_bound_bw == 1.0);
    w.spread = TRILL_SPREAD_UNIFORM;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &q), TRILL_OK);
    assert_int_equal(q.time.decode_steps, 39); /* lengths 1 .. 2 x 20 - 1 */
    w.spread = TRILL_SPREAD_EXPONENTIAL;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &q), TRILL_OK);
    assert_int_equal(q.time.decode_steps, 64); /* up to max_new_tokens */
    w.spread = TRILL_SPREAD_FIXED;
    trill_cluster k2 = k;
    k2.memory_bw_gbs *= 2;
    assert_int_equal(trill_plan_make(&c, &rc, &k2, &w, &q), TRILL_OK);
    assert_true(fabs(q.time.decode_s / p.time.decode_s - 0.5) < 1e-12);
    k2 = k;
    k2.bf16_tflops *= 2;
    assert_int_equal(trill_plan_make(&c, &rc, &k2, &w, &q), TRILL_OK);
    assert_true(fabs(q.time.train_s / p.time.train_s - 0.5) < 1e-12 && p.time.train_comm_s == 0);
    assert_true(fabs(q.time.prefill_s / p.time.prefill_s - 0.5) < 1e-12);
    /* a KL coefficient adds the reference's forward: 3 passes where there were 2 */
    rc.algo.kl_coef = 0.01;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &q), TRILL_OK);
    assert_true(fabs(q.time.train_flops / p.time.train_flops - 1.5) < 1e-12);
    rc.algo.kl_coef = 0;
    /* full fine-tuning: every trainable weight in fp32 with its gradient and moments, a pass more
     * for the weights' gradients, and merge the only sync */
    w.full = true;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &q), TRILL_OK);
    assert_true(fabs(q.time.train_flops / p.time.train_flops - 1.5) < 1e-12);
    assert_true(q.counts.trainable == q.counts.sum_total && q.sync.adapter_bytes == 0 && q.memory.base == 0);
    assert_true(q.memory.adapters == 4.0 * (double)q.counts.trainable && q.memory.optimizer == 8.0 * (double)q.counts.trainable);
    w.full = false;
    /* the generator on 2 devices of its own, 6 trainer devices, 64 rollouts */
    rc.generator.prompts_per_step = 8, rc.generator.n = 8, rc.parallel.trainer.dp = 6, rc.parallel.generator.replicas = 2;
    rc.parallel.generator.ep = 1;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &p), TRILL_OK);
    const trill_plan_time *t = &p.time;
    assert_true(t->sync_step_s == t->gen_s + t->train_s + t->sync_s);
    assert_true(t->async_step_s == fmax(t->gen_s, t->train_s + t->sync_s) && t->async_speedup > 1);
    assert_true(t->train_comm_s > 0 && t->colocated_step_s > 0 && t->colocated_step_s != t->sync_step_s);
    rc.async.max_staleness = 0; /* on-policy: nothing overlaps */
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &q), TRILL_OK);
    assert_true(q.time.async_step_s == q.time.sync_step_s && q.time.async_speedup == 1);
    rc.async.max_staleness = 1;
    assert_true(t->gen_concurrent == 32); /* a replica's 32 rollouts at once */
    /* point to point over min(6 trainer, 2 generator devices) links: half the broadcast's transfer */
    const double lat = k.intra_latency_us * 1e-6;
    assert_true(fabs((p.sync.merge_p2p_s - lat) * 2 - (p.sync.merge_s - lat)) < 1e-12 * p.sync.merge_s);
    /* the 8 samples of a prompt share its prefill: 64 prompts of one sample prefill 8 times the tokens */
    rc.generator.prompts_per_step = 64, rc.generator.n = 1;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &q), TRILL_OK);
    assert_true(fabs(q.time.prefill_s / p.time.prefill_s - 8) < 1e-9 && q.time.decode_s == p.time.decode_s);
    rc.generator.prompts_per_step = 8, rc.generator.n = 8;
    /* continuous batching: a device whose KV cache holds 200 tokens runs 16 of its 32 rollouts
     * at once (12.5 tokens each on average: a 16-token prompt shared by 8 samples, 2 each, and a
     * running response's mean age 10.5 of 20), 20 steps of 16 full rows before the last 16 run
     * out in 20 more */
    k2 = k;
    k2.memory_gb = (p.memory.gen_weights + 200.5 * p.memory.kv_bytes_per_token) / (1 - 0.1) / 1e9;
    assert_int_equal(trill_plan_make(&c, &rc, &k2, &w, &q), TRILL_OK);
    assert_int_equal(q.memory.kv_tokens, 200);
    assert_true(fabs(q.time.gen_concurrent - 16) < 1e-9);
    assert_int_equal(q.time.decode_steps, 20 + 20);
    assert_true(q.time.decode_s > 1.8 * p.time.decode_s && q.time.decode_s < 2.2 * p.time.decode_s);
    assert_true(fabs(q.time.prefill_s / p.time.prefill_s - 1) < 1e-9); /* every prompt, once */
    trill_run_config_free(&rc);
}

/* --gen-tp: generators of tensor-parallel devices, as vLLM's (trill's own have none) */
static void test_generator_tp(void **state) {
    (void)state;
    trill_run_config rc;
    assert_int_equal(trill_run_config_defaults(&rc), TRILL_OK);
    trill_config c = preset("small");
    trill_cluster k;
    assert_int_equal(trill_cluster_load("h100-sxm:4", &k), TRILL_OK);
    rc.generator.prompts_per_step = 8, rc.generator.n = 8, rc.generator.max_new_tokens = 64, rc.generator.dtype = TRILL_GEN_BF16;
    rc.parallel.trainer.dp = 2, rc.parallel.generator.replicas = 2;
    trill_plan_workload w = { .prompt_len = 16, .response_len = 20, .spread = TRILL_SPREAD_FIXED };
    trill_plan p, q;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &p), TRILL_OK);
    w.gen_tp = 2;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &q), TRILL_OK);
    assert_int_equal(q.generator_devices, 2 * 2);
    /* small's 4 kv heads split in 2; every matrix and the embedding split, the norms whole */
    assert_true(q.memory.kv_bytes_per_token == p.memory.kv_bytes_per_token / 2);
    assert_true(q.memory.gen_weights > 0.5 * p.memory.gen_weights && q.memory.gen_weights < 0.51 * p.memory.gen_weights);
    assert_true(q.sync.merge_bytes == p.sync.merge_bytes);
    /* twice the devices: prefill's compute halves (plus its all-reduces); decode reads half the bytes a device, plus 2 all-reduces a layer */
    const double tokens = 4.0 * 16; /* a replica's 4 prompts' tokens (8 samples each), each one's hidden state all-reduced twice a layer */
    /* an all-reduce over 2 ranks: 2 latencies (a tree's depth 1, down and up) and half the bytes twice over the link */
    const double prefill_ar = 2.0 * c.num_hidden_layers * (2 * k.intra_latency_us * 1e-6 + tokens * c.hidden_size * 2 * 2 * 0.5 / (k.intra_bw_gbs * 1e9));
    assert_true(fabs(q.time.prefill_s - (0.5 * p.time.prefill_s + prefill_ar)) < 1e-9 * q.time.prefill_s);
    const double ar = 2.0 * c.num_hidden_layers * q.time.decode_steps *
                      (2 * k.intra_latency_us * 1e-6 + 32.0 * c.hidden_size * 2 * 2 * 0.5 / (k.intra_bw_gbs * 1e9)); /* 32 rows a step */
    assert_true(q.time.decode_s > 0.5 * p.time.decode_s + ar && q.time.decode_s < 0.51 * p.time.decode_s + ar); /* the norms whole */
    /* 16-way across two nodes of 8 costs more a step than within one node of 16 */
    w.gen_tp = 16;
    rc.parallel.trainer.dp = 1, rc.parallel.generator.replicas = 1;
    trill_cluster wide = k;
    wide.devices_per_node = 16, wide.nodes = 2;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &p), TRILL_OK);
    assert_int_equal(trill_plan_make(&c, &rc, &wide, &w, &q), TRILL_OK);
    assert_true(p.time.decode_s > q.time.decode_s);
    /* without replicas the trainer's ranks generate, without tensor parallelism */
    rc.parallel.generator.replicas = 0;
    assert_int_not_equal(trill_plan_make(&c, &rc, &k, &w, &p), TRILL_OK);
    assert_non_null(strstr(trill_error_message(), "parallel.generator.replicas"));
    trill_run_config_free(&rc);
}

/* --search: the layouts it keeps fit the cluster, come fastest first, and the best is no slower
 * than a layout written by hand that fits (Qwen3-30B-A3B on 2 nodes of 8 H100s). */
static void test_search(void **state) {
    (void)state;
    trill_run_config rc;
    assert_int_equal(trill_run_config_defaults(&rc), TRILL_OK);
    trill_config c = preset("qwen3-30b-a3b");
    trill_cluster k;
    assert_int_equal(trill_cluster_load("h100-sxm:2", &k), TRILL_OK);
    rc.generator.max_new_tokens = 2048;
    rc.mode = TRILL_MODE_ASYNC;
    const trill_plan_workload w = { .prompt_len = 256, .response_len = 1024, .spread = TRILL_SPREAD_UNIFORM };
    trill_plan_layout best[5];
    int n, tried;
    assert_int_equal(trill_plan_search(&c, &rc, &k, &w, best, 5, &n, &tried), TRILL_OK);
    assert_true(n == 5 && tried > 50);
    for (int i = 0; i < n; i++) {
        const trill_plan_layout *l = &best[i];
        assert_true(l->plan.memory.trainer_fits && l->plan.memory.generator_fits);
        assert_true(l->dp * l->ep * l->tp + l->replicas * l->gen_ep <= 16 && l->tp <= 8);
        assert_true(l->step_s == l->plan.time.async_step_s);
        if (i) assert_true(best[i - 1].step_s <= l->step_s);
    }
    /* by hand: trainer ep 2 x tp 4, two generators of ep 4 */
    rc.parallel.trainer.ep = 2, rc.parallel.trainer.tp = 4, rc.parallel.generator.replicas = 2, rc.parallel.generator.ep = 4;
    trill_plan p;
    assert_int_equal(trill_plan_make(&c, &rc, &k, &w, &p), TRILL_OK);
    assert_true(p.memory.trainer_fits && p.memory.generator_fits);
    assert_true(best[0].step_s <= p.time.async_step_s);
    /* nothing fits one 80 GB device for Kimi K2 */
    c = preset("kimi-k2");
    assert_int_equal(trill_cluster_load("h100-sxm", &k), TRILL_OK);
    k.devices_per_node = 1;
    assert_int_equal(trill_plan_search(&c, &rc, &k, &w, best, 5, &n, &tried), TRILL_OK);
    assert_int_equal(n, 0);
    trill_run_config_free(&rc);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_preset_adds_up), cmocka_unit_test(test_published_totals), cmocka_unit_test(test_k2_lora_by_hand),
        cmocka_unit_test(test_small_lora_by_hand),   cmocka_unit_test(test_cluster_files),    cmocka_unit_test(test_plan_bytes),
        cmocka_unit_test(test_step_time),            cmocka_unit_test(test_generator_tp),     cmocka_unit_test(test_search),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
