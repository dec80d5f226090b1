/* trill train: RL post-training (the controller in src/rl). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/dist.h"
#include "trill/run_config.h"
#include "trill/run.h"

static void print_progress(void *ctx, const trill_run_status *status, const char *line) {
    (void)ctx;
    (void)status;
    if (trill_comm_rank(cli_world()) == 0) fprintf(stderr, "%s\n", line);
}

/* The run, step by step, its progress on stderr (rank 0's). */
static trill_status run(const trill_run_config *cfg, trill_rl_result *res) {
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
    const char *resume = NULL;
    bool print_only = false, reference = false;
    const cli_opt opts[] = {
        { "resume", CLI_STR, "DIR|auto", "the same as the key resume: a checkpoint folder, or auto (run_dir's latest)", .str = &resume },
        { "print-config", CLI_FLAG, NULL, "print the resolved config and exit", .flag = &print_only },
        { "config-reference", CLI_FLAG, NULL, "print every key (docs/config.md) and exit", .flag = &reference },
    };
    const cli_spec spec = { "train", "[CONFIG.yaml] [section.key=value ...]",
                            "Runs GRPO-family RL with LoRA on an MoE model: rollouts from the generator engine, rewards,\n"
                            "group advantages, the trainer's log-probs (router replay, TIS/MIS corrections), LoRA updates\n"
                            "and a weight sync each step. With no CONFIG it runs the embedded demo (a tiny MoE learning\n"
                            "addition: SFT warm start, cached, then RL; env.kind=guess env.max_turns=3: its multi-turn version, the\n"
                            "higher/lower game). Overrides use the config's dotted keys, e.g.\n"
                            "algo.loss=gspo trainer.lr=1e-4 generator.dtype=f32 'correction.mis=[0.5, 5]'. mode=async runs generator,\n"
                            "rewards and trainer at the same time on their own cores (async.max_staleness, resources.*).\n"
                            "Ctrl-C (SIGINT) or SIGTERM: the current step finishes and is checkpointed, then it exits with\n"
                            "128 + the signal (a second signal quits at once); resume=auto continues the run.\n"
                            "Writes config.yaml, metrics.jsonl and checkpoints/ to run_dir (default: a new runs/YYYYMMDD-HHMMSS).",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if (reference) return trill_run_config_reference(stdout) ? cli_fail("train") : 0;
    trill_run_config cfg;
    rc = cli_run_config(&spec, argc, argv, first, NULL, &cfg);
    if (rc) return rc;
    if (!rc && resume) {
        char arg[4200];
        snprintf(arg, sizeof arg, "resume=%s", resume);
        if (trill_run_config_set(&cfg, arg)) rc = cli_spec_error(&spec, "%s", trill_error_message());
    }
    if (!rc && trill_run_config_validate(&cfg)) rc = cli_fail("train");
    if (!rc && print_only) {
        if (trill_run_config_write(&cfg, stdout)) rc = cli_fail("train");
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
    trill_run_config_free(&cfg);
    return rc;
}
