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

/* ---- the chunked form (the WY form of HF's torch_chunk_gated_delta_rule, chunks of GDN_CHUNK) ----
 *
 * Per chunk of c <= GDN_CHUNK positions, from the state S before it, with G_i the cumulative log
 * decay within the chunk (G_i = g_0 + ... + g_i), M_ij = exp(G_i - G_j) (j <= i):
 *   L_ij = beta_i (k_i . k_j) M_ij (j < i);  (I + L) U' = beta v;  (I + L) W = beta exp(G) k;
 *   U = U' - W S                                       (the chunk's u_t, as the recurrence's)
 *   O = diag(exp G) Q S + P U,   P_ij = (q_i . k_j) M_ij (j <= i)
 *   S = exp(G_last) S + Kd^T U,  Kd_i = exp(G_last - G_i) k_i.
 * Every product is a GEMM (the triangular systems a TRSM) over the chunk's rows; the backward
 * differentiates these equations chunk by chunk, last to first, from the state before each chunk
 * (kept by a forward pass). exp(G_i - G_j) <= 1 and exp(G_i) <= 1: nothing is divided. */

/* One head's chunk scratch (gdn_chunk_ws_size REALs): the prepared chunk and, for the backward,
 * the gradients' buffers. */
typedef struct KN(gdn_ws) {
    REAL *eG, *eD, *bt, *dG;          /* [C]: exp(G_i), exp(G_last - G_i), beta, the gradient of G */
    REAL *M, *Le, *L, *P, *dP;        /* [C, C]: M, (k_i . k_j) M_ij, L, P; dP the backward's */
    REAL *W, *Kd, *dKb, *dQe;         /* [C, dk] */
    REAL *Up, *U, *dU, *dVb;          /* [C, dv] */
} KN(gdn_ws);

static size_t KN(gdn_ws_size)(int dk, int dv) {
    const size_t C = GDN_CHUNK;
    return 4 * C + 5 * C * C + 4 * C * (size_t)dk + 4 * C * (size_t)dv;
}

static void KN(gdn_ws_init)(KN(gdn_ws) *w, REAL *p, int dk, int dv) {
    const size_t C = GDN_CHUNK;
    REAL **const c1[] = { &w->eG, &w->eD, &w->bt, &w->dG }, **const c2[] = { &w->M, &w->Le, &w->L, &w->P, &w->dP };
    REAL **const ck[] = { &w->W, &w->Kd, &w->dKb, &w->dQe }, **const cv[] = { &w->Up, &w->U, &w->dU, &w->dVb };
    for (int i = 0; i < 4; i++) *c1[i] = p, p += C;
    for (int i = 0; i < 5; i++) *c2[i] = p, p += C * C;
    for (int i = 0; i < 4; i++) *ck[i] = p, p += C * (size_t)dk;
    for (int i = 0; i < 4; i++) *cv[i] = p, p += C * (size_t)dv;
}

#define GDN_MM(ta, tb, m, n, kk, alpha, A, lda, B, ldb, beta, Cm, ldc)                                                              \
    GEMM(CblasRowMajor, Cblas##ta, Cblas##tb, m, n, kk, alpha, A, (int)(lda), B, (int)(ldb), beta, Cm, (int)(ldc))

/* A chunk of c rows (q, k at stride sk, v at sv, g and beta at sg) from the state S: eG, eD, bt,
 * M, Le, L, P (zero above the diagonal), W, Up and U; and Kd. */
static void KN(gdn_chunk_prep)(const KN(gdn_ws) *w, int c, const REAL *q, const REAL *k, const REAL *v, const REAL *g, const REAL *beta,
                               size_t sk, size_t sv, size_t sg, int dk, int dv, const REAL *S) {
    const int C = GDN_CHUNK;
    /* G in double: over a chunk of strong decay it reaches -1e3 and more, where float's G_i - G_j
     * would lose the digits of exp(G_i - G_j) between near positions (1e-4 of it at -1e3) */
    double G[GDN_CHUNK], acc = 0;
    for (int i = 0; i < c; i++) {
        G[i] = acc += (double)g[(size_t)i * sg];
        w->bt[i] = beta[(size_t)i * sg];
        w->eG[i] = KN(exp_nonpos)((REAL)G[i]);
    }
    for (int i = 0; i < c; i++) w->eD[i] = KN(exp_nonpos)((REAL)(G[c - 1] - G[i]));
    GDN_MM(NoTrans, Trans, c, c, dk, 1, k, sk, k, sk, 0, w->Le, C);
    GDN_MM(NoTrans, Trans, c, c, dk, 1, q, sk, k, sk, 0, w->P, C);
    for (int i = 0; i < c; i++) {
        REAL *Mi = w->M + (size_t)i * C, *Pi = w->P + (size_t)i * C, *Lei = w->Le + (size_t)i * C, *Li = w->L + (size_t)i * C;
        for (int j = 0; j <= i; j++) {
            Mi[j] = KN(exp_nonpos)((REAL)(G[i] - G[j]));
            Pi[j] *= Mi[j];
            Lei[j] *= Mi[j];
            Li[j] = w->bt[i] * Lei[j];
        }
        for (int j = i + 1; j < c; j++) Pi[j] = 0;
    }
    for (int i = 0; i < c; i++) {
        const REAL *ki = k + (size_t)i * sk, *vi = v + (size_t)i * sv, bk = w->bt[i] * w->eG[i];
        for (int y = 0; y < dv; y++) w->Up[(size_t)i * dv + y] = w->bt[i] * vi[y];
        for (int x = 0; x < dk; x++) w->W[(size_t)i * dk + x] = bk * ki[x], w->Kd[(size_t)i * dk + x] = w->eD[i] * ki[x];
    }
    TRSM(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, c, dv, 1, w->L, C, w->Up, dv);
    TRSM(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, c, dk, 1, w->L, C, w->W, dk);
    memcpy(w->U, w->Up, sizeof(REAL) * (size_t)c * dv);
    GDN_MM(NoTrans, NoTrans, c, dv, dk, -1, w->W, dk, S, dv, 1, w->U, dv);
}

/* One head of one sequence: n steps from the state in S (overwritten with the final one); o
 * (NULL: not wanted) at stride sv. keep (NULL: none) gets the state before each chunk. */
static void KN(gdn_head_chunked)(REAL *S, REAL *o, const REAL *q, const REAL *k, const REAL *v, const REAL *g, const REAL *beta, int n,
                                 int dk, int dv, size_t sk, size_t sv, size_t sg, REAL *keep, const KN(gdn_ws) *w) {
    const int C = GDN_CHUNK;
    const size_t ss = (size_t)dk * dv;
    for (int t0 = 0; t0 < n; t0 += C) {
        const int c = n - t0 < C ? n - t0 : C;
        const REAL *qc = q + (size_t)t0 * sk, *kc = k + (size_t)t0 * sk;
        if (keep) memcpy(keep + (size_t)(t0 / C) * ss, S, sizeof(REAL) * ss);
        KN(gdn_chunk_prep)(w, c, qc, kc, v + (size_t)t0 * sv, g + (size_t)t0 * sg, beta + (size_t)t0 * sg, sk, sv, sg, dk, dv, S);
        if (o) {
            REAL *oc = o + (size_t)t0 * sv;
            GDN_MM(NoTrans, NoTrans, c, dv, dk, 1, qc, sk, S, dv, 0, oc, sv);
            for (int i = 0; i < c; i++)
                for (int y = 0; y < dv; y++) oc[(size_t)i * sv + y] *= w->eG[i];
            GDN_MM(NoTrans, NoTrans, c, dv, c, 1, w->P, C, w->U, dv, 1, oc, sv);
        }
        const REAL el = w->eG[c - 1];
        for (size_t x = 0; x < ss; x++) S[x] *= el;
        GDN_MM(Trans, NoTrans, dk, dv, c, 1, w->Kd, dk, w->U, dv, 1, S, dv);
    }
}

/* One chunk's backward, from its state before (S) and dS = the gradient of its state after,
 * made the gradient of S; adds into the chunk's rows of dq, dk, dv (strides sk, sv), dg, dbeta
 * (sg). */
static void KN(gdn_chunk_backward)(const KN(gdn_ws) *w, int c, REAL *dS, REAL *dq, REAL *dk_, REAL *dv_, REAL *dg, REAL *dbeta, const REAL *dO,
                                   const REAL *q, const REAL *k, const REAL *v, const REAL *g, const REAL *beta, size_t sk, size_t sv,
                                   size_t sg, int dk, int dv, const REAL *S) {
    const int C = GDN_CHUNK;
    const size_t ss = (size_t)dk * dv;
    KN(gdn_chunk_prep)(w, c, q, k, v, g, beta, sk, sv, sg, dk, dv, S);
    REAL *dG = w->dG;
    for (int i = 0; i < c; i++) dG[i] = 0;
    /* S_out = el S + Kd^T U:  dU = Kd dS (+ P^T dO below),  dKd = U dS^T,  d el = <S, dS> */
    const REAL el = w->eG[c - 1];
    GDN_MM(Trans, NoTrans, c, dv, c, 1, w->P, C, dO, sv, 0, w->dU, dv);
    GDN_MM(NoTrans, NoTrans, c, dv, dk, 1, w->Kd, dk, dS, dv, 1, w->dU, dv);
    REAL *dKd = w->dQe; /* [c, dk], used and done with before dQe */
    GDN_MM(NoTrans, Trans, c, dk, dv, 1, w->U, dv, dS, dv, 0, dKd, dk);
    REAL dGl = 0;
    for (size_t x = 0; x < ss; x++) dGl += S[x] * dS[x];
    dGl *= el;
    for (int i = 0; i < c; i++) { /* Kd_i = eD_i k_i, eD_i = exp(G_last - G_i) */
        const REAL *ki = k + (size_t)i * sk, *di = dKd + (size_t)i * dk;
        REAL *dki = dk_ + (size_t)i * sk, dot = 0;
        for (int x = 0; x < dk; x++) dot += ki[x] * di[x], dki[x] += w->eD[i] * di[x];
        dGl += w->eD[i] * dot;
        dG[i] -= w->eD[i] * dot;
    }
    /* O = diag(eG) Q S + P U:  dP = dO U^T;  P = (Q K^T) o M */
    REAL *dP = w->dP;
    GDN_MM(NoTrans, Trans, c, c, dv, 1, dO, sv, w->U, dv, 0, dP, C);
    for (int i = 0; i < c; i++) {
        REAL *dPi = dP + (size_t)i * C;
        const REAL *Pi = w->P + (size_t)i * C, *Mi = w->M + (size_t)i * C;
        for (int j = 0; j <= i; j++) {
            const REAL h = dPi[j] * Pi[j];
            dG[i] += h, dG[j] -= h;
            dPi[j] *= Mi[j];
        }
        for (int j = i + 1; j < c; j++) dPi[j] = 0;
    }
    GDN_MM(NoTrans, NoTrans, c, dk, c, 1, dP, C, k, sk, 1, dq, sk);
    GDN_MM(Trans, NoTrans, c, dk, c, 1, dP, C, q, sk, 1, dk_, sk);
    REAL *dQe = w->dQe; /* dO S^T */
    GDN_MM(NoTrans, Trans, c, dk, dv, 1, dO, sv, S, dv, 0, dQe, dk);
    for (int i = 0; i < c; i++) {
        const REAL *qi = q + (size_t)i * sk;
        REAL *di = dQe + (size_t)i * dk, *dqi = dq + (size_t)i * sk, dot = 0;
        for (int x = 0; x < dk; x++) dot += qi[x] * di[x], dqi[x] += w->eG[i] * di[x], di[x] = w->eG[i] * qi[x]; /* di: Qe from here */
        dG[i] += w->eG[i] * dot;
    }
    /* U = U' - W S:  dW = -dU S^T;  the state before: el dS + Qe^T dO - W^T dU */
    GDN_MM(NoTrans, Trans, c, dk, dv, -1, w->dU, dv, S, dv, 0, w->dKb, dk);
    for (size_t x = 0; x < ss; x++) dS[x] *= el;
    GDN_MM(Trans, NoTrans, dk, dv, c, 1, dQe, dk, dO, sv, 1, dS, dv);
    GDN_MM(Trans, NoTrans, dk, dv, c, -1, w->W, dk, w->dU, dv, 1, dS, dv);
    /* (I + L) U' = beta v, (I + L) W = Kb:  d(beta v) = (I + L)^-T dU',  dKb = (I + L)^-T dW,
     * dL = -(d(beta v) U'^T + dKb W^T) below the diagonal */
    memcpy(w->dVb, w->dU, sizeof(REAL) * (size_t)c * dv);
    TRSM(CblasRowMajor, CblasLeft, CblasLower, CblasTrans, CblasUnit, c, dv, 1, w->L, C, w->dVb, dv);
    TRSM(CblasRowMajor, CblasLeft, CblasLower, CblasTrans, CblasUnit, c, dk, 1, w->L, C, w->dKb, dk);
    REAL *E = dP; /* dL */
    GDN_MM(NoTrans, Trans, c, c, dv, -1, w->dVb, dv, w->Up, dv, 0, E, C);
    GDN_MM(NoTrans, Trans, c, c, dk, -1, w->dKb, dk, w->W, dk, 1, E, C);
    for (int i = 0; i < c; i++) {
        const REAL *vi = v + (size_t)i * sv, *ki = k + (size_t)i * sk, *dvb = w->dVb + (size_t)i * dv, *dkb = w->dKb + (size_t)i * dk;
        REAL *dvi = dv_ + (size_t)i * sv, *dki = dk_ + (size_t)i * sk, db = 0, dot = 0;
        const REAL b = w->bt[i], bk = b * w->eG[i];
        for (int y = 0; y < dv; y++) db += vi[y] * dvb[y], dvi[y] += b * dvb[y];
        for (int x = 0; x < dk; x++) dot += ki[x] * dkb[x], dki[x] += bk * dkb[x];
        db += w->eG[i] * dot;
        dG[i] += bk * dot;
        /* L_ij = beta_i Le_ij, Le_ij = (k_i . k_j) M_ij:  dbeta_i += E_ij Le_ij,  dG_i += E_ij L_ij,
         * dG_j -= E_ij L_ij;  F_ij = E_ij beta_i M_ij, d(k_i . k_j) */
        REAL *Ei = E + (size_t)i * C;
        const REAL *Lei = w->Le + (size_t)i * C, *Mi = w->M + (size_t)i * C;
        for (int j = 0; j < i; j++) {
            const REAL x = Ei[j] * Lei[j];
            db += x;
            dG[i] += b * x, dG[j] -= b * x;
            Ei[j] *= b * Mi[j];
        }
        for (int j = i; j < c; j++) Ei[j] = 0;
        dbeta[(size_t)i * sg] += db;
    }
    GDN_MM(NoTrans, NoTrans, c, dk, c, 1, E, C, k, sk, 1, dk_, sk);
    GDN_MM(Trans, NoTrans, c, dk, c, 1, E, C, k, sk, 1, dk_, sk);
    dG[c - 1] += dGl; /* G = cumsum(g) */
    REAL acc = 0;
    for (int i = c - 1; i >= 0; i--) dg[(size_t)i * sg] += acc += dG[i];
}

trill_status KN(trill_gdn_chunked_forward)(REAL *out, REAL *state_out, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                                           const REAL *beta, const REAL *state0, const int *offsets, int n_seqs, int nh, int dk, int dv) {
    const size_t sk = (size_t)nh * dk, sv = (size_t)nh * dv, ss = (size_t)dk * dv;
    int failed = 0;
    trill_kernels_blas_init(); /* each thread's GEMMs single-threaded */
#pragma omp parallel reduction(+ : failed)
    {
        REAL *S = malloc(sizeof(REAL) * (ss + KN(gdn_ws_size)(dk, dv)));
        failed += S == NULL;
        KN(gdn_ws) w;
        if (S) KN(gdn_ws_init)(&w, S + ss, dk, dv);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seqs; s++)
            for (int h = 0; h < nh; h++) {
                if (!S) continue;
                const size_t t0 = (size_t)offsets[s];
                if (state0) memcpy(S, state0 + ((size_t)s * nh + h) * ss, sizeof(REAL) * ss);
                else memset(S, 0, sizeof(REAL) * ss);
                KN(gdn_head_chunked)(S, out + t0 * sv + (size_t)h * dv, q + t0 * sk + (size_t)h * dk, k + t0 * sk + (size_t)h * dk,
                                     v + t0 * sv + (size_t)h * dv, g + t0 * nh + h, beta + t0 * nh + h, offsets[s + 1] - offsets[s], dk, dv, sk, sv,
                                     (size_t)nh, NULL, &w);
                if (state_out) memcpy(state_out + ((size_t)s * nh + h) * ss, S, sizeof(REAL) * ss);
            }
        free(S);
    }
    if (failed) return trill_error(TRILL_ERR_NOMEM, "gated delta rule (chunked): out of memory for a chunk's scratch");
    return TRILL_OK;
}

trill_status KN(trill_gdn_chunked_backward)(REAL *dq, REAL *dk, REAL *dv, REAL *dg, REAL *dbeta, REAL *dstate0, const REAL *dout,
                                            const REAL *dstate_out, const REAL *q, const REAL *k, const REAL *v, const REAL *g,
                                            const REAL *beta, const REAL *state0, const int *offsets, int n_seqs, int nh, int dk_, int dv_) {
    const size_t sk = (size_t)nh * dk_, sv = (size_t)nh * dv_, ss = (size_t)dk_ * dv_, C = GDN_CHUNK;
    int longest = 1, failed = 0;
    for (int s = 0; s < n_seqs; s++)
        if (offsets[s + 1] - offsets[s] > longest) longest = offsets[s + 1] - offsets[s];
    const size_t n_keep = ((size_t)longest + C - 1) / C;
    trill_kernels_blas_init(); /* each thread's GEMMs single-threaded */
#pragma omp parallel reduction(+ : failed)
    {
        /* per thread: the states before each chunk, dS, the chunk scratch */
        REAL *keep = malloc(sizeof(REAL) * (ss * (n_keep + 1) + KN(gdn_ws_size)(dk_, dv_)));
        failed += keep == NULL;
        REAL *dS = keep ? keep + n_keep * ss : NULL;
        KN(gdn_ws) w;
        if (keep) KN(gdn_ws_init)(&w, dS + ss, dk_, dv_);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seqs; s++)
            for (int h = 0; h < nh; h++) {
                if (!keep) continue;
                const size_t t0 = (size_t)offsets[s], kh = t0 * sk + (size_t)h * dk_, vh = t0 * sv + (size_t)h * dv_, gh = t0 * nh + h;
                const int n = offsets[s + 1] - offsets[s];
                /* the forward again, keeping the state before every chunk (dS its running state for now) */
                if (state0) memcpy(dS, state0 + ((size_t)s * nh + h) * ss, sizeof(REAL) * ss);
                else memset(dS, 0, sizeof(REAL) * ss);
                KN(gdn_head_chunked)(dS, NULL, q + kh, k + kh, v + vh, g + gh, beta + gh, n, dk_, dv_, sk, sv, (size_t)nh, keep, &w);
                if (dstate_out) memcpy(dS, dstate_out + ((size_t)s * nh + h) * ss, sizeof(REAL) * ss);
                else memset(dS, 0, sizeof(REAL) * ss);
                for (int c = (n - 1) / (int)C; n > 0 && c >= 0; c--) {
                    const size_t a = (size_t)c * C, ak = a * sk, av = a * sv, ag = a * nh;
                    const int len = n - (int)a < (int)C ? n - (int)a : (int)C;
                    KN(gdn_chunk_backward)(&w, len, dS, dq + kh + ak, dk + kh + ak, dv + vh + av, dg + gh + ag, dbeta + gh + ag, dout + vh + av,
                                           q + kh + ak, k + kh + ak, v + vh + av, g + gh + ag, beta + gh + ag, sk, sv, (size_t)nh, dk_, dv_,
                                           keep + (size_t)c * ss);
                }
                if (dstate0)
                    for (size_t x = 0; x < ss; x++) dstate0[((size_t)s * nh + h) * ss + x] += dS[x];
            }
        free(keep);
    }
    if (failed) return trill_error(TRILL_ERR_NOMEM, "gated delta rule backward (chunked): out of memory for the kept states (%zu per head)", n_keep);
    return TRILL_OK;
}
#undef GDN_MM

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
