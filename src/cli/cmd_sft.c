/* trill sft: supervised fine-tuning on prompt/completion JSONL, LoRA or full, on the run
 * configuration `trill train` uses (one key table: docs/config.md). */
#include <math.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/run_config.h"
#include "trill/sft.h"

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
static int set_one(const cli_spec *spec, trill_run_config *cfg, const char *arg) {
    const char *eq = strchr(arg, '=');
    const size_t n = (size_t)(eq - arg);
    for (size_t i = 0; i < sizeof RENAMED / sizeof RENAMED[0]; i++)
        if (strlen(RENAMED[i][0]) == n && strncmp(arg, RENAMED[i][0], n) == 0)
            return cli_spec_error(spec, "\"%s\": the setting %s is now the key %s (e.g. %s=%s)", arg, RENAMED[i][0], RENAMED[i][1],
                                   RENAMED[i][1], eq + 1);
    if (strcmp(arg, "resume=true") == 0)
        return cli_spec_error(spec, "\"resume=true\": resume takes \"\" (afresh), auto (run_dir's checkpoint) or a checkpoint folder");
    return trill_run_config_set(cfg, arg) ? cli_spec_error(spec, "%s", trill_error_message()) : 0;
}

/* --model DIR and the like: the key, quoted as a YAML string so that any path is taken whole. */
static int set_path(const cli_spec *spec, trill_run_config *cfg, const char *key, const char *path) {
    if (strchr(path, '\'')) return cli_spec_error(spec, "%s: a path with a single quote is not supported: %s", key, path);
    char arg[4200];
    snprintf(arg, sizeof arg, "%s='%s'", key, path);
    return set_one(spec, cfg, arg);
}

int cmd_sft(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *eval = NULL, *out = NULL;
    bool lora = false, full = false, print_only = false;
    const cli_opt opts[] = {
        { "model", CLI_STR, "DIR", "the key model", .str = &model },
        { "data", CLI_STR, "TRAIN.jsonl", "the key data.train", .str = &data },
        { "eval", CLI_STR, "HELDOUT.jsonl", "the key data.eval", .str = &eval },
        { "out", CLI_STR, "DIR", "the key run_dir", .str = &out },
        { "lora", CLI_FLAG, NULL, "sft.mode lora: adapters on a frozen base", .flag = &lora },
        { "full", CLI_FLAG, NULL, "sft.mode full: every weight", .flag = &full },
        { "print-config", CLI_FLAG, NULL, "print the resolved config and exit", .flag = &print_only },
    };
    const cli_spec spec = { "sft", "[CONFIG.yaml] [section.key=value ...]",
                            "Lines: {\"prompt\": ..., \"completion\": ...} (data.prompt_field, data.completion_field); the loss covers the\n"
                            "completion and the end-of-sequence token. The keys are trill train's (trill train --config-reference): model,\n"
                            "run_dir, seed, resume (\"\" afresh, auto, or a checkpoint folder), data.*, trainer.* (lr, schedule, grad_clip,\n"
                            "micro_batch_tokens, recompute, precision, lora.*) and sft.* (mode lora|full, epochs, max_steps, grad_accum, eval_every,\n"
                            "max_seq_len, save_every, stop_after); the options win over them. Checkpoints go to run_dir/checkpoints/step-N\n"
                            "(every sft.save_every steps and at the end; checkpoint.keep of them kept); the result, the PEFT adapter (or the\n"
                            "full model), the optimizer state and trainer_state.json, to run_dir. One run a run_dir (a lock). Ctrl-C (SIGINT)\n"
                            "or SIGTERM: the current step finishes and is checkpointed, then it exits with 128 + the signal; resume=auto\n"
                            "continues it.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    if (lora && full) return cli_spec_error(&spec, "--lora and --full exclude each other: train adapters or every weight");
    trill_run_config cfg;
    rc = cli_run_config(&spec, argc, argv, first, set_one, &cfg);
    if (rc) return rc;
    /* the flags win over the file and the keys, as flags do */
    if (!rc && model) rc = set_path(&spec, &cfg, "model", model);
    if (!rc && data) rc = set_path(&spec, &cfg, "data.train", data);
    if (!rc && eval) rc = set_path(&spec, &cfg, "data.eval", eval);
    if (!rc && out) rc = set_path(&spec, &cfg, "run_dir", out);
    if (!rc && (lora || full)) rc = set_one(&spec, &cfg, full ? "sft.mode=full" : "sft.mode=lora");
    if (!rc && trill_sft_validate(&cfg)) rc = cli_spec_error(&spec, "%s", trill_error_message());
    if (!rc && print_only) {
        if (trill_run_config_write(&cfg, stdout)) rc = cli_fail("sft");
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
    trill_run_config_free(&cfg);
    return rc;
}
