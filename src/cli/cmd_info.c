/* trill info: architecture, layer map, parameter counts and bytes of a model folder. */
#include <inttypes.h>
#include <string.h>

#include "cli.h"
#include "trill/model.h"

static const char USAGE[] = "trill info --model DIR";

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
static void print_breakdown(const trill_model *m) {
    int64_t n[6] = { 0 }, experts = 0;
    size_t n_tensors;
    const trill_param *tensors = trill_model_tensors(m, &n_tensors);
    const trill_config *c = trill_model_config(m);
    for (size_t t = 0; t < n_tensors; t++) {
        const trill_param *p = &tensors[t];
        if (p->expert >= 0) experts += (int64_t)p->numel;
        else if ((unsigned)p->kind < 6) n[p->kind] += (int64_t)p->numel;
    }
    printf("by kind:       embedding %" PRId64 ", matrices %" PRId64 ", routed experts %" PRId64 ", routers %" PRId64
           ", norms %" PRId64 ", biases %" PRId64 ", head %" PRId64 "%s\n",
           n[TRILL_TENSOR_EMBEDDING], n[TRILL_TENSOR_MATRIX], experts, n[TRILL_TENSOR_ROUTER], n[TRILL_TENSOR_NORM],
           n[TRILL_TENSOR_BIAS], n[TRILL_TENSOR_HEAD], c->tie_word_embeddings && c->num_labels == 0 ? " (tied)" : "");
    printf("tensors:       %zu\n", n_tensors);
}

int cmd_info(int argc, char **argv) {
    static const struct option opts[] = { { "model", required_argument, 0, 'm' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 } };
    const char *dir = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'm') dir = optarg;
        else if (c == 'h') { printf("usage: %s\n", USAGE); return 0; }
        else return cli_usage_error("info", USAGE, "invalid option %s", argv[optind - 1]);
    }
    if (optind < argc) return cli_usage_error("info", USAGE, "unexpected argument \"%s\"", argv[optind]);
    if (!dir) return cli_usage_error("info", USAGE, "--model DIR is required");
    trill_model *m;
    if (trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &m)) return cli_fail("info");
    const trill_config *cfg = trill_model_config(m);
    int64_t total, active;
    trill_config_param_counts(cfg, &total, &active);
    printf("model:         %s\n", dir);
    printf("architecture:  %s (model_type %s)\n", trill_config_architecture(cfg), trill_config_model_type(cfg));
    printf("dimensions:    vocab %d, hidden %d, %d layers, %d heads / %d kv heads x head_dim %d\n", cfg->vocab_size,
           cfg->hidden_size, cfg->num_hidden_layers, cfg->num_attention_heads, cfg->num_key_value_heads, cfg->head_dim);
    printf("mlp:           dense intermediate %d", cfg->intermediate_size);
    if (cfg->n_moe_layers)
        printf("; %d experts, top-%d, expert intermediate %d, norm_topk_prob %s", cfg->num_experts,
               cfg->num_experts_per_tok, cfg->moe_intermediate_size, cfg->norm_topk_prob ? "true" : "false");
    printf("\n");
    if (cfg->num_labels > 0)
        printf("rope_theta:    %g, rms_norm_eps %g, score head [%d, %d] (sequence classifier)\n", cfg->rope_theta, cfg->rms_norm_eps,
               cfg->num_labels, cfg->hidden_size);
    else
        printf("rope_theta:    %g, rms_norm_eps %g, lm_head %s\n", cfg->rope_theta, cfg->rms_norm_eps,
               cfg->tie_word_embeddings ? "tied to embeddings" : "untied");
    print_layer_map(cfg);
    printf("moe layers:    %d of %d\n", cfg->n_moe_layers, cfg->num_hidden_layers);
    printf("parameters:    %" PRId64 " total, %" PRId64 " active per token (%.1f%%)\n", total, active, 100.0 * active / total);
    print_breakdown(m);
    printf("bytes:         %.1f MB on disk (%s), %.1f MB as fp32 in memory\n",
           total * (double)trill_dtype_size(trill_model_checkpoint_dtype(m)) / 1e6, trill_dtype_name(trill_model_checkpoint_dtype(m)), total * 4.0 / 1e6);
    trill_model_free(m);
    return 0;
}
