/* The Qwen3 family (Qwen3ForCausalLM, Qwen3MoeForCausalLM and their *ForSequenceClassification):
 * its config.json fields, its layer description and its presets. Internal to the library. */
#ifndef TRILL_ARCH_QWEN3_H
#define TRILL_ARCH_QWEN3_H

#include "arch/family.h"

/* config.c: the family's config.json fields (trill_family.config_*) */
struct json_t;
extern const char *const trill_qwen3_config_keys[];
void trill_qwen3_config_defaults(trill_config *c);
trill_status trill_qwen3_config_read(const struct json_t *root, const char *what, trill_config *c);
bool trill_qwen3_config_write(const trill_config *c, struct json_t *j);
bool trill_qwen3_layer_is_moe(const trill_config *c, int l);
trill_layer_desc trill_qwen3_describe(const trill_config *c, int l);

/* presets.c */
extern const trill_preset trill_qwen3_presets[];
extern const int trill_qwen3_n_presets;

#endif
