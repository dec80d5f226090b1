/* Optimisation: AdamW (PyTorch's formulation), global-norm gradient clipping and learning-rate
 * schedules. The optimizer works on one flat fp32 vector of trainable values (the parameter
 * block in full fine-tuning, the adapter block with LoRA). */
#ifndef TRILL_OPTIM_H
#define TRILL_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "trill/error.h"

typedef struct trill_adamw_config {
    double beta1, beta2, eps, weight_decay; /* defaults: 0.9, 0.999, 1e-8, 0.01 (torch.optim.AdamW) */
} trill_adamw_config;

typedef struct trill_adamw {
    trill_adamw_config config;
    size_t n;
    int64_t step;          /* steps taken */
    float *exp_avg;        /* [n] first moment */
    float *exp_avg_sq;     /* [n] second moment */
} trill_adamw;

trill_adamw_config trill_adamw_defaults(void);
trill_status trill_adamw_create(size_t n, trill_adamw_config config, trill_adamw **out);
void trill_adamw_free(trill_adamw *opt);

/* One step at learning rate lr: decoupled weight decay p -= lr * wd * p (skipped where
 * no_decay[i] is set; no_decay may be NULL), then the bias-corrected Adam update. */
void trill_adamw_step(trill_adamw *opt, float *params, const float *grads, double lr, const uint8_t *no_decay);

/* Saves/loads the moments and step count: PATH.safetensors (exp_avg, exp_avg_sq) and
 * PATH.json (step, config); both written atomically. Loading checks the size matches. */
trill_status trill_adamw_save(const trill_adamw *opt, const char *path_prefix);
trill_status trill_adamw_load(const char *path_prefix, size_t n, trill_adamw **out);

/* Scales grads so their global L2 norm is at most max_norm (max_norm <= 0: no clipping);
 * returns the norm before clipping (as torch.nn.utils.clip_grad_norm_). */
double trill_clip_grad_norm(float *grads, size_t n, double max_norm);

/* A gradient's squared norm taken tensor by tensor, so that it is the same number however the
 * tensors are spread over ranks: a tensor's sum of squares (in double, over fixed blocks of 16384
 * values each summed in order, the blocks added in order) is trill_grad_sumsq; the trainer adds
 * the tensors' in the model's (or the whole adapter's) tensor order, gathering the sums of the
 * tensors other ranks hold. trill_grad_sumsq_parts computes out[k] = trill_grad_sumsq(g +
 * offset[k], numel[k]) for n_parts tensors at once over the threads (same bits). */
double trill_grad_sumsq(const float *g, size_t n);
trill_status trill_grad_sumsq_parts(const float *g, const size_t *offset, const size_t *numel, size_t n_parts, double *out);
/* grads *= max_norm / (norm + 1e-6) when norm > max_norm > 0 (torch's clip coefficient). */
void trill_clip_grads_to(float *grads, size_t n, double norm, double max_norm);

typedef enum trill_lr_schedule { TRILL_LR_CONSTANT, TRILL_LR_LINEAR, TRILL_LR_COSINE } trill_lr_schedule;

/* The learning rate at `step` (0-based): linear warm-up, step i < warmup_steps taking peak * (i + 1) / warmup_steps, then
 * constant, linear decay to min_lr at total_steps, or cosine decay to min_lr. */
double trill_lr_at(trill_lr_schedule schedule, double peak, double min_lr, int64_t warmup_steps, int64_t total_steps,
                   int64_t step);
/* Parses "constant", "linear" or "cosine"; -1 if unknown. */
int trill_lr_schedule_parse(const char *name, trill_lr_schedule *out);

#endif
