#include "rl/data/rollout.h"
#include "base/alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void trill_rl_batch_free(rl_batch *b) {
    if (b->completion)
        for (int s = 0; s < b->n_seqs; s++) free(b->completion[s]);
    if (b->env_metrics)
        for (int s = 0; s < b->n_seqs; s++) free(b->env_metrics[s]);
    free(b->env_metrics);
    free(b->offsets); free(b->prompt_len); free(b->tokens); free(b->behav_logp); free(b->version); free(b->experts);
    free(b->example); free(b->completion); free(b->reward); free(b->adv); free(b->correct); free(b->keep);
    free(b->seg_offsets); free(b->segs); free(b->loss_mask); free(b->episodes);
    memset(b, 0, sizeof *b);
}

/* ---- trajectories ---- */

trill_status trill_rl_batch_derive(rl_batch *b) {
    const int n = b->n_seqs;
    const size_t T = n ? (size_t)b->offsets[n] : 0;
    if (!b->seg_offsets || !b->segs) return trill_error(TRILL_ERR_INVALID, "rollout batch: no segments");
    if (b->seg_offsets[0] != 0) return trill_error(TRILL_ERR_INVALID, "rollout batch: segment offsets start at %d", b->seg_offsets[0]);
    for (int s = 0; s < n; s++) {
        const int first = b->seg_offsets[s], last = b->seg_offsets[s + 1];
        long covered = 0;
        if (last <= first || b->segs[first].kind != RL_SEG_INJECTED || b->segs[first].len != b->prompt_len[s])
            return trill_error(TRILL_ERR_INVALID, "rollout batch: sequence %d does not start with its prompt as an injected segment "
                               "of %d tokens", s, b->prompt_len[s]);
        for (int k = first; k < last; k++) {
            if (b->segs[k].len < 1 || (b->segs[k].kind != RL_SEG_INJECTED && b->segs[k].kind != RL_SEG_SAMPLED))
                return trill_error(TRILL_ERR_INVALID, "rollout batch: sequence %d, segment %d: %d tokens of kind %d (expected at least 1, "
                                   "kind 0 injected or 1 sampled)", s, k - first, b->segs[k].len, b->segs[k].kind);
            covered += b->segs[k].len;
        }
        if (covered != b->offsets[s + 1] - b->offsets[s])
            return trill_error(TRILL_ERR_INVALID, "rollout batch: sequence %d has %d tokens, its segments %ld", s,
                               b->offsets[s + 1] - b->offsets[s], covered);
    }
    uint8_t *mask = trill_realloc(b->loss_mask, T ? T : 1);
    if (!mask) return trill_error(TRILL_ERR_NOMEM, "out of memory for a loss mask of %zu tokens", T);
    b->loss_mask = mask;
    for (int s = 0; s < n; s++)
        for (int k = b->seg_offsets[s], t = b->offsets[s]; k < b->seg_offsets[s + 1]; t += b->segs[k++].len)
            memset(mask + t, b->segs[k].kind == RL_SEG_SAMPLED, (size_t)b->segs[k].len);
    return TRILL_OK;
}

trill_status trill_rl_batch_single_turn(rl_batch *b) {
    const int n = b->n_seqs;
    free(b->seg_offsets);
    free(b->segs);
    b->seg_offsets = trill_malloc(sizeof(int) * (size_t)(n + 1));
    b->segs = trill_malloc(sizeof(rl_segment) * (size_t)(2 * n + 1));
    if (!b->seg_offsets || !b->segs) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int s = 0; s < n; s++) {
        b->seg_offsets[s] = k;
        b->segs[k++] = (rl_segment){ .len = b->prompt_len[s], .kind = RL_SEG_INJECTED };
        if (rl_response_len(b, s) > 0) b->segs[k++] = (rl_segment){ .len = rl_response_len(b, s), .kind = RL_SEG_SAMPLED };
    }
    b->seg_offsets[n] = k;
    return trill_rl_batch_derive(b);
}

bool trill_rl_batch_is_single_turn(const rl_batch *b) {
    if (!b->segs) return true;
    for (int s = 0; s < b->n_seqs; s++) {
        const int first = b->seg_offsets[s], count = b->seg_offsets[s + 1] - first;
        if (count > 2 || (count == 2 && b->segs[first + 1].kind != RL_SEG_SAMPLED)) return false;
    }
    return true;
}

static int batch_arrays(rl_batch *b, size_t T, void ***ptr, size_t *bytes);

trill_status trill_rl_batch_alloc(rl_batch *b, size_t T) {
    void **ptr[16] = { 0 };
    size_t bytes[16] = { 0 };
    const int count = batch_arrays(b, T, ptr, bytes);
    for (int i = 0; i < count; i++)
        if (!(*ptr[i] = trill_calloc(1, bytes[i] ? bytes[i] : 1)))
            return trill_error(TRILL_ERR_NOMEM, "out of memory for a batch of %d sequences, %zu tokens", b->n_seqs, T);
    if (!(b->completion = trill_calloc((size_t)b->n_seqs + 1, sizeof(char *))))
        return trill_error(TRILL_ERR_NOMEM, "out of memory for a batch of %d sequences", b->n_seqs);
    return TRILL_OK;
}

static bool is_stop(const trill_request *r, int id) {
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == id) return true;
    return false;
}

trill_status trill_rl_generate(trill_engine *e, const trill_tokenizer *tok, const trill_dataset *d, const int *examples, int n_prompts,
                         int group_size, const uint64_t *request_ids, const trill_request *proto, int n_moe_layers, int top_k,
                         trill_status (*between_steps)(void *), void *ctx, rl_batch *b) {
    memset(b, 0, sizeof *b);
    const int n = n_prompts * group_size;
    trill_status st = TRILL_OK;
    for (int p = 0; p < n_prompts && !st; p++) {
        trill_request r = *proto;
        r.id = request_ids[p];
        r.prompt = d->examples[examples[p]].ids;
        r.prompt_len = d->examples[examples[p]].n_ids;
        r.n = group_size;
        st = trill_engine_submit(e, &r);
    }
    for (bool busy = true; !st;) { /* an expert-parallel group steps together until every rank is done */
        st = trill_engine_group_busy(e, &busy);
        if (st || !busy) break;
        if (between_steps) st = between_steps(ctx);
        if (!st) st = trill_engine_step(e, NULL);
    }
    trill_sequence_out *outs = st ? NULL : trill_calloc((size_t)n, sizeof *outs);
    if (!st && !outs) st = trill_error(TRILL_ERR_NOMEM, "generator: out of memory for the %d samples of a batch", n);
    int got = 0;
    if (!st) {
        trill_sequence_out tmp[64];
        int k;
        while ((k = trill_engine_collect(e, tmp, 64)) > 0)
            for (int i = 0; i < k; i++) {
                int p = 0;
                while (p < n_prompts && request_ids[p] != tmp[i].request) p++;
                const int slot = p * group_size + tmp[i].sample;
                if (slot < 0 || slot >= n || outs[slot].tokens) { trill_sequence_out_free(&tmp[i]); continue; }
                outs[slot] = tmp[i];
                got++;
            }
        if (got != n) st = trill_error(TRILL_ERR_INVALID, "generator: %d of %d samples came back", got, n);
    }
    const int L = n_moe_layers, K = top_k;
    size_t T = 0;
    for (int s = 0; s < n && !st; s++) T += (size_t)(outs[s].n_prompt + outs[s].n_generated);
    b->n_seqs = n; b->group_size = group_size; b->n_moe_layers = L; b->top_k = K;
    if (!st) st = trill_rl_batch_alloc(b, T);
    size_t at = 0;
    for (int s = 0; s < n && !st; s++) {
        const trill_sequence_out *o = &outs[s];
        const int len = o->n_prompt + o->n_generated;
        b->offsets[s] = (int)at;
        b->prompt_len[s] = o->n_prompt;
        b->example[s] = examples[s / group_size];
        b->keep[s] = true;
        memcpy(b->tokens + at, o->tokens, sizeof(int) * (size_t)len);
        for (int t = 0; t < o->n_prompt; t++) b->behav_logp[at + t] = NAN;
        memcpy(b->behav_logp + at + o->n_prompt, o->logprobs, sizeof(float) * (size_t)o->n_generated);
        memcpy(b->version + at + o->n_prompt, o->versions, sizeof(uint32_t) * (size_t)o->n_generated);
        if (L) {
            const size_t row = (size_t)L * K;
            if (o->experts) memcpy(b->experts + at * row, o->experts, sizeof(uint16_t) * row * (size_t)(len - 1));
            else for (size_t i = 0; i < row * (size_t)(len - 1); i++) b->experts[at * row + i] = TRILL_REPLAY_NONE;
            for (size_t i = 0; i < row; i++) b->experts[(at + (size_t)len - 1) * row + i] = TRILL_REPLAY_NONE;
        }
        int n_text = o->n_generated;
        if (n_text > 0 && o->finish == TRILL_FINISH_STOP_ID && is_stop(proto, o->tokens[len - 1])) n_text--;
        size_t text_len;
        st = trill_tokenizer_decode_lenient(tok, o->tokens + o->n_prompt, n_text, &b->completion[s], &text_len);
        at += (size_t)len;
    }
    if (!st) b->offsets[n] = (int)at;
    if (!st) st = trill_rl_batch_single_turn(b);
    for (int s = 0; outs && s < n; s++) trill_sequence_out_free(&outs[s]);
    free(outs);
    if (st) {
        /* leave the engine empty for the next caller */
        trill_sequence_out tmp[16];
        int k;
        while (trill_engine_busy(e)) if (trill_engine_step(e, NULL)) break;
        while ((k = trill_engine_collect(e, tmp, 16)) > 0) for (int i = 0; i < k; i++) trill_sequence_out_free(&tmp[i]);
        trill_rl_batch_free(b);
    }
    return st;
}

/* Copies sequence s of `from` (its tokens at `at`) to sequence `to` of b; returns its length. */
static size_t copy_sequence(rl_batch *b, int to, size_t at, const rl_batch *from, int s) {
    const size_t row = (size_t)b->n_moe_layers * b->top_k, first = (size_t)from->offsets[s];
    const size_t len = (size_t)(from->offsets[s + 1] - from->offsets[s]);
    b->offsets[to] = (int)at;
    b->prompt_len[to] = from->prompt_len[s];
    b->example[to] = from->example[s];
    b->reward[to] = from->reward[s];
    b->adv[to] = from->adv[s];
    b->correct[to] = from->correct[s];
    b->keep[to] = from->keep[s];
    memcpy(b->tokens + at, from->tokens + first, sizeof(int) * len);
    memcpy(b->behav_logp + at, from->behav_logp + first, sizeof(float) * len);
    memcpy(b->version + at, from->version + first, sizeof(uint32_t) * len);
    if (row) memcpy(b->experts + at * row, from->experts + first * row, sizeof(uint16_t) * len * row);
    if (b->episodes) b->episodes[to] = from->episodes[s];
    return len;
}

/* The merged batch's segments, in the order merge placed the sequences (parts without segments:
 * single-turn). */
static trill_status merge_segments(const rl_batch *parts, int n_parts, const int *part_of, int n_groups, rl_batch *b) {
    bool any = false;
    size_t total = 0;
    for (int j = 0; j < n_parts; j++) {
        any |= parts[j].segs != NULL;
        total += parts[j].segs ? (size_t)parts[j].seg_offsets[parts[j].n_seqs] : 2 * (size_t)parts[j].n_seqs;
    }
    if (!any) return trill_rl_batch_single_turn(b);
    b->seg_offsets = trill_malloc(sizeof(int) * (size_t)(b->n_seqs + 1));
    b->segs = trill_malloc(sizeof(rl_segment) * (total + 1));
    int *next = trill_calloc((size_t)n_parts, sizeof(int));
    trill_status st = b->seg_offsets && b->segs && next ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    const int G = b->group_size;
    int k = 0;
    for (int g = 0, to = 0; g < n_groups && !st; g++) {
        const rl_batch *p = &parts[part_of[g]];
        for (int i = 0; i < G; i++, to++) {
            const int s = next[part_of[g]] * G + i;
            b->seg_offsets[to] = k;
            if (!p->segs) {
                b->segs[k++] = (rl_segment){ .len = p->prompt_len[s], .kind = RL_SEG_INJECTED };
                if (rl_response_len(p, s) > 0) b->segs[k++] = (rl_segment){ .len = rl_response_len(p, s), .kind = RL_SEG_SAMPLED };
                continue;
            }
            const int n = p->seg_offsets[s + 1] - p->seg_offsets[s];
            memcpy(b->segs + k, p->segs + p->seg_offsets[s], sizeof(rl_segment) * (size_t)n);
            k += n;
        }
        next[part_of[g]]++;
    }
    if (!st) b->seg_offsets[b->n_seqs] = k;
    free(next);
    return st ? st : trill_rl_batch_derive(b);
}

trill_status trill_rl_batch_merge(const rl_batch *parts, int n_parts, const int *part_of, int n_groups, rl_batch *b) {
    memset(b, 0, sizeof *b);
    if (n_parts < 1) return trill_error(TRILL_ERR_INVALID, "rollout batch merge: no parts");
    const int G = parts[0].group_size, L = parts[0].n_moe_layers, K = parts[0].top_k;
    size_t T = 0;
    int seqs = 0;
    for (int j = 0; j < n_parts; j++) {
        const rl_batch *p = &parts[j];
        int groups = 0;
        for (int g = 0; g < n_groups; g++) groups += part_of[g] == j;
        if (p->n_seqs != groups * G || (p->n_seqs && (p->group_size != G || p->n_moe_layers != L || p->top_k != K)))
            return trill_error(TRILL_ERR_INVALID, "rollout batch merge: part %d has %d sequences in groups of %d (%d x top-%d experts), "
                               "expected %d groups of %d (%d x top-%d)", j, p->n_seqs, p->group_size, p->n_moe_layers, p->top_k,
                               groups, G, L, K);
        T += p->n_seqs ? (size_t)p->offsets[p->n_seqs] : 0;
        seqs += p->n_seqs;
    }
    b->n_seqs = seqs;
    b->group_size = G;
    b->n_moe_layers = L;
    b->top_k = K;
    trill_status st = trill_rl_batch_alloc(b, T);
    bool episodes = false;
    for (int j = 0; j < n_parts; j++) episodes |= parts[j].episodes != NULL;
    for (int j = 0; j < n_parts && episodes && !st; j++)
        if (parts[j].n_seqs && !parts[j].episodes)
            st = trill_error(TRILL_ERR_INVALID, "rollout batch merge: part %d has no episodes where others have", j);
    if (!st && episodes && (!(b->episodes = trill_calloc((size_t)seqs + 1, sizeof(rl_episode))) ||
                            !(b->env_metrics = trill_calloc((size_t)seqs + 1, sizeof(char *)))))
        st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    int *next = st ? NULL : trill_calloc((size_t)n_parts, sizeof(int)); /* each part's next group */
    if (!st && !next) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t at = 0;
    for (int g = 0, to = 0; g < n_groups && !st; g++) {
        const rl_batch *p = &parts[part_of[g]];
        for (int k = 0; k < G && !st; k++, to++) {
            const int s = next[part_of[g]] * G + k;
            at += copy_sequence(b, to, at, p, s);
            if (!(b->completion[to] = trill_strdup(p->completion[s])) || (episodes && !(b->env_metrics[to] = trill_strdup(p->env_metrics[s]))))
                st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        }
        next[part_of[g]]++;
    }
    if (!st) b->offsets[seqs] = (int)at;
    if (!st) st = merge_segments(parts, n_parts, part_of, n_groups, b);
    free(next);
    if (st) trill_rl_batch_free(b);
    return st;
}

/* ---- serialisation ---- */

#define PACK_MAGIC 0x424c5254u /* "TRLB" */

/* Format 1: a single-turn batch (every sequence a prompt and a completion): the header, the arrays
 * of batch_arrays, the completions. Format 2, a batch of trajectories: the header, the number of
 * segments (int64), the same arrays, seg_offsets [n_seqs + 1] and the segments, the completions.
 * Format 3, a batch of episodes: format 2 with the episodes [n_seqs] after the segments, and each
 * episode's environment metrics (JSON text, NUL-terminated) after the completions. */
typedef struct pack_header {
    uint32_t magic, format;
    int32_t n_seqs, group_size, n_moe_layers, top_k;
    int64_t n_tokens, text_bytes;
} pack_header;

/* Every array of a batch: where it lives and how many bytes it holds. */
static int batch_arrays(rl_batch *b, size_t T, void ***ptr, size_t *bytes) {
    const size_t n = (size_t)b->n_seqs, row = (size_t)b->n_moe_layers * b->top_k;
    void **p[] = { (void **)&b->offsets, (void **)&b->prompt_len, (void **)&b->tokens, (void **)&b->behav_logp,
                   (void **)&b->version, (void **)&b->experts, (void **)&b->example, (void **)&b->reward,
                   (void **)&b->adv, (void **)&b->correct, (void **)&b->keep };
    const size_t sz[] = { sizeof(int) * (n + 1), sizeof(int) * n, sizeof(int) * T, sizeof(float) * T, sizeof(uint32_t) * T,
                          sizeof(uint16_t) * T * row, sizeof(int) * n, sizeof(double) * n, sizeof(double) * n,
                          sizeof(double) * n, sizeof(bool) * n };
    const int count = (int)(sizeof sz / sizeof sz[0]);
    for (int i = 0; i < count; i++) { ptr[i] = p[i]; bytes[i] = sz[i]; }
    return count;
}

trill_status trill_rl_batch_pack(const rl_batch *b, void **buf, size_t *len) {
    rl_batch v = *b; /* only read through the pointers */
    const size_t T = b->n_seqs ? (size_t)b->offsets[b->n_seqs] : 0;
    void **ptr[16] = { 0 };
    size_t bytes[16] = { 0 }, total = sizeof(pack_header), text = 0;
    int count = batch_arrays(&v, T, ptr, bytes);
    const bool turns = b->episodes || !trill_rl_batch_is_single_turn(b);
    const int64_t n_segs = turns ? b->seg_offsets[b->n_seqs] : 0;
    if (turns) {
        ptr[count] = (void **)&v.seg_offsets;
        bytes[count++] = sizeof(int) * (size_t)(b->n_seqs + 1);
        ptr[count] = (void **)&v.segs;
        bytes[count++] = sizeof(rl_segment) * (size_t)n_segs;
        total += sizeof n_segs;
    }
    if (b->episodes) {
        ptr[count] = (void **)&v.episodes;
        bytes[count++] = sizeof(rl_episode) * (size_t)b->n_seqs;
    }
    for (int i = 0; i < count; i++) total += bytes[i];
    for (int s = 0; s < b->n_seqs; s++) text += strlen(b->completion[s]) + 1 + (b->episodes ? strlen(b->env_metrics[s]) + 1 : 0);
    char *out = trill_malloc(total + text);
    if (!out) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    pack_header h = { PACK_MAGIC, b->episodes ? 3 : turns ? 2 : 1, b->n_seqs, b->group_size, b->n_moe_layers, b->top_k, (int64_t)T, (int64_t)text };
    memcpy(out, &h, sizeof h);
    size_t at = sizeof h;
    if (turns) {
        memcpy(out + at, &n_segs, sizeof n_segs);
        at += sizeof n_segs;
    }
    for (int i = 0; i < count; i++) {
        if (bytes[i]) memcpy(out + at, *ptr[i], bytes[i]);
        at += bytes[i];
    }
    for (int k = 0; k < (b->episodes ? 2 : 1); k++)
        for (int s = 0; s < b->n_seqs; s++) {
            const char *t = k ? b->env_metrics[s] : b->completion[s];
            const size_t n = strlen(t) + 1;
            memcpy(out + at, t, n);
            at += n;
        }
    *buf = out;
    *len = at;
    return TRILL_OK;
}

/* The header (format 2: and its segment count) of a packed batch, checked; *head: its bytes. */
static trill_status unpack_header(const void *buf, size_t len, pack_header *h, int64_t *n_segs, size_t *head) {
    if (len < sizeof *h) return trill_error(TRILL_ERR_INVALID, "rollout batch: %zu bytes, shorter than its header", len);
    memcpy(h, buf, sizeof *h);
    if (h->magic != PACK_MAGIC || h->format < 1 || h->format > 3)
        return trill_error(TRILL_ERR_INVALID, "rollout batch: not a packed rollout batch (magic %08x, format %u)", h->magic, h->format);
    *n_segs = 0;
    *head = sizeof *h;
    if (h->format >= 2) {
        if (len < *head + sizeof *n_segs) return trill_error(TRILL_ERR_INVALID, "rollout batch: %zu bytes, shorter than its header", len);
        memcpy(n_segs, (const char *)buf + *head, sizeof *n_segs);
        *head += sizeof *n_segs;
        if (*n_segs < h->n_seqs || *n_segs > h->n_tokens)
            return trill_error(TRILL_ERR_INVALID, "rollout batch: %lld segments for %d sequences of %lld tokens", (long long)*n_segs, h->n_seqs,
                               (long long)h->n_tokens);
    }
    if (h->n_seqs < 0 || h->group_size < 0 || h->n_moe_layers < 0 || h->top_k < 0 || h->n_tokens < 0 || h->text_bytes < 0 ||
        h->n_seqs > (1 << 24) || h->n_tokens > ((int64_t)1 << 34) || (h->n_moe_layers && h->top_k > 64))
        return trill_error(TRILL_ERR_INVALID, "rollout batch: header out of range (%d sequences, %lld tokens)", h->n_seqs,
                           (long long)h->n_tokens);
    return TRILL_OK;
}

/* The unpacked segment offsets: from 0 (trill_rl_batch_derive checks) to the n_segs, never decreasing. */
static trill_status check_segment_offsets(const rl_batch *b, int64_t n_segs) {
    if (b->seg_offsets[b->n_seqs] != n_segs)
        return trill_error(TRILL_ERR_INVALID, "rollout batch: the segment offsets end at %d, not at its %lld segments", b->seg_offsets[b->n_seqs],
                           (long long)n_segs);
    for (int s = 0; s < b->n_seqs; s++)
        if (b->seg_offsets[s + 1] < b->seg_offsets[s])
            return trill_error(TRILL_ERR_INVALID, "rollout batch: sequence %d's segment offsets decrease", s);
    return TRILL_OK;
}

/* The unpacked episodes' outcomes: a known stop reason, at least one turn, a finite return. */
static trill_status check_episodes(const rl_batch *b) {
    for (int s = 0; s < b->n_seqs; s++) {
        const rl_episode *e = &b->episodes[s];
        if (e->stop < 0 || e->stop >= RL_STOP_KINDS || e->turns < 1 || e->cut_turns < 0 || e->cut_turns > e->turns || !isfinite(e->env_return))
            return trill_error(TRILL_ERR_INVALID, "rollout batch: episode %d has stop reason %d, %d turns (%d cut), return %g", s, e->stop,
                               e->turns, e->cut_turns, e->env_return);
    }
    return TRILL_OK;
}

/* n NUL-terminated texts from in[*at, len) into out. */
static trill_status read_texts(const char *in, size_t len, size_t *at, int n, const char *what, char **out) {
    for (int s = 0; s < n; s++) {
        const char *text = in + *at, *nul = *at < len ? memchr(text, 0, len - *at) : NULL;
        if (!nul) return trill_error(TRILL_ERR_INVALID, "rollout batch: %s %d is not terminated", what, s);
        if (!(out[s] = trill_strdup(text))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
        *at = (size_t)(nul - in) + 1;
    }
    return TRILL_OK;
}

trill_status trill_rl_batch_unpack(const void *buf, size_t len, rl_batch *b) {
    memset(b, 0, sizeof *b);
    pack_header h;
    int64_t n_segs = 0;
    size_t head = 0;
    trill_status hst = unpack_header(buf, len, &h, &n_segs, &head);
    if (hst) return hst;
    b->n_seqs = h.n_seqs;
    b->group_size = h.group_size;
    b->n_moe_layers = h.n_moe_layers;
    b->top_k = h.top_k;
    void **ptr[16] = { 0 };
    size_t bytes[16] = { 0 }, need = head;
    int count = batch_arrays(b, (size_t)h.n_tokens, ptr, bytes);
    if (h.format >= 2) {
        ptr[count] = (void **)&b->seg_offsets;
        bytes[count++] = sizeof(int) * (size_t)(h.n_seqs + 1);
        ptr[count] = (void **)&b->segs;
        bytes[count++] = sizeof(rl_segment) * (size_t)n_segs;
    }
    if (h.format == 3) {
        ptr[count] = (void **)&b->episodes;
        bytes[count++] = sizeof(rl_episode) * (size_t)h.n_seqs;
    }
    for (int i = 0; i < count; i++) need += bytes[i];
    if (need + (size_t)h.text_bytes != len)
        return trill_error(TRILL_ERR_INVALID, "rollout batch: %zu bytes, the header describes %zu", len, need + (size_t)h.text_bytes);
    const char *in = buf;
    size_t at = head;
    trill_status st = TRILL_OK;
    for (int i = 0; i < count && !st; i++) {
        if (!(*ptr[i] = trill_malloc(bytes[i] ? bytes[i] : 1))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else memcpy(*ptr[i], in + at, bytes[i]);
        at += bytes[i];
    }
    if (!st && !(b->completion = trill_calloc((size_t)h.n_seqs + 1, sizeof(char *)))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && (b->offsets[0] != 0 || b->offsets[h.n_seqs] != h.n_tokens))
        st = trill_error(TRILL_ERR_INVALID, "rollout batch: sequence offsets do not cover the %lld tokens", (long long)h.n_tokens);
    for (int s = 0; s < h.n_seqs && !st; s++)
        if (b->offsets[s + 1] <= b->offsets[s] || b->prompt_len[s] < 1 || b->prompt_len[s] > b->offsets[s + 1] - b->offsets[s])
            st = trill_error(TRILL_ERR_INVALID, "rollout batch: sequence %d has offsets [%d, %d) and prompt length %d", s, b->offsets[s],
                             b->offsets[s + 1], b->prompt_len[s]);
    if (!st) st = read_texts(in, len, &at, h.n_seqs, "completion", b->completion);
    if (!st && h.format == 3 && !(b->env_metrics = trill_calloc((size_t)h.n_seqs + 1, sizeof(char *))))
        st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && h.format == 3) st = read_texts(in, len, &at, h.n_seqs, "episode metrics", b->env_metrics);
    if (!st && at != len) st = trill_error(TRILL_ERR_INVALID, "rollout batch: %zu bytes after the last completion", len - at);
    if (!st && h.format >= 2) st = check_segment_offsets(b, n_segs);
    if (!st) st = h.format >= 2 ? trill_rl_batch_derive(b) : trill_rl_batch_single_turn(b);
    if (!st && h.format == 3) st = check_episodes(b);
    if (st) trill_rl_batch_free(b);
    return st;
}
