/* Adapters and live updates (engine_internal.h). Adapters are LoRA on the side of the base
 * weights (y = W x + s B (A x), gen matrices in the adapter format, the A of a fused matrix's
 * parts stacked).
 * An update, adapters or merged weights, is built in the caller's thread, posted to the mailbox
 * (a newer one replaces one not yet taken) and taken whole at the start of the next step. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "infer/engine_internal.h"
#include "base/alloc.h"

/* ---- adapters ---- */

static void free_lora(eng_lora *el) {
    trill_gen_matrix_free(&el->A);
    for (int a = 0; a < 3; a++) trill_gen_matrix_free(&el->B[a]);
    *el = (eng_lora){ 0 };
}

static void free_lora_slots(const trill_config *c, eng_lora_layer *L) {
    for (int r = 0; r < ENG_MAX_ROLES; r++) {
        free_lora(&L->m[r]);
        for (int x = 0; L->experts[r] && x < c->num_experts; x++) free_lora(&L->experts[r][x]);
        free(L->experts[r]);
    }
    for (int h = 0; h < ENG_HEAD_SLOTS; h++) {
        eng_head_lora *hl = &L->heads[h];
        for (int x = 0; hl->shrink && x < (hl->shrink_per_head ? c->num_attention_heads : 1); x++) trill_gen_matrix_free(&hl->shrink[x]);
        for (int x = 0; hl->expand && x < (hl->expand_per_head ? c->num_attention_heads : 1); x++) trill_gen_matrix_free(&hl->expand[x]);
        free(hl->shrink);
        free(hl->expand);
    }
}

trill_gen_format trill_eng_adapter_format(trill_gen_format weights) { return weights == TRILL_GEN_F32 ? TRILL_GEN_F32 : TRILL_GEN_BF16; }

void trill_eng_free_adapter(const trill_config *c, eng_adapter *ad) {
    if (!ad) return;
    for (int l = 0; ad->layers && l < c->num_hidden_layers; l++) free_lora_slots(c, &ad->layers[l]);
    free(ad->layers);
    free_lora_slots(c, &ad->global);
    free(ad);
}

/* The adapter of a matrix made of n_parts modules of cols[p] outputs each (pairs[p].A NULL:
 * that module has no adapter). */
static trill_status make_lora(eng_lora *el, const trill_lora_pair *pairs, const int *cols, int n_parts, int K, eng_adapter *ad) {
    const int r = ad->rank;
    if (n_parts < 1 || n_parts > ENG_MAX_PARTS) return trill_error(TRILL_ERR_INVALID, "engine: a matrix of %d parts", n_parts);
    int na = 0;
    for (int p = 0; p < n_parts; p++) na += pairs[p].A != NULL;
    if (na == 0) return TRILL_OK;
    float *A = trill_malloc(sizeof(float) * (size_t)na * r * K);
    if (!A) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    for (int p = 0, a = 0, col = 0; p < n_parts; col += cols[p], p++) {
        if (!pairs[p].A) continue;
        memcpy(A + (size_t)a * r * K, pairs[p].A, sizeof(float) * (size_t)r * K);
        if (!st && !(st = trill_gen_matrix_create(&el->B[a], ad->format, pairs[p].B, NULL, cols[p], r))) ad->resident += el->B[a].bytes;
        el->col0[a] = col;
        el->cols[a] = cols[p];
        ad->bytes += sizeof(float) * ((size_t)r * K + (size_t)cols[p] * r);
        a++;
    }
    if (!st && !(st = trill_gen_matrix_create(&el->A, ad->format, A, NULL, na * r, K))) ad->resident += el->A.bytes;
    free(A);
    el->n_adapted = na;
    return st;
}

typedef struct adapter_build {
    eng_adapter *ad;
    const trill_engine *e;
    const trill_lora_pair *pair_of; /* [model tensor] its adapter, A NULL when none */
} adapter_build;

/* The adapter of one engine matrix: its parts' pairs, stacked as the matrix stacks the parts. */
static trill_status adapt_matrix(void *ctx, const eng_group *g) {
    adapter_build *b = ctx;
    const trill_config *c = &b->e->c;
    trill_lora_pair pairs[ENG_MAX_PARTS] = { 0 };
    int cols[ENG_MAX_PARTS] = { 0 }, n_adapted = 0;
    for (int p = 0; p < g->n_parts; p++) {
        pairs[p] = b->pair_of[g->parts[p]];
        cols[p] = (int)b->e->tensors[g->parts[p]].shape[0];
        n_adapted += pairs[p].A != NULL;
    }
    eng_lora_layer *L = g->layer >= 0 ? &b->ad->layers[g->layer] : &b->ad->global;
    eng_lora *dst = &L->m[g->role];
    if (g->expert >= 0) { /* every expert of the role gets a slot (n_adapted 0 where none) */
        if (!L->experts[g->role] && !(L->experts[g->role] = trill_calloc((size_t)c->num_experts, sizeof(eng_lora))))
            return trill_error(TRILL_ERR_NOMEM, "out of memory");
        dst = &L->experts[g->role][g->expert];
    }
    if (!n_adapted) return TRILL_OK;
    return make_lora(dst, pairs, cols, g->n_parts, (int)b->e->tensors[g->parts[0]].shape[1], b->ad);
}

static trill_status fill_adapter(eng_adapter *ad, const trill_engine *e, const trill_lora *lora) {
    const trill_config *c = &e->c;
    ad->rank = lora->config.rank;
    ad->scale = lora->scale;
    ad->format = trill_eng_adapter_format(e->cfg.format);
    if (!(ad->layers = trill_calloc((size_t)c->num_hidden_layers, sizeof *ad->layers))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_lora_pair *pair_of = trill_calloc(e->n_tensors ? e->n_tensors : 1, sizeof *pair_of);
    if (!pair_of) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = TRILL_OK;
    for (size_t t = 0; t + 1 < lora->n_tensors && !st; t += 2) { /* A, then B, of the weight at index */
        const trill_param *A = &lora->tensors[t];
        if (A->index < 0 || (size_t)A->index >= e->n_tensors || A->shape[1] != e->tensors[A->index].shape[1])
            st = trill_error(TRILL_ERR_INVALID, "engine: adapter %s was not made for this model", A->name);
        else pair_of[A->index] = (trill_lora_pair){ A->data, lora->tensors[t + 1].data };
    }
    adapter_build b = { .ad = ad, .e = e, .pair_of = pair_of };
    if (!st) st = trill_eng_for_each_matrix(c, e->tensors, e->n_tensors, adapt_matrix, &b);
    free(pair_of);
    return st;
}

static trill_status build_adapter(const trill_engine *e, const trill_lora *lora, eng_adapter **out) {
    eng_adapter *ad = trill_calloc(1, sizeof *ad);
    if (!ad) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_status st = fill_adapter(ad, e, lora);
    if (!st) st = e->fam->derive_adapter(e, lora, ad);
    if (st) {
        trill_eng_free_adapter(&e->c, ad);
        return st;
    }
    *out = ad;
    return TRILL_OK;
}

/* ---- the layout ---- */

static trill_status layout_matrix(void *ctx, const eng_group *g) {
    trill_engine *e = ctx;
    eng_lora_layer *L = g->layer >= 0 ? &e->layout->layers[g->layer] : &e->layout->global;
    eng_lora *dst = &L->m[g->role];
    if (g->expert >= 0) {
        if (!L->experts[g->role] && !(L->experts[g->role] = trill_calloc((size_t)e->c.num_experts, sizeof(eng_lora))))
            return trill_error(TRILL_ERR_NOMEM, "out of memory");
        dst = &L->experts[g->role][g->expert];
    }
    dst->layer = g->layer, dst->role = g->role, dst->expert = g->expert;
    return TRILL_OK;
}

trill_status trill_eng_build_layout(trill_engine *e) {
    const trill_config *c = &e->c;
    eng_adapter *lay = trill_calloc(1, sizeof *lay);
    if (!lay || !(lay->layers = trill_calloc((size_t)c->num_hidden_layers, sizeof *lay->layers))) {
        free(lay);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    e->layout = lay;
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int h = 0; h < ENG_HEAD_SLOTS; h++) lay->layers[l].heads[h].layer = l, lay->layers[l].heads[h].slot = h;
    return trill_eng_for_each_matrix(c, e->tensors, e->n_tensors, layout_matrix, e);
}

int trill_eng_max_rank(const trill_engine *e) {
    int r = e->ad ? e->ad->rank : 0;
    for (int k = 1; e->n_slots && k < TRILL_ENGINE_ADAPTER_SLOTS; k++)
        if (e->slots[k] && e->slots[k]->rank > r) r = e->slots[k]->rank;
    return r;
}

/* ---- live updates ---- */

/* Takes a waiting weight update: the step about to run sees all of it, and nothing before did. */
trill_status trill_eng_take_update(trill_engine *e) {
    pthread_mutex_lock(&e->update.lock);
    eng_weights *w = NULL;
    eng_adapter *ad = NULL;
    bool has_w = false, has_ad = false, pending = e->update.pending;
    uint32_t version = e->update.version;
    if (pending) {
        has_w = e->update.has_w;
        has_ad = e->update.has_ad;
        w = e->update.w;
        ad = e->update.ad;
        e->update.pending = e->update.has_w = e->update.has_ad = false;
        e->update.w = NULL;
        e->update.ad = NULL;
    }
    pthread_mutex_unlock(&e->update.lock);
    if (!pending) return TRILL_OK;
    const int rank = trill_eng_max_rank(e);
    trill_status st = ad ? e->fam->ensure_lora_buffers(e, ad->rank > rank ? ad->rank : rank) : TRILL_OK;
    if (st) { /* the old weights stay; the update waits for the next step, unless a newer one came */
        pthread_mutex_lock(&e->update.lock);
        if (!e->update.pending) {
            e->update.pending = true;
            e->update.has_w = has_w;
            e->update.has_ad = has_ad;
            e->update.w = w;
            e->update.ad = ad;
            e->update.version = version;
            w = NULL;
            ad = NULL;
        }
        pthread_mutex_unlock(&e->update.lock);
        trill_eng_free_weights(&e->c, w);
        trill_eng_free_adapter(&e->c, ad);
        return st;
    }
    if (has_w) {
        trill_eng_free_weights(&e->c, e->w);
        e->w = w;
        if (e->ep) trill_eng_ep_place(e); /* merged weights come whole: keep this rank's experts */
    }
    if (has_ad) {
        trill_eng_free_adapter(&e->c, e->ad);
        e->ad = ad;
    }
    e->version = version;
    return TRILL_OK;
}

/* Queues an update for the next step; a newer one replaces one not yet taken. */
static void post_update(trill_engine *e, bool has_w, eng_weights *w, bool has_ad, eng_adapter *ad, uint32_t version) {
    pthread_mutex_lock(&e->update.lock);
    if (has_w) {
        if (e->update.w) trill_eng_free_weights(&e->c, e->update.w);
        e->update.w = w;
        e->update.has_w = true;
    }
    if (has_ad) {
        if (e->update.ad) trill_eng_free_adapter(&e->c, e->update.ad);
        e->update.ad = ad;
        e->update.has_ad = true;
    }
    e->update.version = version;
    e->update.pending = true;
    pthread_mutex_unlock(&e->update.lock);
}

static trill_status same_architecture(const trill_config *a, const trill_config *b) {
    if (a->hidden_size != b->hidden_size || a->num_hidden_layers != b->num_hidden_layers || a->vocab_size != b->vocab_size ||
        a->num_attention_heads != b->num_attention_heads || a->num_key_value_heads != b->num_key_value_heads ||
        a->head_dim != b->head_dim || a->intermediate_size != b->intermediate_size || a->num_experts != b->num_experts ||
        a->moe_intermediate_size != b->moe_intermediate_size || a->n_moe_layers != b->n_moe_layers || a->arch != b->arch ||
        a->q_lora_rank != b->q_lora_rank || a->kv_lora_rank != b->kv_lora_rank || a->qk_nope_head_dim != b->qk_nope_head_dim ||
        a->qk_rope_head_dim != b->qk_rope_head_dim || a->v_head_dim != b->v_head_dim || a->n_shared_experts != b->n_shared_experts)
        return trill_error(TRILL_ERR_INVALID, "weight update: the model's architecture differs from the engine's");
    for (int l = 0; l < a->num_hidden_layers; l++)
        if (a->moe_ordinal[l] != b->moe_ordinal[l])
            return trill_error(TRILL_ERR_INVALID, "weight update: layer %d is %s in the update but %s in the engine", l,
                               b->moe_ordinal[l] >= 0 ? "MoE" : "dense", a->moe_ordinal[l] >= 0 ? "MoE" : "dense");
    return TRILL_OK;
}

trill_status trill_engine_update_weights(trill_engine *e, const trill_model *m, uint32_t version, size_t *bytes) {
    if (m->expert_count < m->config.num_experts || m->tp_size > 1)
        return trill_error(TRILL_ERR_UNSUPPORTED, "weight update: the model is a shard (experts %d-%d of %d, tensor-parallel share %d of %d), "
                           "not the whole model", m->expert_first, m->expert_first + m->expert_count - 1, m->config.num_experts, m->tp_rank,
                           m->tp_size);
    trill_status st = same_architecture(&e->c, &m->config);
    if (!st && (st = trill_model_check_finite(m))) trill_error_context("engine");
    eng_weights *w = NULL;
    if (!st) st = trill_eng_build_weights(&e->c, e->cfg.format, m, &w);
    if (st) return st;
    if (bytes) *bytes = w->bytes;
    post_update(e, true, w, false, NULL, version);
    return TRILL_OK;
}

size_t trill_engine_adapter_bytes(const trill_engine *e) { return e->ad ? e->ad->resident : 0; }

/* An adapter for e from lora (NULL: none), checked. */
static trill_status adapter_from(const trill_engine *e, const trill_lora *lora, const char *what, eng_adapter **ad) {
    *ad = NULL;
    if (!lora) return TRILL_OK;
    if (lora->config.rank < 1) return trill_error(TRILL_ERR_INVALID, "%s: rank %d", what, lora->config.rank);
    if (!trill_lora_is_whole(lora))
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: the adapters are a shard's (%zu of the whole adapter's %zu values)", what, lora->n_params,
                           lora->n_global);
    trill_status st = trill_lora_check_finite(lora);
    if (st) trill_error_context("engine");
    return st ? st : build_adapter(e, lora, ad);
}

trill_status trill_engine_update_adapter(trill_engine *e, const trill_lora *lora, uint32_t version, size_t *bytes) {
    eng_adapter *ad = NULL;
    trill_status st = adapter_from(e, lora, "adapter update", &ad);
    if (st) return st;
    if (bytes) *bytes = ad ? ad->bytes : 0;
    post_update(e, false, NULL, true, ad, version);
    return TRILL_OK;
}

trill_status trill_engine_set_adapter(trill_engine *e, int slot, const trill_lora *lora, size_t *bytes) {
    if (slot < 1 || slot >= TRILL_ENGINE_ADAPTER_SLOTS)
        return trill_error(TRILL_ERR_INVALID, "adapter slot %d: expected 1 to %d (slot 0 is the engine's own: trill_engine_update_adapter)", slot,
                           TRILL_ENGINE_ADAPTER_SLOTS - 1);
    if (e->ep) return trill_error(TRILL_ERR_UNSUPPORTED, "adapter slots: not with expert parallelism across ranks");
    for (int i = 0; i < e->sched.n_reqs; i++)
        if (e->sched.reqs[i]->r.adapter == slot)
            return trill_error(TRILL_ERR_INVALID, "adapter slot %d: request %llu still uses it", slot, (unsigned long long)e->sched.reqs[i]->r.id);
    eng_adapter *ad = NULL;
    char what[48];
    snprintf(what, sizeof what, "adapter slot %d", slot);
    trill_status st = adapter_from(e, lora, what, &ad);
    const int rank = trill_eng_max_rank(e);
    if (!st && ad) st = e->fam->ensure_lora_buffers(e, ad->rank > rank ? ad->rank : rank);
    if (st) { trill_eng_free_adapter(&e->c, ad); return st; }
    e->n_slots += (ad != NULL) - (e->slots[slot] != NULL);
    trill_eng_free_adapter(&e->c, e->slots[slot]);
    e->slots[slot] = ad;
    if (bytes) *bytes = ad ? ad->resident : 0;
    return TRILL_OK;
}
