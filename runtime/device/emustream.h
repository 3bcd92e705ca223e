/* emustream.h - the emulated device's streams, run in order or held late.
 *
 * On a GPU the launch stream and the runtime's second streams (NCCL's
 * reductions, ZeRO's gathers, pipeline transfers) run side by side, and only
 * the orders the runtime asks for (stream_wait) hold between them. The
 * emulated device runs everything at once by default, so a missing order
 * cannot show there. HPDL_EMU_STREAMS picks how its streams run:
 *
 *   order        (the default) everything at once, in the order given;
 *   side-late    work on a stream made by stream_create is held and runs
 *                only when something must see it done: a stream_wait on
 *                that stream, a sync, the clock, a release (cuMemFree waits
 *                for the device) or the device's close;
 *   launch-late  the launch stream's kernels, GEMMs, copies and fills (and
 *                NCCL calls queued on it) are held the same way, and also
 *                run before a copy to or from the host (cuMemcpyDtoH and
 *                HtoD are ordered after the launch stream's work).
 *
 * Under side-late the launch stream reading a second stream's results, or
 * overwriting what it has still to read, without a wait computes wrong
 * numbers, as on a GPU; under launch-late a second stream reading what the
 * launches have not yet written does. docs/gpu.md, "Streams on the emulated
 * device". One device a process: the mode and the streams are the
 * process's. */
#ifndef HPDL_EMUSTREAM_H
#define HPDL_EMUSTREAM_H

#include <stddef.h>

typedef enum { EMUS_ORDER, EMUS_SIDE_LATE, EMUS_LAUNCH_LATE } EmusMode;

/* HPDL_EMU_STREAMS's value (NULL or "": order); -1 for a word it does not know. */
int emus_mode_of(const char *text, EmusMode *mode);
const char *emus_mode_name(EmusMode mode);
void emus_set_mode(EmusMode mode);
EmusMode emus_mode(void);

/* A held piece of work: run(arg) when its stream drains (0, or -1 with the
 * reason in msg); arg is freed after. */
typedef int (*EmusRun)(void *arg, char *msg, size_t len);

/* A second stream: a queue under side-late, else a name (NULL: out of memory). */
void *emus_create(void);
/* Runs what it holds and forgets it (-1 with the reason in msg when held work failed). */
int emus_destroy(void *stream, char *msg, size_t len);

/* Whether work given to `stream` (NULL: the launch stream) is held now. */
int emus_holds(void *stream);
/* Holds run(arg) on stream: 0, or -1 when out of memory (arg not taken). */
int emus_hold(void *stream, EmusRun run, void *arg);
/* Runs what stream holds, in order: 0, or -1 (the first failure in msg)
 * when a piece failed, now or when it ran. */
int emus_drain(void *stream, char *msg, size_t len);
int emus_drain_all(char *msg, size_t len);

/* For a test double of a library that queues work on the device's streams
 * (tests/cuda/fake_nccl.c, found by name: hpdlrun exports both):
 * hpdl_emu_defer holds run(arg) on `stream` and returns 1 when that stream
 * holds its work now, else 0 (run it at once); hpdl_emu_drain runs what
 * `stream` holds (0, or -1 with the reason on stderr). */
int hpdl_emu_defer(void *stream, EmusRun run, void *arg);
int hpdl_emu_drain(void *stream);

#endif
