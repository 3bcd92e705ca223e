/* ckpt.h - checkpoints: safetensors files of logical tensors, a manifest
 * with checksums beside each, atomic commits, and resharding helpers.
 *
 * safetensors (huggingface/safetensors, docs "Format"): 8 bytes, the little-
 * endian length N of a JSON header; N bytes of header {"name": {"dtype":
 * "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__":
 * {string: string}}, padded with spaces to a multiple of 8; then the byte
 * buffer, which the offsets cover exactly (no holes, no overlaps). We write
 * tensors widest dtype first, so each is naturally aligned.
 *
 * A checkpoint of step S in folder D is two files:
 *   D/step-SSSSSSSS.safetensors   the tensors (parameters by their .hpd
 *                                 names, optimizer state as "opt.m.<name>",
 *                                 "opt.v.<name>", "opt.momentum.<name>")
 *   D/step-SSSSSSSS.json          the manifest: step, file size, CRC-32C of
 *                                 the header and of every tensor, and the
 *                                 caller's "info" (layout, optimizer, data)
 * The tensor file is made durable first (temporary, fsync, rename, fsync of
 * the folder), then the manifest the same way: the manifest's rename is the
 * commit. A checkpoint exists when its manifest does; the latest is the
 * highest step with a manifest. A writer killed at any point leaves at most
 * a hidden temporary file or a tensor file without manifest, never a
 * checkpoint that looks valid. */
#ifndef HPDL_CKPT_H
#define HPDL_CKPT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "rt.h"

#define CKPT_DTYPES(X) \
  X(F64, 8)            \
  X(F32, 4)            \
  X(F16, 2)            \
  X(BF16, 2)           \
  X(I64, 8)            \
  X(I32, 4)            \
  X(I16, 2)            \
  X(I8, 1)             \
  X(U64, 8)            \
  X(U32, 4)            \
  X(U16, 2)            \
  X(U8, 1)             \
  X(BOOL, 1)

typedef enum {
#define X(id, bytes) CKPT_##id,
  CKPT_DTYPES(X)
#undef X
  CKPT_DTYPE_COUNT
} CkptDtype;

const char *ckpt_dtype_name(CkptDtype t); /* "F32" */
int ckpt_dtype_size(CkptDtype t);
int ckpt_dtype_parse(const char *s);      /* -1 when unknown */

enum { CKPT_MAX_RANK = 8 };

typedef struct {
  const char *name;
  CkptDtype dtype;
  int rank;
  int64_t shape[CKPT_MAX_RANK];
  const void *data; /* numel x dtype size bytes, little-endian */
} CkptTensor;

int64_t ckpt_numel(const CkptTensor *t);

/* ---- safetensors files ---- */

/* Writes atomically. meta: string pairs for "__metadata__" (may be NULL).
 * crc_out (may be NULL): CRC-32C of each tensor's bytes, in the order given;
 * header_crc_out: of the 8 + N header bytes. */
int ckpt_st_write(const char *path, const CkptTensor *tensors, int n, const json_t *meta, uint32_t *crc_out,
                  uint32_t *header_crc_out, RtErr *e);

typedef struct CkptFile CkptFile;

/* Opens and validates: the header's length and JSON, every dtype, shape and
 * offset, the buffer covered exactly, the file size. Errors say which
 * tensor and which byte. */
CkptFile *ckpt_st_open(const char *path, RtErr *e);
/* The same checks on a file's bytes already in memory (`name` for the
 * messages); the tensors point into buf, which must outlive the CkptFile. */
CkptFile *ckpt_st_open_mem(const char *name, const void *buf, size_t len, RtErr *e);
void ckpt_st_close(CkptFile *f);
int ckpt_st_count(const CkptFile *f);
const CkptTensor *ckpt_st_tensor(const CkptFile *f, int i);
const CkptTensor *ckpt_st_find(const CkptFile *f, const char *name);
const json_t *ckpt_st_meta(const CkptFile *f); /* "__metadata__" or NULL */
uint32_t ckpt_st_header_crc(const CkptFile *f);
int64_t ckpt_st_file_bytes(const CkptFile *f);
/* Converts a float tensor (F32, F64, F16, BF16) to fp32. */
int ckpt_st_read_f32(const CkptTensor *t, float *out, RtErr *e);

/* ---- checkpoints (tensor file + manifest) ---- */

/* Saves step `step` into dir (created when missing); `info` (may be NULL)
 * is stored under the manifest's "info". Then keeps the newest `keep`
 * checkpoints (0: all). manifest_out (may be NULL, size 4096) gets the
 * manifest's path. */
int ckpt_save(const char *dir, int64_t step, const CkptTensor *tensors, int n, const json_t *info, int keep,
              char *manifest_out, RtErr *e);

/* The newest checkpoint in dir: 1 with its step and manifest path (size
 * 4096), 0 when there is none, -1 on error. */
int ckpt_latest(const char *dir, int64_t *step, char *manifest_path, RtErr *e);

/* Deletes all but the newest `keep` checkpoints (manifest first, so a
 * half-deleted one is never mistaken for a checkpoint), and temporary files
 * a killed writer left. */
int ckpt_prune(const char *dir, int keep, RtErr *e);

typedef struct Ckpt Ckpt;

/* Loads a checkpoint by its manifest path (or the folder, meaning its
 * latest): checks the tensor file's size, header checksum, and every
 * tensor's dtype, shape and CRC-32C against the manifest. */
Ckpt *ckpt_load(const char *path, RtErr *e);
void ckpt_close(Ckpt *c);
int64_t ckpt_step(const Ckpt *c);
const json_t *ckpt_info(const Ckpt *c);     /* the manifest's "info", or NULL */
const CkptFile *ckpt_file(const Ckpt *c);
const char *ckpt_path(const Ckpt *c);       /* the tensor file */

#endif
