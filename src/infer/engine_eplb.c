/* EPLB in the engine (engine_internal.h, trill/eplb.h): the physical slots and first plan, the
 * sliding window of routed-token counts, re-planning every eplb_interval steps, and the
 * imbalance figures. The forward maps rows to replicas (src/infer/gen_decoder.c, moe). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "infer/engine_internal.h"
#include "base/alloc.h"

/* Physical slots: the logical experts plus the redundant ones, a whole number per worker; the
 * first plan balances a uniform load (every expert replicated in turn). */
trill_status trill_eng_eplb_start(trill_engine *e) {
    const trill_config *c = &e->c;
    const int E = c->num_experts, L = c->n_moe_layers;
    e->eplb.workers = e->cfg.eplb_workers > 0 ? e->cfg.eplb_workers : omp_get_max_threads();
    const int W = e->eplb.workers;
    int P = E + (e->cfg.eplb_redundant >= 0 ? e->cfg.eplb_redundant : W);
    P = (P + W - 1) / W * W;
    if (e->cfg.eplb_window < 1 || e->cfg.eplb_interval < 1)
        return trill_error(TRILL_ERR_INVALID, "engine: eplb_window and eplb_interval must be >= 1 (got %d and %d)", e->cfg.eplb_window,
                           e->cfg.eplb_interval);
    double *load = trill_malloc(sizeof(double) * (size_t)L * E);
    e->eplb.counts = trill_calloc((size_t)L * E, sizeof(uint32_t));
    if (!load || !e->eplb.counts) {
        free(load);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < L * E; i++) load[i] = 1.0;
    trill_status st = trill_eplb_window_create(L, E, e->cfg.eplb_window, &e->eplb.window);
    if (!st) st = trill_eplb_rebalance(load, L, E, P, 1, 1, W, &e->eplb.plan);
    free(load);
    if (st) trill_error_context("engine: EPLB with %d experts, %d physical slots, %d workers", E, P, W);
    return st;
}

/* A new placement from the window, if one is due; on failure it stays due. */
static trill_status replan(trill_engine *e) {
    if (!e->eplb.replan) return TRILL_OK;
    const int E = e->c.num_experts, L = e->c.n_moe_layers;
    double *load = trill_malloc(sizeof(double) * (size_t)L * E);
    if (!load) return trill_error(TRILL_ERR_NOMEM, "out of memory for EPLB's load of %d layers x %d experts", L, E);
    trill_eplb_window_load(e->eplb.window, load);
    trill_eplb_plan plan;
    trill_status st = trill_eplb_rebalance(load, L, E, e->eplb.plan.n_physical, 1, 1, e->eplb.workers, &plan);
    free(load);
    if (!st && e->ep) st = trill_eng_ep_move(e, &e->eplb.plan, &plan); /* the experts follow their slots */
    if (st) {
        trill_eplb_plan_free(&plan);
        return st;
    }
    trill_eplb_plan_free(&e->eplb.plan);
    e->eplb.plan = plan;
    e->eplb.replan = false;
    if (e->ep) trill_eng_ep_place(e);
    return TRILL_OK;
}

/* After a step: its routed-token counts join the window; every eplb_interval steps the placement
 * is planned again from the window (a plan that fails for want of memory is made before the
 * next step instead, from the same window). */
trill_status trill_eng_eplb_after_step(trill_engine *e) {
    const trill_config *c = &e->c;
    const int E = c->num_experts, L = c->n_moe_layers;
    if (e->ep) { /* the group's counts, so every rank plans the same placement */
        double *sum = trill_malloc(sizeof(double) * (size_t)L * E);
        if (!sum) return trill_error(TRILL_ERR_NOMEM, "out of memory for EPLB's counts");
        for (int i = 0; i < L * E; i++) sum[i] = e->eplb.counts[i];
        trill_status st = trill_comm_allreduce_f64(e->ep, sum, (size_t)L * E); /* exact: integers */
        for (int i = 0; !st && i < L * E; i++) e->eplb.counts[i] = (uint32_t)sum[i];
        free(sum);
        if (st) return st;
    }
    trill_eplb_window_add(e->eplb.window, e->eplb.counts);
    memset(e->eplb.counts, 0, sizeof(uint32_t) * (size_t)L * E);
    if (++e->eplb.steps % e->cfg.eplb_interval == 0) e->eplb.replan = true;
    return replan(e);
}

trill_status trill_eng_eplb_before_step(trill_engine *e) { return replan(e); }

void trill_eng_eplb_discard_step(trill_engine *e) {
    memset(e->eplb.counts, 0, sizeof(uint32_t) * (size_t)e->c.n_moe_layers * e->c.num_experts);
}

void trill_eng_eplb_free(trill_engine *e) {
    trill_eplb_window_free(e->eplb.window);
    trill_eplb_plan_free(&e->eplb.plan);
    free(e->eplb.counts);
}

const trill_eplb_plan *trill_engine_eplb_plan(const trill_engine *e) { return e->eplb.window ? &e->eplb.plan : NULL; }

/* max over mean of the workers' expected loads, averaged over MoE layers */
static trill_status imbalance_of(const trill_eplb_plan *plan, const double *load, int W, double *out) {
    const int L = plan->n_layers;
    double *per = trill_malloc(sizeof(double) * (size_t)L * W);
    if (!per) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_eplb_worker_load(plan, load, W, per);
    double sum = 0;
    for (int l = 0; !st && l < L; l++) {
        double mx = 0, total = 0;
        for (int w = 0; w < W; w++) {
            mx = per[(size_t)l * W + w] > mx ? per[(size_t)l * W + w] : mx;
            total += per[(size_t)l * W + w];
        }
        sum += total > 0 ? mx / (total / W) : 1.0;
    }
    free(per);
    *out = sum / L;
    return st;
}

trill_status trill_engine_eplb_imbalance(const trill_engine *e, double *identity, double *planned) {
    if (!e->eplb.window) return trill_error(TRILL_ERR_INVALID, "EPLB is off in this engine");
    const int L = e->c.n_moe_layers, E = e->c.num_experts, W = e->eplb.workers;
    if (E % W) return trill_error(TRILL_ERR_UNSUPPORTED, "EPLB imbalance: %d experts do not split evenly over %d workers", E, W);
    double *load = trill_malloc(sizeof(double) * (size_t)L * E);
    trill_eplb_plan id = { 0 };
    trill_status st = load ? trill_eplb_identity(L, E, &id) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        trill_eplb_window_load(e->eplb.window, load);
        st = imbalance_of(&id, load, W, identity);
    }
    if (!st) st = imbalance_of(&e->eplb.plan, load, W, planned);
    trill_eplb_plan_free(&id);
    free(load);
    return st;
}
