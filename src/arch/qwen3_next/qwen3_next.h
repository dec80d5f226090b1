/* The Qwen3-Next family (Qwen3NextForCausalLM, HF modeling_qwen3_next.py): Gated DeltaNet layers
 * (linear attention, a recurrent state per value head) with a gated full-attention layer every
 * full_attention_interval-th (q_proj per head [q, gate], QK-norm, partial RoPE, the output times
 * sigmoid(gate)); every RMSNorm of the decoder zero-centred; MoE layers of a softmax top-k router
 * and a shared expert under a sigmoid gate. Its config.json fields, its layer description and
 * its presets. Internal to the library. */
#ifndef TRILL_ARCH_QWEN3_NEXT_H
#define TRILL_ARCH_QWEN3_NEXT_H

#include "arch/family.h"

struct json_t;

/* config.c */
extern const char *const trill_qwen3_next_config_keys[];
void trill_qwen3_next_config_defaults(trill_config *c);
trill_status trill_qwen3_next_config_read(const struct json_t *root, const char *what, trill_config *c);
bool trill_qwen3_next_config_write(const trill_config *c, struct json_t *j);
bool trill_qwen3_next_layer_is_moe(const trill_config *c, int l);
trill_layer_desc trill_qwen3_next_describe(const trill_config *c, int l);

/* tensors.c: FLOPs of the full-attention layers over `pairs` causal pairs (averaged over the
 * layers) and of the Gated DeltaNet's recurrence per token (trill_family's) */
double trill_qwen3_next_attention_flops(const trill_config *c, double pairs);
double trill_qwen3_next_token_flops(const trill_config *c);

/* presets.c */
extern const trill_preset trill_qwen3_next_presets[];
extern const int trill_qwen3_next_n_presets;
extern const trill_preset trill_qwen3_5_moe_presets[]; /* Qwen3.5 MoE's */
extern const int trill_qwen3_5_moe_n_presets;

#endif
