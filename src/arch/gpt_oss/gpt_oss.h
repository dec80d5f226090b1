/* The gpt-oss family (GptOssForCausalLM, HF modeling_gpt_oss.py): GQA with biases on q, k, v and
 * o, attention sinks, sliding-window layers alternating with full ones, YaRN; every layer a MoE
 * of num_local_experts experts with biases and a clamped SwiGLU behind a router with a bias
 * (top-k of the logits, a softmax over those k). Its config.json fields, its layer description
 * and its presets. Internal to the library. */
#ifndef TRILL_ARCH_GPT_OSS_H
#define TRILL_ARCH_GPT_OSS_H

#include "arch/family.h"

struct json_t;

/* config.c */
extern const char *const trill_gpt_oss_config_keys[];
void trill_gpt_oss_config_defaults(trill_config *c);
trill_status trill_gpt_oss_config_read(const struct json_t *root, const char *what, trill_config *c);
bool trill_gpt_oss_config_write(const trill_config *c, struct json_t *j);
bool trill_gpt_oss_layer_is_moe(const trill_config *c, int l);
trill_layer_desc trill_gpt_oss_describe(const trill_config *c, int l);

/* presets.c */
extern const trill_preset trill_gpt_oss_presets[];
extern const int trill_gpt_oss_n_presets;

#endif
