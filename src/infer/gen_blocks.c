/* Building blocks the families' generator layers share (src/infer/gen_blocks.h). */
#include "infer/gen_blocks.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "base/tls.h"
#include "kernels/exp_nonpos.h"
#include "model/decoder.h"
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

bool trill_gen_any_adapter(const trill_engine *e) { return e->ad || e->n_slots; }

int trill_gen_row_slot(const trill_engine *e, gen_rowmap m, int i) {
    return e->rows.mixed && m.div ? e->rows.slot[m.idx ? m.idx[i] / m.div : i] : 0;
}

/* Adapter ad's matrix at layout entry `at` (NULL: none there). */
static const eng_lora *lora_at(const eng_adapter *ad, const eng_lora *at) {
    if (!ad) return NULL;
    const eng_lora_layer *L = at->layer >= 0 ? &ad->layers[at->layer] : &ad->global;
    if (at->expert >= 0) return L->experts[at->role] ? &L->experts[at->role][at->expert] : NULL;
    return &L->m[at->role];
}

/* The side paths of rows [0, T) of x [T, x_width] (which the map places among the step's rows),
 * each run of rows of one adapter slot with that slot's matrix at `at`: with expand false, the
 * shrinks x A^T (a matrix's parts' A stacked) into the buffer's rows from row0, [T][n_adapted r];
 * with expand true, every part's expand read from its columns of those rows and added into its
 * columns of y [T, width], y = fmaf(scale, (x A_p^T) B_p^T, y). Writes the products to list;
 * returns how many. */
static int side_products(const trill_engine *e, const gen_lora_buf *b, const eng_lora *at, gen_rowmap m, const float *x, size_t x_width,
                         float *y, size_t width, int T, int row0, bool expand, gen_product *list) {
    int n = 0;
    for (int i0 = 0, i1; i0 < T; i0 = i1) {
        const int slot = trill_gen_row_slot(e, m, i0);
        for (i1 = i0 + 1; i1 < T && trill_gen_row_slot(e, m, i1) == slot; i1++) {}
        const eng_adapter *ad = trill_eng_slot_adapter(e, slot);
        const eng_lora *el = lora_at(ad, at);
        if (!adapted(el)) continue;
        float *xa = b->xa + (size_t)(row0 + i0) * 3 * b->rank;
        if (!expand) {
            list[n++] = (gen_product){ .out = xa, .inp = x + (size_t)i0 * x_width, .W = &el->A, .T = i1 - i0 };
            continue;
        }
        for (int a = 0; a < el->n_adapted; a++)
            list[n++] = (gen_product){ .out = y + (size_t)i0 * width + el->col0[a], .ldo = width, .inp = xa + (size_t)a * ad->rank,
                                       .ldi = (size_t)el->n_adapted * ad->rank, .W = &el->B[a], .T = i1 - i0, .accumulate = 1, .scale = ad->scale };
    }
    return n;
}

trill_status trill_gen_linear(const trill_engine *e, gen_lora_buf *b, const gen_matrix *W, const eng_lora *at, gen_rowmap m, float *y,
                              const float *x, int T, int row0) {
    const gen_product base = { .out = y, .inp = x, .W = W, .T = T };
    if (!at || !trill_gen_any_adapter(e)) return trill_gen_products(e, &base, 1);
    gen_product *list = trill_gen_product_list(1 + (size_t)ENG_MAX_PARTS * (e->rows.mixed ? (size_t)T : 1));
    if (!list) return trill_error(TRILL_ERR_NOMEM, "out of memory for the adapters' products");
    list[0] = base;
    const int n = 1 + side_products(e, b, at, m, x, (size_t)W->K, NULL, 0, T, row0, false, list + 1);
    trill_status st = trill_gen_products(e, list, n);
    if (st || n == 1) return st;
    return trill_gen_products(e, list, side_products(e, b, at, m, x, (size_t)W->K, y, (size_t)W->N, T, row0, true, list));
}

trill_status trill_gen_products(const trill_engine *e, const gen_product *list, int n) {
    eng_count_products(e, list, n);
    return trill_gen_matmul_many(list, n);
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
    return trill_gen_linear(e, lb, &e->w->global.m[head_role], &e->layout->global.m[head_role], (gen_rowmap){ e->rows.logit, 1 }, logits, xn, n, 0);
}

/* ---- the routed experts ---- */

/* act[n, Im] of expert x's rows ff [n, gate | up]: the gate and up biases added (in ff) when the
 * experts have them, then the activation. */
static void expert_act(const eng_layer *L, gen_expert_roles roles, int x, float *act, float *ff, int n, int Im) {
    if (roles.bias) {
        const float *bg = L->vec[TRILL_ROLE_EXPERT_GATE_BIAS] + (size_t)x * Im, *bu = L->vec[TRILL_ROLE_EXPERT_UP_BIAS] + (size_t)x * Im;
        for (int r = 0; r < n; r++) {
            float *g = ff + (size_t)r * 2 * Im, *u = g + Im;
            for (int i = 0; i < Im; i++) g[i] += bg[i], u[i] += bu[i];
        }
    }
    if (roles.act != TRILL_EXPERT_SWIGLU_CLAMPED) {
        trill_gen_swiglu_fused(act, ff, n, Im);
        return;
    }
    const float lim = roles.limit, alpha = roles.alpha;
    for (int r = 0; r < n; r++) {
        const float *g = ff + (size_t)r * 2 * Im, *u = g + Im;
        float *a = act + (size_t)r * Im;
        for (int i = 0; i < Im; i++) {
            const float gc = g[i] > lim ? lim : g[i], uc = u[i] > lim ? lim : u[i] < -lim ? -lim : u[i];
            a[i] = gc / (1.0f + expf(-alpha * gc)) * (uc + 1.0f);
        }
    }
}

/* y[n, H] += expert x's down bias, when the experts have biases. */
static void expert_out_bias(const eng_layer *L, gen_expert_roles roles, int x, float *y, int n, int H) {
    if (roles.bias) trill_decoder_bias_forward(y, L->vec[TRILL_ROLE_EXPERT_DOWN_BIAS] + (size_t)x * H, n, H);
}

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
    const gen_rowmap m = { b->order + first, K };
    trill_status st = trill_gen_linear(e, lb, &L->experts[roles.gate_up][x], &A->experts[roles.gate_up][x], m, ff, xe, n, first);
    if (st) return st;
    expert_act(L, roles, x, act, ff, n, Im);
    st = trill_gen_linear(e, lb, &L->experts[roles.down][x], &A->experts[roles.down][x], m, ye, act, n, first);
    if (!st) expert_out_bias(L, roles, x, ye, n, H);
    return st;
}

/* One role of every expert of the step, as two batches of products (two forks for all the experts,
 * rather than a few per expert): each expert's rows of x [.., x_width] through its base matrix into
 * y [.., width] with its adapters' shrinks beside it (a run of rows per adapter slot), then the
 * adapters' expands added into y. A: the layout's layer. */
static trill_status experts_role(const trill_engine *e, const gen_moe *b, gen_lora_buf *lb, const eng_layer *L, const eng_lora_layer *A,
                                 int role, float *y, size_t width, const float *x, size_t x_width, int E) {
    const int K = e->c.num_experts_per_tok, rows_all = b->count[E - 1];
    const bool sides = trill_gen_any_adapter(e) && A->experts[role];
    gen_product *list = trill_gen_product_list((size_t)E + (size_t)ENG_MAX_PARTS * ((size_t)E + (e->rows.mixed ? (size_t)rows_all : 0)));
    if (!list) return trill_error(TRILL_ERR_NOMEM, "out of memory for the list of %d experts' products", E);
    int n = 0, n_side = 0;
    for (int ex = 0; ex < E; ex++) {
        const int first = ex ? b->count[ex - 1] : 0, rows = b->count[ex] - first;
        if (rows == 0) continue;
        list[n++] = (gen_product){ .out = y + (size_t)first * width, .inp = x + (size_t)first * x_width, .W = &L->experts[role][ex], .T = rows };
        if (sides) {
            const int k = side_products(e, lb, &A->experts[role][ex], (gen_rowmap){ b->order + first, K }, x + (size_t)first * x_width, x_width,
                                        NULL, 0, rows, first, false, list + n);
            n += k, n_side += k;
        }
    }
    trill_status st = trill_gen_products(e, list, n);
    if (st || !n_side) return st;
    n = 0;
    for (int ex = 0; ex < E; ex++) {
        const int first = ex ? b->count[ex - 1] : 0, rows = b->count[ex] - first;
        if (rows > 0)
            n += side_products(e, lb, &A->experts[role][ex], (gen_rowmap){ b->order + first, K }, x + (size_t)first * x_width, x_width,
                               y + (size_t)first * width, width, rows, first, true, list + n);
    }
    return trill_gen_products(e, list, n);
}

/* Without EPLB: each expert's rows gathered, every expert's gate|up (and adapter) in one batch,
 * SwiGLU over every row, every expert's down. Per row the same operations in the same order as
 * expert_rows. */
static trill_status experts_grouped(const trill_engine *e, gen_moe *b, gen_lora_buf *lb, const float *xn, const eng_layer *L,
                                    const eng_lora_layer *A, gen_expert_roles roles, int R) {
    const trill_config *c = &e->c;
    const int H = c->hidden_size, K = c->num_experts_per_tok, Im = c->moe_intermediate_size, E = c->num_experts;
    for (int i = 0; i < R * K; i++) memcpy(b->xe + (size_t)i * H, xn + (size_t)(b->order[i] / K) * H, sizeof(float) * H);
    eng_phase(e, TRILL_PHASE_EXPERTS);
    trill_status st = experts_role(e, b, lb, L, A, roles.gate_up, b->ff, 2 * (size_t)Im, b->xe, (size_t)H, E);
    if (st) return st;
    if (!roles.bias && roles.act == TRILL_EXPERT_SWIGLU) {
        trill_gen_swiglu_fused(b->act, b->ff, R * K, Im);
    } else {
        for (int ex = 0; ex < E; ex++) {
            const int first = ex ? b->count[ex - 1] : 0;
            expert_act(L, roles, ex, b->act + (size_t)first * Im, b->ff + (size_t)first * 2 * Im, b->count[ex] - first, Im);
        }
    }
    if ((st = experts_role(e, b, lb, L, A, roles.down, b->ye, (size_t)H, b->act, (size_t)Im, E))) return st;
    for (int ex = 0; roles.bias && ex < E; ex++) {
        const int first = ex ? b->count[ex - 1] : 0;
        expert_out_bias(L, roles, ex, b->ye + (size_t)first * H, b->count[ex] - first, H);
    }
    return TRILL_OK;
}

/* Counting sort of the step's (row, slot) pairs by key[i] in [0, n_keys): order[] lists them
 * grouped by key, count[k] ends group k. When rows apply different adapters, a group's pairs
 * come in order of their row's adapter slot, so each adapter's side path runs over one run of
 * them (b->where is the scratch: combine_experts sets it afterwards). */
static void group_by(const trill_engine *e, gen_moe *b, const int *key, int n, int n_keys) {
    const int K = e->c.num_experts_per_tok;
    memset(b->count, 0, sizeof(int) * (size_t)(n_keys + 1));
    for (int i = 0; i < n; i++) b->count[key[i] + 1]++;
    for (int k = 0; k < n_keys; k++) b->count[k + 1] += b->count[k];
    if (e->rows.mixed) {
        int at[TRILL_ENGINE_ADAPTER_SLOTS + 1] = { 0 };
        for (int i = 0; i < n; i++) at[e->rows.slot[i / K] + 1]++;
        for (int s = 0; s < TRILL_ENGINE_ADAPTER_SLOTS; s++) at[s + 1] += at[s];
        for (int i = 0; i < n; i++) b->where[at[e->rows.slot[i / K]]++] = i;
    }
    for (int j = 0; j < n; j++) {
        const int i = e->rows.mixed ? b->where[j] : j;
        b->order[b->count[key[i]]++] = i;
    }
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
    group_by(e, b, b->phys, R * K, plan->n_physical);
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
    /* rows from other ranks: slot 0 (adapter slots are refused with expert parallelism) */
    trill_status st = trill_gen_linear(e, lb, &L->experts[roles.gate_up][x], &A->experts[roles.gate_up][x], GEN_SLOT0_ROWS, ff, xin, n, first);
    if (!st) expert_act(L, roles, x, act, ff, n, Im);
    if (!st) st = trill_gen_linear(e, lb, &L->experts[roles.down][x], &A->experts[roles.down][x], GEN_SLOT0_ROWS, yout, act, n, first);
    if (!st) expert_out_bias(L, roles, x, yout, n, e->c.hidden_size);
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
    group_by(e, b, b->phys, R * K, slots);
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
    if (!st && trill_gen_any_adapter(e) && total > lb->rows) st = trill_gen_lora_buf_ensure(lb, lb->rank, total);
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
    eng_phase(e, TRILL_PHASE_EXPERTS); /* EP and EPLB: their grouping and exchange counted with the experts */
    if (e->ep) {
        st = experts_on_ranks(e, b, lb, xn, L, A, roles, ordinal, R);
    } else if (e->eplb.window) {
        st = experts_on_workers(e, b, lb, xn, L, A, roles, ordinal, R);
    } else {
        eng_phase(e, TRILL_PHASE_DISPATCH);
        group_by(e, b, b->topi, R * K, E);
        st = experts_grouped(e, b, lb, xn, L, A, roles, R);
    }
    if (st) return st;
    eng_phase(e, TRILL_PHASE_COMBINE);
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
