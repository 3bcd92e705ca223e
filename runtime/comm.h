/* comm.h - collectives behind one interface.
 *
 * A Comm is a table of function pointers over process groups (QBE's
 * `struct Target` idea): MPI fills it on CPU ranks (comm_mpi.c), NCCL on
 * the GPUs' buffers (comm_nccl.c), and comm_local_new gives the one-rank
 * version where every group has a single member. Ranks are laid out as
 * Megatron-LM does, tensor innermost:
 *     rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))
 * so a tensor group is tp consecutive ranks (one node's fast links), and the
 * pipeline is outermost. A group call takes buffers on every member.
 *
 * Gradient compression for the data-parallel reduction is built on the
 * interface (comm_allreduce_compressed), so every back end gets it:
 *   fp16   each rank's values rounded to binary16;
 *   int8   per chunk of COMM_INT8_CHUNK values, q = round(x / s) with
 *          s = max|x| / 127 (one fp32 scale per chunk);
 *   top-k  the k = ceil(ratio n) values of largest magnitude, as (index,
 *          value) pairs (Aji and Heafield 2017; Lin et al. 2018, "Deep
 *          Gradient Compression").
 * With error feedback (Seide et al. 2014; Karimireddy et al. 2019) each
 * rank adds last step's residual before compressing and keeps as residual
 * what compression dropped: residual' = (x + residual) - decompress(sent),
 * so nothing is lost, only delayed. Payloads are all-gathered (a reduce-
 * scatter's sent all-to-all, a slice to each member) and summed in
 * fp32 in rank order, so every rank gets bit-identical results. */
#ifndef HPDL_COMM_H
#define HPDL_COMM_H

#include <stdint.h>

#include "rt.h"

/* EP: expert parallelism, ep consecutive members of a data-parallel group
 * (dp_i = ep_i + ep x edp_i); EDP: the data-parallel members with the same
 * ep_i, which hold the same experts. Under parallel folding (ep_fold) the
 * expert group is the tensor group times ep / tp consecutive data-parallel
 * ranks (ep_i = tp_i + tp x (dp_i mod ep / tp), edp_i = dp_i / (ep / tp)). */
typedef enum { COMM_WORLD, COMM_DP, COMM_TP, COMM_PP, COMM_CP, COMM_EP, COMM_EDP, COMM_NGROUPS } CommGroup;
typedef enum { COMM_F32, COMM_F64, COMM_I32, COMM_U8 } CommType; /* sums: F32, F64, I32 */
typedef enum { COMM_SUM, COMM_MAX } CommOp;

const char *comm_group_name(CommGroup g);
int comm_type_size(CommType t);

typedef struct {
  int dp, tp, pp, cp;
  int ep; /* expert parallelism inside dp (0 or 1: none) */
  int ep_fold; /* the expert group folded over tensor x data ranks (ep a multiple of tp) */
} CommLayout;

typedef struct {
  int dp, tp, pp, cp; /* this rank's index in each dimension */
} CommCoords;

int comm_layout_size(const CommLayout *l);
CommCoords comm_coords_of(const CommLayout *l, int rank);
int comm_rank_of(const CommLayout *l, CommCoords c);
/* Whether l's expert group is folded over the tensor group (ep_fold, tp > 1). */
int comm_layout_folded(const CommLayout *l);
/* The coordinates of member `peer` of the expert group (EP) or the
 * expert-data-parallel group (EDP) that the rank at k belongs to. */
CommCoords comm_ep_member(const CommLayout *l, CommCoords k, int peer);
CommCoords comm_edp_member(const CommLayout *l, CommCoords k, int peer);

typedef struct Comm Comm;

/* Every function returns 0, or -1 with a message (the library's own). */
typedef struct {
  const char *name; /* "mpi", "local", "nccl" */
  int (*all_reduce)(Comm *c, CommGroup g, CommType t, CommOp op, void *buf, int64_t n, RtErr *e);
  /* out: size x n values, member by member; in may be this member's place in out */
  int (*all_gather)(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e);
  /* in: size x n values; out: this member's n-value piece of the reduction */
  int (*reduce_scatter)(Comm *c, CommGroup g, CommType t, CommOp op, const void *in, int64_t n, void *out, RtErr *e);
  int (*broadcast)(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int root, RtErr *e);
  /* peer: a member index within the group */
  int (*send)(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e);
  int (*recv)(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int peer, int tag, RtErr *e);
  int (*barrier)(Comm *c, CommGroup g, RtErr *e);
  /* Stops every rank of the job (MPI_Abort): for an error one rank alone
   * sees, so the others do not wait in a collective forever. */
  void (*abort)(Comm *c, int code);
  void (*destroy)(Comm *c);
  /* A send that does not wait for its receive (MPI_Isend): buf must stay
   * as it is until wait_sends, which completes every one still pending.
   * Pipeline schedules need it: in 1F1B's steady state a stage sends an
   * activation forward while its neighbour sends a gradient back, and two
   * blocking sends would wait for each other once messages outgrow MPI's
   * eager buffers. */
  int (*isend)(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e);
  int (*wait_sends)(Comm *c, RtErr *e);
  /* n values to each member (in: member by member); out: n from each, member by member */
  int (*all_to_all)(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e);
  /* Optional (NULL: calls run one by one): begin = 1 opens a group of calls
   * that progress together and complete at its close (begin = 0), NCCL's
   * ncclGroupStart / ncclGroupEnd: a send and a receive that must overlap,
   * or many reductions fused into one launch. */
  int (*group)(Comm *c, int begin, RtErr *e);
  /* Optional (NULL: the ring exchanges when its receive runs, comm_ring.c):
   * starts sending n values of `send` to member `to` and receiving n from
   * member `from` into `recv`, and returns at once - ring attention's
   * transfer, running while the attention works on the block before it.
   * exchange_wait(handle) completes both: the buffers are free and recv
   * holds the values (NCCL: the caller's stream ordered after them). 1, not
   * 0, when it did not start (the caller exchanges at once instead). */
  int (*exchange_start)(Comm *c, CommGroup g, CommType t, const void *send, int to, void *recv, int from, int64_t n, int tag,
                        void **handle, RtErr *e);
  int (*exchange_wait)(Comm *c, void *handle, RtErr *e);
} CommOps;

struct Comm {
  const CommOps *ops;
  CommLayout layout;
  int world_rank, world_size;
  CommCoords coords;
  int rank[COMM_NGROUPS], size[COMM_NGROUPS]; /* this rank's index in, and the size of, each group */
  int node_ranks; /* ranks of the job on this node (they share its cores) */
  void *impl;
};

/* A one-rank Comm (every group has one member): collectives are copies. */
Comm *comm_local_new(RtErr *e);
/* Fills layout, coords and the rank / size tables from world_rank. */
int comm_init_groups(Comm *c, const CommLayout *l, int world_rank, int world_size, RtErr *e);
void comm_destroy(Comm *c);

/* Convenience wrappers (c->ops->...). */
int comm_all_reduce(Comm *c, CommGroup g, CommType t, CommOp op, void *buf, int64_t n, RtErr *e);
int comm_all_gather(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e);
int comm_reduce_scatter(Comm *c, CommGroup g, CommType t, CommOp op, const void *in, int64_t n, void *out, RtErr *e);
int comm_broadcast(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int root, RtErr *e);
int comm_send(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e);
int comm_isend(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e);
int comm_wait_sends(Comm *c, RtErr *e);
int comm_recv(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int peer, int tag, RtErr *e);
int comm_barrier(Comm *c, CommGroup g, RtErr *e);
int comm_all_to_all(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e);
/* c->ops->group where the table has one, else nothing to do. */
int comm_group(Comm *c, int begin, RtErr *e);

/* hpdlrun --profile: every call through c->ops from here on (the loop's,
 * the compressed reduction's and the program's, which call the table
 * directly) is timed into p as a span on its "comm" track, with the bytes
 * of the buffer it moves (all_gather: the gathered output, reduce_scatter:
 * the input), the group and, for a message, the peer's world rank. p NULL
 * puts the table back. One Comm at a time (the process's). */
struct Prof; /* prof.h */
void comm_profile(Comm *c, struct Prof *p);

/* ---- compression ---- */

/* BF16: each value rounded to bf16 (a bf16 run's gradients reduced in its
 * storage type: Megatron-LM's grad_reduce_in_fp32 = False, FSDP's
 * reduce_dtype = bf16), the received values summed in fp32 in rank order */
typedef enum { COMM_COMPRESS_NONE, COMM_COMPRESS_FP16, COMM_COMPRESS_INT8, COMM_COMPRESS_TOPK, COMM_COMPRESS_BF16 } CommCompressKind;
enum { COMM_INT8_CHUNK = 256 };

int comm_compress_parse(const char *s); /* sem_compression_names' words; -1 when unknown */
const char *comm_compress_name(CommCompressKind k);
/* fp16 or bf16: each value rounded on its own, so the sums are elementwise
 * (an all-reduce may take the reduce-scatter form; a device may compute them) */
int comm_compress_is16(CommCompressKind k);

typedef struct {
  CommCompressKind kind;
  double topk_ratio;   /* top-k: the fraction of values sent */
  int error_feedback;  /* keep what compression dropped for the next step */
  float *residual;     /* n values, owned; allocated on first use */
  int64_t n;
  /* scratch, reused from step to step */
  unsigned char *payload, *gathered;
  float *work, *pad;
  int64_t payload_cap, gathered_cap, work_cap, pad_cap;
} CommCompressor;

/* From this many members an fp16 / bf16 all-reduce goes as the compressed
 * reduce-scatter and an fp32 all-gather of the sums (the same values). */
enum { COMM_COMPRESS_RS_FROM = 4 };

void comm_compressor_init(CommCompressor *z, CommCompressKind kind, double topk_ratio, int error_feedback);
void comm_compressor_free(CommCompressor *z);

/* Bytes of one rank's payload for n values. */
int64_t comm_compressed_bytes(const CommCompressor *z, int64_t n);
/* Compresses x (n values) into payload; with error feedback, x + residual is
 * compressed and the residual updated. x is not changed. */
int comm_compress(CommCompressor *z, const float *x, int64_t n, unsigned char *payload, RtErr *e);
/* Adds the values a payload stands for to acc (n values). */
void comm_decompress_add(const CommCompressor *z, const unsigned char *payload, int64_t n, float *acc);

/* buf (n values on every member of g) becomes the sum over the members of
 * their compressed values, in fp32 in rank order; kind NONE is a plain
 * all-reduce. The payloads are all-gathered (each member receives size - 1
 * of them), but fp16 and bf16 from COMM_COMPRESS_RS_FROM members on go as
 * comm_reduce_scatter_compressed over ceil(n / size) values a member and an
 * fp32 all-gather of the slices' sums: (size - 1) / size x 6 bytes a value
 * in, not (size - 1) x 2, and the same bits (the rounding is elementwise;
 * error feedback then keeps a residual of size x ceil(n / size) values). */
int comm_allreduce_compressed(Comm *c, CommGroup g, CommCompressor *z, float *buf, int64_t n, RtErr *e);
/* The same for a reduce-scatter (ZeRO 2 and 3): in holds n values per
 * member of g (member m's slice at m x n), each slice compressed on its own
 * and sent to its member (an all-to-all of payloads); out (n values)
 * becomes the sum over the members of their compressed values of this
 * member's slice, in rank order: at fp16 and bf16 the values the
 * all-reduce gives that slice. Error feedback keeps a residual of all
 * n x size values. Kind NONE is a plain reduce-scatter. */
int comm_reduce_scatter_compressed(Comm *c, CommGroup g, CommCompressor *z, const float *in, int64_t n, float *out, RtErr *e);

/* NCCL (comm_nccl.c): the same table over the GPUs' own buffers, every
 * pointer a device address, calls queued on the legacy default stream (the
 * one the device layer launches on). libnccl is opened with dlopen
 * ($HPDL_NCCL, $CUDA_HOME, the loader's path). A communicator per group of
 * more than one member, its ncclUniqueId made by member 0 and broadcast
 * over `host` (which keeps serving the host's own collectives), none for
 * the world (its calls fail: the host's serve it); every rank
 * must call this at the same point, as every group's members create their
 * communicator together. A size-1 group's gather or scatter is a copy
 * through `copy` (the device's). There are no tags: a pair's messages match
 * in the order they were posted. isend queues the send until the next
 * send, receive or wait_sends, and posts it in one group with that call
 * (NCCL blocks a stream on a send until its receive runs, so a 1F1B stage
 * sending forward while its neighbour sends back must post both
 * directions together). NULL with the reason in e. */
typedef struct {
  void *ctx;
  int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
  /* device.h's stream_wait: `waiter` (NULL: the launch stream) runs what it
   * is given next after everything `waited` holds now */
  int (*stream_wait)(void *ctx, void *waiter, void *waited);
} CommDevCopy;
Comm *comm_nccl_new(Comm *host, const CommDevCopy *copy, RtErr *e);
/* A group's point-to-point calls (the pipeline's) on a stream of their own:
 * it waits for the launch stream before each post, and the launch stream
 * waits for it after a receive, not after a send alone - so a send's buffer
 * must outlive the step's last post (comm_nccl_sync_group). NULL: the
 * launch stream. */
void comm_nccl_set_group_stream(Comm *c, CommGroup g, void *stream);
/* The launch stream waits for the group's stream (the step's end: the
 * sends' buffers may be reused after it). */
int comm_nccl_sync_group(Comm *c, CommGroup g, RtErr *e);
/* The device stream later calls are queued on (NULL: the launches'); the
 * caller orders it against the launch stream (device.h's stream_wait). */
void comm_nccl_set_stream(Comm *c, void *stream);
/* "NCCL 2.28.9", or "" when c is not an NCCL Comm. */
const char *comm_nccl_version(const Comm *c);

#ifdef HPDL_HAVE_MPI
/* MPI: initialises MPI when needed (and finalises it in destroy), checks the
 * world size against the layout, and splits the groups. On failure MPI is
 * left running, so that the caller can report the error before every rank
 * leaves: then call comm_mpi_finalize. */
Comm *comm_mpi_new(const CommLayout *l, RtErr *e);
/* The MPI library's name and version, one line ("Open MPI v4.1.4 (MPI 3.1)"). */
void comm_mpi_library(char *buf, int n);
void comm_mpi_finalize(void);
#endif
/* 1 when this process runs under a launcher (mpirun, srun, PMI). */
int comm_under_launcher(void);

#endif
