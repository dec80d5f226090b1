/* trill bench train: throughput of a training step (forward keeping activations + backward)
 * on a model folder, next to the GEMM peak of its precision measured in the same run. */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"
#include "opts.h"
#include "trill/dist.h"
#include "trill/kernels.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/rng.h"
#include "trill/timing.h"
#include "trill/train.h"

/* What the timed steps cost the process beyond their time: minor page faults, system and user
 * CPU seconds (getrusage deltas over the timed steps). */
typedef struct step_costs { long faults; double sys_s, user_s; } step_costs;

static double tv_s(struct timeval t) { return (double)t.tv_sec + 1e-6 * (double)t.tv_usec; }

/* How the ranks share the work: the world (data ranks), and under expert parallelism the group
 * of ep ranks splitting the experts and the ranks holding the same experts (edp). */
typedef struct bench_ranks {
    trill_comm *world, *ep, *edp;
    trill_comm *tp, *data;  /* tensor parallelism: the group, and the ranks of one share (the data ranks) */
    size_t routed;   /* expert parallelism: the adapters' held experts' part starts here */
    float **src;     /* [ep] its gradient per source rank */
} bench_ranks;

static trill_comm_stats comm_stats(const bench_ranks *r) {
    trill_comm_stats sum = trill_comm_stats_get(r->world);
    const trill_comm *sub[4] = { r->ep, r->edp, r->tp, r->data };
    for (int i = 0; i < 4; i++)
        if (sub[i]) {
            const trill_comm_stats s = trill_comm_stats_get(sub[i]);
            for (int k = 0; k < TRILL_COMM_KINDS; k++) sum.calls[k] += s.calls[k], sum.bytes[k] += s.bytes[k], sum.ms[k] += s.ms[k];
        }
    return sum;
}

static void comm_reset(const bench_ranks *r) {
    trill_comm *all[5] = { r->world, r->ep, r->edp, r->tp, r->data };
    for (int i = 0; i < 5; i++)
        if (all[i]) trill_comm_stats_reset(all[i]);
}

/* One step's gradient reduction: every value summed over the ranks that computed a part of it
 * (all of them; under expert parallelism the held experts' over the ranks holding them, after
 * adding the parts each source rank's tokens made). */
static trill_status reduce(const bench_ranks *r, float *g, size_t n) {
    if (r->tp) return trill_comm_allreduce_f32(r->data, g, n); /* a share's slices over the data ranks */
    if (!r->ep) return trill_comm_allreduce_f32(r->world, g, n);
    const int P = trill_comm_size(r->ep);
    for (int j = 0; j < P; j++)
        for (size_t i = r->routed; i < n; i++) g[i] += r->src[j][i - r->routed];
    trill_status st = trill_comm_allreduce_f32(r->world, g, r->routed);
    return st ? st : trill_comm_allreduce_f32(r->edp, g + r->routed, n - r->routed);
}

/* One warm-up step, then `runs` timed forward + backward steps (times[r] in seconds). With
 * several ranks, each steps its share of the batch and the gradients (n floats at g) are
 * reduced; the ranks start each step together and its time ends with the reduction. */
static trill_status time_steps(trill_model *m, const int *tokens, const int *offsets, int batch, float *lp, const float *dlp, float *grads,
                               float *lgrads, bool recompute, int runs, const bench_ranks *rk, float *g, size_t n, double *times, step_costs *sc) {
    trill_status st = TRILL_OK;
    struct rusage before, after;
    const bool dp = trill_comm_size(rk->world) > 1;
    for (int r = -1; !st && r < runs; r++) {
        if (r == 0) {
            getrusage(RUSAGE_SELF, &before);
            comm_reset(rk);
        }
        if (dp && (st = trill_comm_barrier(rk->world))) break;
        double t0 = trill_now();
        trill_forward_pass *pass = NULL;
        if (!(st = trill_model_forward_train(m, tokens, offsets, batch, NULL, lp, NULL, recompute, &pass)))
            st = trill_model_backward_ep(pass, dlp, grads, lgrads, rk->src);
        trill_forward_pass_free(pass);
        if (!st && dp) st = reduce(rk, g, n);
        if (r >= 0) times[r] = trill_now() - t0;
        if (!st && trill_comm_rank(rk->world) == 0) fprintf(stderr, "trill bench: %s step %.0f ms\n", r < 0 ? "warm-up" : "timed", (trill_now() - t0) * 1e3);
    }
    getrusage(RUSAGE_SELF, &after);
    *sc = (step_costs){ .faults = after.ru_minflt - before.ru_minflt, .sys_s = tv_s(after.ru_stime) - tv_s(before.ru_stime),
                        .user_s = tv_s(after.ru_utime) - tv_s(before.ru_utime) };
    return st;
}

/* Best of three GEMM 2048^3 runs through the kernels' matmul in precision prec (fp32: OpenMP-split
 * single-threaded OpenBLAS sgemm; bf16: the bf16 GEMM). */
static double gemm_peak(trill_precision prec) {
    const int n = 2048;
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    if (!a || !b || !c) { free(a); free(b); free(c); return 0; }
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = 0.001f * (float)(i % 1000);
    double best = 1e30;
    for (int r = 0; r < 4; r++) { /* the first is a warm-up */
        double t0 = trill_now();
        if (trill_matmul_forward_p(c, a, b, n, n, n, prec)) break;
        double t = trill_now() - t0;
        if (r > 0 && t < best) best = t;
    }
    free(a); free(b); free(c);
    return 2.0 * n * n * n / best * 1e-9;
}

/* What a bench run measured, for its report (rank 0's). */
typedef struct bench_result {
    trill_precision prec;
    bool lora_mode, recompute;
    long long rank, batch, seq;
    int runs, ranks, share, ep, tp; /* share: sequences per rank; ep, tp: the model-parallel groups' size */
    double *times;            /* [runs] seconds (trill_median reorders them) */
    double peak;              /* rank 0's GEMM */
    step_costs sc;
    uint64_t *rss, *bytes;    /* [ranks] each rank's peak RSS (KB) and weight bytes */
    trill_comm_stats comm;
} bench_result;

static void report(const trill_model *m, const int *offsets, const bench_result *b) {
    const trill_config *cfg = trill_model_config(m);
    const trill_precision prec = b->prec;
    const bool lora_mode = b->lora_mode, recompute = b->recompute;
    const long long batch = b->batch, seq = b->seq;
    const int runs = b->runs, P = b->ranks;
    const double peak = b->peak;
    const step_costs sc = b->sc;
    const int T = (int)(batch * seq);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double med = trill_median(b->times, runs);
    double flops = trill_train_step_flops(cfg, offsets, (int)batch, lora_mode, (int)b->rank, recompute);
    if (P > 1) {
        const trill_comm_stats cs = b->comm;
        printf("%d ranks, %d data-parallel (%d sequences each%s): a step's communication from rank 0:", P, P / b->tp, b->share,
               b->ep > 1 ? "" : ", gradients all-reduced");
        for (int k = 0; k < TRILL_COMM_KINDS; k++)
            if (cs.calls[k]) printf(" %s %.2f MB %.1f ms", trill_comm_kind_name((trill_comm_kind)k), cs.bytes[k] / (double)runs / 1e6, cs.ms[k] / runs);
        printf(" (percent of peak below: against rank 0's GEMM with its own threads, times %d)\n", P);
        if (b->ep > 1) {
            int first, count;
            trill_model_experts_held(m, &first, &count);
            printf("expert parallel in groups of %d ranks: %d of %d routed experts a rank (loaded alone); tokens to their experts' ranks "
                   "by all-to-all-v; %d group%s\n", b->ep, count, cfg->num_experts, P / b->ep, P / b->ep == 1 ? "" : "s, each expert's gradient summed over them");
        }
        if (b->tp > 1)
            printf("tensor parallel in groups of %d ranks: %d of %d attention heads a rank and 1/%d of the dense MLPs (loaded alone); a "
                   "group forwards the same %d sequences, partial sums added in rank order\n", b->tp, cfg->num_attention_heads,
                   trill_model_whole_config(m)->num_attention_heads, b->tp, b->share);
        for (int r = 0; r < P; r++) printf("rank %d: peak RSS %.0f MB, weights %.1f MB\n", r, b->rss[r] / 1024.0, b->bytes[r] / 1e6);
    }
    printf("%s peak (GEMM 2048^3, %s): %.1f GFLOP/s\n", trill_precision_name(prec),
           prec == TRILL_PRECISION_FP32 ? "OpenMP-split single-threaded OpenBLAS sgemm"
           : trill_kernels_bf16_native() ? "trill's bf16 GEMM on vdpbf16ps" : "trill's bf16 GEMM, generic path (no AVX-512 BF16)",
           peak);
    if (prec == TRILL_PRECISION_BF16) printf("fp32 peak (GEMM 2048^3, OpenMP-split single-threaded OpenBLAS sgemm): %.1f GFLOP/s\n", gemm_peak(TRILL_PRECISION_FP32));
    printf("trill train (%s%s, %s matmuls) %lldx%lld: %.0f tokens/s, median %.0f ms, %.1f GFLOP/s (%.1f%% of peak; %.1f GFLOP a step), peak RSS %.0f MB\n",
           lora_mode ? "lora" : "full", recompute ? ", recompute" : "", trill_precision_name(prec), batch, seq, T / med, med * 1e3, flops / med * 1e-9,
           100.0 * flops / med * 1e-9 / (peak * P), flops * 1e-9, ru.ru_maxrss / 1024.0);
    printf("timed steps: %.0f minor page faults a step, system time %.1f%% of CPU time (the warm-up step's first touch excluded)\n",
           sc.faults / (double)runs, 100.0 * sc.sys_s / (sc.sys_s + sc.user_s));
    printf("base weights: %s, %.0f MB (%zu parameters)\n", trill_model_storage(m) == TRILL_BF16 ? "bf16 (frozen, widened on the fly)" : "fp32",
           trill_model_bytes(m) / 1e6, trill_model_n_params(m));
}

/* Groups of ep (expert) or tp (tensor) consecutive ranks, and the ranks of one share under tensor
 * parallelism (the data ranks). */
static trill_status set_up_ranks(bench_ranks *rk, int ep, int tp) {
    const int me = trill_comm_rank(rk->world), q = me % ep, tq = me % tp, d = me / tp;
    trill_status st = TRILL_OK;
    if (ep > 1 && !(st = trill_comm_split(rk->world, me / ep, q, &rk->ep))) st = trill_comm_split(rk->world, q, me / ep, &rk->edp);
    if (!st && tp > 1 && !(st = trill_comm_split(rk->world, d, tq, &rk->tp))) st = trill_comm_split(rk->world, tq, d, &rk->data);
    return st;
}

static void bench_ranks_free(bench_ranks *rk, int ep) {
    for (int j = 0; rk->src && j < ep; j++) free(rk->src[j]);
    free(rk->src);
    trill_comm_free(rk->ep);
    trill_comm_free(rk->edp);
    trill_comm_free(rk->tp);
    trill_comm_free(rk->data);
}

/* This rank's model (LoRA: a frozen base kept as the checkpoint stores it, bf16 staying bf16;
 * under model parallelism only its experts, or its share of the heads) in its groups, with
 * adapters of rank `rank` on every linear layer when lora_mode. */
static trill_status load_model(const char *dir, const bench_ranks *rk, int ep, int tp, bool lora_mode, int rank, trill_precision prec,
                               trill_model **m, trill_lora **lora) {
    const int me = trill_comm_rank(rk->world);
    const trill_shard shard = { .ep_rank = me % ep, .ep_size = ep, .tp_rank = me % tp, .tp_size = tp };
    trill_status st = trill_model_load_shard(dir, lora_mode ? TRILL_STORE_CHECKPOINT : TRILL_STORE_F32, &shard, m);
    if (!st && rk->ep) st = trill_model_set_expert_comm(*m, rk->ep);
    if (!st && rk->tp) st = trill_model_set_tensor_comm(*m, rk->tp);
    if (!st) trill_model_set_precision(*m, prec);
    if (!st && lora_mode) {
        trill_lora_config lc = { .rank = rank, .alpha = 2.0 * rank };
        trill_lora_parse_targets("all-linear", &lc.targets);
        if (!(st = trill_lora_create(*m, lc, 1, lora))) trill_model_attach_lora(*m, *lora);
    }
    if (st) {
        trill_model_free(*m);
        *m = NULL;
    }
    return st;
}

/* Every rank's peak RSS (KB) and weight bytes, into rss[P] and bytes[P]. */
static trill_status memory_of_ranks(trill_comm *world, const trill_model *m, uint64_t *rss, uint64_t *bytes) {
    const int P = trill_comm_size(world);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const uint64_t mine[2] = { (uint64_t)ru.ru_maxrss, trill_model_bytes(m) };
    uint64_t *both = calloc(2 * (size_t)P, sizeof(uint64_t));
    trill_status st = both ? trill_comm_allgather(world, mine, sizeof mine, both) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int r = 0; !st && r < P; r++) rss[r] = both[2 * r], bytes[r] = both[2 * r + 1];
    free(both);
    return st;
}

/* trill bench train's options. */
typedef struct bench_args {
    const char *dir;
    bool lora, full, recompute;
    int precision;                /* PRECISIONS */
    long long rank, batch, seq, runs, ep, tp;
} bench_args;

static const char *const PRECISIONS[] = { "auto", "fp32", "bf16", NULL }; /* the first is the default */
static bench_args g_args = { .rank = 16, .batch = 8, .seq = 512, .runs = 3, .ep = 1, .tp = 1 };
static const cli_opt OPTS[] = {
    { "model", CLI_STR, "DIR", "the model folder", .str = &g_args.dir, .required = true },
    { "lora", CLI_FLAG, NULL, "train LoRA adapters on every linear layer (the default)", .flag = &g_args.lora },
    { "full", CLI_FLAG, NULL, "train every weight instead", .flag = &g_args.full },
    { "rank", CLI_INT, "R", "the adapters' rank", .i = &g_args.rank, .min = 1, .max = 4096 },
    { "batch", CLI_INT, "B", "sequences a step", .i = &g_args.batch, .min = 1, .max = 1024 },
    { "seq", CLI_INT, "L", "tokens a sequence", .i = &g_args.seq, .min = 2, .max = 1 << 16 },
    { "runs", CLI_INT, "N", "timed steps after a warm-up", .i = &g_args.runs, .min = 1, .max = 100 },
    { "recompute", CLI_FLAG, NULL, "recompute each layer's forward in the backward instead of keeping it", .flag = &g_args.recompute },
    { "precision", CLI_CHOICE, NULL, "the matmuls' precision (auto: bf16 where the CPU has AVX-512 BF16, else fp32)", .choice = &g_args.precision, .choices = PRECISIONS },
    { "ep", CLI_INT, "N", "LoRA: groups of N consecutive ranks split the routed experts", .i = &g_args.ep, .min = 1, .max = 65536 },
    { "tp", CLI_INT, "N", "LoRA: groups of N consecutive ranks split the attention heads and dense MLPs", .i = &g_args.tp, .min = 1,
      .max = 65536 },
};
static const cli_spec SPEC = { "bench train", NULL,
                               "Times forward + backward on B random sequences of L tokens and a GEMM 2048^3 in the same\n"
                               "precision for the peak; bf16 also prints the fp32 GEMM's, to compare.\n"
                               "Prints tokens/s, GFLOP/s (FLOPs as done, see trill_train_step_flops), percent of peak, peak RSS,\n"
                               "and the timed steps' minor page faults and system-time share.\n"
                               "Under mpirun -np N the ranks share the batch (data parallelism: B/N sequences each, the\n"
                               "gradients all-reduced every step) and it also prints the step's communication by kind and\n"
                               "each rank's peak RSS and weight bytes. --ep: each rank loads only its experts' tensors, tokens\n"
                               "travel to their experts' ranks by all-to-all-v. --tp: the group's ranks share their sequences.",
                               OPTS, (int)(sizeof OPTS / sizeof OPTS[0]) };

static const char BENCH_USAGE[] = "trill bench train|generate [options]   (trill bench train --help, trill bench generate --help)";

/* A step's buffers: random tokens, B sequences of L, the loss's gradient (a mean cross-entropy),
 * the gradients (the adapters' or every weight's), the timings and every rank's memory figures;
 * with --ep the experts' gradient parts. */
typedef struct bench_bufs {
    int *tokens, *offsets;
    float *lp, *dlp, *grads, *lgrads;
    size_t n_lora;
    double *times;
    uint64_t *rss, *bytes;
} bench_bufs;

static void bufs_free(bench_bufs *b) {
    free(b->tokens); free(b->offsets); free(b->lp); free(b->dlp); free(b->grads); free(b->lgrads); free(b->times); free(b->rss);
    free(b->bytes);
}

static trill_status bufs_alloc(bench_bufs *b, const trill_model *m, trill_lora *lora, bench_ranks *rk, int P) {
    const long long batch = g_args.batch, seq = g_args.seq;
    const int T = (int)(batch * seq);
    b->tokens = malloc(sizeof(int) * T);
    b->offsets = malloc(sizeof(int) * (batch + 1));
    b->lp = malloc(sizeof(float) * T);
    b->dlp = malloc(sizeof(float) * T);
    if (g_args.full) b->grads = calloc(trill_model_n_params(m), sizeof(float));
    else trill_lora_params(lora, &b->n_lora), b->lgrads = calloc(b->n_lora, sizeof(float));
    b->times = malloc(sizeof(double) * g_args.runs);
    b->rss = calloc((size_t)P, sizeof(uint64_t));
    b->bytes = calloc((size_t)P, sizeof(uint64_t));
    trill_status st = b->tokens && b->offsets && b->lp && b->dlp && b->times && b->rss && b->bytes && (b->grads || b->lgrads)
                          ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && rk->ep) {
        rk->routed = trill_lora_routed_first(lora);
        if (!(rk->src = calloc((size_t)g_args.ep, sizeof *rk->src))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (int j = 0; !st && j < g_args.ep; j++)
            if (!(rk->src[j] = calloc(b->n_lora - rk->routed + 1, sizeof(float)))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    const int vocab = trill_model_config(m)->vocab_size;
    for (int t = 0; !st && t < T; t++) {
        b->tokens[t] = (int)(trill_rng_bits(12345, (uint64_t)t) % (uint64_t)vocab);
        b->dlp[t] = -1.0f / (float)T; /* mean cross-entropy */
    }
    for (int s = 0; !st && s <= batch; s++) b->offsets[s] = s * (int)seq;
    return st;
}

/* trill bench train's options against the job's P ranks: 0, or the exit status. */
static int check_args(int P) {
    const long long ep = g_args.ep, tp = g_args.tp;
    if (g_args.lora && g_args.full) return cli_spec_error(&SPEC, "--lora and --full exclude each other");
    if (ep > 1 && tp > 1) return cli_spec_error(&SPEC, "--ep %lld with --tp %lld: expert and tensor parallelism together are not built", ep, tp);
    if (P % ep != 0 || P % tp != 0)
        return cli_spec_error(&SPEC, "--%s %lld: the job's %d ranks are not groups of %lld", ep > 1 ? "ep" : "tp", ep > 1 ? ep : tp, P,
                               ep > 1 ? ep : tp);
    if (g_args.batch < P / tp) return cli_spec_error(&SPEC, "--batch %lld: fewer sequences than the job's %lld ranks", g_args.batch, P / tp);
    if ((ep > 1 || tp > 1) && g_args.full) return cli_spec_error(&SPEC, "--%s: model parallelism trains adapters (--lora)", ep > 1 ? "ep" : "tp");
    return 0;
}

/* --precision, auto resolved for this CPU (said by rank 0). */
static trill_precision bench_precision(int me) {
    trill_precision prec = TRILL_PRECISION_FP32;
    trill_precision_parse(PRECISIONS[g_args.precision], &prec); /* a CLI_CHOICE: always one of them */
    if (prec != TRILL_PRECISION_AUTO) return prec;
    prec = trill_kernels_precision_auto();
    if (me == 0) printf("precision auto: %s (this CPU %s AVX-512 BF16)\n", trill_precision_name(prec), prec == TRILL_PRECISION_BF16 ? "has" : "lacks");
    return prec;
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "generate") == 0) return bench_generate(argc - 1, argv + 1);
    if (argc < 2 || strcmp(argv[1], "train") != 0) {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { printf("usage: %s\n", BENCH_USAGE); return 0; }
        return cli_usage_error("bench", BENCH_USAGE, "expected the benchmark name: train or generate");
    }
    trill_comm *world = cli_world();
    const int P = trill_comm_size(world), me = trill_comm_rank(world);
    int first, rc = cli_parse(&SPEC, argc - 1, argv + 1, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if ((rc = check_args(P))) return rc;
    const trill_precision prec = bench_precision(me);
    const char *dir = g_args.dir;
    const bool lora_mode = !g_args.full, recompute = g_args.recompute;
    const long long rank = g_args.rank, batch = g_args.batch, seq = g_args.seq, runs = g_args.runs, ep = g_args.ep, tp = g_args.tp;
    const int D = P / (int)tp; /* data ranks: a tensor-parallel group is one */
    bench_ranks rk = { .world = world };
    const int d = me / (int)tp;
    trill_model *m = NULL;
    trill_lora *lora = NULL;
    if (set_up_ranks(&rk, (int)ep, (int)tp) || load_model(dir, &rk, (int)ep, (int)tp, lora_mode, (int)rank, prec, &m, &lora)) {
        bench_ranks_free(&rk, (int)ep);
        return cli_fail("bench");
    }
    bench_bufs bb = { 0 };
    trill_status st = bufs_alloc(&bb, m, lora, &rk, P);
    int *tokens = bb.tokens, *offsets = bb.offsets;
    float *lp = bb.lp, *dlp = bb.dlp, *grads = bb.grads, *lgrads = bb.lgrads;
    const size_t n_lora = bb.n_lora;
    double *times = bb.times;
    uint64_t *rss = bb.rss, *bytes = bb.bytes;
    /* this data rank's share of the sequences (all of them on one process) */
    const int s0 = (int)(batch * d / D), s1 = (int)(batch * (d + 1) / D);
    double peak = 0;
    if (!st && me == 0) peak = gemm_peak(prec); /* rank 0's, while the others wait */
    if (!st && P > 1) st = trill_comm_barrier(world);
    step_costs sc = { 0 };
    if (!st)
        st = time_steps(m, tokens + (size_t)s0 * seq, offsets, s1 - s0, lp, dlp, grads, lgrads, recompute, (int)runs, &rk,
                        lora_mode ? lgrads : grads, lora_mode ? n_lora : trill_model_n_params(m), times, &sc);
    const trill_comm_stats comm = comm_stats(&rk);
    if (!st) st = memory_of_ranks(world, m, rss, bytes);
    if (!st && me == 0) {
        const bench_result res = { .prec = prec, .lora_mode = lora_mode, .recompute = recompute, .rank = rank, .batch = batch, .seq = seq,
                                   .runs = (int)runs, .ranks = P, .share = s1 - s0, .ep = (int)ep, .tp = (int)tp, .times = times, .peak = peak, .sc = sc,
                                   .rss = rss, .bytes = bytes, .comm = comm };
        report(m, offsets, &res);
    }
    trill_model_attach_lora(m, NULL);
    trill_model_set_expert_comm(m, NULL);
    trill_model_set_tensor_comm(m, NULL);
    trill_lora_free(lora);
    bench_ranks_free(&rk, (int)ep);
    bufs_free(&bb);
    trill_model_free(m);
    return st ? cli_fail("bench") : 0;
}
