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

/* ---- counts ---- */

typedef struct count_walk {
    trill_plan_counts *out;
    const trill_config *c;
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
    count_walk w = { .out = out, .c = c };
    if (lora) {
        const trill_family *f = trill_family_of(c);
        unsigned targets = lora->targets;
        if (targets & TRILL_LORA_ALL_LINEAR) targets = (targets & ~TRILL_LORA_ALL_LINEAR) | f->all_linear;
        if (lora->rank < 1) return trill_error(TRILL_ERR_INVALID, "trainer.lora.rank: %d must be at least 1", lora->rank);
        if (!targets) return trill_error(TRILL_ERR_INVALID, "trainer.lora.target_modules: no module selected");
        for (int i = 0; i < 31; i++)
            if (targets & ~f->lora_targets & (1u << i))
                return trill_error(TRILL_ERR_UNSUPPORTED, "trainer.lora.target_modules: %s: a %s model has no such module",
                                   trill_lora_target_peft_name(i), trill_config_model_type(c));
        w.targets = targets;
        w.rank = lora->rank;
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

static void from_profile(const profile *p, trill_cluster *k) {
    *k = (trill_cluster){ .nodes = 1, .devices_per_node = p->devices_per_node, .memory_gb = p->mem, .bf16_tflops = p->bf16, .fp8_tflops = p->fp8,
                          .memory_bw_gbs = p->bw, .intra_bw_gbs = p->intra, .inter_bw_gbs = p->inter, .intra_latency_us = p->lat_intra,
                          .inter_latency_us = p->lat_inter };
    snprintf(k->name, sizeof k->name, "%s", p->name);
    snprintf(k->source, sizeof k->source, "%s", p->source);
}

/* A cluster file's keys: where each goes, its least value, and whether it must be given. */
typedef struct cluster_key { const char *key; size_t at; bool integer, required; double min; const char *doc; } cluster_key;
#define DKEY(k, req, lo, doc) { #k, offsetof(trill_cluster, k), false, req, lo, doc }
#define IKEY(k, req, lo, doc) { #k, offsetof(trill_cluster, k), true, req, lo, doc }
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
};
enum { N_CLUSTER_KEYS = sizeof cluster_keys / sizeof cluster_keys[0] };

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
    memset(k, 0, sizeof *k);
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
        const char *key = (const char *)kn->data.scalar.value, *val = (const char *)vn->data.scalar.value;
        if (!strcmp(key, "name") || !strcmp(key, "source")) {
            snprintf(!strcmp(key, "name") ? k->name : k->source, !strcmp(key, "name") ? sizeof k->name : sizeof k->source, "%s", val);
            continue;
        }
        int i = 0;
        while (i < N_CLUSTER_KEYS && strcmp(cluster_keys[i].key, key)) i++;
        if (i == N_CLUSTER_KEYS) {
            st = trill_error(TRILL_ERR_INVALID,
                             "%s:%zu: %s: unknown field (known: name, source, nodes, devices_per_node, memory_gb, bf16_tflops, fp8_tflops, "
                             "memory_bw_gbs, intra_bw_gbs, inter_bw_gbs, intra_latency_us, inter_latency_us)",
                             path, line, key);
            goto done;
        }
        const cluster_key *ck = &cluster_keys[i];
        char *end;
        const double v = strtod(val, &end);
        if (end == val || *end || !isfinite(v) || v < ck->min || (ck->integer && (v != floor(v) || v > 1e9))) {
            st = trill_error(TRILL_ERR_INVALID, "%s:%zu: %s: '%s' is not %s at least %g (%s)", path, line, key, val, ck->integer ? "an integer" : "a number",
                             ck->min, ck->doc);
            goto done;
        }
        if (ck->integer) *(int *)((char *)k + ck->at) = (int)v;
        else *(double *)((char *)k + ck->at) = v;
        seen[i] = true;
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
    const trill_config *c;
    const trill_run_config *rc;
    unsigned targets;
    int tp, ep, gen_ep;
    trill_gen_format gen_format;
    double base, lora, gen_weights, merge_bytes;
} mem_walk;

/* The share of tensor t a device keeps: a routed expert's 1 in ep, a tensor-parallel split's 1 in
 * tp, the rest whole. */
static double share(const trill_param *t, int tp, int ep) {
    if (t->expert >= 0 || module_of(t) == TRILL_PLAN_ROUTED_EXPERTS) return 1.0 / ep;
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
    if (t->lora_target >= 0 && (w->targets & (1u << t->lora_target)) && t->ndim == 2)
        w->lora += s * (double)w->rc->trainer.lora.rank * (double)(t->shape[0] + t->shape[1]);
    const double g = gen_bytes(t, w->gen_format);
    w->merge_bytes += g;
    w->gen_weights += g * (t->expert >= 0 || module_of(t) == TRILL_PLAN_ROUTED_EXPERTS ? 1.0 / w->gen_ep : 1.0);
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

/* KV-cache bytes a token takes in every attention layer (elem bytes an element): GQA's K and V,
 * MLA's latent and rope key; Gated DeltaNet layers keep a state per sequence instead. */
static double kv_bytes_per_token(const trill_config *c, int elem) {
    double b = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const trill_layer_desc d = trill_layer_desc_of(c, l);
        if (d.attention == TRILL_ATTENTION_GDN) continue;
        b += d.attention == TRILL_ATTENTION_MLA ? (double)(c->kv_lora_rank + c->qk_rope_head_dim) * elem
                                                : 2.0 * c->num_key_value_heads * c->head_dim * elem;
    }
    return b;
}

/* The fraction of a device's memory a generator leaves for its step buffers and the runtime
 * (vLLM's default gpu_memory_utilization is 0.9). */
#define GEN_RESERVE 0.10

trill_status trill_plan_make(const trill_config *c, const trill_run_config *rc, const trill_cluster *k, trill_plan *out) {
    memset(out, 0, sizeof *out);
    trill_status st = trill_plan_count(c, &rc->trainer.lora, &out->counts);
    if (st) return st;
    const int dp = rc->parallel.trainer.dp, ep = rc->parallel.trainer.ep, tp = rc->parallel.trainer.tp;
    const int replicas = rc->parallel.generator.replicas, gen_ep = replicas ? rc->parallel.generator.ep : 1;
    out->trainer_devices = dp * ep * tp;
    out->generator_devices = replicas * gen_ep;
    const int devices = k->nodes * k->devices_per_node;
    if (out->trainer_devices + out->generator_devices > devices)
        return trill_error(TRILL_ERR_INVALID, "plan: the layout needs %d trainer devices (dp %d x ep %d x tp %d) and %d generator devices (%d replicas x ep %d), "
                                              "%d in all; the cluster has %d (%d nodes x %d)",
                           out->trainer_devices, dp, ep, tp, out->generator_devices, replicas, gen_ep, out->trainer_devices + out->generator_devices,
                           devices, k->nodes, k->devices_per_node);
    const trill_family *f = trill_family_of(c);
    unsigned targets = rc->trainer.lora.targets;
    if (targets & TRILL_LORA_ALL_LINEAR) targets = (targets & ~TRILL_LORA_ALL_LINEAR) | f->all_linear;
    mem_walk w = { .c = c, .rc = rc, .targets = targets, .tp = tp, .ep = ep, .gen_ep = gen_ep, .gen_format = rc->generator.dtype };
    trill_arch_walk(c, mem_tensor, &w);

    trill_plan_memory *m = &out->memory;
    m->base = w.base;
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
    m->logits = 2 * 4 * T * (double)(c->num_labels > 0 ? c->num_labels : c->vocab_size) / tp; /* the logits and their gradient */
    m->trainer_total = m->base + m->adapters + m->grads + m->optimizer + m->activations + m->logits;
    m->trainer_fits = m->trainer_total <= k->memory_gb * 1e9;

    const double dev = k->memory_gb * 1e9;
    m->gen_weights = w.gen_weights;
    m->gen_reserve = GEN_RESERVE * dev;
    m->kv_bytes_per_token = kv_bytes_per_token(c, rc->generator.dtype == TRILL_GEN_F32 ? 4 : 2);
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
    s->adapter_bytes = 4.0 * (double)out->counts.sum_lora;
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
    return TRILL_OK;
}
