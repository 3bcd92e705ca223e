/* comm_mpi.c - the Comm interface over MPI (CPU ranks).
 *
 * One communicator per group, made with MPI_Comm_split: ranks that share
 * every coordinate but the group's own land together, ordered by that
 * coordinate, so member i of the tensor group is tp_i. Counts above
 * INT_MAX (MPI-3's int counts) are sent in pieces. */
#include <inttypes.h>
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"

typedef struct {
  MPI_Comm group[COMM_NGROUPS];
  MPI_Request *pending; /* isend's requests, until wait_sends */
  int npending, cappending;
} Mpi;

/* MPI_CHECK: on failure, the library's own message, with file and line. */
#define MPI_CHECK(call, e)                                                  \
  do {                                                                      \
    int rc_ = (call);                                                       \
    if (rc_ != MPI_SUCCESS) return mpi_fail((e), rc_, #call, __FILE__, __LINE__); \
  } while (0)

static int mpi_fail(RtErr *e, int rc, const char *what, const char *file, int line) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
  /* name the call only up to its first parenthesis: "MPI_Allreduce" */
  int n = (int)strcspn(what, "(");
  return rt_fail(e, "%.*s failed (%s:%d): %s", n, what, file, line, msg);
}

static MPI_Datatype mpi_type(CommType t) {
  switch (t) {
  case COMM_F32: return MPI_FLOAT;
  case COMM_F64: return MPI_DOUBLE;
  case COMM_I32: return MPI_INT32_T;
  case COMM_U8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

static MPI_Comm grp(Comm *c, CommGroup g) { return ((Mpi *)c->impl)->group[g]; }

enum { PIECE = 1 << 30 };

static int m_all_reduce(Comm *c, CommGroup g, CommType t, CommOp op, void *buf, int64_t n, RtErr *e) {
  if (c->size[g] == 1) return 0;
  if (t == COMM_U8) return rt_fail(e, "all_reduce of bytes");
  for (int64_t at = 0; at < n; at += PIECE) {
    int k = (int)(n - at < PIECE ? n - at : PIECE);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + at * comm_type_size(t), k, mpi_type(t), op == COMM_SUM ? MPI_SUM : MPI_MAX,
                            grp(c, g)),
              e);
  }
  return 0;
}

static int m_all_gather(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  if (c->size[g] == 1) {
    if (out != in) memmove(out, in, (size_t)n * (size_t)comm_type_size(t));
    return 0;
  }
  if (n > INT_MAX) return rt_fail(e, "all_gather of %lld values: at most INT_MAX per member", (long long)n);
  /* in already at this member's place in out: MPI's in-place form (MPI forbids overlapping buffers otherwise) */
  const void *send = (const char *)in == (const char *)out + (size_t)c->rank[g] * (size_t)n * (size_t)comm_type_size(t) ? MPI_IN_PLACE : in;
  MPI_CHECK(MPI_Allgather(send, (int)n, mpi_type(t), out, (int)n, mpi_type(t), grp(c, g)), e);
  return 0;
}

static int m_reduce_scatter(Comm *c, CommGroup g, CommType t, CommOp op, const void *in, int64_t n, void *out, RtErr *e) {
  if (c->size[g] == 1) {
    if (out != in) memmove(out, in, (size_t)n * (size_t)comm_type_size(t));
    return 0;
  }
  if (t == COMM_U8) return rt_fail(e, "reduce_scatter of bytes");
  if (n > INT_MAX) return rt_fail(e, "reduce_scatter of %lld values: at most INT_MAX per member", (long long)n);
  MPI_CHECK(MPI_Reduce_scatter_block(in, out, (int)n, mpi_type(t), op == COMM_SUM ? MPI_SUM : MPI_MAX, grp(c, g)), e);
  return 0;
}

static int m_broadcast(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int root, RtErr *e) {
  if (c->size[g] == 1) return 0;
  for (int64_t at = 0; at < n; at += PIECE) {
    int k = (int)(n - at < PIECE ? n - at : PIECE);
    MPI_CHECK(MPI_Bcast((char *)buf + at * comm_type_size(t), k, mpi_type(t), root, grp(c, g)), e);
  }
  return 0;
}

static int m_send(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  if (peer < 0 || peer >= c->size[g]) return rt_fail(e, "send to member %d of a %s group of %d", peer, comm_group_name(g), c->size[g]);
  for (int64_t at = 0; at < n || (n == 0 && at == 0); at += PIECE) {
    int k = (int)(n - at < PIECE ? n - at : PIECE);
    MPI_CHECK(MPI_Send((const char *)buf + at * comm_type_size(t), k, mpi_type(t), peer, tag, grp(c, g)), e);
    if (n == 0) break;
  }
  return 0;
}

static int m_recv(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int peer, int tag, RtErr *e) {
  if (peer < 0 || peer >= c->size[g]) return rt_fail(e, "recv from member %d of a %s group of %d", peer, comm_group_name(g), c->size[g]);
  for (int64_t at = 0; at < n || (n == 0 && at == 0); at += PIECE) {
    int k = (int)(n - at < PIECE ? n - at : PIECE);
    MPI_Status st;
    MPI_CHECK(MPI_Recv((char *)buf + at * comm_type_size(t), k, mpi_type(t), peer, tag, grp(c, g), &st), e);
    int got = 0;
    MPI_Get_count(&st, mpi_type(t), &got);
    if (got != k) return rt_fail(e, "recv over %s: expected %d values from member %d, got %d", comm_group_name(g), k, peer, got);
    if (n == 0) break;
  }
  return 0;
}

static int m_isend(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  if (peer < 0 || peer >= c->size[g]) return rt_fail(e, "send to member %d of a %s group of %d", peer, comm_group_name(g), c->size[g]);
  Mpi *m = c->impl;
  for (int64_t at = 0; at < n || (n == 0 && at == 0); at += PIECE) {
    if (m->npending == m->cappending) {
      int cap = m->cappending ? 2 * m->cappending : 16;
      MPI_Request *p = realloc(m->pending, sizeof(MPI_Request) * (size_t)cap);
      if (!p) return rt_fail(e, "out of memory for a pending send");
      m->pending = p;
      m->cappending = cap;
    }
    int k = (int)(n - at < PIECE ? n - at : PIECE);
    MPI_CHECK(MPI_Isend((const char *)buf + at * comm_type_size(t), k, mpi_type(t), peer, tag, grp(c, g), &m->pending[m->npending]), e);
    m->npending++;
    if (n == 0) break;
  }
  return 0;
}

static int m_wait_sends(Comm *c, RtErr *e) {
  Mpi *m = c->impl;
  int n = m->npending;
  m->npending = 0;
  if (n) MPI_CHECK(MPI_Waitall(n, m->pending, MPI_STATUSES_IGNORE), e);
  return 0;
}

/* The ring's exchange: a receive and a send posted at once, completed by
 * m_exchange_wait (MPI moves the data as its progress allows: at the latest
 * in the wait). Messages past one MPI count are exchanged at once instead. */
static int m_exchange_start(Comm *c, CommGroup g, CommType t, const void *send, int to, void *recv, int from, int64_t n, int tag,
                            void **handle, RtErr *e) {
  if (n > PIECE) return 1;
  if (to < 0 || to >= c->size[g] || from < 0 || from >= c->size[g])
    return rt_fail(e, "an exchange with members %d and %d of a %s group of %d", to, from, comm_group_name(g), c->size[g]);
  MPI_Request *r = malloc(2 * sizeof *r);
  if (!r) return rt_fail(e, "out of memory for an exchange");
  int rc = MPI_Irecv(recv, (int)n, mpi_type(t), from, tag, grp(c, g), &r[0]);
  if (rc == MPI_SUCCESS) rc = MPI_Isend(send, (int)n, mpi_type(t), to, tag, grp(c, g), &r[1]);
  if (rc != MPI_SUCCESS) {
    free(r);
    MPI_CHECK(rc, e);
  }
  *handle = r;
  return 0;
}

static int m_exchange_wait(Comm *c, void *handle, RtErr *e) {
  (void)c;
  MPI_Request *r = handle;
  int rc = MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
  free(r);
  MPI_CHECK(rc, e);
  return 0;
}

static int m_all_to_all(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  if (n > INT_MAX) return rt_fail(e, "all_to_all of %" PRId64 " values a member: more than MPI's int counts", n);
  MPI_CHECK(MPI_Alltoall(in, (int)n, mpi_type(t), out, (int)n, mpi_type(t), grp(c, g)), e);
  return 0;
}

static int m_barrier(Comm *c, CommGroup g, RtErr *e) {
  MPI_CHECK(MPI_Barrier(grp(c, g)), e);
  return 0;
}

static void m_abort(Comm *c, int code) { MPI_Abort(MPI_COMM_WORLD, code); }

static int we_initialised; /* MPI_Init was ours, so MPI_Finalize is too */

void comm_mpi_library(char *buf, int n) {
  char v[MPI_MAX_LIBRARY_VERSION_STRING] = "";
  int len = 0, major = 0, minor = 0;
  MPI_Get_library_version(v, &len); /* callable before MPI_Init */
  MPI_Get_version(&major, &minor);
  char *nl = strchr(v, '\n');
  if (nl) *nl = '\0';
  char *comma = strstr(v, ", package");
  if (comma) *comma = '\0';
  snprintf(buf, (size_t)n, "%s (MPI %d.%d)", v, major, minor);
}

void comm_mpi_finalize(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (we_initialised && init && !fin) MPI_Finalize();
}

/* Frees the groups; keep_mpi: leave MPI running (a failed comm_mpi_new,
 * whose caller reports the error before comm_mpi_finalize). */
static void free_comm(Comm *c, int keep_mpi) {
  Mpi *m = c->impl;
  if (m) {
    for (int g = 1; g < COMM_NGROUPS; g++)
      if (m->group[g] != MPI_COMM_NULL) MPI_Comm_free(&m->group[g]);
    free(m->pending);
    rt_free(m);
  }
  rt_free(c);
  if (!keep_mpi) comm_mpi_finalize();
}

static void m_destroy(Comm *c) { free_comm(c, 0); }

static const CommOps mpi_ops = {"mpi",  m_all_reduce, m_all_gather, m_reduce_scatter, m_broadcast,
                                m_send, m_recv,       m_barrier,    m_abort,          m_destroy,
                                m_isend, m_wait_sends, m_all_to_all, NULL,
                                m_exchange_start, m_exchange_wait};

static int split(Comm *c, CommGroup g, int color, int key, RtErr *e) {
  Mpi *m = c->impl;
  MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, color, key, &m->group[g]), e);
  int r, s;
  MPI_Comm_rank(m->group[g], &r);
  MPI_Comm_size(m->group[g], &s);
  if (r != c->rank[g] || s != c->size[g])
    return rt_fail(e, "the %s group came out as member %d of %d, expected %d of %d", comm_group_name(g), r, s, c->rank[g], c->size[g]);
  return 0;
}

Comm *comm_mpi_new(const CommLayout *l, RtErr *e) {
  Comm *c = rt_calloc(1, sizeof *c);
  Mpi *m = rt_calloc(1, sizeof *m);
  if (!c || !m) {
    rt_free(c);
    rt_free(m);
    rt_fail(e, "out of memory");
    return NULL;
  }
  for (int g = 0; g < COMM_NGROUPS; g++) m->group[g] = MPI_COMM_NULL;
  c->ops = &mpi_ops;
  c->impl = m;
  int inited = 0, provided = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    /* FUNNELED: only the main thread calls MPI (the data loader's thread
     * reads files, nothing else). */
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      rt_fail(e, "MPI_Init_thread failed");
      rt_free(m);
      rt_free(c);
      return NULL;
    }
    we_initialised = 1;
  }
  /* Errors come back as codes (we report them) instead of aborting inside
   * the library with a less helpful message. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int wr, ws;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  m->group[COMM_WORLD] = MPI_COMM_WORLD;
  if (comm_init_groups(c, l, wr, ws, e) < 0) {
    free_comm(c, 1);
    return NULL;
  }
  CommCoords k = c->coords;
  /* color: the coordinates outside the group, as one number; key: the
   * coordinate along it */
  int ep_i = c->rank[COMM_EP];
  int colors[COMM_NGROUPS] = {0, comm_rank_of(l, (CommCoords){0, k.tp, k.pp, k.cp}),
                              comm_rank_of(l, (CommCoords){k.dp, 0, k.pp, k.cp}), comm_rank_of(l, (CommCoords){k.dp, k.tp, 0, k.cp}),
                              comm_rank_of(l, (CommCoords){k.dp, k.tp, k.pp, 0}),
                              /* ep: the group's member 0; edp: its member 0 (the same place in the first block) */
                              comm_rank_of(l, comm_ep_member(l, k, 0)), comm_rank_of(l, comm_edp_member(l, k, 0))};
  int keys[COMM_NGROUPS] = {0, k.dp, k.tp, k.pp, k.cp, ep_i, c->rank[COMM_EDP]};
  for (int g = 1; g < COMM_NGROUPS; g++) {
    if (split(c, (CommGroup)g, colors[g], keys[g], e) < 0) {
      free_comm(c, 1);
      return NULL;
    }
    MPI_Comm_set_errhandler(m->group[g], MPI_ERRORS_RETURN);
  }
  /* the ranks that share this node's memory share its cores too */
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, wr, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &c->node_ranks);
    MPI_Comm_free(&node);
  }
  return c;
}
