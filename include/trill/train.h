/* Training: the backward pass of the model.
 *
 * A step is trill_model_forward_train (trill/model.h), which returns the log-probs and keeps
 * the activations, then trill_model_backward with the loss's gradient with respect to each
 * token's log-prob. Any loss built from per-token log-probs fits: cross-entropy is
 * dlogprobs = -1/N on the predicted tokens, a policy-gradient loss supplies its coefficients.
 * Router replay is decided in the forward pass; the backward follows the same routing, and
 * the router gets gradients through the gate weights of the experts used. */
#ifndef TRILL_TRAIN_H
#define TRILL_TRAIN_H

#include "trill/model.h"

/* grads[n_params] (laid out as m->params) += d loss / d base weights, and
 * lora_grads[lora->n_params] (laid out as the attached adapters' params) += d loss / d adapters,
 * where dlogprobs[t] is d loss / d logprobs[t] (each sequence's first entry is ignored).
 * Either block may be NULL: LoRA training passes grads = NULL (base frozen), full fine-tuning
 * lora_grads = NULL. Not reentrant for one pass (it reuses the pass's scratch). On failure
 * (TRILL_ERR_NOMEM: scratch that could not be allocated) the blocks hold part of the gradient:
 * discard them. */
trill_status trill_model_backward(const trill_forward_pass *pass, const float *dlogprobs, float *grads, float *lora_grads);

/* The backward of an expert-parallel shard (trill_model_set_expert_comm), collective over its
 * group like the forward: lora_grads[lora->n_params] takes the gradient of every adapter but
 * those of the routed experts this rank holds (lora_grads[routed..n_params) stays as it was:
 * a shard's adapters keep those last, trill_lora_routed_first), and expert_grads[s] (one buffer
 * per rank of the group, each n_params - routed floats, laid out as those held experts'
 * adapters) takes the part of their gradient that the tokens of rank s made — the part that
 * belongs to rank s's micro-batch. Adapters of every expert (a group of one) take it all in
 * lora_grads, and then trill_model_backward serves too. Adapters only: weight gradients (grads) are refused. expert_grads NULL on a model
 * that is not expert-parallel is trill_model_backward. */
trill_status trill_model_backward_ep(const trill_forward_pass *pass, const float *dlogprobs, float *grads, float *lora_grads,
                                     float *const *expert_grads);

/* Micro-batch packing, the one rule of `trill train`, `trill sft` and `trill serve`: the next
 * micro-batch takes items (sequences, examples, data) in order while their tokens fit in `budget`,
 * and always at least one (an item longer than the budget goes alone). len(ctx, i) is item i's
 * token count, for i in [0, n). Returns how many items of [0, n) the next micro-batch takes (0
 * when n is 0). */
int trill_micro_batch_take(int n, int budget, int (*len)(const void *ctx, int i), const void *ctx);

/* FLOPs of one training step (forward keeping activations + backward) over a packed batch,
 * counted as the code does them (2 per multiply-add; elementwise work not counted):
 *   forward: every projection, router, dense MLP, the top-k experts used, lm_head, causal QK^T + PV;
 *   backward: input gradients (and weight gradients unless `lora`), lm_head recomputed,
 *   attention 2.5x its forward (recomputed QK^T, dV, dP, dQ, dK), LoRA's own matmuls (x2 backward),
 *   and with `recompute` every layer's forward again. lora_rank adapts all linear layers but lm_head. */
double trill_train_step_flops(const trill_config *c, const int *offsets, int n_seqs, bool lora, int lora_rank, bool recompute);

/* FLOPs of the forward alone (the first line above). */
double trill_forward_flops(const trill_config *c, const int *offsets, int n_seqs);

#endif
