/* trill train: RL post-training (the controller in src/rl). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trill/dist.h"
#include "trill/rl_config.h"
#include "trill/run.h"

static const char USAGE[] =
    "trill train [CONFIG.yaml] [section.key=value ...] [--resume DIR|auto] [--print-config] [--config-reference]\n"
    "  Runs GRPO-family RL with LoRA on an MoE model: rollouts from the generator engine, rewards,\n"
    "  group advantages, the trainer's log-probs (router replay, TIS/MIS corrections), LoRA updates\n"
    "  and a weight sync each step. With no CONFIG it runs the embedded demo (a tiny MoE learning\n"
    "  addition: SFT warm start, cached, then RL). Overrides use the config's dotted keys, e.g.\n"
    "  algo.loss=gspo trainer.lr=1e-4 generator.dtype=f32 'correction.mis=[0.5, 5]'. mode=async runs generator,\n"
    "  rewards and trainer at the same time on their own cores (async.max_staleness, resources.*).\n"
    "  --print-config prints the resolved config and exits; --config-reference prints every key.\n"
    "  Ctrl-C (SIGINT) or SIGTERM: the current step finishes and is checkpointed, then it exits with\n"
    "  128 + the signal (a second signal quits at once); resume=auto continues the run.\n"
    "  Writes config.yaml, metrics.jsonl and checkpoints/ to run_dir (default: a new runs/YYYYMMDD-HHMMSS).";

static void print_progress(void *ctx, const trill_run_status *status, const char *line) {
    (void)ctx;
    (void)status;
    if (trill_comm_rank(cli_world()) == 0) fprintf(stderr, "%s\n", line);
}

/* The run, step by step, its progress on stderr (rank 0's). */
static trill_status run(const trill_rl_config *cfg, trill_rl_result *res) {
    const trill_run_options o = { .progress = print_progress, .world = cli_world() };
    trill_run *h;
    trill_status st = trill_run_create(cfg, &o, &h);
    if (st) return st;
    trill_run_status s;
    do {
        st = trill_run_step(h);
        trill_run_get_status(h, &s);
    } while (!st && s.phase != TRILL_RUN_DONE);
    const trill_status fin = trill_run_finish(h, res);
    trill_run_free(h);
    return st ? st : fin;
}

int cmd_train(int argc, char **argv) {
    static const struct option opts[] = {
        { "resume", required_argument, 0, 'r' }, { "print-config", no_argument, 0, 'p' },
        { "config-reference", no_argument, 0, 'R' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
    };
    const char *resume = NULL;
    bool print_only = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r': resume = optarg; break;
        case 'p': print_only = true; break;
        case 'R': return trill_rl_config_reference(stdout) ? cli_fail("train") : 0;
        case 'h': printf("usage: %s\n", USAGE); return 0;
        default: return cli_usage_error("train", USAGE, "invalid option %s", argv[optind - 1]);
        }
    }
    trill_rl_config cfg;
    int rc = cli_run_config("train", USAGE, argc, argv, optind, NULL, &cfg);
    if (rc) return rc;
    if (!rc && resume) {
        char arg[4200];
        snprintf(arg, sizeof arg, "resume=%s", resume);
        if (trill_rl_config_set(&cfg, arg)) rc = cli_usage_error("train", USAGE, "%s", trill_error_message());
    }
    if (!rc && trill_rl_config_validate(&cfg)) rc = cli_fail("train");
    if (!rc && print_only) {
        if (trill_rl_config_write(&cfg, stdout)) rc = cli_fail("train");
        goto done;
    }
    if (!rc) {
        trill_rl_result res;
        cli_catch_stop_signals("train");
        trill_status st = run(&cfg, &res);
        if (st == TRILL_ERR_INTERRUPTED) {
            fprintf(stderr, "trill train: %s\n", trill_error_message());
            rc = cli_stopped_status();
        } else if (st) rc = cli_fail("train");
        else if (isfinite(res.eval_before) && isfinite(res.eval_after) && trill_comm_rank(cli_world()) == 0)
            fprintf(stderr, "trill train: held-out pass@1 %.1f%% -> %.1f%% (%+.1f points), pass@k %.1f%% -> %.1f%%, %.0f s in all\n",
                    100 * res.eval_before, 100 * res.eval_after, 100 * (res.eval_after - res.eval_before), 100 * res.passk_before,
                    100 * res.passk_after, res.seconds);
    }
done:
    trill_rl_config_free(&cfg);
    return rc;
}
