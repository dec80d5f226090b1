/* The Qwen3-MoE tensor table (src/arch/qwen3/tensors.c) and what is derived from it, checked
 * against counts written out here by hand from the `small` preset's numbers (presets.c: vocab
 * 32000, hidden 512, dense intermediate 1536, 8 layers, layer 0 dense, 8 heads / 4 kv heads of
 * 64, 16 experts top-4 of intermediate 256, untied lm_head). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "arch/family.h"
#include "arch/decoder.h"
#include "model/config_json.h"
#include "trill/config.h"
#include "model/lora_internal.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/train.h"
#include "trill/infer.h"
#include "trill/fileio.h"
#include "trill/safetensors.h"
#include "testutil.h"

#define LW(m, l) ((const trill_decoder_weights *)trill_model_layer(m, l))
#define LL(lora, l) ((const trill_decoder_lora *)trill_lora_layer(lora, l))

/* the small preset, independently of the config struct */
enum { V = 32000, H = 512, I = 1536, LAYERS = 8, QD = 8 * 64, KVD = 4 * 64, HD = 64, E = 16, K = 4, IM = 256 };
static const int64_t ATTN = (int64_t)QD * H + 2 * (int64_t)KVD * H + (int64_t)H * QD; /* q, k, v, o */
static const int64_t NORMS = 2 * H + 2 * HD;                                            /* input, post, q_norm, k_norm */
static const int64_t EXPERT = 3 * (int64_t)IM * H;                                      /* gate, up, down */
static const int64_t DENSE_MLP = 3 * (int64_t)I * H;
static const int64_t ROUTER = (int64_t)E * H;
static const int64_t EMBED = (int64_t)V * H;

static trill_config small_config(void) {
    json_t *j = trill_config_preset("small");
    assert_non_null(j);
    trill_config c;
    assert_int_equal(trill_config_from_json(j, "small", &c), TRILL_OK);
    json_decref(j);
    return c;
}

typedef struct seen {
    int n, n_expert, n_norm, n_router, n_head, n_embed;
    int64_t numel;
    char first[112], last[112];
    bool layer_order_ok;
    int last_layer;
} seen;

static void visit(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    seen *s = ctx;
    if (s->n == 0) snprintf(s->first, sizeof s->first, "%s", t->name);
    snprintf(s->last, sizeof s->last, "%s", t->name);
    assert_int_equal(t->index, s->n); /* checkpoint order */
    s->n++;
    s->numel += (int64_t)t->numel;
    s->n_expert += t->expert >= 0;
    s->n_norm += t->kind == TRILL_TENSOR_NORM;
    s->n_router += t->kind == TRILL_TENSOR_ROUTER;
    s->n_head += t->kind == TRILL_TENSOR_HEAD;
    s->n_embed += t->kind == TRILL_TENSOR_EMBEDDING;
    if (t->layer >= 0) {
        if (t->layer < s->last_layer) s->layer_order_ok = false; /* a layer's tensors are contiguous */
        s->last_layer = t->layer;
    }
    /* the row's facts are consistent with the shape */
    if (t->ndim == 1) assert_true(t->kind == TRILL_TENSOR_NORM || t->kind == TRILL_TENSOR_BIAS);
    if (t->role == TRILL_ROLE_Q) {
        assert_int_equal(t->shape[0], QD);
        assert_int_equal(t->shape[1], H);
        assert_int_equal(t->fuse, TRILL_FUSE_QKV);
        assert_int_equal(t->split, TRILL_SPLIT_ROWS);
    }
    if (t->role == TRILL_ROLE_EXPERT_DOWN) {
        assert_int_equal(t->shape[0], H);
        assert_int_equal(t->shape[1], IM);
        assert_int_equal(t->split, TRILL_SPLIT_COLS);
        assert_int_equal(t->lora_target, TRILL_LORA_DOWN);
    }
    if (t->role == TRILL_ROLE_ROUTER) assert_int_equal(t->lora_target, TRILL_NO_LORA);
}

static void test_table_walk(void **state) {
    (void)state;
    trill_config c = small_config();
    seen s = { .layer_order_ok = true };
    trill_arch_walk(&c, visit, &s);
    /* embed; per layer 4 norms + 4 attention; 1 dense MLP of 3; 7 MoE layers of router + 16 x 3; norm; lm_head */
    assert_int_equal(s.n, 1 + LAYERS * 8 + 3 + 7 * (1 + E * 3) + 1 + 1);
    assert_int_equal(s.n_expert, 7 * E * 3);
    assert_int_equal(s.n_norm, LAYERS * 4 + 1);
    assert_int_equal(s.n_router, 7);
    assert_int_equal(s.n_head, 1);
    assert_int_equal(s.n_embed, 1);
    assert_true(s.layer_order_ok);
    assert_string_equal(s.first, "model.embed_tokens.weight");
    assert_string_equal(s.last, "lm_head.weight");
    const int64_t total = 2 * EMBED + H + LAYERS * (ATTN + NORMS) + DENSE_MLP + 7 * (ROUTER + E * EXPERT);
    assert_int_equal(s.numel, total);
}

static void test_param_counts(void **state) {
    (void)state;
    trill_config c = small_config();
    int64_t total, active;
    trill_config_param_counts(&c, &total, &active);
    assert_int_equal(total, 2 * EMBED + H + LAYERS * (ATTN + NORMS) + DENSE_MLP + 7 * (ROUTER + E * EXPERT));
    assert_int_equal(active, 2 * EMBED + H + LAYERS * (ATTN + NORMS) + DENSE_MLP + 7 * (ROUTER + K * EXPERT));
    /* tied: no lm_head tensor of its own */
    c.tie_word_embeddings = true;
    int64_t tied_total, tied_active;
    trill_config_param_counts(&c, &tied_total, &tied_active);
    assert_int_equal(tied_total, total - EMBED);
    assert_int_equal(tied_active, active - EMBED);
}

static void test_flops(void **state) {
    (void)state;
    trill_config c = small_config();
    const int offsets[2] = { 0, 10 }; /* one sequence of 10 tokens: 55 causal pairs */
    const double T = 10, pairs = 55;
    const double matmul = 2 * T * (double)(LAYERS * ATTN + DENSE_MLP + 7 * (ROUTER + K * EXPERT));
    const double head = 2 * T * (double)EMBED;
    const double attention = LAYERS * 2.0 * 2.0 * pairs * HD * 8;
    assert_true(trill_forward_flops(&c, offsets, 1) == matmul + head + attention);
    const int r = 16;
    /* an adapter costs 2 r (in + out) per token: q, k, v, o; the dense MLP; the top-k experts */
    const double lora = 2 * T * r *
                        (double)(LAYERS * ((H + QD) + 2 * (H + KVD) + (QD + H)) + 3 * (H + I) + 7 * K * 3 * (H + IM));
    const double fwd = matmul + head + attention + lora;
    assert_true(trill_train_step_flops(&c, offsets, 1, true, r, false) == fwd + (matmul + head) + head + 2.5 * attention + 2 * lora);
    assert_true(trill_train_step_flops(&c, offsets, 1, false, 0, true) ==
                (matmul + head + attention) + 2 * (matmul + head) + head + 2.5 * attention + (matmul + attention));
}

/* The LoRA layout derived from the table: parameters per target, PEFT names, order, pointers. */
static void test_lora_layout(void **state) {
    (void)state;
    trill_config c = small_config();
    c.num_hidden_layers = 3; /* layer 0 dense, 1-2 MoE: keeps the model small */
    c.vocab_size = 256;
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    const int r = 4;
    trill_lora_config lc = { .rank = r, .alpha = 8, .targets = trill_family_qwen3.lora_targets };
    trill_lora *lora;
    assert_int_equal(trill_lora_create(m, lc, 1, &lora), TRILL_OK);
    int64_t per_target[TRILL_LORA_N_TARGETS] = { 0 };
    for (size_t t = 0; t < lora->n_tensors; t++) {
        assert_true(lora->tensors[t].lora_target >= 0 && lora->tensors[t].lora_target < TRILL_LORA_N_TARGETS);
        per_target[lora->tensors[t].lora_target] += (int64_t)lora->tensors[t].numel;
    }
    const int moe_layers = 2, layers = 3;
    assert_int_equal(per_target[TRILL_LORA_Q], layers * r * (H + QD));
    assert_int_equal(per_target[TRILL_LORA_K], layers * r * (H + KVD));
    assert_int_equal(per_target[TRILL_LORA_V], layers * r * (H + KVD));
    assert_int_equal(per_target[TRILL_LORA_O], layers * r * (QD + H));
    assert_int_equal(per_target[TRILL_LORA_GATE], r * (H + I) + moe_layers * E * r * (H + IM));
    assert_int_equal(per_target[TRILL_LORA_UP], r * (H + I) + moe_layers * E * r * (H + IM));
    assert_int_equal(per_target[TRILL_LORA_DOWN], r * (I + H) + moe_layers * E * r * (IM + H));
    assert_int_equal(per_target[TRILL_LORA_LM_HEAD], r * (H + 256));
    /* order: layer by layer, the layer's own modules, then expert by expert; lm_head last */
    assert_string_equal(lora->tensors[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    assert_string_equal(lora->tensors[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
    const size_t moe0 = 2 * (4 + 3), expert1 = moe0 + 2 * 4 + 2 * 3; /* layer 0: attention + MLP; layer 1: attention, expert 0 */
    assert_string_equal(lora->tensors[moe0 + 8].name, "base_model.model.model.layers.1.mlp.experts.0.gate_proj.lora_A.weight");
    assert_string_equal(lora->tensors[moe0 + 12].name, "base_model.model.model.layers.1.mlp.experts.0.down_proj.lora_A.weight");
    assert_string_equal(lora->tensors[expert1].name, "base_model.model.model.layers.1.mlp.experts.1.gate_proj.lora_A.weight");
    assert_string_equal(lora->tensors[lora->n_tensors - 1].name, "base_model.model.lm_head.lora_B.weight");
    /* each A knows the weight it adapts, and the layer's pointers point at it */
    for (size_t t = 0; t < lora->n_tensors; t += 2) {
        const trill_param *A = &lora->tensors[t], *W = &m->tensors[A->index];
        assert_int_equal(A->shape[1], W->shape[1]);
        assert_int_equal(lora->tensors[t + 1].shape[0], W->shape[0]);
        assert_int_equal(A->layer, W->layer);
        assert_int_equal(A->expert, W->expert);
    }
    assert_ptr_equal(LL(lora, 0)->o.A, lora->tensors[6].data);
    assert_non_null(LL(lora, 2)->expert_up[5].A);
    assert_null(LL(lora, 0)->expert_up); /* dense */
    assert_ptr_equal(lora->lm_head.B, lora->tensors[lora->n_tensors - 1].data);
    trill_lora_free(lora);
    /* only q and down: the expert arrays of gate and up stay empty */
    lc.targets = (1u << TRILL_LORA_Q) | (1u << TRILL_LORA_DOWN);
    assert_int_equal(trill_lora_create(m, lc, 1, &lora), TRILL_OK);
    assert_null(LL(lora, 1)->expert_gate);
    assert_non_null(LL(lora, 1)->expert_down);
    assert_int_equal(lora->n_tensors, 2 * (layers + 1 + moe_layers * E));
    trill_lora_free(lora);
    /* all-linear is the family's linear modules but lm_head, resolved at create */
    lc.targets = TRILL_LORA_ALL_LINEAR | 1u << TRILL_LORA_Q;
    assert_int_equal(trill_lora_create(m, lc, 1, &lora), TRILL_OK);
    assert_int_equal(trill_lora_get_config(lora)->targets, trill_family_qwen3.lora_targets & ~(1u << TRILL_LORA_LM_HEAD));
    trill_lora_free(lora);
    /* a module of another family is refused by name */
    lc.targets = 1u << TRILL_LORA_KV_B;
    assert_int_equal(trill_lora_create(m, lc, 1, &lora), TRILL_ERR_UNSUPPORTED);
    assert_non_null(strstr(trill_error_message(), "kv_b_proj: a qwen3_moe model has no such module"));
    lc.targets = 1u << TRILL_LORA_N_TARGETS; /* no module has this bit */
    assert_int_equal(trill_lora_create(m, lc, 1, &lora), TRILL_ERR_INVALID);
    char bit[48];
    snprintf(bit, sizeof bit, "bit %d names no module", (int)TRILL_LORA_N_TARGETS);
    assert_non_null(strstr(trill_error_message(), bit));
    trill_model_free(m);
}

/* the model's pointers are the table's slices */
static void test_model_fields(void **state) {
    (void)state;
    trill_config c = small_config();
    c.num_hidden_layers = 2;
    c.vocab_size = 64;
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        assert_int_equal(p->index, (int)t);
        if (p->role == TRILL_ROLE_K) assert_ptr_equal(LW(m, p->layer)->wk.f32, p->data);
        if (p->role == TRILL_ROLE_EXPERT_GATE && p->expert == 3)
            assert_ptr_equal(LW(m, p->layer)->expert_gate.f32 + 3 * (size_t)IM * H, p->data);
        if (p->role == TRILL_ROLE_FINAL_NORM) assert_ptr_equal(m->final_norm, p->data);
        if (p->role == TRILL_ROLE_LM_HEAD) assert_ptr_equal(m->lm_head.f32, p->data);
    }
    trill_model_free(m);
}

/* ---- the second family: DeepSeek-V3 / Kimi K2 (MLA, shared experts, first layers dense) ---- */

static trill_config parse(const char *text) {
    trill_config c;
    if (trill_config_parse(text, strlen(text), "config.json", &c) != TRILL_OK) fail_msg("%s", trill_error_message());
    return c;
}

/* An independent count of a DeepSeek-V3-shaped model: per layer the MLA projections and norms,
 * then a dense MLP (first_k_dense layers) or the router, its bias, the routed experts and the
 * shared ones; the embedding and an untied head. Active: k routed experts of each MoE layer. */
typedef struct ds_shape { int64_t V, H, I, Im, L, first_dense, heads, E, shared, k, q_lora, kv_lora, nope, rope, v; } ds_shape;

static void ds_count(const ds_shape *d, double *total, double *active) {
    const int64_t q = d->q_lora ? d->q_lora * d->H + d->q_lora + d->heads * (d->nope + d->rope) * d->q_lora
                                : d->heads * (d->nope + d->rope) * d->H;
    const int64_t attn = q + (d->kv_lora + d->rope) * d->H + d->kv_lora + d->heads * (d->nope + d->v) * d->kv_lora +
                         d->H * d->heads * d->v + 2 * d->H;
    const int64_t expert = 3 * d->Im * d->H, moe_fixed = d->E * d->H + d->E + d->shared * expert;
    const int64_t moe_layers = d->L - d->first_dense;
    *total = (double)(2 * d->V * d->H + d->H + d->L * attn + d->first_dense * 3 * d->I * d->H + moe_layers * (moe_fixed + d->E * expert));
    *active = (double)(2 * d->V * d->H + d->H + d->L * attn + d->first_dense * 3 * d->I * d->H + moe_layers * (moe_fixed + d->k * expert));
}

/* The published sizes: DeepSeek-V3 671B total / 37B activated (without its MTP module), Kimi K2
 * "1T total / 32B activated" (1.03T / 32.9B counted exactly with the embeddings and the head). */
static void test_deepseek_counts(void **state) {
    (void)state;
    const struct { const char *preset; ds_shape d; double total, active; } cases[] = {
        { "deepseek-v3", { 129280, 7168, 18432, 2048, 61, 3, 128, 256, 1, 8, 1536, 512, 128, 64, 128 }, 671e9, 37e9 },
        { "kimi-k2", { 163840, 7168, 18432, 2048, 61, 1, 64, 384, 1, 8, 1536, 512, 128, 64, 128 }, 1.03e12, 32.9e9 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = trill_config_preset_text(cases[i].preset); /* the real configs (presets.c) */
        assert_non_null(text);
        const trill_config c = parse(text);
        free(text);
        assert_int_equal(c.n_moe_layers, 61 - cases[i].d.first_dense);
        assert_int_equal(c.moe_ordinal[cases[i].d.first_dense], 0);
        int64_t total, active;
        trill_config_param_counts(&c, &total, &active);
        double want_total, want_active;
        ds_count(&cases[i].d, &want_total, &want_active);
        assert_true((double)total == want_total);
        assert_true((double)active == want_active);
        /* against the published figures, to the precision they are given in */
        if (fabs(total / cases[i].total - 1) > 0.01 || fabs(active / cases[i].active - 1) > 0.02)
            fail_msg("%s: %.4g total / %.4g active, published %.4g / %.4g", trill_config_model_type(&c), (double)total, (double)active,
                     cases[i].total, cases[i].active);
        print_message("%s: %.2f B total, %.2f B active\n", trill_config_model_type(&c), total * 1e-9, active * 1e-9);
    }
}

/* A change to a toy config.json (`from` replaced by `to`) and the words its refusal must hold. */
typedef struct refusal { const char *from, *to, *msg; } refusal;

/* Each change of the toy is refused, naming the field. */
static void expect_refusals(const char *toy, const refusal *bad, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char text[2048];
        const char *at = strstr(toy, bad[i].from);
        assert_non_null(at);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - toy), toy, bad[i].to, at + strlen(bad[i].from));
        trill_config x;
        assert_int_not_equal(trill_config_parse(text, strlen(text), "config.json", &x), TRILL_OK);
        if (!strstr(trill_error_message(), bad[i].msg)) fail_msg("%s: %s", bad[i].msg, trill_error_message());
    }
}

/* A toy of the family: its checkpoint names, the MLA LoRA targets, q_proj when q_lora_rank is
 * null, the refusals by field; its forward and generator run. */
static void test_deepseek_toy(void **state) {
    (void)state;
    static const char toy[] =
        "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\", \"vocab_size\": 64, \"hidden_size\": 32,"
        " \"intermediate_size\": 48, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 2,"
        " \"num_key_value_heads\": 2, \"n_shared_experts\": 1, \"n_routed_experts\": 8, \"routed_scaling_factor\": 2.827,"
        " \"kv_lora_rank\": 16, \"q_lora_rank\": null, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8, \"qk_nope_head_dim\": 8,"
        " \"n_group\": 2, \"topk_group\": 1, \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1, \"rope_scaling\": null}";
    trill_config c = parse(toy);
    assert_int_equal(c.arch, TRILL_ARCH_KIMI_K2);
    assert_int_equal(c.q_lora_rank, 0);
    assert_false(c.yarn);
    assert_string_equal(trill_config_architecture(&c), "DeepseekV3ForCausalLM");
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    const trill_param *q = NULL, *kvb = NULL, *bias = NULL, *sh = NULL;
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        if (!strcmp(p->name, "model.layers.0.self_attn.q_proj.weight")) q = p;
        if (!strcmp(p->name, "model.layers.2.self_attn.kv_b_proj.weight")) kvb = p;
        if (!strcmp(p->name, "model.layers.1.mlp.gate.e_score_correction_bias")) bias = p;
        if (!strcmp(p->name, "model.layers.1.mlp.shared_experts.down_proj.weight")) sh = p;
        assert_null(strstr(p->name, "q_a_proj")); /* q_lora_rank null */
        assert_null(strstr(p->name, "layers.0.mlp.experts")); /* the first layer is dense */
    }
    assert_non_null(q);
    assert_int_equal(q->shape[0], 2 * (8 + 8));
    assert_non_null(kvb);
    assert_int_equal(kvb->shape[0], 2 * (8 + 8));
    assert_int_equal(kvb->shape[1], 16);
    assert_non_null(bias);
    assert_int_equal(bias->kind, TRILL_TENSOR_BIAS);
    assert_non_null(sh);
    assert_int_equal(sh->shape[1], 16);
    /* LoRA: all-linear covers MLA's projections and the shared experts, PEFT names */
    trill_lora_config lc = { .rank = 2, .alpha = 4, .targets = TRILL_LORA_ALL_LINEAR };
    trill_lora *lora;
    assert_int_equal(trill_lora_create(m, lc, 1, &lora), TRILL_OK);
    bool kv_b_named = false, shared_named = false;
    for (size_t t = 0; t < lora->n_tensors; t++) {
        kv_b_named |= !strcmp(lora->tensors[t].name, "base_model.model.model.layers.1.self_attn.kv_b_proj.lora_A.weight");
        shared_named |= !strcmp(lora->tensors[t].name, "base_model.model.model.layers.2.mlp.shared_experts.gate_proj.lora_B.weight");
    }
    assert_true(kv_b_named && shared_named);
    /* a dense layer, 2 MoE layers: q, kv_a, kv_b, o each layer; gate/up/down dense; 8 experts + shared of each MoE layer */
    assert_int_equal(lora->n_tensors, 2 * (3 * 4 + 3 + 2 * (8 * 3 + 3)));
    trill_lora_free(lora);
    /* the forward and the generator run */
    int tok[3] = { 1, 2, 3 }, off[2] = { 0, 3 };
    float lp[3];
    assert_int_equal(trill_model_forward(m, tok, off, 1, NULL, lp, NULL), TRILL_OK);
    assert_true(isfinite(lp[1]) && isfinite(lp[2]) && lp[1] < 0 && lp[2] < 0);
    trill_engine *e;
    assert_int_equal(trill_engine_create(m, NULL, &e), TRILL_OK);
    trill_engine_free(e);
    trill_model_free(m);
    /* what is not computed is refused by field */
    const refusal bad[] = {
        { "\"rope_scaling\": null", "\"scoring_func\": \"softmax\"", "field \"scoring_func\": \"softmax\" is not supported" },
        { "\"rope_scaling\": null", "\"topk_method\": \"greedy\"", "field \"topk_method\": \"greedy\" is not supported" },
        { "\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}", "rope type \"linear\" is not supported" },
        { "\"n_group\": 2", "\"n_group\": 3", "field \"n_group\": 3 does not divide n_routed_experts (8)" },
    };
    expect_refusals(toy, bad, sizeof bad / sizeof bad[0]);
}

/* ---- Mixtral (GQA without QK-norm, every layer a MoE; composed from the shared decoder) ---- */

/* The published sizes: Mixtral-8x7B 46.7B total / 12.9B active, Mixtral-8x22B 141B / 39B, against
 * an independent count (per layer q, k, v, o, two norms, the router and 8 experts of three
 * matrices; the embedding, the final norm and an untied head; active: the top-2 experts). */
static void test_mixtral_counts(void **state) {
    (void)state;
    const struct { const char *preset; int64_t V, H, I, L, nh, nkv; double total, active; } cases[] = {
        { "mixtral-8x7b", 32000, 4096, 14336, 32, 32, 8, 46.7e9, 12.9e9 },
        { "mixtral-8x22b", 32768, 6144, 16384, 56, 48, 8, 141e9, 39e9 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = trill_config_preset_text(cases[i].preset);
        assert_non_null(text);
        const trill_config c = parse(text);
        free(text);
        const int64_t h = cases[i].H, hd = h / cases[i].nh, expert = 3 * cases[i].I * h;
        const int64_t attn = 2 * cases[i].nh * hd * h + 2 * cases[i].nkv * hd * h + 2 * h + 8 * h;
        const double fixed = (double)(2 * cases[i].V * h + h);
        assert_int_equal(c.n_moe_layers, cases[i].L);
        int64_t total, active;
        trill_config_param_counts(&c, &total, &active);
        assert_true((double)total == fixed + (double)(cases[i].L * (attn + 8 * expert)));
        assert_true((double)active == fixed + (double)(cases[i].L * (attn + 2 * expert)));
        if (fabs(total / cases[i].total - 1) > 0.005 || fabs(active / cases[i].active - 1) > 0.005) /* to the figures' precision */
            fail_msg("%s: %.4g total / %.4g active, published %.4g / %.4g", cases[i].preset, (double)total, (double)active, cases[i].total,
                     cases[i].active);
        print_message("%s: %.2f B total, %.2f B active\n", cases[i].preset, total * 1e-9, active * 1e-9);
    }
}

/* A Mixtral toy: HF's checkpoint names (block_sparse_moe, w1/w2/w3), no QK-norm, every layer a
 * MoE, LoRA's PEFT module names w1/w2/w3, the refusals by field; its forward and generator run. */
static void test_mixtral_toy(void **state) {
    (void)state;
    static const char toy[] =
        "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": 64, \"hidden_size\": 32,"
        " \"intermediate_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"sliding_window\": null, \"router_jitter_noise\": 0.0}";
    trill_config c = parse(toy);
    assert_int_equal(c.arch, TRILL_ARCH_MIXTRAL);
    assert_int_equal(c.head_dim, 8); /* hidden_size / num_attention_heads */
    assert_int_equal(c.moe_intermediate_size, 16);
    assert_int_equal(c.n_moe_layers, 2);
    assert_true(c.norm_topk_prob);
    assert_false(trill_layer_desc_of(&c, 0).qk_norm);
    assert_int_equal(c.rms_norm_eps * 1e5 + 0.5, 1);
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    const trill_param *w1 = NULL, *w2 = NULL, *gate = NULL;
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        if (!strcmp(p->name, "model.layers.1.block_sparse_moe.experts.3.w1.weight")) w1 = p;
        if (!strcmp(p->name, "model.layers.0.block_sparse_moe.experts.0.w2.weight")) w2 = p;
        if (!strcmp(p->name, "model.layers.0.block_sparse_moe.gate.weight")) gate = p;
        assert_null(strstr(p->name, "norm.weight") && strstr(p->name, "self_attn")); /* no q_norm / k_norm */
        assert_null(strstr(p->name, "mlp."));
    }
    assert_non_null(w1);
    assert_int_equal(w1->shape[0], 16);
    assert_int_equal(w1->role, TRILL_ROLE_EXPERT_GATE);
    assert_non_null(w2);
    assert_int_equal(w2->shape[0], 32);
    assert_int_equal(w2->role, TRILL_ROLE_EXPERT_DOWN);
    assert_non_null(gate);
    assert_int_equal(gate->kind, TRILL_TENSOR_ROUTER);
    /* 2 layers: q k v o, router, 4 experts x 3, two norms; embedding, final norm, head */
    assert_int_equal(m->n_tensors, 2 * (4 + 1 + 4 * 3 + 2) + 3);
    trill_lora_config lc = { .rank = 2, .alpha = 4 };
    assert_int_equal(trill_lora_parse_targets("all-linear", &lc.targets), 0);
    trill_lora *lora;
    assert_int_equal(trill_lora_create(m, lc, 1, &lora), TRILL_OK);
    bool named = false;
    for (size_t t = 0; t < lora->n_tensors; t++)
        named |= !strcmp(lora->tensors[t].name, "base_model.model.model.layers.1.block_sparse_moe.experts.2.w3.lora_B.weight");
    assert_true(named);
    assert_int_equal(lora->n_tensors, 2 * 2 * (4 + 4 * 3));
    trill_lora_free(lora);
    /* all-linear is q, k, v, o, w1, w2, w3 here; Qwen3's expert names are not Mixtral's modules */
    lc.targets = 0;
    assert_int_equal(trill_lora_parse_targets("gate_proj", &lc.targets), 0);
    assert_int_not_equal(trill_lora_create(m, lc, 1, &lora), TRILL_OK);
    int tok[3] = { 1, 2, 3 }, off[2] = { 0, 3 };
    float lp[3];
    trill_model_init_random(m, 3);
    assert_int_equal(trill_model_forward(m, tok, off, 1, NULL, lp, NULL), TRILL_OK);
    assert_true(isfinite(lp[1]) && isfinite(lp[2]) && lp[1] < 0 && lp[2] < 0);
    trill_engine *e;
    assert_int_equal(trill_engine_create(m, NULL, &e), TRILL_OK);
    trill_engine_free(e);
    trill_model_free(m);
    const refusal bad[] = {
        { "\"sliding_window\": null", "\"sliding_window\": 0", "field \"sliding_window\"" }, /* null, or a window of 1 or more */
        { "\"router_jitter_noise\": 0.0", "\"router_jitter_noise\": 0.01", "field \"router_jitter_noise\": 0.01 is not supported" },
        { "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5", "field \"num_experts_per_tok\": 5 must be in [1, num_local_experts=4]" },
        { "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "must be a multiple of num_key_value_heads (3)" },
    };
    expect_refusals(toy, bad, sizeof bad / sizeof bad[0]);
}

/* ---- GLM-4.5 (GQA with q/k/v biases, QK-norm, partial RoPE; DeepSeek's router, shared experts) ---- */

/* The published sizes: GLM-4.5 355B total / 32B active, GLM-4.5-Air 106B / 12B, the active
 * figures without the embedding and the head (GLM's model card: "32 billion active
 * parameters"), against an independent count. trill counts GLM-4.5 at 352.8B: the published
 * figure is 0.6% above (the MTP layer, not part of the model here, would add 4.0B). */
static void test_glm_counts(void **state) {
    (void)state;
    const struct { const char *preset; int64_t V, H, I, Im, L, dense, nh, nkv, hd, E, k; bool qk_norm; double total, active; } cases[] = {
        { "glm-4.5", 151552, 5120, 12288, 1536, 92, 3, 96, 8, 128, 160, 8, true, 355e9, 32e9 },
        { "glm-4.5-air", 151552, 4096, 10944, 1408, 46, 1, 96, 8, 128, 128, 8, false, 106e9, 12e9 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = trill_config_preset_text(cases[i].preset);
        assert_non_null(text);
        const trill_config c = parse(text);
        free(text);
        const int64_t h = cases[i].H, qd = cases[i].nh * cases[i].hd, kvd = cases[i].nkv * cases[i].hd;
        const int64_t attn = 2 * qd * h + 2 * kvd * h + qd + 2 * kvd + (cases[i].qk_norm ? 2 * cases[i].hd : 0) + 2 * h;
        const int64_t expert = 3 * cases[i].Im * h, moe_fixed = cases[i].E * h + cases[i].E + expert; /* router, its bias, 1 shared */
        const int64_t moe_layers = cases[i].L - cases[i].dense, embeddings = 2 * cases[i].V * h;
        const double body = (double)(h + cases[i].L * attn + cases[i].dense * 3 * cases[i].I * h);
        assert_int_equal(c.n_moe_layers, moe_layers);
        int64_t total, active;
        trill_config_param_counts(&c, &total, &active);
        assert_true((double)total == (double)embeddings + body + (double)(moe_layers * (moe_fixed + cases[i].E * expert)));
        assert_true((double)active == (double)embeddings + body + (double)(moe_layers * (moe_fixed + cases[i].k * expert)));
        if (fabs(total / cases[i].total - 1) > 0.01 || fabs((active - embeddings) / cases[i].active - 1) > 0.02)
            fail_msg("%s: %.4g total / %.4g active without the embeddings, published %.4g / %.4g", cases[i].preset, (double)total,
                     (double)(active - embeddings), cases[i].total, cases[i].active);
        print_message("%s: %.2f B total, %.2f B active (%.2f B without the embeddings)\n", cases[i].preset, total * 1e-9, active * 1e-9,
                      (active - embeddings) * 1e-9);
    }
}

/* A GLM-4.5 toy: q/k/v biases (trained: a linear bias kind) and no o_proj bias, q_norm/k_norm
 * only with use_qk_norm, RoPE on the partial dimensions, the refusals by field. */
static void test_glm_toy(void **state) {
    (void)state;
    static const char toy[] =
        "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"vocab_size\": 64, \"hidden_size\": 32,"
        " \"intermediate_size\": 48, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
        " \"num_key_value_heads\": 2, \"head_dim\": 16, \"partial_rotary_factor\": 0.5, \"attention_bias\": true, \"use_qk_norm\": false,"
        " \"n_routed_experts\": 8, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1, \"n_group\": 1,"
        " \"topk_group\": 1, \"routed_scaling_factor\": 2.5, \"num_nextn_predict_layers\": 1}";
    trill_config c = parse(toy);
    assert_int_equal(c.arch, TRILL_ARCH_GLM4_MOE);
    assert_true(c.attention_bias);
    assert_false(c.qk_norm);
    assert_int_equal(c.n_moe_layers, 2);
    assert_int_equal(c.num_nextn_predict_layers, 1);
    const trill_layer_desc d = trill_layer_desc_of(&c, 1);
    assert_true(d.qkv_bias && !d.qk_norm && d.moe && d.shared_experts && d.router == TRILL_ROUTER_SIGMOID_GROUPS);
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    int n_bias = 0;
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        if (strstr(p->name, "_proj.bias")) {
            n_bias++;
            assert_int_equal(p->kind, TRILL_TENSOR_LINEAR_BIAS);
            assert_true(trill_tensor_trainable(p->kind));
            assert_null(strstr(p->name, "o_proj"));
        }
        assert_null(strstr(p->name, "_norm.weight") && strstr(p->name, "self_attn")); /* use_qk_norm false */
    }
    assert_int_equal(n_bias, 3 * 3);
    int tok[5] = { 1, 2, 3, 4, 5 }, off[2] = { 0, 5 };
    float lp[5];
    trill_model_init_random(m, 3);
    assert_int_equal(trill_model_forward(m, tok, off, 1, NULL, lp, NULL), TRILL_OK);
    for (int t = 1; t < 5; t++) assert_true(isfinite(lp[t]) && lp[t] < 0);
    trill_model_free(m);
    const refusal bad[] = {
        { "\"n_group\": 1", "\"n_group\": 2", "field \"n_group\": 2 groups (topk_group 1) are not supported for Glm4Moe" },
        { "\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 0.1", "rotates 1 dimensions (expected an even number >= 2)" },
        { "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 9", "field \"num_experts_per_tok\": 9 must be in [1, n_routed_experts=8]" },
        { "\"head_dim\": 16", "\"head_dim\": 16, \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2}", "rope type \"dynamic\" is not supported" },
    };
    expect_refusals(toy, bad, sizeof bad / sizeof bad[0]);
    /* Qwen3 and Mixtral rotate the whole head */
    static const char q3[] = "{\"model_type\": \"qwen3_moe\", \"partial_rotary_factor\": 0.5}";
    trill_config x;
    assert_int_not_equal(trill_config_parse(q3, strlen(q3), "config.json", &x), TRILL_OK);
    assert_non_null(strstr(trill_error_message(), "field \"partial_rotary_factor\": 0.5 is not supported"));
}

/* GLM-4.7-Flash (Glm4MoeLiteForCausalLM) is DeepSeek-V3's MLA and router under another name, its
 * MoE layers from mlp_layer_types: a toy computes exactly what the DeepSeek-V3 config with the
 * same fields (the same tensors, the same random weights) computes; its defaults count as
 * GLM-4.7-Flash's 30B / 3B active; the refusals by field. */
static void test_glm_lite(void **state) {
    (void)state;
    static const char lite[] =
        "{\"architectures\": [\"Glm4MoeLiteForCausalLM\"], \"model_type\": \"glm4_moe_lite\", \"vocab_size\": 64, \"hidden_size\": 32,"
        " \"intermediate_size\": 48, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 4, \"num_attention_heads\": 2,"
        " \"num_key_value_heads\": 2, \"n_shared_experts\": 1, \"n_routed_experts\": 8, \"routed_scaling_factor\": 1.8,"
        " \"kv_lora_rank\": 16, \"q_lora_rank\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8, \"qk_nope_head_dim\": 8,"
        " \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 2, \"rope_theta\": 1000000.0,"
        " \"mlp_layer_types\": [\"dense\", \"dense\", \"sparse\", \"sparse\"], \"initializer_range\": 0.3}";
    static const char same[] = /* layers 2 and 3 MoE: first_k_dense_replace 2 */
        "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"vocab_size\": 64, \"hidden_size\": 32,"
        " \"intermediate_size\": 48, \"moe_intermediate_size\": 16, \"num_hidden_layers\": 4, \"num_attention_heads\": 2,"
        " \"num_key_value_heads\": 2, \"n_shared_experts\": 1, \"n_routed_experts\": 8, \"routed_scaling_factor\": 1.8,"
        " \"kv_lora_rank\": 16, \"q_lora_rank\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 8, \"qk_nope_head_dim\": 8,"
        " \"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 2, \"rope_theta\": 1000000.0, \"rope_scaling\": null,"
        " \"first_k_dense_replace\": 2, \"moe_layer_freq\": 1, \"rms_norm_eps\": 1e-5, \"initializer_range\": 0.3}";
    const trill_config a = parse(lite), b = parse(same);
    assert_int_equal(a.arch, TRILL_ARCH_GLM4_MOE_LITE);
    assert_int_equal(a.n_moe_layers, 2);
    assert_int_equal(a.moe_layer[0], 2);
    assert_int_equal(a.moe_layer[1], 3);
    assert_int_equal(b.n_moe_layers, 2);
    assert_true(a.rms_norm_eps == b.rms_norm_eps && a.rope_interleave && b.rope_interleave && !a.yarn);
    trill_model *ma, *mb;
    assert_int_equal(trill_model_create(&a, &ma), TRILL_OK);
    assert_int_equal(trill_model_create(&b, &mb), TRILL_OK);
    assert_int_equal(ma->n_tensors, mb->n_tensors);
    for (size_t t = 0; t < ma->n_tensors; t++) assert_string_equal(ma->tensors[t].name, mb->tensors[t].name);
    trill_model_init_random(ma, 7);
    trill_model_init_random(mb, 7);
    int tok[9] = { 1, 5, 9, 2, 7, 3, 3, 8, 4 }, off[2] = { 0, 9 };
    float la[9], lb[9];
    uint16_t ea[9 * 2 * 2], eb[9 * 2 * 2];
    assert_int_equal(trill_model_forward(ma, tok, off, 1, NULL, la, ea), TRILL_OK);
    assert_int_equal(trill_model_forward(mb, tok, off, 1, NULL, lb, eb), TRILL_OK);
    assert_memory_equal(la + 1, lb + 1, sizeof(float) * 8);
    assert_memory_equal(ea, eb, sizeof ea);
    trill_model_free(ma);
    trill_model_free(mb);
    /* HF's defaults: GLM-4.7-Flash's shape, "30B-A3B" */
    static const char defaults[] = "{\"model_type\": \"glm4_moe_lite\"}";
    const trill_config d = parse(defaults);
    int64_t total, active;
    trill_config_param_counts(&d, &total, &active);
    print_message("glm4_moe_lite defaults: %.2f B total, %.2f B active\n", total * 1e-9, active * 1e-9);
    assert_true(fabs(total / 30e9 - 1) < 0.01 && active > 3e9 && active < 4e9);
    const refusal bad[] = {
        { "\"n_group\": 1", "\"n_group\": 2", "field \"n_group\": 2 groups (topk_group 1) are not supported for Glm4MoeLite" },
        { "\"dense\", \"dense\", \"sparse\", \"sparse\"", "\"dense\", \"sparse\"", "field \"mlp_layer_types\": expected a list of 4 entries" },
        { "\"dense\", \"dense\", \"sparse\"", "\"dense\", \"moe\", \"sparse\"", "field \"mlp_layer_types\": entry 1: expected \"dense\" or \"sparse\"" },
        { "\"rope_theta\": 1000000.0", "\"rope_parameters\": {\"rope_type\": \"llama3\"}", "rope type \"llama3\" is not supported" },
    };
    expect_refusals(lite, bad, sizeof bad / sizeof bad[0]);
}

/* The sliding window (Mixtral's sliding_window, the decoder's option): a one-layer model whose
 * first token changes; the log-probs of the tokens whose window no longer holds it stay
 * bit-identical, the others change; without the window every later one changes. */
static void test_sliding_window(void **state) {
    (void)state;
    enum { W = 4, T = 12 };
    for (int windowed = 0; windowed < 2; windowed++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": 64, \"hidden_size\": 32,"
                 " \"intermediate_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                 " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"sliding_window\": %s, \"initializer_range\": 0.5}",
                 windowed ? "4" : "null");
        const trill_config c = parse(text);
        assert_int_equal(c.sliding_window, windowed ? W : 0);
        assert_int_equal(trill_layer_desc_of(&c, 0).window, windowed ? W : 0);
        trill_model *m;
        assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
        trill_model_init_random(m, 21);
        int a[T], b[T], off[2] = { 0, T };
        for (int t = 0; t < T; t++) a[t] = b[t] = (t * 7 + 3) % 64;
        b[0] = 40;
        float la[T], lb[T];
        assert_int_equal(trill_model_forward(m, a, off, 1, NULL, la, NULL), TRILL_OK);
        assert_int_equal(trill_model_forward(m, b, off, 1, NULL, lb, NULL), TRILL_OK);
        /* log-prob t is read at position t - 1, whose window is t - W .. t - 1 */
        for (int t = 1; t < T; t++) {
            const bool sees_first = !windowed || t - 1 < W;
            if (sees_first) assert_true(la[t] != lb[t]);
            else assert_memory_equal(&la[t], &lb[t], sizeof(float));
        }
        trill_model_free(m);
    }
}

/* Qwen3-Next-80B-A3B: the table's counts equal an independent count of HF's tensors (36 Gated
 * DeltaNet layers: in_proj_qkvz, in_proj_ba, conv1d [C, 1, 4], dt_bias, A_log, the gated norm,
 * out_proj; 12 gated attention layers: q_proj twice as wide, k/v/o, QK-norm; every layer the
 * router, 512 experts, the shared expert and its gate) and the published "80B total, 3B active"
 * (3.87B active counted with the embedding and the head, 3.25B without either). */
static void test_qwen3next_counts(void **state) {
    (void)state;
    char *text = trill_config_preset_text("qwen3-next-80b-a3b");
    assert_non_null(text);
    const trill_config c = parse(text);
    free(text);
    const int64_t vocab = 151936, h = 2048, L = 48, n_lin = 36, nk = 16, nv = 32, dk = 128, dv = 128, nh = 16, nkv = 2, hd = 256;
    const int64_t n_e = 512, Im = 512, Ish = 512, k = 10, kernel = 4;
    const int64_t gdn = (2 * nk * dk + 2 * nv * dv) * h + 2 * nv * h + (2 * nk * dk + nv * dv) * kernel + 2 * nv + dv + h * nv * dv;
    const int64_t attn = 2 * nh * hd * h + 2 * nkv * hd * h + h * nh * hd + 2 * hd;
    const int64_t fixed = 2 * h + n_e * h + 3 * Ish * h + h, expert = 3 * Im * h;
    int64_t total, active;
    trill_config_param_counts(&c, &total, &active);
    const int64_t ends = 2 * vocab * h + h, layers = n_lin * gdn + (L - n_lin) * attn + L * fixed;
    assert_true(total == ends + layers + L * n_e * expert);
    assert_true(active == ends + layers + L * k * expert);
    assert_int_equal(c.n_moe_layers, 48);
    const double without = (double)(active - 2 * vocab * h) * 1e-9;
    if (fabs(total / 80e9 - 1) > 0.01 || without < 3.0 || without >= 3.5)
        fail_msg("%.5g total / %.5g active without the embeddings: not Qwen3-Next-80B-A3B's", (double)total, without * 1e9);
    print_message("Qwen3-Next-80B-A3B: %.2f B total, %.2f B active (%.2f B without the embedding and the head)\n", total * 1e-9,
                  active * 1e-9, without);
}

/* A Qwen3-Next toy: the layer description per layer (full_attention_interval, mlp_only_layers),
 * the Gated DeltaNet's tensors (the conv saved as HF's [C, 1, K], A_log and dt_bias trained), the
 * zero-centred norms starting at 0 (the gated norm at 1), a save and load that gives every value
 * back, an "mtp.*" tensor in the checkpoint skipped; the refusals by field. */
static void test_qwen3next_toy(void **state) {
    (void)state;
    static const char toy[] =
        "{\"architectures\": [\"Qwen3NextForCausalLM\"], \"model_type\": \"qwen3_next\", \"vocab_size\": 64, \"hidden_size\": 32,"
        " \"intermediate_size\": 24, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8,"
        " \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 4,"
        " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"shared_expert_intermediate_size\": 12,"
        " \"full_attention_interval\": 2, \"mlp_only_layers\": [0], \"partial_rotary_factor\": 0.25}";
    trill_config c = parse(toy);
    assert_int_equal(c.arch, TRILL_ARCH_QWEN3_NEXT);
    assert_int_equal(c.n_moe_layers, 3);
    assert_true(c.norm_centered && c.linear_conv_kernel_dim == 4 && c.rope_theta == 10000.0);
    for (int l = 0; l < 4; l++) {
        const trill_layer_desc d = trill_layer_desc_of(&c, l);
        assert_int_equal(d.attention, l % 2 ? TRILL_ATTENTION_GQA : TRILL_ATTENTION_GDN);
        assert_true(d.moe == (l > 0) && d.shared_experts == (l > 0) && d.shared_expert_gate == (l > 0) && d.output_gate && d.qk_norm);
        assert_true(!d.qkv_bias && !d.o_bias && d.router == TRILL_ROUTER_SOFTMAX);
    }
    trill_model *m, *back;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    trill_model_init_random(m, 7);
    int n_conv = 0, n_decay = 0;
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        assert_true(trill_tensor_trainable(p->kind));
        n_conv += p->kind == TRILL_TENSOR_CONV;
        n_decay += p->kind == TRILL_TENSOR_DECAY;
        if (p->kind == TRILL_TENSOR_CONV) assert_int_equal(p->numel, (2 * 2 * 8 + 4 * 4) * 4);
        if (p->kind == TRILL_TENSOR_NORM) assert_true(p->data[0] == (p->role == TRILL_ROLE_GDN_NORM ? 1.0f : 0.0f));
        if (p->role == TRILL_ROLE_GDN_A_LOG) assert_true(p->data[0] < logf(16.0f));
        if (p->role == TRILL_ROLE_Q) assert_int_equal(p->shape[0], 2 * 4 * 8);
        if (p->role == TRILL_ROLE_SHARED_EXPERT_GATE) assert_true(p->shape[0] == 1 && p->lora_target == TRILL_LORA_SHARED_EXPERT_GATE);
    }
    assert_int_equal(n_conv, 2);
    assert_int_equal(n_decay, 4);
    for (size_t t = 0; t < m->n_tensors; t++) /* every vector non-trivial for the round trip */
        if (m->tensors[t].ndim == 1)
            for (size_t i = 0; i < m->tensors[t].numel; i++) m->tensors[t].data[i] = (float)(t * 1000 + i);
    char *dir = test_tmpdir("qwen3next");
    assert_int_equal(trill_model_save(m, dir, TRILL_F32, 0), TRILL_OK);
    trill_checkpoint *ck;
    assert_int_equal(trill_checkpoint_open(dir, &ck), TRILL_OK);
    const trill_tensor_view *conv = trill_checkpoint_find(ck, "model.layers.2.linear_attn.conv1d.weight");
    assert_true(conv && conv->ndim == 3 && conv->shape[0] == 48 && conv->shape[1] == 1 && conv->shape[2] == 4);
    trill_checkpoint_close(ck);
    const float mtp[4] = { 1, 2, 3, 4 }; /* a shard holding the MTP module's tensor, which HF skips too */
    trill_tensor_out extra = { .name = "mtp.fc.weight", .ndim = 2, .shape = { 2, 2 }, .data = mtp, .src_dtype = TRILL_F32 };
    char mtp_path[512];
    snprintf(mtp_path, sizeof mtp_path, "%s/mtp.safetensors", dir);
    assert_int_equal(trill_st_write(mtp_path, &extra, 1, TRILL_F32), TRILL_OK);
    assert_int_equal(trill_model_load(dir, &back), TRILL_OK);
    assert_memory_equal(back->params, m->params, m->n_params * sizeof(float));
    trill_model_free(back);
    trill_model_free(m);
    test_rmdir(dir);
    free(dir);
    const refusal bad[] = {
        { "\"linear_num_value_heads\": 4", "\"linear_num_value_heads\": 3", "linear_num_value_heads (3) must be a multiple of linear_num_key_heads (2)" },
        { "\"full_attention_interval\": 2", "\"layer_types\": [\"linear_attention\", \"full_attention\", \"mamba\", \"full_attention\"]",
          "field \"layer_types\": entry 2: expected \"full_attention\" or \"linear_attention\"" },
        { "\"partial_rotary_factor\": 0.25", "\"partial_rotary_factor\": 0.125", "field \"partial_rotary_factor\": 0.125 of head_dim 8 rotates 1" },
        { "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5", "field \"num_experts_per_tok\": 5 must be in [1, num_experts=4]" },
        { "\"mlp_only_layers\": [0]", "\"mlp_only_layers\": [4]", "field \"mlp_only_layers\": entry 0: expected a layer index in [0, 4)" },
    };
    expect_refusals(toy, bad, sizeof bad / sizeof bad[0]);
}

/* Qwen3.5 MoE (Qwen3_5MoeForConditionalGeneration's language model): HF's Qwen3_5MoeTextConfig
 * defaults (Qwen3.5-35B-A3B's shape) count 34.66 B, 3.45 B active, as an independent count of its
 * tensors (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a instead of Qwen3-Next's two; every layer a
 * MoE); a toy's config.json round-trips through text_config; its experts are saved stacked in
 * nn.Linear's orientation (gate_up_proj [E, 2I, H]: gate's rows first, then up's; down_proj [E, H,
 * I]) where HF puts each element, and load back exactly, the vision tower's and MTP's tensors skipped. */
static void test_qwen35_moe(void **state) {
    (void)state;
    char *text = trill_config_preset_text("qwen3.5-35b-a3b");
    assert_non_null(text);
    trill_config c = parse(text);
    free(text);
    assert_int_equal(c.arch, TRILL_ARCH_QWEN3_5_MOE);
    assert_true(trill_config_is_multimodal(&c) && c.norm_topk_prob && c.rope_theta == 1e7 && c.partial_rotary_factor == 0.25);
    const int64_t vocab = 248320, h = 2048, L = 40, n_lin = 30, nk = 16, nv = 32, dk = 128, dv = 128, nh = 16, nkv = 2, hd = 256;
    const int64_t n_e = 256, Im = 512, Ish = 512, k = 8, kernel = 4, C = 2 * nk * dk + nv * dv;
    const int64_t gdn = C * h + nv * dv * h + 2 * nv * h + C * kernel + 2 * nv + dv + h * nv * dv;
    const int64_t attn = 2 * nh * hd * h + 2 * nkv * hd * h + h * nh * hd + 2 * hd;
    const int64_t fixed = 2 * h + n_e * h + 3 * Ish * h + h, expert = 3 * Im * h;
    int64_t total, active;
    trill_config_param_counts(&c, &total, &active);
    const int64_t ends = 2 * vocab * h + h, layers = n_lin * gdn + (L - n_lin) * attn + L * fixed;
    assert_true(total == ends + layers + L * n_e * expert);
    assert_true(active == ends + layers + L * k * expert);
    print_message("Qwen3.5-35B-A3B's shape: %.2f B total, %.2f B active (%.2f B without the embedding and the head)\n", total * 1e-9,
                  active * 1e-9, (active - 2 * vocab * h) * 1e-9);
    /* a toy, its config written and read back */
    text = trill_config_preset_text("qwen35-tiny");
    c = parse(text);
    free(text);
    assert_int_equal(c.n_moe_layers, 4);
    assert_true(trill_layer_desc_of(&c, 0).gdn_split_proj && trill_layer_desc_of(&c, 3).attention == TRILL_ATTENTION_GQA);
    char *again = trill_config_to_text(&c);
    assert_non_null(strstr(again, "\"text_config\"") && strstr(again, "\"qwen3_5_moe_text\""));
    assert_null(strstr(again, "\"norm_topk_prob\"")); /* not a field of Qwen3_5MoeTextConfig */
    const trill_config back_c = parse(again);
    free(again);
    assert_memory_equal(&back_c, &c, sizeof c);
    trill_model *m, *back;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    trill_model_init_random(m, 3);
    char *dir = test_tmpdir("qwen35");
    assert_int_equal(trill_model_save(m, dir, TRILL_F32, 0), TRILL_OK);
    trill_checkpoint *ck;
    assert_int_equal(trill_checkpoint_open(dir, &ck), TRILL_OK);
    assert_null(trill_checkpoint_find(ck, "model.language_model.layers.0.mlp.experts.0.gate_proj.weight"));
    const trill_tensor_view *gu = trill_checkpoint_find(ck, "model.language_model.layers.2.mlp.experts.gate_up_proj");
    const trill_tensor_view *dn = trill_checkpoint_find(ck, "model.language_model.layers.2.mlp.experts.down_proj");
    const int64_t ne = c.num_experts, im = c.moe_intermediate_size, hs = c.hidden_size;
    assert_true(gu && gu->ndim == 3 && gu->shape[0] == ne && gu->shape[1] == 2 * im && gu->shape[2] == hs);
    assert_true(dn && dn->ndim == 3 && dn->shape[0] == ne && dn->shape[1] == hs && dn->shape[2] == im);
    const trill_decoder_weights *w = trill_model_layer(m, 2);
    const float *G = gu->data, *D = dn->data;
    for (int64_t e = 0; e < ne; e += 3)
        for (int64_t i = 0; i < im; i += 7)
            for (int64_t j = 0; j < hs; j += 5) {
                assert_true(G[(e * 2 * im + i) * hs + j] == w->expert_gate.f32[(e * im + i) * hs + j]);
                assert_true(G[(e * 2 * im + im + i) * hs + j] == w->expert_up.f32[(e * im + i) * hs + j]);
                assert_true(D[(e * hs + j) * im + i] == w->expert_down.f32[(e * hs + j) * im + i]);
            }
    trill_checkpoint_close(ck);
    const float x[4] = { 1, 2, 3, 4 }; /* the checkpoint's vision tower and MTP module: skipped */
    const trill_tensor_out extra[2] = { { .name = "model.visual.patch_embed.proj.weight", .ndim = 2, .shape = { 2, 2 }, .data = x, .src_dtype = TRILL_F32 },
                                        { .name = "mtp.fc.weight", .ndim = 2, .shape = { 2, 2 }, .data = x, .src_dtype = TRILL_F32 } };
    char path[512];
    snprintf(path, sizeof path, "%s/extra.safetensors", dir);
    assert_int_equal(trill_st_write(path, extra, 2, TRILL_F32), TRILL_OK);
    assert_int_equal(trill_model_load(dir, &back), TRILL_OK);
    assert_memory_equal(back->params, m->params, m->n_params * sizeof(float));
    trill_model_free(back);
    trill_model_free(m);
    test_rmdir(dir);
    free(dir);
    /* the special tokens: text_config's, the top level's over them where it has them */
    static const char toks[] = "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": \"qwen3_5_moe\", \"bos_token_id\": 3,"
                               " \"text_config\": {\"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
                               " \"num_key_value_heads\": 2, \"head_dim\": 8, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
                               " \"bos_token_id\": 1, \"eos_token_id\": [5, 6]}}";
    const trill_config t35 = parse(toks);
    assert_true(t35.bos_token_id == 3 && t35.n_eos == 2 && t35.eos_token_ids[0] == 5 && t35.eos_token_ids[1] == 6);
    /* the language model's fields are text_config's: a config without it is refused by name */
    static const char flat[] = "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"], \"model_type\": \"qwen3_5_moe\", \"hidden_size\": 64}";
    trill_config x35;
    assert_int_not_equal(trill_config_parse(flat, strlen(flat), "config.json", &x35), TRILL_OK);
    assert_non_null(strstr(trill_error_message(), "field \"text_config\": expected an object"));
}

/* gpt-oss-120b and gpt-oss-20b: the table's counts equal an independent count of HF's tensors
 * (q/k/v/o with biases, sinks, the router with its bias, each expert's gate_up and down with
 * their biases) and the published totals; the published active counts leave out the input
 * embedding (OpenAI's model card: 5.13B and 3.61B). */
static void test_gptoss_counts(void **state) {
    (void)state;
    const struct { const char *preset; int64_t L, E; double total, active; } cases[] = {
        { "gpt-oss-120b", 36, 128, 116.83e9, 5.13e9 },
        { "gpt-oss-20b", 24, 32, 20.91e9, 3.61e9 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = trill_config_preset_text(cases[i].preset);
        assert_non_null(text);
        const trill_config c = parse(text);
        free(text);
        const int64_t vocab = 201088, h = 2880, Im = 2880, nh = 64, qd = 64 * 64, kvd = 8 * 64, L = cases[i].L, n_e = cases[i].E, k = 4;
        const int64_t attn = (qd * h + qd) + 2 * (kvd * h + kvd) + (h * qd + h) + nh + 2 * h;
        const int64_t expert = 2 * Im * h + 2 * Im + Im * h + h, router = n_e * h + n_e;
        int64_t total, active;
        trill_config_param_counts(&c, &total, &active);
        assert_true(total == 2 * vocab * h + h + L * (attn + router + n_e * expert));
        assert_true(active == 2 * vocab * h + h + L * (attn + router + k * expert));
        if (fabs(total / cases[i].total - 1) > 0.001 || fabs((active - vocab * h) / cases[i].active - 1) > 0.002)
            fail_msg("%s: %.5g total / %.5g active without the input embedding, published %.5g / %.5g", cases[i].preset, (double)total,
                     (double)(active - vocab * h), cases[i].total, cases[i].active);
        print_message("%s: %.2f B total, %.2f B active (%.2f B without the input embedding)\n", cases[i].preset, total * 1e-9, active * 1e-9,
                      (active - vocab * h) * 1e-9);
    }
}

/* A gpt-oss toy: HF's defaults (sliding layers 0, 2, ..., YaRN factor 32 without truncation),
 * the layer description's options, trainable sinks and biases, MXFP4's quantization_config; the
 * refusals by field. */
static void test_gptoss_toy(void **state) {
    (void)state;
    static const char toy[] =
        "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": 64, \"hidden_size\": 32,"
        " \"intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8,"
        " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"sliding_window\": 4, \"swiglu_limit\": 7.0,"
        " \"quantization_config\": {\"quant_method\": \"mxfp4\"}}";
    trill_config c = parse(toy);
    assert_int_equal(c.arch, TRILL_ARCH_GPT_OSS);
    assert_true(c.mxfp4 && c.attention_bias && c.yarn && !c.yarn_truncate);
    assert_true(c.yarn_factor == 32 && c.yarn_original_max_position_embeddings == 4096 && c.swiglu_alpha == 1.702);
    assert_int_equal(c.n_moe_layers, 3);
    for (int l = 0; l < 3; l++) {
        const trill_layer_desc d = trill_layer_desc_of(&c, l);
        assert_int_equal(d.window, l % 2 ? 0 : 4);
        assert_true(d.qkv_bias && d.o_bias && d.sinks && !d.qk_norm && d.moe && d.router == TRILL_ROUTER_SOFTMAX && d.router_linear_bias &&
                    d.expert_bias && d.expert_act == TRILL_EXPERT_SWIGLU_CLAMPED && !d.shared_experts);
    }
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    int n_sinks = 0, n_bias = 0;
    for (size_t t = 0; t < m->n_tensors; t++) {
        const trill_param *p = &m->tensors[t];
        n_sinks += p->kind == TRILL_TENSOR_SINKS;
        n_bias += p->kind == TRILL_TENSOR_LINEAR_BIAS;
        assert_true(trill_tensor_trainable(p->kind));
    }
    assert_int_equal(n_sinks, 3);
    assert_int_equal(n_bias, 3 * (4 + 1 + 3 * 4)); /* q/k/v/o, the router, each expert's gate/up/down */
    trill_model_free(m);
    const refusal bad[] = {
        { "\"quant_method\": \"mxfp4\"", "\"quant_method\": \"fp8\"", "quant_method \"fp8\" is not supported for gpt-oss (expected \"mxfp4\")" },
        { "\"sliding_window\": 4", "\"sliding_window\": 4, \"layer_types\": [\"full_attention\"]", "field \"layer_types\": expected a list of 3 entries" },
        { "\"sliding_window\": 4", "\"sliding_window\": 4, \"layer_types\": [\"full_attention\", \"local\", \"full_attention\"]",
          "field \"layer_types\": entry 1: expected \"full_attention\" or \"sliding_attention\"" },
        { "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5", "field \"num_experts_per_tok\": 5 must be in [1, num_local_experts=4]" },
        { "\"swiglu_limit\": 7.0", "\"swiglu_limit\": -1", "swiglu_limit" },
    };
    expect_refusals(toy, bad, sizeof bad / sizeof bad[0]);
}

/* gpt-oss's experts round-trip through HF's stacked tensors: trill saves gate_up_proj [E, H, 2I]
 * (gate in the even columns), its bias, down_proj [E, I, H] and its bias, no per-expert tensor;
 * each element sits where HF's layout puts it; loading gives back every value exactly. Five
 * layers: 20 stacked tensors, more than the saver's first list holds (its names must outlive
 * the list's growth: they did not, and an 8-layer model's save failed). */
static void test_gptoss_stacked(void **state) {
    (void)state;
    static const char toy[] =
        "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": 64, \"hidden_size\": 32,"
        " \"intermediate_size\": 16, \"num_hidden_layers\": 5, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8,"
        " \"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"sliding_window\": 4}";
    const trill_config c = parse(toy);
    trill_model *m, *back;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    trill_model_init_random(m, 5);
    for (size_t t = 0; t < m->n_tensors; t++) /* biases too */
        if (m->tensors[t].kind == TRILL_TENSOR_LINEAR_BIAS)
            for (size_t i = 0; i < m->tensors[t].numel; i++) m->tensors[t].data[i] = (float)(t * 1000 + i);
    char *dir = test_tmpdir("gptoss-stacked");
    assert_int_equal(trill_model_save(m, dir, TRILL_F32, 0), TRILL_OK);
    trill_checkpoint *ck;
    assert_int_equal(trill_checkpoint_open(dir, &ck), TRILL_OK);
    assert_null(trill_checkpoint_find(ck, "model.layers.0.mlp.experts.0.gate_proj.weight"));
    const trill_tensor_view *gu = trill_checkpoint_find(ck, "model.layers.1.mlp.experts.gate_up_proj");
    const trill_tensor_view *dn = trill_checkpoint_find(ck, "model.layers.1.mlp.experts.down_proj");
    const trill_tensor_view *gub = trill_checkpoint_find(ck, "model.layers.1.mlp.experts.gate_up_proj_bias");
    assert_true(gu && dn && gub);
    assert_true(gu->ndim == 3 && gu->shape[0] == 4 && gu->shape[1] == 32 && gu->shape[2] == 32);
    assert_true(dn->ndim == 3 && dn->shape[0] == 4 && dn->shape[1] == 16 && dn->shape[2] == 32);
    const trill_decoder_weights *w = trill_model_layer(m, 1);
    const float *G = gu->data, *D = dn->data, *B = gub->data;
    for (int e = 0; e < 4; e++)
        for (int i = 0; i < 16; i++) {
            for (int j = 0; j < 32; j++) { /* gate[e][i][j] = gate_up[e][j][2i], up at 2i + 1; down[e][j][i] = down_proj[e][i][j] */
                assert_true(G[((size_t)e * 32 + j) * 32 + 2 * i] == w->expert_gate.f32[((size_t)e * 16 + i) * 32 + j]);
                assert_true(G[((size_t)e * 32 + j) * 32 + 2 * i + 1] == w->expert_up.f32[((size_t)e * 16 + i) * 32 + j]);
                assert_true(D[((size_t)e * 16 + i) * 32 + j] == w->expert_down.f32[((size_t)e * 32 + j) * 16 + i]);
            }
            assert_true(B[(size_t)e * 32 + 2 * i] == w->expert_gate_bias[(size_t)e * 16 + i]);
            assert_true(B[(size_t)e * 32 + 2 * i + 1] == w->expert_up_bias[(size_t)e * 16 + i]);
        }
    trill_checkpoint_close(ck);
    assert_int_equal(trill_model_load(dir, &back), TRILL_OK);
    assert_int_equal(back->n_params, m->n_params);
    assert_memory_equal(back->params, m->params, m->n_params * sizeof(float));
    trill_model_free(back);
    trill_model_free(m);
    test_rmdir(dir);
    free(dir);
}

/* MXFP4 experts (gpt-oss's released checkpoints): every one of the 16 E2M1 codes in both nibbles
 * of a byte, and E8M0 scales swept over 0..254, decode to code * 2^(scale - 127) exactly, in the
 * expert matrix and the element HF's layout puts them (the gate from gate_up_proj's even rows,
 * the up from the odd; down_proj's rows are H). A checkpoint rewritten by hand: the dense save's
 * tensors but the two stacked matrices, then their _blocks and _scales (U8). */
static void test_gptoss_mxfp4(void **state) {
    (void)state;
    static const float E2M1[16] = { 0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6 };
    static const char toy[] =
        "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": 16, \"hidden_size\": 64,"
        " \"intermediate_size\": 32, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16,"
        " \"num_local_experts\": 2, \"num_experts_per_tok\": 1, \"sliding_window\": 4}";
    enum { N_E = 2, HID = 64, INTER = 32 };
    const trill_config c = parse(toy);
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    trill_model_init_random(m, 7);
    char *dense = test_tmpdir("mxfp4-dense"), *dir = test_tmpdir("mxfp4");
    assert_int_equal(trill_model_save(m, dense, TRILL_F32, 0), TRILL_OK);
    trill_model_free(m);
    /* the two matrices' codes and scales: [N_E, rows, cols / 32, 16] and [N_E, rows, cols / 32] */
    const int rows[2] = { 2 * INTER, HID }, cols[2] = { HID, INTER };
    unsigned char *codes[2], *scales[2];
    size_t ncodes[2], nscales[2];
    for (int k = 0; k < 2; k++) {
        nscales[k] = (size_t)N_E * rows[k] * (cols[k] / 32);
        ncodes[k] = nscales[k] * 16;
        codes[k] = malloc(ncodes[k]);
        scales[k] = malloc(nscales[k]);
        for (size_t b = 0; b < ncodes[k]; b++) codes[k][b] = (unsigned char)(b * 17 + k); /* both nibbles run through 0..15 */
        for (size_t g = 0; g < nscales[k]; g++) scales[k][g] = (unsigned char)((g * 37 + 11 * k) % 255); /* 0..254 */
    }
    /* the header and data of the rewritten file */
    trill_checkpoint *ck;
    assert_int_equal(trill_checkpoint_open(dense, &ck), TRILL_OK);
    json_t *header = json_object();
    size_t total = 0;
    for (size_t i = 0; i < trill_checkpoint_count(ck); i++) {
        const trill_tensor_view *v = trill_checkpoint_tensor(ck, i);
        if (!strcmp(v->name, "model.layers.0.mlp.experts.gate_up_proj") || !strcmp(v->name, "model.layers.0.mlp.experts.down_proj")) continue;
        total += v->nbytes;
    }
    for (int k = 0; k < 2; k++) total += ncodes[k] + nscales[k];
    unsigned char *data = malloc(total);
    size_t at = 0;
    for (size_t i = 0; i < trill_checkpoint_count(ck); i++) {
        const trill_tensor_view *v = trill_checkpoint_tensor(ck, i);
        if (!strcmp(v->name, "model.layers.0.mlp.experts.gate_up_proj") || !strcmp(v->name, "model.layers.0.mlp.experts.down_proj")) continue;
        json_t *shape = json_array();
        for (int d = 0; d < v->ndim; d++) json_array_append_new(shape, json_integer(v->shape[d]));
        json_object_set_new(header, v->name, json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape, "data_offsets", (json_int_t)at,
                                                       (json_int_t)(at + v->nbytes)));
        memcpy(data + at, v->data, v->nbytes);
        at += v->nbytes;
    }
    trill_checkpoint_close(ck);
    const char *names[2] = { "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj" };
    for (int k = 0; k < 2; k++) {
        char name[128];
        snprintf(name, sizeof name, "%s_blocks", names[k]);
        json_object_set_new(header, name, json_pack("{s:s, s:[i, i, i, i], s:[I, I]}", "dtype", "U8", "shape", N_E, rows[k], cols[k] / 32, 16,
                                                    "data_offsets", (json_int_t)at, (json_int_t)(at + ncodes[k])));
        memcpy(data + at, codes[k], ncodes[k]);
        at += ncodes[k];
        snprintf(name, sizeof name, "%s_scales", names[k]);
        json_object_set_new(header, name, json_pack("{s:s, s:[i, i, i], s:[I, I]}", "dtype", "U8", "shape", N_E, rows[k], cols[k] / 32,
                                                    "data_offsets", (json_int_t)at, (json_int_t)(at + nscales[k])));
        memcpy(data + at, scales[k], nscales[k]);
        at += nscales[k];
    }
    char *text = json_dumps(header, JSON_COMPACT);
    const uint64_t hlen = strlen(text);
    unsigned char *file = malloc(8 + hlen + total);
    memcpy(file, &hlen, 8); /* little-endian, as the machine */
    memcpy(file + 8, text, hlen);
    memcpy(file + 8 + hlen, data, total);
    test_write(dir, "model.safetensors", file, 8 + hlen + total);
    /* config.json: the toy's with MXFP4's quantization_config */
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%.*s, \"quantization_config\": {\"quant_method\": \"mxfp4\"}}", (int)strlen(toy) - 1, toy);
    test_write(dir, "config.json", cfg, strlen(cfg));
    trill_model *q;
    assert_int_equal(trill_model_load(dir, &q), TRILL_OK);
    const trill_decoder_weights *w = trill_model_layer(q, 0);
    int hits[2][16] = { { 0 } }, exps[256] = { 0 };
    for (int k = 0; k < 2; k++)
        for (int e = 0; e < N_E; e++)
            for (int r = 0; r < rows[k]; r++)
                for (int j = 0; j < cols[k]; j++) {
                    const size_t g = ((size_t)e * rows[k] + r) * (cols[k] / 32) + j / 32;
                    const unsigned char byte = codes[k][g * 16 + (j % 32) / 2];
                    const int code = j % 2 ? byte >> 4 : byte & 15;
                    const float want = ldexpf(E2M1[code], (int)scales[k][g] - 127);
                    float got; /* gate [e][r/2][j] or up for odd r; down [e][r][j] */
                    if (k == 0) got = (r % 2 ? w->expert_up : w->expert_gate).f32[((size_t)e * INTER + r / 2) * HID + j];
                    else got = w->expert_down.f32[((size_t)e * HID + r) * INTER + j];
                    if (memcmp(&got, &want, sizeof got)) fail_msg("matrix %d expert %d row %d col %d: %g, want %g", k, e, r, j, got, want);
                    hits[j % 2][code]++;
                    exps[scales[k][g]]++;
                }
    for (int n = 0; n < 2; n++)
        for (int code = 0; code < 16; code++) assert_true(hits[n][code] > 0);
    int n_exps = 0;
    for (int x = 0; x < 256; x++) n_exps += exps[x] > 0;
    print_message("MXFP4: %d codes in each nibble, %d distinct scales (0 .. 254), every element exact\n", 16, n_exps);
    assert_true(exps[0] > 0 && exps[254] > 0 && n_exps >= 200);
    trill_model_free(q);
    free(text);
    free(file);
    free(data);
    json_decref(header);
    for (int k = 0; k < 2; k++) free(codes[k]), free(scales[k]);
    test_rmdir(dense);
    test_rmdir(dir);
    free(dense);
    free(dir);
}

/* gpt-oss's adapters on its stacked experts in PEFT's target_parameters form: trill's rank-r gate
 * and up adapters written as gate_up_proj's block-diagonal rank 2r (rank and alpha patterns),
 * down_proj's per expert, the tensors named as PEFT nests them (gate_up_proj inside down_proj's
 * wrapper: base_layer); read back bit for bit; with down_proj alone, no nesting; and one A shared
 * by gate and up (PEFT's own rank-r form) read as two copies of it. */
static void test_gptoss_peft_params(void **state) {
    (void)state;
    static const char toy[] =
        "{\"architectures\": [\"GptOssForCausalLM\"], \"model_type\": \"gpt_oss\", \"vocab_size\": 16, \"hidden_size\": 16,"
        " \"intermediate_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8,"
        " \"num_local_experts\": 3, \"num_experts_per_tok\": 2, \"sliding_window\": 4}";
    const trill_config c = parse(toy);
    trill_model *m;
    assert_int_equal(trill_model_create(&c, &m), TRILL_OK);
    for (int pass = 0; pass < 2; pass++) {
        trill_lora_config cfg = { .rank = 3, .alpha = 5, .targets = pass ? 1u << TRILL_LORA_DOWN : TRILL_LORA_ALL_LINEAR };
        trill_lora *l, *back;
        assert_int_equal(trill_lora_create(m, cfg, 4, &l), TRILL_OK);
        size_t n;
        float *v = trill_lora_params(l, &n);
        for (size_t i = 0; i < n; i++) v[i] = (float)((int)(i * 7919 % 23) - 11) / 16; /* B non-zero too */
        char *dir = test_tmpdir("gptoss-peft");
        assert_int_equal(trill_lora_save(l, dir), TRILL_OK);
        trill_st_file *ck;
        char *st_path = trill_path_join(dir, "adapter_model.safetensors");
        assert_int_equal(trill_st_open(st_path, &ck), TRILL_OK);
        free(st_path);
        assert_null(trill_st_find(ck, "base_model.model.model.layers.0.mlp.experts.0.gate_proj.lora_A.weight"));
        const trill_tensor_view *gua = trill_st_find(ck, "base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight");
        const trill_tensor_view *gub = trill_st_find(ck, "base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight");
        const trill_tensor_view *da = trill_st_find(ck, "base_model.model.model.layers.1.mlp.experts.lora_A.weight");
        if (pass == 0) { /* gate_up_proj [E, H, 2I]: A [2r E, H], B [2I, 2r E]; down_proj [E, I, H]: A [r E, I] */
            assert_true(gua && gub && da);
            assert_true(gua->shape[0] == 6 * 3 && gua->shape[1] == 16 && gub->shape[0] == 16 && gub->shape[1] == 6 * 3);
            assert_true(da->shape[0] == 3 * 3 && da->shape[1] == 8);
            const float *B = gub->data; /* gate rows (even) use slots 0..2 only, up rows slots 3..5 */
            for (int i = 0; i < 16; i++)
                for (int k = 0; k < 18; k++)
                    if ((k / 3) / 3 != i % 2) assert_true(B[i * 18 + k] == 0);
        } else {
            assert_true(!gua && da && da->shape[0] == 3 * 3);
        }
        trill_st_close(ck);
        char *cfg_path = trill_path_join(dir, "adapter_config.json");
        json_error_t jerr;
        json_t *cj = json_load_file(cfg_path, 0, &jerr);
        assert_non_null(cj);
        const json_t *params = json_object_get(cj, "target_parameters");
        assert_int_equal(json_array_size(params), pass ? 1 : 2);
        assert_string_equal(json_string_value(json_array_get(params, pass ? 0 : 1)), "mlp.experts.down_proj");
        if (!pass) {
            assert_string_equal(json_string_value(json_array_get(params, 0)), "mlp.experts.gate_up_proj");
            assert_int_equal(json_integer_value(json_object_get(json_object_get(cj, "rank_pattern"), "mlp.experts.gate_up_proj")), 6);
            assert_true(json_number_value(json_object_get(json_object_get(cj, "alpha_pattern"), "mlp.experts.gate_up_proj")) == 10.0);
        }
        json_decref(cj);
        assert_int_equal(trill_lora_load(m, dir, &back), TRILL_OK);
        size_t nb;
        const float *vb = trill_lora_params(back, &nb);
        assert_int_equal(nb, n);
        assert_memory_equal(vb, v, n * sizeof(float));
        trill_lora_free(back);
        trill_lora_free(l);
        test_rmdir(dir);
        free(dir);
        free(cfg_path);
    }
    trill_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_walk),  cmocka_unit_test(test_param_counts), cmocka_unit_test(test_flops),
        cmocka_unit_test(test_lora_layout), cmocka_unit_test(test_model_fields), cmocka_unit_test(test_deepseek_counts),
        cmocka_unit_test(test_deepseek_toy),  cmocka_unit_test(test_mixtral_counts), cmocka_unit_test(test_mixtral_toy),
        cmocka_unit_test(test_glm_counts),    cmocka_unit_test(test_glm_toy),       cmocka_unit_test(test_glm_lite),
        cmocka_unit_test(test_sliding_window), cmocka_unit_test(test_gptoss_counts), cmocka_unit_test(test_gptoss_toy),
        cmocka_unit_test(test_gptoss_stacked), cmocka_unit_test(test_gptoss_mxfp4), cmocka_unit_test(test_gptoss_peft_params),
        cmocka_unit_test(test_qwen3next_counts), cmocka_unit_test(test_qwen3next_toy),
        cmocka_unit_test(test_qwen35_moe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
