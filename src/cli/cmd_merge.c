/* trill merge: fold a PEFT LoRA adapter into the base weights and write a full HF checkpoint. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/fileio.h"
#include "trill/lora.h"
#include "trill/model.h"

int cmd_merge(int argc, char **argv) {
    static const char *const DTYPES[] = { "checkpoint", "bf16", "f32", NULL };
    const char *dir = NULL, *adapter = NULL, *out = NULL;
    int dtype = 0;
    const cli_opt opts[] = {
        { "model", CLI_STR, "DIR", "the base model folder", .str = &dir, .required = true },
        { "adapter", CLI_STR, "DIR", "the PEFT adapter folder (adapter_config.json, adapter_model.safetensors)", .str = &adapter, .required = true },
        { "out", CLI_STR, "DIR", "where the merged checkpoint is written", .str = &out, .required = true },
        { "dtype", CLI_CHOICE, NULL, "the weights' dtype (checkpoint: the base checkpoint's)", .choice = &dtype, .choices = DTYPES },
    };
    const cli_spec spec = { "merge", NULL,
                            "W += scale * B A for every adapted layer; writes config.json and the weights and copies the\n"
                            "tokenizer files.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    trill_model *m = NULL;
    trill_lora *lora = NULL;
    trill_status st = trill_model_load(dir, &m);
    if (!st) st = trill_lora_load(m, adapter, &lora);
    if (!st && (st = trill_lora_merge(lora, m))) trill_error_context("%s", adapter);
    if (!st) {
        const trill_dtype as = dtype == 0 ? trill_model_checkpoint_dtype(m) : dtype == 1 ? TRILL_BF16 : TRILL_F32;
        st = trill_model_save(m, out, as, 5000000000u);
    }
    if (!st) st = trill_model_copy_side_files(dir, out);
    size_t n_merged = 0;
    if (!st) trill_lora_tensors(lora, &n_merged);
    if (!st) fprintf(stderr, "trill merge: wrote %s (%zu adapter tensors merged)\n", out, n_merged);
    trill_lora_free(lora);
    trill_model_free(m);
    return st ? cli_fail("merge") : 0;
}
