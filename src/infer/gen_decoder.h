/* The generator's decoder layer (trill_eng_forward, src/infer/engine_internal.h), every family's
 * with the options of its layer description (src/arch/decoder.h): gen_decoder.c holds the layer
 * skeleton, GQA over the paged cache, the MLPs and the routers; gen_mla.c MLA's absorbed
 * attention over its latent cache. Their shared step buffers are here. Not public. */
#ifndef TRILL_INFER_GEN_DECODER_H
#define TRILL_INFER_GEN_DECODER_H

#include "arch/decoder.h"
#include "infer/engine_internal.h"
#include "infer/gen_blocks.h"

/* The forward's buffers (trill_engine.fwd), for rows.max rows; the ones the model's attention
 * kind does not use are NULL. GQA: nh heads, nkv kv heads of hd; MLA: qk = nope + rope, kl
 * kv_lora_rank, values of v_head_dim. */
/* The Gated DeltaNet layer's step buffers (gen_gdn.c; src/model/gdn.h names them) and its runs:
 * each a sequence's consecutive rows, offsets[n + 1], its states conv[i] and rec[i]. */
typedef struct gen_gdn {
    float *qkvz, *ba, *mixed, *convo, *z, *beta, *g, *qc, *kc, *q, *k, *v, *o, *y;
    int *ordinal; /* [layers] a linear layer's place among them (seq.gdn), -1 for the others */
    int *offsets;
    float **conv, **rec;
} gen_gdn;

typedef struct gen_state {
    float *x, *xn;        /* [R, H] the residual stream, and a norm of it */
    float *qkv;           /* GQA: [R, (nh + 2 nkv) hd] the fused q|k|v output */
    float *qkva;          /* MLA: [R, q_a (or q) + kl + rope] the fused q_a|kv_a (q|kv_a) output */
    float *qa;            /* MLA: [R, q_lora_rank] q_a_layernorm of q_a's */
    float *q;             /* [R, nh*hd] (MLA: [R, nh*qk]) */
    float *k, *v;         /* GQA: [R, nkv*hd] */
    float *ckv;           /* MLA: [R, kl + rope] the cache rows: normed latent | rotated rope key */
    float *qabs;          /* MLA: [R, nh*(kl + rope)] absorbed queries */
    float *olat;          /* MLA: [R, nh*kl] attention output in the latent space */
    float *att;           /* [R, nh*hd] (MLA: [R, nh*v]) */
    float *out, *shared;  /* [R, H] a block's output; the shared experts' */
    float *scores, *sel;  /* [R, E] router probabilities or scores; [R, K] the sigmoid router's selection values */
    float *logits;        /* [R, V] */
    gen_moe moe;          /* routed experts (moe.ff / moe.act also serve the dense and shared MLPs) */
    float *inv_freq;
    float rope_scale, softmax_scale;
    gen_scores att_scores; /* per thread: [heads of a task][max_context] */
    gen_lora_buf lora;    /* the adapters' side path */
    float *head_u;        /* MLA: [R, nh * rank] the absorbed attention adapter's shrinks */
    float *qg, *ogate;    /* GQA with an output gate: [R, 2 nh hd] q_proj's rows (per head q, gate), [R, nh hd] the gates */
    gen_gdn gdn;          /* with Gated DeltaNet layers */
    int head_u_rank;
} gen_state;

static inline gen_state *S(const trill_engine *e) { return e->fwd; }

/* ---- MLA (gen_mla.c) ---- */

/* Query heads per attention task at most: a task reads its row's cache once for them (8 against
 * 4: k2-small at a 4k context, batch 16, 1.3-1.4x); fewer where the rows' tasks would leave
 * threads idle (gen_mla.c's latent_attention). */
enum { MLA_HEADS_PER_TASK = 8 };

/* The width of MLA's first query projection: q_lora_rank, or q_proj's nh * qk. */
int trill_gen_mla_q_width(const trill_config *c);
/* Layer l's MLA on S(e)->xn: out = o_proj(attention), the rows' cache rows written first. */
trill_status trill_gen_mla_attention(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int l, int R);
/* The absorbed attention's per-head matrices from kv_b_proj (trill_eng_forward.derive_*). */
trill_status trill_gen_mla_derive_weights(const trill_config *c, trill_gen_format f, const trill_model *m, eng_weights *w);
trill_status trill_gen_mla_derive_adapter(const trill_engine *e, const trill_lora *lora, eng_adapter *ad);

/* ---- Gated DeltaNet (gen_gdn.c) ---- */

/* Floats of one sequence's state in one linear layer (conv, then recurrent), and in all of them. */
size_t trill_gen_gdn_layer_floats(const trill_config *c);
size_t trill_gen_gdn_state_floats(const trill_config *c);
/* The step buffers for e->rows.max rows; freed by trill_gen_gdn_free. */
trill_status trill_gen_gdn_alloc(trill_engine *e);
void trill_gen_gdn_free(gen_gdn *g);
/* Layer l's Gated DeltaNet on S(e)->xn into S(e)->out, the rows' sequences' states advanced. */
trill_status trill_gen_gdn(trill_engine *e, const eng_layer *L, const eng_lora_layer *A, int l, int R);

#endif
