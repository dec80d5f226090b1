/* Expert parallelism in the model's passes (trill_model_set_expert_comm) on however many ranks
 * the test is started with (alone, and under mpirun -np 2 and 4): every rank holds a shard of a
 * model with 8 routed experts and forwards its own batch (on 4 ranks the last an empty one, which
 * still serves its experts; on 2 both have rows for the other's experts, so each receives from
 * two sources and their order matters); every rank also holds the whole model and computes each rank's batch on it
 * alone. The shard's log-probs, routed experts and adapter gradients must equal the whole
 * model's bit for bit: the non-expert gradients for its own batch, and for each source rank the
 * held experts' gradients from that rank's batch. With and without router replay, with and
 * without recomputation, adapters disabled (the KL reference), a bf16 base, and for both
 * families (Qwen3-MoE and DeepSeek-V3 with a shared expert and groups). The all-to-all-v's
 * bytes must be the (token, expert) rows that cross ranks, counted from the routing, times
 * hidden_size times 4, both ways. Also: a shard's adapters start as the whole adapter's, and
 * gathered they are the whole adapter; the refusals.
 * `test_ep [--expect N]`. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trill/config.h"
#include "dist_test.h"
#include "trill/infer.h"
#include "trill/lora.h"
#include "trill/model.h"
#include "trill/train.h"



/* The batch of rank s: sequences of formula lengths and tokens; the last of more than 2 ranks has none
 * (on 2 both send rows both ways). */
typedef struct batch {
    int n_seqs, T;
    int offsets[8], tokens[256];
    uint16_t replay[256 * 2 * 3]; /* [T][MoE layers][top-k] */
    float dlp[256];
} batch;

static void make_batch(batch *b, int s, int P, const trill_config *c) {
    memset(b, 0, sizeof *b);
    b->n_seqs = P > 2 && s == P - 1 ? 0 : 2 + s % 2;
    for (int i = 0; i < b->n_seqs; i++) b->offsets[i + 1] = b->offsets[i] + 5 + (7 * s + 11 * i) % 23;
    b->T = b->offsets[b->n_seqs];
    for (int t = 0; t < b->T; t++) {
        b->tokens[t] = (int)((t * 13 + s * 29 + 7) % (unsigned)c->vocab_size);
        b->dlp[t] = (float)((t * 5 + s) % 7 - 3) / 8.0f;
    }
    const int L = c->n_moe_layers, K = c->num_experts_per_tok, E = c->num_experts;
    for (int t = 0; t < b->T; t++)
        for (int l = 0; l < L; l++) {
            uint16_t *ids = b->replay + ((size_t)t * L + l) * K;
            if ((t + l) % 7 == 3) { /* this token routes itself here */
                ids[0] = TRILL_REPLAY_NONE;
                continue;
            }
            const int base = (t * 5 + l * 3 + s * 7) % E; /* K distinct ids, spread over every shard */
            for (int k = 0; k < K; k++) ids[k] = (uint16_t)((base + k * 3) % E);
        }
}

static const trill_param *lora_tensor_named(const trill_lora *l, const char *name) {
    size_t n;
    const trill_param *t = trill_lora_tensors(l, &n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].name, name)) return &t[i];
    return NULL;
}

static size_t lora_offset(trill_lora *l, const trill_param *t) {
    size_t n;
    return (size_t)(t->data - trill_lora_params(l, &n));
}

static trill_model *make_model(const trill_config *c, trill_dtype storage, int rank, int size) {
    trill_model *m;
    OK(trill_model_create_shard(c, storage, &(trill_shard){ .ep_rank = rank, .ep_size = size, .tp_size = 1 }, &m));
    trill_model_init_random(m, 11);
    test_set_bias(m);
    return m;
}

/* (token, expert) rows of `routing` ([T][L][K]) whose expert is held by a rank other than `src`. */
static uint64_t crossing(const uint16_t *routing, int T, int L, int K, int l, int E, int P, int src, int to) {
    uint64_t n = 0;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            const int owner = routing[((size_t)t * L + l) * K + k] / (E / P);
            n += to < 0 ? owner != src : owner == to;
        }
    return n;
}

typedef struct ref { float lp[256]; uint16_t ex[256 * 2 * 3]; float *grads; } ref;

static void run_case(trill_comm *w, const trill_config *c, trill_dtype storage, const char *what, bool replay, bool recompute, bool enabled) {
    const int me = trill_comm_rank(w), P = trill_comm_size(w), L = c->n_moe_layers, K = c->num_experts_per_tok, E = c->num_experts;
    trill_model *whole = make_model(c, storage, 0, 1), *shard = make_model(c, storage, me, P);
    trill_lora_config lc = { .rank = 4, .alpha = 8, .targets = TRILL_LORA_ALL_LINEAR | (1u << TRILL_LORA_LM_HEAD) };
    trill_lora *lw, *ls;
    OK(trill_lora_create(whole, lc, 5, &lw));
    OK(trill_lora_create(shard, lc, 5, &ls));
    size_t nw, ns, nts;
    trill_lora_params(lw, &nw);
    trill_lora_params(ls, &ns);
    const trill_param *tsh = trill_lora_tensors(ls, &nts);
    /* a shard's adapters are the whole adapter's, tensor by tensor (A from the same keys) */
    for (size_t i = 0; i < nts; i++) {
        const trill_param *o = lora_tensor_named(lw, tsh[i].name);
        CHECK(o && o->numel == tsh[i].numel && !memcmp(o->data, tsh[i].data, sizeof(float) * o->numel));
    }
    test_set_lora_b(lw);
    test_set_lora_b(ls);
    trill_model_attach_lora(whole, lw);
    trill_model_attach_lora(shard, ls);
    trill_lora_set_enabled(lw, enabled);
    trill_lora_set_enabled(ls, enabled);
    OK(trill_model_set_expert_comm(shard, w));
    const size_t routed = trill_lora_routed_first(ls), n_exp = ns - routed;
    /* the whole model, alone, on every rank's batch */
    batch *b = calloc((size_t)P, sizeof *b);
    ref *rf = calloc((size_t)P, sizeof *rf);
    for (int s = 0; s < P; s++) {
        make_batch(&b[s], s, P, c);
        trill_forward_pass *pass;
        OK(trill_model_forward_train(whole, b[s].tokens, b[s].offsets, b[s].n_seqs, replay ? b[s].replay : NULL, rf[s].lp, rf[s].ex, recompute,
                                     &pass));
        rf[s].grads = calloc(nw, sizeof(float));
        OK(trill_model_backward(pass, b[s].dlp, NULL, enabled ? rf[s].grads : NULL));
        trill_forward_pass_free(pass);
    }
    /* the shard, over the group */
    const batch *mine = &b[me];
    float lp[256];
    uint16_t ex[256 * 2 * 3];
    float *grads = calloc(ns, sizeof(float)), **src = calloc((size_t)P, sizeof *src);
    for (int s = 0; s < P; s++) src[s] = calloc(n_exp ? n_exp : 1, sizeof(float));
    trill_comm_stats_reset(w);
    trill_model_ep_stats_reset(shard);
    trill_forward_pass *pass;
    OK(trill_model_forward_train(shard, mine->tokens, mine->offsets, mine->n_seqs, replay ? mine->replay : NULL, lp, ex, recompute, &pass));
    CHECK(!memcmp(lp, rf[me].lp, sizeof(float) * (size_t)mine->T));
    CHECK(!memcmp(ex, rf[me].ex, sizeof(uint16_t) * (size_t)mine->T * L * K));
    OK(trill_model_backward_ep(pass, mine->dlp, NULL, enabled ? grads : NULL, src));
    trill_forward_pass_free(pass);
    /* the gradients: the shard's own tensors for its batch, its experts' for every source's */
    int differ = 0;
    for (size_t i = 0; enabled && i < nts; i++) {
        const trill_param *o = lora_tensor_named(lw, tsh[i].name);
        const size_t at = lora_offset(ls, &tsh[i]), wo = lora_offset(lw, o);
        if (at < routed) {
            differ += memcmp(grads + at, rf[me].grads + wo, sizeof(float) * o->numel) != 0;
        } else {
            for (int s = 0; s < P; s++) differ += memcmp(src[s] + (at - routed), rf[s].grads + wo, sizeof(float) * o->numel) != 0;
        }
    }
    for (size_t i = routed; i < ns; i++) differ += grads[i] != 0; /* nothing of the held experts' goes to the rank's own block */
    if (differ) fprintf(stderr, "test_ep: rank %d: %s: %d gradient tensors differ from the whole model's\n", me, what, differ);
    CHECK(differ == 0);
    /* every (token, expert) row that crossed ranks, both ways, forward (again with recomputation) and backward */
    uint64_t rows = 0, out = 0, in = 0;
    for (int l = 0; l < L; l++) {
        out += crossing(rf[me].ex, mine->T, L, K, l, E, P, me, -1); /* out, and its outputs back */
        for (int s = 0; s < P; s++)
            if (s != me) in += crossing(rf[s].ex, b[s].T, L, K, l, E, P, s, me); /* served for s, returned */
    }
    rows = out + in;
    if (P == 2) CHECK(out > 0 && in > 0); /* rows flow both ways: each rank serves two sources */
    const uint64_t passes = recompute ? 3 : 2;
    const trill_comm_stats cs = trill_comm_stats_get(w);
    const trill_ep_stats es = trill_model_ep_stats(shard);
    CHECK(es.rows_sent == passes * rows && es.rows_received == es.rows_sent);
    CHECK(cs.bytes[TRILL_COMM_ALLTOALLV] == es.rows_sent * (uint64_t)c->hidden_size * sizeof(float));
    CHECK(cs.calls[TRILL_COMM_ALLTOALLV] == (uint64_t)L * 2 * passes);
    CHECK(cs.calls[TRILL_COMM_COUNTS] == (uint64_t)L * (passes - 1));
    /* a forward without gradients (the pre-pass), collective as well */
    OK(trill_model_forward(shard, mine->tokens, mine->offsets, mine->n_seqs, replay ? mine->replay : NULL, lp, NULL));
    CHECK(!memcmp(lp, rf[me].lp, sizeof(float) * (size_t)mine->T));
    /* gathered, the shards' adapters are the whole adapter: each value written by one rank */
    trill_lora *gathered;
    OK(trill_lora_create_whole(shard, lc, &gathered));
    size_t ng;
    float *pg = trill_lora_params(gathered, &ng);
    CHECK(ng == nw);
    for (size_t i = 0; i < nts; i++)
        if (lora_offset(ls, &tsh[i]) >= routed || me == 0) {
            const trill_param *o = lora_tensor_named(gathered, tsh[i].name);
            memcpy(o->data, tsh[i].data, sizeof(float) * o->numel);
        }
    OK(trill_comm_allreduce_f32(w, pg, ng));
    CHECK(!memcmp(pg, trill_lora_params(lw, &nw), sizeof(float) * nw));
    trill_lora_free(gathered);
    if (me == 0)
        printf("test_ep: %s: log-probs, routing and adapter gradients equal to the whole model's; %llu rows crossed ranks\n", what,
               (unsigned long long)es.rows_sent);
    OK(trill_model_set_expert_comm(shard, NULL));
    trill_model_attach_lora(shard, NULL);
    trill_model_attach_lora(whole, NULL);
    for (int s = 0; s < P; s++) free(src[s]), free(rf[s].grads);
    free(src);
    free(grads);
    free(rf);
    free(b);
    trill_lora_free(lw);
    trill_lora_free(ls);
    trill_model_free(whole);
    trill_model_free(shard);
}

/* A shard holds 1/P of the routed experts' bytes and every other tensor: exactly. */
static void shard_bytes(trill_comm *w, const trill_config *c) {
    const int me = trill_comm_rank(w), P = trill_comm_size(w);
    trill_model *whole = make_model(c, TRILL_BF16, 0, 1), *shard = make_model(c, TRILL_BF16, me, P);
    size_t n, routed = 0;
    const trill_param *t = trill_model_tensors(whole, &n);
    for (size_t i = 0; i < n; i++)
        if (t[i].expert >= 0) routed += t[i].numel * (t[i].ndim == 2 ? sizeof(uint16_t) : sizeof(float)); /* a bf16 base keeps vectors in fp32 */
    CHECK(routed > 0 && trill_model_bytes(whole) - trill_model_bytes(shard) == routed - routed / (size_t)P);
    int first, count;
    trill_model_experts_held(shard, &first, &count);
    CHECK(count == c->num_experts / P && first == me * count);
    size_t ns;
    const trill_param *ts = trill_model_tensors(shard, &ns);
    CHECK(ns == n); /* the whole model's list; the others' experts without storage */
    for (size_t i = 0; i < ns; i++) CHECK(((ts[i].data || ts[i].bf16) != 0) == (ts[i].expert < 0 || (ts[i].expert >= first && ts[i].expert < first + count)));
    if (me == 0)
        printf("test_ep: a shard of %d holds %zu of the %zu bytes of routed experts and %zu bytes in all (the whole model %zu)\n", P,
               routed / (size_t)P, routed, trill_model_bytes(shard), trill_model_bytes(whole));
    trill_model_free(whole);
    trill_model_free(shard);
}

static void refusals(trill_comm *w, const trill_config *c) {
    const int me = trill_comm_rank(w), P = trill_comm_size(w);
    trill_model *m;
    CHECK(trill_model_create_shard(c, TRILL_F32, &(trill_shard){ .ep_size = 3, .tp_size = 1 }, &m) == TRILL_ERR_INVALID);
    CHECK(strstr(trill_error_message(), "need routed experts in a multiple of 3, but this"));
    CHECK(trill_model_create_shard(c, TRILL_F32, &(trill_shard){ .ep_rank = 2, .ep_size = 2, .tp_size = 1 }, &m) == TRILL_ERR_INVALID);
    if (P == 1) return;
    trill_model *shard = make_model(c, TRILL_F32, me, P);
    trill_engine *e;
    CHECK(trill_engine_create(shard, NULL, &e) == TRILL_ERR_UNSUPPORTED);
    CHECK(strstr(trill_error_message(), "engine: this model is a shard"));
    CHECK(trill_model_save(shard, "/nonexistent", TRILL_F32, 0) == TRILL_ERR_UNSUPPORTED);
    trill_lora *l;
    OK(trill_lora_create(shard, (trill_lora_config){ .rank = 2, .alpha = 2, .targets = TRILL_LORA_ALL_LINEAR }, 1, &l));
    CHECK(trill_lora_save(l, "/nonexistent") == TRILL_ERR_UNSUPPORTED);
    trill_model_attach_lora(shard, l);
    trill_model *other = make_model(c, TRILL_F32, (me + 1) % P, P);
    CHECK(trill_model_set_expert_comm(other, w) == TRILL_ERR_INVALID); /* shard of another rank */
    trill_model_free(other);
    OK(trill_model_set_expert_comm(shard, w));
    batch b;
    make_batch(&b, me, P, c);
    float lp[256];
    size_t n;
    float *g = calloc(trill_lora_params(l, &n) ? n : 1, sizeof(float));
    trill_forward_pass *pass;
    OK(trill_model_forward_train(shard, b.tokens, b.offsets, b.n_seqs, NULL, lp, NULL, false, &pass));
    CHECK(trill_model_backward(pass, b.dlp, NULL, g) == TRILL_ERR_INVALID); /* no buffers for the experts' */
    /* the refused backward sent nothing: every rank still runs the same passes */
    trill_forward_pass_free(pass);
    trill_model_attach_lora(shard, NULL);
    trill_lora_free(l);
    free(g);
    trill_model_free(shard);
}

int main(int argc, char **argv) {
    trill_comm *w = dist_test_begin("test_ep", argc, argv, NULL);
    const int P = trill_comm_size(w);
    static const struct { const char *name, *json; } FAMILIES[] = { { "qwen3_moe", DIST_QWEN3_MOE }, { "deepseek_v3", DIST_DEEPSEEK_V3 },
                                                                     { "mixtral", DIST_MIXTRAL }, { "glm4_moe", DIST_GLM },
                                                                     { "gpt_oss", DIST_GPT_OSS }, { "qwen3_next", DIST_QWEN3NEXT } };
    for (size_t f = 0; f < sizeof FAMILIES / sizeof FAMILIES[0]; f++) {
        trill_config c;
        OK(trill_config_parse(FAMILIES[f].json, strlen(FAMILIES[f].json), FAMILIES[f].name, &c));
        char what[128];
        for (int replay = 0; replay < 2; replay++)
            for (int recompute = 0; recompute < 2; recompute++) {
                snprintf(what, sizeof what, "%s, %d ranks, replay %s, recompute %s", FAMILIES[f].name, P, replay ? "on" : "off", recompute ? "on" : "off");
                run_case(w, &c, TRILL_F32, what, replay, recompute, true);
            }
        snprintf(what, sizeof what, "%s, %d ranks, adapters disabled", FAMILIES[f].name, P);
        run_case(w, &c, TRILL_F32, what, true, false, false);
        snprintf(what, sizeof what, "%s, %d ranks, bf16 base", FAMILIES[f].name, P);
        run_case(w, &c, TRILL_BF16, what, true, false, true);
        shard_bytes(w, &c);
        refusals(w, &c);
    }
    return dist_test_end(w);
}
