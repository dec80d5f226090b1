/* Expert parallelism inside a model's passes: the group, the served records of a pass, and a MoE
 * layer's forward over the group (src/model/moe_ep.h; the backward is src/train/moe_ep_backward.c). */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "model/lora_internal.h"
#include "model/moe_ep.h"

static void served_free(trill_ep_served *s) {
    free(s->cnt);
    free(s->x);
    free(s->gate);
    free(s->up);
    for (int i = 0; i < 3; i++) free(s->xa[i]);
    memset(s, 0, sizeof *s);
}

static void set_free(trill_ep_served_set *set) {
    for (int i = 0; set->layer && i < set->n; i++) served_free(&set->layer[i]);
    free(set->layer);
    set->layer = NULL;
    set->n = 0;
}

static void ep_free(trill_ep *ep) {
    if (!ep) return;
    set_free(&ep->pool);
    free(ep->send_cnt);
    free(ep->bytes);
    free(ep->send);
    free(ep->recv);
    free(ep->act);
    free(ep);
}

trill_status trill_model_set_expert_comm(trill_model *m, trill_comm *comm) {
    if (m->ep && m->ep->pool_lent)
        return trill_error(TRILL_ERR_INVALID, "expert parallelism: the group cannot change while a pass of the model is alive");
    ep_free(m->ep);
    m->ep = NULL;
    if (!comm) return TRILL_OK;
    const int P = trill_comm_size(comm), me = trill_comm_rank(comm);
    if (P != m->ep_size || me != m->ep_rank)
        return trill_error(TRILL_ERR_INVALID, "expert parallelism: the model is shard %d of %d, but this rank is %d of a group of %d", m->ep_rank,
                           m->ep_size, me, P);
    trill_ep *ep = trill_calloc(1, sizeof *ep);
    if (ep) {
        *ep = (trill_ep){ .comm = comm, .P = P, .me = me, .El = m->expert_count };
        ep->send_cnt = trill_calloc((size_t)P * (size_t)(ep->El ? ep->El : 1), sizeof(size_t));
        ep->bytes = trill_calloc(4 * (size_t)P, sizeof(size_t));
    }
    if (!ep || !ep->send_cnt || !ep->bytes) {
        ep_free(ep);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    m->ep = ep;
    return TRILL_OK;
}

void trill_model_ep_free(trill_model *m) {
    ep_free(m->ep);
    m->ep = NULL;
}

trill_ep_stats trill_model_ep_stats(const trill_model *m) { return m->ep ? m->ep->stats : (trill_ep_stats){ 0 }; }
void trill_model_ep_stats_reset(trill_model *m) {
    if (m->ep) memset(&m->ep->stats, 0, sizeof m->ep->stats);
}

trill_status trill_ep_reserve(float **p, size_t *cap, size_t n) {
    if (n <= *cap && *p) return TRILL_OK;
    free(*p);
    *cap = 0;
    if (!(*p = trill_aligned_alloc(64, (sizeof(float) * (n ? n : 1) + 63) & ~(size_t)63)))
        return trill_error(TRILL_ERR_NOMEM, "out of memory for %zu floats of the expert-parallel exchange", n);
    *cap = n;
    return TRILL_OK;
}

/* ---- a pass's served records ---- */

trill_status trill_ep_pass_begin(trill_forward_pass *fp) {
    trill_ep *ep = fp->m->ep;
    if (!ep) return TRILL_OK;
    const int n = fp->training && !fp->recompute ? fp->m->config.n_moe_layers : 1; /* the backward reads each layer's */
    trill_ep_served_set *set = &ep->pool;
    if (ep->pool_lent) { /* two passes alive at once: the second has its own */
        if (!(set = trill_calloc(1, sizeof *set))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    } else {
        ep->pool_lent = 1;
    }
    if (set->n < n) {
        trill_ep_served *grown = trill_realloc(set->layer, sizeof *grown * (size_t)n);
        if (!grown) {
            if (set == &ep->pool) ep->pool_lent = 0;
            else free(set);
            return trill_error(TRILL_ERR_NOMEM, "out of memory");
        }
        memset(grown + set->n, 0, sizeof *grown * (size_t)(n - set->n));
        set->layer = grown;
        set->n = n;
    }
    fp->ep_served = set;
    return TRILL_OK;
}

void trill_ep_pass_end(trill_forward_pass *fp) {
    trill_ep *ep = fp->m->ep;
    if (!fp->ep_served) return;
    if (ep && fp->ep_served == &ep->pool) {
        ep->pool_lent = 0;
    } else {
        set_free(fp->ep_served);
        free(fp->ep_served);
    }
    fp->ep_served = NULL;
}

trill_ep_served *trill_ep_served_of(const trill_forward_pass *fp, int ordinal) {
    trill_ep_served_set *set = fp->ep_served;
    return &set->layer[set->n > 1 ? ordinal : 0];
}

/* Room for R received rows: x [R, H], gate and up [R, Im], the adapters' inputs [R, r] (r 0: no
 * adapters). Contents are not kept. */
static trill_status served_reserve(trill_ep_served *s, size_t R, int H, int Im, int r) {
    s->R = R;
    if (R <= s->cap && s->rank == r && s->x) return TRILL_OK;
    float **buf[6] = { &s->x, &s->gate, &s->up, &s->xa[0], &s->xa[1], &s->xa[2] };
    const int width[6] = { H, Im, Im, r, r, r };
    trill_status st = TRILL_OK;
    for (int i = 0; i < 6; i++) {
        size_t cap = 0;
        free(*buf[i]);
        *buf[i] = NULL;
        if (!st && width[i]) st = trill_ep_reserve(buf[i], &cap, R * (size_t)width[i]);
    }
    s->cap = st ? 0 : R;
    s->rank = st ? 0 : r;
    return st;
}

size_t trill_ep_rows_for(const trill_ep *ep, const int *count, int p) {
    const int lo = p * ep->El, hi = lo + ep->El;
    return (size_t)(count[hi - 1] - (lo ? count[lo - 1] : 0));
}

/* ---- the forward ---- */

trill_status trill_ep_experts_forward(const trill_forward_pass *fp, float *out, const float *xn, const trill_moe_experts *x, trill_moe_acts *a,
                                      int ordinal, int T, int H, int K, int Im) {
    trill_ep *ep = fp->m->ep;
    trill_ep_served *sv = trill_ep_served_of(fp, ordinal);
    const int P = ep->P, El = ep->El, r = fp->lora ? fp->lora->config.rank : 0;
    const size_t row = sizeof(float) * (size_t)H, TK = (size_t)T * K;
    size_t *sb = ep->bytes, *rb = ep->bytes + P; /* dispatch: bytes to and from each peer */
    /* 1. counts: after the grouping, count[e] ends expert e's rows */
    for (int e = 0; e < P * El; e++) ep->send_cnt[e] = (size_t)(a->count[e] - (e ? a->count[e - 1] : 0));
    if (!sv->cnt && !(sv->cnt = trill_calloc((size_t)P * (size_t)(El ? El : 1), sizeof(size_t))))
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = trill_comm_alltoall_counts(ep->comm, El, ep->send_cnt, sv->cnt);
    size_t R = 0;
    for (int p = 0; !st && p < P; p++) {
        size_t from = 0;
        for (int el = 0; el < El; el++) from += sv->cnt[(size_t)p * El + el];
        sb[p] = trill_ep_rows_for(ep, a->count, p) * row;
        rb[p] = from * row;
        R += from;
        if (p != ep->me) {
            ep->stats.rows_sent += sb[p] / row + from; /* its rows out, the outputs it returns */
            ep->stats.rows_received += from + sb[p] / row;
        }
    }
    /* 2. dispatch: the rows in expert order, which is destination order */
    if (!st) st = served_reserve(sv, R, H, Im, r);
    if (!st) st = trill_ep_reserve(&ep->send, &ep->send_cap, TK * (size_t)H);
    if (st) return st;
    for (size_t i = 0; i < TK; i++) memcpy(ep->send + i * (size_t)H, xn + (size_t)(a->order[i] / K) * H, row);
    if ((st = trill_comm_alltoallv(ep->comm, ep->send, sb, sv->x, rb))) return st;
    /* 3. serve, source by source and expert by expert: the single-rank layer's products */
    if ((st = trill_ep_reserve(&ep->recv, &ep->recv_cap, R * (size_t)H))) return st;
    size_t off = 0;
    for (int s = 0; s < P && !st; s++)
        for (int el = 0; el < El && !st; el++) {
            const size_t n = sv->cnt[(size_t)s * El + el];
            if (n == 0) continue;
            if ((st = trill_ep_reserve(&ep->act, &ep->act_cap, n * (size_t)Im))) break;
            const trill_mlp_weights w = trill_moe_expert(x, el, H, Im);
            st = trill_mlp_forward(fp, ep->recv + off * H, sv->x + off * H, &w, sv->xa, off, sv->gate + off * Im, sv->up + off * Im, ep->act,
                                   (int)n, H, Im);
            off += n;
        }
    /* 4. return: the outputs come back in expert order, into a->ye */
    if (!st) st = trill_comm_alltoallv(ep->comm, ep->recv, rb, a->ye, sb);
    if (!st) trill_moe_combine(out, a, T, K, H);
    return st;
}
