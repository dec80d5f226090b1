/* Expert parallelism inside a model's passes (trill_model_set_expert_comm, trill/model.h). Not
 * public.
 *
 * A shard holds experts [first, first + El) of every MoE layer; its group has P ranks. In each
 * MoE layer of a pass every rank, whatever its batch (an empty one too), does the same four
 * exchanges over the group:
 *
 *   1. counts   each rank tells each other how many of its (token, expert) rows go to each of
 *               their experts (El counts a peer);
 *   2. dispatch its rows, grouped by expert (the counting sort the single-rank layer does), so
 *               the rows for rank p are one run: the experts are held in ascending blocks;
 *   3. serve    each rank runs its experts over what it received, source rank by source rank and
 *               expert by expert: exactly the rows, in the order, that the single-rank layer
 *               multiplies for that source's batch, so every product has the same shape and the
 *               same bits;
 *   4. return   the outputs go back to their sources, arriving in expert order, and each token
 *               adds its experts' outputs in ascending logical id, as the single-rank layer does.
 *
 * The backward sends the output gradients along the same routes (no count exchange: the
 * forward's are kept) and the input gradients back. What a rank served in a layer — the rows,
 * the SwiGLU pre-activations and the adapters' inputs — stays with the pass for that backward.
 * The adapters' gradients of its experts go to one buffer per source rank (trill_grad_sinks'
 * expert_grads): each is part of that source's micro-batch's gradient. */
#ifndef TRILL_MOE_EP_H
#define TRILL_MOE_EP_H

#include <stddef.h>

#include "model/forward_internal.h"
#include "trill/dist.h"

/* What one rank served in one MoE layer of a pass. */
typedef struct trill_ep_served {
    size_t *cnt;       /* [P * El] rows from source rank s for its expert first + el */
    size_t R, cap;     /* rows received; rows allocated */
    float *x;          /* [R, H] the rows, source by source, expert by expert */
    float *gate, *up;  /* [R, Im] SwiGLU pre-activations */
    float *xa[3];      /* [R, r] the adapters' inputs (gate, up, down) when adapters took part */
    int rank;          /* the adapters' rank the xa were sized for (0: none) */
} trill_ep_served;

/* A set of them, one per MoE layer (or one every layer shares: inference, recomputation). */
typedef struct trill_ep_served_set {
    trill_ep_served *layer;
    int n;
} trill_ep_served_set;

typedef struct trill_ep {
    trill_comm *comm;
    int P, me, El;          /* ranks, this rank, experts a rank holds */
    trill_ep_stats stats;
    trill_ep_served_set pool; /* reused from pass to pass */
    int pool_lent;          /* the pool is a live pass's */
    /* transient buffers of one exchange (grown, reused) */
    size_t *send_cnt;       /* [P * El] */
    size_t *bytes;          /* [4 P]: send and receive bytes per peer */
    float *send, *recv, *act;
    size_t send_cap, recv_cap, act_cap;
} trill_ep;

/* The served set a new pass of T tokens uses (the pool when free); released with the pass. */
trill_status trill_ep_pass_begin(trill_forward_pass *fp);
void trill_ep_pass_end(trill_forward_pass *fp);
/* The served record of MoE layer `ordinal` in the pass. */
trill_ep_served *trill_ep_served_of(const trill_forward_pass *fp, int ordinal);

/* The forward of a MoE layer's routed experts over the group, after the grouping by expert
 * (a->order, a->count): out[T, H] += each token's experts' outputs, a->ye filled in expert order. */
trill_status trill_ep_experts_forward(const trill_forward_pass *fp, float *out, const float *xn, const trill_moe_experts *x, trill_moe_acts *a,
                                      int ordinal, int T, int H, int K, int Im);

/* Grows *p (64-byte aligned, contents not kept) to hold n floats; *cap counts them. */
trill_status trill_ep_reserve(float **p, size_t *cap, size_t n);

/* Rows a rank sends peer p in the dispatch: the experts p holds, from the grouping's ends. */
size_t trill_ep_rows_for(const trill_ep *ep, const int *count, int p);

#endif
