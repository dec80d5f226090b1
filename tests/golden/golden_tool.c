/* Golden outputs: the bytes the model code produces today for fixed inputs, so that a refactor
 * meant to change nothing can prove it changed nothing (tests/golden/README.md).
 *
 *   golden_tool write FILE   compute every output and write them to FILE
 *   golden_tool check FILE   compute them again and compare with FILE byte for byte
 *   golden_tool list FILE    print the records FILE holds (name, type, bytes)
 *
 * Only the public API (the headers in include/trill) is used, so the tool survives a reorganisation of
 * src/. Every model is built in memory from a config and trill_model_init_random; every input
 * (tokens, router-replay ids, d loss / d logprob, LoRA B values) is a fixed integer formula.
 *
 * File: "TRILLGLD" + u32 version + u32 record count, then per record: u16 name length, the name,
 * u8 element type, u64 byte length, the bytes (little-endian, as this x86-64 machine writes them).
 * The first record is the fingerprint of the machine class (OpenBLAS kernel, generator ISA,
 * compiler target...): check compares it first and exits 77 (a skip) when it differs, since bytes
 * from another machine class are not comparable; it still runs every computation first so
 * sanitizers see all of it. Any other difference (a record missing, extra, of another size or
 * other bytes) exits 1 naming each record, its first differing element and both values. */
#include <cblas.h> /* openblas_get_corename, openblas_get_config (OpenBLAS's cblas.h) */
#include <gnu/libc-version.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trill/config.h"
#include "trill/eplb.h"
#include "trill/error.h"
#include "trill/fileio.h"
#include "trill/infer.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/optim.h"
#include "trill/train.h"

#ifndef TRILL_GOLDEN_BUILD
#define TRILL_GOLDEN_BUILD "unknown"
#endif

enum { FILE_VERSION = 1, GOLDEN_THREADS = 2 };

/* ---- errors: every failure names the call ---- */

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "golden_tool: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

#define CHECK(call)                                                                                       \
    do {                                                                                                  \
        const trill_status st_ = (call);                                                                  \
        if (st_ != TRILL_OK) die("%s failed (%s): %s", #call, trill_status_name(st_), trill_error_message()); \
    } while (0)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory (%zu x %zu bytes)", n, size);
    return p;
}

static char *xstrdup(const char *s) {
    char *p = xmalloc(strlen(s) + 1);
    strcpy(p, s);
    return p;
}

/* ---- records ---- */

typedef enum rtype { R_F32 = 1, R_F64, R_I32, R_U16, R_U32, R_I64, R_TEXT } rtype;

static size_t type_size(rtype t) {
    switch (t) {
    case R_F32: case R_I32: case R_U32: return 4;
    case R_F64: case R_I64: return 8;
    case R_U16: return 2;
    case R_TEXT: return 1;
    }
    return 1;
}

static const char *type_name(rtype t) {
    switch (t) {
    case R_F32: return "f32";
    case R_F64: return "f64";
    case R_I32: return "i32";
    case R_U16: return "u16";
    case R_U32: return "u32";
    case R_I64: return "i64";
    case R_TEXT: return "text";
    }
    return "?";
}

typedef struct record {
    char *name;
    rtype type;
    size_t len; /* bytes */
    uint8_t *data;
} record;

typedef struct records {
    record *r;
    size_t n, cap;
} records;

static records g_out;     /* what this run computed */
static char g_prefix[128]; /* "moe_a/" ... */

static void put(rtype type, const char *name, const void *data, size_t count) {
    if (g_out.n == g_out.cap) {
        g_out.cap = g_out.cap ? 2 * g_out.cap : 64;
        record *r = realloc(g_out.r, g_out.cap * sizeof *r);
        if (!r) die("out of memory (records)");
        g_out.r = r;
    }
    char full[256];
    if ((size_t)snprintf(full, sizeof full, "%s%s", g_prefix, name) >= sizeof full) die("record name too long: %s%s", g_prefix, name);
    for (size_t i = 0; i < g_out.n; i++)
        if (!strcmp(g_out.r[i].name, full)) die("record %s written twice", full);
    record *r = &g_out.r[g_out.n++];
    r->name = xstrdup(full);
    r->type = type;
    r->len = count * type_size(type);
    r->data = xmalloc(r->len);
    if (r->len) memcpy(r->data, data, r->len);
}

static void put_f32(const char *name, const float *v, size_t n) { put(R_F32, name, v, n); }
static void put_u16(const char *name, const uint16_t *v, size_t n) { put(R_U16, name, v, n); }

/* Growable text for R_TEXT records. */
typedef struct text {
    char *s;
    size_t len, cap;
} text;

static void text_add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_add(text *t, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = t->cap - t->len;
        const int k = vsnprintf(t->s ? t->s + t->len : NULL, room, fmt, ap);
        va_end(ap);
        if (k < 0) die("vsnprintf failed");
        if ((size_t)k < room) {
            t->len += (size_t)k;
            return;
        }
        t->cap = 2 * (t->cap + (size_t)k + 64);
        char *s = realloc(t->s, t->cap);
        if (!s) die("out of memory (text)");
        t->s = s;
    }
}

static void put_text(const char *name, text *t) {
    put(R_TEXT, name, t->s ? t->s : "", t->len);
    free(t->s);
    *t = (text){ 0 };
}

/* ---- fixed inputs ---- */

/* A packed batch of 3 sequences of 5, 17 and 33 tokens. */
enum { N_SEQS = 3, T_ALL = 5 + 17 + 33 };
static const int OFFSETS[N_SEQS + 1] = { 0, 5, 22, 55 };
static int g_tokens[T_ALL];

static void make_tokens(int vocab) {
    for (int s = 0; s < N_SEQS; s++)
        for (int t = OFFSETS[s]; t < OFFSETS[s + 1]; t++) {
            const int i = t - OFFSETS[s];
            g_tokens[t] = (int)((7u * i * i + 13u * i + 29u * s + 1u) % (unsigned)vocab);
        }
}

/* Router-replay ids [T][L][K]: distinct per token (consecutive ids mod E, upwards or downwards:
 * 1 and E - 1 are coprime with E), every fifth row TRILL_REPLAY_NONE (the router decides). */
static uint16_t *make_replay(const trill_config *c) {
    const int L = c->n_moe_layers, K = c->num_experts_per_tok, E = c->num_experts;
    uint16_t *r = xcalloc((size_t)T_ALL * L * K, sizeof *r);
    for (int t = 0; t < T_ALL; t++)
        for (int l = 0; l < L; l++) {
            uint16_t *row = r + ((size_t)t * L + l) * K;
            const int base = (5 * t + 3 * l + 1) % E, step = t % 2 ? 1 : E - 1;
            for (int j = 0; j < K; j++) row[j] = (t + l) % 5 == 0 ? TRILL_REPLAY_NONE : (uint16_t)((base + j * step) % E);
        }
    CHECK(trill_check_replay(c, r, T_ALL));
    return r;
}

/* d loss / d logprob: small multiples of 1/64 (exact in fp32), some zero. */
static float *make_dlogprobs(void) {
    float *d = xmalloc(sizeof(float) * T_ALL);
    for (int t = 0; t < T_ALL; t++) d[t] = (float)((t * 37 % 11) - 5) / 64.0f;
    return d;
}

/* A small deterministic value for element i of tensor t: k/4096 for k in [-40, 40]. */
static float lora_b_value(size_t t, size_t i) {
    const uint64_t h = (t * 2654435761u + i * 40503u + 17u) % 81u;
    return (float)((int)h - 40) / 4096.0f;
}

/* ---- models ---- */

typedef struct spec {
    const char *name;
    const char *json; /* config.json */
    uint64_t seed;
    bool full_replay; /* also full fine-tuning gradients under router replay */
} spec;

/* Qwen3-MoE, layer 0 dense (mlp_only_layers), GQA 4/2, head_dim 16, 8 experts top-2, normalised top-k, untied. */
static const char MOE_A[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 16, \"num_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"moe_intermediate_size\": 8, \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [0],"
    " \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";
/* Qwen3-MoE, hidden 16, every second layer MoE (decoder_sparse_step 2), GQA 4/1, head_dim 8, 8 experts top-3,
 * top-k weights not renormalised, untied. */
static const char MOE_B[] =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"vocab_size\": 64,"
    " \"hidden_size\": 16, \"intermediate_size\": 32, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 1, \"head_dim\": 8, \"num_experts\": 8, \"num_experts_per_tok\": 3,"
    " \"moe_intermediate_size\": 8, \"norm_topk_prob\": false, \"decoder_sparse_step\": 2, \"mlp_only_layers\": [],"
    " \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";
/* Dense Qwen3, tied embeddings, GQA 4/2, head_dim 8. */
static const char DENSE[] =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 48, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6,"
    " \"tie_word_embeddings\": true, \"max_position_embeddings\": 128, \"initializer_range\": 0.25,"
    " \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* DeepSeek-V3: MLA (q_lora 16, kv_lora 16, nope/rope/v 8/8/8, 4 heads), YaRN with a cos/sin
 * factor != 1, interleaved RoPE, layer 0 dense, 8 routed experts in 2 groups keeping 1, top-2,
 * one shared expert, scaling 2.5; the selection bias from a formula (golden_tool sets it). */
static const char DSV3[] =
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 32, \"moe_intermediate_size\": 8, \"num_hidden_layers\": 3,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"n_shared_experts\": 1, \"n_routed_experts\": 8,"
    " \"num_experts_per_tok\": 2, \"n_group\": 2, \"topk_group\": 1, \"routed_scaling_factor\": 2.5,"
    " \"q_lora_rank\": 16, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8,"
    " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"sigmoid\","
    " \"topk_method\": \"noaux_tc\", \"rope_theta\": 10000.0, \"rope_interleave\": true, \"rope_scaling\": {\"type\": \"yarn\","
    " \"factor\": 4, \"original_max_position_embeddings\": 32, \"beta_fast\": 32, \"beta_slow\": 1, \"mscale\": 0.7,"
    " \"mscale_all_dim\": 1.3}, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* Mixtral: GQA 4/2 without QK-norm, head_dim 8, every layer a MoE of 8 experts top-2 (always
 * renormalised), untied. */
static const char MIXTRAL[] =
    "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 8, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"num_local_experts\": 8, \"num_experts_per_tok\": 2,"
    " \"rope_theta\": 1000000.0, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* GLM-4.5: GQA 4/2 with q/k/v biases and QK-norm, head_dim 16 with RoPE on 8 of it, layer 0
 * dense, 8 routed experts top-2 behind the sigmoid router (its selection bias from a formula),
 * one shared expert, scaling 2.5, untied. */
static const char GLM[] =
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 32, \"moe_intermediate_size\": 8, \"num_hidden_layers\": 3,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, \"partial_rotary_factor\": 0.5,"
    " \"attention_bias\": true, \"use_qk_norm\": true, \"n_routed_experts\": 8, \"n_shared_experts\": 1,"
    " \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1, \"routed_scaling_factor\": 2.5, \"n_group\": 1, \"topk_group\": 1,"
    " \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* gpt-oss: GQA 4/2 with q/k/v/o biases and sinks, head_dim 8, a window of 3 on layers 0 and 2,
 * YaRN over 16 original positions, every layer a MoE of 8 experts top-2 with biases and the
 * clamped SwiGLU (a limit of 0.5 that cuts), the router's bias, untied. */
static const char GPTOSS[] =
    "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 8, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"sliding_window\": 3,"
    " \"swiglu_limit\": 0.5, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 16,"
    " \"truncate\": false}, \"rope_theta\": 150000.0, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false,"
    " \"max_position_embeddings\": 128, \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* Qwen3-Next: Gated DeltaNet layers 0 and 2 (2 key heads of 8, 4 value heads of 8, conv kernel
 * 4) beside a gated attention layer 1 (GQA 4/2, head_dim 8, RoPE on 4 of it), zero-centred norms,
 * layer 0 dense, then 8 experts top-2 and a shared expert under its sigmoid gate, untied. */
static const char QWEN3NEXT[] =
    "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\", \"vocab_size\": 64,"
    " \"hidden_size\": 32, \"intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"partial_rotary_factor\": 0.5, \"linear_num_key_heads\": 2,"
    " \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8,"
    " \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\"], \"mlp_only_layers\": [0],"
    " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"shared_expert_intermediate_size\": 8,"
    " \"rope_theta\": 10000.0, \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false, \"max_position_embeddings\": 128,"
    " \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}";

/* Qwen3.5 MoE (its multimodal config's language model): Qwen3-Next's spec above with in_proj_qkv,
 * in_proj_z, in_proj_b and in_proj_a, every layer a MoE, the experts saved stacked. */
static const char QWEN35[] =
    "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": \"qwen3_5_moe\", \"tie_word_embeddings\": false,"
    " \"text_config\": {\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0,"
    " \"partial_rotary_factor\": 0.5}, \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8,"
    " \"linear_value_head_dim\": 8, \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\"],"
    " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"shared_expert_intermediate_size\": 8,"
    " \"rms_norm_eps\": 1e-6, \"max_position_embeddings\": 128, \"initializer_range\": 0.25, \"bos_token_id\": 0, \"eos_token_id\": 0}}";

static const spec SPECS[] = {
    { "moe_a", MOE_A, 101, true },
    { "moe_b", MOE_B, 202, false },
    { "dense", DENSE, 303, false },
    { "dsv3", DSV3, 404, true },
    { "mixtral", MIXTRAL, 505, true },
    { "glm", GLM, 606, true },
    { "gptoss", GPTOSS, 707, true },
    { "qwen3next", QWEN3NEXT, 808, true },
    { "qwen35", QWEN35, 909, true },
};

/* The public accessors, shortened for the records below. */
static size_t lora_n_params(trill_lora *l) { size_t n; trill_lora_params(l, &n); return n; }
static size_t lora_n_tensors(const trill_lora *l) { size_t n; trill_lora_tensors(l, &n); return n; }
static const trill_param *lora_tensor(const trill_lora *l, size_t t) { size_t n; return &trill_lora_tensors(l, &n)[t]; }
static size_t model_n_tensors(const trill_model *m) { size_t n; trill_model_tensors(m, &n); return n; }
static size_t model_n_f32(trill_model *m) { size_t n; trill_model_params(m, &n); return n; }

static trill_config config_of(const spec *sp) {
    trill_config c;
    CHECK(trill_config_parse(sp->json, strlen(sp->json), sp->name, &c));
    return c;
}

static trill_model *model_of(const trill_config *c, trill_dtype storage, uint64_t seed) {
    trill_model *m;
    CHECK(trill_model_create_stored(c, storage, &m));
    trill_model_init_random(m, seed);
    size_t n;
    const trill_param *t = trill_model_tensors(m, &n);
    for (size_t i = 0; i < n; i++) /* a selection bias (initialised to 0) that changes some choices; linear biases (0 too) */
        if (t[i].kind == TRILL_TENSOR_BIAS)
            for (size_t k = 0; k < t[i].numel; k++) t[i].data[k] = 0.02f * (float)((int)((k * 7 + (size_t)i) % 9) - 4);
        else if (t[i].kind == TRILL_TENSOR_LINEAR_BIAS)
            for (size_t k = 0; k < t[i].numel; k++) t[i].data[k] = 0.1f * (float)((int)((k * 5 + (size_t)i) % 7) - 3);
    return m;
}

static unsigned lora_targets(const trill_config *c) {
    unsigned targets;
    const char *list = c->tie_word_embeddings ? "all-linear"
                       : c->arch == TRILL_ARCH_QWEN3_MOE ? "q,k,v,o,gate,up,down,lm_head" : "all-linear,lm_head";
    if (trill_lora_parse_targets(list, &targets))
        die("trill_lora_parse_targets failed: %s", trill_error_message());
    return targets;
}

/* rank 4 on every target it can have, A from the seed, every B set to lora_b_value. */
static trill_lora *lora_of(const trill_model *m) {
    trill_lora_config lc = { .rank = 4, .alpha = 8, .targets = lora_targets(trill_model_config(m)) };
    trill_lora *lora;
    CHECK(trill_lora_create(m, lc, 7, &lora));
    size_t n_b = 0;
    for (size_t t = 0; t < lora_n_tensors(lora); t++) {
        const char *name = (*lora_tensor(lora, t)).name;
        if (!strstr(name, "lora_B")) continue;
        for (size_t i = 0; i < (*lora_tensor(lora, t)).numel; i++) (*lora_tensor(lora, t)).data[i] = lora_b_value(t, i);
        n_b++;
    }
    if (n_b * 2 != lora_n_tensors(lora)) die("expected as many lora_B as lora_A tensors, got %zu of %zu", n_b, lora_n_tensors(lora));
    return lora;
}

static void tensor_list(const char *name, const trill_param *ts, size_t n) {
    text t = { 0 };
    for (size_t i = 0; i < n; i++) {
        text_add(&t, "%s", ts[i].name);
        for (int d = 0; d < ts[i].ndim; d++) text_add(&t, " %lld", (long long)ts[i].shape[d]);
        text_add(&t, " (%zu)\n", ts[i].numel);
    }
    put_text(name, &t);
}

/* ---- the reference forward and training ---- */

static void forward(const trill_model *m, const uint16_t *replay, const char *name) {
    const trill_config *c = trill_model_config(m);
    const size_t ne = (size_t)T_ALL * c->n_moe_layers * c->num_experts_per_tok;
    float *lp = xmalloc(sizeof(float) * T_ALL);
    uint16_t *ex = xcalloc(ne, sizeof *ex);
    CHECK(trill_model_forward(m, g_tokens, OFFSETS, N_SEQS, replay, lp, ne ? ex : NULL));
    char key[128];
    snprintf(key, sizeof key, "%s/logprobs", name);
    put_f32(key, lp, T_ALL);
    if (ne) {
        snprintf(key, sizeof key, "%s/experts", name);
        put_u16(key, ex, ne);
    }
    free(lp);
    free(ex);
}

/* forward_train + backward with fixed dlogprobs: log-probs, experts and the gradient block
 * (base weights when lora_n == 0, else the attached adapters'). Returns the gradient (owned). */
static float *train(const trill_model *m, const uint16_t *replay, bool recompute, size_t lora_n, const char *name) {
    const trill_config *c = trill_model_config(m);
    const size_t ne = (size_t)T_ALL * c->n_moe_layers * c->num_experts_per_tok;
    float *lp = xmalloc(sizeof(float) * T_ALL), *d = make_dlogprobs();
    uint16_t *ex = xcalloc(ne, sizeof *ex);
    const size_t n = lora_n ? lora_n : trill_model_n_params(m);
    float *g = xcalloc(n, sizeof(float));
    trill_forward_pass *pass;
    CHECK(trill_model_forward_train(m, g_tokens, OFFSETS, N_SEQS, replay, lp, ne ? ex : NULL, recompute, &pass));
    CHECK(trill_model_backward(pass, d, lora_n ? NULL : g, lora_n ? g : NULL));
    trill_forward_pass_free(pass);
    char key[128];
    snprintf(key, sizeof key, "%s/logprobs", name);
    put_f32(key, lp, T_ALL);
    if (ne) {
        snprintf(key, sizeof key, "%s/experts", name);
        put_u16(key, ex, ne);
    }
    snprintf(key, sizeof key, "%s/grads", name);
    put_f32(key, g, n);
    free(lp);
    free(d);
    free(ex);
    return g;
}

/* ---- the generator ---- */

enum { MAX_SEQS = 16 };

static int cmp_seq(const void *a, const void *b) {
    const trill_sequence_out *x = a, *y = b;
    if (x->request != y->request) return x->request < y->request ? -1 : 1;
    return x->sample - y->sample;
}

typedef struct gen_result {
    int n;
    trill_sequence_out s[MAX_SEQS];
    int stops;               /* sequences that ended on a stop id */
    int *phy2log, *logcnt;   /* the EPLB plan at the end (NULL when off) */
    int plan_n;              /* n_layers * n_physical */
    int logcnt_n;
} gen_result;

static const int STOP_IDS[] = { 3, 10, 17, 24, 31, 38, 45, 52, 59 };

/* Three requests on the prompts of the packed batch: 2 samples at temperature 0.8 (seed 1234),
 * greedy, and top-k/top-p/min-p sampling with stop ids. With an adapter it is taken after two
 * steps (tokens before it carry version 0, after it version 1). */
static void generate(const trill_model *m, trill_gen_format f, const trill_lora *lora, bool eplb, gen_result *res) {
    trill_engine_config cfg = trill_engine_config_default();
    cfg.format = f;
    cfg.block_size = 8;
    cfg.kv_blocks = 64;
    cfg.max_batch_tokens = 24; /* the prompts are prefilled in chunks */
    cfg.capture_experts = true;
    cfg.eplb = eplb;
    if (eplb) {
        cfg.eplb_redundant = 6;
        cfg.eplb_workers = 2;
        cfg.eplb_window = 4;
        cfg.eplb_interval = 2;
    }
    trill_engine *e;
    CHECK(trill_engine_create(m, &cfg, &e));
    trill_request rq[3];
    for (int i = 0; i < 3; i++) {
        rq[i] = (trill_request){ .id = 11 + (uint64_t)i, .prompt = g_tokens + OFFSETS[i], .prompt_len = OFFSETS[i + 1] - OFFSETS[i] };
        rq[i].sampling = trill_sampling_default();
    }
    rq[0].n = 2;
    rq[0].max_new_tokens = 12;
    rq[0].sampling.temperature = 0.8f;
    rq[0].sampling.seed = 1234;
    rq[1].n = 1;
    rq[1].max_new_tokens = 10;
    rq[1].sampling.temperature = 0;
    rq[2].n = 1;
    rq[2].max_new_tokens = 16;
    rq[2].sampling.temperature = 1.1f;
    rq[2].sampling.top_k = 20;
    rq[2].sampling.top_p = 0.9f;
    rq[2].sampling.min_p = 0.02f;
    rq[2].sampling.seed = 99;
    rq[2].stop_ids = STOP_IDS;
    rq[2].n_stop_ids = (int)(sizeof STOP_IDS / sizeof STOP_IDS[0]);
    for (int i = 0; i < 3; i++) CHECK(trill_engine_submit(e, &rq[i]));
    if (lora) {
        for (int i = 0; i < 2; i++) CHECK(trill_engine_step(e, NULL));
        CHECK(trill_engine_update_adapter(e, lora, 1, NULL));
    }
    CHECK(trill_engine_run(e));
    res->n = trill_engine_collect(e, res->s, MAX_SEQS);
    if (res->n != 4) die("trill_engine_collect: expected 4 sequences, got %d", res->n);
    if (trill_engine_busy(e)) die("trill_engine_run returned with work left");
    qsort(res->s, (size_t)res->n, sizeof res->s[0], cmp_seq);
    res->stops = 0;
    for (int i = 0; i < res->n; i++) res->stops += res->s[i].finish == TRILL_FINISH_STOP_ID;
    res->phy2log = res->logcnt = NULL;
    if (eplb) {
        const trill_eplb_plan *p = trill_engine_eplb_plan(e);
        if (!p) die("trill_engine_eplb_plan: NULL with eplb on");
        if (p->max_replicas < 2) die("EPLB never replicated an expert (max_replicas %d): it did not re-plan", p->max_replicas);
        res->plan_n = p->n_layers * p->n_physical;
        res->logcnt_n = p->n_layers * p->n_logical;
        res->phy2log = xmalloc(sizeof(int) * (size_t)res->plan_n);
        res->logcnt = xmalloc(sizeof(int) * (size_t)res->logcnt_n);
        memcpy(res->phy2log, p->phy2log, sizeof(int) * (size_t)res->plan_n);
        memcpy(res->logcnt, p->logcnt, sizeof(int) * (size_t)res->logcnt_n);
    }
    trill_engine_free(e);
}

static void gen_record(const trill_config *c, const gen_result *r, const char *name) {
    const size_t per = (size_t)c->n_moe_layers * c->num_experts_per_tok;
    size_t nt = 0, ng = 0, nx = 0;
    for (int i = 0; i < r->n; i++) {
        nt += (size_t)(r->s[i].n_prompt + r->s[i].n_generated);
        ng += (size_t)r->s[i].n_generated;
        nx += (size_t)(r->s[i].n_prompt + r->s[i].n_generated - 1) * per;
    }
    int32_t *meta = xmalloc(sizeof(int32_t) * 5 * (size_t)r->n), *tok = xmalloc(sizeof(int32_t) * nt);
    float *lp = xmalloc(sizeof(float) * (ng ? ng : 1));
    uint32_t *ver = xmalloc(sizeof(uint32_t) * (ng ? ng : 1));
    uint16_t *ex = xmalloc(sizeof(uint16_t) * (nx ? nx : 1));
    size_t at = 0, ag = 0, ax = 0;
    for (int i = 0; i < r->n; i++) {
        const trill_sequence_out *s = &r->s[i];
        const int32_t mrow[5] = { (int32_t)s->request, s->sample, s->n_prompt, s->n_generated, (int32_t)s->finish };
        memcpy(meta + 5 * i, mrow, sizeof mrow);
        memcpy(tok + at, s->tokens, sizeof(int) * (size_t)(s->n_prompt + s->n_generated));
        at += (size_t)(s->n_prompt + s->n_generated);
        memcpy(lp + ag, s->logprobs, sizeof(float) * (size_t)s->n_generated);
        memcpy(ver + ag, s->versions, sizeof(uint32_t) * (size_t)s->n_generated);
        ag += (size_t)s->n_generated;
        const size_t k = (size_t)(s->n_prompt + s->n_generated - 1) * per;
        if (k && !s->experts) die("%s: capture_experts on but sequence %d has no experts", name, i);
        if (k) memcpy(ex + ax, s->experts, sizeof(uint16_t) * k);
        ax += k;
    }
    char key[160];
    snprintf(key, sizeof key, "%s/meta(request,sample,n_prompt,n_generated,finish)", name);
    put(R_I32, key, meta, 5 * (size_t)r->n);
    snprintf(key, sizeof key, "%s/tokens", name);
    put(R_I32, key, tok, nt);
    snprintf(key, sizeof key, "%s/logprobs", name);
    put_f32(key, lp, ng);
    snprintf(key, sizeof key, "%s/versions", name);
    put(R_U32, key, ver, ng);
    if (nx) {
        snprintf(key, sizeof key, "%s/experts", name);
        put_u16(key, ex, nx);
    }
    if (r->phy2log) {
        snprintf(key, sizeof key, "%s/eplb_phy2log", name);
        put(R_I32, key, r->phy2log, (size_t)r->plan_n);
        snprintf(key, sizeof key, "%s/eplb_logcnt", name);
        put(R_I32, key, r->logcnt, (size_t)r->logcnt_n);
    }
    free(meta);
    free(tok);
    free(lp);
    free(ver);
    free(ex);
}

static void gen_free(gen_result *r) {
    for (int i = 0; i < r->n; i++) trill_sequence_out_free(&r->s[i]);
    free(r->phy2log);
    free(r->logcnt);
    r->n = 0;
}

/* EPLB must not change a single output (only the plan differs). */
static void expect_same_outputs(const trill_config *c, const gen_result *a, const gen_result *b, const char *what) {
    const size_t per = (size_t)c->n_moe_layers * c->num_experts_per_tok;
    if (a->n != b->n) die("%s: EPLB on gave %d sequences, off %d", what, b->n, a->n);
    for (int i = 0; i < a->n; i++) {
        const trill_sequence_out *x = &a->s[i], *y = &b->s[i];
        const int rows = x->n_prompt + x->n_generated;
        if (x->request != y->request || x->sample != y->sample || x->n_generated != y->n_generated || x->finish != y->finish ||
            memcmp(x->tokens, y->tokens, sizeof(int) * (size_t)rows) ||
            memcmp(x->logprobs, y->logprobs, sizeof(float) * (size_t)x->n_generated) ||
            memcmp(x->versions, y->versions, sizeof(uint32_t) * (size_t)x->n_generated) ||
            (per && memcmp(x->experts, y->experts, sizeof(uint16_t) * (size_t)(rows - 1) * per)))
            die("%s: sequence %d (request %llu, sample %d) differs with EPLB on: EPLB must not change outputs", what, i,
                (unsigned long long)x->request, x->sample);
    }
}

/* ---- one model: every output ---- */

static void run_spec(const spec *sp, bool verbose) {
    snprintf(g_prefix, sizeof g_prefix, "%s/", sp->name);
    const trill_config c = config_of(sp);
    const bool moe = c.n_moe_layers > 0;
    make_tokens(c.vocab_size);
    put(R_I32, "inputs/tokens", g_tokens, T_ALL);

    /* configuration-derived numbers */
    int64_t counts[2];
    trill_config_param_counts(&c, &counts[0], &counts[1]);
    put(R_I64, "param_counts(total,active)", counts, 2);
    const double flops[6] = {
        trill_forward_flops(&c, OFFSETS, N_SEQS),
        trill_train_step_flops(&c, OFFSETS, N_SEQS, false, 0, false),
        trill_train_step_flops(&c, OFFSETS, N_SEQS, false, 0, true),
        trill_train_step_flops(&c, OFFSETS, N_SEQS, true, 4, false),
        trill_train_step_flops(&c, OFFSETS, N_SEQS, true, 4, true),
        trill_train_step_flops(&c, OFFSETS, N_SEQS, true, 16, false),
    };
    put(R_F64, "flops(forward,full,full_recompute,lora4,lora4_recompute,lora16)", flops, 6);

    trill_model *m = model_of(&c, TRILL_F32, sp->seed);
    tensor_list("model/tensors", trill_model_tensors(m, &(size_t){ 0 }), model_n_tensors(m));
    const int64_t sizes[3] = { (int64_t)trill_model_n_params(m), (int64_t)model_n_f32(m), (int64_t)model_n_tensors(m) };
    put(R_I64, "model/sizes(n_params,n_f32,n_tensors)", sizes, 3);

    /* reference forward, router replay, last hidden states */
    uint16_t *replay = moe ? make_replay(&c) : NULL;
    forward(m, NULL, "forward");
    if (moe) {
        put_u16("inputs/replay", replay, (size_t)T_ALL * c.n_moe_layers * c.num_experts_per_tok);
        forward(m, replay, "forward_replay");
    }
    float *hidden = xmalloc(sizeof(float) * N_SEQS * (size_t)c.hidden_size);
    CHECK(trill_model_forward_last_hidden(m, g_tokens, OFFSETS, N_SEQS, hidden));
    put_f32("forward/last_hidden", hidden, N_SEQS * (size_t)c.hidden_size);
    free(hidden);

    /* full fine-tuning gradients */
    for (int rc = 0; rc < 2; rc++) free(train(m, NULL, rc, 0, rc ? "train_full_recompute" : "train_full"));
    if (sp->full_replay) free(train(m, replay, false, 0, "train_full_replay"));

    /* LoRA: forward enabled and disabled, gradients, two optimizer steps */
    trill_lora *lora = lora_of(m);
    tensor_list("lora/tensors", trill_lora_tensors(lora, &(size_t){ 0 }), lora_n_tensors(lora));
    const int64_t lsz[2] = { (int64_t)lora_n_params(lora), (int64_t)lora_n_tensors(lora) };
    put(R_I64, "lora/sizes(n_params,n_tensors)", lsz, 2);
    const float scale = trill_lora_scale(lora);
    put_f32("lora/scale", &scale, 1);
    trill_model_attach_lora(m, lora);
    trill_lora_set_enabled(lora, true);
    forward(m, NULL, "lora_enabled/forward");
    if (moe) forward(m, replay, "lora_enabled/forward_replay");
    float *lg = NULL;
    for (int rc = 0; rc < 2; rc++) {
        float *g = train(m, NULL, rc, lora_n_params(lora), rc ? "train_lora_recompute" : "train_lora");
        if (rc == 0) lg = g;
        else free(g);
    }
    if (moe) free(train(m, replay, true, lora_n_params(lora), "train_lora_replay_recompute"));
    {
        trill_adamw *opt;
        CHECK(trill_adamw_create(lora_n_params(lora), trill_adamw_defaults(), &opt));
        float *p = xmalloc(sizeof(float) * lora_n_params(lora));
        memcpy(p, trill_lora_params(lora, &(size_t){ 0 }), sizeof(float) * lora_n_params(lora));
        const double norm = trill_clip_grad_norm(lg, lora_n_params(lora), 0.5);
        for (int step = 0; step < 2; step++) trill_adamw_step(opt, p, lg, 1e-2, NULL);
        put(R_F64, "optim/grad_norm", &norm, 1);
        put_f32("optim/lora_params_after_2_adamw_steps", p, lora_n_params(lora));
        free(p);
        trill_adamw_free(opt);
    }
    free(lg);
    trill_lora_set_enabled(lora, false);
    forward(m, NULL, "lora_disabled/forward");
    trill_lora_set_enabled(lora, true);
    trill_model_attach_lora(m, NULL);

    /* merging into an fp32 copy */
    trill_model *merged = model_of(&c, TRILL_F32, sp->seed);
    CHECK(trill_lora_merge(lora, merged));
    put_f32("merged/params", trill_model_params(merged, &(size_t){ 0 }), model_n_f32(merged));
    forward(merged, NULL, "merged/forward");
    trill_model_free(merged);

    /* bf16 storage: forward, and LoRA gradients on the frozen bf16 base */
    trill_model *mb = model_of(&c, TRILL_BF16, sp->seed);
    if (trill_model_storage(mb) != TRILL_BF16) die("trill_model_create_stored(TRILL_BF16): storage is not bf16");
    const size_t mb_f32 = model_n_f32(mb), mb_bf16 = (trill_model_bytes(mb) - mb_f32 * sizeof(float)) / sizeof(uint16_t);
    const int64_t bsz[2] = { (int64_t)mb_f32, (int64_t)mb_bf16 };
    put(R_I64, "bf16/sizes(n_f32,n_bf16)", bsz, 2);
    forward(mb, NULL, "bf16/forward");
    if (moe) forward(mb, replay, "bf16/forward_replay");
    trill_lora *lb = lora_of(mb);
    trill_model_attach_lora(mb, lb);
    free(train(mb, NULL, false, lora_n_params(lb), "bf16/train_lora"));
    trill_model_attach_lora(mb, NULL);
    trill_lora_free(lb);
    trill_model_free(mb);

    /* the generator in every format: plain, with EPLB, with a live adapter update, with both */
    static const trill_gen_format FORMATS[] = { TRILL_GEN_F32, TRILL_GEN_BF16, TRILL_GEN_INT8 };
    for (size_t fi = 0; fi < sizeof FORMATS / sizeof FORMATS[0]; fi++) {
        const char *fname = trill_gen_format_name(FORMATS[fi]);
        for (int with_lora = 0; with_lora < 2; with_lora++) {
            char key[96];
            snprintf(key, sizeof key, "engine_%s%s", fname, with_lora ? "_adapter" : "");
            gen_result off;
            generate(m, FORMATS[fi], with_lora ? lora : NULL, false, &off);
            gen_record(&c, &off, key);
            if (verbose) printf("  %s%s: %d sequences, %d ended on a stop id\n", g_prefix, key, off.n, off.stops);
            if (moe) {
                gen_result on;
                generate(m, FORMATS[fi], with_lora ? lora : NULL, true, &on);
                expect_same_outputs(&c, &off, &on, key);
                snprintf(key, sizeof key, "engine_%s%s_eplb", fname, with_lora ? "_adapter" : "");
                gen_record(&c, &on, key);
                gen_free(&on);
            }
            gen_free(&off);
        }
    }

    trill_lora_free(lora);
    free(replay);
    trill_model_free(m);
    g_prefix[0] = 0;
}

/* ---- fingerprint: what makes bytes comparable ---- */

/* The AVX-512 extensions the compiler targeted (-march=native): two AVX-512 machines of other
 * generations (Cascade Lake, Cooper Lake with BF16 and FP16) vectorise the same C differently,
 * so they are different classes even though both have AVX-512F. */
static void compiler_isa(text *t) {
    text_add(t, "compiler_avx512=");
#ifdef __AVX512BW__
    text_add(t, "bw ");
#endif
#ifdef __AVX512VL__
    text_add(t, "vl ");
#endif
#ifdef __AVX512DQ__
    text_add(t, "dq ");
#endif
#ifdef __AVX512VNNI__
    text_add(t, "vnni ");
#endif
#ifdef __AVX512BF16__
    text_add(t, "bf16 ");
#endif
#ifdef __AVX512FP16__
    text_add(t, "fp16 ");
#endif
#ifdef __AVX512IFMA__
    text_add(t, "ifma ");
#endif
#ifdef __AVX512VBMI__
    text_add(t, "vbmi ");
#endif
#ifdef __AVX512VBMI2__
    text_add(t, "vbmi2 ");
#endif
#ifdef __AVX512BITALG__
    text_add(t, "bitalg ");
#endif
#ifdef __AVX512VPOPCNTDQ__
    text_add(t, "vpopcntdq ");
#endif
    text_add(t, "\n");
}

static void fingerprint(text *t) {
    const char *isa;
    if (trill_gen_isa(&isa) != TRILL_OK) {
        /* A skip only where the CPU lacks what ctest pins (TRILL_GEN_ISA=avx2): trill refusing
         * an instruction set the CPU has is a failure of trill's dispatch, not a reason to skip. */
        const char *want = getenv("TRILL_GEN_ISA");
        const int supported = want && !strcmp(want, "avx2") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        fprintf(stderr, "golden_tool: the generator cannot run as asked here%s: %s\n",
                supported ? ", although this CPU has AVX2 and FMA" : "", trill_error_message());
        exit(supported ? 1 : 77);
    }
    const char *core = openblas_get_corename(), *conf = openblas_get_config();
    text_add(t, "openblas_core=%s\n", core ? core : "?");
    text_add(t, "openblas_config=%s\n", conf ? conf : "?");
    text_add(t, "gen_isa=%s\n", isa);
    text_add(t, "omp_threads=%d\n", omp_get_max_threads());
#ifdef __AVX512F__
    text_add(t, "compiler_avx512f=1\n");
#else
    text_add(t, "compiler_avx512f=0\n");
#endif
    compiler_isa(t);
    text_add(t, "compiler_march=%s\n", TRILL_GOLDEN_MARCH);
#if defined(__AVX2__) && defined(__FMA__)
    text_add(t, "compiler_avx2_fma=1\n");
#else
    text_add(t, "compiler_avx2_fma=0\n");
#endif
    text_add(t, "compiler=%s\n", __VERSION__);
    text_add(t, "build=%s\n", TRILL_GOLDEN_BUILD);
    text_add(t, "libc=glibc %s\n", gnu_get_libc_version());
}

/* ---- file I/O ---- */

static void write_file(const char *path) {
    trill_atomic_file af;
    CHECK(trill_atomic_open(&af, path));
    const uint32_t head[2] = { FILE_VERSION, (uint32_t)g_out.n };
    CHECK(trill_atomic_write(&af, "TRILLGLD", 8));
    CHECK(trill_atomic_write(&af, head, sizeof head));
    for (size_t i = 0; i < g_out.n; i++) {
        const record *r = &g_out.r[i];
        const uint16_t nl = (uint16_t)strlen(r->name);
        const uint8_t ty = (uint8_t)r->type;
        const uint64_t len = r->len;
        CHECK(trill_atomic_write(&af, &nl, sizeof nl));
        CHECK(trill_atomic_write(&af, r->name, nl));
        CHECK(trill_atomic_write(&af, &ty, 1));
        CHECK(trill_atomic_write(&af, &len, sizeof len));
        CHECK(trill_atomic_write(&af, r->data, r->len));
    }
    CHECK(trill_atomic_commit(&af));
}

static const uint8_t *g_file_start;

static void take(const char *path, const uint8_t **p, const uint8_t *end, void *dst, size_t n, const char *what) {
    if ((size_t)(end - *p) < n) die("%s: truncated at byte %zu (reading %s)", path, (size_t)(*p - g_file_start), what);
    memcpy(dst, *p, n);
    *p += n;
}

static records read_file(const char *path) {
    char *buf;
    size_t len;
    CHECK(trill_read_file(path, &buf, &len));
    const uint8_t *p = (const uint8_t *)buf, *end = p + len;
    g_file_start = p;
    char magic[8];
    uint32_t head[2];
    take(path, &p, end, magic, 8, "the magic");
    if (memcmp(magic, "TRILLGLD", 8)) die("%s: not a golden file (bad magic)", path);
    take(path, &p, end, head, sizeof head, "the header");
    if (head[0] != FILE_VERSION) die("%s: file version %u, this tool writes %u", path, head[0], FILE_VERSION);
    records rs = { .r = xcalloc(head[1], sizeof(record)), .n = head[1], .cap = head[1] };
    for (uint32_t i = 0; i < head[1]; i++) {
        record *r = &rs.r[i];
        uint16_t nl;
        uint8_t ty;
        uint64_t n;
        take(path, &p, end, &nl, sizeof nl, "a name length");
        r->name = xcalloc(nl + 1u, 1);
        take(path, &p, end, r->name, nl, "a name");
        take(path, &p, end, &ty, 1, r->name);
        take(path, &p, end, &n, sizeof n, r->name);
        if (ty < R_F32 || ty > R_TEXT) die("%s: record %s: unknown type %u", path, r->name, ty);
        if (n > (uint64_t)(end - p)) die("%s: record %s: %llu bytes, only %zu left", path, r->name, (unsigned long long)n, (size_t)(end - p));
        r->type = (rtype)ty;
        r->len = (size_t)n;
        r->data = xmalloc(r->len);
        take(path, &p, end, r->data, r->len, r->name);
    }
    if (p != end) die("%s: %zu bytes after the last record", path, (size_t)(end - p));
    free(buf);
    return rs;
}

static void records_free(records *rs) {
    for (size_t i = 0; i < rs->n; i++) {
        free(rs->r[i].name);
        free(rs->r[i].data);
    }
    free(rs->r);
    *rs = (records){ 0 };
}

static const record *find(const records *rs, const char *name) {
    for (size_t i = 0; i < rs->n; i++)
        if (!strcmp(rs->r[i].name, name)) return &rs->r[i];
    return NULL;
}

static void print_element(rtype t, const uint8_t *p) {
    switch (t) {
    case R_F32: { float v; uint32_t b; memcpy(&v, p, 4); memcpy(&b, p, 4); printf("%.9g (0x%08x)", v, b); break; }
    case R_F64: { double v; uint64_t b; memcpy(&v, p, 8); memcpy(&b, p, 8); printf("%.17g (0x%016llx)", v, (unsigned long long)b); break; }
    case R_I32: { int32_t v; memcpy(&v, p, 4); printf("%d", v); break; }
    case R_U32: { uint32_t v; memcpy(&v, p, 4); printf("%u", v); break; }
    case R_U16: { uint16_t v; memcpy(&v, p, 2); printf("%u", v); break; }
    case R_I64: { int64_t v; memcpy(&v, p, 8); printf("%lld", (long long)v); break; }
    case R_TEXT: printf("'%c'", *p); break;
    }
}

/* The line of a text containing byte `at`, printed on its own. */
static void print_line(const char *label, const uint8_t *s, size_t len, size_t at) {
    size_t b = at < len ? at : len, e = b;
    while (b > 0 && s[b - 1] != '\n') b--;
    while (e < len && s[e] != '\n') e++;
    printf("    %s: %.*s\n", label, (int)(e - b), (const char *)s + b);
}

/* 0 when equal, else prints what differs and returns 1. */
static int compare_record(const record *want, const record *got) {
    if (want->type != got->type) {
        printf("MISMATCH %s: type %s in the file, %s now\n", want->name, type_name(want->type), type_name(got->type));
        return 1;
    }
    const size_t es = type_size(want->type);
    if (want->len != got->len) {
        printf("MISMATCH %s: %zu elements of %s in the file, %zu now\n", want->name, want->len / es, type_name(want->type), got->len / es);
        return 1;
    }
    if (!memcmp(want->data, got->data, want->len)) return 0;
    const size_t n = want->len / es;
    size_t first = n, count = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(want->data + i * es, got->data + i * es, es)) {
            if (first == n) first = i;
            count++;
        }
    printf("MISMATCH %s (%s[%zu]): %zu elements differ, the first at index %zu: golden ", want->name, type_name(want->type), n, count, first);
    print_element(want->type, want->data + first * es);
    printf(", now ");
    print_element(got->type, got->data + first * es);
    printf("\n");
    if (want->type == R_TEXT) {
        print_line("golden", want->data, want->len, first);
        print_line("now   ", got->data, got->len, first);
    }
    return 1;
}

/* The line "KEY=..." of a fingerprint (length in *len), or NULL. */
static const char *fp_line(const record *r, const char *key, size_t kl, size_t *len) {
    const char *p = (const char *)r->data, *end = p + r->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const size_t l = (size_t)((nl ? nl : end) - p);
        if (l > kl && p[kl] == '=' && !memcmp(p, key, kl)) {
            *len = l;
            return p;
        }
        p += l + 1;
    }
    return NULL;
}

/* Prints each fingerprint entry that differs between the file and this machine; returns how many. */
static int compare_fingerprint(const record *want, const record *got) {
    int diffs = 0;
    for (int side = 0; side < 2; side++) { /* entries of the file, then entries only this machine has */
        const record *a = side ? got : want, *b = side ? want : got;
        const char *p = (const char *)a->data, *end = p + a->len;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p)), *eq;
            const size_t l = (size_t)((nl ? nl : end) - p);
            const size_t kl = (eq = memchr(p, '=', l)) ? (size_t)(eq - p) : l;
            size_t ol;
            const char *o = fp_line(b, p, kl, &ol);
            if (!o) {
                printf("  %.*s: %s\n", (int)l, p, side ? "only on this machine" : "in the file, not on this machine");
                diffs++;
            } else if (!side && (ol != l || memcmp(o, p, l))) {
                printf("  %.*s: golden '%.*s', here '%.*s'\n", (int)kl, p, (int)(l - kl - 1), p + kl + 1, (int)(ol - kl - 1), o + kl + 1);
                diffs++;
            }
            p += l + 1;
        }
    }
    return diffs;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void compute_all(bool verbose) {
    for (size_t i = 0; i < sizeof SPECS / sizeof SPECS[0]; i++) run_spec(&SPECS[i], verbose);
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[1], "write") && strcmp(argv[1], "check") && strcmp(argv[1], "across") && strcmp(argv[1], "list"))) {
        fprintf(stderr, "usage: golden_tool write|check|across|list FILE\n");
        return 2;
    }
    /* across: check, comparing the records (but the fingerprint) even when the fingerprint
     * differs: how far two machine classes agree (by hand, never in ctest) */
    const int across = !strcmp(argv[1], "across");
    const char *mode = across ? "check" : argv[1], *path = argv[2];
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "list")) {
        records rs = read_file(path);
        size_t total = 0;
        for (size_t i = 0; i < rs.n; i++) {
            printf("%-72s %-4s %8zu bytes\n", rs.r[i].name, type_name(rs.r[i].type), rs.r[i].len);
            total += rs.r[i].len;
        }
        printf("%zu records, %zu bytes of data\n", rs.n, total);
        if (rs.n && !strcmp(rs.r[0].name, "fingerprint")) printf("fingerprint:\n%.*s", (int)rs.r[0].len, (const char *)rs.r[0].data);
        records_free(&rs);
        return 0;
    }

    /* RMSNorm's weight gradients sum per-thread partials in thread order, so full fine-tuning
     * gradients of the norm vectors depend on the thread count (their last bits; everything else
     * does not): the tool runs on GOLDEN_THREADS whatever OMP_NUM_THREADS says. */
    omp_set_num_threads(GOLDEN_THREADS);
    if (!strcmp(mode, "write"))
        for (size_t i = 0; i < 2; i++) {
            static const char *const PINNED[] = { "OPENBLAS_CORETYPE", "TRILL_GEN_ISA" };
            const char *v = getenv(PINNED[i]);
            if (!v || !*v) die("write: %s is not set: the file would record this CPU's own kernels, which ctest (OPENBLAS_CORETYPE=Haswell "
                               "TRILL_GEN_ISA=avx2) never reproduces; use tests/golden/regenerate.sh", PINNED[i]);
        }
    const double t0 = now_s();
    text fp = { 0 };
    fingerprint(&fp);
    printf("golden_tool: fingerprint of this machine:\n%.*s", (int)fp.len, fp.s);
    put_text("fingerprint", &fp);

    records want = { 0 };
    int fp_diffs = 0;
    if (!strcmp(mode, "check")) {
        want = read_file(path);
        if (!want.n || strcmp(want.r[0].name, "fingerprint")) die("%s: the first record is not the fingerprint", path);
        fp_diffs = compare_fingerprint(&want.r[0], &g_out.r[0]);
        if (fp_diffs && !across)
            printf("golden_tool: the fingerprint differs (%d entr%s above): %s was made on another machine class, its bytes are not "
                   "comparable here; computing everything anyway (for the sanitizers), then skipping the comparison\n",
                   fp_diffs, fp_diffs == 1 ? "y" : "ies", path);
    }

    compute_all(!strcmp(mode, "write"));
    const double t1 = now_s();

    if (!strcmp(mode, "write")) {
        write_file(path);
        size_t total = 0;
        for (size_t i = 0; i < g_out.n; i++) total += g_out.r[i].len;
        printf("golden_tool: wrote %zu records (%zu bytes of data) to %s in %.2f s\n", g_out.n, total, path, t1 - t0);
        records_free(&g_out);
        return 0;
    }
    if (fp_diffs && !across) {
        records_free(&want);
        records_free(&g_out);
        return 77;
    }
    int bad = 0;
    for (size_t i = across ? 1 : 0; i < want.n; i++) {
        const record *got = find(&g_out, want.r[i].name);
        if (!got) {
            printf("MISSING %s: in the file (%s, %zu bytes) but not computed now\n", want.r[i].name, type_name(want.r[i].type), want.r[i].len);
            bad++;
        } else bad += compare_record(&want.r[i], got);
    }
    for (size_t i = 0; i < g_out.n; i++)
        if (!find(&want, g_out.r[i].name)) {
            printf("EXTRA %s: computed now (%s, %zu bytes) but not in the file\n", g_out.r[i].name, type_name(g_out.r[i].type), g_out.r[i].len);
            bad++;
        }
    if (bad) printf("golden_tool: %d of %zu records differ from %s (%.2f s)\n", bad, want.n, path, t1 - t0);
    else printf("golden_tool: all %zu records identical to %s (%.2f s)\n", want.n, path, t1 - t0);
    records_free(&want);
    records_free(&g_out);
    return bad ? 1 : 0;
}
