/* fake_nccl.c - a test double of libnccl over MPI on host memory, so that
 * runtime/comm_nccl.c (the NCCL Comm) runs on the emulated device, whose
 * "device" buffers are host memory: hpdlrun --device emulate with
 * HPDL_COLLECTIVES=nccl HPDL_NCCL=<this library>.
 *
 * It keeps the rules of NCCL that a caller can get wrong:
 *   - a send blocks until its receive runs (MPI_Ssend), outside a group;
 *     inside ncclGroupStart / ncclGroupEnd sends (MPI_Issend: synchronous
 *     too) and receives only start, and the group's end waits for them all
 *     (so a caller that posts two directions apart, or a held send nowhere,
 *     hangs here as on a GPU);
 *   - no tags: messages between two members match in posting order;
 *   - a communicator's members are the ranks that passed the same id;
 *     ncclCommInitRank is collective over them.
 * Communicators are made by MPI_Comm_split over the world, so every world
 * rank must make its k-th communicator at the same time (hpdlrun makes one
 * per group kind, in the same order on all ranks); the id carries the
 * creator's world rank as the split's colour. Collectives inside a group
 * run at once, in posting order. Only the types and operations hpdlrun
 * uses (uint8, int32, float32, float64; sum, max). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  char internal[128];
} ncclUniqueId;

typedef struct FakeComm {
  MPI_Comm comm;
  int rank, size;
} FakeComm;
typedef FakeComm *ncclComm_t;

/* NCCL's entry points as hpdlrun calls them (comm_nccl.c), streams unused */
int ncclGetVersion(int *v);
const char *ncclGetErrorString(int r);
int ncclGetUniqueId(ncclUniqueId *id);
int ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank);
int ncclCommDestroy(ncclComm_t c);
int ncclCommAbort(ncclComm_t c);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclSend(const void *buf, size_t n, int type, int peer, ncclComm_t c, void *stream);
int ncclRecv(void *buf, size_t n, int type, int peer, ncclComm_t c, void *stream);
int ncclAllReduce(const void *in, void *out, size_t n, int type, int op, ncclComm_t c, void *stream);
int ncclAllGather(const void *in, void *out, size_t n, int type, ncclComm_t c, void *stream);
int ncclReduceScatter(const void *in, void *out, size_t n, int type, int op, ncclComm_t c, void *stream);
int ncclBroadcast(const void *in, void *out, size_t n, int type, int root, ncclComm_t c, void *stream);
/* Not NCCL's: what was called since the last call, for tests/cuda/test_comm_nccl.c */
const char *fake_nccl_log(void);

enum { OK = 0, UNHANDLED = 1, SYSTEM = 2, INTERNAL = 3, INVALID_ARGUMENT = 4, INVALID_USAGE = 5 };

static int depth;          /* ncclGroupStart nesting */
static char journal[4096]; /* the calls, "start send@S recv@S end ..." (S the stream) */

static void note(const char *what, const void *stream) {
  size_t at = strlen(journal);
  if (at + 40 < sizeof journal) snprintf(journal + at, sizeof journal - at, "%s%s@%lx", at ? " " : "", what, (unsigned long)(uintptr_t)stream);
}

const char *fake_nccl_log(void) {
  static char copy[sizeof journal];
  memcpy(copy, journal, sizeof copy);
  journal[0] = '\0';
  return copy;
}
static MPI_Request *pending; /* the group's started transfers */
static int npending, cappending;
static int ids_made;

static MPI_Datatype type_of(int t) {
  switch (t) {
  case 1: return MPI_UINT8_T;
  case 2: return MPI_INT32_T;
  case 7: return MPI_FLOAT;
  case 8: return MPI_DOUBLE;
  default: return MPI_DATATYPE_NULL;
  }
}

static MPI_Op op_of(int op) { return op == 0 ? MPI_SUM : op == 2 ? MPI_MAX : MPI_OP_NULL; }

static int type_size(int t) { return t == 1 ? 1 : t == 8 ? 8 : 4; }

int ncclGetVersion(int *v) {
  *v = 99999; /* 9.99.99: no NCCL ever had it, so a start-up line shows the fake */
  return OK;
}

const char *ncclGetErrorString(int r) {
  switch (r) {
  case OK: return "no error";
  case INVALID_ARGUMENT: return "invalid argument (fake NCCL)";
  case INVALID_USAGE: return "invalid usage (fake NCCL)";
  default: return "MPI failed under the fake NCCL";
  }
}

int ncclGetUniqueId(ncclUniqueId *id) {
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  memset(id, 0, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fake-nccl %d %d", me, ids_made++);
  return OK;
}

int ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  int creator = -1, serial = -1;
  if (sscanf(id.internal, "fake-nccl %d %d", &creator, &serial) != 2 || creator < 0) return INVALID_ARGUMENT;
  FakeComm *c = calloc(1, sizeof *c);
  if (!c) return SYSTEM;
  if (MPI_Comm_split(MPI_COMM_WORLD, creator, rank, &c->comm) != MPI_SUCCESS) return free(c), SYSTEM;
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  if (c->size != nranks || c->rank != rank) {
    fprintf(stderr, "fake NCCL: a communicator of %d ranks was asked for %d (rank %d, asked %d)\n", c->size, nranks, c->rank, rank);
    MPI_Comm_free(&c->comm);
    free(c);
    return INVALID_USAGE;
  }
  *out = c;
  return OK;
}

int ncclCommDestroy(ncclComm_t c) {
  if (!c) return OK;
  MPI_Comm_free(&c->comm);
  free(c);
  return OK;
}

int ncclCommAbort(ncclComm_t c) { return ncclCommDestroy(c); }

int ncclGroupStart(void) {
  note("start", NULL);
  depth++;
  return OK;
}

int ncclGroupEnd(void) {
  if (depth <= 0) return INVALID_USAGE;
  note("end", NULL);
  if (--depth > 0) return OK;
  int rc = npending ? MPI_Waitall(npending, pending, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
  npending = 0;
  return rc == MPI_SUCCESS ? OK : SYSTEM;
}

static MPI_Request *next_request(void) {
  if (npending == cappending) {
    int cap = cappending ? 2 * cappending : 16;
    MPI_Request *r = realloc(pending, sizeof *r * (size_t)cap);
    if (!r) return NULL;
    pending = r;
    cappending = cap;
  }
  return &pending[npending++];
}

static int bad_args(ncclComm_t c, int type, int peer) {
  return !c || type_of(type) == MPI_DATATYPE_NULL || (peer != -1 && (peer < 0 || peer >= c->size));
}

int ncclSend(const void *buf, size_t n, int type, int peer, ncclComm_t c, void *stream) {
  note("send", stream);
  if (bad_args(c, type, peer)) return INVALID_ARGUMENT;
  if (depth == 0) return MPI_Ssend(buf, (int)n, type_of(type), peer, 0, c->comm) == MPI_SUCCESS ? OK : SYSTEM;
  MPI_Request *r = next_request();
  if (!r) return SYSTEM;
  return MPI_Issend(buf, (int)n, type_of(type), peer, 0, c->comm, r) == MPI_SUCCESS ? OK : SYSTEM;
}

int ncclRecv(void *buf, size_t n, int type, int peer, ncclComm_t c, void *stream) {
  note("recv", stream);
  if (bad_args(c, type, peer)) return INVALID_ARGUMENT;
  if (depth == 0) return MPI_Recv(buf, (int)n, type_of(type), peer, 0, c->comm, MPI_STATUS_IGNORE) == MPI_SUCCESS ? OK : SYSTEM;
  MPI_Request *r = next_request();
  if (!r) return SYSTEM;
  return MPI_Irecv(buf, (int)n, type_of(type), peer, 0, c->comm, r) == MPI_SUCCESS ? OK : SYSTEM;
}

int ncclAllReduce(const void *in, void *out, size_t n, int type, int op, ncclComm_t c, void *stream) {
  note("allreduce", stream);
  if (bad_args(c, type, -1) || op_of(op) == MPI_OP_NULL) return INVALID_ARGUMENT;
  return MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, (int)n, type_of(type), op_of(op), c->comm) == MPI_SUCCESS ? OK : SYSTEM;
}

int ncclAllGather(const void *in, void *out, size_t n, int type, ncclComm_t c, void *stream) {
  (void)stream;
  if (bad_args(c, type, -1)) return INVALID_ARGUMENT;
  int inplace = (const char *)in == (const char *)out + (size_t)c->rank * n * (size_t)type_size(type);
  return MPI_Allgather(inplace ? MPI_IN_PLACE : in, (int)n, type_of(type), out, (int)n, type_of(type), c->comm) == MPI_SUCCESS ? OK
                                                                                                                             : SYSTEM;
}

int ncclReduceScatter(const void *in, void *out, size_t n, int type, int op, ncclComm_t c, void *stream) {
  (void)stream;
  if (bad_args(c, type, -1) || op_of(op) == MPI_OP_NULL) return INVALID_ARGUMENT;
  /* NCCL's in place: out is this member's n values of in; MPI's buffers may not overlap */
  size_t bytes = n * (size_t)type_size(type);
  void *copy = NULL;
  if ((const char *)out == (const char *)in + (size_t)c->rank * bytes) {
    if (!(copy = malloc(bytes * (size_t)c->size + 1))) return SYSTEM;
    memcpy(copy, in, bytes * (size_t)c->size);
    in = copy;
  }
  int rc = MPI_Reduce_scatter_block(in, out, (int)n, type_of(type), op_of(op), c->comm) == MPI_SUCCESS ? OK : SYSTEM;
  free(copy);
  return rc;
}

int ncclBroadcast(const void *in, void *out, size_t n, int type, int root, ncclComm_t c, void *stream) {
  (void)stream;
  if (bad_args(c, type, root)) return INVALID_ARGUMENT;
  if (c->rank == root && in != out) memcpy(out, in, n * (size_t)type_size(type));
  return MPI_Bcast(out, (int)n, type_of(type), root, c->comm) == MPI_SUCCESS ? OK : SYSTEM;
}
