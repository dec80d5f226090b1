#include "trill/train.h"

typedef struct flop_parts { double matmul, head, attention, lora; } flop_parts;

static flop_parts count(const trill_config *c, const int *offsets, int n_seqs, int rank) {
    const double T = offsets[n_seqs], H = c->hidden_size, hd = c->head_dim;
    const double qd = (double)c->num_attention_heads * hd, kvd = (double)c->num_key_value_heads * hd;
    double pairs = 0; /* causal (query, key) pairs: L(L+1)/2 per sequence */
    for (int s = 0; s < n_seqs; s++) {
        double L = offsets[s + 1] - offsets[s];
        pairs += L * (L + 1) / 2;
    }
    flop_parts f = { 0 };
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const bool moe = trill_config_is_moe(c, l);
        const double rows = moe ? T * c->num_experts_per_tok : T, inter = moe ? c->moe_intermediate_size : c->intermediate_size;
        f.matmul += 2 * T * H * (qd + 2 * kvd) + 2 * T * qd * H + 2 * rows * 3 * H * inter;
        if (moe) f.matmul += 2 * T * H * c->num_experts;
        f.attention += 2 * 2 * pairs * hd * c->num_attention_heads;
        f.lora += 2 * T * rank * ((H + qd) * 2 + (H + kvd) * 2) + 2 * rows * rank * (H + inter) * 3;
    }
    f.head = 2 * T * H * c->vocab_size;
    return f;
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
