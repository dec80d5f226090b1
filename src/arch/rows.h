/* Shorthands for writing a family's tensor table (src/arch/<family>/tensors.c); each family adds
 * LW and LL for the offsets in its own layer and adapter-layer structs. */
#ifndef TRILL_ARCH_ROWS_H
#define TRILL_ARCH_ROWS_H

#include <stddef.h>

#include "arch/family.h"

#define MW(f) (int)offsetof(trill_model, f)
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
