/* Helpers shared by the unit tests. */
#ifndef TRILL_TESTUTIL_H
#define TRILL_TESTUTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model_internal.h"
#include "trill/model.h"

/* A fresh empty directory under $TMPDIR (or /tmp); malloc'ed path. */
char *test_tmpdir(const char *tag);
/* rm -rf of a directory made by test_tmpdir. */
void test_rmdir(const char *dir);
/* Writes bytes to dir/name (plain write, for crafting malformed inputs). */
void test_write(const char *dir, const char *name, const void *data, size_t len);

/* config.json of the model below (the caller owns the object). */
json_t *test_small_moe_json(void);

/* A small Qwen3-MoE (the tiny preset at hidden 32: layer 0 dense, 1..3 MoE with 8 experts,
 * top-2, vocab 128), weights N(0, 0.3) from `seed`. Fails the test if it cannot be made. */
trill_model *test_small_moe(uint64_t seed, bool tied, bool norm_topk_prob);

/* config.json of the DeepSeek-V3 toy below (the caller owns the object). */
json_t *test_small_deepseek_json(void);

/* A small DeepSeek-V3 (k2-tiny's features at hidden 32: layer 0 dense, 1..3 MoE with 8 routed
 * experts in 2 groups keeping 1, top-2, one shared expert; MLA with q_lora_rank 16, kv_lora_rank
 * 16, nope/rope/v 8/8/8, 2 heads; YaRN; vocab 128), weights N(0, 0.3) from `seed` and a
 * correction bias N(0, 0.05) that changes some choices. */
trill_model *test_small_deepseek(uint64_t seed);

/* config.json of the Mixtral toy below (the caller owns the object). */
json_t *test_small_mixtral_json(void);

/* A small Mixtral (mixtral-tiny at hidden 32: 3 layers, every one a MoE of 8 experts of width
 * 16, top-2 renormalised; GQA 4/2 heads of 8 without QK-norm; vocab 128), weights N(0, 0.3). */
trill_model *test_small_mixtral(uint64_t seed);

/* config.json of the GLM-4.5 toy below (the caller owns the object). */
json_t *test_small_glm_json(void);

/* A small GLM-4.5 (glm45-tiny at hidden 32: layer 0 dense, 1..3 MoE with 8 routed experts top-2
 * and a shared one behind the sigmoid router; GQA 4/2 heads of 8 with q/k/v biases and QK-norm,
 * RoPE on 4 of each head's 8 dimensions; vocab 128), weights N(0, 0.3) from `seed` and a
 * correction bias N(0, 0.05). */
trill_model *test_small_glm(uint64_t seed);
/* gpt-oss: gptoss-tiny at hidden 32, head_dim 8, experts of 16, 3 layers (a window of 5 on layers
 * 0 and 2), swiglu_limit 0.5 (both clamps cut), every bias and sink random. */
json_t *test_small_gptoss_json(void);
trill_model *test_small_gptoss(uint64_t seed);
/* Qwen3-Next's toy: 4 layers (0 and 2 Gated DeltaNet, 1 and 3 gated attention with q/k/v/o
 * biases), a dense layer 0 then 3 MoE layers of 8 experts top-2 with a shared expert and its gate. */
json_t *test_small_qwen3next_json(void);
trill_model *test_small_qwen3next(uint64_t seed);
/* Qwen3.5 MoE's toy (the multimodal config's text_config): Qwen3-Next's toy's sizes, 3 layers (0
 * and 2 Gated DeltaNet with in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; 1 gated attention), every
 * one a MoE. test_json_set sets a config.json field where
 * the family reads it (text_config when there is one). */
json_t *test_small_qwen35_json(void);
trill_model *test_small_qwen35(uint64_t seed);
void test_json_set(json_t *j, const char *key, json_t *value);

#endif
