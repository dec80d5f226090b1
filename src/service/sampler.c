/* The sampling worker (svc.h): every sampler's requests batched together in its base's engine
 * (continuous batching: queued requests join between engine steps), each sampler's weights (one
 * copy a path's version, shared by its samplers) held in one of the engine's adapter slots, so the rows of many tenants' adapters share each step
 * (multi-LoRA, trill_engine_set_adapter). A slot is given to another adapter only when no running
 * request uses it, the least recently used first. Every request is keyed by its seed alone
 * (trill_request.keyed), so a sample is what it is alone, whatever runs beside it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "service/svc.h"
#include "trill/log.h"

/* One base's engine and what its adapter slots hold. */
typedef struct engine_slots {
    const trill_lora *held[TRILL_ENGINE_ADAPTER_SLOTS]; /* [0] unused: slot 0 is the base (no adapter) */
    int users[TRILL_ENGINE_ADAPTER_SLOTS];              /* running requests on the slot */
    uint64_t used[TRILL_ENGINE_ADAPTER_SLOTS];          /* when it was last given a request */
} engine_slots;

typedef struct sampling {
    svc *s;
    engine_slots *slots;  /* [n_bases] */
    svc_job **running;    /* submitted to an engine, not finished */
    int n_running, cap_running;
    uint64_t next_id, clock;
} sampling;

/* The slot holding lora in its base's engine (0: the base itself), a free one to load it into
 * (*load set), or -1 when every slot is busy with running requests. */
static int slot_for(engine_slots *es, const trill_lora *lora, bool *load) {
    *load = false;
    if (!lora) return 0;
    int best = -1;
    for (int k = 1; k < TRILL_ENGINE_ADAPTER_SLOTS; k++) {
        if (es->held[k] == lora) return k;
        if (es->users[k] == 0 && (best < 0 || es->used[k] < es->used[best])) best = k;
    }
    *load = best >= 0;
    return best;
}

static json_t *sequence_json(const trill_sequence_out *o, const trill_config *c) {
    json_t *toks = json_array(), *experts = json_array();
    for (int i = 0; i < o->n_generated; i++) json_array_append_new(toks, json_integer(o->tokens[o->n_prompt + i]));
    const size_t rows = (size_t)(o->n_prompt + o->n_generated - 1) * c->n_moe_layers * c->num_experts_per_tok;
    for (size_t i = 0; o->experts && i < rows; i++) json_array_append_new(experts, json_integer(o->experts[i]));
    const char *reason = o->finish == TRILL_FINISH_LENGTH ? "length" : o->finish == TRILL_FINISH_ABORTED ? "aborted" : "stop";
    return json_pack("{s:o, s:o, s:s, s:o}", "tokens", toks, "logprobs", trill_svc_json_floats(o->logprobs, o->n_generated), "stop_reason", reason,
                     "routed_experts", experts);
}

/* The request scoring job j's prompt: its first token, the rest forced (their log-probs as the
 * sampler would have drawn them at temperature 1). */
static trill_request prompt_request(const svc_job *j, uint64_t id, int slot) {
    return (trill_request){ .id = id, .prompt = j->prompt, .prompt_len = 1, .n = 1, .sampling = trill_sampling_default(), .keyed = true,
                            .key = 0, .adapter = slot, .forced = j->prompt + 1, .n_forced = j->prompt_len - 1,
                            .max_new_tokens = j->prompt_len - 1 };
}

/* Submits job j to its base's engine on adapter slot `slot`: a sample's n samples (its result's
 * sequences filled in sample order as they finish) and, when asked, its prompt's log-probs by a
 * second request; for compute_logprobs the prompt alone. A one-token prompt's log-probs ([null])
 * need no engine. */
static trill_status submit(sampling *w, svc_job *j, int slot) {
    const trill_config *c = trill_model_config(trill_svc_base_model(w->s->bases[j->sampler->base]));
    trill_engine *e = w->s->engines[j->sampler->base];
    const bool sample = j->kind == JOB_SAMPLE, prompt = !sample || j->prompt_logprobs;
    j->result = json_object();
    json_t *list = json_array(), *lps = prompt ? json_pack("[n]") : NULL;
    for (int i = 0; list && sample && i < j->num_samples; i++) json_array_append_new(list, json_null());
    if (!j->result || !list || (prompt && !lps) || (sample && json_object_set_new(j->result, "sequences", list)) ||
        (prompt && json_object_set_new(j->result, sample ? "prompt_logprobs" : "logprobs", lps)))
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!sample) json_decref(list);
    j->remaining = 0;
    j->prompt_logprobs = sample && j->prompt_logprobs && j->prompt_len > 1; /* from here: a second request runs */
    trill_status st = TRILL_OK;
    if (prompt && j->prompt_len > 1) {
        j->logprobs_id = w->next_id++;
        trill_request r = prompt_request(j, j->logprobs_id, slot);
        if (!(st = trill_engine_submit(e, &r))) j->remaining = 1;
        if (!sample) j->engine_id = j->logprobs_id;
    }
    if (st || !sample) return st;
    j->engine_id = w->next_id++;
    trill_request r = { .id = j->engine_id, .prompt = j->prompt, .prompt_len = j->prompt_len, .n = j->num_samples, .sampling = j->sampling,
                        .keyed = true, .key = 0, .adapter = slot, .max_new_tokens = j->max_tokens,
                        .stop_ids = j->n_stop_ids ? j->stop_ids : c->eos_token_ids, .n_stop_ids = j->n_stop_ids ? j->n_stop_ids : c->n_eos,
                        .stop_strings = (const char *const *)j->stop_strings, .n_stop_strings = j->n_stop_strings };
    st = trill_engine_submit(e, &r);
    if (!st) j->remaining += r.n;
    else if (j->remaining) trill_engine_abort(e, j->logprobs_id);
    return st;
}

/* A finished sequence of job j into its result: a sample, or the prompt's log-probs. */
static trill_status add_output(sampling *w, svc_job *j, const trill_sequence_out *o) {
    const trill_config *c = trill_model_config(trill_svc_base_model(w->s->bases[j->sampler->base]));
    const bool prompt = j->kind == JOB_LOGPROBS || (j->prompt_logprobs && o->request == j->logprobs_id);
    if (!prompt)
        return json_array_set_new(json_object_get(j->result, "sequences"), (size_t)o->sample, sequence_json(o, c))
                   ? trill_error(TRILL_ERR_NOMEM, "out of memory") : TRILL_OK;
    json_t *lps = json_object_get(j->result, j->kind == JOB_LOGPROBS ? "logprobs" : "prompt_logprobs");
    for (int t = 0; t < o->n_generated; t++)
        if (json_array_append_new(lps, json_real(o->logprobs[t]))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    return TRILL_OK;
}

/* The adapter a sampler samples with (NULL: the base model, or its weights not loaded now). */
static trill_lora *lora_of(const svc_sampler *p) { return p->weights ? p->weights->lora : NULL; }

/* Takes job i off the running list, its slot released; then records its outcome. */
static void complete(sampling *w, int i, trill_status st) {
    svc_job *j = w->running[i];
    engine_slots *es = &w->slots[j->sampler->base];
    const trill_lora *lora = lora_of(j->sampler);
    for (int k = 1; k < TRILL_ENGINE_ADAPTER_SLOTS; k++)
        if (lora && es->held[k] == lora) { es->users[k]--; break; }
    w->running[i] = w->running[--w->n_running];
    trill_svc_job_finish(w->s, j, st ? NULL : trill_svc_json_dump(json_incref(j->result)), st);
}

/* Under s->mu: the queued jobs whose adapters can have a slot now, in queue order, into
 * w->running (their slots reserved; *load[i] set where the adapter must be loaded first). The
 * others stay queued. Returns how many were taken (from index first of w->running). */
static int take(sampling *w, bool *load, int *slot_of) {
    svc *s = w->s;
    int n = 0;
    for (svc_job **p = &s->sample_head, *j; (j = *p) && n < s->cfg.max_queued;) {
        engine_slots *es = &w->slots[j->sampler->base];
        svc_weights *wt = j->sampler->weights;
        const bool loaded = !wt || wt->lora;
        const int slot = loaded ? slot_for(es, lora_of(j->sampler), &load[n]) : -1;
        if (slot < 0) { p = &j->next; continue; }
        if (wt) wt->last_used = ++w->clock;
        *p = j->next;
        j->next = NULL;
        if (load[n]) es->held[slot] = lora_of(j->sampler);
        es->users[slot] += slot > 0;
        es->used[slot] = ++w->clock;
        slot_of[n++] = slot;
        w->running[w->n_running++] = j;
    }
    s->sample_tail = NULL;
    for (svc_job *j = s->sample_head; j; j = j->next) s->sample_tail = j;
    return n;
}

/* The taken jobs into their engines (outside s->mu): first the adapters to load (a job sharing a
 * slot with one taken before it may come first in the list), then the requests; a job that
 * fails, or needs no engine, is completed at once. */
static void start(sampling *w, int first, int n, const bool *load, const int *slot_of) {
    char why[512] = "";
    for (int t = 0; t < n; t++) {
        if (!load[t]) continue;
        svc_job *j = w->running[first + t];
        if (trill_engine_set_adapter(w->s->engines[j->sampler->base], slot_of[t], lora_of(j->sampler), NULL)) {
            w->slots[j->sampler->base].held[slot_of[t]] = NULL; /* every job of that slot fails below */
            snprintf(why, sizeof why, "%s", trill_error_message());
        }
    }
    for (int t = n - 1; t >= 0; t--) { /* from the end: complete() moves the last running job into the hole */
        svc_job *j = w->running[first + t];
        engine_slots *es = &w->slots[j->sampler->base];
        trill_status st = TRILL_OK;
        if (slot_of[t] > 0 && es->held[slot_of[t]] != lora_of(j->sampler)) {
            es->users[slot_of[t]]--; /* its slot failed to load: nothing for complete() to release */
            st = trill_error(TRILL_ERR_NOMEM, "sampling: the adapter could not be loaded: %s", why);
        }
        if (!st) st = submit(w, j, slot_of[t]);
        if (st || j->remaining == 0) complete(w, first + t, st);
    }
}

/* Stops job j's requests in engine e. */
static void abort_job(trill_engine *e, const svc_job *j) {
    trill_engine_abort(e, j->engine_id);
    if (j->prompt_logprobs) trill_engine_abort(e, j->logprobs_id);
}

/* One step of every busy engine; finished sequences go to their jobs, finished jobs complete. A
 * failed step fails the jobs running in that engine. */
static void step(sampling *w) {
    svc *s = w->s;
    trill_sequence_out out[32];
    for (int b = 0; b < s->n_bases; b++) {
        trill_engine *e = s->engines[b];
        if (!trill_engine_busy(e)) continue;
        trill_status st = trill_engine_step(e, NULL);
        for (int got; !st && (got = trill_engine_collect(e, out, 32)) > 0;)
            for (int k = 0; k < got; k++) {
                for (int i = 0; i < w->n_running; i++) {
                    svc_job *j = w->running[i];
                    if (j->sampler->base != b || (j->engine_id != out[k].request && !(j->prompt_logprobs && j->logprobs_id == out[k].request)))
                        continue;
                    const trill_status as = add_output(w, j, &out[k]);
                    if (as || --j->remaining == 0) {
                        if (as) abort_job(e, j); /* its other samples are dropped below */
                        complete(w, i, as);
                    }
                    break;
                }
                trill_sequence_out_free(&out[k]);
            }
        if (!st) continue;
        char message[512];
        snprintf(message, sizeof message, "%s", trill_error_message());
        for (int i = w->n_running - 1; i >= 0; i--)
            if (w->running[i]->sampler->base == b) {
                abort_job(e, w->running[i]);
                complete(w, i, trill_error(st, "sampling: %s", message));
            }
        for (int got; (got = trill_engine_collect(e, out, 32)) > 0;)
            for (int k = 0; k < got; k++) trill_sequence_out_free(&out[k]);
    }
}

/* Under s->mu: whether a queued or running job samples with weights wt. */
static bool in_use(const sampling *w, const svc_weights *wt) {
    for (int i = 0; i < w->n_running; i++)
        if (w->running[i]->sampler->weights == wt) return true;
    for (const svc_job *j = w->s->sample_head; j; j = j->next)
        if (j->sampler->weights == wt) return true;
    return false;
}

/* Under s->mu: queued jobs' weights that are not loaded get loaded (the lock released while
 * reading); those that cannot be (their path saved again, a file gone) fail their queued jobs
 * with the reason. */
static void load_needed(sampling *w) {
    svc *s = w->s;
    enum { BATCH = 8 };
    svc_weights *need[BATCH];
    int n = 0;
    for (const svc_job *j = s->sample_head; j && n < BATCH; j = j->next) {
        svc_weights *wt = j->sampler->weights;
        bool seen = false;
        for (int k = 0; k < n; k++) seen |= need[k] == wt;
        if (wt && !wt->lora && !seen) need[n++] = wt;
    }
    for (int k = 0; k < n; k++) {
        pthread_mutex_unlock(&s->mu);
        const trill_status st = trill_svc_weights_load(s, need[k]);
        char why[1024];
        snprintf(why, sizeof why, "%s", trill_error_message());
        svc_job *failed = NULL;
        pthread_mutex_lock(&s->mu);
        if (!st) continue;
        for (svc_job **q = &s->sample_head, *j; (j = *q);) {
            if (j->sampler->weights != need[k]) { q = &j->next; continue; }
            *q = j->next;
            j->next = failed, failed = j;
        }
        s->sample_tail = NULL;
        for (svc_job *j = s->sample_head; j; j = j->next) s->sample_tail = j;
        pthread_mutex_unlock(&s->mu);
        for (svc_job *j = failed, *next; j; j = next) next = j->next, trill_svc_job_finish(s, j, NULL, trill_error(st, "%s", why));
        pthread_mutex_lock(&s->mu);
    }
}

/* Under s->mu: weights wt out of its engine's slots and out of memory (it loads again if needed). */
static void drop(sampling *w, svc_weights *wt) {
    svc *s = w->s;
    engine_slots *es = &w->slots[wt->base];
    for (int k = 1; wt->lora && k < TRILL_ENGINE_ADAPTER_SLOTS; k++)
        if (es->held[k] == wt->lora) {
            trill_engine_set_adapter(s->engines[wt->base], k, NULL, NULL); /* emptying an unused slot cannot fail */
            es->held[k] = NULL;
        }
    trill_lora_free(wt->lora);
    wt->lora = NULL;
    s->sampler_bytes -= wt->bytes;
    wt->bytes = 0;
}

/* Under s->mu: weights no sampler holds any more are freed; then while the loaded ones pass
 * --max-adapter-mb, the least recently used idle one is dropped (it loads again when it samples). */
static void evict(sampling *w) {
    svc *s = w->s;
    for (int i = s->n_weights - 1; i >= 0; i--) {
        svc_weights *wt = s->weights[i];
        if (wt->refs > 0 || in_use(w, wt)) continue;
        drop(w, wt);
        s->weights[i] = s->weights[--s->n_weights];
        free(wt);
    }
    while (s->sampler_bytes > s->cfg.max_adapter_bytes) {
        svc_weights *lru = NULL;
        for (int i = 0; i < s->n_weights; i++) {
            svc_weights *wt = s->weights[i];
            if (wt->lora && (!lru || wt->last_used < lru->last_used) && !in_use(w, wt)) lru = wt;
        }
        if (!lru) break; /* every loaded one is in use: they stay until they are not */
        drop(w, lru);
    }
    s->reap = false;
}

void *trill_svc_sample_main(void *arg) {
    svc *s = arg;
    sampling w = { .s = s, .slots = trill_calloc((size_t)s->n_bases, sizeof *w.slots),
                   .running = trill_calloc((size_t)s->cfg.max_queued + 1, sizeof *w.running) };
    bool *load = trill_calloc((size_t)s->cfg.max_queued + 1, sizeof *load);
    int *slot_of = trill_calloc((size_t)s->cfg.max_queued + 1, sizeof *slot_of);
    if (!w.slots || !w.running || !load || !slot_of) {
        trill_log(TRILL_LOG_WARN, "trill serve: out of memory for the sampling worker: sampling calls will wait");
        free(w.slots), free(w.running), free(load), free(slot_of);
        return NULL;
    }
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stopping && !s->sample_head && w.n_running == 0 && !s->reap) pthread_cond_wait(&s->work, &s->mu);
        if (s->stopping) break;
        load_needed(&w);
        const int first = w.n_running, n = take(&w, load, slot_of);
        pthread_mutex_unlock(&s->mu);
        start(&w, first, n, load, slot_of);
        step(&w);
        pthread_mutex_lock(&s->mu);
        evict(&w);
    }
    pthread_mutex_unlock(&s->mu);
    /* stopping: what runs stays pending in the request log (server_restarted at the next start) */
    for (int i = 0; i < w.n_running; i++) trill_svc_job_free(w.running[i]);
    free(w.slots), free(w.running), free(load), free(slot_of);
    return NULL;
}
