/* comm.c - rank layout, the one-rank Comm, and compressed reduction. */
#include "comm.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "prof.h"
#include "semtypes.h"

static const char *const group_names[] = {"world", "dp", "tp", "pp", "cp", "ep", "edp"};

const char *comm_group_name(CommGroup g) { return (unsigned)g < COMM_NGROUPS ? group_names[g] : "?"; }

int comm_type_size(CommType t) {
  switch (t) {
  case COMM_F32: return 4;
  case COMM_F64: return 8;
  case COMM_I32: return 4;
  case COMM_U8: return 1;
  }
  return 0;
}

int comm_layout_size(const CommLayout *l) { return l->dp * l->tp * l->pp * l->cp; }

CommCoords comm_coords_of(const CommLayout *l, int rank) {
  CommCoords c;
  c.tp = rank % l->tp;
  rank /= l->tp;
  c.cp = rank % l->cp;
  rank /= l->cp;
  c.dp = rank % l->dp;
  c.pp = rank / l->dp;
  return c;
}

int comm_rank_of(const CommLayout *l, CommCoords c) { return c.tp + l->tp * (c.cp + l->cp * (c.dp + l->dp * c.pp)); }

int comm_layout_folded(const CommLayout *l) { return l->ep_fold && l->tp > 1; }

/* The data-parallel ranks in one expert group: ep, or ep / tp when folded. */
static int ep_dp_members(const CommLayout *l) {
  int ep = l->ep > 1 ? l->ep : 1;
  return comm_layout_folded(l) ? ep / l->tp : ep;
}

CommCoords comm_ep_member(const CommLayout *l, CommCoords k, int peer) {
  int m = ep_dp_members(l);
  if (comm_layout_folded(l)) {
    k.dp = k.dp - k.dp % m + peer / l->tp;
    k.tp = peer % l->tp;
  } else {
    k.dp = k.dp - k.dp % m + peer;
  }
  return k;
}

CommCoords comm_edp_member(const CommLayout *l, CommCoords k, int peer) {
  int m = ep_dp_members(l);
  k.dp = k.dp % m + m * peer;
  return k;
}

int comm_init_groups(Comm *c, const CommLayout *l, int world_rank, int world_size, RtErr *e) {
  if (l->dp < 1 || l->tp < 1 || l->pp < 1 || l->cp < 1)
    return rt_fail(e, "bad layout dp=%d tp=%d pp=%d cp=%d", l->dp, l->tp, l->pp, l->cp);
  if (l->ep > 1 && comm_layout_folded(l) && (l->ep % l->tp || l->dp % (l->ep / l->tp)))
    return rt_fail(e, "a folded expert group ep=%d needs a multiple of tp=%d whose quotient divides dp=%d", l->ep, l->tp, l->dp);
  if (l->ep > 1 && !comm_layout_folded(l) && l->dp % l->ep)
    return rt_fail(e, "expert parallelism ep=%d does not divide the data-parallel degree dp=%d", l->ep, l->dp);
  if (comm_layout_size(l) != world_size)
    return rt_fail(e, "the layout dp=%d x tp=%d x pp=%d x cp=%d needs %d ranks, but there are %d", l->dp, l->tp, l->pp, l->cp,
                   comm_layout_size(l), world_size);
  c->layout = *l;
  c->world_rank = world_rank;
  c->world_size = world_size;
  c->coords = comm_coords_of(l, world_rank);
  c->rank[COMM_WORLD] = world_rank;
  c->size[COMM_WORLD] = world_size;
  c->rank[COMM_DP] = c->coords.dp;
  c->size[COMM_DP] = l->dp;
  c->rank[COMM_TP] = c->coords.tp;
  c->size[COMM_TP] = l->tp;
  c->rank[COMM_PP] = c->coords.pp;
  c->size[COMM_PP] = l->pp;
  c->rank[COMM_CP] = c->coords.cp;
  c->size[COMM_CP] = l->cp;
  int ep = l->ep > 1 ? l->ep : 1, m = ep_dp_members(l);
  c->rank[COMM_EP] = comm_layout_folded(l) ? c->coords.tp + l->tp * (c->coords.dp % m) : c->coords.dp % m;
  c->size[COMM_EP] = ep;
  c->rank[COMM_EDP] = c->coords.dp / m;
  c->size[COMM_EDP] = l->dp / m;
  c->node_ranks = 1;
  return 0;
}

/* ---- one rank ---- */

static int local_all_reduce(Comm *c, CommGroup g, CommType t, CommOp op, void *buf, int64_t n, RtErr *e) { return 0; }

static int local_all_gather(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  if (out != in) memmove(out, in, (size_t)n * (size_t)comm_type_size(t));
  return 0;
}

static int local_reduce_scatter(Comm *c, CommGroup g, CommType t, CommOp op, const void *in, int64_t n, void *out, RtErr *e) {
  if (out != in) memmove(out, in, (size_t)n * (size_t)comm_type_size(t));
  return 0;
}

static int local_broadcast(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int root, RtErr *e) {
  return root == 0 ? 0 : rt_fail(e, "broadcast from member %d of a one-rank group", root);
}

static int local_send(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  return rt_fail(e, "send over %s: a one-rank group has no peer", comm_group_name(g));
}

static int local_recv(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int peer, int tag, RtErr *e) {
  return rt_fail(e, "recv over %s: a one-rank group has no peer", comm_group_name(g));
}

static int local_barrier(Comm *c, CommGroup g, RtErr *e) { return 0; }

static void local_abort(Comm *c, int code) { exit(code); }

static void local_destroy(Comm *c) { rt_free(c); }

static int local_wait_sends(Comm *c, RtErr *e) { return 0; }

static const CommOps local_ops = {"local",    local_all_reduce, local_all_gather, local_reduce_scatter, local_broadcast,
                                  local_send, local_recv,       local_barrier,    local_abort,          local_destroy,
                                  local_send, local_wait_sends, local_all_gather, NULL,
                                  NULL,       NULL};

Comm *comm_local_new(RtErr *e) {
  Comm *c = rt_calloc(1, sizeof *c);
  if (!c) {
    rt_fail(e, "out of memory");
    return NULL;
  }
  c->ops = &local_ops;
  CommLayout one = {1, 1, 1, 1, 1, 0};
  comm_init_groups(c, &one, 0, 1, e);
  return c;
}

void comm_destroy(Comm *c) {
  if (c) c->ops->destroy(c);
}

int comm_all_reduce(Comm *c, CommGroup g, CommType t, CommOp op, void *buf, int64_t n, RtErr *e) {
  return c->ops->all_reduce(c, g, t, op, buf, n, e);
}
int comm_all_gather(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  return c->ops->all_gather(c, g, t, in, n, out, e);
}
int comm_reduce_scatter(Comm *c, CommGroup g, CommType t, CommOp op, const void *in, int64_t n, void *out, RtErr *e) {
  return c->ops->reduce_scatter(c, g, t, op, in, n, out, e);
}
int comm_broadcast(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int root, RtErr *e) {
  return c->ops->broadcast(c, g, t, buf, n, root, e);
}
int comm_send(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  return c->ops->send(c, g, t, buf, n, peer, tag, e);
}
int comm_recv(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int peer, int tag, RtErr *e) {
  return c->ops->recv(c, g, t, buf, n, peer, tag, e);
}
int comm_isend(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  return c->ops->isend(c, g, t, buf, n, peer, tag, e);
}
int comm_wait_sends(Comm *c, RtErr *e) { return c->ops->wait_sends(c, e); }
int comm_barrier(Comm *c, CommGroup g, RtErr *e) { return c->ops->barrier(c, g, e); }
int comm_all_to_all(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  return c->ops->all_to_all(c, g, t, in, n, out, e);
}

int comm_group(Comm *c, int begin, RtErr *e) { return c->ops->group ? c->ops->group(c, begin, e) : 0; }

int comm_under_launcher(void) {
  /* srun sets SLURM_PROCID for each task, but an sbatch script's own shell
   * has it too (as task 0 of the batch step); only srun's tasks also carry a
   * step id. */
  if (getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_RANK") || getenv("PMIX_RANK")) return 1;
  return getenv("SLURM_PROCID") && getenv("SLURM_STEP_ID") && getenv("SLURM_STEP_NUM_TASKS") ? 1 : 0;
}

/* ---- compression ---- */

/* the names are the language's (core/semtypes.h), in the same order */
_Static_assert((int)COMM_COMPRESS_NONE == (int)COMPRESS_NONE && (int)COMM_COMPRESS_FP16 == (int)COMPRESS_FP16 &&
                   (int)COMM_COMPRESS_INT8 == (int)COMPRESS_INT8 && (int)COMM_COMPRESS_TOPK == (int)COMPRESS_TOPK &&
                   (int)COMM_COMPRESS_BF16 == (int)COMPRESS_BF16,
               "CommCompressKind follows Compression");

int comm_compress_parse(const char *s) { return sem_compression_parse(s); }

const char *comm_compress_name(CommCompressKind k) {
  return (unsigned)k <= (unsigned)COMM_COMPRESS_BF16 ? sem_compression_name((Compression)k) : "?";
}

int comm_compress_is16(CommCompressKind k) { return k == COMM_COMPRESS_FP16 || k == COMM_COMPRESS_BF16; }

void comm_compressor_init(CommCompressor *z, CommCompressKind kind, double topk_ratio, int error_feedback) {
  memset(z, 0, sizeof *z);
  z->kind = kind;
  z->topk_ratio = topk_ratio > 0 && topk_ratio <= 1 ? topk_ratio : 0.01;
  z->error_feedback = error_feedback;
}

void comm_compressor_free(CommCompressor *z) {
  rt_free(z->pad);
  rt_free(z->residual);
  rt_free(z->payload);
  rt_free(z->gathered);
  rt_free(z->work);
  memset(z, 0, sizeof *z);
}

static int64_t topk_count(const CommCompressor *z, int64_t n) {
  int64_t k = (int64_t)ceil(z->topk_ratio * (double)n);
  return k < 1 ? (n > 0) : k > n ? n : k;
}

int64_t comm_compressed_bytes(const CommCompressor *z, int64_t n) {
  switch (z->kind) {
  case COMM_COMPRESS_NONE: return 4 * n;
  case COMM_COMPRESS_FP16:
  case COMM_COMPRESS_BF16: return 2 * n;
  case COMM_COMPRESS_INT8: return n + 4 * ((n + COMM_INT8_CHUNK - 1) / COMM_INT8_CHUNK);
  case COMM_COMPRESS_TOPK: return 8 * topk_count(z, n);
  }
  return 0;
}

static int grow(void **p, int64_t *cap, int64_t want) {
  if (*cap >= want) return 0;
  void *np = rt_realloc(*p, (size_t)want);
  if (!np) return -1;
  *p = np;
  *cap = want;
  return 0;
}

/* Quickselect on magnitudes: moves the k largest |v| of idx[0..n) to the
 * front (Hoare's FIND). Ties are broken by index, so the choice is
 * deterministic. */
static int bigger(const float *v, int32_t a, int32_t b) {
  float x = fabsf(v[a]), y = fabsf(v[b]);
  return x > y || (x == y && a < b);
}

static void select_top(const float *v, int32_t *idx, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    int32_t pivot = idx[lo + (hi - lo) / 2];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (bigger(v, idx[i], pivot)) i++;
      while (bigger(v, pivot, idx[j])) j--;
      if (i <= j) {
        int32_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
        i++;
        j--;
      }
    }
    if (k - 1 <= j) hi = j;
    else if (k - 1 >= i) lo = i;
    else break;
  }
}

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Prepares z for n values: the residual (error feedback; n must match the
 * last call's) and v = x + residual in z->work. */
static int compress_begin(CommCompressor *z, const float *x, int64_t n, RtErr *e) {
  if (z->error_feedback && z->kind != COMM_COMPRESS_NONE) {
    if (z->residual && z->n != n) return rt_fail(e, "compression: %" PRId64 " values, but the residual holds %" PRId64, n, z->n);
    if (!z->residual) {
      z->residual = rt_calloc((size_t)(n > 0 ? n : 1), sizeof(float));
      if (!z->residual) return rt_fail(e, "out of memory for the compression residual");
      z->n = n;
    }
  }
  if (grow((void **)&z->work, &z->work_cap, (int64_t)sizeof(float) * (n > 0 ? n : 1)) < 0) return rt_fail(e, "out of memory");
  for (int64_t i = 0; i < n; i++) z->work[i] = x[i] + (z->residual ? z->residual[i] : 0.0f);
  return 0;
}

/* Compresses the n values v into payload; r (NULL without error feedback)
 * becomes what was dropped of each. */
static int compress_values(const CommCompressor *z, const float *v, int64_t n, unsigned char *payload, float *r, RtErr *e) {
  switch (z->kind) {
  case COMM_COMPRESS_NONE: memcpy(payload, v, (size_t)n * 4); break;
  case COMM_COMPRESS_FP16:
  case COMM_COMPRESS_BF16:
    for (int64_t i = 0; i < n; i++) {
      uint16_t h = z->kind == COMM_COMPRESS_BF16 ? half_bf16_from_f32(v[i]) : half_from_f32(v[i]);
      memcpy(payload + 2 * i, &h, 2);
      if (r) r[i] = v[i] - (z->kind == COMM_COMPRESS_BF16 ? half_bf16_to_f32(h) : half_to_f32(h));
    }
    break;
  case COMM_COMPRESS_INT8: {
    int64_t chunks = (n + COMM_INT8_CHUNK - 1) / COMM_INT8_CHUNK;
    int8_t *q = (int8_t *)(payload + 4 * chunks);
    for (int64_t c = 0; c < chunks; c++) {
      int64_t lo = c * COMM_INT8_CHUNK, hi = lo + COMM_INT8_CHUNK < n ? lo + COMM_INT8_CHUNK : n;
      float amax = 0;
      for (int64_t i = lo; i < hi; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
      float s = amax / 127.0f;
      memcpy(payload + 4 * c, &s, 4); /* the caller's buffer need not be aligned */
      for (int64_t i = lo; i < hi; i++) {
        float qi = s > 0 ? nearbyintf(v[i] / s) : 0.0f;
        if (qi > 127) qi = 127;
        if (qi < -127) qi = -127;
        q[i] = (int8_t)qi;
        if (r) r[i] = v[i] - qi * s;
      }
    }
    break;
  }
  case COMM_COMPRESS_TOPK: {
    int64_t k = topk_count(z, n);
    int32_t *idx = rt_alloc((size_t)(n > 0 ? n : 1) * sizeof *idx);
    if (!idx) return rt_fail(e, "out of memory");
    for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
    if (k < n) select_top(v, idx, n, k);
    qsort(idx, (size_t)k, sizeof *idx, cmp_i32); /* ascending indices: a canonical payload */
    if (r) memcpy(r, v, (size_t)n * 4);
    for (int64_t j = 0; j < k; j++) {
      memcpy(payload + 8 * j, &idx[j], 4);
      memcpy(payload + 8 * j + 4, &v[idx[j]], 4);
      if (r) r[idx[j]] = 0; /* sent exactly */
    }
    rt_free(idx);
    break;
  }
  }
  return 0;
}

int comm_compress(CommCompressor *z, const float *x, int64_t n, unsigned char *payload, RtErr *e) {
  if (n > INT32_MAX) return rt_fail(e, "compression of %" PRId64 " values: at most 2^31 - 1 per call", n);
  if (compress_begin(z, x, n, e) < 0) return -1;
  return compress_values(z, z->work, n, payload, z->residual, e);
}

void comm_decompress_add(const CommCompressor *z, const unsigned char *payload, int64_t n, float *acc) {
  switch (z->kind) {
  case COMM_COMPRESS_NONE:
    for (int64_t i = 0; i < n; i++) {
      float f;
      memcpy(&f, payload + 4 * i, 4);
      acc[i] += f;
    }
    break;
  case COMM_COMPRESS_FP16:
  case COMM_COMPRESS_BF16:
    for (int64_t i = 0; i < n; i++) {
      uint16_t h;
      memcpy(&h, payload + 2 * i, 2);
      acc[i] += z->kind == COMM_COMPRESS_BF16 ? half_bf16_to_f32(h) : half_to_f32(h);
    }
    break;
  case COMM_COMPRESS_INT8: {
    int64_t chunks = (n + COMM_INT8_CHUNK - 1) / COMM_INT8_CHUNK;
    const int8_t *q = (const int8_t *)(payload + 4 * chunks);
    for (int64_t c = 0; c < chunks; c++) {
      float s;
      memcpy(&s, payload + 4 * c, 4);
      int64_t lo = c * COMM_INT8_CHUNK, hi = lo + COMM_INT8_CHUNK < n ? lo + COMM_INT8_CHUNK : n;
      for (int64_t i = lo; i < hi; i++) acc[i] += (float)q[i] * s;
    }
    break;
  }
  case COMM_COMPRESS_TOPK: {
    int64_t k = topk_count(z, n);
    for (int64_t j = 0; j < k; j++) {
      int32_t i;
      float f;
      memcpy(&i, payload + 8 * j, 4);
      memcpy(&f, payload + 8 * j + 4, 4);
      if (i >= 0 && i < n) acc[i] += f;
    }
    break;
  }
  }
}

int comm_allreduce_compressed(Comm *c, CommGroup g, CommCompressor *z, float *buf, int64_t n, RtErr *e) {
  if (z->kind == COMM_COMPRESS_NONE) return comm_all_reduce(c, g, COMM_F32, COMM_SUM, buf, n, e);
  int size = c->size[g];
  if (comm_compress_is16(z->kind) && size >= COMM_COMPRESS_RS_FROM) {
    /* elementwise: the compressed reduce-scatter's sums, all-gathered in fp32, are the values
     * below; (size - 1) / size of 2 + 4 bytes a value move rather than (size - 1) x 2 */
    int64_t slice = (n + size - 1) / size, all = slice * size;
    if (grow((void **)&z->pad, &z->pad_cap, (int64_t)sizeof(float) * (all + slice > 0 ? all + slice : 1)) < 0)
      return rt_fail(e, "out of memory for compression buffers");
    float *whole = z->pad, *mine = z->pad + all;
    memcpy(whole, buf, (size_t)n * sizeof *buf);
    memset(whole + n, 0, (size_t)(all - n) * sizeof *buf);
    if (comm_reduce_scatter_compressed(c, g, z, whole, slice, mine, e) < 0 ||
        comm_all_gather(c, g, COMM_F32, mine, slice, whole, e) < 0)
      return -1;
    memcpy(buf, whole, (size_t)n * sizeof *buf);
    return 0;
  }
  int64_t pb = comm_compressed_bytes(z, n);
  if (grow((void **)&z->payload, &z->payload_cap, pb > 0 ? pb : 1) < 0 ||
      grow((void **)&z->gathered, &z->gathered_cap, pb * size > 0 ? pb * size : 1) < 0)
    return rt_fail(e, "out of memory for compression buffers");
  if (comm_compress(z, buf, n, z->payload, e) < 0) return -1;
  if (comm_all_gather(c, g, COMM_U8, z->payload, pb, z->gathered, e) < 0) return -1;
  memset(buf, 0, (size_t)n * sizeof *buf);
  for (int m = 0; m < size; m++) comm_decompress_add(z, z->gathered + (int64_t)m * pb, n, buf);
  return 0;
}

int comm_reduce_scatter_compressed(Comm *c, CommGroup g, CommCompressor *z, const float *in, int64_t n, float *out, RtErr *e) {
  if (z->kind == COMM_COMPRESS_NONE) return comm_reduce_scatter(c, g, COMM_F32, COMM_SUM, in, n, out, e);
  int size = c->size[g];
  int64_t all = n * size, pb = comm_compressed_bytes(z, n);
  if (n > INT32_MAX) return rt_fail(e, "compression of %" PRId64 " values: at most 2^31 - 1 per member", n);
  if (grow((void **)&z->payload, &z->payload_cap, pb * size > 0 ? pb * size : 1) < 0 ||
      grow((void **)&z->gathered, &z->gathered_cap, pb * size > 0 ? pb * size : 1) < 0)
    return rt_fail(e, "out of memory for compression buffers");
  if (compress_begin(z, in, all, e) < 0) return -1;
  /* member m's slice compressed on its own (int8's chunks and top-k's k
   * per slice), so each payload stands alone */
  for (int m = 0; m < size; m++)
    if (compress_values(z, z->work + (int64_t)m * n, n, z->payload + (int64_t)m * pb, z->residual ? z->residual + (int64_t)m * n : NULL,
                        e) < 0)
      return -1;
  if (comm_all_to_all(c, g, COMM_U8, z->payload, pb, z->gathered, e) < 0) return -1;
  memset(out, 0, (size_t)n * sizeof *out);
  for (int m = 0; m < size; m++) comm_decompress_add(z, z->gathered + (int64_t)m * pb, n, out);
  return 0;
}

/* ---- hpdlrun --profile: the table wrapped ---- */

static const CommOps *prof_inner; /* the table the wrapper calls */
static Prof *prof_rec;

/* The world rank of member `peer` of group g. */
static int peer_world(const Comm *c, CommGroup g, int peer) {
  CommCoords k = c->coords;
  switch (g) {
  case COMM_WORLD: return peer;
  case COMM_DP: k.dp = peer; break;
  case COMM_TP: k.tp = peer; break;
  case COMM_PP: k.pp = peer; break;
  case COMM_CP: k.cp = peer; break;
  case COMM_EP: k = comm_ep_member(&c->layout, k, peer); break;
  case COMM_EDP: k = comm_edp_member(&c->layout, k, peer); break;
  default: return -1;
  }
  return comm_rank_of(&c->layout, k);
}

static void prof_comm(const Comm *c, const char *name, int p2p, CommGroup g, int64_t bytes, int peer, double t0) {
  double t1 = prof_time(prof_rec);
  ProfArgs a = PROF_ARGS_NONE;
  a.cat = p2p ? "p2p" : "collective";
  a.group = g == COMM_NGROUPS ? NULL : comm_group_name(g);
  a.bytes = bytes;
  a.peer = peer >= 0 ? peer_world(c, g, peer) : -1;
  prof_span(prof_rec, PROF_COMM, name, t0, t1, &a);
}

#define PROF_T0() double t0 = prof_time(prof_rec)

static int p_all_reduce(Comm *c, CommGroup g, CommType t, CommOp op, void *buf, int64_t n, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->all_reduce(c, g, t, op, buf, n, e);
  prof_comm(c, "all_reduce", 0, g, n * comm_type_size(t), -1, t0);
  return rc;
}

static int p_all_gather(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->all_gather(c, g, t, in, n, out, e);
  prof_comm(c, "all_gather", 0, g, n * comm_type_size(t) * c->size[g], -1, t0);
  return rc;
}

static int p_reduce_scatter(Comm *c, CommGroup g, CommType t, CommOp op, const void *in, int64_t n, void *out, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->reduce_scatter(c, g, t, op, in, n, out, e);
  prof_comm(c, "reduce_scatter", 0, g, n * comm_type_size(t) * c->size[g], -1, t0);
  return rc;
}

static int p_broadcast(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int root, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->broadcast(c, g, t, buf, n, root, e);
  prof_comm(c, "broadcast", 0, g, n * comm_type_size(t), -1, t0);
  return rc;
}

static int p_send(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->send(c, g, t, buf, n, peer, tag, e);
  prof_comm(c, "send", 1, g, n * comm_type_size(t), peer, t0);
  return rc;
}

static int p_recv(Comm *c, CommGroup g, CommType t, void *buf, int64_t n, int peer, int tag, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->recv(c, g, t, buf, n, peer, tag, e);
  prof_comm(c, "recv", 1, g, n * comm_type_size(t), peer, t0);
  return rc;
}

static int p_isend(Comm *c, CommGroup g, CommType t, const void *buf, int64_t n, int peer, int tag, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->isend(c, g, t, buf, n, peer, tag, e);
  prof_comm(c, "isend", 1, g, n * comm_type_size(t), peer, t0);
  return rc;
}

static int p_barrier(Comm *c, CommGroup g, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->barrier(c, g, e);
  prof_comm(c, "barrier", 0, g, 0, -1, t0);
  return rc;
}

static int p_all_to_all(Comm *c, CommGroup g, CommType t, const void *in, int64_t n, void *out, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->all_to_all(c, g, t, in, n, out, e);
  prof_comm(c, "all_to_all", 0, g, n * comm_type_size(t) * c->size[g], -1, t0);
  return rc;
}

static int p_wait_sends(Comm *c, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->wait_sends(c, e);
  prof_comm(c, "wait_sends", 1, COMM_NGROUPS, 0, -1, t0);
  return rc;
}

static int p_exchange_start(Comm *c, CommGroup g, CommType t, const void *send, int to, void *recv, int from, int64_t n, int tag,
                            void **handle, RtErr *e) {
  if (!prof_inner->exchange_start) return 1;
  PROF_T0();
  int rc = prof_inner->exchange_start(c, g, t, send, to, recv, from, n, tag, handle, e);
  prof_comm(c, "exchange_start", 1, g, n * comm_type_size(t), to, t0);
  return rc;
}

static int p_exchange_wait(Comm *c, void *handle, RtErr *e) {
  PROF_T0();
  int rc = prof_inner->exchange_wait(c, handle, e);
  prof_comm(c, "exchange_wait", 1, COMM_CP, 0, -1, t0);
  return rc;
}

static void p_abort(Comm *c, int code) { prof_inner->abort(c, code); }

static int p_group(Comm *c, int begin, RtErr *e) { return prof_inner->group ? prof_inner->group(c, begin, e) : 0; }

static void p_destroy(Comm *c) {
  const CommOps *in = prof_inner;
  c->ops = in;
  in->destroy(c);
}

static const CommOps prof_ops = {"profiled", p_all_reduce, p_all_gather, p_reduce_scatter, p_broadcast, p_send, p_recv,
                                 p_barrier,  p_abort,      p_destroy,    p_isend,          p_wait_sends, p_all_to_all, p_group,
                                 p_exchange_start, p_exchange_wait};

void comm_profile(Comm *c, Prof *p) {
  if (p && c->ops != &prof_ops) {
    prof_inner = c->ops;
    prof_rec = p;
    c->ops = &prof_ops;
  } else if (!p && c->ops == &prof_ops) {
    c->ops = prof_inner;
    prof_rec = NULL;
  }
}
