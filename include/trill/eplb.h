/* Expert-parallel load balancing (EPLB) for the inference engine.
 *
 * DeepSeek's EPLB (github.com/deepseek-ai/EPLB, eplb.py, `rebalance_experts`): given the observed
 * load of every logical expert of every MoE layer, choose how many replicas ("physical experts")
 * each logical expert gets and on which worker each replica lives, so that the busiest worker
 * does as little as possible. Workers are the engine's threads on one machine (later: GPUs or
 * ranks); worker w owns the contiguous physical slots [w * per, (w + 1) * per), per =
 * n_physical / n_workers. Layers are planned independently.
 *
 * Two policies, chosen as eplb.py chooses them:
 *   - hierarchical (n_groups % n_nodes == 0): pack expert groups onto nodes (balanced, equal
 *     number of groups per node), replicate experts within each node, then pack the node's
 *     replicas onto its workers;
 *   - global (otherwise): the hierarchical policy with one group and one node, i.e. replicate
 *     over all experts and pack all replicas onto all workers.
 *
 * The result reproduces eplb.py exactly, including its arithmetic (loads are converted to float32
 * and every sum and quotient the policy compares is a float32 one, as in the Python) and its tie
 * rules:
 *   - sort of items by weight (torch `sort(descending=True)`): equal weights keep index order
 *     (a stable sort). torch's default CPU sort is not stable: torch 1.13 (std::sort) orders equal
 *     keys by index for rows of at most 16 items, which covers the README example, and its own way
 *     on longer rows (other builds use other sorts). Equal weights arise whenever an expert has
 *     several replicas, so on long rows the plans can differ from eplb.py's by swapping items of
 *     equal weight (when packing replicas onto workers that leaves every worker's load as it
 *     was, only the slots differ); we fix the stable order;
 *   - packing (`min(..., key=pack_weights)`): the lightest pack that is not full, the lowest pack
 *     index among equally light ones;
 *   - replication (`(weight / logcnt).max(-1)`): the expert with the largest load per replica,
 *     the first one in the node's expert order among equal ones (in the hierarchical policy that
 *     order is the groups' order after packing onto nodes, not the logical index).
 * Group sums are rounded to float32 once (eplb.py sums in float32 in torch's order), so they
 * agree whenever they are exact: integer token counts with per-group totals below 2^24.
 */
#ifndef TRILL_EPLB_H
#define TRILL_EPLB_H

#include <stdint.h>

#include "trill/error.h"

/* Placement of logical experts on physical slots for every MoE layer (indexed by MoE-layer
 * ordinal, like everything "per MoE layer"). */
typedef struct trill_eplb_plan {
    int n_layers, n_logical, n_physical;
    int max_replicas; /* the largest replica count over all layers and experts (log2phy's last dim) */
    int *phy2log;     /* [n_layers][n_physical] logical expert held by each physical slot */
    int *log2phy;     /* [n_layers][n_logical][max_replicas] slots of each logical expert by replica
                         rank, -1 padded */
    int *logcnt;      /* [n_layers][n_logical] number of replicas (>= 1) */
} trill_eplb_plan;

/* Plans the placement for `load` ([n_layers][n_logical], tokens routed to each logical expert;
 * finite and >= 0). Requires n_layers, n_logical, n_groups, n_nodes, n_workers >= 1;
 * n_physical >= n_logical; n_physical % n_workers == 0; n_workers % n_nodes == 0;
 * n_logical % n_groups == 0 (eplb.py only asserts the last two for the hierarchical policy; an
 * inconsistent configuration is refused here whichever policy it would select).
 * On success *out owns its arrays (trill_eplb_plan_free); on failure *out is empty. */
trill_status trill_eplb_rebalance(const double *load, int n_layers, int n_logical, int n_physical, int n_groups,
                                  int n_nodes, int n_workers, trill_eplb_plan *out);

/* The identity plan (n_physical == n_logical, slot i holds expert i, one replica each): EPLB off. */
trill_status trill_eplb_identity(int n_layers, int n_logical, trill_eplb_plan *out);

/* Frees the arrays and empties the plan (safe on an empty or zeroed plan). */
void trill_eplb_plan_free(trill_eplb_plan *p);

/* The physical slot that computes logical expert `logical` of MoE layer `layer` for the token at
 * `token_index`: replica token_index % logcnt, so dispatch is a pure function of the token and
 * is reproducible whatever the batch or thread count. */
int trill_eplb_physical(const trill_eplb_plan *p, int layer, int logical, uint64_t token_index);

/* Expected tokens per worker ([n_layers][n_workers] into out) for `load` ([n_layers][n_logical])
 * under plan p, each expert's load split evenly over its replicas: the figure EPLB minimises
 * (report its max over the mean as the imbalance). n_physical % n_workers must be 0. */
trill_status trill_eplb_worker_load(const trill_eplb_plan *p, const double *load, int n_workers, double *out);

/* Sliding window of observed expert load: the engine adds, once per step, the number of tokens
 * routed to each logical expert of each MoE layer; the load is the sum over the last `window`
 * steps (fewer while the window fills). Sums are exact (64-bit integers). */
typedef struct trill_eplb_window trill_eplb_window;

trill_status trill_eplb_window_create(int n_layers, int n_logical, int window, trill_eplb_window **out);
/* Adds one step's counts ([n_layers][n_logical]); the oldest step leaves once `window` are held. */
void trill_eplb_window_add(trill_eplb_window *w, const uint32_t *counts);
/* The summed counts of the steps held, as loads for trill_eplb_rebalance ([n_layers][n_logical]). */
void trill_eplb_window_load(const trill_eplb_window *w, double *load);
/* Steps currently held: min(steps added, window). */
int trill_eplb_window_steps(const trill_eplb_window *w);
void trill_eplb_window_free(trill_eplb_window *w);

#endif
