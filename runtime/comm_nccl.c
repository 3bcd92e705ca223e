/* comm_nccl.c - the Comm table over NCCL on the GPUs' own buffers (comm.h).
 *
 * libnccl is opened with dlopen, so nothing of CUDA is needed to build
 * this; the few declarations below are NCCL's ABI as nccl.h states it
 * (ncclUniqueId is 128 bytes, handles are pointers, enumerations ints).
 * Every call is queued on stream 0, the legacy default stream the device
 * layer launches its kernels and GEMMs on, so a collective runs after the
 * kernels that produced its input and before those that read its output,
 * with no synchronisation of the host; or on another stream the caller
 * names (comm_nccl_set_stream) and orders itself.
 *
 * NCCL has no tags: the messages between two members match in the order
 * they are posted, which the programs keep (a pipeline stage's activations
 * go out in micro-batch order and its neighbour receives them in that
 * order). A send blocks its stream until the receive runs, so sends that
 * must not wait (Comm.isend) are held back and posted in one group with
 * the next send, receive or wait_sends of this Comm. */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "device.h"

typedef struct {
  char internal[128];
} NcclUniqueId;
typedef void *NcclComm;
typedef void *NcclStream;

enum { NCCL_UINT8 = 1, NCCL_INT32 = 2, NCCL_FLOAT32 = 7, NCCL_FLOAT64 = 8 };
enum { NCCL_SUM = 0, NCCL_MAX = 2 };

typedef struct {
  void *lib;
  char version[32];
  const char *(*error_string)(int);
  int (*get_unique_id)(NcclUniqueId *);
  int (*comm_init_rank)(NcclComm *, int, NcclUniqueId, int);
  int (*comm_destroy)(NcclComm);
  int (*all_reduce)(const void *, void *, size_t, int, int, NcclComm, NcclStream);
  int (*all_gather)(const void *, void *, size_t, int, NcclComm, NcclStream);
  int (*reduce_scatter)(const void *, void *, size_t, int, int, NcclComm, NcclStream);
  int (*broadcast)(const void *, void *, size_t, int, int, NcclComm, NcclStream);
  int (*send)(const void *, size_t, int, int, NcclComm, NcclStream);
  int (*recv)(void *, size_t, int, int, NcclComm, NcclStream);
  int (*group_start)(void);
  int (*group_end)(void);
} NcclLib;

typedef struct {
  const void *buf;
  int64_t n;
  CommType t;
  CommGroup g;
  int peer;
} HeldSend;

typedef struct {
  NcclLib api;
  NcclComm comm[COMM_NGROUPS]; /* NULL for a group of one */
  Comm *host;
  CommDevCopy copy;
  HeldSend *held;
  int nheld, cap;
  NcclStream stream; /* the stream calls are queued on: NULL, the launches' (comm_nccl_set_stream) */
  NcclStream p2p_stream[COMM_NGROUPS]; /* a group's sends and receives (comm_nccl_set_group_stream) */
} NcclImpl;

static NcclImpl *impl_of(Comm *c) { return c->impl; }

static int nccl_type(CommType t) {
  switch (t) {
  case COMM_F32: return NCCL_FLOAT32;
  case COMM_F64: return NCCL_FLOAT64;
  case COMM_I32: return NCCL_INT32;
  default: return NCCL_UINT8;
  }
}

static int failed(NcclImpl *z, int rc, const char *what, CommGroup g, RtErr *e) {
  if (rc == 0) return 0;
  snprintf(e->msg, sizeof e->msg, "NCCL %s over %s: %s (error %d)", what, comm_group_name(g),
           z->api.error_string ? z->api.error_string(rc) : "failed", rc);
  return -1;
}

static NcclComm comm_of(Comm *c, CommGroup g, const char *what, RtErr *e) {
  NcclComm k = impl_of(c)->comm[g];
  if (!k) snprintf(e->msg, sizeof e->msg, "NCCL %s over %s: no communicator (a group of one member, or the world)", what, comm_group_name(g));
  return k;
}

static int dev_copy(NcclImpl *z, void *dst, const void *src, size_t bytes, RtErr *e) {
  if (dst == src || !bytes) return 0;
  if (z->copy.copy && z->copy.copy(z->copy.ctx, dst, src, bytes) == 0) return 0;
  snprintf(e->msg, sizeof e->msg, "a copy of %zu bytes on the device failed", bytes);
  return -1;
}

/* The stream of group g's point-to-point calls. */
static NcclStream p2p_stream(NcclImpl *z, CommGroup g) { return z->p2p_stream[g] ? z->p2p_stream[g] : z->stream; }

static int order(NcclImpl *z, void *waiter, void *waited, RtErr *e) {
  if (waiter == waited || !z->copy.stream_wait || z->copy.stream_wait(z->copy.ctx, waiter, waited) == 0) return 0;
  snprintf(e->msg, sizeof e->msg, "ordering a stream after another failed");
  return -1;
}

/* Posts the held sends of group g (every group: COMM_NGROUPS) inside the
 * group call the caller opened; the others stay held. */
static int post_held(Comm *c, CommGroup g, RtErr *e) {
  NcclImpl *z = impl_of(c);
  int kept = 0;
  for (int i = 0; i < z->nheld; i++) {
    HeldSend *h = &z->held[i];
    if (g != COMM_NGROUPS && h->g != g) {
      z->held[kept++] = *h;
      continue;
    }
    NcclComm k = comm_of(c, h->g, "send", e);
    if (!k || failed(z, z->api.send(h->buf, (size_t)h->n, nccl_type(h->t), h->peer, k, p2p_stream(z, h->g)), "send", h->g, e))
      return -1;
  }
  z->nheld = kept;
  return 0;
}

static int n_all_reduce(Comm *c, CommGroup g, CommType t, CommOp op, void *buf, int64_t n, RtErr *e) {
  if (c->size[g] <= 1) return 0;
  NcclImpl *z = impl_of(c);
  NcclComm k = comm_of(c, g, "all_reduce", e);
  return k ? failed(z, z->api.all_reduce(buf, buf, (size_t)n, nccl_type(t), op == COMM_MAX ? NCCL_MAX : NCCL_SUM, k, z->stream),
                    "all_reduce", g, e)
           : -1;
}

static int n_all_gather(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  NcclImpl *z = impl_of(c);
  if (c->size[g] <= 1) return dev_copy(z, out, in, (size_t)n * (size_t)comm_type_size(t), e);
  NcclComm k = comm_of(c, g, "all_gather", e);
  return k ? failed(z, z->api.all_gather(in, out, (size_t)n, nccl_type(t), k, z->stream), "all_gather", g, e) : -1;
}

static int n_reduce_scatter(Comm *c, CommGroup g, CommType t, CommOp op, const void *in, int64_t n, void *out, RtErr *e) {
  NcclImpl *z = impl_of(c);
  if (c->size[g] <= 1) return dev_copy(z, out, in, (size_t)n * (size_t)comm_type_size(t), e);
  NcclComm k = comm_of(c, g, "reduce_scatter", e);
  return k ? failed(z,
                    z->api.reduce_scatter(in, out, (size_t)n, nccl_type(t), op == COMM_MAX ? NCCL_MAX : NCCL_SUM, k, z->stream),
                    "reduce_scatter", g, e)
           : -1;
}

static int n_broadcast(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int root, RtErr *e) {
  if (c->size[g] <= 1) return 0;
  NcclImpl *z = impl_of(c);
  NcclComm k = comm_of(c, g, "broadcast", e);
  return k ? failed(z, z->api.broadcast(buf, buf, (size_t)n, nccl_type(t), root, k, z->stream), "broadcast", g, e) : -1;
}

/* One point-to-point call with the group's held sends, in a group call;
 * on the group's own stream, ordered after the launches (and a receive's
 * launches after it). */
static int p2p(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int peer, int sending, RtErr *e) {
  NcclImpl *z = impl_of(c);
  const char *what = sending ? "send" : "recv";
  NcclComm k = comm_of(c, g, what, e);
  NcclStream s = p2p_stream(z, g);
  if (!k || order(z, s, z->stream, e)) return -1;
  if (failed(z, z->api.group_start(), "group start", g, e)) return -1;
  int rc = post_held(c, g, e);
  if (!rc)
    rc = failed(z,
                sending ? z->api.send(buf, (size_t)n, nccl_type(t), peer, k, s) : z->api.recv(buf, (size_t)n, nccl_type(t), peer, k, s),
                what, g, e);
  int end = z->api.group_end();
  if (!rc && end) rc = failed(z, end, "group end", g, e);
  return rc ? rc : sending ? 0 : order(z, z->stream, s, e);
}

static int n_send(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  return p2p(c, g, t, (void *)buf, n, peer, 1, e);
}

static int n_recv(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int peer, int tag, RtErr *e) {
  return p2p(c, g, t, buf, n, peer, 0, e);
}

/* The ring's exchange on the group's own stream (comm_nccl_set_group_stream;
 * else the launches' stream, where it cannot overlap them): ordered after
 * the launches that made the message, one group of a send and a receive,
 * returning at once; exchange_wait orders the launches after it. */
static int n_exchange_start(Comm *c, CommGroup g, CommType t, const void *send, int to, void *recv, int from, int64_t n, int tag,
                            void **handle, RtErr *e) {
  (void)tag;
  NcclImpl *z = impl_of(c);
  NcclComm k = comm_of(c, g, "exchange", e);
  NcclStream s = p2p_stream(z, g);
  if (!k || order(z, s, z->stream, e)) return -1;
  if (failed(z, z->api.group_start(), "group start", g, e)) return -1;
  int rc = post_held(c, g, e);
  if (!rc) rc = failed(z, z->api.send(send, (size_t)n, nccl_type(t), to, k, s), "send", g, e);
  if (!rc) rc = failed(z, z->api.recv(recv, (size_t)n, nccl_type(t), from, k, s), "recv", g, e);
  int end = z->api.group_end();
  if (!rc && end) rc = failed(z, end, "group end", g, e);
  *handle = (void *)(intptr_t)(1 + (int)g);
  return rc;
}

static int n_exchange_wait(Comm *c, void *handle, RtErr *e) {
  NcclImpl *z = impl_of(c);
  int g = (int)(intptr_t)handle - 1;
  if (g < 0 || g >= COMM_NGROUPS) return snprintf(e->msg, sizeof e->msg, "an exchange that was not started"), -1;
  return order(z, z->stream, p2p_stream(z, (CommGroup)g), e);
}

static int n_isend(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  NcclImpl *z = impl_of(c);
  if (!comm_of(c, g, "send", e)) return -1;
  if (z->nheld == z->cap) {
    int cap = z->cap ? 2 * z->cap : 16;
    HeldSend *h = realloc(z->held, sizeof *h * (size_t)cap);
    if (!h) return snprintf(e->msg, sizeof e->msg, "out of memory for a held send"), -1;
    z->held = h;
    z->cap = cap;
  }
  z->held[z->nheld++] = (HeldSend){buf, n, t, g, peer};
  return 0;
}

static int n_wait_sends(Comm *c, RtErr *e) {
  NcclImpl *z = impl_of(c);
  if (!z->nheld) return 0;
  for (int g = 0; g < COMM_NGROUPS; g++)
    if (z->p2p_stream[g] && order(z, z->p2p_stream[g], z->stream, e)) return -1;
  if (failed(z, z->api.group_start(), "group start", COMM_WORLD, e)) return -1;
  int rc = post_held(c, COMM_NGROUPS, e);
  int end = z->api.group_end();
  return rc ? rc : failed(z, end, "group end", COMM_WORLD, e);
}

static int n_barrier(Comm *c, CommGroup g, RtErr *e) { return impl_of(c)->host->ops->barrier(impl_of(c)->host, g, e); }

/* n values to each member: a send and a receive per member, in one group. */
static int n_all_to_all(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  NcclImpl *z = impl_of(c);
  size_t bytes = (size_t)n * (size_t)comm_type_size(t);
  if (c->size[g] <= 1) return dev_copy(z, out, in, bytes, e);
  NcclComm k = comm_of(c, g, "all_to_all", e);
  if (!k || failed(z, z->api.group_start(), "group start", g, e)) return -1;
  int rc = 0;
  for (int m = 0; m < c->size[g] && !rc; m++) {
    rc = failed(z, z->api.send((const char *)in + (size_t)m * bytes, (size_t)n, nccl_type(t), m, k, z->stream), "all_to_all", g, e);
    if (!rc) rc = failed(z, z->api.recv((char *)out + (size_t)m * bytes, (size_t)n, nccl_type(t), m, k, z->stream), "all_to_all", g, e);
  }
  int end = z->api.group_end();
  return rc ? rc : failed(z, end, "group end", g, e);
}

static int n_group(Comm *c, int begin, RtErr *e) {
  NcclImpl *z = impl_of(c);
  return failed(z, begin ? z->api.group_start() : z->api.group_end(), begin ? "group start" : "group end", COMM_WORLD, e);
}

static void n_abort(Comm *c, int code) { impl_of(c)->host->ops->abort(impl_of(c)->host, code); }

static void n_destroy(Comm *c) {
  NcclImpl *z = impl_of(c);
  for (int g = 0; g < COMM_NGROUPS; g++)
    if (z->comm[g]) z->api.comm_destroy(z->comm[g]);
  free(z->held);
  free(z);
  free(c);
}

static const CommOps nccl_ops = {"nccl",  n_all_reduce, n_all_gather, n_reduce_scatter, n_broadcast,
                                 n_send,  n_recv,       n_barrier,    n_abort,          n_destroy,
                                 n_isend, n_wait_sends, n_all_to_all, n_group,
                                 n_exchange_start, n_exchange_wait};

void comm_nccl_set_group_stream(Comm *c, CommGroup g, void *stream) {
  if (c && c->ops == &nccl_ops && g >= 0 && g < COMM_NGROUPS) ((NcclImpl *)c->impl)->p2p_stream[g] = stream;
}

int comm_nccl_sync_group(Comm *c, CommGroup g, RtErr *e) {
  if (!c || c->ops != &nccl_ops || g < 0 || g >= COMM_NGROUPS) return 0;
  NcclImpl *z = c->impl;
  return z->p2p_stream[g] ? order(z, z->stream, z->p2p_stream[g], e) : 0;
}

void comm_nccl_set_stream(Comm *c, void *stream) {
  if (c && c->ops == &nccl_ops) ((NcclImpl *)c->impl)->stream = stream;
}

const char *comm_nccl_version(const Comm *c) { return c && c->ops == &nccl_ops ? ((NcclImpl *)c->impl)->api.version : ""; }

static int load(NcclLib *a, RtErr *e) {
  char tried[2048] = "";
  if (!(a->lib = dev_nccl_open(tried, sizeof tried))) {
    snprintf(e->msg, sizeof e->msg, "no NCCL: could not open %.900s (set HPDL_NCCL to libnccl.so.2)", tried);
    return -1;
  }
  if (dev_nccl_version_text(a->lib, a->version, sizeof a->version)) snprintf(a->version, sizeof a->version, "(version unknown)");
  struct {
    const char *name;
    void **fn;
  } syms[] = {
      {"ncclGetErrorString", (void **)&a->error_string}, {"ncclGetUniqueId", (void **)&a->get_unique_id},
      {"ncclCommInitRank", (void **)&a->comm_init_rank}, {"ncclCommDestroy", (void **)&a->comm_destroy},
      {"ncclAllReduce", (void **)&a->all_reduce},        {"ncclAllGather", (void **)&a->all_gather},
      {"ncclReduceScatter", (void **)&a->reduce_scatter}, {"ncclBroadcast", (void **)&a->broadcast},
      {"ncclSend", (void **)&a->send},                   {"ncclRecv", (void **)&a->recv},
      {"ncclGroupStart", (void **)&a->group_start},      {"ncclGroupEnd", (void **)&a->group_end},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
    if (!(*syms[i].fn = dlsym(a->lib, syms[i].name))) {
      /* ncclSend / ncclRecv arrived in NCCL 2.7 */
      snprintf(e->msg, sizeof e->msg, "NCCL %s lacks %s (NCCL 2.7 or newer is needed)", a->version, syms[i].name);
      return -1;
    }
  return 0;
}

Comm *comm_nccl_new(Comm *host, const CommDevCopy *copy, RtErr *e) {
  Comm *c = calloc(1, sizeof *c);
  NcclImpl *z = calloc(1, sizeof *z);
  if (!c || !z) {
    free(c);
    free(z);
    snprintf(e->msg, sizeof e->msg, "out of memory");
    return NULL;
  }
  c->ops = &nccl_ops;
  c->impl = z;
  c->layout = host->layout;
  c->world_rank = host->world_rank;
  c->world_size = host->world_size;
  c->coords = host->coords;
  memcpy(c->rank, host->rank, sizeof c->rank);
  memcpy(c->size, host->size, sizeof c->size);
  c->node_ranks = host->node_ranks;
  z->host = host;
  if (copy) z->copy = *copy;
  /* the libraries are loaded on every rank before any group is made, so a
   * rank without NCCL fails here, not inside another's communicator */
  int bad = load(&z->api, e) ? 1 : 0, any = bad;
  RtErr he = {{0}};
  if (host->ops->all_reduce(host, COMM_WORLD, COMM_I32, COMM_MAX, &any, 1, &he)) {
    snprintf(e->msg, sizeof e->msg, "%s", he.msg);
    bad = any = 1;
  }
  if (any) {
    if (!bad) snprintf(e->msg, sizeof e->msg, "another rank could not load NCCL");
    n_destroy(c);
    return NULL;
  }
  /* every group the programs use; not the world's (nothing the device does
   * spans it, and a communicator holds buffers on every GPU of it) */
  for (int g = 0; g < COMM_NGROUPS; g++) {
    if (host->size[g] <= 1 || g == COMM_WORLD) continue;
    NcclUniqueId id;
    memset(&id, 0, sizeof id);
    int rc = host->rank[g] == 0 ? z->api.get_unique_id(&id) : 0;
    /* member 0's id (or its failure) to the group's members */
    int32_t status = rc;
    if (host->ops->broadcast(host, (CommGroup)g, COMM_I32, &status, 1, 0, &he) ||
        host->ops->broadcast(host, (CommGroup)g, COMM_U8, &id, (int64_t)sizeof id, 0, &he)) {
      snprintf(e->msg, sizeof e->msg, "the NCCL id of the %s group: %.900s", comm_group_name((CommGroup)g), he.msg);
      n_destroy(c);
      return NULL;
    }
    if (status || (rc = z->api.comm_init_rank(&z->comm[g], host->size[g], id, host->rank[g]))) {
      failed(z, status ? status : rc, status ? "ncclGetUniqueId" : "ncclCommInitRank", (CommGroup)g, e);
      n_destroy(c);
      return NULL;
    }
  }
  return c;
}
