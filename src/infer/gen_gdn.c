/* The generator's Gated DeltaNet layer (Qwen3-Next's linear attention; src/model/gdn.h for the
 * computation): a step's rows grouped into runs, each run one sequence's consecutive positions,
 * through the conv and the delta rule with the sequence's own state in place. A sequence keeps,
 * per linear layer, its conv state [C, K - 1] (the last inputs) and its recurrent state [nv, dk,
 * dv], in fp32 (seq.gdn); a run from position 0 starts them at zero (a new, preempted or
 * recomputed sequence), and a prompt's samples copy their parent's when they fork. The delta
 * rule is the recurrent form for every row, so a row's result does not depend on how its
 * sequence's positions were split into steps nor on its neighbours. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "arch/family.h"
#include "infer/gen_decoder.h"
#include "model/gdn.h"
#include "trill/kernels.h"

size_t trill_gen_gdn_layer_floats(const trill_config *c) {
    const trill_gdn_dims d = trill_gdn_dims_of(c);
    return (size_t)d.C * (d.K - 1) + (size_t)d.nv * d.dk * d.dv;
}

size_t trill_gen_gdn_state_floats(const trill_config *c) {
    size_t n = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n += trill_layer_desc_of(c, l).attention == TRILL_ATTENTION_GDN;
    return n * trill_gen_gdn_layer_floats(c);
}

trill_status trill_gen_gdn_alloc(trill_engine *e) {
    const trill_config *c = &e->c;
    gen_gdn *g = &S(e)->gdn;
    const trill_gdn_dims d = trill_gdn_dims_of(c);
    const size_t R = (size_t)e->rows.max, kd = (size_t)d.nk * d.dk, vd = (size_t)d.nv * d.dv;
    float **fl[] = { &g->qkvz, &g->ba, &g->mixed, &g->convo, &g->z, &g->beta, &g->g, &g->qc, &g->kc, &g->q, &g->k, &g->v, &g->o, &g->y };
    const size_t fn[] = { R * d.P, R * 2 * d.nv, R * d.C, R * d.C, R * vd, R * d.nv, R * d.nv, R * kd, R * kd, R * d.nv * d.dk,
                          R * d.nv * d.dk, R * vd, R * vd, R * vd };
    bool ok = (g->ordinal = trill_malloc(sizeof(int) * (size_t)c->num_hidden_layers)) != NULL;
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) ok &= (*fl[i] = trill_malloc(fn[i] * sizeof(float))) != NULL;
    ok &= (g->offsets = trill_malloc(sizeof(int) * (R + 1))) != NULL;
    ok &= (g->conv = trill_malloc(sizeof(float *) * R)) != NULL && (g->rec = trill_malloc(sizeof(float *) * R)) != NULL;
    if (!ok) return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's Gated DeltaNet buffers (%d rows)", e->rows.max);
    for (int l = 0, n = 0; l < c->num_hidden_layers; l++)
        g->ordinal[l] = trill_layer_desc_of(c, l).attention == TRILL_ATTENTION_GDN ? n++ : -1;
    return TRILL_OK;
}

void trill_gen_gdn_free(gen_gdn *g) {
    float *fl[] = { g->qkvz, g->ba, g->mixed, g->convo, g->z, g->beta, g->g, g->qc, g->kc, g->q, g->k, g->v, g->o, g->y };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) free(fl[i]);
    free(g->ordinal);
    free(g->offsets);
    free(g->conv);
    free(g->rec);
}

trill_status trill_gen_gdn(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int l, int R) {
    const trill_config *c = &e->c;
    gen_state *f = S(e);
    gen_gdn *g = &f->gdn;
    const trill_gdn_dims d = trill_gdn_dims_of(c);
    const size_t per_layer = trill_gen_gdn_layer_floats(c), conv_n = (size_t)d.C * (d.K - 1);
    const bool split = L->m[TRILL_ROLE_GDN_QKV].N > 0; /* Qwen3.5: each part its own projection */
#define LIN(role, y) trill_gen_linear(e, &f->lora, &L->m[role], &A->m[role], GEN_STEP_ROWS, y, f->xn, R, 0)
    trill_status st = split ? LIN(TRILL_ROLE_GDN_QKV, g->mixed) : LIN(TRILL_ROLE_GDN_QKVZ, g->qkvz);
    if (!st) st = split ? LIN(TRILL_ROLE_GDN_Z, g->z) : LIN(TRILL_ROLE_GDN_BA, g->ba);
    if (!st && split && !(st = LIN(TRILL_ROLE_GDN_B, g->beta))) st = LIN(TRILL_ROLE_GDN_A, g->g);
#undef LIN
    if (st) return st;
    /* the runs: each sequence's rows are consecutive, positions ascending */
    int n = 0;
    for (int r = 0; r < R; r++) {
        if (r > 0 && e->rows.seq[r] == e->rows.seq[r - 1]) continue;
        seq *s = e->rows.seq[r];
        float *state = s->gdn + (size_t)g->ordinal[l] * per_layer;
        if (e->rows.pos[r] == 0) memset(state, 0, per_layer * sizeof(float)); /* from the start: no state yet */
        g->offsets[n] = r;
        g->conv[n] = state;
        g->rec[n++] = state + conv_n;
    }
    g->offsets[n] = R;
    if (!split) trill_gdn_split(&d, g->qkvz, g->ba, R, g->mixed, g->z, g->beta, g->g);
    eng_phase(e, TRILL_PHASE_ATTENTION);
    trill_conv1d_causal_forward_states(g->convo, g->mixed, L->vec[TRILL_ROLE_GDN_CONV], g->conv, g->offsets, n, d.C, d.K);
    trill_gdn_qkv(&d, g->convo, R, g->qc, g->kc, g->q, g->k, g->v);
    trill_gdn_gates(&d, g->g, g->beta, L->vec[TRILL_ROLE_GDN_A_LOG], L->vec[TRILL_ROLE_GDN_DT_BIAS], R, g->g, g->beta);
    trill_gdn_recurrent_forward_states(g->o, g->q, g->k, g->v, g->g, g->beta, g->rec, g->offsets, n, d.nv, d.dk, d.dv);
    eng_count_attention_flops(e, 6.0 * d.dk * d.dv * d.nv * R); /* a step of the recurrence: decay and S^T k, the outer product, S^T q */
    trill_rmsnorm_gated_forward(g->y, g->o, g->z, L->vec[TRILL_ROLE_GDN_NORM], R * d.nv, d.dv, (float)c->rms_norm_eps);
    eng_phase(e, TRILL_PHASE_PROJECT);
    return trill_gen_linear(e, &f->lora, &L->m[TRILL_ROLE_GDN_OUT], &A->m[TRILL_ROLE_GDN_OUT], GEN_STEP_ROWS, f->out, g->y, R, 0);
}
