/* The engine's weights (engine_internal.h): conversion from a trill_model into the engine's format
 * (q/k/v and gate/up fused into one matrix each; int8 keeps the router and lm_head in bf16), the
 * refusal of non-finite weights, freeing, and what a decode step reads (benchmarks). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "infer/engine_internal.h"
#include "trill/kernels.h"

/* One generator matrix from the row-wise concatenation of parts (all [rows_i, K], same storage). */
static trill_status make_matrix(gen_matrix *g, trill_gen_format f, const trill_weight *parts, const int *rows, int n_parts, int K) {
    int N = 0;
    for (int i = 0; i < n_parts; i++) N += rows[i];
    if (n_parts == 1) return gen_matrix_create(g, f, parts[0].f32, parts[0].bf16, N, K);
    const bool half = parts[0].bf16 != NULL;
    const size_t elem = half ? sizeof(uint16_t) : sizeof(float);
    char *buf = malloc((size_t)N * K * elem), *at = buf;
    if (!buf) return trill_error(TRILL_ERR_NOMEM, "out of memory converting weights");
    for (int i = 0; i < n_parts; i++) {
        memcpy(at, half ? (const void *)parts[i].bf16 : (const void *)parts[i].f32, (size_t)rows[i] * K * elem);
        at += (size_t)rows[i] * K * elem;
    }
    trill_status st = gen_matrix_create(g, f, half ? NULL : (const float *)buf, half ? (const uint16_t *)buf : NULL, N, K);
    free(buf);
    return st;
}

static float *copy_floats(const float *src, size_t n) {
    float *p = malloc(n * sizeof(float));
    if (p) memcpy(p, src, n * sizeof(float));
    return p;
}

void eng_free_weights(const trill_config *c, eng_weights *w) {
    if (!w) return;
    for (int l = 0; w->layers && l < c->num_hidden_layers; l++) {
        eng_layer *L = &w->layers[l];
        free(L->input_norm); free(L->q_norm); free(L->k_norm); free(L->post_norm);
        gen_matrix_free(&L->qkv); gen_matrix_free(&L->o); gen_matrix_free(&L->gate_up); gen_matrix_free(&L->down);
        gen_matrix_free(&L->router);
        for (int x = 0; L->experts_gate_up && x < c->num_experts; x++) {
            gen_matrix_free(&L->experts_gate_up[x]);
            gen_matrix_free(&L->experts_down[x]);
        }
        free(L->experts_gate_up);
        free(L->experts_down);
    }
    free(w->layers);
    gen_matrix_free(&w->lm_head);
    free(w->final_norm); free(w->embed_f32); free(w->embed_bf16);
    free(w);
}

/* Layer l of m in format f (fine: the format of the router). */
static trill_status fill_layer(eng_layer *L, const trill_layer_weights *mw, const trill_config *c, int l, trill_gen_format f,
                               trill_gen_format fine) {
    const int H = c->hidden_size, hd = c->head_dim, qd = c->num_attention_heads * hd, kvd = c->num_key_value_heads * hd;
    L->input_norm = copy_floats(mw->input_norm, (size_t)H);
    L->post_norm = copy_floats(mw->post_norm, (size_t)H);
    L->q_norm = copy_floats(mw->q_norm, (size_t)hd);
    L->k_norm = copy_floats(mw->k_norm, (size_t)hd);
    if (!L->input_norm || !L->post_norm || !L->q_norm || !L->k_norm) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    const trill_weight qkv[3] = { mw->wq, mw->wk, mw->wv };
    const int qkv_rows[3] = { qd, kvd, kvd };
    trill_status st;
    if ((st = make_matrix(&L->qkv, f, qkv, qkv_rows, 3, H))) return st;
    if ((st = make_matrix(&L->o, f, &mw->wo, &H, 1, qd))) return st;
    if (trill_config_is_moe(c, l)) {
        const int E = c->num_experts, Im = c->moe_intermediate_size;
        if ((st = make_matrix(&L->router, fine, &mw->router, &E, 1, H))) return st;
        L->experts_gate_up = calloc((size_t)E, sizeof(gen_matrix));
        L->experts_down = calloc((size_t)E, sizeof(gen_matrix));
        if (!L->experts_gate_up || !L->experts_down) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        for (int x = 0; x < E && !st; x++) {
            const trill_weight gu[2] = { trill_weight_at(mw->expert_gate, (size_t)x * Im * H), trill_weight_at(mw->expert_up, (size_t)x * Im * H) };
            const int gu_rows[2] = { Im, Im };
            const trill_weight dn = trill_weight_at(mw->expert_down, (size_t)x * H * Im);
            if (!(st = make_matrix(&L->experts_gate_up[x], f, gu, gu_rows, 2, H))) st = make_matrix(&L->experts_down[x], f, &dn, &H, 1, Im);
        }
        return st;
    }
    const int I = c->intermediate_size;
    const trill_weight gu[2] = { mw->mlp_gate, mw->mlp_up };
    const int gu_rows[2] = { I, I };
    if (!(st = make_matrix(&L->gate_up, f, gu, gu_rows, 2, H))) st = make_matrix(&L->down, f, &mw->mlp_down, &H, 1, I);
    return st;
}

static trill_status fill_weights(eng_weights *w, const trill_config *c, trill_gen_format f, const trill_model *m) {
    const int H = c->hidden_size, hd = c->head_dim;
    /* int8 leaves the router and lm_head in bf16, as W8A8 serving does: routing and the output
     * distribution are the most sensitive to quantisation */
    const trill_gen_format fine = f == TRILL_GEN_INT8 ? TRILL_GEN_BF16 : f;
    if (!(w->layers = calloc((size_t)c->num_hidden_layers, sizeof *w->layers))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    for (int l = 0; l < c->num_hidden_layers && !st; l++) st = fill_layer(&w->layers[l], &m->layers[l], c, l, f, fine);
    if (st) return st;
    if ((st = make_matrix(&w->lm_head, fine, &m->lm_head, &c->vocab_size, 1, H))) return st;
    w->final_norm = copy_floats(m->final_norm, (size_t)H);
    const size_t table = (size_t)c->vocab_size * H;
    if (f == TRILL_GEN_F32) {
        if ((w->embed_f32 = malloc(table * sizeof(float))) && m->embed.f32) memcpy(w->embed_f32, m->embed.f32, table * sizeof(float));
        else if (w->embed_f32) bf16_widen(w->embed_f32, m->embed.bf16, table);
    } else if ((w->embed_bf16 = malloc(table * sizeof(uint16_t)))) {
        if (m->embed.bf16) memcpy(w->embed_bf16, m->embed.bf16, table * sizeof(uint16_t));
        else trill_from_f32(w->embed_bf16, m->embed.f32, TRILL_BF16, table);
    }
    if (!w->final_norm || (!w->embed_f32 && !w->embed_bf16)) return trill_error(TRILL_ERR_NOMEM, "out of memory");

    size_t bytes = w->lm_head.bytes + table * (f == TRILL_GEN_F32 ? 4 : 2) + (size_t)H * 4;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const eng_layer *L = &w->layers[l];
        bytes += L->qkv.bytes + L->o.bytes + L->gate_up.bytes + L->down.bytes + L->router.bytes + (size_t)(2 * H + 2 * hd) * 4;
        for (int x = 0; L->experts_gate_up && x < c->num_experts; x++) bytes += L->experts_gate_up[x].bytes + L->experts_down[x].bytes;
    }
    w->bytes = bytes;
    return TRILL_OK;
}

/* m's weights in `format`: m must have this engine's architecture. */
trill_status eng_build_weights(const trill_config *c, trill_gen_format format, const trill_model *m, eng_weights **out) {
    eng_weights *w = calloc(1, sizeof *w);
    if (!w) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = fill_weights(w, c, format, m);
    if (st) {
        eng_free_weights(c, w);
        return st;
    }
    *out = w;
    return TRILL_OK;
}

/* Weights that are not finite numbers are refused at the door: they would only make logits
 * nobody can sample from. bf16 NaN and infinity have every exponent bit set. */
trill_status eng_check_finite_model(const trill_model *m) {
    for (size_t k = 0; k < m->n_tensors; k++) {
        const trill_param *p = &m->tensors[k];
        for (size_t i = 0; i < p->numel; i++)
            if (p->data ? !isfinite(p->data[i]) : (p->bf16[i] & 0x7f80u) == 0x7f80u)
                return trill_error(TRILL_ERR_INVALID, "engine: weight %s[%zu] is not a finite number: refused", p->name, i);
    }
    return TRILL_OK;
}

/* Per decode token at batch 1, what the matrices cost: each used matrix's bytes (the bytes
 * one step streams) or 2 N K FLOPs. A MoE layer counts its top-k experts at the average size. */
static double per_token_cost(const trill_engine *e, bool flops) {
    const trill_config *c = &e->c;
    const eng_weights *w = e->w;
#define COST(mat) (flops ? 2.0 * (mat).N * (mat).K : (double)(mat).bytes)
    double total = COST(w->lm_head) + (double)c->hidden_size * (flops ? 0 : w->embed_f32 ? 4 : 2);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const eng_layer *L = &w->layers[l];
        total += COST(L->qkv) + COST(L->o);
        if (!trill_config_is_moe(c, l)) {
            total += COST(L->gate_up) + COST(L->down);
            continue;
        }
        double experts = 0;
        for (int x = 0; x < c->num_experts; x++) experts += COST(L->experts_gate_up[x]) + COST(L->experts_down[x]);
        total += COST(L->router) + experts / c->num_experts * c->num_experts_per_tok;
    }
#undef COST
    return total;
}

size_t trill_engine_decode_bytes(const trill_engine *e) { return (size_t)per_token_cost(e, false); }

double trill_engine_decode_flops(const trill_engine *e) { return per_token_cost(e, true); }
