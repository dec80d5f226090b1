/* bench_gdn: the gated delta rule's kernels alone (fp32): the recurrent and the chunked forms,
 * forward and backward, on a packed batch of equal-length sequences of Gated DeltaNet heads
 * (Qwen3-Next's linear attention: 16 value heads of 128, keys of 128 by default).
 *
 * A benchmark, not a test: it prints figures and fails only if it cannot run.
 *
 *   bench_gdn [--batch B] [--seq L] [--heads H] [--dk D] [--dv D] [--runs N]
 *
 * FLOPs, 2 per multiply-add. "GFLOP/s" counts every kernel at the recurrent form's work, so the
 * two forms compare directly: a step costs 6 dk dv per head and token (decay and S^T k, the outer
 * product, S^T q), the backward 3x that (18 dk dv: it also recomputes the forward). "own" counts
 * the chunked form's own work (chunked_macs: its GEMMs and triangular solves, larger than the
 * recurrent form's), i.e. how well its GEMMs use the machine. */
#include <errno.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/error.h"
#include "trill/kernels.h"
#include "trill/rng.h"
#include "trill/timing.h"

static int parse_int(const char *opt, const char *s, int min) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min || v > 1 << 24) {
        fprintf(stderr, "bench_gdn: %s expects an integer >= %d, got '%s'\n", opt, min, s);
        exit(2);
    }
    return (int)v;
}

static float *filled(size_t n, uint64_t stream, float scale, float shift) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    if (!x) {
        fprintf(stderr, "bench_gdn: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = shift + scale * (float)(2.0 * trill_rng_uniform(stream, i) - 1.0);
    return x;
}

/* The chunked form's multiply-adds per head over a sequence of L positions (src/kernels/gdn_impl.h):
 * per chunk of c, a prep (K K^T and Q K^T, two triangular solves, U = U' - W S), then the forward's
 * Q S, P U and the state's Kd^T U; the backward runs a forward keeping states (prep and Kd^T U),
 * then per chunk the prep again and its 12 products and 2 solves. */
static double chunked_macs(int L, int dk, int dv, int backward) {
    double total = 0;
    for (int t0 = 0; t0 < L; t0 += 64) {
        const double c = L - t0 < 64 ? L - t0 : 64, sd = (double)dk * dv, solve = c * (c - 1) / 2 * (dk + dv);
        const double prep = 2 * c * c * dk + solve + c * sd;
        if (!backward) total += prep + 2 * c * sd + c * c * dv;
        else total += (prep + c * sd) + prep + 6 * c * sd + 2 * c * c * dv + 4 * c * c * dk + solve + c * c * (dk + dv);
    }
    return total;
}

int main(int argc, char **argv) {
    int B = 4, L = 1024, H = 16, dk = 128, dv = 128, runs = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = parse_int("--batch", argv[++i], 1);
        else if (!strcmp(argv[i], "--seq") && i + 1 < argc) L = parse_int("--seq", argv[++i], 1);
        else if (!strcmp(argv[i], "--heads") && i + 1 < argc) H = parse_int("--heads", argv[++i], 1);
        else if (!strcmp(argv[i], "--dk") && i + 1 < argc) dk = parse_int("--dk", argv[++i], 1);
        else if (!strcmp(argv[i], "--dv") && i + 1 < argc) dv = parse_int("--dv", argv[++i], 1);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = parse_int("--runs", argv[++i], 1);
        else {
            fprintf(stderr, "usage: bench_gdn [--batch B] [--seq L] [--heads H] [--dk D] [--dv D] [--runs N]\n");
            return 2;
        }
    }
    const size_t T = (size_t)B * L, nk = T * H * dk, nv = T * H * dv, ng = T * H;
    int *offsets = malloc(sizeof(int) * (size_t)(B + 1));
    for (int s = 0; s <= B; s++) offsets[s] = s * L;
    float *q = filled(nk, 1, 0.09f, 0), *k = filled(nk, 2, 0.09f, 0), *v = filled(nv, 3, 1, 0);
    float *g = filled(ng, 4, 0.05f, -0.1f), *beta = filled(ng, 5, 0.3f, 0.5f), *dout = filled(nv, 6, 1, 0);
    float *out = filled(nv, 7, 0, 0), *dq = filled(nk, 8, 0, 0), *dk_ = filled(nk, 9, 0, 0), *dv_ = filled(nv, 10, 0, 0);
    float *dg = filled(ng, 11, 0, 0), *db = filled(ng, 12, 0, 0);
    const double step = 6.0 * dk * dv * (double)T * H; /* FLOPs of one pass of the recurrent form */
    printf("bench_gdn: %d sequences x %d tokens, %d heads, dk %d, dv %d, %d threads (fp32)\n", B, L, H, dk, dv, omp_get_max_threads());
    const char *names[4] = { "recurrent forward", "chunked forward", "recurrent backward", "chunked backward" };
    for (int which = 0; which < 4; which++) {
        double best = 1e30, total = 0;
        for (int r = 0; r <= runs; r++) { /* run 0 warms up */
            const double t0 = trill_now();
            trill_status st = TRILL_OK;
            if (which == 0) trill_gdn_recurrent_forward(out, NULL, q, k, v, g, beta, NULL, offsets, B, H, dk, dv);
            else if (which == 1) st = trill_gdn_chunked_forward(out, NULL, q, k, v, g, beta, NULL, offsets, B, H, dk, dv);
            else if (which == 2) st = trill_gdn_recurrent_backward(dq, dk_, dv_, dg, db, NULL, dout, NULL, q, k, v, g, beta, NULL, offsets, B, H, dk, dv);
            else st = trill_gdn_chunked_backward(dq, dk_, dv_, dg, db, NULL, dout, NULL, q, k, v, g, beta, NULL, offsets, B, H, dk, dv);
            if (st) {
                fprintf(stderr, "bench_gdn: %s\n", trill_error_message());
                return 1;
            }
            const double dt = trill_now() - t0;
            if (r > 0) total += dt, best = dt < best ? dt : best;
        }
        const double flops = which >= 2 ? 3 * step : step;
        char own[48] = "";
        if (which % 2) snprintf(own, sizeof own, " (own %6.2f GFLOP/s)", 2 * chunked_macs(L, dk, dv, which == 3) * B * H / best * 1e-9);
        printf("  %-20s %8.1f ms mean, best %8.1f ms: %6.2f GFLOP/s%s, %8.0f tokens/s\n", names[which], 1e3 * total / runs, 1e3 * best,
               flops / best * 1e-9, own, (double)T / best);
    }
    free(offsets); free(q); free(k); free(v); free(g); free(beta); free(dout); free(out);
    free(dq); free(dk_); free(dv_); free(dg); free(db);
    return 0;
}
