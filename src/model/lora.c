#include "model/lora_internal.h"
#include "trill/lora.h"
#include "base/alloc.h"

#include "arch/family.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"
#include "base/json.h"
#include "trill/kernels.h"
#include "trill/rng.h"
#include "trill/safetensors.h"

/* Every target's PEFT module name and the short name trill's configs accept (trill/families.def). */
static const struct { const char *peft, *alias; } TARGETS[TRILL_LORA_N_TARGETS] = {
#define TRILL_LORA_TARGET(name, peft, alias) [TRILL_LORA_##name] = { peft, alias },
#include "trill/families.def"
#undef TRILL_LORA_TARGET
};

int trill_lora_parse_targets(const char *list, unsigned *targets) {
    *targets = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        if (strcmp(tok, "all-linear") == 0) { *targets |= TRILL_LORA_ALL_LINEAR; continue; }
        int found = -1;
        for (int i = 0; i < TRILL_LORA_N_TARGETS; i++)
            if (strcmp(tok, TARGETS[i].alias) == 0 || strcmp(tok, TARGETS[i].peft) == 0) found = i;
        if (found < 0) {
            char names[256] = "";
            for (int i = 0; i < TRILL_LORA_N_TARGETS; i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s, ", TARGETS[i].alias);
            trill_error(TRILL_ERR_INVALID, "lora.target_modules: unknown module \"%s\" (expected %sor all-linear)", tok, names);
            return -1;
        }
        *targets |= 1u << found;
    }
    return 0;
}

const char *trill_lora_target_peft_name(int target) {
    return target >= 0 && target < TRILL_LORA_N_TARGETS ? TARGETS[target].peft : NULL;
}

const char *trill_lora_target_alias(int target) {
    return target >= 0 && target < TRILL_LORA_N_TARGETS ? TARGETS[target].alias : NULL;
}

/* ---- layout -----------------------------------------------------------------------------
 * Derived from the model's tensors (its family's table): an A [r, in] and a B [out, r] for every
 * tensor whose LoRA target is selected. The whole adapter's order (the checkpoint's and the
 * optimizer file's), per decoder layer: the layer's own adapted tensors in table order, then
 * expert by expert each expert's adapted tensors in table order; then the adapted global
 * tensors (lm_head). A shard's adapter holds its model's experts only, after everything else
 * (trill_lora.routed_first), and maps each tensor to its place in the whole one. */

static bool adapted(const trill_param *t, unsigned targets) {
    return t->lora_target != TRILL_NO_LORA && (targets & (1u << t->lora_target));
}

/* The model's adapted tensors (by index) in the whole adapter's order; *n of them. */
static int *whole_order(const trill_model *m, unsigned targets, size_t *n) {
    const int E = m->config.num_experts;
    int *order = trill_malloc(sizeof(int) * (m->n_tensors ? m->n_tensors : 1));
    *n = 0;
    if (!order) return NULL;
    size_t t = 0;
    while (t < m->n_tensors) {
        if (m->tensors[t].layer < 0) { t++; continue; }
        size_t end = t; /* a layer's tensors are contiguous in checkpoint order */
        while (end < m->n_tensors && m->tensors[end].layer == m->tensors[t].layer) end++;
        for (size_t k = t; k < end; k++)
            if (m->tensors[k].expert < 0 && adapted(&m->tensors[k], targets)) order[(*n)++] = (int)k;
        for (int e = 0; e < E; e++)
            for (size_t k = t; k < end; k++)
                if (m->tensors[k].expert == e && adapted(&m->tensors[k], targets)) order[(*n)++] = (int)k;
        t = end;
    }
    for (size_t k = 0; k < m->n_tensors; k++)
        if (m->tensors[k].layer < 0 && adapted(&m->tensors[k], targets)) order[(*n)++] = (int)k;
    return order;
}

typedef struct walk {
    trill_lora *lora;
    const trill_model *m;
    bool whole;             /* the whole adapter: whole tensors (a tensor-parallel shard's are slices) */
    size_t offset, n, next_experts;
    const size_t *g_offset; /* [model tensor] its A's offset in the whole adapter ... */
    const int *g_pos;       /* ... and its place in the whole adapter's order (A at 2 g_pos, B after) */
} walk;

/* A ([r, in]: part "lora_A") or B ([out, r]: "lora_B") of the weight `base`: under tensor parallelism
 * A takes the slice of the weight's columns (a row-parallel weight's input), B of its rows (a
 * column-parallel weight's output), each whole otherwise. */
static float *add(walk *w, const trill_param *base, int64_t rows, int64_t cols, const char *part, size_t g_offset, int g_index) {
    float *data = w->lora->params ? w->lora->params + w->offset : NULL;
    if (w->lora->tensors) {
        trill_param *p = &w->lora->tensors[w->n];
        *p = *base;
        const size_t stem = strlen(base->name) - (sizeof ".weight" - 1); /* "model.layers.3.self_attn.q_proj" */
        snprintf(p->name, sizeof p->name, "base_model.model.%.*s.%s.weight", (int)stem, base->name, part);
        p->ndim = 2;
        p->shape[0] = rows;
        p->shape[1] = cols;
        const bool is_a = part[5] == 'A';
        p->whole_shape[0] = is_a || w->whole ? rows : base->whole_shape[0];
        p->whole_shape[1] = !is_a || w->whole ? cols : base->whole_shape[1];
        p->slice_at[0] = is_a || w->whole ? 0 : base->slice_at[0];
        p->slice_at[1] = !is_a || w->whole ? 0 : base->slice_at[1];
        if (is_a || w->whole) p->chan_len[0] = p->chan_len[1] = 0; /* B's rows are the weight's (channels and all), A's not */
        p->data = data;
        p->bf16 = NULL;
        p->numel = (size_t)(rows * cols);
        w->lora->global_offset[w->n] = g_offset;
        w->lora->global_index[w->n] = g_index;
    }
    w->offset += (size_t)(rows * cols);
    w->n++;
    return data;
}

/* The adapter of model tensor t; its pointers go where the row says. */
static void adapt(walk *w, const trill_param *t) {
    trill_lora *lora = w->lora;
    const int64_t r = lora->config.rank;
    const size_t g = w->g_offset ? w->g_offset[t->index] : 0;
    const int gi = w->g_pos ? 2 * w->g_pos[t->index] : 0;
    const int64_t *dims = w->whole ? t->whole_shape : t->shape;
    trill_lora_pair p = { .A = add(w, t, r, dims[1], "lora_A", g, gi),
                          .B = add(w, t, dims[0], r, "lora_B", g + (size_t)(r * t->whole_shape[1]), gi + 1) };
    const int field = trill_arch_row(&w->m->config, t)->lora_field;
    if (!lora->layers || field == TRILL_NO_FIELD) return;
    if (t->layer < 0) { *(trill_lora_pair *)((char *)lora + field) = p; return; }
    char *at = (char *)trill_lora_layer(lora, t->layer) + field;
    if (t->expert < 0) { *(trill_lora_pair *)at = p; return; }
    trill_lora_pair **experts = (trill_lora_pair **)at;
    if (t->expert == lora->expert_first) { /* the first expert held gives this layer's row its pairs */
        if (lora->expert_pairs) *experts = lora->expert_pairs + w->next_experts;
        w->next_experts += (size_t)lora->expert_count;
    }
    if (*experts) (*experts)[t->expert - lora->expert_first] = p;
}

/* Places the adapters: in the whole adapter's order, or for a shard every non-routed adapter
 * first, then its routed experts'. */
static void walk_layout(walk *w, const int *order, size_t n_order) {
    const trill_lora *lora = w->lora;
    const bool shard = lora->expert_count < w->m->config.num_experts;
    for (int pass = shard ? 1 : 0; pass < (shard ? 3 : 1); pass++) {
        if (pass == 2) w->lora->routed_first = w->offset;
        for (size_t i = 0; i < n_order; i++) {
            const trill_param *t = &w->m->tensors[order[i]];
            const bool routed = t->expert >= 0;
            if (routed && (t->expert < lora->expert_first || t->expert >= lora->expert_first + lora->expert_count)) continue;
            if (pass == 0 || (pass == 1) == !routed) adapt(w, t);
        }
    }
    if (!shard) w->lora->routed_first = w->offset;
}

void trill_lora_free(trill_lora *lora) {
    if (!lora) return;
    free(lora->layers);
    free(lora->expert_pairs);
    free(lora->params);
    free(lora->tensors);
    free(lora->global_offset);
    free(lora->global_index);
    free(lora);
}

/* Allocates the structure and the parameter block (zeroed) for m's config: for every expert
 * (whole), or for those m holds. */
trill_status trill_lora_config_resolve(const trill_config *c, trill_lora_config *cfg) {
    if (cfg->rank < 1 || cfg->rank > 4096) return trill_error(TRILL_ERR_INVALID, "lora.rank: %d is out of range [1, 4096]", cfg->rank);
    if (!(cfg->alpha > 0)) return trill_error(TRILL_ERR_INVALID, "lora.alpha: %g must be positive", cfg->alpha);
    const trill_family *f = trill_family_of(c);
    if (cfg->targets & TRILL_LORA_ALL_LINEAR) cfg->targets = (cfg->targets & ~TRILL_LORA_ALL_LINEAR) | f->all_linear;
    if (!cfg->targets) return trill_error(TRILL_ERR_INVALID, "lora.target_modules: no module selected");
    for (int i = 0; i < 32; i++)
        if (cfg->targets & ~f->lora_targets & (1u << i)) {
            const char *name = trill_lora_target_peft_name(i);
            return name ? trill_error(TRILL_ERR_UNSUPPORTED, "lora.target_modules: %s: a %s model has no such module", name, trill_config_model_type(c))
                        : trill_error(TRILL_ERR_INVALID, "lora.target_modules: bit %d names no module", i);
        }
    if ((cfg->targets & (1u << TRILL_LORA_LM_HEAD)) && c->num_labels > 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "lora.target_modules: lm_head: this is a sequence classifier (score head), it has no lm_head");
    if ((cfg->targets & (1u << TRILL_LORA_LM_HEAD)) && c->tie_word_embeddings)
        return trill_error(TRILL_ERR_UNSUPPORTED, "lora.target_modules: lm_head is tied to the embeddings in this model; adapting it is not supported");
    return TRILL_OK;
}

static trill_status lora_alloc(const trill_model *m, trill_lora_config cfg, bool whole, trill_lora **out) {
    const trill_config *c = &m->config;
    trill_status st = trill_lora_config_resolve(c, &cfg);
    if (st) return st;
    trill_lora *lora = trill_calloc(1, sizeof *lora);
    if (!lora) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    lora->config = cfg;
    lora->scale = (float)(cfg.use_rslora ? cfg.alpha / sqrt(cfg.rank) : cfg.alpha / cfg.rank);
    lora->enabled = true;
    lora->expert_first = whole ? 0 : m->expert_first;
    lora->expert_count = whole ? c->num_experts : m->expert_count;
    lora->layer_size = sizeof(trill_decoder_lora);
    const trill_family *f = trill_family_of(c);
    lora->stacked = f->stacked;
    lora->n_stacked = f->n_stacked < TRILL_MAX_STACKED ? f->n_stacked : TRILL_MAX_STACKED;
    lora->n_experts = c->num_experts;
    lora->layers = trill_calloc((size_t)c->num_hidden_layers, lora->layer_size);
    size_t n_order = 0;
    int *order = whole_order(m, cfg.targets, &n_order);
    size_t *g_offset = trill_malloc(sizeof(size_t) * (m->n_tensors ? m->n_tensors : 1));
    int *g_pos = trill_malloc(sizeof(int) * (m->n_tensors ? m->n_tensors : 1));
    if (!lora->layers || !order || !g_offset || !g_pos) {
        free(order);
        free(g_offset);
        free(g_pos);
        trill_lora_free(lora);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n_order; i++) { /* the whole adapter's offsets, A then B of each */
        const trill_param *t = &m->tensors[order[i]];
        g_offset[order[i]] = lora->n_global;
        g_pos[order[i]] = (int)i;
        lora->n_global += (size_t)cfg.rank * (size_t)(t->whole_shape[0] + t->whole_shape[1]);
    }
    lora->n_global_tensors = 2 * n_order;
    walk w = { .lora = lora, .m = m, .whole = whole };
    walk_layout(&w, order, n_order); /* count */
    lora->n_params = w.offset;
    lora->n_tensors = w.n;
    lora->params = trill_calloc(w.offset ? w.offset : 1, sizeof(float));
    lora->tensors = trill_calloc(w.n ? w.n : 1, sizeof *lora->tensors);
    lora->expert_pairs = trill_calloc(w.next_experts ? w.next_experts : 1, sizeof *lora->expert_pairs);
    lora->global_offset = trill_calloc(w.n ? w.n : 1, sizeof *lora->global_offset);
    lora->global_index = trill_calloc(w.n ? w.n : 1, sizeof *lora->global_index);
    if (!lora->params || !lora->tensors || !lora->expert_pairs || !lora->global_offset || !lora->global_index) {
        free(order);
        free(g_offset);
        free(g_pos);
        trill_lora_free(lora);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for %zu adapter values", w.offset);
    }
    w = (walk){ .lora = lora, .m = m, .whole = whole, .g_offset = g_offset, .g_pos = g_pos };
    walk_layout(&w, order, n_order); /* names and pointers */
    free(order);
    free(g_offset);
    free(g_pos);
    *out = lora;
    return TRILL_OK;
}

trill_status trill_lora_create(const trill_model *m, trill_lora_config cfg, uint64_t seed, trill_lora **out) {
    trill_lora *lora;
    trill_status st = lora_alloc(m, cfg, false, &lora);
    if (st) return st;
    /* PEFT: kaiming_uniform_(A, a=sqrt(5)) -> U(-1/sqrt(in), 1/sqrt(in)); B = 0. Keyed by the
     * tensor's place in the whole adapter, so a shard's are the whole one's. */
    for (size_t t = 0; t < lora->n_tensors; t += 2) { /* a tensor-parallel slice draws its columns of the whole A */
        trill_param *A = &lora->tensors[t];
        const double bound = 1.0 / sqrt((double)A->whole_shape[1]);
        const uint64_t key = trill_rng_key(seed, (uint64_t)lora->global_index[t]);
        const size_t cols = (size_t)A->shape[1], wcols = (size_t)A->whole_shape[1], c0 = (size_t)A->slice_at[1];
        for (size_t i = 0; i < A->numel; i++)
            A->data[i] = (float)((2.0 * trill_rng_uniform(key, (i / cols) * wcols + c0 + i % cols) - 1.0) * bound);
    }
    *out = lora;
    return TRILL_OK;
}

trill_status trill_lora_create_whole(const trill_model *m, trill_lora_config cfg, trill_lora **out) { return lora_alloc(m, cfg, true, out); }

void trill_model_attach_lora(trill_model *m, trill_lora *lora) { m->lora = lora; }

/* ---- PEFT files ---- */

/* adapter_config.json: PEFT's fields; the stacked experts' parameters under target_parameters
 * with their rank and alpha patterns, the other targets under target_modules. */
static json_t *adapter_config(const trill_lora *lora, const trill_lora_peft_param *pp, int n_pp) {
    unsigned modules = 0; /* targets with an adapted tensor outside the stacked experts */
    for (size_t t = 0; t < lora->n_tensors; t++)
        if (!trill_lora_stacked_of(lora, &lora->tensors[t])) modules |= 1u << lora->tensors[t].lora_target;
    json_t *targets = json_array(), *params = json_array(), *ranks = json_object(), *alphas = json_object();
    bool ok = targets && params && ranks && alphas;
    for (int i = 0; ok && i < TRILL_LORA_N_TARGETS; i++)
        if (lora->config.targets & modules & (1u << i)) ok &= json_array_append_new(targets, json_string(trill_lora_target_peft_name(i))) == 0;
    for (int i = 0; ok && i < n_pp; i++) {
        bool seen = false;
        for (size_t k = 0; k < json_array_size(params); k++) seen |= !strcmp(json_string_value(json_array_get(params, k)), pp[i].suffix);
        if (seen) continue;
        ok &= json_array_append_new(params, json_string(pp[i].suffix)) == 0;
        if (pp[i].rank != lora->config.rank) {
            ok &= json_object_set_new(ranks, pp[i].suffix, json_integer(pp[i].rank)) == 0;
            ok &= json_object_set_new(alphas, pp[i].suffix, json_real(pp[i].alpha)) == 0;
        }
    }
    json_t *j = ok ? json_pack("{s:s, s:s, s:i, s:f, s:b, s:O, s:f, s:s, s:b, s:b, s:n}", "peft_type", "LORA", "task_type", "CAUSAL_LM",
                               "r", lora->config.rank, "lora_alpha", lora->config.alpha, "use_rslora", lora->config.use_rslora,
                               "target_modules", targets, "lora_dropout", 0.0, "bias", "none", "fan_in_fan_out", 0, "inference_mode", 1,
                               "modules_to_save")
                   : NULL;
    if (j && n_pp)
        ok &= json_object_set(j, "target_parameters", params) == 0 && json_object_set(j, "rank_pattern", ranks) == 0 &&
              json_object_set(j, "alpha_pattern", alphas) == 0;
    json_decref(targets);
    json_decref(params);
    json_decref(ranks);
    json_decref(alphas);
    if (!ok) json_decref(j);
    return ok ? j : NULL;
}

trill_status trill_lora_save(const trill_lora *lora, const char *dir) {
    if (!trill_lora_is_whole(lora))
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: these adapters are a shard's (%zu of the whole adapter's %zu values); an adapter file "
                           "is written from the whole adapter", dir, lora->n_params, lora->n_global);
    trill_status st = trill_mkdir_p(dir);
    if (st) return st;
    trill_lora_peft_param *pp = NULL;
    int n_pp = 0;
    if ((st = trill_lora_peft_params(lora, &pp, &n_pp))) return st;
    trill_tensor_out *outs = trill_calloc(lora->n_tensors + 2 * (size_t)n_pp + 1, sizeof *outs);
    if (!outs) {
        trill_lora_peft_params_free(pp, n_pp);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t t = 0; t < lora->n_tensors; t++) {
        const trill_param *p = &lora->tensors[t];
        if (trill_lora_stacked_of(lora, p)) continue; /* in its stacked parameter's, below */
        outs[n++] = (trill_tensor_out){ .name = p->name, .ndim = 2, .shape = { p->shape[0], p->shape[1] }, .data = p->data, .src_dtype = TRILL_F32 };
    }
    for (int i = 0; i < n_pp; i++) {
        outs[n++] = (trill_tensor_out){ .name = pp[i].a_name, .ndim = 2, .shape = { (int64_t)pp[i].rank * pp[i].experts, pp[i].in }, .data = pp[i].A,
                                        .src_dtype = TRILL_F32 };
        outs[n++] = (trill_tensor_out){ .name = pp[i].b_name, .ndim = 2, .shape = { pp[i].out, (int64_t)pp[i].rank * pp[i].experts }, .data = pp[i].B,
                                        .src_dtype = TRILL_F32 };
    }
    char *st_path = trill_path_join(dir, "adapter_model.safetensors"), *cfg_path = trill_path_join(dir, "adapter_config.json");
    st = st_path && cfg_path ? trill_st_write(st_path, outs, n, TRILL_F32) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        json_t *j = adapter_config(lora, pp, n_pp);
        st = j ? trill_json_write_file(cfg_path, j) : trill_error(TRILL_ERR_NOMEM, "%s: out of memory", cfg_path);
        json_decref(j);
    }
    free(st_path);
    free(cfg_path);
    free(outs);
    trill_lora_peft_params_free(pp, n_pp);
    return st;
}

/* adapter_config.json into cfg (targets from target_modules and target_parameters: *param_targets
 * those of the latter); *out the parsed object, for the stacked experts' rank and alpha patterns. */
static trill_status read_adapter_config(const char *path, const trill_config *c, trill_lora_config *cfg, unsigned *param_targets,
                                        unsigned *module_targets, json_t **out) {
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
                char names[256] = "";
                for (int k = 0; k < TRILL_LORA_N_TARGETS; k++)
                    snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "", TARGETS[k].peft);
                st = trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"target_modules\": entry %zu is not one of %s", path, i, names);
                break;
            }
            cfg->targets |= bit;
        }
        *param_targets = 0;
        *module_targets = cfg->targets;
        if (!st) st = trill_lora_read_target_parameters(c, json_object_get(j, "target_parameters"), path, param_targets);
        cfg->targets |= *param_targets;
    }
    if (st) json_decref(j);
    else *out = j;
    return st;
}

trill_status trill_lora_load(const trill_model *m, const char *dir, trill_lora **out) {
    char *st_path = trill_path_join(dir, "adapter_model.safetensors"), *cfg_path = trill_path_join(dir, "adapter_config.json");
    trill_lora_config cfg;
    trill_lora *lora = NULL;
    trill_st_file *f = NULL;
    json_t *cj = NULL;
    unsigned params = 0, modules = 0; /* the targets the file holds in PEFT's target_parameters form, and under module names */
    trill_status st = st_path && cfg_path ? read_adapter_config(cfg_path, &m->config, &cfg, &params, &modules, &cj)
                                          : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) st = lora_alloc(m, cfg, false, &lora);
    if (!st) st = trill_st_open(st_path, &f);
    bool expert_modules = false; /* nn.Linear-layout stacked experts under trill's per-expert module names (its own form) */
    for (size_t t = 0; !st && t < lora->n_tensors && !expert_modules; t++) {
        const trill_stacked *sk = trill_lora_stacked_of(lora, &lora->tensors[t]);
        expert_modules = sk && sk->linear && trill_st_find(f, lora->tensors[t].name) != NULL;
    }
    for (size_t t = 0; !st && t < lora->n_tensors; t++) {
        const trill_param *p = &lora->tensors[t];
        if (trill_lora_stacked_of(lora, p) && (params & (1u << p->lora_target))) continue; /* from its stacked parameter's, below */
        if (!trill_lora_in_file(lora, p, params, modules, expert_modules)) continue; /* not adapted by the file: stays 0 */
        const trill_tensor_view *v = trill_st_find(f, p->name);
        if (!v) st = trill_error(TRILL_ERR_INVALID, "%s: missing tensor \"%s\" (adapter_config.json targets it)", st_path, p->name);
        else if (v->ndim != 2 || v->shape[0] != p->whole_shape[0] || v->shape[1] != p->whole_shape[1])
            st = trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": shape does not match the model and rank (expected [%lld, %lld])",
                             st_path, p->name, (long long)p->whole_shape[0], (long long)p->whole_shape[1]);
        else /* a tensor-parallel slice: its rows and columns of the file's */
            for (int64_t i = 0; i < p->shape[0]; i++)
                trill_to_f32(p->data + i * p->shape[1],
                             (const char *)v->data + (size_t)(trill_param_whole_row(p, i) * p->whole_shape[1] + p->slice_at[1]) * trill_dtype_size(v->dtype),
                             v->dtype, (size_t)p->shape[1]);
    }
    if (!st) st = trill_lora_read_stacked(lora, params, cj, cfg_path, f, st_path);
    if (!st && trill_st_count(f) != trill_lora_file_tensors(lora, m, params, modules, expert_modules)) /* a shard reads its own of the whole adapter's */
        st = trill_error(TRILL_ERR_INVALID, "%s: %zu tensors, but adapter_config.json and the model call for %zu", st_path, trill_st_count(f),
                         trill_lora_file_tensors(lora, m, params, modules, expert_modules));
    trill_st_close(f);
    json_decref(cj);
    free(st_path);
    free(cfg_path);
    if (st) { trill_lora_free(lora); return st; }
    *out = lora;
    return TRILL_OK;
}

/* ---- merging ---- */

static trill_status merge_pair(const trill_lora *lora, const trill_param *A, const trill_param *B, float *W) {
    const int r = lora->config.rank, in = (int)A->shape[1], out = (int)B->shape[0];
    /* W[out, in] += scale * B[out, r] @ A[r, in]: a matmul with A^T as the weight */
    float *At = trill_malloc(sizeof(float) * (size_t)in * r), *delta = trill_malloc(sizeof(float) * (size_t)out * in);
    if (!At || !delta) {
        free(At);
        free(delta);
        return trill_error(TRILL_ERR_NOMEM, "merge: out of memory for the update of %s [%d, %d]", B->name, out, in);
    }
    for (int i = 0; i < r; i++)
        for (int j = 0; j < in; j++) At[(size_t)j * r + i] = A->data[(size_t)i * in + j];
    trill_matmul_forward(delta, B->data, At, out, r, in);
    for (size_t i = 0; i < (size_t)out * in; i++) W[i] += lora->scale * delta[i];
    free(At);
    free(delta);
    return TRILL_OK;
}

trill_status trill_lora_check_finite(const trill_lora *lora) {
    for (size_t k = 0; k < lora->n_tensors; k++) {
        const trill_param *p = &lora->tensors[k];
        for (size_t i = 0; i < p->numel; i++)
            if (!isfinite(p->data[i]))
                return trill_error(TRILL_ERR_INVALID, "adapter tensor %s[%zu] is %g: refused", p->name, i, p->data[i]);
    }
    return TRILL_OK;
}

trill_status trill_lora_merge(const trill_lora *lora, trill_model *m) {
    if (m->storage != TRILL_F32)
        return trill_error(TRILL_ERR_INVALID, "merge: the model keeps its base in bf16; load it with fp32 storage to merge adapters into it");
    trill_status st = trill_lora_check_finite(lora);
    for (size_t t = 0; t + 1 < lora->n_tensors && !st; t += 2) { /* A, then B, of the weight at index */
        const trill_param *A = &lora->tensors[t], *B = &lora->tensors[t + 1];
        if (A->index < 0 || (size_t)A->index >= m->n_tensors || m->tensors[A->index].numel != (size_t)B->shape[0] * A->shape[1])
            return trill_error(TRILL_ERR_INVALID, "merge: adapter %s was not made for this model", A->name);
        st = merge_pair(lora, A, B, m->tensors[A->index].data);
    }
    return st;
}

const trill_lora_config *trill_lora_get_config(const trill_lora *lora) { return &lora->config; }
float trill_lora_scale(const trill_lora *lora) { return lora->scale; }
size_t trill_lora_routed_first(const trill_lora *lora) { return lora->routed_first; }
float *trill_lora_params(trill_lora *lora, size_t *n) {
    *n = lora->n_params;
    return lora->params;
}
const trill_param *trill_lora_tensors(const trill_lora *lora, size_t *n) {
    *n = lora->n_tensors;
    return lora->tensors;
}
void trill_lora_set_enabled(trill_lora *lora, bool enabled) { lora->enabled = enabled; }
bool trill_lora_enabled(const trill_lora *lora) { return lora->enabled; }
