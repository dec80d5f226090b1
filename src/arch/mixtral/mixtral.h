/* The Mixtral family (MixtralForCausalLM, HF modeling_mixtral.py): GQA without QK-norm, every
 * layer a MoE of num_local_experts SwiGLU experts (w1 gate, w3 up, w2 down) behind a softmax
 * top-k router whose gates are always renormalised. Its config.json fields, its layer
 * description and its presets. Internal to the library. */
#ifndef TRILL_ARCH_MIXTRAL_H
#define TRILL_ARCH_MIXTRAL_H

#include "arch/family.h"

struct json_t;

/* config.c */
extern const char *const trill_mixtral_config_keys[];
void trill_mixtral_config_defaults(trill_config *c);
trill_status trill_mixtral_config_read(const struct json_t *root, const char *what, trill_config *c);
bool trill_mixtral_config_write(const trill_config *c, struct json_t *j);
bool trill_mixtral_layer_is_moe(const trill_config *c, int l);
trill_layer_desc trill_mixtral_describe(const trill_config *c, int l);

/* presets.c */
extern const trill_preset trill_mixtral_presets[];
extern const int trill_mixtral_n_presets;

#endif
