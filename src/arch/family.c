/* The family registry and the walk that expands a family's tensor table for a config. */
#include "arch/family.h"
#include "base/json.h"

#include <stdio.h>
#include <string.h>

const trill_family *const trill_families[] = {
#define TRILL_FAMILY(id, model) &model,
#include "trill/families.def"
#undef TRILL_FAMILY
};
const int trill_n_families = (int)(sizeof trill_families / sizeof trill_families[0]);

static const trill_family *family_of_arch(trill_arch arch, const trill_arch_names **names) {
    for (int f = 0; f < trill_n_families; f++)
        for (int a = 0; a < trill_families[f]->n_archs; a++)
            if (trill_families[f]->archs[a].arch == arch) {
                if (names) *names = &trill_families[f]->archs[a];
                return trill_families[f];
            }
    return NULL;
}

const trill_family *trill_family_of(const trill_config *c) {
    const trill_family *f = family_of_arch(c->arch, NULL);
    return f ? f : trill_families[0]; /* every trill_arch has a family: not reached */
}

trill_layer_desc trill_layer_desc_of(const trill_config *c, int l) { return trill_family_of(c)->describe(c, l); }

const trill_arch_names *trill_arch_names_of(trill_arch arch) {
    const trill_arch_names *names = NULL;
    return family_of_arch(arch, &names) ? names : &trill_families[0]->archs[0];
}

const trill_arch_names *trill_arch_by_model_type(const char *model_type) {
    for (int f = 0; f < trill_n_families; f++)
        for (int a = 0; a < trill_families[f]->n_archs; a++)
            if (strcmp(trill_families[f]->archs[a].model_type, model_type) == 0) return &trill_families[f]->archs[a];
    return NULL;
}

static void emit(const trill_family *f, const trill_config *c, int r, int layer, int expert, int *index, trill_tensor_fn fn, void *ctx) {
    const trill_tensor_row *row = &f->rows[r];
    trill_param t = { .ndim = row->dims[1] == TRILL_NO_DIM ? 1 : 2, .kind = row->kind, .layer = layer, .expert = expert,
                      .role = row->role, .lora_target = row->lora_target, .fuse = row->fuse, .fuse_index = row->fuse_index,
                      .split = row->split, .index = (*index)++, .row = r };
    snprintf(t.name, sizeof t.name, row->name, layer, expert);
    t.shape[0] = f->dim(c, row->dims[0]);
    t.shape[1] = t.ndim == 2 ? f->dim(c, row->dims[1]) : 0;
    t.numel = (size_t)t.shape[0] * (size_t)(t.ndim == 2 ? t.shape[1] : 1);
    t.whole_shape[0] = t.shape[0];
    t.whole_shape[1] = t.shape[1];
    fn(ctx, row, &t);
}

void trill_arch_walk(const trill_config *c, trill_tensor_fn fn, void *ctx) {
    const trill_family *f = trill_family_of(c);
    int index = 0;
    for (int r = 0; r < f->n_rows;) {
        if (f->rows[r].scope == TRILL_ROW_GLOBAL) {
            if (!f->rows[r].when || f->rows[r].when(c, -1)) emit(f, c, r, -1, -1, &index, fn, ctx);
            r++;
            continue;
        }
        int end = r; /* a run of per-layer rows: the layer block, repeated for every layer */
        while (end < f->n_rows && f->rows[end].scope != TRILL_ROW_GLOBAL) end++;
        for (int l = 0; l < c->num_hidden_layers; l++)
            for (int k = r; k < end; k++) {
                const trill_tensor_row *row = &f->rows[k];
                if (row->when && !row->when(c, l)) continue;
                if (row->scope == TRILL_ROW_LAYER) emit(f, c, k, l, -1, &index, fn, ctx);
                else
                    for (int e = 0; e < c->num_experts; e++) emit(f, c, k, l, e, &index, fn, ctx);
            }
        r = end;
    }
}

const trill_tensor_row *trill_arch_row(const trill_config *c, const trill_param *t) { return &trill_family_of(c)->rows[t->row]; }

const trill_stacked *trill_arch_stacked(const trill_config *c, const trill_param *t) {
    const trill_family *f = trill_family_of(c);
    if (t->expert < 0) return NULL;
    for (int i = 0; i < f->n_stacked; i++)
        if (f->stacked[i].role == t->role) return &f->stacked[i];
    return NULL;
}

/* ---- counts derived from the walk ---- */

typedef struct counts { int64_t total, active; const trill_config *c; } counts;

static void count_params(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    counts *n = ctx;
    n->total += (int64_t)t->numel;
    if (trill_arch_active(n->c, t)) n->active += (int64_t)t->numel;
}

void trill_config_param_counts(const trill_config *c, int64_t *total, int64_t *active) {
    counts n = { .c = c };
    trill_arch_walk(c, count_params, &n);
    *total = n.total;
    *active = n.active;
}

typedef struct kinds { int64_t *by_kind, *routed; } kinds;

static void count_kind(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    (void)row;
    kinds *k = ctx;
    if (t->expert >= 0) *k->routed += (int64_t)t->numel;
    else if ((unsigned)t->kind < TRILL_TENSOR_N_KINDS) k->by_kind[t->kind] += (int64_t)t->numel;
}

void trill_config_param_breakdown(const trill_config *c, int64_t *by_kind, int64_t *routed_experts) {
    for (int i = 0; i < TRILL_TENSOR_N_KINDS; i++) by_kind[i] = 0;
    *routed_experts = 0;
    kinds k = { by_kind, routed_experts };
    trill_arch_walk(c, count_kind, &k);
}

/* ---- the weights' quantization, as config.json describes it ---- */

/* A string field of quantization_config that must be `want`; absent reads as `fallback` (NULL:
 * required). */
static trill_status expect_quant_string(const json_t *q, const char *key, const char *want, const char *fallback, const char *what) {
    const char *v = fallback;
    const json_t *j = json_object_get(q, key);
    if (j && !json_is_string(j))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"quantization_config.%s\": expected a string, got %s", what, key,
                           trill_json_type_name(j));
    if (j) v = json_string_value(j);
    if (!v) return trill_error(TRILL_ERR_INVALID, "%s: field \"quantization_config.%s\" is missing (expected \"%s\")", what, key, want);
    if (strcmp(v, want) != 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"quantization_config.%s\": \"%s\" is not supported (expected \"%s\")", what,
                           key, v, want);
    return TRILL_OK;
}

/* quantization_config: absent or null, or block-scaled FP8 (DeepSeek-V3's, Qwen3's FP8 releases; HF FineGrainedFP8Config:
 * quant_method "fp8", fmt "e4m3", activation_scheme "dynamic", weight_block_size [rows, cols],
 * HF's defaults for the last three). Activations are not quantized here: trill dequantizes the
 * weights at load. */
trill_status trill_arch_read_fp8(const json_t *root, const char *what, trill_config *c) {
    const json_t *q = json_object_get(root, "quantization_config");
    c->fp8_block[0] = c->fp8_block[1] = 0;
    if (!q || json_is_null(q)) return TRILL_OK;
    if (!json_is_object(q))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"quantization_config\": expected an object or null, got %s", what,
                           trill_json_type_name(q));
    trill_status st;
    if ((st = expect_quant_string(q, "quant_method", "fp8", NULL, what)) || (st = expect_quant_string(q, "fmt", "e4m3", "e4m3", what)) ||
        (st = expect_quant_string(q, "activation_scheme", "dynamic", "dynamic", what)))
        return st;
    const json_t *bs = json_object_get(q, "weight_block_size");
    if (!bs) {
        c->fp8_block[0] = c->fp8_block[1] = 128;
        return TRILL_OK;
    }
    const long long MAX_BLOCK = 1 << 20;
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_array_get(bs, (size_t)i);
        if (!json_is_array(bs) || json_array_size(bs) != 2 || !json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > MAX_BLOCK)
            return trill_error(TRILL_ERR_INVALID,
                               "%s: field \"quantization_config.weight_block_size\": expected [rows, cols], two integers in [1, %lld]", what,
                               MAX_BLOCK);
        c->fp8_block[i] = (int)json_integer_value(v);
    }
    return TRILL_OK;
}

trill_status trill_arch_read_yarn(const json_t *v, const char *key, const char *whole, trill_config *c) {
    char what[512]; /* errors name the object, then its field */
    snprintf(what, sizeof what, "%s: field \"%s\"", whole, key);
    c->yarn = true;
    c->yarn_factor = 1;
    c->yarn_beta_fast = 32;
    c->yarn_beta_slow = 1;
    c->yarn_mscale = 1;
    c->yarn_mscale_all_dim = 0;
    c->yarn_attention_factor = 0;
    c->yarn_truncate = true;
    c->yarn_original_max_position_embeddings = c->max_position_embeddings;
    trill_status st;
    if ((st = trill_json_get_double(v, "factor", what, 1.0, 1e6, &c->yarn_factor)) ||
        (st = trill_json_get_int(v, "original_max_position_embeddings", what, 1, 1 << 30, &c->yarn_original_max_position_embeddings)) ||
        (st = trill_json_get_double(v, "beta_fast", what, 0, 1e6, &c->yarn_beta_fast)) ||
        (st = trill_json_get_double(v, "beta_slow", what, 0, 1e6, &c->yarn_beta_slow)) ||
        (st = trill_json_get_double(v, "mscale", what, 0, 1e6, &c->yarn_mscale)) ||
        (st = trill_json_get_double(v, "mscale_all_dim", what, 0, 1e6, &c->yarn_mscale_all_dim)) ||
        (st = trill_json_get_double(v, "attention_factor", what, 1e-6, 1e6, &c->yarn_attention_factor)) ||
        (st = trill_json_get_bool(v, "truncate", what, &c->yarn_truncate)))
        return st;
    return TRILL_OK;
}

json_t *trill_arch_rope_scaling_json(const trill_config *c) {
    if (!c->yarn) return json_null();
    json_t *rs = json_pack("{s:s, s:f, s:i, s:f, s:f, s:f, s:f}", "type", "yarn", "factor", c->yarn_factor, "original_max_position_embeddings",
                           c->yarn_original_max_position_embeddings, "beta_fast", c->yarn_beta_fast, "beta_slow", c->yarn_beta_slow, "mscale",
                           c->yarn_mscale, "mscale_all_dim", c->yarn_mscale_all_dim);
    bool ok = rs != NULL;
    if (ok && c->yarn_attention_factor > 0) ok = json_object_set_new(rs, "attention_factor", json_real(c->yarn_attention_factor)) == 0;
    if (ok && !c->yarn_truncate) ok = json_object_set_new(rs, "truncate", json_false()) == 0;
    if (!ok) json_decref(rs);
    return ok ? rs : NULL;
}

trill_status trill_arch_read_rope(const json_t *root, const char *what, trill_config *c) {
    const char *keys[2] = { "rope_scaling", "rope_parameters" };
    for (int i = 0; i < 2; i++) {
        const json_t *v = json_object_get(root, keys[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_object(v))
            return trill_error(TRILL_ERR_INVALID, "%s: field \"%s\": expected an object or null, got %s", what, keys[i], trill_json_type_name(v));
        const char *type = NULL;
        if (trill_json_get_string(v, "rope_type", what, &type)) return TRILL_ERR_INVALID;
        if (!type) trill_json_get_string(v, "type", what, &type);
        if (!type || (strcmp(type, "default") != 0 && strcmp(type, "yarn") != 0))
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"%s\": rope type \"%s\" is not supported (plain RoPE, rope_type \"default\", or \"yarn\")",
                               what, keys[i], type ? type : "(missing)");
        trill_status st = strcmp(type, "yarn") == 0 ? trill_arch_read_yarn(v, keys[i], what, c) : TRILL_OK;
        if (!st) st = trill_json_get_double(v, "rope_theta", what, 1e-3, 1e12, &c->rope_theta);
        if (!st) st = trill_json_get_double(v, "partial_rotary_factor", what, 1e-6, 1, &c->partial_rotary_factor);
        if (st) return st;
    }
    trill_status st = trill_json_get_double(root, "rope_theta", what, 1e-3, 1e12, &c->rope_theta);
    if (!st) st = trill_json_get_double(root, "partial_rotary_factor", what, 1e-6, 1, &c->partial_rotary_factor);
    return st;
}

trill_status trill_arch_get_int_or_null(const json_t *root, const char *key, const char *what, int lo, int hi, int *out) {
    const json_t *v = json_object_get(root, key);
    if (v && json_is_null(v)) {
        *out = 0;
        return TRILL_OK;
    }
    return trill_json_get_int(root, key, what, lo, hi, out);
}

trill_status trill_arch_read_layer_kinds(const json_t *root, const char *what, trill_config *c, const char *flagged, const char *other,
                                        bool *flags) {
    const json_t *v = json_object_get(root, "layer_types");
    if (!v || json_is_null(v)) return TRILL_OK;
    if (!json_is_array(v) || json_array_size(v) != (size_t)c->num_hidden_layers)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"layer_types\": expected a list of %d entries (one per layer), got %s", what,
                           c->num_hidden_layers, json_is_array(v) ? "another length" : trill_json_type_name(v));
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const char *t = json_string_value(json_array_get(v, (size_t)l));
        if (!t || (strcmp(t, other) != 0 && strcmp(t, flagged) != 0))
            return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"layer_types\": entry %d: expected \"%s\" or \"%s\"", what, l, other, flagged);
        flags[l] = strcmp(t, flagged) == 0;
    }
    return TRILL_OK;
}

trill_status trill_arch_read_layer_types(const json_t *root, const char *what, trill_config *c) {
    return trill_arch_read_layer_kinds(root, what, c, "sliding_attention", "full_attention", c->sliding_layer);
}

trill_status trill_arch_read_mlp_only_layers(const json_t *root, const char *what, trill_config *c) {
    const json_t *v = json_object_get(root, "mlp_only_layers");
    if (!v || json_is_null(v)) return TRILL_OK;
    if (!json_is_array(v))
        return trill_error(TRILL_ERR_INVALID, "%s: field \"mlp_only_layers\": expected a list of layer indices, got %s", what, trill_json_type_name(v));
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= c->num_hidden_layers)
            return trill_error(TRILL_ERR_INVALID, "%s: field \"mlp_only_layers\": entry %zu: expected a layer index in [0, %d)", what, i,
                               c->num_hidden_layers);
        c->mlp_only[json_integer_value(x)] = true;
    }
    return TRILL_OK;
}

trill_status trill_arch_check_gqa_moe(const trill_config *c, const char *what, const char *experts_field) {
    if (c->head_dim < 2 || c->head_dim % 2)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"head_dim\": %d must be even and at least 2 (RoPE)", what, c->head_dim);
    if (c->num_attention_heads % c->num_key_value_heads)
        return trill_error(TRILL_ERR_INVALID, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", what,
                           c->num_attention_heads, c->num_key_value_heads);
    if (c->num_experts_per_tok > c->num_experts)
        return trill_error(TRILL_ERR_INVALID, "%s: field \"num_experts_per_tok\": %d must be in [1, %s=%d]", what, c->num_experts_per_tok,
                           experts_field, c->num_experts);
    return TRILL_OK;
}

trill_status trill_arch_refuse_partial_rope(const trill_config *c, const char *what) {
    if (c->partial_rotary_factor == 1.0) return TRILL_OK;
    return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"partial_rotary_factor\": %g is not supported for %s (expected 1: RoPE on the whole head)",
                       what, c->partial_rotary_factor, trill_config_architecture(c));
}

trill_status trill_arch_refuse_true(const json_t *root, const char *key, const char *what) {
    bool flag = false;
    trill_status st = trill_json_get_bool(root, key, what, &flag);
    if (st) return st;
    if (flag) return trill_error(TRILL_ERR_UNSUPPORTED, "%s: field \"%s\": true is not supported (expected false)", what, key);
    return TRILL_OK;
}

int trill_param_file_shape(const trill_config *c, const trill_param *p, int64_t *shape) {
    if (p->kind == TRILL_TENSOR_CONV) {
        const int64_t K = c->linear_conv_kernel_dim;
        shape[0] = p->whole_shape[0] / K, shape[1] = 1, shape[2] = K;
        return 3;
    }
    for (int d = 0; d < p->ndim; d++) shape[d] = p->whole_shape[d];
    return p->ndim;
}
