/* Expert parallelism across ranks (trill_engine_set_expert_comm): which expert weights a rank
 * keeps, and moving them when EPLB re-plans. Rank q holds the logical experts of its physical
 * slots [q S / n, (q + 1) S / n) under the plan (without EPLB, its contiguous share of the
 * logical experts); the other experts' matrices are released (shape kept, storage freed). A
 * re-plan sends each rank the experts it newly holds from the lowest rank that held them under
 * the old plan: every rank derives the same list from the two plans, so one all-to-all-v with
 * sizes known on both sides moves them all. The forward (gen_blocks.c) only ever runs a rank's
 * held experts. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "infer/engine_internal.h"

static const trill_eplb_plan *plan_of(const trill_engine *e) { return e->eplb.window ? &e->eplb.plan : NULL; }

/* Whether rank q holds logical expert x of MoE layer `ordinal` under plan (NULL: the shares). */
static bool holds(const trill_engine *e, const trill_eplb_plan *plan, int q, int ordinal, int x) {
    const int slots = plan ? plan->n_physical : e->c.num_experts, per = slots / e->ep_size;
    for (int s = q * per; s < (q + 1) * per; s++)
        if ((plan ? plan->phy2log[(size_t)ordinal * plan->n_physical + s] : s) == x) return true;
    return false;
}

/* The lowest rank holding x under plan. */
static int holder(const trill_engine *e, const trill_eplb_plan *plan, int ordinal, int x) {
    for (int q = 0; q < e->ep_size; q++)
        if (holds(e, plan, q, ordinal, x)) return q;
    return -1; /* cannot happen: a plan gives every logical expert a slot */
}

void trill_eng_ep_place(trill_engine *e) {
    const trill_config *c = &e->c;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (!trill_config_is_moe(c, l)) continue;
        eng_layer *L = &e->w->layers[l];
        for (int x = 0; x < c->num_experts; x++) {
            if (holds(e, plan_of(e), e->ep_rank, c->moe_ordinal[l], x)) continue;
            for (int r = 0; r < ENG_MAX_ROLES; r++)
                if (L->experts[r] && L->experts[r][x].data) {
                    e->w->bytes -= L->experts[r][x].bytes;
                    trill_gen_matrix_release(&L->experts[r][x]);
                }
        }
    }
}

/* The bytes of expert x's matrices (every expert role) of layer L. */
static size_t expert_bytes(const eng_layer *L, int x) {
    size_t n = 0;
    for (int r = 0; r < ENG_MAX_ROLES; r++)
        if (L->experts[r]) n += trill_gen_matrix_wire_bytes(&L->experts[r][x]);
    return n;
}

/* Walks every expert a rank newly holds under `now`, in (destination, layer, expert) order, with
 * its source under `old`; fn's nonzero status stops the walk. */
typedef trill_status (*move_fn)(trill_engine *e, void *ctx, int to, int from, eng_layer *L, int x);
static trill_status each_move(trill_engine *e, const trill_eplb_plan *old, const trill_eplb_plan *now, move_fn fn, void *ctx) {
    const trill_config *c = &e->c;
    trill_status st = TRILL_OK;
    for (int q = 0; q < e->ep_size && !st; q++)
        for (int l = 0; l < c->num_hidden_layers && !st; l++) {
            if (!trill_config_is_moe(c, l)) continue;
            const int ord = c->moe_ordinal[l];
            for (int x = 0; x < c->num_experts && !st; x++)
                if (holds(e, now, q, ord, x) && !holds(e, old, q, ord, x)) st = fn(e, ctx, q, holder(e, old, ord, x), &e->w->layers[l], x);
        }
    return st;
}

typedef struct move_state { size_t *send_b, *recv_b, *send_at, *recv_at; char *send, *recv; } move_state;

static trill_status count_move(trill_engine *e, void *ctx, int to, int from, eng_layer *L, int x) {
    move_state *m = ctx;
    if (from == e->ep_rank) m->send_b[to] += expert_bytes(L, x);
    if (to == e->ep_rank) m->recv_b[from] += expert_bytes(L, x);
    return TRILL_OK;
}

static trill_status pack_move(trill_engine *e, void *ctx, int to, int from, eng_layer *L, int x) {
    move_state *m = ctx;
    if (from != e->ep_rank) return TRILL_OK;
    for (int r = 0; r < ENG_MAX_ROLES; r++)
        if (L->experts[r]) {
            trill_gen_matrix_save(&L->experts[r][x], m->send + m->send_at[to]);
            m->send_at[to] += trill_gen_matrix_wire_bytes(&L->experts[r][x]);
        }
    return TRILL_OK;
}

static trill_status unpack_move(trill_engine *e, void *ctx, int to, int from, eng_layer *L, int x) {
    move_state *m = ctx;
    if (to != e->ep_rank) return TRILL_OK;
    for (int r = 0; r < ENG_MAX_ROLES; r++)
        if (L->experts[r]) {
            gen_matrix *g = &L->experts[r][x];
            const size_t n = trill_gen_matrix_wire_bytes(g);
            trill_status st = trill_gen_matrix_load(g, m->recv + m->recv_at[from]);
            if (st) return st;
            m->recv_at[from] += n;
            e->w->bytes += g->bytes;
            e->ep_moved += n;
        }
    return TRILL_OK;
}

trill_status trill_eng_ep_move(trill_engine *e, const trill_eplb_plan *old, const trill_eplb_plan *now) {
    const int P = e->ep_size;
    size_t *n = trill_calloc((size_t)4 * P, sizeof(size_t));
    if (!n) return trill_error(TRILL_ERR_NOMEM, "out of memory for moving experts");
    move_state m = { .send_b = n, .recv_b = n + P, .send_at = n + 2 * P, .recv_at = n + 3 * P };
    trill_status st = each_move(e, old, now, count_move, &m);
    size_t sent = 0, got = 0;
    for (int q = 0; q < P; q++) {
        m.send_at[q] = sent;
        m.recv_at[q] = got;
        sent += m.send_b[q];
        got += m.recv_b[q];
    }
    m.send = trill_malloc(sent + 1);
    m.recv = trill_malloc(got + 1);
    if (!st && (!m.send || !m.recv)) st = trill_error(TRILL_ERR_NOMEM, "out of memory for %zu bytes of experts to move", sent + got);
    if (!st) st = each_move(e, old, now, pack_move, &m);
    if (!st) st = trill_comm_alltoallv(e->ep, m.send, m.send_b, m.recv, m.recv_b);
    for (int q = 0; q < P; q++) m.recv_at[q] = q ? m.recv_at[q - 1] + m.recv_b[q - 1] : 0;
    if (!st) st = each_move(e, old, now, unpack_move, &m);
    free(m.send);
    free(m.recv);
    free(n);
    if (st) trill_error_context("EPLB re-plan across %d expert-parallel ranks", P);
    return st;
}

uint64_t trill_engine_ep_moved_bytes(const trill_engine *e) { return e->ep_moved; }

bool trill_engine_ep_holdings(const trill_engine *e, uint8_t *held) {
    if (!e->ep) return false;
    const int L = e->c.n_moe_layers, E = e->c.num_experts;
    for (int l = 0; l < L; l++)
        for (int x = 0; x < E; x++) held[(size_t)l * E + x] = holds(e, plan_of(e), e->ep_rank, l, x);
    return true;
}
