/* The Gated DeltaNet block's backward (src/train/gdn_backward.c). Not public. */
#ifndef TRILL_TRAIN_GDN_BACKWARD_H
#define TRILL_TRAIN_GDN_BACKWARD_H

#include "model/gdn.h"
#include "train/backward_internal.h"

/* Given dout [T, H], the gradient of the block's output (out_proj's): weight and adapter
 * gradients into the sinks, and dxn [T, H] += the gradient of its input a->xn1 (under tensor
 * parallelism summed over the group: dxn must hold nothing else). Fails as
 * trill_linear_backward, or without its scratch. */
trill_status trill_gdn_backward(const trill_forward_pass *fp, const trill_grad_sinks *sink, const trill_lora_scratch *lg,
                                const trill_decoder_weights *w, const trill_decoder_lora *ad, const trill_decoder_acts *a, const float *dout,
                                float *dxn);

#endif
