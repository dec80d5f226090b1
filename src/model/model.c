#include "model/config_json.h"
#include "base/alloc.h"
#include "model/model_internal.h"
#include "trill/kernels.h"
#include "trill/model.h"
#include "text/tokenizer_json.h"
#include "trill/tokenizer.h"

#include "arch/family.h"

#include <assert.h>
#include <math.h>
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
    const int64_t (*whole)[2]; /* tensor parallelism: [tensor] the whole model's shapes */
} layout;

static void place(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    layout *L = ctx;
    trill_model *m = L->m;
    const bool half = t->ndim == 2 && m->storage == TRILL_BF16, held = trill_model_holds(m, t);
    if (m->tensors) {
        trill_param *p = &m->tensors[L->n];
        *p = *t;
        for (int d = 0; L->whole && d < p->ndim; d++) { /* a slice: this rank's rows or columns of the whole tensor */
            p->whole_shape[d] = L->whole[L->n][d];
            p->slice_at[d] = p->whole_shape[d] != p->shape[d] ? (int64_t)m->tp_rank * p->shape[d] : 0;
        }
        if (L->whole && p->split == TRILL_SPLIT_CHANNELS) { /* its heads' channels of q, of k and of v */
            const trill_config *l = &m->config, *w = &m->whole_config;
            const int64_t kl = (int64_t)l->linear_num_key_heads * l->linear_key_head_dim, kw = (int64_t)w->linear_num_key_heads * w->linear_key_head_dim;
            const int64_t vl = (int64_t)l->linear_num_value_heads * l->linear_value_head_dim, r = m->tp_rank;
            p->chan_len[0] = p->chan_len[1] = kl;
            p->chan_at[0] = r * kl, p->chan_at[1] = kw + r * kl, p->chan_at[2] = 2 * kw + r * vl;
        }
        p->data = held && !half && m->params ? m->params + L->n32 : NULL;
        p->bf16 = held && half && m->params_bf16 ? m->params_bf16 + L->n16 : NULL;
        /* the held experts of a row follow its first */
        if (held && row->field != TRILL_NO_FIELD && (t->expert < 0 || t->expert == m->expert_first)) {
            char *base = t->layer >= 0 ? (char *)trill_model_layer(m, t->layer) : (char *)m;
            if (t->ndim == 2) *(trill_weight *)(base + row->field) = (trill_weight){ p->data, p->bf16 };
            else *(float **)(base + row->field) = p->data;
        }
    }
    if (held) *(half ? &L->n16 : &L->n32) += t->numel;
    L->n++;
}

static void walk_layout(layout *L) {
    trill_model *m = L->m;
    trill_arch_walk(&m->config, place, L);
    if (m->config.num_labels == 0 && m->config.tie_word_embeddings) m->lm_head = m->embed;
}

/* The config of tensor-parallel share: its heads and its part of the dense MLPs' width. */
static trill_status tp_config(const trill_config *c, int tp, trill_config *out) {
    *out = *c;
    if (tp == 1) return TRILL_OK;
    bool linear = false;
    for (int l = 0; l < c->num_hidden_layers; l++) linear |= c->linear_layer[l];
    const bool dense = c->n_moe_layers < c->num_hidden_layers;
    if (c->num_attention_heads % tp || c->num_key_value_heads % tp || (dense && c->intermediate_size % tp))
        return trill_error(TRILL_ERR_INVALID, "parallel.trainer.tp: %d tensor-parallel ranks split the attention heads (%d, %d key-value) "
                           "%sinto equal shares, but %d does not divide them", tp, c->num_attention_heads, c->num_key_value_heads,
                           dense ? "and the dense MLPs' intermediate_size " : "", tp);
    if (linear && c->linear_num_key_heads % tp) /* Gated DeltaNet: a rank takes whole key heads with their value heads */
        return trill_error(TRILL_ERR_INVALID, "parallel.trainer.tp: %d tensor-parallel ranks split the Gated DeltaNet layers' key heads "
                           "(linear_num_key_heads %d) into equal shares, but %d does not divide them", tp, c->linear_num_key_heads, tp);
    if (linear) out->linear_num_key_heads /= tp, out->linear_num_value_heads /= tp;
    out->num_attention_heads /= tp;
    out->num_key_value_heads /= tp;
    if (dense) out->intermediate_size /= tp;
    return TRILL_OK;
}

static void note_shape(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    (void)row;
    int64_t (*whole)[2] = ctx;
    whole[t->index][0] = t->shape[0];
    whole[t->index][1] = t->shape[1];
}

trill_status trill_model_create_shard(const trill_config *config, trill_dtype storage, const trill_shard *shard, trill_model **out) {
    const trill_shard whole_model = { 0, 1, 0, 1 }, *sh = shard ? shard : &whole_model;
    if (storage != TRILL_F32 && storage != TRILL_BF16)
        return trill_error(TRILL_ERR_INVALID, "model storage must be F32 or BF16, not %s", trill_dtype_name(storage));
    if (sh->ep_size < 1 || sh->ep_rank < 0 || sh->ep_rank >= sh->ep_size || sh->tp_size < 1 || sh->tp_rank < 0 || sh->tp_rank >= sh->tp_size)
        return trill_error(TRILL_ERR_INVALID, "model shard: expert-parallel rank %d of %d, tensor-parallel rank %d of %d", sh->ep_rank, sh->ep_size,
                           sh->tp_rank, sh->tp_size);
    if (sh->ep_size > 1 && (config->n_moe_layers == 0 || config->num_experts % sh->ep_size != 0))
        return trill_error(TRILL_ERR_INVALID, "parallel.trainer.ep: %d expert-parallel ranks need routed experts in a multiple of %d, "
                           "but this %s has %d (in %d MoE layers)", sh->ep_size, sh->ep_size, trill_config_architecture(config),
                           config->num_experts, config->n_moe_layers);
    trill_config local;
    trill_status st = tp_config(config, sh->tp_size, &local);
    if (st) return st;
    trill_model *m = trill_calloc(1, sizeof *m);
    if (!m) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    m->config = local;
    m->whole_config = *config;
    m->checkpoint_dtype = TRILL_F32;
    m->storage = storage;
    m->ep_rank = sh->ep_rank;
    m->ep_size = sh->ep_size;
    m->tp_rank = sh->tp_rank;
    m->tp_size = sh->tp_size;
    m->expert_count = config->num_experts / sh->ep_size;
    m->expert_first = sh->ep_rank * m->expert_count;
    m->layer_size = sizeof(trill_decoder_weights);
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
    int64_t (*whole)[2] = sh->tp_size > 1 ? trill_calloc(m->n_tensors ? m->n_tensors : 1, sizeof *whole) : NULL;
    if (!m->layers || !m->params || !m->tensors || (storage == TRILL_BF16 && !m->params_bf16) || (sh->tp_size > 1 && !whole)) {
        free(whole);
        trill_model_free(m);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for %zu parameters (%.1f GB)", L.n32 + L.n16,
                           (L.n32 * 4.0 + L.n16 * 2.0) * 1e-9);
    }
    if (whole) trill_arch_walk(config, note_shape, whole); /* the same tensors in the same order */
    L = (layout){ .m = m, .whole = (const int64_t(*)[2])whole };
    walk_layout(&L); /* set names and pointers */
    free(whole);
    *out = m;
    return TRILL_OK;
}

trill_status trill_model_create_stored(const trill_config *config, trill_dtype storage, trill_model **out) {
    return trill_model_create_shard(config, storage, NULL, out);
}

trill_status trill_model_create(const trill_config *config, trill_model **out) {
    return trill_model_create_stored(config, TRILL_F32, out);
}

void trill_model_free(trill_model *m) {
    if (!m) return;
    trill_model_ep_free(m);
    free(m->params);
    free(m->params_bf16);
    free(m->tensors);
    free(m->layers);
    free(m);
}

/* Element i of p's share in the whole tensor (i itself unless the model is a tensor-parallel share:
 * a vector's rows from slice_at, a conv's by its channels). */
static size_t whole_index(const trill_model *m, const trill_param *p, size_t i) {
    if (p->chan_len[0]) { /* a conv's channels, K values each */
        const size_t K = (size_t)m->config.linear_conv_kernel_dim;
        return (size_t)trill_param_whole_row(p, (int64_t)(i / K)) * K + i % K;
    }
    return (size_t)p->slice_at[0] + i;
}

/* HF's initial values of a vector's element i: RMSNorm weights one (zero-centred ones zero),
 * biases zero, attention sinks and a conv1d's weight N(0, std) (the conv as nn.Linear's default
 * scale would have it is the caller's std), Gated DeltaNet's dt_bias one and A_log log(U(0, 16)). */
static float init_vector(const trill_config *c, const trill_param *p, float std, uint64_t key, size_t i) {
    switch (p->kind) {
    case TRILL_TENSOR_NORM: return trill_norm_centered(c, p->role) ? 0.0f : 1.0f;
    case TRILL_TENSOR_SINKS:
    case TRILL_TENSOR_CONV: return std * (float)trill_rng_normal(key, i);
    case TRILL_TENSOR_DECAY:
        if (p->role == TRILL_ROLE_GDN_A_LOG) return logf(16.0f * (float)trill_rng_uniform(key, i) + 1e-6f); /* HF: uniform_(0, 16).log_() */
        return 1.0f;
    default: return 0.0f;
    }
}

void trill_model_init_random(trill_model *m, uint64_t seed) {
    const float std = (float)m->config.initializer_range;
    for (size_t t = 0; t < m->n_tensors; t++) {
        trill_param *p = &m->tensors[t];
        if (!trill_model_holds(m, p)) continue; /* another shard's expert: its key is its index all the same */
        uint64_t key = trill_rng_key(seed, t);
        if (p->ndim == 1) {
            for (size_t i = 0; i < p->numel; i++) p->data[i] = init_vector(&m->config, p, std, key, whole_index(m, p, i));
            continue;
        }
        /* a tensor-parallel slice draws its elements of the whole tensor: the whole model's values */
        const size_t cols = (size_t)p->shape[1], wcols = (size_t)p->whole_shape[1], c0 = (size_t)p->slice_at[1];
#define AT(i) ((size_t)trill_param_whole_row(p, (int64_t)((i) / cols)) * wcols + c0 + (i) % cols)
        if (p->bf16) {
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < p->numel; i++) p->bf16[i] = trill_f32_to_bf16(std * (float)trill_rng_normal(key, AT(i)));
        } else {
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < p->numel; i++) p->data[i] = std * (float)trill_rng_normal(key, AT(i));
        }
#undef AT
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

/* "X.weight" stored F8_E4M3 comes with "X.weight_scale_inv": its F32 scale per block. */
#define SCALE_SUFFIX "_scale_inv"

/* W[i, j] = e4m3(W[i, j]) * scale_inv[i / R][j / C] into the tensor's storage: fp32, or bf16 (the
 * fp32 product rounded, as DeepSeek's and HF's dequantization to bf16 round it). A
 * tensor-parallel slice takes its rows and columns of the whole tensor, each with its own block's
 * scale. */
static void dequantize_fp8(const trill_param *p, const trill_tensor_view *w, const trill_tensor_view *s, const int block[2]) {
    const size_t rows = (size_t)p->shape[0], cols = (size_t)p->shape[1], wcols = (size_t)p->whole_shape[1], grid_cols = (size_t)s->shape[1];
    const size_t r0 = (size_t)p->slice_at[0], c0 = (size_t)p->slice_at[1];
    const unsigned char *codes = w->data, *scales = s->data;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols;) { /* the run of columns up to the end of this block */
            const size_t gi = r0 + i, gj = c0 + j, b = gj / (size_t)block[1];
            const size_t end = (b + 1) * (size_t)block[1] - c0, n = (end < cols ? end : cols) - j;
            float scale;
            memcpy(&scale, scales + sizeof scale * ((gi / (size_t)block[0]) * grid_cols + b), sizeof scale); /* may be unaligned */
            if (p->bf16) trill_e4m3_scaled(p->bf16 + i * cols + j, TRILL_BF16, codes + gi * wcols + gj, n, scale);
            else trill_e4m3_scaled(p->data + i * cols + j, TRILL_F32, codes + gi * wcols + gj, n, scale);
            j += n;
        }
}

/* The block scales of p, stored F8_E4M3 as v: the config's block size, then "<name>_scale_inv",
 * F32, one per block of [R, C] of the whole tensor (the last row and column of blocks may be
 * partial). */
static trill_status fp8_scales(const trill_model *m, const trill_checkpoint *ck, const char *dir, const trill_param *p,
                               const trill_tensor_view **out) {
    const int *block = m->config.fp8_block;
    if (block[0] == 0)
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\" is F8_E4M3 but config.json has no fp8 \"quantization_config\" "
                           "(expected F32, BF16 or F16 without one)", dir, p->name);
    if (p->ndim != 2)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: tensor \"%s\" is F8_E4M3, which trill reads for matrices only (expected F32, BF16 or F16)",
                           dir, p->name);
    char name[sizeof p->name + sizeof SCALE_SUFFIX], want[64], got[64];
    snprintf(name, sizeof name, "%s" SCALE_SUFFIX, p->name);
    const trill_tensor_view *s = trill_checkpoint_find(ck, name);
    if (!s)
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\" is F8_E4M3 but \"%s\" is missing (expected its F32 scale per %dx%d block)",
                           dir, p->name, name, block[0], block[1]);
    if (s->dtype != TRILL_F32)
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\" is %s, expected F32 (the block scales of F8_E4M3 \"%s\")", s->path, name,
                           trill_dtype_name(s->dtype), p->name);
    const int64_t grid[2] = { (p->whole_shape[0] + block[0] - 1) / block[0], (p->whole_shape[1] + block[1] - 1) / block[1] };
    if (s->ndim != 2 || s->shape[0] != grid[0] || s->shape[1] != grid[1]) {
        format_shape(got, sizeof got, s->ndim, s->shape);
        format_shape(want, sizeof want, 2, grid);
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": shape: got %s, expected %s (a scale per %dx%d block of \"%s\" [%lld, %lld])",
                           s->path, name, got, want, block[0], block[1], p->name, (long long)p->whole_shape[0], (long long)p->whole_shape[1]);
    }
    *out = s;
    return TRILL_OK;
}

/* ---- routed experts the checkpoint stacks (gpt-oss: trill_stacked, src/arch/family.h) ---- */

/* MXFP4's E2M1 codes (OCP MX: 1 sign, 2 exponent, 1 mantissa bit), as HF's FP4_VALUES. */
static const float FP4_E2M1[16] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f };

/* Whether view v has shape `want` (n dims); else the error names it. */
static trill_status check_shape(const trill_tensor_view *v, const char *what, int n, const int64_t *want, trill_dtype dtype, bool exact_dtype) {
    char w[96], g[96];
    bool same = v->ndim == n;
    for (int d = 0; same && d < n; d++) same = v->shape[d] == want[d];
    if (!same) {
        format_shape(g, sizeof g, v->ndim, v->shape);
        format_shape(w, sizeof w, n, want);
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": shape %s does not match config.json (expected %s, %s)", v->path, v->name, g, w, what);
    }
    if (exact_dtype ? v->dtype != dtype : (v->dtype == TRILL_U8 || v->dtype == TRILL_F8_E4M3))
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": dtype %s, expected %s (%s)", v->path, v->name, trill_dtype_name(v->dtype),
                           exact_dtype ? trill_dtype_name(dtype) : "F32, BF16 or F16", what);
    return TRILL_OK;
}

/* Where element (i, j) of expert e's [R, C] part (a vector: C 1, j 0) sits in its stacked tensor
 * sk (trill_stacked: HF's x @ W layout [E, C, R S] with the parts interleaved, or nn.Linear's [E,
 * S R, C] with the parts one after the other), and that tensor's shape (its ndim returned). */
static size_t stacked_at(const trill_stacked *sk, int64_t e, int64_t R, int64_t C, int64_t i, int64_t j) {
    const int64_t S = sk->stride;
    if (sk->linear) return (size_t)(((e * S + sk->offset) * R + i) * C + j);
    return (size_t)((e * C + j) * R * S + i * S + sk->offset);
}

static int stacked_shape(const trill_stacked *sk, int64_t E, int64_t R, int64_t C, bool matrix, int64_t *shape) {
    const int64_t S = sk->stride;
    shape[0] = E;
    if (!matrix) return shape[1] = R * S, 2;
    shape[1] = sk->linear ? R * S : C;
    shape[2] = sk->linear ? C : R * S;
    return 3;
}

static void store(const trill_param *p, size_t i, float x) {
    if (p->bf16) p->bf16[i] = trill_f32_to_bf16(x);
    else p->data[i] = x;
}

/* Expert p's part of the layer's stacked tensor sk: a matrix [R, C] from [E, C, R * stride]
 * (element (i, j) at [e][j][i * stride + offset]) or, MXFP4, from "<name>_blocks" [E, R * stride,
 * C / 32, 16] and "<name>_scales" [E, R * stride, C / 32] (element (i, j) of row r = i * stride +
 * offset: code j % 32 of block j / 32, the low nibble of byte (j % 32) / 2 for even j, the high
 * for odd, times 2^(scale - 127), as HF's convert_moe_packed_tensors); a vector [N] from [E, N *
 * stride]. A tensor-parallel slice takes its rows and columns of the whole. */
static trill_status load_stacked(const trill_model *m, const trill_checkpoint *ck, const char *dir, const trill_param *p, const trill_stacked *sk) {
    char name[sizeof p->name + 16], part[sizeof name + 8], what[sizeof name + 64];
    snprintf(name, sizeof name, sk->name, p->layer);
    snprintf(what, sizeof what, "expert %d's %s of it", p->expert, p->name);
    const int64_t E = m->whole_config.num_experts, R = p->whole_shape[0], C = p->ndim == 2 ? p->whole_shape[1] : 1;
    const int64_t S = sk->stride, e = p->expert, r0 = p->slice_at[0], c0 = p->slice_at[1];
    const size_t rows = (size_t)p->shape[0], cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
    const trill_tensor_view *v = trill_checkpoint_find(ck, name);
    trill_status st;
    if (!v && p->ndim == 2 && m->config.mxfp4 && !sk->linear) {
        snprintf(part, sizeof part, "%s_blocks", name);
        const trill_tensor_view *blocks = trill_checkpoint_find(ck, part);
        snprintf(part, sizeof part, "%s_scales", name);
        const trill_tensor_view *scales = trill_checkpoint_find(ck, part);
        if (!blocks || !scales)
            return trill_error(TRILL_ERR_INVALID, "%s: missing tensor \"%s\" (or MXFP4's \"%s_blocks\" and \"%s_scales\"): expected from config.json", dir,
                               name, name, name);
        if (C % 32)
            return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s_blocks\": MXFP4 needs the input width %lld to be a multiple of 32", dir, name, (long long)C);
        const int64_t bshape[4] = { E, R * S, C / 32, 16 };
        if ((st = check_shape(blocks, "MXFP4 codes", 4, bshape, TRILL_U8, true)) || (st = check_shape(scales, "E8M0 scales", 3, bshape, TRILL_U8, true)))
            return st;
        const unsigned char *code = blocks->data, *scale = scales->data;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < rows; i++) {
            const size_t row = (size_t)(e * R * S + ((int64_t)i + r0) * S + sk->offset); /* [E, R*S] flattened */
            for (size_t j = 0; j < cols; j++) {
                const size_t gj = j + (size_t)c0, b = gj / 32, k = gj % 32;
                const unsigned char byte = code[(row * (size_t)(C / 32) + b) * 16 + k / 2];
                store(p, i * cols + j, ldexpf(FP4_E2M1[k % 2 ? byte >> 4 : byte & 15], (int)scale[row * (size_t)(C / 32) + b] - 127));
            }
        }
        return TRILL_OK;
    }
    if (!v) return trill_error(TRILL_ERR_INVALID, "%s: missing tensor \"%s\" (expected from config.json: the layer's stacked experts)", dir, name);
    int64_t want[3];
    const int nd = stacked_shape(sk, E, R, C, p->ndim == 2, want);
    if ((st = check_shape(v, what, nd, want, TRILL_F32, false))) return st;
    const size_t elem = trill_dtype_size(v->dtype);
    const char *base = v->data;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            const size_t at = stacked_at(sk, e, R, C, (int64_t)i + r0, (int64_t)j + c0);
            float x;
            trill_to_f32(&x, base + at * elem, v->dtype, 1);
            store(p, i * cols + j, x);
        }
    return TRILL_OK;
}

/* One expected tensor: present, the right (whole) shape; widened into its storage, or
 * dequantized; a tensor-parallel slice copies its rows and columns of it. */
static trill_status load_tensor(const trill_model *m, const trill_checkpoint *ck, const char *dir, const trill_param *p) {
    const trill_stacked *sk = trill_arch_stacked(&m->config, p);
    if (sk) return load_stacked(m, ck, dir, p, sk);
    const trill_tensor_view *v = trill_checkpoint_find(ck, p->name), *scales = NULL;
    char want[64], got[64];
    int64_t file_shape[3];
    const int file_ndim = trill_param_file_shape(&m->config, p, file_shape);
    format_shape(want, sizeof want, file_ndim, file_shape);
    if (!v) return trill_error(TRILL_ERR_INVALID, "%s: missing tensor \"%s\" (expected shape %s from config.json)", dir, p->name, want);
    bool same = v->ndim == file_ndim;
    for (int d = 0; same && d < file_ndim; d++) same = v->shape[d] == file_shape[d];
    if (!same) {
        format_shape(got, sizeof got, v->ndim, v->shape);
        return trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": shape %s does not match config.json (expected %s)", v->path, p->name, got, want);
    }
    if (v->dtype == TRILL_F8_E4M3) {
        trill_status st = fp8_scales(m, ck, dir, p, &scales);
        if (!st) dequantize_fp8(p, v, scales, m->config.fp8_block);
        return st;
    }
    const size_t rows = p->ndim == 2 ? (size_t)p->shape[0] : 1, cols = p->ndim == 2 ? (size_t)p->shape[1] : p->numel;
    const size_t wcols = p->ndim == 2 ? (size_t)p->whole_shape[1] : cols, elem = trill_dtype_size(v->dtype);
    if (p->chan_len[0] && p->ndim == 1) { /* a share's conv: its heads' channels of q, k and v */
        for (size_t i = 0; i < p->numel; i++) trill_to_f32(p->data + i, (const char *)v->data + whole_index(m, p, i) * elem, v->dtype, 1);
        return TRILL_OK;
    }
    for (size_t i = 0; i < rows; i++) { /* row by row: a slice's are strided in the whole tensor */
        const char *src = (const char *)v->data + ((size_t)trill_param_whole_row(p, (int64_t)i) * wcols + (size_t)p->slice_at[1]) * elem;
        if (p->bf16) { /* chosen only when every matrix is BF16 or F8_E4M3 (matrices_fit_bf16) */
            assert(v->dtype == TRILL_BF16);
            memcpy(p->bf16 + i * cols, src, cols * sizeof(uint16_t));
        } else {
            trill_to_f32(p->data + i * cols, src, v->dtype, cols);
        }
    }
    return TRILL_OK;
}

static bool is_expected(const trill_param *const *sorted, size_t n, const char *name) {
    trill_param key;
    if (strlen(name) >= sizeof key.name) return false;
    snprintf(key.name, sizeof key.name, "%s", name);
    const trill_param *kp = &key;
    return bsearch(&kp, sorted, n, sizeof *sorted, cmp_param_name) != NULL;
}

/* Whether a checkpoint tensor is one of the MTP module's layers, stored after the decoder's
 * (num_nextn_predict_layers of them: DeepSeek-V3's "model.layers.61.*"), which HF does not load
 * either. The layers' name prefix is the family's first per-layer row's, up to its index. */
static bool in_mtp_layer(const trill_config *c, const char *name) {
    if (c->num_nextn_predict_layers == 0) return false;
    const trill_family *f = trill_family_of(c);
    for (int r = 0; r < f->n_rows; r++) {
        const char *pattern = f->rows[r].name, *at = strstr(pattern, "%d");
        if (f->rows[r].scope == TRILL_ROW_GLOBAL || !at) continue;
        const size_t n = (size_t)(at - pattern);
        if (strncmp(name, pattern, n) != 0 || name[n] < '0' || name[n] > '9') return false;
        char *end;
        const long l = strtol(name + n, &end, 10);
        return *end == at[2] && l >= c->num_hidden_layers && l < (long)c->num_hidden_layers + c->num_nextn_predict_layers;
    }
    return false;
}

/* Whether `name` is one of the family's stacked expert tensors (trill_stacked) of a layer below
 * the config's count, or their MXFP4 _blocks and _scales. */
static bool is_stacked(const trill_config *c, const char *name) {
    const trill_family *f = trill_family_of(c);
    for (int i = 0; i < f->n_stacked; i++) {
        const char *pattern = f->stacked[i].name, *at = strstr(pattern, "%d");
        const size_t n = (size_t)(at - pattern);
        if (strncmp(name, pattern, n) != 0 || name[n] < '0' || name[n] > '9') continue;
        char *end;
        const long l = strtol(name + n, &end, 10);
        const size_t k = strlen(at + 2);
        if (l >= c->num_hidden_layers || strncmp(end, at + 2, k) != 0) continue;
        if (!end[k] || (c->mxfp4 && (!strcmp(end + k, "_blocks") || !strcmp(end + k, "_scales")))) return true;
    }
    return false;
}

/* Whether checkpoint tensor v is read or knowingly left: an expected tensor, the scales of an
 * F8_E4M3 one, a stacked experts' tensor, a stored copy of a tied lm_head (HF ties it to the
 * embedding and ignores the copy; so do we), the MTP layers, the family's ignored tensors. */
static bool consumed(const trill_model *m, const trill_checkpoint *ck, const trill_param *const *sorted, const trill_tensor_view *v) {
    if (is_expected(sorted, m->n_tensors, v->name) || is_stacked(&m->config, v->name)) return true;
    const size_t n = strlen(v->name), k = strlen(SCALE_SUFFIX);
    if (n > k && n - k < sizeof sorted[0]->name && strcmp(v->name + n - k, SCALE_SUFFIX) == 0) {
        char weight[sizeof sorted[0]->name];
        snprintf(weight, sizeof weight, "%.*s", (int)(n - k), v->name);
        const trill_tensor_view *w = trill_checkpoint_find(ck, weight);
        if (w && w->dtype == TRILL_F8_E4M3 && is_expected(sorted, m->n_tensors, weight)) return true;
    }
    if (m->config.tie_word_embeddings && m->config.num_labels == 0 && strcmp(v->name, "lm_head.weight") == 0) return true;
    for (const char *const *p = trill_family_of(&m->config)->ignored_prefixes; p && *p; p++)
        if (strncmp(v->name, *p, strlen(*p)) == 0) return true;
    return in_mtp_layer(&m->config, v->name);
}

static trill_status fill_params(trill_model *m, const trill_checkpoint *ck, const char *dir) {
    trill_status st = TRILL_OK;
    for (size_t t = 0; t < m->n_tensors && !st; t++) /* a shard reads its own tensors' pages of the mapped files only */
        if (trill_model_holds(m, &m->tensors[t])) st = load_tensor(m, ck, dir, &m->tensors[t]);
    if (st) return st;
    /* F8_E4M3 weights are held, and saved, as their dequantized values: trill writes no FP8 */
    const trill_dtype first = m->n_tensors ? trill_checkpoint_find(ck, m->tensors[0].name)->dtype : TRILL_F32;
    m->checkpoint_dtype = first == TRILL_F8_E4M3 ? TRILL_BF16 : first;

    /* and nothing else: an unexpected tensor means the config and weights disagree */
    const trill_param **sorted = trill_malloc((m->n_tensors ? m->n_tensors : 1) * sizeof *sorted);
    if (!sorted) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t t = 0; t < m->n_tensors; t++) sorted[t] = &m->tensors[t];
    qsort(sorted, m->n_tensors, sizeof *sorted, cmp_param_name);
    for (size_t i = 0; i < trill_checkpoint_count(ck) && !st; i++) {
        const trill_tensor_view *v = trill_checkpoint_tensor(ck, i);
        if (!consumed(m, ck, sorted, v))
            st = trill_error(TRILL_ERR_INVALID, "%s: unexpected tensor \"%s\" (not part of a %s with this config.json)", v->path, v->name,
                             trill_config_architecture(&m->config));
    }
    free(sorted);
    return st;
}

/* bf16 storage keeps the matrices as the checkpoint has them only if every one is BF16, or
 * F8_E4M3: dequantized and rounded to bf16, what DeepSeek's and HF's conversions of an FP8
 * checkpoint hold (8 significant bits where the FP8 codes have 4), in half fp32's memory. */
typedef struct bf16_fit { const trill_checkpoint *ck; bool fits; const trill_config *c; } bf16_fit;

static void check_bf16_fit(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    bf16_fit *f = ctx;
    const trill_stacked *sk = t->ndim == 2 ? trill_arch_stacked(f->c, t) : NULL;
    char name[sizeof t->name + 16];
    if (sk) snprintf(name, sizeof name, sk->name, t->layer); /* absent: MXFP4, exact in bf16 */
    const trill_tensor_view *v = t->ndim == 2 ? trill_checkpoint_find(f->ck, sk ? name : t->name) : NULL;
    if (v && v->dtype != TRILL_BF16 && v->dtype != TRILL_F8_E4M3) f->fits = false;
}

static bool matrices_fit_bf16(const trill_config *c, const trill_checkpoint *ck) {
    bf16_fit f = { ck, trill_checkpoint_count(ck) > 0, c };
    trill_arch_walk(c, check_bf16_fit, &f);
    return f.fits;
}

trill_status trill_model_load(const char *dir, trill_model **out) { return trill_model_load_as(dir, TRILL_STORE_F32, out); }

trill_status trill_model_load_as(const char *dir, trill_storage storage, trill_model **out) {
    return trill_model_load_shard(dir, storage, NULL, out);
}

trill_status trill_model_load_shard(const char *dir, trill_storage storage, const trill_shard *shard, trill_model **out) {
    char *config_path = trill_path_join(dir, "config.json");
    if (!config_path) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    trill_config config;
    trill_status st = trill_config_load(config_path, &config);
    free(config_path);
    if (st) return st;
    trill_checkpoint *ck;
    if ((st = trill_checkpoint_open(dir, &ck))) return st;
    trill_model *m;
    const trill_dtype kept = storage == TRILL_STORE_CHECKPOINT && matrices_fit_bf16(&config, ck) ? TRILL_BF16 : TRILL_F32;
    if (!(st = trill_model_create_shard(&config, kept, shard, &m))) {
        if ((st = fill_params(m, ck, dir))) trill_model_free(m);
        else *out = m;
    }
    trill_checkpoint_close(ck);
    return st;
}

/* bf16 NaN and infinity have every exponent bit set. */
trill_status trill_model_check_finite(const trill_model *m) {
    for (size_t k = 0; k < m->n_tensors; k++) {
        const trill_param *p = &m->tensors[k];
        for (size_t i = 0; i < p->numel; i++)
            if (p->data ? !isfinite(p->data[i]) : (p->bf16[i] & 0x7f80u) == 0x7f80u)
                return trill_error(TRILL_ERR_INVALID, "weight %s[%zu] is not a finite number: refused", p->name, i);
    }
    return TRILL_OK;
}

/* The stacked tensors a save writes (fp32 buffers in HF's layout) and their names, each its own
 * allocation: the outputs point at them while the lists grow. */
typedef struct stacked_outs { float **buf; char **names; int n, cap; } stacked_outs;

/* Expert p's elements into its layer's stacked tensor (the inverse of load_stacked's read), made
 * and added to outs when p is its first member. */
static trill_status stack_expert(stacked_outs *so, const trill_model *m, const trill_param *p, const trill_stacked *sk, trill_tensor_out *outs,
                                 size_t *n) {
    char name[160];
    snprintf(name, sizeof name, sk->name, p->layer);
    const int64_t E = m->config.num_experts, R = p->shape[0], C = p->ndim == 2 ? p->shape[1] : 1, S = sk->stride;
    int k = so->n - 1; /* a stacked tensor's members are in consecutive rows: the last one made, or a new one */
    if (k < 0 || strcmp(so->names[k], name) != 0) {
        if (so->n == so->cap) {
            const int cap = so->cap ? 2 * so->cap : 16;
            float **b = realloc(so->buf, sizeof *b * (size_t)cap);
            if (b) so->buf = b;
            char **nm = b ? realloc(so->names, sizeof *nm * (size_t)cap) : NULL;
            if (!nm) return trill_error(TRILL_ERR_NOMEM, "out of memory");
            so->names = nm;
            so->cap = cap;
        }
        k = so->n;
        so->buf[k] = trill_malloc(sizeof(float) * (size_t)(E * C * R * S));
        so->names[k] = strdup(name);
        so->n++;
        if (!so->buf[k] || !so->names[k]) return trill_error(TRILL_ERR_NOMEM, "out of memory for %s", name);
        trill_tensor_out *o = &outs[(*n)++];
        *o = (trill_tensor_out){ .name = so->names[k], .data = so->buf[k], .src_dtype = TRILL_F32 };
        o->ndim = stacked_shape(sk, E, R, C, p->ndim == 2, o->shape);
    }
    float *dst = so->buf[k];
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < C; j++) {
            const size_t at = stacked_at(sk, p->expert, R, C, i, j), from = (size_t)(i * C + j);
            dst[at] = p->bf16 ? trill_bf16_to_f32(p->bf16[from]) : p->data[from];
        }
    return TRILL_OK;
}

trill_status trill_model_save(const trill_model *m, const char *dir, trill_dtype dtype, size_t max_shard_bytes) {
    if (m->ep_size > 1 || m->tp_size > 1)
        return trill_error(TRILL_ERR_UNSUPPORTED, "%s: this model is a shard (expert-parallel rank %d of %d, tensor-parallel rank %d of %d); a "
                           "checkpoint is written from the whole weights", dir, m->ep_rank, m->ep_size, m->tp_rank, m->tp_size);
    trill_status st = trill_mkdir_p(dir);
    if (st) return st;
    trill_tensor_out *outs = trill_calloc(m->n_tensors, sizeof *outs);
    stacked_outs so = { 0 };
    size_t n = 0;
    if (!outs) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (size_t t = 0; t < m->n_tensors && !st; t++) {
        const trill_param *p = &m->tensors[t];
        const trill_stacked *sk = trill_arch_stacked(&m->config, p);
        if (sk) { /* into the layer's stacked tensor, which takes the place of its first expert's */
            st = stack_expert(&so, m, p, sk, outs, &n);
            continue;
        }
        outs[n] = (trill_tensor_out){ .name = p->name, .data = p->bf16 ? (const void *)p->bf16 : p->data,
                                      .src_dtype = p->bf16 ? TRILL_BF16 : TRILL_F32 };
        outs[n].ndim = trill_param_file_shape(&m->config, p, outs[n].shape);
        n++;
    }
    if (!st) st = trill_checkpoint_write(dir, outs, n, dtype, max_shard_bytes);
    for (int i = 0; i < so.n; i++) free(so.buf[i]), free(so.names[i]);
    free(so.buf);
    free(so.names);
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
const trill_config *trill_model_whole_config(const trill_model *m) { return &m->whole_config; }
void trill_model_experts_held(const trill_model *m, int *first, int *count) {
    *first = m->expert_first;
    *count = m->expert_count;
}
trill_dtype trill_model_checkpoint_dtype(const trill_model *m) { return m->checkpoint_dtype; }
void trill_model_set_precision(trill_model *m, trill_precision p) { m->precision = p == TRILL_PRECISION_AUTO ? trill_kernels_precision_auto() : p; }
trill_precision trill_model_precision(const trill_model *m) { return m->precision; }
size_t trill_model_bytes(const trill_model *m) { return m->n_f32 * sizeof(float) + m->n_bf16 * sizeof(uint16_t); }
float *trill_model_params(trill_model *m, size_t *n) {
    *n = m->n_f32;
    return m->params;
}
