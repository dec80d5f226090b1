/* FLOPs of a forward pass and a training step, derived from the family's tensor table: 2 per
 * multiply-add of every matrix one token multiplies by (a routed expert counted for the top-k),
 * the attention over the causal pairs, and the adapters' two thin matmuls per adapted matrix. */
#include "trill/train.h"

#include "arch/family.h"

typedef struct flop_parts { double matmul, head, attention, lora; } flop_parts;

typedef struct flop_walk { const trill_config *c; double T; int rank; flop_parts f; } flop_walk;

static void count_tensor(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    flop_walk *w = ctx;
    const bool tied_head = t->kind == TRILL_TENSOR_EMBEDDING && w->c->tie_word_embeddings && w->c->num_labels == 0;
    if (t->kind == TRILL_TENSOR_HEAD || tied_head) w->f.head += 2 * w->T * (double)t->numel;
    if (!trill_arch_is_matmul(t) || !trill_arch_active(w->c, t) || t->kind == TRILL_TENSOR_HEAD) return;
    w->f.matmul += 2 * w->T * (double)t->numel;
    if (t->lora_target != TRILL_NO_LORA) w->f.lora += 2 * w->T * w->rank * (double)(t->shape[0] + t->shape[1]);
}

static flop_parts count(const trill_config *c, const int *offsets, int n_seqs, int rank) {
    double pairs = 0; /* causal (query, key) pairs: L(L+1)/2 per sequence */
    for (int s = 0; s < n_seqs; s++) {
        double L = offsets[s + 1] - offsets[s];
        pairs += L * (L + 1) / 2;
    }
    flop_walk w = { .c = c, .T = offsets[n_seqs], .rank = rank };
    trill_arch_walk(c, count_tensor, &w);
    const trill_family *f = trill_family_of(c);
    w.f.attention = c->num_hidden_layers * f->attention_flops(c, pairs) + (f->token_flops ? f->token_flops(c) * w.T : 0);
    return w.f;
}

double trill_forward_flops(const trill_config *c, const int *offsets, int n_seqs) {
    flop_parts f = count(c, offsets, n_seqs, 0);
    return f.matmul + f.head + f.attention;
}

double trill_train_step_flops(const trill_config *c, const int *offsets, int n_seqs, bool lora, int lora_rank, bool recompute) {
    flop_parts f = count(c, offsets, n_seqs, lora ? lora_rank : 0);
    double forward = f.matmul + f.head + f.attention + f.lora;
    double backward = (lora ? 1 : 2) * (f.matmul + f.head) + f.head + 2.5 * f.attention + 2 * f.lora;
    return forward + backward + (recompute ? f.matmul + f.attention + f.lora : 0);
}
