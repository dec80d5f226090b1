/* bench_forward: throughput of the reference forward (trill_model_forward), set against
 * the machine's fp32 GEMM peak measured in the same run.
 *
 * A benchmark, not a test: it prints figures and fails only if it cannot run.
 *
 *   bench_forward [--preset NAME] [--batch B] [--seq L] [--runs N] [--skip-peak]
 *
 * FLOPs are counted analytically (2 per multiply-add) from the config and the batch:
 *   - attention projections q, k, v, o over all T tokens;
 *   - the router (MoE layers) and the dense MLP (gate, up, down) of dense layers;
 *   - the experts actually run: top_k experts per token, 3 matrices each;
 *   - lm_head over all T tokens (the forward computes logits for every row);
 *   - attention scores Q·K^T and probabilities·V, causal: a query at position t reads
 *     t+1 keys, so per head and sequence of length L both cost sum_t (t+1)·hd·2 FLOPs.
 * Elementwise work (norms, RoPE, softmax, SwiGLU, residuals, log-softmax) is not counted,
 * so GFLOP/s here is "useful matmul-equivalent work per second". */
#include <cblas.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trill/timing.h"
#include "model/config_json.h"
#include "trill/config.h"
#include "model/model_internal.h"
#include "trill/model.h"
#include "trill/rng.h"
#include "trill/train.h"

static void die(const char *msg) {
    fprintf(stderr, "bench_forward: %s\n", msg);
    exit(1);
}

static int parse_int(const char *opt, const char *s, int min) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min || v > 1 << 24) {
        fprintf(stderr, "bench_forward: %s expects an integer >= %d, got '%s'\n", opt, min, s);
        exit(2);
    }
    return (int)v;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_forward [--preset NAME] [--batch B] [--seq L] [--runs N] [--skip-peak]\n"
               "  --preset NAME  model preset (%s; default small)\n"
               "  --batch B      sequences per forward (default 8)\n"
               "  --seq L        tokens per sequence (default 256)\n"
               "  --runs N       timed runs after one warm-up (default 3, at least 1)\n"
               "  --skip-peak    do not measure the sgemm peak\n",
            trill_config_preset_names());
}

/* ---- sgemm peak ------------------------------------------------------------------------ */

/* Best-of and median-of `runs` timings of a square sgemm; returns the best GFLOP/s. */
static double sgemm_peak(int n, int runs) {
    size_t nn = (size_t)n * n;
    float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float)), *c = malloc(nn * sizeof(float));
    double *t = malloc(runs * sizeof(double));
    if (!a || !b || !c || !t) die("out of memory for the sgemm peak");
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(trill_rng_uniform(1, i) - 0.5);
        b[i] = (float)(trill_rng_uniform(2, i) - 0.5);
    }
    const double flops = 2.0 * n * n * n;
    /* same layout as trill_matmul_forward: row-major A times B^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
    for (int r = 0; r < runs; r++) {
        double t0 = trill_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        t[r] = trill_now() - t0;
    }
    double med = trill_median(t, runs), best = t[0]; /* trill_median() sorted t */
    printf("sgemm %dx%dx%d (NT, fp32), %d runs after 1 warm-up:\n", n, n, n, runs);
    printf("  best   %8.2f ms  %8.2f GFLOP/s\n", best * 1e3, flops / best * 1e-9);
    printf("  median %8.2f ms  %8.2f GFLOP/s\n", med * 1e3, flops / med * 1e-9);
    free(a), free(b), free(c), free(t);
    return flops / best * 1e-9;
}

/* ---- main ------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    const char *preset = "small";
    int batch = 8, seq = 256, runs = 3, skip_peak = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--skip-peak")) { skip_peak = 1; continue; }
        int takes_value = !strcmp(a, "--preset") || !strcmp(a, "--batch") || !strcmp(a, "--seq") || !strcmp(a, "--runs");
        if (!takes_value) { fprintf(stderr, "bench_forward: unknown option %s\n", a); usage(stderr); return 2; }
        if (i + 1 >= argc) { fprintf(stderr, "bench_forward: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--preset")) preset = argv[++i];
        else if (!strcmp(a, "--batch")) batch = parse_int(a, argv[++i], 1);
        else if (!strcmp(a, "--seq")) seq = parse_int(a, argv[++i], 1);
        else runs = parse_int(a, argv[++i], 1);
    }

    if ((long long)batch * seq > 1 << 24) {
        fprintf(stderr, "bench_forward: batch x seq = %lld tokens is more than this benchmark allows (%d)\n", (long long)batch * seq, 1 << 24);
        return 2;
    }
    const char *env[] = { "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY" };
    printf("threads: omp_get_max_threads=%d openblas_get_num_threads=%d (", omp_get_max_threads(), openblas_get_num_threads());
    for (int i = 0; i < 3; i++) printf("%s%s=%s", i ? " " : "", env[i], getenv(env[i]) ? getenv(env[i]) : "unset");
    printf(")\n");
    {
        int par = openblas_get_parallel();
        printf("openblas: %s, %s\n", openblas_get_config(),
               par == 0 ? "sequential" : par == 1 ? "pthreads" : par == 2 ? "openmp" : "?");
    }

    double peak = 0.0;
    if (!skip_peak) peak = sgemm_peak(2048, runs < 3 ? 3 : runs);

    /* model */
    json_t *js = trill_config_preset(preset);
    if (!js) {
        fprintf(stderr, "bench_forward: unknown preset '%s' (known: %s)\n", preset, trill_config_preset_names());
        return 2;
    }
    trill_config cfg;
    trill_model *m = NULL;
    if (trill_config_from_json(js, preset, &cfg) || trill_model_create(&cfg, &m)) {
        fprintf(stderr, "bench_forward: %s\n", trill_error_message());
        return 1;
    }
    json_decref(js);
    double t_init = trill_now();
    trill_model_init_random(m, 0);
    t_init = trill_now() - t_init;
    int64_t n_total, n_active;
    trill_config_param_counts(&cfg, &n_total, &n_active);
    printf("model %s: %d layers (%d MoE), hidden %d, heads %d/%d x %d, experts %d top-%d (Im %d), dense I %d, vocab %d; "
           "%.1fM params, %.1fM active per token (random init %.1f s)\n",
           preset, cfg.num_hidden_layers, cfg.n_moe_layers, cfg.hidden_size, cfg.num_attention_heads,
           cfg.num_key_value_heads, cfg.head_dim, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
           cfg.intermediate_size, cfg.vocab_size, n_total * 1e-6, n_active * 1e-6, t_init);

    /* batch: `batch` sequences of `seq` random token ids, fixed seed */
    const int T = batch * seq;
    int *tokens = malloc(sizeof(int) * T), *offsets = malloc(sizeof(int) * (batch + 1));
    float *logprobs = malloc(sizeof(float) * T);
    size_t n_exp = (size_t)T * (cfg.n_moe_layers > 0 ? cfg.n_moe_layers : 1) * (cfg.num_experts_per_tok > 0 ? cfg.num_experts_per_tok : 1);
    uint16_t *experts = malloc(sizeof(uint16_t) * n_exp);
    double *times = malloc(sizeof(double) * runs);
    if (!tokens || !offsets || !logprobs || !experts || !times) die("out of memory for the batch");
    for (int t = 0; t < T; t++) tokens[t] = (int)(trill_rng_bits(12345, t) % (uint64_t)cfg.vocab_size);
    for (int s = 0; s <= batch; s++) offsets[s] = s * seq;

    const double flops = trill_forward_flops(&cfg, offsets, batch);
    printf("FLOPs per forward: %.2f GFLOP, counted as the code does them (trill_forward_flops): 2 per multiply-add\n"
           "  of q/k/v/o, router, dense MLP, the top-k experts used, lm_head, causal QK^T and PV; elementwise work not counted\n",
           flops * 1e-9);

    /* forward: one warm-up, then `runs` timed, router capture on */
    trill_status st = trill_model_forward(m, tokens, offsets, batch, NULL, logprobs, experts);
    if (st) { fprintf(stderr, "bench_forward: forward: %s\n", trill_error_message()); return 1; }
    for (int r = 0; r < runs; r++) {
        double t0 = trill_now();
        st = trill_model_forward(m, tokens, offsets, batch, NULL, logprobs, experts);
        times[r] = trill_now() - t0;
        if (st) { fprintf(stderr, "bench_forward: forward: %s\n", trill_error_message()); return 1; }
    }
    /* checksum: mean log-prob over predicted tokens (~ -log(vocab) for a random model) */
    double sum_lp = 0.0;
    int n_lp = 0;
    for (int t = 0; t < T; t++)
        if (!isnan(logprobs[t])) sum_lp += logprobs[t], n_lp++;
    printf("forward %s %dx%d (T=%d tokens, router capture on), %d timed runs after 1 warm-up; mean logprob %.6f:\n",
           preset, batch, seq, T, runs, n_lp ? sum_lp / n_lp : NAN);
    printf("  runs (ms):");
    for (int r = 0; r < runs; r++) printf(" %.1f", times[r] * 1e3);
    printf("\n");
    double med = trill_median(times, runs), best = times[0]; /* trill_median() sorted times */
    const char *label[2] = { "best  ", "median" };
    double tt[2] = { best, med };
    for (int i = 0; i < 2; i++) {
        printf("  %s %9.2f ms/forward %10.0f tokens/s %8.2f GFLOP/s", label[i], tt[i] * 1e3, T / tt[i],
               flops / tt[i] * 1e-9);
        if (peak > 0) printf("  %5.1f%% of sgemm peak", 100.0 * flops / tt[i] * 1e-9 / peak);
        printf("\n");
    }
    /* summary: the median forward; the peak is the best sgemm run */
    printf("forward %s %dx%d: %.0f tokens/s, %.2f GFLOP/s", preset, batch, seq, T / med, flops / med * 1e-9);
    if (peak > 0) printf(" (%.1f%% of sgemm peak %.2f GFLOP/s)", 100.0 * flops / med * 1e-9 / peak, peak);
    printf("\n");

    free(tokens), free(offsets), free(logprobs), free(experts), free(times);
    trill_model_free(m);
    return 0;
}
