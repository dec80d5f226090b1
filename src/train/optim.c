#include "trill/optim.h"
#include "base/alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trill/fileio.h"
#include "base/json.h"
#include "trill/safetensors.h"

trill_adamw_config trill_adamw_defaults(void) {
    return (trill_adamw_config){ .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01 };
}

trill_status trill_adamw_create(size_t n, trill_adamw_config config, trill_adamw **out) {
    trill_adamw *o = trill_calloc(1, sizeof *o);
    if (o) {
        o->exp_avg = trill_calloc(n ? n : 1, sizeof(float));
        o->exp_avg_sq = trill_calloc(n ? n : 1, sizeof(float));
    }
    if (!o || !o->exp_avg || !o->exp_avg_sq) {
        trill_adamw_free(o);
        return trill_error(TRILL_ERR_NOMEM, "out of memory for the optimizer state of %zu values", n);
    }
    o->config = config;
    o->n = n;
    *out = o;
    return TRILL_OK;
}

void trill_adamw_free(trill_adamw *o) {
    if (!o) return;
    free(o->exp_avg);
    free(o->exp_avg_sq);
    free(o);
}

/* torch.optim.AdamW: p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
void trill_adamw_step(trill_adamw *o, float *params, const float *grads, double lr, const uint8_t *no_decay) {
    const trill_adamw_config *c = &o->config;
    o->step++;
    const double bc1 = 1.0 - pow(c->beta1, (double)o->step), bc2_sqrt = sqrt(1.0 - pow(c->beta2, (double)o->step));
    const float step_size = (float)(lr / bc1), decay = (float)(1.0 - lr * c->weight_decay);
    const float b1 = (float)c->beta1, b2 = (float)c->beta2, eps = (float)c->eps, inv_bc2 = (float)(1.0 / bc2_sqrt);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < o->n; i++) {
        float g = grads[i];
        if (!no_decay || !no_decay[i]) params[i] *= decay;
        o->exp_avg[i] = b1 * o->exp_avg[i] + (1 - b1) * g;
        o->exp_avg_sq[i] = b2 * o->exp_avg_sq[i] + (1 - b2) * g * g;
        params[i] -= step_size * o->exp_avg[i] / (sqrtf(o->exp_avg_sq[i]) * inv_bc2 + eps);
    }
}

double trill_clip_grad_norm(float *grads, size_t n, double max_norm) {
    /* fixed-order sum of fixed blocks: the same norm (and clipping) on every run */
    enum { BLOCKS = 64 };
    double partial[BLOCKS] = { 0 }, ss = 0;
    const size_t per = (n + BLOCKS - 1) / BLOCKS;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < BLOCKS; b++) {
        size_t end = (size_t)(b + 1) * per < n ? (size_t)(b + 1) * per : n;
        for (size_t i = (size_t)b * per; i < end; i++) partial[b] += (double)grads[i] * grads[i];
    }
    for (int b = 0; b < BLOCKS; b++) ss += partial[b];
    double norm = sqrt(ss);
    if (max_norm > 0 && norm > max_norm) {
        float scale = (float)(max_norm / (norm + 1e-6)); /* torch's clip coefficient */
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) grads[i] *= scale;
    }
    return norm;
}

enum { SUMSQ_BLOCK = 16384 };

double trill_grad_sumsq(const float *g, size_t n) {
    double ss = 0;
    for (size_t at = 0; at < n; at += SUMSQ_BLOCK) { /* each block's sum in order, then the blocks' in order */
        const size_t end = at + SUMSQ_BLOCK < n ? at + SUMSQ_BLOCK : n;
        double part = 0;
        for (size_t i = at; i < end; i++) part += (double)g[i] * g[i];
        ss += part;
    }
    return ss;
}

trill_status trill_grad_sumsq_parts(const float *g, const size_t *offset, const size_t *numel, size_t n_parts, double *out) {
    /* every block of every part is a task (its own sum, in order), so a part's bits do not depend
     * on the threads; then each part adds its blocks in order, as trill_grad_sumsq does */
    size_t *first = trill_malloc(sizeof(size_t) * (n_parts + 1));
    if (!first) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    first[0] = 0;
    for (size_t k = 0; k < n_parts; k++) first[k + 1] = first[k] + (numel[k] + SUMSQ_BLOCK - 1) / SUMSQ_BLOCK;
    double *block = trill_malloc(sizeof(double) * (first[n_parts] ? first[n_parts] : 1));
    if (!block) {
        free(first);
        return trill_error(TRILL_ERR_NOMEM, "out of memory");
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t k = 0; k < n_parts; k++)
        for (size_t b = first[k]; b < first[k + 1]; b++) {
            const size_t at = (b - first[k]) * SUMSQ_BLOCK, end = at + SUMSQ_BLOCK < numel[k] ? at + SUMSQ_BLOCK : numel[k];
            double part = 0;
            for (size_t i = at; i < end; i++) part += (double)g[offset[k] + i] * g[offset[k] + i];
            block[b] = part;
        }
    for (size_t k = 0; k < n_parts; k++) {
        double ss = 0;
        for (size_t b = first[k]; b < first[k + 1]; b++) ss += block[b];
        out[k] = ss;
    }
    free(block);
    free(first);
    return TRILL_OK;
}

void trill_clip_grads_to(float *grads, size_t n, double norm, double max_norm) {
    if (!(max_norm > 0 && norm > max_norm)) return;
    float scale = (float)(max_norm / (norm + 1e-6)); /* torch's clip coefficient */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) grads[i] *= scale;
}

int trill_lr_schedule_parse(const char *name, trill_lr_schedule *out) {
    static const char *const names[] = { "constant", "linear", "cosine" };
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0) { *out = (trill_lr_schedule)i; return 0; }
    return -1;
}

double trill_lr_at(trill_lr_schedule schedule, double peak, double min_lr, int64_t warmup_steps, int64_t total_steps,
                   int64_t step) {
    if (step < warmup_steps) return peak * (double)(step + 1) / (double)warmup_steps;
    if (schedule == TRILL_LR_CONSTANT || total_steps <= warmup_steps) return peak;
    double progress = (double)(step - warmup_steps) / (double)(total_steps - warmup_steps);
    if (progress > 1) progress = 1;
    if (schedule == TRILL_LR_LINEAR) return min_lr + (peak - min_lr) * (1 - progress);
    return min_lr + (peak - min_lr) * 0.5 * (1 + cos(M_PI * progress));
}

/* ---- state on disk ---- */

static char *with_suffix(const char *prefix, const char *suffix) {
    size_t n = strlen(prefix) + strlen(suffix) + 1;
    char *s = trill_malloc(n);
    if (s) snprintf(s, n, "%s%s", prefix, suffix);
    return s;
}

trill_status trill_adamw_save(const trill_adamw *o, const char *prefix) {
    char *st_path = with_suffix(prefix, ".safetensors"), *json_path = with_suffix(prefix, ".json");
    trill_tensor_out t[2] = {
        { .name = "exp_avg", .ndim = 1, .shape = { (int64_t)o->n }, .data = o->exp_avg, .src_dtype = TRILL_F32 },
        { .name = "exp_avg_sq", .ndim = 1, .shape = { (int64_t)o->n }, .data = o->exp_avg_sq, .src_dtype = TRILL_F32 },
    };
    trill_status st = st_path && json_path ? trill_st_write(st_path, t, 2, TRILL_F32) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        json_t *j = json_pack("{s:s, s:I, s:I, s:f, s:f, s:f, s:f}", "optimizer", "adamw", "step", (json_int_t)o->step,
                              "size", (json_int_t)o->n, "beta1", o->config.beta1, "beta2", o->config.beta2, "eps", o->config.eps,
                              "weight_decay", o->config.weight_decay);
        st = trill_json_write_file(json_path, j);
        json_decref(j);
    }
    free(st_path);
    free(json_path);
    return st;
}

trill_status trill_adamw_load(const char *prefix, size_t n, trill_adamw **out) {
    char *st_path = with_suffix(prefix, ".safetensors"), *json_path = with_suffix(prefix, ".json");
    json_t *j = NULL;
    trill_st_file *f = NULL;
    trill_adamw *o = NULL;
    trill_adamw_config cfg = trill_adamw_defaults();
    int step = 0;
    trill_status st = st_path && json_path ? trill_json_load_file(json_path, &j) : trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st && !(st = trill_json_get_int(j, "step", json_path, 0, INT32_MAX, &step)) &&
        !(st = trill_json_get_double(j, "beta1", json_path, 0, 1, &cfg.beta1)) &&
        !(st = trill_json_get_double(j, "beta2", json_path, 0, 1, &cfg.beta2)) &&
        !(st = trill_json_get_double(j, "eps", json_path, 0, 1, &cfg.eps)) &&
        !(st = trill_json_get_double(j, "weight_decay", json_path, 0, 1e6, &cfg.weight_decay)))
        st = trill_st_open(st_path, &f);
    if (!st) st = trill_adamw_create(n, cfg, &o);
    const char *names[2] = { "exp_avg", "exp_avg_sq" };
    for (int i = 0; i < 2 && !st; i++) {
        const trill_tensor_view *v = trill_st_find(f, names[i]);
        if (!v || v->dtype != TRILL_F32 || v->numel != n)
            st = trill_error(TRILL_ERR_INVALID, "%s: tensor \"%s\": expected F32 with %zu values (the trainable size)", st_path, names[i], n);
        else
            trill_to_f32(i ? o->exp_avg_sq : o->exp_avg, v->data, TRILL_F32, n);
    }
    if (!st) o->step = step;
    trill_st_close(f);
    json_decref(j);
    free(st_path);
    free(json_path);
    if (st) { trill_adamw_free(o); return st; }
    *out = o;
    return TRILL_OK;
}
