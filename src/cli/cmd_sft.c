/* trill sft: supervised fine-tuning on prompt/completion JSONL, LoRA or full. */
#include <math.h>
#include <string.h>

#include "cli.h"
#include "trill/sft.h"

static const char USAGE[] =
    "trill sft --model DIR --data TRAIN.jsonl --out DIR [--eval HELDOUT.jsonl] [--lora|--full] [key=value ...]\n"
    "  Lines: {\"prompt\": ..., \"completion\": ...}; the loss covers the completion and the end-of-sequence token.\n"
    "  Settings (defaults): lr=1e-4 min_lr=0 schedule=cosine warmup_steps=0 weight_decay=0 clip=1 epochs=1\n"
    "  max_steps=0 (all) batch_tokens=4096 grad_accum=1 eval_every=0 (end only) max_seq_len=4096 seed=0\n"
    "  save_every=0 (end only) stop_after=0 (end this run after N steps; the schedule spans all)\n"
    "  resume=false (continue from --out's checkpoint: weights, optimizer, step)\n"
    "  recompute=false (activation checkpointing: less memory, ~1/3 more compute, same results)\n"
    "  prompt_field=prompt completion_field=completion lora.rank=8 lora.alpha=16 lora.use_rslora=false\n"
    "  lora.target_modules=all-linear (q,k,v,o,gate,up,down[,lm_head]). Default mode: --lora.\n"
    "  Writes the PEFT adapter (or the full model), optimizer state and trainer_state.json to --out.";

int cmd_sft(int argc, char **argv) {
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' }, { "data", required_argument, 0, 'd' }, { "eval", required_argument, 0, 'e' },
        { "out", required_argument, 0, 'o' }, { "lora", no_argument, 0, 'l' }, { "full", no_argument, 0, 'f' },
        { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
    };
    trill_sft_config cfg = trill_sft_defaults();
    int c;
    bool lora = false, full = false;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': cfg.model_dir = optarg; break;
        case 'd': cfg.data_path = optarg; break;
        case 'e': cfg.eval_path = optarg; break;
        case 'o': cfg.out_dir = optarg; break;
        case 'l': cfg.lora = lora = true; break;
        case 'f': cfg.lora = false; full = true; break;
        case 'h': printf("usage: %s\n", USAGE); return 0;
        default: return cli_usage_error("sft", USAGE, "invalid option %s", argv[optind - 1]);
        }
    }
    if (lora && full) return cli_usage_error("sft", USAGE, "--lora and --full exclude each other: train adapters or every weight");
    for (int i = optind; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) return cli_usage_error("sft", USAGE, "expected key=value, got \"%s\"", argv[i]);
        *eq = '\0';
        if (trill_sft_set(&cfg, argv[i], eq + 1)) return cli_usage_error("sft", USAGE, "%s", trill_error_message());
    }
    if (!cfg.model_dir || !cfg.data_path || !cfg.out_dir) return cli_usage_error("sft", USAGE, "--model, --data and --out are required");
    double eval;
    return trill_sft_run(&cfg, &eval) ? cli_fail("sft") : 0;
}
