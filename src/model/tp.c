/* Tensor parallelism in a model's passes (trill_model_set_tensor_comm, trill/model.h): the
 * shard's config gives each rank its share of the heads and of the dense MLPs' width, so the
 * family's layer code runs unchanged on it; what crosses ranks is here (the backward's part in
 * src/train/backward.c). Megatron's rules: a column-parallel projection (q/k/v, MLA's q_b/kv_b,
 * gate/up) needs nothing forward, its adapter's A whole and B split like the weight's rows; a
 * row-parallel one (o_proj, down_proj) sums its partial outputs over the group, its adapter's A
 * split like the weight's columns, its partial x A^T summed, B whole. Sums add the ranks in rank
 * order, so every rank keeps the same bits. */
#include "model/forward_internal.h"
#include "model/lora_internal.h"
#include "trill/dist.h"
#include "trill/kernels.h"

trill_status trill_model_set_tensor_comm(trill_model *m, trill_comm *tp) {
    if (tp && (trill_comm_size(tp) != m->tp_size || trill_comm_rank(tp) != m->tp_rank))
        return trill_error(TRILL_ERR_INVALID, "tensor parallelism: the model is share %d of %d, but this rank is %d of a group of %d", m->tp_rank,
                           m->tp_size, trill_comm_rank(tp), trill_comm_size(tp));
    m->tp = tp && trill_comm_size(tp) > 1 ? tp : NULL; /* a group of one is the whole model */
    return TRILL_OK;
}

trill_status trill_tp_sum(const trill_forward_pass *fp, float *data, size_t n) {
    return fp->m->tp ? trill_comm_allreduce_ordered_f32(fp->m->tp, data, n) : TRILL_OK;
}

trill_status trill_linear_rowpar(const trill_forward_pass *fp, float *out, const float *inp, trill_weight W, trill_lora_pair ad, float *xa,
                                 int n, int K, int N) {
    if (!fp->m->tp) return trill_linear(fp, out, inp, W, ad, xa, n, K, N);
    trill_status st = trill_matmul_forward_wp(out, inp, W, n, K, N, fp->precision);
    if (!st) st = trill_tp_sum(fp, out, (size_t)n * N);
    if (st || !fp->lora || !ad.A) return st;
    const int r = fp->lora->config.rank;
    st = trill_matmul_forward_p(xa, inp, ad.A, n, K, r, fp->precision);
    if (!st) st = trill_tp_sum(fp, xa, (size_t)n * r);
    return st ? st : trill_matmul_accumulate_p(out, xa, ad.B, n, r, N, fp->lora->scale, fp->precision);
}
