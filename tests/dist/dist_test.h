/* What the distributed tests (test_comm, test_ep, test_tp) share: checks that count failures
 * and name the rank, calls that must succeed, the world with the rank count the run expects
 * (`--expect N`: an MPI launch that silently fell back to one process fails), and the verdict
 * agreed over the ranks. */
#ifndef TRILL_DIST_TEST_H
#define TRILL_DIST_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/dist.h"
#include "trill/lora.h"
#include "trill/model.h"

static const char *g_test = "test";
static int g_rank;
static int g_failures;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s: rank %d: %s:%d: check failed: %s\n", g_test, g_rank, __FILE__, __LINE__, #cond);     \
            g_failures++;                                                                                              \
        }                                                                                                              \
    } while (0)
#define OK(call)                                                                                                       \
    do {                                                                                                               \
        trill_status st_ = (call);                                                                                     \
        if (st_ != TRILL_OK) {                                                                                         \
            fprintf(stderr, "%s: rank %d: %s:%d: %s failed: %s\n", g_test, g_rank, __FILE__, __LINE__, #call, trill_error_message()); \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

/* Every adapter's B from a formula of its name and of each element's place in the whole tensor
 * (a tensor-parallel slice gets its part of the whole one's), so gradients reach every A and a
 * shard's adapters hold the whole adapter's values. */
static inline void test_set_lora_b(trill_lora *l) {
    size_t n;
    const trill_param *t = trill_lora_tensors(l, &n);
    for (size_t i = 0; i < n; i++) {
        if (!strstr(t[i].name, "lora_B")) continue;
        unsigned h = 0;
        for (const char *p = t[i].name; *p; p++) h = h * 31 + (unsigned char)*p;
        for (int64_t r = 0; r < t[i].shape[0]; r++)
            for (int64_t c = 0; c < t[i].shape[1]; c++) {
                const int64_t k = trill_param_whole_row(&t[i], r) * t[i].whole_shape[1] + c + t[i].slice_at[1];
                t[i].data[r * t[i].shape[1] + c] = 0.05f * (float)((int)((h + (unsigned)k * 7) % 11) - 5);
            }
    }
}

/* DeepSeek-V3's selection bias (zero at creation) from a formula, so it moves some choices. */
static inline void test_set_bias(trill_model *m) {
    size_t n;
    const trill_param *t = trill_model_tensors(m, &n);
    for (size_t i = 0; i < n; i++)
        if (t[i].kind == TRILL_TENSOR_BIAS)
            for (size_t k = 0; k < t[i].numel; k++) t[i].data[k] = 0.02f * (float)((int)((k * 7 + i) % 9) - 4);
        else if (t[i].kind == TRILL_TENSOR_LINEAR_BIAS && t[i].data) /* a linear bias (HF starts it at 0; another rank's expert's: not held) */
            for (size_t k = 0; k < t[i].numel; k++) t[i].data[k] = 0.1f * (float)((int)(((k + (size_t)t[i].slice_at[0]) * 5 + i) % 7) - 3);
}

/* The expert-parallel tests' small MoE models (test_ep, test_gen_ep, test_tp's Mixtral). */
/* Qwen3-MoE: layer 0 dense, 8 experts top-2, hidden 32. */
static const char DIST_QWEN3_MOE[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 16, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [0],"
    " \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";
/* DeepSeek-V3: MLA, layer 0 dense, 8 routed experts in 2 groups keeping 1, top-3, a shared expert. */
static const char DIST_DEEPSEEK_V3[] =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 32, \"moe_intermediate_size\": 8, \"num_hidden_layers\": 3,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"n_shared_experts\": 1, \"n_routed_experts\": 8,"
    " \"num_experts_per_tok\": 3, \"n_group\": 2, \"topk_group\": 1, \"routed_scaling_factor\": 2.5,"
    " \"q_lora_rank\": 16, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8,"
    " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"topk_method\": \"noaux_tc\", \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false,"
    " \"max_position_embeddings\": 128, \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";
/* Mixtral: GQA 4/2 without QK-norm, every layer a MoE of 8 experts, top-2. */
static const char DIST_MIXTRAL[] =
    "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_local_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* GLM-4.5: q/k/v biases, QK-norm, RoPE on half of each head of 16, layer 0 dense, 8 routed experts
 * top-2 behind the sigmoid router, a shared expert; 4 kv heads, so 4 ranks split them. */
static const char DIST_GLM[] =
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 32, \"moe_intermediate_size\": 8, \"num_hidden_layers\": 3,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"head_dim\": 16, \"partial_rotary_factor\": 0.5,"
    " \"attention_bias\": true, \"use_qk_norm\": true, \"n_routed_experts\": 8, \"n_shared_experts\": 1,"
    " \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1, \"routed_scaling_factor\": 2.5, \"n_group\": 1, \"topk_group\": 1,"
    " \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* gpt-oss: q/k/v/o biases, sinks, a sliding window of 3 on layers 0 and 2, YaRN, every layer a MoE
 * of 8 experts top-2 with biases, the clamped SwiGLU (a limit of 0.3 that cuts) behind a router
 * with a bias; 4 kv heads, so 4 ranks split them. */
static const char DIST_GPT_OSS[] =
    "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 8, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 4, \"head_dim\": 16, \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"sliding_window\": 3,"
    " \"swiglu_limit\": 0.3, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 16,"
    " \"truncate\": false}, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* Qwen3-Next: Gated DeltaNet layers 0 and 2 (2 key heads, 4 value heads of 8) beside a gated
 * attention layer 1, zero-centred norms, 8 experts top-2 and a shared expert under its gate. */
static const char DIST_QWEN3NEXT[] =
    "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"partial_rotary_factor\": 0.5, \"linear_num_key_heads\": 2,"
    " \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8,"
    " \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\"], \"num_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"shared_expert_intermediate_size\": 8,"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* The world, after `[--expect N]`; exits 2 on a bad command line, 1 when the launch gave another
 * rank count. *expected is N (0 without the option). */
static inline trill_comm *dist_test_begin(const char *name, int argc, char **argv, int *expected) {
    g_test = name;
    int expect = 0;
    if (argc == 3 && !strcmp(argv[1], "--expect")) expect = atoi(argv[2]);
    else if (argc != 1) {
        fprintf(stderr, "usage: %s [--expect RANKS]\n", name);
        exit(2);
    }
    trill_comm *w;
    OK(trill_dist_init(&argc, &argv, 0, &w));
    g_rank = trill_comm_rank(w);
    if (expect && trill_comm_size(w) != expect) {
        fprintf(stderr, "%s: %d ranks (backend %s), expected %d%s\n", name, trill_comm_size(w), trill_comm_backend(w), expect,
                trill_dist_have_mpi() ? "" : ": this build has no MPI");
        exit(1);
    }
    if (expected) *expected = expect;
    return w;
}

/* Every rank's failures summed; rank 0 prints the verdict; the world ends. The exit status. */
static inline int dist_test_end(trill_comm *w) {
    const int P = trill_comm_size(w);
    double fails = g_failures;
    OK(trill_comm_allreduce_f64(w, &fails, 1));
    if (g_rank == 0) printf("%s: %d rank%s (%s): %s\n", g_test, P, P == 1 ? "" : "s", trill_comm_backend(w), fails ? "FAILED" : "passed");
    trill_dist_finalize(w);
    return fails ? 1 : 0;
}

#endif
