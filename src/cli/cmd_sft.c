/* trill sft: supervised fine-tuning on prompt/completion JSONL, LoRA or full, on the run
 * configuration `trill train` uses (one key table: docs/config.md). */
#include <math.h>
#include <string.h>

#include "cli.h"
#include "trill/rl_config.h"
#include "trill/sft.h"

static const char USAGE[] =
    "trill sft [CONFIG.yaml] [section.key=value ...] [--model DIR] [--data TRAIN.jsonl] [--eval HELDOUT.jsonl] [--out DIR]\n"
    "          [--lora|--full] [--print-config]\n"
    "  Lines: {\"prompt\": ..., \"completion\": ...} (data.prompt_field, data.completion_field); the loss covers the\n"
    "  completion and the end-of-sequence token. The keys are trill train's (trill train --config-reference): model,\n"
    "  run_dir, seed, resume (\"\" afresh, auto, or a checkpoint folder), data.*, trainer.* (lr, schedule, grad_clip,\n"
    "  micro_batch_tokens, recompute, precision, lora.*) and sft.* (mode lora|full, epochs, max_steps, grad_accum, eval_every,\n"
    "  max_seq_len, save_every, stop_after). --model, --data, --eval, --out, --lora and --full set model,\n"
    "  data.train, data.eval, run_dir and sft.mode. Checkpoints go to run_dir/checkpoints/step-N (every sft.save_every\n"
    "  steps and at the end; checkpoint.keep of them kept); the result, the PEFT adapter (or the full model), the\n"
    "  optimizer state and trainer_state.json, to run_dir. One run a run_dir (a lock). Ctrl-C (SIGINT) or SIGTERM: the\n"
    "  current step finishes and is checkpointed, then it exits with 128 + the signal; resume=auto continues it.";

/* The settings of the old `trill sft key=value` form, and the key each is now. */
static const char *const RENAMED[][2] = {
    { "lr", "trainer.lr" }, { "min_lr", "trainer.min_lr" }, { "weight_decay", "trainer.weight_decay" }, { "clip", "trainer.grad_clip" },
    { "schedule", "trainer.schedule" }, { "warmup_steps", "trainer.warmup_steps" }, { "batch_tokens", "trainer.micro_batch_tokens" },
    { "recompute", "trainer.recompute" }, { "epochs", "sft.epochs" }, { "max_steps", "sft.max_steps" }, { "grad_accum", "sft.grad_accum" },
    { "eval_every", "sft.eval_every" }, { "max_seq_len", "sft.max_seq_len" }, { "save_every", "sft.save_every" },
    { "stop_after", "sft.stop_after" }, { "prompt_field", "data.prompt_field" }, { "completion_field", "data.completion_field" },
    { "lora.rank", "trainer.lora.rank" }, { "lora.alpha", "trainer.lora.alpha" }, { "lora.use_rslora", "trainer.lora.use_rslora" },
    { "lora.target_modules", "trainer.lora.targets" },
};

/* key=value, refusing an old name with the key that replaced it (and resume=true with auto). */
static int set_one(trill_rl_config *cfg, const char *arg) {
    const char *eq = strchr(arg, '=');
    const size_t n = (size_t)(eq - arg);
    for (size_t i = 0; i < sizeof RENAMED / sizeof RENAMED[0]; i++)
        if (strlen(RENAMED[i][0]) == n && strncmp(arg, RENAMED[i][0], n) == 0)
            return cli_usage_error("sft", USAGE, "\"%s\": the setting %s is now the key %s (e.g. %s=%s)", arg, RENAMED[i][0], RENAMED[i][1],
                                   RENAMED[i][1], eq + 1);
    if (strcmp(arg, "resume=true") == 0)
        return cli_usage_error("sft", USAGE, "\"resume=true\": resume takes \"\" (afresh), auto (run_dir's checkpoint) or a checkpoint folder");
    return trill_rl_config_set(cfg, arg) ? cli_usage_error("sft", USAGE, "%s", trill_error_message()) : 0;
}

/* --model DIR and the like: the key, quoted as a YAML string so that any path is taken whole. */
static int set_path(trill_rl_config *cfg, const char *key, const char *path) {
    if (strchr(path, '\'')) return cli_usage_error("sft", USAGE, "%s: a path with a single quote is not supported: %s", key, path);
    char arg[4200];
    snprintf(arg, sizeof arg, "%s='%s'", key, path);
    return set_one(cfg, arg);
}

int cmd_sft(int argc, char **argv) {
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' }, { "data", required_argument, 0, 'd' }, { "eval", required_argument, 0, 'e' },
        { "out", required_argument, 0, 'o' }, { "lora", no_argument, 0, 'l' }, { "full", no_argument, 0, 'f' },
        { "print-config", no_argument, 0, 'p' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
    };
    const char *model = NULL, *data = NULL, *eval = NULL, *out = NULL;
    bool lora = false, full = false, print_only = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'd': data = optarg; break;
        case 'e': eval = optarg; break;
        case 'o': out = optarg; break;
        case 'l': lora = true; break;
        case 'f': full = true; break;
        case 'p': print_only = true; break;
        case 'h': printf("usage: %s\n", USAGE); return 0;
        default: return cli_usage_error("sft", USAGE, "invalid option %s", argv[optind - 1]);
        }
    }
    if (lora && full) return cli_usage_error("sft", USAGE, "--lora and --full exclude each other: train adapters or every weight");
    trill_rl_config cfg;
    int rc = cli_run_config("sft", USAGE, argc, argv, optind, set_one, &cfg);
    if (rc) return rc;
    /* the flags win over the file and the keys, as flags do */
    if (!rc && model) rc = set_path(&cfg, "model", model);
    if (!rc && data) rc = set_path(&cfg, "data.train", data);
    if (!rc && eval) rc = set_path(&cfg, "data.eval", eval);
    if (!rc && out) rc = set_path(&cfg, "run_dir", out);
    if (!rc && (lora || full)) rc = set_one(&cfg, full ? "sft.mode=full" : "sft.mode=lora");
    if (!rc && trill_sft_validate(&cfg)) rc = cli_usage_error("sft", USAGE, "%s", trill_error_message());
    if (!rc && print_only) {
        if (trill_rl_config_write(&cfg, stdout)) rc = cli_fail("sft");
        goto done;
    }
    if (!rc) {
        trill_sft_result res;
        const trill_sft_options so = { .world = cli_world() };
        cli_catch_stop_signals("sft");
        const trill_status st = trill_sft_run(&cfg, &so, &res);
        if (st == TRILL_ERR_INTERRUPTED) {
            fprintf(stderr, "trill sft: %s\n", trill_error_message());
            rc = cli_stopped_status();
        } else if (st) rc = cli_fail("sft");
    }
done:
    trill_rl_config_free(&cfg);
    return rc;
}
