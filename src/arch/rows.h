/* Shorthands for writing a family's tensor table (src/arch/<family>/tensors.c): MW, LW and LL are
 * the offsets of a tensor's pointer in trill_model, trill_decoder_weights and trill_decoder_lora. */
#ifndef TRILL_ARCH_ROWS_H
#define TRILL_ARCH_ROWS_H

#include <stddef.h>

#include "arch/family.h"

#define MW(f) (int)offsetof(trill_model, f)
#define LW(f) (int)offsetof(trill_decoder_weights, f)
#define LL(f) (int)offsetof(trill_decoder_lora, f)
#define NO TRILL_NO_DIM
#define G TRILL_ROW_GLOBAL
#define L TRILL_ROW_LAYER
#define X TRILL_ROW_EXPERT
#define NORM TRILL_TENSOR_NORM
#define MAT TRILL_TENSOR_MATRIX
#define ROWS TRILL_SPLIT_ROWS
#define COLS TRILL_SPLIT_COLS
#define REPL TRILL_SPLIT_NONE
#define NOFUSE TRILL_FUSE_NONE, 0
#define QKV(i) TRILL_FUSE_QKV, i
#define GU(i) TRILL_FUSE_GATE_UP, i

/* ---- the rows of the shared blocks under HF's names, for a family's table: each macro takes the
 * family's dimension ids (and `when`, its layer predicate, for the MLP blocks) ---- */

/* Embedding, a layer's two norms, the final norm. */
#define ROW_EMBED(v, h) { "model.embed_tokens.weight", TRILL_TENSOR_EMBEDDING, G, NULL, { v, h }, TRILL_ROLE_EMBED, TRILL_NO_LORA, NOFUSE, ROWS, MW(embed), TRILL_NO_FIELD }
#define ROW_INPUT_NORM(h) { "model.layers.%d.input_layernorm.weight", NORM, L, NULL, { h, NO }, TRILL_ROLE_INPUT_NORM, TRILL_NO_LORA, NOFUSE, REPL, LW(input_norm), TRILL_NO_FIELD }
#define ROW_POST_NORM(h) { "model.layers.%d.post_attention_layernorm.weight", NORM, L, NULL, { h, NO }, TRILL_ROLE_POST_NORM, TRILL_NO_LORA, NOFUSE, REPL, LW(post_norm), TRILL_NO_FIELD }
#define ROW_FINAL_NORM(h) { "model.norm.weight", NORM, G, NULL, { h, NO }, TRILL_ROLE_FINAL_NORM, TRILL_NO_LORA, NOFUSE, REPL, MW(final_norm), TRILL_NO_FIELD }
/* lm_head when `when` (untied: a tied head is the embedding, trill_model.lm_head points at it). */
#define ROW_LM_HEAD(when, v, h) \
    { "lm_head.weight", TRILL_TENSOR_HEAD, G, when, { v, h }, TRILL_ROLE_LM_HEAD, TRILL_LORA_LM_HEAD, NOFUSE, ROWS, MW(lm_head), (int)offsetof(trill_lora, lm_head) }

/* GQA's q, k, v (fused for the generator, split by heads) and o_proj (split by columns). */
#define ROW_Q(qd, h) { "model.layers.%d.self_attn.q_proj.weight", MAT, L, NULL, { qd, h }, TRILL_ROLE_Q, TRILL_LORA_Q, QKV(0), ROWS, LW(wq), LL(q) }
#define ROW_K(kvd, h) { "model.layers.%d.self_attn.k_proj.weight", MAT, L, NULL, { kvd, h }, TRILL_ROLE_K, TRILL_LORA_K, QKV(1), ROWS, LW(wk), LL(k) }
#define ROW_V(kvd, h) { "model.layers.%d.self_attn.v_proj.weight", MAT, L, NULL, { kvd, h }, TRILL_ROLE_V, TRILL_LORA_V, QKV(2), ROWS, LW(wv), LL(v) }
#define ROW_O(h, qd) { "model.layers.%d.self_attn.o_proj.weight", MAT, L, NULL, { h, qd }, TRILL_ROLE_O, TRILL_LORA_O, NOFUSE, COLS, LW(wo), LL(o) }
/* GQA's linear biases (trained), when `when`: q, k, v split by heads as their weights, o_proj's
 * replicated (added once, after the tensor-parallel sum). */
#define ROW_Q_BIAS(when, qd) { "model.layers.%d.self_attn.q_proj.bias", TRILL_TENSOR_LINEAR_BIAS, L, when, { qd, NO }, TRILL_ROLE_Q_BIAS, TRILL_NO_LORA, NOFUSE, ROWS, LW(q_bias), TRILL_NO_FIELD }
#define ROW_K_BIAS(when, kvd) { "model.layers.%d.self_attn.k_proj.bias", TRILL_TENSOR_LINEAR_BIAS, L, when, { kvd, NO }, TRILL_ROLE_K_BIAS, TRILL_NO_LORA, NOFUSE, ROWS, LW(k_bias), TRILL_NO_FIELD }
#define ROW_V_BIAS(when, kvd) { "model.layers.%d.self_attn.v_proj.bias", TRILL_TENSOR_LINEAR_BIAS, L, when, { kvd, NO }, TRILL_ROLE_V_BIAS, TRILL_NO_LORA, NOFUSE, ROWS, LW(v_bias), TRILL_NO_FIELD }
#define ROW_O_BIAS(when, h) { "model.layers.%d.self_attn.o_proj.bias", TRILL_TENSOR_LINEAR_BIAS, L, when, { h, NO }, TRILL_ROLE_O_BIAS, TRILL_NO_LORA, NOFUSE, REPL, LW(o_bias), TRILL_NO_FIELD }
/* QK-norm's per-head RMSNorm weights, when `when`. */
#define ROWS_QK_NORM(when, hd) \
    { "model.layers.%d.self_attn.q_norm.weight", NORM, L, when, { hd, NO }, TRILL_ROLE_Q_NORM, TRILL_NO_LORA, NOFUSE, REPL, LW(q_norm), TRILL_NO_FIELD }, \
    { "model.layers.%d.self_attn.k_norm.weight", NORM, L, when, { hd, NO }, TRILL_ROLE_K_NORM, TRILL_NO_LORA, NOFUSE, REPL, LW(k_norm), TRILL_NO_FIELD }

/* A MoE router's weight [E, H], and the sigmoid router's selection bias (frozen). */
#define ROW_ROUTER(when, e, h) { "model.layers.%d.mlp.gate.weight", TRILL_TENSOR_ROUTER, L, when, { e, h }, TRILL_ROLE_ROUTER, TRILL_NO_LORA, NOFUSE, REPL, LW(router), TRILL_NO_FIELD }
#define ROW_ROUTER_BIAS(when, e) \
    { "model.layers.%d.mlp.gate.e_score_correction_bias", TRILL_TENSOR_BIAS, L, when, { e, NO }, TRILL_ROLE_ROUTER_BIAS, TRILL_NO_LORA, NOFUSE, REPL, LW(router_bias), TRILL_NO_FIELD }
/* Each routed expert's SwiGLU, mlp.experts.{e}.gate/up/down_proj, experts back to back. */
#define ROWS_EXPERTS(when, im, h) \
    { "model.layers.%d.mlp.experts.%d.gate_proj.weight", MAT, X, when, { im, h }, TRILL_ROLE_EXPERT_GATE, TRILL_LORA_GATE, GU(0), ROWS, LW(expert_gate), LL(expert_gate) }, \
    { "model.layers.%d.mlp.experts.%d.up_proj.weight", MAT, X, when, { im, h }, TRILL_ROLE_EXPERT_UP, TRILL_LORA_UP, GU(1), ROWS, LW(expert_up), LL(expert_up) }, \
    { "model.layers.%d.mlp.experts.%d.down_proj.weight", MAT, X, when, { h, im }, TRILL_ROLE_EXPERT_DOWN, TRILL_LORA_DOWN, NOFUSE, COLS, LW(expert_down), LL(expert_down) }
/* The shared experts as one SwiGLU, mlp.shared_experts.gate/up/down_proj (never split). */
#define ROWS_SHARED_EXPERTS(when, sh, h) \
    { "model.layers.%d.mlp.shared_experts.gate_proj.weight", MAT, L, when, { sh, h }, TRILL_ROLE_SHARED_GATE, TRILL_LORA_GATE, GU(0), ROWS, LW(shared_gate), LL(shared_gate) }, \
    { "model.layers.%d.mlp.shared_experts.up_proj.weight", MAT, L, when, { sh, h }, TRILL_ROLE_SHARED_UP, TRILL_LORA_UP, GU(1), ROWS, LW(shared_up), LL(shared_up) }, \
    { "model.layers.%d.mlp.shared_experts.down_proj.weight", MAT, L, when, { h, sh }, TRILL_ROLE_SHARED_DOWN, TRILL_LORA_DOWN, NOFUSE, COLS, LW(shared_down), LL(shared_down) }
/* A dense layer's SwiGLU MLP, mlp.gate/up/down_proj. */
#define ROWS_DENSE_MLP(when, i, h) \
    { "model.layers.%d.mlp.gate_proj.weight", MAT, L, when, { i, h }, TRILL_ROLE_GATE, TRILL_LORA_GATE, GU(0), ROWS, LW(mlp_gate), LL(gate) }, \
    { "model.layers.%d.mlp.up_proj.weight", MAT, L, when, { i, h }, TRILL_ROLE_UP, TRILL_LORA_UP, GU(1), ROWS, LW(mlp_up), LL(up) }, \
    { "model.layers.%d.mlp.down_proj.weight", MAT, L, when, { h, i }, TRILL_ROLE_DOWN, TRILL_LORA_DOWN, NOFUSE, COLS, LW(mlp_down), LL(down) }

#endif
