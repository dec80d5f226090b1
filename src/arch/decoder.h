/* The decoder layer every family composes: the tensor roles, the layer's weights and adapters,
 * and the layer description with which a family picks the options of the shared blocks.
 *
 * A family's tensor table points its rows into trill_decoder_weights / trill_decoder_lora (the
 * fields a family has not stay NULL) and files each tensor under a trill_role; its layer
 * description says, per layer, which attention, which MLP and which router the layer has. The
 * decoder itself is written once per pass, from these alone: the training forward
 * (src/model/decoder.c), its backward (src/train/decoder_backward.c) and the generator's
 * (src/infer/gen_decoder.c, MLA's absorbed attention in src/infer/gen_mla.c). A family that
 * needs more than its folder and its registry line is missing an option here. Internal to the
 * library. */
#ifndef TRILL_ARCH_DECODER_H
#define TRILL_ARCH_DECODER_H

#include <stdbool.h>

#include "model/lora_internal.h"
#include "model/model_internal.h"

/* What a tensor is to the shared blocks (trill_param.role; the generator files its weights by
 * role). Each family's tensors come in this relative order. */
typedef enum trill_role {
    TRILL_ROLE_EMBED,
    TRILL_ROLE_INPUT_NORM,
    TRILL_ROLE_Q_A, TRILL_ROLE_Q_A_NORM, TRILL_ROLE_Q_B, /* MLA's low-rank query */
    TRILL_ROLE_Q, TRILL_ROLE_K, TRILL_ROLE_V,            /* GQA; MLA's full-rank q_proj is TRILL_ROLE_Q */
    TRILL_ROLE_Q_BIAS, TRILL_ROLE_K_BIAS, TRILL_ROLE_V_BIAS, /* GQA with attention_bias */
    TRILL_ROLE_KV_A, TRILL_ROLE_KV_A_NORM, TRILL_ROLE_KV_B, /* MLA's latent */
    TRILL_ROLE_O, TRILL_ROLE_O_BIAS,
    TRILL_ROLE_SINKS, /* gpt-oss's per-head attention sinks */
    TRILL_ROLE_Q_NORM, TRILL_ROLE_K_NORM, /* GQA's per-head QK-norm */
    /* Gated DeltaNet (Qwen3-Next's linear attention) */
    TRILL_ROLE_GDN_QKVZ, TRILL_ROLE_GDN_BA, /* Qwen3-Next's fused projections */
    TRILL_ROLE_GDN_QKV, TRILL_ROLE_GDN_Z, TRILL_ROLE_GDN_B, TRILL_ROLE_GDN_A, /* Qwen3.5's */
    TRILL_ROLE_GDN_CONV, TRILL_ROLE_GDN_DT_BIAS, TRILL_ROLE_GDN_A_LOG, TRILL_ROLE_GDN_NORM, TRILL_ROLE_GDN_OUT,
    TRILL_ROLE_POST_NORM,
    TRILL_ROLE_ROUTER, TRILL_ROLE_ROUTER_BIAS, TRILL_ROLE_ROUTER_LINEAR_BIAS,
    TRILL_ROLE_EXPERT_GATE, TRILL_ROLE_EXPERT_UP, TRILL_ROLE_EXPERT_DOWN,
    TRILL_ROLE_EXPERT_GATE_BIAS, TRILL_ROLE_EXPERT_UP_BIAS, TRILL_ROLE_EXPERT_DOWN_BIAS,
    TRILL_ROLE_SHARED_GATE, TRILL_ROLE_SHARED_UP, TRILL_ROLE_SHARED_DOWN,
    TRILL_ROLE_SHARED_EXPERT_GATE, /* the shared expert's sigmoid gate (Qwen3-Next) */
    TRILL_ROLE_GATE, TRILL_ROLE_UP, TRILL_ROLE_DOWN, /* the dense MLP */
    TRILL_ROLE_FINAL_NORM, TRILL_ROLE_LM_HEAD, TRILL_ROLE_SCORE,
    TRILL_N_ROLES
} trill_role;

/* A decoder layer's weights (trill_model.layers): pointers into the model's blocks, set from the
 * tensor table's field offsets; a family's table fills the ones its layers have. Routed
 * experts' matrices are [E, rows, cols], back to back. nh heads, nkv kv heads of hd (GQA); qk =
 * nope + rope, v of v_head_dim (MLA). */
typedef struct trill_decoder_weights {
    float *input_norm;   /* [H] */
    trill_weight wq;     /* GQA [nh*hd, H]; MLA without q_lora_rank [nh*qk, H] */
    trill_weight wk, wv; /* GQA [nkv*hd, H] */
    float *q_bias;       /* GQA with q/k/v biases: [nh*hd] */
    float *k_bias, *v_bias; /* [nkv*hd] */
    float *q_norm;       /* GQA with QK-norm: [hd] */
    float *k_norm;       /* [hd] */
    trill_weight q_a;    /* MLA: [q_lora_rank, H] (q_lora_rank > 0) */
    float *q_a_norm;     /* [q_lora_rank] */
    trill_weight q_b;    /* [nh*qk, q_lora_rank] */
    trill_weight kv_a;   /* MLA: [kv_lora_rank + rope, H]: the latent, then the shared rope key */
    float *kv_a_norm;    /* [kv_lora_rank] */
    trill_weight kv_b;   /* [nh*(nope + v), kv_lora_rank]: per head k_nope, then v */
    trill_weight wo;     /* [H, nh*hd] (MLA: [H, nh*v]) */
    float *o_bias;       /* GQA with an o_proj bias: [H] */
    float *sinks;        /* attention sinks: [nh], a logit per query head */
    /* Gated DeltaNet: nk key heads of dk, nv value heads of dv, r = nv / nk, conv_dim C = 2 nk dk + nv dv */
    trill_weight gdn_qkvz; /* in_proj_qkvz [2 nk dk + 2 nv dv, H]: per key head q (dk), k (dk), its r value heads' v, their z */
    trill_weight gdn_ba;   /* in_proj_ba [2 nv, H]: per key head its r value heads' b, then their a */
    trill_weight gdn_qkv;  /* Qwen3.5's in_proj_qkv [C, H] (the conv's channels q | k | v), in_proj_z [nv dv, H], */
    trill_weight gdn_z, gdn_b, gdn_a; /* in_proj_b and in_proj_a [nv, H] */
    float *gdn_conv;       /* conv1d.weight [C, K] (the checkpoint's [C, 1, K]) over the channels q | k | v */
    float *gdn_dt_bias;    /* [nv] */
    float *gdn_a_log;      /* [nv] */
    float *gdn_norm;       /* [dv] the gated RMSNorm's weight (not zero-centred) */
    trill_weight gdn_out;  /* out_proj [H, nv dv] */
    float *post_norm;    /* [H] */
    trill_weight mlp_gate, mlp_up; /* dense: [I, H] */
    trill_weight mlp_down;         /* dense: [H, I] */
    trill_weight router;           /* MoE: [E, H] */
    float *router_bias;            /* MoE, sigmoid router: [E] e_score_correction_bias (selection only, never trained) */
    float *router_linear_bias;     /* MoE, a router with a linear bias: [E] added to the logits (trained) */
    trill_weight expert_gate, expert_up; /* [E, Im, H] */
    trill_weight expert_down;            /* [E, H, Im] */
    float *expert_gate_bias, *expert_up_bias; /* experts with biases: [E, Im] */
    float *expert_down_bias;                  /* [E, H] */
    trill_weight shared_gate, shared_up; /* shared experts: [Im * n_shared, H] */
    trill_weight shared_down;            /* [H, Im * n_shared] */
    trill_weight shared_expert_gate;     /* [1, H]: the shared experts' output x sigmoid(h . it) (Qwen3-Next) */
} trill_decoder_weights;

/* A decoder layer's adapters (trill_lora.layers); A == NULL where a module is not adapted. */
typedef struct trill_decoder_lora {
    trill_lora_pair q, k, v, o, q_a, q_b, kv_a, kv_b;
    trill_lora_pair gate, up, down; /* the dense MLP */
    trill_lora_pair shared_gate, shared_up, shared_down, shared_expert_gate;
    trill_lora_pair gdn_qkvz, gdn_ba, gdn_out; /* Gated DeltaNet's in_proj_qkvz, in_proj_ba, out_proj */
    trill_lora_pair gdn_qkv, gdn_z, gdn_b, gdn_a; /* Qwen3.5's in_proj_qkv, in_proj_z, in_proj_b, in_proj_a */
    trill_lora_pair *expert_gate, *expert_up, *expert_down; /* [num_experts] for a MoE layer */
} trill_decoder_lora;

/* The attention block: grouped-query attention over per-head keys and values, or multi-head
 * latent attention (DeepSeek-V3: keys and values from one compressed latent and a rope key
 * shared by the heads; YaRN), or Gated DeltaNet (Qwen3-Next's linear attention: a gated delta
 * rule over a recurrent [dk, dv] state per value head, no positions). A model's attention
 * layers (those not GDN) all have one kind: GQA or MLA; GDN layers sit between them. GQA's
 * RoPE turns the first partial_rotary_factor x head_dim dimensions of each head (rotate-half),
 * MLA's the rope part. */
typedef enum trill_attention_kind { TRILL_ATTENTION_GQA, TRILL_ATTENTION_MLA, TRILL_ATTENTION_GDN } trill_attention_kind;

/* A MoE layer's router: softmax over the experts, top-k, gates the probabilities at the ids
 * (renormalised when norm_topk_prob; Qwen3-MoE, Mixtral); or sigmoid scores, group-limited
 * top-k of the scores plus a correction bias, gates the unbiased scores normalised and scaled by
 * routed_scaling_factor (DeepSeek-V3, GLM-4.5). */
typedef enum trill_router_kind { TRILL_ROUTER_SOFTMAX, TRILL_ROUTER_SIGMOID_GROUPS } trill_router_kind;

/* A routed expert's activation: SwiGLU silu(gate) * up; or gpt-oss's clamped one, with
 * gate' = min(gate, limit), up' = clamp(up, -limit, limit): gate' sigmoid(alpha gate') (up' + 1)
 * (limit, alpha: the config's swiglu_limit and swiglu_alpha). */
typedef enum trill_expert_act { TRILL_EXPERT_SWIGLU, TRILL_EXPERT_SWIGLU_CLAMPED } trill_expert_act;

/* One layer's options of the shared blocks (trill_family.describe). */
typedef struct trill_layer_desc {
    trill_attention_kind attention;
    bool qk_norm;         /* GQA: RMSNorm of each head's q and k (q_norm, k_norm) before RoPE */
    bool qkv_bias;        /* GQA: q, k and v projections with biases (q_bias, k_bias, v_bias) */
    bool o_bias;          /* GQA: o_proj with a bias (o_bias) */
    bool sinks;           /* a learned logit per query head in the softmax's denominator (sinks; gpt-oss) */
    bool output_gate;     /* GQA: q_proj per head [q, gate]; the attention's output x sigmoid(gate) before o_proj (Qwen3-Next) */
    bool gdn_split_proj;  /* Gated DeltaNet: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a (Qwen3.5) instead of in_proj_qkvz, in_proj_ba */
    int window;           /* GQA: a query attends to the `window` latest positions, itself included (0: all) */
    bool moe;             /* routed experts behind a router; else the dense SwiGLU MLP */
    trill_router_kind router;
    /* MoE, softmax router: a linear bias on the logits (router_linear_bias). gpt-oss's router, top-k
     * of the logits and a softmax over those k, is this one with norm_topk_prob: the k
     * probabilities renormalised are that softmax. */
    bool router_linear_bias;
    trill_expert_act expert_act;
    bool expert_bias;     /* MoE: the routed experts' gate, up and down with biases (expert_*_bias) */
    bool shared_experts;  /* MoE: shared experts (trill_config_shared_width) as one SwiGLU beside the routed ones */
    bool shared_expert_gate; /* MoE: the shared experts' output x sigmoid(shared_expert_gate(h)) */
} trill_layer_desc;

#endif
