#include "model/config_json.h"
#include "base/alloc.h"
#include "model/model_internal.h"
#include "trill/model.h"
#include "model/tokenizer_json.h"
#include "trill/tokenizer.h"

#include "arch/family.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"
#include "base/json.h"
#include "trill/rng.h"
#include "trill/safetensors.h"

/* ---- layout ------------------------------------------------------------------------------
 * One walk over the family's tensor table (src/arch/) names every tensor in checkpoint order and
 * gives it a slice of a block. With the blocks not yet allocated it only counts; with them
 * allocated it also fills m->tensors and points the model's fields at the slices. Vectors (norm
 * weights, biases) always go to the fp32 block; matrices go to the block of m->storage. */

typedef struct layout {
    trill_model *m;
    size_t n32, n16; /* elements used so far in each block */
    size_t n;        /* tensors named so far */
} layout;

static void place(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    layout *L = ctx;
    trill_model *m = L->m;
    const bool half = t->ndim == 2 && m->storage == TRILL_BF16;
    if (m->tensors) {
        trill_param *p = &m->tensors[L->n];
        *p = *t;
        p->data = !half && m->params ? m->params + L->n32 : NULL;
        p->bf16 = half && m->params_bf16 ? m->params_bf16 + L->n16 : NULL;
        if (row->field != TRILL_NO_FIELD && t->expert <= 0) { /* experts after the first follow it */
            char *base = t->layer >= 0 ? (char *)trill_model_layer(m, t->layer) : (char *)m;
            if (t->ndim == 2) *(trill_weight *)(base + row->field) = (trill_weight){ p->data, p->bf16 };
            else *(float **)(base + row->field) = p->data;
        }
    }
    *(half ? &L->n16 : &L->n32) += t->numel;
    L->n++;
}

static void walk_layout(layout *L) {
    trill_model *m = L->m;
    trill_arch_walk(&m->config, place, L);
    if (m->config.num_labels == 0 && m->config.tie_word_embeddings) m->lm_head = m->embed;
}

trill_status trill_model_create_stored(const trill_config *config, trill_dtype storage, trill_model **out) {
    if (storage != TRILL_F32 && storage != TRILL_BF16)
        return trill_error(TRILL_ERR_INVALID, "model storage must be F32 or BF16, not %s", trill_dtype_name(storage));
    trill_model *m = trill_calloc(1, sizeof *m);
    if (!m) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    m->config = *config;
    m->checkpoint_dtype = TRILL_F32;
    m->storage = storage;
    m->layer_size = trill_family_of(config)->layer_size;
    m->layers = trill_calloc((size_t)config->num_hidden_layers, m->layer_size);
    layout L = { .m = m };
    if (m->layers) walk_layout(&L); /* count only */
    m->n_f32 = L.n32;
    m->n_bf16 = L.n16;
    m->n_params = L.n32 + L.n16;
    m->n_tensors = L.n;
    m->params = trill_calloc(m->n_f32 ? m->n_f32 : 1, sizeof(float));
    m->params_bf16 = storage == TRILL_BF16 ? trill_calloc(m->n_bf16 ? m->n_bf16 : 1, sizeof(uint16_t)) : NULL;
    m->tensors = trill_calloc(m->n_tensors, sizeof *m->tensors);
    if (!m->layers || !m->params || !m->tensors || (storage == TRILL_BF16 && !m->params_bf16)) {
        trill_model_free(m);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for %zu parameters (%.1f GB)", L.n32 + L.n16,
                           (L.n32 * 4.0 + L.n16 * 2.0) * 1e-9);
    }
    L = (layout){ .m = m };
    walk_layout(&L); /* set names and pointers */
    *out = m;
    return TRILL_OK;
}

trill_status trill_model_create(const trill_config *config, trill_model **out) {
    return trill_model_create_stored(config, TRILL_F32, out);
}

void trill_model_free(trill_model *m) {
    if (!m) return;
    free(m->params);
    free(m->params_bf16);
    free(m->tensors);
    free(m->layers);
    free(m);
}

void trill_model_init_random(trill_model *m, uint64_t seed) {
    const float std = (float)m->config.initializer_range;
    for (size_t t = 0; t < m->n_tensors; t++) {
        trill_param *p = &m->tensors[t];
        if (p->ndim == 1) { /* HF: RMSNorm weights start at one, biases at zero */
            for (size_t i = 0; i < p->numel; i++) p->data[i] = p->kind == TRILL_TENSOR_NORM ? 1.0f : 0.0f;
            continue;
        }
        uint64_t key = trill_rng_key(seed, t);
        if (p->bf16) {
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < p->numel; i++) p->bf16[i] = trill_f32_to_bf16(std * (float)trill_rng_normal(key, i));
        } else {
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < p->numel; i++) p->data[i] = std * (float)trill_rng_normal(key, i);
        }
    }
}

/* ---- checkpoints ------------------------------------------------------------------------- */

static int cmp_param_name(const void *a, const void *b) {
    return strcmp((*(const trill_param *const *)a)->name, (*(const trill_param *const *)b)->name);
}

static void format_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

static trill_status fill_params(trill_model *m, const trill_checkpoint *ck, const char *dir) {
    /* every expected tensor: present, right shape; widened into the block */
    trill_dtype first_dtype = TRILL_F32;
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        const trill_tensor_view *v = trill_checkpoint_find(ck, p->name);
        char want[64], got[64];
        format_shape(want, sizeof want, p->ndim, p->shape);
        if (!v)
            return trill_error(TRILL_ERR_INVALID, "%s: missing tensor \"%s\" (expected shape %s from config.json)",
                               dir, p->name, want);
        bool same = v->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++) same = v->shape[d] == p->shape[d];
        if (!same) {
            format_shape(got, sizeof got, v->ndim, v->shape);
            return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": shape %s does not match config.json (expected %s)",
                               v->path, p->name, got, want);
        }
        if (t == 0) first_dtype = v->dtype;
        if (p->bf16) memcpy(p->bf16, v->data, p->numel * sizeof(uint16_t)); /* only chosen for BF16 tensors */
        else trill_to_f32(p->data, v->data, v->dtype, p->numel);
    }
    m->checkpoint_dtype = first_dtype;

    /* and nothing else: an unexpected tensor means the config and weights disagree */
    const trill_param **sorted = trill_malloc(m->n_tensors * sizeof *sorted);
    if (!sorted) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t t = 0; t < m->n_tensors; t++) sorted[t] = &m->tensors[t];
    qsort(sorted, m->n_tensors, sizeof *sorted, cmp_param_name);
    trill_status st = TRILL_OK;
    for (size_t i = 0; i < trill_checkpoint_count(ck) && !st; i++) {
        const trill_tensor_view *v = trill_checkpoint_tensor(ck, i);
        trill_param key;
        snprintf(key.name, sizeof key.name, "%s", v->name);
        const trill_param *kp = &key;
        if (bsearch(&kp, sorted, m->n_tensors, sizeof *sorted, cmp_param_name)) continue;
        /* HF ties lm_head to the embedding and ignores a stored copy; so do we */
        if (m->config.tie_word_embeddings && m->config.num_labels == 0 && strcmp(v->name, "lm_head.weight") == 0) continue;
        st = trill_error(TRILL_ERR_INVALID, "%s: unexpected tensor \"%s\" (not part of a %s with this config.json)",
                         v->path, v->name, trill_config_architecture(&m->config));
    }
    free(sorted);
    return st;
}

/* bf16 storage keeps a checkpoint as it is only if every matrix in it is BF16 */
static bool matrices_all_bf16(const trill_checkpoint *ck) {
    for (size_t i = 0; i < trill_checkpoint_count(ck); i++) {
        const trill_tensor_view *v = trill_checkpoint_tensor(ck, i);
        if (v->ndim == 2 && v->dtype != TRILL_BF16) return false;
    }
    return trill_checkpoint_count(ck) > 0;
}

trill_status trill_model_load(const char *dir, trill_model **out) { return trill_model_load_as(dir, TRILL_STORE_F32, out); }

trill_status trill_model_load_as(const char *dir, trill_storage storage, trill_model **out) {
    char *config_path = trill_path_join(dir, "config.json");
    if (!config_path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_config config;
    trill_status st = trill_config_load(config_path, &config);
    free(config_path);
    if (st) return st;
    trill_checkpoint *ck;
    if ((st = trill_checkpoint_open(dir, &ck))) return st;
    trill_model *m;
    const trill_dtype kept = storage == TRILL_STORE_CHECKPOINT && matrices_all_bf16(ck) ? TRILL_BF16 : TRILL_F32;
    if (!(st = trill_model_create_stored(&config, kept, &m))) {
        if ((st = fill_params(m, ck, dir))) trill_model_free(m);
        else *out = m;
    }
    trill_checkpoint_close(ck);
    return st;
}

trill_status trill_model_save(const trill_model *m, const char *dir, trill_dtype dtype, size_t max_shard_bytes) {
    trill_status st = trill_mkdir_p(dir);
    if (st) return st;
    trill_tensor_out *outs = trill_calloc(m->n_tensors, sizeof *outs);
    if (!outs) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        outs[t] = (trill_tensor_out){ .name = p->name, .ndim = p->ndim, .data = p->bf16 ? (const void *)p->bf16 : p->data,
                                      .src_dtype = p->bf16 ? TRILL_BF16 : TRILL_F32 };
        memcpy(outs[t].shape, p->shape, sizeof p->shape);
    }
    st = trill_checkpoint_write(dir, outs, m->n_tensors, dtype, max_shard_bytes);
    free(outs);
    if (st) return st;
    char *config_path = trill_path_join(dir, "config.json");
    json_t *cj = trill_config_to_json(&m->config, dtype == TRILL_F32 ? "float32" : dtype == TRILL_BF16 ? "bfloat16" : "float16");
    st = config_path && cj ? trill_json_write_file(config_path, cj) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    json_decref(cj);
    free(config_path);
    return st;
}

trill_status trill_model_copy_side_files(const char *from_dir, const char *to_dir) {
    static const char *const names[] = { "tokenizer.json", "tokenizer_config.json", "generation_config.json" };
    trill_status st = TRILL_OK;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !st; i++) {
        char *from = trill_path_join(from_dir, names[i]), *to = trill_path_join(to_dir, names[i]), *data;
        size_t len;
        if (!from || !to) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else if (trill_file_exists(from) && !(st = trill_read_file(from, &data, &len))) {
            st = trill_write_file_atomic(to, data, len);
            free(data);
        }
        free(from);
        free(to);
    }
    return st;
}

trill_status trill_model_write_charlevel_files(const char *dir, const trill_config *c) {
    json_t *docs[3] = {
        trill_tokenizer_charlevel_json(),
        json_pack("{s:s, s:s, s:s, s:s, s:i}", "tokenizer_class", "PreTrainedTokenizerFast", "eos_token", "<|endoftext|>",
                  "pad_token", "<|endoftext|>", "unk_token", "<unk>", "model_max_length", c->max_position_embeddings),
        json_pack("{s:i, s:i, s:b}", "bos_token_id", c->bos_token_id, "eos_token_id", c->n_eos ? c->eos_token_ids[0] : 0, "do_sample", 1),
    };
    const char *names[3] = { "tokenizer.json", "tokenizer_config.json", "generation_config.json" };
    trill_status st = TRILL_OK;
    for (int i = 0; i < 3 && !st; i++) {
        char *path = trill_path_join(dir, names[i]);
        st = docs[i] && path ? trill_json_write_file(path, docs[i]) : trill_error(TRILL_ERR_NOMEM, "out of memory");
        free(path);
    }
    for (int i = 0; i < 3; i++) json_decref(docs[i]);
    return st;
}

const trill_config *trill_model_config(const trill_model *m) { return &m->config; }
size_t trill_model_n_params(const trill_model *m) { return m->n_params; }
const trill_param *trill_model_tensors(const trill_model *m, size_t *n) {
    *n = m->n_tensors;
    return m->tensors;
}
trill_dtype trill_model_storage(const trill_model *m) { return m->storage; }
trill_dtype trill_model_checkpoint_dtype(const trill_model *m) { return m->checkpoint_dtype; }
size_t trill_model_bytes(const trill_model *m) { return m->n_f32 * sizeof(float) + m->n_bf16 * sizeof(uint16_t); }
float *trill_model_params(trill_model *m, size_t *n) {
    *n = m->n_f32;
    return m->params;
}
