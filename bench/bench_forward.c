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
#include <stdbool.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "trill/config.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/train.h"
#include "trill/rng.h"

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
    fprintf(f, "usage: bench_forward [--preset NAME] [--batch B] [--seq L] [--runs N] [--skip-peak] [--train full|lora|both] [--rank R]\n"
               "  --preset NAME  model preset (%s; default small)\n"
               "  --batch B      sequences per forward (default 8)\n"
               "  --seq L        tokens per sequence (default 256)\n"
               "  --runs N       timed runs after one warm-up (default 3, at least 1)\n"
               "  --skip-peak    do not measure the sgemm peak\n"
               "  --train MODE   also time a training step (forward + backward): full, lora (all-linear) or both\n"
               "  --rank R       LoRA rank for --train lora (default 16)\n"
               "  --recompute    --train with activation checkpointing\n",
            trill_config_preset_names);
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
    /* same layout as matmul_forward: row-major A times B^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n); /* warm-up */
    for (int r = 0; r < runs; r++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        t[r] = now_s() - t0;
    }
    double med = median(t, runs), best = t[0]; /* median() sorted t */
    printf("sgemm %dx%dx%d (NT, fp32), %d runs after 1 warm-up:\n", n, n, n, runs);
    printf("  best   %8.2f ms  %8.2f GFLOP/s\n", best * 1e3, flops / best * 1e-9);
    printf("  median %8.2f ms  %8.2f GFLOP/s\n", med * 1e3, flops / med * 1e-9);
    free(a), free(b), free(c), free(t);
    return flops / best * 1e-9;
}

/* ---- analytic FLOP count ---------------------------------------------------------------- */

enum { F_QKVO, F_ATTN, F_ROUTER, F_DENSE, F_EXPERTS, F_HEAD, F_N };
static const char *const flop_names[F_N] = {
    "q/k/v/o projections", "attention QK^T + PV (causal)", "router", "dense MLP (gate, up, down)",
    "experts (top-k x 3 matrices)", "lm_head (all tokens)",
};

static void count_flops(const trill_config *c, const int *offsets, int n_seqs, double f[F_N]) {
    const double T = offsets[n_seqs], H = c->hidden_size, hd = c->head_dim;
    const double qd = (double)c->num_attention_heads * hd, kvd = (double)c->num_key_value_heads * hd;
    /* sum over sequences of sum_{t<L} (t+1) = L(L+1)/2 key reads per query head */
    double pairs = 0.0;
    for (int s = 0; s < n_seqs; s++) {
        double L = offsets[s + 1] - offsets[s];
        pairs += L * (L + 1) / 2;
    }
    memset(f, 0, sizeof(double) * F_N);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        f[F_QKVO] += 2 * T * H * (qd + 2 * kvd) + 2 * T * qd * H;
        f[F_ATTN] += 2 * (pairs * hd * 2) * c->num_attention_heads; /* QK and PV */
        if (trill_config_is_moe(c, l)) {
            f[F_ROUTER] += 2 * T * H * c->num_experts;
            f[F_EXPERTS] += 2 * T * c->num_experts_per_tok * 3 * H * c->moe_intermediate_size;
        } else {
            f[F_DENSE] += 2 * T * 3 * H * c->intermediate_size;
        }
    }
    f[F_HEAD] = 2 * T * H * c->vocab_size;
}

/* LoRA's own forward FLOPs (x A^T, then (x A^T) B^T) for adapters on every linear layer but
 * lm_head; expert adapters see T*K rows in all. */
static double lora_forward_flops(const trill_config *c, double T, double r) {
    const double H = c->hidden_size, qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
    double f = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        f += 2 * T * r * ((H + qd) * 2 + (H + kvd) * 2);
        double rows = trill_config_is_moe(c, l) ? T * c->num_experts_per_tok : T;
        double inter = trill_config_is_moe(c, l) ? c->moe_intermediate_size : c->intermediate_size;
        f += 2 * rows * r * (H + inter) * 3;
    }
    return f;
}

/* One training step (forward keeping activations + backward), timed; FLOPs as done:
 *   full: forward M + A, backward 2M (input and weight gradients) + lm_head recomputed + 2.5 A
 *   lora: forward M + A + lora, backward M (input gradients only) + lm_head + 2.5 A + 2 lora
 * with M the matmul FLOPs, A attention's (the backward recomputes QK^T, then dV, dP, dQ, dK). */
static void bench_train(trill_model *m, const char *mode, int rank, bool recompute, const int *tokens, const int *offsets, int batch,
                        int runs, const double f[F_N], double peak) {
    const trill_config *c = &m->config;
    const int T = offsets[batch];
    bool lora_mode = strcmp(mode, "lora") == 0;
    trill_lora *lora = NULL;
    if (lora_mode) {
        trill_lora_config lc = { .rank = rank, .alpha = 2.0 * rank };
        trill_lora_parse_targets("all-linear", &lc.targets);
        if (trill_lora_create(m, lc, 1, &lora)) die(trill_error_message());
        trill_model_attach_lora(m, lora);
    }
    double M = f[F_QKVO] + f[F_ROUTER] + f[F_DENSE] + f[F_EXPERTS] + f[F_HEAD], A = f[F_ATTN];
    double lf = lora_mode ? lora_forward_flops(c, T, rank) : 0;
    double flops = lora_mode ? (M + A + lf) + (M + f[F_HEAD] + 2.5 * A + 2 * lf) : (M + A) + (2 * M + f[F_HEAD] + 2.5 * A);
    if (recompute) flops += M - f[F_HEAD] + A + lf; /* every layer's forward again (not lm_head) */
    float *grads = lora_mode ? NULL : calloc(m->n_params, sizeof(float));
    float *lgrads = lora_mode ? calloc(lora->n_params, sizeof(float)) : NULL;
    float *lp = malloc(sizeof(float) * T), *dlp = malloc(sizeof(float) * T);
    for (int t = 0; t < T; t++) dlp[t] = -1.0f / T; /* mean cross-entropy */
    double *times = malloc(sizeof(double) * runs);
    for (int r = -1; r < runs; r++) { /* one warm-up */
        double t0 = now_s();
        trill_forward_pass *pass;
        if (trill_model_forward_train(m, tokens, offsets, batch, NULL, lp, NULL, recompute, &pass) ||
            trill_model_backward(pass, dlp, grads, lgrads))
            die(trill_error_message());
        trill_forward_pass_free(pass);
        if (r >= 0) times[r] = now_s() - t0;
    }
    double med = median(times, runs);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("train step (%s%s", mode, recompute ? ", recompute" : "");
    if (lora_mode) printf(", rank %d on all linear layers", rank);
    printf(") %dx%d: FLOPs %.1f GFLOP; median %.0f ms: %.0f tokens/s, %.2f GFLOP/s", batch, T / batch, flops * 1e-9, med * 1e3,
           T / med, flops / med * 1e-9);
    if (peak > 0) printf(" (%.1f%% of sgemm peak)", 100.0 * flops / med * 1e-9 / peak);
    printf("; peak RSS %.0f MB\n", ru.ru_maxrss / 1024.0);
    trill_model_attach_lora(m, NULL);
    trill_lora_free(lora);
    free(grads), free(lgrads), free(lp), free(dlp), free(times);
}

/* ---- main ------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    const char *preset = "small";
    int batch = 8, seq = 256, runs = 3, skip_peak = 0, rank = 16;
    const char *train = NULL;
    bool recompute = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--skip-peak")) { skip_peak = 1; continue; }
        if (!strcmp(a, "--recompute")) { recompute = true; continue; }
        int takes_value = !strcmp(a, "--preset") || !strcmp(a, "--batch") || !strcmp(a, "--seq") || !strcmp(a, "--runs") ||
                          !strcmp(a, "--train") || !strcmp(a, "--rank");
        if (!takes_value) { fprintf(stderr, "bench_forward: unknown option %s\n", a); usage(stderr); return 2; }
        if (i + 1 >= argc) { fprintf(stderr, "bench_forward: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--preset")) preset = argv[++i];
        else if (!strcmp(a, "--batch")) batch = parse_int(a, argv[++i], 1);
        else if (!strcmp(a, "--seq")) seq = parse_int(a, argv[++i], 1);
        else if (!strcmp(a, "--rank")) rank = parse_int(a, argv[++i], 1);
        else if (!strcmp(a, "--train")) {
            train = argv[++i];
            if (strcmp(train, "full") && strcmp(train, "lora") && strcmp(train, "both")) { fprintf(stderr, "bench_forward: --train full|lora|both\n"); return 2; }
        }
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
        fprintf(stderr, "bench_forward: unknown preset '%s' (known: %s)\n", preset, trill_config_preset_names);
        return 2;
    }
    trill_config cfg;
    trill_model *m = NULL;
    if (trill_config_from_json(js, preset, &cfg) || trill_model_create(&cfg, &m)) {
        fprintf(stderr, "bench_forward: %s\n", trill_error_message());
        return 1;
    }
    json_decref(js);
    double t_init = now_s();
    trill_model_init_random(m, 0);
    t_init = now_s() - t_init;
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

    double f[F_N], flops = 0.0;
    count_flops(&cfg, offsets, batch, f);
    for (int i = 0; i < F_N; i++) flops += f[i];
    printf("FLOPs per forward: %.2f GFLOP, analytic, 2 per multiply-add: q/k/v/o, router, dense MLP, top-k experts\n"
           "  actually used (k x 3 matrices per token), lm_head over all tokens, causal QK^T and PV;\n"
           "  not counted: norms, RoPE, softmax, SwiGLU, residuals, log-softmax\n", flops * 1e-9);
    for (int i = 0; i < F_N; i++)
        if (f[i] > 0) printf("  %-30s %8.3f GFLOP %5.1f%%\n", flop_names[i], f[i] * 1e-9, 100.0 * f[i] / flops);

    /* forward: one warm-up, then `runs` timed, router capture on */
    trill_status st = trill_model_forward(m, tokens, offsets, batch, NULL, logprobs, experts);
    if (st) { fprintf(stderr, "bench_forward: forward: %s\n", trill_error_message()); return 1; }
    for (int r = 0; r < runs; r++) {
        double t0 = now_s();
        st = trill_model_forward(m, tokens, offsets, batch, NULL, logprobs, experts);
        times[r] = now_s() - t0;
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
    double med = median(times, runs), best = times[0]; /* median() sorted times */
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

    if (train) {
        if (strcmp(train, "lora") != 0) bench_train(m, "full", rank, recompute, tokens, offsets, batch, runs, f, peak);
        if (strcmp(train, "full") != 0) bench_train(m, "lora", rank, recompute, tokens, offsets, batch, runs, f, peak);
    }

    free(tokens), free(offsets), free(logprobs), free(experts), free(times);
    trill_model_free(m);
    return 0;
}
