/* trill plan: what a model, an RL configuration and a cluster need, before anyone rents the
 * cluster. Counted exactly from the model family's tensor table (src/arch/) where counting
 * suffices: parameters by module, LoRA's trainable parameters, the bytes each device holds and
 * the bytes a weight sync ships; sync seconds from the cluster's links by a stated model
 * (docs/plan.md). */
#ifndef TRILL_PLAN_H
#define TRILL_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "trill/config.h"
#include "trill/error.h"
#include "trill/lora.h"

struct trill_run_config;

/* Where a parameter belongs. */
typedef enum trill_plan_module {
    TRILL_PLAN_EMBEDDING,      /* the token embeddings */
    TRILL_PLAN_ATTENTION,      /* projections, their norms and biases, sinks; Gated DeltaNet's */
    TRILL_PLAN_DENSE_MLP,      /* the dense layers' MLPs */
    TRILL_PLAN_ROUTED_EXPERTS, /* every routed expert */
    TRILL_PLAN_SHARED_EXPERTS, /* shared experts (and Qwen3-Next's shared-expert gate) */
    TRILL_PLAN_ROUTER,         /* routers and their selection biases */
    TRILL_PLAN_NORMS,          /* the layers' input and post-attention norms, the final norm */
    TRILL_PLAN_LM_HEAD,        /* lm_head (or a classifier's score head) */
    TRILL_PLAN_N_MODULES
} trill_plan_module;

/* "embedding", "attention", ... */
const char *trill_plan_module_name(trill_plan_module m);

/* Parameters by module: all of them, those one token touches (its top-k routed experts), and
 * the LoRA A and B values of the adapted weights (rank r: r (in + out) each). */
typedef struct trill_plan_counts {
    int64_t total[TRILL_PLAN_N_MODULES], active[TRILL_PLAN_N_MODULES], lora[TRILL_PLAN_N_MODULES];
    int64_t sum_total, sum_active, sum_lora;
    int64_t adapted;   /* weights LoRA adapts (each routed expert's its own) */
    int64_t trainable; /* sum_lora with adapters, else every trainable parameter (full fine-tuning) */
} trill_plan_counts;

/* Counts for config c; lora NULL: full fine-tuning (its targets resolved for c's family, as
 * trill_lora_create does: "all-linear" included; a module c lacks is refused). */
trill_status trill_plan_count(const trill_config *c, const trill_lora_config *lora, trill_plan_counts *out);

/* A cluster: identical devices, `devices_per_node` a node. Rates are per device and per
 * direction. */
typedef struct trill_cluster {
    char name[64];
    char source[256];       /* where the figures come from (a datasheet, a measurement) */
    int nodes, devices_per_node;
    double memory_gb;       /* a device's memory (10^9 bytes) */
    double bf16_tflops, fp8_tflops; /* dense peak (10^12 FLOP/s); fp8 0: none */
    double memory_bw_gbs;   /* a device's memory bandwidth (10^9 B/s) */
    double intra_bw_gbs, inter_bw_gbs; /* a device's link within its node, and out of it */
    double intra_latency_us, inter_latency_us;
    /* what trill's engines reach of those peaks on such a device (stated assumptions for the
     * shipped GPU profiles, measured for a local one: docs/plan.md) */
    double train_mfu;       /* training's share of the bf16 peak */
    double prefill_mfu;     /* prefill's */
    double decode_mfu;      /* a compute-bound decode step's */
    double decode_bw_util;  /* a bandwidth-bound decode step's share of the memory bandwidth */
    /* async with no generator replicas (trill's executors sharing a CPU's cores half and half):
     * the rate the generator and the trainer each reach on half the cores, as a share of the whole
     * device's (0: half) */
    double split_gen_rate, split_train_rate;
} trill_cluster;

/* The shipped profiles' names, "h100-sxm, h800, ...", for messages. */
const char *trill_cluster_profile_names(void);
/* A shipped profile by name, or a YAML file of the fields above (every one required but name,
 * source and fp8_tflops; an unknown key or a bad value is refused naming the file, the key and
 * what it expects). */
trill_status trill_cluster_load(const char *profile_or_path, trill_cluster *out);

/* Bytes a device holds (10^9 B = 1 GB in the printout). */
typedef struct trill_plan_memory {
    /* the trainer, per device of its dp x ep x tp ranks */
    double base, adapters, grads, optimizer, activations, logits, trainer_total;
    /* the generator, per device of a replica's ep ranks: weights, the cache the rest holds */
    double gen_weights, gen_reserve, kv_cache, gen_total;
    double kv_bytes_per_token;
    int64_t kv_tokens;      /* tokens the cache holds (0 when the weights leave no room) */
    bool trainer_fits, generator_fits;
} trill_plan_memory;

/* What a weight sync ships per version, and how long it takes. */
typedef struct trill_plan_sync {
    double adapter_bytes;   /* sync.mode adapter: every LoRA A and B in fp32 */
    double merge_bytes;     /* sync.mode merge: the generator's weights in its format */
    double adapter_s, merge_s;
    double merge_p2p_s;     /* merge sent point to point from every trainer device to generator devices at once
                               (not trill's broadcast: what a sharded transfer would reach; replicas only) */
    const char *link;       /* which link the model used: "memory", "intra-node", "inter-node" */
    bool merge_mode;        /* the sync the step times use: merge (sync.mode merge, or full fine-tuning), else adapter */
} trill_plan_sync;

/* The rollouts' lengths: a prompt's mean tokens, a response's mean, and how responses spread up
 * to generator.max_new_tokens (a sync step waits for its longest). */
typedef enum trill_plan_spread { TRILL_SPREAD_FIXED, TRILL_SPREAD_UNIFORM, TRILL_SPREAD_EXPONENTIAL } trill_plan_spread;
typedef struct trill_plan_workload {
    double prompt_len, response_len;
    trill_plan_spread spread;
    /* train every weight instead of adapters (full fine-tuning, as other RL frameworks do; trill
     * train trains LoRA): fp32 master weights, gradients and AdamW's moments of every trainable
     * parameter, and a pass more for the weights' gradients */
    bool full;
    /* generators of gen_tp tensor-parallel devices each (0 or 1: none), as vLLM's and SGLang's
     * tensor parallelism splits them, to compare with other frameworks (trill's generator has no
     * tensor parallelism): each replica is parallel.generator.ep x gen_tp devices; needs replicas */
    int gen_tp;
} trill_plan_workload;
const char *trill_plan_spread_name(trill_plan_spread s);

/* Seconds of one RL step by the roofline of docs/plan.md. */
typedef struct trill_plan_time {
    double prefill_s, decode_s, gen_s; /* one step's batch on the generator's devices */
    double train_s, train_comm_s;      /* on the trainer's devices, its communication included */
    double sync_s;                     /* the weight sync of the configured sync.mode */
    double sync_step_s;                /* mode sync on this layout: generate, train, sync in turn */
    double async_step_s;               /* mode async: generation beside training (steady state, max_staleness >= 1) */
    double colocated_step_s;           /* sync with every device generating, then training (LlamaRL's baseline) */
    double colocated_gen_s, colocated_train_s; /* its generation and its training */
    double async_speedup;              /* sync_step_s / async_step_s */
    double gen_tokens, train_tokens, train_flops;
    int decode_steps;
    double gen_rollouts;               /* a generator replica's share of the batch */
    double gen_concurrent;             /* rollouts it runs at once: gen_rollouts, or what its KV caches hold */
    double decode_bound_bw;            /* the share of decode steps bound by memory bandwidth */
} trill_plan_time;

typedef struct trill_plan {
    trill_plan_counts counts;
    trill_plan_memory memory;
    trill_plan_sync sync;
    trill_plan_time time;
    trill_plan_workload workload;
    int trainer_devices, generator_devices; /* dp ep tp; replicas x ep x gen_tp (0 replicas: the trainer's devices generate) */
} trill_plan;

/* The plan of run configuration rc (its trainer, generator, algo, sync, mode and parallel keys)
 * for model config c on cluster k, with workload w's lengths (NULL: prompts of
 * data.max_prompt_tokens / 4, responses of generator.max_new_tokens / 2 spread uniformly). */
trill_status trill_plan_make(const trill_config *c, const struct trill_run_config *rc, const trill_cluster *k, const trill_plan_workload *w,
                             trill_plan *out);

/* One layout `trill plan --search` tried: trainer dp x ep x tp, generator replicas x ep (0
 * replicas: the trainer's devices generate), and its plan. */
typedef struct trill_plan_layout {
    int dp, ep, tp, replicas, gen_ep;
    double step_s; /* of the configured mode: sync_step_s or async_step_s */
    trill_plan plan;
} trill_plan_layout;

/* Every layout of powers of two that fits cluster k's devices and memory (each trainer and
 * generator device's bytes within its memory, the generator's KV cache holding at least one
 * rollout at full length): trainer tp within a node, ep dividing the routed experts, generator
 * replicas of ep devices on the devices the trainer leaves (or none). The `max` fastest for rc's
 * mode into out[] (fastest first); *n_out of them, *tried the layouts considered. */
trill_status trill_plan_search(const trill_config *c, const struct trill_run_config *rc, const trill_cluster *k, const trill_plan_workload *w,
                               trill_plan_layout *out, int max, int *n_out, int *tried);

#endif
