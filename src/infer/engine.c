/* The generator engine (trill/infer.h): creation, freeing, the step, run and accessors. A step
 * takes a waiting live update (engine_adapter.c), schedules its rows (engine_requests.c), runs
 * the decoder layer's forward (src/infer/gen_decoder.c), samples and finishes sequences (engine_sample.c) and feeds EPLB
 * (engine_eplb.c). The parts and the private state are described in engine_internal.h. */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "infer/engine_internal.h"
#include "infer/gen_decoder.h"
#include "arch/family.h"
#include "base/alloc.h"

trill_engine_config trill_engine_config_default(void) {
    return (trill_engine_config){ .format = TRILL_GEN_BF16, .block_size = 16, .kv_cache_mb = 256, .max_batch_tokens = 512,
                                  .max_running = 256, .eplb_redundant = -1, .eplb_window = 64, .eplb_interval = 16 };
}

/* The step's rows, for max_batch_tokens of them; then the forward's and the sampler's buffers. */
static trill_status alloc_step_buffers(trill_engine *e) {
    const size_t R = (size_t)e->rows.max;
    e->rows.logit = trill_malloc(R * sizeof(int));
    e->rows.seq = trill_malloc(R * sizeof(seq *));
    e->rows.pos = trill_malloc(R * sizeof(int));
    e->rows.token = trill_malloc(R * sizeof(int));
    e->rows.slot = trill_malloc(R);
    if (!e->rows.logit || !e->rows.seq || !e->rows.pos || !e->rows.token || !e->rows.slot)
        return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's step buffers (%d rows)", e->rows.max);
    trill_status st = e->fam->alloc(e);
    if (!st) st = trill_eng_sampler_alloc(e);
    return st;
}

/* The KV cache's size: the layout the forward asks for (*shape, [num_hidden_layers], the caller
 * frees it), in the weights' precision (*elem bytes: fp32 for f32, bf16 otherwise, as bf16
 * serving does), and as many blocks as kv_cache_mb holds, or exactly kv_blocks. */
/* The caches' layouts and sizes: what a token keeps per layer (the family's), in the format's
 * element; kv_blocks, or as many blocks as kv_cache_mb holds. With kv_split the windowed layers'
 * K/V go to win_shape (0 wide in shape), in win_blocks: each running sequence's window and a
 * step's new positions (preemption covers the rest), at most half the budget. */
static trill_status size_kv_cache(const trill_engine *e, kv_layer_shape **shape, kv_layer_shape **win_shape, int *elem, int *blocks,
                                  int *win_blocks) {
    const trill_config *c = &e->c;
    const trill_engine_config *cfg = &e->cfg;
    const int L = c->num_hidden_layers;
    *shape = trill_malloc(sizeof **shape * (size_t)L);
    *win_shape = e->kv_split ? trill_malloc(sizeof **win_shape * (size_t)L) : NULL;
    if (!*shape || (e->kv_split && !*win_shape)) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->fam->kv_shape(c, *shape);
    *elem = cfg->format == TRILL_GEN_F32 ? (int)sizeof(float) : (int)sizeof(uint16_t);
    size_t budget = cfg->kv_cache_mb * 1000000;
    *win_blocks = 0;
    if (e->kv_split) {
        for (int l = 0; l < L; l++) {
            const bool windowed = trill_layer_desc_of(c, l).window > 0;
            (*win_shape)[l] = windowed ? (*shape)[l] : (kv_layer_shape){ 0, 0 };
            if (windowed) (*shape)[l] = (kv_layer_shape){ 0, 0 };
        }
        const int bs = cfg->block_size;
        const size_t per_win = trill_kv_cache_bytes_per_block(bs, L, *win_shape, *elem);
        size_t want = (size_t)cfg->max_running * (size_t)((e->kv_win_window - 1) / bs + 3) + (size_t)(cfg->max_batch_tokens + bs - 1) / bs;
        if (cfg->kv_blocks <= 0 && want * per_win > budget / 2) want = budget / 2 / per_win;
        if (want < 1 || want > INT32_MAX)
            return trill_error(TRILL_ERR_INVALID, "engine: kv_cache_mb %zu holds no block of the windowed layers' cache (%.2f MB each)", cfg->kv_cache_mb,
                               per_win / 1e6);
        *win_blocks = (int)want;
        budget -= want * per_win < budget ? want * per_win : budget;
    }
    const size_t per_block = trill_kv_cache_bytes_per_block(cfg->block_size, L, *shape, *elem);
    const size_t n_blocks = cfg->kv_blocks > 0 ? (size_t)cfg->kv_blocks : per_block ? budget / per_block : 0;
    if (n_blocks < 1 || n_blocks > INT32_MAX)
        return trill_error(TRILL_ERR_INVALID, "engine: kv_cache_mb %zu holds %zu blocks of %d tokens (%.2f MB each); need at least one",
                           cfg->kv_cache_mb, n_blocks, cfg->block_size, per_block / 1e6);
    *blocks = (int)n_blocks;
    return TRILL_OK;
}

size_t trill_engine_state_bytes_per_sequence(const trill_config *c) { return trill_gen_gdn_state_floats(c) * sizeof(float); }

size_t trill_engine_kv_bytes_per_token(const trill_config *c, trill_gen_format f) {
    kv_layer_shape *shape = trill_malloc(sizeof *shape * (size_t)c->num_hidden_layers);
    if (!shape) return 0;
    trill_eng_decoder.kv_shape(c, shape);
    size_t elems = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) elems += (size_t)shape[l].k_width + (size_t)shape[l].v_width;
    free(shape);
    return elems * (f == TRILL_GEN_F32 ? sizeof(float) : sizeof(uint16_t));
}

trill_status trill_engine_create(const trill_model *m, const trill_engine_config *cfg_in, trill_engine **out) {
    trill_engine_config cfg = cfg_in ? *cfg_in : trill_engine_config_default();
    if (m->config.num_labels > 0)
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: this model is a sequence classifier (%s, a reward model): it scores text, it does not generate",
                           trill_config_architecture(&m->config));
    if (m->expert_count < m->config.num_experts || m->tp_size > 1)
        return trill_error(TRILL_ERR_UNSUPPORTED, "engine: this model is a shard (experts %d-%d of %d, tensor-parallel share %d of %d); the "
                           "generator serves the whole model", m->expert_first, m->expert_first + m->expert_count - 1, m->config.num_experts,
                           m->tp_rank, m->tp_size);
    if (cfg.block_size < 1 || cfg.block_size > 4096)
        return trill_error(TRILL_ERR_INVALID, "engine: block_size must be in [1, 4096], got %d", cfg.block_size);
    if (cfg.max_batch_tokens < 1) return trill_error(TRILL_ERR_INVALID, "engine: max_batch_tokens must be >= 1, got %d", cfg.max_batch_tokens);
    if (cfg.max_running < 1) return trill_error(TRILL_ERR_INVALID, "engine: max_running must be >= 1, got %d", cfg.max_running);
    if (cfg.format > TRILL_GEN_INT8) return trill_error(TRILL_ERR_INVALID, "engine: unknown weight format %d", (int)cfg.format);
    trill_status st = trill_eng_decoder.check(&m->config);
    if (st) return st;
    const char *isa;
    if (trill_gen_isa(&isa)) {
        trill_error_context("engine");
        return TRILL_ERR_INVALID;
    }
    trill_engine *e = trill_calloc(1, sizeof *e);
    if (!e) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->c = m->config;
    e->fam = &trill_eng_decoder;
    int window = INT32_MAX; /* the smallest layer window, when every layer has one */
    for (int l = 0; l < m->config.num_hidden_layers && window; l++) {
        const int w = trill_layer_desc_of(&m->config, l).window;
        window = w <= 0 ? 0 : w < window ? w : window;
    }
    e->kv_window = window == INT32_MAX ? 0 : window;
    if (!e->kv_window && trill_layer_desc_of(&m->config, 0).attention == TRILL_ATTENTION_GQA) { /* windowed layers beside full ones */
        int w_all = 0;
        bool one = true;
        for (int l = 0; l < m->config.num_hidden_layers; l++) {
            const int w = trill_layer_desc_of(&m->config, l).window;
            if (w > 0) one &= !w_all || w == w_all, w_all = w;
        }
        e->kv_split = w_all > 0 && one; /* (layers of different windows keep every block) */
        e->kv_win_window = e->kv_split ? w_all : 0;
    }
    e->cfg = cfg;
    if ((e->tensors = trill_malloc((m->n_tensors ? m->n_tensors : 1) * sizeof *e->tensors))) {
        e->n_tensors = m->n_tensors;
        for (size_t t = 0; t < m->n_tensors; t++) {
            e->tensors[t] = m->tensors[t];
            e->tensors[t].data = NULL;
            e->tensors[t].bf16 = NULL;
        }
    } else st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    e->rows.max = cfg.max_batch_tokens;
    const trill_config *c = &e->c;
    kv_layer_shape *kv_shape = NULL, *win_shape = NULL;
    int kv_elem = 0, kv_blocks = 0, win_blocks = 0;
    if (!st) st = size_kv_cache(e, &kv_shape, &win_shape, &kv_elem, &kv_blocks, &win_blocks);
    pthread_mutex_init(&e->update.lock, NULL);
    if (!st && (st = trill_model_check_finite(m))) trill_error_context("engine");
    if (!st) st = trill_eng_build_weights(c, cfg.format, m, &e->w);
    if (!st) st = trill_kv_cache_create(&e->kv, kv_blocks, cfg.block_size, c->num_hidden_layers, kv_shape, kv_elem);
    if (!st && e->kv_split) st = trill_kv_cache_create(&e->kv_win, win_blocks, cfg.block_size, c->num_hidden_layers, win_shape, kv_elem);
    free(kv_shape);
    free(win_shape);
    if (!st && cfg.eplb && c->n_moe_layers > 0) st = trill_eng_eplb_start(e);
    if (!st) st = alloc_step_buffers(e);
    if (!st) st = trill_eng_build_layout(e);
    if (st) {
        trill_engine_free(e);
        return st;
    }
    *out = e;
    return TRILL_OK;
}

void trill_engine_free(trill_engine *e) {
    if (!e) return;
    trill_eng_sched_free(e); /* the sequences give their blocks back before the cache goes */
    trill_eng_free_weights(&e->c, e->w);
    trill_eng_free_adapter(&e->c, e->ad);
    for (int k = 1; k < TRILL_ENGINE_ADAPTER_SLOTS; k++) trill_eng_free_adapter(&e->c, e->slots[k]);
    trill_eng_free_adapter(&e->c, e->layout);
    if (e->update.w) trill_eng_free_weights(&e->c, e->update.w);
    if (e->update.ad) trill_eng_free_adapter(&e->c, e->update.ad);
    pthread_mutex_destroy(&e->update.lock);
    trill_kv_cache_free(&e->kv);
    if (e->kv_split) trill_kv_cache_free(&e->kv_win);
    if (e->fam) e->fam->free(e);
    trill_eng_eplb_free(e);
    free(e->rows.logit);
    free(e->rows.seq);
    free(e->rows.pos);
    free(e->rows.token);
    free(e->rows.slot);
    trill_eng_sampler_free(e);
    free(e->tensors);
    free(e->prof);
    free(e);
}

size_t trill_engine_weight_bytes(const trill_engine *e) { return e->w->bytes; }

size_t trill_engine_kv_bytes(const trill_engine *e) {
    return e->kv.block_bytes * (size_t)e->kv.n_blocks + (e->kv_split ? e->kv_win.block_bytes * (size_t)e->kv_win.n_blocks : 0);
}

uint32_t trill_engine_version(const trill_engine *e) { return e->version; }

bool trill_engine_busy(const trill_engine *e) { return e->sched.n_active > 0 || e->sched.n_waiting > 0; }

trill_status trill_engine_set_expert_comm(trill_engine *e, trill_comm *c) {
    if (!c) {
        e->ep = NULL;
        e->ep_rank = 0;
        e->ep_size = 1;
        return TRILL_OK;
    }
    const int P = trill_comm_size(c), E = e->c.num_experts;
    if (e->n_slots) return trill_error(TRILL_ERR_UNSUPPORTED, "expert parallelism: not with adapter slots (trill_engine_set_adapter)");
    if (e->c.n_moe_layers == 0) return trill_error(TRILL_ERR_INVALID, "expert parallelism: the model has no MoE layer");
    if (e->eplb.window && e->eplb.workers != P)
        return trill_error(TRILL_ERR_INVALID, "expert parallelism: EPLB places slots on %d workers, the group has %d ranks (set eplb_workers "
                           "to %d)", e->eplb.workers, P, P);
    if (!e->eplb.window && E % P)
        return trill_error(TRILL_ERR_INVALID, "expert parallelism: %d experts do not split evenly over %d ranks", E, P);
    e->ep = c;
    e->ep_rank = trill_comm_rank(c);
    e->ep_size = P;
    trill_eng_ep_place(e); /* each rank keeps its experts' weights only */
    return TRILL_OK;
}

trill_status trill_engine_group_busy(trill_engine *e, bool *busy) {
    *busy = trill_engine_busy(e);
    if (!e->ep) return TRILL_OK;
    uint64_t any = 0;
    trill_status st = trill_comm_allreduce_max_u64(e->ep, *busy, &any);
    *busy = any != 0;
    return st;
}

static void touch_pool(const kv_cache *kv) {
    const size_t n = (size_t)kv->n_blocks * kv->block_bytes;
    if (!kv->data || n == 0) return;
#pragma omp parallel
    {
        const size_t per = (n + (size_t)omp_get_num_threads() - 1) / (size_t)omp_get_num_threads(), at = per * (size_t)omp_get_thread_num();
        if (at < n) memset(kv->data + at, 0, at + per < n ? per : n - at);
    }
}

void trill_engine_touch_cache(trill_engine *e) {
    touch_pool(&e->kv);
    if (e->kv_split) touch_pool(&e->kv_win);
}

/* ---- the per-phase profile (trill/infer.h) ---- */

trill_status trill_engine_profile(trill_engine *e, bool on) {
    if (on && !e->prof && !(e->prof = trill_calloc(1, sizeof *e->prof)))
        return trill_error(TRILL_ERR_NOMEM, "out of memory for the engine's profile");
    if (on) memset(&e->prof->p, 0, sizeof e->prof->p);
    if (e->prof) e->prof->enabled = on;
    return TRILL_OK;
}

trill_gen_profile trill_engine_profile_get(const trill_engine *e) {
    return e->prof ? e->prof->p : (trill_gen_profile){ 0 };
}

const char *trill_gen_phase_name(trill_gen_phase p) {
    static const char *const names[TRILL_N_PHASES] = { "schedule", "project", "attention", "route", "dispatch", "experts",
                                                        "combine",  "mlp",     "other",     "logits", "sample" };
    return p >= 0 && p < TRILL_N_PHASES ? names[p] : "?";
}

static void profile_start(trill_engine *e) {
    if (!e->prof || !e->prof->enabled) return;
    e->prof->running = true;
    e->prof->cur = TRILL_PHASE_SCHEDULE;
    e->prof->last = trill_now();
}

static void profile_stop(trill_engine *e, int rows) {
    if (!e->prof || !e->prof->running) return;
    eng_phase(e, TRILL_PHASE_SCHEDULE);
    e->prof->running = false;
    e->prof->p.steps++;
    e->prof->p.rows += rows;
}

trill_status trill_engine_step(trill_engine *e, trill_step_stats *stats) {
    trill_step_stats local = { 0 };
    int R = 0;
    profile_start(e);
    /* what a failed step left: its stop checks, then the placement it was to plan */
    trill_status st = e->sched.recheck_stops ? trill_eng_finish_stopped(e) : TRILL_OK;
    if (!st && e->eplb.window) st = trill_eng_eplb_before_step(e);
    if (!st) st = trill_eng_take_update(e);
    if (!st) st = trill_eng_schedule(e, &R, &local);
    if (!st && R == 0 && trill_engine_busy(e)) /* never a step that makes no progress */
        st = trill_error(TRILL_ERR_INVALID, "engine: no work can be scheduled: %d sequences waiting, %d running, %d of %d KV blocks free",
                         e->sched.n_waiting, e->sched.n_active, e->kv.n_free, e->kv.n_blocks);
    /* in an expert-parallel group every step is collective: with nothing scheduled, the forward
     * runs with no rows and serves the other ranks' experts */
    const bool forward = R > 0 || e->ep;
    if (!st && R > 0) st = trill_eng_ensure_sampler_scratch(e);
    if (!st && forward) st = e->fam->ensure_scores(e, R);
    if (!st && forward) {
        eng_phase(e, TRILL_PHASE_OTHER);
        st = e->fam->rows(e, R);
        if (!st && R > 0) st = trill_eng_after_forward(e, R);
        eng_phase(e, TRILL_PHASE_SCHEDULE);
        /* the step took effect unless it failed before its samples (only its stop check after) */
        const bool took_effect = !st || e->sched.recheck_stops;
        if (e->eplb.window && took_effect) {
            const trill_status est = trill_eng_eplb_after_step(e);
            if (!st) st = est;
        } else if (e->eplb.window) {
            trill_eng_eplb_discard_step(e);
        }
    }
    local.rows = R;
    local.kv_blocks_used = e->kv.n_blocks - e->kv.n_free;
    local.kv_window_blocks_used = e->kv_split ? e->kv_win.n_blocks - e->kv_win.n_free : 0;
    local.running = e->sched.n_active;
    local.waiting = e->sched.n_waiting;
    if (stats) *stats = local;
    profile_stop(e, R);
    return st;
}

trill_status trill_engine_run(trill_engine *e) {
    while (trill_engine_busy(e)) {
        trill_status st = trill_engine_step(e, NULL);
        if (st) return st;
    }
    return TRILL_OK;
}
