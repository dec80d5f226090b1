/* The trainer's set-up (trainer_internal.h): its ranks and expert shards, the adapters or full
 * weights it trains, the optimizer, creation, saving and freeing. */
#include "rl/exec/trainer_internal.h"
#include "trill/kernels.h"

/* ---- distribution ---- */

/* The precision the trainer's products run in: trainer.precision, or for auto (the default)
 * bf16 where every trainer rank's CPU has AVX-512 BF16 (trill_kernels_precision_auto), unless
 * the generator computes in f32 (rl: its log-probs are then matched in fp32); fp32 otherwise.
 * The ranks agree, so data-parallel replicas compute alike on a mixed cluster. */
static trill_precision trainer_precision(trill_trainer *t, trill_comm *world, bool rl, trill_status *st) {
    const trill_run_config *c = t->c;
    t->precision_why = "";
    if (c->trainer.precision != TRILL_PRECISION_AUTO) return c->trainer.precision;
    const bool gen_f32 = rl && c->generator.dtype == TRILL_GEN_F32;
    uint64_t cpu_fp32 = trill_kernels_precision_auto() == TRILL_PRECISION_FP32;
    if (world && trill_comm_size(world) > 1) *st = trill_comm_allreduce_max_u64(world, cpu_fp32, &cpu_fp32);
    t->precision_why = cpu_fp32  ? "auto: a trainer CPU without AVX-512 BF16"
                       : gen_f32 ? "auto: generator.dtype f32"
                                 : "auto: AVX-512 BF16 on every trainer CPU";
    return cpu_fp32 || gen_f32 ? TRILL_PRECISION_FP32 : TRILL_PRECISION_BF16;
}

const char *trill_trainer_precision_note(const trill_trainer *t, char *buf, size_t size) {
    const char *why = t->precision_why ? t->precision_why : "";
    snprintf(buf, size, "%s matmuls%s%s%s", trill_precision_name(trill_model_precision(t->policy)), why[0] ? " [" : "", why, why[0] ? "]" : "");
    return buf;
}

/* The world's ranks as parallel.trainer lays them out: rank = (dp_index * ep + ep_index) * tp +
 * tp_index, so a group of either kind is consecutive ranks and the data ranks' shares stay
 * contiguous per expert-parallel group. */
static trill_status set_up_ranks(trill_trainer *r, trill_comm *world) {
    const trill_run_config *c = r->c;
    r->P = r->tp_size = 1;
    if (!world || trill_comm_size(world) == 1) return TRILL_OK;
    r->data = world;
    const int ep = c->parallel.trainer.ep, tp = c->parallel.trainer.tp, me = trill_comm_rank(world);
    if (ep > 1 && tp > 1)
        return trill_error(TRILL_ERR_UNSUPPORTED, "parallel.trainer: ep %d with tp %d: expert and tensor parallelism together are not built "
                           "(either, with data parallelism, is)", ep, tp);
    if (c->generator.on_policy && (ep > 1 || tp > 1))
        return trill_error(TRILL_ERR_UNSUPPORTED, "generator.on_policy: its scoring engine needs the whole model, and parallel.trainer.%s %d "
                           "shards it (on-policy mode runs with data parallelism only)", ep > 1 ? "ep" : "tp", ep > 1 ? ep : tp);
    trill_status st = TRILL_OK;
    if (ep > 1) {
        r->P = ep;
        r->q = me % ep;
        st = trill_comm_split(world, me / ep, r->q, &r->ep);
        if (!st) st = trill_comm_split(world, r->q, me / ep, &r->edp);
        r->mp = r->ep;
        r->mp_rank = r->q;
    } else if (tp > 1) {
        r->tp_size = tp;
        r->tp_rank = me % tp;
        st = trill_comm_split(world, me / tp, r->tp_rank, &r->tp);
        if (!st) st = trill_comm_split(world, r->tp_rank, me / tp, &r->owned_data); /* the ranks of one trill_rl_trn_share, one per group */
        r->data = r->owned_data;
        r->mp = r->tp;
        r->mp_rank = r->tp_rank;
    }
    return st;
}

/* The policy's shard for this rank (the whole model without model parallelism). */
static trill_shard shard_of(const trill_trainer *r) {
    return (trill_shard){ .ep_rank = r->q, .ep_size = r->P, .tp_rank = r->tp_rank, .tp_size = r->tp_size };
}

/* Under model parallelism: the model's shard joins its group, and (expert parallelism) the
 * gradient buffers of the held experts (one per group rank) and the adapters of every expert are
 * made. */
static trill_status set_up_shards(trill_trainer *r) {
    r->routed = r->lora ? trill_lora_routed_first(r->lora) : r->n_values;
    r->whole = r->lora;
    if (!r->mp) return TRILL_OK;
    trill_status st = r->ep ? trill_model_set_expert_comm(r->policy, r->ep) : trill_model_set_tensor_comm(r->policy, r->tp);
    if (!st && r->ep && !(r->src = trill_calloc((size_t)r->P, sizeof *r->src))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int j = 0; !st && r->ep && j < r->P; j++)
        if (!(r->src[j] = trill_malloc(sizeof(float) * (r->n_values - r->routed + 1))))
            st = trill_error(TRILL_ERR_NOMEM, "out of memory for the experts' gradients");
    r->whole = NULL;
    if (!st) st = trill_lora_create_whole(r->policy, r->lora->config, &r->whole);
    if (!st) st = trill_trainer_gather(r, false);
    return st;
}

/* Copies a tensor laid out as `t` (rows of t->shape[1] at src) to its place in the whole
 * adapter's vector (at base, rows of t->whole_shape[1]), or (to_whole false) back. */
static void copy_slice(const trill_param *t, float *local, float *whole, bool to_whole) {
    for (int64_t i = 0; i < t->shape[0]; i++) {
        float *w = whole + trill_param_whole_row(t, i) * t->whole_shape[1] + t->slice_at[1], *l = local + i * t->shape[1];
        memcpy(to_whole ? w : l, to_whole ? l : w, sizeof(float) * (size_t)t->shape[1]);
    }
}

/* dst (laid out as the whole adapter) = each tensor of the shard's src this rank speaks for at its
 * place there, the rest 0: the group's sum is then the whole adapter's vector. */
static void scatter_whole(const trill_trainer *r, const float *src, float *dst) {
    const trill_lora *l = r->lora;
    memset(dst, 0, sizeof(float) * l->n_global);
    for (size_t k = 0; k < l->n_tensors; k++) {
        const trill_param *t = &l->tensors[k];
        const size_t at = (size_t)(t->data - l->params);
        if (trill_rl_trn_speaks_for(r, t, at)) copy_slice(t, (float *)src + at, dst + l->global_offset[k], true);
    }
}

/* The shard's part of a vector laid out as the whole adapter. */
static void slice_whole(const trill_lora *l, const float *whole, float *dst) {
    for (size_t k = 0; k < l->n_tensors; k++)
        copy_slice(&l->tensors[k], dst + (l->tensors[k].data - l->params), (float *)whole + l->global_offset[k], false);
}

trill_status trill_trainer_gather(trill_trainer *r, bool optimizer) {
    if (!r->mp) return TRILL_OK;
    scatter_whole(r, r->lora->params, r->whole->params);
    trill_status st = trill_comm_allreduce_f32(r->mp, r->whole->params, r->whole->n_params);
    if (st || !optimizer) return st;
    if (!r->whole_opt && (st = trill_adamw_create(r->lora->n_global, r->opt->config, &r->whole_opt))) return st;
    r->whole_opt->config = r->opt->config;
    r->whole_opt->step = r->opt->step;
    scatter_whole(r, r->opt->exp_avg, r->whole_opt->exp_avg);
    scatter_whole(r, r->opt->exp_avg_sq, r->whole_opt->exp_avg_sq);
    st = trill_comm_allreduce_f32(r->mp, r->whole_opt->exp_avg, r->lora->n_global);
    if (!st) st = trill_comm_allreduce_f32(r->mp, r->whole_opt->exp_avg_sq, r->lora->n_global);
    return st;
}

/* The optimizer state of the adapters from `prefix` (a checkpoint's: the whole adapter's, which a
 * shard takes its part of), with this config's weight decay. */
static trill_status load_optimizer(trill_trainer *r, const char *prefix) {
    const size_t n_file = r->lora ? r->lora->n_global : r->n_values;
    trill_adamw *whole = NULL;
    trill_status st = trill_adamw_load(prefix, n_file, &whole);
    if (!st && r->mp) {
        if (!(st = trill_adamw_create(r->n_values, whole->config, &r->opt))) {
            r->opt->step = whole->step;
            slice_whole(r->lora, whole->exp_avg, r->opt->exp_avg);
            slice_whole(r->lora, whole->exp_avg_sq, r->opt->exp_avg_sq);
        }
        trill_adamw_free(whole);
    } else if (!st) {
        r->opt = whole;
    }
    if (!st) r->opt->config.weight_decay = r->c->trainer.weight_decay; /* the moments are the checkpoint's, the settings this config's */
    return st;
}

static trill_status new_optimizer(trill_trainer *r) {
    trill_adamw_config ac = trill_adamw_defaults();
    ac.weight_decay = r->c->trainer.weight_decay;
    return trill_adamw_create(r->n_values, ac, &r->opt);
}

/* The adapters as the trainable values, and their gradient buffers. */
static trill_status use_adapters(trill_trainer *r) {
    r->lora->enabled = true;
    trill_model_attach_lora(r->policy, r->lora);
    r->values = r->lora->params;
    r->n_values = r->lora->n_params;
    r->lora_grads = trill_calloc(r->n_values ? r->n_values : 1, sizeof(float));
    r->leaf = trill_malloc(sizeof(float) * (r->n_values ? r->n_values : 1));
    return r->lora_grads && r->leaf ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
}

/* Full fine-tuning: every weight trains, fp32, without decay on the norm weights (1-D tensors). */
static trill_status make_full(trill_trainer *r) {
    r->values = r->policy->params;
    r->n_values = r->policy->n_params;
    r->no_decay = trill_calloc(r->n_values ? r->n_values : 1, 1);
    r->lora_grads = trill_calloc(r->n_values ? r->n_values : 1, sizeof(float));
    r->leaf = trill_malloc(sizeof(float) * (r->n_values ? r->n_values : 1));
    if (!r->no_decay || !r->lora_grads || !r->leaf) return trill_error(TRILL_ERR_NOMEM, "out of memory for the gradients of %zu weights", r->n_values);
    for (size_t t = 0; t < r->policy->n_tensors; t++)
        if (r->policy->tensors[t].ndim == 1) memset(r->no_decay + (r->policy->tensors[t].data - r->policy->params), 1, r->policy->tensors[t].numel);
    return TRILL_OK;
}

trill_status trill_trainer_create_sft(const trill_run_config *c, const char *model_dir, const char *resume_dir, trill_comm *world,
                                         trill_trainer **out) {
    trill_trainer *t = trill_calloc(1, sizeof *t);
    if (!t) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    t->c = c;
    const bool full = c->sft.mode == TRILL_SFT_FULL;
    trill_status st = set_up_ranks(t, world);
    if (!st && full && (t->P > 1 || t->tp_size > 1))
        st = trill_error(TRILL_ERR_UNSUPPORTED, "sft.mode full: full fine-tuning with parallel.trainer.%s %d is not built (adapters train "
                         "under model parallelism: sft.mode lora)", t->P > 1 ? "ep" : "tp", t->P > 1 ? t->P : t->tp_size);
    const trill_precision prec = st ? TRILL_PRECISION_FP32 : trainer_precision(t, world, false, &st); /* before any rank can fail alone */
    const trill_shard shard = shard_of(t);
    /* LoRA: a frozen base in the checkpoint's dtype (a shard of it under expert parallelism); full:
     * fp32 master weights (a resumed run's own) */
    if (!st)
        st = trill_model_load_shard(full && resume_dir ? resume_dir : model_dir, full ? TRILL_STORE_F32 : TRILL_STORE_CHECKPOINT, &shard,
                                    &t->policy);
    if (!st) trill_model_set_precision(t->policy, prec);
    if (!st && !full) st = resume_dir ? trill_lora_load(t->policy, resume_dir, &t->lora) : trill_lora_create(t->policy, c->trainer.lora, c->seed, &t->lora);
    if (!st) st = full ? make_full(t) : use_adapters(t);
    char *prefix = !st && resume_dir ? trill_path_join(resume_dir, "optimizer") : NULL;
    if (!st && resume_dir) st = prefix ? load_optimizer(t, prefix) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    free(prefix);
    if (!st && !resume_dir) st = new_optimizer(t);
    if (!st) st = set_up_shards(t);
    if (st) {
        trill_trainer_free(t);
        return st;
    }
    *out = t;
    return TRILL_OK;
}

/* ---- set-up ---- */

static trill_status make_trainable(trill_trainer *r, const char *ckpt) {
    const trill_run_config *c = r->c;
    trill_status st;
    char path[4200];
    if (ckpt) {
        snprintf(path, sizeof path, "%s/adapter", ckpt);
        st = trill_lora_load(r->policy, path, &r->lora);
    } else {
        st = trill_lora_create(r->policy, c->trainer.lora, c->seed, &r->lora);
    }
    if (!st) st = use_adapters(r);
    if (!st && ckpt) {
        snprintf(path, sizeof path, "%s/optimizer", ckpt);
        st = load_optimizer(r, path);
    }
    if (!st && !ckpt) st = new_optimizer(r);
    return st;
}

trill_status trill_trainer_create(const trill_run_config *c, const char *model_dir, const char *ckpt, trill_comm *world, trill_trainer **out) {
    trill_trainer *t = trill_calloc(1, sizeof *t);
    if (!t) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    t->c = c;
    trill_status st = set_up_ranks(t, world);
    const trill_precision prec = st ? TRILL_PRECISION_FP32 : trainer_precision(t, world, true, &st); /* before any rank can fail alone */
    const trill_shard shard = shard_of(t);
    if (!st) st = trill_model_load_shard(model_dir, TRILL_STORE_CHECKPOINT, &shard, &t->policy);
    if (!st) {
        trill_model_set_precision(t->policy, prec);
        const trill_config *mc = trill_model_config(t->policy);
        t->L = mc->n_moe_layers;
        t->K = mc->num_experts_per_tok;
    }
    if (!st && c->sync.mode == TRILL_WEIGHT_SYNC_MERGE) {
        st = trill_model_load_as(model_dir, TRILL_STORE_F32, &t->merge_model);
        if (!st && !(t->merge_base = trill_malloc(sizeof(float) * t->merge_model->n_f32))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st) memcpy(t->merge_base, t->merge_model->params, sizeof(float) * t->merge_model->n_f32);
    }
    if (!st) st = make_trainable(t, ckpt);
    if (!st) st = set_up_shards(t);
    if (!st && c->generator.on_policy) {
        const trill_engine_config ec = trill_rl_engine_config(c, trill_model_config(t->policy));
        st = trill_engine_create(t->policy, &ec, &t->onp_engine);
        t->onp_stale = true;
    }
    if (st) {
        trill_trainer_free(t);
        return st;
    }
    *out = t;
    return TRILL_OK;
}

void trill_trainer_free(trill_trainer *t) {
    if (!t) return;
    for (int i = 0; i < WS_N; i++) free(t->ws[i].p);
    trill_engine_free(t->onp_engine);
    if (t->policy) {
        trill_model_attach_lora(t->policy, NULL);
        trill_model_set_expert_comm(t->policy, NULL);
        trill_model_set_tensor_comm(t->policy, NULL);
    }
    if (t->whole != t->lora) trill_lora_free(t->whole);
    trill_lora_free(t->lora);
    free(t->lora_grads);
    free(t->leaf);
    for (int j = 0; t->src && j < t->P; j++) free(t->src[j]);
    free(t->src);
    free(t->no_decay);
    trill_adamw_free(t->opt);
    trill_adamw_free(t->whole_opt);
    trill_model_free(t->policy);
    trill_model_free(t->merge_model);
    free(t->merge_base);
    trill_comm_free(t->ep);
    trill_comm_free(t->edp);
    trill_comm_free(t->tp);
    trill_comm_free(t->owned_data);
    free(t);
}

bool trill_trainer_sharded(const trill_trainer *t) { return t->mp != NULL; }

trill_comm_stats trill_trainer_comm_stats(const trill_trainer *t) {
    trill_comm_stats sum = { 0 };
    const trill_comm *comms[4] = { t->data, t->ep, t->edp, t->tp };
    for (int i = 0; i < 4; i++) {
        if (!comms[i]) continue;
        const trill_comm_stats s = trill_comm_stats_get(comms[i]);
        for (int k = 0; k < TRILL_COMM_KINDS; k++) {
            sum.calls[k] += s.calls[k];
            sum.bytes[k] += s.bytes[k];
            sum.ms[k] += s.ms[k];
        }
    }
    return sum;
}

void trill_trainer_comm_reset(trill_trainer *t) {
    trill_comm *comms[4] = { t->data, t->ep, t->edp, t->tp };
    for (int i = 0; i < 4; i++)
        if (comms[i]) trill_comm_stats_reset(comms[i]);
}

const trill_model *trill_trainer_policy(const trill_trainer *t) { return t->policy; }
trill_lora *trill_trainer_lora(trill_trainer *t) { return t->whole; }
trill_adamw *trill_trainer_optimizer(trill_trainer *t) { return t->whole_opt ? t->whole_opt : t->opt; }
