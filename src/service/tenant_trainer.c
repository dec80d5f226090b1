/* The tenant trainer (trill/service.h): a LoRA adapter, its accumulated gradient and its AdamW
 * state on a shared base model, with Tinker's losses. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arch/family.h"
#include "base/alloc.h"
#include "base/json.h"
#include "trill/fileio.h"
#include "trill/optim.h"
#include "trill/service.h"
#include "trill/chat.h"
#include "trill/tokenizer.h"
#include "trill/train.h"

struct trill_svc_base {
    char *dir, *name;
    trill_model *model;
    trill_tokenizer *tok; /* NULL when the folder has no tokenizer.json */
    trill_chat_template *chat; /* its chat template, read once; NULL: none that trill renders (chat_error says why) */
    char *chat_error;
};

struct trill_svc_trainer {
    trill_svc_base *base;
    trill_svc_trainer_config config;
    trill_lora *lora;
    trill_adamw *opt;
    float *grads; /* [n_params]: the sum of forward_backward's gradients since the last step */
    size_t n_params;
};

/* ---- the base ---- */

trill_status trill_svc_base_load(const char *dir, const char *name, trill_svc_base **out) {
    *out = NULL;
    trill_svc_base *b = trill_calloc(1, sizeof *b);
    if (!b) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--; /* "models/tiny/" names "tiny" */
    b->dir = trill_strdup(dir);
    if (!b->dir) { free(b); return trill_error(TRILL_ERR_NOMEM, "out of memory"); }
    b->dir[len] = '\0';
    const char *slash = strrchr(b->dir, '/');
    b->name = trill_strdup(name ? name : slash ? slash + 1 : b->dir);
    trill_status st = b->name ? trill_model_load_as(b->dir, TRILL_STORE_CHECKPOINT, &b->model)
                              : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer.json", b->dir);
        if (trill_file_exists(path)) st = trill_tokenizer_load(b->dir, &b->tok);
    }
    if (!st && b->tok && trill_chat_template_load(b->dir, &b->chat)) /* no template, or one trill does not render: said when asked */
        b->chat_error = trill_strdup(trill_error_message());
    if (st) {
        trill_error_context("base model %s", dir);
        trill_svc_base_free(b);
        return st;
    }
    *out = b;
    return TRILL_OK;
}

void trill_svc_base_free(trill_svc_base *b) {
    if (!b) return;
    trill_model_free(b->model);
    trill_tokenizer_free(b->tok);
    trill_chat_template_free(b->chat);
    free(b->chat_error);
    free(b->dir);
    free(b->name);
    free(b);
}

const char *trill_svc_base_name(const trill_svc_base *b) { return b->name; }
const char *trill_svc_base_dir(const trill_svc_base *b) { return b->dir; }
trill_model *trill_svc_base_model(trill_svc_base *b) { return b->model; }
const trill_tokenizer *trill_svc_base_tokenizer(const trill_svc_base *b) { return b->tok; }
const struct trill_chat_template *trill_svc_base_chat(const trill_svc_base *b, const char **why) {
    if (why) *why = b->tok ? b->chat_error ? b->chat_error : "out of memory" : "this model has no tokenizer.json";
    return b->chat;
}

/* ---- losses ---- */

trill_svc_loss_config trill_svc_loss_config_default(void) { return (trill_svc_loss_config){ .clip_low = 0.8, .clip_high = 1.2, .beta = NAN }; }

/* One token's loss and d loss / d lp (lp: the trainer's log-probability of the target; q, a, w:
 * the datum's sampler log-prob, advantage and weight), by the loss table (trill/loss.h): the
 * ratio is taken against the sampler, its log clamped to [-20, 20] before exp as the RL losses do,
 * so a far-off token cannot overflow the sum. */
static double token_loss(trill_loss loss, const trill_svc_loss_config *c, double lp, double q, double a, double w, double *grad) {
    const trill_loss_params p = { .lo = c->clip_low, .hi = c->clip_high, .beta = c->beta };
    double value, ratio;
    trill_loss_get(loss)->token(&p, lp, q, a, w, &value, grad, &ratio);
    return value;
}

trill_status trill_svc_datum_check(const trill_svc_base *b, trill_loss loss, const trill_svc_datum *d, int index) {
    const trill_config *c = trill_model_config(b->model);
    if (d->n < 1) return trill_error(TRILL_ERR_INVALID, "data[%d].model_input: empty (at least one token)", index);
    if (!d->targets) return trill_error(TRILL_ERR_INVALID, "data[%d].loss_fn_inputs.target_tokens: missing", index);
    const int K = d->k > 1 ? d->k : 1;
    if (d->k < 0 || d->k > TRILL_MAX_TARGETS)
        return trill_error(TRILL_ERR_INVALID, "data[%d].loss_fn_inputs.target_tokens: %d targets a position; 1 to %d are taken", index, d->k,
                           TRILL_MAX_TARGETS);
    for (int i = 0; i < d->n; i++)
        if (d->tokens[i] < 0 || d->tokens[i] >= c->vocab_size)
            return trill_error(TRILL_ERR_INVALID, "data[%d].model_input[%d]: token %d is outside the vocabulary [0, %d)", index, i,
                               d->tokens[i], c->vocab_size);
    for (int i = 0; i < d->n * K; i++)
        if (d->targets[i] < 0 || d->targets[i] >= c->vocab_size)
            return trill_error(TRILL_ERR_INVALID, "data[%d].loss_fn_inputs.target_tokens[%d]: token %d is outside the vocabulary [0, %d)",
                               index, i / K, d->targets[i], c->vocab_size);
    const trill_loss_info *L = trill_loss_get(loss);
    if (!L || !(L->where & TRILL_LOSS_IN_SERVE)) return trill_error(TRILL_ERR_INVALID, "loss_fn: %d is not a loss of the service", (int)loss);
    if (K > 1 && (loss != TRILL_LOSS_CROSS_ENTROPY || d->logprobs || d->advantages))
        return trill_error(TRILL_ERR_INVALID, "data[%d].loss_fn_inputs.target_tokens: top-k targets (%d a position) are taken by cross_entropy, "
                           "with weights of the same shape and no logprobs or advantages", index, K);
    if ((L->needs & TRILL_LOSS_NEEDS_LOGPROBS) && !d->logprobs)
        return trill_error(TRILL_ERR_INVALID, "data[%d].loss_fn_inputs.logprobs: missing (%s needs the sampler's log-probs)", index, L->name);
    if ((L->needs & TRILL_LOSS_NEEDS_ADVANTAGES) && !d->advantages)
        return trill_error(TRILL_ERR_INVALID, "data[%d].loss_fn_inputs.advantages: missing (%s needs them)", index, L->name);
    const struct { const char *name; const float *v; int per; } arrays[] = { { "weights", d->weights, K }, { "logprobs", d->logprobs, 1 },
                                                                              { "advantages", d->advantages, 1 } };
    for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++)
        for (int i = 0; arrays[a].v && i < d->n * arrays[a].per; i++)
            if (!isfinite(arrays[a].v[i]))
                return trill_error(TRILL_ERR_INVALID, "data[%d].loss_fn_inputs.%s[%d]: not a finite number", index, arrays[a].name, i / arrays[a].per);
    if (d->routed_experts) {
        trill_status st = trill_check_replay(c, d->routed_experts, d->n);
        if (st) {
            trill_error_context("data[%d].loss_fn_inputs.routed_experts", index);
            return st;
        }
    }
    return TRILL_OK;
}

/* ---- the trainer ---- */

static unsigned lora_targets(const trill_config *c, const trill_svc_trainer_config *tc) {
    const unsigned attn = 1u << TRILL_LORA_Q | 1u << TRILL_LORA_K | 1u << TRILL_LORA_V | 1u << TRILL_LORA_O | 1u << TRILL_LORA_Q_A |
                          1u << TRILL_LORA_Q_B | 1u << TRILL_LORA_KV_A | 1u << TRILL_LORA_KV_B;
    const unsigned mlp = 1u << TRILL_LORA_GATE | 1u << TRILL_LORA_UP | 1u << TRILL_LORA_DOWN;
    const unsigned want = (tc->train_attn ? attn : 0) | (tc->train_mlp ? mlp : 0) | (tc->train_unembed ? 1u << TRILL_LORA_LM_HEAD : 0);
    return want & trill_family_of(c)->lora_targets;
}

/* The trainer around an adapter (taken) and an optimizer (taken; NULL: a fresh one). */
static trill_status trainer_wrap(trill_svc_base *b, const trill_svc_trainer_config *c, trill_lora *lora, trill_adamw *opt,
                                 trill_svc_trainer **out) {
    trill_svc_trainer *t = trill_calloc(1, sizeof *t);
    trill_status st = t ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        *t = (trill_svc_trainer){ .base = b, .config = *c, .lora = lora, .opt = opt };
        trill_lora_params(lora, &t->n_params);
        t->grads = trill_calloc(t->n_params ? t->n_params : 1, sizeof(float));
        if (!t->grads) st = trill_error(TRILL_ERR_NOMEM, "out of memory (the adapter's gradient)");
    }
    if (!st && !opt) st = trill_adamw_create(t->n_params, trill_adamw_defaults(), &t->opt);
    if (st) {
        if (t) { t->lora = NULL; t->opt = NULL; trill_svc_trainer_free(t); }
        trill_lora_free(lora);
        trill_adamw_free(opt);
        return st;
    }
    *out = t;
    return TRILL_OK;
}

trill_status trill_svc_trainer_create(trill_svc_base *b, const trill_svc_trainer_config *c, trill_svc_trainer **out) {
    *out = NULL;
    const unsigned targets = lora_targets(trill_model_config(b->model), c);
    if (!targets) return trill_error(TRILL_ERR_INVALID, "train_mlp, train_attn, train_unembed: none is set, so nothing would train");
    trill_lora *lora = NULL;
    trill_status st = trill_lora_create(b->model, (trill_lora_config){ .rank = c->rank, .alpha = 32, .targets = targets }, c->seed, &lora);
    return st ? st : trainer_wrap(b, c, lora, NULL, out);
}

void trill_svc_trainer_free(trill_svc_trainer *t) {
    if (!t) return;
    trill_lora_free(t->lora);
    trill_adamw_free(t->opt);
    free(t->grads);
    free(t);
}

const trill_svc_trainer_config *trill_svc_trainer_get_config(const trill_svc_trainer *t) { return &t->config; }
int64_t trill_svc_trainer_step(const trill_svc_trainer *t) { return t->opt->step; }
trill_lora *trill_svc_trainer_lora(trill_svc_trainer *t) { return t->lora; }
const float *trill_svc_trainer_grads(const trill_svc_trainer *t, size_t *n) { *n = t->n_params; return t->grads; }

/* Tokens a forward keeps activations for at once. */
enum { MICRO_TOKENS = 4096 };

/* A datum's tokens in a forward: its inputs and one more row (which the last target needs). */
static int datum_len(const void *ctx, int i) { return ((const trill_svc_datum *)ctx)[i].n + 1; }

/* A call's targets a position (the data agree: trill_svc_forward checks). */
static int targets_of(const trill_svc_datum *d) { return d->k > 1 ? d->k : 1; }

/* One micro-batch, data [d0, d1): each datum forwarded as its n inputs and its last target, row
 * i scored on its K targets i (any tokens: the next input's, or others). */
static trill_status forward_micro(trill_svc_trainer *t, const trill_svc_datum *data, int d0, int d1, trill_loss loss,
                                  const trill_svc_loss_config *cfg, bool backward, float *logprobs, double *loss_sum) {
    const trill_config *c = trill_model_config(t->base->model);
    const int row = c->n_moe_layers * c->num_experts_per_tok, K = targets_of(&data[d0]);
    int T = 0;
    bool replay = false;
    for (int d = d0; d < d1; d++) T += data[d].n + 1, replay |= data[d].routed_experts != NULL;
    int *tokens = trill_malloc(sizeof(int) * (size_t)T), *targets = trill_calloc((size_t)T * K, sizeof(int));
    int *offsets = trill_malloc(sizeof(int) * (size_t)(d1 - d0 + 1));
    float *lp = trill_malloc(sizeof(float) * (size_t)T * K), *dlp = backward ? trill_calloc((size_t)T * K, sizeof(float)) : NULL;
    uint16_t *rep = replay && row ? trill_malloc(sizeof(uint16_t) * (size_t)T * row) : NULL;
    trill_status st = tokens && targets && offsets && lp && (dlp || !backward) && (rep || !replay || !row) ? TRILL_OK
                                                                                                : trill_error(TRILL_ERR_NOMEM, "out of memory (a forward of %d tokens)", T);
    for (int d = d0, at = 0; !st && d < d1; d++) {
        const trill_svc_datum *x = &data[d];
        offsets[d - d0] = at;
        memcpy(tokens + at, x->tokens, sizeof(int) * (size_t)x->n);
        memcpy(targets + (size_t)at * K, x->targets, sizeof(int) * (size_t)x->n * K);
        tokens[at + x->n] = x->targets[(size_t)(x->n - 1) * K];
        if (rep) { /* a (token, layer) row starting with TRILL_REPLAY_NONE is routed by the trainer */
            const int k = c->num_experts_per_tok, replayed = x->routed_experts ? x->n : 0;
            if (replayed) memcpy(rep + (size_t)at * row, x->routed_experts, sizeof(uint16_t) * (size_t)x->n * row);
            for (int r = (at + replayed) * c->n_moe_layers; r < (at + x->n + 1) * c->n_moe_layers; r++) rep[(size_t)r * k] = TRILL_REPLAY_NONE;
        }
        at += x->n + 1;
        offsets[d - d0 + 1] = at;
    }
    trill_forward_pass *pass = NULL;
    if (!st) st = trill_model_forward_train_targets(t->base->model, tokens, targets, K, offsets, d1 - d0, rep, lp, NULL, false, &pass);
    for (int d = d0, k = 0; !st && d < d1; d++) {
        const trill_svc_datum *x = &data[d];
        for (int i = 0; i < x->n * K; i++) { /* position i / K, its target i % K */
            const size_t at = (size_t)(offsets[d - d0] + i / K + 1) * K + i % K;
            double g;
            *loss_sum += token_loss(loss, cfg, lp[at], x->logprobs ? x->logprobs[i] : 0, x->advantages ? x->advantages[i] : 0,
                                    x->weights ? x->weights[i] : 1, &g);
            if (dlp) dlp[at] = (float)g;
            logprobs[k++] = lp[at];
        }
    }
    if (!st && backward) st = trill_model_backward(pass, dlp, NULL, t->grads);
    trill_forward_pass_free(pass);
    free(tokens), free(targets), free(offsets), free(lp), free(dlp), free(rep);
    return st;
}

trill_status trill_svc_forward(trill_svc_trainer *t, const trill_svc_datum *data, int n, trill_loss loss,
                               const trill_svc_loss_config *config, bool backward, float *logprobs, double *loss_sum) {
    *loss_sum = 0;
    if (!trill_loss_get(loss) || !(trill_loss_get(loss)->where & TRILL_LOSS_IN_SERVE))
        return trill_error(TRILL_ERR_INVALID, "loss_fn: %d is not a loss of the service", (int)loss);
    if (loss == TRILL_LOSS_DRO && !isfinite(config->beta))
        return trill_error(TRILL_ERR_INVALID, "loss_fn_config.beta: dro needs beta (a finite number)");
    for (int d = 0; d < n; d++) {
        trill_status st = trill_svc_datum_check(t->base, loss, &data[d], d);
        if (st) return st;
        if (targets_of(&data[d]) != targets_of(&data[0]))
            return trill_error(TRILL_ERR_INVALID, "data[%d].loss_fn_inputs.target_tokens: %d targets a position, data[0] has %d: one count a call", d,
                               targets_of(&data[d]), targets_of(&data[0]));
    }
    trill_model_attach_lora(t->base->model, t->lora);
    trill_status st = TRILL_OK;
    for (int d0 = 0, k = 0; !st && d0 < n;) {
        const int d1 = d0 + trill_micro_batch_take(n - d0, MICRO_TOKENS, datum_len, data + d0);
        st = forward_micro(t, data, d0, d1, loss, config, backward, logprobs + k, loss_sum);
        for (; d0 < d1; d0++) k += data[d0].n * targets_of(&data[d0]);
    }
    trill_model_attach_lora(t->base->model, NULL);
    /* A gradient only partly added is worth nothing: clear it rather than step on it. */
    if (st && backward) memset(t->grads, 0, sizeof(float) * t->n_params);
    return st;
}

trill_svc_adam trill_svc_adam_default(void) {
    return (trill_svc_adam){ .learning_rate = 1e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-12, .weight_decay = 0, .grad_clip_norm = 0 };
}

trill_status trill_svc_optim_step(trill_svc_trainer *t, const trill_svc_adam *p, double *grad_norm) {
    if (!(p->learning_rate >= 0) || !(p->beta1 >= 0 && p->beta1 < 1) || !(p->beta2 >= 0 && p->beta2 < 1) || !(p->eps > 0) ||
        !(p->weight_decay >= 0) || !(p->grad_clip_norm >= 0))
        return trill_error(TRILL_ERR_INVALID, "adam_params: learning_rate >= 0, 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0 and "
                                              "grad_clip_norm >= 0 expected");
    const double norm = trill_clip_grad_norm(t->grads, t->n_params, p->grad_clip_norm);
    *grad_norm = norm;
    if (!isfinite(norm)) {
        memset(t->grads, 0, sizeof(float) * t->n_params);
        return trill_error(TRILL_ERR_INVALID, "optim_step: the gradient's norm is not finite; the step was not taken and the gradient was cleared");
    }
    t->opt->config = (trill_adamw_config){ .beta1 = p->beta1, .beta2 = p->beta2, .eps = p->eps, .weight_decay = p->weight_decay };
    size_t n;
    trill_adamw_step(t->opt, trill_lora_params(t->lora, &n), t->grads, p->learning_rate, NULL);
    memset(t->grads, 0, sizeof(float) * t->n_params);
    return TRILL_OK;
}

/* ---- saved states ---- */

static trill_status write_meta(const trill_svc_trainer *t, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/trill_service.json", dir);
    json_t *o = json_pack("{s:s, s:i, s:I, s:b, s:b, s:b, s:I}", "base_model", t->base->name, "rank", t->config.rank, "seed",
                          (json_int_t)t->config.seed, "train_mlp", t->config.train_mlp, "train_attn", t->config.train_attn,
                          "train_unembed", t->config.train_unembed, "step", (json_int_t)t->opt->step);
    trill_status st = trill_json_write_file(path, o);
    json_decref(o);
    return st;
}

trill_status trill_svc_trainer_save(const trill_svc_trainer *t, const char *dir, bool optimizer) {
    char path[4096];
    trill_status st = trill_mkdir_p(dir);
    if (!st) st = trill_lora_save(t->lora, dir);
    if (!st && optimizer) {
        snprintf(path, sizeof path, "%s/optimizer", dir);
        st = trill_adamw_save(t->opt, path);
    }
    if (!st) st = write_meta(t, dir); /* last: a state without it is incomplete, and refused */
    return st;
}

static trill_status read_meta(const trill_svc_base *b, const char *dir, trill_svc_trainer_config *c) {
    char path[4096];
    snprintf(path, sizeof path, "%s/trill_service.json", dir);
    json_t *o = NULL;
    trill_status st = trill_json_load_file(path, &o);
    const char *base = NULL;
    long long seed = 0;
    if (!st) st = trill_json_get_string(o, "base_model", path, &base);
    if (!st && (!base || strcmp(base, b->name) != 0))
        st = trill_error(TRILL_ERR_INVALID, "%s: base_model: the state is for \"%s\", not \"%s\"", path, base ? base : "?", b->name);
    if (!st) st = trill_json_get_int(o, "rank", path, 1, 4096, &c->rank);
    json_t *s = o ? json_object_get(o, "seed") : NULL;
    if (!st && json_is_integer(s)) seed = json_integer_value(s);
    c->seed = (uint64_t)seed;
    if (!st) st = trill_json_get_bool(o, "train_mlp", path, &c->train_mlp);
    if (!st) st = trill_json_get_bool(o, "train_attn", path, &c->train_attn);
    if (!st) st = trill_json_get_bool(o, "train_unembed", path, &c->train_unembed);
    json_decref(o);
    return st;
}

static trill_status load_parts(trill_svc_base *b, const char *dir, bool optimizer, size_t n, trill_lora **lora, trill_adamw **opt) {
    char path[4096];
    trill_status st = trill_lora_load(b->model, dir, lora);
    if (!st && optimizer) {
        snprintf(path, sizeof path, "%s/optimizer", dir);
        trill_lora_params(*lora, &n);
        st = trill_adamw_load(path, n, opt);
    }
    if (st) { trill_lora_free(*lora); *lora = NULL; }
    return st;
}

trill_status trill_svc_trainer_load(trill_svc_base *b, const char *dir, bool optimizer, trill_svc_trainer **out) {
    *out = NULL;
    trill_svc_trainer_config c = { 0 };
    trill_lora *lora = NULL;
    trill_adamw *opt = NULL;
    trill_status st = read_meta(b, dir, &c);
    if (!st) st = load_parts(b, dir, optimizer, 0, &lora, &opt);
    return st ? st : trainer_wrap(b, &c, lora, opt, out);
}

trill_status trill_svc_trainer_load_like(const trill_svc_trainer *t, const char *dir, bool optimizer, trill_svc_trainer **out) {
    *out = NULL;
    trill_svc_trainer_config c = { 0 };
    trill_svc_trainer *u = NULL;
    trill_status st = read_meta(t->base, dir, &c);
    if (!st && c.rank != t->config.rank)
        st = trill_error(TRILL_ERR_INVALID, "%s: the state's LoRA rank is %d, the trainer's %d", dir, c.rank, t->config.rank);
    /* weights alone start a fresh optimizer: moments of other weights would mislead it */
    if (!st) st = trill_svc_trainer_load(t->base, dir, optimizer, &u);
    if (!st && u->n_params != t->n_params)
        st = trill_error(TRILL_ERR_INVALID, "%s: the state adapts other modules than the trainer (%zu values, the trainer %zu)", dir, u->n_params,
                         t->n_params);
    if (st) { trill_svc_trainer_free(u); return st; }
    u->config = t->config;
    *out = u;
    return TRILL_OK;
}

void trill_svc_trainer_adopt(trill_svc_trainer *t, trill_svc_trainer *src) {
    trill_lora_free(t->lora);
    trill_adamw_free(t->opt);
    t->lora = src->lora, t->opt = src->opt;
    src->lora = NULL, src->opt = NULL;
    trill_svc_trainer_free(src);
    memset(t->grads, 0, sizeof(float) * t->n_params);
}

trill_status trill_svc_trainer_restore(trill_svc_trainer *t, const char *dir, bool optimizer) {
    trill_svc_trainer *u = NULL;
    trill_status st = trill_svc_trainer_load_like(t, dir, optimizer, &u);
    if (!st) trill_svc_trainer_adopt(t, u);
    return st;
}

/* ---- marks ---- */

struct trill_svc_mark {
    float *values;               /* [4 n]: the adapter, the two moments, the gradient */
    size_t cap;                  /* floats values holds */
    trill_adamw_config config;
    int64_t step;
};

trill_status trill_svc_trainer_mark(trill_svc_trainer *t, trill_svc_mark **mark) {
    const size_t n = t->n_params;
    trill_svc_mark *m = *mark ? *mark : trill_calloc(1, sizeof *m);
    if (!m) return trill_error(TRILL_ERR_NOMEM, "out of memory (a mark of the trainer's state)");
    *mark = m;
    if (m->cap < 4 * n) { /* grown once to the largest trainer: the pages of a kept mark are not faulted in again each step */
        float *grown = trill_malloc(sizeof(float) * 4 * n);
        if (!grown) return trill_error(TRILL_ERR_NOMEM, "out of memory (a copy of the trainer's %zu adapter values, moments and gradient)", n);
        free(m->values);
        m->values = grown, m->cap = 4 * n;
    }
    size_t k;
    memcpy(m->values, trill_lora_params(t->lora, &k), sizeof(float) * n);
    memcpy(m->values + n, t->opt->exp_avg, sizeof(float) * n);
    memcpy(m->values + 2 * n, t->opt->exp_avg_sq, sizeof(float) * n);
    memcpy(m->values + 3 * n, t->grads, sizeof(float) * n);
    m->config = t->opt->config, m->step = t->opt->step;
    return TRILL_OK;
}

void trill_svc_trainer_rewind(trill_svc_trainer *t, const trill_svc_mark *m) {
    const size_t n = t->n_params;
    size_t k;
    memcpy(trill_lora_params(t->lora, &k), m->values, sizeof(float) * n);
    memcpy(t->opt->exp_avg, m->values + n, sizeof(float) * n);
    memcpy(t->opt->exp_avg_sq, m->values + 2 * n, sizeof(float) * n);
    memcpy(t->grads, m->values + 3 * n, sizeof(float) * n);
    t->opt->config = m->config, t->opt->step = m->step;
}

void trill_svc_mark_free(trill_svc_mark *m) {
    if (!m) return;
    free(m->values);
    free(m);
}
