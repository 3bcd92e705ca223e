/* warp_test.cpp - runs warp.cu's kernels and checks each lane's results against the
 * CUDA Programming Guide's description of the primitives, written here independently
 * of the harness (which follows PTX's shfl.sync pseudocode):
 *   shfl(var, src, w): lane (lane / w) * w + src % w
 *   shfl_up(d, w):     lane - d, unless lane % w < d (own value)
 *   shfl_down(d, w):   lane + d, unless lane % w + d >= w (own value)
 *   shfl_xor(m, w):    lane ^ m, unless that lies in a later group of w (own value)
 * Blocks of 64 and of (16, 4) threads; the atomics over a grid of 5 blocks. */
#include <string>
#include "common.h"

extern "C" void shuffles(double* out);
extern "C" void votes(unsigned* out);
extern "C" void block_votes(int* out);
extern "C" void atomics(const int* data, int n, int* counters, unsigned long long* big, float* fsum, unsigned* hist,
                        int bins);

static unsigned src_idx(unsigned lane, int s, int w) { return lane / w * w + unsigned(s) % w; }
static unsigned src_up(unsigned lane, unsigned d, int w) { return lane % w < d ? lane : lane - d; }
static unsigned src_down(unsigned lane, unsigned d, int w) { return lane % w + d >= unsigned(w) ? lane : lane + d; }
static unsigned src_xor(unsigned lane, unsigned m, int w) { return (lane ^ m) / w > lane / w ? lane : lane ^ m; }

int main() {
  for (dim3 block : {dim3(64), dim3(16, 4)}) {
    const unsigned nt = block.x * block.y;
    std::vector<double> out(nt * 24, -1.0);
    if (HPDL_EMU_LAUNCH(shuffles, dim3(1), block, 0, out.data()) != 0)
      return std::printf("shuffles launch failed: %s\n", hpdl_emu_last_error()), 1;
    size_t bad = 0;
    for (unsigned t = 0; t < nt; t++) {
      const unsigned lane = t % 32, base = t - lane;
      auto vi = [&](unsigned l) { return double(int(3 * (base + l)) - 50); };
      auto vu = [&](unsigned l) { return double(1000u + base + l); };
      auto vf = [&](unsigned l) { return 0.5 + double(base + l); };
      auto vd = [&](unsigned l) { return 1e10 + double(base + l); };
      auto vl = [&](unsigned l) { return double(base + l); };
      const double expect[17] = {
          vi(src_idx(lane, int(lane * 7 % 32), 32)), vu(src_idx(lane, 3, 16)), vf(src_idx(lane, 37, 8)),
          vd(src_idx(lane, 31, 32)), vl(src_idx(lane, 5, 32)), vi(src_up(lane, 1, 32)), vf(src_up(lane, 3, 8)),
          vd(src_up(lane, 16, 16)), vu(src_down(lane, 1, 32)), vf(src_down(lane, 5, 16)), vd(src_down(lane, 2, 8)),
          vl(src_down(lane, 31, 32)), vi(src_xor(lane, 1, 32)), vu(src_xor(lane, 16, 32)), vf(src_xor(lane, 8, 8)),
          vd(src_xor(lane, 5, 16)), vf(src_xor(lane, 31, 32))};
      for (int k = 0; k < 17; k++)
        if (out[t * 24 + k] != expect[k] && bad++ < 5)
          std::printf("  thread %u result %d: %.17g, expected %.17g\n", t, k, out[t * 24 + k], expect[k]);
    }
    std::string what = "shuffles, 17 kinds x " + std::to_string(nt) + " threads, block (" + std::to_string(block.x) +
                       "," + std::to_string(block.y) + ")";
    check(bad == 0, what.c_str());
  }

  {
    const unsigned nt = 64;
    std::vector<unsigned> out(nt * 12);
    if (HPDL_EMU_LAUNCH(votes, dim3(1), dim3(nt), 0, out.data()) != 0)
      return std::printf("votes launch failed: %s\n", hpdl_emu_last_error()), 1;
    size_t bad = 0;
    for (unsigned t = 0; t < nt; t++) {
      const unsigned lane = t % 32, base = t - lane;
      unsigned e[12] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xffffffffu, 0xffffffffu};
      for (unsigned l = 0; l < 32; l++) {
        unsigned u = base + l;
        if (l % 3 == 0) e[0] |= 1u << l;
        e[1] |= u == 40;
        e[4] += u;
        e[6] = std::max(e[6], u * 5 % 37);
        e[7] ^= u;
        e[9] |= 1u << (l % 5);
        e[10] &= l | 0x100u;
      }
      e[2] = 0;  // lane 31 fails lane < 31
      e[5] = unsigned(-7);
      e[8] = lane < 8 ? 0xaau : 0u;
      for (int k = 0; k < 12; k++)
        if (out[t * 12 + k] != e[k] && bad++ < 5)
          std::printf("  thread %u vote %d: 0x%x, expected 0x%x\n", t, k, out[t * 12 + k], e[k]);
    }
    check(bad == 0, "ballot, any, all, reduce add/min/max/xor/or/and, sub-warp mask, 64 threads");
  }

  {
    std::vector<int> out(3 * 4);
    if (HPDL_EMU_LAUNCH(block_votes, dim3(3), dim3(96), 0, out.data()) != 0)
      return std::printf("block_votes launch failed: %s\n", hpdl_emu_last_error()), 1;
    bool ok = true;
    for (int b = 0; b < 3; b++) ok = ok && out[b * 4] == 32 && out[b * 4 + 1] == 1 && out[b * 4 + 2] == 0 &&
                                  out[b * 4 + 3] == 1;
    check(ok, "__syncthreads_count / _and / _or, 3 blocks of 96");
  }

  {
    const int n = 5000, bins = 37;
    std::vector<int> data(n);
    Rng rng(9);
    for (int& v : data) v = int(rng.next() % 100000);
    std::vector<int> counters = {0, -1, 0, 0};
    unsigned long long big = 0;
    float fsum = 0;
    std::vector<unsigned> hist(bins, 0);
    if (HPDL_EMU_LAUNCH(atomics, dim3(5), dim3(128), bins * sizeof(unsigned), data.data(), n, counters.data(), &big,
                        &fsum, hist.data(), bins) != 0)
      return std::printf("atomics launch failed: %s\n", hpdl_emu_last_error()), 1;
    long long sum = 0;
    int mx = -1;
    unsigned long long ebig = 0;
    std::vector<unsigned> ehist(bins, 0);
    for (int v : data) {
      sum += v;
      mx = std::max(mx, v);
      ebig += (unsigned long long)v * 1000000007ull;
      ehist[v % bins]++;
    }
    check(counters[0] == int(sum) && counters[1] == mx && counters[2] == n && big == ebig && fsum == 0.5f * n &&
              hist == ehist && counters[3] >= 1000 && counters[3] < 1005,
          "atomicAdd int/ull/float, atomicMax, atomicCAS loop, atomicExch, shared histogram");
  }
  return finish("warp");
}
