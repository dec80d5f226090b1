/* Shorthands for writing a family's tensor table (src/arch/<family>/tensors.c): MW, LW and LL are
 * the offsets of a tensor's pointer in trill_model, trill_decoder_weights and trill_decoder_lora. */
#ifndef TRILL_ARCH_ROWS_H
#define TRILL_ARCH_ROWS_H

#include <stddef.h>

#include "arch/family.h"

#define MW(f) (int)offsetof(trill_model, f)
#define LW(f) (int)offsetof(trill_decoder_weights, f)
#define LL(f) (int)offsetof(trill_decoder_lora, f)
#define NO TRILL_NO_DIM
#define G TRILL_ROW_GLOBAL
#define L TRILL_ROW_LAYER
#define X TRILL_ROW_EXPERT
#define NORM TRILL_TENSOR_NORM
#define MAT TRILL_TENSOR_MATRIX
#define ROWS TRILL_SPLIT_ROWS
#define COLS TRILL_SPLIT_COLS
#define REPL TRILL_SPLIT_NONE
#define NOFUSE TRILL_FUSE_NONE, 0
#define QKV(i) TRILL_FUSE_QKV, i
#define GU(i) TRILL_FUSE_GATE_UP, i

#endif
