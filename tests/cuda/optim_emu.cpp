/* optim_emu.cpp - kernels/hpdl_optim.cuh's multi-tensor AdamW and SGD, run on the CPU
 * through the emulation harness (kernels/cuda_emu.h), against runtime/optim.c's
 * functions called directly, as train.c calls them: bit for bit (CTest cuda.optim.adamw,
 * cuda.optim.sgd; driver tests/cuda/optim_emu.py).
 *
 *     optim_emu adamw|sgd
 *
 * Ten tensors of awkward sizes (1, 3, 4097, 65541, 4, 0, 1000, 65536, 7, 33), some with
 * weight decay and some without, laid one after another in four pools as the runtime
 * lays them (one allocation each), then the same with every pool one float off 16 bytes
 * and canaries between the tensors (the scalar head of each chunk, then float4), and a
 * ZeRO-like shard whose moments start at another alignment than its parameters (the
 * scalar path); each cut into chunks of 65536, 4096, 1000 and 37 elements, launched with
 * grids smaller and larger than the table and blocks of 256, 128 and 32 threads. Five
 * steps each, with a warmup and a cosine schedule, gradients of magnitudes 1e-9 .. 10
 * (zeros and subnormals among them) clipped on every other step. The table and the
 * step's arguments are built by the C helpers (optim_emu_c.c, compiled as C11).
 *
 * Checked after every step: the parameters and moments equal optim.c's bit for bit
 * (the maximum ulp difference is printed when not), nothing outside the tensors was
 * written (canaries), the gradients were not written. Then the test shows it would see
 * a contracted multiply-add: optim.c's formulas with fmaf where nvcc would put one
 * differ from optim.c in some values. */
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hpdl_optim.cuh"

extern "C" {
#include "half.h"
#include "optim.h"

long long optim_emu_c_build(const hpdl_optim_tensor *t, int n, int chunk_elems, hpdl_optim_chunk *out, long long cap);
void optim_emu_c_layout(long long out[12]);
hpdl_adamw_args optim_emu_c_adamw_args(double lr, double beta1, double beta2, double eps, double wd, long long t,
                                       double scale);
hpdl_sgd_args optim_emu_c_sgd_args(double lr, double momentum, double wd, long long t, double scale);
}

static int g_failures = 0;

static bool check(bool cond, const std::string &what) {
  if (!cond) {
    std::printf("%s: FAIL\n", what.c_str());
    g_failures++;
  }
  return cond;
}

#include "../cuda_emu/rng.h" /* Rng */

static uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

/* Distance in units in the last place (floats ordered as integers). */
static uint64_t ulps(float a, float b) {
  auto key = [](float x) -> int64_t {
    int32_t i = int32_t(bits(x));
    return i < 0 ? int64_t(INT32_MIN) - int64_t(i) : int64_t(i);
  };
  int64_t d = key(a) - key(b);
  return uint64_t(d < 0 ? -d : d);
}

static const float CANARY = -12345.0f;
static const long long SIZES[] = {1, 3, 4097, 65541, 4, 0, 1000, 65536, 7, 33};
static const int DECAY[] = {0, 0, 1, 1, 0, 1, 1, 1, 0, 0}; /* biases, norms: none */
static const int NT = int(sizeof SIZES / sizeof SIZES[0]);
static const int STEPS = 5;

/* Where the tensors lie: each pool's first tensor starts `shift` floats past a 16-byte
 * boundary, and `gap` canary floats separate consecutive tensors. */
struct Layout {
  const char *name;
  int shift[4]; /* p, g, m, v */
  int gap;
};
static const Layout LAYOUTS[] = {
    {"runtime pools", {0, 0, 0, 0}, 0},
    {"pools 1 float off 16 B, gaps of 3", {1, 1, 1, 1}, 3},
    {"zero shard (moments 2 floats apart)", {0, 0, 2, 2}, 0},
    {"gradient pool 3 floats off, gaps of 1", {0, 3, 0, 0}, 1},
};

struct Launch {
  int chunk;
  long long grid; /* 0: hpdl_optim_grid(nchunks) */
  int block;
};
static const Launch LAUNCHES[] = {{HPDL_OPTIM_CHUNK, 0, 256}, {4096, 5, 256}, {1000, -1, 128}, {37, 64, 32}};

/* Four pools with 64 canary floats before and after; off[i]: tensor i's offset. */
struct Pools {
  std::vector<float4> store[4];
  float *base[4];
  std::vector<long long> off;
  long long len = 0; /* elements from base[k] to the end of the last tensor */
  Pools(const Layout &L, bool with_m, bool with_v) {
    long long o = 0;
    for (int i = 0; i < NT; i++) {
      off.push_back(o);
      o += SIZES[i] + L.gap;
    }
    len = o;
    for (int k = 0; k < 4; k++) {
      base[k] = nullptr;
      if ((k == 2 && !with_m) || (k == 3 && !with_v)) continue;
      store[k].assign(size_t(len + 128) / 4 + 2, make_float4(CANARY, CANARY, CANARY, CANARY));
      base[k] = reinterpret_cast<float *>(store[k].data()) + 64 + L.shift[k];
    }
  }
  float *at(int k, int i) const { return base[k] ? base[k] + off[i] : nullptr; }
  size_t floats(int k) const { return store[k].size() * 4; }
  float *raw(int k) { return reinterpret_cast<float *>(store[k].data()); }
  /* Every float outside the tensors is still the canary. */
  bool intact(int k) const {
    const float *r = reinterpret_cast<const float *>(store[k].data());
    long long b = base[k] - r, t = 0;
    for (long long j = 0; j < (long long)floats(k); j++) {
      while (t < NT && j >= b + off[t] + SIZES[t]) t++;
      bool inside = t < NT && j >= b + off[t];
      if (!inside && bits(r[j]) != bits(CANARY)) return false;
    }
    return true;
  }
};

/* got against want, element by element over the whole store (canaries too). */
static bool same(const char *what, const std::string &ctx, const Pools &got, const Pools &want, int k) {
  const float *a = reinterpret_cast<const float *>(got.store[k].data());
  const float *b = reinterpret_cast<const float *>(want.store[k].data());
  size_t n = got.floats(k), diff = 0;
  uint64_t worst = 0;
  for (size_t j = 0; j < n; j++)
    if (bits(a[j]) != bits(b[j])) {
      diff++;
      uint64_t u = ulps(a[j], b[j]);
      if (u > worst) worst = u;
    }
  if (diff)
    std::printf("%s: %s differs from optim.c in %zu values, at most %" PRIu64 " ulp\n", ctx.c_str(), what, diff,
                worst);
  return check(diff == 0, ctx + ": " + what + " bit for bit");
}

static void fill_grads(Rng &rng, Pools &P, double factor) {
  for (int i = 0; i < NT; i++) {
    float *g = P.at(1, i);
    for (long long j = 0; j < SIZES[i]; j++) {
      double r = rng.uniform(0, 1), sign = rng.uniform(0, 1) < 0.5 ? -1.0 : 1.0;
      float x;
      if (r < 0.01) x = 0.0f;
      else if (r < 0.02) x = float(sign * 1e-41 * rng.uniform(1, 100)); /* subnormal */
      else x = float(sign * factor * std::pow(10.0, rng.uniform(-9, 1)));
      g[j] = x;
    }
  }
}

static void fill_state(Rng &rng, Pools &P, bool sgd) {
  for (int i = 0; i < NT; i++)
    for (long long j = 0; j < SIZES[i]; j++) {
      P.at(0, i)[j] = float(rng.uniform(-1, 1));
      if (P.base[2]) P.at(2, i)[j] = sgd ? NAN : float(rng.uniform(-1e-2, 1e-2)); /* SGD: not read at t = 1 */
      if (P.base[3]) P.at(3, i)[j] = float(rng.uniform(0, 1e-4) * rng.uniform(0, 1));
    }
}

static std::vector<hpdl_optim_tensor> tensors_of(Pools &P) {
  std::vector<hpdl_optim_tensor> t(NT);
  for (int i = 0; i < NT; i++)
    t[i] = hpdl_optim_tensor{P.at(0, i), P.at(1, i), P.at(2, i), P.at(3, i), SIZES[i], DECAY[i]};
  return t;
}

static void config(OptimConfig *c, bool sgd, double momentum) {
  optim_defaults(c);
  c->kind = sgd ? OPTIM_SGD : OPTIM_ADAMW;
  c->lr = sgd ? 0.05 : 1e-3;
  c->min_lr = c->lr / 10;
  c->momentum = momentum;
  c->beta1 = 0.9;
  c->beta2 = 0.95;
  c->eps = 1e-8;
  c->weight_decay = sgd ? 0.01 : 0.1;
  c->warmup = 2;
  c->total_steps = STEPS;
  c->decay = OPTIM_DECAY_COSINE;
  c->clip = 1.0;
}

/* One layout, one launch shape, STEPS steps; returns the values compared. */
static long long run_case(bool sgd, double momentum, const Layout &L, const Launch &X) {
  OptimConfig cfg;
  config(&cfg, sgd, momentum);
  const bool with_m = !sgd || momentum != 0, with_v = !sgd;
  Pools gpu(L, with_m, with_v), cpu(L, with_m, with_v);
  Rng rng(sgd ? 7 : 5);
  fill_state(rng, gpu, sgd);
  for (int k = 0; k < 4; k++)
    if (gpu.base[k]) cpu.store[k] = gpu.store[k];

  std::vector<hpdl_optim_tensor> tg = tensors_of(gpu);
  long long nchunks = hpdl_optim_count_chunks(tg.data(), NT, X.chunk);
  std::vector<hpdl_optim_chunk> table(static_cast<size_t>(nchunks)), table_cxx(static_cast<size_t>(nchunks));
  long long rows = optim_emu_c_build(tg.data(), NT, X.chunk, table.data(), nchunks);
  char ctxbuf[256];
  unsigned grid = X.grid == 0 ? hpdl_optim_grid(nchunks) : X.grid < 0 ? unsigned(nchunks) : unsigned(X.grid);
  std::snprintf(ctxbuf, sizeof ctxbuf, "%s%s, %s, chunk %d (%lld rows), grid %u x %d", sgd ? "sgd" : "adamw",
                sgd ? (momentum != 0 ? " momentum" : " no momentum") : "", L.name, X.chunk, nchunks, grid, X.block);
  const std::string ctx = ctxbuf;
  check(rows == nchunks, ctx + ": the C helper wrote every row");
  check(hpdl_optim_build_chunks(tg.data(), NT, X.chunk, table_cxx.data()) == nchunks &&
            std::memcmp(table.data(), table_cxx.data(), table.size() * sizeof table[0]) == 0,
        ctx + ": the C and C++ tables agree");
  long long covered = 0;
  for (const hpdl_optim_chunk &c : table) covered += c.count;
  long long total = 0;
  for (long long n : SIZES) total += n;
  check(covered == total, ctx + ": the table covers every element once");

  long long compared = 0;
  for (int s = 0; s < STEPS; s++) {
    fill_grads(rng, gpu, s % 2 ? 1e-5 : 1.0); /* odd steps below the clip norm */
    cpu.store[1] = gpu.store[1];
    std::vector<float4> g_before = gpu.store[1];
    /* train.c: the norm over every tensor, the schedule, the clip, then the update */
    double sumsq = 0;
    for (int i = 0; i < NT; i++) sumsq += optim_sumsq(cpu.at(1, i), SIZES[i]);
    double lr = optim_lr_at(&cfg, s), scale = optim_clip_scale(std::sqrt(sumsq), cfg.clip);
    for (int i = 0; i < NT; i++) {
      if (scale != 1.0) optim_scale(cpu.at(1, i), SIZES[i], scale);
      double wd = DECAY[i] ? cfg.weight_decay : 0.0;
      if (sgd) optim_sgd(cpu.at(0, i), cpu.at(1, i), cpu.at(2, i), SIZES[i], s + 1, lr, wd, &cfg);
      else optim_adamw(cpu.at(0, i), cpu.at(1, i), cpu.at(2, i), cpu.at(3, i), SIZES[i], s + 1, lr, wd, &cfg);
    }
    int rc;
    if (sgd) {
      hpdl_sgd_args a = optim_emu_c_sgd_args(lr, cfg.momentum, cfg.weight_decay, s + 1, scale);
      hpdl_sgd_args b = hpdl_sgd_make_args(lr, cfg.momentum, cfg.weight_decay, s + 1, scale);
      check(std::memcmp(&a, &b, sizeof a) == 0, ctx + ": C and C++ arguments agree");
      rc = HPDL_EMU_LAUNCH(hpdl_sgd_f32, dim3(grid), dim3(X.block), 0, table.data(), nchunks, a);
    } else {
      hpdl_adamw_args a = optim_emu_c_adamw_args(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, s + 1, scale);
      hpdl_adamw_args b = hpdl_adamw_make_args(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, s + 1, scale);
      check(std::memcmp(&a, &b, sizeof a) == 0, ctx + ": C and C++ arguments agree");
      rc = HPDL_EMU_LAUNCH(hpdl_adamw_f32, dim3(grid), dim3(X.block), 0, table.data(), nchunks, a);
    }
    std::string step = ctx + ", step " + std::to_string(s + 1) + (scale != 1.0 ? " (clipped)" : "");
    if (!check(rc == 0, step + ": launch (" + std::string(rc ? hpdl_emu_last_error() : "") + ")")) return compared;
    same("parameters", step, gpu, cpu, 0);
    if (with_m) same(sgd ? "momentum" : "first moment", step, gpu, cpu, 2);
    if (with_v) same("second moment", step, gpu, cpu, 3);
    check(std::memcmp(g_before.data(), gpu.store[1].data(), g_before.size() * sizeof(float4)) == 0,
          step + ": gradients not written");
    for (int k = 0; k < 4; k++)
      if (gpu.base[k] && k != 1) check(gpu.intact(k), step + ": nothing written outside the tensors (pool " +
                                                          std::to_string(k) + ")");
    compared += total * (1 + with_m + with_v);
  }
  std::printf("%-100s %d steps, %lld values: %s\n", ctx.c_str(), STEPS, compared,
              g_failures ? "(failures so far)" : "bit for bit");
  return compared;
}

/* The bf16-moment kernels (hpdl_adamw_bf16m, hpdl_sgd_bf16m) against optim.c's
 * optim_adamw16_mt / optim_sgd16_mt on one thread: the same ten tensors one after
 * another (fp32 parameters and gradients, 16-bit moments with canaries between the
 * tensors), five steps clipped every other step, bit for bit after each; nothing
 * outside the tensors written. sh = 1 puts the moments one value further on, so that
 * no element is at the same place in the moments' 8-byte groups as in the
 * parameters' 16-byte ones (the kernels' one-a-thread path throughout; sh = 0 takes
 * the four-wide path between each chunk's head and tail). Returns the values compared. */
static long long run_case16(bool sgd, double momentum, const Launch &X, int sh) {
  OptimConfig cfg;
  config(&cfg, sgd, momentum);
  const bool with_m = !sgd || momentum != 0, with_v = !sgd;
  const uint16_t CANARY16 = 0xBEEF;
  std::vector<long long> off;
  long long len = 0;
  for (int i = 0; i < NT; i++) off.push_back(len), len += SIZES[i] + 1; /* a canary after each */
  std::vector<float> p(size_t(len) + 1), g(size_t(len) + 1), pc, gc;
  std::vector<uint16_t> m(size_t(len) + 2, CANARY16), v(size_t(len) + 2, CANARY16), mc, vc;
  Rng rng(sgd ? 17 : 15);
  for (int i = 0; i < NT; i++)
    for (long long j = 0; j < SIZES[i]; j++) {
      p[size_t(off[i] + j)] = float(rng.uniform(-1, 1));
      m[size_t(sh + off[i] + j)] = sgd ? 0x7fc0 : half_bf16_from_f32(float(rng.uniform(-1e-2, 1e-2))); /* SGD: not read at t = 1 */
      v[size_t(sh + off[i] + j)] = half_bf16_from_f32(float(rng.uniform(0, 1e-4) * rng.uniform(0, 1)));
    }
  pc = p, mc = m, vc = v;
  std::vector<hpdl_optim_tensor> t(NT);
  for (int i = 0; i < NT; i++)
    t[i] = hpdl_optim_tensor{p.data() + off[i], g.data() + off[i], with_m ? reinterpret_cast<float *>(m.data() + sh + off[i]) : nullptr,
                             with_v ? reinterpret_cast<float *>(v.data() + sh + off[i]) : nullptr, SIZES[i], DECAY[i]};
  long long nchunks = hpdl_optim_count_chunks(t.data(), NT, X.chunk);
  std::vector<hpdl_optim_chunk> table(static_cast<size_t>(nchunks));
  hpdl_optim_build_chunks(t.data(), NT, X.chunk, table.data());
  unsigned grid = X.grid == 0 ? hpdl_optim_grid(nchunks) : X.grid < 0 ? unsigned(nchunks) : unsigned(X.grid);
  char ctxbuf[200];
  std::snprintf(ctxbuf, sizeof ctxbuf, "%s bf16 moments%s%s, chunk %d (%lld rows), grid %u x %d", sgd ? "sgd" : "adamw",
                sgd ? (momentum != 0 ? " momentum" : " no momentum") : "", sh ? " a value off the parameters' alignment" : "",
                X.chunk, nchunks, grid, X.block);
  const std::string ctx = ctxbuf;
  long long compared = 0, total = 0;
  for (long long n : SIZES) total += n;
  for (int s = 0; s < STEPS; s++) {
    for (int i = 0; i < NT; i++)
      for (long long j = 0; j < SIZES[i]; j++) {
        double r = rng.uniform(0, 1), sign = rng.uniform(0, 1) < 0.5 ? -1.0 : 1.0;
        g[size_t(off[i] + j)] = r < 0.01 ? 0.0f : float(sign * (s % 2 ? 1e-5 : 1.0) * std::pow(10.0, rng.uniform(-9, 1)));
      }
    gc = g;
    double sumsq = 0;
    for (int i = 0; i < NT; i++) sumsq += optim_sumsq(gc.data() + off[i], SIZES[i]);
    double lr = optim_lr_at(&cfg, s), scale = optim_clip_scale(std::sqrt(sumsq), cfg.clip);
    for (int i = 0; i < NT; i++) {
      double wd = DECAY[i] ? cfg.weight_decay : 0.0;
      float *pi = pc.data() + off[i];
      const float *gi = gc.data() + off[i];
      if (sgd) optim_sgd16_mt(1, pi, gi, with_m ? mc.data() + sh + off[i] : nullptr, SIZES[i], s + 1, lr, wd, &cfg, scale, nullptr);
      else optim_adamw16_mt(1, pi, gi, mc.data() + sh + off[i], vc.data() + sh + off[i], SIZES[i], s + 1, lr, wd, &cfg, scale, nullptr);
    }
    int rc;
    if (sgd)
      rc = HPDL_EMU_LAUNCH(hpdl_sgd_bf16m, dim3(grid), dim3(X.block), 0, table.data(), nchunks,
                           hpdl_sgd_make_args(lr, cfg.momentum, cfg.weight_decay, s + 1, scale));
    else
      rc = HPDL_EMU_LAUNCH(hpdl_adamw_bf16m, dim3(grid), dim3(X.block), 0, table.data(), nchunks,
                           hpdl_adamw_make_args(lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, s + 1, scale));
    std::string step = ctx + ", step " + std::to_string(s + 1) + (scale != 1.0 ? " (clipped)" : "");
    if (!check(rc == 0, step + ": launch (" + std::string(rc ? hpdl_emu_last_error() : "") + ")")) return compared;
    size_t dp = 0, dm = 0, dv = 0;
    for (size_t j = 0; j < p.size(); j++) {
      dp += bits(p[j]) != bits(pc[j]);
      dm += with_m && m[j] != mc[j];
      dv += with_v && v[j] != vc[j];
    }
    if (dp || dm || dv) std::printf("%s: %zu parameters, %zu m, %zu v differ from optim.c\n", step.c_str(), dp, dm, dv);
    check(dp == 0 && dm == 0 && dv == 0, step + ": bit for bit");
    bool intact = !sh || (m[0] == CANARY16 && v[0] == CANARY16);
    for (int i = 0; i < NT; i++)
      intact = intact && m[size_t(sh + off[i] + SIZES[i])] == CANARY16 && v[size_t(sh + off[i] + SIZES[i])] == CANARY16;
    check(intact, step + ": nothing written outside the 16-bit moments");
    compared += total * (1 + with_m + with_v);
  }
  std::printf("%-100s %d steps, %lld values: %s\n", ctx.c_str(), STEPS, compared, g_failures ? "(failures so far)" : "bit for bit");
  return compared;
}

/* optim.c's element update with the multiply-adds nvcc would contract by default:
 * what the explicit __f*_rn operations prevent. Values differing from optim.c. */
static void fma_sensitivity(bool sgd) {
  OptimConfig cfg;
  config(&cfg, sgd, 0.9);
  Rng rng(11);
  const int n = 100000;
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int i = 0; i < n; i++) {
    p[i] = float(rng.uniform(-1, 1));
    g[i] = float(rng.uniform(-1, 1) * std::pow(10.0, rng.uniform(-6, 0)));
    m[i] = float(rng.uniform(-1e-2, 1e-2));
    v[i] = float(rng.uniform(0, 1e-4));
  }
  std::vector<float> p2 = p, m2 = m, v2 = v;
  const double lr = 1e-3, wd = 0.1;
  const long long t = 3;
  size_t diff = 0;
  uint64_t worst = 0;
  if (sgd) {
    optim_sgd(p.data(), g.data(), m.data(), n, t, lr, wd, &cfg);
    const float mu = float(cfg.momentum), w = float(wd), step = float(lr);
    for (int i = 0; i < n; i++) {
      float gi = std::fmaf(w, p2[i], g[i]);
      gi = std::fmaf(mu, m2[i], gi);
      m2[i] = gi;
      p2[i] = std::fmaf(-step, gi, p2[i]);
    }
  } else {
    optim_adamw(p.data(), g.data(), m.data(), v.data(), n, t, lr, wd, &cfg);
    hpdl_adamw_args a = hpdl_adamw_make_args(lr, cfg.beta1, cfg.beta2, cfg.eps, wd, t, 1.0);
    const float omb1 = 1.0f - a.beta1, omb2 = 1.0f - a.beta2;
    for (int i = 0; i < n; i++) {
      float mi = std::fmaf(a.beta1, m2[i], omb1 * g[i]);
      float vi = std::fmaf(a.beta2, v2[i], omb2 * g[i] * g[i]);
      m2[i] = mi;
      v2[i] = vi;
      p2[i] = std::fmaf(p2[i], a.decay[1], -(a.lr * (mi / a.bc1) / (std::sqrt(vi / a.bc2) + a.eps)));
    }
  }
  for (int i = 0; i < n; i++)
    if (bits(p[i]) != bits(p2[i])) {
      diff++;
      if (ulps(p[i], p2[i]) > worst) worst = ulps(p[i], p2[i]);
    }
  std::printf("%s with contracted multiply-adds (nvcc's default without __f*_rn): %zu of %d parameters differ "
              "from optim.c, at most %" PRIu64 " ulp\n",
              sgd ? "sgd" : "adamw", diff, n, worst);
  check(diff > 0, "the comparison would see a contracted multiply-add");
}

int main(int argc, char **argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what != "adamw" && what != "sgd") {
    std::fprintf(stderr, "usage: optim_emu adamw|sgd\n");
    return 2;
  }
  /* the layout as the C compiler and this C++ compiler see it */
  typedef long long L;
  L c[12], cxx[12] = {L(sizeof(hpdl_optim_chunk)),           L(offsetof(hpdl_optim_chunk, g)),
                      L(offsetof(hpdl_optim_chunk, m)),       L(offsetof(hpdl_optim_chunk, v)),
                      L(offsetof(hpdl_optim_chunk, offset)),  L(offsetof(hpdl_optim_chunk, count)),
                      L(offsetof(hpdl_optim_chunk, flags)),   L(sizeof(hpdl_adamw_args)),
                      L(offsetof(hpdl_adamw_args, decay)),    L(sizeof(hpdl_sgd_args)),
                      L(offsetof(hpdl_sgd_args, first)),      L(sizeof(hpdl_optim_tensor))};
  optim_emu_c_layout(c);
  check(std::memcmp(c, cxx, sizeof c) == 0, "C and C++ agree on the table's layout");
  long long values = 0;
  const bool sgd = what == "sgd";
  for (double momentum : sgd ? std::vector<double>{0.9, 0.0} : std::vector<double>{0.0})
    for (const Layout &L : LAYOUTS)
      for (const Launch &X : LAUNCHES) values += run_case(sgd, momentum, L, X);
  for (double momentum : sgd ? std::vector<double>{0.9, 0.0} : std::vector<double>{0.0})
    for (int sh : {0, 1}) /* 1: the moments' 8-byte groups out of step with the parameters' */
      for (const Launch &X : LAUNCHES) values += run_case16(sgd, momentum, X, sh);
  fma_sensitivity(sgd);
  std::printf("optim_emu %s: %lld values compared, %s\n", what.c_str(), values,
              g_failures ? "FAILED" : "all bit for bit with runtime/optim.c");
  return g_failures ? 1 : 0;
}
