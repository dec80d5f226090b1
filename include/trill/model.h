/* The model: config, one contiguous fp32 parameter block, and the reference forward.
 *
 * Weights are named and shaped exactly as in Hugging Face checkpoints; each
 * named tensor is a slice of `params`. Per-expert weights of a layer are stored
 * back to back, so expert e's gate_proj is expert_gate + e * moe_intermediate * hidden. */
#ifndef TRILL_MODEL_H
#define TRILL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trill/config.h"
#include "trill/dtype.h"
#include "trill/error.h"

typedef struct trill_layer_weights {
    float *input_norm;  /* [H] */
    float *wq;          /* [nh*hd, H] */
    float *wk, *wv;     /* [nkv*hd, H] */
    float *wo;          /* [H, nh*hd] */
    float *q_norm;      /* [hd] */
    float *k_norm;      /* [hd] */
    float *post_norm;   /* [H] */
    /* dense layer */
    float *mlp_gate, *mlp_up; /* [I, H] */
    float *mlp_down;          /* [H, I] */
    /* MoE layer */
    float *router;                    /* [E, H] */
    float *expert_gate, *expert_up;   /* [E, Im, H] */
    float *expert_down;               /* [E, H, Im] */
} trill_layer_weights;

/* One named tensor of the parameter block. */
typedef struct trill_param {
    char name[112]; /* HF name, e.g. "model.layers.3.mlp.experts.7.up_proj.weight" */
    int ndim;
    int64_t shape[2];
    float *data;
    size_t numel;
} trill_param;

typedef struct trill_model {
    trill_config config;
    float *params; /* every weight, fp32, one allocation */
    size_t n_params;
    trill_param *tensors; /* in checkpoint order */
    size_t n_tensors;
    float *embed;      /* [V, H] */
    float *final_norm; /* [H] */
    float *lm_head;    /* [V, H]; == embed when tie_word_embeddings */
    trill_layer_weights *layers;
    trill_dtype checkpoint_dtype; /* storage dtype of the checkpoint loaded (F32 if created) */
    struct trill_lora *lora;      /* attached adapters (trill/lora.h), or NULL */
} trill_model;

/* Lays out and zero-fills a model for `config`. */
trill_status trill_model_create(const trill_config *config, trill_model **out);
void trill_model_free(trill_model *m);

/* Hugging Face initialisation: linear and embedding weights ~ N(0, initializer_range),
 * norm weights 1. Deterministic in `seed` whatever the thread count. */
void trill_model_init_random(trill_model *m, uint64_t seed);

/* Loads DIR/config.json and the checkpoint (single or sharded safetensors, F32/BF16/F16),
 * checking every tensor's presence and shape; unexpected tensors are an error. */
trill_status trill_model_load(const char *dir, trill_model **out);

/* Writes DIR/config.json and the weights in `dtype`, sharded above max_shard_bytes (0: never). */
trill_status trill_model_save(const trill_model *m, const char *dir, trill_dtype dtype, size_t max_shard_bytes);

/* Copies tokenizer.json, tokenizer_config.json and generation_config.json (those present)
 * from one model folder to another, so a written checkpoint is usable on its own. */
trill_status trill_model_copy_side_files(const char *from_dir, const char *to_dir);

/* Reference forward over a packed batch: sequence s is tokens[offsets[s] .. offsets[s+1]).
 * logprobs[t] = log p(tokens[t] | earlier tokens of its sequence); NAN for each sequence's
 * first token. experts (optional) receives [T][n_moe_layers][top_k] routed expert ids:
 * logical ids, indexed by MoE-layer ordinal (dense layers not counted), in descending router
 * weight. replay (optional, same layout) forces those experts instead of the router's top-k
 * (router replay); their gate weights still come from this model's router probabilities.
 * Replayed ids out of range or repeated within a token are refused. */
trill_status trill_model_forward(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                 const uint16_t *replay, float *logprobs, uint16_t *experts);

/* The activations of one forward pass, kept for the backward pass (trill/train.h). */
typedef struct trill_forward_pass trill_forward_pass;

/* trill_model_forward that also keeps what the backward pass needs: every activation, or with
 * `recompute` only each layer's input (activation checkpointing: the backward re-runs each
 * layer, ~1/3 more compute for far less memory; results are bit-identical). tokens, offsets and
 * replay are borrowed: they must outlive *pass. Free with trill_forward_pass_free. */
trill_status trill_model_forward_train(const trill_model *m, const int *tokens, const int *offsets, int n_seqs,
                                       const uint16_t *replay, float *logprobs, uint16_t *experts, bool recompute,
                                       trill_forward_pass **pass);
void trill_forward_pass_free(trill_forward_pass *pass);

/* Checks router-replay ids [T][n_moe_layers][top_k]: each in [0, num_experts), none repeated within a token. */
trill_status trill_check_replay(const trill_config *c, const uint16_t *replay, int T);

/* Next-token logits [V] after the last token of one sequence (for sampling). */
trill_status trill_model_next_logits(const trill_model *m, const int *tokens, int n, float *logits);

#endif
