/* program_ir.c - the chunk file: encoding and decoding (see program_ir.h). */
#include "program_ir.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"

enum { HEADER_BYTES = 8 + 4 + 4 + 8 + 4 };

/* Limits the reader enforces beyond "fits in the bytes left": they keep a
 * damaged count from asking for absurd allocations. */
enum { MAX_ITEMS = 1 << 26, MAX_STR = 1 << 20 };

/* ---- encoding ---- */

typedef struct {
  unsigned char *p;
  size_t len, cap;
  int oom;
} Buf;

static void put(Buf *b, const void *src, size_t n) {
  if (b->oom) return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + n) cap *= 2;
    unsigned char *q = realloc(b->p, cap);
    if (!q) {
      b->oom = 1;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, src, n);
  b->len += n;
}

/* Little-endian by construction: the runtime (rt.h) refuses big-endian hosts. */
static void put_u8(Buf *b, unsigned v) {
  unsigned char c = (unsigned char)v;
  put(b, &c, 1);
}
static void put_u32(Buf *b, uint32_t v) { put(b, &v, 4); }
static void put_i32(Buf *b, int32_t v) { put(b, &v, 4); }
static void put_i64(Buf *b, int64_t v) { put(b, &v, 8); }
static void put_f64(Buf *b, double v) { put(b, &v, 8); }
static void put_str(Buf *b, const char *s) {
  size_t n = s ? strlen(s) : 0;
  put_u32(b, (uint32_t)n);
  if (n) put(b, s, n);
}

static void put_dims(Buf *b, int rank, const int64_t *dims) {
  for (int i = 0; i < rank; i++) put_i64(b, dims[i]);
}

static void put_graph(Buf *b, const IrGraph *g) {
  put_str(b, g->name);
  put_i32(b, g->nargs);
  put_i64(b, g->count);
  put_i32(b, g->fb_split);
  put_u32(b, (uint32_t)g->nnodes);
  for (int i = 0; i < g->nnodes; i++) {
    const IrNode *n = &g->nodes[i];
    put_u8(b, (unsigned)n->op);
    put_u8(b, (unsigned)n->dtype);
    put_u8(b, (unsigned)n->rank);
    put_dims(b, n->rank, n->dims);
    put_u32(b, (uint32_t)n->nin);
    for (int k = 0; k < n->nin; k++) put_i32(b, n->in[k]);
    /* attributes: only up to the last non-zero one */
    int na = IR_NATTR;
    while (na > 0 && n->attr[na - 1] == 0) na--;
    put_u8(b, (unsigned)na);
    for (int k = 0; k < na; k++) put_i64(b, n->attr[k]);
    put_f64(b, n->fattr);
    put_str(b, n->name);
    put_i32(b, n->span.file); /* where it comes from: file (the module's sources), line, column */
    put_i32(b, n->span.line);
    put_i32(b, n->span.col);
  }
  put_u32(b, (uint32_t)g->noutputs);
  for (int k = 0; k < g->noutputs; k++) put_i32(b, g->outputs[k]);
  put_u32(b, (uint32_t)g->ngrad_params);
  for (int k = 0; k < g->ngrad_params; k++) put_i32(b, g->grad_params[k]);
}

static void put_shape(Buf *b, const IrExternShape *s) {
  put_u8(b, (unsigned)s->rank);
  put_dims(b, s->rank, s->dims);
}

static void put_extern(Buf *b, const IrExtern *e) {
  put_str(b, e->name);
  put_str(b, e->where);
  put_str(b, e->library);
  put_str(b, e->path);
  put_str(b, e->symbol);
  put_str(b, e->grad);
  put_u32(b, (uint32_t)e->nargs);
  for (int k = 0; k < e->nargs; k++) put_shape(b, &e->args[k]);
  put_shape(b, &e->out);
  put_u32(b, (uint32_t)e->ndims);
  for (int k = 0; k < e->ndims; k++) put_i64(b, e->dims[k]);
}

unsigned char *program_ir_encode(const ProgramChunk *c, size_t *len) {
  const IrModule *m = c->m;
  Buf b = {0};
  /* the header, patched once the payload is known */
  unsigned char zero[HEADER_BYTES] = {0};
  put(&b, zero, sizeof zero);
  put_i32(&b, c->chunk);
  put_i32(&b, c->nchunks);
  put_i32(&b, c->step);
  put_i32(&b, c->nforward);
  put_i32(&b, (int32_t)c->recompute);
  put_i64(&b, m->micro_batch);
  put_u32(&b, (uint32_t)m->ninputs);
  for (int i = 0; i < m->ninputs; i++) {
    const IrInput *x = &m->inputs[i];
    put_str(&b, x->name);
    put_u8(&b, (unsigned)x->dtype);
    put_u8(&b, (unsigned)x->rank);
    put_dims(&b, x->rank, x->dims);
    put_u8(&b, c->feed ? (unsigned)c->feed[i] : 0);
  }
  put_u32(&b, (uint32_t)m->nparams);
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *p = &m->params[i];
    put_str(&b, p->name);
    put_u8(&b, (unsigned)p->dtype);
    put_u8(&b, (unsigned)p->rank);
    put_dims(&b, p->rank, p->dims);
    put_u8(&b, (unsigned)p->init.kind);
    put_f64(&b, p->init.a);
    put_f64(&b, p->init.b);
    put_u8(&b, (unsigned)p->shard);
    put_i32(&b, p->graph);
    put_i64(&b, p->count);
    put_dims(&b, p->rank, p->full_dims);
    put_i32(&b, p->split_axis);
    put_u8(&b, (unsigned)p->split_group);
    put_i32(&b, p->split2_axis);
    put_u8(&b, (unsigned)p->split2_group);
    put_u8(&b, (unsigned)(p->state != 0));
    put_i64(&b, p->logical_rows);
  }
  put_u32(&b, (uint32_t)m->nexterns);
  for (int i = 0; i < m->nexterns; i++) put_extern(&b, &m->externs[i]);
  put_u32(&b, (uint32_t)m->nsources);
  for (int i = 0; i < m->nsources; i++) put_str(&b, m->sources[i]);
  put_u32(&b, (uint32_t)m->ngraphs);
  for (int gi = 0; gi < m->ngraphs; gi++) put_graph(&b, m->graphs[gi]);
  put_u32(&b, (uint32_t)c->nuses);
  for (int i = 0; i < c->nuses; i++) {
    const ProgramUse *u = &c->uses[i];
    put_i32(&b, u->param);
    put_i64(&b, u->layer);
    put_i32(&b, u->owner);
    put_u32(&b, (uint32_t)u->nmirrors);
    for (int k = 0; k < u->nmirrors; k++) put_i32(&b, u->mirrors[k]);
  }
  put_i32(&b, (int32_t)c->schedule);
  put_i32(&b, c->sched_m);
  put_i32(&b, c->sched_v);
  put_u32(&b, (uint32_t)c->nins);
  for (int i = 0; i < c->nins; i++) {
    put_u8(&b, (unsigned)c->ins[i].op);
    put_i32(&b, c->ins[i].chunk);
    put_i32(&b, c->ins[i].mb);
    put_i32(&b, c->ins[i].peer);
  }
  if (b.oom) {
    free(b.p);
    return NULL;
  }
  uint64_t payload = b.len - HEADER_BYTES;
  uint32_t crc = crc32c_update(0, b.p + HEADER_BYTES, payload), version = PROGRAM_IR_VERSION, flags = 0;
  memcpy(b.p, PROGRAM_IR_MAGIC, 8);
  memcpy(b.p + 8, &version, 4);
  memcpy(b.p + 12, &flags, 4);
  memcpy(b.p + 16, &payload, 8);
  memcpy(b.p + 24, &crc, 4);
  *len = b.len;
  return b.p;
}

static int errf(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int errf(char *err, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (err && n) vsnprintf(err, n, fmt, ap);
  va_end(ap);
  return -1;
}

int program_ir_write(const ProgramChunk *c, const char *path, char *err, size_t errlen) {
  size_t len;
  unsigned char *bytes = program_ir_encode(c, &len);
  if (!bytes) return errf(err, errlen, "%s: out of memory encoding the chunk", path);
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp) {
    free(bytes);
    return errf(err, errlen, "%s: path too long", path);
  }
  FILE *f = fopen(tmp, "wb");
  int rc = 0;
  if (!f) rc = errf(err, errlen, "%s: %s", tmp, strerror(errno));
  else {
    if (fwrite(bytes, 1, len, f) != len) rc = errf(err, errlen, "%s: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && rc == 0) rc = errf(err, errlen, "%s: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0) rc = errf(err, errlen, "%s: %s", path, strerror(errno));
    if (rc) remove(tmp);
  }
  free(bytes);
  return rc;
}

/* ---- decoding ---- */

typedef struct {
  const unsigned char *p;
  size_t len, at;
  char *err;
  size_t errlen;
  int bad;
  Arena *arena;
} Rd;

/* The first problem wins: later reads of a failed reader return zeros. */
static int rd_fail(Rd *r, const char *what) {
  if (!r->bad) errf(r->err, r->errlen, "%s at byte %zu", what, r->at);
  r->bad = 1;
  return -1;
}

static int take(Rd *r, void *dst, size_t n) {
  if (r->bad) {
    memset(dst, 0, n);
    return -1;
  }
  if (n > r->len - r->at) {
    memset(dst, 0, n);
    return rd_fail(r, "truncated: the file ends inside a record");
  }
  memcpy(dst, r->p + r->at, n);
  r->at += n;
  return 0;
}

static unsigned get_u8(Rd *r) {
  unsigned char c;
  take(r, &c, 1);
  return c;
}
static uint32_t get_u32(Rd *r) {
  uint32_t v;
  take(r, &v, 4);
  return v;
}
static int32_t get_i32(Rd *r) {
  int32_t v;
  take(r, &v, 4);
  return v;
}
static int64_t get_i64(Rd *r) {
  int64_t v;
  take(r, &v, 8);
  return v;
}
static double get_f64(Rd *r) {
  double v;
  take(r, &v, 8);
  return v;
}

/* A count of items of at least `each` bytes: checked against what is left. */
static int get_count(Rd *r, size_t each, const char *what) {
  uint32_t n = get_u32(r);
  if (r->bad) return 0;
  if (n > MAX_ITEMS || (each && (size_t)n > (r->len - r->at) / each)) {
    char msg[128];
    snprintf(msg, sizeof msg, "implausible %s count %" PRIu32, what, n);
    rd_fail(r, msg);
    return 0;
  }
  return (int)n;
}

static const char *get_str(Rd *r) {
  uint32_t n = get_u32(r);
  if (r->bad) return NULL;
  if (n > MAX_STR || n > r->len - r->at) {
    rd_fail(r, "a string runs past the end of the file");
    return NULL;
  }
  if (n == 0) return NULL;
  char *s = arena_strndup(r->arena, (const char *)r->p + r->at, n);
  if (strlen(s) != n) {
    rd_fail(r, "a string holds a NUL byte");
    return NULL;
  }
  r->at += n;
  return s;
}

static int get_rank(Rd *r) {
  unsigned k = get_u8(r);
  if (k > IR_MAX_RANK) {
    rd_fail(r, "a rank above 8");
    return 0;
  }
  return (int)k;
}

static DType get_dtype(Rd *r) {
  unsigned t = get_u8(r);
  if (t >= DT_COUNT) {
    rd_fail(r, "an unknown element type");
    return DT_F32;
  }
  return (DType)t;
}

/* Dimensions, and their product below 2^48 values, so that no element
 * count computed from them later can overflow. */
static void get_dims(Rd *r, int rank, int64_t *dims, int allow_zero) {
  int64_t numel = 1;
  for (int i = 0; i < rank; i++) {
    dims[i] = get_i64(r);
    if (r->bad) continue;
    if (dims[i] < (allow_zero ? 0 : 1) || dims[i] > ((int64_t)1 << 40)) rd_fail(r, "an implausible dimension");
    else if (dims[i] && numel > ((int64_t)1 << 48) / dims[i]) rd_fail(r, "an implausible tensor size");
    else numel *= dims[i] ? dims[i] : 1;
  }
}

static void get_shape(Rd *r, IrExternShape *s) {
  s->rank = get_rank(r);
  get_dims(r, s->rank, s->dims, 0);
}

static void get_extern(Rd *r, IrModule *m) {
  IrExtern e;
  memset(&e, 0, sizeof e);
  e.name = get_str(r);
  e.where = get_str(r);
  e.library = get_str(r);
  e.path = get_str(r);
  e.symbol = get_str(r);
  e.grad = get_str(r);
  if (!r->bad && (!e.name || !e.library || !e.path || !e.symbol)) rd_fail(r, "an extern without a name, library or symbol");
  if (!e.where) e.where = "?";
  e.span = span_none;
  e.nargs = get_count(r, 1, "extern argument");
  e.args = arena_alloc(m->arena, sizeof(IrExternShape) * (size_t)(e.nargs + 1));
  for (int k = 0; k < e.nargs && !r->bad; k++) get_shape(r, &e.args[k]);
  get_shape(r, &e.out);
  e.ndims = get_count(r, 8, "extern dimension");
  e.dims = arena_alloc(m->arena, sizeof(int64_t) * (size_t)(e.ndims + 1));
  for (int k = 0; k < e.ndims; k++) e.dims[k] = get_i64(r);
  if (r->bad) return;
  /* appended as is: equal entries stay apart, so EXTERN's indices hold */
  IrExtern *t = arena_alloc(m->arena, sizeof(IrExtern) * (size_t)(m->nexterns + 1));
  if (m->nexterns) memcpy(t, m->externs, sizeof(IrExtern) * (size_t)m->nexterns);
  t[m->nexterns++] = e;
  m->externs = t;
}

static void get_graph(Rd *r, IrModule *m) {
  const char *name = get_str(r);
  IrGraph *g = ir_graph_new(m, name ? name : "?");
  g->nargs = get_i32(r);
  g->count = get_i64(r);
  g->fb_split = get_i32(r);
  if (!r->bad && (g->nargs < 0 || g->nargs > MAX_ITEMS || g->count < 1)) rd_fail(r, "a graph's argument or repeat count is out of range");
  if (!r->bad && g->fb_split < 0) rd_fail(r, "a graph's forward/backward cut is out of range");
  /* a node is at least 27 bytes: op, dtype, rank, nin, nattr, fattr, name */
  int nn = get_count(r, 27, "node");
  g->nodes = arena_alloc(m->arena, sizeof(IrNode) * (size_t)(nn ? nn : 1));
  g->cap = nn;
  for (int i = 0; i < nn && !r->bad; i++) {
    IrNode *n = &g->nodes[i];
    unsigned op = get_u8(r);
    if (op >= IR_OP_COUNT) {
      rd_fail(r, "an unknown op");
      break;
    }
    n->op = (IrOp)op;
    n->dtype = get_dtype(r);
    n->rank = get_rank(r);
    get_dims(r, n->rank, n->dims, 1);
    n->nin = get_count(r, 4, "node input");
    n->in = arena_alloc(m->arena, sizeof(int) * (size_t)(n->nin ? n->nin : 1));
    for (int k = 0; k < n->nin; k++) {
      n->in[k] = get_i32(r);
      if (!r->bad && (n->in[k] < 0 || n->in[k] >= i)) rd_fail(r, "a node input that does not precede its user");
    }
    unsigned na = get_u8(r);
    if (na > IR_NATTR) rd_fail(r, "more than 24 attributes");
    for (unsigned k = 0; k < na && !r->bad; k++) n->attr[k] = get_i64(r);
    n->fattr = get_f64(r);
    n->name = get_str(r);
    n->span = span_none;
    n->span.file = get_i32(r);
    n->span.line = n->span.end_line = get_i32(r);
    n->span.col = n->span.end_col = get_i32(r);
    if (!r->bad && (n->span.file < -1 || n->span.file >= m->nsources)) rd_fail(r, "a node's source file is out of range");
    g->nnodes = i + 1;
  }
  g->noutputs = get_count(r, 4, "graph output");
  g->outputs = arena_alloc(m->arena, sizeof(int) * (size_t)(g->noutputs ? g->noutputs : 1));
  for (int k = 0; k < g->noutputs; k++) {
    g->outputs[k] = get_i32(r);
    if (!r->bad && (g->outputs[k] < 0 || g->outputs[k] >= g->nnodes)) rd_fail(r, "a graph output names no node");
  }
  g->ngrad_params = get_count(r, 4, "gradient output");
  if (g->ngrad_params) g->grad_params = arena_alloc(m->arena, sizeof(int) * (size_t)g->ngrad_params);
  if (!r->bad && g->ngrad_params > g->noutputs) rd_fail(r, "more gradient outputs than outputs");
  for (int k = 0; k < g->ngrad_params; k++) g->grad_params[k] = get_i32(r);
}

ProgramChunk *program_ir_decode(Arena *arena, const unsigned char *buf, size_t len, char *err, size_t errlen) {
  Rd r = {buf, len, 0, err, errlen, 0, arena};
  if (len < HEADER_BYTES || memcmp(buf, PROGRAM_IR_MAGIC, 8) != 0) {
    errf(err, errlen, "not an hpdl chunk file (no \"HPDL-IR\" header)");
    return NULL;
  }
  uint32_t version, crc;
  uint64_t payload;
  memcpy(&version, buf + 8, 4);
  memcpy(&payload, buf + 16, 8);
  memcpy(&crc, buf + 24, 4);
  if (version != PROGRAM_IR_VERSION) {
    errf(err, errlen, "chunk file version %" PRIu32 "; this program reads version %d (recompile with the matching hpdlc)", version,
         PROGRAM_IR_VERSION);
    return NULL;
  }
  if (payload != len - HEADER_BYTES) {
    errf(err, errlen, "truncated: the header announces %" PRIu64 " bytes of payload, the file has %zu", payload,
         len - HEADER_BYTES);
    return NULL;
  }
  uint32_t got = crc32c_update(0, buf + HEADER_BYTES, payload);
  if (got != crc) {
    errf(err, errlen, "corrupted: the payload's CRC-32C is %08" PRIx32 ", the header recorded %08" PRIx32, got, crc);
    return NULL;
  }
  r.at = HEADER_BYTES;
  ProgramChunk *c = arena_alloc(arena, sizeof *c);
  IrModule *m = ir_module_new(arena);
  c->m = m;
  c->chunk = get_i32(&r);
  c->nchunks = get_i32(&r);
  c->step = get_i32(&r);
  c->nforward = get_i32(&r);
  int32_t rc = get_i32(&r);
  if (!r.bad && (c->nchunks < 1 || c->chunk < 0 || c->chunk >= c->nchunks || rc < 0 || rc > RECOMPUTE_LAST))
    rd_fail(&r, "the chunk record is out of range");
  c->recompute = (Recompute)rc;
  m->micro_batch = get_i64(&r);
  m->ninputs = get_count(&r, 7, "input");
  m->inputs = arena_alloc(arena, sizeof(IrInput) * (size_t)(m->ninputs ? m->ninputs : 1));
  c->feed = arena_alloc(arena, sizeof(ProgramFeed) * (size_t)(m->ninputs ? m->ninputs : 1));
  for (int i = 0; i < m->ninputs && !r.bad; i++) {
    IrInput *x = &m->inputs[i];
    x->name = get_str(&r);
    x->dtype = get_dtype(&r);
    x->rank = get_rank(&r);
    get_dims(&r, x->rank, x->dims, 0);
    unsigned f = get_u8(&r);
    if (f > PROGRAM_FEED_LABELS) rd_fail(&r, "an unknown input feed (a file of a later hpdlc?)");
    c->feed[i] = (ProgramFeed)f;
  }
  int np = get_count(&r, 40, "parameter");
  for (int i = 0; i < np && !r.bad; i++) {
    IrParam p;
    memset(&p, 0, sizeof p);
    p.name = get_str(&r);
    if (!r.bad && !p.name) rd_fail(&r, "a parameter without a name");
    p.dtype = get_dtype(&r);
    p.rank = get_rank(&r);
    get_dims(&r, p.rank, p.dims, 0);
    unsigned ik = get_u8(&r);
    if (ik > INIT_UNIFORM) rd_fail(&r, "an unknown initialiser");
    p.init.kind = (InitKind)ik;
    p.init.a = get_f64(&r);
    p.init.b = get_f64(&r);
    unsigned sk = get_u8(&r);
    if (sk > SHARD_EXPERT_ROW) rd_fail(&r, "an unknown sharding");
    p.shard = (ShardKind)sk;
    p.graph = get_i32(&r);
    p.count = get_i64(&r);
    if (!r.bad && (p.count < 1 || p.count > MAX_ITEMS)) rd_fail(&r, "a parameter's copy count is out of range");
    get_dims(&r, p.rank, p.full_dims, 0);
    p.split_axis = get_i32(&r);
    unsigned sg = get_u8(&r);
    if (!r.bad && (p.split_axis < -1 || p.split_axis >= (p.rank ? p.rank : 1) || sg >= IRG_COUNT)) rd_fail(&r, "a parameter's split is out of range");
    p.split_group = (IrGroup)sg;
    p.split2_axis = get_i32(&r);
    unsigned sg2 = get_u8(&r);
    if (!r.bad && (p.split2_axis < -1 || p.split2_axis >= (p.rank ? p.rank : 1) || sg2 >= IRG_COUNT ||
                   (p.split2_axis >= 0 && p.split_axis < 0)))
      rd_fail(&r, "a parameter's second split is out of range");
    p.split2_group = (IrGroup)sg2;
    unsigned st = get_u8(&r);
    if (!r.bad && st > 1) rd_fail(&r, "a parameter's state flag is not 0 or 1");
    p.state = (int)st;
    p.logical_rows = get_i64(&r);
    if (!r.bad && (p.logical_rows < 0 || (p.logical_rows > 0 && (p.rank < 1 || p.logical_rows > p.full_dims[0]))))
      rd_fail(&r, "a parameter's logical rows are out of range");
    p.span = span_none;
    ir_add_param(m, &p);
  }
  /* an extern is at least 6 strings, two counts and a rank */
  int nx = get_count(&r, 33, "extern");
  for (int i = 0; i < nx && !r.bad; i++) get_extern(&r, m);
  m->nsources = get_count(&r, 4, "source file");
  m->sources = arena_alloc(arena, sizeof(char *) * (size_t)(m->nsources ? m->nsources : 1));
  for (int i = 0; i < m->nsources && !r.bad; i++) m->sources[i] = get_str(&r);
  int ng = get_count(&r, 20, "graph");
  for (int i = 0; i < ng && !r.bad; i++) get_graph(&r, m);
  /* Indices that only the whole module can check. */
  if (!r.bad && (c->step < 0 || c->step >= m->ngraphs || c->nforward < 1 || c->nforward > m->ngraphs))
    rd_fail(&r, "the step graph is not in the module");
  for (int gi = 0; gi < m->ngraphs && !r.bad; gi++)
    for (int k = 0; k < m->graphs[gi]->ngrad_params; k++)
      if (m->graphs[gi]->grad_params[k] < 0 || m->graphs[gi]->grad_params[k] >= m->nparams) rd_fail(&r, "a gradient output names no parameter");
  c->nuses = get_count(&r, 20, "parameter use");
  c->uses = arena_alloc(arena, sizeof(ProgramUse) * (size_t)(c->nuses ? c->nuses : 1));
  for (int i = 0; i < c->nuses && !r.bad; i++) {
    ProgramUse *u = &c->uses[i];
    u->param = get_i32(&r);
    u->layer = get_i64(&r);
    u->owner = get_i32(&r);
    if (!r.bad && (u->param < 0 || u->param >= m->nparams || u->layer < 0 ||
                   u->layer >= m->params[u->param].count || u->owner < 0 || u->owner >= c->nchunks))
      rd_fail(&r, "a parameter use is out of range");
    u->nmirrors = get_count(&r, 4, "mirror");
    u->mirrors = arena_alloc(arena, sizeof(int) * (size_t)(u->nmirrors ? u->nmirrors : 1));
    for (int k = 0; k < u->nmirrors; k++) {
      u->mirrors[k] = get_i32(&r);
      if (!r.bad && (u->mirrors[k] < 0 || u->mirrors[k] >= c->nchunks)) rd_fail(&r, "a mirror stage is out of range");
    }
  }
  c->schedule = (Schedule)get_i32(&r);
  c->sched_m = get_i32(&r);
  c->sched_v = get_i32(&r);
  if (!r.bad && ((int)c->schedule < SCHED_GPIPE || c->schedule > SCHED_INTERLEAVED || c->sched_m < 1 || c->sched_v < 1 ||
                 c->nchunks % c->sched_v))
    rd_fail(&r, "the pipeline schedule is out of range");
  c->nins = get_count(&r, 13, "schedule instruction");
  c->ins = arena_alloc(arena, sizeof(SchedInstr) * (size_t)(c->nins ? c->nins : 1));
  for (int i = 0; i < c->nins && !r.bad; i++) {
    SchedInstr *in = &c->ins[i];
    unsigned op = get_u8(&r);
    in->chunk = get_i32(&r);
    in->mb = get_i32(&r);
    in->peer = get_i32(&r);
    in->op = (SchedOp)op;
    if (!r.bad && (op > SCHED_OP_OPTIMIZER_STEP || in->chunk < -1 || in->chunk >= c->nchunks || in->mb < -1 || in->mb >= c->sched_m ||
                   in->peer < -1 || in->peer >= c->nchunks / c->sched_v ||
                   ((op == SCHED_OP_FWD || op == SCHED_OP_BWD) && (in->chunk < 0 || in->mb < 0))))
      rd_fail(&r, "a schedule instruction is out of range");
  }
  if (!r.bad && r.at != len) rd_fail(&r, "extra bytes after the last record");
  if (!r.bad) {
    /* ir_verify re-derives every node's type with the op's shape rule */
    int problems = ir_verify(m, NULL);
    if (problems) {
      errf(err, errlen, "the module does not verify (%d problem%s; a file of another hpdlc?)", problems, problems == 1 ? "" : "s");
      return NULL;
    }
  }
  return r.bad ? NULL : c;
}

ProgramChunk *program_ir_read(Arena *arena, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    errf(err, errlen, "%s: %s", path, strerror(errno));
    return NULL;
  }
  unsigned char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? cap * 2 : 1 << 16;
      unsigned char *q = realloc(buf, cap);
      if (!q) {
        free(buf);
        fclose(f);
        errf(err, errlen, "%s: out of memory", path);
        return NULL;
      }
      buf = q;
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    errf(err, errlen, "%s: read error", path);
    return NULL;
  }
  char why[512];
  ProgramChunk *c = program_ir_decode(arena, buf, len, why, sizeof why);
  free(buf);
  if (!c) errf(err, errlen, "%s: %s", path, why);
  return c;
}
