/* trill: reinforcement-learning post-training for Mixture-of-Experts models. */
#include <malloc.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "opts.h"
#include "trill/dist.h"
#include "trill/kernels.h"
#include "trill/run_config.h"
#include "trill/run.h"
#include "trill/log.h"

static const struct {
    const char *name;
    int (*run)(int, char **);
    const char *summary;
} COMMANDS[] = {
    { "init", cmd_init, "write a randomly initialised model in Hugging Face layout" },
    { "info", cmd_info, "describe a model: architecture, layer map, parameters, bytes" },
    { "plan", cmd_plan, "plan an RL run: parameters, memory per device, weight-sync bytes (no weights needed)" },
    { "score", cmd_score, "per-token log-probs and routed experts of token sequences" },
    { "generate", cmd_generate, "sample completions with the batched generator engine" },
    { "tokenize", cmd_tokenize, "text lines to JSON token ids, or back with --decode" },
    { "sft", cmd_sft, "supervised fine-tuning (LoRA or full) on prompt/completion JSONL" },
    { "bench", cmd_bench, "benchmarks: trill bench train (training-step throughput)" },
    { "train", cmd_train, "RL post-training (GRPO family, LoRA, router replay); no arguments: the embedded demo" },
    { "eval", cmd_eval, "pass@1 / pass@k of a model (and adapter) on a JSONL set with a verifier" },
    { "merge", cmd_merge, "fold a PEFT LoRA adapter into the weights, write a full checkpoint" },
    { "report", cmd_report, "charts of run folders' metrics in one self-contained HTML page" },
    { "serve", cmd_serve, "the post-training service: a Tinker-style HTTP API over shared base models" },
};

static void print_help(FILE *out) {
    fprintf(out, "usage: trill COMMAND [options]   (trill COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        fprintf(out, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
}

int cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "trill %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nusage: %s\n", usage);
    return EXIT_USAGE;
}

static trill_comm *g_world;

trill_comm *cli_world(void) { return g_world; }

/* The commands that run on several ranks; the others refuse a job of more than one. */
static bool distributed(const char *cmd, const char *sub) {
    return strcmp(cmd, "sft") == 0 || strcmp(cmd, "train") == 0 || (strcmp(cmd, "bench") == 0 && sub && strcmp(sub, "train") == 0);
}

/* The first SIGINT/SIGTERM lets the current step finish and be checkpointed; a second one ends
 * the process at once (complete checkpoints are never touched by a kill). */
static volatile sig_atomic_t g_signal;
static char g_stop_message[128];
static size_t g_stop_message_len;

static void on_stop_signal(int sig) {
    if (g_signal) _exit(128 + sig);
    g_signal = sig;
    trill_rl_request_stop(); /* the run in progress (this flag is read by every run) */
    if (write(STDERR_FILENO, g_stop_message, g_stop_message_len) < 0) { /* nothing to do about it */ }
}

void cli_catch_stop_signals(const char *cmd) {
    g_stop_message_len = (size_t)snprintf(g_stop_message, sizeof g_stop_message,
                                          "\ntrill %s: stopping after the current step (checkpointed); again to quit at once\n", cmd);
    if (g_stop_message_len >= sizeof g_stop_message) g_stop_message_len = sizeof g_stop_message - 1;
    struct sigaction sa = { .sa_handler = on_stop_signal, .sa_flags = SA_RESTART }, old;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = { SIGINT, SIGTERM };
    for (int i = 0; i < 2; i++) /* a signal ignored when trill started stays ignored (a shell's background job ignores SIGINT) */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(sigs[i], &sa, NULL);
}

int cli_stopped_status(void) { return 128 + (g_signal ? g_signal : SIGINT); }

int cli_fail(const char *cmd) {
    fprintf(stderr, "trill %s: %s\n", cmd, trill_error_message());
    return 1;
}

/* The process's memory (glibc's allocator), set before anything is allocated. A training step
 * allocates and frees its activations, gradients and scratch each time, and the generator its
 * caches; by default glibc returns a freed block of 128 KiB or more to the kernel, so the next
 * step takes a page fault on every 4 KiB it touches again, and everything is mapped 4 KiB at a
 * time. Measured on the test suite's runs (2 cores, AMD EPYC): sft_learns 1.1 M page faults and
 * 34 s, the demo's 10 RL steps 122 k and 2.9 s. Two remedies, together 28 k faults and 22 s, 4 k
 * and 1.9 s:
 *   - blocks up to 32 MiB come from the heap and freed memory stays there up to 512 MiB, to be
 *     used again without faults (mallopt);
 *   - transparent huge pages where the kernel gives them on request only ("madvise", Debian's
 *     default): glibc asks for them for its heap and its mapped blocks when started with the
 *     tunable glibc.malloc.hugetlb=1, so the command starts itself again with it put first in
 *     GLIBC_TUNABLES (once: the variable then names it; one that names it already is left as it is).
 * The sanitizers' builds have allocators of their own, which these do not reach; the commands
 * that only read or write a file do not restart. */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
static void restart_with_huge_pages(char **argv) {
    const char *had = getenv("GLIBC_TUNABLES");
    if (had && strstr(had, "glibc.malloc.hugetlb")) return;
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return;
    const bool ok = fgets(mode, sizeof mode, f) != NULL;
    fclose(f);
    if (!ok || !strstr(mode, "[madvise]")) return;
    char tunables[4096];
    const int n = snprintf(tunables, sizeof tunables, "glibc.malloc.hugetlb=1%s%s", had && *had ? ":" : "", had ? had : "");
    /* the binary by its own name (not /proc/self/exe, which would name the process "exe") */
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0 || (size_t)len >= sizeof self - 1) return;
    self[len] = '\0';
    if (n > 0 && (size_t)n < sizeof tunables && !setenv("GLIBC_TUNABLES", tunables, 1)) execv(self, argv);
}
#endif

static void tune_memory(int argc, char **argv) {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* the commands that compute (a restart costs about 20 ms: not worth it for init, info, tokenize, merge, report) */
    static const char *const HEAVY[] = { "train", "sft", "score", "generate", "eval", "serve", "bench", NULL };
    for (int i = 0; argc > 1 && HEAVY[i]; i++)
        if (!strcmp(argv[1], HEAVY[i])) restart_with_huge_pages(argv);
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
#else
    (void)argc;
    (void)argv;
#endif
}

int main(int argc, char **argv) {
    /* a file grown past RLIMIT_FSIZE fails with EFBIG (an error naming the file) instead of
     * killing the process mid-write */
    signal(SIGXFSZ, SIG_IGN);
    /* OpenBLAS misdetected the CPU (trill_blas_core_fix): run again with the right kernels. The
     * variable is set from then on, so this happens at most once. */
    trill_blas_restart(argv);
    tune_memory(argc, argv);
    trill_log_set_sink(trill_log_stderr, NULL); /* the library's progress lines and warnings */
    if (argc < 2) {
        print_help(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        print_help(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++) {
        if (strcmp(argv[1], COMMANDS[i].name) != 0) continue;
        if (trill_dist_init(&argc, &argv, 0, &g_world)) {
            fprintf(stderr, "trill %s: %s\n", argv[1], trill_error_message());
            return 1;
        }
        int rc;
        if (trill_comm_rank(g_world) != 0) trill_log_set_sink(NULL, NULL); /* rank 0 speaks for the job */
        if (trill_comm_size(g_world) > 1 && !distributed(argv[1], argc > 2 ? argv[2] : NULL)) {
            if (trill_comm_rank(g_world) == 0)
                fprintf(stderr, "trill %s: runs on one process, but this job has %d ranks (trill train, trill sft and trill bench train "
                                "are the ones that share their work over MPI ranks)\n", argv[1], trill_comm_size(g_world));
            rc = EXIT_USAGE;
        } else {
            rc = COMMANDS[i].run(argc - 1, argv + 1);
        }
        trill_dist_finalize(g_world);
        return rc;
    }
    fprintf(stderr, "trill: unknown command \"%s\"\n", argv[1]);
    print_help(stderr);
    return EXIT_USAGE;
}

int cli_run_config(const cli_spec *spec, int argc, char **argv, int first, int (*set)(const cli_spec *, trill_run_config *, const char *),
                   trill_run_config *cfg) {
    if (trill_run_config_defaults(cfg)) return cli_fail(spec->cmd);
    int rc = 0;
    if (first < argc && !strchr(argv[first], '=')) {
        if (trill_run_config_load(cfg, argv[first])) rc = cli_fail(spec->cmd);
        first++;
    }
    for (int i = first; i < argc && !rc; i++) {
        if (!strchr(argv[i], '=')) rc = cli_spec_error(spec, "expected section.key=value, got \"%s\"", argv[i]);
        else if (set) rc = set(spec, cfg, argv[i]);
        else if (trill_run_config_set(cfg, argv[i])) rc = cli_spec_error(spec, "%s", trill_error_message());
    }
    if (rc) trill_run_config_free(cfg);
    return rc;
}
