/* kernels/cuda_emu.h - run CUDA C kernels on the CPU, unchanged (kernels/README.md,
 * "The CPU emulation harness").
 *
 * The CUDA back end writes kernels in plain CUDA C. With no GPU at hand (here and in
 * CI) the same file is compiled as C++17 with this header forced in front of it
 *
 *     c++ -std=c++17 -O2 -fno-strict-aliasing -include kernels/cuda_emu.h -x c++ k.cu
 *
 * and the kernels run on the CPU: the blocks of a grid one after another on the
 * calling OS thread, the threads of a block as cooperative fibers. A fiber runs until
 * it reaches a barrier (__syncthreads) or a warp operation (__shfl_*_sync, __ballot_sync,
 * __syncwarp, ...), so barriers and warp exchanges have GPU semantics: every lane of a
 * warp contributes its value before any lane reads, and a thread that does not reach a
 * barrier the others wait at is reported, never hung on.
 *
 * Under nvcc or NVRTC (__CUDACC__ defined) the real built-ins exist and this header
 * only defines HPDL_DYNAMIC_SMEM, so it may be force-included there too.
 */
#ifndef HPDL_CUDA_EMU_H
#define HPDL_CUDA_EMU_H

#if defined(__CUDACC__)

/* Dynamic shared memory: `extern __shared__ T name[]` has no C++ meaning, so
 * generated code writes HPDL_DYNAMIC_SMEM(T, name); inside the kernel body. */
#ifndef HPDL_DYNAMIC_SMEM
#define HPDL_DYNAMIC_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif

#else /* ---------------------------------------------------------------- emulation */

#ifndef __cplusplus
#error "kernels/cuda_emu.h emulates CUDA C++: compile the kernel source as C++17 (-x c++ -std=c++17)"
#endif
#if __cplusplus < 201703L
#error "kernels/cuda_emu.h needs C++17 (-std=c++17)"
#endif

#include <math.h>
#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdarg>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <numeric>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>

/* The fiber switch: a few instructions of our own on x86-64 (glibc's swapcontext
 * makes two system calls a switch, for the signal mask), ucontext elsewhere, and
 * under AddressSanitizer or CET shadow stacks, which know ucontext but not ours. */
#if !defined(HPDL_EMU_USE_UCONTEXT)
#if !defined(__x86_64__) || defined(__CET__) || defined(__SANITIZE_ADDRESS__)
#define HPDL_EMU_USE_UCONTEXT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HPDL_EMU_USE_UCONTEXT 1
#endif
#endif
#endif
#ifdef HPDL_EMU_USE_UCONTEXT
#include <ucontext.h>
#endif
/* AddressSanitizer is told of each stack switch (no false reports, no warning). */
#if defined(__SANITIZE_ADDRESS__)
#define HPDL_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HPDL_EMU_ASAN 1
#endif
#endif
#ifdef HPDL_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#define HPDL_EMU 1
#define HPDL_EMU_HIDDEN __attribute__((visibility("hidden")))

/* ------------------------------------------------------------- qualifiers */
#define __global__
#define __device__
#define __host__
#define __forceinline__
#define __noinline__ __attribute__((noinline))
#define __constant__
#define __managed__
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* __restrict__ is a keyword of g++ and clang++ already, with CUDA's meaning. */

/* __shared__ variables are function statics: the fibers of the running block share
 * them, and blocks run one at a time. They are placed in one ELF section so that the
 * harness can poison all of them at each block start (__start_/__stop_ symbols,
 * hidden: each shared object poisons its own). Do not write `static __shared__`. */
#if defined(__ELF__)
#define __shared__ __attribute__((section("hpdl_emu_shared"))) static
extern "C" char __start_hpdl_emu_shared[] HPDL_EMU_HIDDEN;
extern "C" char __stop_hpdl_emu_shared[] HPDL_EMU_HIDDEN;
/* one byte per translation unit, so that the section and its bounds always exist */
__attribute__((section("hpdl_emu_shared"), used)) static char hpdl_emu_shared_anchor;
#else
#define __shared__ static
#endif

/* ---------------------------------------------------------------- vector types */
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

#define HPDL_EMU_VEC1(T, name, al) \
  struct __attribute__((aligned(al))) name { T x; }; \
  inline name make_##name(T x) { return name{x}; }
#define HPDL_EMU_VEC2(T, name, al) \
  struct __attribute__((aligned(al))) name { T x, y; }; \
  inline name make_##name(T x, T y) { return name{x, y}; }
#define HPDL_EMU_VEC3(T, name) \
  struct name { T x, y, z; }; \
  inline name make_##name(T x, T y, T z) { return name{x, y, z}; }
#define HPDL_EMU_VEC4(T, name, al) \
  struct __attribute__((aligned(al))) name { T x, y, z, w; }; \
  inline name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }

HPDL_EMU_VEC1(float, float1, 4)
HPDL_EMU_VEC2(float, float2, 8)
HPDL_EMU_VEC3(float, float3)
HPDL_EMU_VEC4(float, float4, 16)
HPDL_EMU_VEC1(int, int1, 4)
HPDL_EMU_VEC2(int, int2, 8)
HPDL_EMU_VEC3(int, int3)
HPDL_EMU_VEC4(int, int4, 16)
HPDL_EMU_VEC1(unsigned int, uint1, 4)
HPDL_EMU_VEC2(unsigned int, uint2, 8)
HPDL_EMU_VEC4(unsigned int, uint4, 16)
inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3{x, y, z}; }
HPDL_EMU_VEC2(double, double2, 16)
HPDL_EMU_VEC2(long long, longlong2, 16)
HPDL_EMU_VEC2(unsigned long long, ulonglong2, 16)
HPDL_EMU_VEC2(short, short2, 4)
HPDL_EMU_VEC4(short, short4, 8)
HPDL_EMU_VEC2(unsigned short, ushort2, 4)
HPDL_EMU_VEC4(unsigned short, ushort4, 8)
HPDL_EMU_VEC2(signed char, char2, 2)
HPDL_EMU_VEC4(signed char, char4, 4)
HPDL_EMU_VEC2(unsigned char, uchar2, 2)
HPDL_EMU_VEC4(unsigned char, uchar4, 4)
#undef HPDL_EMU_VEC1
#undef HPDL_EMU_VEC2
#undef HPDL_EMU_VEC3
#undef HPDL_EMU_VEC4

/* ------------------------------------------------------- the per-thread built-ins */
/* Set by the scheduler before it resumes a fiber (one OS thread runs all of them). */
HPDL_EMU_HIDDEN inline uint3 threadIdx;
HPDL_EMU_HIDDEN inline uint3 blockIdx;
HPDL_EMU_HIDDEN inline dim3 blockDim;
HPDL_EMU_HIDDEN inline dim3 gridDim;
constexpr int warpSize = 32;

/* ================================================================== the harness */
namespace hpdl_emu HPDL_EMU_HIDDEN {

enum class Order { forward, reverse, random };
enum : uint8_t { F_RUN, F_BAR, F_WARP, F_DONE };  // fiber states
enum : uint8_t {                                  // what a fiber waits at
  W_SYNCWARP, W_IDX, W_UP, W_DOWN, W_BFLY, W_BALLOT, W_ANY, W_ALL,
  W_RADD, W_RMIN, W_RMAX, W_RAND, W_ROR, W_RXOR,
  B_SYNC, B_COUNT, B_AND, B_OR
};

inline const char* op_name(uint8_t k) {
  static const char* const names[] = {
      "__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
      "__ballot_sync", "__any_sync", "__all_sync", "__reduce_add_sync", "__reduce_min_sync",
      "__reduce_max_sync", "__reduce_and_sync", "__reduce_or_sync", "__reduce_xor_sync",
      "__syncthreads", "__syncthreads_count", "__syncthreads_and", "__syncthreads_or"};
  return k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* ----------------------------------------------------------- context switch */
#ifdef HPDL_EMU_USE_UCONTEXT
struct Ctx {
  ucontext_t uc;
  const void* bottom = nullptr;  // the stack, for AddressSanitizer
  size_t size = 0;
  void* fake = nullptr;
};
inline void ctx_init(Ctx& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  c.bottom = stack;
  c.size = size;
  makecontext(&c.uc, entry, 0);
}
/* final: from is never resumed (a finished or failed fiber) */
inline void ctx_switch(Ctx& from, Ctx& to, bool final = false) {
#ifdef HPDL_EMU_ASAN
  __sanitizer_start_switch_fiber(final ? nullptr : &from.fake, to.bottom, to.size);
#endif
  (void)final;
  swapcontext(&from.uc, &to.uc);
#ifdef HPDL_EMU_ASAN
  __sanitizer_finish_switch_fiber(from.fake, nullptr, nullptr);
#endif
}
/* first thing on a new fiber: learn the scheduler's stack (the one it came from) */
inline void ctx_entered(Ctx& sched) {
#ifdef HPDL_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &sched.bottom, &sched.size);
#endif
  (void)sched;
}
#else
struct Ctx {
  void* sp;
};
/* hpdl_emu_switch(save, sp): push the callee-saved registers, MXCSR and the x87
 * control word, store the stack pointer in *save, load sp, pop the same, return on
 * the new stack. Weak: every translation unit carries a copy, the linker keeps one. */
extern "C" void hpdl_emu_switch(void** save, void* sp) HPDL_EMU_HIDDEN;
__asm__(
    ".text\n"
    ".weak hpdl_emu_switch\n"
    ".hidden hpdl_emu_switch\n"
    ".type hpdl_emu_switch, @function\n"
    "hpdl_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size hpdl_emu_switch, .-hpdl_emu_switch\n");
inline void ctx_init(Ctx& c, char* stack, size_t size, void (*entry)()) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
  uint64_t* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                        // entry's "return address" (never used)
  *--sp = reinterpret_cast<uint64_t>(entry);        // popped by ret
  for (int i = 0; i < 6; i++) *--sp = 0;           // rbp rbx r12..r15
  --sp;                                             // MXCSR, x87 control word: the caller's
  uint32_t mxcsr;
  uint16_t fpucw;
  __asm__ volatile("stmxcsr %0" : "=m"(mxcsr));
  __asm__ volatile("fnstcw %0" : "=m"(fpucw));
  std::memcpy(reinterpret_cast<char*>(sp), &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(sp) + 4, &fpucw, 2);
  c.sp = sp;
}
inline void ctx_switch(Ctx& from, Ctx& to, bool final = false) {
  (void)final;
  hpdl_emu_switch(&from.sp, to.sp);
}
inline void ctx_entered(Ctx&) {}
#endif

struct Fiber {
  Ctx ctx;
  uint3 tid;
  unsigned linear, rank;
  uint8_t state, kind;
  int width;
  unsigned mask, b;
  uint64_t value, result;
  const char* file;
  int line;
};

struct Stack {
  char* base;  // lowest usable byte (a guard page lies below)
  size_t size;
};

inline thread_local bool launching = false;  // this OS thread is inside launch()

struct Emu {
  std::mutex mu;
  std::vector<Fiber> fibers;
  std::vector<Stack> stacks;
  size_t stack_size = 0;
  Ctx sched;
  Fiber* cur = nullptr;
  unsigned n = 0, nwarps = 0, n_done = 0, n_bar = 0;
  std::vector<uint32_t> live;      // per warp: lanes that exist and have not exited
  std::vector<uint32_t> at_warp;   // per warp: lanes waiting at a warp operation (F_WARP)
  std::vector<uint64_t> runnable;  // bit per rank
  std::vector<unsigned> by_rank;   // rank -> linear thread id
  bool aborted = false;
  std::string error;
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  unsigned char* dyn = nullptr;
  size_t dyn_size = 0;
  Order order = Order::forward;
  uint64_t rng = 1;
  int poison = 0xff;  // byte written over shared memory at each block start; -1: none
  ~Emu() {
    if (launching) return;  // exit() inside a kernel: this may be a fiber's stack
    for (Stack& s : stacks) munmap(s.base - page(), s.size + page());
    ::operator delete(dyn, std::align_val_t(128));
  }
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
};
inline Emu g;

inline uint64_t next_random() {  // splitmix64
  uint64_t z = (g.rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

inline std::string where(const Fiber& f) {
  return fmt("thread (%u,%u,%u)", f.tid.x, f.tid.y, f.tid.z);
}
/* "at __syncthreads (k.cu:12)", "has exited" */
inline std::string site(const Fiber& f) {
  if (f.state == F_DONE) return "has exited";
  if (f.state == F_RUN) return "is running";
  std::string s = fmt("at %s (%s:%d)", op_name(f.kind), f.file ? f.file : "?", f.line);
  if (f.state == F_WARP) s += fmt(" with mask 0x%08x", f.mask);
  return s;
}
inline std::string state_of(const Fiber& f) {
  return f.state == F_BAR || f.state == F_WARP ? "waits " + site(f) : site(f);
}

inline void set_runnable(Fiber& f) { g.runnable[f.rank >> 6] |= uint64_t(1) << (f.rank & 63); }
inline void clear_runnable(Fiber& f) { g.runnable[f.rank >> 6] &= ~(uint64_t(1) << (f.rank & 63)); }
/* The fiber to run next: the runnable one of lowest rank. Running it until it blocks
 * lets low ranks run as far ahead of the others as the GPU would allow. */
inline Fiber* pick() {
  for (size_t i = 0; i < g.runnable.size(); i++)
    if (g.runnable[i]) return &g.fibers[g.by_rank[i * 64 + __builtin_ctzll(g.runnable[i])]];
  return nullptr;
}

/* Ranks for a new phase of the block (its start, each barrier release). */
inline void assign_ranks() {
  for (unsigned i = 0; i < g.n; i++) g.by_rank[i] = g.order == Order::reverse ? g.n - 1 - i : i;
  if (g.order == Order::random)
    for (unsigned i = g.n; i > 1; i--) std::swap(g.by_rank[i - 1], g.by_rank[next_random() % i]);
  for (unsigned r = 0; r < g.n; r++) g.fibers[g.by_rank[r]].rank = r;
}

/* An error inside a fiber: fail(msg); then stop(); as two statements, so that no
 * temporary of the message is left on the abandoned fiber's stack. The launch stops;
 * the fiber is never resumed. */
inline void fail(const std::string& msg) {
  if (!g.cur) {
    std::fprintf(stderr, "hpdl_emu: %s (outside a kernel launch)\n", msg.c_str());
    std::abort();
  }
  if (!g.aborted) g.error = where(*g.cur) + ": " + msg;
  g.aborted = true;
}
[[noreturn]] inline void stop() {
  ctx_switch(g.cur->ctx, g.sched, true);
  std::abort();  // unreachable: an aborted fiber is not resumed
}

inline Fiber& current(const char* what) {
  if (!g.cur) {
    std::fprintf(stderr, "hpdl_emu: %s called outside a kernel launch\n", what);
    std::abort();
  }
  return *g.cur;
}

/* Block the running fiber (its state already says at what) and run the others; it
 * returns when the scheduler resumes it. A fiber whose warp operation just completed
 * keeps running when it is still the one of lowest rank (no switch). */
inline void wait_here() {
  Fiber* f = g.cur;
  Fiber* next = pick();
  if (f->state == F_RUN && next == f) return;
#ifndef HPDL_EMU_USE_UCONTEXT
  /* straight to the next runnable fiber, not through the scheduler: half the
   * switches of a warp operation (the scheduler still releases barriers and
   * explains a stuck block). Not with ucontext: AddressSanitizer's fiber
   * annotations take every new fiber's first switch to come from the scheduler. */
  if (next && !g.aborted) {
    g.cur = next;
    threadIdx = next->tid;
    ctx_switch(f->ctx, next->ctx);
    return;  // whoever resumed this fiber set g.cur and threadIdx to it
  }
#endif
  ctx_switch(f->ctx, g.sched);
}

/* Exchange among lanes S of warp w, all waiting at the same warp operation: every
 * value is read before any result is written, as on the GPU. */
inline void warp_execute(unsigned w, uint32_t S) {
  Fiber* F = &g.fibers[w * 32];
  uint8_t kind = F[__builtin_ctz(S)].kind;
  bool any = false, every = true;
  uint32_t ballot = 0;
  uint64_t red = 0;
  bool first = true;
  for (uint32_t m = S; m; m &= m - 1) {
    unsigned j = __builtin_ctz(m);
    uint64_t v = F[j].value;
    if (v) ballot |= 1u << j;
    any = any || v;
    every = every && v;
    bool sgn = F[j].b != 0;  // reductions: signed operands
    switch (kind) {
      case W_RADD: red = uint32_t(red + v); break;
      case W_RAND: red = first ? v : (red & v); break;
      case W_ROR: red |= v; break;
      case W_RXOR: red ^= v; break;
      case W_RMIN:
        if (first || (sgn ? int32_t(v) < int32_t(red) : uint32_t(v) < uint32_t(red))) red = v;
        break;
      case W_RMAX:
        if (first || (sgn ? int32_t(v) > int32_t(red) : uint32_t(v) > uint32_t(red))) red = v;
        break;
      default: break;
    }
    first = false;
  }
  for (uint32_t m = S; m; m &= m - 1) {
    unsigned lane = __builtin_ctz(m);
    Fiber& t = F[lane];
    switch (kind) {
      case W_IDX:
      case W_UP:
      case W_DOWN:
      case W_BFLY: {
        /* PTX shfl.sync: segmask = 32 - width; c = segment end (start for up) */
        int seg = 32 - t.width, bval = int(t.b & 31);
        int maxl = (int(lane) & seg) | (t.kind == W_UP ? 0 : (31 & ~seg));
        int minl = int(lane) & seg, j;
        bool ok;
        if (t.kind == W_IDX) {
          j = minl | (bval & ~seg);
          ok = j <= maxl;
        } else if (t.kind == W_UP) {
          j = int(lane) - bval;
          ok = j >= maxl;
        } else if (t.kind == W_DOWN) {
          j = int(lane) + bval;
          ok = j <= maxl;
        } else {
          j = int(lane) ^ bval;
          ok = j <= maxl;
        }
        if (!ok) j = int(lane);
        /* a source lane that takes no part (exited, absent, not in mask): undefined on
         * the GPU, poison here */
        t.result = (S >> j & 1) ? F[j].value : ~uint64_t(0);
        break;
      }
      case W_BALLOT: t.result = ballot; break;
      case W_ANY: t.result = any; break;
      case W_ALL: t.result = every; break;
      case W_SYNCWARP: t.result = 0; break;
      default: t.result = red; break;
    }
  }
}

/* Complete the warp operation lane l of warp w waits at, when every lane it names
 * (less those that exited) waits too. */
inline void warp_try_complete(unsigned w, unsigned l) {
  Fiber* F = &g.fibers[w * 32];
  uint32_t live = g.live[w];
  uint32_t S = F[l].mask & live;
  if (S & ~g.at_warp[w]) return;  // a lane it names is still running: the common case, O(1)
  for (uint32_t m = S; m; m &= m - 1) {
    Fiber& o = F[__builtin_ctz(m)];
    if (o.kind != F[l].kind || o.width != F[l].width || (o.mask & live) != S) {
      fail(fmt("warp %u: lanes meet at different warp operations: lane %u %s, lane %u %s", w, l,
               site(F[l]).c_str(), __builtin_ctz(m), site(o).c_str()));
      stop();
    }
  }
  warp_execute(w, S);
  g.at_warp[w] &= ~S;
  for (uint32_t m = S; m; m &= m - 1) {
    Fiber& o = F[__builtin_ctz(m)];
    o.state = F_RUN;
    set_runnable(o);
  }
}

inline uint64_t warp_op(uint8_t kind, unsigned mask, uint64_t value, unsigned b, int width, const char* file,
                        int line) {
  Fiber& f = current(op_name(kind));
  unsigned lane = f.linear & 31, w = f.linear >> 5;
  f.kind = kind;
  f.file = file;
  f.line = line;
  if (!(mask >> lane & 1)) {
    fail(fmt("%s (%s:%d) with mask 0x%08x that does not name the calling lane %u", op_name(kind), file, line, mask,
             lane));
    stop();
  }
  if (width < 1 || width > 32 || (width & (width - 1))) {
    fail(fmt("%s (%s:%d): width %d is not a power of 2 in 1..32", op_name(kind), file, line, width));
    stop();
  }
  f.state = F_WARP;
  g.at_warp[w] |= 1u << lane;
  f.mask = mask;
  f.value = value;
  f.b = b;
  f.width = width;
  clear_runnable(f);
  warp_try_complete(w, lane);
  wait_here();
  return f.result;
}

inline uint64_t block_op(uint8_t kind, int pred, const char* file, int line) {
  Fiber& f = current(op_name(kind));
  f.state = F_BAR;
  f.kind = kind;
  f.file = file;
  f.line = line;
  f.value = pred != 0;
  clear_runnable(f);
  g.n_bar++;
  wait_here();
  return f.result;
}

inline void fiber_main() {
  ctx_entered(g.sched);
  Fiber& f = *g.cur;
  g.body(g.body_arg);
  f.state = F_DONE;
  clear_runnable(f);
  g.n_done++;
  unsigned w = f.linear >> 5;
  g.live[w] &= ~(1u << (f.linear & 31));
  /* lanes waiting at a warp operation that named this one may now be complete */
  for (uint32_t m = g.at_warp[w]; m; m &= m - 1) {
    unsigned l = unsigned(__builtin_ctz(m));
    if (g.fibers[w * 32 + l].state == F_WARP) warp_try_complete(w, l);
  }
  ctx_switch(f.ctx, g.sched, true);
  std::abort();  // a finished fiber is not resumed
}

/* Nothing can run and not every thread exited: release the block barrier when every
 * thread waits at the same one, otherwise describe why the block is stuck. */
inline bool release_or_explain() {
  if (g.n_bar > 0 && g.n_bar == g.n) {
    const Fiber& a = g.fibers[0];
    for (unsigned i = 1; i < g.n; i++) {
      const Fiber& o = g.fibers[i];
      if (o.kind != a.kind || o.line != a.line || std::strcmp(o.file, a.file) != 0) {
        g.error = fmt("divergent barrier: %s waits %s while %s waits %s", where(a).c_str(), site(a).c_str(),
                      where(o).c_str(), site(o).c_str());
        return false;
      }
    }
    uint64_t count = 0;
    for (unsigned i = 0; i < g.n; i++) count += g.fibers[i].value;
    uint64_t r = a.kind == B_COUNT ? count : a.kind == B_AND ? count == g.n : a.kind == B_OR ? count > 0 : 0;
    g.n_bar = 0;
    assign_ranks();
    for (unsigned i = 0; i < g.n; i++) {
      g.fibers[i].state = F_RUN;
      g.fibers[i].result = r;
      set_runnable(g.fibers[i]);
    }
    return true;
  }
  /* stuck: name one waiting thread and one that will never join it */
  const Fiber* waiting = nullptr;
  const Fiber* other = nullptr;
  for (unsigned i = 0; i < g.n && !waiting; i++)
    if (g.fibers[i].state == F_WARP) waiting = &g.fibers[i];
  if (waiting) {  // a warp operation whose lanes are elsewhere
    unsigned w = waiting->linear >> 5;
    uint32_t S = waiting->mask & g.live[w];
    for (uint32_t m = S; m && !other; m &= m - 1) {
      const Fiber& o = g.fibers[w * 32 + __builtin_ctz(m)];
      if (o.state != F_WARP || o.mask != waiting->mask) other = &o;
    }
    if (!other)
      for (unsigned i = 0; i < g.n && !other; i++)
        if (g.fibers[i].state == F_BAR) other = &g.fibers[i];
  } else {
    for (unsigned i = 0; i < g.n && !waiting; i++)
      if (g.fibers[i].state == F_BAR) waiting = &g.fibers[i];
    for (unsigned i = 0; i < g.n && !other; i++)
      if (g.fibers[i].state == F_DONE) other = &g.fibers[i];
  }
  if (waiting && other)
    g.error = fmt("divergent barrier: %s waits %s but %s %s (%u of %u threads exited, %u at a block barrier)",
                  where(*waiting).c_str(), site(*waiting).c_str(), where(*other).c_str(), state_of(*other).c_str(),
                  g.n_done, g.n, g.n_bar);
  else
    g.error = fmt("deadlock: %u of %u threads exited, %u at a block barrier", g.n_done, g.n, g.n_bar);
  return false;
}

inline void poison_shared() {
  if (g.poison < 0) return;
#if defined(__ELF__)
  std::memset(__start_hpdl_emu_shared, g.poison, size_t(__stop_hpdl_emu_shared - __start_hpdl_emu_shared));
#endif
  if (g.dyn_size) std::memset(g.dyn, g.poison, g.dyn_size);
}

inline bool run_block() {
  poison_shared();
  for (unsigned i = 0; i < g.n; i++) {
    Fiber& f = g.fibers[i];
    f.state = F_RUN;
    f.result = 0;
    ctx_init(f.ctx, g.stacks[i].base, g.stacks[i].size, &fiber_main);
  }
  for (unsigned w = 0; w < g.nwarps; w++) {
    unsigned lanes = std::min(32u, g.n - w * 32);
    g.live[w] = lanes == 32 ? ~0u : (1u << lanes) - 1;
    g.at_warp[w] = 0;
  }
  g.n_done = g.n_bar = 0;
  assign_ranks();
  std::fill(g.runnable.begin(), g.runnable.end(), 0);
  for (unsigned i = 0; i < g.n; i++) set_runnable(g.fibers[i]);
  for (;;) {
    if (g.aborted) return false;
    if (Fiber* f = pick()) {
      g.cur = f;
      threadIdx = f->tid;
      ctx_switch(g.sched, f->ctx);
      g.cur = nullptr;
      continue;
    }
    if (g.n_done == g.n) return true;
    if (!release_or_explain()) return false;
  }
}

inline bool env_number(const char* name, unsigned long long lo, unsigned long long hi, unsigned long long* out) {
  const char* s = std::getenv(name);
  if (!s || !*s) return true;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 0);
  if (*end || v < lo || v > hi) {
    g.error = fmt("%s=%s: expected a number in %llu..%llu", name, s, lo, hi);
    return false;
  }
  *out = v;
  return true;
}

inline bool configure(size_t threads, size_t dyn_smem) {
  const char* o = std::getenv("HPDL_EMU_ORDER");
  if (!o || !*o || !std::strcmp(o, "forward"))
    g.order = Order::forward;
  else if (!std::strcmp(o, "reverse"))
    g.order = Order::reverse;
  else if (!std::strcmp(o, "random"))
    g.order = Order::random;
  else {
    g.error = fmt("HPDL_EMU_ORDER=%s: expected forward, reverse or random", o);
    return false;
  }
  unsigned long long seed = 1, poison = 0xff, stack_kb = 256;
  const char* poison_env = std::getenv("HPDL_EMU_POISON");
  bool no_poison = poison_env && !std::strcmp(poison_env, "off");
  if (!env_number("HPDL_EMU_SEED", 0, ~0ull, &seed) || (!no_poison && !env_number("HPDL_EMU_POISON", 0, 255, &poison)) ||
      !env_number("HPDL_EMU_STACK_KB", 16, 1 << 20, &stack_kb))
    return false;
  static uint64_t launches = 0;  // each launch of a process draws its own orders, reproducibly
  g.rng = seed * 0x100000001B3ull + launches++;
  g.poison = no_poison ? -1 : int(poison);

  size_t page = Emu::page(), size = (size_t(stack_kb) * 1024 + page - 1) / page * page;
  if (size != g.stack_size) {
    for (Stack& s : g.stacks) munmap(s.base - page, s.size + page);
    g.stacks.clear();
    g.stack_size = size;
  }
  while (g.stacks.size() < threads) {  // a guard page under each stack: overflow faults
    void* p = mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      g.error = fmt("cannot map a %zu KiB fiber stack", size / 1024);
      return false;
    }
    mprotect(p, page, PROT_NONE);
    g.stacks.push_back(Stack{static_cast<char*>(p) + page, size});
  }
  if (dyn_smem != g.dyn_size) {  // exactly the size asked for, so that ASan sees overruns
    ::operator delete(g.dyn, std::align_val_t(128));
    g.dyn = static_cast<unsigned char*>(::operator new(dyn_smem ? dyn_smem : 1, std::align_val_t(128)));
    g.dyn_size = dyn_smem;
  }
  g.n = unsigned(threads);
  g.nwarps = (g.n + 31) / 32;
  g.fibers.assign(threads, Fiber{});
  g.live.assign(g.nwarps, 0);
  g.at_warp.assign(g.nwarps, 0);
  g.runnable.assign((threads + 63) / 64, 0);
  g.by_rank.assign(threads, 0);
  return true;
}

/* Largest dynamic shared memory a block may ask for (sm_90's opt-in limit). */
constexpr size_t max_dynamic_smem = 227 * 1024;

/* Run body(arg) as every thread of every block of the grid. 0 on success; otherwise 1
 * with the reason in last_error() (also printed to stderr unless HPDL_EMU_QUIET=1). */
inline int launch(const char* name, dim3 grid, dim3 block, size_t dyn_smem, void (*body)(void*), void* arg) {
  if (launching) {
    std::fprintf(stderr, "hpdl_emu: kernel %s launched from inside a kernel (dynamic parallelism is not emulated)\n",
                 name ? name : "?");
    std::abort();
  }
  std::lock_guard<std::mutex> lock(g.mu);
  struct Flag {
    Flag() { launching = true; }
    ~Flag() { launching = false; }
  } flag;
  g.error.clear();
  g.aborted = false;
  unsigned long long threads = 0;
  bool ran = false;  // the blocks started: the order matters to the message
  if (block.x < 1 || block.y < 1 || block.z < 1 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
             (threads = 1ull * block.x * block.y * block.z) > 1024) {
    g.error = fmt("invalid block size (%u,%u,%u): each of x, y at most 1024, z at most 64, at most 1024 threads",
                  block.x, block.y, block.z);
  } else if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > 0x7fffffffu || grid.y > 65535 ||
             grid.z > 65535) {
    g.error = fmt("invalid grid size (%u,%u,%u)", grid.x, grid.y, grid.z);
  } else if (dyn_smem > max_dynamic_smem) {
    g.error = fmt("%zu bytes of dynamic shared memory: more than a block may have (%zu)", dyn_smem,
                  max_dynamic_smem);
  } else if ((ran = configure(size_t(threads), dyn_smem))) {
    for (unsigned i = 0; i < g.n; i++) {
      Fiber& f = g.fibers[i];
      f.linear = i;
      f.tid = uint3{i % block.x, i / block.x % block.y, i / (block.x * block.y)};
    }
    g.body = body;
    g.body_arg = arg;
    gridDim = grid;
    blockDim = block;
    /* block order: forward, reverse, or an affine permutation a*i+c mod total */
    unsigned long long total = 1ull * grid.x * grid.y * grid.z, a = 1, c = 0;
    if (g.order == Order::random) {
      do a = next_random() % total + 1; while (std::gcd(a, total) != 1);
      c = next_random() % total;
    }
    for (unsigned long long i = 0; i < total; i++) {
      unsigned long long k = i;
      if (g.order == Order::reverse) k = total - 1 - i;
      if (g.order == Order::random)  // a * i may pass 64 bits
        k = (__extension__(unsigned long long)((unsigned __int128)a * i % total) + c) % total;
      blockIdx = uint3{unsigned(k % grid.x), unsigned(k / grid.x % grid.y), unsigned(k / (1ull * grid.x * grid.y))};
      if (!run_block()) {
        g.error = fmt("block (%u,%u,%u) ", blockIdx.x, blockIdx.y, blockIdx.z) + g.error;
        break;
      }
    }
  }
  if (g.error.empty()) return 0;
  static const char* const orders[] = {"forward", "reverse", "random"};
  g.error = fmt("kernel %s <<<(%u,%u,%u), (%u,%u,%u), %zu>>>", name ? name : "?", grid.x, grid.y, grid.z, block.x,
                block.y, block.z, dyn_smem) +
            (ran ? fmt(" (order %s)", orders[int(g.order)]) : std::string()) + ": " + g.error;
  const char* quiet = std::getenv("HPDL_EMU_QUIET");
  if (!quiet || std::strcmp(quiet, "1") != 0) std::fprintf(stderr, "hpdl_emu: %s\n", g.error.c_str());
  return 1;
}

inline const char* last_error() { return g.error.c_str(); }
inline void* dynamic_smem() { return g.dyn; }

template <class T>
inline uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "warp shuffles move at most 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, &v, sizeof(T));
  return u;
}
template <class T>
inline T from_bits(uint64_t u) {
  T v;
  std::memcpy(&v, &u, sizeof(T));
  return v;
}

/* -------------------------------------------------------- 16-bit float bits */
inline unsigned short float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  unsigned short sign = static_cast<unsigned short>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return 0x7fff;                    // NaN (as CUDA's conversion gives)
  if (x >= 0x477ff000u) return sign | 0x7c00;            // >= 65520 rounds to infinity
  if (x < 0x38800000u) {                                 // below 2^-14: subnormal or zero
    float m = std::fabs(f) * 16777216.0f;                // in units of 2^-24, exact
    return sign | static_cast<unsigned short>(std::nearbyint(m));  // ties to even
  }
  uint32_t r = x - 0x38000000u;                          // rebias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);                        // round to nearest even
  return sign | static_cast<unsigned short>(r >> 13);
}
inline float half_bits_to_float(unsigned short h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0) {
    float v = float(m) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  x = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e + 112) << 23) | (m << 13));
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline unsigned short float_to_bf16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;    // NaN
  x += 0x7fffu + ((x >> 16) & 1u);                       // round to nearest even
  return static_cast<unsigned short>(x >> 16);
}
inline float bf16_bits_to_float(unsigned short h) {
  uint32_t x = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

}  // namespace hpdl_emu

/* =============================================================== host side */
/* Run kernel<<<grid, block, dyn_smem>>>(args...); 0 on success, 1 on an error (message
 * on stderr and in hpdl_emu_last_error()). Arguments convert to the kernel's
 * parameter types, as in a <<<>>> launch. */
template <class... P, class... A>
HPDL_EMU_HIDDEN int hpdl_emu_launch_named(const char* name, void (*kernel)(P...), dim3 grid, dim3 block,
                                          size_t dyn_smem, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "hpdl_emu_launch: wrong number of kernel arguments");
  std::tuple<typename std::decay<P>::type...> params(std::forward<A>(args)...);
  auto call = [&]() { std::apply(kernel, params); };  // each fiber copies the parameters
  return hpdl_emu::launch(
      name, grid, block, dyn_smem, [](void* p) { (*static_cast<decltype(call)*>(p))(); }, &call);
}
template <class... P, class... A>
HPDL_EMU_HIDDEN int hpdl_emu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t dyn_smem, A&&... args) {
  return hpdl_emu_launch_named(nullptr, kernel, grid, block, dyn_smem, std::forward<A>(args)...);
}
/* The same, naming the kernel in error messages. */
#define HPDL_EMU_LAUNCH(kernel, grid, block, dyn_smem, ...) \
  hpdl_emu_launch_named(#kernel, kernel, grid, block, dyn_smem, ##__VA_ARGS__)
HPDL_EMU_HIDDEN inline const char* hpdl_emu_last_error() { return hpdl_emu::last_error(); }

/* Dynamic shared memory (the launch's dyn_smem bytes, 128-byte aligned, poisoned at
 * each block start). Under CUDA: extern __shared__ __align__(16) T name[]. */
#define HPDL_DYNAMIC_SMEM(T, name) T* const name = reinterpret_cast<T*>(::hpdl_emu::dynamic_smem())

/* ============================================================ device built-ins */
/* Barriers. The call site is recorded: threads of a block that wait at different
 * __syncthreads() are reported as a divergent barrier. */
inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  hpdl_emu::block_op(hpdl_emu::B_SYNC, 0, file, line);
}
inline int __syncthreads_count(int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return int(hpdl_emu::block_op(hpdl_emu::B_COUNT, pred, file, line));
}
inline int __syncthreads_and(int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return int(hpdl_emu::block_op(hpdl_emu::B_AND, pred, file, line));
}
inline int __syncthreads_or(int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return int(hpdl_emu::block_op(hpdl_emu::B_OR, pred, file, line));
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  hpdl_emu::warp_op(hpdl_emu::W_SYNCWARP, mask, 0, 0, 32, file, line);
}
/* Lanes of the caller's warp that have not exited (fibers do not converge). */
inline unsigned __activemask() {
  hpdl_emu::Fiber& f = hpdl_emu::current("__activemask");
  return hpdl_emu::g.live[f.linear >> 5];
}
inline void __threadfence() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_signal_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap() {
  hpdl_emu::fail("__trap() called");
  hpdl_emu::stop();
}
[[noreturn]] inline void __brkpt() {
  hpdl_emu::fail("__brkpt() called");
  hpdl_emu::stop();
}
inline void __nanosleep(unsigned) {}
inline long long clock64() {
  static long long t = 0;
  return ++t;
}

/* Warp shuffles: T of at most 8 bytes (int, unsigned, float, double, long long, __half,
 * ...). A source lane that takes no part gives all-ones bits (NaN for floats). */
template <class T>
inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize, const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
  return hpdl_emu::from_bits<T>(
      hpdl_emu::warp_op(hpdl_emu::W_IDX, mask, hpdl_emu::to_bits(var), unsigned(srcLane), width, file, line));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return hpdl_emu::from_bits<T>(
      hpdl_emu::warp_op(hpdl_emu::W_UP, mask, hpdl_emu::to_bits(var), delta, width, file, line));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                          const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return hpdl_emu::from_bits<T>(
      hpdl_emu::warp_op(hpdl_emu::W_DOWN, mask, hpdl_emu::to_bits(var), delta, width, file, line));
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,
                         const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return hpdl_emu::from_bits<T>(
      hpdl_emu::warp_op(hpdl_emu::W_BFLY, mask, hpdl_emu::to_bits(var), unsigned(laneMask), width, file, line));
}
inline unsigned __ballot_sync(unsigned mask, int pred, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
  return unsigned(hpdl_emu::warp_op(hpdl_emu::W_BALLOT, mask, pred != 0, 0, 32, file, line));
}
inline int __any_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return int(hpdl_emu::warp_op(hpdl_emu::W_ANY, mask, pred != 0, 0, 32, file, line));
}
inline int __all_sync(unsigned mask, int pred, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  return int(hpdl_emu::warp_op(hpdl_emu::W_ALL, mask, pred != 0, 0, 32, file, line));
}
#define HPDL_EMU_REDUCE(fn, kind)                                                                         \
  inline unsigned fn(unsigned mask, unsigned v, const char* file = __builtin_FILE(),                     \
                     int line = __builtin_LINE()) {                                                      \
    return unsigned(hpdl_emu::warp_op(hpdl_emu::kind, mask, v, 0, 32, file, line));                      \
  }                                                                                                       \
  inline int fn(unsigned mask, int v, const char* file = __builtin_FILE(), int line = __builtin_LINE()) { \
    return int(uint32_t(hpdl_emu::warp_op(hpdl_emu::kind, mask, uint32_t(v), 1, 32, file, line)));       \
  }
HPDL_EMU_REDUCE(__reduce_add_sync, W_RADD)
HPDL_EMU_REDUCE(__reduce_min_sync, W_RMIN)
HPDL_EMU_REDUCE(__reduce_max_sync, W_RMAX)
#undef HPDL_EMU_REDUCE
inline unsigned __reduce_and_sync(unsigned mask, unsigned v, const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
  return unsigned(hpdl_emu::warp_op(hpdl_emu::W_RAND, mask, v, 0, 32, file, line));
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned v, const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
  return unsigned(hpdl_emu::warp_op(hpdl_emu::W_ROR, mask, v, 0, 32, file, line));
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned v, const char* file = __builtin_FILE(),
                                  int line = __builtin_LINE()) {
  return unsigned(hpdl_emu::warp_op(hpdl_emu::W_RXOR, mask, v, 0, 32, file, line));
}

/* Atomics. Fibers switch only at barriers and warp operations, so a read-modify-write
 * is atomic as it stands. */
#define HPDL_EMU_ATOMIC(name, T, expr)     \
  inline T name(T* address, T val) {       \
    T old = *address;                      \
    *address = (expr);                     \
    return old;                            \
  }
HPDL_EMU_ATOMIC(atomicAdd, int, int(unsigned(old) + unsigned(val)))
HPDL_EMU_ATOMIC(atomicAdd, unsigned int, old + val)
HPDL_EMU_ATOMIC(atomicAdd, unsigned long long, old + val)
HPDL_EMU_ATOMIC(atomicAdd, float, old + val)
HPDL_EMU_ATOMIC(atomicAdd, double, old + val)
HPDL_EMU_ATOMIC(atomicSub, int, int(unsigned(old) - unsigned(val)))
HPDL_EMU_ATOMIC(atomicSub, unsigned int, old - val)
HPDL_EMU_ATOMIC(atomicExch, int, val)
HPDL_EMU_ATOMIC(atomicExch, unsigned int, val)
HPDL_EMU_ATOMIC(atomicExch, unsigned long long, val)
HPDL_EMU_ATOMIC(atomicExch, float, val)
HPDL_EMU_ATOMIC(atomicMax, int, old > val ? old : val)
HPDL_EMU_ATOMIC(atomicMax, unsigned int, old > val ? old : val)
HPDL_EMU_ATOMIC(atomicMax, long long, old > val ? old : val)
HPDL_EMU_ATOMIC(atomicMax, unsigned long long, old > val ? old : val)
HPDL_EMU_ATOMIC(atomicMin, int, old < val ? old : val)
HPDL_EMU_ATOMIC(atomicMin, unsigned int, old < val ? old : val)
HPDL_EMU_ATOMIC(atomicMin, long long, old < val ? old : val)
HPDL_EMU_ATOMIC(atomicMin, unsigned long long, old < val ? old : val)
HPDL_EMU_ATOMIC(atomicAnd, int, old & val)
HPDL_EMU_ATOMIC(atomicAnd, unsigned int, old & val)
HPDL_EMU_ATOMIC(atomicAnd, unsigned long long, old & val)
HPDL_EMU_ATOMIC(atomicOr, int, old | val)
HPDL_EMU_ATOMIC(atomicOr, unsigned int, old | val)
HPDL_EMU_ATOMIC(atomicOr, unsigned long long, old | val)
HPDL_EMU_ATOMIC(atomicXor, int, old ^ val)
HPDL_EMU_ATOMIC(atomicXor, unsigned int, old ^ val)
HPDL_EMU_ATOMIC(atomicXor, unsigned long long, old ^ val)
HPDL_EMU_ATOMIC(atomicInc, unsigned int, old >= val ? 0u : old + 1)
HPDL_EMU_ATOMIC(atomicDec, unsigned int, (old == 0 || old > val) ? val : old - 1)
#undef HPDL_EMU_ATOMIC
#define HPDL_EMU_CAS(T)                              \
  inline T atomicCAS(T* address, T compare, T val) { \
    T old = *address;                                \
    if (old == compare) *address = val;              \
    return old;                                      \
  }
HPDL_EMU_CAS(int)
HPDL_EMU_CAS(unsigned int)
HPDL_EMU_CAS(unsigned long long)
HPDL_EMU_CAS(unsigned short)
#undef HPDL_EMU_CAS

/* Loads and stores with cache hints: plain memory here. */
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __ldca(const T* p) { return *p; }
template <class T> inline T __ldcs(const T* p) { return *p; }
template <class T> inline T __ldlu(const T* p) { return *p; }
template <class T> inline T __ldcv(const T* p) { return *p; }
template <class T> inline void __stcg(T* p, T v) { *p = v; }
template <class T> inline void __stcs(T* p, T v) { *p = v; }
template <class T> inline void __stwb(T* p, T v) { *p = v; }
template <class T> inline void __stwt(T* p, T v) { *p = v; }

/* ------------------------------------------------------------------------ math */
/* The fast intrinsics map to the accurate <cmath> functions: results here are at
 * least as accurate as on the GPU, whose __expf etc. are approximations. */
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;
inline float __expf(float x) { return ::expf(x); }
inline float __exp10f(float x) { return ::powf(10.0f, x); }
inline float __logf(float x) { return ::logf(x); }
inline float __log2f(float x) { return ::log2f(x); }
inline float __log10f(float x) { return ::log10f(x); }
inline float __powf(float x, float y) { return ::powf(x, y); }
inline float __sinf(float x) { return ::sinf(x); }
inline float __cosf(float x) { return ::cosf(x); }
inline float __tanf(float x) { return ::tanf(x); }
inline void __sincosf(float x, float* s, float* c) { *s = ::sinf(x); *c = ::cosf(x); }
inline float rsqrtf(float x) { return 1.0f / ::sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / ::sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / ::cbrtf(x); }
inline float normcdff(float x) { return 0.5f * ::erfcf(-x * 0.70710678118654752f); }
inline double normcdf(double x) { return 0.5 * ::erfc(-x * 0.70710678118654752); }
inline float __fdividef(float a, float b) { return a / b; }
inline float fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __frsqrt_rn(float x) { return 1.0f / ::sqrtf(x); }
inline float __fsqrt_rn(float x) { return ::sqrtf(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return ::fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return ::fma(a, b, c); }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }

/* float -> integer conversions saturate and send NaN to 0, as cvt does */
namespace hpdl_emu HPDL_EMU_HIDDEN {
template <class I>
inline I cvt(double r) {
  if (r != r) return 0;
  if (r <= double(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (r >= double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(r);
}
}  // namespace hpdl_emu
inline int __float2int_rn(float x) { return hpdl_emu::cvt<int>(std::nearbyint(double(x))); }
inline int __float2int_rz(float x) { return hpdl_emu::cvt<int>(std::trunc(double(x))); }
inline int __float2int_rd(float x) { return hpdl_emu::cvt<int>(std::floor(double(x))); }
inline int __float2int_ru(float x) { return hpdl_emu::cvt<int>(std::ceil(double(x))); }
inline unsigned __float2uint_rn(float x) { return hpdl_emu::cvt<unsigned>(std::nearbyint(double(x))); }
inline unsigned __float2uint_rz(float x) { return hpdl_emu::cvt<unsigned>(std::trunc(double(x))); }
inline long long __float2ll_rn(float x) { return hpdl_emu::cvt<long long>(std::nearbyint(double(x))); }
inline long long __float2ll_rz(float x) { return hpdl_emu::cvt<long long>(std::trunc(double(x))); }
inline int __double2int_rn(double x) { return hpdl_emu::cvt<int>(std::nearbyint(x)); }
inline float __int2float_rn(int x) { return float(x); }
inline float __uint2float_rn(unsigned x) { return float(x); }
inline float __ll2float_rn(long long x) { return float(x); }
inline float __double2float_rn(double x) { return float(x); }

inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline unsigned __float_as_uint(float x) { unsigned i; std::memcpy(&i, &x, 4); return i; }
inline float __int_as_float(int i) { float x; std::memcpy(&x, &i, 4); return x; }
inline float __uint_as_float(unsigned i) { float x; std::memcpy(&x, &i, 4); return x; }
inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }
inline double __longlong_as_double(long long i) { double x; std::memcpy(&x, &i, 8); return x; }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  x = ((x >> 8) & 0x00ff00ffu) | ((x & 0x00ff00ffu) << 8);
  return (x >> 16) | (x << 16);
}
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((1ull * a * b) >> 32); }
inline int __mulhi(int a, int b) { return int((1ll * a * b) >> 32); }
inline int __mul24(int a, int b) { return int(unsigned(a << 8 >> 8) * unsigned(b << 8 >> 8)); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }

/* CUDA's overloaded min / max of the device library */
#define HPDL_EMU_MINMAX(T)                            \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
HPDL_EMU_MINMAX(int)
HPDL_EMU_MINMAX(unsigned int)
HPDL_EMU_MINMAX(long long)
HPDL_EMU_MINMAX(unsigned long long)
#undef HPDL_EMU_MINMAX
inline float min(float a, float b) { return ::fminf(a, b); }
inline float max(float a, float b) { return ::fmaxf(a, b); }
inline double min(double a, double b) { return ::fmin(a, b); }
inline double max(double a, double b) { return ::fmax(a, b); }
inline unsigned umin(unsigned a, unsigned b) { return b < a ? b : a; }
inline unsigned umax(unsigned a, unsigned b) { return a < b ? b : a; }

/* -------------------------------------------------------------- __half, bf16 */
/* 16-bit storage types, round to nearest even on conversion. Arithmetic on them goes
 * through float and rounds once (exact for + - * /: float has over 2p+2 bits). */
#define HPDL_EMU_HALF_TYPE(H, TO_BITS, FROM_BITS)                                                           \
  struct __attribute__((aligned(2))) H {                                                                   \
    unsigned short __x;                                                                                    \
    H() = default;                                                                                         \
    H(float f) : __x(hpdl_emu::TO_BITS(f)) {}                                                              \
    H(double f) : __x(hpdl_emu::TO_BITS(float(f))) {}                                                      \
    H(int i) : __x(hpdl_emu::TO_BITS(float(i))) {}                                                         \
    operator float() const { return hpdl_emu::FROM_BITS(__x); }                                            \
    H& operator+=(H o) { return *this = H(float(*this) + float(o)); }                                      \
    H& operator-=(H o) { return *this = H(float(*this) - float(o)); }                                      \
    H& operator*=(H o) { return *this = H(float(*this) * float(o)); }                                      \
    H& operator/=(H o) { return *this = H(float(*this) / float(o)); }                                      \
  };                                                                                                       \
  inline H operator+(H a, H b) { return H(float(a) + float(b)); }                                          \
  inline H operator-(H a, H b) { return H(float(a) - float(b)); }                                          \
  inline H operator*(H a, H b) { return H(float(a) * float(b)); }                                          \
  inline H operator/(H a, H b) { return H(float(a) / float(b)); }                                          \
  inline H operator-(H a) {                                                                                \
    H r;                                                                                                   \
    r.__x = static_cast<unsigned short>(a.__x ^ 0x8000u);                                                  \
    return r;                                                                                              \
  }                                                                                                        \
  inline bool operator==(H a, H b) { return float(a) == float(b); }                                        \
  inline bool operator!=(H a, H b) { return float(a) != float(b); }                                        \
  inline bool operator<(H a, H b) { return float(a) < float(b); }                                          \
  inline bool operator>(H a, H b) { return float(a) > float(b); }                                          \
  inline bool operator<=(H a, H b) { return float(a) <= float(b); }                                        \
  inline bool operator>=(H a, H b) { return float(a) >= float(b); }
HPDL_EMU_HALF_TYPE(__half, float_to_half_bits, half_bits_to_float)
HPDL_EMU_HALF_TYPE(__nv_bfloat16, float_to_bf16_bits, bf16_bits_to_float)
#undef HPDL_EMU_HALF_TYPE
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;
struct __attribute__((aligned(4))) __half2 {
  __half x, y;
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
typedef __half2 half2;
typedef __nv_bfloat162 nv_bfloat162;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return float(h); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline __half2 __float2half2_rn(float f) { return __half2{__half(f), __half(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float22half2_rn(float2 f) { return __half2{__half(f.x), __half(f.y)}; }
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 h; h.__x = u; return h; }
inline __nv_bfloat162 __float2bfloat162_rn(float f) { return __nv_bfloat162{__nv_bfloat16(f), __nv_bfloat16(f)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) {
  return __nv_bfloat162{__nv_bfloat16(f.x), __nv_bfloat16(f.y)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }
inline float __low2float(__nv_bfloat162 h) { return float(h.x); }
inline float __high2float(__nv_bfloat162 h) { return float(h.y); }
#define HPDL_EMU_HALF_OPS(H)                                              \
  inline H __hadd(H a, H b) { return a + b; }                            \
  inline H __hsub(H a, H b) { return a - b; }                            \
  inline H __hmul(H a, H b) { return a * b; }                            \
  inline H __hdiv(H a, H b) { return a / b; }                            \
  inline H __hneg(H a) { return -a; }                                    \
  inline H __hmax(H a, H b) { return H(::fmaxf(float(a), float(b))); }  \
  inline H __hmin(H a, H b) { return H(::fminf(float(a), float(b))); }
HPDL_EMU_HALF_OPS(__half)
HPDL_EMU_HALF_OPS(__nv_bfloat16)
#undef HPDL_EMU_HALF_OPS

#endif /* __CUDACC__ */
#endif /* HPDL_CUDA_EMU_H */
