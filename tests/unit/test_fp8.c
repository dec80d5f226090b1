/* FP8 E4M3 block-scaled checkpoints, DeepSeek-V3's and Kimi K2's official format: the decoder
 * against known codes and an independent formula; a small DeepSeek-V3-family model written here
 * as such a checkpoint (16x12 blocks, partial at the edges) loads to its dequantized values
 * exactly, in fp32 and in bf16 storage, and saves as bf16 without a quantization_config; the
 * malformed cases are refused by name; the MTP layer's tensors are ignored when
 * num_nextn_predict_layers says so, and unexpected when it does not. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"
#include "model/config_json.h"
#include "trill/dtype.h"
#include "trill/fileio.h"
#include "trill/model.h"
#include "trill/rng.h"
#include "trill/safetensors.h"

#define assert_msg_has(needle)                                                                   \
    do {                                                                                         \
        const char *m_ = trill_error_message();                                                  \
        if (!strstr(m_, (needle))) fail_msg("message \"%s\" lacks \"%s\"", m_, (needle));        \
    } while (0)

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- the decoder ---------------------------------------------------------------------------- */

/* OCP E4M3FN from its definition: (-1)^s (1 + m/8) 2^(e-7), subnormals (m/8) 2^-6, S.1111.111 NaN. */
static float e4m3_formula(unsigned code) {
    const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7) return NAN;
    const double mag = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1 + m / 8.0, e - 7);
    return (float)(s ? -mag : mag);
}

static void test_decoder(void **state) {
    (void)state;
    const struct { uint8_t code; float value; } known[] = {
        { 0x7E, 448.0f }, { 0x01, 0x1p-9f }, { 0x08, 0x1p-6f }, { 0x38, 1.0f }, { 0xB8, -1.0f },
        { 0x07, 7 * 0x1p-9f }, { 0x3F, 1.875f }, { 0xFE, -448.0f }, { 0x00, 0.0f },
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (bits_of(trill_e4m3_to_f32(known[i].code)) != bits_of(known[i].value))
            fail_msg("0x%02X: %a, expected %a", known[i].code, trill_e4m3_to_f32(known[i].code), known[i].value);
    assert_true(signbit(trill_e4m3_to_f32(0x80)) && trill_e4m3_to_f32(0x80) == 0.0f);
    assert_true(isnan(trill_e4m3_to_f32(0x7F)) && isnan(trill_e4m3_to_f32(0xFF)));

    uint8_t codes[256];
    float all[256];
    for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
    trill_to_f32(all, codes, TRILL_F8_E4M3, 256);
    int nans = 0;
    for (int c = 0; c < 256; c++) {
        const float want = e4m3_formula((unsigned)c);
        nans += isnan(all[c]);
        if (isnan(want) ? !isnan(all[c]) : bits_of(all[c]) != bits_of(want))
            fail_msg("code 0x%02X: %a, expected %a", c, all[c], want);
        assert_true(bits_of(trill_e4m3_to_f32((uint8_t)c)) == bits_of(all[c]));
    }
    assert_int_equal(nans, 2);

    /* a scaled run: the fp32 product, then (bf16) rounded to nearest even */
    const float scale = 0x1.3579bdp-7f;
    float scaled[256];
    uint16_t half[256];
    trill_e4m3_scaled(scaled, TRILL_F32, codes, 256, scale);
    trill_e4m3_scaled(half, TRILL_BF16, codes, 256, scale);
    for (int c = 0; c < 256; c++) {
        if (isnan(all[c])) continue;
        assert_true(bits_of(scaled[c]) == bits_of(all[c] * scale));
        assert_int_equal(half[c], trill_f32_to_bf16(all[c] * scale));
    }

    trill_dtype dt;
    assert_int_equal(trill_dtype_parse("F8_E4M3", &dt), 0);
    assert_int_equal(dt, TRILL_F8_E4M3);
    assert_string_equal(trill_dtype_name(TRILL_F8_E4M3), "F8_E4M3");
    assert_int_equal(trill_dtype_size(TRILL_F8_E4M3), 1);
    assert_int_equal(trill_dtype_parse("F8_E5M2", &dt), -1);
}

/* ---- checkpoints written by hand ------------------------------------------------------------ */

/* Blocks of 16 rows x 12 columns (not square, so rows and columns cannot be confused): q_a_proj
 * [24, 40] is a grid of [2, 4] blocks, o_proj [40, 16] of [3, 2], ...: the edge blocks partial. */
static const char CONFIG[] =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": 64, \"hidden_size\": 40,"
    " \"intermediate_size\": 48, \"moe_intermediate_size\": 12, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
    " \"num_key_value_heads\": 2, \"n_shared_experts\": 1, \"n_routed_experts\": 4, \"routed_scaling_factor\": 2.5,"
    " \"kv_lora_rank\": 16, \"q_lora_rank\": 24, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8, \"qk_nope_head_dim\": 8,"
    " \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1, \"rope_scaling\": null,"
    " \"tie_word_embeddings\": false, \"num_nextn_predict_layers\": 1,"
    " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": \"fp8\","
    " \"weight_block_size\": [16, 12]}}";
enum { BLOCK_R = 16, BLOCK_C = 12, MAX_TENSORS = 256 };

typedef struct raw_tensor {
    char name[160];
    const char *dtype; /* the safetensors spelling */
    int64_t shape[2];
    int ndim;
    unsigned char *data;
    size_t nbytes;
} raw_tensor;

typedef struct checkpoint {
    raw_tensor t[MAX_TENSORS];
    size_t n;
} checkpoint;

static raw_tensor *add(checkpoint *ck, const char *name, const char *dtype, int ndim, int64_t rows, int64_t cols, size_t elem) {
    assert_true(ck->n < MAX_TENSORS);
    raw_tensor *t = &ck->t[ck->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->nbytes = (size_t)rows * (size_t)(ndim == 2 ? cols : 1) * elem;
    t->data = calloc(t->nbytes ? t->nbytes : 1, 1);
    assert_non_null(t->data);
    return t;
}

static raw_tensor *find(checkpoint *ck, const char *name) {
    for (size_t i = 0; i < ck->n; i++)
        if (!strcmp(ck->t[i].name, name)) return &ck->t[i];
    fail_msg("no tensor \"%s\" in the test checkpoint", name);
    return NULL;
}

static void drop(checkpoint *ck, const char *name) {
    raw_tensor *t = find(ck, name);
    free(t->data);
    *t = ck->t[--ck->n];
}

static void free_checkpoint(checkpoint *ck) {
    for (size_t i = 0; i < ck->n; i++) free(ck->t[i].data);
    free(ck);
}

/* A copy whose tensors own their data. */
static checkpoint *copy_checkpoint(const checkpoint *from) {
    checkpoint *ck = malloc(sizeof *ck);
    assert_non_null(ck);
    *ck = *from;
    for (size_t i = 0; i < ck->n; i++) {
        ck->t[i].data = malloc(ck->t[i].nbytes ? ck->t[i].nbytes : 1);
        assert_non_null(ck->t[i].data);
        memcpy(ck->t[i].data, from->t[i].data, ck->t[i].nbytes);
    }
    return ck;
}

/* DIR/model.safetensors: the header written by hand (8-byte aligned data), then the tensors. */
static void write_safetensors(const char *dir, const checkpoint *ck) {
    json_t *header = json_pack("{s:{s:s}}", "__metadata__", "format", "pt");
    size_t offset = 0;
    for (size_t i = 0; i < ck->n; i++) {
        const raw_tensor *t = &ck->t[i];
        json_t *shape = t->ndim == 2 ? json_pack("[I,I]", (json_int_t)t->shape[0], (json_int_t)t->shape[1])
                                     : json_pack("[I]", (json_int_t)t->shape[0]);
        json_object_set_new(header, t->name, json_pack("{s:s, s:o, s:[I,I]}", "dtype", t->dtype, "shape", shape, "data_offsets",
                                                       (json_int_t)offset, (json_int_t)(offset + t->nbytes)));
        offset += t->nbytes;
    }
    char *text = json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(header);
    assert_non_null(text);
    const size_t hlen = (strlen(text) + 7) & ~(size_t)7, len = 8 + hlen + offset;
    unsigned char *bytes = malloc(len);
    assert_non_null(bytes);
    for (int i = 0; i < 8; i++) bytes[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memset(bytes + 8, ' ', hlen);
    memcpy(bytes + 8, text, strlen(text));
    unsigned char *at = bytes + 8 + hlen;
    for (size_t i = 0; i < ck->n; i++) {
        memcpy(at, ck->t[i].data, ck->t[i].nbytes);
        at += ck->t[i].nbytes;
    }
    test_write(dir, "model.safetensors", bytes, len);
    free(bytes);
    free(text);
}

/* A fresh folder with config.json and model.safetensors (the caller removes it). */
static char *write_folder(const json_t *config, const checkpoint *ck) {
    char *dir = test_tmpdir("fp8");
    char *text = json_dumps(config, JSON_INDENT(2));
    assert_non_null(text);
    test_write(dir, "config.json", text, strlen(text));
    free(text);
    write_safetensors(dir, ck);
    return dir;
}

static void put_bf16(raw_tensor *t, size_t i, uint16_t h) { memcpy(t->data + 2 * i, &h, 2); }
static void put_f32(raw_tensor *t, size_t i, float f) { memcpy(t->data + 4 * i, &f, 4); }

/* p as F8_E4M3 codes (random, no NaN) with "<name>_scale_inv" (random, full fp32 mantissas); the
 * expected weights e4m3 * scale into p's fp32 storage. */
static void add_fp8(checkpoint *ck, trill_param *p, uint64_t key) {
    const int64_t rows = p->shape[0], cols = p->shape[1], grid_r = (rows + BLOCK_R - 1) / BLOCK_R,
                  grid_c = (cols + BLOCK_C - 1) / BLOCK_C;
    raw_tensor *w = add(ck, p->name, "F8_E4M3", 2, rows, cols, 1);
    char name[160];
    snprintf(name, sizeof name, "%s_scale_inv", p->name);
    raw_tensor *s = add(ck, name, "F32", 2, grid_r, grid_c, 4);
    float *scales = malloc((size_t)(grid_r * grid_c) * sizeof *scales);
    assert_non_null(scales);
    for (int64_t b = 0; b < grid_r * grid_c; b++) {
        scales[b] = ldexpf(1.0f + (float)trill_rng_uniform(key, (uint64_t)b), -4 - (int)(b % 9));
        put_f32(s, (size_t)b, scales[b]);
    }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            uint8_t code = (uint8_t)trill_rng_bits(key + 1, (uint64_t)(i * cols + j));
            if ((code & 0x7f) == 0x7f) code ^= 1; /* NaN -> +-448 */
            w->data[i * cols + j] = code;
            p->data[i * cols + j] = e4m3_formula(code) * scales[(i / BLOCK_R) * grid_c + j / BLOCK_C];
        }
    free(scales);
}

/* A model of the config's shape and its FP8 checkpoint, as DeepSeek-V3's: the decoder's linear
 * layers F8_E4M3 with their scales, the embedding, routers, norms and head BF16, the router's
 * correction bias F32. `want` holds the values a load must give. */
static checkpoint *make_checkpoint(const json_t *config, trill_model **want) {
    trill_config c;
    assert_int_equal(trill_config_from_json(config, "test config", &c), TRILL_OK);
    assert_int_equal(trill_model_create(&c, want), TRILL_OK);
    checkpoint *ck = calloc(1, sizeof *ck);
    assert_non_null(ck);
    for (size_t t = 0; t < (*want)->n_tensors; t++) {
        trill_param *p = &(*want)->tensors[t];
        const uint64_t key = trill_rng_key(7, t);
        if (p->kind == TRILL_TENSOR_MATRIX) {
            add_fp8(ck, p, key);
        } else if (p->kind == TRILL_TENSOR_BIAS) {
            raw_tensor *r = add(ck, p->name, "F32", p->ndim, p->shape[0], p->shape[1], 4);
            for (size_t i = 0; i < p->numel; i++) put_f32(r, i, p->data[i] = (float)trill_rng_normal(key, i));
        } else {
            raw_tensor *r = add(ck, p->name, "BF16", p->ndim, p->shape[0], p->shape[1], 2);
            for (size_t i = 0; i < p->numel; i++) {
                const uint16_t h = trill_f32_to_bf16((float)trill_rng_normal(key, i));
                put_bf16(r, i, h);
                p->data[i] = trill_bf16_to_f32(h);
            }
        }
    }
    return ck;
}

static json_t *config_json(void) {
    json_error_t err;
    json_t *j = json_loads(CONFIG, 0, &err);
    if (!j) fail_msg("CONFIG: %s", err.text);
    return j;
}

/* got holds exactly want's values: fp32 bit for bit, bf16 storage (and fp32 after a bf16 round
 * trip: `rounded`) their rounding to nearest even. */
static void assert_weights(const trill_model *got, const trill_model *want, bool rounded) {
    size_t n, n_want;
    const trill_param *g = trill_model_tensors(got, &n), *w = trill_model_tensors(want, &n_want);
    assert_int_equal(n, n_want);
    for (size_t t = 0; t < n; t++) {
        assert_string_equal(g[t].name, w[t].name);
        for (size_t i = 0; i < g[t].numel; i++) {
            const uint16_t h = trill_f32_to_bf16(w[t].data[i]);
            const bool ok = g[t].bf16 ? g[t].bf16[i] == h
                                      : bits_of(g[t].data[i]) == bits_of(rounded ? trill_bf16_to_f32(h) : w[t].data[i]);
            if (!ok) fail_msg("%s[%zu]: %a, expected %a", g[t].name, i, g[t].bf16 ? trill_bf16_to_f32(g[t].bf16[i]) : g[t].data[i], w[t].data[i]);
        }
    }
}

static void test_fp8_load(void **state) {
    (void)state;
    json_t *config = config_json();
    trill_model *want;
    checkpoint *ck = make_checkpoint(config, &want);
    char *dir = write_folder(config, ck);

    trill_model *m;
    if (trill_model_load(dir, &m) != TRILL_OK) fail_msg("%s", trill_error_message());
    const trill_config *c = trill_model_config(m);
    assert_int_equal(c->fp8_block[0], BLOCK_R);
    assert_int_equal(c->fp8_block[1], BLOCK_C);
    assert_int_equal(c->num_nextn_predict_layers, 1);
    assert_int_equal(trill_model_storage(m), TRILL_F32);
    assert_int_equal(trill_model_checkpoint_dtype(m), TRILL_BF16); /* what its weights are saved as */
    assert_weights(m, want, false);
    trill_model_free(m);

    /* a frozen base: the matrices dequantized into bf16 storage, as a bf16 checkpoint's */
    assert_int_equal(trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &m), TRILL_OK);
    assert_int_equal(trill_model_storage(m), TRILL_BF16);
    assert_weights(m, want, false);

    /* saved as bf16: no quantization_config, no MTP layers; it loads back the same */
    char *saved = test_tmpdir("fp8-saved");
    assert_int_equal(trill_model_save(m, saved, TRILL_F8_E4M3, 0), TRILL_ERR_UNSUPPORTED);
    assert_msg_has("writing F8_E4M3 is not supported");
    assert_int_equal(trill_model_save(m, saved, trill_model_checkpoint_dtype(m), 0), TRILL_OK);
    char *path = trill_path_join(saved, "config.json");
    json_t *written = json_load_file(path, 0, NULL);
    assert_non_null(written);
    assert_null(json_object_get(written, "quantization_config"));
    assert_int_equal(json_integer_value(json_object_get(written, "num_nextn_predict_layers")), 0);
    json_decref(written);
    trill_model *back;
    assert_int_equal(trill_model_load_as(saved, TRILL_STORE_CHECKPOINT, &back), TRILL_OK);
    assert_int_equal(trill_model_config(back)->fp8_block[0], 0);
    assert_weights(back, want, true); /* the fp32 router bias too */
    trill_model_free(back);
    trill_model_free(m);
    test_rmdir(saved);
    free(saved);
    free(path);

    test_rmdir(dir);
    free(dir);
    free_checkpoint(ck);
    trill_model_free(want);
    json_decref(config);
}

/* A Qwen3-MoE checkpoint in block-scaled FP8 (as Qwen's FP8 releases ship, with the same
 * quantization_config) loads like DeepSeek-V3's: every matrix dequantized exactly, in fp32 and in
 * bf16 storage. Before, Qwen3's config reader ignored the field and the loader refused the first
 * F8_E4M3 tensor as having "no fp8 quantization_config". */
static void test_fp8_qwen3(void **state) {
    (void)state;
    json_error_t err;
    json_t *config = json_loads(
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 40,"
        " \"intermediate_size\": 48, \"moe_intermediate_size\": 12, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,"
        " \"num_key_value_heads\": 1, \"head_dim\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2, \"decoder_sparse_step\": 1,"
        " \"mlp_only_layers\": [0], \"tie_word_embeddings\": false,"
        " \"quantization_config\": {\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": \"fp8\","
        " \"weight_block_size\": [16, 12]}}",
        0, &err);
    if (!config) fail_msg("config: %s", err.text);
    trill_model *want;
    checkpoint *ck = make_checkpoint(config, &want);
    char *dir = write_folder(config, ck);
    trill_model *m;
    if (trill_model_load(dir, &m) != TRILL_OK) fail_msg("%s", trill_error_message());
    assert_int_equal(trill_model_config(m)->fp8_block[0], BLOCK_R);
    assert_int_equal(trill_model_config(m)->fp8_block[1], BLOCK_C);
    assert_weights(m, want, false);
    trill_model_free(m);
    assert_int_equal(trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &m), TRILL_OK);
    assert_int_equal(trill_model_storage(m), TRILL_BF16);
    assert_weights(m, want, false);
    trill_model_free(m);
    test_rmdir(dir);
    free(dir);
    /* the field is checked as DeepSeek-V3's is */
    json_object_set_new(json_object_get(config, "quantization_config"), "fmt", json_string("e5m2"));
    char *bad = write_folder(config, ck);
    assert_int_equal(trill_model_load(bad, &m), TRILL_ERR_UNSUPPORTED);
    assert_msg_has("quantization_config.fmt\": \"e5m2\" is not supported");
    test_rmdir(bad);
    free(bad);
    free_checkpoint(ck);
    trill_model_free(want);
    json_decref(config);
}

/* Loading config and ck fails with `st` and a message naming the folder (or file) and needle. */
static void expect_refused(const json_t *config, const checkpoint *ck, trill_status st, const char *needle) {
    char *dir = write_folder(config, ck);
    trill_model *m = NULL;
    const trill_status got = trill_model_load(dir, &m);
    if (got != st) fail_msg("status %s, expected %s: %s", trill_status_name(got), trill_status_name(st), trill_error_message());
    assert_null(m);
    assert_msg_has(dir);
    assert_msg_has(needle);
    test_rmdir(dir);
    free(dir);
}

#define Q_A "model.layers.0.self_attn.q_a_proj.weight"

static void test_fp8_refused(void **state) {
    (void)state;
    json_t *config = config_json();
    trill_model *want;
    checkpoint *good = make_checkpoint(config, &want);
    checkpoint *ck;

    ck = copy_checkpoint(good);
    drop(ck, Q_A "_scale_inv");
    char *dir = write_folder(config, ck);
    trill_model *m = NULL;
    assert_int_equal(trill_model_load(dir, &m), TRILL_ERR_INVALID);
    char msg[4200];
    snprintf(msg, sizeof msg, "%s: tensor \"" Q_A "\" is F8_E4M3 but \"" Q_A "_scale_inv\" is missing", dir);
    assert_msg_has(msg);
    test_rmdir(dir);
    free(dir);
    free_checkpoint(ck);

    ck = copy_checkpoint(good); /* [24, 40] in 16x12 blocks is a [2, 4] grid */
    raw_tensor *s = find(ck, Q_A "_scale_inv");
    s->shape[0] = 1;
    s->nbytes = 4 * 4;
    expect_refused(config, ck, TRILL_ERR_INVALID, "tensor \"" Q_A "_scale_inv\": shape: got [1, 4], expected [2, 4]");
    s->shape[0] = 4;
    s->shape[1] = 2;
    s->nbytes = 8 * 4;
    expect_refused(config, ck, TRILL_ERR_INVALID, "got [4, 2], expected [2, 4]");
    s->ndim = 1;
    s->shape[0] = 8;
    expect_refused(config, ck, TRILL_ERR_INVALID, "got [8], expected [2, 4]");
    s->ndim = 2;
    s->shape[0] = 2;
    s->shape[1] = 4;
    s->dtype = "BF16";
    s->nbytes = 8 * 2;
    expect_refused(config, ck, TRILL_ERR_INVALID, "tensor \"" Q_A "_scale_inv\" is BF16, expected F32");
    free_checkpoint(ck);

    /* scales of a tensor that is not F8_E4M3 are not consumed */
    ck = copy_checkpoint(good);
    add(ck, "model.embed_tokens.weight_scale_inv", "F32", 2, 4, 3, 4);
    expect_refused(config, ck, TRILL_ERR_INVALID, "unexpected tensor \"model.embed_tokens.weight_scale_inv\"");
    free_checkpoint(ck);

    /* an F8_E4M3 tensor needs a quantization_config */
    json_t *plain = json_deep_copy(config);
    json_object_del(plain, "quantization_config");
    expect_refused(plain, good, TRILL_ERR_INVALID, "tensor \"" Q_A "\" is F8_E4M3 but config.json has no fp8 \"quantization_config\"");
    json_decref(plain);

    /* quantization_config itself: what it must say, by field */
#define QFIELD(k) "field \"quantization_config." k "\""
    const struct { const char *key, *value, *msg; trill_status st; } bad[] = {
        { "quant_method", "\"bitsandbytes\"", QFIELD("quant_method") ": \"bitsandbytes\" is not supported (expected \"fp8\")", TRILL_ERR_UNSUPPORTED },
        { "quant_method", NULL, QFIELD("quant_method") " is missing (expected \"fp8\")", TRILL_ERR_INVALID },
        { "fmt", "\"e5m2\"", QFIELD("fmt") ": \"e5m2\" is not supported (expected \"e4m3\")", TRILL_ERR_UNSUPPORTED },
        { "fmt", "3", QFIELD("fmt") ": expected a string, got integer", TRILL_ERR_INVALID },
        { "activation_scheme", "\"static\"", QFIELD("activation_scheme") ": \"static\" is not supported (expected \"dynamic\")", TRILL_ERR_UNSUPPORTED },
        { "weight_block_size", "[16]", QFIELD("weight_block_size") ": expected [rows, cols]", TRILL_ERR_INVALID },
        { "weight_block_size", "[16, 0]", QFIELD("weight_block_size") ": expected [rows, cols]", TRILL_ERR_INVALID },
        { "weight_block_size", "\"16x16\"", QFIELD("weight_block_size") ": expected [rows, cols]", TRILL_ERR_INVALID },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *j = json_deep_copy(config), *q = json_object_get(j, "quantization_config");
        if (bad[i].value) json_object_set_new(q, bad[i].key, json_loads(bad[i].value, JSON_DECODE_ANY, NULL));
        else json_object_del(q, bad[i].key);
        expect_refused(j, good, bad[i].st, bad[i].msg);
        json_decref(j);
    }
    json_t *j = json_deep_copy(config);
    json_object_set_new(j, "quantization_config", json_string("fp8"));
    expect_refused(j, good, TRILL_ERR_INVALID, "field \"quantization_config\": expected an object or null, got string");
    json_decref(j);
    /* HF's defaults: fmt e4m3, dynamic activations, 128x128 blocks */
    j = json_deep_copy(config);
    json_object_set_new(j, "quantization_config", json_pack("{s:s}", "quant_method", "fp8"));
    trill_config c;
    assert_int_equal(trill_config_from_json(j, "test", &c), TRILL_OK);
    assert_int_equal(c.fp8_block[0], 128);
    assert_int_equal(c.fp8_block[1], 128);
    json_decref(j);

    free_checkpoint(good);
    trill_model_free(want);
    json_decref(config);
}

/* The MTP module (DeepSeek-V3's "model.layers.61.*"): layers num_hidden_layers .. + n - 1. */
static void test_mtp_layers(void **state) {
    (void)state;
    json_t *config = config_json();
    trill_model *want;
    checkpoint *ck = make_checkpoint(config, &want);
    add(ck, "model.layers.2.enorm.weight", "BF16", 1, 40, 0, 2);
    add(ck, "model.layers.2.eh_proj.weight", "F8_E4M3", 2, 40, 80, 1);
    add(ck, "model.layers.2.eh_proj.weight_scale_inv", "F32", 2, 3, 7, 4);
    add(ck, "model.layers.2.self_attn.q_a_proj.weight", "F8_E4M3", 2, 24, 40, 1);
    add(ck, "model.layers.2.self_attn.q_a_proj.weight_scale_inv", "F32", 2, 2, 4, 4);
    add(ck, "model.layers.2.shared_head.head.weight", "BF16", 2, 64, 40, 2);
    char *dir = write_folder(config, ck);
    trill_model *m;
    if (trill_model_load(dir, &m) != TRILL_OK) fail_msg("%s", trill_error_message());
    assert_weights(m, want, false);
    trill_model_free(m);
    test_rmdir(dir);
    free(dir);

    json_t *none = json_deep_copy(config);
    json_object_set_new(none, "num_nextn_predict_layers", json_integer(0));
    expect_refused(none, ck, TRILL_ERR_INVALID, "unexpected tensor \"model.layers.2.");
    json_decref(none);
    /* a layer past the MTP module's, and one whose index only starts like it, are not its */
    add(ck, "model.layers.3.enorm.weight", "BF16", 1, 40, 0, 2);
    expect_refused(config, ck, TRILL_ERR_INVALID, "unexpected tensor \"model.layers.3.enorm.weight\"");
    drop(ck, "model.layers.3.enorm.weight");
    add(ck, "model.layers.20.enorm.weight", "BF16", 1, 40, 0, 2);
    expect_refused(config, ck, TRILL_ERR_INVALID, "unexpected tensor \"model.layers.20.enorm.weight\"");

    free_checkpoint(ck);
    trill_model_free(want);
    json_decref(config);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decoder),
        cmocka_unit_test(test_fp8_load),
        cmocka_unit_test(test_fp8_qwen3),
        cmocka_unit_test(test_fp8_refused),
        cmocka_unit_test(test_mtp_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
