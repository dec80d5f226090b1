/* trill init: a randomly initialised model in Hugging Face layout. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/config.h"
#include "base/json.h"
#include "trill/fileio.h"
#include "trill/model.h"

static int apply_override(const cli_spec *spec, json_t *cfg, const char *kv) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) return cli_spec_error(spec, "--set: expected key=value, got \"%s\"", kv);
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
    if (!trill_config_known_key(key))
        return cli_spec_error(spec, "--set: unknown config.json field \"%s\"", key);
    json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!value) value = json_string(eq + 1);
    json_t *text = json_object_get(cfg, "text_config"); /* a multimodal config: the language model's fields are there */
    const bool top = !strcmp(key, "architectures") || !strcmp(key, "model_type") || !strcmp(key, "tie_word_embeddings") ||
                     !strcmp(key, "text_config") || !strcmp(key, "vision_config");
    json_object_set_new(json_is_object(text) && !top ? text : cfg, key, value);
    return 0;
}

/* --config-only: DIR/config.json alone, for trill info and planning. */
static int write_config_only(const char *out, const char *preset, const trill_config *config) {
    char *cfg_text = trill_config_to_text(config), *path = trill_path_join(out, "config.json");
    trill_status st = cfg_text && path ? trill_mkdir_p(out) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = trill_write_file_atomic(path, cfg_text, strlen(cfg_text));
    int64_t total, active;
    trill_config_param_counts(config, &total, &active);
    if (!st) fprintf(stderr, "trill init: wrote %s (%s, config only: %.2f B parameters, %.2f B active)\n", path, preset, total * 1e-9, active * 1e-9);
    free(cfg_text);
    free(path);
    return st ? cli_fail("init") : 0;
}

/* The preset's config.json with the --set overrides applied (an architectures list follows a
 * model_type set alone), parsed: 0, or the exit status after the error was printed. */
static int preset_config(const cli_spec *spec, const char *preset, const char *const *sets, int n_sets, trill_config *config) {
    char *preset_text = trill_config_preset_text(preset);
    if (!preset_text) return cli_spec_error(spec, "--preset: unknown preset \"%s\" (expected one of: %s)", preset, trill_config_preset_names());
    json_t *cfg_json = json_loads(preset_text, 0, NULL);
    free(preset_text);
    if (!cfg_json) return cli_fail("init");
    bool set_type = false, set_archs = false;
    for (int i = 0; i < n_sets; i++) {
        if (apply_override(spec, cfg_json, sets[i])) { json_decref(cfg_json); return EXIT_USAGE; }
        set_type |= strncmp(sets[i], "model_type=", 11) == 0;
        set_archs |= strncmp(sets[i], "architectures=", 14) == 0;
    }
    if (set_type && !set_archs) json_object_del(cfg_json, "architectures"); /* follows model_type */

    char *text = json_dumps(cfg_json, 0);
    json_decref(cfg_json);
    trill_status st = text ? trill_config_parse(text, strlen(text), "config (preset + --set)", config)
                           : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(text);
    return st ? cli_fail("init") : 0;
}

int cmd_init(int argc, char **argv) {
    static const char *const DTYPES[] = { "bf16", "f32", NULL };
    enum { MAX_SETS = 64 };
    const char *out = NULL, *preset = "tiny", *sets[MAX_SETS];
    long long seed = 0;
    bool config_only = false;
    int dtype_i = 0, n_sets = 0;
    const cli_opt opts[] = {
        { "out", CLI_STR, "DIR", "where the model is written", .str = &out, .required = true },
        { "preset", CLI_STR, "NAME", trill_config_preset_names(), .str = &preset }, /* every family's (its presets.c) */
        { "set", CLI_LIST, "key=value", "override a config.json field (value parsed as JSON, else a string; repeatable)", .str = sets, .count = &n_sets,
          .max = MAX_SETS },
        { "dtype", CLI_CHOICE, NULL, "the weights' dtype", .choice = &dtype_i, .choices = DTYPES },
        { "seed", CLI_INT, "N", "the initialisation's seed", .i = &seed, .min = 0, .max = (long long)1 << 62 },
        { "config-only", CLI_FLAG, NULL, "write config.json alone (for trill info and planning)", .flag = &config_only },
    };
    const cli_spec spec = { "init", NULL,
                            "Writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json and\n"
                            "generation_config.json, e.g. --set num_experts=16 --set 'mlp_only_layers=[0,1]'.\n"
                            "deepseek-v3 and kimi-k2 are those models' real configurations, config-only.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc0 = cli_parse(&spec, argc, argv, &first);
    if (rc0) return rc0 == CLI_HELP_SHOWN ? 0 : rc0;
    const trill_dtype dtype = dtype_i == 0 ? TRILL_BF16 : TRILL_F32;
    const char *dtype_name = DTYPES[dtype_i];
    trill_config config;
    int rc = preset_config(&spec, preset, sets, n_sets, &config);
    if (rc) return rc;
    if (config_only) return write_config_only(out, preset, &config);
    if (trill_config_preset_is_real(preset))
        return cli_spec_error(&spec, "--preset %s is the real model's configuration, too large to create here: add --config-only", preset);
    if (config.vocab_size < 98) {
        trill_error(TRILL_ERR_INVALID, "vocab_size %d is smaller than the 98 ids of the character-level tokenizer", config.vocab_size);
        return cli_fail("init");
    }
    trill_model *m;
    trill_status st = trill_model_create(&config, &m);
    if (st) return cli_fail("init");
    trill_model_init_random(m, (uint64_t)seed);
    st = trill_model_save(m, out, dtype, 5000000000u); /* HF default shard size, 5 GB */
    if (!st) st = trill_model_write_charlevel_files(out, &config);
    if (!st) fprintf(stderr, "trill init: wrote %s (%s, %zu parameters, %s)\n", out, preset, trill_model_n_params(m), dtype_name);
    trill_model_free(m);
    return st ? cli_fail("init") : 0;
}
