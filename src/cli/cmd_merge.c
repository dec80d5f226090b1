/* trill merge: fold a PEFT LoRA adapter into the base weights and write a full HF checkpoint. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trill/fileio.h"
#include "trill/lora.h"
#include "trill/model.h"

static const char USAGE[] =
    "trill merge --model DIR --adapter DIR --out DIR [--dtype bf16|f32]\n"
    "  W += scale * B A for every adapted layer; writes config.json and the weights (default: the\n"
    "  base checkpoint's dtype) and copies the tokenizer files.";

int cmd_merge(int argc, char **argv) {
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' }, { "adapter", required_argument, 0, 'a' },
        { "out", required_argument, 0, 'o' }, { "dtype", required_argument, 0, 'd' },
        { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
    };
    const char *dir = NULL, *adapter = NULL, *out = NULL, *dtype_name = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'm': dir = optarg; break;
        case 'a': adapter = optarg; break;
        case 'o': out = optarg; break;
        case 'd': dtype_name = optarg; break;
        case 'h': printf("usage: %s\n", USAGE); return 0;
        default: return cli_usage_error("merge", USAGE, "invalid option %s", argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage_error("merge", USAGE, "unexpected argument \"%s\"", argv[optind]);
    if (!dir || !adapter || !out) return cli_usage_error("merge", USAGE, "--model, --adapter and --out are required");
    if (dtype_name && strcmp(dtype_name, "bf16") != 0 && strcmp(dtype_name, "f32") != 0)
        return cli_usage_error("merge", USAGE, "--dtype: expected bf16 or f32, got \"%s\"", dtype_name);
    trill_model *m = NULL;
    trill_lora *lora = NULL;
    trill_status st = trill_model_load(dir, &m);
    if (!st) st = trill_lora_load(m, adapter, &lora);
    if (!st && (st = trill_lora_merge(lora, m))) trill_error_context("%s", adapter);
    if (!st) {
        trill_dtype dtype = !dtype_name ? trill_model_checkpoint_dtype(m) : strcmp(dtype_name, "bf16") == 0 ? TRILL_BF16 : TRILL_F32;
        st = trill_model_save(m, out, dtype, 5000000000u);
    }
    if (!st) st = trill_model_copy_side_files(dir, out);
    size_t n_merged = 0;
    if (!st) trill_lora_tensors(lora, &n_merged);
    if (!st) fprintf(stderr, "trill merge: wrote %s (%zu adapter tensors merged)\n", out, n_merged);
    trill_lora_free(lora);
    trill_model_free(m);
    return st ? cli_fail("merge") : 0;
}
