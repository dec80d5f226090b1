/* The DeepSeek-V3 family (DeepseekV3ForCausalLM: DeepSeek-V3/R1, Kimi K2; Glm4MoeLiteForCausalLM:
 * GLM-4.7-Flash, the same MLA and router): MLA attention (the
 * query through a low-rank q_a/q_b pair or one q_proj, keys and values from one compressed latent
 * plus a single rope key shared by the heads), a sigmoid router with a selection bias and
 * group-limited top-k, shared experts beside the routed ones, the first layers dense, YaRN RoPE.
 * Its config.json fields, its layer description and its presets. Internal to the library. */
#ifndef TRILL_ARCH_DEEPSEEK_H
#define TRILL_ARCH_DEEPSEEK_H

#include "arch/family.h"

struct json_t;

/* config.c */
extern const char *const trill_deepseek_config_keys[];
void trill_deepseek_config_defaults(trill_config *c);
trill_status trill_deepseek_config_read(const struct json_t *root, const char *what, trill_config *c);
bool trill_deepseek_config_write(const trill_config *c, struct json_t *j);
bool trill_deepseek_layer_is_moe(const trill_config *c, int l);
trill_layer_desc trill_deepseek_describe(const trill_config *c, int l);

/* presets.c */
extern const trill_preset trill_deepseek_presets[];
extern const int trill_deepseek_n_presets;

#endif
