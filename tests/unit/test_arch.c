/* The Qwen3-MoE tensor table (src/arch/qwen3/tensors.c) and what is derived from it, checked
 * against counts written out here by hand from the `small` preset's numbers (presets.c: vocab
 * 32000, hidden 512, dense intermediate 1536, 8 layers, layer 0 dense, 8 heads / 4 kv heads of
 * 64, 16 experts top-4 of intermediate 256, untied lm_head). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "arch/family.h"
#include "arch/qwen3/qwen3.h"
#include "model/config_json.h"
#include "trill/config.h"
#include "model/lora_internal.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/train.h"

#define LW(m, l) ((const qwen3_layer_weights *)trill_model_layer(m, l))
#define LL(lora, l) ((const qwen3_lora_layer *)trill_lora_layer(lora, l))

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
    if (t->role == QWEN3_Q) {
        assert_int_equal(t->shape[0], QD);
        assert_int_equal(t->shape[1], H);
        assert_int_equal(t->fuse, TRILL_FUSE_QKV);
        assert_int_equal(t->split, TRILL_SPLIT_ROWS);
    }
    if (t->role == QWEN3_EXPERT_DOWN) {
        assert_int_equal(t->shape[0], H);
        assert_int_equal(t->shape[1], IM);
        assert_int_equal(t->split, TRILL_SPLIT_COLS);
        assert_int_equal(t->lora_target, TRILL_LORA_DOWN);
    }
    if (t->role == QWEN3_ROUTER) assert_int_equal(t->lora_target, TRILL_NO_LORA);
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
    trill_lora_config lc = { .rank = r, .alpha = 8, .targets = (1u << TRILL_LORA_N_TARGETS) - 1 };
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
    assert_int_equal(trill_lora_get_config(lora)->targets, (1u << TRILL_LORA_N_TARGETS) - 1 - (1u << TRILL_LORA_LM_HEAD));
    trill_lora_free(lora);
    lc.targets = 1u << 20; /* no module has this bit */
    assert_int_equal(trill_lora_create(m, lc, 1, &lora), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "bit 20 names no module"));
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
        if (p->role == QWEN3_K) assert_ptr_equal(LW(m, p->layer)->wk.f32, p->data);
        if (p->role == QWEN3_EXPERT_GATE && p->expert == 3)
            assert_ptr_equal(LW(m, p->layer)->expert_gate.f32 + 3 * (size_t)IM * H, p->data);
        if (p->role == QWEN3_FINAL_NORM) assert_ptr_equal(m->final_norm, p->data);
        if (p->role == QWEN3_LM_HEAD) assert_ptr_equal(m->lm_head.f32, p->data);
    }
    trill_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_walk),  cmocka_unit_test(test_param_counts), cmocka_unit_test(test_flops),
        cmocka_unit_test(test_lora_layout), cmocka_unit_test(test_model_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
