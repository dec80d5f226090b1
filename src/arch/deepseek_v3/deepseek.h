/* The DeepSeek-V3 family (DeepseekV3ForCausalLM: DeepSeek-V3/R1, Kimi K2): MLA attention (the
 * query through a low-rank q_a/q_b pair or one q_proj, keys and values from one compressed latent
 * plus a single rope key shared by the heads), a sigmoid router with a selection bias and
 * group-limited top-k, shared experts beside the routed ones, the first layers dense, YaRN RoPE.
 * Its tensor roles, layer and adapter-layer structs and config.json fields. Internal to the
 * library. The training layer and the generator's are not written yet: a model of this family
 * can be described, counted, created and saved, and its forward is refused by name. */
#ifndef TRILL_ARCH_DEEPSEEK_H
#define TRILL_ARCH_DEEPSEEK_H

#include "model/lora_internal.h"
#include "model/model_internal.h"

struct json_t;

/* A tensor's role (trill_param.role). */
enum deepseek_role {
    DS_EMBED, DS_INPUT_NORM, DS_Q_A, DS_Q_A_NORM, DS_Q_B, DS_Q, DS_KV_A, DS_KV_A_NORM, DS_KV_B, DS_O, DS_POST_NORM,
    DS_ROUTER, DS_ROUTER_BIAS, DS_EXPERT_GATE, DS_EXPERT_UP, DS_EXPERT_DOWN, DS_SHARED_GATE, DS_SHARED_UP, DS_SHARED_DOWN,
    DS_GATE, DS_UP, DS_DOWN, DS_FINAL_NORM, DS_LM_HEAD,
};

/* A decoder layer's weights (trill_model.layers). */
typedef struct deepseek_layer_weights {
    float *input_norm;               /* [H] */
    trill_weight q_a;                /* [q_lora_rank, H] (q_lora_rank > 0) */
    float *q_a_norm;                 /* [q_lora_rank] */
    trill_weight q_b;                /* [nh * (nope + rope), q_lora_rank] */
    trill_weight q;                  /* [nh * (nope + rope), H] (q_lora_rank 0) */
    trill_weight kv_a;               /* [kv_lora_rank + rope, H]: the latent, then the shared rope key */
    float *kv_a_norm;                /* [kv_lora_rank] */
    trill_weight kv_b;               /* [nh * (nope + v), kv_lora_rank]: per head k_nope, then v */
    trill_weight o;                  /* [H, nh * v] */
    float *post_norm;                /* [H] */
    trill_weight mlp_gate, mlp_up;   /* dense: [I, H] */
    trill_weight mlp_down;           /* dense: [H, I] */
    trill_weight router;             /* MoE: [E, H] */
    float *router_bias;              /* MoE: [E] e_score_correction_bias (selection only, never trained) */
    trill_weight expert_gate, expert_up; /* [E, Im, H] */
    trill_weight expert_down;            /* [E, H, Im] */
    trill_weight shared_gate, shared_up; /* [Im * n_shared, H] */
    trill_weight shared_down;            /* [H, Im * n_shared] */
} deepseek_layer_weights;

/* A decoder layer's adapters (trill_lora.layers). */
typedef struct deepseek_lora_layer {
    trill_lora_pair q_a, q_b, q, kv_a, kv_b, o;
    trill_lora_pair gate, up, down;                /* the dense MLP */
    trill_lora_pair shared_gate, shared_up, shared_down;
    trill_lora_pair *expert_gate, *expert_up, *expert_down; /* [num_experts] for a MoE layer */
} deepseek_lora_layer;

/* config.c */
extern const char *const trill_deepseek_config_keys[];
void trill_deepseek_config_defaults(trill_config *c);
trill_status trill_deepseek_config_read(const struct json_t *root, const char *what, trill_config *c);
bool trill_deepseek_config_write(const trill_config *c, struct json_t *j);
bool trill_deepseek_layer_is_moe(const trill_config *c, int l);

#endif
