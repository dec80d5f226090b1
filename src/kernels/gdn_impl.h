/* The gated delta rule (Gated DeltaNet: Qwen3-Next's linear attention), recurrent form, forward
 * and backward; written once and compiled twice with ops_impl.h (REAL, KN). Per head, over a
 * sequence, with S [dk, dv] (row i: key dimension i):
 *   a_t = exp(g_t);  P = a_t S;  m = P^T k_t;  u = beta_t (v_t - m);  S = P + k_t u^T;  o_t = S^T q_t
 * (HF's torch_recurrent_gated_delta_rule). The backward keeps the state at every CHUNK-th step of
 * the forward and recomputes the steps between, so it holds T / CHUNK states, not T. No include
 * guard on purpose. */

#ifndef GDN_CHUNK
#define GDN_CHUNK 64
#endif

/* One head of one sequence: n steps from the state in S (overwritten with the final one); rows
 * of q, k [.., stride_k], v, o [.., stride_v], g, beta [.., stride_g]. keep (NULL: none) gets the
 * state before each chunk of GDN_CHUNK steps. */
static void KN(gdn_head_forward)(REAL *S, REAL *o, const REAL *q, const REAL *k, const REAL *v, const REAL *g, const REAL *beta, int n,
                                 int dk, int dv, size_t stride_k, size_t stride_v, size_t stride_g, REAL *keep, REAL *m) {
    for (int t = 0; t < n; t++) {
        if (keep && t % GDN_CHUNK == 0) memcpy(keep + (size_t)(t / GDN_CHUNK) * dk * dv, S, sizeof(REAL) * (size_t)dk * dv);
        const REAL *qt = q + (size_t)t * stride_k, *kt = k + (size_t)t * stride_k, *vt = v + (size_t)t * stride_v;
        const REAL a = EXPR(g[(size_t)t * stride_g]), b = beta[(size_t)t * stride_g];
        for (int j = 0; j < dv; j++) m[j] = 0;
        for (int i = 0; i < dk; i++) { /* S *= a, m = S^T k */
            REAL *row = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) {
                row[j] *= a;
                m[j] += row[j] * kt[i];
            }
        }
        for (int j = 0; j < dv; j++) m[j] = b * (vt[j] - m[j]); /* u */
        REAL *ot = o ? o + (size_t)t * stride_v : NULL;
        if (ot)
            for (int j = 0; j < dv; j++) ot[j] = 0;
        for (int i = 0; i < dk; i++) { /* S += k u^T, o = S^T q */
            REAL *row = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) {
                row[j] += kt[i] * m[j];
                if (ot) ot[j] += row[j] * qt[i];
            }
        }
    }
}

void KN(trill_gdn_recurrent_forward)(REAL *out, REAL *state_out, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                                     const REAL *beta, const REAL *state0, const int *offsets, int n_seqs, int nh, int dk, int dv) {
    const size_t sk = (size_t)nh * dk, sv = (size_t)nh * dv, ss = (size_t)dk * dv;
#pragma omp parallel
    {
        REAL *S = malloc(sizeof(REAL) * (ss + (size_t)dv)), *m = S ? S + ss : NULL;
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seqs; s++)
            for (int h = 0; h < nh; h++) {
                if (!S) continue; /* (no memory: checked after) */
                const size_t t0 = (size_t)offsets[s];
                if (state0) memcpy(S, state0 + ((size_t)s * nh + h) * ss, sizeof(REAL) * ss);
                else memset(S, 0, sizeof(REAL) * ss);
                KN(gdn_head_forward)(S, out + t0 * sv + (size_t)h * dv, q + t0 * sk + (size_t)h * dk, k + t0 * sk + (size_t)h * dk,
                                     v + t0 * sv + (size_t)h * dv, g + t0 * nh + h, beta + t0 * nh + h, offsets[s + 1] - offsets[s], dk, dv, sk, sv,
                                     (size_t)nh, NULL, m);
                if (state_out) memcpy(state_out + ((size_t)s * nh + h) * ss, S, sizeof(REAL) * ss);
            }
        free(S);
    }
}

void KN(trill_gdn_recurrent_forward_states)(REAL *out, const REAL *q, const REAL *k, const REAL *v, const REAL *g, const REAL *beta,
                                            REAL *const *states, const int *offsets, int n_seqs, int nh, int dk, int dv) {
    const size_t sk = (size_t)nh * dk, sv = (size_t)nh * dv, ss = (size_t)dk * dv;
#pragma omp parallel
    {
        REAL m[dv];
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seqs; s++)
            for (int h = 0; h < nh; h++) {
                const size_t t0 = (size_t)offsets[s];
                KN(gdn_head_forward)(states[s] + (size_t)h * ss, out + t0 * sv + (size_t)h * dv, q + t0 * sk + (size_t)h * dk,
                                     k + t0 * sk + (size_t)h * dk, v + t0 * sv + (size_t)h * dv, g + t0 * nh + h, beta + t0 * nh + h,
                                     offsets[s + 1] - offsets[s], dk, dv, sk, sv, (size_t)nh, NULL, m);
            }
    }
}

/* One head's backward: the states before each chunk in keep; dS holds d state_out on entry. */
static void KN(gdn_head_backward)(REAL *dq, REAL *dk_, REAL *dv_, REAL *dg, REAL *dbeta, REAL *dS, const REAL *dout, const REAL *q,
                                  const REAL *k, const REAL *v, const REAL *g, const REAL *beta, int n, int dk, int dv, size_t stride_k,
                                  size_t stride_v, size_t stride_g, const REAL *keep, REAL *states, REAL *work) {
    const size_t ss = (size_t)dk * dv;
    REAL *m = work, *u = m + dv, *du = u + dv, *dm = du + dv, *dP = dm + dv, *S = dP + ss;
    for (int c = (n - 1) / GDN_CHUNK; c >= 0; c--) {
        const int t0 = c * GDN_CHUNK, t1 = t0 + GDN_CHUNK < n ? t0 + GDN_CHUNK : n;
        /* the chunk's states again: states[i] = S before step t0 + i */
        memcpy(states, keep + (size_t)c * ss, sizeof(REAL) * ss);
        for (int t = t0; t < t1 - 1; t++) {
            memcpy(states + (size_t)(t - t0 + 1) * ss, states + (size_t)(t - t0) * ss, sizeof(REAL) * ss);
            KN(gdn_head_forward)(states + (size_t)(t - t0 + 1) * ss, NULL, q + (size_t)t * stride_k, k + (size_t)t * stride_k,
                                 v + (size_t)t * stride_v, g + (size_t)t * stride_g, beta + (size_t)t * stride_g, 1, dk, dv, stride_k, stride_v,
                                 stride_g, NULL, m);
        }
        for (int t = t1 - 1; t >= t0; t--) {
            const REAL *prev = states + (size_t)(t - t0) * ss;
            const REAL *qt = q + (size_t)t * stride_k, *kt = k + (size_t)t * stride_k, *vt = v + (size_t)t * stride_v;
            const REAL *dot = dout + (size_t)t * stride_v;
            const REAL a = EXPR(g[(size_t)t * stride_g]), b = beta[(size_t)t * stride_g];
            /* the step again: m = a prev^T k, u = b (v - m), S = a prev + k u^T */
            for (int j = 0; j < dv; j++) m[j] = 0;
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) m[j] += a * prev[(size_t)i * dv + j] * kt[i];
            for (int j = 0; j < dv; j++) u[j] = b * (vt[j] - m[j]);
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++) S[(size_t)i * dv + j] = a * prev[(size_t)i * dv + j] + kt[i] * u[j];
            /* o = S^T q:  dS += q do^T,  dq = S do */
            REAL *dqt = dq + (size_t)t * stride_k, *dkt = dk_ + (size_t)t * stride_k, *dvt = dv_ + (size_t)t * stride_v;
            for (int i = 0; i < dk; i++) {
                REAL acc = 0;
                for (int j = 0; j < dv; j++) {
                    dS[(size_t)i * dv + j] += qt[i] * dot[j];
                    acc += S[(size_t)i * dv + j] * dot[j];
                }
                dqt[i] += acc;
            }
            /* S = P + k u^T:  dP = dS,  dk += dS u,  du = dS^T k */
            for (int j = 0; j < dv; j++) du[j] = 0;
            for (int i = 0; i < dk; i++) {
                REAL acc = 0;
                for (int j = 0; j < dv; j++) {
                    acc += dS[(size_t)i * dv + j] * u[j];
                    du[j] += dS[(size_t)i * dv + j] * kt[i];
                }
                dkt[i] += acc;
            }
            /* u = b (v - m):  dbeta = du . (v - m),  dv = b du,  dm = -b du */
            REAL db = 0;
            for (int j = 0; j < dv; j++) {
                db += du[j] * (vt[j] - m[j]);
                dvt[j] += b * du[j];
                dm[j] = -b * du[j];
            }
            dbeta[(size_t)t * stride_g] += db;
            /* m = P^T k:  dP += k dm^T,  dk += P dm;  P = a prev:  dg = a <dP, prev>, d prev = a dP */
            REAL da = 0;
            for (int i = 0; i < dk; i++) {
                REAL acc = 0;
                for (int j = 0; j < dv; j++) {
                    const REAL p = a * prev[(size_t)i * dv + j];
                    dP[(size_t)i * dv + j] = dS[(size_t)i * dv + j] + kt[i] * dm[j];
                    acc += p * dm[j];
                    da += dP[(size_t)i * dv + j] * prev[(size_t)i * dv + j];
                }
                dkt[i] += acc;
            }
            dg[(size_t)t * stride_g] += da * a;
            for (size_t x = 0; x < ss; x++) dS[x] = a * dP[x];
        }
    }
}

trill_status KN(trill_gdn_recurrent_backward)(REAL *dq, REAL *dk, REAL *dv, REAL *dg, REAL *dbeta, REAL *dstate0, const REAL *dout,
                                              const REAL *dstate_out, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                                              const REAL *beta, const REAL *state0, const int *offsets, int n_seqs, int nh, int dk_, int dv_) {
    const size_t sk = (size_t)nh * dk_, sv = (size_t)nh * dv_, ss = (size_t)dk_ * dv_;
    int longest = 1, failed = 0;
    for (int s = 0; s < n_seqs; s++)
        if (offsets[s + 1] - offsets[s] > longest) longest = offsets[s + 1] - offsets[s];
    const size_t n_keep = (size_t)(longest + GDN_CHUNK - 1) / GDN_CHUNK;
#pragma omp parallel reduction(+ : failed)
    {
        /* per thread: the kept states, a chunk's states, dS and the step's scratch */
        REAL *buf = malloc(sizeof(REAL) * (ss * (n_keep + GDN_CHUNK + 3) + 4 * (size_t)dv_));
        failed += buf == NULL;
        REAL *keep = buf, *states = buf ? keep + n_keep * ss : NULL, *dS = states ? states + (size_t)GDN_CHUNK * ss : NULL;
        REAL *work = dS ? dS + ss : NULL; /* m, u, du, dm [dv], dP, S [dk, dv] */
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seqs; s++)
            for (int h = 0; h < nh; h++) {
                if (!buf) continue;
                const size_t t0 = (size_t)offsets[s];
                const int n = offsets[s + 1] - offsets[s];
                /* the forward again, keeping the state before every chunk (dS its running state for now) */
                if (state0) memcpy(dS, state0 + ((size_t)s * nh + h) * ss, sizeof(REAL) * ss);
                else memset(dS, 0, sizeof(REAL) * ss);
                KN(gdn_head_forward)(dS, NULL, q + t0 * sk + (size_t)h * dk_, k + t0 * sk + (size_t)h * dk_, v + t0 * sv + (size_t)h * dv_,
                                     g + t0 * nh + h, beta + t0 * nh + h, n, dk_, dv_, sk, sv, (size_t)nh, keep, work);
                if (dstate_out) memcpy(dS, dstate_out + ((size_t)s * nh + h) * ss, sizeof(REAL) * ss);
                else memset(dS, 0, sizeof(REAL) * ss);
                if (n > 0)
                    KN(gdn_head_backward)(dq + t0 * sk + (size_t)h * dk_, dk + t0 * sk + (size_t)h * dk_, dv + t0 * sv + (size_t)h * dv_,
                                          dg + t0 * nh + h, dbeta + t0 * nh + h, dS, dout + t0 * sv + (size_t)h * dv_,
                                          q + t0 * sk + (size_t)h * dk_, k + t0 * sk + (size_t)h * dk_, v + t0 * sv + (size_t)h * dv_,
                                          g + t0 * nh + h, beta + t0 * nh + h, n, dk_, dv_, sk, sv, (size_t)nh, keep, states, work);
                if (dstate0)
                    for (size_t x = 0; x < ss; x++) dstate0[((size_t)s * nh + h) * ss + x] += dS[x];
            }
        free(buf);
    }
    if (failed) return trill_error(TRILL_ERR_NOMEM, "gated delta rule backward: out of memory for the kept states (%zu per head)", n_keep);
    return TRILL_OK;
}

/* ---- the chunked form (HF's torch_chunk_gated_delta_rule, chunks of GDN_CHUNK) ---- */

/* One head of one sequence, n steps from the state in S (overwritten with the final one), chunk
 * by chunk (c <= GDN_CHUNK positions; a short last chunk is what HF's zero padding computes). Per
 * chunk, with G the cumulative log decay, kb = beta k, vb = beta v:
 *   A[i][j] = -(kb_i . k_j) exp(G_i - G_j) (j < i), made (I - A)^-1 - ... by forward substitution
 *   as HF does (row i += row i's A times the rows before it), T = A + I;
 *   U = T vb, W = T (kb exp(G));  v' = U - W S;
 *   o_i = exp(G_i) q_i^T S + sum_{j <= i} (q_i . k_j) exp(G_i - G_j) v'_j;
 *   S = exp(G_last) S + sum_j k_j exp(G_last - G_j) v'_j^T.
 * work: [c][c] + [c][dv] + [c][dk] + [c]. */
static void KN(gdn_head_chunked)(REAL *S, REAL *o, const REAL *q, const REAL *k, const REAL *v, const REAL *g, const REAL *beta, int n,
                                 int dk, int dv, size_t stride_k, size_t stride_v, size_t stride_g, REAL *work) {
    const int C = GDN_CHUNK;
    REAL *A = work, *U = A + (size_t)C * C, *W = U + (size_t)C * dv, *G = W + (size_t)C * dk;
    for (int t0 = 0; t0 < n; t0 += C) {
        const int c = n - t0 < C ? n - t0 : C;
        const REAL *qc = q + (size_t)t0 * stride_k, *kc = k + (size_t)t0 * stride_k, *vc = v + (size_t)t0 * stride_v;
        REAL acc = 0;
        for (int i = 0; i < c; i++) G[i] = acc += g[(size_t)(t0 + i) * stride_g];
        for (int i = 0; i < c; i++) {
            const REAL bi = beta[(size_t)(t0 + i) * stride_g];
            for (int j = 0; j < c; j++) {
                REAL d = 0;
                if (j < i)
                    for (int x = 0; x < dk; x++) d += kc[(size_t)i * stride_k + x] * kc[(size_t)j * stride_k + x];
                A[(size_t)i * C + j] = j < i ? -bi * d * EXPR(G[i] - G[j]) : 0;
            }
        }
        for (int i = 1; i < c; i++) { /* row i: row + row . (the rows before it), as HF's loop */
            REAL row[GDN_CHUNK];
            for (int j = 0; j < i; j++) row[j] = A[(size_t)i * C + j];
            for (int j = 0; j < i; j++) {
                REAL s = row[j];
                for (int m = j + 1; m < i; m++) s += row[m] * A[(size_t)m * C + j];
                A[(size_t)i * C + j] = s;
            }
        }
        for (int i = 0; i < c; i++) { /* U = (A + I) vb, W = (A + I) (kb exp(G)) */
            for (int y = 0; y < dv; y++) U[(size_t)i * dv + y] = 0;
            for (int x = 0; x < dk; x++) W[(size_t)i * dk + x] = 0;
            for (int j = 0; j <= i; j++) {
                const REAL a = j == i ? 1 : A[(size_t)i * C + j], bj = beta[(size_t)(t0 + j) * stride_g], ej = EXPR(G[j]);
                for (int y = 0; y < dv; y++) U[(size_t)i * dv + y] += a * bj * vc[(size_t)j * stride_v + y];
                for (int x = 0; x < dk; x++) W[(size_t)i * dk + x] += a * bj * ej * kc[(size_t)j * stride_k + x];
            }
        }
        for (int i = 0; i < c; i++) /* v' = U - W S (into U) */
            for (int x = 0; x < dk; x++) {
                const REAL w = W[(size_t)i * dk + x];
                for (int y = 0; y < dv; y++) U[(size_t)i * dv + y] -= w * S[(size_t)x * dv + y];
            }
        if (o)
            for (int i = 0; i < c; i++) { /* o_i = exp(G_i) q_i^T S + sum_{j <= i} (q_i . k_j) exp(G_i - G_j) v'_j */
                REAL *oi = o + (size_t)(t0 + i) * stride_v;
                const REAL *qi = qc + (size_t)i * stride_k, ei = EXPR(G[i]);
                for (int y = 0; y < dv; y++) oi[y] = 0;
                for (int x = 0; x < dk; x++)
                    for (int y = 0; y < dv; y++) oi[y] += ei * qi[x] * S[(size_t)x * dv + y];
                for (int j = 0; j <= i; j++) {
                    REAL d = 0;
                    for (int x = 0; x < dk; x++) d += qi[x] * kc[(size_t)j * stride_k + x];
                    d *= EXPR(G[i] - G[j]);
                    for (int y = 0; y < dv; y++) oi[y] += d * U[(size_t)j * dv + y];
                }
            }
        const REAL el = EXPR(G[c - 1]); /* S = exp(G_last) S + sum_j k_j exp(G_last - G_j) v'_j^T */
        for (int x = 0; x < dk; x++)
            for (int y = 0; y < dv; y++) S[(size_t)x * dv + y] *= el;
        for (int j = 0; j < c; j++) {
            const REAL e = EXPR(G[c - 1] - G[j]);
            for (int x = 0; x < dk; x++) {
                const REAL kx = kc[(size_t)j * stride_k + x] * e;
                for (int y = 0; y < dv; y++) S[(size_t)x * dv + y] += kx * U[(size_t)j * dv + y];
            }
        }
    }
}

trill_status KN(trill_gdn_chunked_forward)(REAL *out, REAL *state_out, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                                           const REAL *beta, const REAL *state0, const int *offsets, int n_seqs, int nh, int dk, int dv) {
    const size_t sk = (size_t)nh * dk, sv = (size_t)nh * dv, ss = (size_t)dk * dv, C = GDN_CHUNK;
    int failed = 0;
#pragma omp parallel reduction(+ : failed)
    {
        REAL *S = malloc(sizeof(REAL) * (ss + C * C + C * (size_t)dv + C * (size_t)dk + C));
        failed += S == NULL;
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seqs; s++)
            for (int h = 0; h < nh; h++) {
                if (!S) continue;
                const size_t t0 = (size_t)offsets[s];
                if (state0) memcpy(S, state0 + ((size_t)s * nh + h) * ss, sizeof(REAL) * ss);
                else memset(S, 0, sizeof(REAL) * ss);
                KN(gdn_head_chunked)(S, out + t0 * sv + (size_t)h * dv, q + t0 * sk + (size_t)h * dk, k + t0 * sk + (size_t)h * dk,
                                     v + t0 * sv + (size_t)h * dv, g + t0 * nh + h, beta + t0 * nh + h, offsets[s + 1] - offsets[s], dk, dv, sk, sv,
                                     (size_t)nh, S + ss);
                if (state_out) memcpy(state_out + ((size_t)s * nh + h) * ss, S, sizeof(REAL) * ss);
            }
        free(S);
    }
    if (failed) return trill_error(TRILL_ERR_NOMEM, "gated delta rule (chunked): out of memory for a chunk's scratch");
    return TRILL_OK;
}

/* ---- the Gated DeltaNet layer's other operations ---- */

void KN(trill_conv1d_causal_forward)(REAL *out, REAL *state_out, const REAL *x, const REAL *w, const REAL *state0, const int *offsets,
                                     int n_seqs, int C, int K) {
#pragma omp parallel for schedule(static) collapse(2)
    for (int s = 0; s < n_seqs; s++)
        for (int c = 0; c < C; c++) {
            const int t0 = offsets[s], n = offsets[s + 1] - offsets[s];
            const REAL *wc = w + (size_t)c * K, *st = state0 ? state0 + ((size_t)s * C + c) * (K - 1) : NULL;
            for (int t = 0; t < n; t++) { /* input at t + j - (K - 1), from the state before the sequence */
                REAL acc = 0;
                for (int j = 0; j < K; j++) {
                    const int p = t + j - (K - 1);
                    acc += wc[j] * (p >= 0 ? x[(size_t)(t0 + p) * C + c] : st ? st[K - 1 + p] : 0);
                }
                out[(size_t)(t0 + t) * C + c] = acc / (1 + EXPR(-acc));
            }
            if (state_out) /* the last K - 1 inputs, oldest first */
                for (int j = 0; j < K - 1; j++) {
                    const int p = n - (K - 1) + j;
                    state_out[((size_t)s * C + c) * (K - 1) + j] = p >= 0 ? x[(size_t)(t0 + p) * C + c] : st ? st[K - 1 + p] : 0;
                }
        }
}

void KN(trill_conv1d_causal_forward_states)(REAL *out, const REAL *x, const REAL *w, REAL *const *states, const int *offsets, int n_seqs,
                                            int C, int K) {
#pragma omp parallel for schedule(static) collapse(2)
    for (int s = 0; s < n_seqs; s++)
        for (int c = 0; c < C; c++) {
            const int t0 = offsets[s], n = offsets[s + 1] - offsets[s];
            const REAL *wc = w + (size_t)c * K;
            REAL *st = states[s] + (size_t)c * (K - 1);
            for (int t = 0; t < n; t++) {
                REAL acc = 0;
                for (int j = 0; j < K; j++) {
                    const int p = t + j - (K - 1);
                    acc += wc[j] * (p >= 0 ? x[(size_t)(t0 + p) * C + c] : st[K - 1 + p]);
                }
                out[(size_t)(t0 + t) * C + c] = acc / (1 + EXPR(-acc));
            }
            for (int j = 0; j < K - 1; j++) { /* reads st[n + j] (n >= 1) before anything at or after it is written */
                const int p = n - (K - 1) + j;
                st[j] = p >= 0 ? x[(size_t)(t0 + p) * C + c] : st[K - 1 + p];
            }
        }
}

void KN(trill_conv1d_causal_backward)(REAL *dx, REAL *dw, REAL *dstate0, const REAL *dout, const REAL *x, const REAL *w, const REAL *state0,
                                      const int *offsets, int n_seqs, int C, int K) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) /* one channel's weights per thread: no two threads add to one dw */
        for (int s = 0; s < n_seqs; s++) {
            const int t0 = offsets[s], n = offsets[s + 1] - offsets[s];
            const REAL *wc = w + (size_t)c * K, *st = state0 ? state0 + ((size_t)s * C + c) * (K - 1) : NULL;
            REAL *dst = dstate0 ? dstate0 + ((size_t)s * C + c) * (K - 1) : NULL;
            for (int t = 0; t < n; t++) {
                REAL acc = 0;
                for (int j = 0; j < K; j++) {
                    const int p = t + j - (K - 1);
                    acc += wc[j] * (p >= 0 ? x[(size_t)(t0 + p) * C + c] : st ? st[K - 1 + p] : 0);
                }
                const REAL sg = 1 / (1 + EXPR(-acc)), da = dout[(size_t)(t0 + t) * C + c] * sg * (1 + acc * (1 - sg)); /* silu' */
                for (int j = 0; j < K; j++) {
                    const int p = t + j - (K - 1);
                    if (p >= 0) {
                        dx[(size_t)(t0 + p) * C + c] += da * wc[j];
                        if (dw) dw[(size_t)c * K + j] += da * x[(size_t)(t0 + p) * C + c];
                    } else {
                        if (dst) dst[K - 1 + p] += da * wc[j];
                        if (dw && st) dw[(size_t)c * K + j] += da * st[K - 1 + p];
                    }
                }
            }
        }
}

void KN(trill_l2norm_forward)(REAL *out, const REAL *x, int T, int C, REAL eps) {
#pragma omp parallel for if(parallel: (size_t)T * C >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *xt = x + (size_t)t * C;
        REAL ss = 0;
        for (int i = 0; i < C; i++) ss += xt[i] * xt[i];
        const REAL inv = 1 / sqrt(ss + eps);
        for (int i = 0; i < C; i++) out[(size_t)t * C + i] = xt[i] * inv;
    }
}

/* y = x r, r = (|x|^2 + eps)^-1/2:  dx = r dy - r^3 (x . dy) x */
void KN(trill_l2norm_backward)(REAL *dx, const REAL *dout, const REAL *x, int T, int C, REAL eps) {
#pragma omp parallel for if(parallel: (size_t)T * C >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *xt = x + (size_t)t * C, *dy = dout + (size_t)t * C;
        REAL ss = 0, dot = 0;
        for (int i = 0; i < C; i++) ss += xt[i] * xt[i], dot += xt[i] * dy[i];
        const REAL r = 1 / sqrt(ss + eps);
        for (int i = 0; i < C; i++) dx[(size_t)t * C + i] += r * dy[i] - r * r * r * dot * xt[i];
    }
}

void KN(trill_rmsnorm_gated_forward)(REAL *out, const REAL *x, const REAL *z, const REAL *w, int T, int C, REAL eps) {
#pragma omp parallel for if(parallel: (size_t)T * C >= PARALLEL_MIN) schedule(static)
    for (int t = 0; t < T; t++) {
        const REAL *xt = x + (size_t)t * C, *zt = z + (size_t)t * C;
        REAL ss = 0;
        for (int i = 0; i < C; i++) ss += xt[i] * xt[i];
        const REAL r = 1 / sqrt(ss / C + eps);
        for (int i = 0; i < C; i++) out[(size_t)t * C + i] = w[i] * xt[i] * r * (zt[i] / (1 + EXPR(-zt[i])));
    }
}

/* y = w x r silu(z), r = (mean x^2 + eps)^-1/2 */
trill_status KN(trill_rmsnorm_gated_backward)(REAL *dx, REAL *dz, REAL *dw, const REAL *dout, const REAL *x, const REAL *z, const REAL *w, int T,
                                              int C, REAL eps) {
    REAL *dw_all = NULL;
    int threads = 1;
    if (dw) {
        threads = omp_get_max_threads();
        if (!(dw_all = calloc((size_t)threads * C, sizeof(REAL))))
            return trill_error(TRILL_ERR_NOMEM, "gated RMSNorm backward: out of memory for the weight's partial sums");
    }
#pragma omp parallel num_threads(threads)
    {
        REAL *dwt = dw_all ? dw_all + (size_t)omp_get_thread_num() * C : NULL;
#pragma omp for schedule(static)
        for (int t = 0; t < T; t++) {
            const REAL *xt = x + (size_t)t * C, *zt = z + (size_t)t * C, *dy = dout + (size_t)t * C;
            REAL ss = 0, dot = 0;
            for (int i = 0; i < C; i++) ss += xt[i] * xt[i];
            const REAL r = 1 / sqrt(ss / C + eps);
            for (int i = 0; i < C; i++) {
                const REAL sg = 1 / (1 + EXPR(-zt[i])), silu = zt[i] * sg, dn = dy[i] * w[i] * silu; /* d(x r) */
                dot += dn * xt[i];
                if (dz) dz[(size_t)t * C + i] += dy[i] * w[i] * xt[i] * r * sg * (1 + zt[i] * (1 - sg));
                if (dwt) dwt[i] += dy[i] * xt[i] * r * silu;
            }
            for (int i = 0; i < C; i++) { /* d(x r)/dx = r dn - r^3 (x . dn) x / C */
                const REAL silu = zt[i] / (1 + EXPR(-zt[i]));
                dx[(size_t)t * C + i] += r * dy[i] * w[i] * silu - r * r * r * dot * xt[i] / C;
            }
        }
    }
    if (dw_all) {
        for (int th = 0; th < threads; th++)
            for (int i = 0; i < C; i++) dw[i] += dw_all[(size_t)th * C + i];
        free(dw_all);
    }
    return TRILL_OK;
}
