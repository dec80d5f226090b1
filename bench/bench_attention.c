/* bench_attention: time of the causal GQA attention kernels alone (trill_attention_forward and
 * trill_attention_backward, fp32) on a packed batch of equal-length sequences.
 *
 * A benchmark, not a test: it prints figures and fails only if it cannot run.
 *
 *   bench_attention [--attention] [--preset NAME] [--batch B] [--seq L] [--runs N]
 *                   [--qk-dim D] [--v-dim D]
 *
 * Head shapes come from the preset (default small); --qk-dim / --v-dim replace the query/key
 * and value head sizes (DeepSeek MLA: 192 and 128), the scale staying qk-dim^-1/2. FLOPs are
 * counted as the causal work (2 per multiply-add): forward Q·K^T (hd_qk) and P·V (hd_v), sum
 * over rows t of (t+1)·hd·2 each, per query head; backward dP = dO·V^T and dV (hd_v), dQ and
 * dK (hd_qk) (the recomputed Q·K^T of the backward is not counted). `--attention` is accepted for symmetry with the other benchmarks
 * and is the default (and only) mode. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config_json.h"
#include "trill/config.h"
#include "trill/error.h"
#include "trill/kernels.h"
#include "trill/rng.h"
#include "trill/timing.h"

static int parse_int(const char *opt, const char *s, int min) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min || v > 1 << 24) {
        fprintf(stderr, "bench_attention: %s expects an integer >= %d, got '%s'\n", opt, min, s);
        exit(2);
    }
    return (int)v;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_attention [--attention] [--preset NAME] [--batch B] [--seq L] [--runs N]\n"
               "  --preset NAME  head shapes from this model preset (%s; default small)\n"
               "  --batch B      sequences (default 8)\n"
               "  --seq L        tokens per sequence (default 512)\n"
               "  --runs N       timed runs after one warm-up (default 5)\n"
               "  --qk-dim D     query/key head size (default: the preset's head_dim)\n"
               "  --v-dim D      value head size (default: the preset's head_dim)\n",
            trill_config_preset_names());
}

static float *randn(size_t n, uint64_t stream) {
    float *x = malloc(sizeof(float) * n);
    if (!x) {
        fprintf(stderr, "bench_attention: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)(2.0 * trill_rng_uniform(stream, i) - 1.0);
    return x;
}

int main(int argc, char **argv) {
    const char *preset = "small";
    int batch = 8, seq = 512, runs = 5, qk_dim = 0, v_dim = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--attention")) continue;
        int takes_value = !strcmp(a, "--preset") || !strcmp(a, "--batch") || !strcmp(a, "--seq") || !strcmp(a, "--runs") ||
                          !strcmp(a, "--qk-dim") || !strcmp(a, "--v-dim");
        if (!takes_value) { fprintf(stderr, "bench_attention: unknown option %s\n", a); usage(stderr); return 2; }
        if (i + 1 >= argc) { fprintf(stderr, "bench_attention: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--preset")) preset = argv[++i];
        else if (!strcmp(a, "--batch")) batch = parse_int(a, argv[++i], 1);
        else if (!strcmp(a, "--seq")) seq = parse_int(a, argv[++i], 1);
        else if (!strcmp(a, "--qk-dim")) qk_dim = parse_int(a, argv[++i], 1);
        else if (!strcmp(a, "--v-dim")) v_dim = parse_int(a, argv[++i], 1);
        else runs = parse_int(a, argv[++i], 1);
    }
    if ((long long)batch * seq > 1 << 22) {
        fprintf(stderr, "bench_attention: batch x seq is more than this benchmark allows (%d)\n", 1 << 22);
        return 2;
    }
    json_t *js = trill_config_preset(preset);
    trill_config cfg;
    if (!js) {
        fprintf(stderr, "bench_attention: unknown preset '%s' (known: %s)\n", preset, trill_config_preset_names());
        return 2;
    }
    if (trill_config_from_json(js, preset, &cfg)) {
        fprintf(stderr, "bench_attention: %s\n", trill_error_message());
        return 1;
    }
    json_decref(js);
    const int nh = cfg.num_attention_heads, nkv = cfg.num_key_value_heads;
    const int hd_qk = qk_dim ? qk_dim : cfg.head_dim, hd_v = v_dim ? v_dim : cfg.head_dim;
    const float scale = 1 / sqrtf((float)hd_qk);
    const int T = batch * seq;
    int *offsets = malloc(sizeof(int) * (batch + 1));
    double *tf = malloc(sizeof(double) * runs), *tb = malloc(sizeof(double) * runs);
    if (!offsets || !tf || !tb) return 1;
    for (int s = 0; s <= batch; s++) offsets[s] = s * seq;
    const size_t nq = (size_t)T * nh * hd_qk, nk = (size_t)T * nkv * hd_qk, nv = (size_t)T * nkv * hd_v, no = (size_t)T * nh * hd_v;
    float *q = randn(nq, 1), *k = randn(nk, 2), *v = randn(nv, 3), *dout = randn(no, 4);
    float *out = randn(no, 5), *dq = randn(nq, 6), *dk = randn(nk, 7), *dv = randn(nv, 8);

    /* causal products: per sequence and query head, sum_t (t+1) * hd multiply-adds each */
    const double pairs = (double)batch * nh * ((double)seq * (seq + 1) / 2);
    const double f_fwd = 2 * pairs * (hd_qk + hd_v), f_bwd = 2 * 2 * pairs * (hd_qk + hd_v);

    printf("attention %s: %d query heads over %d kv heads x %d (values x %d), %d sequences x %d tokens (T=%d), %d threads\n",
           preset, nh, nkv, hd_qk, hd_v, batch, seq, T, omp_get_max_threads());
    for (int r = -1; r < runs; r++) { /* r = -1: warm-up */
        double t0 = trill_now();
        if (trill_attention_forward(out, q, k, v, offsets, batch, nh, nkv, hd_qk, hd_v, scale, TRILL_PRECISION_FP32, NULL)) {
            fprintf(stderr, "bench_attention: %s\n", trill_error_message());
            return 1;
        }
        if (r >= 0) tf[r] = trill_now() - t0;
        memset(dq, 0, sizeof(float) * nq), memset(dk, 0, sizeof(float) * nk), memset(dv, 0, sizeof(float) * nv);
        t0 = trill_now();
        if (trill_attention_backward(dq, dk, dv, dout, q, k, v, offsets, batch, nh, nkv, hd_qk, hd_v, scale, TRILL_PRECISION_FP32, NULL)) {
            fprintf(stderr, "bench_attention: %s\n", trill_error_message());
            return 1;
        }
        if (r >= 0) tb[r] = trill_now() - t0;
    }
    double cs = 0;
    for (size_t i = 0; i < no; i++) cs += out[i];
    for (size_t i = 0; i < nq; i++) cs += dq[i];
    for (size_t i = 0; i < nk; i++) cs += dk[i];
    for (size_t i = 0; i < nv; i++) cs += dv[i];
    printf("  forward  runs (ms):");
    for (int r = 0; r < runs; r++) printf(" %.2f", tf[r] * 1e3);
    printf("\n  backward runs (ms):");
    for (int r = 0; r < runs; r++) printf(" %.2f", tb[r] * 1e3);
    double mf = trill_median(tf, runs), mb = trill_median(tb, runs);
    printf("\n  checksum %.6e\n", cs);
    printf("attention forward  median %8.2f ms  %7.2f GFLOP/s (causal QK^T, PV)\n", mf * 1e3, f_fwd / mf * 1e-9);
    printf("attention backward median %8.2f ms  %7.2f GFLOP/s (causal dP, dV, dQ, dK)\n", mb * 1e3, f_bwd / mb * 1e-9);
    free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv), free(offsets), free(tf), free(tb);
    return 0;
}
