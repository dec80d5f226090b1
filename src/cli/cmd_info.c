/* trill info: architecture, layer map, parameter counts and bytes of a model folder. */
#include <inttypes.h>
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>

#include "cli.h"
#include "opts.h"
#include "trill/fileio.h"
#include "trill/model.h"


/* "0-2 dense, 3 moe(0), 4 dense, 5-7 moe(1-3)": runs of the same kind, with MoE ordinals. */
static void print_layer_map(const trill_config *c) {
    printf("layer map:     ");
    for (int l = 0; l < c->num_hidden_layers;) {
        int end = l;
        bool moe = trill_config_is_moe(c, l);
        while (end + 1 < c->num_hidden_layers && trill_config_is_moe(c, end + 1) == moe) end++;
        printf("%s", l ? ", " : "");
        if (end > l) printf("%d-%d ", l, end);
        else printf("%d ", l);
        if (moe && end > l) printf("moe(ordinals %d-%d)", c->moe_ordinal[l], c->moe_ordinal[end]);
        else if (moe) printf("moe(ordinal %d)", c->moe_ordinal[l]);
        else printf("dense");
        l = end + 1;
    }
    printf("\n");
}

/* Parameters by the tensor table's kinds (routed experts apart from the other matrices). */
static void print_breakdown(const trill_config *c) {
    int64_t n[TRILL_TENSOR_N_KINDS], experts;
    trill_config_param_breakdown(c, n, &experts);
    printf("by kind:       embedding %" PRId64 ", matrices %" PRId64 ", routed experts %" PRId64 ", routers %" PRId64
           ", norms %" PRId64 ", biases %" PRId64 ", linear biases %" PRId64 ", sinks %" PRId64 ", convs %" PRId64 ", decays %" PRId64
           ", head %" PRId64 "%s\n",
           n[TRILL_TENSOR_EMBEDDING], n[TRILL_TENSOR_MATRIX], experts, n[TRILL_TENSOR_ROUTER], n[TRILL_TENSOR_NORM],
           n[TRILL_TENSOR_BIAS], n[TRILL_TENSOR_LINEAR_BIAS], n[TRILL_TENSOR_SINKS], n[TRILL_TENSOR_CONV], n[TRILL_TENSOR_DECAY],
           n[TRILL_TENSOR_HEAD],
           c->tie_word_embeddings && c->num_labels == 0 ? " (tied)" : "");
}

/* The description every folder gets, from its config alone. */
static void describe(const char *dir, const trill_config *cfg) {
    int64_t total, active;
    trill_config_param_counts(cfg, &total, &active);
    printf("model:         %s\n", dir);
    printf("architecture:  %s (model_type %s)\n", trill_config_architecture(cfg), trill_config_model_type(cfg));
    if (trill_config_is_multimodal(cfg))
        printf("vision tower:  not loaded (vision_config, model.visual.*): trill reads and trains the language model (text_config)\n");
    if (cfg->kv_lora_rank > 0)
        printf("dimensions:    vocab %d, hidden %d, %d layers, %d heads; MLA: q_lora_rank %d, kv_lora_rank %d, qk %d + %d (rope), v %d\n",
               cfg->vocab_size, cfg->hidden_size, cfg->num_hidden_layers, cfg->num_attention_heads, cfg->q_lora_rank, cfg->kv_lora_rank,
               cfg->qk_nope_head_dim, cfg->qk_rope_head_dim, cfg->v_head_dim);
    else {
        printf("dimensions:    vocab %d, hidden %d, %d layers, %d heads / %d kv heads x head_dim %d\n", cfg->vocab_size,
               cfg->hidden_size, cfg->num_hidden_layers, cfg->num_attention_heads, cfg->num_key_value_heads, cfg->head_dim);
        const int rope = cfg->partial_rotary_factor > 0 && cfg->partial_rotary_factor < 1 ? (int)(cfg->head_dim * cfg->partial_rotary_factor)
                                                                                           : cfg->head_dim;
        const bool gpt_oss = cfg->arch == TRILL_ARCH_GPT_OSS; /* o_proj's bias too, and sinks */
        printf("attention:     GQA%s%s%s, RoPE on %d of %d dims", cfg->qk_norm ? ", QK-norm" : "",
               cfg->attention_bias ? (gpt_oss ? ", q/k/v/o biases" : ", q/k/v biases") : "", gpt_oss ? ", sinks" : "", rope, cfg->head_dim);
        int sliding = 0;
        for (int l = 0; l < cfg->num_hidden_layers; l++) sliding += cfg->sliding_layer[l];
        if (cfg->sliding_window && sliding) printf(", sliding window %d on %d of %d layers", cfg->sliding_window, sliding, cfg->num_hidden_layers);
        if (cfg->attn_output_gate) printf(", output gate");
        printf("\n");
        int linear = 0;
        for (int l = 0; l < cfg->num_hidden_layers; l++) linear += cfg->linear_layer[l];
        if (linear) /* Qwen3-Next's Gated DeltaNet layers */
            printf("linear attn:   Gated DeltaNet on %d of %d layers: %d key heads x %d, %d value heads x %d, conv kernel %d\n", linear,
                   cfg->num_hidden_layers, cfg->linear_num_key_heads, cfg->linear_key_head_dim, cfg->linear_num_value_heads,
                   cfg->linear_value_head_dim, cfg->linear_conv_kernel_dim);
    }
    if (cfg->intermediate_size > 0) printf("mlp:           dense intermediate %d", cfg->intermediate_size);
    else printf("mlp:           no dense MLP"); /* every layer a MoE (Qwen3.5) */
    if (cfg->n_moe_layers)
        printf("; %d experts, top-%d, expert intermediate %d, norm_topk_prob %s", cfg->num_experts,
               cfg->num_experts_per_tok, cfg->moe_intermediate_size, cfg->norm_topk_prob ? "true" : "false");
    if (cfg->n_moe_layers && cfg->shared_expert_intermediate_size > 0)
        printf("; a shared expert of %d under a sigmoid gate", cfg->shared_expert_intermediate_size);
    if (cfg->n_moe_layers && cfg->routed_scaling_factor > 0) /* the sigmoid router (DeepSeek-V3, GLM) */
        printf("; %d shared, %d groups keep %d, scaling %g", cfg->n_shared_experts, cfg->n_group, cfg->topk_group, cfg->routed_scaling_factor);
    printf("\n");
    if (cfg->num_labels > 0)
        printf("rope_theta:    %g, rms_norm_eps %g, score head [%d, %d] (sequence classifier)\n", cfg->rope_theta, cfg->rms_norm_eps,
               cfg->num_labels, cfg->hidden_size);
    else
        printf("rope_theta:    %g%s, rms_norm_eps %g%s, lm_head %s\n", cfg->rope_theta, cfg->yarn ? " (YaRN)" : "", cfg->rms_norm_eps,
               cfg->norm_centered ? " (zero-centred norms: 1 + w)" : "", cfg->tie_word_embeddings ? "tied to embeddings" : "untied");
    print_layer_map(cfg);
    printf("moe layers:    %d of %d\n", cfg->n_moe_layers, cfg->num_hidden_layers);
    printf("parameters:    %" PRId64 " total, %" PRId64 " active per token (%.1f%%)\n", total, active, 100.0 * active / total);
    print_breakdown(cfg);
}

int cmd_info(int argc, char **argv) {
    const char *dir = NULL;
    const cli_opt opts[] = { { "model", CLI_STR, "DIR", "the model folder (config.json and its weights, or config.json alone)", .str = &dir, .required = true } };
    const cli_spec spec = { "info", NULL,
                            "Architecture, layer map, parameters (total, active, by kind) and bytes of a model folder.\n"
                            "A folder with config.json alone (trill init --config-only) is described from its config.",
                            opts, (int)(sizeof opts / sizeof opts[0]) };
    int first, rc = cli_parse(&spec, argc, argv, &first);
    if (rc) return rc == CLI_HELP_SHOWN ? 0 : rc;
    char *weights = trill_path_join(dir, "model.safetensors"), *index = trill_path_join(dir, "model.safetensors.index.json");
    const bool has_weights = weights && index && (trill_file_exists(weights) || trill_file_exists(index));
    free(weights);
    free(index);
    if (!has_weights) { /* a config-only folder (trill init --config-only): what the config says */
        char *path = trill_path_join(dir, "config.json");
        trill_config cfg;
        const trill_status st = path ? trill_config_load(path, &cfg) : trill_error(TRILL_ERR_NOMEM, "out of memory");
        free(path);
        if (st) return cli_fail("info");
        describe(dir, &cfg);
        int64_t total, active;
        trill_config_param_counts(&cfg, &total, &active);
        printf("bytes:         config only (no weights); %.1f GB as bf16, %.1f GB as fp32\n", total * 2e-9, total * 4e-9);
        return 0;
    }
    trill_model *m;
    if (trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &m)) return cli_fail("info");
    const trill_config *cfg = trill_model_config(m);
    int64_t total, active;
    trill_config_param_counts(cfg, &total, &active);
    describe(dir, cfg);
    size_t n_tensors;
    trill_model_tensors(m, &n_tensors);
    printf("tensors:       %zu\n", n_tensors);
    /* on disk: the weight files as they are (an FP8 checkpoint's bytes, not what it loads as) */
    double disk = 0;
    int files = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        struct stat sb;
        char *path = len > 12 && !strcmp(e->d_name + len - 12, ".safetensors") ? trill_path_join(dir, e->d_name) : NULL;
        if (path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) disk += (double)sb.st_size, files++;
        free(path);
    }
    if (d) closedir(d);
    printf("bytes:         %.1f MB on disk (%d safetensors file%s, %s), %.1f MB as fp32 in memory\n", disk / 1e6, files, files == 1 ? "" : "s",
           cfg->fp8_block[0] ? "F8_E4M3 matrices with block scales, loaded as bf16" : trill_dtype_name(trill_model_checkpoint_dtype(m)),
           total * 4.0 / 1e6);
    trill_model_free(m);
    return 0;
}
