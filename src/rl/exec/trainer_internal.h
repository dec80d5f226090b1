/* The trainer executor's parts (trainer.h), one file a concern: trainer.c the RL step (the loss,
 * corrections, minibatches, the update, the mismatch figures), trainer_micro.c micro-batches and
 * their plan over the ranks and the gradient's fixed tree, trainer_onpolicy.c generator.on_policy's
 * scoring engine and the pre-passes, trainer_sft.c the NLL step, trainer_setup.c the ranks, shards,
 * optimizer, creation and saving. What they share is here; nothing outside src/rl/exec includes it. */
#ifndef TRILL_RL_TRAINER_INTERNAL_H
#define TRILL_RL_TRAINER_INTERNAL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/alloc.h"
#include "model/model_internal.h"
#include "trill/fileio.h"
#include "model/lora_internal.h"
#include "rl/exec/generator.h"
#include "rl/exec/trainer.h"
#include "trill/dist.h"
#include "trill/infer.h"
#include "trill/timing.h"
#include "trill/rl_algo.h"
#include "trill/train.h"

struct trill_trainer {
    const trill_run_config *c;
    trill_model *policy;          /* LoRA: the base frozen in its checkpoint's dtype, adapters attached;
                                     full fine-tuning: fp32 master weights */
    trill_lora *lora;             /* NULL in full fine-tuning */
    const char *precision_why;    /* how trainer.precision auto chose (trill_trainer_precision_note), or "" */
    float *values;                /* what the optimizer updates: the adapters' block, or every weight */
    size_t n_values;
    float *lora_grads;            /* [n_values] the gradient of values */
    uint8_t *no_decay;            /* full fine-tuning: 1 for weights without decay (norms, as HF Trainer) */
    trill_adamw *opt;
    trill_model *merge_model;     /* merge sync: fp32 model the adapters are folded into */
    float *merge_base;            /* ... and its base weights */
    int L, K;                     /* MoE layers, experts per token */
    int step;                     /* the step being trained (1-based) */
    /* generator.on_policy: an engine in the generator's format scoring the batch's tokens at the
     * trainer's weights (sent again whenever they changed) */
    trill_engine *onp_engine;
    bool onp_stale;
    double score_s;               /* this step's seconds in it */
    /* distribution (parallel.trainer, trill_trainer_create's world): the data ranks (dp x ep)
     * share each step's micro-batches; under expert parallelism the ranks of a group (P of them,
     * this one q-th) hold a shard of the routed experts each and run their micro-batches in
     * rounds, and edp links the ranks holding the same experts (one per group) */
    trill_comm *data;             /* NULL: one process */
    trill_comm *ep, *edp;         /* owned; NULL without expert parallelism */
    int P, q;
    /* tensor parallelism (parallel.trainer.tp): a group of tp consecutive ranks shares each
     * micro-batch, each holding its share of the heads and dense MLPs (the data ranks are then
     * the groups: `data` links the ranks of one share) */
    trill_comm *tp;               /* owned; NULL without tensor parallelism */
    int tp_size, tp_rank;
    /* the group holding one whole model between them (the expert- or the tensor-parallel one), and
     * this rank's place in it: a value its shard holds alone (an expert's, a slice) is its own,
     * any other the group's first rank speaks for */
    trill_comm *mp;
    int mp_rank;
    trill_comm *owned_data;       /* the data comm when split from the world (tensor parallelism) */
    size_t routed;                /* values[routed, n_values): the held experts' adapters (n_values without EP) */
    float *leaf;                  /* [n_values] one micro-batch's gradient (the held experts' part in src) */
    float **src;                  /* [P] the held experts' gradient from each group rank's micro-batch of a round */
    trill_lora *whole;            /* the adapters of every expert, gathered from the shards (lora itself without EP) */
    trill_adamw *whole_opt;       /* the optimizer state likewise, gathered for a checkpoint */
    /* the buffers of one micro-batch's pass, kept between micro-batches and steps and grown to the
     * largest asked: once they fit, a step allocates nothing per micro-batch */
    struct wsbuf { void *p; size_t bytes; } ws[16];
};

/* The workspace's buffers (trill_trainer.ws), by use. */
enum { WS_OFFSETS, WS_TOKENS, WS_REPLAY, WS_LP, WS_DLP, WS_EX, WS_OFF, WS_G_LP, WS_G_OLD, WS_G_BEHAV, WS_G_REF, WS_G_W, WS_G_D, WS_G_MASK,
       WS_ADV, WS_N };
_Static_assert(WS_N <= sizeof ((trill_trainer *)0)->ws / sizeof ((trill_trainer *)0)->ws[0], "trill_trainer.ws holds every buffer");

/* A packed sub-batch of the rollout batch's sequences, for one forward (and backward); its arrays
 * are the trainer's workspace's, valid until the next micro-batch. */
typedef struct micro {
    int n, T;
    const int *seq;         /* [n] indices into the rollout batch */
    int *offsets, *tokens;  /* packed */
    uint16_t *replay;       /* [T][L][K] or NULL */
} micro;

/* Per-token arrays of the whole rollout batch (packed layout). */
typedef struct token_arrays {
    float *old_logp, *ref_logp, *tis;
    uint8_t *mask;
    uint16_t *train_experts;
    float *onp_logp;        /* generator.on_policy: the on-policy engine's log-probs of the response tokens at the current weights */
    uint16_t *onp_experts;  /* ... and its routing (as rl_batch.experts) */
} token_arrays;

/* seq[0, n) cut into micro-batches by the packer's rule (the same cut on every rank count):
 * micro-batch i is seq[first[i], first[i + 1]); *M of them; [*lo, *hi) are this rank's, a
 * contiguous share among the data ranks. Under expert parallelism the group's ranks run in
 * `rounds` lockstep passes (in round i each forwards its i-th micro-batch, or an empty batch, and
 * serves the others' rows): [src_lo[j], src_hi[j]) is group rank j's share. */
typedef struct micro_plan {
    int *first;
    int M, lo, hi, rounds;
    int *src_lo, *src_hi; /* [P] */
} micro_plan;

/* Each micro-batch's gradient is a leaf of trill_tree_sum: values[0, routed) from the rank that
 * forwarded it; under expert parallelism the held experts' part, values[routed, n_values), from
 * the rank holding them, which keeps one tree per group rank (its share of the leaves arrives
 * round by round) and finishes them with the ranks holding the same experts. */
typedef struct grad_sum {
    trill_tree_sum *own;
    trill_tree_sum **experts; /* [P] */
} grad_sum;

/* One micro-batch's figures (sums over its tokens; all doubles, so the data ranks add them up as
 * one array). */
typedef struct micro_stats {
    double loss, pg_loss, kl_loss; /* token-mean with denominator 1, sequence means times their sequence count */
    double mask_tokens;            /* tokens in the loss */
    double clipped, ratio_sum, ratio_n, tokens;
} micro_stats;
enum { STATS = sizeof(micro_stats) / sizeof(double) };
_Static_assert(sizeof(micro_stats) == STATS * sizeof(double), "micro_stats is an array of doubles");

/* The functions one part calls in another (each documented where it is defined). */
void trill_rl_trn_scatter_resp_u8(const rl_batch *b, const micro *m, const uint8_t *src, uint8_t *dst);
void trill_rl_trn_scatter_resp_f(const rl_batch *b, const micro *m, const float *src, float *dst);
bool trill_rl_trn_speaks_for(const trill_trainer *r, const trill_param *t, size_t at);
trill_status trill_rl_trn_apply_update(trill_trainer *r, double denom, double loss, int64_t total, double *grad_norm, double *lr, bool *applied);
void *trill_rl_trn_ws_get(trill_trainer *r, int i, size_t bytes);
trill_status trill_rl_trn_micro_make(trill_trainer *r, const rl_batch *b, const int *seq, int n, const uint16_t *replay, micro *m);
const uint16_t *trill_rl_trn_replay_source(const trill_trainer *r, const rl_batch *b, const uint16_t *scored);
void trill_rl_trn_scatter_logp(const rl_batch *b, const micro *m, const float *src, float *dst);
void trill_rl_trn_scatter_experts(const rl_batch *b, const micro *m, const uint16_t *src, uint16_t *dst);
int trill_rl_trn_response_offsets(const rl_batch *b, const micro *m, int *resp_off);
void trill_rl_trn_gather_f(const rl_batch *b, const micro *m, const float *src, float *dst);
void trill_rl_trn_gather_u8(const rl_batch *b, const micro *m, const uint8_t *src, uint8_t *dst);
trill_status trill_rl_trn_corrections(trill_trainer *r, const rl_batch *b, const micro *m, token_arrays *ta);
void trill_rl_trn_share(int M, int ranks, int d, int *lo, int *hi);
void trill_rl_trn_plan_free(micro_plan *p);
trill_status trill_rl_trn_plan_micros(const trill_trainer *r, const rl_batch *b, const int *seq, int n, micro_plan *p);
void trill_rl_trn_grad_sum_free(const trill_trainer *r, grad_sum *g);
trill_status trill_rl_trn_grad_sum_create(const trill_trainer *r, const micro_plan *p, grad_sum *g);
trill_status trill_rl_trn_backward_round(trill_trainer *r, const micro_plan *p, grad_sum *g, int i, const trill_forward_pass *pass, const float *dlp);
trill_status trill_rl_trn_grad_sum_finish(trill_trainer *r, grad_sum *g);
trill_status trill_rl_trn_assemble(trill_trainer *r, const rl_batch *b, const int *seq, const micro_plan *p, token_arrays *ta, bool old, bool ref);
trill_status trill_rl_trn_score_on_policy(trill_trainer *r, const rl_batch *b, const int *seq, int n, token_arrays *ta);
void trill_rl_trn_take_scored(const rl_batch *b, const micro *m, const token_arrays *ta, float *lp);
void trill_rl_trn_take_scored_experts(const rl_batch *b, const micro *m, const token_arrays *ta, uint16_t *ex);
trill_status trill_rl_trn_pre_pass(trill_trainer *r, const rl_batch *b, const int *seq, int n, bool want_old, bool want_ref, token_arrays *ta);

#endif
