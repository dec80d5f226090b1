/* A weight matrix as the model stores it.
 *
 * fp32 for weights that train (and master weights), or bf16 for a frozen base kept in the
 * checkpoint's dtype: the kernels that take a trill_weight (trill/kernels.h: *_w) widen bf16
 * to fp32 one panel of rows at a time, so a large frozen model is never held twice and the
 * arithmetic stays fp32. Exactly one of the pointers is set. */
#ifndef TRILL_WEIGHT_H
#define TRILL_WEIGHT_H

#include <stddef.h>
#include <stdint.h>

typedef struct trill_weight {
    float *f32;
    uint16_t *bf16;
} trill_weight;

/* The same storage, `offset` elements further (e.g. expert e of a stacked expert block). */
static inline trill_weight trill_weight_at(trill_weight w, size_t offset) {
    return (trill_weight){ w.f32 ? w.f32 + offset : NULL, w.bf16 ? w.bf16 + offset : NULL };
}

#endif
