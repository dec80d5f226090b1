/* The model: config, its parameters in one or two contiguous blocks, and the reference forward.
 *
 * Weights are named and shaped exactly as in Hugging Face checkpoints. With fp32 storage every
 * named tensor is a slice of `params`; with bf16 storage (a frozen base kept in the
 * checkpoint's dtype, trill/weight.h) the matrices are slices of `params_bf16` and only the
 * norm vectors stay in `params`. Per-expert weights of a layer are stored back to back, so
 * expert e's gate_proj starts e * moe_intermediate * hidden elements after expert_gate. */
#ifndef TRILL_MODEL_H
#define TRILL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trill/arch.h"
#include "trill/config.h"
#include "trill/dtype.h"
#include "trill/error.h"
#include "trill/weight.h"

/* One named tensor: what its family's tensor table says about it (src/arch/), and where it is
 * stored. A LoRA A or B (trill/lora.h) carries the facts of the weight it adapts. */
typedef struct trill_param {
    char name[112]; /* HF name, e.g. "model.layers.3.mlp.experts.7.up_proj.weight" */
    int ndim;
    int64_t shape[2];
    float *data;    /* fp32 storage, or NULL */
    uint16_t *bf16; /* bf16 storage, or NULL */
    size_t numel;
    trill_tensor_kind kind;
    int layer;       /* decoder layer, -1 outside the layers */
    int expert;      /* routed expert id, -1 for every other tensor */
    int role;        /* the family's id of the tensor's place in a layer (e.g. QWEN3_Q) */
    int lora_target; /* bit of trill_lora_config.targets that adapts it, -1 if never adapted */
    trill_fuse fuse; /* the generator's fused matrix it joins, and its place there */
    int fuse_index;
    trill_split split; /* tensor-parallel split */
    int index;       /* its place in the model's tensors (a LoRA A or B: the adapted weight's) */
    int row;         /* index of its row in the family's table (internal) */
    /* tensor parallelism: the whole tensor this one is a slice of, and where the slice starts in
     * it (rows, columns); the tensor itself (shape, 0 0) when it is whole */
    int64_t whole_shape[2], slice_at[2];
    /* a tensor-parallel share of a Gated DeltaNet's q | k | v channels (TRILL_SPLIT_CHANNELS: the
     * conv's channels, Qwen3.5's in_proj_qkv's rows, its adapter B's): local rows [0, chan_len[0]),
     * the next chan_len[1], then the rest, at chan_at[0], [1], [2] of the whole; chan_len[0] 0 when
     * the rows are one slice from slice_at[0] */
    int64_t chan_at[3], chan_len[2];
} trill_param;

/* The whole tensor's row of p's local row i (a tensor-parallel share's; i itself otherwise). */
static inline int64_t trill_param_whole_row(const trill_param *p, int64_t i) {
    if (!p->chan_len[0]) return p->slice_at[0] + i;
    if (i < p->chan_len[0]) return p->chan_at[0] + i;
    if (i < p->chan_len[0] + p->chan_len[1]) return p->chan_at[1] + i - p->chan_len[0];
    return p->chan_at[2] + i - p->chan_len[0] - p->chan_len[1];
}

/* A model: its config and its parameters. Opaque: read it through the functions below. */
typedef struct trill_model trill_model;

const trill_config *trill_model_config(const trill_model *m);
/* Every parameter, whatever its storage. */
size_t trill_model_n_params(const trill_model *m);
/* The named tensors in checkpoint order (*n of them); each one's data or bf16 points at its
 * storage in the model. */
const trill_param *trill_model_tensors(const trill_model *m, size_t *n);
/* Storage of the matrices (TRILL_F32 or TRILL_BF16), and the dtype of the checkpoint loaded (F32
 * if the model was created here; BF16 for an FP8 one, whose dequantized weights trill saves as
 * bf16). */
trill_dtype trill_model_storage(const trill_model *m);
trill_dtype trill_model_checkpoint_dtype(const trill_model *m);
/* The precision of the matrix products of the model's forward and backward passes (trill/dtype.h:
 * fp32, the default, or bf16 operands with fp32 sums: trainer.precision). Master weights,
 * gradients, the optimizer, norms, softmaxes and the loss stay fp32 either way, and the router's
 * logits are always fp32 (as Megatron's moe_router_dtype), so bf16 moves no expert choice by
 * itself more than its inputs do. A pass uses the precision set when it began. AUTO sets this
 * CPU's faster one (trill_kernels_precision_auto); trill_model_precision returns what was set. */
void trill_model_set_precision(trill_model *m, trill_precision p);
trill_precision trill_model_precision(const trill_model *m);
/* Bytes the parameters take in memory. */
size_t trill_model_bytes(const trill_model *m);
/* The fp32 block (*n floats): every tensor with fp32 storage, in checkpoint order — all of them
 * with TRILL_F32 storage, which is what weight gradients are laid out like. */
float *trill_model_params(trill_model *m, size_t *n);


/* Lays out and zero-fills a model for `config`, fp32 storage. */
trill_status trill_model_create(const trill_config *config, trill_model **out);
/* The same with the matrices stored in `storage` (TRILL_F32 or TRILL_BF16). */
trill_status trill_model_create_stored(const trill_config *config, trill_dtype storage, trill_model **out);
void trill_model_free(trill_model *m);

/* Hugging Face initialisation: linear and embedding weights ~ N(0, initializer_range),
 * norm weights 1. Deterministic in `seed` whatever the thread count. */
void trill_model_init_random(trill_model *m, uint64_t seed);

/* Loads DIR/config.json and the checkpoint (single or sharded safetensors, F32/BF16/F16, or
 * block-scaled FP8: F8_E4M3 matrices with their F32 "<name>_scale_inv", dequantized), checking
 * every tensor's presence and shape; unexpected tensors are an error. */
trill_status trill_model_load(const char *dir, trill_model **out);

/* How trill_model_load_as stores the weights. */
typedef enum trill_storage {
    TRILL_STORE_F32,       /* everything fp32: weights that train (full fine-tuning) or merge */
    TRILL_STORE_CHECKPOINT /* a frozen base: the matrices stay bf16 when the checkpoint's are all
                              bf16 or FP8 (dequantized, rounded to bf16), else fp32; norms are
                              fp32 either way */
} trill_storage;

/* trill_model_load with a choice of storage. A bf16-stored model runs every forward and the
 * input/adapter gradients of the backward; it refuses weight gradients and merging. */
trill_status trill_model_load_as(const char *dir, trill_storage storage, trill_model **out);

/* Weights that are not finite numbers are refused, naming the tensor and the index, where they
 * would be used (the generator, `trill score`): they only make logits nobody can sample from. */
trill_status trill_model_check_finite(const trill_model *m);

/* ---- model parallelism: a model that holds part of the weights ----
 *
 * A shard is what one rank of an expert-parallel group (ep ranks) and of a tensor-parallel group
 * (tp ranks) holds:
 * - expert parallelism: every tensor but the routed experts of the other ranks — experts
 *   [E ep_rank / ep_size, E (ep_rank + 1) / ep_size) of every MoE layer (E, num_experts, must be
 *   a multiple of ep_size); the others are listed among its tensors (name, shape, index) without
 *   storage (data and bf16 NULL), so a shard of a 4-rank group keeps a quarter of the expert
 *   bytes;
 * - tensor parallelism (Megatron's split): its tp_rank-th share of the attention heads and of the
 *   dense MLPs' width: the q/k/v (MLA: q_b, kv_b) and gate/up rows of those heads and columns
 *   (column-parallel), the o_proj and down_proj columns (row-parallel), as slices of the whole
 *   tensors (trill_param.whole_shape, slice_at); everything else, the routed and shared experts
 *   included, whole on every rank. Its config is the rank's: num_attention_heads,
 *   num_key_value_heads and (with dense layers) intermediate_size divided by tp_size (each must
 *   divide).
 * Loading reads the held tensors and slices only (the pages of the memory-mapped files they
 * touch). NULL or all sizes 1 is the whole model. A shard computes with its groups set
 * (trill_model_set_expert_comm, trill_model_set_tensor_comm); it is not saved whole
 * (trill_model_save refuses it) nor served by the generator. */
typedef struct trill_shard { int ep_rank, ep_size, tp_rank, tp_size; } trill_shard;
trill_status trill_model_create_shard(const trill_config *config, trill_dtype storage, const trill_shard *shard, trill_model **out);
trill_status trill_model_load_shard(const char *dir, trill_storage storage, const trill_shard *shard, trill_model **out);
/* The routed experts the model holds: [*first, *first + *count) of each MoE layer. */
void trill_model_experts_held(const trill_model *m, int *first, int *count);
/* The whole model's config (the shard's own, trill_model_config, has its share of the heads). */
const trill_config *trill_model_whole_config(const trill_model *m);

typedef struct trill_comm trill_comm; /* trill/dist.h */
/* The expert-parallel group of a shard: rank i of `ep` holds shard i. From then on every forward
 * and backward pass of the model is collective over the group: each MoE layer sends the (token,
 * expert) rows of its batch to the ranks that hold their experts with an all-to-all-v, those
 * ranks run the experts and send the outputs back, and the outputs are still added in ascending
 * logical expert id, so a rank's results equal the whole model's bit for bit. Every rank of the
 * group must run the same sequence of passes (a rank with no tokens runs one over an empty
 * batch: n_seqs 0), the same layers and the same adapter state. The backward of such a model is
 * trill_model_backward_ep (trill/train.h). NULL detaches (the comm must outlive the model's use
 * of it). */
trill_status trill_model_set_expert_comm(trill_model *m, trill_comm *ep);
/* The tensor-parallel group of a shard: rank i of `tp` holds share i of the heads. Its passes
 * are then collective over the group, whose ranks forward the same tokens: a row-parallel
 * projection's partial outputs (and its adapter's rank-r partial inputs x A^T) are summed over
 * the group, and in the backward so are the column-parallel projections' input gradients (and
 * their adapters' x A^T gradients). Every sum adds the ranks in rank order
 * (trill_comm_allreduce_ordered_f32), so the replicated activations keep the same bits on every
 * rank; against one rank they differ by the reductions' order (within 1e-5 relative). */
trill_status trill_model_set_tensor_comm(trill_model *m, trill_comm *tp);

/* The (token, expert) rows of hidden_size floats the model's MoE layers sent to and received from
 * the other ranks of its group since the last reset: its tokens to their experts' holders and
 * the outputs of its experts back (forward), then the output gradients and the input gradients
 * (backward). The group's all-to-all-v payload is exactly rows_sent * hidden_size * 4 bytes. */
typedef struct trill_ep_stats { uint64_t rows_sent, rows_received; } trill_ep_stats;
trill_ep_stats trill_model_ep_stats(const trill_model *m);
void trill_model_ep_stats_reset(trill_model *m);

/* Writes DIR/config.json and the weights in `dtype`, sharded above max_shard_bytes (0: never). */
trill_status trill_model_save(const trill_model *m, const char *dir, trill_dtype dtype, size_t max_shard_bytes);

/* Copies tokenizer.json, tokenizer_config.json and generation_config.json (those present)
 * from one model folder to another, so a written checkpoint is usable on its own. */
trill_status trill_model_copy_side_files(const char *from_dir, const char *to_dir);

/* Writes the side files of a model made here: the character-level tokenizer.json
 * (trill_tokenizer_charlevel_json), tokenizer_config.json and generation_config.json. */
trill_status trill_model_write_charlevel_files(const char *dir, const trill_config *c);

/* Reference forward over a packed batch: sequence s is tokens[offsets[s] .. offsets[s+1]).
 * Needs lm_head: a classifier (config.num_labels > 0) is refused here and in _train.
 * logprobs[t] = log p(tokens[t] | earlier tokens of its sequence); NAN for each sequence's
 * first token. experts (optional) receives [T][n_moe_layers][top_k] routed expert ids:
 * logical ids, indexed by MoE-layer ordinal (dense layers not counted), in descending router
 * weight. replay (optional, same layout) forces those experts instead of the router's top-k
 * (router replay); their gate weights still come from this model's router probabilities.
 * Replayed ids out of range or repeated within a token are refused; see TRILL_REPLAY_NONE. */
trill_status trill_model_forward(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                 const uint16_t *replay, float *logprobs, uint16_t *experts);

/* Final-normed hidden states hidden[s][H] at the last token of each sequence of a packed
 * batch: what a ForSequenceClassification head (score.weight) reads. Runs the same layers as
 * trill_model_forward (adapters included when attached and enabled) without lm_head, so it
 * works on a causal LM and on a classifier. Every sequence must have at least one token. */
trill_status trill_model_forward_last_hidden(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                             float *hidden);

/* The activations of one forward pass, kept for the backward pass (trill/train.h). */
typedef struct trill_forward_pass trill_forward_pass;

/* trill_model_forward that also keeps what the backward pass needs: every activation, or with
 * `recompute` only each layer's input (activation checkpointing: the backward re-runs each
 * layer, ~1/3 more compute for far less memory; results are bit-identical). tokens, offsets and
 * replay are borrowed: they must outlive *pass. Free with trill_forward_pass_free. */
trill_status trill_model_forward_train(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                       const uint16_t *replay, float *logprobs, uint16_t *experts, bool recompute,
                                       trill_forward_pass **pass);
/* trill_model_forward_train with the tokens each row is scored on given, K = n_targets of them
 * (1 to TRILL_MAX_TARGETS; K > 1: top-k targets, as for distillation): targets [T][K],
 * logprobs [T][K] with logprobs[(t + 1) K + k] = log p(targets[t K + k] | tokens of its sequence
 * up to t), for every row t but its sequence's last (targets of the last rows are not read);
 * the backward pass takes dlogprobs in the same layout. NULL targets: the next input token, as
 * trill_model_forward_train. Borrowed like tokens. */
#define TRILL_MAX_TARGETS 64
trill_status trill_model_forward_train_targets(const trill_model *m, const int *tokens, const int *targets, int n_targets, const int *offsets,
                                               int n_seqs, const uint16_t *replay, float *logprobs, uint16_t *experts, bool recompute,
                                               trill_forward_pass **pass);
void trill_forward_pass_free(trill_forward_pass *pass);

/* A replay row (one token, one MoE layer) whose first id is TRILL_REPLAY_NONE is not replayed:
 * that token takes the router's own top-k there (the last token of a generated sequence, which
 * the generator never routed). */
#define TRILL_REPLAY_NONE 0xFFFFu

/* Checks router-replay ids [T][n_moe_layers][top_k]: each in [0, num_experts), none repeated within a token. */
trill_status trill_check_replay(const trill_config *c, const uint16_t *replay, int T);

#endif
