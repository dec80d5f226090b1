/* The Qwen3 family (Qwen3ForCausalLM, Qwen3MoeForCausalLM and their *ForSequenceClassification):
 * its tensor roles, its layer and adapter-layer structs, its training activations and its
 * config.json fields. Internal to the library. */
#ifndef TRILL_ARCH_QWEN3_H
#define TRILL_ARCH_QWEN3_H

/* A tensor's role (trill_param.role). */
enum qwen3_role {
    QWEN3_EMBED, QWEN3_INPUT_NORM, QWEN3_Q, QWEN3_K, QWEN3_V, QWEN3_O, QWEN3_Q_NORM, QWEN3_K_NORM, QWEN3_POST_NORM,
    QWEN3_ROUTER, QWEN3_EXPERT_GATE, QWEN3_EXPERT_UP, QWEN3_EXPERT_DOWN, QWEN3_GATE, QWEN3_UP, QWEN3_DOWN,
    QWEN3_FINAL_NORM, QWEN3_LM_HEAD, QWEN3_SCORE,
};

#include "arch/family.h"
#include "model/forward_internal.h"

/* A decoder layer's weights (trill_model.layers): pointers into the model's blocks, set from the
 * tensor table's field offsets. Routed experts' matrices are [E, rows, cols], back to back. */
typedef struct qwen3_layer_weights {
    float *input_norm;   /* [H] */
    trill_weight wq;     /* [nh*hd, H] */
    trill_weight wk, wv; /* [nkv*hd, H] */
    trill_weight wo;     /* [H, nh*hd] */
    float *q_norm;       /* [hd] */
    float *k_norm;       /* [hd] */
    float *post_norm;    /* [H] */
    /* dense layer */
    trill_weight mlp_gate, mlp_up; /* [I, H] */
    trill_weight mlp_down;         /* [H, I] */
    /* MoE layer */
    trill_weight router;                 /* [E, H] */
    trill_weight expert_gate, expert_up; /* [E, Im, H] */
    trill_weight expert_down;            /* [E, H, Im] */
} qwen3_layer_weights;

/* A decoder layer's adapters (trill_lora.layers); A == NULL where a module is not adapted. */
typedef struct qwen3_lora_layer {
    trill_lora_pair q, k, v, o, gate, up, down; /* gate/up/down: the dense MLP */
    trill_lora_pair *expert_gate, *expert_up, *expert_down; /* [num_experts] for a MoE layer */
} qwen3_lora_layer;

/* Module kinds that carry LoRA inputs x A^T, in qwen3_layer_acts.xa. */
enum { XA_Q, XA_K, XA_V, XA_O, XA_GATE, XA_UP, XA_DOWN, XA_N };

/* One decoder layer's activations in the training forward. In inference every layer aliases one
 * set of buffers; in training each layer has its own, kept for the backward pass. */
typedef struct qwen3_layer_acts {
    float *x_in;          /* [T, H]      residual stream entering the layer */
    float *xn1;           /* [T, H]      input_layernorm(x_in) */
    float *q_raw, *k_raw; /* [T, nh*hd], [T, nkv*hd] projections before q/k-norm */
    float *q, *k, *v;     /* after q/k-norm and RoPE; v as projected */
    float *att;           /* [T, nh*hd]  attention output, before o_proj */
    float *x_mid;         /* [T, H]      x_in + o_proj(att) */
    float *xn2;           /* [T, H]      post_attention_layernorm(x_mid) */
    /* MoE: routing and the routed experts' activations; moe.gate / moe.up also hold the dense
     * MLP's pre-activations [T, I] in a dense layer */
    trill_moe_acts moe;
    float *probs;         /* MoE: [T, E] router softmax */
    float *xa[XA_N];      /* LoRA: x A^T [rows, r] per adapted module (MoE rows in expert order) */
} qwen3_layer_acts;

/* The family's activations in a pass (trill_forward_pass.acts). */
typedef struct qwen3_acts {
    qwen3_layer_acts *layers; /* [L]; layers[l+1].x_in is layer l's output */
    float *out;           /* [T, H] scratch: o_proj / MLP output */
    float *act;           /* [T*max(1,K), max(I, Im)] scratch: SwiGLU output */
    float *xe;            /* [T, H] scratch: one expert's gathered rows */
    float *inv_freq;      /* [hd/2] */
} qwen3_acts;

extern const trill_family_layers trill_qwen3_layers; /* layer.c */

/* config.c: the family's config.json fields (trill_family.config_*) */
struct json_t;
extern const char *const trill_qwen3_config_keys[];
void trill_qwen3_config_defaults(trill_config *c);
trill_status trill_qwen3_config_read(const struct json_t *root, const char *what, trill_config *c);
bool trill_qwen3_config_write(const trill_config *c, struct json_t *j);
bool trill_qwen3_layer_is_moe(const trill_config *c, int l);

/* presets.c */
extern const trill_preset trill_qwen3_presets[];
extern const int trill_qwen3_n_presets;

#endif
