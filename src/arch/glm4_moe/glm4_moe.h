/* The GLM-4.5 family (Glm4MoeForCausalLM: GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7; HF
 * modeling_glm4_moe.py): GQA with q/k/v biases, QK-norm when use_qk_norm, RoPE on the first
 * partial_rotary_factor of each head; DeepSeek-V3's router (sigmoid scores, the correction bias,
 * top-k, gates normalised and scaled) with shared experts; the first layers dense; the MTP
 * layers not loaded. Its config.json fields, its layer description and its presets. Internal to
 * the library. */
#ifndef TRILL_ARCH_GLM4_MOE_H
#define TRILL_ARCH_GLM4_MOE_H

#include "arch/family.h"

struct json_t;

/* config.c */
extern const char *const trill_glm4_moe_config_keys[];
void trill_glm4_moe_config_defaults(trill_config *c);
trill_status trill_glm4_moe_config_read(const struct json_t *root, const char *what, trill_config *c);
bool trill_glm4_moe_config_write(const trill_config *c, struct json_t *j);
bool trill_glm4_moe_layer_is_moe(const trill_config *c, int l);
trill_layer_desc trill_glm4_moe_describe(const trill_config *c, int l);

/* presets.c */
extern const trill_preset trill_glm4_moe_presets[];
extern const int trill_glm4_moe_n_presets;

#endif
