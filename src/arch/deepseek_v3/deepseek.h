/* The DeepSeek-V3 family (DeepseekV3ForCausalLM: DeepSeek-V3/R1, Kimi K2): MLA attention (the
 * query through a low-rank q_a/q_b pair or one q_proj, keys and values from one compressed latent
 * plus a single rope key shared by the heads), a sigmoid router with a selection bias and
 * group-limited top-k, shared experts beside the routed ones, the first layers dense, YaRN RoPE.
 * Its tensor roles, layer and adapter-layer structs and config.json fields. Internal to the
 * library. */
#ifndef TRILL_ARCH_DEEPSEEK_H
#define TRILL_ARCH_DEEPSEEK_H

#include "arch/family.h"
#include "model/forward_internal.h"
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

/* Module kinds that carry LoRA inputs x A^T, in deepseek_layer_acts.xa; each MLP's gate, up,
 * down are consecutive (trill_mlp_forward's xa[0..2]). */
enum { DXA_Q_A, DXA_Q_B, DXA_Q, DXA_KV_A, DXA_KV_B, DXA_O, DXA_GATE, DXA_UP, DXA_DOWN, DXA_SH_GATE, DXA_SH_UP, DXA_SH_DOWN, DXA_N };

/* One decoder layer's activations in the training forward (every layer aliases one set in
 * inference; with recomputation each keeps only x_in). nh heads; qk = nope + rope. */
typedef struct deepseek_layer_acts {
    float *x_in;          /* [T, H] residual stream entering the layer */
    float *xn1;           /* [T, H] input_layernorm(x_in) */
    float *qa, *qan;      /* [T, q_lora_rank] q_a_proj's output, and q_a_layernorm of it (q_lora_rank > 0) */
    float *q;             /* [T, nh*qk] queries, the rope part of each head rotated */
    float *ckv, *ckvn;    /* [T, kv_lora_rank] the latent, and kv_a_layernorm of it */
    float *k;             /* [T, nh*qk] keys: each head's k_nope, then the shared rotated rope key */
    float *v;             /* [T, nh*v] */
    float *att;           /* [T, nh*v] attention output, before o_proj */
    float *x_mid;         /* [T, H] x_in + o_proj(att) */
    float *xn2;           /* [T, H] post_attention_layernorm(x_mid) */
    trill_moe_acts moe;   /* routing and the routed experts' (moe.gate / moe.up: the dense MLP's [T, I] in a dense layer) */
    float *scores;        /* MoE: [T, E] sigmoid router scores */
    float *sgate, *sup;   /* MoE: [T, n_shared * Im] the shared experts' pre-activations */
    float *xa[DXA_N];     /* LoRA: x A^T [rows, r] per adapted module (routed rows in expert order) */
} deepseek_layer_acts;

/* The family's activations in a pass (trill_forward_pass.acts). */
typedef struct deepseek_acts {
    deepseek_layer_acts *layers; /* [L]; layers[l+1].x_in is layer l's output */
    float *kva;           /* [T, kv_lora_rank + rope] scratch: kv_a_proj_with_mqa's output */
    float *kvb;           /* [T, nh*(nope + v)] scratch: kv_b_proj's output */
    float *kr;            /* [T, rope] scratch: the shared rope key */
    float *out;           /* [T, H] scratch: o_proj / MLP output */
    float *act;           /* [T*max(1,K), widest MLP] scratch: SwiGLU output */
    float *xe;            /* [T, H] scratch: one expert's gathered rows */
    float *inv_freq;      /* [rope/2] RoPE (YaRN) inverse frequencies */
    float rope_scale;     /* YaRN's attention factor on cos and sin (1 without YaRN) */
    float softmax_scale;  /* qk^-0.5, times mscale(factor, mscale_all_dim)^2 with YaRN */
} deepseek_acts;

/* The family's RoPE tables and scales (layer.c; the generator's too): inv_freq[rope/2], the cos/sin
 * multiplier in *rope_scale and the attention's softmax scale in *softmax_scale. */
void trill_deepseek_rope(const trill_config *c, float *inv_freq, float *rope_scale, float *softmax_scale);

extern const trill_family_layers trill_deepseek_layers; /* layer.c */

/* config.c */
extern const char *const trill_deepseek_config_keys[];
void trill_deepseek_config_defaults(trill_config *c);
trill_status trill_deepseek_config_read(const struct json_t *root, const char *what, trill_config *c);
bool trill_deepseek_config_write(const trill_config *c, struct json_t *j);
bool trill_deepseek_layer_is_moe(const trill_config *c, int l);

/* presets.c */
extern const trill_preset trill_deepseek_presets[];
extern const int trill_deepseek_n_presets;

#endif
