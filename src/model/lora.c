#include "trill/lora.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"
#include "trill/json.h"
#include "trill/kernels.h"
#include "trill/rng.h"
#include "trill/safetensors.h"

static const char *const TARGET_NAMES[TRILL_LORA_N_TARGETS] = { "q_proj", "k_proj", "v_proj", "o_proj",
                                                                "gate_proj", "up_proj", "down_proj", "lm_head" };

int trill_lora_parse_targets(const char *list, unsigned *targets) {
    static const char *const SHORT[TRILL_LORA_N_TARGETS] = { "q", "k", "v", "o", "gate", "up", "down", "lm_head" };
    *targets = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        if (strcmp(tok, "all-linear") == 0) { *targets |= (1u << TRILL_LORA_LM_HEAD) - 1; continue; }
        int found = -1;
        for (int i = 0; i < TRILL_LORA_N_TARGETS; i++)
            if (strcmp(tok, SHORT[i]) == 0 || strcmp(tok, TARGET_NAMES[i]) == 0) found = i;
        if (found < 0) {
            trill_error(TRILL_ERR_INVALID, "lora.target_modules: unknown module \"%s\" (expected q, k, v, o, gate, up, down, lm_head or all-linear)", tok);
            return -1;
        }
        *targets |= 1u << found;
    }
    return 0;
}

/* ---- layout: one walk names every adapter tensor; with params NULL it only counts ---- */

typedef struct walk { trill_lora *lora; size_t offset, n; } walk;

static float *add(walk *w, int64_t rows, int64_t cols, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static float *add(walk *w, int64_t rows, int64_t cols, const char *fmt, ...) {
    float *data = w->lora->params ? w->lora->params + w->offset : NULL;
    if (w->lora->tensors) {
        trill_param *p = &w->lora->tensors[w->n];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->name, sizeof p->name, fmt, ap);
        va_end(ap);
        p->ndim = 2;
        p->shape[0] = rows;
        p->shape[1] = cols;
        p->data = data;
        p->numel = (size_t)(rows * cols);
    }
    w->offset += (size_t)(rows * cols);
    w->n++;
    return data;
}

/* The A and B of module `path` (e.g. "model.layers.3.self_attn.q_proj") if its kind is targeted. */
static trill_lora_pair pair(walk *w, trill_lora_target kind, int64_t in, int64_t out, const char *path) {
    trill_lora_pair p = { 0 };
    if (!(w->lora->config.targets & (1u << kind))) return p;
    const int64_t r = w->lora->config.rank;
    p.A = add(w, r, in, "base_model.model.%s.lora_A.weight", path);
    p.B = add(w, out, r, "base_model.model.%s.lora_B.weight", path);
    return p;
}

static void walk_layout(walk *w, const trill_config *c) {
    trill_lora *lora = w->lora;
    const int64_t H = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim,
                  kvd = (int64_t)c->num_key_value_heads * c->head_dim;
    char path[128];
    for (int l = 0; l < c->num_hidden_layers; l++) {
        trill_lora_layer *L = &lora->layers[l];
        const char *attn[4] = { "q_proj", "k_proj", "v_proj", "o_proj" };
        trill_lora_pair *slots[4] = { &L->q, &L->k, &L->v, &L->o };
        const int64_t ins[4] = { H, H, H, qd }, outs[4] = { qd, kvd, kvd, H };
        for (int i = 0; i < 4; i++) {
            snprintf(path, sizeof path, "model.layers.%d.self_attn.%s", l, attn[i]);
            *slots[i] = pair(w, (trill_lora_target)(TRILL_LORA_Q + i), ins[i], outs[i], path);
        }
        const char *mlp[3] = { "gate_proj", "up_proj", "down_proj" };
        if (trill_config_is_moe(c, l)) {
            const int64_t Im = c->moe_intermediate_size;
            trill_lora_pair *experts[3] = { L->expert_gate, L->expert_up, L->expert_down };
            for (int e = 0; e < c->num_experts; e++)
                for (int i = 0; i < 3; i++) {
                    snprintf(path, sizeof path, "model.layers.%d.mlp.experts.%d.%s", l, e, mlp[i]);
                    trill_lora_pair p = pair(w, (trill_lora_target)(TRILL_LORA_GATE + i), i < 2 ? H : Im, i < 2 ? Im : H, path);
                    if (experts[i]) experts[i][e] = p;
                }
        } else {
            const int64_t I = c->intermediate_size;
            trill_lora_pair *dense[3] = { &L->gate, &L->up, &L->down };
            for (int i = 0; i < 3; i++) {
                snprintf(path, sizeof path, "model.layers.%d.mlp.%s", l, mlp[i]);
                *dense[i] = pair(w, (trill_lora_target)(TRILL_LORA_GATE + i), i < 2 ? H : I, i < 2 ? I : H, path);
            }
        }
    }
    lora->lm_head = pair(w, TRILL_LORA_LM_HEAD, H, c->vocab_size, "lm_head");
}

void trill_lora_free(trill_lora *lora) {
    if (!lora) return;
    free(lora->layers);
    free(lora->expert_pairs);
    free(lora->params);
    free(lora->tensors);
    free(lora);
}

/* Allocates the structure and the parameter block (zeroed) for m's config. */
static trill_status lora_alloc(const trill_model *m, trill_lora_config cfg, trill_lora **out) {
    const trill_config *c = &m->config;
    if (cfg.rank < 1 || cfg.rank > 4096) return trill_error(TRILL_ERR_INVALID, "lora.rank: %d is out of range [1, 4096]", cfg.rank);
    if (!(cfg.alpha > 0)) return trill_error(TRILL_ERR_INVALID, "lora.alpha: %g must be positive", cfg.alpha);
    if (!cfg.targets) return trill_error(TRILL_ERR_INVALID, "lora.target_modules: no module selected");
    if ((cfg.targets & (1u << TRILL_LORA_LM_HEAD)) && c->num_labels > 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "lora.target_modules: lm_head: this is a sequence classifier (score head), it has no lm_head");
    if ((cfg.targets & (1u << TRILL_LORA_LM_HEAD)) && c->tie_word_embeddings)
        return trill_error(TRILL_ERR_UNSUPPORTED, "lora.target_modules: lm_head is tied to the embeddings in this model; adapting it is not supported");
    trill_lora *lora = calloc(1, sizeof *lora);
    if (!lora) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    lora->config = cfg;
    lora->scale = (float)(cfg.use_rslora ? cfg.alpha / sqrt(cfg.rank) : cfg.alpha / cfg.rank);
    lora->enabled = true;
    lora->layers = calloc((size_t)c->num_hidden_layers, sizeof *lora->layers);
    lora->expert_pairs = calloc((size_t)c->n_moe_layers * c->num_experts * 3 + 1, sizeof *lora->expert_pairs);
    if (!lora->layers || !lora->expert_pairs) { trill_lora_free(lora); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    for (int l = 0, k = 0; l < c->num_hidden_layers; l++)
        if (trill_config_is_moe(c, l)) {
            lora->layers[l].expert_gate = lora->expert_pairs + (size_t)k++ * c->num_experts;
            lora->layers[l].expert_up = lora->expert_pairs + (size_t)k++ * c->num_experts;
            lora->layers[l].expert_down = lora->expert_pairs + (size_t)k++ * c->num_experts;
        }
    walk w = { .lora = lora };
    walk_layout(&w, c); /* count */
    lora->n_params = w.offset;
    lora->n_tensors = w.n;
    lora->params = calloc(w.offset ? w.offset : 1, sizeof(float));
    lora->tensors = calloc(w.n ? w.n : 1, sizeof *lora->tensors);
    if (!lora->params || !lora->tensors) { trill_lora_free(lora); return trill_error(TRILL_ERR_NOMEM, "out of memory for %zu adapter values", w.offset); }
    w = (walk){ .lora = lora };
    walk_layout(&w, c); /* names and pointers */
    *out = lora;
    return TRILL_OK;
}

trill_status trill_lora_create(const trill_model *m, trill_lora_config cfg, uint64_t seed, trill_lora **out) {
    trill_lora *lora;
    trill_status st = lora_alloc(m, cfg, &lora);
    if (st) return st;
    /* PEFT: kaiming_uniform_(A, a=sqrt(5)) -> U(-1/sqrt(in), 1/sqrt(in)); B = 0 */
    for (size_t t = 0; t < lora->n_tensors; t += 2) {
        trill_param *A = &lora->tensors[t];
        const double bound = 1.0 / sqrt((double)A->shape[1]);
        const uint64_t key = trill_rng_key(seed, t);
        for (size_t i = 0; i < A->numel; i++) A->data[i] = (float)((2.0 * trill_rng_uniform(key, i) - 1.0) * bound);
    }
    *out = lora;
    return TRILL_OK;
}

void trill_model_attach_lora(trill_model *m, trill_lora *lora) { m->lora = lora; }

/* ---- PEFT files ---- */

trill_status trill_lora_save(const trill_lora *lora, const char *dir) {
    trill_status st = trill_mkdir_p(dir);
    if (st) return st;
    trill_tensor_out *outs = calloc(lora->n_tensors + 1, sizeof *outs);
    if (!outs) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t t = 0; t < lora->n_tensors; t++) {
        const trill_param *p = &lora->tensors[t];
        outs[t] = (trill_tensor_out){ .name = p->name, .ndim = 2, .shape = { p->shape[0], p->shape[1] }, .data = p->data, .src_dtype = TRILL_F32 };
    }
    char *st_path = trill_path_join(dir, "adapter_model.safetensors"), *cfg_path = trill_path_join(dir, "adapter_config.json");
    st = trill_st_write(st_path, outs, lora->n_tensors, TRILL_F32);
    if (!st) {
        json_t *targets = json_array();
        for (int i = 0; i < TRILL_LORA_N_TARGETS; i++)
            if (lora->config.targets & (1u << i)) json_array_append_new(targets, json_string(TARGET_NAMES[i]));
        json_t *j = json_pack("{s:s, s:s, s:i, s:f, s:b, s:o, s:f, s:s, s:b, s:b, s:n}", "peft_type", "LORA", "task_type", "CAUSAL_LM",
                              "r", lora->config.rank, "lora_alpha", lora->config.alpha, "use_rslora", lora->config.use_rslora,
                              "target_modules", targets, "lora_dropout", 0.0, "bias", "none", "fan_in_fan_out", 0,
                              "inference_mode", 1, "modules_to_save");
        st = trill_json_write_file(cfg_path, j);
        json_decref(j);
    }
    free(st_path);
    free(cfg_path);
    free(outs);
    return st;
}

static trill_status read_adapter_config(const char *path, trill_lora_config *cfg) {
    json_t *j;
    trill_status st = trill_json_load_file(path, &j);
    if (st) return st;
    const char *type = "(missing)";
    *cfg = (trill_lora_config){ .rank = 8, .alpha = 8 };
    const json_t *targets = json_object_get(j, "target_modules");
    if ((st = trill_json_get_string(j, "peft_type", path, &type)) || (st = trill_json_get_int(j, "r", path, 1, 4096, &cfg->rank)) ||
        (st = trill_json_get_double(j, "lora_alpha", path, 1e-9, 1e9, &cfg->alpha)) ||
        (st = trill_json_get_bool(j, "use_rslora", path, &cfg->use_rslora))) {
    } else if (strcmp(type, "LORA") != 0) {
        st = trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"peft_type\": \"%s\" is not supported (expected \"LORA\")", path, type);
    } else if (!json_is_array(targets)) {
        st = trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"target_modules\": expected a list of module names", path);
    } else {
        size_t i;
        const json_t *t;
        json_array_foreach(targets, i, t) {
            unsigned bit;
            if (!json_is_string(t) || trill_lora_parse_targets(json_string_value(t), &bit)) {
                st = trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"target_modules\": entry %zu is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head", path, i);
                break;
            }
            cfg->targets |= bit;
        }
    }
    json_decref(j);
    return st;
}

trill_status trill_lora_load(const trill_model *m, const char *dir, trill_lora **out) {
    char *st_path = trill_path_join(dir, "adapter_model.safetensors"), *cfg_path = trill_path_join(dir, "adapter_config.json");
    trill_lora_config cfg;
    trill_lora *lora = NULL;
    trill_st_file *f = NULL;
    trill_status st = read_adapter_config(cfg_path, &cfg);
    if (!st) st = lora_alloc(m, cfg, &lora);
    if (!st) st = trill_st_open(st_path, &f);
    for (size_t t = 0; !st && t < lora->n_tensors; t++) {
        const trill_param *p = &lora->tensors[t];
        const trill_tensor_view *v = trill_st_find(f, p->name);
        if (!v) st = trill_error(TRILL_ERR_INVALID, "%s: missing tensor \"%s\" (adapter_config.json targets it)", st_path, p->name);
        else if (v->ndim != 2 || v->shape[0] != p->shape[0] || v->shape[1] != p->shape[1])
            st = trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": shape does not match the model and rank (expected [%lld, %lld])",
                             st_path, p->name, (long long)p->shape[0], (long long)p->shape[1]);
        else trill_to_f32(p->data, v->data, v->dtype, p->numel);
    }
    if (!st && trill_st_count(f) != lora->n_tensors)
        st = trill_error(TRILL_ERR_INVALID, "%s: %zu tensors, but adapter_config.json and the model call for %zu", st_path, trill_st_count(f), lora->n_tensors);
    trill_st_close(f);
    free(st_path);
    free(cfg_path);
    if (st) { trill_lora_free(lora); return st; }
    *out = lora;
    return TRILL_OK;
}

/* ---- merging ---- */

static void merge_pair(const trill_lora *lora, trill_lora_pair p, float *W, int in, int out) {
    if (!p.A) return;
    const int r = lora->config.rank;
    /* W[out, in] += scale * B[out, r] @ A[r, in]: a matmul with A^T as the weight */
    float *At = malloc(sizeof(float) * (size_t)in * r), *delta = malloc(sizeof(float) * (size_t)out * in);
    for (int i = 0; i < r; i++)
        for (int j = 0; j < in; j++) At[(size_t)j * r + i] = p.A[(size_t)i * in + j];
    matmul_forward(delta, p.B, At, out, r, in);
    for (size_t i = 0; i < (size_t)out * in; i++) W[i] += lora->scale * delta[i];
    free(At);
    free(delta);
}

trill_status trill_lora_merge(const trill_lora *lora, trill_model *m) {
    if (m->storage != TRILL_F32)
        return trill_error(TRILL_ERR_INVALID, "merge: the model keeps its base in bf16; load it with fp32 storage to merge adapters into it");
    const trill_config *c = &m->config;
    const int H = c->hidden_size, qd = c->num_attention_heads * c->head_dim, kvd = c->num_key_value_heads * c->head_dim;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const trill_lora_layer *L = &lora->layers[l];
        trill_layer_weights *w = &m->layers[l];
        merge_pair(lora, L->q, w->wq.f32, H, qd);
        merge_pair(lora, L->k, w->wk.f32, H, kvd);
        merge_pair(lora, L->v, w->wv.f32, H, kvd);
        merge_pair(lora, L->o, w->wo.f32, qd, H);
        if (trill_config_is_moe(c, l)) {
            const int Im = c->moe_intermediate_size;
            for (int e = 0; e < c->num_experts; e++) {
                merge_pair(lora, L->expert_gate[e], w->expert_gate.f32 + (size_t)e * Im * H, H, Im);
                merge_pair(lora, L->expert_up[e], w->expert_up.f32 + (size_t)e * Im * H, H, Im);
                merge_pair(lora, L->expert_down[e], w->expert_down.f32 + (size_t)e * H * Im, Im, H);
            }
        } else {
            const int I = c->intermediate_size;
            merge_pair(lora, L->gate, w->mlp_gate.f32, H, I);
            merge_pair(lora, L->up, w->mlp_up.f32, H, I);
            merge_pair(lora, L->down, w->mlp_down.f32, I, H);
        }
    }
    merge_pair(lora, lora->lm_head, m->lm_head.f32, H, c->vocab_size);
    return TRILL_OK;
}
