/* trill bench generate: the generator engine's prefill and decode throughput per weight format,
 * next to the machine's memory bandwidth and bf16 compute peak measured in the same run, with the
 * engine's per-phase profile of those steps (trill_engine_profile). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/infer.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/rng.h"
#include "trill/timing.h"

enum { MAX_LIST = 8 };

typedef struct gen_bench_args {
    const char *dir, *dtypes, *batches;
    long long prompt_len, steps;
    bool eplb, decode_only;
} gen_bench_args;

static gen_bench_args g_args = { .dtypes = "bf16,int8", .batches = "1,16,64,256", .prompt_len = 64, .steps = 16 };
static const cli_opt OPTS[] = {
    { "model", CLI_STR, "DIR", "the model folder", .str = &g_args.dir, .required = true },
    { "dtypes", CLI_STR, "LIST", "weight formats, comma-separated (bf16, int8, f32)", .str = &g_args.dtypes },
    { "batches", CLI_STR, "LIST", "decode batch sizes, comma-separated (at most 8, each in [1, 4096])", .str = &g_args.batches },
    { "prompt-len", CLI_INT, "N", "tokens a random prompt", .i = &g_args.prompt_len, .min = 1, .max = 1 << 16 },
    { "steps", CLI_INT, "N", "timed decode steps", .i = &g_args.steps, .min = 1, .max = 1 << 16 },
    { "eplb", CLI_FLAG, NULL, "run the experts through EPLB's workers (one replica per worker, re-planned every 16 steps)",
      .flag = &g_args.eplb },
    { "decode-only", CLI_FLAG, NULL, "only decode and prefill at the batch sizes (no adapter-mode or expert-capture comparison: long prompts)",
      .flag = &g_args.decode_only },
};
static const cli_spec SPEC = { "bench generate", NULL,
                               "Decode tokens/s at each batch size and prefill tokens/s for each weight format, the adapter-mode\n"
                               "slowdown (batch 1, 16 and 64, merged and adapter engines alternating 5 times) and the expert-capture\n"
                               "one (batch 16), and beside them the memory bandwidth (a 512 MB copy on all threads) against the\n"
                               "weight bytes a batch-1 decode step reads, and the format's compute peak against GFLOP/s at the\n"
                               "largest batch. Random prompts. Under each batch, the engine's per-phase profile of its decode and\n"
                               "of its prefill steps: ms a step, share and GFLOP/s of schedule, project (attention's projections),\n"
                               "attention, route, dispatch, experts, combine, mlp, other (norms, residuals), logits and sample\n"
                               "(batch 1: also the weight GB/s each phase reads).\n"
                               "--eplb also prints the busiest worker's load over the mean for contiguous experts and for the plan.",
                               OPTS, (int)(sizeof OPTS / sizeof OPTS[0]) };

/* Best of three copies of 512 MB (far beyond the caches) split across the threads, counting bytes read + written. */
static double memory_bandwidth(void) {
    const size_t n = (size_t)512 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) { free(a); free(b); return 0; }
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        const double t0 = trill_now();
#pragma omp parallel
        {
            const size_t per = n / (size_t)omp_get_num_threads(), at = per * (size_t)omp_get_thread_num();
            memcpy(b + at, a + at, per);
        }
        const double t = trill_now() - t0;
        if (r > 0 && t < best) best = t;
    }
    free(a);
    free(b);
    return 2.0 * n / best * 1e-9;
}

static int parse_list(const char *text, const char *flag, int *out, int max, long long lo, long long hi) {
    int n = 0;
    char *copy = strdup(text), *save = NULL;
    if (!copy) {
        trill_error(TRILL_ERR_NOMEM, "out of memory");
        cli_fail("bench");
        return -1;
    }
    for (char *tok = strtok_r(copy, ",", &save); tok && n < max; tok = strtok_r(NULL, ",", &save)) {
        long long v;
        char *end;
        v = strtoll(tok, &end, 10);
        if (*tok == '\0' || *end != '\0' || v < lo || v > hi) {
            cli_spec_error(&SPEC, "%s: expected integers in [%lld, %lld], got \"%s\"", flag, lo, hi, tok);
            free(copy);
            return -1;
        }
        out[n++] = (int)v;
    }
    free(copy);
    return n;
}

typedef struct run_result {
    double decode_tps;   /* generated tokens per second over the timed decode steps */
    double prefill_tps;  /* prompt tokens per second over the prefill steps */
    double step_s;       /* median decode step */
    trill_gen_profile prefill, decode; /* the engine's per-phase profile of those steps */
} run_result;

/* One line of a profile: each phase's ms a step and share of the steps' time, with GFLOP/s where
 * it ran matrix products. */
static double profile_seconds(const trill_gen_profile *p) {
    double total = 0;
    for (int i = 0; i < TRILL_N_PHASES; i++) total += p->seconds[i];
    return total;
}

static void print_profile(const char *what, const trill_gen_profile *p, bool bandwidth) {
    const double total = profile_seconds(p);
    if (p->steps == 0 || total <= 0) return;
    printf("              %s profile, ms a step (%% of it; GFLOP/s%s):", what, bandwidth ? "; weight GB/s" : "");
    for (int i = 0; i < TRILL_N_PHASES; i++) {
        if (p->seconds[i] <= 0) continue;
        printf(" %s %.3g (%.0f%%", trill_gen_phase_name((trill_gen_phase)i), 1e3 * p->seconds[i] / p->steps, 100 * p->seconds[i] / total);
        const double f = p->flops[i] + (i == TRILL_PHASE_ATTENTION ? p->attention_flops : 0);
        if (f > 0) printf("; %.0f", f / p->seconds[i] * 1e-9);
        if (bandwidth && p->weight_bytes[i] > 0) printf("; %.1f GB/s", p->weight_bytes[i] / p->seconds[i] * 1e-9);
        printf(")");
    }
    printf("\n");
}

/* New tokens a request needs: the timed steps, plus those its sequence decodes while later
 * prompts are still being prefilled (max_batch_tokens rows a step), plus a margin. */
static int new_tokens(int batch, int prompt_len, int steps, int step_rows) {
    return steps + batch * prompt_len / step_rows + batch / 8 + 8;
}

/* `batch` requests of random prompts: prefill, then `steps` timed decode steps of `batch` rows. */
static trill_status run(trill_engine *e, const trill_config *c, int batch, int prompt_len, int steps, int step_rows, run_result *res) {
    int *prompt = malloc(sizeof(int) * (size_t)prompt_len);
    double *times = malloc(sizeof(double) * (size_t)steps);
    if (!prompt || !times) { free(prompt); free(times); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    trill_status st = TRILL_OK;
    for (int b = 0; b < batch && !st; b++) {
        for (int i = 0; i < prompt_len; i++) prompt[i] = (int)(trill_rng_bits((uint64_t)b, (uint64_t)i) % (uint64_t)c->vocab_size);
        /* long enough to decode through the staggered prefill; aborted after the timed steps */
        trill_request r = { .id = (uint64_t)b, .prompt = prompt, .prompt_len = prompt_len, .n = 1,
                            .max_new_tokens = new_tokens(batch, prompt_len, steps, step_rows) };
        r.sampling = trill_sampling_default();
        st = trill_engine_submit(e, &r);
    }
    /* prefill: until every sequence decodes (prompt rows per second of those steps) */
    if (!st) st = trill_engine_profile(e, true);
    double t0 = trill_now();
    long prefill_rows = 0;
    trill_step_stats ss = { 0 };
    for (int guard = 0; !st && ss.decode_rows < batch; guard++) {
        if (guard > 4 * new_tokens(batch, prompt_len, steps, step_rows)) /* the cache is too small: sequences keep being preempted */
            st = trill_error(TRILL_ERR_INVALID, "bench: %d sequences never all decode at once (KV cache too small?)", batch);
        else if (!(st = trill_engine_step(e, &ss))) prefill_rows += ss.prefill_rows;
    }
    res->prefill_tps = prefill_rows / (trill_now() - t0);
    res->prefill = trill_engine_profile_get(e);
    if (!st) st = trill_engine_profile(e, true);
    double total = 0;
    for (int s = 0; s < steps && !st; s++) {
        t0 = trill_now();
        st = trill_engine_step(e, &ss);
        times[s] = trill_now() - t0;
        total += times[s];
        if (!st && ss.decode_rows != batch) st = trill_error(TRILL_ERR_INVALID, "bench: step %d decoded %d rows, expected %d", s, ss.decode_rows, batch);
    }
    if (!st) {
        res->decode_tps = batch * steps / total;
        res->step_s = trill_median(times, steps);
    }
    res->decode = trill_engine_profile_get(e);
    trill_engine_profile(e, false);
    for (int b = 0; b < batch; b++) trill_engine_abort(e, (uint64_t)b); /* drop the rest */
    trill_sequence_out out[64];
    int got;
    while ((got = trill_engine_collect(e, out, 64)) > 0)
        for (int i = 0; i < got; i++) trill_sequence_out_free(&out[i]);
    free(prompt);
    free(times);
    return st;
}

/* What every weight format's run shares. */
typedef struct bench_opts {
    const int *batches;
    int n_batches, max_batch;
    long long prompt_len, steps;
    bool eplb, decode_only; /* decode_only: no adapter-mode or capture comparison */
    double bw;               /* measured memory bandwidth, GB/s */
    const char *isa;         /* the generator's kernels */
} bench_opts;

/* Rounds of adapter mode against merged weights: this shared machine's speed drifts between
 * runs, so the two engines alternate and each round's ratio is taken in place. */
enum { ADAPTER_ROUNDS = 5 };

/* Decode at `batch` rows with the plain engine and with one serving `lora` on the side (rank 16,
 * all linear layers), alternating ADAPTER_ROUNDS times: the median and spread of the slowdown. */
static trill_status adapter_cost(trill_model *m, const trill_lora *lora, const trill_engine_config *ec, const bench_opts *o, int batch) {
    const trill_config *cfg = trill_model_config(m);
    trill_engine *plain = NULL, *adapted = NULL;
    trill_status st = trill_engine_create(m, ec, &plain);
    if (!st) st = trill_engine_create(m, ec, &adapted);
    if (!st) st = trill_engine_update_adapter(adapted, lora, 1, NULL);
    double ratio[ADAPTER_ROUNDS], tps[2] = { 0, 0 };
    for (int r = 0; r < ADAPTER_ROUNDS && !st; r++) {
        run_result a, b;
        if ((st = run(plain, cfg, batch, (int)o->prompt_len, (int)o->steps, ec->max_batch_tokens, &a)) ||
            (st = run(adapted, cfg, batch, (int)o->prompt_len, (int)o->steps, ec->max_batch_tokens, &b)))
            break;
        ratio[r] = a.decode_tps / b.decode_tps;
        tps[0] += a.decode_tps / ADAPTER_ROUNDS;
        tps[1] += b.decode_tps / ADAPTER_ROUNDS;
    }
    if (!st) {
        double lo = ratio[0], hi = ratio[0];
        for (int r = 1; r < ADAPTER_ROUNDS; r++) { lo = ratio[r] < lo ? ratio[r] : lo; hi = ratio[r] > hi ? ratio[r] : hi; }
        printf("  batch %d: adapter mode (rank 16, all linear layers) %.2fx slower than merged weights (median of %d alternating rounds, "
               "%.2f-%.2f; %.1f against %.1f tokens/s on average; the adapters %.1f MB in %s beside %.1f MB of weights)\n",
               batch, trill_median(ratio, ADAPTER_ROUNDS), ADAPTER_ROUNDS, lo, hi, tps[1], tps[0], trill_engine_adapter_bytes(adapted) / 1e6,
               trill_gen_format_name(ec->format == TRILL_GEN_F32 ? TRILL_GEN_F32 : TRILL_GEN_BF16), trill_engine_weight_bytes(plain) / 1e6);
    }
    trill_engine_free(plain);
    trill_engine_free(adapted);
    return st;
}

/* One batch size's line: decode against the format's peak (batch 1: against the bandwidth bound),
 * prefill, then the profiles of both. */
static void print_batch(const trill_engine *e, const bench_opts *o, int batch, const run_result *r, double peak, double step_bytes) {
    const double flops = trill_engine_decode_flops(e) * batch / r->step_s;
    printf("  batch %4d: decode %8.1f tokens/s (median step %.2f ms, %.1f GFLOP/s = %.1f%% of peak", batch, r->decode_tps, r->step_s * 1e3,
           flops * 1e-9, 100 * flops * 1e-9 / peak);
    if (batch == 1) printf(", %.1f%% of the bandwidth bound", 100.0 * r->decode_tps * step_bytes / (o->bw * 1e9));
    printf("); prefill %.0f tokens/s", r->prefill_tps);
    const double pre_s = profile_seconds(&r->prefill);
    if (pre_s > 0) /* the prefill steps also carry the rows of the sequences already decoding */
        printf(" (its steps %.0f rows/s, %.0f%% of them prompt tokens)", r->prefill.rows / pre_s, 100.0 * r->prefill_tps * pre_s / r->prefill.rows);
    printf("\n");
    print_profile("decode ", &r->decode, batch == 1); /* batch 1: what each phase reads of the weights a second */
    print_profile("prefill", &r->prefill, false);
}

/* One weight format: the batch sizes, then adapter mode at batch 1, 16 and 64 and expert capture at 16. */
static trill_status bench_format(trill_model *m, const trill_lora *lora, trill_gen_format fmt, const bench_opts *o) {
    const trill_config *cfg = trill_model_config(m);
    const char *instruction;
    const double peak = trill_gen_peak_gflops(fmt, &instruction);
    trill_engine_config ec = trill_engine_config_default();
    ec.format = fmt;
    ec.max_batch_tokens = o->max_batch > 512 ? o->max_batch : 512;
    ec.max_running = o->max_batch;
    ec.eplb = o->eplb;
    /* room for every sequence's whole length: no preemption while timing */
    const double per_token = (double)trill_engine_kv_bytes_per_token(cfg, fmt);
    ec.kv_cache_mb = (size_t)(o->max_batch * (o->prompt_len + new_tokens(o->max_batch, (int)o->prompt_len, (int)o->steps, ec.max_batch_tokens) + 16) *
                              per_token * 1.1 / 1e6) + 16;
    trill_engine *e = NULL;
    trill_status st = trill_engine_create(m, &ec, &e);
    if (st) return st;
    trill_engine_touch_cache(e); /* no timed step writes a cache page for the first time */
    const double step_bytes = (double)trill_engine_decode_bytes(e);
    printf("%s (%s kernels): weights %.1f MB; a batch-1 decode step reads %.1f MB: bound %.0f tokens/s at %.1f GB/s; peak %.0f GFLOP/s (%s); "
           "KV cache %.0f bytes per token",
           trill_gen_format_name(fmt), o->isa, trill_engine_weight_bytes(e) / 1e6, step_bytes / 1e6,
           o->bw * 1e9 / step_bytes, o->bw, peak, instruction, per_token);
    const size_t state = trill_engine_state_bytes_per_sequence(cfg);
    if (state) printf(", linear-attention state %zu bytes per sequence (fp32)", state);
    printf("; at the prompt's %u tokens a sequence holds %.0f bytes\n", (unsigned)o->prompt_len, per_token * (double)o->prompt_len + (double)state);
    for (int i = 0; i < o->n_batches && !st; i++) {
        run_result r;
        if ((st = run(e, cfg, o->batches[i], (int)o->prompt_len, (int)o->steps, ec.max_batch_tokens, &r))) break;
        print_batch(e, o, o->batches[i], &r, peak, step_bytes);
        double before, after;
        if (o->eplb && !trill_engine_eplb_imbalance(e, &before, &after))
            printf("              EPLB: busiest worker / mean over the load window %.3f with contiguous experts, %.3f as planned\n", before, after);
    }
    trill_engine_free(e);
    e = NULL;
    if (o->decode_only) return st;
    /* adapter mode at batch 1, 16 and 64 against the plain engine, alternating; capture at 16 */
    for (int b = 1; b <= 64 && !st; b *= b == 1 ? 16 : 4) st = adapter_cost(m, lora, &ec, o, b);
    run_result plain = { 0 }, captured = { 0 };
    if (!st) st = trill_engine_create(m, &ec, &e);
    if (!st) st = run(e, cfg, 16, (int)o->prompt_len, (int)o->steps, ec.max_batch_tokens, &plain);
    trill_engine_free(e);
    e = NULL;
    ec.capture_experts = true;
    if (!st) st = trill_engine_create(m, &ec, &e);
    if (!st) st = run(e, cfg, 16, (int)o->prompt_len, (int)o->steps, ec.max_batch_tokens, &captured);
    if (!st)
        printf("  batch 16: expert capture on %.1f tokens/s against %.1f off (%.1f%% slower)\n", captured.decode_tps, plain.decode_tps,
               100.0 * (plain.decode_tps / captured.decode_tps - 1));
    trill_engine_free(e);
    return st;
}

int bench_generate(int argc, char **argv) {
    int first, rc = cli_parse(&SPEC, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    const char *dir = g_args.dir, *dtypes = g_args.dtypes;
    const long long prompt_len = g_args.prompt_len, steps = g_args.steps;
    const bool eplb = g_args.eplb;
    int batches[MAX_LIST], n_batches = parse_list(g_args.batches, "--batches", batches, MAX_LIST, 1, 4096);
    if (n_batches < 0) return EXIT_USAGE;
    if (n_batches == 0) return cli_spec_error(&SPEC, "--batches: expected a comma-separated list of batch sizes");
    trill_gen_format formats[3];
    int n_formats = 0;
    char *copy = strdup(dtypes), *save = NULL;
    if (!copy) {
        trill_error(TRILL_ERR_NOMEM, "out of memory");
        return cli_fail("bench");
    }
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n_formats == 3 || trill_gen_format_parse(tok, &formats[n_formats])) {
            free(copy);
            return cli_spec_error(&SPEC, "--dtypes: expected a list of bf16, int8, f32, got \"%s\"", dtypes);
        }
        n_formats++;
    }
    free(copy);

    const char *isa_used; /* TRILL_GEN_ISA, else the best this CPU has */
    if (trill_gen_isa(&isa_used)) return cli_fail("bench");
    trill_model *m;
    if (trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &m)) return cli_fail("bench");
    int max_batch = g_args.decode_only ? 1 : 64; /* the adapter comparison runs at 1, 16 and 64, expert capture at 16 */
    for (int i = 0; i < n_batches; i++) if (batches[i] > max_batch) max_batch = batches[i];
    const double bw = memory_bandwidth();
    printf("memory bandwidth (512 MB copy, %d threads): %.1f GB/s\n", omp_get_max_threads(), bw);
    trill_lora *lora = NULL;
    trill_lora_config lc = { .rank = 16, .alpha = 32 };
    trill_lora_parse_targets("all-linear", &lc.targets);
    trill_status st = trill_lora_create(m, lc, 1, &lora);
    const bench_opts o = { .batches = batches, .n_batches = n_batches, .max_batch = max_batch, .prompt_len = prompt_len,
                           .steps = steps, .eplb = eplb, .bw = bw, .isa = isa_used, .decode_only = g_args.decode_only };
    for (int f = 0; f < n_formats && !st; f++) st = bench_format(m, lora, formats[f], &o);
    trill_lora_free(lora);
    trill_model_free(m);
    return st ? cli_fail("bench") : 0;
}
