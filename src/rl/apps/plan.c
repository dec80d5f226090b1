/* trill plan (trill/plan.h): counts from the tensor table, bytes per device, weight-sync bytes and
 * seconds. The equations and their assumptions: docs/plan.md. */
#include "trill/plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "arch/decoder.h"
#include "arch/family.h"
#include "trill/fileio.h"
#include "trill/infer.h"
#include "trill/run_config.h"

static const char *const module_names[TRILL_PLAN_N_MODULES] = { "embedding", "attention", "dense_mlp", "routed_experts",
                                                                  "shared_experts", "router", "norms", "lm_head" };

const char *trill_plan_module_name(trill_plan_module m) { return m >= 0 && m < TRILL_PLAN_N_MODULES ? module_names[m] : "?"; }

/* The module of a tensor, by its role in the shared blocks (src/arch/decoder.h). */
static trill_plan_module module_of(const trill_param *t) {
    if (t->expert >= 0) return TRILL_PLAN_ROUTED_EXPERTS;
    switch ((trill_role)t->role) {
    case TRILL_ROLE_EMBED: return TRILL_PLAN_EMBEDDING;
    case TRILL_ROLE_LM_HEAD:
    case TRILL_ROLE_SCORE: return TRILL_PLAN_LM_HEAD;
    case TRILL_ROLE_INPUT_NORM:
    case TRILL_ROLE_POST_NORM:
    case TRILL_ROLE_FINAL_NORM: return TRILL_PLAN_NORMS;
    case TRILL_ROLE_ROUTER:
    case TRILL_ROLE_ROUTER_BIAS:
    case TRILL_ROLE_ROUTER_LINEAR_BIAS: return TRILL_PLAN_ROUTER;
    case TRILL_ROLE_EXPERT_GATE:
    case TRILL_ROLE_EXPERT_UP:
    case TRILL_ROLE_EXPERT_DOWN:
    case TRILL_ROLE_EXPERT_GATE_BIAS:
    case TRILL_ROLE_EXPERT_UP_BIAS:
    case TRILL_ROLE_EXPERT_DOWN_BIAS: return TRILL_PLAN_ROUTED_EXPERTS; /* stacked in one tensor (gpt-oss) */
    case TRILL_ROLE_SHARED_GATE:
    case TRILL_ROLE_SHARED_UP:
    case TRILL_ROLE_SHARED_DOWN:
    case TRILL_ROLE_SHARED_EXPERT_GATE: return TRILL_PLAN_SHARED_EXPERTS;
    case TRILL_ROLE_GATE:
    case TRILL_ROLE_UP:
    case TRILL_ROLE_DOWN: return TRILL_PLAN_DENSE_MLP;
    default: return TRILL_PLAN_ATTENTION; /* q .. o, their norms and biases, sinks, Gated DeltaNet */
    }
}

static bool routed(const trill_param *t) { return module_of(t) == TRILL_PLAN_ROUTED_EXPERTS; }

/* ---- counts ---- */

typedef struct count_walk {
    trill_plan_counts *out;
    unsigned targets; /* LoRA's, resolved; 0: full fine-tuning */
    int rank;
} count_walk;

static void count_tensor(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    (void)row;
    count_walk *w = ctx;
    const trill_plan_module m = module_of(t);
    const int64_t n = (int64_t)t->numel;
    w->out->total[m] += n;
    if (m != TRILL_PLAN_ROUTED_EXPERTS) w->out->active[m] += n; /* the routed experts' share: trill_plan_count */
    if (w->targets && t->lora_target >= 0 && (w->targets & (1u << t->lora_target)) && t->ndim == 2) {
        w->out->lora[m] += (int64_t)w->rank * (t->shape[0] + t->shape[1]);
        w->out->adapted++;
    }
    if (!w->targets && trill_tensor_trainable(t->kind)) w->out->trainable += n;
}

trill_status trill_plan_count(const trill_config *c, const trill_lora_config *lora, trill_plan_counts *out) {
    memset(out, 0, sizeof *out);
    count_walk w = { .out = out };
    if (lora) {
        trill_lora_config r = *lora;
        const trill_status st = trill_lora_config_resolve(c, &r);
        if (st) return st;
        w.targets = r.targets;
        w.rank = r.rank;
    }
    trill_arch_walk(c, count_tensor, &w);
    /* active routed experts: the tensor table's own count (trill_config_param_counts) less the rest */
    int64_t total, active;
    trill_config_param_counts(c, &total, &active);
    for (int m = 0; m < TRILL_PLAN_N_MODULES; m++) {
        out->sum_total += out->total[m];
        if (m != TRILL_PLAN_ROUTED_EXPERTS) out->sum_active += out->active[m];
        out->sum_lora += out->lora[m];
    }
    out->active[TRILL_PLAN_ROUTED_EXPERTS] = active - out->sum_active;
    out->sum_active = active;
    if (lora) out->trainable = out->sum_lora;
    if (out->sum_total != total)
        return trill_error(TRILL_ERR_INVALID, "plan: the modules' parameters (%lld) differ from the tensor table's (%lld)", (long long)out->sum_total,
                           (long long)total);
    return TRILL_OK;
}

/* ---- clusters ---- */

/* Shipped profiles: the vendors' datasheet figures, dense (no sparsity), per GPU; links per
 * direction (NVLink's bidirectional figure halved; a 400 Gb/s NIC per GPU = 50 GB/s). Latencies
 * are typical figures, not datasheet ones: a few microseconds within a node, more across. */
typedef struct profile { const char *name, *source; int devices_per_node; double mem, bf16, fp8, bw, intra, inter, lat_intra, lat_inter; } profile;
/* What a GPU's engines reach, assumed for every shipped profile (docs/plan.md gives the sources):
 * Megatron-class MoE training at 40% MFU, prefill at 50%, a compute-bound decode step at 30%, a
 * bandwidth-bound one at 70% of the HBM bandwidth. */
enum { GPU_TRAIN_MFU_PCT = 40, GPU_PREFILL_MFU_PCT = 50, GPU_DECODE_MFU_PCT = 30, GPU_DECODE_BW_PCT = 70 };
static const profile profiles[] = {
    { "h100-sxm", "NVIDIA H100 SXM5 datasheet: 80 GB HBM3 at 3.35 TB/s, 989 bf16 / 1979 fp8 dense TFLOPS, NVLink 900 GB/s; 400 Gb/s NDR per GPU", 8,
      80, 989, 1979, 3350, 450, 50, 3, 8 },
    { "h800", "NVIDIA H800 SXM5: H100's compute and memory, NVLink 400 GB/s; 400 Gb/s per GPU", 8, 80, 989, 1979, 3350, 200, 50, 3, 8 },
    { "h200", "NVIDIA H200 SXM datasheet: 141 GB HBM3e at 4.8 TB/s, H100's compute, NVLink 900 GB/s; 400 Gb/s per GPU", 8, 141, 989, 1979, 4800, 450,
      50, 3, 8 },
    { "h20", "NVIDIA H20: 96 GB HBM3 at 4.0 TB/s, 148 bf16 / 296 fp8 dense TFLOPS, NVLink 900 GB/s; 400 Gb/s per GPU", 8, 96, 148, 296, 4000, 450,
      50, 3, 8 },
};
enum { N_PROFILES = sizeof profiles / sizeof profiles[0] };

const char *trill_cluster_profile_names(void) { return "h100-sxm, h800, h200, h20"; }

/* A cluster with the assumed GPU efficiencies and nothing else set. */
static trill_cluster gpu_defaults(void) {
    return (trill_cluster){ .train_mfu = GPU_TRAIN_MFU_PCT / 100.0, .prefill_mfu = GPU_PREFILL_MFU_PCT / 100.0,
                            .decode_mfu = GPU_DECODE_MFU_PCT / 100.0, .decode_bw_util = GPU_DECODE_BW_PCT / 100.0 };
}

static void from_profile(const profile *p, trill_cluster *k) {
    *k = gpu_defaults();
    k->nodes = 1, k->devices_per_node = p->devices_per_node, k->memory_gb = p->mem, k->bf16_tflops = p->bf16, k->fp8_tflops = p->fp8;
    k->memory_bw_gbs = p->bw, k->intra_bw_gbs = p->intra, k->inter_bw_gbs = p->inter;
    k->intra_latency_us = p->lat_intra, k->inter_latency_us = p->lat_inter;
    snprintf(k->name, sizeof k->name, "%s", p->name);
    snprintf(k->source, sizeof k->source, "%s", p->source);
}

/* A cluster file's keys: where each goes, its least value, and whether it must be given. */
typedef struct cluster_key { const char *key; size_t at; bool integer, required; double min, max; const char *doc; } cluster_key;
#define DKEY(k, req, lo, doc) { #k, offsetof(trill_cluster, k), false, req, lo, INFINITY, doc }
#define SKEY(k, lo, doc) { #k, offsetof(trill_cluster, k), false, false, lo, 1, doc } /* a share: at most 1 */
#define IKEY(k, req, lo, doc) { #k, offsetof(trill_cluster, k), true, req, lo, 1e9, doc }
static const cluster_key cluster_keys[] = {
    IKEY(nodes, true, 1, "nodes"),
    IKEY(devices_per_node, true, 1, "devices a node"),
    DKEY(memory_gb, true, 0.001, "a device's memory, GB"),
    DKEY(bf16_tflops, true, 1e-6, "dense bf16 peak, TFLOP/s"),
    DKEY(fp8_tflops, false, 0, "dense fp8 peak, TFLOP/s (0: none)"),
    DKEY(memory_bw_gbs, true, 1e-3, "memory bandwidth, GB/s"),
    DKEY(intra_bw_gbs, true, 1e-3, "a device's link within its node, GB/s a direction"),
    DKEY(inter_bw_gbs, true, 1e-3, "a device's link out of its node, GB/s a direction"),
    DKEY(intra_latency_us, true, 0, "latency within a node, microseconds"),
    DKEY(inter_latency_us, true, 0, "latency across nodes, microseconds"),
    SKEY(train_mfu, 1e-6, "training's share of the bf16 peak (default 0.4)"),
    SKEY(prefill_mfu, 1e-6, "prefill's share of the bf16 peak (default 0.5)"),
    SKEY(decode_mfu, 1e-6, "a compute-bound decode step's share of the peak (default 0.3)"),
    SKEY(decode_bw_util, 1e-6, "a bandwidth-bound decode step's share of the memory bandwidth (default 0.7)"),
    SKEY(split_gen_rate, 0, "the generator's rate on half a device's cores, a share of the whole device's (default 0.5)"),
    SKEY(split_train_rate, 0, "the trainer's rate on half a device's cores, a share of the whole device's (default 0.5)"),
};
enum { N_CLUSTER_KEYS = sizeof cluster_keys / sizeof cluster_keys[0] };

/* One "key: value" of a cluster file at line `line` into k (name and source as they are, the rest
 * numbers in their key's range); seen[i] marks cluster_keys[i]. */
static trill_status cluster_field(const char *path, size_t line, const char *key, const char *val, trill_cluster *k, bool *seen) {
    if (!strcmp(key, "name")) return snprintf(k->name, sizeof k->name, "%s", val), TRILL_OK;
    if (!strcmp(key, "source")) return snprintf(k->source, sizeof k->source, "%s", val), TRILL_OK;
    int i = 0;
    while (i < N_CLUSTER_KEYS && strcmp(cluster_keys[i].key, key)) i++;
    if (i == N_CLUSTER_KEYS) {
        char known[512] = "name, source";
        for (int j = 0; j < N_CLUSTER_KEYS; j++) snprintf(known + strlen(known), sizeof known - strlen(known), ", %s", cluster_keys[j].key);
        return trill_error(TRILL_ERR_INVALID, "%s:%zu: %s: unknown field (known: %s)", path, line, key, known);
    }
    const cluster_key *ck = &cluster_keys[i];
    char *end;
    const double v = strtod(val, &end);
    if (end == val || *end || !isfinite(v) || v < ck->min || v > ck->max || (ck->integer && v != floor(v))) {
        char range[64] = "";
        if (ck->max == 1) snprintf(range, sizeof range, " and at most 1");
        return trill_error(TRILL_ERR_INVALID, "%s:%zu: %s: '%s' is not %s at least %g%s (%s)", path, line, key, val,
                           ck->integer ? "an integer" : "a number", ck->min, range, ck->doc);
    }
    if (ck->integer) *(int *)((char *)k + ck->at) = (int)v;
    else *(double *)((char *)k + ck->at) = v;
    seen[i] = true;
    return TRILL_OK;
}

static trill_status parse_cluster(const char *path, const char *text, size_t len, trill_cluster *k) {
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        const trill_status st = trill_error(TRILL_ERR_INVALID, "%s:%zu: %s", path, parser.problem_mark.line + 1,
                                            parser.problem ? parser.problem : "not YAML");
        yaml_parser_delete(&parser);
        return st;
    }
    trill_status st = TRILL_OK;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    bool seen[N_CLUSTER_KEYS] = { false };
    *k = gpu_defaults();
    snprintf(k->name, sizeof k->name, "%s", path);
    if (!root || root->type != YAML_MAPPING_NODE) {
        st = trill_error(TRILL_ERR_INVALID, "%s: expected a mapping of the cluster's fields (nodes, devices_per_node, memory_gb, ...)", path);
        goto done;
    }
    for (const yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        const yaml_node_t *kn = yaml_document_get_node(&doc, p->key), *vn = yaml_document_get_node(&doc, p->value);
        const size_t line = kn->start_mark.line + 1;
        if (kn->type != YAML_SCALAR_NODE || vn->type != YAML_SCALAR_NODE) {
            st = trill_error(TRILL_ERR_INVALID, "%s:%zu: expected key: value with a scalar value", path, line);
            goto done;
        }
        if ((st = cluster_field(path, line, (const char *)kn->data.scalar.value, (const char *)vn->data.scalar.value, k, seen))) goto done;
    }
    for (int i = 0; i < N_CLUSTER_KEYS; i++)
        if (cluster_keys[i].required && !seen[i]) {
            st = trill_error(TRILL_ERR_INVALID, "%s: %s is missing (%s)", path, cluster_keys[i].key, cluster_keys[i].doc);
            goto done;
        }
    if (!k->source[0]) snprintf(k->source, sizeof k->source, "%s", path);
done:
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return st;
}

trill_status trill_cluster_load(const char *name, trill_cluster *out) {
    /* "h100-sxm" or "h100-sxm:4" (nodes) */
    for (int i = 0; i < N_PROFILES; i++) {
        const size_t n = strlen(profiles[i].name);
        if (strncmp(name, profiles[i].name, n) || (name[n] && name[n] != ':')) continue;
        from_profile(&profiles[i], out);
        if (name[n] == ':') {
            char *end;
            const long nodes = strtol(name + n + 1, &end, 10);
            if (*end || nodes < 1 || nodes > 1000000)
                return trill_error(TRILL_ERR_INVALID, "--cluster %s: expected PROFILE:NODES with NODES a positive integer", name);
            out->nodes = (int)nodes;
        }
        return TRILL_OK;
    }
    if (!trill_file_exists(name))
        return trill_error(TRILL_ERR_INVALID, "--cluster %s: neither a cluster file nor a profile (%s[:NODES])", name, trill_cluster_profile_names());
    size_t len;
    char *text;
    trill_status st = trill_read_file(name, &text, &len);
    if (st) return st;
    st = parse_cluster(name, text, len, out);
    free(text);
    return st;
}

/* ---- bytes per device ---- */

typedef struct mem_walk {
    trill_lora_config lora_cfg; /* targets resolved */
    int tp, ep, gen_ep, gen_tp;
    trill_gen_format gen_format;
    double base, lora, gen_weights, merge_bytes;
    double gen_experts; /* the generator's bytes of every routed expert */
    double gen_dense;   /* a generator device's bytes of the rest but the embedding table: what a decode step reads whatever the batch */
    bool full;                         /* lora counts every trainable parameter (full fine-tuning) */
} mem_walk;

/* The share of tensor t a device keeps: a routed expert's 1 in ep, a tensor-parallel split's 1 in
 * tp, the rest whole. */
static double share(const trill_param *t, int tp, int ep) {
    if (routed(t)) return 1.0 / ep;
    return t->split != TRILL_SPLIT_NONE ? 1.0 / tp : 1.0;
}

/* The generator's bytes of a tensor in format f: matrices in the format (int8: a scale and a
 * weight sum per output row; the router and the head stay bf16), the embedding a table in bf16
 * (f32: fp32), vectors fp32 (src/infer/engine_weights.c). */
static double gen_bytes(const trill_param *t, trill_gen_format f) {
    const double n = (double)t->numel;
    if (t->kind == TRILL_TENSOR_EMBEDDING) return n * (f == TRILL_GEN_F32 ? 4 : 2);
    if (t->ndim == 1 || t->kind == TRILL_TENSOR_NORM || t->kind == TRILL_TENSOR_BIAS || t->kind == TRILL_TENSOR_LINEAR_BIAS ||
        t->kind == TRILL_TENSOR_SINKS || t->kind == TRILL_TENSOR_CONV || t->kind == TRILL_TENSOR_DECAY)
        return n * 4;
    const bool fine = t->kind == TRILL_TENSOR_ROUTER || t->kind == TRILL_TENSOR_HEAD;
    if (fine && f == TRILL_GEN_INT8) f = TRILL_GEN_BF16;
    /* the kernels' layout (src/infer/gemm.c): rows in blocks of 16, K in groups of 1 (f32), 2
     * (bf16) or 4 (int8) elements; a fused matrix (q|k|v, gate|up) is padded as a whole, which
     * this leaves out (its parts' rows add up to whole blocks in every real model) */
    const int64_t g = f == TRILL_GEN_F32 ? 1 : f == TRILL_GEN_BF16 ? 2 : 4;
    const int64_t rows = t->fuse == TRILL_FUSE_NONE ? (t->shape[0] + 15) / 16 * 16 : t->shape[0], cols = (t->shape[1] + g - 1) / g * g;
    const double elem = f == TRILL_GEN_F32 ? 4 : f == TRILL_GEN_BF16 ? 2 : 1;
    return (double)rows * (double)cols * elem + (f == TRILL_GEN_INT8 ? (double)t->shape[0] * 8 : 0);
}

static void mem_tensor(void *ctx, const trill_tensor_row *row, const trill_param *t) {
    (void)row;
    mem_walk *w = ctx;
    const double s = share(t, w->tp, w->ep);
    /* the frozen base: matrices and the embedding in bf16, vectors fp32 (the trainer's storage of a
     * bf16 checkpoint) */
    w->base += s * (t->ndim == 2 ? 2.0 : 4.0) * (double)t->numel;
    if (w->full) {
        if (trill_tensor_trainable(t->kind)) w->lora += s * (double)t->numel;
    } else if (t->lora_target >= 0 && (w->lora_cfg.targets & (1u << t->lora_target)) && t->ndim == 2) {
        w->lora += s * (double)w->lora_cfg.rank * (double)(t->shape[0] + t->shape[1]);
    }
    const double g = gen_bytes(t, w->gen_format);
    w->merge_bytes += g;
    /* a generator device's share: a routed expert's 1 in ep x gen_tp (vLLM's tensor parallelism
     * splits each expert, its expert parallelism places them whole: the same bytes), a split
     * tensor's 1 in gen_tp, the rest whole */
    const double gs = routed(t) ? 1.0 / (w->gen_ep * w->gen_tp) : t->split != TRILL_SPLIT_NONE ? 1.0 / w->gen_tp : 1.0;
    if (routed(t)) w->gen_experts += g;
    else if (t->kind != TRILL_TENSOR_EMBEDDING) w->gen_dense += g * gs;
    w->gen_weights += g * gs;
}

/* Floats a token keeps for the backward in one layer of c (no recomputation): the layer's input
 * and its two norms' outputs, each matrix's output (a routed expert's k in E of them), and the
 * SwiGLU's product (docs/plan.md). */
static double layer_floats(const trill_config *c, int l) {
    const trill_layer_desc d = trill_layer_desc_of(c, l);
    const double H = c->hidden_size;
    double f = 3 * H; /* input, the attention's norm, the MLP's norm */
    if (d.attention == TRILL_ATTENTION_MLA) {
        const double qk = c->qk_nope_head_dim + c->qk_rope_head_dim, nh = c->num_attention_heads;
        f += (c->q_lora_rank ? c->q_lora_rank : 0) + nh * qk + c->kv_lora_rank + c->qk_rope_head_dim +
             nh * (c->qk_nope_head_dim + c->v_head_dim) + nh * c->v_head_dim + H;
    } else if (d.attention == TRILL_ATTENTION_GDN) {
        const double dk = c->linear_key_head_dim, dv = c->linear_value_head_dim, nk = c->linear_num_key_heads, nv = c->linear_num_value_heads;
        f += 2 * (2 * nk * dk + 2 * nv * dv) + nv * dv + H;
    } else {
        const double qd = (double)c->num_attention_heads * c->head_dim, kvd = (double)c->num_key_value_heads * c->head_dim;
        f += (d.output_gate ? 2 : 1) * qd + 2 * kvd + qd + H;
    }
    if (d.moe) {
        const double K = c->num_experts_per_tok, I = c->moe_intermediate_size, S = trill_config_shared_width(c);
        f += c->num_experts + K * (H + 3 * I + H) + (S > 0 ? 3 * S + H : 0);
    } else {
        f += 3.0 * c->intermediate_size + H;
    }
    return f;
}

/* KV-cache bytes a token takes on a generator device in every attention layer (elem bytes an
 * element): GQA's K and V (tensor parallelism of tp devices splits the kv heads, each device
 * keeping at least one), MLA's latent and rope key (every device keeps it whole); Gated DeltaNet
 * layers keep a state per sequence instead. */
static double kv_bytes_per_token(const trill_config *c, int elem, int tp) {
    double b = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const trill_layer_desc d = trill_layer_desc_of(c, l);
        if (d.attention == TRILL_ATTENTION_GDN) continue;
        b += d.attention == TRILL_ATTENTION_MLA ? (double)(c->kv_lora_rank + c->qk_rope_head_dim) * elem
                                                : 2.0 * ((c->num_key_value_heads + tp - 1) / tp) * c->head_dim * elem;
    }
    return b;
}


/* ---- time (docs/plan.md) ---- */

const char *trill_plan_spread_name(trill_plan_spread s) {
    return s == TRILL_SPREAD_FIXED ? "fixed" : s == TRILL_SPREAD_UNIFORM ? "uniform" : "exponential";
}

/* The share of responses still running at decode step t (1-based): P(length >= t), lengths of
 * mean m spread by s and cut at L (generator.max_new_tokens). */
static double running(trill_plan_spread s, double m, int L, int t) {
    if (t > L) return 0;
    switch (s) {
    case TRILL_SPREAD_FIXED: return t <= (int)ceil(m) ? 1 : 0;
    case TRILL_SPREAD_UNIFORM: { /* uniform on [1, 2m - 1] */
        const double hi = 2 * m - 1;
        return t <= 1 ? 1 : t > hi ? 0 : (hi - t + 1) / hi;
    }
    default: return exp(-(t - 1) / m); /* geometric of mean m */
    }
}

/* Per token and per cached position, the FLOPs of attention in a layer: decode (MLA absorbed: q.k
 * over the latent and rope key, p.V over the latent) and training (q.k and p.V per head). */
static void attention_flops(const trill_config *c, double *decode, double *train) {
    *decode = *train = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const trill_layer_desc d = trill_layer_desc_of(c, l);
        const double nh = c->num_attention_heads;
        if (d.attention == TRILL_ATTENTION_GDN) continue; /* linear in the context: in the matrices' count */
        if (d.attention == TRILL_ATTENTION_MLA) {
            *decode += 2 * nh * (c->kv_lora_rank + c->qk_rope_head_dim) + 2 * nh * c->kv_lora_rank;
            *train += 2 * nh * (c->qk_nope_head_dim + c->qk_rope_head_dim) + 2 * nh * c->v_head_dim;
        } else {
            *decode += 4 * nh * c->head_dim;
            *train += 4 * nh * c->head_dim;
        }
    }
}

/* The link a group of n devices talks over: within a node when it fits in one. */
static void link_of(const trill_cluster *k, int n, double *bw, double *lat) {
    const bool intra = n <= k->devices_per_node;
    *bw = (intra ? k->intra_bw_gbs : k->inter_bw_gbs) * 1e9;
    *lat = (intra ? k->intra_latency_us : k->inter_latency_us) * 1e-6;
}

/* Seconds of an all-reduce of `bytes` (each rank's) over p ranks on a link of bw bytes/s and lat
 * seconds: a tree's depth down and up in latency (2 ceil(log2 p) lat; NCCL's choice for small
 * messages), a ring's traffic in bytes (2 (p - 1) / p of them over each rank's link). */
static double allreduce_s(int p, double bytes, double bw, double lat) {
    if (p < 2) return 0;
    return 2 * ceil(log2(p)) * lat + 2.0 * bytes * (p - 1) / p / bw;
}

/* Seconds of a MoE layer's two all-to-alls over p ranks (each rank's rows to their experts'
 * ranks, `bytes` of them, and back): (p - 1) / p of the bytes leave each rank each way. */
static double alltoall2_s(int p, double bytes, double bw, double lat) {
    if (p < 2) return 0;
    return 2 * lat + 2.0 * bytes * (p - 1) / p / bw;
}

typedef struct model_costs {
    double active_ne;      /* active parameters but the embedding (a token's matrix FLOPs / 2) */
    double head;           /* lm_head's: prefill computes it for a prompt's last token only */
    double dense_bytes;    /* a generator device's bytes a decode step reads whatever the batch: all but the experts and the embedding table */
    double expert_bytes;   /* one routed expert's, in one layer */
    double att_decode, att_train;
    int moe_layers, layers, E, K, H;
} model_costs;

/* A generator replica: g x tp devices (g its expert parallelism, tp its tensor parallelism), the
 * links its all-to-alls and all-reduces take, kv_tok the KV bytes a token on a device. */
typedef struct replica {
    int g, tp;
    double kv_tok;
    double link_bw, link_lat, tp_bw, tp_lat;
} replica;

static replica replica_of(const trill_cluster *k, int g, int tp, double kv_tok) {
    replica r = { .g = g, .tp = tp, .kv_tok = kv_tok };
    link_of(k, g * tp, &r.link_bw, &r.link_lat);
    if (tp > 1) link_of(k, tp, &r.tp_bw, &r.tp_lat);
    return r;
}

/* Seconds of one decode step of B rows on replica r at context ctx: the larger of its bytes over
 * the bandwidth and its FLOPs over the peak (*bw_bound says which), plus its communication. */
static double decode_step(const trill_cluster *k, const model_costs *mc, const replica *r, double B, double ctx, bool *bw_bound) {
    const int G = r->g * r->tp;
    const double b = B / r->g; /* a device's rows (tensor parallelism: each of a group's devices has its group's rows) */
    /* each MoE layer's experts this step: those any of the replica's B rows picks, in expectation */
    const double touched = mc->E ? mc->E * (1 - pow(1 - (double)mc->K / mc->E, B)) : 0;
    const double bytes = mc->dense_bytes + mc->moe_layers * touched / G * mc->expert_bytes + b * ctx * r->kv_tok;
    const double flops = b * (2 * mc->active_ne + mc->att_decode * ctx) / r->tp;
    const double tb = bytes / (k->memory_bw_gbs * 1e9 * k->decode_bw_util), tc = flops / (k->bf16_tflops * 1e12 * k->decode_mfu);
    double step = tb > tc ? tb : tc;
    *bw_bound = tb >= tc;
    /* expert parallelism: each MoE layer sends its rows' hidden states (bf16) to their k experts and back */
    step += mc->moe_layers * alltoall2_s(r->g, b * mc->K * mc->H * 2, r->link_bw, r->link_lat);
    if (r->tp > 1) /* tensor parallelism: two all-reduces a layer (bf16); across nodes when tp exceeds a node */
        step += 2.0 * mc->layers * allreduce_s(r->tp, b * mc->H * 2, r->tp_bw, r->tp_lat);
    return step;
}

/* Seconds to prefill and decode per_rep rollouts on replica r, all started at once; the samples
 * of a prompt (n of them) share its prefill (src/infer/kvcache.h: its blocks, prefilled once). */
static void gen_wave(const trill_cluster *k, const model_costs *mc, const trill_plan_workload *w, int max_new, const replica *r, double per_rep,
                     double n, trill_plan_time *t) {
    /* prefill: compute-bound, plus with tensor parallelism two all-reduces a layer of each prompt
     * token's hidden state (bf16) */
    const double P = w->prompt_len, prompts = per_rep / n;
    const double pf = prompts * (2 * (mc->active_ne - mc->head) * P + 2 * mc->head + mc->att_decode * P * P / 2);
    t->prefill_s = pf / (r->g * r->tp * k->bf16_tflops * 1e12 * k->prefill_mfu);
    if (r->tp > 1) t->prefill_s += 2.0 * mc->layers * allreduce_s(r->tp, prompts / r->g * P * mc->H * 2, r->tp_bw, r->tp_lat);
    /* decode: step by step, the rows still running (in expectation) */
    double sec = 0, bound_bw = 0;
    int steps = 0;
    for (int s = 1; s <= max_new; s++) {
        const double B = per_rep * running(w->spread, w->response_len, max_new, s); /* rows of the replica */
        if (B < 1e-9) break;
        steps++;
        bool bw;
        sec += decode_step(k, mc, r, B, P + s, &bw);
        bound_bw += bw;
    }
    t->decode_s = sec;
    t->decode_steps = steps;
    t->decode_bound_bw = steps ? bound_bw / steps : 0;
    t->gen_s = t->prefill_s + t->decode_s;
}

/* Seconds to generate n_seq rollouts (n a prompt) on `replicas` generators of g x tp devices
 * each, the batch shared between them, each device's KV cache holding kv_tokens. The generator
 * batches continuously (src/infer/engine_requests.c: a rollout starts when the cache has room,
 * blocks are taken as it grows): when a replica's rollouts do not all fit at once, its caches run
 * full, C rollouts at a time, C = g x kv_tokens / (P / n + a) (a prompt's blocks shared by its n
 * samples; a the mean age of a running rollout, sum t S(t) / sum S(t), S the share still running
 * at step t), until the last C of them run out as one wave. */
static void gen_time(const trill_cluster *k, const model_costs *mc, const trill_plan_workload *w, int max_new, double kv_tok, double kv_tokens,
                     double n_seq, double n, int replicas, int g, int tp, trill_plan_time *t) {
    const replica r = replica_of(k, g, tp, kv_tok);
    double len = 0, age = 0; /* a response's mean length (cut at max_new), a running one's mean age */
    for (int s = 1; s <= max_new; s++) {
        const double S = running(w->spread, w->response_len, max_new, s);
        len += S, age += s * S;
    }
    age = len > 0 ? age / len : 0;
    const double per_rep = n_seq / replicas, C = g * kv_tokens / (w->prompt_len / n + age);
    if (!(kv_tokens > 0) || per_rep <= C) { /* all at once (no cache at all: the memory figures refuse it) */
        gen_wave(k, mc, w, max_new, &r, per_rep, n, t);
        t->gen_rollouts = t->gen_concurrent = per_rep;
        return;
    }
    gen_wave(k, mc, w, max_new, &r, C, n, t); /* the last C */
    t->prefill_s *= per_rep / C;           /* every prompt's, once */
    bool bw;
    const double full = (per_rep - C) * len / C; /* steps with the caches full, before the last wave */
    const double step = decode_step(k, mc, &r, C, w->prompt_len + age, &bw);
    t->decode_bound_bw = (t->decode_bound_bw * t->decode_steps + (bw ? full : 0)) / (t->decode_steps + full);
    t->decode_s += full * step;
    t->decode_steps += (int)lround(full);
    t->gen_s = t->prefill_s + t->decode_s;
    t->gen_rollouts = per_rep;
    t->gen_concurrent = C;
}

/* Seconds of the trainer's work on one step's rollouts: the log-prob pass, the reference's (a KL
 * coefficient), each minibatch's forward and backward (activation gradients through the frozen
 * base; the adapters' own are small), a recomputed forward, and the communication of ep, tp and
 * dp (docs/plan.md). */
static void train_time(const trill_config *c, const trill_run_config *rc, const trill_cluster *k, const model_costs *mc,
                       const trill_plan_workload *w, double n_seq, int devices, int dp, int ep, int tp, double lora_dev_bytes,
                       trill_plan_time *t) {
    const double T = n_seq * (w->prompt_len + w->response_len), ctx = (w->prompt_len + w->response_len) / 2;
    const double fwd = 2 * mc->active_ne * T + mc->att_train * ctx * T;
    /* the forward and the backward (activation gradients; LoRA's own are small); the old log-probs
     * come from the first minibatch's forward unless there are several minibatches or KL is a
     * reward (a pre-pass), the reference's from a pass with the adapters off (src/rl/exec/trainer.c) */
    const bool kl_reward = rc->algo.kl_coef > 0 && rc->algo.kl_mode == TRILL_KL_REWARD;
    const double passes = 2 + (rc->algo.minibatches > 1 || kl_reward) + (rc->algo.kl_coef > 0) + rc->trainer.recompute + w->full;
    t->train_flops = passes * fwd;
    t->train_tokens = T;
    double sec = t->train_flops / (devices * k->bf16_tflops * 1e12 * k->train_mfu);
    double comm = 0, bw, lat;
    const double T_dev = T / dp; /* a data-parallel group's tokens */
    if (ep > 1) { /* all-to-alls: each token's hidden state (fp32) to its k experts and back, every pass */
        link_of(k, ep * tp, &bw, &lat);
        comm += passes * mc->moe_layers * alltoall2_s(ep, T_dev / ep * mc->K * mc->H * 4, bw, lat);
    }
    if (tp > 1) { /* two all-reduces a layer, forward and backward */
        link_of(k, tp, &bw, &lat);
        comm += (passes + 1) * 2 * c->num_hidden_layers * allreduce_s(tp, T_dev / ep * mc->H * 4, bw, lat);
    }
    if (dp > 1) { /* the adapters' gradients, once a minibatch */
        link_of(k, dp * ep * tp, &bw, &lat);
        comm += rc->algo.minibatches * allreduce_s(dp, lora_dev_bytes, bw, lat);
    }
    t->train_comm_s = comm;
    t->train_s = sec + comm;
}

/* Rows of lm_head and log-softmax the trainer computes at a time: LOGIT_CHUNK of
 * src/model/forward_internal.h (the full [T, V] logits are never held). */
enum { TRAIN_LOGIT_ROWS = 256 };

/* The fraction of a device's memory a generator leaves for its step buffers and the runtime
 * (vLLM's default gpu_memory_utilization is 0.9). */
#define GEN_RESERVE 0.10

trill_status trill_plan_make(const trill_config *c, const trill_run_config *rc, const trill_cluster *k, const trill_plan_workload *wl,
                             trill_plan *out) {
    memset(out, 0, sizeof *out);
    out->workload = wl ? *wl
                       : (trill_plan_workload){ .prompt_len = rc->data.max_prompt_tokens / 4.0, .response_len = rc->generator.max_new_tokens / 2.0,
                                                .spread = TRILL_SPREAD_UNIFORM };
    if (!(out->workload.prompt_len >= 1) || !(out->workload.response_len >= 1) || out->workload.response_len > rc->generator.max_new_tokens)
        return trill_error(TRILL_ERR_INVALID, "plan: prompts of %g tokens and responses of %g: each must be at least 1, responses at most generator.max_new_tokens (%d)",
                           out->workload.prompt_len, out->workload.response_len, rc->generator.max_new_tokens);
    trill_lora_config lora = rc->trainer.lora; /* resolved once: the counts and the bytes adapt the same weights */
    trill_status st = out->workload.full ? TRILL_OK : trill_lora_config_resolve(c, &lora);
    if (!st) st = trill_plan_count(c, out->workload.full ? NULL : &lora, &out->counts);
    if (st) return st;
    const int dp = rc->parallel.trainer.dp, ep = rc->parallel.trainer.ep, tp = rc->parallel.trainer.tp;
    const int replicas = rc->parallel.generator.replicas, gen_ep = replicas ? rc->parallel.generator.ep : 1;
    const int gen_tp = out->workload.gen_tp > 1 ? out->workload.gen_tp : 1;
    if (gen_tp > 1 && !replicas)
        return trill_error(TRILL_ERR_INVALID, "plan: generators of %d tensor-parallel devices need devices of their own: set parallel.generator.replicas "
                                              "(without replicas the trainer's ranks generate, as trill train does, without tensor parallelism)", gen_tp);
    out->trainer_devices = dp * ep * tp;
    out->generator_devices = replicas * gen_ep * gen_tp;
    const int devices = k->nodes * k->devices_per_node;
    if (out->trainer_devices + out->generator_devices > devices)
        return trill_error(TRILL_ERR_INVALID, "plan: the layout needs %d trainer devices (dp %d x ep %d x tp %d) and %d generator devices (%d replicas x ep %d x tp %d), "
                                              "%d in all; the cluster has %d (%d nodes x %d)",
                           out->trainer_devices, dp, ep, tp, out->generator_devices, replicas, gen_ep, gen_tp, out->trainer_devices + out->generator_devices,
                           devices, k->nodes, k->devices_per_node);
    mem_walk w = { .lora_cfg = lora, .tp = tp, .ep = ep, .gen_ep = gen_ep, .gen_tp = gen_tp, .gen_format = rc->generator.dtype, .full = out->workload.full };
    trill_arch_walk(c, mem_tensor, &w);

    trill_plan_memory *m = &out->memory;
    m->base = out->workload.full ? 0 : w.base; /* full: the fp32 master weights are the model ("adapters" below) */
    m->adapters = 4 * w.lora; /* fp32 values */
    m->grads = 4 * w.lora;
    m->optimizer = 8 * w.lora; /* AdamW's two moments */
    /* activations of one micro-batch: every layer's floats per token without recomputation; with
     * it, each layer's input and one layer's floats (the one being recomputed) */
    const double T = rc->trainer.micro_batch_tokens;
    double per_token = 0, widest = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const double fl = layer_floats(c, l);
        per_token += rc->trainer.recompute ? c->hidden_size : fl;
        widest = fl > widest ? fl : widest;
    }
    if (rc->trainer.recompute) per_token += widest;
    m->activations = 4 * T * per_token / tp;
    /* the logits and their gradient, TRAIN_LOGIT_ROWS rows at a time (the trainer never holds more) */
    m->logits = 2 * 4 * fmin(T, TRAIN_LOGIT_ROWS) * (double)(c->num_labels > 0 ? c->num_labels : c->vocab_size) / tp;
    m->trainer_total = m->base + m->adapters + m->grads + m->optimizer + m->activations + m->logits;
    m->trainer_fits = m->trainer_total <= k->memory_gb * 1e9;

    const double dev = k->memory_gb * 1e9;
    m->gen_weights = w.gen_weights;
    m->gen_reserve = GEN_RESERVE * dev;
    m->kv_bytes_per_token = kv_bytes_per_token(c, rc->generator.dtype == TRILL_GEN_F32 ? 4 : 2, gen_tp);
    const double room = dev - m->gen_weights - m->gen_reserve;
    m->kv_cache = room > 0 ? room : 0;
    m->kv_tokens = m->kv_bytes_per_token > 0 ? (int64_t)(m->kv_cache / m->kv_bytes_per_token) : 0;
    m->gen_total = m->gen_weights + m->gen_reserve + m->kv_cache;
    m->generator_fits = room > 0;

    /* the weight sync: adapters in fp32 (what trill_engine_update_adapter takes), or the merged
     * weights in the generator's format; colocated (no replicas): a copy in the device's memory
     * (read and write); else a pipelined broadcast over the slowest link the replicas sit
     * behind */
    trill_plan_sync *s = &out->sync;
    s->adapter_bytes = out->workload.full ? 0 : 4.0 * (double)out->counts.sum_lora; /* full: merge is the only sync */
    s->merge_bytes = w.merge_bytes;
    double bw, lat;
    if (!replicas) {
        s->link = "memory";
        bw = k->memory_bw_gbs / 2;
        lat = 0;
    } else if (out->trainer_devices + out->generator_devices <= k->devices_per_node) {
        s->link = "intra-node";
        bw = k->intra_bw_gbs;
        lat = k->intra_latency_us;
    } else {
        s->link = "inter-node";
        bw = k->inter_bw_gbs;
        lat = k->inter_latency_us;
    }
    s->adapter_s = lat * 1e-6 + s->adapter_bytes / (bw * 1e9);
    s->merge_s = lat * 1e-6 + s->merge_bytes / (bw * 1e9);
    if (replicas) { /* every link busy at once: the fewer of the senders and the receivers bound it */
        const int links = out->trainer_devices < out->generator_devices ? out->trainer_devices : out->generator_devices;
        s->merge_p2p_s = lat * 1e-6 + s->merge_bytes / ((double)links * bw * 1e9);
    }

    /* time: the costs a token and a decode step pay, then the three schedules */
    model_costs mc = { .E = c->num_experts, .K = c->num_experts_per_tok, .H = c->hidden_size, .moe_layers = c->n_moe_layers,
                       .layers = c->num_hidden_layers };
    mc.active_ne = (double)(out->counts.sum_active - out->counts.total[TRILL_PLAN_EMBEDDING]);
    mc.head = (double)out->counts.total[TRILL_PLAN_LM_HEAD];
    mc.dense_bytes = w.gen_dense;
    mc.expert_bytes = c->n_moe_layers && c->num_experts ? w.gen_experts / ((double)c->n_moe_layers * c->num_experts) : 0;
    attention_flops(c, &mc.att_decode, &mc.att_train);
    trill_plan_time *t = &out->time;
    const double n_seq = (double)rc->generator.prompts_per_step * rc->generator.n, kv_tok = m->kv_bytes_per_token;
    const int max_new = rc->generator.max_new_tokens, D = out->trainer_devices;
    s->merge_mode = rc->sync.mode == TRILL_WEIGHT_SYNC_MERGE || out->workload.full; /* full fine-tuning has no adapters */
    const double sync_s = s->merge_mode ? s->merge_s : s->adapter_s;
    const double lora_dev = 4 * w.lora;
    double mem_sync = s->merge_mode ? s->merge_bytes : s->adapter_bytes;
    mem_sync /= k->memory_bw_gbs / 2 * 1e9;
    const trill_plan_time zero = { 0 };
    trill_plan_time gen = zero, tr = zero, gen_all = zero, tr_all = zero;
    /* LlamaRL's baseline: every device generates its share of the batch (in generators of the
     * layout's size, parallel.generator.ep devices), then every device trains, then the weights
     * are copied in place */
    const int g_all = rc->parallel.generator.ep > 0 ? rc->parallel.generator.ep : 1; /* without replicas too: the colocated generators' size */
    const int all = D + out->generator_devices, reps = all / (g_all * gen_tp) > 0 ? all / (g_all * gen_tp) : 1;
    gen_time(k, &mc, &out->workload, max_new, kv_tok, (double)m->kv_tokens, n_seq, rc->generator.n, reps, g_all, gen_tp, &gen_all);
    train_time(c, rc, k, &mc, &out->workload, n_seq, all, all / (ep * tp) > 0 ? all / (ep * tp) : 1, ep, tp, lora_dev, &tr_all);
    const double colocated = gen_all.gen_s + tr_all.train_s + mem_sync;
    if (replicas) { /* the generator on its own devices: mode sync waits for each phase, async overlaps them */
        gen_time(k, &mc, &out->workload, max_new, kv_tok, (double)m->kv_tokens, n_seq, rc->generator.n, replicas, gen_ep, gen_tp, &gen);
        train_time(c, rc, k, &mc, &out->workload, n_seq, D, dp, ep, tp, lora_dev, &tr);
        *t = gen;
        t->sync_s = sync_s;
        t->train_s = tr.train_s, t->train_comm_s = tr.train_comm_s, t->train_flops = tr.train_flops, t->train_tokens = tr.train_tokens;
        t->sync_step_s = t->gen_s + t->train_s + sync_s;
        t->async_step_s = t->gen_s > t->train_s + sync_s ? t->gen_s : t->train_s + sync_s;
    } else {
        /* mode sync: every trainer rank generates the whole batch (trill train's sync mode), then
         * they train; mode async (one process): the generator's cores beside the trainer's */
        gen_time(k, &mc, &out->workload, max_new, kv_tok, (double)m->kv_tokens, n_seq, rc->generator.n, 1, 1, 1, &gen);
        train_time(c, rc, k, &mc, &out->workload, n_seq, D, dp, ep, tp, lora_dev, &tr);
        *t = gen;
        t->sync_s = mem_sync;
        t->train_s = tr.train_s, t->train_comm_s = tr.train_comm_s, t->train_flops = tr.train_flops, t->train_tokens = tr.train_tokens;
        t->sync_step_s = t->gen_s + t->train_s + mem_sync;
        /* each executor's rate on its cores: measured for a half-and-half split (the cluster's
         * split rates), else in proportion to its cores */
        const double fg = (double)rc->resources.generator_threads / (rc->resources.generator_threads + rc->resources.trainer_threads);
        const bool halves = rc->resources.generator_threads == rc->resources.trainer_threads;
        const double rg = halves && k->split_gen_rate > 0 ? k->split_gen_rate : fg;
        const double rt = halves && k->split_train_rate > 0 ? k->split_train_rate : 1 - fg;
        const double ga = gen.gen_s / rg, ta = tr.train_s / rt;
        t->async_step_s = ga > ta + mem_sync ? ga : ta + mem_sync;
    }
    /* max_staleness 0: the generator may not run ahead of the trainer (on-policy), nothing overlaps */
    if (rc->async.max_staleness < 1) t->async_step_s = t->sync_step_s;
    t->colocated_step_s = colocated;
    t->colocated_gen_s = gen_all.gen_s, t->colocated_train_s = tr_all.train_s;
    t->gen_tokens = n_seq * out->workload.response_len;
    t->async_speedup = t->sync_step_s / t->async_step_s;
    return TRILL_OK;
}

/* ---- --search ---- */

static void keep_fastest(trill_plan_layout *out, int max, int *n, const trill_plan_layout *l) {
    int at = *n < max ? *n : max; /* where it goes: after every faster one */
    while (at > 0 && out[at - 1].step_s > l->step_s) at--;
    if (at >= max) return;
    const int last = *n < max ? *n : max - 1;
    memmove(out + at + 1, out + at, sizeof *out * (size_t)(last - at));
    out[at] = *l;
    if (*n < max) (*n)++;
}

trill_status trill_plan_search(const trill_config *c, const trill_run_config *rc, const trill_cluster *k, const trill_plan_workload *w,
                               trill_plan_layout *out, int max, int *n_out, int *tried) {
    *n_out = *tried = 0;
    const int devices = k->nodes * k->devices_per_node, E = c->num_experts > 0 ? c->num_experts : 1;
    const int gen_tp = w && w->gen_tp > 1 ? w->gen_tp : 1;
    trill_run_config r = *rc; /* shallow: only the parallel keys change, nothing is freed */
    for (int tp = 1; tp <= k->devices_per_node && tp <= devices; tp *= 2)
        for (int ep = 1; ep * tp <= devices && ep <= E; ep *= 2) {
            if (E % ep) continue;
            for (int dp = 1; dp * ep * tp <= devices; dp *= 2) {
                const int trainer = dp * ep * tp, left = devices - trainer;
                for (int gen_ep = 1; gen_ep <= (left > 0 ? left : 1) && gen_ep <= E; gen_ep *= 2) {
                    if (E % gen_ep) continue;
                    /* replicas: none (colocated, gen_ep 1 only, and no generator tensor
                     * parallelism), or as many as the devices left hold */
                    for (int colocated = 0; colocated < 2; colocated++) {
                        const int replicas = colocated ? 0 : left / (gen_ep * gen_tp);
                        if (colocated ? gen_ep != 1 || gen_tp > 1 : replicas < 1) continue;
                        r.parallel.trainer.dp = dp, r.parallel.trainer.ep = ep, r.parallel.trainer.tp = tp;
                        r.parallel.generator.replicas = replicas, r.parallel.generator.ep = replicas ? gen_ep : 1;
                        trill_plan_layout l = { .dp = dp, .ep = ep, .tp = tp, .replicas = replicas, .gen_ep = replicas ? gen_ep : 1 };
                        (*tried)++;
                        const trill_status st = trill_plan_make(c, &r, k, w, &l.plan);
                        if (st) return st;
                        const trill_plan_memory *m = &l.plan.memory;
                        if (!m->trainer_fits || !m->generator_fits) continue;
                        if ((double)m->kv_tokens < w->prompt_len + rc->generator.max_new_tokens) continue;
                        l.step_s = rc->mode == TRILL_MODE_ASYNC ? l.plan.time.async_step_s : l.plan.time.sync_step_s;
                        keep_fastest(out, max, n_out, &l);
                    }
                }
            }
        }
    return TRILL_OK;
}
