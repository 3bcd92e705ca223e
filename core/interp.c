/* interp.c - the reference executor: every IR op as plain fp64 loops.
 *
 * Clarity over speed: each op is a loop over its output (or input) with an
 * explicit multi-index, so the code reads like the op's definition and the
 * back ends can be checked against it. Values die after their last use, so
 * a whole model's forward and backward fit in memory at test sizes.
 *
 * Single-rank conventions (the multi-rank simulation comes with the
 * partitioner): a group has one member, so ALL_REDUCE, and ALL_GATHER /
 * REDUCE_SCATTER that keep the shape, are copies; SEND copies its input to
 * a loopback mailbox (one FIFO per process group) and RECV takes the oldest
 * message of its group, so a SEND / RECV pair in one process is an identity
 * and autodiff's RECV / SEND of gradients can be checked without ranks. */
#include "interp.h"
#include "extcall.h"
#include "xalloc.h"

#include "half.h"
#include "init.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-layer values that a SAVE call keeps for its BACKWARD call. */
typedef struct {
  int graph, node; /* the SAVE call: caller graph and node id */
  int64_t count;
  int per_layer; /* tensors per layer: the arguments, then outputs 1.. */
  InterpTensor *t; /* count * per_layer */
  int64_t bytes;   /* as reported to the accounting listener */
} Stash;

typedef struct Msg {
  int group;
  InterpTensor t;
  struct Msg *next;
} Msg;

struct Interp {
  const IrModule *m;
  double **params; /* per parameter: count copies of numel values */
  double **grads;  /* same layout, allocated on the first gradient */
  double **inputs;
  uint64_t seed;
  double loss_seed; /* the seed of the training step being run (LOSS_SEED) */
  int evaluating;   /* TRAINING reads 0 (interp_set_evaluating), else 1 */
  double aux_sum;   /* weight x value of every AUX_LOSS a forward ran (interp_take_aux) */
  int aux_seen;
  int bwd_depth;    /* inside a BACKWARD call: recomputed forward nodes are not counted */
  Msg *mail_head, *mail_tail;
  InterpComm comm;
  int has_comm;
  InterpAccount acc; /* allocation accounting (memplan's tests) */
  int has_acc;
  ExtCalls *ext; /* the module's extern functions, loaded on their first call */
  int detect_anomaly; /* check every op's values (interp_set_detect_anomaly) */
  int store_f32;      /* round each fp32 value as a back end stores it (interp_set_store_f32) */
  InterpTimer timer; /* op timing (interp_set_timer) */
  int has_timer;
  char err[1024];
};

void interp_set_detect_anomaly(Interp *in, int on) { in->detect_anomaly = on; }
void interp_set_store_f32(Interp *in, int on) { in->store_f32 = on; }

void interp_set_evaluating(Interp *in, int on) { in->evaluating = on; }

void interp_set_timer(Interp *in, const InterpTimer *t) {
  if (t) in->timer = *t;
  in->has_timer = t != NULL;
}

void interp_set_account(Interp *in, const InterpAccount *acc) {
  if (acc) in->acc = *acc;
  in->has_acc = acc != NULL;
}

/* Accounting events (interp.h); no-ops without a listener. */
static void acc_run(Interp *in, int graph, int64_t layer, int begin) {
  if (in->has_acc && in->acc.run) in->acc.run(in->acc.user, graph, layer, begin);
}
static void acc_value(Interp *in, int graph, int node, int alive) {
  if (in->has_acc && in->acc.value) in->acc.value(in->acc.user, graph, node, alive);
}
static void acc_stash(Interp *in, int graph, int node, int64_t bytes, int alive) {
  if (in->has_acc && in->acc.stash) in->acc.stash(in->acc.user, graph, node, bytes, alive);
}

void interp_set_comm(Interp *in, const InterpComm *comm) {
  in->comm = *comm;
  in->has_comm = 1;
}

static int group_size(const Interp *in, int64_t g) {
  return in->has_comm && g >= 0 && g < IRG_COUNT && in->comm.size[g] > 0 ? in->comm.size[g] : 1;
}

static int group_rank(const Interp *in, int64_t g) {
  return in->has_comm && g >= 0 && g < IRG_COUNT ? in->comm.rank[g] : 0;
}

int64_t interp_global_pos(int layout, int r, int size, int64_t local, int64_t i) {
  if (layout == 0 || size <= 1) return (int64_t)r * local + i;
  int64_t h = local / 2; /* zigzag: chunks r and 2 size - 1 - r of length h */
  return i < h ? (int64_t)r * h + i : (int64_t)(2 * size - 1 - r) * h + (i - h);
}

/* Positions in the sequence under context parallelism (ir_ops.h) of ROPE's,
 * CAUSAL_MASK's and ATTENTION's rows and of the latter two's keys; `group`
 * is the attribute: 1 + the process group, or 0 when the axis is not split.
 * Rows: this rank's zigzag chunks. Keys: the group's blocks in ring order,
 * block b from rank r - b, each in that rank's zigzag layout, or (step > 0)
 * the one block received at ring step step - 1. */
static int64_t zigzag_row_pos(const Interp *in, int64_t group, int64_t rows, int64_t row) {
  int64_t g = group - 1;
  return g >= 0 ? interp_global_pos(1, group_rank(in, g), group_size(in, g), rows, row) : row;
}

static int64_t ring_col_pos(const Interp *in, int64_t group, int64_t step, int64_t cols, int64_t col) {
  int64_t g = group - 1;
  if (g < 0) return col;
  int c = group_size(in, g), me = group_rank(in, g);
  if (step > 0) /* one block, the one received at ring step step - 1 (ATTENTION's attr[4]) */
    return interp_global_pos(1, (int)(((me - (step - 1)) % c + c) % c), c, cols, col);
  int64_t len = cols / c, b = col / len;
  return interp_global_pos(1, (int)((me - b + c) % c), c, len, col % len);
}

static int64_t dims_numel(int rank, const int64_t *dims) {
  int64_t k = 1;
  for (int i = 0; i < rank; i++) k *= dims[i];
  return k;
}


static const char *fail(Interp *in, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *fail(Interp *in, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(in->err, sizeof in->err, fmt, ap);
  va_end(ap);
  return in->err;
}

/* ---- deterministic generators ---- */

/* The generator is the runtime's (core/init.c), so the reference and a
 * real run start from the same weights by construction. */
uint64_t interp_hash_name(uint64_t seed, const char *name, int64_t layer) { return init_hash_name(seed, name, layer); }
double interp_uniform01(uint64_t *state) { return init_uniform01(state); }
double interp_normal(uint64_t *state) { return init_normal(state); }

/* ---- life cycle ---- */

Interp *interp_new(const IrModule *m) {
  Interp *in = xalloc_calloc(1, sizeof *in);
  in->m = m;
  in->params = xalloc_calloc((size_t)m->nparams, sizeof(double *));
  in->grads = xalloc_calloc((size_t)m->nparams, sizeof(double *));
  in->inputs = xalloc_calloc((size_t)m->ninputs, sizeof(double *));
  for (int i = 0; i < m->nparams; i++) {
    const IrParam *p = &m->params[i];
    in->params[i] = xalloc_calloc((size_t)ir_param_numel_all(p), sizeof(double));
  }
  for (int g = 0; g < IRG_COUNT; g++) in->comm.size[g] = 1;
  return in;
}

static void stash_clear(Stash *s) {
  for (int64_t i = 0; i < s->count * s->per_layer; i++) free(s->t[i].data);
  free(s->t);
  s->t = NULL;
  s->count = 0;
}

void interp_free(Interp *in) {
  if (!in) return;
  for (int i = 0; i < in->m->nparams; i++) {
    free(in->params[i]);
    free(in->grads[i]);
  }
  for (int i = 0; i < in->m->ninputs; i++) free(in->inputs[i]);
  while (in->mail_head) {
    Msg *next = in->mail_head->next;
    free(in->mail_head->t.data);
    free(in->mail_head);
    in->mail_head = next;
  }
  extcall_close(in->ext);
  free(in->params);
  free(in->grads);
  free(in->inputs);
  free(in);
}

void interp_init_params(Interp *in, uint64_t seed) {
  in->seed = seed;
  for (int i = 0; i < in->m->nparams; i++) {
    const IrParam *p = &in->m->params[i];
    int64_t n = ir_param_numel(p), copies = ir_param_copies(p);
    /* semtypes.h's InitKind and init.h's kinds share their order */
    InitSpec spec = {(InitKindRt)p->init.kind, p->init.a, p->init.b};
    for (int64_t l = 0; l < copies; l++) init_fill_f64(in->params[i] + l * n, n, &spec, seed, p->name, l);
  }
}

/* A parameter of a repeated block has one copy per layer; one used by a
 * repeated graph without copies (count 1) is shared by every layer. */
static int64_t param_copy(const IrParam *p, int64_t layer) { return p->count > 1 ? layer : 0; }

double *interp_param(Interp *in, int param, int64_t layer, int64_t *numel) {
  if (param < 0 || param >= in->m->nparams) return NULL;
  const IrParam *p = &in->m->params[param];
  int64_t copy = param_copy(p, layer);
  if (copy < 0 || copy >= ir_param_copies(p)) return NULL;
  if (numel) *numel = ir_param_numel(p);
  return in->params[param] + copy * ir_param_numel(p);
}

void interp_set_input(Interp *in, int input, const double *data) {
  if (input < 0 || input >= in->m->ninputs) return;
  const IrInput *x = &in->m->inputs[input];
  int64_t n = dims_numel(x->rank, x->dims);
  if (!in->inputs[input]) in->inputs[input] = xalloc_calloc((size_t)n, sizeof(double));
  memcpy(in->inputs[input], data, sizeof(double) * (size_t)n);
}

void interp_zero_grads(Interp *in) {
  for (int i = 0; i < in->m->nparams; i++) {
    const IrParam *p = &in->m->params[i];
    if (in->grads[i])
      memset(in->grads[i], 0, sizeof(double) * (size_t)ir_param_numel_all(p));
  }
}

double *interp_grad(Interp *in, int param, int64_t layer, int64_t *numel) {
  if (param < 0 || param >= in->m->nparams || !in->grads[param]) return NULL;
  const IrParam *p = &in->m->params[param];
  int64_t copy = param_copy(p, layer);
  if (copy < 0 || copy >= ir_param_copies(p)) return NULL;
  if (numel) *numel = ir_param_numel(p);
  return in->grads[param] + copy * ir_param_numel(p);
}

static void add_grad(Interp *in, int param, int64_t layer, const double *g) {
  const IrParam *p = &in->m->params[param];
  int64_t n = ir_param_numel(p);
  if (!in->grads[param]) in->grads[param] = xalloc_calloc((size_t)ir_param_numel_all(p), sizeof(double));
  double *d = in->grads[param] + param_copy(p, layer) * n;
  for (int64_t k = 0; k < n; k++) d[k] += g[k];
}

/* ---- index helpers ---- */

/* Strides of a tensor of shape (rank, dims) read as if broadcast to the
 * shape (orank, odims), aligned at the trailing axis: 0 where it repeats. */
static void bcast_strides(int rank, const int64_t *dims, int orank, int64_t *strides) {
  int64_t s = 1;
  for (int i = orank - 1; i >= 0; i--) {
    int k = rank - orank + i;
    if (k < 0 || dims[k] == 1) strides[i] = 0;
    else strides[i] = s;
    if (k >= 0) s *= dims[k];
  }
}

static void row_strides(int rank, const int64_t *dims, int64_t *strides) {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; i--) {
    strides[i] = s;
    s *= dims[i];
  }
}

static void idx_next(int rank, const int64_t *dims, int64_t *idx) {
  for (int k = rank - 1; k >= 0; k--) {
    if (++idx[k] < dims[k]) return;
    idx[k] = 0;
  }
}

static int64_t idx_dot(int rank, const int64_t *idx, const int64_t *strides) {
  int64_t off = 0;
  for (int k = 0; k < rank; k++) off += idx[k] * strides[k];
  return off;
}

/* [outer, n, inner] view of a tensor around `axis` */
static void axis_view(const IrNode *x, int64_t axis, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = 1;
  *inner = 1;
  for (int i = 0; i < axis; i++) *outer *= x->dims[i];
  *n = x->dims[axis];
  for (int i = (int)axis + 1; i < x->rank; i++) *inner *= x->dims[i];
}

/* ---- elementwise math ---- */

static const double GELU_K = 0.79788456080286535588; /* sqrt(2 / pi) */
static const double GELU_C = 0.044715;

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

static int unary_value(IrOp op, double p, double x, double *y) {
  switch (op) {
  case IR_NEG: *y = -x; return 0;
  case IR_RELU: *y = x > 0 ? x : 0; return 0;
  case IR_GELU: *y = 0.5 * x * (1.0 + tanh(GELU_K * (x + GELU_C * x * x * x))); return 0;
  case IR_SILU: *y = x * sigmoid(x); return 0;
  case IR_SIGMOID: *y = sigmoid(x); return 0;
  case IR_TANH: *y = tanh(x); return 0;
  case IR_EXP: *y = exp(x); return 0;
  case IR_LOG: *y = log(x); return 0;
  case IR_SQRT: *y = sqrt(x); return 0;
  case IR_RSQRT: *y = 1.0 / sqrt(x); return 0;
  case IR_ABS: *y = fabs(x); return 0;
  case IR_SQUARE: *y = x * x; return 0;
  case IR_POWS: *y = pow(x, p); return 0;
  default: return -1;
  }
}

/* f'(x) of the unary ops that ACT_GRAD names; relu'(0) = abs'(0) = 0. */
static int unary_deriv(IrOp op, double p, double x, double *d) {
  switch (op) {
  case IR_NEG: *d = -1; return 0;
  case IR_CAST: *d = 1; return 0;
  case IR_RELU: *d = x > 0 ? 1 : 0; return 0;
  case IR_GELU: {
    double u = GELU_K * (x + GELU_C * x * x * x), t = tanh(u);
    *d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * GELU_C * x * x);
    return 0;
  }
  case IR_SILU: {
    double s = sigmoid(x);
    *d = s + x * s * (1.0 - s);
    return 0;
  }
  case IR_SIGMOID: {
    double s = sigmoid(x);
    *d = s * (1.0 - s);
    return 0;
  }
  case IR_TANH: {
    double t = tanh(x);
    *d = 1.0 - t * t;
    return 0;
  }
  case IR_EXP: *d = exp(x); return 0;
  case IR_LOG: *d = 1.0 / x; return 0;
  case IR_SQRT: *d = 0.5 / sqrt(x); return 0;
  case IR_RSQRT: *d = -0.5 / (x * sqrt(x)); return 0;
  case IR_ABS: *d = x > 0 ? 1 : x < 0 ? -1 : 0; return 0;
  case IR_SQUARE: *d = 2.0 * x; return 0;
  case IR_POWS: *d = p * pow(x, p - 1.0); return 0;
  default: return -1;
  }
}

static double binary_value(IrOp op, double a, double b) {
  switch (op) {
  case IR_ADD: return a + b;
  case IR_SUB: return a - b;
  case IR_MUL: return a * b;
  case IR_DIV: return a / b;
  case IR_MAXIMUM: return a > b ? a : b;
  default: return a < b ? a : b; /* IR_MINIMUM */
  }
}

/* ---- one graph run ---- */

typedef struct {
  Interp *in;
  int gi;
  const IrGraph *g;
  int64_t layer;
  const InterpTensor *args;
  int nargs;
  double **val;  /* per node: its values, or NULL */
  char *owned;   /* per node: val is ours to free */
  int *last;     /* per node: the last node that reads it (nnodes for an output) */
  int next;      /* the next node to run */
  /* The SAVE calls' per-layer activations, kept for their BACKWARD calls
   * of the same run (so two runs in flight keep apart). */
  Stash *stash;
  int nstash, capstash;
  /* A frame (interp_forward): leaves that could change before the rest
   * runs (model inputs, arguments) are copied, and the run outlives the call. */
  int frame;
  InterpTensor *argcopy;
} Run;

static int run_graph(Interp *in, int gi, int64_t layer, const InterpTensor *args, int nargs, InterpTensor *outs,
                     const char **err);

static InterpTensor tensor_of(const IrNode *n, double *data) {
  InterpTensor t;
  memset(&t, 0, sizeof t);
  t.rank = n->rank;
  memcpy(t.dims, n->dims, sizeof t.dims);
  t.data = data;
  return t;
}

static double *dup_values(const double *src, int64_t n) {
  double *d = xalloc_calloc((size_t)n, sizeof(double));
  memcpy(d, src, sizeof(double) * (size_t)n);
  return d;
}

static Stash *stash_find(Run *r, int graph, int node, int create) {
  for (int i = 0; i < r->nstash; i++)
    if (r->stash[i].graph == graph && r->stash[i].node == node) return &r->stash[i];
  if (!create) return NULL;
  if (r->nstash == r->capstash) {
    r->capstash = r->capstash ? r->capstash * 2 : 4;
    Stash *s = realloc(r->stash, sizeof(Stash) * (size_t)r->capstash);
    if (!s) abort();
    r->stash = s;
  }
  Stash *s = &r->stash[r->nstash++];
  memset(s, 0, sizeof *s);
  s->graph = graph;
  s->node = node;
  return s;
}

/* CALL in its three modes (ir.h). */
static const char *exec_call(Run *r, const IrNode *n, double *out) {
  Interp *in = r->in;
  const IrModule *m = in->m;
  int callee = (int)n->attr[0];
  int64_t count = n->attr[1], mode = n->attr[2], first = n->attr[3];
  if (callee < 0 || callee >= m->ngraphs) return fail(in, "call of an unknown graph");
  const IrGraph *cg = m->graphs[callee];
  if (cg->noutputs < 1) return fail(in, "call of graph %s, which has no outputs", cg->name);
  InterpTensor *outs = xalloc_calloc((size_t)cg->noutputs, sizeof(InterpTensor));
  const char *err = NULL;

  if (mode == IR_CALL_PLAIN || mode == IR_CALL_SAVE) {
    int nargs = n->nin;
    InterpTensor *args = xalloc_calloc((size_t)nargs + 1, sizeof(InterpTensor));
    for (int k = 0; k < nargs; k++) args[k] = tensor_of(&r->g->nodes[n->in[k]], r->val[n->in[k]]);
    Stash *st = NULL;
    if (mode == IR_CALL_SAVE) {
      st = stash_find(r, r->gi, (int)(n - r->g->nodes), 1);
      if (st->count) acc_stash(in, st->graph, st->node, st->bytes, 0);
      stash_clear(st);
      st->count = count;
      st->per_layer = nargs + cg->noutputs - 1;
      st->t = xalloc_calloc((size_t)(count * st->per_layer), sizeof(InterpTensor));
      /* the whole stash, in the IR's dtypes: the arguments and outputs 1.. per layer */
      int64_t per = 0;
      for (int k = 0; k < nargs; k++) per += ir_bytes(&r->g->nodes[n->in[k]]);
      for (int k = 1; k < cg->noutputs; k++) per += ir_bytes(&cg->nodes[cg->outputs[k]]);
      st->bytes = per * count;
      acc_stash(in, st->graph, st->node, st->bytes, 1);
    }
    double *carry = NULL; /* output 0 of the previous iteration, ours */
    for (int64_t l = 0; l < count && !err; l++) {
      if (st)
        for (int k = 0; k < nargs; k++) {
          InterpTensor *t = &st->t[l * st->per_layer + k];
          *t = args[k];
          t->data = dup_values(args[k].data, dims_numel(args[k].rank, args[k].dims));
        }
      if (run_graph(in, callee, first + l, args, nargs, outs, &err) == 0) {
        free(carry);
        carry = outs[0].data;
        args[0] = outs[0];
        for (int k = 1; k < cg->noutputs; k++) {
          if (st) st->t[l * st->per_layer + nargs + k - 1] = outs[k];
          else free(outs[k].data);
        }
      }
    }
    if (!err) memcpy(out, carry, sizeof(double) * (size_t)ir_numel(n));
    free(carry);
    free(args);
  } else if (mode == IR_CALL_BACKWARD) {
    Stash *st = n->nin == 2 ? stash_find(r, r->gi, n->in[1], 0) : NULL;
    if (!st || st->count != count)
      err = fail(in, "backward call of %s: nothing saved by its forward call (run the SAVE call first)", cg->name);
    int nargs = 1 + (st ? st->per_layer : 0);
    InterpTensor *args = xalloc_calloc((size_t)nargs, sizeof(InterpTensor));
    double *carry = NULL;
    if (!err) args[0] = tensor_of(&r->g->nodes[n->in[0]], r->val[n->in[0]]);
    in->bwd_depth++;
    for (int64_t l = count - 1; l >= 0 && !err; l--) {
      for (int k = 0; k < st->per_layer; k++) args[1 + k] = st->t[l * st->per_layer + k];
      if (run_graph(in, callee, first + l, args, nargs, outs, &err) == 0) {
        free(carry);
        carry = outs[0].data;
        args[0] = outs[0];
        for (int k = 1; k < cg->noutputs; k++) free(outs[k].data);
      }
    }
    in->bwd_depth--;
    if (!err) memcpy(out, carry, sizeof(double) * (size_t)ir_numel(n));
    free(carry);
    free(args);
    if (st && st->count) acc_stash(in, st->graph, st->node, st->bytes, 0);
    if (st) stash_clear(st); /* the activations die with their backward */
  } else {
    err = fail(in, "call mode %" PRId64 " is unknown", mode);
  }
  free(outs);
  return err;
}

static const char *exec_matmul(Run *r, const IrNode *n, double *out) {
  const IrNode *a = &r->g->nodes[n->in[0]], *b = &r->g->nodes[n->in[1]];
  const double *A = r->val[n->in[0]], *B = r->val[n->in[1]];
  int ta = (int)n->attr[0], tb = (int)n->attr[1];
  int64_t M = n->dims[n->rank - 2], N = n->dims[n->rank - 1];
  int64_t K = ta ? a->dims[a->rank - 2] : a->dims[a->rank - 1];
  int64_t acols = a->dims[a->rank - 1], bcols = b->dims[b->rank - 1];
  int batch = n->rank - 2;
  int64_t sa[IR_MAX_RANK], sb[IR_MAX_RANK], idx[IR_MAX_RANK] = {0};
  /* batch strides in units of whole matrices */
  bcast_strides(a->rank - 2, a->dims, batch, sa);
  bcast_strides(b->rank - 2, b->dims, batch, sb);
  int64_t asz = a->dims[a->rank - 2] * acols, bsz = b->dims[b->rank - 2] * bcols;
  int64_t nb = dims_numel(batch, n->dims);
  for (int64_t bi = 0; bi < nb; bi++) {
    const double *Ab = A + idx_dot(batch, idx, sa) * asz, *Bb = B + idx_dot(batch, idx, sb) * bsz;
    double *O = out + bi * M * N;
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) {
          double av = ta ? Ab[k * acols + i] : Ab[i * acols + k];
          double bv = tb ? Bb[j * bcols + k] : Bb[k * bcols + j];
          s += av * bv;
        }
        O[i * N + j] = s;
      }
    idx_next(batch, n->dims, idx);
  }
  return NULL;
}

/* MOE_EXPERT_IDS: the choices' experts sorted (a counting sort) */
static const char *exec_expert_ids(Run *r, const IrNode *n, double *out) {
  const double *I = r->val[n->in[0]];
  int64_t N = n->dims[0], E = n->attr[0];
  int64_t *count = xalloc_calloc((size_t)(E + 1), sizeof(int64_t));
  const char *e = NULL;
  for (int64_t c = 0; c < N && !e; c++)
    if (I[c] < 0 || I[c] >= (double)E) e = fail(r->in, "moe_expert_ids: expert %g is outside [0, %" PRId64 ")", I[c], E);
    else count[(int64_t)I[c]]++;
  for (int64_t x = 0, o = 0; x < E && !e; x++)
    for (int64_t j = 0; j < count[x]; j++) out[o++] = (double)x;
  free(count);
  return e;
}

/* GROUPED_MM and GROUPED_MM_WGRAD (ir_ops.h), row by row in fp64 */
static const char *exec_grouped_mm(Run *r, const IrNode *n, double *out) {
  const IrGraph *g = r->g;
  const IrNode *a = &g->nodes[n->in[0]], *b = &g->nodes[n->in[1]];
  const double *A = r->val[n->in[0]], *Bv = r->val[n->in[1]], *ids = r->val[n->in[2]];
  int64_t N = a->dims[0], X = a->dims[1];
  int64_t E = n->op == IR_GROUPED_MM ? b->dims[0] : n->dims[0];
  for (int64_t i = 0; i < N; i++)
    if (ids[i] < 0 || ids[i] >= (double)E)
      return fail(r->in, "%s: row %" PRId64 "'s expert %g is outside [0, %" PRId64 ")", ir_op_name(n->op), i, ids[i], E);
  memset(out, 0, sizeof(double) * (size_t)ir_numel(n));
  if (n->op == IR_GROUPED_MM) {
    int t = n->attr[0] != 0;
    int64_t Y = n->dims[1];
    for (int64_t i = 0; i < N; i++) {
      const double *w = Bv + (int64_t)ids[i] * X * Y;
      for (int64_t y = 0; y < Y; y++) {
        double s = 0;
        for (int64_t x = 0; x < X; x++) s += A[i * X + x] * (t ? w[y * X + x] : w[x * Y + y]);
        out[i * Y + y] = s;
      }
    }
  } else {
    int64_t Y = b->dims[1];
    for (int64_t i = 0; i < N; i++) {
      double *o = out + (int64_t)ids[i] * X * Y;
      for (int64_t x = 0; x < X; x++)
        for (int64_t y = 0; y < Y; y++) o[x * Y + y] += A[i * X + x] * Bv[i * Y + y];
    }
  }
  return NULL;
}

static const char *exec_rope(const Interp *in, const IrNode *n, const double *x, double *out) {
  int bthd = ir_rope_bthd(n);
  int64_t B = n->dims[0], H = n->dims[ir_rope_heads_axis(n)], T = n->dims[ir_rope_pos_axis(n)], D = n->dims[3];
  double sign = n->attr[0] ? -1.0 : 1.0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t t = 0; t < T; t++) {
        const int64_t row = bthd ? (b * T + t) * H + h : (b * H + h) * T + t;
        const double *xr = x + row * D;
        double *o = out + row * D;
        for (int64_t i = 0; i < D / 2; i++) {
          int64_t pos = zigzag_row_pos(in, n->attr[1], T, t);
          double theta = sign * (double)pos * (pow(n->fattr, -2.0 * (double)i / (double)D) * ir_rope_gain(n, i, D));
          double c = cos(theta), s = sin(theta), x0 = xr[2 * i], x1 = xr[2 * i + 1];
          o[2 * i] = x0 * c - x1 * s;
          o[2 * i + 1] = x0 * s + x1 * c;
        }
      }
  return NULL;
}

/* log-sum-exp of one row, stable */
static double row_lse(const double *x, int64_t V) {
  double mx = -INFINITY;
  for (int64_t v = 0; v < V; v++)
    if (x[v] > mx) mx = x[v];
  if (mx == -INFINITY) return mx;
  double s = 0;
  for (int64_t v = 0; v < V; v++) s += exp(x[v] - mx);
  return mx + log(s);
}

void interp_chunk_copy(const IrNode *local_node, int64_t axis, int layout, int rank, int size, void *global, void *local,
                       size_t elem, int to_global) {
  int64_t outer = 1, inner = 1, len = local_node->dims[axis];
  for (int64_t i = 0; i < axis; i++) outer *= local_node->dims[i];
  for (int i = (int)axis + 1; i < local_node->rank; i++) inner *= local_node->dims[i];
  int64_t glen = len * size;
  size_t row = elem * (size_t)inner;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < len; i++) {
      int64_t gp = interp_global_pos(layout, rank, size, len, i);
      char *gl = (char *)global + (size_t)(o * glen + gp) * row, *lo = (char *)local + (size_t)(o * len + i) * row;
      if (to_global) memcpy(gl, lo, row);
      else memcpy(lo, gl, row);
    }
}

/* ALL_TO_ALL's chunk of each member (ir_ops.h): x's dims with the split axis 1 / size */
static IrNode a2a_piece(const IrNode *x, int64_t split, int size) {
  IrNode piece = *x;
  piece.dims[split] /= size;
  return piece;
}

void interp_a2a_pack(const IrNode *x, int64_t split, int size, const void *in, void *send, size_t elem) {
  IrNode piece = a2a_piece(x, split, size);
  size_t bytes = (size_t)ir_numel(&piece) * elem;
  for (int k = 0; k < size; k++) interp_chunk_copy(&piece, split, 0, k, size, (void *)in, (char *)send + (size_t)k * bytes, elem, 0);
}

void interp_a2a_unpack(const IrNode *x, int64_t split, int64_t concat, int size, const void *recv, void *out, size_t elem) {
  IrNode piece = a2a_piece(x, split, size);
  size_t bytes = (size_t)ir_numel(&piece) * elem;
  for (int k = 0; k < size; k++) interp_chunk_copy(&piece, concat, 0, k, size, out, (char *)recv + (size_t)k * bytes, elem, 1);
}

static void chunk_copy(const IrNode *local_node, int64_t axis, int layout, int rank, int size, double *global,
                       double *local, int to_global) {
  interp_chunk_copy(local_node, axis, layout, rank, size, global, local, sizeof(double), to_global);
}

static const char *exec_collective(Run *r, const IrNode *n, const IrNode *x, const double *X, double *out) {
  Interp *in = r->in;
  int64_t g = n->attr[0];
  int size = group_size(in, g), rank = group_rank(in, g);
  int64_t N = ir_numel(n), NX = ir_numel(x);
  const char *err = NULL;
  switch (n->op) {
  case IR_COPY_TO_GROUP:
    memcpy(out, X, sizeof(double) * (size_t)N);
    return NULL;
  case IR_ALL_REDUCE:
    memcpy(out, X, sizeof(double) * (size_t)N);
    if (size > 1) err = in->comm.all_reduce(in->comm.ctx, (IrGroup)g, (int)n->attr[2], out, N);
    return err ? fail(in, "all_reduce over %s: %s", ir_group_name((IrGroup)g), err) : NULL;
  case IR_SHARD_SLICE:
    if (NX != N * size) return fail(in, "shard_slice over %s: %" PRId64 " values do not split %d ways", ir_group_name((IrGroup)g), NX, size);
    chunk_copy(n, n->attr[1], (int)n->attr[2], rank, size, (double *)X, out, 0);
    return NULL;
  case IR_ALL_GATHER: {
    if (N != NX * size) return fail(in, "all_gather over %s: the result is not %d times the input", ir_group_name((IrGroup)g), size);
    if (size == 1) {
      memcpy(out, X, sizeof(double) * (size_t)N);
      return NULL;
    }
    double *all = xalloc_calloc((size_t)N, sizeof(double));
    err = in->comm.all_gather(in->comm.ctx, (IrGroup)g, X, NX, all);
    for (int k = 0; k < size && !err; k++) chunk_copy(x, n->attr[1], (int)n->attr[2], k, size, out, all + k * NX, 1);
    free(all);
    return err ? fail(in, "all_gather over %s: %s", ir_group_name((IrGroup)g), err) : NULL;
  }
  case IR_REDUCE_SCATTER: {
    if (NX != N * size) return fail(in, "reduce_scatter over %s: the input is not %d times the result", ir_group_name((IrGroup)g), size);
    double *sum = dup_values(X, NX);
    if (size > 1) err = in->comm.all_reduce(in->comm.ctx, (IrGroup)g, 0, sum, NX);
    if (!err) chunk_copy(n, n->attr[1], (int)n->attr[2], rank, size, sum, out, 0);
    free(sum);
    return err ? fail(in, "reduce_scatter over %s: %s", ir_group_name((IrGroup)g), err) : NULL;
  }
  case IR_ALL_TO_ALL: {
    int64_t split = n->attr[1], concat = n->attr[2];
    if (N != NX || x->dims[split] % size || split == concat)
      return fail(in, "all_to_all over %s: %" PRId64 " values along axis %" PRId64 " do not split %d ways", ir_group_name((IrGroup)g),
                  x->dims[split], split, size);
    if (size == 1) {
      memcpy(out, X, sizeof(double) * (size_t)N);
      return NULL;
    }
    int64_t P = NX / size;
    double *send = xalloc_calloc((size_t)NX, sizeof(double)), *recv = xalloc_calloc((size_t)NX, sizeof(double));
    if (in->comm.all_to_all) {
      interp_a2a_pack(x, split, size, X, send, sizeof(double));
      err = in->comm.all_to_all(in->comm.ctx, (IrGroup)g, send, P, recv);
    } else {
      /* every member's whole input, of which this member keeps its chunk of each */
      IrNode piece = a2a_piece(x, split, size);
      double *all = xalloc_calloc((size_t)NX * (size_t)size, sizeof(double));
      err = in->comm.all_gather(in->comm.ctx, (IrGroup)g, X, NX, all);
      for (int k = 0; k < size && !err; k++) chunk_copy(&piece, split, 0, rank, size, all + k * NX, recv + k * P, 0);
      free(all);
    }
    if (!err) interp_a2a_unpack(x, split, concat, size, recv, out, sizeof(double));
    free(send);
    free(recv);
    return err ? fail(in, "all_to_all over %s: %s", ir_group_name((IrGroup)g), err) : NULL;
  }
  default: return fail(in, "%s is not a collective", ir_op_name(n->op));
  }
}

/* EXTERN and EXTERN_GRAD: the native function on fp32 copies of the values
 * (its convention is fp32), the result widened back. */
static const char *exec_extern(Run *r, const IrNode *n, double *out) {
  Interp *in = r->in;
  const IrModule *m = in->m;
  if (n->attr[0] < 0 || n->attr[0] >= m->nexterns) return fail(in, "extern call of an unknown function");
  if (!in->ext) {
    char why[1024];
    in->ext = extcall_open(m->externs, m->nexterns, why, sizeof why);
    if (!in->ext) return fail(in, "%s", why);
  }
  int nb = n->nin + 1;
  void **bufs = xalloc_calloc((size_t)nb, sizeof(void *));
  for (int k = 0; k < nb; k++) {
    const IrNode *x = k < n->nin ? &r->g->nodes[n->in[k]] : n;
    int64_t N = ir_numel(x);
    float *f = xalloc_calloc((size_t)(N ? N : 1), sizeof(float));
    if (k < n->nin)
      for (int64_t i = 0; i < N; i++) f[i] = (float)r->val[n->in[k]][i];
    bufs[k] = f;
  }
  char why[1024];
  int rc = n->op == IR_EXTERN ? extcall_forward(in->ext, (int)n->attr[0], bufs, why, sizeof why)
                              : extcall_grad(in->ext, (int)n->attr[0], bufs, why, sizeof why);
  const float *res = bufs[n->nin];
  for (int64_t i = 0, N = ir_numel(n); rc == 0 && i < N; i++) out[i] = res[i];
  for (int k = 0; k < nb; k++) free(bufs[k]);
  free(bufs);
  return rc ? fail(in, "%s", why) : NULL;
}

/* The router's ops (ir_ops.h): TOPK, TAKE, TAKE_BWD, ONE_HOT, row by row over the last axis. */
static const char *exec_router(Run *r, const IrNode *n, double *out) {
  Interp *in = r->in;
  const IrGraph *g = r->g;
  const IrNode *x = &g->nodes[n->in[0]];
  const double *X = r->val[n->in[0]];
  int64_t N = ir_numel(n);
  switch (n->op) {
  case IR_TOPK: {
    int64_t V = x->dims[x->rank - 1], K = n->attr[0], rows = V ? ir_numel(x) / V : 0;
    int64_t *pos = xalloc_calloc((size_t)(rows * K + 1), sizeof(int64_t));
    interp_topk(X, NULL, rows, V, K, pos);
    for (int64_t p = 0; p < rows * K; p++) out[p] = (double)pos[p];
    free(pos);
    return NULL;
  }
  case IR_TAKE:
  case IR_TAKE_BWD: {
    const IrNode *t = &g->nodes[n->in[1]];
    const double *I = r->val[n->in[1]];
    int64_t K = t->dims[t->rank - 1], V = n->op == IR_TAKE ? x->dims[x->rank - 1] : n->dims[n->rank - 1];
    int64_t P = ir_numel(t);
    if (n->op == IR_TAKE_BWD) memset(out, 0, sizeof(double) * (size_t)N);
    for (int64_t p = 0; p < P; p++) {
      int64_t v = (int64_t)I[p], row = K ? p / K : 0;
      if (v < 0 || v >= V) return fail(in, "take: index %" PRId64 " is outside [0, %" PRId64 ")", v, V);
      if (n->op == IR_TAKE) out[p] = X[row * V + v];
      else out[row * V + v] += X[p];
    }
    return NULL;
  }
  case IR_ONE_HOT: {
    int64_t C = n->attr[0], P = ir_numel(x);
    memset(out, 0, sizeof(double) * (size_t)N);
    for (int64_t p = 0; p < P; p++) {
      int64_t v = (int64_t)X[p];
      if (v >= 0 && v < C) out[p * C + v] = 1.0;
    }
    return NULL;
  }
  default: return fail(in, "%s is not a router op", ir_op_name(n->op));
  }
}

void interp_topk(const double *xd, const float *xf, int64_t rows, int64_t V, int64_t K, int64_t *out) {
  unsigned char *taken = xalloc_calloc((size_t)(V ? V : 1), 1);
  for (int64_t row = 0; row < rows; row++) {
    memset(taken, 0, (size_t)V);
    for (int64_t j = 0; j < K; j++) {
      int64_t best = -1;
      double bv = 0;
      for (int64_t v = 0; v < V; v++) {
        double xv = xd ? xd[row * V + v] : (double)xf[row * V + v];
        if (!taken[v] && (best < 0 || xv > bv || (isnan(bv) && !isnan(xv)))) best = v, bv = xv;
      }
      taken[best] = 1;
      out[row * K + j] = best;
    }
  }
  free(taken);
}

int64_t interp_moe_slots(const int64_t *choice, int64_t T, int64_t K, int64_t E, int64_t cap, int64_t *slot, int64_t *count) {
  for (int64_t e = 0; e < E; e++) count[e] = 0;
  for (int64_t k = 0; k < K; k++)
    for (int64_t t = 0; t < T; t++) {
      int64_t e = choice[t * K + k];
      if (e < 0 || e >= E) return t * K + k;
      slot[t * K + k] = count[e] < cap ? e * cap + count[e]++ : -1;
    }
  return -1;
}

int64_t interp_moe_rows(const int64_t *choice, int64_t n, int64_t E, int64_t *row, int64_t *count) {
  for (int64_t e = 0; e <= E; e++) count[e] = 0;
  for (int64_t c = 0; c < n; c++) {
    if (choice[c] < 0 || choice[c] >= E) return c;
    count[choice[c] + 1]++;
  }
  for (int64_t e = 0; e < E; e++) count[e + 1] += count[e];
  for (int64_t c = 0; c < n; c++) row[c] = count[choice[c]]++;
  /* count[e] is now expert e's end, the next one's first row: shift back */
  for (int64_t e = E; e > 0; e--) count[e] = count[e - 1];
  count[0] = 0;
  return -1;
}

/* The slots of sequence b's choices (idx as doubles, integral). */
static const char *moe_slots(Interp *in, const double *idx, int64_t T, int64_t K, int64_t E, int64_t cap, int64_t *slot,
                             int64_t *count) {
  int64_t *choice = xalloc_calloc((size_t)(T * K + 1), sizeof(int64_t));
  for (int64_t p = 0; p < T * K; p++) choice[p] = idx[p] >= -1 && idx[p] <= (double)E ? (int64_t)idx[p] : -1;
  int64_t bad = interp_moe_slots(choice, T, K, E, cap, slot, count);
  free(choice);
  return bad >= 0 ? fail(in, "moe: expert %g is outside [0, %" PRId64 ")", idx[bad], E) : NULL;
}

/* ATTN_MERGE (ir_ops.h): the blocks' packed outputs merged by their
 * log-sum-exp, row by row. */
static const char *exec_attn_merge(Run *r, const IrNode *n, double *out) {
  int64_t Dv = n->dims[3] - 1, rows = ir_numel(n) / (Dv + 1);
  for (int64_t t = 0; t < rows; t++) {
    double m = -INFINITY;
    for (int k = 0; k < n->nin; k++) {
      double l = r->val[n->in[k]][t * (Dv + 1) + Dv];
      if (l > m) m = l;
    }
    double *o = out + t * (Dv + 1), sum = 0;
    for (int64_t c = 0; c <= Dv; c++) o[c] = 0;
    if (m == -INFINITY) {
      o[Dv] = -INFINITY;
      continue;
    }
    for (int k = 0; k < n->nin; k++) sum += exp(r->val[n->in[k]][t * (Dv + 1) + Dv] - m);
    double lse = m + log(sum);
    for (int k = 0; k < n->nin; k++) {
      const double *a = r->val[n->in[k]] + t * (Dv + 1);
      double w = exp(a[Dv] - lse);
      for (int64_t c = 0; c < Dv; c++) o[c] += w * a[c];
    }
    o[Dv] = lse;
  }
  return NULL;
}

/* ATTENTION and ATTENTION_BWD in fp64, the scores a row at a time: the
 * definition of the op, which every back end's tiled kernels are held to. */
static const char *exec_attention(Run *r, const IrNode *n, double *out) {
  const IrGraph *g = r->g;
  const IrNode *qn = &g->nodes[n->in[0]], *kn = &g->nodes[n->in[1]], *vn = &g->nodes[n->in[2]];
  int64_t B = qn->dims[0], H = qn->dims[1], T = qn->dims[2], D = qn->dims[3];
  int64_t Hk = kn->dims[1], S = kn->dims[2], Dv = vn->dims[3], rep = H / Hk;
  const double *Q = r->val[n->in[0]], *K = r->val[n->in[1]], *V = r->val[n->in[2]];
  int bwd = n->op == IR_ATTENTION_BWD;
  const double *O = bwd ? r->val[n->in[3]] : NULL, *dO = bwd ? r->val[n->in[4]] : NULL;
  double *p = xalloc_malloc(sizeof(double) * (size_t)(S > 0 ? S : 1));
  double *dq = out, *dk = out + B * H * T * D, *dv = dk + B * Hk * S * D;
  if (bwd) memset(out, 0, sizeof(double) * (size_t)ir_numel(n));
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++) {
      int64_t kh = (b * Hk + h / rep) * S;
      for (int64_t t = 0; t < T; t++) {
        const double *q = Q + ((b * H + h) * T + t) * D;
        int64_t rp = zigzag_row_pos(r->in, n->attr[1], T, t);
        double mx = -INFINITY;
        for (int64_t j = 0; j < S; j++) {
          int64_t cp = n->attr[0] ? ring_col_pos(r->in, n->attr[2], n->attr[4], S, j) : 0;
          if (n->attr[0] && (cp > rp || (n->attr[3] > 0 && rp - cp >= n->attr[3]))) {
            p[j] = -INFINITY;
            continue;
          }
          double dot = 0;
          for (int64_t d = 0; d < D; d++) dot += q[d] * K[(kh + j) * D + d];
          p[j] = n->fattr * dot;
          if (p[j] > mx) mx = p[j];
        }
        double sum = 0;
        for (int64_t j = 0; j < S; j++) sum += p[j] == -INFINITY ? 0 : exp(p[j] - mx);
        double lse = mx == -INFINITY ? -INFINITY : mx + log(sum);
        int64_t row = (b * H + h) * T + t;
        /* the backward's P from the lse of `out` (ir_ops.h): a ring block's is the merged one */
        if (bwd) lse = O[row * (Dv + 1) + Dv];
        for (int64_t j = 0; j < S; j++) p[j] = p[j] == -INFINITY || lse == -INFINITY ? 0 : exp(p[j] - lse);
        if (!bwd) {
          double *o = out + row * (Dv + 1);
          for (int64_t e = 0; e < Dv; e++) {
            double acc = 0;
            for (int64_t j = 0; j < S; j++) acc += p[j] * V[(kh + j) * Dv + e];
            o[e] = acc;
          }
          o[Dv] = lse;
          continue;
        }
        const double *o = O + row * (Dv + 1), *dor = dO + row * (Dv + 1);
        double Dt = -dor[Dv];
        for (int64_t e = 0; e < Dv; e++) Dt += dor[e] * o[e];
        for (int64_t j = 0; j < S; j++) {
          if (p[j] == 0) continue;
          double dp = 0;
          for (int64_t e = 0; e < Dv; e++) dp += dor[e] * V[(kh + j) * Dv + e];
          double ds = p[j] * (dp - Dt) * n->fattr;
          for (int64_t d = 0; d < D; d++) {
            dq[row * D + d] += ds * K[(kh + j) * D + d];
            dk[(kh + j) * D + d] += ds * q[d];
          }
          for (int64_t e = 0; e < Dv; e++) dv[(kh + j) * Dv + e] += p[j] * dor[e];
        }
      }
    }
  free(p);
  return NULL;
}

/* CONV2D and its gradients, POOL2D and its gradient: conv.c's fp64 loops,
 * the definition the back ends are held to. */
static const char *exec_conv(Run *r, const IrNode *n, double *out) {
  const double *A = r->val[n->in[0]], *B = n->nin > 1 ? r->val[n->in[1]] : NULL;
  if (n->op == IR_POOL2D || n->op == IR_POOL2D_BWD) {
    PoolShape s = ir_pool_shape(r->g, n);
    if (n->op == IR_POOL2D) pool_forward_f64(&s, A, out);
    else pool_backward_f64(&s, A, B, out);
    return NULL;
  }
  ConvShape s = ir_conv_shape(r->g, n);
  if (n->op == IR_CONV2D) conv_forward_f64(&s, A, B, out);
  else if (n->op == IR_CONV2D_BWD_DATA) conv_bwd_data_f64(&s, A, B, out);
  else conv_bwd_filter_f64(&s, A, B, out);
  return NULL;
}

/* The packed rows of all B T K choices (idx as doubles, integral) in slot,
 * as interp_moe_rows; count [E + 1] scratch. */
static const char *moe_rows(Interp *in, const double *idx, int64_t n, int64_t E, int64_t *slot, int64_t *count) {
  int64_t *choice = xalloc_calloc((size_t)(n + 1), sizeof(int64_t));
  for (int64_t p = 0; p < n; p++) choice[p] = idx[p] >= -1 && idx[p] <= (double)E ? (int64_t)idx[p] : -1;
  int64_t bad = interp_moe_rows(choice, n, E, slot, count);
  free(choice);
  return bad >= 0 ? fail(in, "moe: expert %g is outside [0, %" PRId64 ")", idx[bad], E) : NULL;
}

/* MOE_DISPATCH, MOE_COMBINE, MOE_GATE_GRAD (ir_ops.h), sequence by sequence;
 * the packed form's rows are numbered over all sequences (cap = 0: a row's
 * place is b E cap + slot = slot). */
static const char *exec_moe(Run *r, const IrNode *n, double *out) {
  const IrGraph *g = r->g;
  const IrNode *idxn = &g->nodes[n->in[n->op == IR_MOE_GATE_GRAD ? 2 : 1]];
  const IrNode *wide = n->op == IR_MOE_DISPATCH ? n : &g->nodes[n->in[n->op == IR_MOE_COMBINE ? 0 : 1]];
  int64_t B = idxn->dims[0], T = idxn->dims[1], K = idxn->dims[2];
  int packed = wide->rank == 2;
  int64_t E = packed ? n->attr[0] : wide->dims[1], cap = packed ? 0 : wide->dims[2], C = wide->dims[wide->rank - 1];
  const double *A = r->val[n->in[0]], *I = r->val[idxn - g->nodes];
  const double *W = n->op == IR_MOE_GATE_GRAD ? r->val[n->in[1]] : r->val[n->in[2]];
  int64_t *rows = packed ? xalloc_calloc((size_t)(B * T * K + 1), sizeof(int64_t)) : NULL;
  int64_t *slot = xalloc_calloc((size_t)(T * K + E + 1), sizeof(int64_t)), *count = slot + T * K;
  const char *e = packed ? moe_rows(r->in, I, B * T * K, E, rows, count) : NULL;
  memset(out, 0, sizeof(double) * (size_t)ir_numel(n));
  for (int64_t b = 0; b < B && !e; b++) {
    if (packed) memcpy(slot, rows + b * T * K, sizeof(int64_t) * (size_t)(T * K));
    else e = moe_slots(r->in, I + b * T * K, T, K, E, cap, slot, count);
    for (int64_t p = 0; p < T * K && !e; p++) {
      if (slot[p] < 0) continue;
      int64_t t = p / K;
      double *tok = NULL; /* [C] of the token's side */
      const double *wide_row = NULL;
      switch (n->op) {
      case IR_MOE_DISPATCH: {
        double w = W[b * T * K + p], *dst = out + (b * E * cap + slot[p]) * C;
        const double *src = A + (b * T + t) * C;
        for (int64_t c = 0; c < C; c++) dst[c] = w * src[c];
        break;
      }
      case IR_MOE_COMBINE: {
        double w = W[b * T * K + p];
        tok = out + (b * T + t) * C;
        wide_row = A + (b * E * cap + slot[p]) * C;
        for (int64_t c = 0; c < C; c++) tok[c] += w * wide_row[c];
        break;
      }
      default: {
        const double *a = A + (b * T + t) * C;
        wide_row = W + (b * E * cap + slot[p]) * C;
        double dot = 0;
        for (int64_t c = 0; c < C; c++) dot += a[c] * wide_row[c];
        out[b * T * K + p] = dot;
        break;
      }
      }
    }
  }
  free(slot);
  free(rows);
  return e;
}

/* The first global index of this rank's vocabulary shard (attr 1 + group), or 0. */
static int64_t vocab_offset(const Interp *in, int64_t attr, int64_t local_rows) {
  return attr ? (int64_t)group_rank(in, attr - 1) * local_rows : 0;
}

/* A value stored in 16 bits (mixed precision's storage, ir_ops.h): the
 * back ends compute in fp32 and round the stored result, so the result is
 * rounded to fp32 and then to the 16-bit type, as they store it. */
static void store_16bit(const IrNode *n, double *v) {
  int64_t N = ir_numel(n);
  for (int64_t i = 0; i < N; i++)
    v[i] = n->dtype == DT_BF16 ? half_bf16_to_f32(half_bf16_from_f32((float)v[i])) : half_to_f32(half_from_f32((float)v[i]));
}

/* LINEAR_CE, LINEAR_LSE and their gradients (ir_ops.h), row by row in
 * double: the logits of one row at a time, never all of them. LINEAR_CE's
 * rows lose their target's logit and its gradient the one-hot; LINEAR_LSE's
 * take the shard's columns before a padded vocabulary's padding. */
static const char *exec_linear_ce(Run *r, const IrNode *n, double *out) {
  const IrGraph *g = r->g;
  const IrNode *xn = &g->nodes[n->in[0]], *wn = &g->nodes[n->in[1]];
  const double *X = r->val[n->in[0]], *W = r->val[n->in[1]];
  int ce = ir_linear_targets(n->op);
  int fwd = ir_linear_role(n->op) == IR_LINEAR_ROWS, dx = ir_linear_role(n->op) == IR_LINEAR_DX;
  const double *Tg = ce ? r->val[n->in[2]] : NULL;
  int rows_w = n->attr[0] != 0;
  int64_t C = xn->dims[xn->rank - 1], V = wn->dims[rows_w ? 0 : 1], P = ir_numel(xn) / C;
  int64_t valid = ce ? V : ir_vocab_prefix(n->attr[2], vocab_offset(r->in, n->attr[1], V), V);
  double *z = calloc((size_t)V + 1, sizeof(double));
  if (!z) return fail(r->in, "%s: out of memory", ir_op_name(n->op));
  if (!fwd) memset(out, 0, sizeof(double) * (size_t)ir_numel(n));
  for (int64_t p = 0; p < P; p++) {
    int64_t tgt = Tg ? (int64_t)Tg[p] : -1;
    if (Tg && (tgt < 0 || tgt >= V)) {
      free(z);
      return fail(r->in, "%s target %" PRId64 " is outside [0, %" PRId64 ")", ir_op_name(n->op), tgt, V);
    }
    const double *xr = X + p * C;
    for (int64_t v = 0; v < valid; v++) {
      double dot = 0;
      for (int64_t k = 0; k < C; k++) dot += xr[k] * (rows_w ? W[v * C + k] : W[k * V + v]);
      z[v] = dot;
    }
    double lse = valid > 0 ? row_lse(z, valid) : -INFINITY;
    if (fwd) {
      out[p] = ce ? lse - z[tgt] : lse;
      continue;
    }
    double dy = r->val[n->in[ce ? 4 : 3]][p];
    for (int64_t v = 0; v < valid; v++) {
      double gv = dy * (exp(z[v] - lse) - (v == tgt ? 1.0 : 0.0));
      if (dx) {
        double *o = out + p * C;
        for (int64_t k = 0; k < C; k++) o[k] += gv * (rows_w ? W[v * C + k] : W[k * V + v]);
      } else {
        for (int64_t k = 0; k < C; k++) out[rows_w ? v * C + k : k * V + v] += gv * xr[k];
      }
    }
  }
  free(z);
  return NULL;
}

static const char *exec_node(Run *r, int id, double *out) {
  Interp *in = r->in;
  const IrGraph *g = r->g;
  const IrNode *n = &g->nodes[id];
  int64_t N = ir_numel(n);
  const IrNode *x = n->nin > 0 ? &g->nodes[n->in[0]] : NULL;
  const double *X = n->nin > 0 ? r->val[n->in[0]] : NULL;
  int64_t idx[IR_MAX_RANK] = {0};
  switch (n->op) {
  case IR_CONST: out[0] = n->fattr; return NULL;
  case IR_FILL:
    for (int64_t i = 0; i < N; i++) out[i] = n->fattr;
    return NULL;
  case IR_IOTA:
    for (int64_t i = 0; i < N; i++) out[i] = (double)i;
    return NULL;
  case IR_NEG:
  case IR_RELU:
  case IR_GELU:
  case IR_SILU:
  case IR_SIGMOID:
  case IR_TANH:
  case IR_EXP:
  case IR_LOG:
  case IR_SQRT:
  case IR_RSQRT:
  case IR_ABS:
  case IR_SQUARE:
  case IR_POWS:
    for (int64_t i = 0; i < N; i++) unary_value(n->op, n->fattr, X[i], &out[i]);
    return NULL;
  case IR_ACT_GRAD: {
    const double *dy = r->val[n->in[1]];
    for (int64_t i = 0; i < N; i++) {
      double d;
      if (unary_deriv((IrOp)n->attr[0], n->fattr, X[i], &d))
        return fail(in, "act_grad of %s is not an elementwise derivative", ir_op_name((IrOp)n->attr[0]));
      out[i] = d * dy[i];
    }
    return NULL;
  }
  case IR_ADD:
  case IR_SUB:
  case IR_MUL:
  case IR_DIV:
  case IR_MAXIMUM:
  case IR_MINIMUM: {
    const IrNode *b = &g->nodes[n->in[1]];
    const double *B = r->val[n->in[1]];
    int64_t sa[IR_MAX_RANK], sb[IR_MAX_RANK];
    bcast_strides(x->rank, x->dims, n->rank, sa);
    bcast_strides(b->rank, b->dims, n->rank, sb);
    for (int64_t i = 0; i < N; i++) {
      out[i] = binary_value(n->op, X[idx_dot(n->rank, idx, sa)], B[idx_dot(n->rank, idx, sb)]);
      idx_next(n->rank, n->dims, idx);
    }
    return NULL;
  }
  case IR_MATMUL: return exec_matmul(r, n, out);
  case IR_REDUCE_SUM:
  case IR_REDUCE_MEAN:
  case IR_REDUCE_MAX: {
    int64_t outer, len, inner;
    axis_view(x, n->attr[0], &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
      for (int64_t k = 0; k < inner; k++) {
        double acc = n->op == IR_REDUCE_MAX ? -INFINITY : 0;
        for (int64_t j = 0; j < len; j++) {
          double v = X[(o * len + j) * inner + k];
          if (n->op == IR_REDUCE_MAX) acc = v > acc ? v : acc;
          else acc += v;
        }
        out[o * inner + k] = n->op == IR_REDUCE_MEAN ? acc / (double)len : acc;
      }
    return NULL;
  }
  case IR_EXPAND: {
    int64_t s[IR_MAX_RANK];
    bcast_strides(x->rank, x->dims, n->rank, s);
    for (int64_t i = 0; i < N; i++) {
      out[i] = X[idx_dot(n->rank, idx, s)];
      idx_next(n->rank, n->dims, idx);
    }
    return NULL;
  }
  case IR_SUM_TO: {
    int64_t s[IR_MAX_RANK];
    bcast_strides(n->rank, n->dims, x->rank, s);
    memset(out, 0, sizeof(double) * (size_t)N);
    int64_t nx = ir_numel(x);
    for (int64_t i = 0; i < nx; i++) {
      out[idx_dot(x->rank, idx, s)] += X[i];
      idx_next(x->rank, x->dims, idx);
    }
    return NULL;
  }
  case IR_SOFTMAX:
  case IR_LOG_SOFTMAX: {
    int64_t outer, len, inner;
    axis_view(x, n->attr[0], &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
      for (int64_t k = 0; k < inner; k++) {
        double mx = -INFINITY, s = 0;
        for (int64_t j = 0; j < len; j++) {
          double v = X[(o * len + j) * inner + k];
          mx = v > mx ? v : mx;
        }
        for (int64_t j = 0; j < len; j++) s += exp(X[(o * len + j) * inner + k] - mx);
        for (int64_t j = 0; j < len; j++) {
          int64_t at = (o * len + j) * inner + k;
          out[at] = n->op == IR_SOFTMAX ? exp(X[at] - mx) / s : X[at] - mx - log(s);
        }
      }
    return NULL;
  }
  case IR_SOFTMAX_BWD:
  case IR_LOG_SOFTMAX_BWD: {
    /* softmax: y * (dy - sum(y * dy)); log_softmax: dy - exp(y) * sum(dy) */
    const double *dy = r->val[n->in[1]];
    int64_t outer, len, inner;
    axis_view(x, n->attr[0], &outer, &len, &inner);
    for (int64_t o = 0; o < outer; o++)
      for (int64_t k = 0; k < inner; k++) {
        double s = 0;
        for (int64_t j = 0; j < len; j++) {
          int64_t at = (o * len + j) * inner + k;
          s += n->op == IR_SOFTMAX_BWD ? X[at] * dy[at] : dy[at];
        }
        for (int64_t j = 0; j < len; j++) {
          int64_t at = (o * len + j) * inner + k;
          out[at] = n->op == IR_SOFTMAX_BWD ? X[at] * (dy[at] - s) : dy[at] - exp(X[at]) * s;
        }
      }
    return NULL;
  }
  case IR_ALL_REDUCE: return exec_collective(r, n, x, X, out);
  case IR_RESHAPE:
  case IR_CAST:
    if (n->op == IR_CAST && !sem_dtype_is_float(n->dtype) && sem_dtype_is_float(x->dtype))
      for (int64_t i = 0; i < N; i++) out[i] = trunc(X[i]);
    else memcpy(out, X, sizeof(double) * (size_t)N);
    return NULL;
  case IR_ALL_GATHER:
  case IR_REDUCE_SCATTER:
  case IR_SHARD_SLICE:
  case IR_ALL_TO_ALL:
  case IR_COPY_TO_GROUP: return exec_collective(r, n, x, X, out);
  case IR_PICK:
  case IR_PICK_BWD: {
    const IrNode *t = &g->nodes[n->in[1]];
    const double *Tg = r->val[n->in[1]];
    int64_t V = n->op == IR_PICK ? x->dims[x->rank - 1] : n->dims[n->rank - 1], P = ir_numel(t);
    int64_t off = vocab_offset(in, n->attr[0], V);
    if (n->op == IR_PICK_BWD) memset(out, 0, sizeof(double) * (size_t)N);
    for (int64_t p = 0; p < P; p++) {
      int64_t k = (int64_t)Tg[p] - off;
      int inside = k >= 0 && k < V;
      if (n->op == IR_PICK) out[p] = inside ? X[p * V + k] : 0.0;
      else if (inside) out[p * V + k] = X[p];
    }
    return NULL;
  }
  case IR_TRANSPOSE: {
    int64_t xs[IR_MAX_RANK], s[IR_MAX_RANK];
    row_strides(x->rank, x->dims, xs);
    for (int i = 0; i < n->rank; i++) s[i] = xs[n->attr[i]];
    for (int64_t i = 0; i < N; i++) {
      out[i] = X[idx_dot(n->rank, idx, s)];
      idx_next(n->rank, n->dims, idx);
    }
    return NULL;
  }
  case IR_SLICE: {
    /* output axis j is input axis kept[j]; dropped axes sit at their start */
    int64_t xs[IR_MAX_RANK], s[IR_MAX_RANK], base = 0;
    row_strides(x->rank, x->dims, xs);
    for (int a = 0, j = 0; a < x->rank; a++) {
      base += n->attr[a] * xs[a];
      if (!n->attr[8 + a]) s[j++] = xs[a];
    }
    for (int64_t i = 0; i < N; i++) {
      out[i] = X[base + idx_dot(n->rank, idx, s)];
      idx_next(n->rank, n->dims, idx);
    }
    return NULL;
  }
  case IR_PAD: {
    int64_t os[IR_MAX_RANK], base = 0;
    row_strides(n->rank, n->dims, os);
    for (int a = 0; a < n->rank; a++) base += n->attr[a] * os[a];
    memset(out, 0, sizeof(double) * (size_t)N);
    int64_t nx = ir_numel(x);
    for (int64_t i = 0; i < nx; i++) {
      out[base + idx_dot(x->rank, idx, os)] = X[i];
      idx_next(x->rank, x->dims, idx);
    }
    return NULL;
  }
  case IR_CONCAT: {
    int64_t outer, len, inner, at = 0;
    axis_view(n, n->attr[0], &outer, &len, &inner);
    for (int k = 0; k < n->nin; k++) {
      const IrNode *p = &g->nodes[n->in[k]];
      const double *P = r->val[n->in[k]];
      int64_t plen = p->dims[n->attr[0]];
      for (int64_t o = 0; o < outer; o++)
        memcpy(out + (o * len + at) * inner, P + o * plen * inner, sizeof(double) * (size_t)(plen * inner));
      at += plen;
    }
    return NULL;
  }
  case IR_EMBEDDING: {
    const IrNode *ids = &g->nodes[n->in[1]];
    const double *I = r->val[n->in[1]];
    int64_t V = x->dims[0], C = x->dims[1], ni = ir_numel(ids);
    int64_t off = vocab_offset(in, n->attr[0], V), total = n->attr[0] ? V * group_size(in, n->attr[0] - 1) : V;
    for (int64_t i = 0; i < ni; i++) {
      int64_t row = (int64_t)I[i];
      if (row < 0 || row >= total) return fail(in, "embedding id %" PRId64 " is outside [0, %" PRId64 ")", row, total);
      row -= off;
      /* a vocabulary shard contributes zeros for the rows other ranks hold */
      if (row < 0 || row >= V) memset(out + i * C, 0, sizeof(double) * (size_t)C);
      else memcpy(out + i * C, X + row * C, sizeof(double) * (size_t)C);
    }
    return NULL;
  }
  case IR_EMBEDDING_BWD: {
    const IrNode *ids = &g->nodes[n->in[1]];
    const double *I = r->val[n->in[1]];
    int64_t V = n->dims[0], C = n->dims[1], ni = ir_numel(ids);
    int64_t off = vocab_offset(in, n->attr[0], V), total = n->attr[0] ? V * group_size(in, n->attr[0] - 1) : V;
    memset(out, 0, sizeof(double) * (size_t)N);
    for (int64_t i = 0; i < ni; i++) {
      int64_t row = (int64_t)I[i];
      if (row < 0 || row >= total) return fail(in, "embedding id %" PRId64 " is outside [0, %" PRId64 ")", row, total);
      row -= off;
      if (row < 0 || row >= V) continue;
      for (int64_t c = 0; c < C; c++) out[row * C + c] += X[i * C + c];
    }
    return NULL;
  }
  case IR_CAUSAL_MASK: {
    if (n->rank < 2) return fail(in, "causal_mask needs a matrix");
    /* rows may be this rank's zigzag chunks of the sequence, keys the ring's blocks (context parallelism) */
    int64_t rows = n->dims[n->rank - 2], cols = n->dims[n->rank - 1];
    for (int64_t i = 0; i < N; i++) {
      int64_t row = zigzag_row_pos(in, n->attr[0], rows, idx[n->rank - 2]);
      int64_t col = ring_col_pos(in, n->attr[1], 0, cols, idx[n->rank - 1]);
      out[i] = col > row ? n->fattr : X[i];
      idx_next(n->rank, n->dims, idx);
    }
    return NULL;
  }
  case IR_VOCAB_MASK: {
    /* columns at or past the vocabulary (its padding) read as fattr */
    int64_t cols = n->dims[n->rank - 1];
    int64_t off = vocab_offset(in, n->attr[0], cols);
    for (int64_t i = 0; i < N; i++) out[i] = off + i % cols >= n->attr[1] ? n->fattr : X[i];
    return NULL;
  }
  case IR_ROPE: return exec_rope(in, n, X, out);
  case IR_REPEAT_KV:
  case IR_REPEAT_KV_BWD: {
    /* output head h of REPEAT_KV reads head h / rep; the backward sums them */
    int64_t rep = n->attr[0], B = x->dims[0], Hx = x->dims[1], TD = x->dims[2] * x->dims[3];
    int64_t Ho = n->dims[1];
    if (n->op == IR_REPEAT_KV) {
      for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Ho; h++)
          memcpy(out + (b * Ho + h) * TD, X + (b * Hx + h / rep) * TD, sizeof(double) * (size_t)TD);
    } else {
      memset(out, 0, sizeof(double) * (size_t)N);
      for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hx; h++)
          for (int64_t k = 0; k < TD; k++) out[(b * Ho + h / rep) * TD + k] += X[(b * Hx + h) * TD + k];
    }
    return NULL;
  }
  case IR_CROSS_ENTROPY:
  case IR_CROSS_ENTROPY_BWD: {
    const IrNode *t = &g->nodes[n->in[1]];
    const double *Tg = r->val[n->in[1]];
    int64_t V = x->dims[x->rank - 1], P = ir_numel(t);
    double total = 0, scale = n->op == IR_CROSS_ENTROPY_BWD ? r->val[n->in[2]][0] / (double)P : 0;
    for (int64_t p = 0; p < P; p++) {
      int64_t tgt = (int64_t)Tg[p];
      if (tgt < 0 || tgt >= V) return fail(in, "cross_entropy target %" PRId64 " is outside [0, %" PRId64 ")", tgt, V);
      const double *row = X + p * V;
      double lse = row_lse(row, V);
      if (n->op == IR_CROSS_ENTROPY) {
        total += lse - row[tgt];
      } else {
        for (int64_t v = 0; v < V; v++) out[p * V + v] = scale * (exp(row[v] - lse) - (v == tgt ? 1.0 : 0.0));
      }
    }
    if (n->op == IR_CROSS_ENTROPY) out[0] = total / (double)P;
    return NULL;
  }
  case IR_DROPOUT: {
    /* Keep with probability 1 - p, scaled by 1 / (1 - p). The mask is a pure
     * function of (init seed, stream, layer, element), so a recomputed
     * dropout and its backward see the same mask. */
    double p = n->fattr;
    if (p <= 0) {
      memcpy(out, X, sizeof(double) * (size_t)N);
      return NULL;
    }
    uint64_t base = interp_hash_name(in->seed ^ ((uint64_t)n->attr[0] * 0x9E3779B97F4A7C15ull), "dropout", r->layer);
    for (int64_t i = 0; i < N; i++) {
      uint64_t st = base ^ ((uint64_t)i * 0xD1B54A32D192ED03ull);
      out[i] = p < 1 && interp_uniform01(&st) >= p ? X[i] / (1.0 - p) : 0.0;
    }
    return NULL;
  }
  case IR_CALL: return exec_call(r, n, out);
  case IR_EXTERN:
  case IR_EXTERN_GRAD: return exec_extern(r, n, out);
  case IR_SEND: {
    if (group_size(in, n->attr[0]) > 1 && in->comm.send) {
      const char *err = in->comm.send(in->comm.ctx, (IrGroup)n->attr[0], (int)n->attr[1], X, ir_numel(x));
      memcpy(out, X, sizeof(double) * (size_t)N);
      return err ? fail(in, "send over %s: %s", ir_group_name((IrGroup)n->attr[0]), err) : NULL;
    }
    Msg *msg = xalloc_calloc(1, sizeof *msg);
    msg->group = (int)n->attr[0];
    msg->t = tensor_of(x, dup_values(X, ir_numel(x)));
    if (in->mail_tail) in->mail_tail->next = msg;
    else in->mail_head = msg;
    in->mail_tail = msg;
    memcpy(out, X, sizeof(double) * (size_t)N);
    return NULL;
  }
  case IR_RECV: {
    if (group_size(in, n->attr[0]) > 1 && in->comm.recv) {
      const char *err = in->comm.recv(in->comm.ctx, (IrGroup)n->attr[0], (int)n->attr[1], out, N);
      return err ? fail(in, "recv over %s: %s", ir_group_name((IrGroup)n->attr[0]), err) : NULL;
    }
    Msg **at = &in->mail_head, *prev = NULL;
    while (*at && (*at)->group != n->attr[0]) {
      prev = *at;
      at = &(*at)->next;
    }
    Msg *msg = *at;
    if (!msg) return fail(in, "recv over %s: no message was sent", ir_group_name((IrGroup)n->attr[0]));
    if (dims_numel(msg->t.rank, msg->t.dims) != N) return fail(in, "recv: the message has another size");
    *at = msg->next;
    if (in->mail_tail == msg) in->mail_tail = prev;
    memcpy(out, msg->t.data, sizeof(double) * (size_t)N);
    free(msg->t.data);
    free(msg);
    return NULL;
  }
  case IR_TOPK:
  case IR_TAKE:
  case IR_TAKE_BWD:
  case IR_ONE_HOT: return exec_router(r, n, out);
  case IR_MOE_DISPATCH:
  case IR_MOE_COMBINE:
  case IR_MOE_GATE_GRAD: return exec_moe(r, n, out);
  case IR_MOE_EXPERT_IDS: return exec_expert_ids(r, n, out);
  case IR_GROUPED_MM:
  case IR_GROUPED_MM_WGRAD: return exec_grouped_mm(r, n, out);
  case IR_ATTENTION:
  case IR_ATTENTION_BWD: return exec_attention(r, n, out);
  case IR_ATTN_MERGE: return exec_attn_merge(r, n, out);
  case IR_CONV2D:
  case IR_CONV2D_BWD_DATA:
  case IR_CONV2D_BWD_FILTER:
  case IR_POOL2D:
  case IR_POOL2D_BWD: return exec_conv(r, n, out);
  case IR_AUX_LOSS:
    /* the value a forward adds (a recomputation in a backward is not counted again) */
    if (!in->bwd_depth && !(g->fb_split > 0 && id >= g->fb_split)) {
      in->aux_sum += n->fattr * r->val[n->in[1]][0];
      in->aux_seen = 1;
    }
    memcpy(out, r->val[n->in[0]], sizeof(double) * (size_t)ir_numel(n));
    return NULL;
  case IR_LINEAR_CE:
  case IR_LINEAR_CE_BWD:
  case IR_LINEAR_CE_BWD_W:
  case IR_LINEAR_LSE:
  case IR_LINEAR_LSE_BWD:
  case IR_LINEAR_LSE_BWD_W: return exec_linear_ce(r, n, out);
  case IR_LOSS_SEED: out[0] = r->in->loss_seed; return NULL;
  case IR_TRAINING: out[0] = r->in->evaluating ? 0.0 : 1.0; return NULL;
  case IR_STATE_UPDATE:
    /* the state parameter's new contents, in a forward (AUX_LOSS's rule); this run's PARAM node keeps its copy */
    if (!in->bwd_depth && !(g->fb_split > 0 && id >= g->fb_split)) {
      double *st = interp_param(in, (int)g->nodes[n->in[2]].attr[0], r->layer, NULL);
      if (!st) return fail(in, "state_update: parameter %s has no copy %" PRId64, in->m->params[g->nodes[n->in[2]].attr[0]].name, r->layer);
      memcpy(st, r->val[n->in[1]], sizeof(double) * (size_t)ir_numel(&g->nodes[n->in[1]]));
    }
    memcpy(out, r->val[n->in[0]], sizeof(double) * (size_t)ir_numel(n));
    return NULL;
  case IR_INPUT:
  case IR_PARAM:
  case IR_ARG:
  case IR_OP_COUNT: break;
  }
  return fail(in, "%s cannot be executed here", ir_op_name(n->op));
}

/* Leaves that alias storage the run does not own. */
static const char *bind_leaf(Run *r, int id) {
  Interp *in = r->in;
  const IrNode *n = &r->g->nodes[id];
  int64_t k = n->attr[0];
  if (n->op == IR_PARAM) {
    if (k < 0 || k >= in->m->nparams) return fail(in, "unknown parameter");
    int64_t numel;
    r->val[id] = interp_param(in, (int)k, r->layer, &numel);
    if (!r->val[id]) return fail(in, "parameter %s has no copy %" PRId64, in->m->params[k].name, r->layer);
    if (numel != ir_numel(n)) return fail(in, "parameter %s: node and parameter sizes differ", in->m->params[k].name);
  } else if (n->op == IR_INPUT) {
    if (k < 0 || k >= in->m->ninputs || !in->inputs[k]) return fail(in, "model input %" PRId64 " is not set", k);
    r->val[id] = in->inputs[k];
  } else {
    if (k < 0 || k >= r->nargs || !r->args[k].data) return fail(in, "argument %" PRId64 " is not given", k);
    if (dims_numel(r->args[k].rank, r->args[k].dims) != ir_numel(n))
      return fail(in, "argument %" PRId64 " of graph %s has the wrong size", k, r->g->name);
    r->val[id] = r->args[k].data;
  }
  return NULL;
}

/* A run of a graph, in three steps so that a step graph cut by autodiff
 * (IrGraph.fb_split) can stop between its forward and its backward. */
static Run *run_begin(Interp *in, int gi, int64_t layer, const InterpTensor *args, int nargs, int frame) {
  const IrGraph *g = in->m->graphs[gi];
  Run *r = xalloc_calloc(1, sizeof *r);
  r->in = in;
  r->gi = gi;
  r->g = g;
  r->layer = layer;
  r->frame = frame;
  r->nargs = nargs;
  /* a training step's argument 0 is its seed, d loss (autodiff.h) */
  if (g->fb_split > 0 && nargs > 0 && args[0].data) in->loss_seed = args[0].data[0];
  if (frame && nargs > 0) {
    r->argcopy = xalloc_calloc((size_t)nargs, sizeof(InterpTensor));
    for (int k = 0; k < nargs; k++) {
      r->argcopy[k] = args[k];
      if (args[k].data) r->argcopy[k].data = dup_values(args[k].data, dims_numel(args[k].rank, args[k].dims));
    }
    r->args = r->argcopy;
  } else {
    r->args = args;
  }
  r->val = xalloc_calloc((size_t)g->nnodes + 1, sizeof(double *));
  r->owned = xalloc_calloc((size_t)g->nnodes + 1, 1);
  /* last use of each value, so it can be freed early; outputs live on */
  r->last = xalloc_calloc((size_t)g->nnodes + 1, sizeof(int));
  for (int i = 0; i < g->nnodes; i++) {
    r->last[i] = i;
    for (int k = 0; k < g->nodes[i].nin; k++) r->last[g->nodes[i].in[k]] = i;
  }
  for (int k = 0; k < g->noutputs; k++) r->last[g->outputs[k]] = g->nnodes;
  acc_run(in, gi, layer, 1);
  return r;
}

/* Runs nodes r->next .. to-1. */
/* --detect-anomaly: a NaN or +inf in node i's values is an error naming the
 * op, its graph (and layer) and, where the module knows its sources, the
 * .hpd line it comes from. -inf passes: a causal mask writes it on purpose,
 * and the softmax after it turns it into 0. */
static const char *anomaly(Run *r, int i) {
  const IrNode *n = &r->g->nodes[i];
  if (!sem_dtype_is_float(n->dtype)) return NULL;
  int64_t numel = ir_numel(n), bad = 0, first = -1;
  const double *v = r->val[i];
  for (int64_t j = 0; j < numel; j++)
    if (isnan(v[j]) || v[j] == INFINITY) {
      if (first < 0) first = j;
      bad++;
    }
  if (!bad) return NULL;
  const IrModule *m = r->in->m;
  char where[600] = "", layer[48] = "";
  if (n->span.file >= 0 && n->span.file < m->nsources && m->sources && m->sources[n->span.file])
    snprintf(where, sizeof where, ", from %s:%d:%d", m->sources[n->span.file], n->span.line, n->span.col);
  if (r->g->count > 1) snprintf(layer, sizeof layer, " layer %" PRId64, r->layer);
  return fail(r->in, "anomaly: %s %%%d%s%s (graph %s%s%s) made %s at element %" PRId64 " (%" PRId64 " of %" PRId64 " values not finite)",
              ir_op_name(n->op), i, n->name ? " " : "", n->name ? n->name : "", r->g->name, layer, where,
              isnan(v[first]) ? "NaN" : "+inf", first, bad, numel);
}

static const char *run_range(Run *r, int to) {
  Interp *in = r->in;
  const IrGraph *g = r->g;
  int gi = r->gi, *last = r->last;
  const char *e = NULL;
  for (int i = r->next; i < to && !e; i++) {
    const IrNode *n = &g->nodes[i];
    acc_value(in, gi, i, 1);
    if (n->op == IR_PARAM || n->op == IR_INPUT || n->op == IR_ARG) {
      e = bind_leaf(r, i);
      /* the next micro-batch may overwrite it; a state parameter (running
       * statistics) is read as it was when the run began, whatever its
       * STATE_UPDATE writes */
      if (!e && ((r->frame && n->op != IR_PARAM) || (n->op == IR_PARAM && in->m->params[n->attr[0]].state))) {
        r->val[i] = dup_values(r->val[i], ir_numel(n));
        r->owned[i] = 1;
      }
      /* a weight read in 16 bits (precision.h): the runtime's rounded copy */
      if (!e && n->op == IR_PARAM && (n->dtype == DT_BF16 || n->dtype == DT_F16) && !r->owned[i]) {
        r->val[i] = dup_values(r->val[i], ir_numel(n));
        r->owned[i] = 1;
        store_16bit(n, r->val[i]);
      }
    } else {
      r->val[i] = xalloc_calloc((size_t)ir_numel(n), sizeof(double));
      r->owned[i] = 1;
      if (in->has_timer && n->op != IR_CALL) {
        double t0 = in->timer.now(in->timer.user);
        e = exec_node(r, i, r->val[i]);
        in->timer.op(in->timer.user, gi, i, r->layer, t0, in->timer.now(in->timer.user));
      } else e = exec_node(r, i, r->val[i]);
      if (!e && (n->dtype == DT_BF16 || n->dtype == DT_F16)) store_16bit(n, r->val[i]);
      if (!e && in->store_f32 && n->dtype == DT_F32)
        for (int64_t k = 0, N = ir_numel(n); k < N; k++) r->val[i][k] = (double)(float)r->val[i][k];
      if (!e && in->detect_anomaly) e = anomaly(r, i);
      if (last[i] == i) { /* nothing reads it (a CALL kept for its effects) */
        acc_value(in, gi, i, 0);
        free(r->val[i]);
        r->val[i] = NULL;
        r->owned[i] = 0;
      }
    }
    for (int k = 0; k < n->nin; k++) {
      int src = n->in[k];
      if (last[src] == i && r->val[src]) acc_value(in, gi, src, 0);
      if (last[src] == i && r->owned[src]) {
        free(r->val[src]);
        r->owned[src] = 0;
      }
      if (last[src] == i) r->val[src] = NULL;
    }
    r->next = i + 1;
  }
  return e;
}

/* The outputs (when e is NULL and outs is not), the gradients added to the
 * store, then everything the run holds freed. */
static int run_end(Run *r, const char *e, InterpTensor *outs, const char **err) {
  Interp *in = r->in;
  const IrGraph *g = r->g;
  if (!e && outs) {
    for (int k = 0; k < g->noutputs; k++) {
      const IrNode *o = &g->nodes[g->outputs[k]];
      outs[k] = tensor_of(o, dup_values(r->val[g->outputs[k]], ir_numel(o)));
    }
    for (int k = 0; k < g->ngrad_params; k++) {
      int at = g->noutputs - g->ngrad_params + k, p = g->grad_params[k];
      if (ir_numel(&g->nodes[g->outputs[at]]) != ir_param_numel(&in->m->params[p])) {
        e = fail(in, "graph %s: gradient output %d does not match parameter %s", g->name, at, in->m->params[p].name);
        break;
      }
      add_grad(in, p, r->layer, outs[at].data);
    }
    if (e)
      for (int k = 0; k < g->noutputs; k++) {
        free(outs[k].data);
        outs[k].data = NULL;
      }
  }
  for (int i = 0; i < g->nnodes; i++)
    if (r->owned[i]) free(r->val[i]);
  for (int i = 0; i < r->nstash; i++) {
    if (r->stash[i].count) acc_stash(in, r->stash[i].graph, r->stash[i].node, r->stash[i].bytes, 0);
    stash_clear(&r->stash[i]);
  }
  free(r->stash);
  for (int k = 0; r->argcopy && k < r->nargs; k++) free(r->argcopy[k].data);
  free(r->argcopy);
  acc_run(in, r->gi, r->layer, 0);
  free(r->val);
  free(r->owned);
  free(r->last);
  free(r);
  if (e && err) *err = e;
  return e ? -1 : 0;
}

static int run_graph(Interp *in, int gi, int64_t layer, const InterpTensor *args, int nargs, InterpTensor *outs,
                     const char **err) {
  Run *r = run_begin(in, gi, layer, args, nargs, 0);
  const char *e = run_range(r, r->g->nnodes);
  return run_end(r, e, outs, err);
}

struct InterpFrame {
  Run *r;
};

InterpFrame *interp_forward(Interp *in, int graph, const InterpTensor *args, int nargs, const char **err) {
  if (graph < 0 || graph >= in->m->ngraphs) {
    if (err) *err = fail(in, "no graph %d", graph);
    return NULL;
  }
  const IrGraph *g = in->m->graphs[graph];
  if (g->fb_split <= 0) {
    if (err) *err = fail(in, "graph %s is not a training step cut into forward and backward", g->name);
    return NULL;
  }
  Run *r = run_begin(in, graph, 0, args, nargs, 1);
  const char *e = run_range(r, g->fb_split);
  if (e) {
    run_end(r, e, NULL, err);
    return NULL;
  }
  InterpFrame *f = xalloc_calloc(1, sizeof *f);
  f->r = r;
  return f;
}

int interp_backward(InterpFrame *f, InterpTensor *outs, const char **err) {
  Run *r = f->r;
  free(f);
  const char *e = run_range(r, r->g->nnodes);
  return run_end(r, e, outs, err);
}

void interp_frame_free(InterpFrame *f) {
  if (!f) return;
  run_end(f->r, NULL, NULL, NULL);
  free(f);
}

int64_t interp_frame_bytes(const InterpFrame *f) {
  const Run *r = f->r;
  int64_t bytes = 0;
  for (int i = 0; i < r->g->nnodes; i++)
    if (r->owned[i] && r->val[i]) bytes += ir_numel(&r->g->nodes[i]) * (int64_t)sizeof(double);
  for (int i = 0; i < r->nstash; i++)
    for (int64_t k = 0; k < r->stash[i].count * r->stash[i].per_layer; k++)
      bytes += dims_numel(r->stash[i].t[k].rank, r->stash[i].t[k].dims) * (int64_t)sizeof(double);
  return bytes;
}

int interp_run(Interp *in, int graph, int64_t layer, const InterpTensor *args, int nargs, InterpTensor *outs,
               const char **err) {
  if (graph < 0 || graph >= in->m->ngraphs) {
    if (err) *err = fail(in, "no graph %d", graph);
    return -1;
  }
  return run_graph(in, graph, layer, args, nargs, outs, err);
}

int interp_take_aux(Interp *in, double *sum) {
  int seen = in->aux_seen;
  *sum = in->aux_sum;
  in->aux_sum = 0;
  in->aux_seen = 0;
  return seen;
}

double interp_loss(Interp *in) {
  const IrGraph *g = in->m->graphs[0];
  InterpTensor *outs = xalloc_calloc((size_t)g->noutputs, sizeof(InterpTensor));
  const char *err = NULL;
  double loss = NAN;
  if (interp_run(in, 0, 0, NULL, 0, outs, &err) == 0) loss = outs[0].data[0];
  else fprintf(stderr, "hpdl interp: %s\n", err);
  for (int k = 0; k < g->noutputs; k++) free(outs[k].data);
  free(outs);
  return loss;
}
