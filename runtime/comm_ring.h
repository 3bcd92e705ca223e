/* comm_ring.h - the programs' point-to-point messages over a Comm's table:
 * their tags, the pipeline's tag rule, and the context-parallel ring of ring
 * attention, shared by the CPU program (program_exec.c, a module that links
 * nothing of libhpdlrt: this file is compiled into it) and the GPU's
 * (program_cuda.c).
 *
 * Ring attention sends a block to the next member of the context group and
 * receives one from the previous, on every member at once; the members run
 * the same program, so the k-th receive pairs with the k-th send. Where the
 * Comm starts an exchange without waiting (Comm.exchange_start: MPI's
 * Isend and Irecv, NCCL's grouped send and receive on the group's stream),
 * the send starts it - its receive from the previous member into a buffer
 * of the ring's own - and the receive that pairs with it waits for it and
 * copies the block out: the transfer runs while the program computes what
 * lies between them (ring attention on the block before, spmd.c). Else a
 * send is only queued and its receive does the exchange (with blocking
 * transfers every member sending first would wait for ever once messages
 * outgrow MPI's eager buffers): even members send then receive, odd ones
 * receive then send, which breaks the cycle on rings of any size. The ring
 * wraps around: a member's neighbour at offset o is (rank + o) mod size. */
#ifndef HPDL_COMM_RING_H
#define HPDL_COMM_RING_H

#include <stdint.h>

#include "comm.h"

/* Tags keep the kinds of point-to-point messages of the programs apart (MPI
 * matches by source, tag and communicator; within one tag, messages keep
 * their order). A pipeline transfer's tag names the message (comm_pipe_tag),
 * so a stage with several micro-batches in flight takes the one it means. */
enum {
  COMM_TAG_TIE_PARAM = 32, /* a tied parameter's values, owner to mirror */
  COMM_TAG_TIE_GRAD = 33,  /* its gradient back */
  COMM_TAG_RING = 34,      /* context parallelism's ring */
  COMM_TAG_PIPE = 64,      /* pipeline transfers from here on */
  COMM_TAG_MAX = 32767     /* MPI's least upper bound */
};

/* The tag of a pipeline transfer of micro-batch mb (of nmicro) by the
 * chunk `chunk` running it: a send carries this chunk's activation (offset
 * +1) or input gradient (-1); a receive takes the neighbour's:
 * COMM_TAG_PIPE + 2 (chunk x nmicro + mb) + (0 activation, 1 gradient), the
 * chunk the one that produced it. -1 when it passes COMM_TAG_MAX. */
int comm_pipe_tag(int chunk, int nmicro, int mb, int offset, int sending);

/* The Comm group of an IR group (ir.h's IrGroup order: dp, tp, pp, cp). */
CommGroup comm_group_of_ir(int ir_group);

/* Where the programs' message buffers live: NULL fields mean host memory
 * (malloc, memcpy, free); a device Comm (NCCL) sends from the device's. */
typedef struct {
  void *ctx;
  void *(*alloc)(void *ctx, size_t bytes);
  void (*release)(void *ctx, void *p, size_t bytes);
  int (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
} CommMem;

/* Sends that do not wait for their receive (Comm.isend: a 1F1B stage sends
 * an activation while its neighbour sends a gradient back), each out of a
 * buffer of its own, kept until comm_outbox_flush completes them all. */
typedef struct {
  void **buf;
  size_t *bytes;
  int n, cap;
  CommMem mem;
} CommOutbox;

/* A new buffer of `bytes` for one send (NULL: out of memory). */
void *comm_outbox_buffer(CommOutbox *o, size_t bytes);
/* Waits for every send (Comm.wait_sends) and frees their buffers. */
int comm_outbox_flush(CommOutbox *o, Comm *c, RtErr *e);
/* Frees the buffers without waiting (a failed step) and the list. */
void comm_outbox_free(CommOutbox *o);

typedef struct CommRingSend CommRingSend;

typedef struct {
  CommRingSend *head, *tail; /* sends not yet exchanged */
  CommMem mem;
} CommRing;

/* Queues n values of type t (copied) for the member `offset` places on, and
 * over c's exchange_start (tag `tag`) starts sending them and receiving as
 * many from the member -offset places on. */
int comm_ring_send(CommRing *r, Comm *c, CommType t, const void *data, int64_t n, int offset, int tag, RtErr *e);
/* Takes the oldest send's exchange: waits for the one it started, else
 * exchanges it with the receive of n values from the member `offset` places
 * on (-offset of the send's), over tag `tag`, in one group where the Comm
 * has groups (NCCL), else in the even / odd order. */
int comm_ring_recv(CommRing *r, Comm *c, CommType t, void *data, int64_t n, int offset, int tag, RtErr *e);
/* The end of a step's transfers: the queue emptied, and -1 with the
 * message when a send was still in it (the ring's transfers did not pair). */
int comm_ring_finish(CommRing *r, RtErr *e);
void comm_ring_clear(CommRing *r);

#endif
