/* Building blocks the families' generator layers share (src/infer/gen_blocks.h). */
#include "infer/gen_blocks.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "base/tls.h"
#include "kernels/exp_nonpos.h"
#include "trill/kernels.h"

/* ---- the adapters' side path ---- */

trill_status trill_gen_lora_buf_ensure(gen_lora_buf *b, int r, size_t rows) {
    if (r <= b->rank && rows <= b->rows) return TRILL_OK;
    /* the new buffer first: when it cannot be had, the adapters in use keep theirs */
    float *xa = trill_malloc(sizeof(float) * rows * 3 * (size_t)r);
    if (!xa) return trill_error(TRILL_ERR_NOMEM, "out of memory for the adapter path (rank %d, %zu rows)", r, rows);
    trill_gen_lora_buf_free(b);
    *b = (gen_lora_buf){ .xa = xa, .rank = r, .rows = rows };
    return TRILL_OK;
}

void trill_gen_lora_buf_free(gen_lora_buf *b) {
    free(b->xa);
    *b = (gen_lora_buf){ 0 };
}

void trill_gen_gather_rows(float *dst, const float *src, int rows, int width, int stride, int offset) {
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * width, src + (size_t)r * stride + offset, sizeof(float) * width);
}

static trill_tls_slot product_slot;

gen_product *trill_gen_product_list(size_t n) { return trill_tls_buffer(&product_slot, sizeof(gen_product) * (n ? n : 1)); }

static int adapted(const eng_lora *el) { return el && el->n_adapted > 0; }

/* The shrink of an adapted matrix: x[T, K] A^T (its parts' A stacked) into the buffer's rows
 * from row0, [T][n_adapted r]. */
static gen_product lora_shrink(const gen_lora_buf *b, const eng_lora *el, const float *x, int T, int row0) {
    return (gen_product){ .out = b->xa + (size_t)row0 * 3 * b->rank, .inp = x, .W = &el->A, .T = T };
}

/* Its parts' expands, read from their columns of the shrink's rows and added into their columns
 * of y[T, width]: y = fmaf(scale, (x A_p^T) B_p^T, y). Writes n_adapted products to list. */
static int lora_expands(const trill_engine *e, const gen_lora_buf *b, const eng_lora *el, float *y, size_t width, int T, int row0,
                        gen_product *list) {
    const int r = e->ad->rank, na = el->n_adapted;
    const float *xa = b->xa + (size_t)row0 * 3 * b->rank;
    for (int a = 0; a < na; a++)
        list[a] = (gen_product){ .out = y + el->col0[a], .ldo = width, .inp = xa + (size_t)a * r, .ldi = (size_t)na * r,
                                 .W = &el->B[a], .T = T, .accumulate = 1, .scale = e->ad->scale };
    return na;
}

trill_status trill_gen_linear(const trill_engine *e, gen_lora_buf *b, const gen_matrix *W, const eng_lora *el, float *y, const float *x,
                              int T, int row0) {
    gen_product p[ENG_MAX_PARTS > 2 ? ENG_MAX_PARTS : 2] = { { .out = y, .inp = x, .W = W, .T = T } };
    if (!adapted(el)) return trill_gen_matmul_many(p, 1);
    p[1] = lora_shrink(b, el, x, T, row0);
    trill_status st = trill_gen_matmul_many(p, 2);
    if (st) return st;
    return trill_gen_matmul_many(p, lora_expands(e, b, el, y, (size_t)W->N, T, row0, p));
}

/* ---- elementwise ---- */

void trill_gen_swiglu_fused(float *act, const float *gate_up, int rows, int I) {
#pragma omp parallel for if(parallel: (size_t)rows * I >= PARALLEL_MIN) schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *g = gate_up + (size_t)r * 2 * I, *u = g + I;
        float *a = act + (size_t)r * I;
        for (int i = 0; i < I; i++) {
            const float x = g[i], ex = exp_nonpos_f32(-fabsf(x)); /* silu(x) = x sigmoid(x), from exp(-|x|) <= 1 */
            a[i] = x * ((x < 0 ? ex : 1.0f) / (1.0f + ex)) * u[i];
        }
    }
}

void trill_gen_add_rows(float *x, const float *y, size_t n) {
#pragma omp parallel for if(parallel: n >= PARALLEL_MIN) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* ---- the model's ends ---- */

void trill_gen_embed(const trill_engine *e, float *x, int R) {
    const int H = e->c.hidden_size;
    if (e->w->embed_f32) trill_embedding_forward(x, e->w->embed_f32, e->rows.token, R, H);
    else trill_embedding_forward_w(x, (trill_weight){ NULL, e->w->embed_bf16 }, e->rows.token, R, H);
}

trill_status trill_gen_logits(const trill_engine *e, gen_lora_buf *lb, const float *x, float *xn, float *logits, int norm_role,
                              int head_role, int n) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size;
    for (int i = 0; i < n; i++) memcpy(xn + (size_t)i * H, x + (size_t)e->rows.logit[i] * H, sizeof(float) * H);
    trill_rmsnorm_forward(xn, xn, e->w->global.vec[norm_role], n, H, (float)c->rms_norm_eps);
    return trill_gen_linear(e, lb, &e->w->global.m[head_role], e->ad ? &e->ad->global.m[head_role] : NULL, logits, xn, n, 0);
}

/* ---- the routed experts ---- */

/* EPLB's workers: rows order[first .. first+n) of the step, all routed to logical expert x:
 * gathered, through the expert (and its adapter), into ye at the same positions. Every buffer is indexed by those
 * positions, so workers computing different experts never touch the same memory. Fails as
 * trill_gen_matmul (the message is on the calling thread). */
static trill_status expert_rows(const trill_engine *e, gen_moe *b, gen_lora_buf *lb, const float *xn, const eng_layer *L,
                                const eng_lora_layer *A, gen_expert_roles roles, int x, int first, int n) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, K = c->num_experts_per_tok, Im = c->moe_intermediate_size;
    float *xe = b->xe + (size_t)first * H, *ff = b->ff + (size_t)first * 2 * Im, *act = b->act + (size_t)first * Im;
    float *ye = b->ye + (size_t)first * H;
    for (int i = 0; i < n; i++) memcpy(xe + (size_t)i * H, xn + (size_t)(b->order[first + i] / K) * H, sizeof(float) * H);
    trill_status st = trill_gen_linear(e, lb, &L->experts[roles.gate_up][x], A ? &A->experts[roles.gate_up][x] : NULL, ff, xe, n, first);
    if (st) return st;
    trill_gen_swiglu_fused(act, ff, n, Im);
    return trill_gen_linear(e, lb, &L->experts[roles.down][x], A ? &A->experts[roles.down][x] : NULL, ye, act, n, first);
}

/* One role of every expert of the step, as two batches of products (two forks for all the experts,
 * rather than a few per expert): each expert's rows of x [.., x_width] through its base matrix into
 * y [.., width] with its adapter's shrink beside it, then the adapters' expands added into y. */
static trill_status experts_role(const trill_engine *e, const gen_moe *b, gen_lora_buf *lb, const eng_layer *L, const eng_lora_layer *A,
                                 int role, float *y, size_t width, const float *x, size_t x_width, int E) {
    gen_product *list = trill_gen_product_list((size_t)E * (ENG_MAX_PARTS > 2 ? ENG_MAX_PARTS : 2));
    if (!list) return trill_error(TRILL_ERR_NOMEM, "out of memory for the list of %d experts' products", E);
    int n = 0, sides = 0;
    for (int ex = 0; ex < E; ex++) {
        const int first = ex ? b->count[ex - 1] : 0, rows = b->count[ex] - first;
        if (rows == 0) continue;
        list[n++] = (gen_product){ .out = y + (size_t)first * width, .inp = x + (size_t)first * x_width, .W = &L->experts[role][ex], .T = rows };
        if (A && adapted(&A->experts[role][ex])) {
            list[n++] = lora_shrink(lb, &A->experts[role][ex], x + (size_t)first * x_width, rows, first);
            sides++;
        }
    }
    trill_status st = trill_gen_matmul_many(list, n);
    if (st || !sides) return st;
    n = 0;
    for (int ex = 0; ex < E; ex++) {
        const int first = ex ? b->count[ex - 1] : 0, rows = b->count[ex] - first;
        if (rows > 0 && adapted(&A->experts[role][ex]))
            n += lora_expands(e, lb, &A->experts[role][ex], y + (size_t)first * width, width, rows, first, list + n);
    }
    return trill_gen_matmul_many(list, n);
}

/* Without EPLB: each expert's rows gathered, every expert's gate|up (and adapter) in one batch,
 * SwiGLU over every row, every expert's down. Per row the same operations in the same order as
 * expert_rows. */
static trill_status experts_grouped(const trill_engine *e, gen_moe *b, gen_lora_buf *lb, const float *xn, const eng_layer *L,
                                    const eng_lora_layer *A, gen_expert_roles roles, int R) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, K = c->num_experts_per_tok, Im = c->moe_intermediate_size, E = c->num_experts;
    for (int i = 0; i < R * K; i++) memcpy(b->xe + (size_t)i * H, xn + (size_t)(b->order[i] / K) * H, sizeof(float) * H);
    trill_status st = experts_role(e, b, lb, L, A, roles.gate_up, b->ff, 2 * (size_t)Im, b->xe, (size_t)H, E);
    if (st) return st;
    trill_gen_swiglu_fused(b->act, b->ff, R * K, Im);
    return experts_role(e, b, lb, L, A, roles.down, b->ye, (size_t)H, b->act, (size_t)Im, E);
}

/* Counting sort of the step's (row, slot) pairs by key[i] in [0, n_keys): order[] lists them
 * grouped by key, count[k] ends group k. */
static void group_by(gen_moe *b, const int *key, int n, int n_keys) {
    memset(b->count, 0, sizeof(int) * (size_t)(n_keys + 1));
    for (int i = 0; i < n; i++) b->count[key[i] + 1]++;
    for (int k = 0; k < n_keys; k++) b->count[k + 1] += b->count[k];
    for (int i = 0; i < n; i++) b->order[b->count[key[i]]++] = i;
}

/* out = sum_k gate_k expert_k(xn) for every row, its experts combined in ascending logical id (as
 * the reference), so the sum is the same whatever the batch, the placement or the worker. */
static void combine_experts(const trill_engine *e, gen_moe *b, float *out, int R) {
    const int H = e->c.hidden_size, K = e->c.num_experts_per_tok;
    for (int i = 0; i < R * K; i++) b->where[b->order[i]] = i;
#pragma omp parallel for if(parallel: (size_t)R * K * H >= PARALLEL_MIN) schedule(static)
    for (int r = 0; r < R; r++) {
        int slots[64];
        const int k_used = K < 64 ? K : 64;
        for (int j = 0; j < k_used; j++) { /* insertion sort of the row's slots by expert id */
            int v = r * K + j, at = j;
            while (at > 0 && b->topi[slots[at - 1]] > b->topi[v]) { slots[at] = slots[at - 1]; at--; }
            slots[at] = v;
        }
        float *o = out + (size_t)r * H;
        memset(o, 0, sizeof(float) * H);
        for (int j = 0; j < k_used; j++) {
            const float g = b->topw[slots[j]];
            const float *y = b->ye + (size_t)b->where[slots[j]] * H;
            for (int h = 0; h < H; h++) o[h] += g * y[h];
        }
    }
}

/* EPLB: rows go to physical replicas and each worker (thread) computes the replicas it holds. */
static trill_status experts_on_workers(trill_engine *e, gen_moe *b, gen_lora_buf *lb, const float *xn, const eng_layer *L,
                                       const eng_lora_layer *A, gen_expert_roles roles, int ordinal, int R) {
    const int K = e->c.num_experts_per_tok;
    const trill_eplb_plan *plan = &e->eplb.plan;
    for (int i = 0; i < R * K; i++) b->phys[i] = trill_eplb_physical(plan, ordinal, b->topi[i], (uint64_t)i);
    group_by(b, b->phys, R * K, plan->n_physical);
    const int per = plan->n_physical / e->eplb.workers;
    /* a worker's failure leaves its message on its own thread: the first is copied out */
    int failed = 0;
    char message[512] = "";
#pragma omp parallel num_threads(e->eplb.workers)
    {
        const int w = omp_get_thread_num();
        for (int p = w * per; p < (w + 1) * per; p++) {
            const int first = p ? b->count[p - 1] : 0, n = b->count[p] - first;
            if (n > 0 && expert_rows(e, b, lb, xn, L, A, roles, plan->phy2log[(size_t)ordinal * plan->n_physical + p], first, n)) {
#pragma omp critical(trill_eplb_failure)
                if (!failed++) snprintf(message, sizeof message, "%s", trill_error_message());
                break;
            }
        }
    }
    if (failed) return trill_error(TRILL_ERR_NOMEM, "EPLB worker: %s", message);
    return TRILL_OK;
}

/* Expert parallelism across ranks: rows n (first .. first + n of the received ones, at x) through
 * logical expert x, as expert_rows computes them (per row the same operations: batch-invariant);
 * ff [n, 3 Im] is scratch. */
static trill_status served_rows(const trill_engine *e, gen_lora_buf *lb, const eng_layer *L, const eng_lora_layer *A, gen_expert_roles roles,
                                int x, const float *xin, float *yout, float *ff, int first, int n) {
    const int Im = e->c.moe_intermediate_size;
    float *act = ff + (size_t)n * 2 * Im;
    trill_status st = trill_gen_linear(e, lb, &L->experts[roles.gate_up][x], A ? &A->experts[roles.gate_up][x] : NULL, ff, xin, n, first);
    if (!st) trill_gen_swiglu_fused(act, ff, n, Im);
    if (!st) st = trill_gen_linear(e, lb, &L->experts[roles.down][x], A ? &A->experts[roles.down][x] : NULL, yout, act, n, first);
    return st;
}

/* The logical expert of slot s on this rank: the EPLB plan's, or the rank's contiguous share. */
static int slot_expert(const trill_engine *e, int ordinal, int slot) {
    return e->eplb.window ? e->eplb.plan.phy2log[(size_t)ordinal * e->eplb.plan.n_physical + slot] : slot;
}

/* The exchange: every (row, slot) pair to the rank holding its slot (physical replica under EPLB,
 * else the logical expert), in slot order, by all-to-all-v; the holder computes each source's
 * rows of each of its slots; the outputs come back in the order sent, into b->ye. */
static trill_status experts_on_ranks(trill_engine *e, gen_moe *b, gen_lora_buf *lb, const float *xn, const eng_layer *L,
                                     const eng_lora_layer *A, gen_expert_roles roles, int ordinal, int R) {
    const int H = e->c.hidden_size, K = e->c.num_experts_per_tok, P = e->ep_size, me = e->ep_rank;
    const int slots = e->eplb.window ? e->eplb.plan.n_physical : e->c.num_experts, per = slots / P;
    for (int i = 0; i < R * K; i++)
        b->phys[i] = e->eplb.window ? trill_eplb_physical(&e->eplb.plan, ordinal, b->topi[i], (uint64_t)i) : b->topi[i];
    group_by(b, b->phys, R * K, slots);
    for (int i = 0; i < R * K; i++) memcpy(b->xe + (size_t)i * H, xn + (size_t)(b->order[i] / K) * H, sizeof(float) * H);
    size_t *n = trill_malloc(sizeof(size_t) * (size_t)(2 * slots + 4 * P));
    if (!n) return trill_error(TRILL_ERR_NOMEM, "out of memory for the expert exchange");
    size_t *sent = n, *got = n + slots, *send_b = got + slots, *recv_b = send_b + P, *out_b = recv_b + P, *back_b = out_b + P;
    for (int s = 0; s < slots; s++) sent[s] = (size_t)(b->count[s] - (s ? b->count[s - 1] : 0));
    trill_status st = trill_comm_alltoall_counts(e->ep, per, sent, got);
    size_t total = 0;
    for (int p = 0; p < P; p++) {
        send_b[p] = recv_b[p] = 0;
        for (int j = 0; j < per; j++) {
            send_b[p] += sent[p * per + j] * H * sizeof(float);
            recv_b[p] += got[p * per + j] * H * sizeof(float);
            total += got[p * per + j];
        }
        out_b[p] = recv_b[p];
        back_b[p] = send_b[p];
    }
    /* the received rows, their outputs and the experts' scratch, in one block */
    const size_t Im3 = 3 * (size_t)e->c.moe_intermediate_size;
    float *xin = st ? NULL : trill_malloc(sizeof(float) * (total * (2 * (size_t)H + Im3) + 1));
    float *yout = xin ? xin + total * H : NULL, *ff = xin ? yout + total * H : NULL;
    if (!st && !xin) st = trill_error(TRILL_ERR_NOMEM, "out of memory for %zu rows served to the expert group", total);
    if (!st) st = trill_comm_alltoallv(e->ep, b->xe, send_b, xin, recv_b);
    if (!st && A && total > lb->rows) st = trill_gen_lora_buf_ensure(lb, lb->rank, total);
    size_t at = 0;
    for (int p = 0; !st && p < P; p++)
        for (int j = 0; !st && j < per; j++) {
            const int rows = (int)got[p * per + j];
            if (rows) st = served_rows(e, lb, L, A, roles, slot_expert(e, ordinal, me * per + j), xin + at * H, yout + at * H, ff, (int)at, rows);
            at += (size_t)rows;
        }
    if (!st) st = trill_comm_alltoallv(e->ep, yout, out_b, b->ye, back_b);
    free(xin);
    free(n);
    return st;
}

trill_status trill_gen_moe_experts(trill_engine *e, gen_moe *b, gen_lora_buf *lb, const float *xn, float *out, const eng_layer *L,
                                   const eng_lora_layer *A, gen_expert_roles roles, int ordinal, int R) {
    const trill_config *c = &e->c;
    const int E = c->num_experts, K = c->num_experts_per_tok;
    /* capture and load count the logical ids, before any mapping to physical replicas */
    if (e->cfg.capture_experts)
        for (int r = 0; r < R; r++) {
            seq *s = e->rows.seq[r];
            uint16_t *dst = s->experts + ((size_t)e->rows.pos[r] * c->n_moe_layers + ordinal) * K;
            for (int j = 0; j < K; j++) dst[j] = (uint16_t)b->topi[r * K + j];
        }
    trill_status st = TRILL_OK;
    if (e->eplb.window) {
        uint32_t *load = e->eplb.counts + (size_t)ordinal * E;
        for (int i = 0; i < R * K; i++) load[b->topi[i]]++;
    }
    if (e->ep) {
        st = experts_on_ranks(e, b, lb, xn, L, A, roles, ordinal, R);
    } else if (e->eplb.window) {
        st = experts_on_workers(e, b, lb, xn, L, A, roles, ordinal, R);
    } else {
        group_by(b, b->topi, R * K, E);
        st = experts_grouped(e, b, lb, xn, L, A, roles, R);
    }
    if (st) return st;
    combine_experts(e, b, out, R);
    return TRILL_OK;
}

/* ---- attention ---- */

trill_status trill_gen_scores_ensure(const trill_engine *e, gen_scores *s, int R, int group) {
    int need = 1;
    for (int r = 0; r < R; r++) if (e->rows.pos[r] + 1 > need) need = e->rows.pos[r] + 1;
    const int threads = omp_get_max_threads();
    if (threads > s->threads) {
        s->threads = threads;
        s->max_context = 0; /* sized again below */
    }
    if (need <= s->max_context) return TRILL_OK;
    float *p = trill_realloc(s->p, sizeof(float) * (size_t)need * group * s->threads);
    if (!p) return trill_error(TRILL_ERR_NOMEM, "out of memory for attention over %d positions", need);
    s->p = p;
    s->max_context = need;
    return TRILL_OK;
}
