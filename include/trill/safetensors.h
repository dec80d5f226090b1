/* Hugging Face safetensors: reading (memory-mapped, fully validated) and
 * crash-safe writing, single file or sharded with model.safetensors.index.json.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
 * then the data section; offsets are relative to it, and the tensors must tile it
 * exactly (no gap, no overlap), as the reference implementation requires. Dtypes read: F32, BF16,
 * F16 and F8_E4M3 (1 byte; its block scales are the loader's, src/model/model.c). */
#ifndef TRILL_SAFETENSORS_H
#define TRILL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "trill/dtype.h"
#include "trill/error.h"

#define TRILL_MAX_DIMS 8
#define TRILL_ST_MAX_HEADER (100u * 1000u * 1000u) /* the reference implementation's limit */

typedef struct trill_tensor_view {
    const char *name;
    trill_dtype dtype;
    int ndim;
    int64_t shape[TRILL_MAX_DIMS];
    size_t numel;
    const void *data; /* inside the mapping; may be unaligned */
    size_t nbytes;
    const char *path; /* the file it lives in, for messages */
} trill_tensor_view;

typedef struct trill_st_file trill_st_file;

/* Maps and validates one file. */
trill_status trill_st_open(const char *path, trill_st_file **out);
/* Validates bytes already in memory (not copied: they must outlive the result). */
trill_status trill_st_parse(const char *path, const void *bytes, size_t len, trill_st_file **out);
void trill_st_close(trill_st_file *f);

size_t trill_st_count(const trill_st_file *f);
const trill_tensor_view *trill_st_tensor(const trill_st_file *f, size_t i); /* sorted by name */
const trill_tensor_view *trill_st_find(const trill_st_file *f, const char *name);

/* A checkpoint folder: model.safetensors, or the shards named by model.safetensors.index.json. */
typedef struct trill_checkpoint trill_checkpoint;

trill_status trill_checkpoint_open(const char *dir, trill_checkpoint **out);
void trill_checkpoint_close(trill_checkpoint *ck);
size_t trill_checkpoint_count(const trill_checkpoint *ck);
const trill_tensor_view *trill_checkpoint_tensor(const trill_checkpoint *ck, size_t i); /* sorted by name */
const trill_tensor_view *trill_checkpoint_find(const trill_checkpoint *ck, const char *name);
size_t trill_checkpoint_file_count(const trill_checkpoint *ck);

/* A tensor to write: `data` holds numel elements of `src_dtype`; it is stored as the
 * writer's dtype (converted through fp32 when the two differ). The writers write F32, BF16 or
 * F16; F8_E4M3 (read for block-scaled checkpoints) is refused. */
typedef struct trill_tensor_out {
    const char *name;
    int ndim;
    int64_t shape[TRILL_MAX_DIMS];
    const void *data;
    trill_dtype src_dtype;
} trill_tensor_out;

size_t trill_tensor_out_numel(const trill_tensor_out *t);

trill_status trill_st_write(const char *path, const trill_tensor_out *tensors, size_t n, trill_dtype dtype);

/* Writes DIR/model.safetensors, or — when the data exceeds max_shard_bytes (0: never
 * shard) — DIR/model-0000i-of-0000K.safetensors plus model.safetensors.index.json.
 * Each file is written atomically; the index last. A stale file of the other layout is removed. */
trill_status trill_checkpoint_write(const char *dir, const trill_tensor_out *tensors, size_t n,
                                    trill_dtype dtype, size_t max_shard_bytes);

#endif
