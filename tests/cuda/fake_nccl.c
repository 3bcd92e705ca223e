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
 * uses (uint8, int32, float32, float64; sum, max).
 *
 * Streams: on the emulated device whose streams run late
 * (HPDL_EMU_STREAMS, runtime/device/emustream.h) a collective outside a
 * group is held on its stream when that stream holds its work
 * (hpdl_emu_defer, found in the process by name) and runs when the device
 * drains it, as a GPU runs it when the stream gets to it; a send, a receive
 * or a grouped call first runs what its stream holds, then runs at once.
 * Elsewhere every call runs at once. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
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
/* The emulated device's hooks (runtime/device/device_emu.c), when hpdlrun has them */
typedef int (*RunHeld)(void *arg, char *msg, size_t len);
static int (*defer_hook)(void *stream, RunHeld run, void *arg);
static int (*drain_hook)(void *stream);
static int hooks_looked;

static void look_hooks(void) {
  if (hooks_looked) return;
  hooks_looked = 1;
  *(void **)&defer_hook = dlsym(RTLD_DEFAULT, "hpdl_emu_defer");
  *(void **)&drain_hook = dlsym(RTLD_DEFAULT, "hpdl_emu_drain");
}

/* Before a call that runs at once on `stream`: what the stream holds runs first. */
static int run_held(void *stream) {
  look_hooks();
  return drain_hook && drain_hook(stream) ? SYSTEM : OK;
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
  if (run_held(stream)) return SYSTEM;
  if (depth == 0) return MPI_Ssend(buf, (int)n, type_of(type), peer, 0, c->comm) == MPI_SUCCESS ? OK : SYSTEM;
  MPI_Request *r = next_request();
  if (!r) return SYSTEM;
  return MPI_Issend(buf, (int)n, type_of(type), peer, 0, c->comm, r) == MPI_SUCCESS ? OK : SYSTEM;
}

int ncclRecv(void *buf, size_t n, int type, int peer, ncclComm_t c, void *stream) {
  note("recv", stream);
  if (bad_args(c, type, peer)) return INVALID_ARGUMENT;
  if (run_held(stream)) return SYSTEM;
  if (depth == 0) return MPI_Recv(buf, (int)n, type_of(type), peer, 0, c->comm, MPI_STATUS_IGNORE) == MPI_SUCCESS ? OK : SYSTEM;
  MPI_Request *r = next_request();
  if (!r) return SYSTEM;
  return MPI_Irecv(buf, (int)n, type_of(type), peer, 0, c->comm, r) == MPI_SUCCESS ? OK : SYSTEM;
}

/* A collective, run at once or held on its stream. */
typedef enum { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST } Kind;
typedef struct {
  Kind kind;
  const void *in;
  void *out;
  size_t n;
  int type, op, root;
  ncclComm_t c;
} Collective;

static const char *const kind_names[] = {"allreduce", "allgather", "reducescatter", "broadcast"};

static int run_collective(const Collective *x) {
  ncclComm_t c = x->c;
  size_t bytes = x->n * (size_t)type_size(x->type);
  int n = (int)x->n;
  MPI_Datatype t = type_of(x->type);
  int rc = INVALID_ARGUMENT;
  switch (x->kind) {
  case ALL_REDUCE:
    rc = MPI_Allreduce(x->in == x->out ? MPI_IN_PLACE : x->in, x->out, n, t, op_of(x->op), c->comm) == MPI_SUCCESS ? OK : SYSTEM;
    break;
  case ALL_GATHER: {
    int inplace = (const char *)x->in == (const char *)x->out + (size_t)c->rank * bytes;
    rc = MPI_Allgather(inplace ? MPI_IN_PLACE : x->in, n, t, x->out, n, t, c->comm) == MPI_SUCCESS ? OK : SYSTEM;
    break;
  }
  case REDUCE_SCATTER: {
    /* NCCL's in place: out is this member's n values of in; MPI's buffers may not overlap */
    const void *in = x->in;
    void *copy = NULL;
    if ((const char *)x->out == (const char *)in + (size_t)c->rank * bytes) {
      if (!(copy = malloc(bytes * (size_t)c->size + 1))) return SYSTEM;
      memcpy(copy, in, bytes * (size_t)c->size);
      in = copy;
    }
    rc = MPI_Reduce_scatter_block(in, x->out, n, t, op_of(x->op), c->comm) == MPI_SUCCESS ? OK : SYSTEM;
    free(copy);
    break;
  }
  case BROADCAST:
    if (c->rank == x->root && x->in != x->out) memcpy(x->out, x->in, bytes);
    rc = MPI_Bcast(x->out, n, t, x->root, c->comm) == MPI_SUCCESS ? OK : SYSTEM;
    break;
  }
  return rc;
}

static int run_held_collective(void *arg, char *msg, size_t len) {
  const Collective *x = arg;
  if (run_collective(x) == OK) return 0;
  snprintf(msg, len, "the fake NCCL's %s of %zu values failed", kind_names[x->kind], x->n);
  return -1;
}

static int collective(const Collective *x, void *stream) {
  note(kind_names[x->kind], stream);
  look_hooks();
  if (depth == 0 && defer_hook) {
    Collective *held = malloc(sizeof *held);
    if (!held) return SYSTEM;
    *held = *x;
    if (defer_hook(stream, run_held_collective, held)) return OK;
    free(held);
  }
  if (run_held(stream)) return SYSTEM;
  return run_collective(x);
}

int ncclAllReduce(const void *in, void *out, size_t n, int type, int op, ncclComm_t c, void *stream) {
  if (bad_args(c, type, -1) || op_of(op) == MPI_OP_NULL) return INVALID_ARGUMENT;
  return collective(&(Collective){ALL_REDUCE, in, out, n, type, op, 0, c}, stream);
}

int ncclAllGather(const void *in, void *out, size_t n, int type, ncclComm_t c, void *stream) {
  if (bad_args(c, type, -1)) return INVALID_ARGUMENT;
  return collective(&(Collective){ALL_GATHER, in, out, n, type, 0, 0, c}, stream);
}

int ncclReduceScatter(const void *in, void *out, size_t n, int type, int op, ncclComm_t c, void *stream) {
  if (bad_args(c, type, -1) || op_of(op) == MPI_OP_NULL) return INVALID_ARGUMENT;
  return collective(&(Collective){REDUCE_SCATTER, in, out, n, type, op, 0, c}, stream);
}

int ncclBroadcast(const void *in, void *out, size_t n, int type, int root, ncclComm_t c, void *stream) {
  if (bad_args(c, type, root)) return INVALID_ARGUMENT;
  return collective(&(Collective){BROADCAST, in, out, n, type, 0, root, c}, stream);
}
