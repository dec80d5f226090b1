/* bench_gen_gemm: the generator's matrix kernels (src/infer/gemm.c) on the linear layers of a
 * preset, against the machine's own limits measured in the same run.
 *
 * A benchmark, not a test: it prints figures and fails only if it cannot run.
 *
 *   bench_gen_gemm [--preset NAME] [--runs N] [--copy-mb MB] [--cold-mb MB] [--isa NAME]
 *
 * Limits, each on all OpenMP threads: memory bandwidth from a large memcpy (bytes read + bytes
 * written per second) and from a read-only sweep; compute peaks from register-only loops of the
 * instruction each kernel is built on: fp32 FMA (vfmadd231ps; the AVX2 bf16 kernel's MACs are
 * fp32 FMAs too), vdpbf16ps (32 bf16 MACs per 512-bit instruction) and vpdpbusd (64 int8 MACs),
 * or on AVX2 int8 the vpsignb + vpmaddubsw + vpmaddwd + vpaddd sequence (32 MACs). FLOPs and
 * int8 OPs count 2 per multiply-add.
 *
 * Shapes: the distinct [N, K] of the preset's q/k/v/o projections, dense and expert MLP and
 * lm_head; T = 1, 16, 64, 256 rows. "hot" times one matrix called repeatedly (in cache when it
 * fits); "cold" (T = 1, decode) cycles through copies of it totalling --cold-mb (default 512 MB,
 * past the last-level cache) as a decode step streams a whole model, and reports the weight
 * bytes read per second against the measured bandwidth. Figures are medians of --runs runs. */
#include <errno.h>
#include <immintrin.h>
#include <jansson.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/infer/gemm.h" /* internal header: the generator has no public API yet */
#include "model/config_json.h"
#include "trill/config.h"
#include "trill/error.h"
#include "trill/rng.h"
#include "trill/timing.h"

static int parse_int(const char *opt, const char *s, int min) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min || v > 1 << 20) {
        fprintf(stderr, "bench_gen_gemm: %s expects an integer >= %d, got '%s'\n", opt, min, s);
        exit(2);
    }
    return (int)v;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_gen_gemm [--preset NAME] [--runs N] [--copy-mb MB] [--cold-mb MB] [--isa NAME]\n"
               "  --preset NAME  layer shapes from this model preset (%s; default small)\n"
               "  --runs N       timed runs per figure, median reported (default 7)\n"
               "  --copy-mb MB   memcpy size for the bandwidth figure (default 1024)\n"
               "  --cold-mb MB   weight copies cycled through for the cold decode figure (default 512)\n"
               "  --isa NAME     generic, avx2 or avx512 (default: the best this CPU has)\n",
            trill_config_preset_names());
}

static void *xalloc(size_t bytes) {
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p) {
        fprintf(stderr, "bench_gen_gemm: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static volatile uint64_t g_sink; /* keeps results of timed loops alive */

/* ---- machine limits ---- */

/* Median seconds of fn over runs (after one warm-up call); *best gets the fastest. The machine
 * may be shared: with two threads on two cores, a run in which another process takes a core
 * waits a scheduler slice at each barrier, so the best shows what the code does and the median
 * what this run of the machine gave. */
static double time_runs(void (*fn)(void *), void *arg, int runs, double *best) {
    double *t = malloc(sizeof(double) * runs);
    fn(arg);
    for (int r = 0; r < runs; r++) {
        const double t0 = trill_now();
        fn(arg);
        t[r] = trill_now() - t0;
    }
    const double m = trill_median(t, runs);
    if (best) *best = t[0]; /* sorted by trill_median */
    free(t);
    return m;
}

typedef struct buffers { uint8_t *src, *dst; size_t bytes; } buffers;

static void copy_all(void *arg) {
    buffers *b = arg;
#pragma omp parallel
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const size_t lo = b->bytes * id / nt & ~(size_t)63, hi = id == nt - 1 ? b->bytes : b->bytes * (id + 1) / nt & ~(size_t)63;
        memcpy(b->dst + lo, b->src + lo, hi - lo);
    }
}

static void read_all(void *arg) {
    buffers *b = arg;
    uint64_t total = 0;
#pragma omp parallel reduction(+ : total)
    {
        const int nt = omp_get_num_threads(), id = omp_get_thread_num();
        const size_t n = b->bytes / 8, lo = n * id / nt, hi = n * (id + 1) / nt;
        const uint64_t *p = (const uint64_t *)(void *)b->src;
        uint64_t s = 0;
        for (size_t i = lo; i < hi; i++) s += p[i];
        total += s;
    }
    g_sink = total;
}

/* ---- kernels ---- */

typedef struct call {
    float *out;
    const float *inp;
    const gen_matrix *m; /* copies: m[0..copies) */
    int copies, T, reps;
    gen_isa isa;
} call;

static void run_calls(void *arg) {
    call *c = arg;
    for (int r = 0; r < c->reps; r++)
        for (int i = 0; i < c->copies; i++) trill_gen_matmul_isa(c->out, c->inp, &c->m[i], c->T, c->isa);
}

typedef struct shape { const char *name; int N, K; } shape;

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* figures appear as they are measured */
    const char *preset = "small";
    int runs = 7, copy_mb = 1024, cold_mb = 512;
    gen_isa isa = trill_gen_isa_best();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        int takes_value = !strcmp(a, "--preset") || !strcmp(a, "--runs") || !strcmp(a, "--copy-mb") || !strcmp(a, "--cold-mb") || !strcmp(a, "--isa");
        if (!takes_value) { fprintf(stderr, "bench_gen_gemm: unknown option %s\n", a); usage(stderr); return 2; }
        if (i + 1 >= argc) { fprintf(stderr, "bench_gen_gemm: %s needs a value\n", a); return 2; }
        const char *v = argv[++i];
        if (!strcmp(a, "--preset")) preset = v;
        else if (!strcmp(a, "--runs")) runs = parse_int(a, v, 1);
        else if (!strcmp(a, "--copy-mb")) copy_mb = parse_int(a, v, 1);
        else if (!strcmp(a, "--cold-mb")) cold_mb = parse_int(a, v, 1);
        else {
            const gen_isa all[] = { GEN_ISA_GENERIC, GEN_ISA_AVX2, GEN_ISA_AVX512 };
            int found = 0;
            for (int j = 0; j < 3; j++)
                if (!strcmp(v, trill_gen_isa_name(all[j]))) isa = all[j], found = 1;
            if (!found || !trill_gen_isa_supported(isa)) { fprintf(stderr, "bench_gen_gemm: --isa %s is not available on this CPU\n", v); return 2; }
        }
    }
    json_t *js = trill_config_preset(preset);
    trill_config cfg;
    if (!js) {
        fprintf(stderr, "bench_gen_gemm: unknown preset '%s' (known: %s)\n", preset, trill_config_preset_names());
        return 2;
    }
    if (trill_config_from_json(js, preset, &cfg)) {
        fprintf(stderr, "bench_gen_gemm: %s\n", trill_error_message());
        return 1;
    }
    json_decref(js);
    const int threads = omp_get_max_threads();
    printf("gen_gemm %s: isa %s, %d threads, medians of %d runs\n", preset, trill_gen_isa_name(isa), threads, runs);

    /* memory bandwidth */
    buffers buf = { .bytes = (size_t)copy_mb << 20 };
    buf.src = xalloc(buf.bytes);
    buf.dst = xalloc(buf.bytes);
    memset(buf.src, 1, buf.bytes);
    memset(buf.dst, 2, buf.bytes);
    double copy_best, read_best;
    const double copy_bw = 2.0 * buf.bytes / time_runs(copy_all, &buf, runs, &copy_best) * 1e-9;
    const double read_bw = (double)buf.bytes / time_runs(read_all, &buf, runs, &read_best) * 1e-9;
    free(buf.src);
    free(buf.dst);
    printf("memory: memcpy %d MB %.1f GB/s (read + write; best run %.1f), read-only sweep %.1f GB/s (best %.1f)\n", copy_mb, copy_bw,
           2.0 * buf.bytes / copy_best * 1e-9, read_bw, (double)buf.bytes / read_best * 1e-9);

    /* compute peaks (GFLOP/s) of the instruction each format's kernel is built on */
    double peak[3] = { 0 };
    for (int f = 0; f < 3; f++) {
        peak[f] = trill_gen_peak_gflops_isa((trill_gen_format)f, isa);
        if (peak[f] > 0) printf("peak %-4s %8.1f GFLOP/s  (%s)\n", trill_gen_format_name((trill_gen_format)f), peak[f], trill_gen_peak_instruction((trill_gen_format)f, isa));
    }

    /* distinct linear-layer shapes of the preset */
    const int H = cfg.hidden_size, q = cfg.num_attention_heads * cfg.head_dim, kv = cfg.num_key_value_heads * cfg.head_dim;
    const shape all[] = {
        { "q_proj", q, H }, { "k/v_proj", kv, H }, { "o_proj", H, q }, { "mlp gate/up", cfg.intermediate_size, H },
        { "mlp down", H, cfg.intermediate_size }, { "expert gate/up", cfg.moe_intermediate_size, H },
        { "expert down", H, cfg.moe_intermediate_size }, { "lm_head", cfg.vocab_size, H },
    };
    shape shapes[8];
    int n_shapes = 0;
    for (int i = 0; i < 8; i++) {
        int dup = 0;
        for (int j = 0; j < n_shapes; j++)
            if (shapes[j].N == all[i].N && shapes[j].K == all[i].K) dup = 1;
        if (!dup && all[i].N > 0 && all[i].K > 0) shapes[n_shapes++] = all[i];
    }
    static const int TS[] = { 1, 16, 64, 256 };
    printf("\n%-15s %-13s %-4s %4s %9s %8s %6s %7s %6s %8s   %s\n", "layer", "[N, K]", "fmt", "T", "us/call", "GFLOP/s", "%peak", "best",
           "%peak", "W GB/s", "cold T=1 (median): W GB/s, % of memcpy, % of read; best run");
    for (int si = 0; si < n_shapes; si++) {
        const int N = shapes[si].N, K = shapes[si].K;
        float *w = xalloc(sizeof(float) * (size_t)N * K), *x = xalloc(sizeof(float) * 256 * (size_t)K), *out = xalloc(sizeof(float) * 256 * (size_t)N);
        for (size_t i = 0; i < (size_t)N * K; i++) w[i] = (float)(trill_rng_uniform(1, i) - 0.5);
        for (size_t i = 0; i < 256 * (size_t)K; i++) x[i] = (float)(trill_rng_uniform(2, i) - 0.5);
        for (int f = 0; f < 3; f++) {
            gen_matrix m;
            if (trill_gen_matrix_create(&m, (trill_gen_format)f, w, NULL, N, K)) {
                fprintf(stderr, "bench_gen_gemm: %s\n", trill_error_message());
                return 1;
            }
            /* cold decode: copies of the packed data (the small per-channel arrays are shared) */
            int copies = (int)(((size_t)cold_mb << 20) / m.bytes) + 1;
            gen_matrix *ring = xalloc(sizeof(gen_matrix) * copies);
            const size_t data_bytes = m.bytes - (m.format == TRILL_GEN_INT8 ? (size_t)N * 8 : 0);
            for (int c = 0; c < copies; c++) {
                ring[c] = m;
                ring[c].data = xalloc(data_bytes);
                memcpy(ring[c].data, m.data, data_bytes);
            }
            call cold = { out, x, ring, copies, 1, 1, isa };
            double t_cold_best;
            const double t_cold = time_runs(run_calls, &cold, runs, &t_cold_best) / copies;
            t_cold_best /= copies;
            for (int c = 0; c < copies; c++) free(ring[c].data);
            free(ring);
            const double cold_bw = m.bytes / t_cold * 1e-9, cold_best = m.bytes / t_cold_best * 1e-9;

            for (size_t ti = 0; ti < sizeof TS / sizeof TS[0]; ti++) {
                const int T = TS[ti];
                const double flops = 2.0 * T * N * K;
                call hot = { out, x, &m, 1, T, 1, isa };
                const double probe = time_runs(run_calls, &hot, 1, NULL);
                hot.reps = probe > 0 ? (int)(0.005 / probe) + 1 : 1000; /* ~5 ms per timed run */
                double best;
                const double t = time_runs(run_calls, &hot, runs, &best) / hot.reps;
                best /= hot.reps;
                printf("%-15s [%5d,%5d] %-4s %4d %9.1f %8.1f %5.0f%% %7.1f %5.0f%% %8.1f", shapes[si].name, N, K, trill_gen_format_name((trill_gen_format)f), T,
                       t * 1e6, flops / t * 1e-9, peak[f] > 0 ? 100 * flops / t * 1e-9 / peak[f] : 0, flops / best * 1e-9,
                       peak[f] > 0 ? 100 * flops / best * 1e-9 / peak[f] : 0, m.bytes / t * 1e-9);
                if (T == 1)
                    printf("   %6.1f GB/s %4.0f%% %4.0f%%  best %6.1f GB/s %4.0f%%", cold_bw, 100 * cold_bw / copy_bw, 100 * cold_bw / read_bw,
                           cold_best, 100 * cold_best / copy_bw);
                printf("\n");
            }
            trill_gen_matrix_free(&m);
        }
        free(w);
        free(x);
        free(out);
    }
    return 0;
}
