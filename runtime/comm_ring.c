/* comm_ring.c - the programs' point-to-point helpers (comm_ring.h). Only the Comm's
 * table is called: the CPU program links nothing of libhpdlrt. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_ring.h"

struct CommRingSend {
  void *data;
  void *stage;  /* an exchange started at the send: where its receive lands */
  void *handle; /* ... and the Comm's handle of it */
  int64_t n;
  size_t bytes;
  int offset;
  CommRingSend *next;
};

static int ring_fail(RtErr *e, const char *msg) {
  snprintf(e->msg, sizeof e->msg, "%s", msg);
  return -1;
}

static int type_bytes(CommType t) { return t == COMM_F64 ? 8 : t == COMM_U8 ? 1 : 4; }

static void *mem_alloc(const CommMem *m, size_t bytes) {
  return m->alloc ? m->alloc(m->ctx, bytes ? bytes : 1) : malloc(bytes ? bytes : 1);
}

/* 0, or nonzero when the copy failed */
static int mem_copy(const CommMem *m, void *dst, const void *src, size_t bytes) {
  if (m->copy) return m->copy(m->ctx, dst, src, bytes);
  memcpy(dst, src, bytes);
  return 0;
}

static void mem_release(const CommMem *m, void *p, size_t bytes) {
  if (!p) return;
  if (m->release) m->release(m->ctx, p, bytes ? bytes : 1);
  else free(p);
}

int comm_ring_send(CommRing *r, Comm *c, CommType t, const void *data, int64_t n, int offset, int tag, RtErr *e) {
  CommRingSend *q = calloc(1, sizeof *q);
  size_t bytes = (size_t)n * (size_t)type_bytes(t);
  if (!q || !(q->data = mem_alloc(&r->mem, bytes))) {
    free(q);
    return ring_fail(e, "out of memory for a context-parallel message");
  }
  q->n = n;
  q->bytes = bytes;
  q->offset = offset;
  if (mem_copy(&r->mem, q->data, data, bytes)) {
    mem_release(&r->mem, q->data, bytes);
    free(q);
    return ring_fail(e, "a context-parallel message could not be copied");
  }
  if (c && c->ops->exchange_start && c->size[COMM_CP] > 1) {
    int me = c->rank[COMM_CP], size = c->size[COMM_CP];
    int to = ((me + offset) % size + size) % size, from = ((me - offset) % size + size) % size;
    int rc = -1;
    if ((q->stage = mem_alloc(&r->mem, bytes)))
      rc = c->ops->exchange_start(c, COMM_CP, t, q->data, to, q->stage, from, n, tag, &q->handle, e);
    else
      snprintf(e->msg, sizeof e->msg, "out of memory for a context-parallel message");
    if (rc) { /* not started (1: exchanged at the receive instead), or failed */
      mem_release(&r->mem, q->stage, bytes);
      q->stage = NULL;
      if (rc < 0) {
        mem_release(&r->mem, q->data, bytes);
        free(q);
        return -1;
      }
    }
  }
  if (r->tail) r->tail->next = q;
  else r->head = q;
  r->tail = q;
  return 0;
}

int comm_ring_recv(CommRing *r, Comm *c, CommType t, void *data, int64_t n, int offset, int tag, RtErr *e) {
  CommRingSend *q = r->head;
  if (!q) return ring_fail(e, "a context-parallel receive with no send before it (the ring's transfers do not pair)");
  if (q->offset != -offset || q->n != n) {
    snprintf(e->msg, sizeof e->msg,
             "a context-parallel receive (offset %d, %" PRId64 " values) does not pair with the send before it (offset %d, %" PRId64
             " values)",
             offset, n, q->offset, q->n);
    return -1;
  }
  r->head = q->next;
  if (!r->head) r->tail = NULL;
  if (q->stage) { /* started at the send: wait, then the block out of the ring's buffer */
    int rc = c->ops->exchange_wait(c, q->handle, e);
    if (!rc && mem_copy(&r->mem, data, q->stage, q->bytes))
      rc = ring_fail(e, "a context-parallel message could not be copied");
    mem_release(&r->mem, q->stage, q->bytes);
    mem_release(&r->mem, q->data, q->bytes);
    free(q);
    return rc;
  }
  int me = c->rank[COMM_CP], size = c->size[COMM_CP];
  int to = ((me + q->offset) % size + size) % size, from = ((me + offset) % size + size) % size;
  int rc;
  if (c->ops->group) {
    rc = c->ops->group(c, 1, e);
    if (rc == 0) rc = c->ops->send(c, COMM_CP, t, q->data, n, to, tag, e);
    if (rc == 0) rc = c->ops->recv(c, COMM_CP, t, data, n, from, tag, e);
    RtErr ge;
    int end = c->ops->group(c, 0, &ge);
    if (rc == 0 && end) rc = ring_fail(e, ge.msg);
  } else if (me % 2 == 0) {
    rc = c->ops->send(c, COMM_CP, t, q->data, n, to, tag, e);
    if (rc == 0) rc = c->ops->recv(c, COMM_CP, t, data, n, from, tag, e);
  } else {
    rc = c->ops->recv(c, COMM_CP, t, data, n, from, tag, e);
    if (rc == 0) rc = c->ops->send(c, COMM_CP, t, q->data, n, to, tag, e);
  }
  mem_release(&r->mem, q->data, q->bytes);
  free(q);
  return rc;
}

int comm_ring_finish(CommRing *r, RtErr *e) {
  int pending = r->head != NULL;
  comm_ring_clear(r);
  return pending ? ring_fail(e, "a context-parallel send that no receive paired with (the ring's transfers do not pair)") : 0;
}

CommGroup comm_group_of_ir(int ir_group) {
  /* IrGroup's order (core/ir.h): dp, tp, pp, cp, ep, edp */
  static const CommGroup groups[6] = {COMM_DP, COMM_TP, COMM_PP, COMM_CP, COMM_EP, COMM_EDP};
  return ir_group >= 0 && ir_group < 6 ? groups[ir_group] : COMM_CP;
}

void *comm_outbox_buffer(CommOutbox *o, size_t bytes) {
  if (o->n == o->cap) {
    int cap = o->cap ? 2 * o->cap : 16;
    void **b = realloc(o->buf, sizeof(void *) * (size_t)cap);
    if (b) o->buf = b;
    size_t *s = b ? realloc(o->bytes, sizeof(size_t) * (size_t)cap) : NULL;
    if (!s) return NULL;
    o->bytes = s;
    o->cap = cap;
  }
  void *p = mem_alloc(&o->mem, bytes);
  if (p) {
    o->buf[o->n] = p;
    o->bytes[o->n++] = bytes;
  }
  return p;
}

int comm_outbox_flush(CommOutbox *o, Comm *c, RtErr *e) {
  int rc = o->n ? c->ops->wait_sends(c, e) : 0;
  for (int i = 0; i < o->n; i++) mem_release(&o->mem, o->buf[i], o->bytes[i]);
  o->n = 0;
  return rc;
}

void comm_outbox_free(CommOutbox *o) {
  for (int i = 0; i < o->n; i++) mem_release(&o->mem, o->buf[i], o->bytes[i]);
  free(o->buf);
  free(o->bytes);
  o->buf = NULL;
  o->bytes = NULL;
  o->n = o->cap = 0;
}

int comm_pipe_tag(int chunk, int nmicro, int mb, int offset, int sending) {
  int grad = (offset > 0) != (sending != 0);
  int from = sending ? chunk : chunk + offset;
  int64_t tag = COMM_TAG_PIPE + 2 * ((int64_t)from * nmicro + mb) + grad;
  return tag > COMM_TAG_MAX ? -1 : (int)tag;
}

void comm_ring_clear(CommRing *r) {
  while (r->head) {
    CommRingSend *q = r->head;
    r->head = q->next;
    /* an exchange still running: its buffers are the Comm's until it ends (an
     * error ended the step: the job stops), so they are left, not freed */
    if (q->stage) {
      free(q);
      continue;
    }
    mem_release(&r->mem, q->data, q->bytes);
    free(q);
  }
  r->tail = NULL;
}
