/* artifact.h - the compiled job's manifest, DIR/manifest.json.
 *
 * `hpdlc compile` writes it beside the per-rank programs; hpdlrun reads it.
 * The schema (version 1) is documented in docs/runtime.md, "The artifact";
 * this reader checks every field it uses and names the bad one. */
#ifndef HPDL_ARTIFACT_H
#define HPDL_ARTIFACT_H

#include <stdint.h>

#include "ckpt.h"
#include "comm.h"
#include "init.h"
#include "optim.h"
#include "rt.h"

enum { ART_MAX_RANK = CKPT_MAX_RANK };

/* Bounds the reader enforces, so that no count the runtime forms from a
 * manifest can overflow (a byte count of 16 x 2^48 still fits): a
 * parameter's elements times its copies, and the tokens of a step
 * (dp x micro_batch x num_micro_batches x seq_len; an image model's pixels
 * in place of seq_len). */
#define ART_MAX_ELEMENTS ((int64_t)1 << 48)
#define ART_MAX_TOKENS ((int64_t)1 << 40)

typedef struct {
  char *name;             /* template: "blocks.{i}.attn.q_proj.weight" */
  CkptDtype dtype;        /* the stored precision (F32 in this version) */
  int rank;
  int64_t shape[ART_MAX_RANK]; /* unsharded (a padded vocabulary's padded rows included) */
  int64_t logical_rows;   /* > 0: a vocabulary padded for tensor parallelism ("padded_rows"): the
                             model's tensor is the first logical_rows rows of shape, the rest zeros;
                             checkpoints and initial values are of the model's tensor */
  int64_t count;          /* copies, one per layer of a repeat; 1 otherwise */
  InitSpec init;
  int split_axis;         /* -1: every rank of the group holds all of it */
  CommGroup split_group;  /* COMM_TP, COMM_CP or COMM_EP */
  int split2_axis;        /* an expert shard's block over the tensor group, or -1 (core/shard.h) */
  CommGroup split2_group;
  int *stages;            /* count entries: the pipeline stage of each copy */
  int weight_decay;       /* 1: decayed (default: rank >= 2, as llm.c) */
  int state;              /* 1: a running statistic the forward updates: no optimizer, whole on every rank */
} ArtParam;

typedef struct {
  char *program;          /* path of the rank's program (native), or NULL */
  int64_t arena_bytes;    /* the memory planner's arena for this rank */
} ArtRank;

typedef struct {
  char *dir, *manifest_path;
  char *model, *target;
  int world_size;
  CommLayout layout;
  /* cluster: where the layout was planned to run (hpdlrun --sbatch, --k8s) */
  char *cluster_name;     /* NULL when the manifest has no cluster */
  int gpus_per_node;      /* devices (ranks) a node holds; 0: not recorded */
  int cluster_shared;     /* 1: CPU ranks sharing one machine (laptop) */
  int zero;
  int64_t micro_batch, num_micro_batches;
  char *schedule;
  CommCompressKind compression;
  double topk_ratio;
  int error_feedback;
  int64_t seq_len, vocab;
  /* train */
  int64_t steps, seed, log_every;
  char *data;
  int shuffle;
  OptimConfig optim;
  char *precision;        /* "fp32", "bf16", "fp16" (the train block's) */
  double loss_scale;      /* fp16: 0 = dynamic, else the static scale */
  int64_t ckpt_every, ckpt_keep;
  char *ckpt_dir;
  int ckpt_async;
  /* program */
  char *program_kind;     /* "builtin" or "native" */
  char *program_name;     /* the builtin's name */
  ArtRank *ranks;
  int nranks;
  ArtParam *params;
  int nparams;
  /* An image model (inputs.kind "images"; 0 for token windows): the image
   * input's dimensions after the batch, the classes its logits have (0:
   * unknown), the inputs' names. seq_len and vocab are 0 then. Last, so
   * that a program built before them finds the fields above in place. */
  int image_rank;
  int64_t image_dims[ART_MAX_RANK];
  int64_t classes;
  char *image_input, *label_input;
} Artifact;

/* Reads DIR/manifest.json; checks that the files it names exist. */
Artifact *artifact_load(const char *dir, RtErr *e);

/* Checks every file the manifest's "files" lists (hpdlc compile writes it)
 * against its size and CRC-32C, and refuses an artifact whose manifest
 * lists extern libraries unless allow_native: 0, or -1 naming the file. A
 * manifest without "files" (written by hand) is not checked. */
int artifact_check_files(const Artifact *a, int allow_native, RtErr *e);
void artifact_free(Artifact *a);

/* The name of copy `layer` of p: "{i}" replaced by the layer number
 * ("blocks.3.attn.q_proj.weight"); -1 when it does not fit in n bytes. */
int artifact_param_name(const ArtParam *p, int64_t layer, char *out, size_t n);
int64_t artifact_param_numel(const ArtParam *p);

#endif
