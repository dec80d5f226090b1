/* Micro-batch packing (trill/train.h): one rule for every trainer. */
#include "trill/train.h"

int trill_micro_batch_take(int n, int budget, int (*len)(const void *ctx, int i), const void *ctx) {
    int k = 0;
    for (long used = 0; k < n; k++) {
        const int l = len(ctx, k);
        if (k > 0 && used + l > budget) break;
        used += l;
    }
    return k;
}
